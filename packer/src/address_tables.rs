//! The layout's address tables (DiskGNN §6): for every batch, where each
//! input row comes from (GPU slot, CPU slot, disk-cache page and offset,
//! packed-chunk row), precomputed so that the trainer does no lookups, and
//! written as one table object per segment with the figures the summary
//! and the manifest report (read amplification, access shares, the largest
//! batch).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use offgnn_manifests::{self as manifests, Object};
use offgnn_shared::address_table::{self, BatchTable, TableWriter};
use offgnn_shared::dataset::Split;
use offgnn_shared::samples::{RunSummary, SampledBatch};
use offgnn_shared::store::Store;
use serde::Serialize;

use crate::access_rank::{Location, Tiers};
use crate::belady::BatchCpu;
use crate::error::{Error, Result};
use crate::plan::{self, BatchInfo, CpuPlan, SegmentPlan};
use crate::typed::TypeView;

/// The write buffer of each segment's table object (all are open at once).
pub(crate) const TABLE_BUFFER: usize = 16 << 10;

/// Batches whose tables are built at once, in parallel, before they go out
/// in order: two a thread.
pub(crate) fn table_window() -> usize {
    2 * rayon::current_num_threads()
}

/// Totals gathered while writing the tables.
#[derive(Default)]
pub(crate) struct TableTotals {
    pub objects: Vec<Object>,
    /// Each figure's maximum over all batches.
    pub largest: manifests::BatchShape,
    gpu: u64,
    cpu: u64,
    dc: u64,
    packed: u64,
    disk_bytes: u64,
    needed_bytes: u64,
    /// Of the training batches' reads: the disk-cache pages and the bytes
    /// of the disk-cache rows on them; the packed chunks and their rows.
    dc_read_bytes: u64,
    dc_needed_bytes: u64,
    chunk_read_bytes: u64,
    chunk_needed_bytes: u64,
    /// The fewest bytes the same reads could take: each batch's disk-cache
    /// rows, and its packed rows, on whole 4 KiB pages of their own.
    least_bytes: u64,
}

/// `read / needed`, 1 when nothing is needed.
fn ratio(read: u64, needed: u64) -> f64 {
    if needed == 0 {
        1.0
    } else {
        read as f64 / needed as f64
    }
}

/// Where a layout's read amplification comes from (training batches,
/// averaged over the sampled epochs), beside a lower bound for its plan.
#[derive(Clone, Debug, Default, Serialize)]
pub struct AmplificationParts {
    /// Disk-cache pages read over the disk-cache rows' bytes: the rows a
    /// page holds that the batch does not need, and rows straddling pages.
    pub disk_cache: f64,
    /// Packed chunks over their rows: the last page's padding only.
    pub packed: f64,
    /// Share of the bytes read that are disk-cache pages.
    pub disk_cache_read_share: f64,
    /// The least amplification of this plan (tiers and segments as they
    /// are): every batch's disk-cache rows and its packed rows each on
    /// their own whole pages, as no layout of shared rows can do for every
    /// batch at once. The gap to it is what the row order costs.
    pub lower_bound: f64,
}

impl TableTotals {
    pub(crate) fn amplification(&self) -> f64 {
        ratio(self.disk_bytes, self.needed_bytes)
    }

    pub(crate) fn parts(&self) -> AmplificationParts {
        AmplificationParts {
            disk_cache: ratio(self.dc_read_bytes, self.dc_needed_bytes),
            packed: ratio(self.chunk_read_bytes, self.chunk_needed_bytes),
            disk_cache_read_share: self.dc_read_bytes as f64 / self.disk_bytes.max(1) as f64,
            lower_bound: ratio(self.least_bytes, self.needed_bytes),
        }
    }

    pub(crate) fn shares(&self) -> manifests::AccessShares {
        let total = (self.gpu + self.cpu + self.dc + self.packed).max(1) as f64;
        manifests::AccessShares {
            gpu: self.gpu as f64 / total,
            cpu: self.cpu as f64 / total,
            disk_cache: self.dc as f64 / total,
            packed: self.packed as f64 / total,
        }
    }
}

/// A writer that keeps the CRC32C of what passes through.
pub(crate) struct CrcWriter<W> {
    inner: W,
    crc: u32,
}

