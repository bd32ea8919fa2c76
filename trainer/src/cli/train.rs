//! Training from the command line: its flags, checked before anything is
//! read; a torchrun or srun launch joined; the layout staged and opened;
//! the run's memory stated and checked; then training, its rows and
//! summary printed.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};
use offgnn_manifests::Manifest;
use offgnn_shared::io_engine::{IoEngine, IoOptions};
use offgnn_shared::report::human_bytes;

use super::report;
use crate::distributed::{Group, Launch};
use crate::historical::HistoricalConfig;
use crate::io_depth::Resolved;
use crate::layout::Layout;
use crate::memory::{self, MemoryEstimate};
use crate::model::{self, ModelKind};
use crate::train::{self, MachineShare, TrainConfig, TrainSummary};
use crate::{device, pipeline, staging};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Model {
    Sage,
    Gat,
    /// Baseline: an MLP on the seeds' own features, no graph.
    Mlp,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum OnOff {
    On,
    Off,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Features {
    /// The packed layout (caches, disk-cache pages, packed chunks).
    Packed,
    /// Baseline: one aligned O_DIRECT read per needed row of the raw feature file.
    Naive,
    /// Baseline: all features in RAM.
    Memory,
}

impl Features {
    /// The pipeline's mode for these rows.
    pub fn mode(self) -> pipeline::FeatureMode {
        match self {
            Features::Packed => pipeline::FeatureMode::Packed,
            Features::Naive => pipeline::FeatureMode::Naive,
            Features::Memory => pipeline::FeatureMode::Memory,
        }
    }
}

/// `--io-depth`: reads in flight per ring, or chosen from the disk's curve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoDepth {
    Auto,
    PerRing(u32),
}

impl std::str::FromStr for IoDepth {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(auto_or(s, 1..=u32::MAX, "requests")?.map_or(IoDepth::Auto, IoDepth::PerRing))
    }
}

/// `auto` (`None`) or a number within `range` of `unit`.
fn auto_or(
    s: &str,
    range: std::ops::RangeInclusive<u32>,
    unit: &str,
) -> Result<Option<u32>, String> {
    if s == "auto" {
        return Ok(None);
    }
    match s.parse::<u32>() {
        Ok(n) if range.contains(&n) => Ok(Some(n)),
        Ok(_) if *range.end() == u32::MAX => Err(format!("must be at least {}", range.start())),
        Ok(_) => Err(format!("{} to {} {unit}", range.start(), range.end())),
        Err(_) => Err(format!("{s:?} is neither auto nor a number of {unit}")),
    }
}

/// `--read-through`: pages of a gap between two reads that are read
/// through, or chosen from the disk's measured costs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadThrough {
    Auto,
    Pages(u32),
}

