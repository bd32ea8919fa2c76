//! The memory plan: the rows of a source chunk, and the destination groups
//! whose state fits `--memory` (and the device's memory where the
//! aggregation runs there), as DiskGNN §5.2 sizes its feature partitions
//! to fit in memory; and how many edge buckets a chunk of each layer's
//! stream takes.

use offgnn_shared::dataset::Dataset;
use offgnn_shared::report::human_bytes;
use offgnn_shared::store::Store;
use serde::{Deserialize, Serialize};
use tch::Device;

use super::chunk::Chunk;
use super::edges::for_each_edge;
use super::hidden_rows::WRITE_PIECE;
use super::layers::Model;
use super::on_device;
use super::output::OutputPlan;
use super::stream::{PER_CALL, REQUEST, STREAM_AHEAD};
use super::{ALIGN_NODES, Aggregate, InferConfig, PAGE};
use crate::error::{Error, Result};

/// The plan: groups of destinations and the source chunk size (that of
/// the edge buckets), and per layer the buckets a chunk of its stream
/// takes (see [`chunk_merges`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct Plan {
    pub(super) groups: Vec<(u64, u64)>,
    pub(super) chunk_rows: u64,
    pub(super) planned_bytes: u64,
    #[serde(default)]
    pub(super) merges: Vec<u64>,
}

impl Plan {
    pub(super) fn chunks(&self, n: u64) -> usize {
        n.div_ceil(self.chunk_rows) as usize
    }
}

/// Bytes a group holds per in-edge of its destinations: the pair, and its
/// sorted copy while bucketing.
const EDGE_BYTES: u64 = 16;

/// The run's plan, and the sizes the passes take from it.
pub(super) struct RunPlan {
    pub(super) plan: Plan,
    /// Bytes per write of the hidden layers' rows.
    pub(super) write_piece: usize,
    pub(super) output: OutputPlan,
    /// The edges as streamed, duplicates counted (what the bucketed edges
    /// take on disk at most).
    pub(super) edge_upper_bound: u64,
}

