//! The training job: epochs over the sampled batches through the pipeline,
//! validation and test accuracy every epoch, checkpoints (every epoch, and
//! every `checkpoint_every` batches within one), per-epoch metrics, and the
//! final report (test accuracy at the best validation epoch).
//!
//! Epoch `t` trains on sampled epoch `t mod E` (E sampled epochs); past the
//! sampled ones, the batch order is reshuffled with a generator of
//! (seed, t), so no two passes see batches in the same order.
//!
//! Resume is exact: dropout draws are seeded per (seed, epoch, position),
//! the optimizer's moments and step are in the checkpoint, and a checkpoint
//! taken inside an epoch records the position and the epoch's running
//! sums, so a resumed run trains every batch once and reports the same
//! losses as one that was never stopped.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use offgnn_manifests::BatchRef;
use offgnn_shared::io_engine::IoEngine;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor, nn};

use crate::distributed::{self, Group};
use crate::error::{Error, Result};
use crate::export;
use crate::layout::Layout;
use crate::model::{self, Adam, ModelConfig};
use crate::pipeline::{
    self, AssembleSources, DeviceTimes, FeatureMode, LoadSources, Ready, Sources, StageTimes,
};

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
    /// Progress bars and a printed row per epoch (the binary); quiet for tests.
    pub show_progress: bool,
    /// Train at most this many batches of each epoch (quick checks).
    pub max_batches: Option<usize>,
    /// Also checkpoint after every this many batches inside an epoch.
    pub checkpoint_every: Option<u64>,
    /// Fail as if killed after this many training batches of this process,
    /// just after any checkpoint due there (tests of resume).
    pub interrupt_after: Option<u64>,
    /// Where the trained model goes as safetensors + model.json.
    pub export: Option<ExportTarget>,
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
        }
    }
}

/// One epoch's figures; also the JSON line written to --metrics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EpochMetrics {
    pub epoch: u32,
    pub sampled_epoch: u32,
    pub batches: u64,
    pub wall_seconds: f64,
    pub train_seconds: f64,
    pub eval_seconds: f64,
    pub stage_busy: StageBusy,
    pub disk_bytes: u64,
    pub disk_rows_bytes: u64,
    pub read_amplification: f64,
    pub hit_gpu: f64,
    pub hit_cpu: f64,
    pub hit_disk: f64,
    pub loss: f64,
    pub train_acc: f64,
    pub valid_acc: f64,
    pub test_acc: f64,
    /// Data-parallel runs: seconds this rank spent in the gradient
    /// all-reduce, and the bytes of gradients it reduced (each step's).
    #[serde(default)]
    pub allreduce_seconds: f64,
    #[serde(default)]
    pub allreduce_bytes: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StageBusy {
    pub load: f64,
    pub assemble: f64,
    pub graph: f64,
    pub model: f64,
    /// On CUDA: each stage's time on the device, from CUDA events (the
    /// host's figures above then count queueing and waiting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceTimes>,
}

impl StageBusy {
    /// These figures with a run of batches' added.
    fn plus(&self, t: &StageTimes) -> StageBusy {
        StageBusy {
            load: self.load + t.load,
            assemble: self.assemble + t.assemble,
            graph: self.graph + t.graph,
            model: self.model + t.model,
            device: match (self.device, t.device) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            },
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct TrainSummary {
    pub epochs: Vec<EpochMetrics>,
    pub best_epoch: u32,
    pub best_valid_acc: f64,
    pub test_acc_at_best_valid: f64,
    pub mean_epoch_seconds_excl_first: f64,
    pub device: String,
    pub io_backend: String,
    pub features: FeatureMode,
    /// How the rows read are stored (the layout's `store_dtype`, or the
    /// feature file's type for the baselines); batches are widened to
    /// float32 before the model.
    pub rows_dtype: String,
    pub pipelined: bool,
    /// (epoch, batches of it done) where this run picked up a checkpoint.
    pub resumed_from: Option<(u32, u64)>,
    /// The exports written: the best epoch's, then the last epoch's if asked.
    pub exports: Vec<export::Written>,
    /// The batch dump written, if asked.
    pub dump: Option<PathBuf>,
    /// Ranks that trained data-parallel (1: one process).
    pub world_size: u32,
    /// Data-parallel runs: the part of the layout this machine's ranks
    /// read (and staged, from a remote layout).
    pub machine_share: Option<MachineShare>,
}

#[derive(Clone, Debug, Serialize)]
pub struct MachineShare {
    pub segments: u32,
    pub of_segments: u32,
    pub bytes: u64,
    pub of_bytes: u64,
}

impl MachineShare {
    pub fn of(m: &offgnn_manifests::Manifest, only: &std::collections::BTreeSet<u32>) -> Self {
        MachineShare {
            segments: only.len() as u32,
            of_segments: m.segments.len() as u32,
            bytes: crate::layout::objects_read(m, Some(only))
                .iter()
                .map(|o| o.size)
                .sum(),
            of_bytes: m.objects.iter().map(|o| o.size).sum(),
        }
    }
}

/// How this process takes part in training.
#[derive(Clone, Copy)]
pub enum Ranks<'a> {
    /// One process, alone.
    One,
    /// One rank of a c10d process group: it trains its share of every
    /// epoch, and gradients are averaged over the group before each step.
    Group(&'a Group),
    /// One process standing in for this many ranks: each step trains every
    /// rank's batch of that step and averages their gradients by hand. The
    /// check that a data-parallel run computes what it should.
    Emulated(u32),
}

impl Ranks<'_> {
    pub fn world(&self) -> u32 {
        match self {
            Ranks::One => 1,
            Ranks::Group(g) => g.world,
            Ranks::Emulated(n) => *n,
        }
    }

    /// The ranks whose batches this process trains.
    fn local(&self) -> Vec<u32> {
        match self {
            Ranks::One => vec![0],
            Ranks::Group(g) => vec![g.rank],
            Ranks::Emulated(n) => (0..*n).collect(),
        }
    }

    /// Whether this process writes metrics, checkpoints and exports.
    pub fn writer(&self) -> bool {
        match self {
            Ranks::Group(g) => g.rank == 0,
            _ => true,
        }
    }

    fn group(&self) -> Option<&Group> {
        match self {
            Ranks::Group(g) => Some(g),
            _ => None,
        }
    }
}

/// What a checkpoint records besides tensors. `checkpoint.json` is the
/// commit point: it names the tensor file written before it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct CheckpointMeta {
    model: ModelConfig,
    manifest_run_sha256: String,
    dataset_fingerprint: String,
    /// The feature file's fingerprint, for exports. Empty in checkpoints
    /// of older trainers.
    #[serde(default)]
    feature_fingerprint: String,
    /// Epochs completed.
    epoch: u32,
    /// Progress inside epoch `epoch`, when taken mid-epoch.
    in_epoch: Option<EpochProgress>,
    history: Vec<EpochMetrics>,
    /// The tensor file (model and optimizer) of this checkpoint.
    tensors: String,
    /// The epoch whose parameters the tensor file also holds as `best.*`:
    /// the best validation so far. Absent in checkpoints of older trainers.
    #[serde(default)]
    best_epoch: Option<u32>,
    #[serde(default)]
    feature_dtype: String,
    /// What else fixes the run's results: a resume must keep them.
    #[serde(default)]
    hyper: Option<Hyper>,
    /// The data-parallel ranks that trained it (absent: one process).
    #[serde(default)]
    world_size: Option<u32>,
}

/// The settings besides the model's shape that a resumed run must share
/// with the run it continues, for resume to be exact.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct Hyper {
    lr: f64,
    seed: u64,
    max_batches: Option<usize>,
}

