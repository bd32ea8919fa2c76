//! The memory a sampling run will use, stated from its flags and the
//! dataset's shape before any work starts (`--memory` refuses a run whose
//! statement exceeds it). Every part is an upper bound on what the run
//! allocates; the end-to-end suite checks a run's peak RSS against it.

use crate::topology::{CHUNK, held_bytes};
use offgnn_shared::dataset::{Dataset, EdgeList, EdgeSource, LinkTask, Split, TypedDataset};
use serde::Serialize;

use crate::config::SampleConfig;

/// Edge pairs the CSV reader can hold per line at the least (`0,1\n`).
const MIN_CSV_LINE: u64 = 4;
/// The process before any data: code, thread stacks touched, allocator
/// arenas and the Tokio runtime of the object store, stated with room over
/// what it measures.
const RUNTIME_BYTES: u64 = 64 << 20;
/// Parquet's open row group (flushed past 16 MiB, by one batch at most)
/// and its encoded pages beside it.
const ROW_GROUP_BYTES: u64 = 2 * (16 << 20);
/// The store writer's buffer plus the multipart parts it keeps in flight
/// (object_store's BufWriter: 16 MiB parts, up to 8 at once).
const UPLOAD_BYTES: u64 = 9 * (16 << 20);

/// A statement of peak memory, by part.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemoryEstimate {
    /// The sampling graph: u64 offsets and u32 neighbor ids.
    pub graph_bytes: u64,
    /// Extra while the graph is built: per-node cursors and edge chunks,
    /// and `graph_hold_bytes`.
    pub graph_build_bytes: u64,
    /// The first pass's sorted edges, kept for the second pass (the largest
    /// relation's, one relation being built at a time) when that fits
    /// under what the sampling after the build takes anyway, so that the
    /// peak stays where it is; 0 when the edges are read twice instead.
    pub graph_hold_bytes: u64,
    /// Per-thread node maps of the sampler.
    pub scratch_bytes: u64,
    /// Sampled batches between the threads and the Parquet encoder, at
    /// the fan-outs' worst case, and one Arrow copy of each.
    pub batches_in_flight_bytes: u64,
    /// Parquet row groups, encoded pages and upload buffers of two files.
    pub output_bytes: u64,
    /// Every split's seeds and labels, in plan order.
    pub plan_bytes: u64,
    pub runtime_bytes: u64,
    /// Peak: the runtime, the graph, and the larger of the build and the
    /// sampling that follows it.
    pub total_bytes: u64,
}

/// Upper bound on one batch's bytes: seeds and labels, input node ids, and
/// each block's edges (two u32s each).
pub fn batch_bytes_bound(num_nodes: u64, batch_size: u64, fanouts: &[usize]) -> u64 {
    let blocks = offgnn_shared::samples::block_bounds(num_nodes, batch_size, fanouts);
    let inputs = blocks.first().map_or(batch_size.min(num_nodes), |b| b.0);
    blocks.iter().fold(
        8 * batch_size.min(num_nodes) + 4 * inputs,
        |bytes, &(_, _, edges)| bytes.saturating_add(edges.saturating_mul(8)),
    )
}

/// What the memory statement needs of a dataset: its nodes, the rows of
/// its sampling graph (one per node, or per relation's destination), the
/// edges in its files, each split's seeds, and per layer the most edges
/// one destination draws.
pub struct InputShape {
    pub num_nodes: u64,
    pub graph_rows: u64,
    pub input_edges: u64,
    /// The edges of the largest relation (all of them on an untyped graph).
    pub largest_relation_edges: u64,
    pub seeds: [u64; 3],
    pub fanouts: Vec<usize>,
}

/// Edges in a file, counted from its shape (or a CSV's smallest lines).
fn file_edges(edges: &EdgeList) -> u64 {
    match &edges.source {
        EdgeSource::Numpy(f) => f.shape()[1],
        EdgeSource::Csv(path) => std::fs::metadata(path).map_or(0, |m| m.len() / MIN_CSV_LINE),
    }
}

impl InputShape {
    pub fn of(ds: &Dataset, cfg: &SampleConfig) -> Self {
        InputShape {
            num_nodes: ds.num_nodes,
            graph_rows: ds.num_nodes,
            input_edges: file_edges(&ds.edges),
            largest_relation_edges: file_edges(&ds.edges),
            seeds: Split::ALL.map(|s| ds.split(s).seeds.len() as u64),
            fanouts: cfg.fanouts.clone(),
        }
    }

    /// A typed dataset sampled at `fanouts` (per layer, per relation): a
    /// destination draws at most the layer's sum over the relations into
    /// its type.
    pub fn of_typed(ds: &TypedDataset, fanouts: &[Vec<usize>]) -> Self {
        InputShape {
            num_nodes: ds.num_nodes(),
            graph_rows: ds
                .relations
                .iter()
                .map(|r| ds.node_types[r.dst].num + 1)
                .sum(),
            input_edges: ds.relations.iter().map(|r| file_edges(&r.edges)).sum(),
            largest_relation_edges: ds
                .relations
                .iter()
                .map(|r| file_edges(&r.edges))
                .max()
                .unwrap_or(0),
            seeds: Split::ALL.map(|s| ds.split(s).seeds.len() as u64),
            fanouts: fanouts
                .iter()
                .map(|layer| {
                    let mut into = vec![0usize; ds.node_types.len()];
                    for (r, f) in ds.relations.iter().zip(layer) {
                        into[r.dst] += f;
                    }
                    into.into_iter().max().unwrap_or(0)
                })
                .collect(),
        }
    }
}

