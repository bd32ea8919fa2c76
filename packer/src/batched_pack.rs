//! Writing the packed layout's feature objects (DiskGNN §5.2): batched
//! packing, which reads the feature file once in partitions and streams each
//! partition's rows into every region that needs them, and the individual
//! packing baseline, one aligned read per needed row per batch.
//!
//! The feature file streams through two piece buffers (a reader thread,
//! started before the plan is done, fills one with O_DIRECT while the other
//! is dispatched); a piece may straddle two partitions. Every region of the
//! layout (the GPU-cache and CPU-cache blocks, each segment's disk cache,
//! each batch's packed chunk) starts on a 4 KiB page and is written front to
//! back: caches and packed chunks hold their rows in node order, so each
//! piece appends their next rows; a disk cache is in MinHash order, so the
//! rows of its current partition gather in a staging buffer and go out as
//! one run when the partition ends (see `plan`). Each region is thus an
//! append stream, written with O_DIRECT in whole pages, behind
//! (`region_writer`), and the disk sees large sequential writes without the
//! page cache copying every byte.

use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::Instant;

use offgnn_shared::io_engine::IoEngine;
use rayon::prelude::*;

use crate::access_rank::Tiers;
use crate::error::{Error, Result};
use crate::feature_source::{FeatureSource, PartitionBuf, PartitionReader};
use crate::plan::{BatchInfo, SegmentPlan};
use crate::region_writer::RegionWriter;
pub use crate::region_writer::{MAX_STAGES, OutFile, STAGE_POOL_BYTES, WritePool};
use crate::store_dtype::{self, Values};
use offgnn_manifests::Dtype;

/// The feature file read front to back in pieces of equal rows by a thread
/// of its own, up to `depth` pieces ahead of the packing pass (DiskGNN
/// §5.2's one sequential read). It starts before the plan is finished, so
/// the disk streams while the packer plans.
pub struct ReadAhead<'scope> {
    /// Each piece's rows `[first, end)`, in reading order.
    pieces: Vec<(u64, u64)>,
    filled: Receiver<PartitionBuf>,
    to_reader: SyncSender<PartitionBuf>,
    thread: ScopedJoinHandle<'scope, Result<(u64, f64)>>,
}

impl<'scope> ReadAhead<'scope> {
    /// Starts reading `num_nodes` rows in pieces of `piece_rows`, through
    /// `depth` buffers (at least two: one read while one is dispatched).
    /// Dropped unused, the reader stops at its next piece.
    pub fn start<'env>(
        s: &'scope Scope<'scope, 'env>,
        features: &'env FeatureSource,
        engine: &'env IoEngine,
        piece_rows: u64,
        depth: usize,
    ) -> Result<Self> {
        let num_nodes = features.num_rows();
        let step = piece_rows.max(1);
        let pieces: Vec<(u64, u64)> = (0..num_nodes)
            .step_by(step as usize)
            .map(|first| (first, (first + step).min(num_nodes)))
            .collect();
        let depth = depth.max(2);
        let reader: PartitionReader<'env> = features.partition_reader(engine)?;
        let (to_dispatch, filled) = sync_channel::<PartitionBuf>(depth);
        let (to_reader, empty) = sync_channel::<PartitionBuf>(depth);
        for _ in 0..depth {
            to_reader
                .send(PartitionBuf::new())
                .expect("the receiver is alive");
        }
        let order = pieces.clone();
        let thread = s.spawn(move || -> Result<(u64, f64)> {
            let (mut read, mut busy) = (0u64, 0.0);
            for (first, end) in order {
                let Ok(mut buf) = empty.recv() else {
                    break; // the pass stopped (or never started)
                };
                let started = Instant::now();
                read += reader.read(first, end, &mut buf)?;
                busy += started.elapsed().as_secs_f64();
                if to_dispatch.send(buf).is_err() {
                    break;
                }
            }
            Ok((read, busy))
        });
        Ok(ReadAhead {
            pieces,
            filled,
            to_reader,
            thread,
        })
    }
}

/// What a packing pass did.
#[derive(Clone, Copy, Debug, Default)]
pub struct PassFigures {
    /// Bytes read from the feature file.
    pub bytes_read: u64,
    /// Seconds spent reading (batched: the reader thread's busy time).
    pub read_seconds: f64,
    /// Seconds spent gathering rows and writing them out.
    pub write_seconds: f64,
    /// CRC32C of every row, in order (batched packing reads them all).
    pub rows_crc32c: Option<u32>,
}

/// The current partition's disk-cache runs, one per segment, end to end in
/// one buffer (kept between partitions, so it is allocated once).
#[derive(Default)]
struct Staging {
    partition: Option<usize>,
    buf: Vec<u8>,
    /// `ends[s]` is where segment s's run ends in `buf`.
    ends: Vec<usize>,
}

