//! How a call's requests reach the workers: cut into pieces of at most
//! [`MAX_PIECE`] bytes, queued, and counted off as each finishes.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use super::files::IoFile;
use super::requests::ReadReq;
use super::{MAX_PIECE, PAGE};
use crate::{Error, Result};

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The data behind these locks stays consistent at every unlock, so a
    // panic elsewhere does not make it unusable.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One `read` call: the pieces still out, and the first error.
pub(super) struct Batch {
    pub(super) path: PathBuf,
    pub(super) direct: bool,
    /// Writes from the buffer rather than reads into it.
    pub(super) write: bool,
    pub(super) remaining: AtomicUsize,
    pub(super) failed: AtomicBool,
    pub(super) error: Mutex<Option<Error>>,
    pub(super) finished: Mutex<bool>,
    pub(super) finished_cv: Condvar,
}

impl Batch {
    fn new(file: &IoFile, write: bool) -> Self {
        Batch {
            path: file.path.clone(),
            direct: file.direct,
            write,
            remaining: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            error: Mutex::new(None),
            finished: Mutex::new(false),
            finished_cv: Condvar::new(),
        }
    }

    pub(super) fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Keeps the first error; pieces not yet started are then skipped.
    pub(super) fn fail(&self, error: Error) {
        let mut slot = lock(&self.error);
        if slot.is_none() {
            *slot = Some(error);
        }
        self.failed.store(true, Ordering::Relaxed);
    }

