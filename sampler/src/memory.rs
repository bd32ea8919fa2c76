//! The memory a sampling run will use, stated from its flags and the
//! dataset's shape before any work starts (`--memory` refuses a run whose
//! statement exceeds it). Every part is an upper bound on what the run
//! allocates; the end-to-end suite checks a run's peak RSS against it.

use crate::topology::{CHUNK, held_bytes};
use offgnn_shared::dataset::{Dataset, LinkTask, Split, TypedDataset};
use offgnn_shared::samples::block_bounds;
use serde::Serialize;

use crate::config::SampleConfig;

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
/// A samples file's encoder beside its data: the compressors of its
/// columns, page headers and the footer.
const ENCODER_BYTES: u64 = 8 << 20;

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
    /// Parquet row groups, encoded pages and upload buffers of two files,
    /// each no larger than a file's batches at their bound allow.
    pub output_bytes: u64,
    /// Every split's seeds and labels, in plan order.
    pub plan_bytes: u64,
    pub runtime_bytes: u64,
    /// Peak: the runtime, the graph, and the larger of the build and the
    /// sampling that follows it.
    pub total_bytes: u64,
}

/// Upper bound on one batch's bytes from its blocks' bounds (input layer
/// first, as [`block_bounds`] gives them): seeds and labels, input node
/// ids, and each block's edges (two u32s each).
pub fn batch_bytes_bound(seeds: u64, blocks: &[(u64, u64, u64)]) -> u64 {
    let inputs = blocks.first().map_or(seeds, |b| b.0);
    blocks.iter().fold(
        seeds
            .saturating_mul(8)
            .saturating_add(inputs.saturating_mul(4)),
        |bytes, &(_, _, edges)| bytes.saturating_add(edges.saturating_mul(8)),
    )
}

/// Upper bounds on one batch's blocks over a typed graph, input layer
/// first, as [`block_bounds`] gives them for one edge type, for `seeds`
/// per node type. A destination draws at most its fan-out over each
/// relation into its type, a layer at most all of a relation's edges (a
/// destination's picks are distinct, and a layer's destinations too), and
/// each type's nodes stop at its count.
pub fn typed_block_bounds(shape: &TypedShape, seeds: &[u64]) -> Vec<(u64, u64, u64)> {
    let mut dst: Vec<u64> = (seeds.iter().zip(&shape.type_nodes))
        .map(|(&s, &n)| s.min(n))
        .collect();
    let mut out = Vec::with_capacity(shape.fanouts.len());
    for layer in shape.fanouts.iter().rev() {
        let mut src = dst.clone();
        let mut edges = 0u64;
        for (&(s, d, e), &f) in shape.relations.iter().zip(layer) {
            let drawn = dst[d].saturating_mul(f as u64).min(e);
            edges = edges.saturating_add(drawn);
            src[s] = src[s].saturating_add(drawn).min(shape.type_nodes[s]);
        }
        let sum = |v: &[u64]| v.iter().fold(0u64, |a, &b| a.saturating_add(b));
        out.push((sum(&src), sum(&dst), edges));
        dst = src;
    }
    out.reverse();
    out
}

/// What the memory statement needs of a dataset: its nodes, the rows of
/// its sampling graph (one per node, or per relation's destination), the
/// edges in its files, each split's seeds, and the fan-outs.
pub struct InputShape {
    pub num_nodes: u64,
    pub graph_rows: u64,
    pub input_edges: u64,
    /// The edges of the largest relation (all of them on an untyped graph).
    pub largest_relation_edges: u64,
    pub seeds: [u64; 3],
    pub fanouts: Fanouts,
}

/// Fan-outs, as a batch's bounds are taken from them.
pub enum Fanouts {
    /// One edge type's, per layer (input layer first).
    Plain(Vec<usize>),
    /// A typed graph's, with the types and relations they apply to.
    Typed(TypedShape),
}

/// What the memory statement needs of a typed graph's schema.
pub struct TypedShape {
    /// Nodes of each type.
    pub type_nodes: Vec<u64>,
    /// Each relation's source type, destination type and edges.
    pub relations: Vec<(usize, usize, u64)>,
    /// The node classification task's type (its seeds').
    pub target: usize,
    /// Per layer (input layer first), each relation's fan-out.
    pub fanouts: Vec<Vec<usize>>,
}

impl InputShape {
    pub fn of(ds: &Dataset, cfg: &SampleConfig) -> Self {
        InputShape {
            num_nodes: ds.num_nodes,
            graph_rows: ds.num_nodes,
            input_edges: ds.edges.max_edges(),
            largest_relation_edges: ds.edges.max_edges(),
            seeds: Split::ALL.map(|s| ds.split(s).seeds.len() as u64),
            fanouts: Fanouts::Plain(cfg.fanouts.clone()),
        }
    }

