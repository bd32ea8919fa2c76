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

use std::collections::VecDeque;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;

use io_uring::{IoUring, Probe, opcode, types};

use crate::{Error, Result};

/// The alignment O_DIRECT reads need here: offsets, lengths and buffer
/// addresses are multiples of it. 4 KiB covers every NVMe logical block size
/// in use and is the page size of the disk cache and the packed chunks.
pub const PAGE: usize = 4096;

/// The largest piece one request is cut into. 1 MiB keeps a large sequential
/// read at full speed (the NVMe's maximum transfer is usually 128 KiB–2 MiB)
/// while a 64 MiB packed chunk still becomes 64 pieces that fill the rings.
pub const MAX_PIECE: usize = 1 << 20;

/// How an [`IoEngine`] is set up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoOptions {
    /// io_uring rings, each owned by a worker thread; with the `pread`
    /// fallback, the number of `pread` threads. DiskGNN uses 4.
    pub rings: usize,
    /// Reads in flight at most, per ring.
    pub queue_depth: u32,
    /// Open files with O_DIRECT, bypassing the page cache (falls back to
    /// buffered reads, once logged, on a filesystem that refuses it).
    pub direct: bool,
    /// Use the `pread` pool even where io_uring works (tests, comparisons).
    pub force_pread: bool,
}

impl Default for IoOptions {
    fn default() -> Self {
        IoOptions {
            rings: 4,
            queue_depth: 64,
            direct: true,
            force_pread: false,
        }
    }
}

/// Which kernel interface an engine reads with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    IoUring,
    Pread,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::IoUring => "io_uring",
            Backend::Pread => "pread",
        })
    }
}

/// One byte range of a file and where it lands in the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadReq {
    /// Byte offset in the file.
    pub offset: u64,
    /// Bytes to read.
    pub len: usize,
    /// Byte offset in the destination buffer.
    pub buf_offset: usize,
}

impl ReadReq {
    /// Requests of at most `piece` bytes, front to back, for the file's
    /// bytes `[from, to)`, landing in the buffer from `buf_offset` on.
    pub fn span((from, to): (u64, u64), piece: usize, buf_offset: usize) -> Vec<ReadReq> {
        (from..to)
            .step_by(piece)
            .map(|at| ReadReq {
                offset: at,
                len: (to - at).min(piece as u64) as usize,
                buf_offset: buf_offset + (at - from) as usize,
            })
            .collect()
    }
}

/// A file opened for the engine: O_DIRECT unless the engine was told not to
/// or the filesystem refused it.
#[derive(Debug)]
pub struct IoFile {
    file: File,
    path: PathBuf,
    direct: bool,
    len: u64,
    /// Opened by [`IoEngine::open_write`].
    writable: bool,
}

impl IoFile {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether reads bypass the page cache (and so must be page-aligned).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// The file's size when it was opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Bytes an unprivileged writer may still put on the filesystem that holds
/// `path` (`statvfs`: available blocks times the fragment size).
pub fn free_bytes(path: &Path) -> Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Error::io(path, io::Error::other("a path with a NUL byte")))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path that outlives the call, and `st`
    // points to writable memory of the struct's size; statvfs fills it
    // whole when it returns 0, and only then is it read.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(Error::io(path, io::Error::last_os_error()));
    }
    // SAFETY: statvfs returned 0, so it initialised the struct.
    let st = unsafe { st.assume_init() };
    Ok(st.f_bavail * st.f_frsize)
}

/// A heap buffer whose start is aligned to [`PAGE`], as O_DIRECT needs.
/// Its bytes are always initialized: new bytes are zero.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// Bytes allocated: a whole number of pages, at least one.
    cap: usize,
}

// SAFETY: an `AlignedBuf` owns its allocation alone, like a `Vec<u8>`: moving
// it to another thread moves that ownership, and `&AlignedBuf` only reads.
unsafe impl Send for AlignedBuf {}
// SAFETY: as above; shared references give read-only access to initialized bytes.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes.
    pub fn new(len: usize) -> Self {
        let cap = page_capacity(len);
        AlignedBuf {
            ptr: alloc_zeroed_pages(cap),
            len,
            cap,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the buffer can grow to without reallocating.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` holds `cap >= len` bytes, all initialized (zeroed at
        // allocation, or written since).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Sets the length to `len`: the first `min(old, new)` bytes are kept and
    /// bytes past the old length are zero. Reallocates (still page-aligned)
    /// when `len` exceeds the capacity, so earlier slices' addresses change.
    pub fn resize(&mut self, len: usize) {
        if len > self.cap {
            let cap = page_capacity(len);
            let ptr = alloc_zeroed_pages(cap);
            // SAFETY: both allocations hold at least `self.len` bytes and are
            // distinct; the old one is freed as it was made.
            unsafe {
                std::ptr::copy_nonoverlapping(self.ptr.as_ptr(), ptr.as_ptr(), self.len);
                free_pages(self.ptr, self.cap);
            }
            self.ptr = ptr;
            self.cap = cap;
        } else if len > self.len {
            // SAFETY: `[self.len, len)` lies inside the allocation of `cap` bytes.
            unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(self.len), 0, len - self.len) };
        }
        self.len = len;
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `alloc_zeroed_pages(self.cap)` and is freed once.
        unsafe { free_pages(self.ptr, self.cap) };
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("capacity", &self.cap)
            .finish()
    }
}

fn page_capacity(len: usize) -> usize {
    len.max(1)
        .checked_next_multiple_of(PAGE)
        .expect("an aligned buffer of more than usize::MAX bytes")
}

/// Buffers of this size or more are mapped from the kernel on their own and
/// asked to be backed by transparent huge pages: their pages arrive zeroed
/// when first touched (no second pass to zero them, which in a VM costs
/// as much as the first), and a multi-GB packing partition takes a few
/// thousand page faults instead of a million.
const HUGE_PAGE: usize = 2 << 20;

fn small_layout(cap: usize) -> std::alloc::Layout {
    std::alloc::Layout::from_size_align(cap, PAGE)
        .expect("an aligned buffer of more than isize::MAX bytes")
}

/// `cap` zeroed bytes (a nonzero multiple of [`PAGE`]), aligned for
/// O_DIRECT; from an anonymous mapping where large enough.
fn alloc_zeroed_pages(cap: usize) -> NonNull<u8> {
    if cap >= HUGE_PAGE {
        // SAFETY: a fresh private anonymous mapping, no address hint; the
        // kernel returns page-aligned memory that reads as zero.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                cap,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            std::alloc::handle_alloc_error(small_layout(cap));
        }
        // SAFETY: advice on this mapping's own range; a refusal (THP off)
        // changes nothing.
        unsafe { libc::madvise(raw, cap, libc::MADV_HUGEPAGE) };
        return NonNull::new(raw.cast()).expect("mmap does not return null on success");
    }
    let layout = small_layout(cap);
    // SAFETY: the layout's size is at least one page, never zero.
    let raw = unsafe { std::alloc::alloc_zeroed(layout) };
    NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout))
}

/// Frees what [`alloc_zeroed_pages`] returned.
///
/// # Safety
/// `ptr` came from `alloc_zeroed_pages(cap)` and is not used again.
unsafe fn free_pages(ptr: NonNull<u8>, cap: usize) {
    if cap >= HUGE_PAGE {
        // SAFETY: the caller passes a mapping of exactly `cap` bytes.
        unsafe { libc::munmap(ptr.as_ptr().cast(), cap) };
    } else {
        // SAFETY: allocated with exactly this layout.
        unsafe { std::alloc::dealloc(ptr.as_ptr(), small_layout(cap)) };
    }
}

/// A local file mapped read-only: its bytes are read where they lie, in the
/// page cache, and only the pages touched are read from the disk. For
/// gathers that touch scattered rows of a file many times over (`packer
/// verify`), where copying whole spans into a buffer would move the file
/// through memory once per gather.
pub struct MappedFile {
    /// `None` for an empty file (nothing to map).
    map: Option<memmap2::Mmap>,
}

impl MappedFile {
    pub fn open(path: &Path) -> Result<MappedFile> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        if len == 0 {
            return Ok(MappedFile { map: None });
        }
        // SAFETY: a private read-only mapping; the bytes are only read as
        // `&[u8]`. offgnn never changes a feature file or a committed
        // layout object in place (a new layout is written beside the old
        // one and renamed); another process that truncated the file while
        // it is mapped would end this one with SIGBUS, as with any mapping.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        Ok(MappedFile { map: Some(map) })
    }

    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

/// Reads byte ranges of files into [`AlignedBuf`]s over io_uring or `pread`.
/// `Send + Sync`: any number of threads may call [`IoEngine::read`] at once;
/// their pieces share the rings.
pub struct IoEngine {
    opts: IoOptions,
    backend: Backend,
    queue: Arc<WorkQueue>,
    workers: Vec<JoinHandle<()>>,
}

impl fmt::Debug for IoEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoEngine")
            .field("backend", &self.backend)
            .field("opts", &self.opts)
            .finish()
    }
}