impl std::str::FromStr for ReadThrough {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let pages = auto_or(s, 0..=crate::io_depth::MAX_READ_THROUGH, "pages")?;
        Ok(pages.map_or(ReadThrough::Auto, ReadThrough::Pages))
    }
}

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// manifest.json of a packed layout: a local path or an object-store URL.
    #[arg(long)]
    pub manifest: Option<String>,
    #[arg(long, value_enum, default_value_t = Model::Sage)]
    pub model: Model,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    #[arg(long, default_value_t = 10)]
    pub epochs: u32,
    #[arg(long, default_value_t = 0.003)]
    pub lr: f64,
    /// Hidden width (default: 256 for GraphSAGE, heads x 32 for GAT).
    #[arg(long)]
    pub hidden: Option<i64>,
    /// GAT attention heads.
    #[arg(long, default_value_t = 4)]
    pub heads: i64,
    /// Typed graphs, R-SAGE: each relation's convolution also maps the
    /// destination's own row (PyG's SAGEConv default, root_weight=True);
    /// without it, MLPerf's R-SAGE (root_weight=False).
    #[arg(long)]
    pub root_weight: bool,
    /// Typed graphs, R-SAGE: how its linear maps start: pyg (PyG's
    /// SAGEConv's; the default for node classification) or glorot (DGL's:
    /// Glorot-uniform weights, zero bias, larger where rows are wide; the
    /// default for link prediction).
    #[arg(long)]
    pub init: Option<String>,
    #[arg(long, default_value_t = 0.5)]
    pub dropout: f64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Where a remote layout is staged.
    #[arg(long)]
    pub local_dir: Option<PathBuf>,
    /// Per-epoch JSON lines go here.
    #[arg(long)]
    pub metrics: Option<PathBuf>,
    #[arg(long)]
    pub checkpoint_dir: Option<PathBuf>,
    /// Continue from the checkpoint in --checkpoint-dir.
    #[arg(long)]
    pub resume: bool,
    /// Also checkpoint every N batches inside an epoch (default: at epoch ends only).
    #[arg(long)]
    pub checkpoint_every: Option<u64>,
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub pipeline: OnOff,
    #[arg(long, value_enum, default_value_t = Features::Packed)]
    pub features: Features,
    /// Depth of the queues between pipeline stages.
    #[arg(long, default_value_t = 2)]
    pub queue_depth: usize,
    /// Loader threads: batches whose disk reads are in flight at once.
    #[arg(long, default_value_t = 2)]
    pub loaders: usize,
    /// io_uring rings.
    #[arg(long, default_value_t = 4)]
    pub io_rings: usize,
    /// Requests in flight per ring, or `auto` (the default): as many in all
    /// as the disk holding the layout needs to reach 95% of its best
    /// random-read rate, from its measured curve (probed once per machine
    /// and disk, about 5 s, then kept; see `trainer probe-disk`). Where it
    /// cannot be probed (the pread pool, no O_DIRECT), 64 per ring.
    #[arg(long, default_value = "auto")]
    pub io_depth: IoDepth,
    /// Pages of a gap between two of a batch's reads of the packed layout
    /// that are read through rather than asked for apart, or `auto` (the
    /// default): from the disk's measured time for a read of one page and
    /// of 16 (probed with --io-depth's curve), the largest gap that costs
    /// less than a read of its own; 0 where it cannot be probed. A disk
    /// that runs out of requests before bytes reads faster through gaps.
    #[arg(long, default_value = "auto")]
    pub read_through: ReadThrough,
    /// Use the pread thread pool even where io_uring works.
    #[arg(long)]
    pub pread: bool,
    /// Refuse to start if the run's stated peak host memory (logged at the
    /// start and in the summary) exceeds this, e.g. 16G.
    #[arg(long)]
    pub memory: Option<String>,
    /// Write the best validation epoch's model here at the end (a directory
    /// or an object-store URL): the weights (safetensors) and model.json, which load
    /// into PyTorch Geometric's GraphSAGE, GAT or MLP.
    #[arg(long)]
    pub export: Option<String>,
    /// With --export, also write the last epoch's model to EXPORT/last.
    #[arg(long, requires = "export")]
    pub export_last: bool,
    /// Start afresh over what an earlier run left: a checkpoint in
    /// --checkpoint-dir, the --metrics file, an export at --export. Without
    /// it (or --resume) the run refuses to replace them.
    #[arg(long)]
    pub overwrite: bool,
    /// Write the first --dump-count test batches (blocks, input rows, and
    /// the best model's logits; a link batch's pairs and its seeds'
    /// embeddings) to this safetensors file, to check the export or a
    /// loader against another implementation.
    #[arg(long)]
    pub dump_batches: Option<PathBuf>,
    #[arg(long, default_value_t = 2)]
    pub dump_count: usize,
    /// FreshGNN's historical embedding cache: between layers, embeddings
    /// with small gradients stand in for their subtrees, which are neither
    /// computed nor read (see docs/techniques.md). Bare, its defaults:
    /// `p_grad=0.9,t_stale=200,start=0,memory=1GiB`; or any of them, e.g.
    /// `--historical p_grad=0.8,start=500`. Off without it.
    #[arg(long, num_args = 0..=1, default_missing_value = "", value_parser = HistoricalConfig::parse)]
    pub historical: Option<HistoricalConfig>,
    /// Link-prediction layouts (`sampler --task link`): how two endpoints'
    /// embeddings score as an edge. `mlp` (the default) is DGL's predictor,
    /// three linear layers on `h_u * h_v`; `dot` is `<h_u, h_v>`.
    #[arg(long, value_enum)]
    pub scorer: Option<crate::link::ScorerKind>,
    /// Train at most this many batches per epoch (for quick checks); under
    /// data-parallel training, padded up to a multiple of the ranks as
    /// every epoch is.
    #[arg(long)]
    pub max_batches: Option<usize>,
    /// Launched by torchrun or srun: how long a rank waits for the others
    /// (to join, and at each collective) before it gives up, in seconds.
    #[arg(long, default_value_t = 600)]
    pub dist_timeout: u64,
    /// One process standing in for N data-parallel ranks: each step trains
    /// every rank's batch and averages their gradients by hand (the check
    /// of a torchrun run).
    #[arg(long)]
    pub emulate_ranks: Option<u32>,
}

