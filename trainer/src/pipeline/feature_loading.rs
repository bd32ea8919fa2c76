//! Stage 1, feature loading (DiskGNN §5.3): a batch's address table, then
//! its disk reads: the packed layout's disk-cache pages and packed chunk,
//! or for the naive baseline one aligned read per row of the raw file.

use offgnn_manifests::BatchRef;
use offgnn_shared::address_table::BatchTable;
use offgnn_shared::io_engine::{AlignedBuf, IoEngine, ReadReq};

use super::sources::{FeatureMode, LoadSources};
use crate::error::{Error, Result};
use crate::layout::Layout;

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
}

/// Stage 1: the batch's table, then its disk reads — page runs of the
/// segment's disk cache and its packed chunk, submitted together — into
/// `buf`, which the result carries on (loaders hand buffers round, so
/// after the first batches no memory is fresh).
pub fn load(
    layout: &Layout,
    engine: &IoEngine,
    src: &LoadSources,
    r: BatchRef,
    buf: AlignedBuf,
) -> Result<Loaded> {
    let table = layout.record(r.segment, r.record)?;
    match src.mode {
        FeatureMode::Memory => Ok(Loaded {
            table,
            buf,
            disk: Vec::new(),
            disk_bytes: 0,
            disk_rows: 0,
        }),
        FeatureMode::Packed => load_packed(layout, engine, src, r, table, buf),
        FeatureMode::Naive => load_naive(engine, src, table, buf),
    }
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
    let disk_bytes = engine.read(layout.segment(r.segment)?, &reqs, &mut buf)?;
    let mut disk = Vec::with_capacity(table.disk_pos.len() + table.packed_pos.len());
    for (&p, &off) in table.disk_pos.iter().zip(&table.disk_offset) {
        disk.push((p, off as usize));
    }
    for (&p, &row) in table.packed_pos.iter().zip(&table.packed_row) {
        disk.push((p, chunk_base + row as usize * rb));
    }
    let disk_rows = disk.len() as u64;
    Ok(Loaded {
        table,
        buf,
        disk,
        disk_bytes,
        disk_rows,
    })
}

/// The naive baseline's reads: one aligned read per needed row of the raw
/// feature file.
fn load_naive(
    engine: &IoEngine,
    src: &LoadSources,
    table: BatchTable,
    mut buf: AlignedBuf,
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
    Ok(Loaded {
        table,
        buf,
        disk,
        disk_bytes,
        disk_rows: n as u64,
    })
}
