//! The io_uring backend: the once-per-process probe of whether io_uring
//! works here, and the workers that each keep a ring's reads in flight
//! (DiskGNN §6, "I/O operations").

use std::collections::VecDeque;
use std::io;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use io_uring::{IoUring, Probe, opcode, types};

use super::queue::{Piece, Progress, WorkQueue};

/// The process-wide verdict on io_uring: `None` where it works, else why not.
pub(super) fn io_uring_refusal() -> Option<&'static str> {
    static VERDICT: OnceLock<Option<String>> = OnceLock::new();
    VERDICT.get_or_init(|| probe_io_uring().err()).as_deref()
}

/// Creates a small ring, asks whether IORING_OP_READ is supported (Linux
/// 5.6+), and runs one no-op through it, so that a seccomp filter that lets
/// `io_uring_setup` through but not `io_uring_enter` is caught too.
fn probe_io_uring() -> std::result::Result<(), String> {
    let mut ring = IoUring::new(2).map_err(|e| format!("io_uring_setup failed: {e}"))?;
    let mut probe = Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(|e| format!("io_uring_register(PROBE) failed: {e}"))?;
    if !probe.is_supported(opcode::Read::CODE) {
        return Err("the kernel's io_uring lacks IORING_OP_READ".to_string());
    }
    let nop = opcode::Nop::new().build().user_data(1);
    // SAFETY: a no-op refers to no memory.
    unsafe { ring.submission().push(&nop) }
        .map_err(|_| "a new ring's submission queue is full".to_string())?;
    ring.submit_and_wait(1)
        .map_err(|e| format!("io_uring_enter failed: {e}"))?;
    match ring.completion().next() {
        Some(cqe) if cqe.result() >= 0 => Ok(()),
        Some(cqe) => Err(format!(
            "a no-op completed with {}",
            io::Error::from_raw_os_error(-cqe.result())
        )),
        None => Err("a no-op did not complete".to_string()),
    }
}

pub(super) fn warn_fallback(why: &str) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "io_uring is not available ({why}); reading with a pool of pread threads instead"
        );
    }
}

/// An io_uring worker: keeps up to `depth` pieces in flight on its own ring,
/// takes more from the queue as slots free up, and resubmits short reads.
pub(super) fn uring_worker(ring: IoUring, depth: usize, queue: &WorkQueue) {
    work(ring, depth, queue, |ring| ring.submit_and_wait(1));
}

/// [`uring_worker`] with its `io_uring_enter` call passed in, so that a
/// test can make the call fail.
fn work(
    ring: IoUring,
    depth: usize,
    queue: &WorkQueue,
    mut enter: impl FnMut(&mut IoUring) -> io::Result<usize>,
) {
    let mut worker = Worker {
        ring,
        slots: (0..depth).map(|_| None).collect(),
        free: (0..depth).rev().collect(),
        unsubmitted: VecDeque::with_capacity(depth),
        broken: None,
        warned: false,
    };
    let mut taken = Vec::with_capacity(depth);
    let mut reaped: Vec<(u64, i32)> = Vec::with_capacity(depth);
    loop {
        let idle = worker.free.len() == depth;
        if !worker.free.is_empty() {
            let open = queue.take(worker.free.len(), idle, &mut taken);
            if !open && idle {
                return;
            }
            for piece in taken.drain(..) {
                worker.start(piece);
            }
        }
        if worker.free.len() == depth {
            continue;
        }
        worker.enter(&mut enter);
        reaped.extend(
            worker
                .ring
                .completion()
                .map(|cqe| (cqe.user_data(), cqe.result())),
        );
        for (slot, result) in reaped.drain(..) {
            worker.complete(slot as usize, result);
        }
    }
}

/// A ring and the pieces it holds.
struct Worker {
    ring: IoUring,
    /// Slot i holds the piece whose read carries user_data i.
    slots: Vec<Option<Piece>>,
    free: Vec<usize>,
    /// Slots whose entries wait in the submission queue, oldest first: the
    /// kernel has not taken them yet.
    unsubmitted: VecDeque<usize>,
    /// The hard error that put the ring out of service; from then on it is
    /// never entered again, and every piece it is given fails.
    broken: Option<io::Error>,
    warned: bool,
}