impl<W: Write> Write for CrcWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc = crc32c::crc32c_append(self.crc, &buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Builds one batch's address table (DiskGNN §6). The batch's labels,
/// input nodes and blocks move into the table: they are its largest part,
/// and copying them cost the table writer fresh memory beside the packing.
/// Under Belady (`cpu`), the CPU-cache rows are the batch's hits, and
/// the rows it admits follow its addresses.
pub fn batch_table(
    b: SampledBatch,
    seg: &SegmentPlan,
    record: usize,
    (cache, cpu): (&Tiers, Option<&BatchCpu>),
    row_bytes: u64,
) -> Result<BatchTable> {
    let mut t = BatchTable {
        split: Some(b.split),
        epoch: b.epoch,
        index: b.index,
        num_inputs: b.input_nodes.len() as u32,
        labels: b.labels,
        input_nodes: b.input_nodes,
        chunk_offset: seg.chunk_offset[record],
        chunk_len: seg.chunk_len[record],
        blocks: b.blocks,
        pairs: b.pairs,
        ..Default::default()
    };
    let mut on_disk: Vec<(u32, u32)> = Vec::new(); // (node, input position)
    for (i, &v) in t.input_nodes.iter().enumerate() {
        let at = match (cache.locate(v), cpu) {
            (Location::Gpu(slot), _) => Location::Gpu(slot),
            (_, Some(u)) => match u.hits.binary_search_by_key(&v, |h| h.0) {
                Ok(h) => Location::Cpu(u.hits[h].1),
                Err(_) => Location::Disk,
            },
            (at, None) => at,
        };
        match at {
            Location::Gpu(slot) => {
                t.gpu_pos.push(i as u32);
                t.gpu_slot.push(slot);
            }
            Location::Cpu(slot) => {
                t.cpu_pos.push(i as u32);
                t.cpu_slot.push(slot);
            }
            Location::Disk => on_disk.push((v, i as u32)),
        }
    }
    // Sorted by node, the rows on disk find their disk-cache places in one
    // walk of the segment's index (binary searches over it were most of
    // the table writer's time); the rest are in the batch's packed chunk.
    on_disk.sort_unstable();
    let mut dc: Vec<(u64, u32)> = Vec::new(); // (cache position, input position)
    let mut packed: Vec<(u32, u32)> = Vec::new(); // (input position, chunk row)
    let places = seg.dc_positions_sorted(on_disk.iter().map(|&(v, _)| v));
    for (&(v, i), place) in on_disk.iter().zip(places) {
        match place {
            Some(pos) => dc.push((pos as u64, i)),
            None => {
                let row = seg.packed[record].binary_search(&v).map_err(|_| {
                    Error::InvalidArgument(format!(
                        "internal: node {v} of batch {} has no place",
                        t.index
                    ))
                })?;
                packed.push((i, row as u32));
            }
        }
    }
    if let Some(u) = cpu {
        admissions(&mut t, &on_disk, u)?;
    }
    // The packed rows in input order, as the table has always listed them.
    packed.sort_unstable();
    (t.packed_pos, t.packed_row) = packed.into_iter().unzip();
    dc.sort_unstable();
    let positions: Vec<u64> = dc.iter().map(|d| d.0).collect();
    let pages = crate::disk_pages::pages_of_rows(&positions, row_bytes);
    t.page_runs = crate::disk_pages::page_runs(&pages);
    for (pos, i) in dc {
        let byte = pos * row_bytes;
        let page_index = pages.binary_search(&(byte / plan::PAGE)).map_err(|_| {
            Error::InvalidArgument("internal: a disk-cache row outside its pages".into())
        })? as u64;
        t.disk_pos.push(i);
        t.disk_offset
            .push(page_index * plan::PAGE + byte % plan::PAGE);
    }
    Ok(t)
}

/// The batch's admissions into the CPU cache, in input order: each admits
/// a row it reads from disk (`on_disk`: `(node, input position)` sorted
/// by node).
fn admissions(t: &mut BatchTable, on_disk: &[(u32, u32)], u: &BatchCpu) -> Result<()> {
    let mut admit = Vec::with_capacity(u.admits.len());
    for &(v, slot) in &u.admits {
        let k = on_disk.binary_search_by_key(&v, |d| d.0).map_err(|_| {
            Error::InvalidArgument(format!(
                "internal: batch {} admits node {v}, which it does not read from disk",
                t.index
            ))
        })?;
        admit.push((on_disk[k].1, slot));
    }
    admit.sort_unstable();
    (t.admit_pos, t.admit_slot) = admit.into_iter().unzip();
    Ok(())
}

/// A batch's table, encoded, with its place (segment and record) and the
/// figures the summary adds up; the table itself is dropped once encoded,
/// so a window holds only the encoded records.
struct Built {
    si: usize,
    ri: usize,
    split: Split,
    index: u32,
    inputs: u64,
    /// `[sources, destinations, edges]` per block.
    blocks: Vec<[u64; 3]>,
    /// Rows from the GPU cache, the CPU cache, the disk cache, packed.
    tiers: [u64; 4],
    disk_bytes: u64,
    chunk_len: u64,
    record: Vec<u8>,
}

impl Built {
    /// Builds and encodes the table of batch `b`, record `ri` of segment `si`.
    fn new(
        b: SampledBatch,
        (si, ri): (usize, usize),
        seg: &SegmentPlan,
        cache: (&Tiers, Option<&BatchCpu>),
        row_bytes: u64,
        num_nodes: u64,
        scratch: &mut Vec<u8>,
    ) -> Result<Built> {
        let t = batch_table(b, seg, ri, cache, row_bytes)?;
        let mut record = Vec::new();
        address_table::encode_into(&t, row_bytes, num_nodes, scratch, &mut record)?;
        Ok(Built {
            si,
            ri,
            split: t.split.expect("set by batch_table"),
            index: t.index,
            inputs: t.input_nodes.len() as u64,
            blocks: t
                .blocks
                .iter()
                .map(|b| [b.num_src.into(), b.num_dst.into(), b.src.len() as u64])
                .collect(),
            tiers: [
                t.gpu_pos.len() as u64,
                t.cpu_pos.len() as u64,
                t.disk_pos.len() as u64,
                t.packed_pos.len() as u64,
            ],
            disk_bytes: t.disk_bytes(),
            chunk_len: t.chunk_len,
            record,
        })
    }
}

impl TableTotals {
    /// Adds a built table's figures: its shape to the largest batch's, and
    /// a training batch's reads to the read amplification's parts.
    fn add(&mut self, built: &Built, row_bytes: u64) {
        let largest = &mut self.largest;
        largest.inputs = largest.inputs.max(built.inputs);
        largest
            .blocks
            .resize(built.blocks.len().max(largest.blocks.len()), [0; 3]);
        for (most, shape) in largest.blocks.iter_mut().zip(&built.blocks) {
            for (m, x) in most.iter_mut().zip(shape) {
                *m = (*m).max(*x);
            }
        }
        if built.split == Split::Train {
            let [gpu, cpu, dc, packed] = built.tiers;
            self.gpu += gpu;
            self.cpu += cpu;
            self.dc += dc;
            self.packed += packed;
            self.disk_bytes += built.disk_bytes;
            self.needed_bytes += (dc + packed) * row_bytes;
            let (dc_needed, chunk_needed) = (dc * row_bytes, packed * row_bytes);
            self.dc_read_bytes += built.disk_bytes - built.chunk_len;
            self.dc_needed_bytes += dc_needed;
            self.chunk_read_bytes += built.chunk_len;
            self.chunk_needed_bytes += chunk_needed;
            self.least_bytes +=
                dc_needed.next_multiple_of(plan::PAGE) + chunk_needed.next_multiple_of(plan::PAGE);
        }
    }
}

/// Where each batch's record goes: its segment and its place there.
type Places = HashMap<(Split, u32, u32), (usize, usize)>;

fn batch_places(segments: &[SegmentPlan], batches: &[BatchInfo]) -> Places {
    let mut place = Places::new();
    for (si, s) in segments.iter().enumerate() {
        for (ri, &b) in s.batches.iter().enumerate() {
            let info = &batches[b];
            place.insert((info.split, info.epoch, info.index), (si, ri));
        }
    }
    place
}

/// Builds and encodes the tables of a window of batches in parallel, in
/// the window's order; `None` for a batch no segment holds.
fn build_window(
    window: Vec<SampledBatch>,
    place: &Places,
    segments: &[SegmentPlan],
    (cache, cpu): (&Tiers, &CpuPlan),
    row_bytes: u64,
    num_nodes: u64,
) -> Result<Vec<Option<Built>>> {
    use rayon::prelude::*;
    window
        .into_par_iter()
        .map_init(Vec::new, |scratch, b| -> Result<Option<Built>> {
            let Some(&(si, ri)) = place.get(&(b.split, b.epoch, b.index)) else {
                return Ok(None);
            };
            let used = cpu.of(segments[si].batches[ri]);
            let built = Built::new(
                b,
                (si, ri),
                &segments[si],
                (cache, used),
                row_bytes,
                num_nodes,
                scratch,
            )?;
            Ok(Some(built))
        })
        .collect()
}

pub(crate) type Table = TableWriter<CrcWriter<BufWriter<File>>>;

/// Creates the table object `name` (relative to `staging`).
pub(crate) fn open_table(staging: &Path, name: &str) -> Result<Table> {
    let path = staging.join(name);
    let f = File::create(&path).map_err(|e| Error::io(path.display(), e))?;
    Ok(TableWriter::new(CrcWriter {
        inner: BufWriter::with_capacity(TABLE_BUFFER, f),
        crc: 0,
    }))
}

/// Writes a table's index and footer, flushes and syncs it: a manifest
/// object.
pub(crate) fn finish_table(name: String, w: Table) -> Result<Object> {
    let (mut crcw, size) = w.finish().map_err(|e| Error::io(&name, e))?;
    crcw.flush().map_err(|e| Error::io(&name, e))?;
    let file = crcw
        .inner
        .into_inner()
        .map_err(|e| Error::io(&name, e.into_error()))?;
    file.sync_all().map_err(|e| Error::io(&name, e))?;
    Ok(Object {
        name,
        size,
        crc32c: crcw.crc,
    })
}

/// Each segment's table object, open from its first record to its last
/// (all may be open at once).
struct TableObjects<'a> {
    staging: &'a Path,
    prefix: &'a str,
    writers: Vec<Option<Table>>,
}

