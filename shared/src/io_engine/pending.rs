//! Reads and writes that finish behind their caller: the memory or buffer
//! they own until the engine is done with it, and the calls of a span read
//! still in flight.

use std::fmt;
use std::sync::Arc;

use super::buffers::AlignedBuf;
use super::files::IoFile;
use super::queue::Batch;
use crate::Result;

/// The calls [`IoEngine::read_span`](super::IoEngine::read_span) has queued:
/// each batch, its bytes and where they land in the buffer. Waits for them all
/// when dropped.
pub(super) struct InFlight(pub(super) std::collections::VecDeque<(Arc<Batch>, u64, usize)>);

impl Drop for InFlight {
    fn drop(&mut self) {
        for (batch, _, _) in &self.0 {
            batch.wait();
        }
    }
}

/// A write started by
/// [`IoEngine::write_behind`](super::IoEngine::write_behind): it owns the
/// buffer (and a handle on the file) until the write is done. Dropping it waits
/// for the write; leaking it leaks the buffer, which the kernel may still read.
pub struct PendingWrite {
    pub(super) batch: Arc<Batch>,
    pub(super) total: u64,
    pub(super) buf: Option<AlignedBuf>,
    pub(super) _file: Arc<IoFile>,
}

impl PendingWrite {
    /// Waits for the write and returns the bytes written (or its first
    /// error) and the buffer, free for reuse.
    pub fn wait(mut self) -> (Result<u64>, AlignedBuf) {
        let outcome = self.batch.outcome(self.total);
        let buf = self.buf.take().expect("a pending write holds its buffer");
        (outcome, buf)
    }
}

impl Drop for PendingWrite {
    fn drop(&mut self) {
        // The buffer must outlive the workers' reads from it.
        if self.buf.is_some() {
            self.batch.wait();
        }
    }
}

impl fmt::Debug for PendingWrite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingWrite")
            .field("path", &self.batch.path)
            .field("bytes", &self.total)
            .finish()
    }
}

/// Memory that [`IoEngine::read_behind`](super::IoEngine::read_behind) reads
/// into while its owner goes on: a value that owns heap memory, which stays
/// where it is however the value is moved.
///
/// # Safety
/// `target` returns the same memory (address and length) each time, and
/// that memory stays allocated, and is not read or written other than
/// through `target`, for as long as the value lives.
pub unsafe trait ReadTarget: Send {
    fn target(&mut self) -> &mut [u8];
}

// SAFETY: an `AlignedBuf`'s pages are its own allocation, freed only on
// drop; moving the struct moves the pointer, not the pages.
unsafe impl ReadTarget for AlignedBuf {
    fn target(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

/// A read started by [`IoEngine::read_behind`](super::IoEngine::read_behind):
/// it owns the memory read into until the reads are done, and borrows the file.
/// Dropping it waits for them; leaking it leaks the memory, which the kernel
/// may still write.
pub struct PendingRead<'f, T: ReadTarget> {
    pub(super) batch: Arc<Batch>,
    pub(super) total: u64,
    pub(super) into: Option<T>,
    pub(super) _file: std::marker::PhantomData<&'f IoFile>,
}

impl<T: ReadTarget> PendingRead<'_, T> {
    /// Waits for the reads and returns the bytes read (or the first
    /// error, the memory's contents then unspecified) and the memory.
    pub fn wait(mut self) -> (Result<u64>, T) {
        let outcome = self.batch.outcome(self.total);
        let into = self.into.take().expect("a pending read holds its memory");
        (outcome, into)
    }
}

impl<T: ReadTarget> Drop for PendingRead<'_, T> {
    fn drop(&mut self) {
        // The memory must outlive the kernel's writes into it.
        if self.into.is_some() {
            self.batch.wait();
        }
    }
}

impl<T: ReadTarget> fmt::Debug for PendingRead<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingRead")
            .field("path", &self.batch.path)
            .field("bytes", &self.total)
            .finish()
    }
}
