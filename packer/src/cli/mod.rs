//! The packer's command line: its flags (clap), the dispatch to packing and
//! `packer verify`, and the summaries it prints; the library returns figures
//! and this module prints them.

mod report;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::{pack, sizes, verify};

const EXAMPLES: &str = "\
Examples:
  # Pack Cora's features for the sampled batches, with a 3x disk budget:
  packer --samples data/cora-samples --features data/cora/data/feat.npy --out data/cora-pack \\
      --gpu-cache 1M --cpu-cache 2M --disk-budget 3x

  # The same as a batch job against S3, with 16 GiB of packing memory:
  packer --samples s3://bucket/cora/samples --features s3://bucket/cora/feat.npy \\
      --out s3://bucket/cora/pack --gpu-cache 4G --cpu-cache 32G --disk-budget 5x --memory 16G

  # Half-precision rows: half the disk bytes and reads, the caches hold twice the rows:
  packer --samples data/cora-samples --features data/cora/data/feat.npy --out data/cora-pack16 \\
      --gpu-cache 1M --cpu-cache 2M --disk-budget 3x --store-dtype bf16

  # Check a layout byte for byte against the feature file, then print its plan:
  packer verify --manifest data/cora-pack/manifest.json
  packer inspect --manifest data/cora-pack/manifest.json";

#[derive(Debug, Parser)]
#[command(
    name = "packer",
    version,
    about = "Packs node features into a disk-friendly layout for offline-sampled mini-batches (DiskGNN)",
    after_help = EXAMPLES,
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub pack: PackArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Rebuild every batch's features from the layout and compare with the feature file.
    Verify(ManifestArgs),
    /// Print the plan of a packed layout.
    Inspect(ManifestArgs),
}

#[derive(Debug, Args)]
pub struct ManifestArgs {
    #[arg(long)]
    pub manifest: String,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Packing {
    Batched,
    Individual,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum DiskCache {
    Segmented,
    Global,
}

/// How a disk cache's rows are ordered.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum RowOrderArg {
    /// Each row's 4 least batches under one random permutation (fewer pages read).
    Bottom4,
    /// DiskGNN's Algorithm 1: the least batch under each of 2 permutations.
    Minhash,
}

/// What ranks rows for the cache tiers.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum RankByArg {
    Samples,
    Graph,
}

/// How the CPU cache's rows change from batch to batch.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum CpuCachePolicyArg {
    /// The most-read rows, the same for every batch (DiskGNN).
    Static,
    /// Belady's policy over the sampled batch order (Ginex): one process
    /// trains it, in the sampled order.
    Belady,
    /// GIDS's window buffering (for comparison): each row read goes in,
    /// in place of a random row none of the next --cpu-cache-window
    /// batches reads; restored each epoch, one process, as belady.
    Window,
    /// Whichever of static and belady reads fewer bytes from disk.
    Auto,
}

/// How the layout stores feature values.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum StoreDtype {
    F32,
    F16,
    Bf16,
}