impl Hyper {
    fn of(cfg: &TrainConfig) -> Self {
        Hyper {
            lr: cfg.lr,
            seed: cfg.seed,
            max_batches: cfg.max_batches,
        }
    }
}

/// What a checkpoint saves of the model: its parameters, the optimizer's
/// state, and the best validation epoch's parameters so far.
#[derive(Clone, Copy)]
struct State<'a> {
    vs: &'a nn::VarStore,
    adam: &'a Adam,
    best: Option<&'a Best>,
}

/// The parameters of the best validation epoch so far.
struct Best {
    epoch: u32,
    valid_acc: f64,
    params: Vec<(String, Tensor)>,
}

/// An epoch's running sums: what a mid-epoch checkpoint must carry for the
/// epoch's figures to come out whole after a resume.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct EpochProgress {
    /// Batches of the epoch's order trained.
    batches: u64,
    loss_sum: f64,
    correct: i64,
    seen: i64,
    disk_bytes: u64,
    disk_rows_bytes: u64,
    tiers: [u64; 3],
    train_seconds: f64,
    stage_busy: StageBusy,
}

const META: &str = "checkpoint.json";

/// Sources shared by the stages: caches loaded once (the GPU cache on the device on CUDA).
pub fn sources(layout: &Layout, engine: &IoEngine, cfg: &TrainConfig) -> Result<Sources> {
    let m = &layout.manifest;
    // The layout's rows may be stored narrower than the feature file's (the
    // packer's --store-dtype); the baselines read the feature file itself.
    // Either way the assembly stage widens the batch to float32 on the device.
    let (dtype, row_bytes) = match cfg.features {
        FeatureMode::Packed => (m.dataset.store_dtype(), m.dataset.store_row_bytes()),
        FeatureMode::Naive | FeatureMode::Memory => {
            (m.dataset.feature_dtype.as_str(), m.dataset.row_bytes)
        }
    };
    let kind = match dtype {
        "float32" => Kind::Float,
        "float16" => Kind::Half,
        "bfloat16" => Kind::BFloat16,
        other => {
            return Err(Error::Layout(format!(
                "feature dtype {other} is not supported"
            )));
        }
    };
    let dim = m.dataset.feature_dim as i64;
    let on_cpu = cfg.device == Device::Cpu;
    // The caches stay plain host rows, but on CUDA the GPU cache goes to
    // the device (DiskGNN §4). The CPU cache is not page-locked: assembly
    // gathers its rows into small page-locked staging buffers instead.
    let cache = |t: &offgnn_manifests::Tier| -> Result<Option<Vec<u8>>> {
        t.object
            .as_ref()
            .map(|object| layout.read_cache(object, t.rows))
            .transpose()
    };
    let tensor = |bytes: &[u8], rows: u64| -> Result<Tensor> {
        Ok(Tensor::f_from_data_size(bytes, &[rows as i64, dim], kind)?)
    };
    let mut load = LoadSources {
        mode: cfg.features,
        row_bytes: row_bytes as usize,
        raw: None,
        raw_tail: None,
    };
    let mut asm = AssembleSources {
        mode: cfg.features,
        device: cfg.device,
        kind,
        dim,
        row_bytes: row_bytes as usize,
        gpu_cache: None,
        gpu_rows: None,
        cpu_rows: None,
        all_rows: None,
    };
    match cfg.features {
        FeatureMode::Packed => {
            let (gpu, cpu) = (cache(&m.gpu_cache)?, cache(&m.cpu_cache)?);
            asm.cpu_rows = cpu.map(Arc::new);
            if on_cpu {
                asm.gpu_rows = gpu.map(Arc::new);
            } else {
                // Fallible: a GPU cache beyond the device's free memory is
                // an error that names the tier, not a panic.
                let rows = m.gpu_cache.rows;
                asm.gpu_cache = gpu
                    .map(|b| {
                        tensor(&b, rows)?.f_to_device(cfg.device).map_err(|e| {
                            Error::Layout(format!(
                                "the GPU cache ({rows} rows, {}) does not fit on {:?}: {e}; pack with a smaller --gpu-cache budget",
                                offgnn_shared::report::human_bytes(rows * row_bytes),
                                cfg.device,
                            ))
                        })
                    })
                    .transpose()?;
            }
        }
        FeatureMode::Naive | FeatureMode::Memory => {
            let path = PathBuf::from(&m.dataset.feature_location);
            let npy = offgnn_shared::npy::NpyFile::open(&path)?;
            if offgnn_shared::dataset::file_fingerprint(&path)? != m.dataset.feature_fingerprint {
                return Err(Error::Layout(format!(
                    "{}: not the feature file this layout was packed from",
                    path.display()
                )));
            }
            if cfg.features == FeatureMode::Naive {
                load.raw = Some((engine.open(&path)?, npy.header().data_offset));
                load.raw_tail =
                    Some(std::fs::File::open(&path).map_err(|e| Error::io(path.display(), e))?);
            } else {
                let n = m.dataset.num_nodes;
                let mut bytes = vec![0u8; (n * m.dataset.row_bytes) as usize];
                npy.read_data_at(0, &mut bytes)?;
                asm.all_rows = Some(Arc::new(bytes));
            }
        }
    }
    let src = Sources {
        load,
        assemble: asm,
    };
    Ok(src)
}

/// The batch's correct predictions, as an int64 scalar on the device (read
/// back once per epoch, not once per batch: on CUDA a read is a sync).
fn correct(logits: &Tensor, labels: &Tensor) -> Tensor {
    logits.argmax(-1, false).eq_tensor(labels).sum(Kind::Int64)
}

/// An epoch's loss sum and correct count, kept on the device so that a step
/// need not wait for them, and the last loss that was NaN or infinite.
/// Both sums start at the progress a resume restored and add in batch
/// order, exactly as the host summed them before.
struct DeviceSums {
    loss: Tensor,
    correct: Tensor,
    bad_loss: Tensor,
}

impl DeviceSums {
    fn new(p: &EpochProgress, device: Device) -> DeviceSums {
        DeviceSums {
            loss: Tensor::from(p.loss_sum).to_device(device),
            correct: Tensor::from(p.correct).to_device(device),
            bad_loss: Tensor::from(0f32).to_device(device),
        }
    }

    fn add(&mut self, loss: &Tensor, logits: &Tensor, labels: &Tensor) {
        tch::no_grad(|| {
            let loss = loss.detach();
            let _ = self.loss.g_add_(&loss.to_kind(Kind::Double));
            let _ = self.correct.g_add_(&correct(logits, labels));
            // Where the loss is finite keep the last bad one, else take it.
            self.bad_loss = self.bad_loss.where_self(&loss.isfinite(), &loss);
        })
    }

    /// Whether a loss was NaN or infinite, as a device flag.
    fn loss_diverged(&self) -> Tensor {
        self.bad_loss.isfinite().logical_not()
    }

    /// Reads the sums into `p` (a sync on CUDA).
    fn store(&self, p: &mut EpochProgress) {
        p.loss_sum = self.loss.double_value(&[]);
        p.correct = self.correct.int64_value(&[]);
    }
}

/// Training order of epoch `t`.
fn epoch_order(schedule: &[Vec<BatchRef>], t: u32, seed: u64) -> (u32, Vec<BatchRef>) {
    let sampled = t % schedule.len() as u32;
    let mut order = schedule[sampled as usize].clone();
    if t as usize >= schedule.len() {
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(seed ^ (0x0E90_C000 + t as u64));
        order.shuffle(&mut rng);
    }
    (sampled, order)
}

