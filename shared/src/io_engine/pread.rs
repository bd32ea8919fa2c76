//! The `pread` fallback: a pool of threads that each read (or write) one
//! piece at a time, to the end.

use std::io;

use super::queue::{Piece, Progress, WorkQueue};

/// A `pread` thread: one piece at a time, to the end.
pub(super) fn pread_worker(queue: &WorkQueue) {
    let mut taken = Vec::with_capacity(1);
    while queue.take(1, true, &mut taken) {
        for mut piece in taken.drain(..) {
            if !piece.batch.has_failed() {
                pread_piece(&mut piece);
            }
            piece.finish();
        }
    }
}

fn pread_piece(piece: &mut Piece) {
    loop {
        // SAFETY: `next_dst()` and the `remaining()` bytes after it lie inside
        // the caller's buffer and belong to this piece alone (see `Piece`);
        // `fd` is open; the offset fits `off_t` (`check_requests`).
        let n = unsafe {
            if piece.batch.write {
                libc::pwrite(
                    piece.fd,
                    piece.next_dst().cast_const().cast(),
                    piece.remaining(),
                    piece.next_offset() as libc::off_t,
                )
            } else {
                libc::pread(
                    piece.fd,
                    piece.next_dst().cast(),
                    piece.remaining(),
                    piece.next_offset() as libc::off_t,
                )
            }
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            piece.batch.fail(piece.os_error(e));
            return;
        }
        match piece.advance(n as usize) {
            Progress::Complete => return,
            Progress::More => {}
            Progress::EndOfFile => {
                piece.batch.fail(piece.end_of_file());
                return;
            }
        }
    }
}