impl Worker {
    /// Queues a piece on the ring, or finishes it at once where its batch
    /// has failed or the ring is out of service.
    fn start(&mut self, piece: Piece) {
        if piece.batch.has_failed() {
            piece.finish();
            return;
        }
        let slot = self
            .free
            .pop()
            .expect("took no more pieces than free slots");
        match self.queue_rest(slot, &piece) {
            Ok(()) => self.slots[slot] = Some(piece),
            Err(e) => {
                piece.batch.fail(piece.os_error(e));
                piece.finish();
                self.free.push(slot);
            }
        }
    }

    /// Submits the queued entries and waits for a completion. A hard error
    /// (anything but EINTR, EAGAIN or EBUSY) puts the ring out of service:
    /// the pieces the kernel has not taken fail at once, and those it has
    /// are waited for by polling the completion queue, which needs no call.
    fn enter(&mut self, enter: &mut impl FnMut(&mut IoUring) -> io::Result<usize>) {
        if self.broken.is_some() {
            std::thread::sleep(std::time::Duration::from_millis(1));
            return;
        }
        let entered = enter(&mut self.ring);
        let waiting = self.ring.submission().len();
        while self.unsubmitted.len() > waiting {
            self.unsubmitted.pop_front();
        }
        let Err(e) = entered else {
            return;
        };
        match e.raw_os_error() {
            Some(libc::EINTR) => {}
            // The kernel is short of memory or of completion room for now;
            // the queued entries go with the next call.
            Some(libc::EAGAIN | libc::EBUSY) => {
                if !self.warned {
                    tracing::warn!("io_uring_enter failed ({e}); retrying");
                    self.warned = true;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            _ => {
                tracing::warn!(
                    "io_uring_enter failed ({e}); this ring's reads and writes fail from now on"
                );
                for slot in self.unsubmitted.drain(..) {
                    if let Some(piece) = self.slots[slot].take() {
                        piece.batch.fail(piece.os_error(ring_failure(&e)));
                        piece.finish();
                        self.free.push(slot);
                    }
                }
                self.broken = Some(e);
            }
        }
    }

    /// Accounts for the completion of the entry of `slot`: queues the rest
    /// of a short read again, or finishes the piece.
    fn complete(&mut self, slot: usize, result: i32) {
        let Some(mut piece) = self.slots.get_mut(slot).and_then(Option::take) else {
            return;
        };
        let progress = if result >= 0 {
            Ok(piece.advance(result as usize))
        } else if -result == libc::EINTR || -result == libc::EAGAIN {
            Ok(Progress::More)
        } else {
            Err(piece.os_error(io::Error::from_raw_os_error(-result)))
        };
        let failure = match progress {
            Ok(Progress::More) => match self.queue_rest(slot, &piece) {
                Ok(()) => {
                    self.slots[slot] = Some(piece);
                    return;
                }
                Err(e) => Some(piece.os_error(e)),
            },
            Ok(Progress::Complete) => None,
            Ok(Progress::EndOfFile) => Some(piece.end_of_file()),
            Err(e) => Some(e),
        };
        if let Some(e) = failure {
            piece.batch.fail(e);
        }
        piece.finish();
        self.free.push(slot);
    }

    /// Puts the read (or write) of a piece's remainder on the submission
    /// queue, or says why the ring takes no more.
    fn queue_rest(&mut self, slot: usize, piece: &Piece) -> io::Result<()> {
        if let Some(e) = &self.broken {
            return Err(ring_failure(e));
        }
        // A piece is at most MAX_PIECE (1 MiB) long.
        let len = piece.remaining() as u32;
        let entry = if piece.batch.write {
            opcode::Write::new(types::Fd(piece.fd), piece.next_dst().cast_const(), len)
                .offset(piece.next_offset())
                .build()
        } else {
            opcode::Read::new(types::Fd(piece.fd), piece.next_dst(), len)
                .offset(piece.next_offset())
                .build()
        }
        .user_data(slot as u64);
        // SAFETY: the entry reads or writes at most `remaining()` bytes at
        // `next_dst()`, inside the caller's buffer and this piece's alone;
        // the buffer and `fd` outlive it because the piece is finished, and
        // its caller released, only after the entry's completion has been
        // reaped or, where the ring broke before the kernel took the entry,
        // once the ring is never entered again.
        unsafe { self.ring.submission().push(&entry) }
            // Each slot has at most one entry queued or in flight and the
            // queue has room for `depth`, so this is not expected.
            .map_err(|_| io::Error::other("the ring's submission queue is full"))?;
        self.unsubmitted.push_back(slot);
        Ok(())
    }
}

/// The error a piece gets from a ring that a hard error put out of service.
fn ring_failure(e: &io::Error) -> io::Error {
    io::Error::new(
        e.kind(),
        format!("io_uring_enter failed ({e}), and the ring takes no more requests"),
    )
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;
    use crate::io_engine::PAGE;
    use crate::io_engine::buffers::AlignedBuf;
    use crate::io_engine::files::IoFile;
    use crate::io_engine::requests::{ReadReq, check_requests};

    /// Reads `reqs` into `buf` through `queue`, as `IoEngine::read` does.
    fn read(
        queue: &WorkQueue,
        file: &IoFile,
        reqs: &[ReadReq],
        buf: &mut AlignedBuf,
    ) -> crate::Result<u64> {
        let base = buf.as_mut_ptr();
        check_requests(file, reqs, base, buf.len())?;
        // SAFETY: the requests fit `buf` (just checked), which stays
        // borrowed mutably, as `file` is, until `outcome` has seen every
        // piece finished.
        let (batch, total) = unsafe { queue.enqueue(file, reqs, base, false) };
        batch.outcome(total)
    }

    #[test]
    fn a_hard_enter_error_fails_the_rings_reads_instead_of_retrying() {
        if let Some(why) = io_uring_refusal() {
            if std::env::var_os("OFFGNN_REQUIRE_IO_URING").is_some_and(|v| v == "1") {
                panic!("io_uring is required (OFFGNN_REQUIRE_IO_URING=1) but refused: {why}");
            }
            let _ = writeln!(
                io::stderr(),
                "uring tests: io_uring is refused on this machine ({why}): this test did NOT run"
            );
            return;
        }
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("pages.bin");
        std::fs::write(&path, vec![7u8; 8 * PAGE]).expect("writing the test file");
        let file = IoFile {
            file: std::fs::File::open(&path).expect("opening the test file"),
            path,
            direct: false,
            len: 8 * PAGE as u64,
            writable: false,
        };
        let reqs = ReadReq::span((0, 8 * PAGE as u64), PAGE, 0);
        let ring = IoUring::new(2).expect("a ring, where the probe's worked");
        let queue = WorkQueue::new(1);
        // The first call goes to the kernel, so that the ring holds reads
        // the kernel took as well as reads it never saw; every later one
        // fails as a closed ring descriptor would.
        let mut calls = 0;
        let enter = move |ring: &mut IoUring| {
            calls += 1;
            if calls == 1 {
                ring.submit_and_wait(1)
            } else {
                Err(io::Error::from_raw_os_error(libc::EBADF))
            }
        };
        std::thread::scope(|s| {
            let worker = s.spawn(|| work(ring, 2, &queue, enter));
            let mut buf = AlignedBuf::new(8 * PAGE);
            let errno = format!("os error {}", libc::EBADF);
            for attempt in ["pending", "later"] {
                let err = read(&queue, &file, &reqs, &mut buf)
                    .expect_err("a read on a broken ring fails");
                let message = err.to_string();
                assert!(
                    message.contains(&errno) && message.contains("pages.bin"),
                    "the {attempt} read's error names the file and the errno: {message}"
                );
            }
            queue.close();
            worker
                .join()
                .expect("the worker returns once the queue closes");
        });
    }
}
