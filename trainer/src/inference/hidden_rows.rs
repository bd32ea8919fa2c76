//! The hidden layers' outputs in the work directory: their files, and the
//! writer that encodes a group's rows (float32 or float16) and writes them
//! behind the computation, page-aligned, with O_DIRECT.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use offgnn_shared::io_engine::{AlignedBuf, IoEngine, IoFile, PendingWrite, ReadReq};
use rayon::prelude::*;

use super::{InferConfig, PAGE};
use crate::error::Result;

/// Bytes per write of a hidden layer's rows (a multiple of the page).
pub(super) const WRITE_PIECE: usize = 32 << 20;

/// Bytes per value of the hidden layers' files.
pub(super) fn hidden_elem(cfg: &InferConfig) -> u64 {
    if cfg.hidden_f16 { 2 } else { 4 }
}

pub(super) fn hidden_file(work: &Path, l: usize) -> PathBuf {
    work.join(format!("h{l}.f32"))
}

/// Encodes hidden rows' values into `dst` as float16 or float32
/// (little-endian), on the thread pool; returns the bytes written.
pub(crate) fn encode_rows(values: &[f32], f16: bool, dst: &mut [u8]) -> usize {
    let elem = if f16 { 2 } else { 4 };
    let bytes = values.len() * elem;
    // Slices of 64 KiB of values a task.
    const TASK: usize = 1 << 14;
    dst[..bytes]
        .par_chunks_mut(TASK * elem)
        .zip(values.par_chunks(TASK))
        .for_each(|(dst, values)| {
            if f16 {
                for (d, v) in dst.chunks_exact_mut(2).zip(values) {
                    d.copy_from_slice(&half::f16::from_f32(*v).to_le_bytes());
                }
            } else {
                for (d, v) in dst.chunks_exact_mut(4).zip(values) {
                    d.copy_from_slice(&v.to_le_bytes());
                }
            }
        });
    bytes
}

/// A hidden layer's output rows on their way to the work directory, handed
/// on in node order (a group's rows at once, or a pull's as it finishes
/// them, so the disk takes them while it computes the next), encoded into
/// pieces of one buffer's size, each written behind while the next is
/// filled: two buffers, reused from group to group (a group's rows can be
/// gigabytes, and fresh pages cost more than the copy).
pub(super) struct RowWriter<'a> {
    engine: &'a IoEngine,
    file: Arc<IoFile>,
    f16: bool,
    /// Buffers free to fill; the one being filled, and its bytes so far.
    free: Vec<AlignedBuf>,
    filling: Option<(AlignedBuf, usize)>,
    in_flight: VecDeque<PendingWrite>,
    /// Where the piece being filled goes in the file (page-aligned).
    offset: u64,
    /// Values handed on so far, and bytes written.
    handed: usize,
    written: u64,
}

impl<'a> RowWriter<'a> {
    /// A writer of rows from byte `offset` of `file` on (a group's first
    /// row: page-aligned, see [`ALIGN_NODES`]), through `bufs` (of equal,
    /// page-multiple sizes).
    pub(super) fn new(
        engine: &'a IoEngine,
        file: Arc<IoFile>,
        f16: bool,
        bufs: Vec<AlignedBuf>,
        offset: u64,
    ) -> Self {
        RowWriter {
            engine,
            file,
            f16,
            free: bufs,
            filling: None,
            in_flight: Default::default(),
            offset,
            handed: 0,
            written: 0,
        }
    }

    /// The values handed on so far.
    pub(super) fn handed(&self) -> usize {
        self.handed
    }

    /// Hands on the next `values`.
    pub(super) fn put(&mut self, mut values: &[f32]) -> Result<()> {
        let elem = if self.f16 { 2 } else { 4 };
        while !values.is_empty() {
            let (mut buf, filled) = match self.filling.take() {
                Some(filling) => filling,
                None => (self.spare()?, 0),
            };
            let size = buf.as_mut_slice().len();
            let take = ((size - filled) / elem).min(values.len());
            let (now, rest) = values.split_at(take);
            let filled = filled + encode_rows(now, self.f16, &mut buf.as_mut_slice()[filled..]);
            self.handed += take;
            values = rest;
            if filled == size {
                self.submit(buf, filled)?;
            } else {
                self.filling = Some((buf, filled));
            }
        }
        Ok(())
    }

