//! The io_uring backend: the once-per-process probe of whether io_uring
//! works here, and the workers that each keep a ring's reads in flight
//! (DiskGNN §6, "I/O operations").

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
pub(super) fn uring_worker(mut ring: IoUring, depth: usize, queue: &WorkQueue) {
    // Slot i holds the piece whose read carries user_data i.
    let mut slots: Vec<Option<Piece>> = (0..depth).map(|_| None).collect();
    let mut free: Vec<usize> = (0..depth).rev().collect();
    let mut taken = Vec::with_capacity(depth);
    let mut reaped: Vec<(u64, i32)> = Vec::with_capacity(depth);
    let mut warned = false;
    loop {
        let idle = free.len() == depth;
        if !free.is_empty() {
            let open = queue.take(free.len(), idle, &mut taken);
            if !open && idle {
                return;
            }
            for piece in taken.drain(..) {
                if piece.batch.has_failed() {
                    piece.finish();
                    continue;
                }
                let slot = free.pop().expect("took no more pieces than free slots");
                queue_read(&mut ring, slot, &piece);
                slots[slot] = Some(piece);
            }
        }
        if free.len() == depth {
            continue;
        }
        if let Err(e) = ring.submit_and_wait(1) {
            // EINTR, EAGAIN and EBUSY pass; the queued reads stay in the
            // submission queue and go with the next call.
            if e.kind() != io::ErrorKind::Interrupted {
                if !warned {
                    tracing::warn!("io_uring_enter failed ({e}); retrying");
                    warned = true;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        reaped.extend(ring.completion().map(|cqe| (cqe.user_data(), cqe.result())));
        for (slot, result) in reaped.drain(..) {
            let slot = slot as usize;
            let Some(piece) = slots.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            let failure = if result < 0 {
                let errno = -result;
                if errno == libc::EINTR || errno == libc::EAGAIN {
                    queue_read(&mut ring, slot, piece);
                    continue;
                }
                Some(piece.os_error(io::Error::from_raw_os_error(errno)))
            } else {
                match piece.advance(result as usize) {
                    Progress::More => {
                        queue_read(&mut ring, slot, piece);
                        continue;
                    }
                    Progress::Complete => None,
                    Progress::EndOfFile => Some(piece.end_of_file()),
                }
            };
            let piece = slots[slot]
                .take()
                .expect("the slot held a piece a moment ago");
            if let Some(e) = failure {
                piece.batch.fail(e);
            }
            piece.finish();
            free.push(slot);
        }
    }
}

/// Puts the read of a piece's remainder on the ring's submission queue.
fn queue_read(ring: &mut IoUring, slot: usize, piece: &Piece) {
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
    loop {
        // SAFETY: the read writes at most `remaining()` bytes at `next_dst()`,
        // inside the caller's buffer and this piece's alone; the buffer and
        // `fd` outlive it because the piece is finished, and its `read` call
        // released, only after this read's completion has been reaped.
        if unsafe { ring.submission().push(&entry) }.is_ok() {
            return;
        }
        // The queue holds a slot for each of the `depth` pieces a worker
        // keeps, so it is never full; should it be, let the kernel drain it.
        if ring.submit().is_err() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}
