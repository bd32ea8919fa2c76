//! A node type's rows of a layer's input: its feature file for the first
//! layer, the previous layer's output in the work directory after that.
//! A group reads its sources' rows in ascending order through the I/O
//! engine (O_DIRECT, many reads in flight), rows close together in one
//! read of the pages that hold them, at most [`MAX_CALL`] bytes of pages
//! per call, so that a dense group reads its file nearly front to back in
//! bounded memory; its own rows are one range.

use std::fs::File;
use std::io::{Seek, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use offgnn_shared::io_engine::{AlignedBuf, IoEngine, IoFile, ReadReq};
use offgnn_shared::npy::{DType, NpyFile};
use tch::Tensor;

use crate::error::{Error, Result};

const PAGE: u64 = 4096;

/// Rows whose pages are at most this far apart are read in one read, the
/// pages between them discarded: cheaper than another request.
const COALESCE_GAP: u64 = 16 << 10;

/// The pages one engine call reads at most (the buffer they land in).
const MAX_CALL: u64 = 32 << 20;

/// One type's rows of a layer's input.
pub(super) struct Rows<'e> {
    engine: &'e IoEngine,
    file: IoFile,
    /// The same file, buffered: rows in its short last page, which O_DIRECT
    /// cannot read whole.
    tail: File,
    path: PathBuf,
    data_offset: u64,
    width: usize,
    /// float32 or float16 (widened as read).
    dtype: DType,
}

impl<'e> Rows<'e> {
    /// A feature file (float32 or float16).
    pub(super) fn features(engine: &'e IoEngine, npy: &NpyFile) -> Result<Rows<'e>> {
        let dtype = npy.dtype();
        if !matches!(dtype, DType::F32 | DType::F16) {
            return Err(Error::InvalidArgument(format!(
                "{}: features of dtype {}; inference reads float32 or float16",
                npy.path().display(),
                dtype.name()
            )));
        }
        let width = npy.shape().get(1).copied().unwrap_or(1) as usize;
        Rows::open(engine, npy.path(), (npy.header().data_offset, width, dtype))
    }

    /// A layer's output that [`HiddenWriter`] wrote, float32 or float16.
    pub(super) fn hidden(
        engine: &'e IoEngine,
        path: &Path,
        (width, dtype): (usize, DType),
    ) -> Result<Rows<'e>> {
        Rows::open(engine, path, (0, width, dtype))
    }