    /// Writes what is left, with zeros up to the next page, and waits for
    /// every write; returns the bytes written and the buffers.
    pub(super) fn finish(mut self) -> Result<(u64, Vec<AlignedBuf>)> {
        if let Some((mut buf, filled)) = self.filling.take() {
            let len = (filled as u64).div_ceil(PAGE) as usize * PAGE as usize;
            buf.as_mut_slice()[filled..len].fill(0);
            self.submit(buf, len)?;
        }
        while let Some(pending) = self.in_flight.pop_front() {
            let (outcome, buf) = pending.wait();
            self.written += outcome?;
            self.free.push(buf);
        }
        Ok((self.written, self.free))
    }

    /// A free buffer, waiting for the oldest write if none is.
    fn spare(&mut self) -> Result<AlignedBuf> {
        if let Some(buf) = self.free.pop() {
            return Ok(buf);
        }
        let pending = self.in_flight.pop_front().expect("a buffer is out");
        let (outcome, buf) = pending.wait();
        self.written += outcome?;
        Ok(buf)
    }

    fn submit(&mut self, buf: AlignedBuf, len: usize) -> Result<()> {
        let size = buf.as_slice().len() as u64;
        let req = ReadReq {
            offset: self.offset,
            len,
            buf_offset: 0,
        };
        self.in_flight
            .push_back(self.engine.write_behind(&self.file, &[req], buf)?);
        self.offset += size;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows handed on in runs that straddle the writer's buffers, as
    /// float32 and float16, land in the file from the group's offset on in order, the
    /// last page padded with zeros; the bytes before are not touched and
    /// the buffers come back.
    #[test]
    fn hidden_rows_handed_on_in_runs_land_in_order() {
        let engine = IoEngine::new(offgnn_shared::io_engine::IoOptions::default());
        let dir = tempfile::tempdir().unwrap();
        for f16 in [false, true] {
            let path = dir.path().join(format!("h-{f16}.bin"));
            let elem = if f16 { 2 } else { 4 };
            let values: Vec<f32> = (0..20_000).map(|v| v as f32 * 0.5).collect();
            let offset = 2 * PAGE;
            let padded = (values.len() * elem).div_ceil(PAGE as usize) * PAGE as usize;
            std::fs::write(
                &path,
                vec![0xA5u8; offset as usize + padded + PAGE as usize],
            )
            .unwrap();
            let file = Arc::new(engine.open_write(&path).unwrap());
            let bufs = vec![
                AlignedBuf::new(2 * PAGE as usize),
                AlignedBuf::new(2 * PAGE as usize),
            ];
            let mut w = RowWriter::new(&engine, file, f16, bufs, offset);
            let mut at = 0;
            for run in [1, 2047, 2048, 3000, 1, 5000].into_iter().cycle() {
                let end = (at + run).min(values.len());
                w.put(&values[at..end]).unwrap();
                at = end;
                assert_eq!(w.handed(), at);
                if at == values.len() {
                    break;
                }
            }
            let (written, bufs) = w.finish().unwrap();
            assert_eq!(written, padded as u64, "f16 {f16}");
            assert_eq!(bufs.len(), 2);
            let bytes = std::fs::read(&path).unwrap();
            assert!(bytes[..offset as usize].iter().all(|&b| b == 0xA5));
            let body = &bytes[offset as usize..];
            for (i, v) in values.iter().enumerate() {
                let got = if f16 {
                    half::f16::from_le_bytes([body[2 * i], body[2 * i + 1]]).to_f32()
                } else {
                    f32::from_le_bytes(body[4 * i..4 * i + 4].try_into().unwrap())
                };
                let want = if f16 {
                    half::f16::from_f32(*v).to_f32()
                } else {
                    *v
                };
                assert_eq!(got, want, "f16 {f16}: value {i}");
            }
            assert!(body[values.len() * elem..padded].iter().all(|&b| b == 0));
            assert!(body[padded..].iter().all(|&b| b == 0xA5));
        }
    }
}