impl Staging {
    /// Lays out the runs of partition `p`.
    fn start(&mut self, p: usize, segments: &[SegmentPlan], rb: u64) {
        self.ends.clear();
        let mut at = 0usize;
        for seg in segments {
            at += (seg.dc_bounds[p + 1] - seg.dc_bounds[p]) * rb as usize;
            self.ends.push(at);
        }
        self.buf.resize(at, 0);
        self.partition = Some(p);
    }

    fn runs(&self) -> Vec<&[u8]> {
        let mut runs = Vec::with_capacity(self.ends.len());
        let mut start = 0;
        for &end in &self.ends {
            runs.push(&self.buf[start..end]);
            start = end;
        }
        runs
    }

    fn runs_mut(&mut self) -> Vec<&mut [u8]> {
        let mut runs = Vec::with_capacity(self.ends.len());
        let mut rest = self.buf.as_mut_slice();
        let mut start = 0;
        for &end in &self.ends {
            let (run, tail) = rest.split_at_mut(end - start);
            runs.push(run);
            rest = tail;
            start = end;
        }
        runs
    }
}

/// The writers of one segment's regions: its disk cache, then each chunk.
struct SegmentWriters {
    disk_cache: RegionWriter,
    chunks: Vec<RegionWriter>,
}

/// Everything packing needs, borrowed from the plan.
pub struct PackCtx<'a> {
    /// Reads the feature file (O_DIRECT).
    pub engine: &'a IoEngine,
    /// Writes the regions (O_DIRECT, behind), on rings of its own.
    pub writes: &'a WritePool<'a>,
    pub features: &'a FeatureSource,
    pub cache: &'a Tiers,
    pub segments: &'a [SegmentPlan],
    pub batches: &'a [BatchInfo],
    pub gpu: Option<&'a OutFile>,
    pub cpu: Option<&'a OutFile>,
    pub seg_files: &'a [OutFile],
    /// Bytes of a row in the layout (values of `to`).
    pub row_bytes: u64,
    /// The feature file's values, and the layout's: rows are converted
    /// as they are read when the two differ.
    pub from: Dtype,
    pub to: Dtype,
    /// First node of each partition, `num_nodes` last (`plan::partition_bounds`).
    pub bounds: &'a [u64],
    pub num_nodes: u64,
}

