//! A batch ready for the model step: what the pipeline hands `step`.

use tch::Tensor;

use crate::historical::Plan;
use crate::model::BlockTensors;

/// A batch ready for the model step.
pub struct Ready {
    pub x: Tensor,
    pub blocks: Vec<BlockTensors>,
    pub labels: Tensor,
    pub disk_bytes: u64,
    pub disk_rows: u64,
    pub tiers: [u64; 3],
    /// The batch pruned against the historical cache, when training with it.
    pub plan: Option<Plan>,
}
