//! Stage 1, feature loading (DiskGNN §5.3): a batch's address table, then
//! its disk reads: the packed layout's disk-cache pages and packed chunk,
//! or for the naive baseline one aligned read per row of the raw file.
//! With the historical cache, the batch is pruned first and only the rows
//! the pruned batch needs are read: whole pages, skipping every page (of a
//! disk-cache run or the packed chunk) that holds none of them.

use offgnn_manifests::BatchRef;
use offgnn_shared::address_table::BatchTable;
use offgnn_shared::io_engine::{AlignedBuf, IoEngine, ReadReq};

use super::sources::{FeatureMode, LoadSources};
use crate::error::{Error, Result};
use crate::historical::{Historical, Plan};
use crate::layout::Layout;

/// Disk pages are read whole.
const PAGE: usize = 4096;

/// Output of feature loading: the pages read, where each row read from disk
/// sits in them, and the table.
pub struct Loaded {
    pub table: BatchTable,
    /// The batch's reads, back to back (disk-cache page runs, then its packed
    /// chunk; naive mode: each row's pages).
    pub buf: AlignedBuf,
    /// `(input position, byte offset in buf)` of every row read from disk.
    pub disk: Vec<(u32, usize)>,
    pub disk_bytes: u64,
    pub disk_rows: u64,
    /// The batch pruned against the historical cache (its table's blocks
    /// are then the pruned ones).
    pub plan: Option<Plan>,
    /// Whether it was pruned: inputs the pruned batch no longer reads have
    /// no row (the plan itself goes on to the model step).
    pub pruned: bool,
}

/// Stage 1: the batch's table, then its disk reads — page runs of the
/// segment's disk cache and its packed chunk, submitted together — into
/// `buf`, which the result carries on (loaders hand buffers round, so
/// after the first batches no memory is fresh). With `historical`, the
/// batch is training step `step` and is pruned against the cache first.
pub fn load(
    layout: &Layout,
    engine: &IoEngine,
    src: &LoadSources,
    r: BatchRef,
    buf: AlignedBuf,
    historical: Option<(&Historical, u64)>,
) -> Result<Loaded> {
    let mut table = layout.record(r.segment, r.record)?;
    let mut plan =
        historical.and_then(|(h, step)| h.lookup(step, &table.blocks, &table.input_nodes));
    let needed = plan.as_ref().map(|p| needed_rows(&table, &p.pruned.inputs));
    if let Some(p) = plan.as_mut() {
        table.blocks = std::mem::take(&mut p.pruned.blocks);
    }
    let mut loaded = load_table(layout, engine, src, (r, table), buf, needed)?;
    loaded.pruned = plan.is_some();
    loaded.plan = plan;
    Ok(loaded)
}

/// Stage 1 for one node type of a typed batch pruned against the
/// historical cache (`inputs`: the type's input positions the pruned batch
/// reads; none: every row), as [`load`] reads a pruned batch.
pub fn load_inputs(
    layout: &Layout,
    engine: &IoEngine,
    src: &LoadSources,
    r: BatchRef,
    buf: AlignedBuf,
    inputs: Option<&[u32]>,
) -> Result<Loaded> {
    let table = layout.record(r.segment, r.record)?;
    let needed = inputs.map(|i| needed_rows(&table, i));
    let mut loaded = load_table(layout, engine, src, (r, table), buf, needed)?;
    loaded.pruned = inputs.is_some();
    Ok(loaded)
}

/// The rows a pruned batch still reads: its `inputs`, and the rows a CPU
/// cache that follows the batch order admits from this batch's reads.
fn needed_rows(table: &BatchTable, inputs: &[u32]) -> Vec<bool> {
    let mut needed = vec![false; table.num_inputs as usize];
    for &i in inputs.iter().chain(&table.admit_pos) {
        if let Some(n) = needed.get_mut(i as usize) {
            *n = true;
        }
    }
    needed
}

/// Batch `r`'s reads as its `table` addresses them, only the `needed`
/// rows where given.
fn load_table(
    layout: &Layout,
    engine: &IoEngine,
    src: &LoadSources,
    (r, table): (BatchRef, BatchTable),
    buf: AlignedBuf,
    needed: Option<Vec<bool>>,
) -> Result<Loaded> {
    Ok(match src.mode {
        FeatureMode::Memory => Loaded {
            table,
            buf,
            disk: Vec::new(),
            disk_bytes: 0,
            disk_rows: 0,
            plan: None,
            pruned: false,
        },
        FeatureMode::Packed => load_packed(layout, engine, src, r, table, buf, needed.as_deref())?,
        FeatureMode::Naive => load_naive(engine, src, table, buf, needed.as_deref())?,
    })
}

