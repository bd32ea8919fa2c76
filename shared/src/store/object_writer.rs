//! [`ObjectWriter`]: a `std::io::Write` into one object, checksummed as it
//! goes: to a local store past the page cache (a
//! [`StagedWriter`](super::StagedWriter)), to any
//! other uploaded in parts above a threshold.

use std::io::Write;
use std::sync::Arc;

use object_store::buffered::BufWriter;
use sha2::{Digest, Sha256};
use tokio_util::io::SyncIoBridge;

use super::background::Background;
use super::client::runtime;
use super::{Store, hex};
use crate::error::Result;

/// Objects larger than this go up as multipart uploads.
pub(super) const MULTIPART_THRESHOLD: usize = 16 << 20;
/// Parts of one multipart upload in flight at once.
pub(super) const MULTIPART_CONCURRENCY: usize = 4;

impl Store {
    /// A streaming writer for one object, checksummed. To a local store it
    /// writes a staging file past the page cache, as [`Store::staged_writer`]
    /// does (through the cache, each page written was a copy into a fresh
    /// page, a tenth of a sampler job's cycles), hashing and writing on a
    /// thread of its own. To any other store it uploads in parts above
    /// 16 MiB. Must be called from a plain thread, not from async code.
    pub fn writer(&self, rel: &str) -> Result<ObjectWriter> {
        let sink = match self.local_file(rel) {
            Some(file) => Sink::Local(Background::new(self.local_writer(rel, &file)?)),
            None => {
                let inner = BufWriter::with_capacity(
                    Arc::clone(&self.inner),
                    self.path(rel),
                    MULTIPART_THRESHOLD,
                )
                .with_max_concurrency(MULTIPART_CONCURRENCY);
                Sink::Remote(SyncIoBridge::new_with_handle(
                    inner,
                    runtime().handle().clone(),
                ))
            }
        };
        Ok(ObjectWriter {
            sink: Some(sink),
            hasher: Sha256::new(),
            size: 0,
            name: rel.to_string(),
            store: self.clone(),
        })
    }
}

/// What an [`ObjectWriter`] wrote.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WrittenObject {
    /// Name relative to the store it was written to.
    pub name: String,
    pub size: u64,
    /// Lower-case hex SHA-256 of the object's bytes.
    pub sha256: String,
}

/// A `std::io::Write` into an object. Nothing is visible under the name until
/// [`ObjectWriter::finish`]; dropped unfinished, the upload is abandoned.
pub struct ObjectWriter {
    /// `None` once finished.
    sink: Option<Sink>,
    hasher: Sha256,
    size: u64,
    name: String,
    store: Store,
}

/// Where an [`ObjectWriter`]'s bytes go.
enum Sink {
    /// A local store's staging file, renamed over the object when finished,
    /// and hashed on the same thread as it is written.
    Local(Background),
    /// Any other store's multipart upload.
    Remote(SyncIoBridge<BufWriter>),
}

impl Write for ObjectWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = match self.sink.as_mut().expect("writer used after finish") {
            Sink::Local(w) => w.write(buf).map(|()| buf.len())?,
            Sink::Remote(bridge) => {
                let n = bridge.write(buf)?;
                self.hasher.update(&buf[..n]);
                n
            }
        };
        self.size += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        // Parts go up as they fill; a flush must not force a small part.
        Ok(())
    }
}

impl ObjectWriter {
    /// Completes the upload and returns the object's size and checksum.
    pub fn finish(mut self) -> Result<WrittenObject> {
        let hasher = match self.sink.take().expect("finish called once") {
            Sink::Local(w) => {
                let (staged, hasher) = w.finish().map_err(|e| self.store.err(&self.name, e))?;
                let size = staged.finish()?;
                debug_assert_eq!(size, self.size);
                hasher
            }
            Sink::Remote(mut bridge) => {
                bridge
                    .shutdown()
                    .map_err(|e| self.store.err(&self.name, e))?;
                self.hasher.clone()
            }
        };
        Ok(WrittenObject {
            name: self.name.clone(),
            size: self.size,
            sha256: hex(&hasher.finalize()),
        })
    }
}

impl Drop for ObjectWriter {
    /// An unfinished upload is abandoned; a local staging file is removed
    /// by its [`StagedWriter`](super::StagedWriter)'s own drop.
    fn drop(&mut self) {
        if let Some(Sink::Remote(bridge)) = self.sink.take() {
            let mut inner = bridge.into_inner();
            let _ = runtime().block_on(inner.abort());
        }
    }
}