impl<'a> TableObjects<'a> {
    fn new(staging: &'a Path, prefix: &'a str, segments: usize) -> Self {
        TableObjects {
            staging,
            prefix,
            writers: (0..segments).map(|_| None).collect(),
        }
    }

    fn name(&self, si: usize) -> String {
        format!("{}/table-{si:05}.bin", self.prefix)
    }

    /// Appends a built record to its segment's table, which it opens if
    /// this is the first; records arrive in each segment's order.
    fn append(&mut self, built: &Built) -> Result<()> {
        let (si, ri) = (built.si, built.ri);
        let name = self.name(si);
        if self.writers[si].is_none() {
            self.writers[si] = Some(open_table(self.staging, &name)?);
        }
        let w = self.writers[si].as_mut().expect("created above");
        if w.len() != ri {
            return Err(Error::InvalidArgument(format!(
                "internal: batch {} of {} arrived out of order",
                built.index, built.split
            )));
        }
        w.push(&built.record).map_err(|e| Error::io(&name, e))
    }

    /// Finishes segment `si`'s table once it holds all `batches` records:
    /// its footer written, flushed and synced, it is a manifest object.
    fn finish_if_complete(&mut self, si: usize, batches: usize) -> Result<Option<Object>> {
        let complete = self.writers[si]
            .as_ref()
            .is_some_and(|w| w.len() == batches);
        if !complete {
            return Ok(None);
        }
        let w = self.writers[si].take().expect("present");
        finish_table(self.name(si), w).map(Some)
    }