/// `reqs` narrowed to the pages that hold a row of `disk` (`(input, byte
/// offset in the buffer)`, rows of `rb` bytes) whose input is `needed`;
/// `disk` keeps only those rows. Every request starts on a page of the
/// buffer and the file, so its pages map one to one.
fn narrow_to_needed(
    reqs: Vec<ReadReq>,
    disk: &mut Vec<(u32, usize)>,
    needed: &[bool],
    rb: usize,
) -> Vec<ReadReq> {
    disk.retain(|&(p, _)| needed[p as usize]);
    let end = reqs.iter().map(|q| q.buf_offset + q.len).max().unwrap_or(0);
    let mut marked = vec![false; end.div_ceil(PAGE)];
    for &(_, off) in disk.iter() {
        marked[off / PAGE..=(off + rb.max(1) - 1) / PAGE].fill(true);
    }
    let mut out = Vec::new();
    for q in reqs {
        let (first, last) = (q.buf_offset / PAGE, (q.buf_offset + q.len).div_ceil(PAGE));
        let mut page = first;
        while page < last {
            if !marked[page] {
                page += 1;
                continue;
            }
            let run = page;
            while page < last && marked[page] {
                page += 1;
            }
            let from = run * PAGE - q.buf_offset;
            let to = (page * PAGE - q.buf_offset).min(q.len);
            out.push(ReadReq {
                offset: q.offset + from as u64,
                len: to - from,
                buf_offset: run * PAGE,
            });
        }
    }
    out
}

/// `reqs` (in file and buffer order) with neighbours whose gap in the file
/// is at most `max_gap` bytes read as one request, through the gap, while
/// the buffer stays within `limit` bytes: the gap's pages land between
/// them, and the requests after move along the buffer by what the gap
/// adds (nothing where narrowing left the gap's room there). The rows of
/// `disk` move with their pages. Returns the buffer's new length.
fn read_through_gaps(
    reqs: &mut Vec<ReadReq>,
    disk: &mut [(u32, usize)],
    max_gap: u64,
    limit: usize,
) -> usize {
    let end_of = |q: &ReadReq| q.buf_offset + q.len;
    let mut budget = limit.saturating_sub(reqs.last().map_or(0, end_of));
    // Each request's old buffer start and how far it moved.
    let mut moves: Vec<(usize, usize)> = Vec::with_capacity(reqs.len());
    let mut out: Vec<ReadReq> = Vec::with_capacity(reqs.len());
    let mut moved = 0usize;
    for q in reqs.drain(..) {
        if let Some(last) = out.last_mut() {
            let file_end = last.offset + last.len as u64;
            let gap = q.offset.wrapping_sub(file_end);
            // Where q lands read through the gap, against where it lands
            // otherwise: what merging adds to the buffer.
            let through = end_of(last) + gap as usize;
            let grows = through.checked_sub(q.buf_offset + moved);
            if q.offset >= file_end
                && gap <= max_gap
                && let Some(grows) = grows.filter(|&g| g <= budget)
            {
                budget -= grows;
                moved += grows;
                last.len = through + q.len - last.buf_offset;
                moves.push((q.buf_offset, moved));
                continue;
            }
        }
        moves.push((q.buf_offset, moved));
        out.push(ReadReq {
            buf_offset: q.buf_offset + moved,
            ..q
        });
    }
    for (_, off) in disk.iter_mut() {
        let i = moves.partition_point(|&(start, _)| start <= *off);
        *off += moves[i.max(1) - 1].1;
    }
    *reqs = out;
    reqs.last().map_or(0, end_of)
}

