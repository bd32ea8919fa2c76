//! The host memory a typed training run will use, stated before any batch
//! is read as [`crate::memory`] states a homogeneous run's, from the
//! largest batch the packer recorded (each figure the most of any batch):
//! every type's cache tiers, the batches in the loader's queue (each
//! type's reads, assembled rows and the typed blocks), the model with
//! Adam's state, and the activations of every relation's convolution; and
//! a typed loader's, which holds finished batches in place of a model.

use offgnn_manifests::{TypedBatchShape, TypedManifest};
use tch::{Device, Tensor, nn};

use super::{RelationalKind, Rgnn, RgnnConfig, Schema};
use crate::error::{Error, Result};
use crate::memory::{ACTIVATION_FACTOR, BatchBytes, CUDA_CONTEXT_BYTES, MemoryEstimate};
use crate::memory::{PROCESS_BYTES, TORCH_RUNTIME_BYTES};
use crate::pipeline::FeatureMode;

/// Batches a pipelined run holds read at once: the one the loader thread
/// reads, two in its queue, and the one the model steps on. Their read
/// buffers go round (the loader takes a fresh one only when none is spare
/// then), so no more than four sets exist.
const PIPELINED_READS: u64 = 4;

/// What every type's rows and the blocks of the largest batch take: the
/// caches (host tiers, and the GPU tier alone), and per batch the reads,
/// the staging, the assembled rows and the blocks' tensors.
struct Parts {
    cache_bytes: u64,
    gpu_cache: u64,
    read: u64,
    staged: u64,
    assembled: u64,
    graph: u64,
    /// The largest batch's edges over every block and relation.
    edges: u64,
}

impl Parts {
    fn of(
        m: &TypedManifest,
        shape: &TypedBatchShape,
        schema: &Schema,
        features: FeatureMode,
        on_cpu: bool,
    ) -> Parts {
        let (mut cache_bytes, mut read, mut staged, mut assembled, mut gpu_cache) = (0, 0, 0, 0, 0);
        for (t, part) in m.node_types.iter().enumerate() {
            let Some(layout) = &part.layout else { continue };
            let d = &layout.dataset;
            cache_bytes += match features {
                FeatureMode::Packed => {
                    (layout.gpu_cache.rows + layout.cpu_cache.rows) * d.store_row_bytes()
                }
                FeatureMode::Memory => d.num_nodes * d.row_bytes,
                FeatureMode::Naive => 0,
            };
            if features == FeatureMode::Packed {
                gpu_cache += layout.gpu_cache.rows * d.store_row_bytes();
            }
            let b = BatchBytes::of(layout, shape.inputs[t], features, on_cpu);
            read += b.read;
            staged += b.staged;
            assembled += b.assembled;
        }
        // Each block's edges as source and destination positions, and each
        // destination row's in-degree, per relation (int64).
        let graph: u64 = shape
            .blocks
            .iter()
            .map(|b| {
                let edges: u64 = b.edges.iter().sum();
                let dst: u64 = schema.relations.iter().map(|r| b.dst[r.2]).sum();
                16 * edges + 8 * dst
            })
            .sum();
        let edges = shape.blocks.iter().flat_map(|b| &b.edges).sum();
        Parts {
            cache_bytes,
            gpu_cache,
            read,
            staged,
            assembled,
            graph,
            edges,
        }
    }

    /// The batches a run's loader holds at once, read and not yet stepped.
    fn in_flight(&self, pipelined: bool) -> u64 {
        if pipelined {
            PIPELINED_READS * (self.read + self.graph) + self.staged
        } else {
            self.read + self.graph + self.staged
        }
    }
}

