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

/// What feature assembly needs. On CUDA: the GPU cache on the device and
/// the CPU cache as a pinned host tensor, gathered by torch. On the CPU:
/// the caches as plain host rows, gathered by this crate's own copies (no
/// torch threads racing the model step's for the same cores).
pub struct AssembleSources {
    pub mode: FeatureMode,
    pub device: Device,
    /// Element kind of the stored features (Float or Half).
    pub kind: Kind,
    pub dim: i64,
    pub row_bytes: usize,
    pub gpu_cache: Option<Tensor>,
    pub cpu_cache: Option<Tensor>,
    pub memory: Option<Tensor>,
    /// Host rows of the GPU cache, the CPU cache and (memory mode) every
    /// node, on the CPU device.
    pub gpu_rows: Option<Arc<Vec<u8>>>,
    pub cpu_rows: Option<Arc<Vec<u8>>>,
    pub all_rows: Option<Arc<Vec<u8>>>,
}

impl AssembleSources {
    /// Another handle on the same tensors and rows (no copy).
    pub fn share(&self) -> AssembleSources {
        let clone = |t: &Option<Tensor>| t.as_ref().map(Tensor::shallow_clone);
        AssembleSources {
            mode: self.mode,
            device: self.device,
            kind: self.kind,
            dim: self.dim,
            row_bytes: self.row_bytes,
            gpu_cache: clone(&self.gpu_cache),
            cpu_cache: clone(&self.cpu_cache),
            memory: clone(&self.memory),
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

fn index(v: &[u32], device: Device) -> Tensor {
    let v: Vec<i64> = v.iter().map(|&x| x as i64).collect();
    Tensor::from_slice(&v).to_device(device)
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
    let n = t.num_inputs as usize;
    let rb = src.row_bytes;
    let missing = |what: &str| Error::InvalidArgument(format!("{what} mode without its rows"));
    let loaded = |out: &mut [u8]| {
        let data = l.buf.as_slice();
        for &(p, off) in &l.disk {
            let d = p as usize * rb;
            out[d..d + rb].copy_from_slice(&data[off..off + rb]);
        }
    };
    let x = match (src.mode, src.device) {
        (FeatureMode::Naive, _) => host_matrix(src, n, |out| {
            loaded(out);
            Ok(())
        })?
        .to_device(src.device),
        (FeatureMode::Memory, Device::Cpu) => {
            let all = src.all_rows.as_ref().ok_or_else(|| missing("memory"))?;
            host_matrix(src, n, |out| {
                let positions: Vec<u32> = (0..n as u32).collect();
                gather(out, &positions, all, &t.input_nodes, rb);
                Ok(())
            })?
        }
        (FeatureMode::Memory, device) => {
            let feats = src.memory.as_ref().ok_or_else(|| missing("memory"))?;
            feats
                .index_select(0, &index(&t.input_nodes, Device::Cpu))
                .to_device(device)
        }
        (FeatureMode::Packed, Device::Cpu) => host_matrix(src, n, |out| {
            for (rows, pos, slots) in [
                (&src.gpu_rows, &t.gpu_pos, &t.gpu_slot),
                (&src.cpu_rows, &t.cpu_pos, &t.cpu_slot),
            ] {
                if !pos.is_empty() {
                    let rows = rows.as_ref().ok_or_else(|| missing("cache"))?;
                    gather(out, pos, rows, slots, rb);
                }
            }
            loaded(out);
            Ok(())
        })?,
        (FeatureMode::Packed, device) => {
            // Every row is written below: no need to zero the matrix first.
            let mut out = Tensor::empty([n as i64, src.dim], (src.kind, device));
            if !t.gpu_pos.is_empty() {
                let gpu = src.gpu_cache.as_ref().ok_or_else(|| missing("cache"))?;
                let rows = gpu.index_select(0, &index(&t.gpu_slot, device));
                let _ = out.index_copy_(0, &index(&t.gpu_pos, device), &rows);
            }
            if !t.cpu_pos.is_empty() {
                let cpu = src.cpu_cache.as_ref().ok_or_else(|| missing("cache"))?;
                let rows = cpu
                    .index_select(0, &index(&t.cpu_slot, Device::Cpu))
                    .to_device(device);
                let _ = out.index_copy_(0, &index(&t.cpu_pos, device), &rows);
            }
            if !l.disk.is_empty() {
                let data = l.buf.as_slice();
                let mut rows = Vec::with_capacity(l.disk.len() * rb);
                let mut positions = Vec::with_capacity(l.disk.len());
                for &(p, off) in &l.disk {
                    rows.extend_from_slice(&data[off..off + rb]);
                    positions.push(p as i64);
                }
                let k = l.disk.len() as i64;
                let rows =
                    Tensor::f_from_data_size(&rows, &[k, src.dim], src.kind)?.to_device(device);
                let _ =
                    out.index_copy_(0, &Tensor::from_slice(&positions).to_device(device), &rows);
            }
            out
        }
    };
    let tiers = [t.gpu_pos.len() as u64, t.cpu_pos.len() as u64, l.disk_rows];
    Ok((x.to_kind(Kind::Float), tiers))
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

/// Stage 3: the batch's blocks and labels as tensors on the device.
pub fn graph(t: &BatchTable, device: Device) -> (Vec<BlockTensors>, Tensor) {
    let blocks = t
        .blocks
        .iter()
        .map(|b| {
            let (counts, offsets) = degrees(&b.dst, b.num_dst as usize);
            BlockTensors {
                src: index(&b.src, device),
                dst: index(&b.dst, device),
                num_src: b.num_src as i64,
                num_dst: b.num_dst as i64,
                counts: Tensor::from_slice(&counts).to_device(device),
                offsets: Tensor::from_slice(&offsets).to_device(device),
            }
        })
        .collect();
    (blocks, index(&t.labels, device))
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
    let secs = |d: Duration| d.as_secs_f64();
    if !opts.pipelined {
        let mut spare = AlignedBuf::new(0);
        for &r in order {
            let t = Instant::now();
            let loaded = load(layout, engine, &src.load, r, spare)?;
            times.load += secs(t.elapsed());
            let t = Instant::now();
            let (x, tiers) = assemble(&src.assemble, &loaded)?;
            times.assemble += secs(t.elapsed());
            let t = Instant::now();
            let (blocks, labels) = graph(&loaded.table, src.assemble.device);
            times.graph += secs(t.elapsed());
            let t = Instant::now();
            step(Ready {
                x,
                blocks,
                labels,
                disk_bytes: loaded.disk_bytes,
                disk_rows: loaded.disk_rows,
                tiers,
            })?;
            times.model += secs(t.elapsed());
            spare = loaded.buf;
        }
        return Ok(times);
    }
    let depth = opts.queue_depth.max(1);
    let loaders = opts.loaders.clamp(1, order.len().max(1));
    let (load_src, asm_src, device) = (&src.load, src.assemble.share(), src.assemble.device);
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
        let (to_model_x, model_x) = sync_channel::<(Tensor, [u64; 3], u64, u64)>(depth);
        let (to_model_g, model_g) = sync_channel::<(Vec<BlockTensors>, Tensor)>(depth);
        let n = order.len();
        let assembler = s.spawn(move || -> Result<f64> {
            let mut busy = 0.0;
            for k in 0..n {
                let Ok(loaded) = to_assemble[k % loaders].recv() else {
                    break; // a loader stopped; its error is collected below
                };
                let t = Instant::now();
                let (x, tiers) = assemble(&asm_src, &loaded)?;
                busy += secs(t.elapsed());
                let _ = recycle[k % loaders].try_send(loaded.buf);
                if to_model_x
                    .send((x, tiers, loaded.disk_bytes, loaded.disk_rows))
                    .is_err()
                {
                    break;
                }
            }
            Ok(busy)
        });
        let grapher = s.spawn(move || -> f64 {
            let mut busy = 0.0;
            for k in 0..n {
                let Ok(t) = to_graph[k % loaders].recv() else {
                    break;
                };
                let start = Instant::now();
                let out = graph(&t, device);
                busy += secs(start.elapsed());
                if to_model_g.send(out).is_err() {
                    break;
                }
            }
            busy
        });
        let mut model_busy = 0.0;
        let mut result = Ok(());
        for _ in 0..n {
            let (Ok((x, tiers, disk_bytes, disk_rows)), Ok((blocks, labels))) =
                (model_x.recv(), model_g.recv())
            else {
                break; // a stage stopped; its error is collected below
            };
            let t = Instant::now();
            result = step(Ready {
                x,
                blocks,
                labels,
                disk_bytes,
                disk_rows,
                tiers,
            });
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
        result?;
        Ok(StageTimes {
            load,
            assemble,
            graph,
            model: model_busy,
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