/// The packed layout's reads: the batch's page runs of the segment's disk
/// cache, then its packed chunk.
fn load_packed(
    layout: &Layout,
    engine: &IoEngine,
    src: &LoadSources,
    r: BatchRef,
    table: BatchTable,
    mut buf: AlignedBuf,
    needed: Option<&[bool]>,
) -> Result<Loaded> {
    let rb = src.row_bytes;
    let mut reqs = Vec::with_capacity(table.page_runs.len() + 1);
    let mut at = 0usize;
    for &(first, count) in &table.page_runs {
        reqs.push(ReadReq {
            offset: first * 4096,
            len: (count * 4096) as usize,
            buf_offset: at,
        });
        at += (count * 4096) as usize;
    }
    let chunk_base = at;
    if table.chunk_len > 0 {
        reqs.push(ReadReq {
            offset: table.chunk_offset,
            len: table.chunk_len as usize,
            buf_offset: at,
        });
        at += table.chunk_len as usize;
    }
    buf.resize(at);
    let mut disk = Vec::with_capacity(table.disk_pos.len() + table.packed_pos.len());
    for (&p, &off) in table.disk_pos.iter().zip(&table.disk_offset) {
        disk.push((p, off as usize));
    }
    for (&p, &row) in table.packed_pos.iter().zip(&table.packed_row) {
        disk.push((p, chunk_base + row as usize * rb));
    }
    if let Some(needed) = needed {
        reqs = narrow_to_needed(reqs, &mut disk, needed, rb);
    }
    let gap = engine.options().read_through as u64;
    if gap > 0 {
        // What the memory statement holds a batch's read to: a page per
        // input row at most, never more than its segment's disk cache,
        // and its packed chunk.
        let cache = layout.manifest.segments[r.segment as usize].disk_cache_bytes as usize;
        let limit = (table.num_inputs as usize * PAGE).min(cache.next_multiple_of(PAGE))
            + table.chunk_len as usize;
        let len = read_through_gaps(&mut reqs, &mut disk, gap, limit);
        buf.resize(len.max(at));
    }
    let disk_bytes = engine.read(layout.segment(r.segment)?, &reqs, &mut buf)?;
    let disk_rows = disk.len() as u64;
    Ok(Loaded {
        table,
        buf,
        disk,
        disk_bytes,
        disk_rows,
        plan: None,
        pruned: false,
    })
}

