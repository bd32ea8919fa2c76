//! What the parts of a training run work on: the job they only read (the
//! layout, the I/O engine, the feature sources, the configuration, the
//! ranks), the model being trained, and the record of the run so far.

use offgnn_shared::io_engine::IoEngine;
use tch::nn;

use super::checkpoint::{Best, State};
use super::config::TrainConfig;
use super::metrics::EpochMetrics;
use super::ranks::Ranks;
use crate::historical::Historical;
use crate::layout::Layout;
use crate::link::Scorer;
use crate::model::{self, Adam, Gnn};
use crate::pipeline::Sources;
use crate::test_hooks::TestHooks;

/// What every part of a run reads and none changes.
pub(super) struct Job<'a> {
    pub(super) layout: &'a Layout,
    pub(super) engine: &'a IoEngine,
    pub(super) src: &'a Sources,
    pub(super) cfg: &'a TrainConfig,
    pub(super) ranks: Ranks<'a>,
    /// The ranks whose batches this process trains.
    pub(super) local: Vec<u32>,
    /// The tests' hooks, read as the run starts.
    pub(super) hooks: TestHooks,
    /// FreshGNN's historical embedding cache (`--historical`).
    pub(super) historical: Option<&'a Historical>,
}

impl Job<'_> {
    pub(super) fn manifest(&self) -> &offgnn_manifests::Manifest {
        &self.layout.manifest
    }

    pub(super) fn world(&self) -> u32 {
        self.ranks.world()
    }

    /// Whether the CPU cache follows the batch order (a layout packed with
    /// Belady's policy, read through the layout).
    pub(super) fn cpu_cache_follows(&self) -> bool {
        self.src
            .assemble
            .cpu_rows
            .as_ref()
            .is_some_and(|c| c.follows)
    }

    /// Whether this process writes metrics, checkpoints and exports.
    pub(super) fn writer(&self) -> bool {
        self.ranks.writer()
    }
}

/// The model being trained: its parameters, its forward pass and its
/// optimizer.
pub(super) struct ModelState {
    pub(super) vs: nn::VarStore,
    pub(super) net: Box<dyn Gnn>,
    /// Link prediction: the scorer over pairs of the net's outputs.
    pub(super) scorer: Option<Scorer>,
    pub(super) adam: Adam,
}

impl ModelState {
    /// A fresh model as `cfg` describes it, on its device.
    pub(super) fn new(cfg: &TrainConfig) -> ModelState {
        let vs = nn::VarStore::new(cfg.device);
        let (net, scorer) = model::build_with_scorer(&vs.root(), &cfg.model);
        let adam = Adam::new(&vs, cfg.lr);
        ModelState {
            vs,
            net,
            scorer,
            adam,
        }
    }

    /// What a checkpoint saves of it, with the best epoch's parameters.
    pub(super) fn state<'a>(&'a self, best: Option<&'a Best>) -> State<'a> {
        State {
            vs: &self.vs,
            adam: &self.adam,
            best,
        }
    }
}

/// What the run has done so far.
pub(super) struct RunState {
    /// The completed epochs' figures, a resumed run's earlier ones first.
    pub(super) history: Vec<EpochMetrics>,
    /// The parameters of the best validation epoch so far.
    pub(super) best: Option<Best>,
    /// Training batches this process has trained (not those it resumed).
    pub(super) trained_here: u64,
    /// The `--metrics` file, on the rank that writes it.
    pub(super) metrics_file: Option<std::fs::File>,
}