/// The seed of the dropout draws of the batch at `position` of epoch `t`.
fn batch_seed(seed: u64, t: u32, position: u64) -> i64 {
    let mut x = seed ^ 0x5EED_0000_0000_0000 ^ ((t as u64) << 32) ^ position;
    // splitmix64's finaliser: nearby inputs give unrelated seeds.
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (x ^ (x >> 31)) as i64
}

/// Where a run starts: completed epochs, progress inside the next.
struct Start {
    history: Vec<EpochMetrics>,
    in_epoch: Option<EpochProgress>,
    resumed_from: Option<(u32, u64)>,
    best: Option<Best>,
}

impl Start {
    fn fresh() -> Self {
        Start {
            history: Vec::new(),
            in_epoch: None,
            resumed_from: None,
            best: None,
        }
    }
}

/// Loads the checkpoint in `dir` into the model and optimizer, after
/// checking that it belongs to this model and this layout.
fn resume(
    dir: &Path,
    vs: &nn::VarStore,
    adam: &mut Adam,
    cfg: &TrainConfig,
    m: &offgnn_manifests::Manifest,
    world: u32,
) -> Result<Start> {
    let meta_path = dir.join(META);
    if !meta_path.exists() {
        tracing::info!("no checkpoint in {}: starting from scratch", dir.display());
        return Ok(Start::fresh());
    }
    let bytes = std::fs::read(&meta_path).map_err(|e| Error::io(meta_path.display(), e))?;
    let meta: CheckpointMeta = serde_json::from_slice(&bytes).map_err(|e| {
        Error::Checkpoint(format!(
            "{}: malformed checkpoint: {e}",
            meta_path.display()
        ))
    })?;
    if meta.model != cfg.model {
        return Err(Error::Checkpoint(format!(
            "{}: the checkpoint is of another model ({:?}, hidden {}, {} layers), not {:?} hidden {}, {} layers",
            dir.display(),
            meta.model.kind,
            meta.model.hidden,
            meta.model.layers,
            cfg.model.kind,
            cfg.model.hidden,
            cfg.model.layers
        )));
    }
    if meta.manifest_run_sha256 != m.samples.run_sha256
        || meta.dataset_fingerprint != m.dataset.dataset_fingerprint
    {
        return Err(Error::Checkpoint(format!(
            "{}: the checkpoint was trained on another layout (other samples or dataset)",
            dir.display()
        )));
    }
    let saved_world = meta.world_size.unwrap_or(1);
    if saved_world != world {
        return Err(Error::Checkpoint(format!(
            "{}: the checkpoint was taken by a run of {saved_world} rank(s), and this run has {world}: ranks are dealt their shares of each epoch by the world size, so resume with {saved_world} (torchrun --nproc-per-node, or srun --ntasks), or start a new run with --overwrite",
            dir.display()
        )));
    }
    if let Some(saved) = &meta.hyper {
        let now = Hyper::of(cfg);
        let mut changed = Vec::new();
        if saved.lr != now.lr {
            changed.push(format!("--lr {:?} (now {:?})", saved.lr, now.lr));
        }
        if saved.seed != now.seed {
            changed.push(format!("--seed {} (now {})", saved.seed, now.seed));
        }
        if saved.max_batches != now.max_batches {
            changed.push(format!(
                "batches per epoch capped at {:?} (now {:?})",
                saved.max_batches, now.max_batches
            ));
        }
        if !changed.is_empty() {
            return Err(Error::Checkpoint(format!(
                "{}: the checkpoint's run used {}; a resume continues the same run, so pass the same settings, or start a new run with --overwrite",
                dir.display(),
                changed.join(", ")
            )));
        }
    }
    let tensors = tensor_file(dir, &meta)?;
    let named = load_tensors(&tensors, cfg.device)?;
    export::load_into(
        vs,
        &with_prefix(&named, "model."),
        &tensors.display().to_string(),
    )?;
    let best = best_of(&meta, &named, &tensors)?;
    adam.load_state(&named)
        .map_err(|e| Error::Checkpoint(format!("{}: {e}", tensors.display())))?;
    let position = meta.in_epoch.as_ref().map_or(0, |p| p.batches);
    tracing::info!(
        "resumed from {} at epoch {}, batch {position}",
        dir.display(),
        meta.epoch
    );
    Ok(Start {
        history: meta.history,
        in_epoch: meta.in_epoch,
        resumed_from: Some((meta.epoch, position)),
        best,
    })
}

/// The tensor file a checkpoint's metadata names, which must be in `dir`.
fn tensor_file(dir: &Path, meta: &CheckpointMeta) -> Result<PathBuf> {
    let tensors = dir.join(&meta.tensors);
    if meta.tensors.contains('/') || !tensors.exists() {
        return Err(Error::Checkpoint(format!(
            "{}: names tensor file {:?}, which is not in {}",
            dir.join(META).display(),
            meta.tensors,
            dir.display()
        )));
    }
    Ok(tensors)
}

/// A checkpoint's tensor file, by name.
fn load_tensors(path: &Path, device: Device) -> Result<HashMap<String, Tensor>> {
    Ok(Tensor::load_multi_with_device(path, device)
        .map_err(|e| Error::Checkpoint(format!("{}: {e}", path.display())))?
        .into_iter()
        .collect())
}

/// The tensors named `prefix` + name, by name.
fn with_prefix(named: &HashMap<String, Tensor>, prefix: &str) -> HashMap<String, Tensor> {
    named
        .iter()
        .filter_map(|(k, v)| {
            k.strip_prefix(prefix)
                .map(|name| (name.to_string(), v.shallow_clone()))
        })
        .collect()
}

/// The best epoch's parameters that a checkpoint holds, if it names one.
fn best_of(
    meta: &CheckpointMeta,
    named: &HashMap<String, Tensor>,
    tensors: &Path,
) -> Result<Option<Best>> {
    let Some(epoch) = meta.best_epoch else {
        return Ok(None);
    };
    let valid_acc = meta
        .history
        .get(epoch as usize)
        .map(|e| e.valid_acc)
        .ok_or_else(|| {
            Error::Checkpoint(format!(
                "{}: names best epoch {epoch}, which its history lacks",
                tensors.display()
            ))
        })?;
    let mut params: Vec<(String, Tensor)> = with_prefix(named, "best.model.")
        .into_iter()
        .map(|(k, v)| (k, v.to_device(Device::Cpu)))
        .collect();
    params.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Some(Best {
        epoch,
        valid_acc,
        params,
    }))
}

/// Trains as configured on an opened layout, as one process.
pub fn train(layout: &Layout, engine: &IoEngine, cfg: &TrainConfig) -> Result<TrainSummary> {
    train_ranks(layout, engine, cfg, Ranks::One, None)
}

/// The positions into epoch `t`'s order (of `n` batches) that `rank` trains,
/// one per step. One process trains the whole order (shuffled past the
/// sampled epochs by [`epoch_order`]); ranks of a larger world are dealt
/// contiguous shares of the sampled order ([`distributed::deal`]), each
/// shuffled on its own past the sampled epochs.
fn rank_positions(
    n: usize,
    world: u32,
    rank: u32,
    t: u32,
    sampled: usize,
    seed: u64,
) -> Vec<usize> {
    if world == 1 {
        return (0..n).collect();
    }
    let mut share = distributed::deal(n, world as usize, rank as usize);
    if t as usize >= sampled {
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(
            seed ^ (0x0E90_C000 + t as u64) ^ ((rank as u64 + 1) << 40),
        );
        share.shuffle(&mut rng);
    }
    share
}