    /// Every segment's table is complete: the samples held all its batches.
    fn check_complete(&self) -> Result<()> {
        if let Some(si) = self.writers.iter().position(Option::is_some) {
            return Err(Error::InvalidArgument(format!(
                "the samples lack batches of segment {si}: the run summary and its files disagree"
            )));
        }
        Ok(())
    }
}

/// Streams every batch from the samples again (for its topology) and writes
/// each segment's table object.
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_tables(
    (samples, run, view): (&Store, &RunSummary, Option<&TypeView>),
    staging: &Path,
    prefix: &str,
    segments: &[SegmentPlan],
    batches: &[BatchInfo],
    cache: (&Tiers, &CpuPlan),
    row_bytes: u64,
    num_nodes: u64,
    show: bool,
) -> Result<TableTotals> {
    let place = batch_places(segments, batches);
    let mut tables = TableObjects::new(staging, prefix, segments.len());
    let mut totals = TableTotals::default();
    let pb = offgnn_shared::progress::bar_if(show, batches.len() as u64, "tables", "batches");
    for file in &run.files {
        offgnn_shared::signals::check()?;
        let mut decoded = offgnn_shared::samples::read_file(samples, file)?.into_iter();
        loop {
            // A window of batches builds and encodes its tables in parallel
            // (one at a time, this was the packer's longest step), then
            // they go out in order; a window's tables are a few MB.
            let window: Vec<SampledBatch> = decoded
                .by_ref()
                .take(table_window())
                .map(|b| match view {
                    Some(v) => v.batch(&b),
                    None => b,
                })
                .collect();
            if window.is_empty() {
                break;
            }
            let built = build_window(window, &place, segments, cache, row_bytes, num_nodes)?;
            for built in built.into_iter().flatten() {
                totals.add(&built, row_bytes);
                tables.append(&built)?;
                pb.inc(1);
                let si = built.si;
                if let Some(object) = tables.finish_if_complete(si, segments[si].batches.len())? {
                    totals.objects.push(object);
                }
            }
        }
    }
    pb.finish_and_clear();
    tables.check_complete()?;
    totals.objects.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(totals)
}
