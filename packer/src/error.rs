//! The packer's one error type.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    InvalidArgument(String),
    #[error(transparent)]
    Plan(#[from] crate::plan_error::PlanError),
    #[error(transparent)]
    Shared(#[from] offgnn_shared::Error),
    #[error(transparent)]
    Manifest(#[from] offgnn_manifests::Error),
    #[error("{path}: {cause}")]
    Io {
        path: String,
        // Shown in the message, not chained: `{:#}` would print it twice.
        cause: std::io::Error,
    },
    #[error("{0} already holds a committed layout (manifest.json); pass --overwrite to replace it")]
    Committed(String),
    #[error("samples and features do not match: {0}")]
    Mismatch(String),
    #[error("verify: {0}")]
    Verify(String),
    /// SIGINT or SIGTERM: what the run did about it.
    #[error("{0}")]
    Stopped(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn io(path: impl std::fmt::Display, source: std::io::Error) -> Self {
        Error::Io {
            path: path.to_string(),
            cause: source,
        }
    }
}
