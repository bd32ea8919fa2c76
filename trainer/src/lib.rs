//! The `trainer` program: trains GraphSAGE or GAT from a packed feature
//! layout through a pipelined loop, with libtorch via `tch`. `main.rs` only
//! parses flags and calls [`run`].

pub mod cuda;
pub mod device;
pub mod distributed;
pub mod error;
pub mod export;
pub mod inference;
pub mod layout;
pub mod memory;
pub mod model;
pub mod pipeline;
mod report;
pub mod staging;
pub mod train;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use offgnn_shared::report::human_bytes;

const EXAMPLES: &str = "\
Examples:
  # Train GraphSAGE on a local layout, on the first GPU:
  trainer --manifest data/cora-pack/manifest.json --model sage --device cuda --epochs 20

  # Pull a layout from S3 to local NVMe and train GAT with metrics and checkpoints:
  trainer --manifest s3://bucket/cora/pack/manifest.json --local-dir /nvme/cora \\
      --model gat --device cuda:0 --metrics metrics.jsonl --checkpoint-dir ckpt

  # Train and export the best validation epoch's model for PyTorch Geometric:
  trainer --manifest data/cora-pack/manifest.json --model gat --export models/cora-gat

  # Export the model of an existing checkpoint:
  trainer export --checkpoint-dir ckpt --out s3://bucket/models/cora-sage

  # Predictions and embeddings for every node, in 8 GiB of memory:
  trainer infer --model models/cora-gat --dataset data/demo/cora --out preds \
      --outputs class,probabilities,embeddings --memory 8G

  # Check an export and show what it holds:
  trainer show-model --model models/cora-gat

  # Show the libtorch build and the devices it can use:
  trainer info";

#[derive(Debug, Parser)]
#[command(
    name = "trainer",
    version,
    about = "Trains GraphSAGE and GAT from a packed feature layout (io_uring loading, pipelined, libtorch)",
    after_help = EXAMPLES,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub train: TrainArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the libtorch version and the devices it can use.
    Info,
    /// Write the model of a checkpoint as its weights (safetensors) + model.json
    /// (PyTorch Geometric's parameter names and constructor arguments).
    Export(ExportArgs),
    /// Predictions and embeddings for every node: the exported model's
    /// exact function over full neighborhoods, layer by layer, out of core,
    /// written as Parquet.
    Infer(Box<InferArgs>),
    /// Check an export (model.json, the weights' checksum, every parameter's
    /// name and shape) and print what it holds.
    ShowModel {
        /// The export: a directory or an object-store URL.
        #[arg(long)]
        model: String,
    },
}