/// States the peak host memory of training `cfg`'s model on `m` with rows
/// from `features` on `device`; `None` where the layout records no largest
/// batch (packed before it did).
pub fn estimate(
    m: &TypedManifest,
    schema: &Schema,
    cfg: &RgnnConfig,
    (features, device, pipelined): (FeatureMode, Device, bool),
) -> Result<Option<MemoryEstimate>> {
    let Some(shape) = &m.topology.largest_batch else {
        return Ok(None);
    };
    let on_cpu = device == Device::Cpu;
    let p = Parts::of(m, shape, schema, features, on_cpu);
    let (cache_bytes, gpu_cache, assembled) = (p.cache_bytes, p.gpu_cache, p.assembled);
    let batches_in_flight_bytes = p.in_flight(pipelined);
    let model_bytes = parameters(schema, cfg)? * 4 * 4;
    // A link batch's pairs: the training batch's positives and their
    // negatives; an evaluation batch's queries fill about its batch size
    // and overflow it by less than one query, bounded here by a second
    // batch.
    let pairs = m.samples.link.as_ref().map_or(0, |l| {
        let train = m.samples.batch_size as u64 * (1 + u64::from(l.negatives));
        let eval = m.samples.eval_batch_size.unwrap_or(m.samples.batch_size) as u64;
        train.max(eval) + m.samples.batch_size.max(eval as usize) as u64
    });
    let activations = activation_bytes(shape, schema, cfg, pairs);
    let activation_bytes = if on_cpu { activations } else { 0 };
    let gpu_bytes = if on_cpu {
        0
    } else {
        [
            gpu_cache,
            model_bytes,
            2 * assembled,
            activations,
            CUDA_CONTEXT_BYTES,
        ]
        .into_iter()
        .fold(0u64, u64::saturating_add)
    };
    let runtime_bytes = TORCH_RUNTIME_BYTES + PROCESS_BYTES;
    let total_bytes = [
        cache_bytes,
        batches_in_flight_bytes,
        model_bytes,
        activation_bytes,
        runtime_bytes,
    ]
    .into_iter()
    .fold(0u64, u64::saturating_add);
    Ok(Some(MemoryEstimate {
        cache_bytes,
        batches_in_flight_bytes,
        model_bytes,
        historical_bytes: 0,
        activation_bytes,
        runtime_bytes,
        total_bytes,
        gpu_bytes,
    }))
}

/// The historical cache `h` of a run of `cfg`'s model on `m` (as for
/// homogeneous training, [`crate::memory::historical_cache_bytes`]): the
/// largest batch's nodes of every level above the inputs are each block's
/// destinations but the last's.
pub fn historical_bytes(
    m: &TypedManifest,
    cfg: &RgnnConfig,
    h: &crate::historical::HistoricalConfig,
) -> u64 {
    let level_rows = m.topology.largest_batch.as_ref().map_or(0, |s| {
        let below_last = s.blocks.len().saturating_sub(1);
        s.blocks[..below_last]
            .iter()
            .map(|b| b.dst.iter().sum::<u64>())
            .sum()
    });
    let shape = (cfg.hidden, cfg.layers);
    let rows = (level_rows, m.dataset.num_nodes);
    crate::memory::historical_cache_bytes(h, shape, rows, super::historical::LAG)
}

/// States the peak host memory of a loader over `m` (the Python
/// `offgnn.Loader`): every type's caches, the batches its pipeline reads
/// ahead, and `held` finished batches beyond them (those it has ready and
/// the one its caller holds; on CUDA their rows and edges live on the
/// device), each with its edges twice more (as `edge_index` and as
/// `blocks`); `None` where the layout records no largest batch.
pub fn loader_estimate(
    m: &TypedManifest,
    schema: &Schema,
    device: Device,
    held: u64,
) -> Option<MemoryEstimate> {
    let shape = m.topology.largest_batch.as_ref()?;
    let on_cpu = device == Device::Cpu;
    let p = Parts::of(m, shape, schema, FeatureMode::Packed, on_cpu);
    let finished = p.assembled + p.graph + 32 * p.edges;
    // The batch being shaped beside those held.
    let finished_bytes = (held + 1).saturating_mul(finished);
    let batches_in_flight_bytes =
        p.in_flight(true)
            .saturating_add(if on_cpu { finished_bytes } else { 0 });
    let gpu_bytes = if on_cpu {
        0
    } else {
        [p.gpu_cache, finished_bytes, CUDA_CONTEXT_BYTES]
            .into_iter()
            .fold(0u64, u64::saturating_add)
    };
    let runtime_bytes = TORCH_RUNTIME_BYTES + PROCESS_BYTES;
    Some(MemoryEstimate {
        cache_bytes: p.cache_bytes,
        batches_in_flight_bytes,
        runtime_bytes,
        total_bytes: [p.cache_bytes, batches_in_flight_bytes, runtime_bytes]
            .into_iter()
            .fold(0u64, u64::saturating_add),
        gpu_bytes,
        ..MemoryEstimate::default()
    })
}

