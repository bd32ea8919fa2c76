//! The sampler's command line: its flags (clap), the dispatch to sampling and
//! the dataset tools, and the summaries it prints; the library returns
//! figures and this module prints them.

mod dataset_tools;
mod report;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::{array_job, config, sample_run};

const EXAMPLES: &str = "\
Examples:
  # A synthetic graph with a learnable task (10M nodes, 128-d features):
  sampler generate --out data/synth10m --nodes 10000000 --feature-dim 128

  # Import Parquet node and edge tables (Cora from graphdatascience):
  sampler import-parquet --nodes cora_nodes.parquet.gzip --edges cora_rels.parquet.gzip \\
      --preset cora --out data/cora

  # Check a GraphBolt OnDiskDataset directory and print its shape:
  sampler inspect --dataset data/cora

  # Sample mini-batches for 2 epochs into an object store:
  sampler --dataset data/cora --out s3://bucket/cora/samples --fanout 10,15,20 --batch-size 1024 --epochs 2

  # The same as 8 tasks of a Slurm job array (each finds its shard in SLURM_ARRAY_*):
  sbatch --array=0-7 --wrap 'sampler --dataset data/cora --out s3://bucket/cora/samples --epochs 2'";

#[derive(Debug, Parser)]
#[command(
    name = "sampler",
    version,
    about = "Offline neighbor sampling of GNN mini-batches, and the dataset tools that feed it",
    after_help = EXAMPLES,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub sample: SampleArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write a synthetic graph (degree-corrected SBM, power-law degrees) as an OnDiskDataset.
    Generate(GenerateArgs),
    /// Import Parquet node and edge tables into an OnDiskDataset.
    ImportParquet(ImportArgs),
    /// Validate a dataset directory (edges included) and print its shape.
    Inspect(InspectArgs),
    /// Hold out edges for link prediction: a new dataset whose graph lacks
    /// them (both ways) and whose link_prediction task ranks each against
    /// its negatives.
    SplitEdges(SplitEdgesArgs),
    /// Typed graphs: give a node type without features the mean of its
    /// in-neighbours' rows over a relation (a new dataset, the input's
    /// files hard-linked).
    DeriveFeatures(DeriveArgs),
}

