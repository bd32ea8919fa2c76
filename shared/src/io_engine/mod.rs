//! The I/O engine: reads many byte ranges of local files into one page-aligned
//! buffer, with O_DIRECT, over io_uring rings or, where io_uring is refused, a
//! pool of `pread` threads (DiskGNN §6, "I/O operations").
//!
//! DiskGNN reads its disk cache with 4 threads that each hold an io_uring ring
//! and its packed chunks with `pread`, all through descriptors opened with
//! O_DIRECT. Here one engine does both: every request is cut into pieces of at
//! most [`MAX_PIECE`] bytes, so that a packed chunk of tens of MB spreads over
//! the rings and their queue depth just as a list of single disk-cache pages
//! does. Each ring is owned by one worker thread; callers hand their pieces to a
//! shared queue and sleep until the last of them has landed.
//!
//! Rules every read follows, whichever backend runs it:
//! - request `i` lands at `buf[reqs[i].buf_offset..][..reqs[i].len]`; the
//!   destinations of one call must not overlap and must fit the buffer;
//! - on a file opened with O_DIRECT, offsets, lengths and buffer offsets are
//!   multiples of [`PAGE`] (4096), or the call is refused before anything is read;
//! - a short read is resubmitted for its remainder; a request that reaches past
//!   the end of the file is an error naming the file and the offset where the
//!   data ran out. This holds for a buffered file too: a file whose last page is
//!   short can be read up to its last byte (unaligned requests are allowed on a
//!   buffered file), not past it. Files meant for O_DIRECT are written padded
//!   to whole pages.
//!
//! The engine is split by concern: `engine` holds [`IoEngine`] and its
//! calls, `files` the files it reads and writes, `buffers` the aligned
//! memory reads land in, `requests` the checks every call's requests pass
//! first, `queue` the pieces queued for the workers, `uring` and
//! `pread` the two kinds of worker, and `pending` the reads and writes
//! that finish behind their caller.

mod buffers;
mod engine;
mod files;
mod pending;
mod pread;
mod queue;
mod requests;
mod uring;

pub use buffers::AlignedBuf;
pub use engine::{Backend, IoEngine, IoOptions};
pub use files::{IoFile, MappedFile, free_bytes};
pub use pending::{PendingRead, PendingWrite, ReadTarget};
pub use requests::ReadReq;

/// The alignment O_DIRECT reads need here: offsets, lengths and buffer
/// addresses are multiples of it. 4 KiB covers every NVMe logical block size
/// in use and is the page size of the disk cache and the packed chunks.
pub const PAGE: usize = 4096;

/// The largest piece one request is cut into. 1 MiB keeps a large sequential
/// read at full speed (the NVMe's maximum transfer is usually 128 KiB–2 MiB)
/// while a 64 MiB packed chunk still becomes 64 pieces that fill the rings.
pub const MAX_PIECE: usize = 1 << 20;