/// The naive baseline's reads: one aligned read per needed row of the raw
/// feature file.
fn load_naive(
    engine: &IoEngine,
    src: &LoadSources,
    table: BatchTable,
    mut buf: AlignedBuf,
    needed: Option<&[bool]>,
) -> Result<Loaded> {
    let rb = src.row_bytes;
    let (file, data_offset) = src
        .raw
        .as_ref()
        .ok_or_else(|| Error::Internal("naive mode without a feature file".into()))?;
    let file_len = file.len();
    // One aligned read per needed row: the pages that hold it.
    let n = table.input_nodes.len();
    let mut reqs = Vec::with_capacity(n);
    let mut disk = Vec::with_capacity(n);
    let mut tail_rows = Vec::new();
    let mut at = 0usize;
    for (i, &v) in table.input_nodes.iter().enumerate() {
        if needed.is_some_and(|n| !n[i]) {
            continue;
        }
        let start = data_offset + v as u64 * rb as u64;
        let first = start / 4096 * 4096;
        let end = (start + rb as u64).div_ceil(4096) * 4096;
        if file.is_direct() && end > file_len {
            tail_rows.push((i, start));
            continue;
        }
        reqs.push(ReadReq {
            offset: first,
            len: (end - first) as usize,
            buf_offset: at,
        });
        disk.push((i as u32, at + (start - first) as usize));
        at += (end - first) as usize;
    }
    // Rows in the file's short last page are read buffered, after
    // the rest in the same buffer.
    buf.resize(at + tail_rows.len() * rb);
    let mut disk_bytes = engine.read(file, &reqs, &mut buf)?;
    if !tail_rows.is_empty() {
        let tail = src
            .raw_tail
            .as_ref()
            .ok_or_else(|| Error::Internal("naive mode without a feature file".into()))?;
        for (k, (i, start)) in tail_rows.into_iter().enumerate() {
            let off = at + k * rb;
            std::os::unix::fs::FileExt::read_exact_at(
                tail,
                &mut buf.as_mut_slice()[off..off + rb],
                start,
            )
            .map_err(|e| Error::io(file.path().display(), e))?;
            disk_bytes += 4096;
            disk.push((i as u32, off));
        }
    }
    let disk_rows = disk.len() as u64;
    Ok(Loaded {
        table,
        buf,
        disk,
        disk_bytes,
        disk_rows,
        plan: None,
        pruned: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_pages_that_hold_a_needed_row_are_read() {
        // A disk-cache run of 3 pages at file page 10, then a 2-page chunk
        // at byte 1 MiB; rows of 3000 bytes.
        let reqs = vec![
            ReadReq {
                offset: 10 * 4096,
                len: 3 * 4096,
                buf_offset: 0,
            },
            ReadReq {
                offset: 1 << 20,
                len: 2 * 4096,
                buf_offset: 3 * 4096,
            },
        ];
        // Input 0 spans pages 0-1 of the run, input 1 sits in page 2,
        // input 2 is the chunk's second page, input 3 its first.
        let mut disk = vec![(0, 2000), (1, 8192), (2, 4 * 4096), (3, 3 * 4096)];
        let needed = [true, false, true, false];
        let out = narrow_to_needed(reqs, &mut disk, &needed, 3000);
        assert_eq!(disk, vec![(0, 2000), (2, 4 * 4096)]);
        let got: Vec<(u64, usize, usize)> = out
            .iter()
            .map(|q| (q.offset, q.len, q.buf_offset))
            .collect();
        assert_eq!(
            got,
            vec![(10 * 4096, 2 * 4096, 0), ((1 << 20) + 4096, 4096, 4 * 4096)]
        );
    }

    fn req(page: u64, pages: usize, buf_page: usize) -> ReadReq {
        ReadReq {
            offset: page * PAGE as u64,
            len: pages * PAGE,
            buf_offset: buf_page * PAGE,
        }
    }

    fn spans(reqs: &[ReadReq]) -> Vec<(u64, usize, usize)> {
        reqs.iter()
            .map(|q| (q.offset / PAGE as u64, q.len / PAGE, q.buf_offset / PAGE))
            .collect()
    }

    #[test]
    fn reads_merge_through_small_gaps_and_rows_move_with_their_pages() {
        // Runs at file pages 10-11, 13, 20 and 22, back to back in the
        // buffer; a row in each (the second run's at byte 100 of it).
        let mut reqs = vec![req(10, 2, 0), req(13, 1, 2), req(20, 1, 3), req(22, 1, 4)];
        let mut disk = vec![(0, 4096), (1, 2 * 4096 + 100), (2, 3 * 4096), (3, 4 * 4096)];
        let len = read_through_gaps(&mut reqs, &mut disk, 2 * PAGE as u64, usize::MAX);
        // Gaps of 1 page and 1 page merge; the 6-page gap does not.
        assert_eq!(spans(&reqs), vec![(10, 4, 0), (20, 3, 4)]);
        assert_eq!(len, 7 * PAGE);
        // Each row sits where its file page now lands in the buffer.
        assert_eq!(
            disk,
            vec![(0, 4096), (1, 3 * 4096 + 100), (2, 4 * 4096), (3, 6 * 4096)]
        );
        // A buffer limit stops the merging where the gaps would pass it.
        let mut reqs = vec![req(10, 2, 0), req(13, 1, 2), req(20, 1, 3), req(22, 1, 4)];
        let mut disk = vec![(3, 4 * 4096)];
        read_through_gaps(&mut reqs, &mut disk, 2 * PAGE as u64, 6 * PAGE);
        assert_eq!(spans(&reqs), vec![(10, 4, 0), (20, 1, 4), (22, 1, 5)]);
        assert_eq!(disk, vec![(3, 5 * 4096)]);
    }

    #[test]
    fn pages_skipped_by_narrowing_are_read_through_in_place() {
        // A 4-page run narrowed to its pages 0 and 2: the buffer keeps
        // page 1's room, so reading through it grows nothing.
        let mut reqs = vec![req(10, 1, 0), req(12, 1, 2)];
        let mut disk = vec![(0, 0), (1, 2 * 4096)];
        let len = read_through_gaps(&mut reqs, &mut disk, PAGE as u64, 3 * PAGE);
        assert_eq!(spans(&reqs), vec![(10, 3, 0)]);
        assert_eq!((len, disk), (3 * PAGE, vec![(0, 0), (1, 2 * 4096)]));
        // Reads out of file order, or apart by more than the gap, stay.
        let mut reqs = vec![req(30, 1, 0), req(10, 1, 1), req(14, 1, 2)];
        read_through_gaps(&mut reqs, &mut [], 2 * PAGE as u64, usize::MAX);
        assert_eq!(spans(&reqs), vec![(30, 1, 0), (10, 1, 1), (14, 1, 2)]);
    }
}