/// Neighbor sampling (the default command).
#[derive(Debug, Args)]
pub struct SampleArgs {
    /// Dataset directory (GraphBolt OnDiskDataset with metadata.yaml).
    #[arg(long)]
    pub dataset: Option<PathBuf>,
    /// Where the samples go: a local path, or a file://, s3://, gs://, az://
    /// or http(s):// URL (a WebDAV server).
    #[arg(long)]
    pub out: Option<String>,
    /// Neighbors sampled per layer, input layer first (as DGL's
    /// NeighborSampler). A typed graph: each destination draws this many
    /// over each relation reaching its type; `--fanout REL=LIST` (repeated)
    /// sets one relation's.
    #[arg(long, default_value = "10,15,20")]
    pub fanout: Vec<String>,
    #[arg(long, default_value_t = 1024)]
    pub batch_size: usize,
    /// Validation and test batches: seeds per batch, or with --task link
    /// pairs per batch (whole queries, at least one). Default: --batch-size;
    /// with --task link at least 4096 pairs (a query is a positive and its
    /// 100 or 1000 negatives, and evaluation keeps no gradients: larger
    /// batches rank several times faster).
    #[arg(long)]
    pub eval_batch_size: Option<usize>,
    /// Epochs of training batches to sample (validation and test are sampled once).
    #[arg(long, default_value_t = 1)]
    pub epochs: u32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Sampling threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// This process's shard, 0-based, of --num-shards. Default: the index
    /// of the array-job task this runs as: JOB_COMPLETION_INDEX (Kubernetes
    /// Indexed Job), AWS_BATCH_JOB_ARRAY_INDEX (AWS Batch array job),
    /// SLURM_ARRAY_TASK_ID less SLURM_ARRAY_TASK_MIN (Slurm job array);
    /// else 0. Give both flags to override an array job's own.
    #[arg(long)]
    pub shard: Option<u32>,
    /// Shards the run is split into; the last shard to finish commits.
    /// Default: OFFGNN_NUM_SHARDS, or the array's size
    /// (AWS_BATCH_JOB_ARRAY_SIZE, SLURM_ARRAY_TASK_COUNT); else 1. A
    /// Kubernetes Indexed Job does not tell its pods its completions: set
    /// OFFGNN_NUM_SHARDS to them.
    #[arg(long)]
    pub num_shards: Option<u32>,
    /// Replace a committed run at --out.
    #[arg(long)]
    pub overwrite: bool,
    /// Batches per Parquet file.
    #[arg(long, default_value_t = 64)]
    pub batches_per_file: u32,
    /// Add the reverse of every edge (sample over an undirected graph).
    #[arg(long)]
    pub add_reverse_edges: bool,
    /// Refuse to start if the run's stated peak memory (logged at the start
    /// and in the summary) exceeds this, e.g. 8G.
    #[arg(long)]
    pub memory: Option<String>,
    /// Drop self-loops.
    #[arg(long)]
    pub drop_self_loops: bool,
    /// What the batches are for: node classification (the dataset's
    /// node_classification task), or link prediction (its link_prediction
    /// task, as `sampler split-edges` writes it): training pairs with drawn
    /// negatives and their own edges excluded from their blocks, and
    /// validation and test queries with their given negatives.
    #[arg(long, value_enum, default_value_t = TaskKind::Node)]
    pub task: TaskKind,
    /// --task link: negatives drawn per positive training pair.
    #[arg(long, default_value_t = 1)]
    pub negatives: u32,
    /// --task link: how a negative's destination is drawn.
    #[arg(long, value_enum, default_value_t = crate::config::NegativeKind::Uniform)]
    pub negative_sampler: crate::config::NegativeKind,
    /// Keep repeated (source, destination) edges, as DGL does: a repeated
    /// neighbor can then be sampled more than once. By default each pair
    /// is kept once (the count dropped is logged and in the summary).
    #[arg(long)]
    pub keep_duplicate_edges: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TaskKind {
    Node,
    Link,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum FeatureDtype {
    F32,
    F16,
}

impl From<FeatureDtype> for offgnn_shared::npy::DType {
    fn from(d: FeatureDtype) -> Self {
        match d {
            FeatureDtype::F32 => offgnn_shared::npy::DType::F32,
            FeatureDtype::F16 => offgnn_shared::npy::DType::F16,
        }
    }
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Output dataset directory (must not exist unless --overwrite).
    #[arg(long)]
    pub out: PathBuf,
    #[arg(long, default_value_t = 100_000)]
    pub nodes: u64,
    /// Average (undirected) degree.
    #[arg(long, default_value_t = 10.0)]
    pub avg_degree: f64,
    #[arg(long, default_value_t = 128)]
    pub feature_dim: u64,
    #[arg(long, value_enum, default_value_t = FeatureDtype::F32)]
    pub dtype: FeatureDtype,
    /// Communities, which are the class labels.
    #[arg(long, default_value_t = 16)]
    pub classes: u32,
    #[arg(long, default_value_t = 0.1, allow_negative_numbers = true)]
    pub train_fraction: f64,
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true)]
    pub valid_fraction: f64,
    /// Test fraction (default: every node not in train or validation).
    #[arg(long, allow_negative_numbers = true)]
    pub test_fraction: Option<f64>,
    /// Probability that an edge stays inside its community.
    #[arg(long, default_value_t = 0.8)]
    pub homophily: f64,
    /// Exponent of the power-law degree distribution (> 2).
    #[arg(long, default_value_t = 2.5)]
    pub power_law: f64,
    /// Strength of the class signal in the features, against unit noise.
    #[arg(long, default_value_t = crate::synthetic::GeneratorConfig::default().signal)]
    pub signal: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[arg(long)]
    pub overwrite: bool,
    /// The graph's types: one node type and one edge type, or IGBH's
    /// (paper, author, institute, fos; cites, written_by, affiliated_to,
    /// topic and their reverses), where --nodes counts the papers and
    /// --classes their classes.
    #[arg(long, value_enum, default_value_t = Schema::Homogeneous)]
    pub schema: Schema,
    /// --schema igbh: node types written without a feature file
    /// (comma-separated), as MAG240M's authors and institutions have none.
    #[arg(long, value_delimiter = ',')]
    pub no_features: Vec<String>,
    /// --schema igbh: node types whose rows are not --feature-dim wide, as
    /// TYPE=WIDTH (comma-separated), e.g. `author=64,fos=32`.
    #[arg(long, value_delimiter = ',', value_parser = parse_type_dim)]
    pub type_dims: Vec<(String, u64)>,
}

