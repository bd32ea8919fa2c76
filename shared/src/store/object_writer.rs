//! [`ObjectWriter`]: a `std::io::Write` into one object, uploaded in parts
//! above a threshold and checksummed as it goes.

use std::io::Write;
use std::sync::Arc;

use object_store::buffered::BufWriter;
use sha2::{Digest, Sha256};
use tokio_util::io::SyncIoBridge;

use super::client::runtime;
use super::{Store, hex};
use crate::error::Result;

/// Objects larger than this go up as multipart uploads.
pub(super) const MULTIPART_THRESHOLD: usize = 16 << 20;
/// Parts of one multipart upload in flight at once.
pub(super) const MULTIPART_CONCURRENCY: usize = 4;

impl Store {
    /// A streaming writer for one object: multipart above 16 MiB, checksummed.
    /// Must be called from a plain thread, not from async code.
    pub fn writer(&self, rel: &str) -> ObjectWriter {
        let path = self.path(rel);
        let inner = BufWriter::with_capacity(Arc::clone(&self.inner), path, MULTIPART_THRESHOLD)
            .with_max_concurrency(MULTIPART_CONCURRENCY);
        ObjectWriter {
            bridge: Some(SyncIoBridge::new_with_handle(
                inner,
                runtime().handle().clone(),
            )),
            hasher: Sha256::new(),
            size: 0,
            name: rel.to_string(),
            store: self.clone(),
        }
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
    bridge: Option<SyncIoBridge<BufWriter>>,
    hasher: Sha256,
    size: u64,
    name: String,
    store: Store,
}

impl Write for ObjectWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let bridge = self.bridge.as_mut().expect("writer used after finish");
        let n = bridge.write(buf)?;
        self.hasher.update(&buf[..n]);
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
        let mut bridge = self.bridge.take().expect("finish called once");
        bridge
            .shutdown()
            .map_err(|e| self.store.err(&self.name, e))?;
        Ok(WrittenObject {
            name: self.name.clone(),
            size: self.size,
            sha256: hex(&self.hasher.clone().finalize()),
        })
    }
}

impl Drop for ObjectWriter {
    fn drop(&mut self) {
        if let Some(bridge) = self.bridge.take() {
            let mut inner = bridge.into_inner();
            let _ = runtime().block_on(inner.abort());
        }
    }
}