/// The segments that `ranks` of a world of `world` read in a run: their
/// shares of every sampled epoch's training batches (later epochs reuse
/// them) and of the evaluation batches. A machine stages only these.
pub fn segments_read(
    m: &offgnn_manifests::Manifest,
    ranks: std::ops::Range<u32>,
    world: u32,
    max_batches: Option<usize>,
) -> std::collections::BTreeSet<u32> {
    let mut read = std::collections::BTreeSet::new();
    for rank in ranks {
        for epoch in m.schedule.get("train").into_iter().flatten() {
            let n = max_batches.map_or(epoch.len(), |k| k.min(epoch.len()));
            // A share's set of batches, whatever order it trains them in.
            for pos in distributed::deal(n, world as usize, rank as usize) {
                read.insert(epoch[pos].segment);
            }
        }
        for split in ["valid", "test"] {
            if let Some(refs) = m.schedule.get(split).and_then(|e| e.first()) {
                let part = distributed::eval_share(refs.len(), world as usize, rank as usize);
                read.extend(refs[part].iter().map(|b| b.segment));
            }
        }
    }
    read
}

/// The flattened gradients of `params` (zeros where a parameter has none),
/// with `flags` after them.
fn flat_grads(params: &[(String, Tensor)], flags: &Tensor) -> Tensor {
    let mut parts: Vec<Tensor> = params
        .iter()
        .map(|(_, p)| {
            let g = p.grad();
            if g.defined() {
                g.flatten(0, -1)
            } else {
                p.zeros_like().flatten(0, -1)
            }
        })
        .collect();
    parts.push(flags.shallow_clone());
    Tensor::cat(&parts, 0)
}

/// The boolean device scalars `flags`, and whether any gradient is NaN or
/// infinite, read back in one copy (on CUDA the step's one sync).
fn read_flags(params: &[(String, Tensor)], flags: &[Tensor]) -> Result<(Vec<bool>, bool)> {
    let all = tch::no_grad(|| {
        let bad_grads = params
            .iter()
            .map(|(_, p)| p.grad())
            .filter(Tensor::defined)
            .map(|g| g.isfinite().logical_not().any())
            .reduce(|a, b| a.logical_or(&b));
        let mut all: Vec<Tensor> = flags.iter().map(|f| f.reshape([1])).collect();
        if let Some(b) = bad_grads {
            all.push(b.reshape([1]));
        }
        Tensor::cat(&all, 0).to_kind(Kind::Uint8)
    });
    let mut read: Vec<bool> = Vec::<u8>::try_from(all.to_device(Device::Cpu))?
        .into_iter()
        .map(|v| v != 0)
        .collect();
    let bad_grads = read.len() > flags.len() && read.pop() == Some(true);
    Ok((read, bad_grads))
}

/// Writes the parameters after step `step` to `dir/rank{rank}/` (the
/// data-parallel test compares ranks bit for bit, and against a run that
/// averages the ranks' gradients by hand).
fn trace_params(dir: &Path, rank: u32, epoch: u32, step: u64, adam: &Adam) -> Result<()> {
    let dir = dir.join(format!("rank{rank}"));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(dir.display(), e))?;
    let path = dir.join(format!("e{epoch:03}-s{step:06}.safetensors"));
    let named: Vec<(String, Tensor)> = adam
        .params()
        .iter()
        .map(|(k, v)| (k.clone(), v.to_device(Device::Cpu)))
        .collect();
    Tensor::write_safetensors(&named, &path)
        .map_err(|e| Error::Checkpoint(format!("writing {}: {e}", path.display())))
}

/// Running sums that ranks add up: an epoch's figures, or a checkpoint's.
/// The collectives' tensors live on the training `device` (NCCL reduces
/// device tensors only).
fn summed(p: &EpochProgress, ranks: Ranks, device: Device) -> Result<EpochProgress> {
    let Some(g) = ranks.group() else {
        return Ok(p.clone());
    };
    let v = g.sum_f64(
        &[
            p.loss_sum,
            p.correct as f64,
            p.seen as f64,
            p.disk_bytes as f64,
            p.disk_rows_bytes as f64,
            p.tiers[0] as f64,
            p.tiers[1] as f64,
            p.tiers[2] as f64,
        ],
        device,
    )?;
    Ok(EpochProgress {
        loss_sum: v[0],
        correct: v[1] as i64,
        seen: v[2] as i64,
        disk_bytes: v[3] as u64,
        disk_rows_bytes: v[4] as u64,
        tiers: [v[5] as u64, v[6] as u64, v[7] as u64],
        ..p.clone()
    })
}

/// Where training starts, as rank 0 decides it: refusals before any work
/// (a checkpoint or metrics file not to be replaced, an export target), the
/// checkpoint resumed. The other ranks only learn the outcome.
fn start_of(
    cfg: &TrainConfig,
    vs: &nn::VarStore,
    adam: &mut Adam,
    m: &offgnn_manifests::Manifest,
    world: u32,
) -> Result<Start> {
    let start = match (&cfg.checkpoint_dir, cfg.resume) {
        (Some(dir), true) => resume(dir, vs, adam, cfg, m, world)?,
        (None, true) => {
            return Err(Error::InvalidArgument(
                "--resume needs --checkpoint-dir".into(),
            ));
        }
        (Some(dir), false) => {
            if dir.join(META).exists() && !cfg.overwrite {
                return Err(Error::InvalidArgument(format!(
                    "{}: holds a checkpoint of an earlier run; pass --resume to continue it or --overwrite to start afresh",
                    dir.display()
                )));
            }
            Start::fresh()
        }
        (None, false) => Start::fresh(),
    };
    if let Some(path) = &cfg.metrics
        && !cfg.resume
        && !cfg.overwrite
        && std::fs::metadata(path).is_ok_and(|md| md.len() > 0)
    {
        return Err(Error::InvalidArgument(format!(
            "{}: the metrics file exists; pass --overwrite to replace it (or --resume to append to it)",
            path.display()
        )));
    }
    if let Some(x) = &cfg.export {
        // Refused before any training, not after it: the last epoch's
        // export too, or an occupied `last/` would fail the run after the
        // best export had committed.
        export::check_target(&x.location, x.overwrite)?;
        if x.last {
            let last = offgnn_shared::store::Store::open(&x.location)?.join("last");
            export::check_target(&last, x.overwrite)?;
        }
    }
    Ok(start)
}

/// Gives every rank rank 0's start: whether it could start at all, then
/// where (epoch, batch), then its parameters and optimizer state, as
/// DistributedDataParallel broadcasts a model at its start.
fn share_start(
    g: &Group,
    decided: Result<Start>,
    adam: &mut Adam,
    device: Device,
) -> Result<Start> {
    let header = match &decided {
        Ok(s) => vec![
            1,
            s.history.len() as i64,
            s.in_epoch.as_ref().map_or(-1, |p| p.batches as i64),
        ],
        Err(_) => vec![0, 0, -1],
    };
    let h = Tensor::from_slice(&header).to_device(device);
    g.broadcast(&h, 0)?;
    let header = Vec::<i64>::try_from(h.to_device(Device::Cpu))?;
    if header[0] == 0 {
        return match decided {
            Err(e) => Err(e),
            Ok(_) => Err(Error::Distributed(format!(
                "rank {} of {}: rank 0 could not start the run; its message says why",
                g.rank, g.world
            ))),
        };
    }
    tch::no_grad(|| -> Result<()> {
        for (_, p) in adam.params() {
            g.broadcast(p, 0)?;
        }
        for (name, t) in adam.state() {
            if name == "adam.step" {
                continue;
            }
            g.broadcast(&t, 0)?;
        }
        Ok(())
    })?;
    let step = Tensor::from_slice(&[adam.step]).to_device(device);
    g.broadcast(&step, 0)?;
    adam.step = step.int64_value(&[0]);
    match decided {
        Ok(s) if g.rank == 0 => Ok(s),
        _ => Ok(Start {
            history: vec![EpochMetrics::default(); header[1] as usize],
            in_epoch: (header[2] >= 0).then(|| EpochProgress {
                batches: header[2] as u64,
                ..Default::default()
            }),
            resumed_from: (header[1] > 0 || header[2] > 0)
                .then_some((header[1] as u32, header[2].max(0) as u64)),
            best: None,
        }),
    }
}

