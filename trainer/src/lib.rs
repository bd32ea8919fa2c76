//! The `trainer` program: trains GraphSAGE or GAT from a packed feature
//! layout through a pipelined loop, with libtorch via `tch`. `main.rs` only
//! parses flags and calls [`run`].

pub mod device;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

const EXAMPLES: &str = "\
Examples:
  # Train GraphSAGE on a local layout, on the first GPU:
  trainer --manifest data/cora-pack/manifest.json --model sage --device cuda --epochs 20

  # Pull a layout from S3 to local NVMe and train GAT with metrics and checkpoints:
  trainer --manifest s3://bucket/cora/pack/manifest.json --local-dir /nvme/cora \\
      --model gat --device cuda:0 --metrics metrics.jsonl --checkpoint-dir ckpt

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
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Model {
    Sage,
    Gat,
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
    #[arg(long, default_value_t = 256)]
    pub hidden: i64,
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
    #[arg(long)]
    pub resume: bool,
}

/// Runs the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Some(Command::Info) => device::print_info(),
        None => {
            let args = cli.train;
            device::parse_device(&args.device)?;
            if args.manifest.is_none() {
                anyhow::bail!("--manifest is required (see trainer --help)");
            }
            anyhow::bail!("training is not built yet: the packer's manifest does not exist yet")
        }
    }
}