/// Trains as the flags say: alone, as one rank of a torchrun or srun
/// launch, or standing in for several ranks.
pub(super) fn train_command(a: TrainArgs) -> anyhow::Result<()> {
    let launch = Launch::from_env(|k| std::env::var(k).ok())?;
    let device = device::parse_device(&a.device)?;
    let device = launch.as_ref().map_or(device, |l| l.device(device));
    // Flags are checked before anything is read or staged.
    let (kind, hidden) = model_shape(&a)?;
    let memory_limit = a
        .memory
        .as_deref()
        .map(offgnn_shared::sizes::parse_bytes)
        .transpose()?;
    let location = a
        .manifest
        .clone()
        .ok_or_else(|| anyhow::anyhow!("--manifest is required (see trainer --help)"))?;
    if launch.is_some() && a.emulate_ranks.is_some() {
        anyhow::bail!(
            "--emulate-ranks stands in for a launch by torchrun or srun; it cannot run under one"
        );
    }
    if a.emulate_ranks == Some(0) {
        anyhow::bail!("--emulate-ranks must be at least 1");
    }
    if a.dist_timeout == 0 {
        anyhow::bail!("--dist-timeout must be at least 1 (seconds)");
    }
    if a.resume && a.overwrite {
        anyhow::bail!(
            "--resume continues the checkpoint in --checkpoint-dir and --overwrite starts afresh over it: pass one"
        );
    }
    // A typed graph's layout trains R-SAGE or R-GAT.
    if let Some(src) = super::typed_train::typed_layout(&location, &a)? {
        return super::typed_train::train_typed_command(
            &a,
            (device, kind, hidden),
            launch.as_ref(),
            &src,
        );
    }
    if a.root_weight {
        anyhow::bail!(
            "--root-weight is for typed graphs' R-SAGE; GraphSAGE on a homogeneous graph has its root weight always"
        );
    }
    if a.init.is_some() {
        anyhow::bail!("--init is for typed graphs' R-SAGE");
    }
    let group = join_group(launch.as_ref(), device, a.dist_timeout)?;
    let writer = group.as_ref().is_none_or(|g| g.rank == 0);
    tracing::info!("training on {device:?}");
    let engine = IoEngine::new(io_options(&a));
    let (layout, share) = open_layout(
        &a,
        &location,
        launch.as_ref(),
        group.as_ref(),
        &engine,
        writer,
    )?;
    let (engine, probe) = engine_for_disk((&layout.dir, &layout.manifest.objects), engine, &a);
    let m = &layout.manifest;
    if writer {
        warn_without_validation(&m.schedule);
    }
    let scorer = scorer_of(&a, m, &location)?;
    let cfg = train_config(&a, (kind, hidden, scorer), device, m, writer);
    let memory = state_memory(m, &cfg, memory_limit)?;
    let ranks = match (&group, a.emulate_ranks) {
        (Some(g), _) => train::Ranks::Group(g),
        (None, Some(n)) => train::Ranks::Emulated(n),
        (None, None) => train::Ranks::One,
    };
    let mut summary = train::train_ranks(&layout, &engine, &cfg, ranks, &mut report::epoch_row)?;
    summary.machine_share = share;
    summary.io_depth_probe = probe;
    report_run(&summary, &memory, group.as_ref());
    Ok(())
}

