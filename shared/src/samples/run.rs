//! The run summary (`run.json`) and the shard summaries: what a run
//! sampled, from which dataset, how, and into which files.

use serde::{Deserialize, Serialize};

use super::{FORMAT, FORMAT_VERSION, RUN_SUMMARY};
use crate::dataset::Split;
use crate::error::{Error, Result};
use crate::store::{Store, WrittenObject};

/// One file of a run, as the run summary lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleFile {
    #[serde(flatten)]
    pub object: WrittenObject,
    pub split: Split,
    pub epoch: u32,
    /// Index of the first batch in the file and how many follow.
    pub first_batch: u32,
    pub batches: u32,
    pub edges: u64,
    pub input_nodes: u64,
}

/// Per-split totals.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SplitCounts {
    pub epochs: u32,
    pub batches_per_epoch: u32,
    pub seeds: u64,
    pub batches: u64,
    pub edges: u64,
    pub input_nodes: u64,
}

/// The identity of the dataset a run was sampled from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetInfo {
    pub name: String,
    pub location: String,
    /// SHA-256 over the metadata, topology, labels and sets (see `fingerprint`).
    pub fingerprint: String,
    /// SHA-256 over the feature file's header, size and sampled contents.
    pub feature_fingerprint: String,
    pub num_nodes: u64,
    pub num_classes: u32,
    pub feature_dim: u64,
    pub feature_dtype: crate::npy::DType,
    pub graph_edges: u64,
    /// A typed graph's node types, in order: each a contiguous range of
    /// the homogenized ids (empty for one node type; `feature_dim`,
    /// `feature_dtype` and `feature_fingerprint` are then the target
    /// type's, or 0, float32 and empty where it has no features).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_types: Vec<NodeTypeInfo>,
    /// A typed graph's relations `src:relation:dst`, in the order of
    /// [`Block::relations`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relations: Vec<String>,
    /// A typed graph's type whose nodes are the seeds (empty for one node
    /// type).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub target_type: String,
    /// A typed graph's link-prediction run: the relation whose pairs it
    /// scores (empty otherwise).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub link_relation: String,
}

/// One node type of a typed graph.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeTypeInfo {
    pub name: String,
    pub num: u64,
    /// Its first homogenized id.
    pub offset: u64,
    /// Its feature file's width, dtype and fingerprint (none: no features).
    pub feature_dim: Option<u64>,
    pub feature_dtype: Option<crate::npy::DType>,
    pub feature_fingerprint: Option<String>,
}

/// How the run was sampled.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// Per layer, input layer first; in a typed graph the most any
    /// relation draws.
    pub fanouts: Vec<usize>,
    /// A typed graph: per layer, each relation's fan-out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relation_fanouts: Vec<Vec<usize>>,
    pub batch_size: usize,
    /// Seeds (a link task's pairs) per validation and test batch, where
    /// it differs from `batch_size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_batch_size: Option<usize>,
    pub epochs: u32,
    pub seed: u64,
    pub batches_per_file: u32,
    pub add_reverse_edges: bool,
    pub dedup_edges: bool,
    pub keep_self_loops: bool,
    /// Link prediction: the batches are the dataset's link_prediction
    /// pairs and queries (absent: node classification).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<LinkParams>,
}

impl SamplingParams {
    /// Seeds (or a link task's pairs) in the run's largest batches: its
    /// training or its evaluation batches'.
    pub fn largest_batch_size(&self) -> usize {
        self.batch_size.max(self.eval_batch_size.unwrap_or(0))
    }
}

/// How a link-prediction run drew its training negatives.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkParams {
    /// Negatives per positive training pair.
    pub negatives: u32,
    /// `uniform` or `degree` (degree^0.75).
    pub negative_sampler: String,
}

/// What one shard of a run wrote.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShardSummary {
    pub format: String,
    pub format_version: u32,
    /// The run this shard belongs to (its objects are named under it).
    #[serde(default)]
    pub run_id: String,
    pub shard: u32,
    pub num_shards: u32,
    pub dataset: DatasetInfo,
    pub params: SamplingParams,
    pub files: Vec<SampleFile>,
    pub seconds: f64,
}

/// `run.json`: the commit point and table of contents of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    pub format: String,
    pub format_version: u32,
    /// The run this commit names (empty for runs from before run ids).
    #[serde(default)]
    pub run_id: String,
    pub dataset: DatasetInfo,
    pub params: SamplingParams,
    pub num_shards: u32,
    pub counts: std::collections::BTreeMap<Split, SplitCounts>,
    /// Every file of the run, sorted by name.
    pub files: Vec<SampleFile>,
    /// Which files each shard wrote (one entry for an unsharded run).
    pub shards: Vec<ShardFiles>,
    /// Wall seconds of the slowest shard.
    pub seconds: f64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardFiles {
    pub shard: u32,
    pub files: Vec<String>,
}

impl RunSummary {
    /// Reads and checks the run summary of a samples location.
    pub fn read(store: &Store) -> Result<RunSummary> {
        let bytes = store.get(RUN_SUMMARY).map_err(|e| match e {
            Error::Store {
                url,
                kind: Some(std::io::ErrorKind::NotFound),
                ..
            } => Error::Store {
                url,
                fault: "no run summary: the sampling run is missing or incomplete".into(),
                kind: Some(std::io::ErrorKind::NotFound),
            },
            other => other,
        })?;
        let origin = format!("{}/{RUN_SUMMARY}", store.url().trim_end_matches('/'));
        let run: RunSummary = serde_json::from_slice(&bytes).map_err(|e| Error::Store {
            kind: None,
            url: origin.clone(),
            fault: format!("malformed run summary: {e}"),
        })?;
        if run.format != FORMAT || !(1..=FORMAT_VERSION).contains(&run.format_version) {
            return Err(Error::Store {
                kind: None,
                url: origin,
                fault: format!(
                    "format {} version {} is not {FORMAT} version 1 to {FORMAT_VERSION}",
                    run.format, run.format_version
                ),
            });
        }
        Ok(run)
    }

    /// The files of one split and epoch, in batch order.
    pub fn files_of(&self, split: Split, epoch: u32) -> Vec<&SampleFile> {
        let mut files: Vec<&SampleFile> = self
            .files
            .iter()
            .filter(|f| f.split == split && f.epoch == epoch)
            .collect();
        files.sort_by_key(|f| f.first_batch);
        files
    }
}
