//! The trainer's one error type.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    Layout(String),
    #[error("{0}")]
    Checkpoint(String),
    /// A run's statement exceeds the memory it was given.
    #[error("{0}")]
    OverMemory(String),
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
    /// A test hook (see `test_hooks`) fired: a stand-in for a kill, after
    /// this many of these units of work.
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
    /// A libtorch call failed (on a GPU, most often out of memory), while
    /// doing `during` where that is known; its message on one line.
    #[error("{}{}", during.as_ref().map_or(String::new(), |d| format!("{d}: ")), torch_line(cause))]
    Torch {
        during: Option<String>,
        // Shown in the message, not chained: `{:#}` would print it twice.
        cause: tch::TchError,
    },
    #[error("{path}: {cause}")]
    Io {
        path: String,
        // Shown in the message, not chained: `{:#}` would print it twice.
        cause: std::io::Error,
    },
    /// A file this program wrote earlier is not what it wrote (cut short,
    /// zeroed, garbled): `fault` says what is wrong and what to do.
    #[error("{path}: {fault}")]
    Corrupt { path: String, fault: String },
    /// Encoding the Parquet output failed.
    #[error("writing Parquet: {cause}")]
    Parquet {
        cause: parquet::errors::ParquetError,
    },
    /// A thread pool could not be started (the system refused threads).
    #[error("{what}: {cause}")]
    ThreadPool {
        what: &'static str,
        cause: rayon::ThreadPoolBuildError,
    },
    /// A broken invariant: a bug in this program, not bad input.
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn io(path: impl std::fmt::Display, source: std::io::Error) -> Self {
        Error::Io {
            path: path.to_string(),
            cause: source,
        }
    }

    /// Whether a full disk (ENOSPC) caused this error.
    pub fn disk_full(&self) -> bool {
        let full = Some(std::io::ErrorKind::StorageFull);
        match self {
            Error::Io { cause, .. } => cause.kind() == std::io::ErrorKind::StorageFull,
            Error::Shared(e) => e.io_kind() == full,
            Error::Parquet {
                cause: parquet::errors::ParquetError::External(e),
            } => offgnn_shared::error::io_kind_in(e.as_ref()) == full,
            _ => false,
        }
    }

    /// A libtorch failure while doing `during` (a clause: "training at
    /// epoch 2, batch 7").
    pub fn torch(during: impl Into<String>, cause: tch::TchError) -> Self {
        Error::Torch {
            during: Some(during.into()),
            cause,
        }
    }

    /// This error, where it is a libtorch failure that does not yet say
    /// what was being done, as one while doing `during`.
    pub fn during(self, during: impl FnOnce() -> String) -> Self {
        match self {
            Error::Torch {
                during: None,
                cause,
            } => Error::torch(during(), cause),
            e => e,
        }
    }
}

impl From<tch::TchError> for Error {
    fn from(cause: tch::TchError) -> Self {
        Error::Torch {
            during: None,
            cause,
        }
    }
}

/// A libtorch error's message without the C++ backtrace libtorch appends
/// to it (a page of stack frames), on one line.
fn torch_line(e: &tch::TchError) -> String {
    let text = match e {
        tch::TchError::Torch(message) => format!("libtorch: {message}"),
        other => other.to_string(),
    };
    let message = text
        .split_once("\nException raised from")
        .map_or(text.as_str(), |(m, _)| m);
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failing libtorch op (an index past the tensor) is one line that
    /// says what was being done, without libtorch's backtrace.
    #[test]
    fn a_torch_error_is_one_line_with_what_was_being_done() {
        let t = tch::Tensor::zeros([3], (tch::Kind::Float, tch::Device::Cpu));
        let index = tch::Tensor::from_slice(&[7i64]);
        let cause = t.f_index_select(0, &index).unwrap_err();
        let line = Error::torch("training at epoch 1, batch 4", cause).to_string();
        assert!(
            line == "training at epoch 1, batch 4: libtorch: index out of range in self",
            "{line}"
        );
        assert!(!line.contains('\n') && !line.contains("frame #"), "{line}");
    }
}