/// The I/O engine's options of the flags (`--io-depth auto` starts at the
/// default depth).
pub(super) fn io_options(a: &TrainArgs) -> IoOptions {
    IoOptions {
        rings: a.io_rings,
        queue_depth: match a.io_depth {
            IoDepth::PerRing(n) => n,
            IoDepth::Auto => IoOptions::default().queue_depth,
        },
        force_pread: a.pread,
        read_through: match a.read_through {
            ReadThrough::Pages(n) => n as usize * offgnn_shared::io_engine::PAGE,
            ReadThrough::Auto => 0,
        },
        ..Default::default()
    }
}

/// The engine for the layout in `dir` with `--io-depth` and
/// `--read-through` taken from its disk where they are `auto`.
pub(super) fn engine_for_disk(
    layout: (&std::path::Path, &[offgnn_manifests::Object]),
    engine: IoEngine,
    a: &TrainArgs,
) -> (IoEngine, Option<Resolved>) {
    crate::io_depth::engine_for_disk(
        layout,
        engine,
        (
            a.io_depth == IoDepth::Auto,
            a.read_through == ReadThrough::Auto,
        ),
    )
}

/// The model's kind and hidden width, after the flags' checks: each a
/// clear refusal before anything is read.
fn model_shape(a: &TrainArgs) -> anyhow::Result<(ModelKind, i64)> {
    let kind = match a.model {
        Model::Sage => ModelKind::Sage,
        Model::Gat => ModelKind::Gat,
        Model::Mlp => ModelKind::Mlp,
    };
    let hidden = a.hidden.unwrap_or(match kind {
        ModelKind::Sage | ModelKind::Mlp => 256,
        ModelKind::Gat => a.heads * 32,
    });
    for (flag, value) in [
        ("--queue-depth", a.queue_depth),
        ("--loaders", a.loaders),
        ("--io-rings", a.io_rings),
    ] {
        if value == 0 {
            anyhow::bail!("{flag} must be at least 1");
        }
    }
    if a.checkpoint_every == Some(0) {
        anyhow::bail!("--checkpoint-every must be at least 1");
    }
    if a.max_batches == Some(0) {
        anyhow::bail!("--max-batches must be at least 1");
    }
    if hidden <= 0
        || a.heads <= 0
        || !(0.0..1.0).contains(&a.dropout)
        || a.lr <= 0.0
        || !a.lr.is_finite()
        || a.epochs == 0
    {
        anyhow::bail!(
            "--hidden, --heads and --epochs must be positive, --dropout in [0, 1), --lr positive (got --lr {}, --dropout {}, --hidden {hidden}, --heads {}, --epochs {})",
            a.lr,
            a.dropout,
            a.heads,
            a.epochs
        );
    }
    if kind == ModelKind::Gat && hidden % a.heads != 0 {
        anyhow::bail!(
            "--hidden {hidden} is not a multiple of --heads {}: GAT's hidden layers split their width evenly across heads",
            a.heads
        );
    }
    Ok((kind, hidden))
}

/// Joins the process group of a torchrun or srun launch. Joined before
/// staging: local rank 0 stages for its machine while the others wait at
/// a barrier.
pub(super) fn join_group(
    launch: Option<&Launch>,
    device: tch::Device,
    timeout_seconds: u64,
) -> anyhow::Result<Option<Group>> {
    Ok(launch
        .map(|l| {
            tracing::info!(
                "rank {} of {} (local rank {}), launched by {}: joining the store at {}:{}",
                l.rank,
                l.world,
                l.local_rank,
                l.launcher,
                l.master_addr,
                l.master_port
            );
            Group::connect(l, device, std::time::Duration::from_secs(timeout_seconds))
        })
        .transpose()?)
}

