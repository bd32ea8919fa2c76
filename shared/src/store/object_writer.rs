//! [`ObjectWriter`]: a `std::io::Write` into one object, checksummed as it
//! goes: to a local store past the page cache (a
//! [`StagedWriter`](super::StagedWriter)), to any
//! other uploaded in parts above a threshold.

use std::io::Write;
use std::sync::Arc;

use object_store::buffered::BufWriter;
use tokio_util::io::SyncIoBridge;

use super::Store;
use super::background::Background;
use super::client::runtime;
use crate::error::Result;

/// Objects larger than this go up as multipart uploads.
pub(super) const MULTIPART_THRESHOLD: usize = 16 << 20;
/// Parts of one multipart upload in flight at once.
pub(super) const MULTIPART_CONCURRENCY: usize = 4;

impl Store {
    /// A streaming writer for one object, checksummed. To a local store it
    /// writes a staging file past the page cache, as [`Store::staged_writer`]
    /// does (through the cache, each page written is a copy into a fresh
    /// page), checksumming and writing on a thread of its own. To any other
    /// store it uploads in parts above 16 MiB. Must be called from a plain
    /// thread, not from async code.
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
            crc32c: 0,
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
    /// The CRC32C of the object's bytes, as the writer computes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crc32c: Option<u32>,
    /// Lower-case hex SHA-256 of the object's bytes: what writers recorded
    /// before CRC32C (samples of format 2 and earlier), still checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

impl WrittenObject {
    /// Whether `bytes` are this object's: its size, and its CRC32C (or
    /// SHA-256, where it records that instead). An object that records
    /// neither matches nothing.
    pub fn matches(&self, bytes: &[u8]) -> bool {
        use sha2::Digest;
        bytes.len() as u64 == self.size
            && match (self.crc32c, &self.sha256) {
                (Some(crc), _) => crc32c::crc32c(bytes) == crc,
                (None, Some(sum)) => super::hex(&sha2::Sha256::digest(bytes)) == *sum,
                (None, None) => false,
            }
    }
}

/// A `std::io::Write` into an object. Nothing is visible under the name until
/// [`ObjectWriter::finish`]; dropped unfinished, the upload is abandoned.
pub struct ObjectWriter {
    /// `None` once finished.
    sink: Option<Sink>,
    /// The CRC32C of what went to a remote store so far (a local one's
    /// thread computes its own).
    crc32c: u32,
    size: u64,
    name: String,
    store: Store,
}

/// Where an [`ObjectWriter`]'s bytes go.
enum Sink {
    /// A local store's staging file, renamed over the object when finished,
    /// and checksummed on the same thread as it is written.
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
                self.crc32c = crc32c::crc32c_append(self.crc32c, &buf[..n]);
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
        let crc = match self.sink.take().expect("finish called once") {
            Sink::Local(w) => {
                let (staged, crc) = w.finish().map_err(|e| self.store.err(&self.name, e))?;
                let size = staged.finish()?;
                debug_assert_eq!(size, self.size);
                crc
            }
            Sink::Remote(mut bridge) => {
                bridge
                    .shutdown()
                    .map_err(|e| self.store.err(&self.name, e))?;
                self.crc32c
            }
        };
        Ok(WrittenObject {
            name: self.name.clone(),
            size: self.size,
            crc32c: Some(crc),
            sha256: None,
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
