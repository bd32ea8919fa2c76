//! The host memory a training run will use, stated from its flags and the
//! manifest before any batch is read (`--memory` refuses a run whose
//! statement exceeds it). Each part is an upper bound; batch sizes come
//! from the largest batch the packer recorded in the manifest (each figure
//! the maximum over all batches), or, in a layout without it, from the
//! sampling fan-outs' worst case ([`block_bounds`]), so the statement holds
//! for every batch of the layout. The end-to-end suite checks a run's peak
//! RSS against it.

use offgnn_manifests::Manifest;
use offgnn_shared::samples::block_bounds;
use serde::Serialize;
use tch::Device;

use crate::model::{ModelConfig, ModelKind};
use crate::pipeline::{FeatureMode, PipelineOptions};
use crate::train::TrainConfig;

/// libtorch's CPU runtime once loaded and warmed (its code, OpenMP and
/// allocator pools, the intra-op threads), and what the allocator keeps of
/// a run's freed batches. Its code pages count as mapped or not depending
/// on what the page cache holds, and glibc's per-thread arenas fragment
/// over epochs, so the figure is stated with room over the peaks measured
/// of `trainer info` and of training Cora, in CI too.
pub(crate) const TORCH_RUNTIME_BYTES: u64 = 640 << 20;
/// The rest of the process: staging, io_uring rings, address tables being
/// decoded, progress and summaries.
pub(crate) const PROCESS_BYTES: u64 = 64 << 20;
/// What a trainer process holds before any data: the runtime and the rest.
pub const RUNTIME_BYTES: u64 = TORCH_RUNTIME_BYTES + PROCESS_BYTES;
/// A CUDA device's own share before any tensor: the CUDA context and
/// libtorch's kernels loaded on it (hundreds of MiB with the cu13 wheel);
/// stated with room until a GPU session measures it.
pub(crate) const CUDA_CONTEXT_BYTES: u64 = 1 << 30;
/// Disk pages are read whole.
const PAGE: u64 = 4096;
/// A layer's tensors, and the gradients of the same sizes in the backward
/// pass.
pub(crate) const ACTIVATION_FACTOR: u64 = 2;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemoryEstimate {
    /// Feature rows held for the whole run: the two cache tiers' host rows
    /// (on CUDA the GPU tier's only until it is uploaded at start), or
    /// every row (`--features memory`).
    pub cache_bytes: u64,
    /// Read buffers and assembled inputs (on CUDA their page-locked
    /// staging buffers) of the batches in the pipeline's queues.
    pub batches_in_flight_bytes: u64,
    /// Parameters, gradients and Adam's two moments.
    pub model_bytes: u64,
    /// `--historical`: the cache's rows and index, and the cached rows and
    /// updates of the batches between lookup and update.
    pub historical_bytes: u64,
    /// Activations kept for the backward pass (host memory on the CPU
    /// device only; on CUDA they live on the GPU).
    pub activation_bytes: u64,
    pub runtime_bytes: u64,
    pub total_bytes: u64,
    /// On a CUDA device: what the run keeps on it (the GPU cache tier, the
    /// model with its gradients and Adam's moments, the assembled inputs
    /// in flight, the activations, the CUDA context). 0 on the CPU.
    pub gpu_bytes: u64,
}

/// Per block, input layer first, `(sources, destinations, edges)` of the
/// largest batch: as the packer recorded it, or (in a layout packed before
/// it did) the sampling fan-outs' worst case.
fn batch_bounds(m: &Manifest) -> Vec<(u64, u64, u64)> {
    match &m.largest_batch {
        Some(shape) => shape.blocks.iter().map(|&[s, d, e]| (s, d, e)).collect(),
        None => block_bounds(
            m.dataset.num_nodes,
            m.samples.batch_size as u64,
            &m.samples.fanouts,
        ),
    }
}

