//! The four stages of a training step (DiskGNN §5.3) and the pipeline that
//! runs them on their own threads joined by bounded queues:
//!
//! ```text
//! feature loading ──▶ feature assembly ──▶ ┐
//! (table + disk I/O)   (tensor on device)   ├─▶ model step
//!         └──────────▶ graph loading ─────▶ ┘
//! ```
//!
//! Both paths carry batches in the same order, so the heads of the two
//! queues always belong to the same batch. With the pipeline off, one thread
//! runs the same stage functions in sequence — same inputs, same results.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::time::{Duration, Instant};

use offgnn_manifests::BatchRef;
use offgnn_shared::address_table::BatchTable;
use offgnn_shared::io_engine::{AlignedBuf, IoEngine, IoFile, ReadReq};
use tch::{Device, Kind, Tensor};

use crate::cuda::{Event, Stream};
use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::model::BlockTensors;

/// Where input rows come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FeatureMode {
    /// The packed layout: caches, disk-cache pages and packed chunks.
    Packed,
    /// The DGL-OnDisk baseline: one aligned O_DIRECT read per row from the raw feature file.
    Naive,
    /// Every feature in RAM: the upper bound.
    Memory,
}

/// What feature loading needs (shared by reference with the loader thread).
pub struct LoadSources {
    pub mode: FeatureMode,
    pub row_bytes: usize,
    /// The raw feature file (naive mode) and its data offset.
    pub raw: Option<(IoFile, u64)>,
    /// The same file opened buffered, for rows in its last partial page
    /// (an O_DIRECT read cannot stop short of a page boundary).
    pub raw_tail: Option<std::fs::File>,
}

/// What feature assembly needs: the GPU cache on the device (CUDA), and
/// host rows for the rest (the CPU cache; every node in memory mode),
/// gathered by this crate's own copies: on the CPU straight into the batch
/// matrix (no torch threads racing the model step's for the same cores), on
/// CUDA into a small page-locked staging buffer that one non-blocking copy
/// takes to the device (DiskGNN §4, feature assembling).
pub struct AssembleSources {
    pub mode: FeatureMode,
    pub device: Device,
    /// Element kind of the stored features (Float or Half).
    pub kind: Kind,
    pub dim: i64,
    pub row_bytes: usize,
    /// The GPU cache tier on the device (CUDA).
    pub gpu_cache: Option<Tensor>,
    /// Host rows of the GPU cache (on the CPU device), the CPU cache and
    /// (memory mode) every node.
    pub gpu_rows: Option<Arc<Vec<u8>>>,
    pub cpu_rows: Option<Arc<Vec<u8>>>,
    pub all_rows: Option<Arc<Vec<u8>>>,
}

impl AssembleSources {
    /// Another handle on the same tensor and rows (no copy).
    pub fn share(&self) -> AssembleSources {
        AssembleSources {
            mode: self.mode,
            device: self.device,
            kind: self.kind,
            dim: self.dim,
            row_bytes: self.row_bytes,
            gpu_cache: self.gpu_cache.as_ref().map(Tensor::shallow_clone),
            gpu_rows: self.gpu_rows.clone(),
            cpu_rows: self.cpu_rows.clone(),
            all_rows: self.all_rows.clone(),
        }
    }
}

/// Everything the stages read, built once per job.
pub struct Sources {
    pub load: LoadSources,
    pub assemble: AssembleSources,
}

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

/// A batch ready for the model step.
pub struct Ready {
    pub x: Tensor,
    pub blocks: Vec<BlockTensors>,
    pub labels: Tensor,
    pub disk_bytes: u64,
    pub disk_rows: u64,
    pub tiers: [u64; 3],
}

/// Busy seconds of each stage over a run of batches.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct StageTimes {
    pub load: f64,
    pub assemble: f64,
    pub graph: f64,
    pub model: f64,
    /// On CUDA: the device's time in each stage's work, from CUDA events.
    /// The host's times above are then what queueing the work took (and,
    /// for the model step, waiting on the device).
    pub device: Option<DeviceTimes>,
}

/// Seconds of device time per stage, from CUDA events recorded around each
/// batch's work on the stage's stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DeviceTimes {
    pub assemble: f64,
    pub graph: f64,
    pub model: f64,
}