/// Trains as configured on an opened layout, as `ranks` says: one process,
/// one rank of a data-parallel group, or one process standing in for
/// several ranks. `trace` writes every step's parameters there.
pub fn train_ranks(
    layout: &Layout,
    engine: &IoEngine,
    cfg: &TrainConfig,
    ranks: Ranks,
    trace: Option<&Path>,
) -> Result<TrainSummary> {
    let m = &layout.manifest;
    let schedule = m
        .schedule
        .get("train")
        .filter(|s| !s.is_empty())
        .ok_or_else(|| Error::Layout("the layout has no training batches".into()))?;
    let eval_sets: Vec<(&str, Vec<BatchRef>)> = ["valid", "test"]
        .iter()
        .map(|s| {
            (
                *s,
                m.schedule
                    .get(*s)
                    .and_then(|e| e.first())
                    .cloned()
                    .unwrap_or_default(),
            )
        })
        .collect();
    if cfg.checkpoint_every == Some(0) {
        return Err(Error::InvalidArgument(
            "--checkpoint-every must be at least 1".into(),
        ));
    }
    let world = ranks.world();
    let writer = ranks.writer();
    let local = ranks.local();
    // One run at a time writes a checkpoint directory: held until this
    // run ends, so a second trainer on it is refused before it writes.
    let _held = cfg
        .checkpoint_dir
        .as_deref()
        .filter(|_| writer)
        .map(|dir| {
            offgnn_shared::commit::hold_dir(
                dir,
                "another trainer is writing checkpoints here; wait for it to end or choose another --checkpoint-dir",
            )
        })
        .transpose()?;
    tch::manual_seed(cfg.seed as i64);
    let vs = nn::VarStore::new(cfg.device);
    let net = model::build(&vs.root(), &cfg.model);
    let mut adam = Adam::new(&vs, cfg.lr);
    let src = sources(layout, engine, cfg)?;

    let decided = if writer {
        start_of(cfg, &vs, &mut adam, m, world)
    } else {
        Ok(Start::fresh())
    };
    let start = match ranks.group() {
        Some(g) => share_start(g, decided, &mut adam, cfg.device)?,
        None => decided?,
    };
    let mut history = start.history;
    let mut best_so_far = start.best;
    let mut in_epoch = start.in_epoch;
    let mut metrics_file = match cfg.metrics.as_ref().filter(|_| writer) {
        Some(p) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(cfg.resume)
                .write(true)
                .truncate(!cfg.resume)
                .open(p)
                .map_err(|e| Error::io(p.display(), e))?,
        ),
        None => None,
    };

    let mut trained_here = 0u64;
    let first_epoch = history.len() as u32;
    if cfg.epochs as usize > schedule.len() && writer {
        tracing::info!(
            "{} epochs over {} sampled: epochs {}..{} reuse the sampled batches, in a new order each epoch",
            cfg.epochs,
            schedule.len(),
            schedule.len(),
            cfg.epochs - 1
        );
    }
    for t in first_epoch..cfg.epochs {
        let started = Instant::now();
        let (sampled, mut order) = if world == 1 {
            epoch_order(schedule, t, cfg.seed)
        } else {
            let sampled = t % schedule.len() as u32;
            (sampled, schedule[sampled as usize].clone())
        };
        if let Some(k) = cfg.max_batches {
            order.truncate(k);
        }
        // Each local rank's positions into `order`, one per step.
        let shares: Vec<Vec<usize>> = local
            .iter()
            .map(|&r| rank_positions(order.len(), world, r, t, schedule.len(), cfg.seed))
            .collect();
        let steps = shares.first().map_or(0, Vec::len);
        let mut p = in_epoch.take().unwrap_or_default();
        let skip = (p.batches as usize).min(steps);
        // The batches in the order this process trains them: step by step,
        // each local rank's batch of the step.
        let mine: Vec<(BatchRef, usize)> = (skip..steps)
            .flat_map(|s| shares.iter().map(move |share| share[s]))
            .map(|pos| (order[pos], pos))
            .collect();
        let refs: Vec<BatchRef> = mine.iter().map(|(b, _)| *b).collect();
        let pb = if cfg.show_progress && writer {
            let pb = offgnn_shared::progress::bar(steps as u64, &format!("epoch {t}"), "steps");
            pb.set_position(skip as u64);
            pb
        } else {
            indicatif::ProgressBar::hidden()
        };
        let times_before = p.stage_busy.clone();
        let seconds_before = p.train_seconds;
        let mut k = 0usize;
        let mut sums = DeviceSums::new(&p, cfg.device);
        let (mut reduce_seconds, mut reduce_bytes) = (0f64, 0u64);
        let times = pipeline::run_batches(
            layout,
            engine,
            &src,
            &refs,
            cfg.pipeline_options(),
            |r: Ready| {
                let j = k % local.len();
                let position = mine[k].1;
                k += 1;
                if j == 0 {
                    adam.zero_grad();
                }
                // Dropout draws follow the batch's place in the epoch's
                // order, whichever rank trains it.
                tch::manual_seed(batch_seed(cfg.seed, t, position as u64));
                let logits = net.forward(&r.x, &r.blocks, true);
                let loss = logits.cross_entropy_for_logits(&r.labels);
                // No read-back here: a NaN or infinite loss is caught with
                // the gradients, once per step, before the optimizer runs.
                loss.backward();
                sums.add(&loss, &logits, &r.labels);
                p.seen += r.labels.size()[0];
                p.disk_bytes += r.disk_bytes;
                p.disk_rows_bytes += r.disk_rows * src.load.row_bytes as u64;
                for (a, b) in p.tiers.iter_mut().zip(r.tiers) {
                    *a += b;
                }
                if j + 1 < local.len() {
                    return Ok(());
                }
                // The step: every rank's gradient of it, averaged.
                let signal = offgnn_shared::signals::received();
                let mut stop = signal.is_some();
                // Device flags, read back with the gradients' check: this
                // rank's loss turned NaN or infinite; then, in a group, any
                // rank's did, and any rank was signalled.
                let mut flags = vec![sums.loss_diverged()];
                match ranks {
                    Ranks::One => {}
                    Ranks::Emulated(n) => tch::no_grad(|| {
                        for (_, w) in adam.params() {
                            let mut g = w.grad();
                            if g.defined() {
                                let _ = g.divide_scalar_(n as f64);
                            }
                        }
                    }),
                    Ranks::Group(g) => {
                        let reduce_started = Instant::now();
                        let params = adam.params();
                        let device = params[0].1.device();
                        let signalled = Tensor::from_slice(&[f32::from(u8::from(stop))]);
                        let mine = Tensor::cat(
                            &[
                                flags[0].to_kind(Kind::Float).reshape([1]),
                                signalled.to_device(device),
                            ],
                            0,
                        );
                        let flat = flat_grads(params, &mine);
                        g.all_reduce_sum(&flat)?;
                        let n = flat.size()[0];
                        flags.push(flat.narrow(0, n - 2, 1).gt(0.0));
                        flags.push(flat.narrow(0, n - 1, 1).gt(0.0));
                        tch::no_grad(|| {
                            let flat = flat.divide_scalar(world as f64);
                            let mut offset = 0;
                            for (_, w) in params {
                                let len = w.numel() as i64;
                                let mut g = w.grad();
                                if g.defined() {
                                    g.copy_(&flat.narrow(0, offset, len).view_as(&g));
                                }
                                offset += len;
                            }
                        });
                        reduce_seconds += reduce_started.elapsed().as_secs_f64();
                        reduce_bytes += (n as u64) * 4;
                    }
                }
                // A finite loss can still give an infinite or NaN gradient
                // (an overflow in the backward pass); after the all-reduce
                // every rank holds the same gradients, so all agree.
                let (read, bad_grads) = read_flags(adam.params(), &flags)?;
                let loss_here = read[0];
                let loss_anywhere = read.get(1).copied().unwrap_or(loss_here);
                if let Some(&s) = read.get(2) {
                    stop = s;
                }
                // A diverged run stops before the step that would spread
                // NaN into every parameter; the last checkpoint stays.
                if loss_anywhere || bad_grads {
                    return Err(Error::Diverged {
                        epoch: t,
                        batch: p.batches,
                        what: if loss_here {
                            format!("the loss became {}", sums.bad_loss.double_value(&[]))
                        } else if loss_anywhere {
                            "the loss became NaN or infinite on another rank".into()
                        } else {
                            "a gradient became NaN or infinite".into()
                        },
                        kept: cfg
                            .checkpoint_dir
                            .as_ref()
                            .filter(|d| d.join(META).exists())
                            .map(|d| d.display().to_string()),
                    });
                }
                adam.step();
                p.batches += 1;
                pb.inc(1);
                trained_here += 1;
                if let Some(dir) = trace {
                    trace_params(dir, local[0], t, p.batches, &adam)?;
                }
                // A checkpoint of this step: every rank adds its sums in,
                // rank 0 writes it.
                let keep = |p: &mut EpochProgress, dir: &Path| -> Result<()> {
                    sums.store(p);
                    p.train_seconds = seconds_before + started.elapsed().as_secs_f64();
                    let all = summed(p, ranks, cfg.device)?;
                    if writer {
                        let state = State {
                            vs: &vs,
                            adam: &adam,
                            best: best_so_far.as_ref(),
                        };
                        save_checkpoint(dir, &state, cfg, m, &history, Some(&all), world)?;
                    }
                    Ok(())
                };
                if let (Some(dir), Some(every)) = (&cfg.checkpoint_dir, cfg.checkpoint_every)
                    && p.batches % every == 0
                    && (p.batches as usize) < steps
                {
                    keep(&mut p, dir)?;
                }
                if cfg.interrupt_after == Some(trained_here) {
                    return Err(Error::Interrupted(trained_here));
                }
                // SIGINT or SIGTERM (on any rank): stop at this step's
                // boundary, keeping a checkpoint of it when there is a
                // checkpoint directory. (At the epoch's last step the epoch
                // ends first and its own checkpoint is kept, below.)
                if stop && (p.batches as usize) < steps {
                    let kept = match &cfg.checkpoint_dir {
                        Some(dir) => {
                            keep(&mut p, dir)?;
                            format!(
                                "checkpoint of that step written to {}; run again with --resume to continue",
                                dir.display()
                            )
                        }
                        None => "no --checkpoint-dir, so nothing of this run was kept".into(),
                    };
                    return Err(Error::Stopped(format!(
                        "stopped by {} at epoch {t}, batch {}: {kept}",
                        signal.map_or_else(
                            || "a signal to another rank".to_string(),
                            |s| s.to_string()
                        ),
                        p.batches
                    )));
                }
                Ok(())
            },
        )?;
        pb.finish_and_clear();
        sums.store(&mut p);
        let all = summed(&p, ranks, cfg.device)?;
        let mut e = EpochMetrics {
            epoch: t,
            sampled_epoch: sampled,
            batches: p.batches * world as u64,
            ..Default::default()
        };
        e.train_seconds = seconds_before + started.elapsed().as_secs_f64();
        e.stage_busy = times_before.plus(&times);
        e.loss = all.loss_sum / e.batches.max(1) as f64;
        e.train_acc = all.correct as f64 / all.seen.max(1) as f64;
        e.disk_bytes = all.disk_bytes;
        e.disk_rows_bytes = all.disk_rows_bytes;
        e.read_amplification = if all.disk_rows_bytes == 0 {
            1.0
        } else {
            all.disk_bytes as f64 / all.disk_rows_bytes as f64
        };
        let total: u64 = all.tiers.iter().sum::<u64>().max(1);
        (e.hit_gpu, e.hit_cpu, e.hit_disk) = (
            all.tiers[0] as f64 / total as f64,
            all.tiers[1] as f64 / total as f64,
            all.tiers[2] as f64 / total as f64,
        );
        e.allreduce_seconds = reduce_seconds;
        e.allreduce_bytes = reduce_bytes;

        let eval_started = Instant::now();
        for (name, refs) in &eval_sets {
            let (mut right, mut n) = (Tensor::from(0i64).to_device(cfg.device), 0i64);
            // Each rank evaluates its part; one process all of them.
            let part = match ranks.group() {
                Some(g) => {
                    &refs[distributed::eval_share(refs.len(), world as usize, g.rank as usize)]
                }
                None => &refs[..],
            };
            tch::no_grad(|| {
                pipeline::run_batches(
                    layout,
                    engine,
                    &src,
                    part,
                    cfg.pipeline_options(),
                    |r: Ready| {
                        let logits = net.forward(&r.x, &r.blocks, false);
                        let _ = right.g_add_(&correct(&logits, &r.labels));
                        n += r.labels.size()[0];
                        Ok(())
                    },
                )
            })?;
            let mut c = right.int64_value(&[]);
            if let Some(g) = ranks.group() {
                let v = g.sum_f64(&[c as f64, n as f64], cfg.device)?;
                (c, n) = (v[0] as i64, v[1] as i64);
            }
            let acc = c as f64 / n.max(1) as f64;
            if *name == "valid" {
                e.valid_acc = acc
            } else {
                e.test_acc = acc
            }
        }
        e.eval_seconds = eval_started.elapsed().as_secs_f64();
        e.wall_seconds = e.train_seconds + e.eval_seconds;
        if let Some(f) = metrics_file.as_mut() {
            let line = serde_json::to_string(&e).expect("metrics serialize");
            writeln!(f, "{line}").map_err(|err| Error::io("metrics", err))?;
        }
        if cfg.show_progress && writer {
            crate::report::epoch_row(&e);
        }
        // Ties keep the earlier epoch, as the summary's pick does.
        if best_so_far
            .as_ref()
            .is_none_or(|b| e.valid_acc > b.valid_acc)
        {
            best_so_far = Some(Best {
                epoch: t,
                valid_acc: e.valid_acc,
                params: export::snapshot(&vs),
            });
        }
        history.push(e);
        if let Some(dir) = cfg.checkpoint_dir.as_ref().filter(|_| writer) {
            let state = State {
                vs: &vs,
                adam: &adam,
                best: best_so_far.as_ref(),
            };
            save_checkpoint(dir, &state, cfg, m, &history, None, world)?;
        }
        // A signal to any rank stops every rank after this epoch.
        let signal = offgnn_shared::signals::received();
        let stop = match ranks.group() {
            Some(g) => g.sum_f64(&[f64::from(u8::from(signal.is_some()))], cfg.device)?[0] > 0.0,
            None => signal.is_some(),
        };
        if stop {
            return Err(Error::Stopped(format!(
                "stopped by {} after epoch {t}: {}",
                signal.map_or_else(|| "a signal to another rank".to_string(), |s| s.to_string()),
                match &cfg.checkpoint_dir {
                    Some(dir) => format!(
                        "checkpoint of that epoch written to {}; run again with --resume to continue",
                        dir.display()
                    ),
                    None => "no --checkpoint-dir, so nothing of this run was kept".into(),
                }
            )));
        }
    }

    let (best_epoch, best) = history
        .iter()
        .enumerate()
        .max_by(|a, b| {
            a.1.valid_acc
                .partial_cmp(&b.1.valid_acc)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(b.0.cmp(&a.0))
        })
        .map(|(i, e)| (i as u32, e.clone()))
        .unwrap_or_default();
    let rest: Vec<f64> = history.iter().skip(1).map(|e| e.wall_seconds).collect();
    let mut exports = Vec::new();
    let mut dump = None;
    if writer && (cfg.export.is_some() || cfg.dump.is_some()) {
        let best = best_so_far.filter(|b| b.epoch == best_epoch).ok_or_else(|| {
            Error::Checkpoint(format!(
                "the parameters of the best epoch ({best_epoch}) are not in the checkpoint this run resumed from (an older trainer wrote it); export the last epoch with `trainer export --last`"
            ))
        })?;
        let last = export::snapshot(&vs);
        let provenance = |which: &str, e: &EpochMetrics| export::Provenance {
            feature_dtype: m.dataset.feature_dtype.clone(),
            dataset_fingerprint: m.dataset.dataset_fingerprint.clone(),
            feature_fingerprint: m.dataset.feature_fingerprint.clone(),
            samples_run_sha256: m.samples.run_sha256.clone(),
            which: which.into(),
            epoch: e.epoch,
            valid_acc: e.valid_acc,
            test_acc: e.test_acc,
        };
        if let Some(target) = &cfg.dump {
            let params: HashMap<String, Tensor> = best
                .params
                .iter()
                .map(|(k, v)| (k.clone(), v.shallow_clone()))
                .collect();
            export::load_into(&vs, &params, "the best epoch's parameters")?;
            let test = eval_sets
                .iter()
                .find(|(name, _)| *name == "test")
                .map(|(_, refs)| refs.as_slice())
                .unwrap_or_default();
            dump_batches(layout, engine, &src, cfg, net.as_ref(), test, target)?;
            dump = Some(target.path.clone());
        }
        if let Some(x) = &cfg.export {
            let at_best = &history[best_epoch as usize];
            exports.push(export::write(
                &x.location,
                &cfg.model,
                &best.params,
                &provenance("best", at_best),
                x.overwrite,
            )?);
            if x.last {
                let last_epoch = history.last().expect("at least one epoch ran");
                let location = offgnn_shared::store::Store::open(&x.location)?.join("last");
                exports.push(export::write(
                    &location,
                    &cfg.model,
                    &last,
                    &provenance("last", last_epoch),
                    x.overwrite,
                )?);
            }
        }
    }
    Ok(TrainSummary {
        mean_epoch_seconds_excl_first: if rest.is_empty() {
            history.first().map_or(0.0, |e| e.wall_seconds)
        } else {
            rest.iter().sum::<f64>() / rest.len() as f64
        },
        best_epoch,
        best_valid_acc: best.valid_acc,
        test_acc_at_best_valid: best.test_acc,
        epochs: history,
        device: format!("{:?}", cfg.device),
        io_backend: engine.backend().to_string(),
        features: cfg.features,
        rows_dtype: match cfg.features {
            FeatureMode::Packed => layout.manifest.dataset.store_dtype(),
            FeatureMode::Naive | FeatureMode::Memory => &layout.manifest.dataset.feature_dtype,
        }
        .to_string(),
        pipelined: cfg.pipelined,
        resumed_from: start.resumed_from,
        exports,
        dump,
        world_size: world,
        machine_share: None,
    })
}

