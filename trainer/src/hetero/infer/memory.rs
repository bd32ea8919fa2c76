//! Typed inference's memory plan: what a run holds before any group
//! (libtorch's runtime, the model, the in-degrees), what `--memory` leaves
//! for the groups, and what a group of each type costs in it.

use offgnn_shared::dataset::TypedDataset;
use tch::Device;

use super::{Loaded, output, rows};
use crate::error::{Error, Result};
use crate::hetero::RelationalKind;
use crate::inference::InferConfig;

/// What the run holds before any group (libtorch's runtime and the
/// process's, the model's parameters, each node's in-degree), and what
/// `--memory` leaves besides; a `--memory` that leaves too little for a
/// group of one node is refused, naming the parts.
pub(super) fn working_memory(
    cfg: &InferConfig,
    ds: &TypedDataset,
    m: &Loaded,
) -> Result<(u64, u64)> {
    let human = offgnn_shared::report::human_bytes;
    let nodes: u64 = ds.node_types.iter().map(|t| t.num).sum();
    let model = 4 * m.card.parameters.max(0) as u64;
    let base = crate::memory::RUNTIME_BYTES + model + 4 * nodes;
    // A group of one node at the least chunk: its fixed costs.
    let least = (0..ds.node_types.len())
        .map(|t| {
            let (per_edge, per_node, fixed, _) = costs(m, t, 0);
            fixed + per_node + per_edge
        })
        .max()
        .unwrap_or(0)
        / 3
        * 4;
    match cfg.memory.checked_sub(base).filter(|w| *w >= least) {
        Some(working) => Ok((base, working)),
        None => Err(Error::InvalidArgument(format!(
            "--memory {} is too little: the run holds {} before any group (libtorch's runtime {}, the model's parameters {}, 4 bytes per node for {nodes} nodes) and its smallest group takes {} more; give --memory at least about {}",
            human(cfg.memory),
            human(base),
            human(crate::memory::RUNTIME_BYTES),
            human(model),
            human(least),
            human(base + least)
        ))),
    }
}

/// Source rows of one chunk, the rows a group reads and projects at once:
/// a thirty-second of `--memory`, at most 16 MiB (so that its buffers stay
/// under the allocator's mapping threshold and are reused, see
/// [`crate::runtime::return_freed_memory`]).
pub(super) fn chunk_bytes(memory: u64) -> u64 {
    (memory / 32).clamp(64 << 10, 16 << 20)
}

/// Bytes of a group's working state per in-edge and per destination of
/// type `t` at its widest layer, what one chunk and one slice of edges take
/// besides, and the edges of a slice (whose messages are computed at once,
/// in a chunk's bytes).
pub(super) fn costs(m: &Loaded, t: usize, memory: u64) -> (u64, u64, u64, usize) {
    let hidden = m.cfg.hidden as u64;
    let heads = m.cfg.heads as u64;
    let classes = m.cfg.classes as u64;
    let width = |s: usize| (m.cfg.in_dims[s].unwrap_or(0) as u64).max(hidden);
    let gat = m.cfg.kind == RelationalKind::Rgat;
    // Each edge's pair, loaded and sorted.
    let per_edge = 8;
    // The type's sum over its relations (which becomes the layer's output
    // in place), one relation's accumulators and count, at the last layer
    // the logits; R-GAT's own rows (twice while they are read: widened,
    // then copied into a tensor), their projection with its temporary, and
    // per-head state (R-GAT ran at 8.62 GiB RSS under 8G when the copy and
    // the temporary went uncounted).
    let mut per_node = 2 * 4 * hidden + 4 + 3 * 4 * classes;
    if gat {
        per_node += 2 * 4 * width(t) + 2 * 4 * hidden + 4 * 4 * heads;
    } else if m.cfg.root_weight {
        // The own rows, read and widened, and their projection.
        per_node += 2 * 4 * width(t) + 4 * hidden;
    }
    // A chunk's rows as read and widened, projected; a slice of edges'
    // indices, scores and messages.
    let chunk = chunk_bytes(memory);
    let chunk = 2 * chunk + chunk / 4 * hidden / width(t).max(1) * 4;
    let per_slice_edge = 3 * 8 + 2 * 4 * hidden + 6 * 4 * heads;
    let slice_edges = (chunk_bytes(memory) / per_slice_edge).max(1);
    // A part's values as sliced, copied out, encoded and stored; a hidden
    // layer's pieces as copied and encoded.
    let writing = 4 * output::part_bytes(memory) + 2 * rows::piece_bytes(memory);
    let fixed = chunk + slice_edges * per_slice_edge + writing;
    (per_edge, per_node, fixed, slice_edges as usize)
}

/// The memory a group's working state may take: three quarters of
/// `--memory` (the rest is libtorch's runtime, the model and the degrees),
/// and on CUDA, where the state lives, no more than the device has free
/// less its context.
pub(super) struct Room {
    pub(super) bytes: u64,
    /// What bounds it, and what to do where it is too little.
    pub(super) what: String,
    pub(super) remedy: &'static str,
}

impl Room {
    /// The room in `working` bytes of host memory (what --memory leaves).
    pub(super) fn of(cfg: &InferConfig, working: u64) -> Room {
        let human = offgnn_shared::report::human_bytes;
        let host = Room {
            bytes: working / 4 * 3,
            what: format!(
                "three quarters of the {} --memory {} leaves",
                human(working),
                human(cfg.memory)
            ),
            remedy: "give more --memory",
        };
        let Device::Cuda(index) = cfg.device else {
            return host;
        };
        let Some((whole, free, _)) = crate::memory::cuda_free_for_groups(index) else {
            return host;
        };
        let usable = whole.saturating_sub(crate::memory::CUDA_CONTEXT_BYTES);
        match usable < host.bytes {
            true => Room {
                bytes: usable,
                what: format!(
                    "the {} cuda:{index} has free, less {} for its context",
                    human(free),
                    human(crate::memory::CUDA_CONTEXT_BYTES)
                ),
                remedy: "free the device's memory, or infer on the CPU (--device cpu)",
            },
            false => host,
        }
    }
}