/// The model's parameters, counted on a model built for the purpose (it
/// also refuses a schema the model cannot train before anything loads).
fn parameters(schema: &Schema, cfg: &RgnnConfig) -> Result<u64> {
    let vs = nn::VarStore::new(Device::Cpu);
    Rgnn::new(&vs.root(), schema, cfg)?;
    Ok(vs
        .trainable_variables()
        .iter()
        .map(Tensor::numel)
        .sum::<usize>() as u64)
}

/// The activations kept for the backward pass of the largest batch, with
/// their gradients: per block and relation, its convolution's; per block
/// and type, the sum over relations, the activation and the dropout mask;
/// then the classifier on the seeds; or, in a link model, every seed's
/// embedding gathered into one matrix and the scorer over `pairs` pairs
/// (both endpoints' rows, their product and the MLP's two hidden layers,
/// each with its gradient).
fn activation_bytes(shape: &TypedBatchShape, schema: &Schema, cfg: &RgnnConfig, pairs: u64) -> u64 {
    let hidden = cfg.hidden.max(1) as u64;
    let heads = cfg.heads.max(1) as u64;
    let mut src = shape.inputs.clone();
    let mut width: Vec<u64> = cfg.in_dims.iter().map(|d| d.unwrap_or(0) as u64).collect();
    let mut elements = 0u64;
    for b in &shape.blocks {
        for (r, &(st, _, dt)) in schema.relations.iter().enumerate() {
            let (e, s, d, d_in) = (b.edges[r], src[st], b.dst[dt], width[st]);
            elements = elements.saturating_add(match cfg.kind {
                // The edge-to-destination map of the mean (int64: two
                // elements an edge), the means, the projection; with a
                // root weight, the destinations' own rows' projection and
                // the sum.
                RelationalKind::Rsage => e.saturating_mul(2).saturating_add(
                    d.saturating_mul(d_in + 2 * hidden + u64::from(cfg.root_weight) * 2 * hidden),
                ),
                // Both sides' projections and scores, per-edge scores
                // through the softmax and messages, the sums.
                RelationalKind::Rgat => s
                    .saturating_mul(2 * hidden + heads)
                    .saturating_add(e.saturating_mul(2 * hidden + 8 * heads))
                    .saturating_add(d.saturating_mul(4 * hidden + heads)),
            });
        }
        let dst: u64 = b.dst.iter().sum();
        elements = elements.saturating_add(dst.saturating_mul(4 * hidden));
        src = b.dst.clone();
        width = vec![hidden; width.len()];
    }
    let seeds = shape
        .blocks
        .last()
        .map_or(0, |b| b.dst.get(schema.target).copied().unwrap_or(0));
    if cfg.scorer.is_some() {
        let all_seeds: u64 = shape.blocks.last().map_or(0, |b| b.dst.iter().sum());
        elements = elements
            .saturating_add(all_seeds.saturating_mul(2 * hidden))
            .saturating_add(pairs.saturating_mul(10 * hidden + 8));
    } else {
        let classes = cfg.classes.max(1) as u64;
        elements = elements.saturating_add(seeds.saturating_mul(hidden + 3 * classes));
    }
    elements.saturating_mul(4 * ACTIVATION_FACTOR)
}

/// The statement's refusal where the layout records no largest batch, of
/// the limit given as `given` (the trainer's `--memory`, the loader's
/// `memory`).
pub fn unstated(given: &str, limit: u64) -> Error {
    Error::InvalidArgument(format!(
        "{given} {}: this typed layout records no largest batch to state the memory it takes from; pack it again",
        offgnn_shared::report::human_bytes(limit)
    ))
}