    /// A typed dataset sampled at `fanouts` (per layer, input layer first,
    /// per relation).
    pub fn of_typed(ds: &TypedDataset, fanouts: &[Vec<usize>]) -> Self {
        let relations: Vec<(usize, usize, u64)> = (ds.relations.iter())
            .map(|r| (r.src, r.dst, r.edges.max_edges()))
            .collect();
        InputShape {
            num_nodes: ds.num_nodes(),
            graph_rows: ds
                .relations
                .iter()
                .map(|r| ds.node_types[r.dst].num + 1)
                .sum(),
            input_edges: relations.iter().map(|r| r.2).sum(),
            largest_relation_edges: relations.iter().map(|r| r.2).max().unwrap_or(0),
            seeds: Split::ALL.map(|s| ds.split(s).seeds.len() as u64),
            fanouts: Fanouts::Typed(TypedShape {
                type_nodes: ds.node_types.iter().map(|t| t.num).collect(),
                relations,
                target: ds.target,
                fanouts: fanouts.to_vec(),
            }),
        }
    }
}

/// Parquet's buffers for two files at once (one finishing while the next
/// is written), each file's no more than its batches at `per_batch` bytes
/// can fill: the open row group's columns and their encoded pages, and the
/// upload of those pages (a page compressed is at most a little over its
/// values). A file holds at most an epoch of one split.
fn output_bytes(
    shape: &InputShape,
    cfg: &SampleConfig,
    link: Option<&LinkTask>,
    per_batch: u64,
) -> u64 {
    let epoch_batches = (Split::ALL.iter().zip(shape.seeds))
        .map(|(&split, seeds)| {
            let batch = cfg.batch_size_for(split).max(1);
            let (items, per_batch) = link.map_or((seeds, batch), |t| t.split_items(split, batch));
            items.div_ceil(per_batch as u64)
        })
        .max()
        .unwrap_or(0);
    let file_batches = u64::from(cfg.batches_per_file).min(epoch_batches.max(1));
    let file_bytes = file_batches.saturating_mul(per_batch);
    2 * (ROW_GROUP_BYTES.min(file_bytes.saturating_mul(2))
        + UPLOAD_BYTES.min(file_bytes.saturating_add(file_bytes / 8))
        + ENCODER_BYTES)
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
    let chunk = CHUNK.min(shape.largest_relation_edges.max(1) as usize) as u64;
    let graph_build_bytes = 8 * shape.graph_rows + chunk * (8 + 16 + 4 * 16 + 16);
    let threads = cfg.threads as u64;
    // Windows of 2 x threads batches: one being sampled, one in the
    // channel, one being encoded.
    let window = (2 * threads).max(2);
    // A link training batch's seeds are its pairs' distinct endpoints:
    // two a positive and one a drawn negative; an evaluation batch's at
    // most two a given pair. Pairs take 16 bytes each.
    let eval_batch = cfg.batch_size_for(Split::Valid) as u64;
    let (seeds_per_batch, pair_bytes) = match cfg.link {
        Some(l) => {
            let pairs = cfg.batch_size as u64 * (1 + u64::from(l.negatives));
            let eval_pairs = link.map_or(0, |t| {
                (t.valid.most_pairs_per_batch(eval_batch as usize))
                    .max(t.test.most_pairs_per_batch(eval_batch as usize))
            });
            let seeds = (cfg.batch_size as u64 + pairs).max(2 * eval_pairs);
            (seeds, 16 * pairs.max(eval_pairs))
        }
        None => (cfg.batch_size.max(eval_batch as usize) as u64, 0),
    };
    let blocks = match &shape.fanouts {
        // A layer draws each of the graph's edges at most once.
        Fanouts::Plain(fanouts) => block_bounds(n, seeds_per_batch, fanouts)
            .into_iter()
            .map(|(src, dst, edges)| (src, dst, edges.min(graph_edges)))
            .collect(),
        Fanouts::Typed(typed) => {
            // A node batch's seeds are of the task's type; a link batch's
            // are endpoints of its relation's two types.
            let ends = match link.and_then(|t| t.relation) {
                Some(r) => vec![typed.relations[r].0, typed.relations[r].1],
                None => vec![typed.target],
            };
            let seeds: Vec<u64> = (0..typed.type_nodes.len())
                .map(|t| {
                    if ends.contains(&t) {
                        seeds_per_batch
                    } else {
                        0
                    }
                })
                .collect();
            typed_block_bounds(typed, &seeds)
        }
    };
    let per_batch = batch_bytes_bound(seeds_per_batch.min(n), &blocks) + pair_bytes;
    // Each thread's global-to-local map, and a layer's picks as positions
    // in the neighbour lists (`Scratch::at`, 8 bytes a pick).
    let most_picks = blocks.iter().map(|b| b.2).max().unwrap_or(0);
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
    let output_bytes = output_bytes(shape, cfg, link, per_batch);
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
        let bound = |n: u64, seeds: u64, fanouts: &[usize]| {
            batch_bytes_bound(seeds.min(n), &block_bounds(n, seeds, fanouts))
        };
        // 2 seeds, fan-out 3: 6 edges, at most 8 input nodes.
        assert_eq!(bound(1000, 2, &[3]), 8 * 2 + 6 * 8 + 4 * 8);
        // Two layers: output layer 2 -> 6 edges (8 nodes), input layer
        // 8 -> 24 edges (32 nodes).
        assert_eq!(bound(1000, 2, &[3, 3]), 8 * 2 + 6 * 8 + 24 * 8 + 4 * 32);
        // Node counts cap at the graph's size.
        assert_eq!(bound(4, 2, &[3]), 8 * 2 + 6 * 8 + 4 * 4);
        assert_eq!(bound(10, u64::MAX, &[usize::MAX]), u64::MAX);
    }

    #[test]
    fn a_typed_bound_grows_type_by_type() {
        // Papers cite papers (100 edges) and are written by authors (7
        // edges in all); 3 paper seeds, fan-out 2 then 4 (input layer
        // first), 5 per layer for the authorship.
        let shape = TypedShape {
            type_nodes: vec![50, 1000],
            relations: vec![(0, 0, 100), (1, 0, 7)],
            target: 0,
            fanouts: vec![vec![2, 5], vec![4, 5]],
        };
        let bounds = typed_block_bounds(&shape, &[3, 0]);
        // Output layer: 3 papers draw 12 citations and 15 authors, capped
        // at the relation's 7 edges: 15 papers (3 + 12), 7 authors.
        // Input layer: the 15 papers draw 30 citations (45 papers) and 7
        // more authors (the relation's edges again; 14); authors draw
        // nothing, no relation reaching them.
        assert_eq!(bounds, vec![(45 + 14, 15 + 7, 30 + 7), (15 + 7, 3, 12 + 7)]);
        // Paper counts stop at their 50: 15 + 30 = 45 < 50 here; with 10
        // seeds, 10 + 40 = 50 at the output layer, then at most 50.
        let bounds = typed_block_bounds(&shape, &[10, 0]);
        assert_eq!(bounds[1].0, 50 + 7);
        assert_eq!(bounds[0].0, 50 + 14);
    }

    #[test]
    fn sampled_typed_batches_stay_within_their_bound() {
        use rand::SeedableRng;
        let (_dir, ds, g) = crate::typed_sampling::tests::graph();
        let names: Vec<String> = ds.relations.iter().map(|r| r.name.clone()).collect();
        let fanouts =
            crate::typed_sampling::RelationFanouts::parse(&["4,3,2".to_string()], &names).unwrap();
        let shape = InputShape::of_typed(&ds, &fanouts.layers);
        let Fanouts::Typed(typed) = &shape.fanouts else {
            panic!("a typed dataset's shape is typed")
        };
        let mut scratch = crate::neighbor_sampling::Scratch::new(g.num_nodes());
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(3);
        let mut tight = 0;
        for (k, seeds) in ds.train.seeds.chunks(64).enumerate() {
            let mut per_type = vec![0u64; typed.type_nodes.len()];
            per_type[typed.target] = seeds.len() as u64;
            let bounds = typed_block_bounds(typed, &per_type);
            let (nodes, blocks) = crate::typed_sampling::sample_typed_blocks(
                &g,
                &fanouts,
                seeds,
                &mut rng,
                &mut scratch,
            );
            assert!(nodes.len() as u64 <= bounds[0].0, "batch {k}");
            for (l, (b, &(src, dst, edges))) in blocks.iter().zip(&bounds).enumerate() {
                let seen = (
                    u64::from(b.num_src),
                    u64::from(b.num_dst),
                    b.src.len() as u64,
                );
                assert!(
                    seen.0 <= src && seen.1 <= dst && seen.2 <= edges,
                    "batch {k} layer {l}: {seen:?} over {:?}",
                    (src, dst, edges)
                );
                tight += usize::from(seen.1 == dst);
            }
        }
        // The output layer's destinations are the seeds: the bound is met.
        assert!(tight >= ds.train.seeds.len() / 64);
    }
}