impl IoEngine {
    /// Starts the worker threads. io_uring is probed once per process; where
    /// it is refused (seccomp, `kernel.io_uring_disabled`, an old kernel) or
    /// its rings cannot be created, the engine falls back to `pread` threads
    /// and logs one warning that says why.
    pub fn new(opts: IoOptions) -> Self {
        let rings = opts.rings.max(1);
        let depth = opts.queue_depth.clamp(1, 4096);
        let mut uring = Vec::new();
        if !opts.force_pread {
            match io_uring_refusal() {
                None => match (0..rings)
                    .map(|_| IoUring::new(depth))
                    .collect::<io::Result<Vec<_>>>()
                {
                    Ok(made) => uring = made,
                    Err(e) => warn_fallback(&format!(
                        "creating {rings} rings of depth {depth} failed: {e}"
                    )),
                },
                Some(why) => warn_fallback(why),
            }
        }
        let backend = if uring.is_empty() {
            Backend::Pread
        } else {
            Backend::IoUring
        };
        let queue = Arc::new(WorkQueue::new(rings));
        let spawn = |i: usize, work: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(format!("offgnn-io-{i}"))
                .spawn(work)
                .expect("the OS refused to start an I/O thread")
        };
        let workers = if uring.is_empty() {
            (0..rings)
                .map(|i| {
                    let queue = Arc::clone(&queue);
                    spawn(i, Box::new(move || pread_worker(&queue)))
                })
                .collect()
        } else {
            uring
                .into_iter()
                .enumerate()
                .map(|(i, ring)| {
                    let queue = Arc::clone(&queue);
                    spawn(
                        i,
                        Box::new(move || uring_worker(ring, depth as usize, &queue)),
                    )
                })
                .collect()
        };
        IoEngine {
            opts,
            backend,
            queue,
            workers,
        }
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn options(&self) -> IoOptions {
        self.opts
    }