/// Runs the model on the first `target.batches` of `refs` and writes, per
/// batch `k`: `batch{k}.x` (input rows, float32), `batch{k}.block{l}.src`,
/// `.dst` (int64 local ids, edges sorted by destination) and `.size`
/// (`[num_src, num_dst]`) for each layer `l`, `batch{k}.logits` and
/// `batch{k}.labels`. Written to a temporary name, then renamed.
fn dump_batches(
    layout: &Layout,
    engine: &IoEngine,
    src: &Sources,
    cfg: &TrainConfig,
    net: &dyn model::Gnn,
    refs: &[BatchRef],
    target: &DumpTarget,
) -> Result<()> {
    let refs = &refs[..target.batches.min(refs.len())];
    let mut named: Vec<(String, Tensor)> = Vec::new();
    tch::no_grad(|| {
        pipeline::run_batches(
            layout,
            engine,
            src,
            refs,
            cfg.pipeline_options(),
            |r: Ready| {
                let k = named.len();
                let logits = net.forward(&r.x, &r.blocks, false);
                let mut add =
                    |name: String, t: Tensor| named.push((name, t.to_device(Device::Cpu)));
                add(format!("batch{k}.x"), r.x.to_kind(Kind::Float));
                for (l, b) in r.blocks.iter().enumerate() {
                    add(format!("batch{k}.block{l}.src"), b.src.to_kind(Kind::Int64));
                    add(format!("batch{k}.block{l}.dst"), b.dst.to_kind(Kind::Int64));
                    add(
                        format!("batch{k}.block{l}.size"),
                        Tensor::from_slice(&[b.num_src, b.num_dst]),
                    );
                }
                add(format!("batch{k}.logits"), logits);
                add(format!("batch{k}.labels"), r.labels.to_kind(Kind::Int64));
                Ok(())
            },
        )
    })?;
    export::write_tensors(&target.path, &named)
}