    fn open(
        engine: &'e IoEngine,
        path: &Path,
        (data_offset, width, dtype): (u64, usize, DType),
    ) -> Result<Rows<'e>> {
        Ok(Rows {
            engine,
            file: engine.open(path)?,
            tail: File::open(path).map_err(|e| Error::io(path.display(), e))?,
            path: path.to_path_buf(),
            data_offset,
            width,
            dtype,
        })
    }

    pub(super) fn width(&self) -> usize {
        self.width
    }

    fn row_bytes(&self) -> u64 {
        (self.width * self.dtype.size()) as u64
    }

    /// The pages that hold rows `first..=last`.
    fn pages(&self, first: u64, last: u64) -> (u64, u64) {
        let rb = self.row_bytes();
        let from = self.data_offset + first * rb;
        let to = self.data_offset + (last + 1) * rb;
        (from / PAGE * PAGE, to.div_ceil(PAGE) * PAGE)
    }

    /// The rows `ids` (ascending, distinct) as a `[ids, width]` float32
    /// tensor; adds the bytes read to `read`.
    pub(super) fn gather(&self, ids: &[u32], read: &mut u64) -> Result<Tensor> {
        let mut out = vec![0f32; ids.len() * self.width];
        // Runs of ids whose pages are read in one request.
        let mut runs: Vec<(usize, usize)> = Vec::new();
        let mut i = 0;
        while i < ids.len() {
            let mut j = i + 1;
            while j < ids.len() {
                let (_, end) = self.pages(u64::from(ids[i]), u64::from(ids[j - 1]));
                let (next, _) = self.pages(u64::from(ids[j]), u64::from(ids[j]));
                let (start, span_end) = self.pages(u64::from(ids[i]), u64::from(ids[j]));
                if next > end + COALESCE_GAP || span_end - start > MAX_CALL {
                    break;
                }
                j += 1;
            }
            runs.push((i, j));
            i = j;
        }
        self.read_runs(ids, &runs, &mut out, read)?;
        Ok(Tensor::from_slice(&out).view([ids.len() as i64, self.width as i64]))
    }

    /// Rows `lo..hi` as a `[hi - lo, width]` float32 tensor.
    pub(super) fn range(&self, (lo, hi): (u64, u64), read: &mut u64) -> Result<Tensor> {
        let ids: Vec<u32> = (lo as u32..hi as u32).collect();
        self.gather(&ids, read)
    }

    /// Reads the pages of each run of `ids` (in calls of at most
    /// [`MAX_CALL`] bytes) and widens the rows into `out`.
    fn read_runs(
        &self,
        ids: &[u32],
        runs: &[(usize, usize)],
        out: &mut [f32],
        read: &mut u64,
    ) -> Result<()> {
        let rb = self.row_bytes() as usize;
        let mut buf = AlignedBuf::new(0);
        let mut r = 0;
        while r < runs.len() {
            // The runs of this call, and where each lands in the buffer.
            let mut reqs = Vec::new();
            let mut placed = Vec::new();
            let mut at = 0usize;
            while r < runs.len() {
                let (i, j) = runs[r];
                let (from, to) = self.pages(u64::from(ids[i]), u64::from(ids[j - 1]));
                let len = (to - from) as usize;
                if !reqs.is_empty() && (at + len) as u64 > MAX_CALL {
                    break;
                }
                // The short last page cannot be read with O_DIRECT: its
                // rows are read buffered below.
                let tail = self.file.is_direct() && to > self.file.len();
                placed.push((r, from, at, tail));
                if !tail {
                    reqs.push(ReadReq {
                        offset: from,
                        len,
                        buf_offset: at,
                    });
                }
                at += len;
                r += 1;
            }
            buf.resize(at);
            *read += self.engine.read(&self.file, &reqs, &mut buf)?;
            for &(run, from, at, tail) in &placed {
                let (i, j) = runs[run];
                let bytes = buf.as_mut_slice();
                if tail {
                    let start = self.data_offset + u64::from(ids[i]) * rb as u64;
                    let len = (u64::from(ids[j - 1]) + 1 - u64::from(ids[i])) as usize * rb;
                    let skip = (start - from) as usize;
                    self.tail
                        .read_exact_at(&mut bytes[at + skip..at + skip + len], start)
                        .map_err(|e| Error::io(self.path.display(), e))?;
                    *read += len as u64;
                }
                for (k, &v) in ids[i..j].iter().enumerate() {
                    let off = at + (self.data_offset + u64::from(v) * rb as u64 - from) as usize;
                    let row = &mut out[(i + k) * self.width..(i + k + 1) * self.width];
                    self.widen(&bytes[off..off + rb], row);
                }
            }
        }
        Ok(())
    }

    fn widen(&self, bytes: &[u8], row: &mut [f32]) {
        match self.dtype {
            DType::F16 => {
                for (v, b) in row.iter_mut().zip(bytes.chunks_exact(2)) {
                    *v = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
            _ => {
                for (v, b) in row.iter_mut().zip(bytes.chunks_exact(4)) {
                    *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
        }
    }
}

/// Bytes of a hidden layer's rows copied out and written at once: a
/// hundred-and-twenty-eighth of `memory`, at most 16 MiB.
pub(super) fn piece_bytes(memory: u64) -> u64 {
    (memory / 128).clamp(4 << 10, 16 << 20)
}

/// A layer's output for one type, written group after group, front to back
/// (float32, or float16 under `--hidden-dtype f16`); a resumed run's from
/// where the groups done end.
pub(super) struct HiddenWriter {
    file: std::io::BufWriter<File>,
    path: PathBuf,
    pub(super) bytes: u64,
    f16: bool,
}

impl HiddenWriter {
    pub(super) fn create(path: PathBuf, f16: bool) -> Result<HiddenWriter> {
        let file = File::create(&path).map_err(|e| Error::io(path.display(), e))?;
        Ok(HiddenWriter {
            file: std::io::BufWriter::with_capacity(1 << 20, file),
            path,
            bytes: 0,
            f16,
        })
    }

    /// The file at `path`, cut to its first `bytes` (the rows of the groups
    /// a killed run finished), to append to.
    pub(super) fn reopen(path: PathBuf, bytes: u64, f16: bool) -> Result<HiddenWriter> {
        let io = |e| Error::io(path.display(), e);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(io)?;
        if file.metadata().map_err(io)?.len() < bytes {
            return Err(Error::InvalidArgument(format!(
                "{}: shorter than the groups its progress says are done; remove the work directory to start over",
                path.display()
            )));
        }
        file.set_len(bytes).map_err(io)?;
        file.seek(std::io::SeekFrom::End(0)).map_err(io)?;
        Ok(HiddenWriter {
            file: std::io::BufWriter::with_capacity(1 << 20, file),
            path,
            bytes,
            f16,
        })
    }

    /// Appends the rows of `h` (float32, on the CPU), encoded, `piece`
    /// bytes of them at a time.
    pub(super) fn append(&mut self, h: &Tensor, piece: u64) -> Result<()> {
        let (rows, width) = (h.size()[0], h.size().get(1).copied().unwrap_or(1).max(1));
        let elem = if self.f16 { 2 } else { 4 };
        let step = (piece as i64 / (width * elem)).max(1);
        for at in (0..rows).step_by(step as usize) {
            let piece = h.narrow(0, at, step.min(rows - at)).flatten(0, -1);
            let values = Vec::<f32>::try_from(piece).map_err(Error::from)?;
            let mut bytes = vec![0u8; values.len() * elem as usize];
            crate::inference::encode_rows(&values, self.f16, &mut bytes);
            self.file
                .write_all(&bytes)
                .map_err(|e| Error::io(self.path.display(), e))?;
            self.bytes += bytes.len() as u64;
        }
        Ok(())
    }

    /// Writes what is buffered and syncs it: the rows appended so far
    /// outlast the process, before the progress names their group.
    pub(super) fn flush(&mut self) -> Result<()> {
        let io = |e| Error::io(self.path.display(), e);
        self.file.flush().map_err(io)?;
        self.file.get_ref().sync_data().map_err(io)
    }

    /// Flushes and syncs the file; returns its bytes.
    pub(super) fn finish(self) -> Result<u64> {
        let path = self.path;
        let file = self
            .file
            .into_inner()
            .map_err(|e| Error::io(path.display(), e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(path.display(), e))?;
        Ok(self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gathered_rows_are_the_rows_asked_for_however_they_are_spread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.bin");
        let (rows, width) = (40_000u32, 3usize);
        let mut w = HiddenWriter::create(path.clone(), false).unwrap();
        let all = Tensor::arange(
            i64::from(rows) * width as i64,
            (tch::Kind::Float, tch::Device::Cpu),
        )
        .view([i64::from(rows), width as i64]);
        w.append(&all, 4096).unwrap();
        w.finish().unwrap();
        let engine = IoEngine::new(Default::default());
        let r = Rows::hidden(&engine, &path, (width, DType::F32)).unwrap();
        // Neighbours, a gap to coalesce over and one too wide to.
        let ids = [0u32, 1, 2, 900, 30_000, 39_999];
        let mut read = 0;
        let got = r.gather(&ids, &mut read).unwrap();
        let want = all.index_select(0, &Tensor::from_slice(&ids.map(i64::from)));
        assert!(got.equal(&want));
        assert!(read < u64::from(rows) * 12 / 4, "{read}");
        let range = r.range((5, 9), &mut read).unwrap();
        assert!(range.equal(&all.narrow(0, 5, 4)));
    }
}