    /// Opens `path` for reading: with O_DIRECT when the options ask for it,
    /// buffered (see [`IoFile::is_direct`], logged once per process) when the
    /// filesystem refuses O_DIRECT with EINVAL, as tmpfs did before Linux 6.6.
    pub fn open(&self, path: &Path) -> Result<IoFile> {
        let mut direct = None;
        if self.opts.direct {
            match OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
            {
                Ok(file) => direct = Some(file),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    static WARNED: AtomicBool = AtomicBool::new(false);
                    if !WARNED.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            "{}: the filesystem refuses O_DIRECT (EINVAL); reading through the page cache (not repeated for other files)",
                            path.display()
                        );
                    }
                }
                Err(e) => return Err(Error::io(path, e)),
            }
        }
        let is_direct = direct.is_some();
        let file = match direct {
            Some(file) => file,
            None => File::open(path).map_err(|e| Error::io(path, e))?,
        };
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        Ok(IoFile {
            file,
            path: path.to_path_buf(),
            direct: is_direct,
            len,
            writable: false,
        })
    }

    /// Opens an existing file for [`IoEngine::write`]: with O_DIRECT when the
    /// options ask for it and the filesystem allows it (as [`IoEngine::open`]).
    pub fn open_write(&self, path: &Path) -> Result<IoFile> {
        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.write(true);
            if direct {
                o.custom_flags(libc::O_DIRECT);
            }
            o.open(path)
        };
        let (file, direct) = match self.opts.direct.then(|| open(true)) {
            Some(Ok(file)) => (file, true),
            Some(Err(e)) if e.raw_os_error() != Some(libc::EINVAL) => {
                return Err(Error::io(path, e));
            }
            _ => (open(false).map_err(|e| Error::io(path, e))?, false),
        };
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        Ok(IoFile {
            file,
            path: path.to_path_buf(),
            direct,
            len,
            writable: true,
        })
    }

    /// Reads every request into `buf` (request i's bytes land at
    /// `buf[req.buf_offset..][..req.len]`) and returns the bytes read, the sum
    /// of the lengths. All pieces are queued together and spread over the
    /// rings, at most `queue_depth` in flight per ring. Requests are checked
    /// before anything is read: they must fit `buf`, not overlap there, and on
    /// an O_DIRECT file be page-aligned. Returns only once no read of this call
    /// is in flight, also on error; the first error is returned and the
    /// buffer's contents are then unspecified.
    pub fn read(&self, file: &IoFile, reqs: &[ReadReq], buf: &mut AlignedBuf) -> Result<u64> {
        check_requests(file, reqs, buf.as_slice())?;
        let base = buf.as_mut_ptr();
        // `buf` stays borrowed mutably until `submit` returns, after the last
        // read into it.
        self.submit(file, reqs, base, false)
    }

    /// Reads `file`'s bytes `[0, end)` front to back in requests of
    /// `request` bytes (the last may be shorter), at most `per_call` of them
    /// in flight, and hands the bytes to `each` in file order, a half of
    /// those at a time while the other half is read. On an O_DIRECT file
    /// `end` and `request` are page-aligned. Returns the bytes read.
    pub fn read_sequential(
        &self,
        file: &IoFile,
        end: u64,
        request: usize,
        per_call: usize,
        mut each: impl FnMut(&[u8]),
    ) -> Result<u64> {
        // The same memory in two halves: one is read while `each` works on
        // the other, so the disk always has half the requests or more.
        let half = (per_call / 2).max(1);
        let mut buf = AlignedBuf::new(2 * request * half);
        self.read_span(file, (0, end), request, half, &mut buf, |bytes| {
            each(bytes);
            true
        })
    }

    /// [`IoEngine::read_sequential`] over `[from, end)` (`from` on a page
    /// for O_DIRECT) through the caller's `buf`, stopping after any call
    /// whose bytes `each` answers with `false`. With room in `buf` for two
    /// calls (`2 * request * per_call` bytes) the next call's reads are
    /// queued before `each` runs on this one's bytes, so the disk keeps
    /// reading while the caller works; with room for one, each call waits
    /// for the last. Returns the bytes handed to `each`.
    pub fn read_span(
        &self,
        file: &IoFile,
        (from, end): (u64, u64),
        request: usize,
        per_call: usize,
        buf: &mut AlignedBuf,
        mut each: impl FnMut(&[u8]) -> bool,
    ) -> Result<u64> {
        let call = request * per_call;
        let halves = if buf.len() >= 2 * call { 2 } else { 1 };
        let reqs_at = |at: u64, half: usize| -> Vec<ReadReq> {
            ReadReq::span((at, end.min(at + call as u64)), request, half * call)
        };
        let base = buf.as_mut_ptr();
        // Calls in flight, in file order; dropped (on an error, an early
        // stop or a panic in `each`), it waits for them: `buf` stays
        // borrowed mutably until this returns, after the last read into it.
        let mut in_flight = InFlight(std::collections::VecDeque::new());
        let (mut next, mut k, mut done) = (from, 0usize, 0u64);
        loop {
            while in_flight.0.len() < halves && next < end {
                let reqs = reqs_at(next, k % halves);
                check_requests(file, &reqs, buf.as_slice())?;
                let (batch, total) = self.enqueue(file, &reqs, base, false);
                in_flight.0.push_back((batch, total, (k % halves) * call));
                next += total;
                k += 1;
            }
            let Some((batch, total, offset)) = in_flight.0.pop_front() else {
                break;
            };
            done += batch.outcome(total)?;
            // SAFETY: this call's reads have finished and its bytes are
            // inside `buf`; the call in flight writes the other half only.
            let bytes = unsafe { std::slice::from_raw_parts(base.add(offset), total as usize) };
            if !each(bytes) {
                break;
            }
        }
        Ok(done)
    }

    /// Starts reading every request into `into`'s memory (request i's
    /// bytes land at `into.target()[req.buf_offset..][..req.len]`, checked
    /// as [`IoEngine::read`] checks them, alignment by address) and returns
    /// at once: the engine writes that memory until [`PendingRead::wait`]
    /// gives `into` back with the outcome. A reader thus queues its next
    /// block's reads before it hands this one on, and the disk never waits
    /// for it; with a tensor's memory as the target the bytes need no copy.
    pub fn read_behind<'f, T: ReadTarget>(
        &self,
        file: &'f IoFile,
        reqs: &[ReadReq],
        mut into: T,
    ) -> Result<PendingRead<'f, T>> {
        let dst = into.target();
        check_requests(file, reqs, dst)?;
        let base = dst.as_mut_ptr();
        let (batch, total) = self.enqueue(file, reqs, base, false);
        Ok(PendingRead {
            batch,
            total,
            into: Some(into),
            _file: std::marker::PhantomData,
        })
    }

    /// Writes every request from `buf` (request i's bytes come from
    /// `buf[req.buf_offset..][..req.len]` and go to the file at `req.offset`)
    /// and returns the bytes written, spread over the rings like reads. The
    /// file must come from [`IoEngine::open_write`]; on an O_DIRECT file the
    /// requests are page-aligned. Returns once no write of this call is in
    /// flight; the first error is returned.
    pub fn write(&self, file: &IoFile, reqs: &[ReadReq], buf: &AlignedBuf) -> Result<u64> {
        if !file.writable {
            return Err(invalid(file, "was not opened for writing".into()));
        }
        check_requests(file, reqs, buf.as_slice())?;
        // The workers only read through this pointer for a write; `buf` stays
        // borrowed until `submit` returns, after the last write from it.
        let base = buf.as_slice().as_ptr().cast_mut();
        self.submit(file, reqs, base, true)
    }

    /// Starts writing the requests from `buf` (as [`IoEngine::write`]) and
    /// returns at once: the engine holds the buffer and the file until the
    /// writes finish, and [`PendingWrite::wait`] gives the buffer back with
    /// the outcome. A caller thus gathers its next buffer while the disk
    /// takes the last one.
    pub fn write_behind(
        &self,
        file: &Arc<IoFile>,
        reqs: &[ReadReq],
        buf: AlignedBuf,
    ) -> Result<PendingWrite> {
        if !file.writable {
            return Err(invalid(file, "was not opened for writing".into()));
        }
        check_requests(file, reqs, buf.as_slice())?;
        let base = buf.as_slice().as_ptr().cast_mut();
        let (batch, total) = self.enqueue(file, reqs, base, true);
        Ok(PendingWrite {
            batch,
            total,
            buf: Some(buf),
            _file: Arc::clone(file),
        })
    }

    /// Cuts the requests into pieces, queues them and waits for the last.
    fn submit(&self, file: &IoFile, reqs: &[ReadReq], base: *mut u8, write: bool) -> Result<u64> {
        let (batch, total) = self.enqueue(file, reqs, base, write);
        // The buffer and `file` stay borrowed until every piece has finished:
        // the kernel and the workers use `dst` only before that.
        batch.outcome(total)
    }

    /// Cuts the requests into pieces and queues them; the batch is finished
    /// once every piece is (at once when there are none). The caller keeps
    /// the buffer behind `base` and the file alive until then.
    fn enqueue(
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
                    // In bounds: `check_requests` saw `buf_offset + len <= buf.len()`.
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
            self.queue.push(pieces);
        }
        (batch, total)
    }
}

/// The calls [`IoEngine::read_span`] has queued: each batch, its bytes and
/// where they land in the buffer. Waits for them all when dropped.
struct InFlight(std::collections::VecDeque<(Arc<Batch>, u64, usize)>);

impl Drop for InFlight {
    fn drop(&mut self) {
        for (batch, _, _) in &self.0 {
            batch.wait();
        }
    }
}

