//! A node type's rows of a layer's input: its feature file for the first
//! layer, the previous layer's output in the work directory after that.
//! A group reads its sources' rows in ascending order, neighbouring rows
//! coalesced into one read, so that a dense group reads its file nearly
//! front to back; its own rows are one range.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use offgnn_shared::npy::{DType, NpyFile};
use tch::Tensor;

use crate::error::{Error, Result};

/// Rows closer than this are read in one read, the bytes between them
/// discarded: cheaper than a second seek.
const COALESCE_GAP: u64 = 64 << 10;

/// The largest single read.
const MAX_READ: u64 = 16 << 20;

/// One type's rows of a layer's input.
pub(super) struct Rows {
    file: File,
    path: PathBuf,
    data_offset: u64,
    width: usize,
    /// float32 or float16 (widened as read).
    dtype: DType,
}

impl Rows {
    /// A feature file (float32 or float16).
    pub(super) fn features(npy: &NpyFile) -> Result<Rows> {
        let dtype = npy.dtype();
        if !matches!(dtype, DType::F32 | DType::F16) {
            return Err(Error::InvalidArgument(format!(
                "{}: features of dtype {}; inference reads float32 or float16",
                npy.path().display(),
                dtype.name()
            )));
        }
        let file = npy
            .file()
            .try_clone()
            .map_err(|e| Error::io(npy.path().display(), e))?;
        Ok(Rows {
            file,
            path: npy.path().to_path_buf(),
            data_offset: npy.header().data_offset,
            width: npy.shape().get(1).copied().unwrap_or(1) as usize,
            dtype,
        })
    }

    /// A layer's output that [`HiddenWriter`] wrote.
    pub(super) fn hidden(path: &Path, width: usize) -> Result<Rows> {
        Ok(Rows {
            file: File::open(path).map_err(|e| Error::io(path.display(), e))?,
            path: path.to_path_buf(),
            data_offset: 0,
            width,
            dtype: DType::F32,
        })
    }

    pub(super) fn width(&self) -> usize {
        self.width
    }

    fn row_bytes(&self) -> u64 {
        (self.width * self.dtype.size()) as u64
    }

    /// The rows `ids` (ascending, distinct) as a `[ids, width]` float32
    /// tensor; adds the bytes read to `read`.
    pub(super) fn gather(&self, ids: &[u32], read: &mut u64) -> Result<Tensor> {
        let rb = self.row_bytes();
        let mut out = vec![0f32; ids.len() * self.width];
        let mut buf = Vec::new();
        let mut i = 0;
        while i < ids.len() {
            // The run of rows one read covers.
            let first = u64::from(ids[i]);
            let mut j = i + 1;
            while j < ids.len() {
                let next = u64::from(ids[j]);
                let gap = (next - u64::from(ids[j - 1]) - 1) * rb;
                if gap > COALESCE_GAP || (next + 1 - first) * rb > MAX_READ {
                    break;
                }
                j += 1;
            }
            let span = (u64::from(ids[j - 1]) + 1 - first) * rb;
            buf.resize(span as usize, 0);
            self.read_at(first * rb, &mut buf)?;
            *read += span;
            for (k, &v) in ids[i..j].iter().enumerate() {
                let at = ((u64::from(v) - first) * rb) as usize;
                let row = &mut out[(i + k) * self.width..(i + k + 1) * self.width];
                self.widen(&buf[at..at + rb as usize], row);
            }
            i = j;
        }
        Ok(Tensor::from_slice(&out).view([ids.len() as i64, self.width as i64]))
    }

    /// Rows `lo..hi` as a `[hi - lo, width]` float32 tensor.
    pub(super) fn range(&self, (lo, hi): (u64, u64), read: &mut u64) -> Result<Tensor> {
        let rb = self.row_bytes();
        let mut buf = vec![0u8; ((hi - lo) * rb) as usize];
        self.read_at(lo * rb, &mut buf)?;
        *read += buf.len() as u64;
        let mut out = vec![0f32; (hi - lo) as usize * self.width];
        for (row, bytes) in out
            .chunks_exact_mut(self.width.max(1))
            .zip(buf.chunks_exact(rb.max(1) as usize))
        {
            self.widen(bytes, row);
        }
        Ok(Tensor::from_slice(&out).view([(hi - lo) as i64, self.width as i64]))
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.file
            .read_exact_at(buf, self.data_offset + offset)
            .map_err(|e| Error::io(self.path.display(), e))
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

/// A layer's output for one type, written group after group, front to back.
pub(super) struct HiddenWriter {
    file: std::io::BufWriter<File>,
    path: PathBuf,
    pub(super) bytes: u64,
}

impl HiddenWriter {
    pub(super) fn create(path: PathBuf) -> Result<HiddenWriter> {
        let file = File::create(&path).map_err(|e| Error::io(path.display(), e))?;
        Ok(HiddenWriter {
            file: std::io::BufWriter::with_capacity(1 << 20, file),
            path,
            bytes: 0,
        })
    }

    /// Appends the rows of `h` (float32, on the CPU).
    pub(super) fn append(&mut self, h: &Tensor) -> Result<()> {
        let values = Vec::<f32>::try_from(h.flatten(0, -1)).map_err(Error::from)?;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.file
            .write_all(&bytes)
            .map_err(|e| Error::io(self.path.display(), e))?;
        self.bytes += bytes.len() as u64;
        Ok(())
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
        let mut w = HiddenWriter::create(path.clone()).unwrap();
        let all = Tensor::arange(
            i64::from(rows) * width as i64,
            (tch::Kind::Float, tch::Device::Cpu),
        )
        .view([i64::from(rows), width as i64]);
        w.append(&all).unwrap();
        w.finish().unwrap();
        let r = Rows::hidden(&path, width).unwrap();
        // Neighbours, a gap to coalesce over and one too wide to.
        let ids = [0u32, 1, 2, 900, 30_000, 39_999];
        let mut read = 0;
        let got = r.gather(&ids, &mut read).unwrap();
        let want = all.index_select(0, &Tensor::from_slice(&ids.map(i64::from)));
        assert!(got.equal(&want));
        assert!(read < u64::from(rows) * 12, "{read}");
        let range = r.range((5, 9), &mut read).unwrap();
        assert!(range.equal(&all.narrow(0, 5, 4)));
    }
}