impl PackCtx<'_> {
    /// Bytes of a row of the feature file.
    fn source_row_bytes(&self) -> u64 {
        self.row_bytes / self.to.size() * self.from.size()
    }

    /// The error for a value that converting made infinite: value `index`
    /// of the rows from node `first` on.
    fn out_of_range(&self, first: u64, o: store_dtype::OutOfRange) -> Error {
        let cols = (self.row_bytes / self.to.size()).max(1);
        let (row, col) = (first + o.index as u64 / cols, o.index as u64 % cols);
        Error::InvalidArgument(format!(
            "{}: row {row}, column {col} is {}, beyond {}'s range (largest {}); pack with --store-dtype bf16 or f32",
            self.features.describe(),
            o.value,
            self.to,
            self.to.max_finite()
        ))
    }

    /// Row `data` of the feature file as the layout stores it: itself, or
    /// converted into `row`.
    fn stored<'r>(&self, data: &'r [u8], row: &'r mut Vec<u8>, node: u64) -> Result<&'r [u8]> {
        if self.to == self.from {
            return Ok(data);
        }
        row.resize(self.row_bytes as usize, 0);
        store_dtype::convert(data, self.from, row, self.to)
            .map_err(|o| self.out_of_range(node, o))?;
        Ok(row)
    }

    /// DiskGNN §5.2: the feature file is read once, front to back, and each
    /// piece's rows go to every region that needs them. The pieces come
    /// from `ahead` (a reader thread, O_DIRECT, many requests in flight)
    /// while this thread dispatches, and the rows go out behind through the
    /// write pool, so the disk streams while rows are copied.
    pub fn batched(&self, ahead: ReadAhead<'_>, show: bool) -> Result<PassFigures> {
        let rb = self.row_bytes;
        let srb = self.source_row_bytes();
        let pb = offgnn_shared::progress::bytes_bar_if(show, self.num_nodes * srb, "packing");
        let mut tiers = [RegionWriter::new(0), RegionWriter::new(0)];
        let mut writers: Vec<SegmentWriters> = self
            .segments
            .iter()
            .map(|seg| SegmentWriters {
                disk_cache: RegionWriter::new(0),
                chunks: seg
                    .chunk_offset
                    .iter()
                    .map(|&o| RegionWriter::new(o))
                    .collect(),
            })
            .collect();
        let ReadAhead {
            pieces,
            filled,
            to_reader,
            thread,
        } = ahead;
        let mut staging = Staging::default();
        let mut dispatched: Result<()> = Ok(());
        let mut write_seconds = 0.0;
        // The partition of the piece's first row; pieces ignore partitions,
        // so one may hold the end of one and the start of the next.
        let mut p = 0;
        let mut crc = 0u32;
        let dtype = self.features.dtype();
        let cols = (srb / dtype.size() as u64).max(1);
        // A piece's rows as the layout stores them, when they are converted.
        let mut converted = Vec::new();
        for (k, buf) in filled.iter().enumerate() {
            let (first, end) = pieces[k];
            let started = Instant::now();
            crc = crc32c::crc32c_append(crc, buf.rows());
            // Every value passes here once: a NaN or an infinity would
            // train a model of NaNs, and the check is cheap beside the read.
            if let Some((i, value)) = offgnn_shared::npy::first_non_finite_in(buf.rows(), dtype) {
                let (row, col) = (first + i as u64 / cols, i as u64 % cols);
                dispatched = Err(Error::InvalidArgument(format!(
                    "{}: row {row}, column {col} is {value}: the features hold NaN or infinity, which would train a model of NaNs; fix the file (`sampler inspect` names the first)",
                    self.features.describe()
                )));
                break;
            }
            // Converted once here, on every core, whatever regions take the row.
            let part = if self.to == self.from {
                buf.rows()
            } else {
                converted.resize(buf.rows().len() / srb as usize * rb as usize, 0);
                if let Err(o) = store_dtype::convert(buf.rows(), self.from, &mut converted, self.to)
                {
                    dispatched = Err(self.out_of_range(first, o));
                    break;
                }
                &converted
            };
            dispatched = (|| {
                let mut at = first;
                while at < end {
                    while self.bounds[p + 1] <= at {
                        p += 1;
                    }
                    let stop = end.min(self.bounds[p + 1]);
                    if staging.partition != Some(p) {
                        self.flush_disk_caches(&mut staging, &mut writers)?;
                        staging.start(p, self.segments, rb);
                    }
                    let rows = &part[((at - first) * rb) as usize..((stop - first) * rb) as usize];
                    self.dispatch(p, at, stop, rows, &mut tiers, &mut writers, &mut staging)?;
                    at = stop;
                }
                Ok(())
            })();
            write_seconds += started.elapsed().as_secs_f64();
            if dispatched.is_ok() {
                // SIGINT or SIGTERM: the pass ends at this piece.
                dispatched = offgnn_shared::signals::check().map_err(Error::from);
            }
            if dispatched.is_err() {
                break;
            }
            pb.inc(buf.rows().len() as u64);
            // The reader may be done: a closed channel is fine.
            let _ = to_reader.send(buf);
        }
        drop(filled);
        drop(to_reader);
        let (bytes_read, read_seconds) = thread
            .join()
            .expect("the partition reader does not panic")?;
        dispatched?;
        let started = Instant::now();
        self.flush_disk_caches(&mut staging, &mut writers)?;
        for (w, out) in tiers.iter_mut().zip([self.gpu, self.cpu]) {
            if let Some(out) = out {
                w.finish((self.writes, out))?;
            }
        }
        for ((w, out), seg) in writers.iter_mut().zip(self.seg_files).zip(self.segments) {
            w.disk_cache.finish((self.writes, out))?;
            for c in &mut w.chunks {
                c.finish((self.writes, out))?;
            }
            debug_assert!(w.disk_cache.done <= seg.dc_bytes);
        }
        self.writes.drain()?;
        let figures = PassFigures {
            bytes_read,
            read_seconds,
            write_seconds: write_seconds + started.elapsed().as_secs_f64(),
            rows_crc32c: Some(crc),
        };
        pb.finish_and_clear();
        Ok(figures)
    }

    /// Writes the staged disk-cache runs of the current partition, each
    /// after the previous partition's run of its disk cache.
    fn flush_disk_caches(
        &self,
        staging: &mut Staging,
        writers: &mut [SegmentWriters],
    ) -> Result<()> {
        if staging.partition.is_none() {
            return Ok(());
        }
        let rb = self.row_bytes as usize;
        let runs = staging.runs();
        writers
            .par_iter_mut()
            .zip(self.seg_files)
            .zip(runs)
            .try_for_each(|((w, out), run)| {
                w.disk_cache.append_bytes((self.writes, out), run, rb)
            })?;
        staging.partition = None;
        Ok(())
    }

    /// Sends a piece of partition `p` (rows `[first, end)`, in `part`) to
    /// every region that needs rows of it: the caches and the packed chunks
    /// append them, each disk cache stages them at their MinHash positions.
    /// Segments (each its own file) and the two caches go side by side.
    #[allow(clippy::too_many_arguments)]
    fn dispatch(
        &self,
        p: usize,
        first: u64,
        end: u64,
        part: &[u8],
        tiers: &mut [RegionWriter; 2],
        writers: &mut [SegmentWriters],
        staging: &mut Staging,
    ) -> Result<()> {
        let rb = self.row_bytes as usize;
        let in_piece = |nodes: &[u32]| -> (usize, usize) {
            let a = nodes.partition_point(|&v| (v as u64) < first);
            let b = nodes.partition_point(|&v| (v as u64) < end);
            (a, b)
        };
        let [gpu_w, cpu_w] = tiers;
        let tier = |w: &mut RegionWriter, rows: &[u32], out: Option<&OutFile>| -> Result<()> {
            match out {
                Some(out) => {
                    let (a, b) = in_piece(rows);
                    w.append((self.writes, out), &rows[a..b], first, part, rb)
                }
                None => Ok(()),
            }
        };
        let runs = staging.runs_mut();
        let (caches, segments) = rayon::join(
            || {
                rayon::join(
                    || tier(gpu_w, self.cache.gpu_nodes(), self.gpu),
                    || tier(cpu_w, self.cache.cpu_nodes(), self.cpu),
                )
            },
            || {
                self.segments
                    .par_iter()
                    .zip(self.seg_files)
                    .zip(writers.par_iter_mut())
                    .zip(runs)
                    .try_for_each(|(((seg, out), w), run)| -> Result<()> {
                        let base = seg.dc_bounds[p];
                        for &(v, pos) in seg.dc_entries_in(first, end) {
                            let (src, dst) =
                                ((v as u64 - first) as usize * rb, (pos as usize - base) * rb);
                            run[dst..dst + rb].copy_from_slice(&part[src..src + rb]);
                        }
                        for (rows, cw) in seg.packed.iter().zip(&mut w.chunks) {
                            let (a, b) = in_piece(rows);
                            if a < b {
                                cw.append((self.writes, out), &rows[a..b], first, part, rb)?;
                            }
                        }
                        Ok(())
                    })
            },
        );
        caches.0?;
        caches.1?;
        segments
    }

    /// The naive baseline (§5.2, Figure 6a): for every batch, one aligned
    /// O_DIRECT read per row it needs (many in flight through the I/O
    /// engine), written to its place; cached rows once each. Returns the
    /// bytes read from the feature file.
    pub fn individual(&self, show: bool) -> Result<PassFigures> {
        let started = Instant::now();
        let mut rows = self.features.row_reader()?;
        let rb = self.row_bytes;
        let total: u64 = self.cache.gpu_nodes().len() as u64
            + self.cache.cpu_nodes().len() as u64
            + self
                .segments
                .iter()
                .flat_map(|s| &s.batches)
                .map(|&b| self.batches[b].cold.len() as u64)
                .sum::<u64>();
        let pb = offgnn_shared::progress::bar_if(show, total, "packing", "rows");
        let mut read = 0u64;
        let mut row = Vec::new();
        for (tier, out) in [
            (self.cache.gpu_nodes(), self.gpu),
            (self.cache.cpu_nodes(), self.cpu),
        ] {
            if let Some(out) = out {
                read += rows.read_each(tier, |slot, data| {
                    let data = self.stored(data, &mut row, u64::from(tier[slot]))?;
                    out.write_at(slot as u64 * rb, data)
                })?;
                pb.inc(tier.len() as u64);
            }
        }
        for (seg, out) in self.segments.iter().zip(self.seg_files) {
            let mut written = std::collections::HashSet::new();
            for (k, &b) in seg.batches.iter().enumerate() {
                offgnn_shared::signals::check()?;
                let cold = &self.batches[b].cold;
                read += rows.read_each(cold, |i, data| {
                    let v = cold[i];
                    let data = self.stored(data, &mut row, u64::from(v))?;
                    match seg.dc_position(v) {
                        // A shared row is written once; every batch still reads it.
                        Some(pos) => {
                            if written.insert(v) {
                                out.write_at(pos as u64 * rb, data)?;
                            }
                            Ok(())
                        }
                        None => {
                            let i = seg.packed[k].binary_search(&v).map_err(|_| {
                                Error::InvalidArgument(format!(
                                    "internal: row {v} has no place in its segment"
                                ))
                            })?;
                            out.write_at(seg.chunk_offset[k] + i as u64 * rb, data)
                        }
                    }
                })?;
                pb.inc(cold.len() as u64);
            }
        }
        pb.finish_and_clear();
        // Reads and writes interleave row by row: the pass is one figure.
        Ok(PassFigures {
            bytes_read: read,
            read_seconds: started.elapsed().as_secs_f64(),
            write_seconds: 0.0,
            // Rows the batches need, not every row: no checksum of the file.
            rows_crc32c: None,
        })
    }
}