#[derive(Debug, Args)]
pub struct PackArgs {
    /// The sampler's output (a local path or object-store URL).
    #[arg(long)]
    pub samples: Option<String>,
    /// The node-feature .npy file. For a typed graph's samples: omitted,
    /// each type's file where the dataset names it; or TYPE=PATH entries
    /// (comma-separated) for the types whose files are elsewhere.
    #[arg(long)]
    pub features: Option<String>,
    /// Where the layout and manifest go.
    #[arg(long)]
    pub out: Option<String>,
    /// GPU-cache budget in bytes (suffixes K, M, G, T).
    #[arg(long, allow_hyphen_values = true)]
    pub gpu_cache: Option<String>,
    /// CPU-cache budget in bytes.
    #[arg(long, allow_hyphen_values = true)]
    pub cpu_cache: Option<String>,
    /// Disk budget for everything the layout writes: the GPU and CPU caches,
    /// the disk caches and packed chunks of every segment, and the address
    /// tables (each batch's compressed topology and row addresses). Bytes,
    /// or a multiple of the feature file such as 3x (of the file as
    /// --store-dtype stores it: 3x of a float32 file stored as f16 is 1.5
    /// times the file's bytes). A budget below the smallest layout is
    /// refused with the minimum and what it counts.
    #[arg(long, allow_hyphen_values = true)]
    pub disk_budget: Option<String>,
    /// Memory the packer may use (plan plus feature partitions); default 2G.
    #[arg(long, allow_hyphen_values = true)]
    pub memory: Option<String>,
    /// Batches per segment (searched under the disk budget when absent).
    #[arg(long)]
    pub segment_size: Option<usize>,
    #[arg(long, value_enum, default_value_t = Packing::Batched)]
    pub packing: Packing,
    #[arg(long, value_enum, default_value_t = DiskCache::Segmented)]
    pub disk_cache: DiskCache,
    /// How the layout stores feature values (default: as the feature file).
    /// f16 and bf16 halve a float32 file's disk bytes and the trainer's reads
    /// (rounded to nearest even while packing; the trainer widens them to
    /// float32); a float32 value beyond float16's range (65504) is refused
    /// with f16, where bf16 keeps float32's range with 8 bits of mantissa.
    #[arg(long, value_enum)]
    pub store_dtype: Option<StoreDtype>,
    /// How each disk cache's rows are ordered so that a batch's rows share
    /// pages: bottom4 (default) or DiskGNN's Algorithm 1 (the baseline).
    #[arg(long, value_enum, default_value_t = RowOrderArg::Bottom4)]
    pub row_order: RowOrderArg,
    /// How the CPU cache's rows change: static (the most-read rows
    /// throughout), belady (rows a batch read from disk replace those read
    /// again furthest ahead, over the sampled order; restored each epoch;
    /// data-parallel training refuses such a layout) or auto (whichever
    /// reads fewer bytes from disk, said in the summary), or window (GIDS's
    /// window buffering, for comparison).
    #[arg(long, value_enum, default_value_t = CpuCachePolicyArg::Auto)]
    pub cpu_cache_policy: CpuCachePolicyArg,
    /// What ranks rows for the GPU and CPU caches: samples (how many
    /// sampled batches read each row) or graph (each row's expected reads
    /// from the graph and the fan-outs alone, GIDS's reverse-PageRank hot
    /// set, for where no samples exist yet; it reads the dataset the
    /// samples came from).
    #[arg(long, value_enum, default_value_t = RankByArg::Samples)]
    pub rank_by: RankByArg,
    /// The window policy's look-ahead, in batches (default 8).
    #[arg(long)]
    pub cpu_cache_window: Option<u32>,
    #[arg(long)]
    pub overwrite: bool,
}