/// `trainer export`: the model of a checkpoint (its best validation epoch,
/// or with `last` the parameters it was taken with) to `out`. With a
/// manifest, the checkpoint must have been trained on that layout.
pub fn export_checkpoint(
    dir: &Path,
    out: &str,
    last: bool,
    overwrite: bool,
    manifest: Option<&offgnn_manifests::Manifest>,
) -> Result<export::Written> {
    let meta_path = dir.join(META);
    let bytes = std::fs::read(&meta_path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Error::Checkpoint(format!(
                "{}: no checkpoint (checkpoint.json) there",
                dir.display()
            ))
        } else {
            Error::io(meta_path.display(), e)
        }
    })?;
    let meta: CheckpointMeta = serde_json::from_slice(&bytes).map_err(|e| {
        Error::Checkpoint(format!(
            "{}: malformed checkpoint: {e}",
            meta_path.display()
        ))
    })?;
    if let Some(m) = manifest
        && (meta.manifest_run_sha256 != m.samples.run_sha256
            || meta.dataset_fingerprint != m.dataset.dataset_fingerprint)
    {
        return Err(Error::Checkpoint(format!(
            "{}: the checkpoint was trained on another layout than that manifest (other samples or dataset)",
            dir.display()
        )));
    }
    export::check_target(out, overwrite)?;
    let tensors = tensor_file(dir, &meta)?;
    let named = load_tensors(&tensors, Device::Cpu)?;
    let (which, epoch, prefix) = if last {
        if meta.in_epoch.is_some() {
            tracing::warn!(
                "the checkpoint was taken inside epoch {}: its parameters are those of that moment",
                meta.epoch
            );
        }
        ("last", meta.epoch.saturating_sub(1), "model.")
    } else {
        let epoch = meta.best_epoch.ok_or_else(|| {
            Error::Checkpoint(format!(
                "{}: holds no best-epoch parameters (an older trainer wrote it); pass --last to export the parameters it holds",
                dir.display()
            ))
        })?;
        ("best", epoch, "best.model.")
    };
    let figures = meta.history.get(epoch as usize).cloned().ok_or_else(|| {
        Error::Checkpoint(format!(
            "{}: no completed epoch to export",
            meta_path.display()
        ))
    })?;
    // Through a fresh model: every parameter present, with its shape.
    let vs = nn::VarStore::new(Device::Cpu);
    let _net = model::build(&vs.root(), &meta.model);
    export::load_into(
        &vs,
        &with_prefix(&named, prefix),
        &tensors.display().to_string(),
    )?;
    let provenance = export::Provenance {
        feature_dtype: meta.feature_dtype.clone(),
        dataset_fingerprint: meta.dataset_fingerprint.clone(),
        feature_fingerprint: meta.feature_fingerprint.clone(),
        samples_run_sha256: meta.manifest_run_sha256.clone(),
        which: which.into(),
        epoch,
        valid_acc: figures.valid_acc,
        test_acc: figures.test_acc,
    };
    export::write(
        out,
        &meta.model,
        &export::snapshot(&vs),
        &provenance,
        overwrite,
    )
}