/// States the peak host memory of training `m` as `cfg` says.
pub fn estimate(m: &Manifest, cfg: &TrainConfig) -> MemoryEstimate {
    let on_cpu = cfg.device == Device::Cpu;
    let cache_bytes = cache_bytes(m, cfg.features);
    let blocks = batch_bounds(m);
    let recorded_inputs = m.largest_batch.as_ref().map_or(0, |s| s.inputs);
    let inputs = blocks.first().map_or(0, |b| b.0).max(recorded_inputs);
    let batch = BatchBytes::of(m, inputs, cfg.features, on_cpu);
    let batches_in_flight_bytes = in_flight_bytes(&batch, cfg.pipeline_options());
    let depth = cfg.queue_depth.max(1) as u64;

    let widths = layer_widths(&cfg.model);
    // Every layer has at most two weight matrices (self and neighbor, or
    // projection and residual) and a few vectors per output.
    let params: u64 = widths.windows(2).map(|w| 2 * w[0] * w[1] + 4 * w[1]).sum();
    let model_bytes = params * 4 * 4;

    let activations = activation_bytes(&cfg.model, &blocks, &widths);
    let activation_bytes = if on_cpu { activations } else { 0 };
    let gpu_bytes = if on_cpu {
        0
    } else {
        let gpu_cache = match cfg.features {
            FeatureMode::Packed => m.gpu_cache.rows * m.dataset.store_row_bytes(),
            FeatureMode::Memory | FeatureMode::Naive => 0,
        };
        [
            gpu_cache,
            model_bytes,
            (depth + 2) * batch.assembled,
            activations,
            CUDA_CONTEXT_BYTES,
        ]
        .into_iter()
        .fold(0u64, u64::saturating_add)
    };

    let historical_bytes = historical_bytes(cfg, &blocks, m.dataset.num_nodes);
    let runtime_bytes = TORCH_RUNTIME_BYTES + PROCESS_BYTES;
    let total_bytes = [
        cache_bytes,
        batches_in_flight_bytes,
        model_bytes,
        historical_bytes,
        activation_bytes,
        runtime_bytes,
    ]
    .into_iter()
    .fold(0u64, u64::saturating_add);
    MemoryEstimate {
        cache_bytes,
        batches_in_flight_bytes,
        model_bytes,
        historical_bytes,
        activation_bytes,
        runtime_bytes,
        total_bytes,
        gpu_bytes,
    }
}

/// The batches in the pipeline's queues: each loader holds one batch it
/// reads, `queue_depth` loaded ones and `queue_depth + 2` spare buffers;
/// the assembler one, the model step `queue_depth` assembled inputs and
/// the one it trains on. Assembled between steps, the step's thread holds
/// one assembled input at a time.
fn in_flight_bytes(batch: &BatchBytes, opts: PipelineOptions) -> u64 {
    let loaders = opts.loaders.max(1) as u64;
    let depth = opts.queue_depth.max(1) as u64;
    let assembled = if opts.assemble_between_steps {
        1
    } else {
        depth + 2
    };
    if opts.pipelined {
        loaders * (2 * depth + 3) * batch.read + assembled * batch.staged
    } else {
        batch.read + batch.staged
    }
}

/// States the peak host memory of a loader over `m` (the Python
/// `offgnn.Loader`): the caches, the pipeline's batches in flight, and
/// `held` finished batches beyond them (those it has ready and the one
/// its caller holds; on CUDA those live on the device), and the runtime.
pub fn loader_estimate(
    m: &Manifest,
    device: Device,
    opts: PipelineOptions,
    held: u64,
) -> MemoryEstimate {
    let on_cpu = device == Device::Cpu;
    let cache_bytes = cache_bytes(m, FeatureMode::Packed);
    let blocks = batch_bounds(m);
    let recorded_inputs = m.largest_batch.as_ref().map_or(0, |s| s.inputs);
    let inputs = blocks.first().map_or(0, |b| b.0).max(recorded_inputs);
    let batch = BatchBytes::of(m, inputs, FeatureMode::Packed, on_cpu);
    // A finished batch's blocks: each edge's two endpoints, and per
    // destination a degree and an offset, as int64.
    let graph: u64 = blocks
        .iter()
        .map(|&(_, d, e)| 8 * (2 * e + 2 * d + 1))
        .sum();
    let finished = batch.assembled + graph;
    let batches_in_flight_bytes =
        in_flight_bytes(&batch, opts) + if on_cpu { held * finished } else { 0 };
    let gpu_bytes = if on_cpu {
        0
    } else {
        let gpu_cache = m.gpu_cache.rows * m.dataset.store_row_bytes();
        let depth = opts.queue_depth.max(1) as u64;
        [gpu_cache, (depth + 2 + held) * finished, CUDA_CONTEXT_BYTES]
            .into_iter()
            .fold(0u64, u64::saturating_add)
    };
    let runtime_bytes = TORCH_RUNTIME_BYTES + PROCESS_BYTES;
    MemoryEstimate {
        cache_bytes,
        batches_in_flight_bytes,
        runtime_bytes,
        total_bytes: cache_bytes
            .saturating_add(batches_in_flight_bytes)
            .saturating_add(runtime_bytes),
        gpu_bytes,
        ..MemoryEstimate::default()
    }
}

