//! What a training run is asked to do: the model, the device, the epochs
//! and optimizer settings, the pipeline's shape, and where checkpoints,
//! metrics, exports and batch dumps go.

use std::path::PathBuf;

use tch::Device;

use crate::historical::HistoricalConfig;
use crate::model::ModelConfig;
use crate::pipeline::{self, FeatureMode};

#[derive(Clone, Debug)]
pub struct TrainConfig {
    pub model: ModelConfig,
    pub device: Device,
    pub epochs: u32,
    pub lr: f64,
    pub seed: u64,
    pub features: FeatureMode,
    pub pipelined: bool,
    pub queue_depth: usize,
    /// Loader threads of the pipeline (batches whose reads are in flight).
    pub loaders: usize,
    pub metrics: Option<PathBuf>,
    pub checkpoint_dir: Option<PathBuf>,
    pub resume: bool,
    /// Replace an earlier run's checkpoint and metrics file instead of
    /// refusing to start over them.
    pub overwrite: bool,
    /// Progress bars (the binary); quiet for tests.
    pub show_progress: bool,
    /// Train at most this many batches of each epoch (quick checks).
    pub max_batches: Option<usize>,
    /// Also checkpoint after every this many batches inside an epoch.
    pub checkpoint_every: Option<u64>,
    /// Where the trained model goes as safetensors + model.json.
    pub export: Option<ExportTarget>,
    /// FreshGNN's historical embedding cache, off without it.
    pub historical: Option<HistoricalConfig>,
    /// Write a few test batches' blocks, input rows and logits of the
    /// exported model here (for checking the export against another reader).
    pub dump: Option<DumpTarget>,
}

/// `--export`: the best validation epoch's model goes to `location`; with
/// `last`, the last epoch's also goes to `location/last`.
#[derive(Clone, Debug)]
pub struct ExportTarget {
    pub location: String,
    pub overwrite: bool,
    pub last: bool,
}

/// `--dump-batches`: a safetensors file of the first `batches` test batches
/// as the best model sees them.
#[derive(Clone, Debug)]
pub struct DumpTarget {
    pub path: PathBuf,
    pub batches: usize,
}

impl TrainConfig {
    pub fn pipeline_options(&self) -> pipeline::PipelineOptions {
        pipeline::PipelineOptions {
            pipelined: self.pipelined,
            queue_depth: self.queue_depth,
            loaders: self.loaders,
            assemble_between_steps: self.device == Device::Cpu,
        }
    }
}