#[derive(Debug, Args)]
pub struct InferArgs {
    /// The export (model.json and the weights it names): a directory or URL.
    #[arg(long)]
    pub model: String,
    /// The GraphBolt OnDiskDataset the model was trained on: a directory,
    /// or an object-store URL, staged then into --work-dir/dataset (and
    /// kept there for the next run).
    #[arg(long)]
    pub dataset: String,
    /// Where the Parquet files and their _SUCCESS.json commit go: a
    /// directory or an object-store URL.
    #[arg(long)]
    pub out: String,
    /// Which nodes get a row: all, train, valid, test, or a .npy of node ids.
    #[arg(long, default_value = "all")]
    pub nodes: String,
    /// Columns besides node_id and class: any of class, probabilities,
    /// logits, embeddings (the last hidden layer's output), comma-separated.
    #[arg(long, default_value = "class,probabilities")]
    pub outputs: String,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Host memory for the run's working state, e.g. 8G (default: half of
    /// this machine's memory). Destinations are processed in groups that fit.
    #[arg(long)]
    pub memory: Option<String>,
    /// Where the layers' outputs and the bucketed edges go while the run
    /// works (default: a directory beside --out for a local --out, else
    /// ./offgnn-infer-work). A killed run resumes from it.
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
    /// Replace a committed result at --out.
    #[arg(long)]
    pub overwrite: bool,
    /// The graph as the sampler built it: with --add-reverse-edges.
    #[arg(long)]
    pub add_reverse_edges: bool,
    /// The graph as the sampler built it: with --drop-self-loops.
    #[arg(long)]
    pub drop_self_loops: bool,
    /// The graph as the sampler built it: with --keep-duplicate-edges
    /// (a repeated edge counts once per repeat in the aggregation).
    #[arg(long)]
    pub keep_duplicate_edges: bool,
    /// Rows per source chunk (default: from --memory).
    #[arg(long, hide = true)]
    pub chunk_rows: Option<u64>,
    /// streamed (the method above) or naive: the baseline that reads each
    /// in-neighbor's row with one read, timed on --naive-blocks blocks of
    /// 1024 destinations and extrapolated; writes no output.
    #[arg(long, default_value = "streamed")]
    pub method: String,
    #[arg(long, default_value_t = 16)]
    pub naive_blocks: u64,
    /// How hidden layers' outputs are stored in --work-dir: f32, or f16
    /// for half the disk and I/O (rounded to nearest even).
    #[arg(long, default_value = "f32")]
    pub hidden_dtype: String,
    /// Where the neighbor aggregation runs: host, device (torch's ops on
    /// --device, the accumulators there), or auto (device on CUDA, host on
    /// the CPU, where the host's own scatter is the faster).
    #[arg(long, default_value = "auto")]
    pub aggregate: String,
}

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The --checkpoint-dir of a training run.
    #[arg(long)]
    pub checkpoint_dir: PathBuf,
    /// Where the export goes: a directory or an object-store URL.
    #[arg(long)]
    pub out: String,
    /// Export the parameters the checkpoint was taken with, not those of
    /// the best validation epoch.
    #[arg(long)]
    pub last: bool,
    /// Replace an export already at --out.
    #[arg(long)]
    pub overwrite: bool,
    /// Refuse unless the checkpoint was trained on this layout's manifest.
    #[arg(long)]
    pub manifest: Option<String>,
}

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
    /// Requests in flight per ring.
    #[arg(long, default_value_t = 64)]
    pub io_depth: u32,
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
    /// the best model's logits) to this safetensors file, to check the
    /// export against another implementation.
    #[arg(long)]
    pub dump_batches: Option<PathBuf>,
    #[arg(long, default_value_t = 2)]
    pub dump_count: usize,
    /// Train at most this many batches per epoch (for quick checks).
    #[arg(long, hide = true)]
    pub max_batches: Option<usize>,
    /// Launched by torchrun or srun: how long a rank waits for the others
    /// (to join, and at each collective) before it gives up, in seconds.
    #[arg(long, default_value_t = 600)]
    pub dist_timeout: u64,
    /// One process standing in for N data-parallel ranks: each step trains
    /// every rank's batch and averages their gradients by hand (the check
    /// of a torchrun run).
    #[arg(long, hide = true)]
    pub emulate_ranks: Option<u32>,
    /// Write the parameters after every step under DIR/rank<R>/ (tests).
    #[arg(long, hide = true)]
    pub trace_params: Option<PathBuf>,
}

