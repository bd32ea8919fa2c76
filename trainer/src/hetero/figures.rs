//! What a typed training run reports: each epoch's figures, where its
//! batches' time went, and the run's summary (JSON and the text report).

use std::path::PathBuf;

use serde::Serialize;

use super::{LinearInit, RelationalKind};
use crate::link::RankMetrics;
use crate::pipeline::FeatureMode;

/// One epoch's figures.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct TypedEpoch {
    pub epoch: u32,
    pub loss: f64,
    pub train_accuracy: f64,
    pub valid_accuracy: Option<f64>,
    pub test_accuracy: Option<f64>,
    /// Link prediction: the ranking figures of the validation and test
    /// queries (the accuracies are then the share of pairs scored on
    /// their label's side of 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_rank: Option<RankMetrics>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_rank: Option<RankMetrics>,
    /// Feature bytes the epoch's training batches read from disk.
    pub disk_bytes: u64,
    /// Bytes of the rows they needed from disk, without the rest of the
    /// pages read (`disk_bytes` over this: the read amplification).
    #[serde(default)]
    pub disk_rows_bytes: u64,
    /// Where the training batches' time went.
    #[serde(default)]
    pub stages: StageSeconds,
    /// Training, then evaluation; and the whole epoch.
    pub train_seconds: f64,
    pub eval_seconds: f64,
    pub seconds: f64,
}

/// Seconds an epoch's stages took: the loader's fetches (topology
/// records, each type's tables and disk reads; beside the training thread
/// when pipelined), this thread's wait for them, each batch's assembly
/// and the model's steps (forward, backward, gradients averaged, Adam).
#[derive(Clone, Copy, Debug, Default, Serialize, serde::Deserialize)]
pub struct StageSeconds {
    pub fetch: f64,
    pub wait: f64,
    pub assemble: f64,
    pub step: f64,
}

/// A typed run's figures.
#[derive(Clone, Debug, Serialize)]
pub struct TypedTrainSummary {
    pub model: RelationalKind,
    /// R-SAGE: `--root-weight` and `--init`.
    pub root_weight: bool,
    pub init: LinearInit,
    /// Where the rows came from.
    pub features: FeatureMode,
    /// The ranks that trained it.
    pub world_size: u32,
    pub node_types: Vec<String>,
    pub relations: usize,
    pub parameters: i64,
    pub epochs: Vec<TypedEpoch>,
    /// The epoch of the best validation accuracy, and the test accuracy
    /// then.
    pub best_epoch: Option<u32>,
    pub test_accuracy_at_best: Option<f64>,
    /// Link prediction: the best epoch's validation and test ranking.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_valid_rank: Option<RankMetrics>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_rank_at_best_valid: Option<RankMetrics>,
    /// The exports written (the best epoch's, then the last's).
    pub exports: Vec<String>,
    /// Where `--dump-batches` wrote.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dump: Option<PathBuf>,
    /// Reads in flight per ring, and the most pages between two packed
    /// reads that were read through.
    pub io_depth: u32,
    pub read_through_pages: usize,
    /// `--historical`: the cache's settings and what it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub historical: Option<crate::historical::HistoricalSummary>,
    /// A resumed run's start: the epochs its checkpoint had done, and the
    /// steps of the next.
    pub resumed_from: Option<(u32, u64)>,
    pub seconds: f64,
}