/// Plans the run's memory: a count per node and the selection (`bits`), the
/// chunk's rows (raw and as float32, and GAT's projection), the stream's
/// buffer and the output's encoders, then the destination groups in what
/// is left of `--memory` (and of the device's memory where the aggregation
/// runs on CUDA).
pub(super) fn plan_run(
    cfg: &InferConfig,
    model: &Model,
    ds: &Dataset,
    bits: &[u64],
    out: &Store,
) -> Result<RunPlan> {
    let n = ds.num_nodes;
    // A chunk's float32 tensors in flight (the one in use, those ready
    // ahead, and two the reader fills: it reads or converts into them, and
    // the matmuls read them as they are), then what it is projected to. On
    // CUDA they are page-locked, and libtorch's caching host allocator
    // rounds each up to a power of two: up to twice their size.
    let pin = if cfg.device.is_cuda() { 2 } else { 1 };
    let costs = layer_costs(cfg, model, pin);
    // Hidden rows go out in pieces of at most WRITE_PIECE bytes.
    let widest = *model.widths[1..].iter().max().expect("a layer") as u64;
    let write_piece = (WRITE_PIECE as u64).min((n * widest * 4).div_ceil(PAGE) * PAGE) as usize;
    let output = OutputPlan::new(cfg, model, bits, out);
    let (encoders, encoding_bytes) = (output.encoders, output.bytes());
    // libtorch's runtime and the process's own, as the training statement
    // counts them, then a count per node, the selection, the read and
    // write buffers, and the output parts being encoded and the one being
    // stored.
    let fixed = crate::memory::RUNTIME_BYTES
        + 4 * n
        + n.div_ceil(8)
        + (2 * REQUEST * PER_CALL + 2 * write_piece) as u64
        + pin * (STREAM_AHEAD as u64 + 2) * 4 * Chunk::SLACK as u64
        + encoding_bytes;
    let chunk_rows = match cfg.chunk_rows {
        Some(c) => c.div_ceil(ALIGN_NODES).max(1) * ALIGN_NODES,
        None => {
            // An eighth of what is left after the fixed part.
            let bytes = (cfg.memory.saturating_sub(fixed) / 8).min(256 << 20);
            (bytes / costs.per_chunk_row / ALIGN_NODES).max(1) * ALIGN_NODES
        }
    };
    let chunk_bytes = chunk_rows * costs.per_chunk_row;
    let merges = chunk_merges(&costs.row_costs, costs.per_chunk_row, costs.device_floats.1);
    let mut indegree = vec![0u32; n as usize];
    let mut edge_upper_bound = 0u64;
    for_each_edge(ds, cfg, |_, dst| {
        indegree[dst as usize] += 1;
        edge_upper_bound += 1;
        Ok(())
    })?;
    // The groups need room for their largest block of nodes at least.
    let block = largest_block(&indegree, costs.per_node, model.mlp.is_empty());
    let budget = cfg.memory.saturating_sub(fixed + chunk_bytes);
    if budget < block {
        // A source chunk sized from --memory grows with it: the least that
        // works leaves the block its room beside the chunk it then takes.
        let least_chunk = ALIGN_NODES * costs.per_chunk_row;
        let least = match cfg.chunk_rows {
            Some(_) => fixed + chunk_bytes + block,
            None => fixed + (block + least_chunk).max((8 * block).div_ceil(7)),
        };
        return Err(Error::InvalidArgument(format!(
            "--memory {} is below the {} this run needs (libtorch's runtime {}, 4 bytes per node for {n} nodes, {} for a source chunk of {chunk_rows} rows, {} of read and write buffers, {} for {encoders} output parts encoded at once and one being stored, and {} for its largest block of {ALIGN_NODES} destinations); give --memory at least {}",
            human_bytes(cfg.memory),
            human_bytes(fixed + chunk_bytes + block),
            human_bytes(crate::memory::RUNTIME_BYTES),
            human_bytes(chunk_bytes),
            human_bytes((2 * REQUEST * PER_CALL + 2 * write_piece) as u64),
            human_bytes(encoding_bytes),
            human_bytes(block),
            human_bytes(least.div_ceil(1 << 20) << 20)
        )));
    }
    let host = Budget {
        node_bytes: costs.per_node,
        edge_bytes: EDGE_BYTES,
        bytes: budget,
    };
    let device = match (cfg.aggregate, cfg.device, model.mlp.is_empty()) {
        (Aggregate::Device, Device::Cuda(index), true) => device_budget(
            index,
            4 * costs.device_floats.0,
            4 * chunk_rows * costs.device_floats.1,
        )?,
        _ => None,
    };
    let (groups, largest) = if model.mlp.is_empty() {
        plan_groups(&indegree, host, device)?
    } else {
        plan_groups(&vec![0; n as usize], host, None)?
    };
    drop(indegree);
    let plan = Plan {
        planned_bytes: fixed + chunk_bytes + largest,
        groups,
        chunk_rows,
        merges,
    };
    tracing::info!(
        "inference: {} nodes in {} groups, source chunks of {} rows, memory at most {}",
        n,
        plan.groups.len(),
        chunk_rows,
        human_bytes(cfg.memory)
    );
    Ok(RunPlan {
        plan,
        write_piece,
        output,
        edge_upper_bound,
    })
}

/// What the layers cost, the most of any layer: host bytes per destination
/// of a group and per row of a source chunk; with the aggregation on CUDA,
/// the device floats per destination and per source row (see
/// [`on_device::device_floats`]); and per layer whose aggregation runs on
/// the device, its host bytes and device floats per row of a source chunk
/// (see [`chunk_merges`]).
struct LayerCosts {
    per_node: u64,
    per_chunk_row: u64,
    device_floats: (u64, u64),
    row_costs: Vec<(u64, u64)>,
}

/// The layers' costs, with a chunk's tensors taking `pin` times their size
/// (see [`plan_run`]).
fn layer_costs(cfg: &InferConfig, model: &Model, pin: u64) -> LayerCosts {
    let num_layers = model.card.num_layers;
    let max_in = *model.widths[..num_layers].iter().max().expect("a layer") as u64;
    let mut per_node = 0u64;
    let chunks_per_row = pin * 4 * (STREAM_AHEAD as u64 + 2) * max_in;
    let mut per_chunk_row = chunks_per_row;
    let mut device_floats = (0u64, 0u64);
    let mut row_costs = Vec::new();
    for l in 0..num_layers {
        let last = l + 1 == num_layers;
        let d_in = model.widths[l] as u64;
        // Embeddings keep the last layer's input rows of the group.
        let kept = if last && cfg.outputs.embeddings {
            d_in
        } else {
            0
        };
        let floats = if model.mlp.is_empty() {
            let (mut node, mut per_src) = model.layer_floats(l);
            if cfg.aggregate == Aggregate::Device {
                let d_out = model.widths[l + 1] as u64;
                let (dev_node, dev_src) = on_device::device_floats(&model.layers[l], d_in, d_out);
                if cfg.device.is_cuda() {
                    // The group's state is on the device, planned below;
                    // the host holds the output rows.
                    node = on_device::host_floats(d_out);
                    per_src = 0;
                    device_floats = (device_floats.0.max(dev_node), device_floats.1.max(dev_src));
                } else {
                    // torch's ops on the CPU: the device's tensors are host
                    // memory (a chunk "on the device" is the chunk itself),
                    // and the output rows are copied out of them.
                    node = node.max(dev_node + d_out);
                    per_src = per_src.max(dev_src - d_in);
                }
                let dev_src = if cfg.device.is_cuda() { dev_src } else { 0 };
                let host_row = pin * 4 * (STREAM_AHEAD as u64 + 2) * d_in + 4 * per_src;
                row_costs.push((host_row, dev_src));
            }
            per_chunk_row = per_chunk_row.max(chunks_per_row + 4 * per_src);
            node + kept
        } else {
            // The MLP's rows, every hidden width and the output, twice.
            2 * (d_in + model.widths[1..].iter().sum::<i64>() as u64)
        };
        per_node = per_node.max(4 * floats);
        if !model.mlp.is_empty() {
            break;
        }
    }
    LayerCosts {
        per_node,
        per_chunk_row,
        device_floats,
        row_costs,
    }
}