    fn piece_finished(&self) {
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            *lock(&self.finished) = true;
            self.finished_cv.notify_all();
        }
    }

    pub(super) fn wait(&self) {
        let mut finished = lock(&self.finished);
        while !*finished {
            finished = self
                .finished_cv
                .wait(finished)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Waits for every piece; `total` bytes, or the first error.
    pub(super) fn outcome(&self, total: u64) -> Result<u64> {
        self.wait();
        match lock(&self.error).take() {
            Some(e) => Err(e),
            None => Ok(total),
        }
    }
}

/// At most [`MAX_PIECE`] bytes of one request: the unit a ring or a `pread`
/// thread reads.
pub(super) struct Piece {
    pub(super) fd: RawFd,
    /// File offset of the piece's first byte.
    pub(super) offset: u64,
    /// Where the piece's first byte lands in the caller's buffer.
    pub(super) dst: *mut u8,
    pub(super) len: usize,
    /// Bytes already read (short reads leave the rest to resubmit).
    pub(super) done: usize,
    pub(super) batch: Arc<Batch>,
}

// SAFETY: `dst` points into memory that the caller of `enqueue` keeps
// alive, and lets no one else touch, until the piece's batch is finished, and
// it keeps the file behind `fd` open as long (`enqueue`'s contract); the
// workers use both only before they finish the piece. `check_requests` makes
// the pieces' ranges of the buffer disjoint, so no two threads write the
// same bytes.
unsafe impl Send for Piece {}

/// What a completed read means for its piece.
pub(super) enum Progress {
    Complete,
    /// Short read: resubmit the remainder.
    More,
    EndOfFile,
}

impl Piece {
    pub(super) fn next_offset(&self) -> u64 {
        self.offset + self.done as u64
    }

    pub(super) fn remaining(&self) -> usize {
        self.len - self.done
    }

    pub(super) fn next_dst(&self) -> *mut u8 {
        self.dst.wrapping_add(self.done)
    }

    /// Accounts for `n` bytes that arrived.
    pub(super) fn advance(&mut self, n: usize) -> Progress {
        if n == 0 {
            return Progress::EndOfFile;
        }
        self.done += n;
        if self.done >= self.len {
            Progress::Complete
        } else if self.batch.direct && !self.done.is_multiple_of(PAGE) {
            // O_DIRECT stops short of a page boundary only at the end of the
            // file, and the remainder could not be asked for aligned anyway.
            Progress::EndOfFile
        } else {
            Progress::More
        }
    }

    pub(super) fn end_of_file(&self) -> Error {
        let what = if self.batch.write {
            format!(
                "the disk took no more bytes at offset {}, {} short of the write of {} bytes at offset {}",
                self.next_offset(),
                self.remaining(),
                self.len,
                self.offset
            )
        } else {
            format!(
                "end of file at offset {}, {} bytes short of the read of {} bytes at offset {}",
                self.next_offset(),
                self.remaining(),
                self.len,
                self.offset
            )
        };
        Error::io(
            &self.batch.path,
            io::Error::new(io::ErrorKind::UnexpectedEof, what),
        )
    }

    pub(super) fn os_error(&self, e: io::Error) -> Error {
        let op = if self.batch.write {
            "writing"
        } else {
            "reading"
        };
        Error::io(
            &self.batch.path,
            io::Error::new(
                e.kind(),
                format!(
                    "{op} {} bytes at offset {}: {e}",
                    self.remaining(),
                    self.next_offset()
                ),
            ),
        )
    }

    pub(super) fn finish(self) {
        self.batch.piece_finished();
    }
}

/// The pieces waiting for a ring or a `pread` thread.
pub(super) struct WorkQueue {
    state: Mutex<QueueState>,
    ready: Condvar,
    workers: usize,
}

struct QueueState {
    pieces: VecDeque<Piece>,
    closed: bool,
}

impl WorkQueue {
    pub(super) fn new(workers: usize) -> Self {
        WorkQueue {
            state: Mutex::new(QueueState {
                pieces: VecDeque::new(),
                closed: false,
            }),
            ready: Condvar::new(),
            workers,
        }
    }

    /// Cuts the requests into pieces and queues them; the batch is finished
    /// once every piece is (at once when there are none).
    ///
    /// # Safety
    /// [`check_requests`](super::requests::check_requests) has accepted
    /// `reqs` for a buffer at `base`, and every request's bytes of that
    /// buffer are valid for writes (for reads only, with `write`). Until the
    /// returned batch is finished, that memory and `file` stay alive and
    /// nothing else reads or writes those bytes (nothing else writes them,
    /// with `write`): the workers and the kernel use them from other threads.
    pub(super) unsafe fn enqueue(
        &self,
        file: &IoFile,
        reqs: &[ReadReq],
        base: *mut u8,
        write: bool,
    ) -> (Arc<Batch>, u64) {
        let batch = Arc::new(Batch::new(file, write));
        let fd = file.file.as_raw_fd();
        let mut pieces = Vec::with_capacity(reqs.len());
        let mut total = 0u64;
        for req in reqs {
            let mut start = 0;
            while start < req.len {
                let len = MAX_PIECE.min(req.len - start);
                pieces.push(Piece {
                    fd,
                    offset: req.offset + start as u64,
                    // In bounds: `check_requests` saw `buf_offset + len <= buf_len`.
                    dst: base.wrapping_add(req.buf_offset + start),
                    len,
                    done: 0,
                    batch: Arc::clone(&batch),
                });
                start += len;
            }
            total += req.len as u64;
        }
        if pieces.is_empty() {
            *lock(&batch.finished) = true;
        } else {
            batch.remaining.store(pieces.len(), Ordering::Relaxed);
            self.push(pieces);
        }
        (batch, total)
    }

    pub(super) fn push(&self, pieces: Vec<Piece>) {
        lock(&self.state).pieces.extend(pieces);
        self.ready.notify_all();
    }

    pub(super) fn close(&self) {
        lock(&self.state).closed = true;
        self.ready.notify_all();
    }

    /// Moves up to `room` pieces into `out`, but no more than a fair share
    /// of what is queued, so that one batch spreads over all the workers.
    /// With `wait`, sleeps while the queue is empty. Returns false once the
    /// engine is closed and nothing is queued.
    pub(super) fn take(&self, room: usize, wait: bool, out: &mut Vec<Piece>) -> bool {
        let mut state = lock(&self.state);
        while wait && state.pieces.is_empty() && !state.closed {
            state = self
                .ready
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if state.pieces.is_empty() {
            return !state.closed;
        }
        let share = state.pieces.len().div_ceil(self.workers);
        let n = share.min(room).max(1);
        out.extend(state.pieces.drain(..n));
        true
    }
}
