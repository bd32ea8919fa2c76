//! Where a typed inference run stands, in its work directory: edges
//! bucketed, then layer by layer and type by type the groups finished,
//! with the figures so far and the parts written under `--out`. Saved
//! after every group; the same command resumes from it
//! ([`crate::inference::resume`] holds the steps both kinds of run share).

use serde::{Deserialize, Serialize};
use sha2::Digest;

use super::TypedLayerFigures;
use crate::inference::InferConfig;
use crate::inference::resume::{RunProgress, RunRecord};

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct TypedProgress {
    #[serde(flatten)]
    pub(super) run: RunRecord,
    /// The edges bucketed, once every relation's are.
    pub(super) edges: Option<u64>,
    pub(super) edge_bucketing_seconds: f64,
    /// Layers finished.
    pub(super) layer: usize,
    /// Node types of layer `layer` finished.
    pub(super) node_type: usize,
    /// Groups of that type finished.
    pub(super) groups_done: usize,
    pub(super) figures: Vec<TypedLayerFigures>,
    /// Rows written under `--out`, per node type.
    pub(super) written: Vec<u64>,
}

impl RunProgress for TypedProgress {
    fn run(&self) -> &RunRecord {
        &self.run
    }

    fn run_mut(&mut self) -> &mut RunRecord {
        &mut self.run
    }

    fn owns(name: &str) -> bool {
        super::output::is_part(name)
    }

    fn resumed(&mut self) -> Option<String> {
        for f in self.figures.iter_mut() {
            f.groups_resumed = f.groups;
        }
        let begun = self.layer > 0 || self.node_type > 0 || self.groups_done > 0;
        begun.then(|| {
            format!(
                "layer {}, node type {}, {} groups of it done",
                self.layer + 1,
                self.node_type + 1,
                self.groups_done
            )
        })
    }
}

/// The key of a typed run's progress: the model's weights, the dataset
/// (`fingerprint`), each type's groups, whether repeated edges count once,
/// how hidden rows are stored, and the options that shape the output
/// (`--memory` sizes its parts). A run resumes only progress with its key.
pub(super) fn run_key(
    cfg: &InferConfig,
    weights_sha256: &str,
    fingerprint: &str,
    (groups, dedup): (&[Vec<(u64, u64)>], bool),
) -> String {
    let mut h = sha2::Sha256::new();
    h.update(weights_sha256);
    h.update(fingerprint);
    h.update(serde_json::to_vec(groups).expect("groups serialize"));
    h.update(format!(
        "typed{dedup}{}{}{:?}{:?}{:?}",
        cfg.memory, cfg.hidden_f16, cfg.nodes, cfg.outputs, cfg.device
    ));
    offgnn_shared::store::hex(&h.finalize())
}