impl std::ops::Add for DeviceTimes {
    type Output = DeviceTimes;
    fn add(self, o: DeviceTimes) -> DeviceTimes {
        DeviceTimes {
            assemble: self.assemble + o.assemble,
            graph: self.graph + o.graph,
            model: self.model + o.model,
        }
    }
}

/// A batch's work in one stage on the device: events before and after it.
type Span = Option<(Event, Event)>;

/// Runs `f`; on CUDA, records timing events around the work it queued on
/// the calling thread's current stream.
fn timed<T>(device: Device, f: impl FnOnce() -> Result<T>) -> Result<(T, Span)> {
    if !device.is_cuda() {
        return Ok((f()?, None));
    }
    let start = Event::record(device, true)?;
    let out = f()?;
    Ok((out, Some((start, Event::record(device, true)?))))
}

/// The device time of each stage's spans; waits for the last of them.
#[derive(Default)]
struct DeviceSpans {
    assemble: Vec<(Event, Event)>,
    graph: Vec<(Event, Event)>,
    model: Vec<(Event, Event)>,
}

impl DeviceSpans {
    /// Before the model step uses a batch: its stream waits (on the
    /// device) for the batch's assembly and graph work, which the pipeline
    /// queued on those stages' own streams, and the caching allocator
    /// learns that the batch's tensors are used on it too. The block
    /// tensors and labels are views of one upload, so one record covers
    /// them.
    fn receive(&mut self, r: &Ready, assembled: Span, graphed: Span) -> Result<()> {
        for (span, to) in [(assembled, &mut self.assemble), (graphed, &mut self.graph)] {
            if let Some(span) = span {
                span.1.wait_on_device()?;
                to.push(span);
            }
        }
        if r.x.device().is_cuda() {
            crate::cuda::record_stream(&r.x)?;
            crate::cuda::record_stream(&r.labels)?;
        }
        Ok(())
    }

    fn times(self) -> Result<Option<DeviceTimes>> {
        if self.model.is_empty() {
            return Ok(None);
        }
        let total = |spans: Vec<(Event, Event)>| -> Result<f64> {
            spans.iter().map(|(a, b)| a.seconds_to(b)).sum()
        };
        Ok(Some(DeviceTimes {
            assemble: total(self.assemble)?,
            graph: total(self.graph)?,
            model: total(self.model)?,
        }))
    }
}

