//! Writing the packed layout's feature objects (DiskGNN §5.2): batched
//! packing, which reads the feature file once in partitions and streams each
//! partition's rows into every region that needs them, and the individual
//! packing baseline, one aligned read per needed row per batch.
//!
//! Every region of the layout (the GPU-cache and CPU-cache blocks, each
//! segment's disk cache, each batch's packed chunk) starts on a 4 KiB page
//! and is filled in order as the partitions go by: partition p holds the
//! region's next run of rows. So each region is an append stream, written
//! with O_DIRECT in whole pages from a small staging buffer (a row that
//! straddles a page boundary waits in the region's carry for the next
//! partition), and the disk sees large sequential writes without the page
//! cache copying every byte.

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc::sync_channel;
use std::time::Instant;

use offgnn_manifests::Object;
use offgnn_shared::io_engine::{AlignedBuf, PAGE};
use rayon::prelude::*;

use crate::crc::RunCrcs;
use crate::error::{Error, Result};
use crate::feature_source::{FeatureSource, PartitionBuf};
use crate::plan::{BatchInfo, CacheMap, SegmentPlan};

/// Bytes gathered per direct write (plus a page for the carried tail).
const STAGE_BYTES: usize = (8 << 20) + PAGE;

thread_local! {
    /// Each thread's staging buffer: allocated once, page-aligned.
    static STAGE: RefCell<AlignedBuf> = RefCell::new(AlignedBuf::new(STAGE_BYTES));
}

/// An output object being filled, with the CRC32C of what went in.
pub struct OutFile {
    name: String,
    path: PathBuf,
    file: File,
    /// The same file opened with O_DIRECT, for whole-page writes; `None`
    /// where the filesystem refuses it (then writes go through `file`).
    direct: Option<File>,
    pub size: u64,
    crcs: RunCrcs,
}

