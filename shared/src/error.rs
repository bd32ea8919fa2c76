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
    /// An object-store operation that failed (URL without credentials), with
    /// the I/O kind at its root where there is one (a full disk, a missing
    /// object), so that callers tell failures apart by kind, not by text.
    #[error("{url}: {}", without_credentials(fault))]
    Store {
        url: String,
        fault: String,
        kind: Option<std::io::ErrorKind>,
    },
    /// A parameter out of its valid range.
    #[error("{0}")]
    InvalidArgument(String),
    /// SIGINT or SIGTERM arrived: the run stops at its next safe point.
    #[error("stopped by {0}")]
    Interrupted(&'static str),
}

/// `text` with the user name and password of every URL in it removed
/// (`http://user:secret@host/x` becomes `http://host/x`): the object-store
/// library's messages quote the URLs it requested as given, credentials
/// and all, and a credential in a URL never reaches a log or a terminal.
pub fn without_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        // The authority runs to the path, the query or the end of the word.
        let end = tail
            .find(|c: char| matches!(c, '/' | '?' | '#') || c.is_whitespace())
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        out.push_str(
            authority
                .rfind('@')
                .map_or(authority, |i| &authority[i + 1..]),
        );
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

impl Error {
    /// The kind of I/O failure behind this error, where it is one.
    pub fn io_kind(&self) -> Option<std::io::ErrorKind> {
        match self {
            Error::Io { cause, .. } => Some(cause.kind()),
            Error::Store { kind, .. } => *kind,
            _ => None,
        }
    }

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
}

/// The kind of the first I/O failure in `e`'s chain of sources, if any. An
/// `io::Error` of kind `Other` that wraps another error (object_store's
/// writers wrap theirs so) has the kind of what it wraps, where that has one.
pub fn io_kind_in(e: &(dyn std::error::Error + 'static)) -> Option<std::io::ErrorKind> {
    let mut at = Some(e);
    while let Some(err) = at {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            let wrapped = io.get_ref().and_then(|inner| io_kind_in(inner));
            return match io.kind() {
                std::io::ErrorKind::Other => wrapped.or(Some(std::io::ErrorKind::Other)),
                kind => Some(kind),
            };
        }
        if let Some(kind) = err.downcast_ref::<Error>().and_then(Error::io_kind) {
            return Some(kind);
        }
        at = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A URL's user name and password never show in a store error's line.
    #[test]
    fn store_errors_show_no_credentials() {
        let e = Error::Store {
            url: "http://127.0.0.1:1/dav/x".into(),
            fault: "Error performing HEAD http://alice:TOPSECRET@127.0.0.1:1/dav/x/run.json and s3://k@b/o, at http://host/a@b".into(),
            kind: None,
        };
        assert_eq!(
            e.to_string(),
            "http://127.0.0.1:1/dav/x: Error performing HEAD http://127.0.0.1:1/dav/x/run.json and s3://b/o, at http://host/a@b"
        );
    }

    /// A missing object and an I/O error wrapped by object_store's writers
    /// keep their kinds, so callers match kinds, not messages.
    #[test]
    fn store_errors_keep_their_io_kind() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::Store::open(dir.path().to_str().unwrap()).unwrap();
        let missing = store.get("no/such/object").unwrap_err();
        assert_eq!(
            missing.io_kind(),
            Some(std::io::ErrorKind::NotFound),
            "{missing}"
        );

        let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
        let wrapped = std::io::Error::other(Error::Store {
            url: "file:///x".into(),
            fault: full.to_string(),
            kind: Some(full.kind()),
        });
        assert_eq!(io_kind_in(&wrapped), Some(std::io::ErrorKind::StorageFull));
        let plain = std::io::Error::other("no kind inside");
        assert_eq!(io_kind_in(&plain), Some(std::io::ErrorKind::Other));
        let message = Error::InvalidArgument("a message".into());
        assert_eq!(message.io_kind(), None);
    }
}