/// Keeps memory that libtorch frees for its next tensors. By default glibc
/// maps every large allocation (over 128 KiB at first, over 32 MiB at
/// most) on its own and unmaps it when freed,
/// so each batch's activations and gradients arrive as fresh pages that the
/// kernel zeroes on first touch: on the 10M-node bench that was over a
/// quarter of the CPU epoch's cycles. Served from the heap and not trimmed,
/// they are reused instead: one packed CPU epoch 14.7-16.8 s -> 10.0-10.1 s,
/// peak RSS 3.96-4.10 GB -> 4.14-4.15 GB (binaries alternated). glibc
/// only; elsewhere nothing changes.
pub fn retain_freed_memory() {
    // SAFETY: mallopt only sets allocator parameters; the binaries call
    // this first thing, before any other thread runs.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

/// The OpenMP wait policy `trainer infer` runs libtorch with.
pub const OMP_WAIT_POLICY: &str = "OMP_WAIT_POLICY";

/// Re-executes `trainer infer` with `OMP_WAIT_POLICY=PASSIVE` unless the
/// caller chose a policy. Inference runs libtorch's matmuls (OpenMP) in
/// turn with its own threads' work (the reader, the scatter), and by
/// default libgomp's idle threads spin, on the cores that work needs:
/// 13-19% of CPU samples in the narrow layers of the 3.2M-node benchmark
/// graph. libgomp reads the policy once, as it loads, before `main`; hence
/// the exec. There, alternated in five pairs: layer 2 took 3.8-5.6 s
/// passive against 4.7-6.6 s by default, faster in every pair; layer 1
/// (27.6-32.6 s) and the whole run (42.5-49.7 s) moved within the VM's
/// noise either way. Returns (and the run goes on as it is) where the exec
/// fails.
pub fn passive_openmp_for_infer() {
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os();
    let arg0 = args.next();
    let rest: Vec<_> = args.collect();
    if rest.first().map(|a| a.as_os_str()) != Some(std::ffi::OsStr::new("infer"))
        || std::env::var_os(OMP_WAIT_POLICY).is_some()
    {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let mut command = std::process::Command::new(exe);
    if let Some(arg0) = arg0 {
        command.arg0(arg0);
    }
    let err = command.args(rest).env(OMP_WAIT_POLICY, "PASSIVE").exec();
    eprintln!(
        "warning: could not re-execute with {OMP_WAIT_POLICY}=PASSIVE ({err}); going on without"
    );
}

/// Runs the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Some(Command::Info) => device::print_info(),
        Some(Command::Export(a)) => export_command(a),
        Some(Command::Infer(a)) => infer_command(*a),
        Some(Command::ShowModel { model }) => {
            let (card, vs) = export::read(&model, tch::Device::Cpu)?;
            let weights_bytes = vs.variables().values().map(|t| t.numel() as u64 * 4).sum();
            report::export_summary(
                "show-model",
                &export::Written {
                    location: offgnn_shared::store::redact(&model),
                    weights_bytes,
                    card,
                },
            );
            Ok(())
        }
        None => {
            // Training stops at its next batch on SIGINT or SIGTERM, with a
            // checkpoint when --checkpoint-dir is set.
            offgnn_shared::signals::install();
            train_command(cli.train)
        }
    }
}