/// Stages the layout at `location` (a remote one into `--local-dir`) and
/// opens it. A rank's machine stages, checks and opens only the segments
/// its ranks read; returns that share of the layout with it.
fn open_layout(
    a: &TrainArgs,
    location: &str,
    launch: Option<&Launch>,
    group: Option<&Group>,
    engine: &IoEngine,
    writer: bool,
) -> anyhow::Result<(Layout, Option<MachineShare>)> {
    let stages_first = launch.is_none_or(|l| l.local_rank == 0);
    let only = |m: &Manifest| {
        launch.map(|l| train::segments_read(m, l.machine_ranks(), l.world, a.max_batches))
    };
    let stage = || {
        staging::resolve_part(location, a.local_dir.as_deref(), engine, writer, only)
            .with_context(|| format!("reading {}", offgnn_shared::store::redact(location)))
    };
    // Local rank 0 stages this machine's copy while the others wait (if it
    // fails, it exits, and the barrier fails for the others).
    let staged = if stages_first { Some(stage()?) } else { None };
    if let Some(g) = group {
        g.barrier()?;
    }
    let (dir, manifest) = match staged {
        Some(s) => s,
        None => stage()?,
    };
    let only = only(&manifest);
    let share = only.as_ref().map(|o| MachineShare::of(&manifest, o));
    let layout = Layout::open_part(&dir, manifest, engine, writer, only.as_ref())?;
    Ok((layout, share))
}

/// The scorer of a link-prediction layout (`--scorer`, else the MLP);
/// none for a node layout, which refuses `--scorer`.
fn scorer_of(
    a: &TrainArgs,
    m: &Manifest,
    location: &str,
) -> anyhow::Result<Option<crate::link::ScorerKind>> {
    match (&m.samples.link, a.scorer) {
        (Some(_), s) => Ok(Some(s.unwrap_or(crate::link::ScorerKind::Mlp))),
        (None, None) => Ok(None),
        (None, Some(_)) => anyhow::bail!(
            "--scorer is for link-prediction layouts (sampler --task link); {} is a node-classification layout",
            offgnn_shared::store::redact(location)
        ),
    }
}

/// The training configuration of the flags, for the layout `m`: a link
/// layout's encoder outputs embeddings of the hidden width.
fn train_config(
    a: &TrainArgs,
    (kind, hidden, scorer): (ModelKind, i64, Option<crate::link::ScorerKind>),
    device: tch::Device,
    m: &Manifest,
    writer: bool,
) -> TrainConfig {
    TrainConfig {
        model: model::ModelConfig {
            kind,
            in_dim: m.dataset.feature_dim as i64,
            hidden,
            classes: match scorer {
                Some(_) => hidden,
                None => m.dataset.num_classes as i64,
            },
            layers: m.samples.fanouts.len(),
            heads: a.heads,
            dropout: a.dropout,
            scorer,
        },
        device,
        epochs: a.epochs,
        lr: a.lr,
        seed: a.seed,
        features: a.features.mode(),
        pipelined: a.pipeline == OnOff::On,
        queue_depth: a.queue_depth,
        loaders: a.loaders,
        metrics: a.metrics.clone(),
        checkpoint_dir: a.checkpoint_dir.clone(),
        resume: a.resume,
        overwrite: a.overwrite,
        show_progress: writer,
        max_batches: a.max_batches,
        checkpoint_every: a.checkpoint_every,
        export: a.export.clone().map(|location| train::ExportTarget {
            location,
            overwrite: a.overwrite,
            last: a.export_last,
        }),
        dump: a.dump_batches.clone().map(|path| train::DumpTarget {
            path,
            batches: a.dump_count,
        }),
        historical: a.historical.clone(),
    }
}

/// States the run's peak host memory (logged), refused over `--memory`;
/// on CUDA its peak on the device too, refused over the device's free
/// memory.
fn state_memory(
    m: &Manifest,
    cfg: &TrainConfig,
    memory_limit: Option<u64>,
) -> anyhow::Result<MemoryEstimate> {
    let memory = memory::estimate(m, cfg);
    check_statement(
        &memory,
        (cfg.device, memory_limit),
        (
            m.gpu_cache.rows * m.dataset.store_row_bytes(),
            "fewer --loaders or a smaller --queue-depth",
        ),
    )?;
    Ok(memory)
}

