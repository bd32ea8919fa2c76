//! The one error type of the shared crate: every variant names the file or
//! the input it concerns, so a user sees a single line that says where and what.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An I/O failure on a named file.
    #[error("{}: {cause}", path.display())]
    Io {
        path: PathBuf,
        // Shown in the message, not chained: `{:#}` would print it twice.
        cause: std::io::Error,
    },
    /// A `.npy` file whose header or size is not what we can read.
    #[error("{}: {fault}", path.display())]
    Npy { path: PathBuf, fault: String },
    /// A dataset whose metadata or contents break the format's rules.
    #[error("{}: {fault}", path.display())]
    Dataset { path: PathBuf, fault: String },
    /// A Parquet table that cannot be imported.
    #[error("{}: {fault}", path.display())]
    Parquet { path: PathBuf, fault: String },
    /// A graph that cannot be represented (too many nodes, ids out of range).
    #[error("{0}")]
    Topology(String),
    /// An object-store operation that failed (URL without credentials).
    #[error("{url}: {fault}")]
    Store { url: String, fault: String },
    /// A parameter out of its valid range.
    #[error("{0}")]
    InvalidArgument(String),
    /// SIGINT or SIGTERM arrived: the run stops at its next safe point.
    #[error("stopped by {0}")]
    Interrupted(&'static str),
}

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            cause: source,
        }
    }

    pub fn npy(path: impl Into<PathBuf>, fault: impl Into<String>) -> Self {
        Error::Npy {
            path: path.into(),
            fault: fault.into(),
        }
    }

    pub fn dataset(path: impl Into<PathBuf>, fault: impl Into<String>) -> Self {
        Error::Dataset {
            path: path.into(),
            fault: fault.into(),
        }
    }

    pub fn parquet(path: impl Into<PathBuf>, fault: impl Into<String>) -> Self {
        Error::Parquet {
            path: path.into(),
            fault: fault.into(),
        }
    }
}