fn train_command(a: TrainArgs) -> anyhow::Result<()> {
    use anyhow::Context;
    let launch = distributed::Launch::from_env(|k| std::env::var(k).ok())?;
    let device = device::parse_device(&a.device)?;
    let device = launch.as_ref().map_or(device, |l| l.device(device));
    // Flags are checked before anything is read or staged.
    let kind = match a.model {
        Model::Sage => model::ModelKind::Sage,
        Model::Gat => model::ModelKind::Gat,
        Model::Mlp => model::ModelKind::Mlp,
    };
    let hidden = a.hidden.unwrap_or(match kind {
        model::ModelKind::Sage | model::ModelKind::Mlp => 256,
        model::ModelKind::Gat => a.heads * 32,
    });
    for (flag, value) in [
        ("--queue-depth", a.queue_depth),
        ("--loaders", a.loaders),
        ("--io-rings", a.io_rings),
        ("--io-depth", a.io_depth as usize),
    ] {
        if value == 0 {
            anyhow::bail!("{flag} must be at least 1");
        }
    }
    if a.checkpoint_every == Some(0) {
        anyhow::bail!("--checkpoint-every must be at least 1");
    }
    if kind == model::ModelKind::Gat && hidden % a.heads != 0 {
        anyhow::bail!(
            "--hidden {hidden} is not a multiple of --heads {}: GAT's hidden layers split their width evenly across heads",
            a.heads
        );
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
    if a.emulate_ranks == Some(0) || a.dist_timeout == 0 {
        anyhow::bail!("--emulate-ranks and --dist-timeout must be at least 1");
    }
    // Joined before staging: local rank 0 stages for its machine while the
    // others wait at a barrier.
    let group = launch
        .as_ref()
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
            distributed::Group::connect(l, device, std::time::Duration::from_secs(a.dist_timeout))
        })
        .transpose()?;
    let writer = group.as_ref().is_none_or(|g| g.rank == 0);
    let stages_first = launch.as_ref().is_none_or(|l| l.local_rank == 0);
    tracing::info!("training on {device:?}");
    let engine = offgnn_shared::io_engine::IoEngine::new(offgnn_shared::io_engine::IoOptions {
        rings: a.io_rings,
        queue_depth: a.io_depth,
        force_pread: a.pread,
        ..Default::default()
    });
    // A rank's machine stages, checks and opens only the segments its
    // ranks read.
    let only = |m: &offgnn_manifests::Manifest| {
        launch
            .as_ref()
            .map(|l| train::segments_read(m, l.machine_ranks(), l.world, a.max_batches))
    };
    let stage = || {
        staging::resolve_part(&location, a.local_dir.as_deref(), &engine, writer, only)
            .with_context(|| format!("reading {}", offgnn_shared::store::redact(&location)))
    };
    // Local rank 0 stages this machine's copy while the others wait (if it
    // fails, it exits, and the barrier fails for the others).
    let staged = if stages_first { Some(stage()?) } else { None };
    if let Some(g) = &group {
        g.barrier()?;
    }
    let (dir, manifest) = match staged {
        Some(s) => s,
        None => stage()?,
    };
    let only = only(&manifest);
    let share = only.as_ref().map(|o| train::MachineShare::of(&manifest, o));
    let layout = layout::Layout::open_part(&dir, manifest, &engine, writer, only.as_ref())?;
    let m = &layout.manifest;
    let cfg = train::TrainConfig {
        model: model::ModelConfig {
            kind,
            in_dim: m.dataset.feature_dim as i64,
            hidden,
            classes: m.dataset.num_classes as i64,
            layers: m.samples.fanouts.len(),
            heads: a.heads,
            dropout: a.dropout,
        },
        device,
        epochs: a.epochs,
        lr: a.lr,
        seed: a.seed,
        features: match a.features {
            Features::Packed => pipeline::FeatureMode::Packed,
            Features::Naive => pipeline::FeatureMode::Naive,
            Features::Memory => pipeline::FeatureMode::Memory,
        },
        pipelined: a.pipeline == OnOff::On,
        queue_depth: a.queue_depth,
        loaders: a.loaders,
        metrics: a.metrics,
        checkpoint_dir: a.checkpoint_dir,
        resume: a.resume,
        overwrite: a.overwrite,
        show_progress: writer,
        max_batches: a.max_batches,
        checkpoint_every: a.checkpoint_every,
        interrupt_after: None,
        export: a.export.map(|location| train::ExportTarget {
            location,
            overwrite: a.overwrite,
            last: a.export_last,
        }),
        dump: a.dump_batches.map(|path| train::DumpTarget {
            path,
            batches: a.dump_count,
        }),
    };
    let memory = memory::estimate(m, &cfg);
    tracing::info!(
        "memory: at most {} (caches {}, batches in flight {}, model {}, activations {}, runtime {})",
        human_bytes(memory.total_bytes),
        human_bytes(memory.cache_bytes),
        human_bytes(memory.batches_in_flight_bytes),
        human_bytes(memory.model_bytes),
        human_bytes(memory.activation_bytes),
        human_bytes(memory.runtime_bytes),
    );
    if let Some(limit) = memory_limit
        && memory.total_bytes > limit
    {
        anyhow::bail!(
            "--memory {}: this run needs up to {} (caches {}, batches in flight {}, activations {}); give more memory, or fewer --loaders or a smaller --queue-depth",
            human_bytes(limit),
            human_bytes(memory.total_bytes),
            human_bytes(memory.cache_bytes),
            human_bytes(memory.batches_in_flight_bytes),
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
                human_bytes(m.gpu_cache.rows * m.dataset.store_row_bytes())
            ),
            Some(_) => {}
            None => tracing::warn!(
                "cuda:{index}: the CUDA runtime's free memory could not be read; the GPU statement is not checked"
            ),
        }
    }
    let ranks = match (&group, a.emulate_ranks) {
        (Some(g), _) => train::Ranks::Group(g),
        (None, Some(n)) => train::Ranks::Emulated(n),
        (None, None) => train::Ranks::One,
    };
    let mut summary = train::train_ranks(&layout, &engine, &cfg, ranks, a.trace_params.as_deref())?;
    summary.machine_share = share;
    if writer {
        report::summary(&summary, &memory);
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
            group.as_ref().map_or(0, |g| g.rank),
            summary.world_size
        );
    }
    Ok(())
}