/// Warns where a layout has no validation batches: every epoch's
/// validation figure is then 0 and the first epoch counts as the best.
pub(super) fn warn_without_validation<T>(
    schedule: &std::collections::BTreeMap<offgnn_manifests::Split, Vec<Vec<T>>>,
) {
    let valid = schedule.get(&offgnn_manifests::Split::Valid);
    if valid.is_none_or(|epochs| epochs.iter().all(Vec::is_empty)) {
        tracing::warn!(
            "the layout has no validation batches (its dataset holds out none): validation figures read 0 and the first epoch counts as the best, so --export writes that epoch's parameters; --export-last writes the last"
        );
    }
}

/// Logs a run's statement and refuses it over `--memory` (`memory_limit`),
/// or on CUDA over the device's free memory; `gpu_cache` is the GPU tier's
/// bytes and `fewer` what else would lower the statement.
pub(super) fn check_statement(
    memory: &MemoryEstimate,
    (device, memory_limit): (tch::Device, Option<u64>),
    (gpu_cache, fewer): (u64, &str),
) -> anyhow::Result<()> {
    tracing::info!(
        "memory: at most {} (caches {}, batches in flight {}, model {}{}, activations {}, runtime {})",
        human_bytes(memory.total_bytes),
        human_bytes(memory.cache_bytes),
        human_bytes(memory.batches_in_flight_bytes),
        human_bytes(memory.model_bytes),
        if memory.historical_bytes > 0 {
            format!(
                ", historical embeddings {}",
                human_bytes(memory.historical_bytes)
            )
        } else {
            String::new()
        },
        human_bytes(memory.activation_bytes),
        human_bytes(memory.runtime_bytes),
    );
    if let Some(limit) = memory_limit
        && memory.total_bytes > limit
    {
        let smaller_cache = match memory.historical_bytes {
            0 => "",
            _ => ", or give --historical a smaller memory=",
        };
        anyhow::bail!(
            "--memory {}: this run needs up to {} (libtorch's runtime {}, caches {}, batches in flight {}, model and optimizer {}{}, activations {}); give more memory, or {fewer}{smaller_cache}",
            human_bytes(limit),
            human_bytes(memory.total_bytes),
            human_bytes(memory.runtime_bytes),
            human_bytes(memory.cache_bytes),
            human_bytes(memory.batches_in_flight_bytes),
            human_bytes(memory.model_bytes),
            match memory.historical_bytes {
                0 => String::new(),
                h => format!(", historical embeddings {}", human_bytes(h)),
            },
            human_bytes(memory.activation_bytes),
        );
    }
    if let tch::Device::Cuda(index) = device {
        tracing::info!(
            "GPU memory: at most {} on cuda:{index} (the GPU cache, the model and its optimizer state, inputs in flight, activations, and 1 GiB for the CUDA context)",
            human_bytes(memory.gpu_bytes)
        );
        match memory::cuda_free_memory(index) {
            Some((free, total)) if memory.gpu_bytes > free => anyhow::bail!(
                "cuda:{index} has {} free of {}, and this run needs up to {} there (GPU cache {}); pack with a smaller --gpu-cache, or free the device",
                human_bytes(free),
                human_bytes(total),
                human_bytes(memory.gpu_bytes),
                human_bytes(gpu_cache)
            ),
            Some(_) => {}
            None => tracing::warn!(
                "cuda:{index}: the CUDA runtime's free memory could not be read; the GPU statement is not checked"
            ),
        }
    }
    Ok(())
}

/// Rank 0 (or the one process) prints the run's summary; the other ranks
/// log that they are done.
fn report_run(summary: &TrainSummary, memory: &MemoryEstimate, group: Option<&Group>) {
    if group.is_none_or(|g| g.rank == 0) {
        report::summary(summary, memory);
    } else {
        let machine = summary.machine_share.as_ref().map_or(String::new(), |m| {
            format!(
                " (its machine reads {} of {} segments, {} of {})",
                m.segments,
                m.of_segments,
                human_bytes(m.bytes),
                human_bytes(m.of_bytes)
            )
        });
        tracing::info!(
            "rank {} of {} done{machine}; rank 0 reports the run",
            group.map_or(0, |g| g.rank),
            summary.world_size
        );
    }
}