impl OutFile {
    /// Creates `root/name` of `size` zero bytes.
    pub fn create(root: &Path, name: &str, size: u64) -> Result<OutFile> {
        let path = root.join(name);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.display(), e))?;
        }
        let file = File::create(&path).map_err(|e| Error::io(path.display(), e))?;
        file.set_len(size)
            .map_err(|e| Error::io(path.display(), e))?;
        let direct = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .ok();
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

    /// Writes whole pages from a page-aligned buffer at a page-aligned
    /// offset, with O_DIRECT where the filesystem allows it.
    fn write_pages(&self, offset: u64, data: &[u8]) -> Result<()> {
        debug_assert!(offset.is_multiple_of(PAGE as u64) && data.len().is_multiple_of(PAGE));
        let file = self.direct.as_ref().unwrap_or(&self.file);
        file.write_all_at(data, offset)
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

/// One region being appended to: where it starts, the whole pages written
/// so far, and the bytes of a page not yet full.
struct RegionWriter {
    start: u64,
    done: u64,
    carry: Vec<u8>,
}

impl RegionWriter {
    fn new(start: u64) -> Self {
        RegionWriter {
            start,
            done: 0,
            carry: Vec::new(),
        }
    }

    /// Appends the rows `rows` of the partition that starts at node `first`
    /// (`part` holds its rows) in whole-page writes.
    fn append(
        &mut self,
        out: &OutFile,
        rows: &[u32],
        first: u64,
        part: &[u8],
        rb: usize,
    ) -> Result<()> {
        STAGE.with_borrow_mut(|stage| {
            let mut i = 0;
            while i < rows.len() {
                let c = self.carry.len();
                let take = (stage.len().saturating_sub(c) / rb).clamp(1, rows.len() - i);
                if c + take * rb > stage.len() {
                    stage.resize(c + take * rb);
                }
                let buf = stage.as_mut_slice();
                buf[..c].copy_from_slice(&self.carry);
                let mut at = c;
                for &v in &rows[i..i + take] {
                    let src = (v as u64 - first) as usize * rb;
                    buf[at..at + rb].copy_from_slice(&part[src..src + rb]);
                    at += rb;
                }
                let full = at / PAGE * PAGE;
                if full > 0 {
                    out.write_pages(self.start + self.done, &stage.as_slice()[..full])?;
                    self.done += full as u64;
                }
                self.carry.clear();
                self.carry.extend_from_slice(&stage.as_slice()[full..at]);
                i += take;
            }
            Ok(())
        })
    }

    /// Writes the last, partial page, padded with zeros (every region is
    /// a whole number of pages).
    fn finish(&mut self, out: &OutFile) -> Result<()> {
        if self.carry.is_empty() {
            return Ok(());
        }
        STAGE.with_borrow_mut(|stage| {
            let buf = &mut stage.as_mut_slice()[..PAGE];
            buf.fill(0);
            buf[..self.carry.len()].copy_from_slice(&self.carry);
            out.write_pages(self.start + self.done, &stage.as_slice()[..PAGE])?;
            self.done += PAGE as u64;
            self.carry.clear();
            Ok(())
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
}

/// The writers of one segment's regions: its disk cache, then each chunk.
struct SegmentWriters {
    disk_cache: RegionWriter,
    chunks: Vec<RegionWriter>,
}

/// Everything packing needs, borrowed from the plan.
pub struct PackCtx<'a> {
    pub features: &'a FeatureSource,
    pub cache: &'a CacheMap,
    pub segments: &'a [SegmentPlan],
    pub batches: &'a [BatchInfo],
    pub gpu: Option<&'a OutFile>,
    pub cpu: Option<&'a OutFile>,
    pub seg_files: &'a [OutFile],
    pub row_bytes: u64,
    pub partition_rows: u64,
    pub num_nodes: u64,
}

fn bar(show: bool, len: u64, label: &str, unit: &str) -> indicatif::ProgressBar {
    if show {
        offgnn_shared::progress::bar(len, label, unit)
    } else {
        indicatif::ProgressBar::hidden()
    }
}

impl PackCtx<'_> {
    /// DiskGNN §5.2: the feature file is read once, in partitions; each
    /// partition's rows go to every region that needs them. Two partition
    /// buffers take turns: a reader thread fills one (O_DIRECT, many
    /// requests in flight) while this thread dispatches the other, so the
    /// disk streams while rows are copied out.
    pub fn batched(&self, show: bool) -> Result<PassFigures> {
        let rb = self.row_bytes;
        let pb = if show {
            offgnn_shared::progress::bytes_bar(self.num_nodes * rb, "packing")
        } else {
            indicatif::ProgressBar::hidden()
        };
        let parts: Vec<(u64, u64)> = (0..self.num_nodes)
            .step_by(self.partition_rows.max(1) as usize)
            .map(|first| (first, (first + self.partition_rows).min(self.num_nodes)))
            .collect();
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
        let reader = self.features.partition_reader()?;
        let figures = std::thread::scope(|s| -> Result<PassFigures> {
            let (to_dispatch, filled) = sync_channel::<PartitionBuf>(1);
            let (to_reader, empty) = sync_channel::<PartitionBuf>(2);
            for _ in 0..2 {
                to_reader
                    .send(PartitionBuf::new())
                    .expect("the receiver is alive");
            }
            let (parts_ref, reader) = (&parts, &reader);
            let read_thread = s.spawn(move || -> Result<(u64, f64)> {
                let (mut read, mut busy) = (0u64, 0.0);
                for &(first, end) in parts_ref {
                    let Ok(mut buf) = empty.recv() else {
                        break; // the dispatcher stopped; its error is returned
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
            let mut dispatched = Ok(());
            let mut write_seconds = 0.0;
            for (p, buf) in filled.iter().enumerate() {
                let (first, end) = parts[p];
                let started = Instant::now();
                dispatched = self.dispatch(p, first, end, buf.rows(), &mut tiers, &mut writers);
                write_seconds += started.elapsed().as_secs_f64();
                if dispatched.is_err() {
                    break;
                }
                pb.inc(buf.rows().len() as u64);
                // The reader may be done: a closed channel is fine.
                let _ = to_reader.send(buf);
            }
            drop(filled);
            drop(to_reader);
            let (bytes_read, read_seconds) = read_thread
                .join()
                .expect("the partition reader does not panic")?;
            dispatched?;
            Ok(PassFigures {
                bytes_read,
                read_seconds,
                write_seconds,
            })
        })?;
        for (w, out) in tiers.iter_mut().zip([self.gpu, self.cpu]) {
            if let Some(out) = out {
                w.finish(out)?;
            }
        }
        for ((w, out), seg) in writers.iter_mut().zip(self.seg_files).zip(self.segments) {
            w.disk_cache.finish(out)?;
            for c in &mut w.chunks {
                c.finish(out)?;
            }
            debug_assert!(w.disk_cache.done <= seg.dc_bytes);
        }
        pb.finish_and_clear();
        Ok(figures)
    }

    /// Sends partition `p` (rows `[first, end)`, in `part`) to every region
    /// that needs rows of it: the caches, and each segment's disk cache and
    /// packed chunks. Segments (each its own file) and the two caches are
    /// written side by side.
    fn dispatch(
        &self,
        p: usize,
        first: u64,
        end: u64,
        part: &[u8],
        tiers: &mut [RegionWriter; 2],
        writers: &mut [SegmentWriters],
    ) -> Result<()> {
        let rb = self.row_bytes as usize;
        let in_part = |nodes: &[u32]| -> (usize, usize) {
            let a = nodes.partition_point(|&v| (v as u64) < first);
            let b = nodes.partition_point(|&v| (v as u64) < end);
            (a, b)
        };
        let [gpu_w, cpu_w] = tiers;
        let tier = |w: &mut RegionWriter, rows: &[u32], out: Option<&OutFile>| -> Result<()> {
            match out {
                Some(out) => {
                    let (a, b) = in_part(rows);
                    w.append(out, &rows[a..b], first, part, rb)
                }
                None => Ok(()),
            }
        };
        let (caches, segments) = rayon::join(
            || {
                rayon::join(
                    || tier(gpu_w, &self.cache.gpu, self.gpu),
                    || tier(cpu_w, &self.cache.cpu, self.cpu),
                )
            },
            || {
                self.segments
                    .par_iter()
                    .zip(self.seg_files)
                    .zip(writers.par_iter_mut())
                    .try_for_each(|((seg, out), w)| -> Result<()> {
                        let (a, b) = (seg.dc_bounds[p], seg.dc_bounds[p + 1]);
                        w.disk_cache
                            .append(out, &seg.dc_rows[a..b], first, part, rb)?;
                        for (rows, cw) in seg.packed.iter().zip(&mut w.chunks) {
                            let (a, b) = in_part(rows);
                            if a < b {
                                cw.append(out, &rows[a..b], first, part, rb)?;
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
        let total: u64 = self.cache.gpu.len() as u64
            + self.cache.cpu.len() as u64
            + self
                .segments
                .iter()
                .flat_map(|s| &s.batches)
                .map(|&b| self.batches[b].cold.len() as u64)
                .sum::<u64>();
        let pb = bar(show, total, "packing", "rows");
        let mut read = 0u64;
        for (tier, out) in [(&self.cache.gpu, self.gpu), (&self.cache.cpu, self.cpu)] {
            if let Some(out) = out {
                read += rows.read_each(tier, |slot, data| out.write_at(slot as u64 * rb, data))?;
                pb.inc(tier.len() as u64);
            }
        }
        for (seg, out) in self.segments.iter().zip(self.seg_files) {
            let mut written = std::collections::HashSet::new();
            for (k, &b) in seg.batches.iter().enumerate() {
                let cold = &self.batches[b].cold;
                read += rows.read_each(cold, |i, data| {
                    let v = cold[i];
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
        })
    }
}