/// States the peak memory of sampling a dataset of `shape` as `cfg` says.
pub fn estimate(shape: &InputShape, cfg: &SampleConfig, link: Option<&LinkTask>) -> MemoryEstimate {
    let n = shape.num_nodes;
    let input_edges = shape.input_edges;
    let graph_edges = if cfg.csr.add_reverse {
        input_edges.saturating_mul(2)
    } else {
        input_edges
    };
    let graph_bytes = 8 * (shape.graph_rows + 1) + graph_edges.saturating_mul(4);
    // Cursors (later the rows' deduplicated degrees); the reader's chunk
    // (one side's bytes, then both sides as u64s) and at most four copies
    // of it between the reader and the pool (being made, queued, being
    // placed, spare); and the chunk sorted into row buckets (up to two u32
    // pairs an edge).
    let chunk = CHUNK as u64;
    let graph_build_bytes = 8 * shape.graph_rows + chunk * (8 + 16 + 4 * 16 + 16);
    let threads = cfg.threads as u64;
    // Windows of 2 x threads batches: one being sampled, one in the
    // channel, one being encoded.
    let window = (2 * threads).max(2);
    // A link batch's seeds are its pairs' distinct endpoints: two a
    // positive and one a negative; its pairs 16 bytes each.
    let (seeds_per_batch, pair_bytes) = match cfg.link {
        Some(l) => {
            let pairs = cfg.batch_size as u64 * (1 + u64::from(l.negatives));
            (cfg.batch_size as u64 + pairs, 16 * pairs)
        }
        None => (cfg.batch_size as u64, 0),
    };
    let per_batch = batch_bytes_bound(n, seeds_per_batch, &shape.fanouts) + pair_bytes;
    // Each thread's global-to-local map, and a layer's picks as positions
    // in the neighbour lists (`Scratch::at`, 8 bytes a pick).
    let most_picks = offgnn_shared::samples::block_bounds(n, seeds_per_batch, &shape.fanouts)
        .iter()
        .map(|b| b.2)
        .max()
        .unwrap_or(0);
    let scratch_bytes = threads * (4 * n + 8 * most_picks);
    let batches_in_flight_bytes = 3 * window * per_batch * 2;
    let epochs = |s: Split| {
        if s == Split::Train {
            cfg.epochs as u64
        } else {
            1
        }
    };
    let plan_bytes = match link {
        // The task's pairs (8 bytes each), the training pairs again in each
        // epoch's order and the plan's copy, and the degree sampler's sums.
        Some(t) => {
            let held = (t.valid.negatives.len() + t.test.negatives.len()) as u64
                + (t.valid.positives.len() + t.test.positives.len()) as u64;
            let train = t.train.pairs.len() as u64;
            8 * (train + held) + train * 8 * 2 * epochs(Split::Train) + 8 * n
        }
        // Seeds and labels (8 bytes a seed) in each epoch's order, and the
        // unit plan's copy of them.
        None => {
            let seeds: u64 = Split::ALL
                .iter()
                .zip(shape.seeds)
                .map(|(&s, seeds)| seeds * epochs(s))
                .sum();
            seeds * 8 * 2
        }
    };
    // Two files' at once: one finishing while the next is written.
    let output_bytes = 2 * (ROW_GROUP_BYTES + UPLOAD_BYTES);
    let sampling = scratch_bytes + batches_in_flight_bytes + output_bytes + plan_bytes;
    let held = held_bytes(
        shape.largest_relation_edges,
        cfg.csr.add_reverse,
        cfg.threads,
    );
    let graph_hold_bytes = if graph_build_bytes.saturating_add(held) <= sampling {
        held
    } else {
        0
    };
    let graph_build_bytes = graph_build_bytes + graph_hold_bytes;
    let total_bytes = RUNTIME_BYTES + graph_bytes + graph_build_bytes.max(sampling);
    MemoryEstimate {
        graph_bytes,
        graph_build_bytes,
        graph_hold_bytes,
        scratch_bytes,
        batches_in_flight_bytes,
        output_bytes,
        plan_bytes,
        runtime_bytes: RUNTIME_BYTES,
        total_bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_bound_grows_by_fanout_and_stops_at_the_node_count() {
        // 2 seeds, fan-out 3: 6 edges, at most 8 input nodes.
        assert_eq!(batch_bytes_bound(1000, 2, &[3]), 8 * 2 + 6 * 8 + 4 * 8);
        // Two layers: output layer 2 -> 6 edges (8 nodes), input layer
        // 8 -> 24 edges (32 nodes).
        assert_eq!(
            batch_bytes_bound(1000, 2, &[3, 3]),
            8 * 2 + 6 * 8 + 24 * 8 + 4 * 32
        );
        // Node counts cap at the graph's size.
        assert_eq!(batch_bytes_bound(4, 2, &[3]), 8 * 2 + 6 * 8 + 4 * 4);
        assert_eq!(batch_bytes_bound(10, u64::MAX, &[usize::MAX]), u64::MAX);
    }
}