/// Writes a checkpoint: a new tensor file, then `checkpoint.json` naming it
/// by rename (the commit), then the older tensor files go. A crash at any
/// point leaves the previous checkpoint or the new one whole.
fn save_checkpoint(
    dir: &Path,
    state: &State,
    cfg: &TrainConfig,
    m: &offgnn_manifests::Manifest,
    history: &[EpochMetrics],
    in_epoch: Option<&EpochProgress>,
    world: u32,
) -> Result<()> {
    let State { vs, adam, best } = *state;
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.display(), e))?;
    let epoch = history.len() as u32;
    let position = in_epoch.map_or(0, |p| p.batches);
    let tensors = format!("checkpoint-e{epoch:05}-b{position:08}.ot");
    let mut named: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .map(|(k, v)| (format!("model.{k}"), v))
        .collect();
    named.extend(adam.state());
    if let Some(b) = best {
        named.extend(
            b.params
                .iter()
                .map(|(k, v)| (format!("best.model.{k}"), v.shallow_clone())),
        );
    }
    // libtorch aborts the process when its writer meets a full disk: the
    // space is checked first (the tensors' bytes plus a little per tensor
    // for the archive's records).
    let need: u64 = named
        .iter()
        .map(|(_, t)| t.numel() as u64 * t.kind().elt_size_in_bytes() as u64 + 1024)
        .sum::<u64>()
        + (64 << 10);
    let free = offgnn_shared::io_engine::free_bytes(dir)?;
    if need > free {
        return Err(Error::Checkpoint(format!(
            "{}: {} free, a checkpoint needs about {}; any previous checkpoint is kept; free some space or choose another --checkpoint-dir",
            dir.display(),
            offgnn_shared::report::human_bytes(free),
            offgnn_shared::report::human_bytes(need)
        )));
    }
    let tmp = dir.join(format!("{tensors}.partial"));
    let written = Tensor::save_multi(&named, &tmp)
        .map_err(|e| Error::Checkpoint(format!("writing {}: {e}", tmp.display())))
        .and_then(|()| {
            std::fs::File::open(&tmp)
                .and_then(|f| f.sync_all())
                .map_err(|e| Error::io(tmp.display(), e))
        })
        .and_then(|()| {
            std::fs::rename(&tmp, dir.join(&tensors)).map_err(|e| Error::io(dir.display(), e))
        });
    if let Err(e) = written {
        // A full disk, most likely: the partial file goes, the previous
        // checkpoint stays.
        let _ = std::fs::remove_file(&tmp);
        let free = offgnn_shared::io_engine::free_bytes(dir).unwrap_or(0);
        return Err(Error::Checkpoint(format!(
            "{e} ({} free in {}); the previous checkpoint is kept",
            offgnn_shared::report::human_bytes(free),
            dir.display()
        )));
    }
    let meta = CheckpointMeta {
        model: cfg.model.clone(),
        manifest_run_sha256: m.samples.run_sha256.clone(),
        dataset_fingerprint: m.dataset.dataset_fingerprint.clone(),
        feature_fingerprint: m.dataset.feature_fingerprint.clone(),
        epoch,
        in_epoch: in_epoch.cloned(),
        history: history.to_vec(),
        tensors: tensors.clone(),
        best_epoch: best.map(|b| b.epoch),
        feature_dtype: m.dataset.feature_dtype.clone(),
        hyper: Some(Hyper::of(cfg)),
        world_size: (world > 1).then_some(world),
    };
    let meta_tmp = dir.join(format!("{META}.partial"));
    let body = serde_json::to_vec_pretty(&meta).expect("checkpoint metadata serializes");
    let committed = std::fs::File::create(&meta_tmp)
        .and_then(|mut f| {
            f.write_all(&body)?;
            f.sync_all()
        })
        .map_err(|e| Error::io(meta_tmp.display(), e))
        .and_then(|()| {
            std::fs::rename(&meta_tmp, dir.join(META)).map_err(|e| Error::io(dir.display(), e))
        });
    if let Err(e) = committed {
        // The new tensor file stays unnamed (the next checkpoint removes
        // it); the previous checkpoint.json still names its own.
        let _ = std::fs::remove_file(&meta_tmp);
        return Err(e);
    }
    // Older tensor files are no longer named by the commit point.
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir.display(), e))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("checkpoint-") && name != tensors {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_infinite_or_nan_gradient_and_the_flags_come_back_in_one_read() {
        let vs = nn::VarStore::new(Device::Cpu);
        let w = vs.root().zeros("w", &[3]);
        let b = vs.root().zeros("b", &[2]);
        let params = vec![("w".to_string(), w.shallow_clone()), ("b".to_string(), b)];
        let flags = [Tensor::from(true), Tensor::from(false).reshape([1])];
        let grads_bad = |params: &[(String, Tensor)]| {
            let (read, bad) = read_flags(params, &flags).unwrap();
            assert_eq!(read, vec![true, false], "flags as given");
            bad
        };
        assert!(!grads_bad(&params), "no gradient yet");
        (&w * 2.0).sum(Kind::Float).backward();
        assert!(!grads_bad(&params));
        for bad in [f64::INFINITY, f64::NAN] {
            tch::no_grad(|| {
                let _ = w.grad().get(1).fill_(bad);
            });
            assert!(grads_bad(&params), "{bad}");
            tch::no_grad(|| {
                let _ = w.grad().get(1).fill_(2.0);
            });
        }
    }

    // The device sums add in batch order from the restored progress, as
    // the host did: the same f64 sum bit for bit, and the last non-finite
    // loss kept for the message.
    #[test]
    fn device_sums_equal_the_host_sums_and_keep_a_bad_loss() {
        let start = EpochProgress {
            loss_sum: 0.1,
            correct: 7,
            ..Default::default()
        };
        let mut sums = DeviceSums::new(&start, Device::Cpu);
        let logits = Tensor::from_slice(&[0.0f32, 1.0, 2.0, 0.0]).view([2, 2]);
        let labels = Tensor::from_slice(&[1i64, 1]);
        let mut host = start.loss_sum;
        for v in [0.3f32, 1.7, 2.9e-3] {
            sums.add(&Tensor::from(v), &logits, &labels);
            host += v as f64;
        }
        let mut p = EpochProgress::default();
        sums.store(&mut p);
        assert_eq!(p.loss_sum.to_bits(), host.to_bits());
        assert_eq!(p.correct, 7 + 3, "one of two right, three times");
        assert!(!bool::try_from(sums.loss_diverged()).unwrap());
        sums.add(&Tensor::from(f32::INFINITY), &logits, &labels);
        sums.add(&Tensor::from(0.5f32), &logits, &labels);
        assert!(bool::try_from(sums.loss_diverged()).unwrap());
        assert_eq!(sums.bad_loss.double_value(&[]), f64::INFINITY);
    }
}