/// What a destination group costs in one memory, and how much of that
/// memory groups may use.
#[derive(Clone, Copy, Debug)]
struct Budget {
    node_bytes: u64,
    edge_bytes: u64,
    bytes: u64,
}

impl Budget {
    fn of(&self, nodes: u64, edges: u64) -> u64 {
        nodes * self.node_bytes + edges * self.edge_bytes
    }
}

/// Cuts the destinations into groups whose working state fits the host's
/// budget (each node costs `node_bytes`, each of its in-edges 16 bytes: the
/// pairs, and their sorted copy while bucketing) and, with the aggregation
/// on a CUDA device, that device's (`device`, with the device's index).
/// Returns the groups and the largest group's cost on the host.
/// The most any block of [`ALIGN_NODES`] destinations takes in a group:
/// `node_bytes` each and, where the model aggregates (`edges`), each
/// in-edge's [`EDGE_BYTES`].
fn largest_block(indegree: &[u32], node_bytes: u64, edges: bool) -> u64 {
    indegree
        .chunks(ALIGN_NODES as usize)
        .map(|b| {
            let in_edges: u64 = b.iter().map(|&d| u64::from(d)).sum();
            b.len() as u64 * node_bytes + if edges { in_edges * EDGE_BYTES } else { 0 }
        })
        .max()
        .unwrap_or(0)
}

fn plan_groups(
    indegree: &[u32],
    host: Budget,
    device: Option<(Budget, usize)>,
) -> Result<(Vec<(u64, u64)>, u64)> {
    let n = indegree.len() as u64;
    let mut groups = Vec::new();
    let (mut start, mut cost, mut cost_dev, mut largest) = (0u64, 0u64, 0u64, 0u64);
    let mut a = 0u64;
    while a < n {
        let b = (a + ALIGN_NODES).min(n);
        let edges: u64 = indegree[a as usize..b as usize]
            .iter()
            .map(|&d| d as u64)
            .sum();
        let block = host.of(b - a, edges);
        if block > host.bytes {
            return Err(Error::InvalidArgument(format!(
                "--memory leaves {} for destination groups, but nodes {a}..{b} alone need {} ({} per node, 16 bytes per in-edge); give --memory at least {} more",
                human_bytes(host.bytes),
                human_bytes(block),
                human_bytes(host.node_bytes),
                human_bytes(block - host.bytes)
            )));
        }
        let block_dev = device.map_or(0, |(d, _)| d.of(b - a, edges));
        if let Some((d, index)) = device.filter(|(d, _)| block_dev > d.bytes) {
            return Err(Error::InvalidArgument(format!(
                "cuda:{index} has {} free for destination groups, but nodes {a}..{b} alone need {} there ({} per node); aggregate on the host (--aggregate host)",
                human_bytes(d.bytes),
                human_bytes(block_dev),
                human_bytes(d.node_bytes)
            )));
        }
        let over_dev = device.is_some_and(|(d, _)| cost_dev + block_dev > d.bytes);
        if cost + block > host.bytes || over_dev {
            groups.push((start, a));
            start = a;
            cost = 0;
            cost_dev = 0;
        }
        cost += block;
        cost_dev += block_dev;
        largest = largest.max(cost);
        a = b;
    }
    if start < n || groups.is_empty() {
        groups.push((start, n));
    }
    Ok((groups, largest))
}

