//! `trainer infer`: the exported model's exact function on every node of a
//! graph larger than memory, layer by layer over full neighborhoods, with
//! sequential I/O (in the spirit of DiskGNN §5.2's batched packing: read the
//! big file once, front to back, and dispatch each row to where it is
//! needed).
//!
//! Destinations are cut into contiguous groups whose state fits `--memory`
//! (multiples of 1024 nodes, so every group's rows of a layer's output start
//! on a 4 KiB boundary). For each layer and group, the layer's input H(l-1)
//! (the feature file for l = 1, the previous layer's output in the work
//! directory after that) streams through the I/O engine in source chunks,
//! and each chunk's rows are added into the group's accumulators along the
//! group's in-edges from that chunk. The edges are bucketed once per run by
//! (group, source chunk), on disk, in bounded memory. GraphSAGE's mean is a
//! sum and a count; GAT's softmax over in-edges is an online softmax (a
//! running maximum and rescaled sums) seeded with each node's self-loop, so
//! one pass over the sources suffices; a group's own rows come by in that
//! pass too (for GAT the stream starts at the group's first chunk, since a
//! score needs its destination's row), so with one group every layer reads
//! its input exactly once. The layer's dense part then runs on
//! the device, and the group's rows of H(l) go out in one O_DIRECT write;
//! the last layer's go to Parquet under `--out`, whose `_SUCCESS.json`
//! commits the result. A killed run resumes at its last finished group.
//!
//! The stages, one module each: `run` is the orchestrator (checks, plan,
//! resume, edges, passes, commit); `plan` sizes the chunks and cuts the
//! groups; `edges` buckets the edges and serves a group's; `stream` and
//! `chunk` read a layer's input front to back; `passes` runs the layers
//! over the groups, each group's work a `group` job, aggregated on the host
//! by `sage`, `gat` and `pull`, or on the device by `on_device`;
//! `hidden_rows` writes a hidden layer's rows to the work directory,
//! `output` the last layer's to Parquet; `resume` keeps where a run
//! stands; `layers` holds the model's tensors, `buffer_pool` and
//! `host_tensors` the memory the passes reuse; `naive` is the baseline
//! that reads a row per edge.

use std::path::PathBuf;

use offgnn_shared::dataset::Split;
use serde::{Deserialize, Serialize};
use tch::Device;

use crate::model::ModelKind;

mod buffer_pool;
mod chunk;
mod edges;
mod gat;
mod group;
mod hidden_rows;
mod host_tensors;
mod layers;
mod naive;
mod on_device;
pub(crate) mod output;
mod passes;
mod plan;
mod pull;
pub(crate) mod resume;
pub(crate) mod run;
pub(crate) use run::outputs_of;
mod sage;
mod stream;

pub(crate) use hidden_rows::encode_rows;
pub use naive::{NaiveEstimate, naive_first_layer};
pub use run::infer;
pub(crate) use run::{commit_result, local_dataset};

/// Groups and chunks are whole multiples of this many nodes: a row of d
/// float32 values times 1024 is a multiple of 4 KiB, so every group's and
/// chunk's rows start on a page of the layer files.
pub const ALIGN_NODES: u64 = 1024;

const PAGE: u64 = 4096;

/// How many edges ahead a scatter asks for its destination rows' cache
/// lines (see [`offgnn_shared::prefetch`]).
const SCATTER_AHEAD: usize = 8;

/// The committed result's summary, written last.
pub const COMMIT: &str = "_SUCCESS.json";

/// Which nodes get a row in the output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeSet {
    All,
    Split(Split),
    /// A `.npy` of node ids.
    File(PathBuf),
}

/// Where a graph layer's neighbor aggregation runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Aggregate {
    /// On the host, in place in the group's accumulators (threads over
    /// disjoint destinations); only the dense part runs on the device.
    #[default]
    Host,
    /// With torch's ops on the run's device, the accumulators there (the
    /// default on CUDA, where the host's random scatter would be the
    /// bottleneck).
    Device,
}