/// Runs the parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    use anyhow::Context;
    match cli.command {
        Some(Command::Verify(args)) => {
            let s = verify::verify(&args.manifest, true).with_context(|| {
                format!("verifying {}", offgnn_shared::store::redact(&args.manifest))
            })?;
            report::verified(&s);
            Ok(())
        }
        Some(Command::Inspect(args)) => {
            let (store, name, origin) = verify::layout_location(&args.manifest)?;
            let bytes = store.get(&name)?;
            if offgnn_manifests::is_typed(&bytes) {
                let m = offgnn_manifests::TypedManifest::parse(&origin, &bytes)?;
                report::inspect_typed(&origin, &m);
            } else {
                let m = offgnn_manifests::Manifest::parse(&origin, &bytes)?;
                report::inspect(&origin, &m);
            }
            Ok(())
        }
        None => {
            // Packing stops at its next piece on SIGINT or SIGTERM and
            // removes what it wrote.
            offgnn_shared::signals::install();
            let a = cli.pack;
            let need = |v: &Option<String>, flag: &str| {
                v.clone()
                    .ok_or_else(|| anyhow::anyhow!("{flag} is required (see packer --help)"))
            };
            let samples = need(&a.samples, "--samples")?;
            // A typed graph's feature files are where its dataset names
            // them, unless --features names them TYPE=PATH.
            let typed = crate::typed::is_typed_run(&samples)?;
            let cfg = pack::PackConfig {
                features: match typed {
                    true => a.features.clone().unwrap_or_default(),
                    false => need(&a.features, "--features")?,
                },
                samples,
                out: need(&a.out, "--out")?,
                gpu_cache: sizes::parse_bytes(&need(&a.gpu_cache, "--gpu-cache")?)?,
                cpu_cache: sizes::parse_bytes(&need(&a.cpu_cache, "--cpu-cache")?)?,
                disk_budget: sizes::parse_budget(&need(&a.disk_budget, "--disk-budget")?)?,
                memory: match &a.memory {
                    Some(m) => sizes::parse_bytes(m)?,
                    None => DEFAULT_MEMORY,
                },
                segment_size: a.segment_size,
                packing: match a.packing {
                    Packing::Batched => pack::PackingMode::Batched,
                    Packing::Individual => pack::PackingMode::Individual,
                },
                disk_cache: match a.disk_cache {
                    DiskCache::Segmented => pack::DiskCacheMode::Segmented,
                    DiskCache::Global => pack::DiskCacheMode::Global,
                },
                store_dtype: a.store_dtype.map(|d| match d {
                    StoreDtype::F32 => pack::Dtype::F32,
                    StoreDtype::F16 => pack::Dtype::F16,
                    StoreDtype::Bf16 => pack::Dtype::BF16,
                }),
                row_order: match a.row_order {
                    RowOrderArg::Bottom4 => pack::RowOrder::DEFAULT,
                    RowOrderArg::Minhash => pack::RowOrder::MinHash { functions: 2 },
                },
                cpu_cache_policy: match a.cpu_cache_policy {
                    p if a.cpu_cache_window.is_some()
                        && !matches!(p, CpuCachePolicyArg::Window) =>
                    {
                        anyhow::bail!(
                            "--cpu-cache-window is the window policy's look-ahead: pass --cpu-cache-policy window with it"
                        )
                    }
                    CpuCachePolicyArg::Static => pack::CpuCachePolicy::Static,
                    CpuCachePolicyArg::Belady => pack::CpuCachePolicy::Belady,
                    CpuCachePolicyArg::Window => pack::CpuCachePolicy::Window {
                        batches: match a.cpu_cache_window {
                            Some(0) => anyhow::bail!("--cpu-cache-window must be at least 1 batch"),
                            Some(w) => w,
                            None => 8,
                        },
                    },
                    CpuCachePolicyArg::Auto => pack::CpuCachePolicy::Auto,
                },
                rank_by: match a.rank_by {
                    RankByArg::Samples => pack::RankBy::Samples,
                    RankByArg::Graph => pack::RankBy::Graph,
                },
                overwrite: a.overwrite,
                show_progress: true,
            };
            let context = || format!("packing into {}", offgnn_shared::store::redact(&cfg.out));
            // A run refused before its commit removes its objects; the
            // directories it made for them go too, where left empty.
            let created = offgnn_shared::store::Store::to_be_created(&cfg.out);
            let packed = if typed {
                crate::typed::pack_typed(&cfg).map(|s| report::packed_typed(&s))
            } else {
                pack::pack(&cfg).map(|s| report::packed(&cfg, &s))
            };
            if packed.is_err()
                && let Some(dir) = &created
            {
                offgnn_shared::store::remove_if_empty(Some(&dir.join("pack")));
                offgnn_shared::store::remove_if_empty(Some(dir));
            }
            packed.with_context(context)?;
            Ok(())
        }
    }
}

/// Packing memory when --memory is not given.
pub const DEFAULT_MEMORY: u64 = 2 << 30;