fn parse_type_dim(s: &str) -> Result<(String, u64), String> {
    let (t, d) = s
        .split_once('=')
        .ok_or_else(|| format!("'{s}' is not TYPE=WIDTH"))?;
    let d = d
        .parse()
        .map_err(|_| format!("'{s}': the width '{d}' is not a whole number"))?;
    Ok((t.to_string(), d))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Schema {
    Homogeneous,
    Igbh,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Preset {
    /// The Cora tables of graphdatascience: nodeId, features, subject; sourceNodeId, targetNodeId.
    Cora,
}

#[derive(Debug, Args)]
pub struct ImportArgs {
    /// Parquet node table: one row per node with an id, a feature list and
    /// a label. A typed graph: `TYPE=PATH`, once per node type (a type's
    /// table may lack the feature column: no features; only the
    /// --target-type's needs labels).
    #[arg(long, required = true)]
    pub nodes: Vec<String>,
    /// Parquet edge table: one row per edge with a source and a target id.
    /// A typed graph: `SRC:RELATION:DST=PATH`, once per relation, its ids
    /// those of the two types' tables.
    #[arg(long, required = true)]
    pub edges: Vec<String>,
    /// A typed graph: the node type whose labels the task learns.
    #[arg(long)]
    pub target_type: Option<String>,
    /// Output dataset directory (must not exist unless --overwrite).
    #[arg(long)]
    pub out: PathBuf,
    /// Column names and options of a known export.
    #[arg(long, value_enum)]
    pub preset: Option<Preset>,
    #[arg(long)]
    pub name: Option<String>,
    #[arg(long, default_value = "id")]
    pub id_column: String,
    #[arg(long, default_value = "features")]
    pub features_column: String,
    #[arg(long, default_value = "label")]
    pub label_column: String,
    #[arg(long, default_value = "source")]
    pub source_column: String,
    #[arg(long, default_value = "target")]
    pub target_column: String,
    /// Also write the reverse of every edge (on by default with --preset cora).
    #[arg(long)]
    pub add_reverse: bool,
    #[arg(long, value_enum, default_value_t = FeatureDtype::F32)]
    pub dtype: FeatureDtype,
    #[arg(long, default_value_t = 0.6, allow_negative_numbers = true)]
    pub train_fraction: f64,
    #[arg(long, default_value_t = 0.2, allow_negative_numbers = true)]
    pub valid_fraction: f64,
    #[arg(long, default_value_t = 0)]
    pub split_seed: u64,
    #[arg(long)]
    pub overwrite: bool,
}

#[derive(Debug, Args)]
pub struct SplitEdgesArgs {
    /// The dataset whose edges are split.
    #[arg(long)]
    pub dataset: PathBuf,
    /// Output dataset directory (must not exist unless --overwrite).
    #[arg(long)]
    pub out: PathBuf,
    /// Share of the node pairs held out for validation.
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true)]
    pub valid: f64,
    /// Share of the node pairs held out for test.
    #[arg(long, default_value_t = 0.1, allow_negative_numbers = true)]
    pub test: f64,
    /// Negatives drawn for each held-out pair (OGB's citation2 ranks
    /// against 1000).
    #[arg(long, default_value_t = 1000)]
    pub negatives: u32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Typed graphs: the relation `src:relation:dst` whose edges are split
    /// and predicted.
    #[arg(long)]
    pub relation: Option<String>,
    /// Typed graphs: the relation that stores --relation's edges the other
    /// way, whose copies of the held-out pairs go too (default:
    /// `dst:rev_relation:src` where the graph has it).
    #[arg(long)]
    pub reverse: Option<String>,
    #[arg(long)]
    pub overwrite: bool,
}

#[derive(Debug, Args)]
pub struct DeriveArgs {
    /// A typed dataset.
    #[arg(long)]
    pub dataset: PathBuf,
    /// Output dataset directory (must not exist unless --overwrite).
    #[arg(long)]
    pub out: PathBuf,
    /// A relation `src:relation:dst` whose destination type has no
    /// features: each such node gets the mean of its sources' rows. Repeat
    /// it, in order, to derive from rows derived before (authors from
    /// papers, then institutes from authors).
    #[arg(long = "derive", required = true)]
    pub relations: Vec<String>,
    /// Memory for the accumulators and edges of one pass, e.g. 8G (larger:
    /// fewer passes over the edges).
    #[arg(long, default_value = "2G")]
    pub memory: String,
    #[arg(long)]
    pub overwrite: bool,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    #[arg(long)]
    pub dataset: PathBuf,
    /// Add the reverse of every edge when building the CSR.
    #[arg(long)]
    pub add_reverse: bool,
    /// Drop repeated edges when building the CSR.
    #[arg(long)]
    pub dedup: bool,
    /// Drop self-loops when building the CSR.
    #[arg(long)]
    pub drop_self_loops: bool,
}