/// Makes a stream from libtorch's pool current on this thread (CUDA): the
/// stage's copies and gathers then overlap the model step, which runs on
/// the default stream.
fn side_stream(device: Device) -> Result<Option<Stream>> {
    if !device.is_cuda() {
        return Ok(None);
    }
    let stream = Stream::from_pool(device)?;
    stream.make_current()?;
    Ok(Some(stream))
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
    mut buf: AlignedBuf,
) -> Result<Loaded> {
    let table = layout.record(r.segment, r.record)?;
    let rb = src.row_bytes;
    match src.mode {
        FeatureMode::Memory => Ok(Loaded {
            table,
            buf,
            disk: Vec::new(),
            disk_bytes: 0,
            disk_rows: 0,
        }),
        FeatureMode::Packed => {
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
        FeatureMode::Naive => {
            let (file, data_offset) = src.raw.as_ref().ok_or_else(|| {
                Error::InvalidArgument("naive mode without a feature file".into())
            })?;
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
                let tail = src.raw_tail.as_ref().ok_or_else(|| {
                    Error::InvalidArgument("naive mode without a feature file".into())
                })?;
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
    }
}

/// A dense `[n, d]` CPU tensor whose rows `fill` writes, every one of them
/// (the tensor's memory is not zeroed first), straight into the tensor:
/// a batch's input matrix is hundreds of MB, not worth a second copy.
fn host_matrix(
    src: &AssembleSources,
    n: usize,
    fill: impl FnOnce(&mut [u8]) -> Result<()>,
) -> Result<Tensor> {
    let x = Tensor::f_empty([n as i64, src.dim], (src.kind, Device::Cpu))?;
    let len = n * src.row_bytes;
    debug_assert_eq!(x.numel() * x.kind().elt_size_in_bytes(), len);
    if len == 0 {
        fill(&mut [])?;
        return Ok(x);
    }
    // SAFETY: `x` is a new contiguous CPU tensor of `len` bytes (n rows of
    // `row_bytes`, its dtype's row) that nothing else refers to; the slice
    // ends before `x` is returned.
    let bytes = unsafe { std::slice::from_raw_parts_mut(x.data_ptr().cast::<u8>(), len) };
    fill(bytes)?;
    Ok(x)
}

/// Copies the rows `slots` of `from` to input positions `pos` of `out`.
fn gather(out: &mut [u8], pos: &[u32], from: &[u8], slots: &[u32], rb: usize) {
    for (&p, &s) in pos.iter().zip(slots) {
        let (d, f) = (p as usize * rb, s as usize * rb);
        out[d..d + rb].copy_from_slice(&from[f..f + rb]);
    }
}

/// Stage 2: one `[inputs, d]` float tensor on the device from the GPU
/// cache, the CPU cache and the loaded rows (DiskGNN §4, feature assembling).
pub fn assemble(src: &AssembleSources, l: &Loaded) -> Result<(Tensor, [u64; 3])> {
    let t = &l.table;
    let tiers = [t.gpu_pos.len() as u64, t.cpu_pos.len() as u64, l.disk_rows];
    if src.device != Device::Cpu {
        return Ok((assemble_staged(src, l)?, tiers));
    }
    let n = t.num_inputs as usize;
    let rb = src.row_bytes;
    let x = host_matrix(src, n, |out| {
        match src.mode {
            FeatureMode::Memory => {
                let all = src.all_rows.as_ref().ok_or_else(|| missing("memory"))?;
                for (row, &v) in out.chunks_exact_mut(rb).zip(&t.input_nodes) {
                    row.copy_from_slice(&all[v as usize * rb..][..rb]);
                }
            }
            FeatureMode::Packed => {
                for (rows, pos, slots) in [
                    (&src.gpu_rows, &t.gpu_pos, &t.gpu_slot),
                    (&src.cpu_rows, &t.cpu_pos, &t.cpu_slot),
                ] {
                    if !pos.is_empty() {
                        let rows = rows.as_ref().ok_or_else(|| missing("cache"))?;
                        gather(out, pos, rows, slots, rb);
                    }
                }
            }
            FeatureMode::Naive => {}
        }
        let data = l.buf.as_slice();
        for &(p, off) in &l.disk {
            let d = p as usize * rb;
            out[d..d + rb].copy_from_slice(&data[off..off + rb]);
        }
        Ok(())
    })?;
    Ok((x.to_kind(Kind::Float), tiers))
}

fn missing(what: &str) -> Error {
    Error::InvalidArgument(format!("{what} mode without its rows"))
}

/// Host memory for one batch's upload: page-locked on CUDA, where a
/// non-blocking copy from it leaves the host free and libtorch's caching
/// host allocator reuses the block once that copy is done; plain memory on
/// the CPU, where the same code runs in tests.
fn staging(bytes: usize, device: Device) -> Result<Tensor> {
    // Never empty: a zero-byte tensor has no memory to point at.
    let bytes = bytes.max(8);
    match device {
        Device::Cuda(_) => crate::cuda::pinned(bytes),
        _ => Ok(Tensor::f_empty([bytes as i64], (Kind::Uint8, Device::Cpu))?),
    }
}

/// The bytes of a staging tensor, to write the batch into.
fn staged_bytes(t: &mut Tensor) -> &mut [u8] {
    let len = t.numel();
    debug_assert_eq!(t.kind(), Kind::Uint8);
    // SAFETY: a new contiguous uint8 host tensor of `len` bytes, owned by
    // the caller and borrowed mutably for the slice's life.
    unsafe { std::slice::from_raw_parts_mut(t.data_ptr().cast::<u8>(), len) }
}

/// Writes `v` widened to int64 into `out`, 8 bytes each.
fn put_indices(out: &mut [u8], v: impl IntoIterator<Item = i64>) {
    for (o, x) in out.chunks_exact_mut(8).zip(v) {
        o.copy_from_slice(&x.to_ne_bytes());
    }
}

/// The staging tensor on `device`: on CUDA a copy queued on the calling
/// thread's current stream, the host going on at once.
fn upload(staged: &Tensor, device: Device) -> Result<Tensor> {
    Ok(staged.f_to_device_(device, Kind::Uint8, true, false)?)
}

/// `[offset, offset + len)` of an uploaded staging tensor, as `len / 8`
/// int64 values.
fn indices_at(dev: &Tensor, offset: usize, len: usize) -> Result<Tensor> {
    Ok(dev
        .f_narrow(0, offset as i64, (len * 8) as i64)?
        .f_view_dtype(Kind::Int64)?)
}

/// Feature assembly for a device other than the CPU (DiskGNN §4). The rows
/// that are not in the GPU cache (CPU-cache rows, rows read from disk, all
/// rows in memory mode) and every index the device needs are written
/// straight into one page-locked staging buffer, which goes to the device
/// in one non-blocking copy; the GPU cache's rows are gathered on the
/// device. On the device an index scatter places both in input order.
/// Public so that tests run this path on the CPU.
pub fn assemble_staged(src: &AssembleSources, l: &Loaded) -> Result<Tensor> {
    let t = &l.table;
    let (n, rb, device) = (t.num_inputs as usize, src.row_bytes, src.device);
    // The host tier: its rows and slots (memory mode: every input node,
    // already in input order, so no positions to place them by).
    let (host_rows, host_slot): (Option<&[u8]>, &[u32]) = match src.mode {
        FeatureMode::Memory => {
            let all = src.all_rows.as_ref().ok_or_else(|| missing("memory"))?;
            (Some(all.as_slice()), &t.input_nodes)
        }
        FeatureMode::Packed if !t.cpu_pos.is_empty() => {
            let rows = src.cpu_rows.as_ref().ok_or_else(|| missing("cache"))?;
            (Some(rows.as_slice()), &t.cpu_slot)
        }
        FeatureMode::Packed | FeatureMode::Naive => (None, &[]),
    };
    // GPU-cache rows: gathered on the device from its tensor; on the CPU
    // (where the tier is host rows) with the host tier's.
    let gpu = match (src.mode, &src.gpu_cache) {
        (FeatureMode::Packed, Some(cache)) => Some(cache),
        _ => None,
    };
    let host_gpu = gpu.is_none() && src.mode == FeatureMode::Packed && !t.gpu_pos.is_empty();
    let gpu_rows = if host_gpu {
        Some(
            src.gpu_rows
                .as_ref()
                .ok_or_else(|| missing("cache"))?
                .as_slice(),
        )
    } else {
        None
    };
    let g = if gpu.is_some() { t.gpu_pos.len() } else { 0 };
    let hosted = [
        (host_rows, &t.cpu_pos[..], host_slot),
        (gpu_rows, &t.gpu_pos[..], &t.gpu_slot[..]),
    ];
    let k: usize = hosted
        .iter()
        .filter(|h| h.0.is_some())
        .map(|h| h.2.len())
        .sum::<usize>()
        + l.disk.len();
    // Positions to scatter the rows by: none in memory mode.
    let placed = if src.mode == FeatureMode::Memory {
        0
    } else {
        k
    };
    // [k rows][`placed` host positions, g GPU slots, g GPU positions as int64]
    let rows_len = k * rb;
    let idx_at = rows_len.next_multiple_of(8);
    let mut staged = staging(idx_at + (placed + 2 * g) * 8, device)?;
    {
        let bytes = staged_bytes(&mut staged);
        let (rows, idx) = bytes.split_at_mut(idx_at);
        let (host_idx, gpu_idx) = idx.split_at_mut(placed * 8);
        let mut positions = host_idx.chunks_exact_mut(8);
        let mut place = |p: u32| {
            if let Some(o) = positions.next() {
                o.copy_from_slice(&(p as i64).to_ne_bytes());
            }
        };
        let mut at = 0usize;
        for (from, pos, slots) in hosted {
            let Some(from) = from else { continue };
            for (i, &s) in slots.iter().enumerate() {
                let f = s as usize * rb;
                rows[at..at + rb].copy_from_slice(&from[f..f + rb]);
                at += rb;
                if placed > 0 {
                    place(pos[i]);
                }
            }
        }
        let data = l.buf.as_slice();
        for &(p, off) in &l.disk {
            rows[at..at + rb].copy_from_slice(&data[off..off + rb]);
            at += rb;
            place(p);
        }
        if g > 0 {
            let (slots, pos) = gpu_idx.split_at_mut(g * 8);
            put_indices(slots, t.gpu_slot.iter().map(|&v| v as i64));
            put_indices(pos, t.gpu_pos.iter().map(|&v| v as i64));
        }
    }
    let dev = upload(&staged, device)?;
    let rows = dev
        .f_narrow(0, 0, rows_len as i64)?
        .f_view_dtype(src.kind)?
        .f_view([k as i64, src.dim])?;
    let x = if src.mode == FeatureMode::Memory {
        // Every row, already in input order.
        rows
    } else {
        // Every row is written below: no need to zero the matrix first.
        let mut out = Tensor::f_empty([n as i64, src.dim], (src.kind, device))?;
        if let Some(cache) = gpu {
            let slots = indices_at(&dev, idx_at + placed * 8, g)?;
            let pos = indices_at(&dev, idx_at + (placed + g) * 8, g)?;
            let _ = out.f_index_copy_(0, &pos, &cache.f_index_select(0, &slots)?)?;
        }
        if k > 0 {
            let _ = out.f_index_copy_(0, &indices_at(&dev, idx_at, k)?, &rows)?;
        }
        out
    };
    Ok(x.f_to_kind(Kind::Float)?)
}

/// In-degree of each of `num_dst` destinations and where each one's edges
/// start (`num_dst + 1` entries), for edges sorted by destination (as a
/// decoded table's are). Counted here on the host: on CUDA, `bincount`
/// must learn its output's size from the device, a sync per block.
fn degrees(dst: &[u32], num_dst: usize) -> (Vec<i64>, Vec<i64>) {
    debug_assert!(dst.is_sorted(), "block edges sorted by destination");
    let mut counts = vec![0i64; num_dst];
    for &d in dst {
        counts[d as usize] += 1;
    }
    let mut offsets = Vec::with_capacity(num_dst + 1);
    offsets.push(0);
    let mut at = 0;
    for &c in &counts {
        at += c;
        offsets.push(at);
    }
    (counts, offsets)
}

/// Stage 3: the batch's blocks and labels as tensors on the device. Every
/// index (each block's edges, degrees and offsets, then the labels) is
/// written as int64 into one staging buffer that goes to the device in one
/// copy (non-blocking on CUDA, from page-locked memory); the tensors are
/// views of it.
pub fn graph(t: &BatchTable, device: Device) -> Result<(Vec<BlockTensors>, Tensor)> {
    let degrees: Vec<(Vec<i64>, Vec<i64>)> = t
        .blocks
        .iter()
        .map(|b| degrees(&b.dst, b.num_dst as usize))
        .collect();
    let parts = t
        .blocks
        .iter()
        .zip(&degrees)
        .map(|(b, (c, o))| 2 * b.src.len() + c.len() + o.len())
        .sum::<usize>()
        + t.labels.len();
    let mut staged = staging(parts * 8, device)?;
    {
        let mut out = staged_bytes(&mut staged);
        let mut put = |v: &mut dyn Iterator<Item = i64>, len: usize| {
            let (head, rest) = std::mem::take(&mut out).split_at_mut(len * 8);
            put_indices(head, v);
            out = rest;
        };
        for (b, (counts, offsets)) in t.blocks.iter().zip(&degrees) {
            put(&mut b.src.iter().map(|&x| x as i64), b.src.len());
            put(&mut b.dst.iter().map(|&x| x as i64), b.dst.len());
            put(&mut counts.iter().copied(), counts.len());
            put(&mut offsets.iter().copied(), offsets.len());
        }
        put(&mut t.labels.iter().map(|&x| x as i64), t.labels.len());
    }
    let dev = upload(&staged, device)?;
    let mut at = 0usize;
    let mut next = |len: usize| -> Result<Tensor> {
        let v = indices_at(&dev, at * 8, len)?;
        at += len;
        Ok(v)
    };
    let mut blocks = Vec::with_capacity(t.blocks.len());
    for (b, (counts, offsets)) in t.blocks.iter().zip(&degrees) {
        blocks.push(BlockTensors {
            src: next(b.src.len())?,
            dst: next(b.dst.len())?,
            num_src: b.num_src as i64,
            num_dst: b.num_dst as i64,
            counts: next(counts.len())?,
            offsets: next(offsets.len())?,
        });
    }
    let labels = next(t.labels.len())?;
    Ok((blocks, labels))
}

/// How batches flow through the stages.
#[derive(Clone, Copy, Debug)]
pub struct PipelineOptions {
    /// Stages on their own threads (else in sequence on the caller's).
    pub pipelined: bool,
    /// Batches a queue between two stages holds.
    pub queue_depth: usize,
    /// Loader threads: each reads every `loaders`-th batch, so this many
    /// batches' reads are in flight while tables decode and rows unpack.
    pub loaders: usize,
}

/// Runs `step` on every batch of `order`, with the stages pipelined over
/// threads or in sequence on this thread.
pub fn run_batches(
    layout: &Layout,
    engine: &IoEngine,
    src: &Sources,
    order: &[BatchRef],
    opts: PipelineOptions,
    mut step: impl FnMut(Ready) -> Result<()>,
) -> Result<StageTimes> {
    let mut times = StageTimes::default();
    let mut spans = DeviceSpans::default();
    let secs = |d: Duration| d.as_secs_f64();
    let device = src.assemble.device;
    if !opts.pipelined {
        // One thread, the default stream: each stage's work is queued after
        // the last one's.
        let mut spare = AlignedBuf::new(0);
        for &r in order {
            let t = Instant::now();
            let loaded = load(layout, engine, &src.load, r, spare)?;
            times.load += secs(t.elapsed());
            let t = Instant::now();
            let ((x, tiers), assembled) = timed(device, || assemble(&src.assemble, &loaded))?;
            times.assemble += secs(t.elapsed());
            let t = Instant::now();
            let ((blocks, labels), graphed) = timed(device, || graph(&loaded.table, device))?;
            times.graph += secs(t.elapsed());
            let ready = Ready {
                x,
                blocks,
                labels,
                disk_bytes: loaded.disk_bytes,
                disk_rows: loaded.disk_rows,
                tiers,
            };
            spans.receive(&ready, assembled, graphed)?;
            let t = Instant::now();
            let ((), stepped) = timed(device, || step(ready))?;
            times.model += secs(t.elapsed());
            spans.model.extend(stepped);
            spare = loaded.buf;
        }
        times.device = spans.times()?;
        return Ok(times);
    }
    let depth = opts.queue_depth.max(1);
    let loaders = opts.loaders.clamp(1, order.len().max(1));
    let (load_src, asm_src) = (&src.load, src.assemble.share());
    std::thread::scope(|s| -> Result<StageTimes> {
        // Loader j takes batches j, j + L, j + 2L, ...; the assembler and
        // the graph loader read the loaders' queues in turn, so batches
        // keep their order. Buffers go back to their loader once assembled.
        let mut to_assemble: Vec<Receiver<Loaded>> = Vec::new();
        let mut to_graph: Vec<Receiver<BatchTable>> = Vec::new();
        let mut recycle: Vec<SyncSender<AlignedBuf>> = Vec::new();
        let mut handles = Vec::new();
        for j in 0..loaders {
            let (loaded_tx, loaded_rx) = sync_channel::<Loaded>(depth);
            let (graph_tx, graph_rx) = sync_channel::<BatchTable>(depth);
            let (spare_tx, spare_rx) = sync_channel::<AlignedBuf>(depth + 2);
            to_assemble.push(loaded_rx);
            to_graph.push(graph_rx);
            recycle.push(spare_tx);
            handles.push(s.spawn(move || -> Result<f64> {
                let mut busy = 0.0;
                for &r in order.iter().skip(j).step_by(loaders) {
                    let buf = spare_rx.try_recv().unwrap_or_else(|_| AlignedBuf::new(0));
                    let t = Instant::now();
                    let mut loaded = load(layout, engine, load_src, r, buf)?;
                    busy += secs(t.elapsed());
                    let topology = BatchTable {
                        labels: std::mem::take(&mut loaded.table.labels),
                        blocks: std::mem::take(&mut loaded.table.blocks),
                        ..Default::default()
                    };
                    if graph_tx.send(topology).is_err() || loaded_tx.send(loaded).is_err() {
                        break;
                    }
                }
                Ok(busy)
            }));
        }
        type Assembled = (Tensor, [u64; 3], u64, u64, Span);
        let (to_model_x, model_x) = sync_channel::<Assembled>(depth);
        let (to_model_g, model_g) = sync_channel::<(Vec<BlockTensors>, Tensor, Span)>(depth);
        let n = order.len();
        let assembler = s.spawn(move || -> Result<f64> {
            let _stream = side_stream(device)?;
            let mut busy = 0.0;
            for k in 0..n {
                let Ok(loaded) = to_assemble[k % loaders].recv() else {
                    break; // a loader stopped; its error is collected below
                };
                let t = Instant::now();
                let ((x, tiers), span) = timed(device, || assemble(&asm_src, &loaded))?;
                busy += secs(t.elapsed());
                let _ = recycle[k % loaders].try_send(loaded.buf);
                if to_model_x
                    .send((x, tiers, loaded.disk_bytes, loaded.disk_rows, span))
                    .is_err()
                {
                    break;
                }
            }
            Ok(busy)
        });
        let grapher = s.spawn(move || -> Result<f64> {
            let _stream = side_stream(device)?;
            let mut busy = 0.0;
            for k in 0..n {
                let Ok(t) = to_graph[k % loaders].recv() else {
                    break;
                };
                let start = Instant::now();
                let ((blocks, labels), span) = timed(device, || graph(&t, device))?;
                busy += secs(start.elapsed());
                if to_model_g.send((blocks, labels, span)).is_err() {
                    break;
                }
            }
            Ok(busy)
        });
        let mut model_busy = 0.0;
        let mut result = Ok(());
        for _ in 0..n {
            let (Ok((x, tiers, disk_bytes, disk_rows, assembled)), Ok((blocks, labels, graphed))) =
                (model_x.recv(), model_g.recv())
            else {
                break; // a stage stopped; its error is collected below
            };
            let ready = Ready {
                x,
                blocks,
                labels,
                disk_bytes,
                disk_rows,
                tiers,
            };
            let t = Instant::now();
            result = spans
                .receive(&ready, assembled, graphed)
                .and_then(|()| timed(device, || step(ready)))
                .map(|((), stepped)| spans.model.extend(stepped));
            model_busy += secs(t.elapsed());
            if result.is_err() {
                break;
            }
        }
        drop(model_x);
        drop(model_g);
        let assemble = assembler.join().expect("the assembler does not panic");
        let graph = grapher.join().expect("the graph loader does not panic");
        let mut load = 0.0;
        let mut loader_error = Ok(());
        for h in handles {
            match h.join().expect("a loader does not panic") {
                Ok(busy) => load += busy,
                Err(e) => loader_error = loader_error.and(Err(e)),
            }
        }
        loader_error?;
        let assemble = assemble?;
        let graph = graph?;
        result?;
        Ok(StageTimes {
            load,
            assemble,
            graph,
            model: model_busy,
            device: spans.times()?,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::degrees;
    use tch::{Kind, Tensor};

    #[test]
    fn host_degrees_equal_torch_bincount_and_cumsum() {
        let dst: Vec<u32> = vec![0, 0, 2, 2, 2, 3, 6, 6];
        let (counts, offsets) = degrees(&dst, 8);
        let t: Vec<i64> = dst.iter().map(|&d| d as i64).collect();
        let want = Tensor::from_slice(&t).bincount(None::<Tensor>, 8);
        assert_eq!(counts, Vec::<i64>::try_from(&want).unwrap());
        let cum = Vec::<i64>::try_from(&want.cumsum(0, Kind::Int64)).unwrap();
        assert_eq!(offsets[0], 0);
        assert_eq!(&offsets[1..], cum.as_slice());
        assert_eq!(offsets.len(), 9);
        // No edges: every destination has degree 0.
        assert_eq!(degrees(&[], 3), (vec![0; 3], vec![0; 4]));
    }
}
