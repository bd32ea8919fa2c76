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

use std::sync::mpsc::sync_channel;
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

/// What feature assembly needs: the cache tensors, owned by the assembling
/// thread (tensors may move between threads but not be shared).
pub struct AssembleSources {
    pub mode: FeatureMode,
    pub device: Device,
    /// Element kind of the stored features (Float or Half).
    pub kind: Kind,
    pub dim: i64,
    pub gpu_cache: Option<Tensor>,
    pub cpu_cache: Option<Tensor>,
    pub memory: Option<Tensor>,
}

impl AssembleSources {
    /// Another handle on the same tensors (no copy).
    pub fn share(&self) -> AssembleSources {
        let clone = |t: &Option<Tensor>| t.as_ref().map(Tensor::shallow_clone);
        AssembleSources {
            mode: self.mode,
            device: self.device,
            kind: self.kind,
            dim: self.dim,
            gpu_cache: clone(&self.gpu_cache),
            cpu_cache: clone(&self.cpu_cache),
            memory: clone(&self.memory),
        }
    }
}

/// Everything the stages read, built once per job.
pub struct Sources {
    pub load: LoadSources,
    pub assemble: AssembleSources,
}

/// Output of feature loading.
pub struct Loaded {
    pub table: BatchTable,
    /// Rows read from disk, packed densely, and the input row each fills.
    pub rows: Vec<u8>,
    pub positions: Vec<i64>,
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
/// segment's disk cache and its packed chunk, submitted together.
pub fn load(
    layout: &Layout,
    engine: &IoEngine,
    src: &LoadSources,
    r: BatchRef,
    buf: &mut AlignedBuf,
) -> Result<Loaded> {
    let table = layout.record(r.segment, r.record)?;
    let rb = src.row_bytes;
    match src.mode {
        FeatureMode::Memory => Ok(Loaded {
            table,
            rows: Vec::new(),
            positions: Vec::new(),
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
            let disk_bytes = engine.read(&layout.segments[r.segment as usize], &reqs, buf)?;
            let data = buf.as_slice();
            let n = table.disk_pos.len() + table.packed_pos.len();
            let mut rows = Vec::with_capacity(n * rb);
            let mut positions = Vec::with_capacity(n);
            for (&p, &off) in table.disk_pos.iter().zip(&table.disk_offset) {
                rows.extend_from_slice(&data[off as usize..off as usize + rb]);
                positions.push(p as i64);
            }
            for (&p, &row) in table.packed_pos.iter().zip(&table.packed_row) {
                let off = chunk_base + row as usize * rb;
                rows.extend_from_slice(&data[off..off + rb]);
                positions.push(p as i64);
            }
            Ok(Loaded {
                table,
                rows,
                positions,
                disk_bytes,
                disk_rows: n as u64,
            })
        }
        FeatureMode::Naive => {
            let (file, data_offset) = src.raw.as_ref().ok_or_else(|| {
                Error::InvalidArgument("naive mode without a feature file".into())
            })?;
            let file_len = file.len();
            // One aligned read per needed row: the pages that hold it.
            let mut reqs = Vec::with_capacity(table.input_nodes.len());
            let mut starts = Vec::with_capacity(table.input_nodes.len());
            let mut tail_rows = Vec::new();
            let mut at = 0usize;
            for (i, &v) in table.input_nodes.iter().enumerate() {
                let start = data_offset + v as u64 * rb as u64;
                let first = start / 4096 * 4096;
                let end = (start + rb as u64).div_ceil(4096) * 4096;
                if end > file_len {
                    tail_rows.push((i, start));
                    starts.push(usize::MAX);
                    continue;
                }
                reqs.push(ReadReq {
                    offset: first,
                    len: (end - first) as usize,
                    buf_offset: at,
                });
                starts.push(at + (start - first) as usize);
                at += (end - first) as usize;
            }
            buf.resize(at);
            let mut disk_bytes = engine.read(file, &reqs, buf)?;
            let data = buf.as_slice();
            let mut rows = vec![0u8; starts.len() * rb];
            for (i, &s) in starts.iter().enumerate() {
                if s != usize::MAX {
                    rows[i * rb..(i + 1) * rb].copy_from_slice(&data[s..s + rb]);
                }
            }
            if !tail_rows.is_empty() {
                let tail = src.raw_tail.as_ref().ok_or_else(|| {
                    Error::InvalidArgument("naive mode without a feature file".into())
                })?;
                for (i, start) in tail_rows {
                    std::os::unix::fs::FileExt::read_exact_at(
                        tail,
                        &mut rows[i * rb..(i + 1) * rb],
                        start,
                    )
                    .map_err(|e| Error::io(file.path().display(), e))?;
                    disk_bytes += 4096;
                }
            }
            let n = starts.len();
            Ok(Loaded {
                table,
                rows,
                positions: (0..n as i64).collect(),
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

/// Stage 2: one `[inputs, d]` float tensor on the device from the GPU
/// cache, the CPU cache and the loaded rows (DiskGNN §4, feature assembling).
pub fn assemble(src: &AssembleSources, l: &Loaded) -> Result<(Tensor, [u64; 3])> {
    let t = &l.table;
    let n = t.num_inputs as i64;
    let x = match src.mode {
        FeatureMode::Memory => {
            let feats = src
                .memory
                .as_ref()
                .ok_or_else(|| Error::InvalidArgument("memory mode without features".into()))?;
            feats
                .index_select(0, &index(&t.input_nodes, Device::Cpu))
                .to_device(src.device)
        }
        FeatureMode::Naive => {
            Tensor::f_from_data_size(&l.rows, &[n, src.dim], src.kind)?.to_device(src.device)
        }
        FeatureMode::Packed => {
            let mut out = Tensor::zeros([n, src.dim], (src.kind, src.device));
            if let Some(gpu) = &src.gpu_cache
                && !t.gpu_pos.is_empty()
            {
                let rows = gpu.index_select(0, &index(&t.gpu_slot, src.device));
                let _ = out.index_copy_(0, &index(&t.gpu_pos, src.device), &rows);
            }
            if let Some(cpu) = &src.cpu_cache
                && !t.cpu_pos.is_empty()
            {
                let rows = cpu
                    .index_select(0, &index(&t.cpu_slot, Device::Cpu))
                    .to_device(src.device);
                let _ = out.index_copy_(0, &index(&t.cpu_pos, src.device), &rows);
            }
            if !l.positions.is_empty() {
                let k = l.positions.len() as i64;
                let rows = Tensor::f_from_data_size(&l.rows, &[k, src.dim], src.kind)?
                    .to_device(src.device);
                let _ = out.index_copy_(
                    0,
                    &Tensor::from_slice(&l.positions).to_device(src.device),
                    &rows,
                );
            }
            out
        }
    };
    let tiers = [t.gpu_pos.len() as u64, t.cpu_pos.len() as u64, l.disk_rows];
    Ok((x.to_kind(Kind::Float), tiers))
}

/// Stage 3: the batch's blocks and labels as tensors on the device.
pub fn graph(t: &BatchTable, device: Device) -> (Vec<BlockTensors>, Tensor) {
    let blocks = t
        .blocks
        .iter()
        .map(|b| {
            let dst = index(&b.dst, device);
            let counts = dst.bincount(None::<Tensor>, b.num_dst as i64);
            let deg = counts.clamp_min(1).to_kind(Kind::Float);
            BlockTensors {
                src: index(&b.src, device),
                dst,
                num_src: b.num_src as i64,
                num_dst: b.num_dst as i64,
                counts,
                deg,
            }
        })
        .collect();
    (blocks, index(&t.labels, device))
}

/// Runs `step` on every batch of `order`, with the stages pipelined over
/// threads (queue depth `depth`) or in sequence on this thread.
pub fn run_batches(
    layout: &Layout,
    engine: &IoEngine,
    src: &Sources,
    order: &[BatchRef],
    pipelined: bool,
    depth: usize,
    mut step: impl FnMut(Ready) -> Result<()>,
) -> Result<StageTimes> {
    let mut times = StageTimes::default();
    let secs = |d: Duration| d.as_secs_f64();
    if !pipelined {
        let mut buf = AlignedBuf::new(0);
        for &r in order {
            let t = Instant::now();
            let loaded = load(layout, engine, &src.load, r, &mut buf)?;
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
        }
        return Ok(times);
    }
    let depth = depth.max(1);
    let (load_src, asm_src, device) = (&src.load, src.assemble.share(), src.assemble.device);
    std::thread::scope(|s| -> Result<StageTimes> {
        let (to_assemble, from_load) = sync_channel::<Loaded>(depth);
        let (to_graph, graph_in) = sync_channel::<BatchTable>(depth);
        let (to_model_x, model_x) = sync_channel::<(Tensor, [u64; 3], u64, u64)>(depth);
        let (to_model_g, model_g) = sync_channel::<(Vec<BlockTensors>, Tensor)>(depth);
        let loader = s.spawn(move || -> Result<f64> {
            let mut busy = 0.0;
            let mut buf = AlignedBuf::new(0);
            for &r in order {
                let t = Instant::now();
                let mut loaded = load(layout, engine, load_src, r, &mut buf)?;
                busy += secs(t.elapsed());
                let topology = BatchTable {
                    labels: std::mem::take(&mut loaded.table.labels),
                    blocks: std::mem::take(&mut loaded.table.blocks),
                    ..Default::default()
                };
                if to_graph.send(topology).is_err() || to_assemble.send(loaded).is_err() {
                    break;
                }
            }
            Ok(busy)
        });
        let assembler = s.spawn(move || -> Result<f64> {
            let mut busy = 0.0;
            for loaded in from_load {
                let t = Instant::now();
                let (x, tiers) = assemble(&asm_src, &loaded)?;
                busy += secs(t.elapsed());
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
            for t in graph_in {
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
        for _ in order {
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
        let load = loader.join().expect("the loader does not panic")?;
        let assemble = assembler.join().expect("the assembler does not panic")?;
        let graph = grapher.join().expect("the graph loader does not panic");
        result?;
        Ok(StageTimes {
            load,
            assemble,
            graph,
            model: model_busy,
        })
    })
}