/// The historical cache's host memory: each level's rows (its share of the
/// `memory` setting, whole rows, and at most one per node of the graph's
/// `num_nodes`) with, per entry, its index entry and up to four records of
/// its admission order; and a level's nodes in rows (cached rows in a
/// plan, or an update's admissions) for each batch between its lookup and
/// its update being applied, `lag` plus the pipeline's lookahead.
fn historical_bytes(cfg: &TrainConfig, blocks: &[(u64, u64, u64)], num_nodes: u64) -> u64 {
    let Some(h) = &cfg.historical else {
        return 0;
    };
    let level_rows: u64 = blocks.iter().skip(1).map(|b| b.0).sum();
    let shape = (cfg.model.hidden, cfg.model.layers);
    let lookahead = cfg.pipeline_options().lookahead();
    historical_cache_bytes(h, shape, (level_rows, num_nodes), lookahead)
}

/// The historical cache `h` of a model of `(hidden, layers)` over a graph
/// of `num_nodes`: each level's rows (no more than a node each) with their
/// bookkeeping, and the embeddings of the `2 x lag + 1` batches between a
/// lookup and its update, each `level_rows` nodes (the largest batch's,
/// every level above the inputs).
pub(crate) fn historical_cache_bytes(
    h: &crate::historical::HistoricalConfig,
    (hidden, layers): (i64, usize),
    (level_rows, num_nodes): (u64, u64),
    lag: u64,
) -> u64 {
    /// A hash-map entry (node, slot, step) with the table's slack, and four
    /// admission records of 16 bytes.
    const PER_ENTRY: u64 = 40 + 4 * 16;
    let dim = hidden.max(1) as u64;
    let levels = layers.saturating_sub(1).max(1) as u64;
    let entries = (h.memory / levels / (dim * 4)).min(num_nodes);
    let held = levels * entries * (dim * 4 + PER_ENTRY);
    held + (2 * lag + 1) * level_rows * dim * 4
}

/// Feature rows held for the whole run. Host rows, once; on CUDA the GPU
/// tier's only until it is uploaded at start. The CPU tier is never
/// page-locked as a whole.
fn cache_bytes(m: &Manifest, features: FeatureMode) -> u64 {
    // A layout row (the caches, the reads) and a feature-file row (the
    // in-memory baseline): they differ where the packer converted rows.
    let row = m.dataset.store_row_bytes();
    let file_row = m.dataset.row_bytes;
    match features {
        FeatureMode::Packed => (m.gpu_cache.rows + m.cpu_cache.rows) * row,
        FeatureMode::Memory => m.dataset.num_nodes * file_row,
        FeatureMode::Naive => 0,
    }
}

/// What one batch of the largest size takes in host memory.
pub(crate) struct BatchBytes {
    /// Its read: disk-cache pages and packed chunk (the naive baseline:
    /// each row's pages).
    pub read: u64,
    /// Its assembled float32 input matrix.
    pub assembled: u64,
    /// What the host holds of it assembled.
    pub staged: u64,
}

impl BatchBytes {
    /// A batch of `inputs` rows of layout `m`, read as `features` says.
    pub(crate) fn of(m: &Manifest, inputs: u64, features: FeatureMode, on_cpu: bool) -> BatchBytes {
        let row = m.dataset.store_row_bytes();
        let largest_disk_cache = m
            .segments
            .iter()
            .map(|s| s.disk_cache_bytes)
            .max()
            .unwrap_or(0);
        // A batch's read: its disk-cache pages (each row on a page of its own
        // at worst, never more than the segment's cache) and its packed chunk,
        // both whole pages; its assembled input matrix beside it.
        let read = match features {
            // The pages that hold each row of the feature file, which
            // (after the file's header) may straddle one more.
            FeatureMode::Naive => {
                inputs.saturating_mul((m.dataset.row_bytes.div_ceil(PAGE) + 1) * PAGE) + 2 * PAGE
            }
            FeatureMode::Packed | FeatureMode::Memory => {
                (inputs.saturating_mul(PAGE)).min(largest_disk_cache.next_multiple_of(PAGE))
                    + (inputs * row).next_multiple_of(PAGE)
                    + 2 * PAGE
            }
        };
        let assembled = inputs * m.dataset.feature_dim * 4;
        // What the host holds of an assembled batch: on the CPU the float32
        // matrix; on CUDA its page-locked staging buffer (the rows as stored and
        // three int64 indices a row at most), which libtorch's caching host
        // allocator rounds up to a power of two.
        let staged = if on_cpu {
            assembled
        } else {
            (inputs * (row + 24)).next_power_of_two()
        };
        BatchBytes {
            read,
            assembled,
            staged,
        }
    }
}

/// The model's layer widths; GAT's output layer has one set per head.
fn layer_widths(mc: &ModelConfig) -> Vec<u64> {
    let heads = if mc.kind == ModelKind::Gat {
        mc.heads as u64
    } else {
        1
    };
    let mut widths: Vec<u64> = crate::model::widths(mc)
        .into_iter()
        .map(|w| w as u64)
        .collect();
    if let Some(last) = widths.last_mut() {
        *last *= heads;
    }
    widths
}