/// A write started by [`IoEngine::write_behind`]: it owns the buffer (and a
/// handle on the file) until the write is done. Dropping it waits for the
/// write; leaking it leaks the buffer, which the kernel may still read.
pub struct PendingWrite {
    batch: Arc<Batch>,
    total: u64,
    buf: Option<AlignedBuf>,
    _file: Arc<IoFile>,
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

/// Memory that [`IoEngine::read_behind`] reads into while its owner goes
/// on: a value that owns heap memory, which stays where it is however the
/// value is moved.
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

/// A read started by [`IoEngine::read_behind`]: it owns the memory read
/// into until the reads are done, and borrows the file. Dropping it waits
/// for them; leaking it leaks the memory, which the kernel may still write.
pub struct PendingRead<'f, T: ReadTarget> {
    batch: Arc<Batch>,
    total: u64,
    into: Option<T>,
    _file: std::marker::PhantomData<&'f IoFile>,
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

impl Drop for IoEngine {
    fn drop(&mut self) {
        self.queue.close();
        for worker in self.workers.drain(..) {
            // A worker that panicked has nothing left in flight worth reporting.
            let _ = worker.join();
        }
    }
}

fn invalid(file: &IoFile, what: String) -> Error {
    Error::InvalidArgument(format!("{}: {what}", file.path.display()))
}

/// Refuses requests that do not fit the buffer, overlap there, reach past
/// what `pread` can address, or break O_DIRECT's alignment.
fn check_requests(file: &IoFile, reqs: &[ReadReq], buf: &[u8]) -> Result<()> {
    let base = buf.as_ptr() as usize;
    let mut dests = Vec::with_capacity(reqs.len());
    let mut sorted = true;
    for (i, req) in reqs.iter().enumerate() {
        let end = req
            .buf_offset
            .checked_add(req.len)
            .filter(|&end| end <= buf.len())
            .ok_or_else(|| {
                invalid(
                    file,
                    format!(
                        "read request {i} (buffer offset {}, length {}) does not fit the {}-byte buffer",
                        req.buf_offset,
                        req.len,
                        buf.len()
                    ),
                )
            })?;
        let fits_off_t = req
            .offset
            .checked_add(req.len as u64)
            .is_some_and(|end| end <= i64::MAX as u64);
        if !fits_off_t {
            return Err(invalid(
                file,
                format!(
                    "read request {i} (offset {}, length {}) reaches past the largest file offset",
                    req.offset, req.len
                ),
            ));
        }
        if file.direct
            && !(req.offset.is_multiple_of(PAGE as u64)
                && req.len.is_multiple_of(PAGE)
                && (base + req.buf_offset).is_multiple_of(PAGE))
        {
            return Err(invalid(
                file,
                format!(
                    "read request {i} (offset {}, length {}, buffer offset {}{}) is not aligned to {PAGE} bytes, which O_DIRECT requires",
                    req.offset,
                    req.len,
                    req.buf_offset,
                    match base % PAGE {
                        0 => String::new(),
                        off => format!(" in memory that starts {off} bytes into a page"),
                    }
                ),
            ));
        }
        if req.len > 0 {
            if let Some(&(prev_start, _, _)) = dests.last() {
                sorted &= prev_start <= req.buf_offset;
            }
            dests.push((req.buf_offset, end, i));
        }
    }
    // The trainer lays requests out in buffer order; sort only when it did not.
    if !sorted {
        dests.sort_unstable();
    }
    for pair in dests.windows(2) {
        let ((_, a_end, a), (b_start, _, b)) = (pair[0], pair[1]);
        if b_start < a_end {
            return Err(invalid(
                file,
                format!("read requests {a} and {b} overlap in the buffer"),
            ));
        }
    }
    Ok(())
}

/// The process-wide verdict on io_uring: `None` where it works, else why not.
fn io_uring_refusal() -> Option<&'static str> {
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

fn warn_fallback(why: &str) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if !WARNED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            "io_uring is not available ({why}); reading with a pool of pread threads instead"
        );
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // The data behind these locks stays consistent at every unlock, so a
    // panic elsewhere does not make it unusable.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One `read` call: the pieces still out, and the first error.
struct Batch {
    path: PathBuf,
    direct: bool,
    /// Writes from the buffer rather than reads into it.
    write: bool,
    remaining: AtomicUsize,
    failed: AtomicBool,
    error: Mutex<Option<Error>>,
    finished: Mutex<bool>,
    finished_cv: Condvar,
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

    fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Keeps the first error; pieces not yet started are then skipped.
    fn fail(&self, error: Error) {
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

    fn wait(&self) {
        let mut finished = lock(&self.finished);
        while !*finished {
            finished = self
                .finished_cv
                .wait(finished)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Waits for every piece; `total` bytes, or the first error.
    fn outcome(&self, total: u64) -> Result<u64> {
        self.wait();
        match lock(&self.error).take() {
            Some(e) => Err(e),
            None => Ok(total),
        }
    }
}

/// At most [`MAX_PIECE`] bytes of one request: the unit a ring or a `pread`
/// thread reads.
struct Piece {
    fd: RawFd,
    /// File offset of the piece's first byte.
    offset: u64,
    /// Where the piece's first byte lands in the caller's buffer.
    dst: *mut u8,
    len: usize,
    /// Bytes already read (short reads leave the rest to resubmit).
    done: usize,
    batch: Arc<Batch>,
}

// SAFETY: `dst` points into the buffer of the `read` (or `write`) call that
// made the piece. That call holds the buffer (`&mut` for a read, `&` for a
// write, which only reads through `dst`) and the `&IoFile` behind `fd`, and
// does not return before the piece is finished, so the memory and the
// descriptor outlive every use on the worker thread. A `write_behind` piece's
// buffer and file are owned by its `PendingWrite`, which frees neither before
// the piece is finished (its drop waits; a leaked one frees nothing), and the
// workers only read through `dst`; `check_requests` makes
// the pieces' ranges of the buffer disjoint, so no two threads write the
// same bytes.
unsafe impl Send for Piece {}

/// What a completed read means for its piece.
enum Progress {
    Complete,
    /// Short read: resubmit the remainder.
    More,
    EndOfFile,
}

impl Piece {
    fn next_offset(&self) -> u64 {
        self.offset + self.done as u64
    }

    fn remaining(&self) -> usize {
        self.len - self.done
    }

    fn next_dst(&self) -> *mut u8 {
        self.dst.wrapping_add(self.done)
    }

    /// Accounts for `n` bytes that arrived.
    fn advance(&mut self, n: usize) -> Progress {
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

    fn end_of_file(&self) -> Error {
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

    fn os_error(&self, e: io::Error) -> Error {
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

    fn finish(self) {
        self.batch.piece_finished();
    }
}

/// The pieces waiting for a ring or a `pread` thread.
struct WorkQueue {
    state: Mutex<QueueState>,
    ready: Condvar,
    workers: usize,
}

struct QueueState {
    pieces: VecDeque<Piece>,
    closed: bool,
}

impl WorkQueue {
    fn new(workers: usize) -> Self {
        WorkQueue {
            state: Mutex::new(QueueState {
                pieces: VecDeque::new(),
                closed: false,
            }),
            ready: Condvar::new(),
            workers,
        }
    }

    fn push(&self, pieces: Vec<Piece>) {
        lock(&self.state).pieces.extend(pieces);
        self.ready.notify_all();
    }

    fn close(&self) {
        lock(&self.state).closed = true;
        self.ready.notify_all();
    }

    /// Moves up to `room` pieces into `out`, but no more than a fair share
    /// of what is queued, so that one batch spreads over all the workers.
    /// With `wait`, sleeps while the queue is empty. Returns false once the
    /// engine is closed and nothing is queued.
    fn take(&self, room: usize, wait: bool, out: &mut Vec<Piece>) -> bool {
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

/// A `pread` thread: one piece at a time, to the end.
fn pread_worker(queue: &WorkQueue) {
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

/// An io_uring worker: keeps up to `depth` pieces in flight on its own ring,
/// takes more from the queue as slots free up, and resubmits short reads.
fn uring_worker(mut ring: IoUring, depth: usize, queue: &WorkQueue) {
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

#[cfg(test)]
mod tests {
    use std::io::Write;

    use rand::seq::SliceRandom;
    use rand::{Rng, RngCore, SeedableRng};
    use rand_pcg::Pcg64;

    use super::*;

    /// Says something the test run must show even when the test passes:
    /// libtest captures `eprintln!`, not writes to the stderr handle.
    fn announce(message: &str) {
        let _ = writeln!(io::stderr(), "io_engine tests: {message}");
    }

    /// An engine on `backend`, or `None` (announced) when io_uring is refused
    /// here. With OFFGNN_REQUIRE_IO_URING=1 a refusal fails the test instead.
    fn engine(backend: Backend, rings: usize, queue_depth: u32) -> Option<IoEngine> {
        let engine = IoEngine::new(IoOptions {
            rings,
            queue_depth,
            direct: true,
            force_pread: backend == Backend::Pread,
        });
        if engine.backend() == backend {
            return Some(engine);
        }
        let why = io_uring_refusal().unwrap_or("its rings could not be created");
        if std::env::var_os("OFFGNN_REQUIRE_IO_URING").is_some_and(|v| v == "1") {
            panic!("io_uring is required (OFFGNN_REQUIRE_IO_URING=1) but refused: {why}");
        }
        announce(&format!(
            "io_uring is refused on this machine ({why}): the io_uring half of this test did NOT run"
        ));
        None
    }

    /// A file of `len` pseudo-random bytes in a fresh directory under the
    /// system temp dir, and those bytes.
    struct Fixture {
        _dir: tempfile::TempDir,
        path: PathBuf,
        bytes: Vec<u8>,
    }

    fn fixture(len: usize, seed: u64) -> Fixture {
        let dir = tempfile::tempdir_in(std::env::temp_dir()).expect("a temp dir");
        let path = dir.path().join("features.bin");
        let mut bytes = vec![0u8; len];
        Pcg64::seed_from_u64(seed).fill_bytes(&mut bytes);
        std::fs::write(&path, &bytes).expect("writing the test file");
        Fixture {
            _dir: dir,
            path,
            bytes,
        }
    }

    fn open(engine: &IoEngine, fx: &Fixture) -> IoFile {
        let file = engine.open(&fx.path).expect("opening the test file");
        if !file.is_direct() {
            announce(&format!(
                "{} refuses O_DIRECT: testing the buffered path instead",
                std::env::temp_dir().display()
            ));
        }
        file
    }

    /// `count` page-aligned requests of 1 page to 2 MiB (mostly short, as
    /// disk-cache runs are, some long, as packed chunks are), laid out one
    /// after another in the buffer, then shuffled; and the buffer size.
    fn random_requests(rng: &mut Pcg64, file_pages: usize, count: usize) -> (Vec<ReadReq>, usize) {
        let mut reqs = Vec::with_capacity(count);
        let mut buf_offset = 0;
        for i in 0..count {
            let pages = if i == 0 {
                512
            } else if rng.random_bool(0.8) {
                rng.random_range(1..=16)
            } else {
                rng.random_range(17..=512)
            };
            let pages = pages.min(file_pages);
            let first = rng.random_range(0..=file_pages - pages);
            reqs.push(ReadReq {
                offset: (first * PAGE) as u64,
                len: pages * PAGE,
                buf_offset,
            });
            buf_offset += pages * PAGE;
        }
        reqs.shuffle(rng);
        (reqs, buf_offset)
    }

    fn assert_landed(fx: &Fixture, reqs: &[ReadReq], buf: &AlignedBuf) {
        for (i, req) in reqs.iter().enumerate() {
            let got = &buf.as_slice()[req.buf_offset..][..req.len];
            let want = &fx.bytes[req.offset as usize..][..req.len];
            assert!(got == want, "request {i} ({req:?}) read the wrong bytes");
        }
    }

    fn message<T: fmt::Debug>(result: Result<T>) -> String {
        match result {
            Ok(n) => panic!("expected an error, got {n:?}"),
            Err(e) => e.to_string(),
        }
    }

    // The suite below runs once per backend (see `both_backends!`).

    fn random_requests_match_file(backend: Backend) {
        let Some(engine) = engine(backend, 3, 8) else {
            return;
        };
        let fx = fixture(6 << 20, 1);
        let file = open(&engine, &fx);
        let mut rng = Pcg64::seed_from_u64(2);
        let (reqs, len) = random_requests(&mut rng, fx.bytes.len() / PAGE, 150);
        let mut buf = AlignedBuf::new(len);
        let read = engine.read(&file, &reqs, &mut buf).expect("reading");
        assert_eq!(read, len as u64);
        assert_landed(&fx, &reqs, &buf);
    }

    fn whole_file_in_one_request(backend: Backend) {
        // 6 MiB in one request: six pieces, spread over two rings of depth 2.
        let Some(engine) = engine(backend, 2, 2) else {
            return;
        };
        let fx = fixture(6 << 20, 3);
        let file = open(&engine, &fx);
        let reqs = [ReadReq {
            offset: 0,
            len: fx.bytes.len(),
            buf_offset: PAGE,
        }];
        let mut buf = AlignedBuf::new(PAGE + fx.bytes.len());
        assert_eq!(
            engine.read(&file, &reqs, &mut buf).expect("reading"),
            6 << 20
        );
        assert!(
            buf.as_slice()[..PAGE].iter().all(|&b| b == 0),
            "bytes before the request were written"
        );
        assert_landed(&fx, &reqs, &buf);
    }

    fn reads_at_end_of_file(backend: Backend) {
        let Some(engine) = engine(backend, 2, 4) else {
            return;
        };
        // Five whole pages and a last page of 100 bytes.
        let fx = fixture(5 * PAGE + 100, 4);
        let file = open(&engine, &fx);
        let last_whole = [ReadReq {
            offset: 3 * PAGE as u64,
            len: 2 * PAGE,
            buf_offset: 0,
        }];
        let mut buf = AlignedBuf::new(2 * PAGE);
        assert_eq!(
            engine.read(&file, &last_whole, &mut buf).expect("reading"),
            2 * PAGE as u64
        );
        assert_landed(&fx, &last_whole, &buf);

        // A whole page asked of the short last page: the data ends after 100
        // bytes, direct or not, and that is an error that says where.
        let past_end = [ReadReq {
            offset: 4 * PAGE as u64,
            len: 2 * PAGE,
            buf_offset: 0,
        }];
        let text = message(engine.read(&file, &past_end, &mut buf));
        assert!(text.contains(&fx.path.display().to_string()), "{text}");
        assert!(
            text.contains(&format!("end of file at offset {}", 5 * PAGE + 100)),
            "{text}"
        );

        // Buffered, the short last page can be read to its last byte.
        let buffered = IoEngine::new(IoOptions {
            direct: false,
            ..engine.options()
        });
        let file = buffered.open(&fx.path).expect("opening buffered");
        assert!(!file.is_direct());
        let tail = [ReadReq {
            offset: 5 * PAGE as u64,
            len: 100,
            buf_offset: 0,
        }];
        assert_eq!(
            buffered
                .read(&file, &tail, &mut buf)
                .expect("reading the tail"),
            100
        );
        assert_landed(&fx, &tail, &buf);
        let text = message(buffered.read(&file, &past_end, &mut buf));
        assert!(
            text.contains(&format!("end of file at offset {}", 5 * PAGE + 100)),
            "{text}"
        );
    }

    fn unaligned_requests_are_refused_on_direct_file(backend: Backend) {
        let Some(engine) = engine(backend, 2, 4) else {
            return;
        };
        let fx = fixture(8 * PAGE, 5);
        let file = open(&engine, &fx);
        let unaligned = [
            ReadReq {
                offset: 512,
                len: PAGE,
                buf_offset: 0,
            },
            ReadReq {
                offset: 0,
                len: 100,
                buf_offset: 0,
            },
            ReadReq {
                offset: 0,
                len: PAGE,
                buf_offset: 512,
            },
        ];
        let mut buf = AlignedBuf::new(4 * PAGE);
        if !file.is_direct() {
            announce("no O_DIRECT here: checking that unaligned reads work buffered instead");
            for req in unaligned {
                engine
                    .read(&file, &[req], &mut buf)
                    .expect("an unaligned buffered read");
                assert_landed(&fx, &[req], &buf);
            }
            return;
        }
        for req in unaligned {
            // A good request first: the refusal must come before any read.
            let reqs = [
                ReadReq {
                    offset: 0,
                    len: PAGE,
                    buf_offset: 2 * PAGE,
                },
                req,
            ];
            match engine.read(&file, &reqs, &mut buf) {
                Err(Error::InvalidArgument(text)) => {
                    assert!(text.contains(&fx.path.display().to_string()), "{text}");
                    assert!(text.contains("not aligned to 4096 bytes"), "{text}");
                }
                other => {
                    panic!("{req:?} on an O_DIRECT file: expected InvalidArgument, got {other:?}")
                }
            }
            assert!(
                buf.as_slice().iter().all(|&b| b == 0),
                "a refused call read something"
            );
        }
    }

    fn empty_request_lists_read_nothing(backend: Backend) {
        let Some(engine) = engine(backend, 2, 4) else {
            return;
        };
        let fx = fixture(4 * PAGE, 6);
        let file = open(&engine, &fx);
        let mut buf = AlignedBuf::new(2 * PAGE);
        buf.as_mut_slice().fill(0xEE);
        assert_eq!(engine.read(&file, &[], &mut buf).expect("no requests"), 0);
        let empty = [ReadReq {
            offset: 0,
            len: 0,
            buf_offset: 0,
        }; 3];
        assert_eq!(
            engine
                .read(&file, &empty, &mut buf)
                .expect("empty requests"),
            0
        );
        assert!(
            buf.as_slice().iter().all(|&b| b == 0xEE),
            "an empty read wrote to the buffer"
        );
    }

    fn short_file_is_an_error_naming_the_file(backend: Backend) {
        let Some(engine) = engine(backend, 2, 4) else {
            return;
        };
        let fx = fixture(2 * PAGE, 7);
        let file = open(&engine, &fx);
        let mut buf = AlignedBuf::new(4 * PAGE);
        let path = fx.path.display().to_string();

        let beyond = [ReadReq {
            offset: 4 * PAGE as u64,
            len: PAGE,
            buf_offset: 0,
        }];
        let text = message(engine.read(&file, &beyond, &mut buf));
        assert!(
            text.contains(&path) && text.contains("end of file at offset 16384"),
            "{text}"
        );

        // Good requests around one that runs past the end: still an error.
        let across = [
            ReadReq {
                offset: 0,
                len: PAGE,
                buf_offset: 0,
            },
            ReadReq {
                offset: PAGE as u64,
                len: 2 * PAGE,
                buf_offset: PAGE,
            },
            ReadReq {
                offset: PAGE as u64,
                len: PAGE,
                buf_offset: 3 * PAGE,
            },
        ];
        let text = message(engine.read(&file, &across, &mut buf));
        assert!(
            text.contains(&path) && text.contains("end of file at offset 8192"),
            "{text}"
        );

        // The engine is still good after an error.
        let good = [ReadReq {
            offset: 0,
            len: 2 * PAGE,
            buf_offset: 0,
        }];
        assert_eq!(
            engine
                .read(&file, &good, &mut buf)
                .expect("reading after an error"),
            2 * PAGE as u64
        );
        assert_landed(&fx, &good, &buf);
    }

    fn spans_hand_their_bytes_in_order(backend: Backend) {
        let Some(engine) = engine(backend, 2, 4) else {
            return;
        };
        let fx = fixture(3 << 20, 11);
        let file = open(&engine, &fx);
        let (request, per_call) = (64 << 10, 3);
        let call = request * per_call;
        // From page 5 to the end: 13 calls (the last short), with room for
        // one call (each waits for the last) and for two (the next is read
        // while `each` works, into the other half).
        let from = 5 * PAGE;
        for room in [call, 2 * call] {
            let mut buf = AlignedBuf::new(room);
            let mut got = Vec::new();
            let mut sizes = Vec::new();
            let n = engine
                .read_span(
                    &file,
                    (from as u64, fx.bytes.len() as u64),
                    request,
                    per_call,
                    &mut buf,
                    |bytes| {
                        got.extend_from_slice(bytes);
                        sizes.push(bytes.len());
                        true
                    },
                )
                .expect("reading the span");
            assert_eq!(n as usize, fx.bytes.len() - from, "room {room}");
            assert!(
                got == fx.bytes[from..],
                "room {room}: the bytes or their order differ"
            );
            assert_eq!(sizes.len(), (fx.bytes.len() - from).div_ceil(call));
            assert!(sizes[..sizes.len() - 1].iter().all(|&s| s == call));
            // Stopped after the third call: three calls' bytes handed over.
            let mut calls = 0;
            let n = engine
                .read_span(
                    &file,
                    (0, fx.bytes.len() as u64),
                    request,
                    per_call,
                    &mut buf,
                    |_| {
                        calls += 1;
                        calls < 3
                    },
                )
                .expect("reading the span");
            assert_eq!((calls, n), (3, 3 * call as u64), "room {room}");
            // A span past the end: the error names the file, after the
            // calls before it were handed over.
            let mut handed = 0;
            let err = message(engine.read_span(
                &file,
                (0, fx.bytes.len() as u64 + call as u64),
                request,
                per_call,
                &mut buf,
                |bytes| {
                    handed += bytes.len();
                    true
                },
            ));
            assert!(err.contains("end of file"), "{err}");
            assert!(handed < fx.bytes.len() + call && handed % call == 0);
        }
        // The engine is still good after the error.
        assert_eq!(
            engine
                .read_sequential(&file, fx.bytes.len() as u64, request, 4, |_| {})
                .expect("reading after an error"),
            fx.bytes.len() as u64
        );
    }

    fn bad_destinations_are_refused(backend: Backend) {
        let Some(engine) = engine(backend, 2, 4) else {
            return;
        };
        let fx = fixture(8 * PAGE, 8);
        let file = open(&engine, &fx);
        let mut buf = AlignedBuf::new(4 * PAGE);
        let outside = [ReadReq {
            offset: 0,
            len: 2 * PAGE,
            buf_offset: 3 * PAGE,
        }];
        let text = message(engine.read(&file, &outside, &mut buf));
        assert!(
            text.contains("does not fit the 16384-byte buffer"),
            "{text}"
        );
        let overlapping = [
            ReadReq {
                offset: 0,
                len: PAGE,
                buf_offset: 2 * PAGE,
            },
            ReadReq {
                offset: 0,
                len: PAGE,
                buf_offset: 0,
            },
            ReadReq {
                offset: 0,
                len: 2 * PAGE,
                buf_offset: PAGE,
            },
        ];
        let text = message(engine.read(&file, &overlapping, &mut buf));
        assert!(text.contains("overlap in the buffer"), "{text}");
        // Adjacent is fine.
        let adjacent = [
            ReadReq {
                offset: 0,
                len: PAGE,
                buf_offset: 2 * PAGE,
            },
            ReadReq {
                offset: 4 * PAGE as u64,
                len: 2 * PAGE,
                buf_offset: 0,
            },
        ];
        engine
            .read(&file, &adjacent, &mut buf)
            .expect("adjacent destinations");
        assert_landed(&fx, &adjacent, &buf);
    }

    fn threads_share_one_engine(backend: Backend) {
        let Some(engine) = engine(backend, 2, 4) else {
            return;
        };
        let fx = fixture(4 << 20, 9);
        let file = open(&engine, &fx);
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let (engine, file, fx) = (&engine, &file, &fx);
                scope.spawn(move || {
                    let mut rng = Pcg64::seed_from_u64(100 + t);
                    for _ in 0..10 {
                        let (reqs, len) = random_requests(&mut rng, fx.bytes.len() / PAGE, 20);
                        let mut buf = AlignedBuf::new(len);
                        let read = engine.read(file, &reqs, &mut buf).expect("reading");
                        assert_eq!(read, len as u64);
                        assert_landed(fx, &reqs, &buf);
                    }
                });
            }
        });
    }

    fn writes_land_where_asked(backend: Backend) {
        let Some(engine) = engine(backend, 2, 4) else {
            return;
        };
        let fx = fixture(3 << 20, 21);
        // Scattered page-aligned writes of random bytes, some longer than a
        // piece, then everything read back.
        let mut rng = Pcg64::seed_from_u64(5);
        let (reqs, len) = random_requests(&mut rng, fx.bytes.len() / PAGE, 12);
        // Requests may overlap in the file: keep the first of overlapping ones.
        let mut taken = vec![false; fx.bytes.len() / PAGE];
        let reqs: Vec<ReadReq> = reqs
            .into_iter()
            .filter(|r| {
                let pages = r.offset as usize / PAGE..(r.offset as usize + r.len) / PAGE;
                let free = pages.clone().all(|p| !taken[p]);
                if free {
                    pages.for_each(|p| taken[p] = true);
                }
                free
            })
            .collect();
        let mut src = AlignedBuf::new(len);
        rng.fill_bytes(src.as_mut_slice());
        let file = engine.open_write(&fx.path).expect("opening for writing");
        let written = engine.write(&file, &reqs, &src).expect("writing");
        assert_eq!(written, reqs.iter().map(|r| r.len as u64).sum::<u64>());
        let mut want = fx.bytes.clone();
        for r in &reqs {
            want[r.offset as usize..][..r.len]
                .copy_from_slice(&src.as_slice()[r.buf_offset..][..r.len]);
        }
        assert!(
            std::fs::read(&fx.path).unwrap() == want,
            "the file holds what was written"
        );
        // A file opened for reading refuses writes.
        let read_only = open(&engine, &fx);
        let err = message(engine.write(&read_only, &reqs, &src));
        assert!(err.contains("not opened for writing"), "{err}");
    }

    fn writes_behind_land_where_asked(backend: Backend) {
        let Some(engine) = engine(backend, 2, 4) else {
            return;
        };
        let fx = fixture(3 << 20, 22);
        let file = Arc::new(engine.open_write(&fx.path).expect("opening for writing"));
        // Eight buffers in flight at once, each to its own 384 KiB run (more
        // than one piece for some), then two more: one waited for, one only
        // dropped.
        let mut rng = Pcg64::seed_from_u64(6);
        let run = 96 * PAGE;
        let mut want = fx.bytes.clone();
        let mut pending = Vec::new();
        for k in 0..8 {
            let mut buf = AlignedBuf::new(run + PAGE);
            rng.fill_bytes(buf.as_mut_slice());
            let req = ReadReq {
                offset: (k * run) as u64,
                len: run,
                buf_offset: PAGE,
            };
            want[k * run..][..run].copy_from_slice(&buf.as_slice()[PAGE..]);
            pending.push(engine.write_behind(&file, &[req], buf).expect("queued"));
        }
        for p in pending {
            let (written, buf) = p.wait();
            assert_eq!(written.expect("written"), run as u64);
            assert_eq!(buf.len(), run + PAGE, "the buffer comes back whole");
        }
        let mut last = AlignedBuf::new(PAGE);
        rng.fill_bytes(last.as_mut_slice());
        let at = fx.bytes.len() - PAGE;
        want[at..].copy_from_slice(last.as_slice());
        let req = ReadReq {
            offset: at as u64,
            len: PAGE,
            buf_offset: 0,
        };
        drop(engine.write_behind(&file, &[req], last).expect("queued"));
        // No requests: finished at once.
        let (written, _) = engine
            .write_behind(&file, &[], AlignedBuf::new(PAGE))
            .expect("queued")
            .wait();
        assert_eq!(written.expect("nothing to write"), 0);
        assert!(
            std::fs::read(&fx.path).unwrap() == want,
            "the file holds what was written"
        );
        // A request that does not fit its buffer is refused before any write.
        let req = ReadReq {
            offset: 0,
            len: 2 * PAGE,
            buf_offset: 0,
        };
        let err = message(engine.write_behind(&file, &[req], AlignedBuf::new(PAGE)));
        assert!(err.contains("does not fit"), "{err}");
        let read_only = Arc::new(open(&engine, &fx));
        let err = message(engine.write_behind(&read_only, &[], AlignedBuf::new(PAGE)));
        assert!(err.contains("not opened for writing"), "{err}");
    }

    /// Memory a page into an allocation, or 64 bytes past a page.
    struct Offset(AlignedBuf, usize);

    // SAFETY: a fixed window of the buffer's own pages.
    unsafe impl ReadTarget for Offset {
        fn target(&mut self) -> &mut [u8] {
            &mut self.0.as_mut_slice()[self.1..]
        }
    }

    fn reads_behind_land_in_their_memory(backend: Backend) {
        let Some(engine) = engine(backend, 2, 4) else {
            return;
        };
        let fx = fixture(2 << 20, 13);
        let file = open(&engine, &fx);
        let block = 256 << 10;
        let reqs = |at: usize| -> Vec<ReadReq> {
            (0..4)
                .map(|i| ReadReq {
                    offset: (at + i * (block / 4)) as u64,
                    len: block / 4,
                    buf_offset: i * (block / 4),
                })
                .collect()
        };
        // Two blocks in flight at once, each into its own memory, a page
        // into an allocation; then the next two into the same memories.
        let mut memories = vec![
            Offset(AlignedBuf::new(block + PAGE), PAGE),
            Offset(AlignedBuf::new(block + PAGE), PAGE),
        ];
        let mut got = Vec::new();
        for pair in 0..4 {
            let pending: Vec<_> = (0..2)
                .map(|k| {
                    let at = (2 * pair + k) * block;
                    engine
                        .read_behind(&file, &reqs(at), memories.pop().expect("two memories"))
                        .expect("queued")
                })
                .collect();
            for p in pending {
                let (n, mut into) = p.wait();
                assert_eq!(n.expect("read"), block as u64);
                got.extend_from_slice(into.target());
                memories.push(into);
            }
        }
        assert!(got == fx.bytes, "the blocks' bytes or their order differ");
        // Dropped unwaited: the drop waits for the reads.
        drop(
            engine
                .read_behind(&file, &reqs(0), Offset(AlignedBuf::new(block), 0))
                .expect("queued"),
        );
        // Past the end: the error comes with the memory.
        let (err, _) = engine
            .read_behind(
                &file,
                &reqs(fx.bytes.len()),
                Offset(AlignedBuf::new(block), 0),
            )
            .expect("queued")
            .wait();
        assert!(message(err).contains("features.bin"));
        // Too small, or (O_DIRECT) at an address off a page: refused
        // before anything is queued.
        let err =
            message(engine.read_behind(&file, &reqs(0), Offset(AlignedBuf::new(block), PAGE)));
        assert!(err.contains("does not fit"), "{err}");
        let off_page = engine.read_behind(&file, &reqs(0), Offset(AlignedBuf::new(block + 64), 64));
        if file.is_direct() {
            let err = message(off_page);
            assert!(err.contains("starts 64 bytes into a page"), "{err}");
        } else {
            let (n, into) = off_page.expect("buffered reads need no alignment").wait();
            assert_eq!(n.expect("read"), block as u64);
            assert!(into.0.as_slice()[64..] == fx.bytes[..block]);
        }
    }

    macro_rules! both_backends {
        ($($case:ident),* $(,)?) => {
            mod on_io_uring {
                $( #[test] fn $case() { super::$case(super::Backend::IoUring) } )*
            }
            mod on_pread {
                $( #[test] fn $case() { super::$case(super::Backend::Pread) } )*
            }
        };
    }

    both_backends!(
        writes_land_where_asked,
        writes_behind_land_where_asked,
        random_requests_match_file,
        whole_file_in_one_request,
        reads_at_end_of_file,
        unaligned_requests_are_refused_on_direct_file,
        empty_request_lists_read_nothing,
        short_file_is_an_error_naming_the_file,
        bad_destinations_are_refused,
        threads_share_one_engine,
        spans_hand_their_bytes_in_order,
        reads_behind_land_in_their_memory,
    );

    #[test]
    fn force_pread_selects_the_fallback() {
        let engine = IoEngine::new(IoOptions {
            force_pread: true,
            ..IoOptions::default()
        });
        assert_eq!(engine.backend(), Backend::Pread);
    }

    #[test]
    fn io_uring_is_chosen_where_it_works() {
        let engine = IoEngine::new(IoOptions::default());
        match io_uring_refusal() {
            None => assert_eq!(engine.backend(), Backend::IoUring),
            Some(why) => {
                announce(&format!(
                    "io_uring refused here ({why}); the engine fell back to pread"
                ));
                assert_eq!(engine.backend(), Backend::Pread);
            }
        }
    }

    #[test]
    fn backends_read_identical_bytes() {
        let Some(uring) = engine(Backend::IoUring, 4, 16) else {
            return;
        };
        let pread = engine(Backend::Pread, 4, 16).expect("pread is always there");
        let fx = fixture(3 << 20, 10);
        let mut rng = Pcg64::seed_from_u64(11);
        let (reqs, len) = random_requests(&mut rng, fx.bytes.len() / PAGE, 60);
        let mut bufs = [AlignedBuf::new(len), AlignedBuf::new(len)];
        for (engine, buf) in [&uring, &pread].into_iter().zip(&mut bufs) {
            let file = open(engine, &fx);
            assert_eq!(engine.read(&file, &reqs, buf).expect("reading"), len as u64);
        }
        assert!(
            bufs[0].as_slice() == bufs[1].as_slice(),
            "io_uring and pread disagree"
        );
        assert_landed(&fx, &reqs, &bufs[0]);
    }

    #[test]
    fn aligned_buf_is_aligned_zeroed_and_resizes() {
        // The first `n` bytes still hold the pattern written below.
        let kept = |buf: &AlignedBuf, n: usize| {
            buf.as_slice()[..n]
                .iter()
                .enumerate()
                .all(|(i, &b)| b == i as u8 | 1)
        };
        let empty = AlignedBuf::new(0);
        assert!(empty.is_empty() && empty.as_slice().is_empty());
        assert_eq!(empty.as_slice().as_ptr() as usize % PAGE, 0);

        let mut buf = AlignedBuf::new(5000);
        assert_eq!((buf.len(), buf.capacity()), (5000, 2 * PAGE));
        assert_eq!(buf.as_slice().as_ptr() as usize % PAGE, 0);
        assert!(buf.as_slice().iter().all(|&b| b == 0));
        for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
            *b = i as u8 | 1;
        }
        // Growing past the capacity reallocates, still aligned, prefix kept.
        buf.resize(100_000);
        assert_eq!(buf.as_slice().as_ptr() as usize % PAGE, 0);
        assert!(kept(&buf, 5000));
        assert!(buf.as_slice()[5000..].iter().all(|&b| b == 0));
        // Shrinking then growing within the capacity zeroes the regrown bytes.
        buf.resize(10);
        assert_eq!(buf.len(), 10);
        buf.resize(5000);
        assert!(kept(&buf, 10));
        assert!(buf.as_slice()[10..].iter().all(|&b| b == 0));
        // Past `HUGE_PAGE` the buffer is a mapping of its own: zeroed,
        // aligned, the prefix kept across a move from the heap and between
        // mappings.
        buf.resize(HUGE_PAGE + 1);
        assert_eq!(buf.capacity(), HUGE_PAGE + PAGE);
        assert_eq!(buf.as_slice().as_ptr() as usize % PAGE, 0);
        assert!(kept(&buf, 10));
        assert!(buf.as_slice()[10..].iter().all(|&b| b == 0));
        buf.as_mut_slice()[HUGE_PAGE] = 7;
        buf.resize(3 * HUGE_PAGE);
        assert_eq!(buf.as_slice()[HUGE_PAGE], 7);
        assert!(buf.as_slice()[HUGE_PAGE + 1..].iter().all(|&b| b == 0));
        let big = AlignedBuf::new(5 * HUGE_PAGE);
        assert!(big.as_slice().iter().all(|&b| b == 0));
    }

    #[test]
    fn engine_and_buffers_cross_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<IoEngine>();
        send_sync::<IoFile>();
        send_sync::<AlignedBuf>();
    }
}
