//! The one error type of the sampler library: bad flags, a committed run in
//! the way, a file that cannot be written, and the shared crate's errors.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    InvalidArgument(String),
    #[error(
        "{0} already holds a committed sampling run (run.json); pass --overwrite to replace it"
    )]
    Committed(String),
    #[error(transparent)]
    Shared(#[from] offgnn_shared::Error),
    /// A Parquet table that cannot be imported.
    #[error("{}: {fault}", path.display())]
    Parquet {
        path: std::path::PathBuf,
        fault: String,
    },
    /// A graph that cannot be represented (too many nodes, ids out of range).
    #[error("{0}")]
    Topology(String),
    /// Writing an output file failed; `kind` is the I/O failure at its root,
    /// where there is one (a full disk).
    #[error("{file}: {fault}")]
    Write {
        file: String,
        fault: String,
        kind: Option<std::io::ErrorKind>,
    },
    /// The run ended early (a signal, a full disk): what it did about it.
    #[error("{0}")]
    Ended(String),
}

impl Error {
    pub fn parquet(path: impl Into<std::path::PathBuf>, fault: impl Into<String>) -> Self {
        Error::Parquet {
            path: path.into(),
            fault: fault.into(),
        }
    }

    /// The kind of I/O failure behind this error, where it is one.
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        match self {
            Error::Write { kind, .. } => *kind,
            Error::Shared(e) => e.io_kind(),
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
