//! The `trainer` command line: its flags (clap derive) and [`run`], which
//! hands each command to its module and prints what the library returns.

mod export;
mod infer;
mod info;
mod report;
mod train;
mod typed_train;

use clap::{Parser, Subcommand};

pub use export::ExportArgs;
pub use infer::InferArgs;
pub use train::{Features, Model, OnOff, TrainArgs};

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

  # A link-prediction model: every node's embedding, then scores for pairs:
  trainer infer --model models/lp-sage --dataset data/lp --out emb --outputs embeddings
  trainer score --model models/lp-sage --embeddings emb --pairs pairs.npy --out scores.npy

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
    /// A link-prediction model's scores for given node pairs, from the
    /// embeddings `trainer infer --outputs embeddings` wrote with it.
    Score(ScoreArgs),
    /// Check an export (model.json, the weights' checksum, every parameter's
    /// name and shape) and print what it holds.
    ShowModel {
        /// The export: a directory or an object-store URL.
        #[arg(long)]
        model: String,
    },
    /// Measure the random-read rate of the disk holding FILE at 1 to 256
    /// reads in flight, and the depth `--io-depth auto` takes from it (the
    /// knee: the fewest in flight from which every depth up to the best is
    /// within 95% of it). Kept per machine.
    ProbeDisk {
        /// A file of at least a few MiB on the disk to measure (a layout's
        /// segment).
        #[arg(long)]
        file: std::path::PathBuf,
        /// Measure again even where a curve of this disk is kept.
        #[arg(long)]
        fresh: bool,
    },
}

/// Runs the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Some(Command::Info) => info::print_info(),
        Some(Command::Export(a)) => export::export_command(a),
        Some(Command::Infer(a)) => infer::infer_command(*a),
        Some(Command::Score(a)) => score_command(a),
        Some(Command::ShowModel { model }) => export::show_model(&model),
        Some(Command::ProbeDisk { file, fresh }) => info::probe_disk(&file, fresh),
        None => {
            // Training stops at its next batch on SIGINT or SIGTERM, with a
            // checkpoint when --checkpoint-dir is set.
            offgnn_shared::signals::install();
            train::train_command(cli.train)
        }
    }
}

/// `trainer score`'s flags.
#[derive(Debug, clap::Args)]
pub struct ScoreArgs {
    /// The export of a link-prediction model (a directory or an
    /// object-store URL).
    #[arg(long)]
    pub model: String,
    /// The output of `trainer infer --outputs embeddings` with that model.
    #[arg(long)]
    pub embeddings: String,
    /// A .npy of node pairs, shape [N, 2], any integer type.
    #[arg(long)]
    pub pairs: std::path::PathBuf,
    /// Where the N scores go: a .npy of float32 logits (the sigmoid of a
    /// logit is the model's probability of an edge).
    #[arg(long)]
    pub out: std::path::PathBuf,
    /// Replace a file at --out.
    #[arg(long)]
    pub overwrite: bool,
}

/// `trainer score`: the pairs' scores, then the summary.
fn score_command(a: ScoreArgs) -> anyhow::Result<()> {
    offgnn_shared::signals::install();
    let s = crate::link::score(&crate::link::ScoreConfig {
        model: a.model,
        embeddings: a.embeddings,
        pairs: a.pairs,
        out: a.out,
        overwrite: a.overwrite,
    })?;
    report::score_summary(&s);
    Ok(())
}
