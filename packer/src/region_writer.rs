//! Writing the layout's objects as DiskGNN §5.2 asks, in large sequential
//! writes: every region (a cache block, a disk cache, a packed chunk)
//! starts on a 4 KiB page and is appended front to back in whole pages
//! with O_DIRECT (a row that straddles a page boundary waits in the
//! region's carry), gathered in stage buffers that go to the disk behind
//! while the next fills (`WritePool`).

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use offgnn_manifests::Object;
use offgnn_shared::io_engine::{AlignedBuf, IoEngine, IoFile, PAGE, PendingWrite, ReadReq};

use crate::crc::RunCrcs;
use crate::error::{Error, Result};

/// Bytes gathered per direct write (plus a page for the carried tail).
const STAGE_BYTES: usize = (4 << 20) + PAGE;
/// Stage buffers at most: one being filled by each gathering thread and
/// the others on their way to the disk. 16 x 4 MiB stays inside the
/// packer's baseline memory (`memory::BASELINE_BYTES`).
pub const MAX_STAGES: usize = 16;
/// The most memory the stage buffers take.
pub const STAGE_POOL_BYTES: u64 = (MAX_STAGES * STAGE_BYTES) as u64;

/// The stage buffers rows are gathered in, shared by the threads that
/// gather, and the direct writes in flight from them (write-behind: a
/// thread hands a full buffer to the engine and fills the next while the
/// disk takes it). A buffer comes back when its write is waited for.
pub struct WritePool<'e> {
    engine: &'e IoEngine,
    capacity: usize,
    state: Mutex<PoolState>,
    returned: Condvar,
}

#[derive(Default)]
struct PoolState {
    free: Vec<AlignedBuf>,
    allocated: usize,
    in_flight: VecDeque<PendingWrite>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The pool's state is consistent at every unlock.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<'e> WritePool<'e> {
    /// A pool of at most `MAX_STAGES` buffers, two per thread that gathers
    /// (so each can fill one while its last one is written).
    pub fn new(engine: &'e IoEngine) -> Self {
        WritePool {
            engine,
            capacity: (2 * rayon::current_num_threads() + 2).min(MAX_STAGES),
            state: Mutex::new(PoolState::default()),
            returned: Condvar::new(),
        }
    }

    /// A stage buffer: a free one, a new one while under the cap, else the
    /// buffer of the oldest write in flight once it is done (its error, if
    /// any, is returned here).
    fn take(&self) -> Result<AlignedBuf> {
        let mut state = lock(&self.state);
        loop {
            if let Some(buf) = state.free.pop() {
                return Ok(buf);
            }
            if state.allocated < self.capacity {
                state.allocated += 1;
                drop(state);
                return Ok(AlignedBuf::new(STAGE_BYTES));
            }
            if let Some(oldest) = state.in_flight.pop_front() {
                drop(state);
                let (written, buf) = oldest.wait();
                if let Err(e) = written {
                    self.give(buf);
                    return Err(e.into());
                }
                return Ok(buf);
            }
            // Every buffer is being filled by another thread.
            state = self
                .returned
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Returns a buffer that goes to no write.
    fn give(&self, buf: AlignedBuf) {
        lock(&self.state).free.push(buf);
        self.returned.notify_one();
    }

    /// Writes the first `len` bytes of `buf` (whole pages) at a
    /// page-aligned `offset` of `out`: behind, through the engine, where
    /// the file is open with O_DIRECT, else at once through the page cache.
    fn write(&self, out: &OutFile, offset: u64, buf: AlignedBuf, len: usize) -> Result<()> {
        debug_assert!(offset.is_multiple_of(PAGE as u64) && len.is_multiple_of(PAGE));
        out.crcs.record(offset, &buf.as_slice()[..len]);
        match &out.direct {
            Some(direct) => {
                let req = ReadReq {
                    offset,
                    len,
                    buf_offset: 0,
                };
                // The length is the request's; the buffer keeps its size.
                match self.engine.write_behind(direct, &[req], buf) {
                    Ok(pending) => {
                        lock(&self.state).in_flight.push_back(pending);
                        self.returned.notify_one();
                        Ok(())
                    }
                    Err(e) => {
                        // The buffer is gone: a waiting thread may make a new one.
                        lock(&self.state).allocated -= 1;
                        self.returned.notify_one();
                        Err(e.into())
                    }
                }
            }
            None => {
                let written = out
                    .file
                    .write_all_at(&buf.as_slice()[..len], offset)
                    .map_err(|e| Error::io(out.path.display(), e));
                self.give(buf);
                written
            }
        }
    }

    /// Waits for every write in flight; the first error is returned.
    pub fn drain(&self) -> Result<()> {
        let pending: Vec<PendingWrite> = lock(&self.state).in_flight.drain(..).collect();
        let mut first = Ok(());
        for p in pending {
            let (written, buf) = p.wait();
            if let (Err(e), Ok(())) = (written, &first) {
                first = Err(e.into());
            }
            self.give(buf);
        }
        first
    }
}

/// An output object being filled, with the CRC32C of what went in.
pub struct OutFile {
    name: String,
    path: PathBuf,
    file: File,
    /// The same file opened with O_DIRECT for the I/O engine's whole-page
    /// writes; `None` where the filesystem refuses it (then writes go
    /// through `file`).
    direct: Option<Arc<IoFile>>,
    pub size: u64,
    crcs: RunCrcs,
}

impl OutFile {
    /// Creates `root/name` of `size` zero bytes; with `engine`, whole pages
    /// will go through it with O_DIRECT.
    pub fn create(
        root: &Path,
        name: &str,
        size: u64,
        engine: Option<&IoEngine>,
    ) -> Result<OutFile> {
        let path = root.join(name);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.display(), e))?;
        }
        let file = File::create(&path).map_err(|e| Error::io(path.display(), e))?;
        file.set_len(size)
            .map_err(|e| Error::io(path.display(), e))?;
        let direct = match engine {
            Some(engine) => Some(engine.open_write(&path)?)
                .filter(IoFile::is_direct)
                .map(Arc::new),
            None => None,
        };
        Ok(OutFile {
            name: name.to_string(),
            path,
            file,
            direct,
            size,
            crcs: RunCrcs::default(),
        })
    }

    /// Writes `data` at `offset` through the page cache.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.file
            .write_all_at(data, offset)
            .map_err(|e| Error::io(self.path.display(), e))?;
        self.crcs.record(offset, data);
        Ok(())
    }

    /// Flushes the file and returns it as a manifest object.
    pub fn finish(self) -> Result<Object> {
        self.file
            .sync_all()
            .map_err(|e| Error::io(self.path.display(), e))?;
        let crc32c = self
            .crcs
            .object_crc(self.size)
            .map_err(|e| Error::InvalidArgument(format!("{}: {e}", self.name)))?;
        Ok(Object {
            name: self.name,
            size: self.size,
            crc32c,
        })
    }
}

