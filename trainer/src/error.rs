//! The trainer's one error type.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    Layout(String),
    #[error("{0}")]
    Checkpoint(String),
    /// The loss or a gradient turned NaN or infinite: the run stops rather
    /// than go on training, and reporting accuracies of, a broken model.
    #[error(
        "{what} at epoch {epoch}, batch {batch}: training diverged and stopped ({}); lower --lr, or check the features for NaN or Inf",
        match kept { Some(dir) => format!("the last checkpoint in {dir} is kept"), None => "no checkpoint was taken".to_string() }
    )]
    Diverged {
        epoch: u32,
        batch: u64,
        /// What turned non-finite, as a clause ("the loss became NaN").
        what: String,
        kept: Option<String>,
    },
    /// SIGINT or SIGTERM stopped the run: what it kept.
    #[error("{0}")]
    Stopped(String),
    /// A test hook (`interrupt_after`, `interrupt_after_groups`) fired: a
    /// stand-in for a kill, after this many of these units of work.
    #[error("interrupted after {0} {1}")]
    Interrupted(u64, &'static str),
    /// A collective or the process group failed: another rank stopped,
    /// or the store cannot be reached.
    #[error("{0}")]
    Distributed(String),
    #[error(transparent)]
    Device(#[from] crate::device::DeviceError),
    #[error(transparent)]
    Shared(#[from] offgnn_shared::Error),
    #[error(transparent)]
    Manifest(#[from] offgnn_manifests::Error),
    #[error(transparent)]
    Torch(#[from] tch::TchError),
    #[error("{path}: {cause}")]
    Io {
        path: String,
        // Shown in the message, not chained: `{:#}` would print it twice.
        cause: std::io::Error,
    },
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