/// The activations kept for the backward pass of the largest batch
/// (`blocks`, input layer first) through layers of `widths`, with their
/// gradients.
fn activation_bytes(mc: &ModelConfig, blocks: &[(u64, u64, u64)], widths: &[u64]) -> u64 {
    let heads = if mc.kind == ModelKind::Gat {
        mc.heads as u64
    } else {
        1
    };
    let elements: u64 = blocks
        .iter()
        .zip(widths.windows(2))
        .enumerate()
        .map(|(l, (&(src, dst, edges), w))| {
            let (d_in, d_out) = (w[0], w[1]);
            match mc.kind {
                // The edge-to-destination map of the mean's
                // embedding_bag (int64: two elements an edge), the
                // destinations' means, then the two projections, the
                // activation and the dropout mask.
                ModelKind::Sage => edges
                    .saturating_mul(2)
                    .saturating_add(dst.saturating_mul(d_in + 6 * d_out)),
                // The sources' projection and scores, per-edge scores
                // through the softmax, per-edge messages, and the
                // destinations' sums, residual and activation.
                ModelKind::Gat => src
                    .saturating_mul(2 * d_out + heads)
                    .saturating_add(edges.saturating_mul(2 * d_out + 8 * heads))
                    .saturating_add(dst.saturating_mul(6 * d_out)),
                // The seeds' rows only.
                ModelKind::Mlp if l == 0 => {
                    let seeds = blocks.last().map_or(0, |b| b.1);
                    seeds.saturating_mul(d_in + 6 * d_out)
                }
                ModelKind::Mlp => {
                    let seeds = blocks.last().map_or(0, |b| b.1);
                    seeds.saturating_mul(6 * d_out)
                }
            }
        })
        .fold(0u64, u64::saturating_add);
    // Each kept for the backward pass has a gradient of its size.
    elements.saturating_mul(4 * ACTIVATION_FACTOR)
}

/// What inference planning its groups on CUDA device `index` counts on:
/// the free bytes in whole GiB (so that a resumed run plans the same groups
/// while the free figure moves a little), then the free and total bytes as
/// read; `None` where the runtime cannot tell, said in a warning (groups are
/// then planned by `--memory` alone).
pub(crate) fn cuda_free_for_groups(index: usize) -> Option<(u64, u64, u64)> {
    let Some((free, total)) = cuda_free_memory(index) else {
        tracing::warn!(
            "cuda:{index}: the CUDA runtime's free memory could not be read; groups are planned by --memory alone"
        );
        return None;
    };
    Some((free >> 30 << 30, free, total))
}

/// Free and total bytes of CUDA device `index`, from the CUDA runtime that
/// libtorch loaded (`cudaMemGetInfo`, found at run time so that the trainer
/// links no CUDA library of its own); `None` where there is none.
pub fn cuda_free_memory(index: usize) -> Option<(u64, u64)> {
    type SetDevice = unsafe extern "C" fn(libc::c_int) -> libc::c_int;
    type GetDevice = unsafe extern "C" fn(*mut libc::c_int) -> libc::c_int;
    type MemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> libc::c_int;
    for name in [c"libcudart.so.13", c"libcudart.so.12", c"libcudart.so"] {
        // SAFETY: RTLD_NOLOAD only finds a library already loaded; the
        // symbols have the CUDA runtime's documented signatures.
        unsafe {
            let lib = libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
            if lib.is_null() {
                continue;
            }
            let sym = |s: &std::ffi::CStr| libc::dlsym(lib, s.as_ptr());
            let (set, get, info) = (
                sym(c"cudaSetDevice"),
                sym(c"cudaGetDevice"),
                sym(c"cudaMemGetInfo"),
            );
            if set.is_null() || get.is_null() || info.is_null() {
                continue;
            }
            let set: SetDevice = std::mem::transmute(set);
            let get: GetDevice = std::mem::transmute(get);
            let info: MemGetInfo = std::mem::transmute(info);
            let mut before = 0;
            if get(&mut before) != 0 || set(index as libc::c_int) != 0 {
                return None;
            }
            let (mut free, mut total) = (0usize, 0usize);
            let ok = info(&mut free, &mut total) == 0;
            set(before);
            return ok.then_some((free as u64, total as u64));
        }
    }
    None
}

/// This machine's memory (MemTotal of /proc/meminfo), or 8 GiB where that
/// cannot be read.
pub fn machine_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(8 << 30, |kb| kb * 1024)
}