/// Per layer whose aggregation runs on the device (`row_costs`: host bytes
/// and device floats per source row), how many edge buckets' rows a chunk
/// of its stream takes: as many as the memory planned for a chunk of the
/// widest layer holds (`per_chunk_row` host bytes and `device_row` device
/// floats a row). A narrow hidden layer then streams in chunks as large
/// as the first layer's, in bytes, not in 16 times as many small ones,
/// each of which costs the device a few copies and dozens of kernels.
fn chunk_merges(row_costs: &[(u64, u64)], per_chunk_row: u64, device_row: u64) -> Vec<u64> {
    row_costs
        .iter()
        .map(|&(host, device)| {
            let by_device = device_row.checked_div(device).unwrap_or(u64::MAX);
            (per_chunk_row / host.max(1)).min(by_device).max(1)
        })
        .collect()
}

/// The device's budget for destination groups when the aggregation runs on
/// CUDA device `index`, each node costing `node_bytes` there: its free
/// memory ([`crate::memory::cuda_free_for_groups`]) less a source chunk's
/// state (`chunk_bytes`), an edge batch's temporaries and the CUDA context.
/// `None` where the free memory cannot be read.
fn device_budget(
    index: usize,
    node_bytes: u64,
    chunk_bytes: u64,
) -> Result<Option<(Budget, usize)>> {
    let Some((usable, free, total)) = crate::memory::cuda_free_for_groups(index) else {
        return Ok(None);
    };
    let fixed = chunk_bytes + on_device::EDGE_BATCH_BYTES + crate::memory::CUDA_CONTEXT_BYTES;
    let bytes = usable.checked_sub(fixed).filter(|b| *b > 0).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "cuda:{index} has {} free of {}, below the {} aggregating there needs before any group (a source chunk's state {}, edge batches {}, the CUDA context {}); aggregate on the host (--aggregate host)",
            human_bytes(free),
            human_bytes(total),
            human_bytes(fixed),
            human_bytes(chunk_bytes),
            human_bytes(on_device::EDGE_BATCH_BYTES),
            human_bytes(crate::memory::CUDA_CONTEXT_BYTES)
        ))
    })?;
    tracing::info!(
        "aggregating on cuda:{index}: {} of its {} free for destination groups ({} per node)",
        human_bytes(bytes),
        human_bytes(free),
        human_bytes(node_bytes)
    );
    Ok(Some((
        Budget {
            node_bytes,
            edge_bytes: 0,
            bytes,
        },
        index,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: u64 = ALIGN_NODES * (100 + 16);

    fn host(blocks: u64) -> Budget {
        Budget {
            node_bytes: 100,
            edge_bytes: 16,
            bytes: blocks * BLOCK,
        }
    }

    #[test]
    fn groups_fit_the_host_and_the_device_budget() {
        // 10 blocks of 1024 nodes, an in-edge each: a block costs BLOCK.
        let indegree = vec![1u32; 10 * ALIGN_NODES as usize];
        let k = ALIGN_NODES;
        let (groups, largest) = plan_groups(&indegree, host(3), None).unwrap();
        assert_eq!(
            groups,
            [(0, 3 * k), (3 * k, 6 * k), (6 * k, 9 * k), (9 * k, 10 * k)]
        );
        assert_eq!(largest, 3 * BLOCK);
        // A device that holds two blocks' state (edges cost it nothing)
        // cuts the groups there, whatever the host could hold.
        let device = Budget {
            node_bytes: 100,
            edge_bytes: 0,
            bytes: 2 * k * 100,
        };
        let (groups, largest) = plan_groups(&indegree, host(8), Some((device, 3))).unwrap();
        let starts: Vec<u64> = groups.iter().map(|g| g.0).collect();
        assert_eq!(starts, [0, 2 * k, 4 * k, 6 * k, 8 * k]);
        assert_eq!(groups.last(), Some(&(8 * k, 10 * k)));
        assert_eq!(largest, 2 * BLOCK);
        // A device roomier than the host leaves the host's groups.
        let roomy = Budget {
            bytes: 100 * k * 100,
            ..device
        };
        let (groups, _) = plan_groups(&indegree, host(3), Some((roomy, 0))).unwrap();
        assert_eq!(groups.len(), 4);
    }

    #[test]
    fn a_block_over_either_budget_is_refused_naming_that_memory() {
        let indegree = vec![1u32; 2 * ALIGN_NODES as usize];
        let e = plan_groups(
            &indegree,
            Budget {
                bytes: BLOCK - 1,
                ..host(1)
            },
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("--memory leaves"), "{e}");
        let device = Budget {
            node_bytes: 100,
            edge_bytes: 0,
            bytes: ALIGN_NODES * 100 - 1,
        };
        let e = plan_groups(&indegree, host(4), Some((device, 3)))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cuda:3") && e.contains("--aggregate host"),
            "{e}"
        );
    }
}