/// Where a region's pages go: the stage pool and the output object.
pub(crate) type Io<'a> = (&'a WritePool<'a>, &'a OutFile);

/// One region being appended to: where it starts, the whole pages written
/// so far, and the bytes of a page not yet full.
pub(crate) struct RegionWriter {
    start: u64,
    pub(crate) done: u64,
    carry: Vec<u8>,
}

impl RegionWriter {
    pub(crate) fn new(start: u64) -> Self {
        RegionWriter {
            start,
            done: 0,
            carry: Vec::new(),
        }
    }

    /// Appends the rows `rows` of the piece that starts at node `first`
    /// (`part` holds its rows) in whole-page writes.
    pub(crate) fn append(
        &mut self,
        io: Io<'_>,
        rows: &[u32],
        first: u64,
        part: &[u8],
        rb: usize,
    ) -> Result<()> {
        self.append_rows(io, rows.len(), rb, |i, dst| {
            let src = (rows[i] as u64 - first) as usize * rb;
            dst.copy_from_slice(&part[src..src + rb]);
        })
    }

    /// Appends `bytes`, a whole number of rows, in whole-page writes.
    pub(crate) fn append_bytes(&mut self, io: Io<'_>, bytes: &[u8], rb: usize) -> Result<()> {
        self.append_rows(io, bytes.len() / rb, rb, |i, dst| {
            dst.copy_from_slice(&bytes[i * rb..(i + 1) * rb]);
        })
    }

    /// Appends `n` rows, row `i` copied into the slice `row(i, dst)` gets,
    /// through a stage buffer of the pool: whole pages go out behind, the
    /// rest waits in the carry.
    fn append_rows(
        &mut self,
        (pool, out): Io<'_>,
        n: usize,
        rb: usize,
        mut row: impl FnMut(usize, &mut [u8]),
    ) -> Result<()> {
        let mut i = 0;
        while i < n {
            let mut stage = pool.take()?;
            let c = self.carry.len();
            let take = (stage.len().saturating_sub(c) / rb).clamp(1, n - i);
            if c + take * rb > stage.len() {
                stage.resize(c + take * rb); // a row longer than a stage
            }
            let buf = stage.as_mut_slice();
            buf[..c].copy_from_slice(&self.carry);
            for (k, dst) in buf[c..c + take * rb].chunks_exact_mut(rb).enumerate() {
                row(i + k, dst);
            }
            let at = c + take * rb;
            let full = at / PAGE * PAGE;
            self.carry.clear();
            self.carry.extend_from_slice(&buf[full..at]);
            if full > 0 {
                pool.write(out, self.start + self.done, stage, full)?;
                self.done += full as u64;
            } else {
                pool.give(stage);
            }
            i += take;
        }
        Ok(())
    }

    /// Writes the last, partial page, padded with zeros (every region is
    /// a whole number of pages).
    pub(crate) fn finish(&mut self, (pool, out): Io<'_>) -> Result<()> {
        if self.carry.is_empty() {
            return Ok(());
        }
        let mut stage = pool.take()?;
        let buf = &mut stage.as_mut_slice()[..PAGE];
        buf.fill(0);
        buf[..self.carry.len()].copy_from_slice(&self.carry);
        pool.write(out, self.start + self.done, stage, PAGE)?;
        self.done += PAGE as u64;
        self.carry.clear();
        Ok(())
    }
}