fn export_command(a: ExportArgs) -> anyhow::Result<()> {
    use anyhow::Context;
    let manifest = a
        .manifest
        .as_deref()
        .map(|location| {
            let (dir, name) = location.rsplit_once('/').unwrap_or((".", location));
            let store = offgnn_shared::store::Store::open(dir)?;
            let bytes = store.get(name)?;
            anyhow::Ok(offgnn_manifests::Manifest::parse(location, &bytes)?)
        })
        .transpose()
        .with_context(|| {
            format!(
                "reading {}",
                offgnn_shared::store::redact(a.manifest.as_deref().unwrap_or_default())
            )
        })?;
    let written = train::export_checkpoint(
        &a.checkpoint_dir,
        &a.out,
        a.last,
        a.overwrite,
        manifest.as_ref(),
    )?;
    report::export_summary("export", &written);
    Ok(())
}

fn infer_command(a: InferArgs) -> anyhow::Result<()> {
    use offgnn_shared::dataset::Split;
    // Stops after its current group on SIGINT or SIGTERM; the work
    // directory keeps what is done, for a rerun to resume.
    offgnn_shared::signals::install();
    let device = device::parse_device(&a.device)?;
    let nodes = match a.nodes.as_str() {
        "all" => inference::NodeSet::All,
        "train" => inference::NodeSet::Split(Split::Train),
        "valid" => inference::NodeSet::Split(Split::Valid),
        "test" => inference::NodeSet::Split(Split::Test),
        path if path.ends_with(".npy") => inference::NodeSet::File(PathBuf::from(path)),
        other => anyhow::bail!(
            "--nodes {other}: expected all, train, valid, test or a .npy file of node ids"
        ),
    };
    let mut outputs = inference::Outputs::default();
    for column in a
        .outputs
        .split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
    {
        match column {
            "class" => {}
            "probabilities" => outputs.probabilities = true,
            "logits" => outputs.logits = true,
            "embeddings" | "embedding" => outputs.embeddings = true,
            other => anyhow::bail!(
                "--outputs {other}: expected class, probabilities, logits or embeddings"
            ),
        }
    }
    let memory = match a.memory.as_deref() {
        Some(m) => offgnn_shared::sizes::parse_bytes(m)?,
        None => memory::machine_memory() / 2,
    };
    let work_dir = a.work_dir.unwrap_or_else(|| {
        if a.out.contains("://") {
            PathBuf::from("offgnn-infer-work")
        } else {
            PathBuf::from(format!("{}.work", a.out.trim_end_matches('/')))
        }
    });
    let engine = offgnn_shared::io_engine::IoEngine::new(Default::default());
    let cfg = inference::InferConfig {
        model: a.model,
        dataset: a.dataset,
        out: a.out,
        nodes,
        outputs,
        device,
        memory,
        work_dir,
        overwrite: a.overwrite,
        add_reverse_edges: a.add_reverse_edges,
        keep_self_loops: !a.drop_self_loops,
        keep_duplicate_edges: a.keep_duplicate_edges,
        chunk_rows: a.chunk_rows,
        show_progress: true,
        interrupt_after_groups: None,
        hidden_f16: match a.hidden_dtype.as_str() {
            "f32" | "float32" => false,
            "f16" | "float16" => true,
            other => anyhow::bail!("--hidden-dtype {other}: expected f32 or f16"),
        },
        aggregate: match a.aggregate.as_str() {
            "auto" if device.is_cuda() => inference::Aggregate::Device,
            "auto" | "host" => inference::Aggregate::Host,
            "device" => inference::Aggregate::Device,
            other => anyhow::bail!("--aggregate {other}: expected auto, host or device"),
        },
    };
    match a.method.as_str() {
        "streamed" => {
            let summary = inference::infer(&cfg, &engine)?;
            report::infer_summary(&summary);
        }
        "naive" => {
            let e = inference::naive_first_layer(&cfg, &engine, a.naive_blocks)?;
            offgnn_shared::report::print_summary(
                "naive first layer (one read per in-edge)",
                &[
                    (
                        "sample",
                        format!(
                            "{} destinations, {} edges, {} reads, {}",
                            e.sample_destinations,
                            e.sample_edges,
                            e.reads,
                            human_bytes(e.bytes_read)
                        ),
                    ),
                    ("time", format!("{:.2} s", e.seconds)),
                    (
                        "extrapolated",
                        format!(
                            "{:.1} s for {} edges",
                            e.extrapolated_seconds, e.total_edges
                        ),
                    ),
                ],
                &serde_json::json!({ "command": "infer-naive", "summary": e }),
            );
        }
        other => anyhow::bail!("--method {other}: expected streamed or naive"),
    }
    Ok(())
}