/// The optional output columns (node id and predicted class are always
/// there, but for a link-prediction model's, which has no classes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Outputs {
    pub probabilities: bool,
    pub logits: bool,
    /// A node model's last hidden layer's output.
    pub embeddings: bool,
    /// A link-prediction model's output, its embedding (what its scorer
    /// takes), in the column `embedding`; no class column.
    pub link_embedding: bool,
}

impl Outputs {
    /// Whether rows have a predicted class.
    pub fn class(&self) -> bool {
        !self.link_embedding
    }

    /// Whether rows have an `embedding` column (a node model's hidden
    /// layer, or a link model's output).
    pub fn embedding(&self) -> bool {
        self.embeddings || self.link_embedding
    }
}

#[derive(Clone, Debug)]
pub struct InferConfig {
    pub model: String,
    pub dataset: String,
    pub out: String,
    pub nodes: NodeSet,
    pub outputs: Outputs,
    pub device: Device,
    /// Host memory the run may use for its working state.
    pub memory: u64,
    pub work_dir: PathBuf,
    pub overwrite: bool,
    /// The graph as the sampler built it: reverse edges added, self-loops kept.
    pub add_reverse_edges: bool,
    pub keep_self_loops: bool,
    /// Keep repeated edges (the sampler's --keep-duplicate-edges).
    pub keep_duplicate_edges: bool,
    /// Build the graph as the three flags above say even where the model's
    /// card records another one (by default the card's graph is built, and
    /// a flag that contradicts it is refused).
    pub graph_override: bool,
    /// Rows per source chunk (default: from --memory).
    pub chunk_rows: Option<u64>,
    pub show_progress: bool,
    /// Store the hidden layers' outputs in the work directory as float16
    /// (half the disk and I/O; values rounded to nearest even).
    pub hidden_f16: bool,
    pub aggregate: Aggregate,
}

/// One layer's figures.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct LayerFigures {
    pub layer: usize,
    pub in_width: i64,
    pub out_width: i64,
    /// Sequential passes over the layer's input (one per group).
    pub passes: u64,
    /// Bytes of the layer's input read (the feature file or the previous
    /// layer's output), over every pass.
    pub bytes_read: u64,
    /// Bytes of the bucketed edge files read (each group's, once per layer).
    #[serde(default)]
    pub edge_bytes_read: u64,
    pub bytes_written: u64,
    pub seconds: f64,
    /// Of `seconds`: waiting for the next source chunk from the disk.
    pub io_wait_seconds: f64,
    /// Of `seconds`: projecting and scattering source chunks.
    pub scatter_seconds: f64,
    /// Groups done by an earlier, interrupted run.
    pub groups_resumed: u64,
    /// Rows of a source chunk of this layer's stream.
    #[serde(default)]
    pub chunk_rows: u64,
}

/// What `trainer infer` reports, and what `_SUCCESS.json` holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct InferSummary {
    pub format_version: u32,
    /// The run whose parts (named `RUN/part-….parquet`) this commit lists.
    pub run_id: String,
    pub model: String,
    pub architecture: ModelKind,
    pub weights_sha256: String,
    pub dataset: String,
    pub dataset_fingerprint: String,
    pub num_nodes: u64,
    pub edges: u64,
    pub nodes_written: u64,
    pub columns: Vec<String>,
    pub files: Vec<String>,
    pub groups: u64,
    pub chunk_rows: u64,
    /// `OMP_WAIT_POLICY` as the run had it (the binary sets `PASSIVE`
    /// unless the caller chose one; empty for libgomp's default).
    pub omp_wait_policy: String,
    pub memory_limit: u64,
    pub memory_planned: u64,
    pub layers: Vec<LayerFigures>,
    pub edge_bucketing_seconds: f64,
    pub seconds: f64,
    pub device: String,
    /// Where the aggregation ran (host for results committed before the
    /// choice existed).
    #[serde(default)]
    pub aggregate: Aggregate,
    /// Where `--graph-override` built another graph than the model was
    /// trained on: which, and which the model's card records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph_override: Option<String>,
    /// The parts of runs killed before committing, removed at start.
    #[serde(default)]
    pub leftovers_removed: offgnn_shared::lease::Swept,
}