/// Runs the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Some(Command::Generate(args)) => {
            stop_writing_on_signal("generating", &args.out);
            dataset_tools::generate(&args)
        }
        Some(Command::ImportParquet(args)) => {
            stop_writing_on_signal("importing into", &args.out);
            dataset_tools::import_parquet(&args)
        }
        Some(Command::Inspect(args)) => dataset_tools::inspect(&args),
        Some(Command::SplitEdges(args)) => {
            stop_writing_on_signal("splitting edges into", &args.out);
            dataset_tools::split_edges(&args)
        }
        Some(Command::DeriveFeatures(args)) => {
            stop_writing_on_signal("deriving features into", &args.out);
            dataset_tools::derive_features(&args)
        }
        None => {
            // Sampling stops at its next file window on SIGINT or SIGTERM
            // and removes what it wrote; `inspect` writes nothing and keeps
            // the default (it ends at once).
            offgnn_shared::signals::install();
            sample(cli.sample)
        }
    }
}

/// `generate` and `import-parquet` stop on SIGINT or SIGTERM: their
/// writing has no safe point to poll, so a thread of their own removes the
/// partial dataset (`.NAME.partial-PID` beside `out`), keeps it from being
/// committed, says so in one line and ends the process with the signal's
/// status. A dataset already at `out` is untouched.
fn stop_writing_on_signal(doing: &'static str, out: &std::path::Path) {
    let out = out.to_path_buf();
    offgnn_shared::signals::on_first(move |signal| {
        // Stderr is held from the removal to the exit: the writer, its
        // directory gone, fails too, and its error would be printed beside
        // this line; holding the lock, it waits until the process has ended.
        let _stderr = std::io::stderr().lock();
        let found = offgnn_shared::dataset::abandon_partial();
        let list = |dirs: &[std::path::PathBuf]| {
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let what = if !found.committed.is_empty() {
            format!("{} was committed before it", list(&found.committed))
        } else if found.removed.is_empty() {
            "nothing was written".to_string()
        } else {
            let kept = if out.exists() {
                "; the dataset there is untouched"
            } else {
                ""
            };
            format!("removed the partial dataset {}{kept}", list(&found.removed))
        };
        eprintln!(
            "error: {doing} {}: stopped by {signal}: {what}",
            out.display()
        );
        let code = offgnn_shared::signals::exit_status().unwrap_or(1);
        std::process::exit(i32::from(code));
    });
}

fn sample(args: SampleArgs) -> anyhow::Result<()> {
    use anyhow::Context;
    let (Some(dataset), Some(out)) = (args.dataset, args.out) else {
        anyhow::bail!("--dataset and --out are required (see sampler --help)");
    };
    let shards = array_job::resolve(args.shard, args.num_shards, &|name| {
        std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
    })?;
    if let Some(line) = shards.log_line() {
        tracing::info!("{line}");
    }
    if let Some(line) = &shards.overridden {
        tracing::warn!("{line}");
    }
    let (fanouts, relation_fanouts) = config::resolve_fanouts(&args.fanout, &dataset)?;
    let cfg = config::SampleConfig {
        dataset,
        out,
        fanouts,
        relation_fanouts,
        batch_size: args.batch_size,
        eval_batch_size: args.eval_batch_size.or_else(|| {
            (args.task == TaskKind::Link).then(|| args.batch_size.max(config::LINK_EVAL_PAIRS))
        }),
        epochs: args.epochs,
        seed: args.seed,
        threads: args
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        shard: shards.shard,
        num_shards: shards.num_shards,
        overwrite: args.overwrite,
        batches_per_file: args.batches_per_file,
        csr: crate::topology::CsrOptions {
            add_reverse: args.add_reverse_edges,
            dedup: !args.keep_duplicate_edges,
            keep_self_loops: !args.drop_self_loops,
            // Set from the run's memory statement, once the dataset's shape is known.
            hold_bytes: 0,
        },
        show_progress: true,
        memory_limit: args
            .memory
            .as_deref()
            .map(offgnn_shared::sizes::parse_bytes)
            .transpose()?,
        link: (args.task == TaskKind::Link).then_some(config::LinkOptions {
            negatives: args.negatives,
            sampler: args.negative_sampler,
        }),
    };
    let outcome = sample_run::run(&cfg)
        .with_context(|| format!("sampling into {}", offgnn_shared::store::redact(&cfg.out)))?;
    report::print(&cfg, &outcome);
    Ok(())
}
