//! The engine itself: its options, the choice of backend and worker threads,
//! and the calls that read and write byte ranges (DiskGNN §6, "I/O operations").

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::{fmt, io};

use io_uring::IoUring;

use super::buffers::AlignedBuf;
use super::files::IoFile;
use super::pending::{InFlight, PendingRead, PendingWrite, ReadTarget};
use super::pread::pread_worker;
use super::queue::WorkQueue;
use super::requests::{ReadReq, check_requests, invalid};
use super::uring::{io_uring_refusal, uring_worker, warn_fallback};
use crate::{Error, Result};

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
    /// Bytes of a gap between two reads of one file that are cheaper to
    /// read through than to ask for separately (0: never). The engine
    /// reads what it is asked; callers that lay out their own buffers (the
    /// trainer's packed reads) merge their requests by it.
    pub read_through: usize,
}

impl Default for IoOptions {
    fn default() -> Self {
        IoOptions {
            rings: 4,
            queue_depth: 64,
            direct: true,
            force_pread: false,
            read_through: 0,
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
        self.submit(file, reqs, Memory::ReadInto(buf.as_mut_slice()))
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
        let (base, buf_len) = (buf.as_mut_ptr(), buf.len());
        // Calls in flight, in file order; dropped (on an error, an early
        // stop or a panic in `each`), it waits for them: `buf` stays
        // borrowed mutably until this returns, after the last read into it.
        let mut in_flight = InFlight(std::collections::VecDeque::new());
        let (mut next, mut k, mut done) = (from, 0usize, 0u64);
        loop {
            while in_flight.0.len() < halves && next < end {
                let reqs = reqs_at(next, k % halves);
                check_requests(file, &reqs, base, buf_len)?;
                // SAFETY: the requests fit `buf` (just checked) and lie in
                // half `k % halves`, which no call in flight reads into and
                // `each` no longer reads (its slice ended with its call).
                // `buf` and `file` stay borrowed until this returns, and
                // `in_flight` waits for every queued call when dropped, also
                // on an early return or a panic.
                let (batch, total) = unsafe { self.queue.enqueue(file, &reqs, base, false) };
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
        let (base, len) = (dst.as_mut_ptr(), dst.len());
        check_requests(file, reqs, base, len)?;
        // SAFETY: the requests fit `into`'s memory (just checked), which by
        // `ReadTarget`'s contract stays where it is, allocated and touched
        // only through `target`, while `into` lives. The `PendingRead` owns
        // `into` and gives it back or drops it only once the batch is
        // finished, and borrows `file` as long. A leaked one frees nothing,
        // and were `file` closed, a read through its descriptor would fail
        // or land only in that leaked memory.
        let (batch, total) = unsafe { self.queue.enqueue(file, reqs, base, false) };
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
        self.submit(file, reqs, Memory::WriteFrom(buf.as_slice()))
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
        let base = buf.as_ptr().cast_mut();
        check_requests(file, reqs, base, buf.len())?;
        // SAFETY: the requests fit `buf` (just checked) and the workers only
        // read it. Its pages stay where they are as it moves into the
        // `PendingWrite`, which holds it and `file` until the batch is
        // finished (`wait` and its drop wait; a leaked one frees neither).
        let (batch, total) = unsafe { self.queue.enqueue(file, reqs, base, true) };
        Ok(PendingWrite {
            batch,
            total,
            buf: Some(buf),
            _file: Arc::clone(file),
        })
    }

    /// Checks the requests against `memory`, queues their pieces and waits
    /// for the last, so that the borrow of `memory` outlasts every use.
    fn submit(&self, file: &IoFile, reqs: &[ReadReq], memory: Memory<'_>) -> Result<u64> {
        let (base, len, write) = match memory {
            Memory::ReadInto(buf) => (buf.as_mut_ptr(), buf.len(), false),
            Memory::WriteFrom(buf) => (buf.as_ptr().cast_mut(), buf.len(), true),
        };
        check_requests(file, reqs, base, len)?;
        // SAFETY: the requests fit the memory (just checked), which is
        // borrowed, mutably for a read, as `file` is, until this returns;
        // `outcome` returns only once every piece has finished. A write's
        // workers only read through `base`.
        let (batch, total) = unsafe { self.queue.enqueue(file, reqs, base, write) };
        batch.outcome(total)
    }
}

/// The memory of a call that waits for its pieces.
enum Memory<'b> {
    /// Read into: the workers write it.
    ReadInto(&'b mut [u8]),
    /// Written from: the workers only read it.
    WriteFrom(&'b [u8]),
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

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::path::PathBuf;

    use rand::seq::SliceRandom;
    use rand::{Rng, RngCore, SeedableRng};
    use rand_pcg::Pcg64;

    use super::*;
    use crate::io_engine::PAGE;

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
            read_through: 0,
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
    fn engine_and_buffers_cross_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<IoEngine>();
        send_sync::<IoFile>();
        send_sync::<AlignedBuf>();
    }
}
