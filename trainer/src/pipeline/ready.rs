//! A batch ready for the model step: what the pipeline hands `step`.

use tch::Tensor;

use crate::historical::Plan;
use crate::model::BlockTensors;

/// A batch ready for the model step.
pub struct Ready {
    pub x: Tensor,
    pub blocks: Vec<BlockTensors>,
    /// The seeds' labels (empty in a link-prediction batch).
    pub labels: Tensor,
    /// A link-prediction batch's node pairs among its seeds.
    pub pairs: Option<crate::link::PairTensors>,
    /// The global id of each input row (row `i` of `x` is node `n_id[i]`).
    pub n_id: Vec<u32>,
    pub disk_bytes: u64,
    pub disk_rows: u64,
    pub tiers: [u64; 3],
    /// The batch pruned against the historical cache, when training with it.
    pub plan: Option<Plan>,
}

impl Ready {
    /// What the batch predicts: its seeds' labels, or its pairs.
    pub fn targets(&self) -> i64 {
        self.pairs
            .as_ref()
            .map_or(self.labels.size()[0], |p| p.src.size()[0])
    }
}
