//! `trainer infer`: its flags, read into an inference configuration, and
//! the run's summary printed.

use std::path::PathBuf;

use clap::Args;
use offgnn_shared::dataset::Split;

use super::report;
use crate::{device, inference, memory};

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
    /// The graph as the sampler built it: with --add-reverse-edges. The
    /// model's card records its graph, which is built by default; a flag
    /// that contradicts it is refused (see --graph-override).
    #[arg(long)]
    pub add_reverse_edges: bool,
    /// The graph as the sampler built it: with --drop-self-loops.
    #[arg(long)]
    pub drop_self_loops: bool,
    /// The graph as the sampler built it: with --keep-duplicate-edges
    /// (a repeated edge counts once per repeat in the aggregation).
    #[arg(long)]
    pub keep_duplicate_edges: bool,
    /// Build the graph as the three flags above give it, even where the
    /// model was trained on another (the summary says so).
    #[arg(long)]
    pub graph_override: bool,
    /// Rows per source chunk (default: from --memory).
    #[arg(long, hide = true)]
    pub chunk_rows: Option<u64>,
    /// streamed (the method above) or naive: the baseline that reads each
    /// in-neighbor's row with one read, timed on --naive-blocks blocks of
    /// 1024 destinations and extrapolated; writes no output.
    #[arg(long, default_value = "streamed")]
    pub method: String,
    /// `--method naive`: blocks of 1024 destinations timed before the
    /// whole run's time is extrapolated from them.
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

/// `trainer infer`: predictions and embeddings for the nodes asked, by the
/// streamed method or, timed on a sample, the naive one.
pub(super) fn infer_command(a: InferArgs) -> anyhow::Result<()> {
    // Stops after its current group on SIGINT or SIGTERM; the work
    // directory keeps what is done, for a rerun to resume.
    offgnn_shared::signals::install();
    let device = device::parse_device(&a.device)?;
    let nodes = node_set(&a.nodes)?;
    let outputs = output_columns(&a.outputs)?;
    let memory = match a.memory.as_deref() {
        Some(m) => offgnn_shared::sizes::parse_bytes(m)?,
        None => memory::machine_memory() / 2,
    };
    let engine = offgnn_shared::io_engine::IoEngine::new(Default::default());
    let (method, naive_blocks) = (a.method.clone(), a.naive_blocks);
    let host_asked = a.aggregate == "host";
    let cfg = infer_config(a, nodes, outputs, device, memory)?;
    // A run refused before it writes leaves no output directory it made.
    let created = offgnn_shared::store::Store::to_be_created(&cfg.out);
    let result = run_infer(&cfg, &engine, (&method, naive_blocks), host_asked);
    if result.is_err() {
        offgnn_shared::store::remove_if_empty(created.as_deref());
    }
    result
}

/// Runs the inference `cfg` asks for by `method` and prints its summary.
fn run_infer(
    cfg: &inference::InferConfig,
    engine: &offgnn_shared::io_engine::IoEngine,
    (method, naive_blocks): (&str, u64),
    host_asked: bool,
) -> anyhow::Result<()> {
    if crate::hetero::infer::is_typed_model(&cfg.model)? {
        if host_asked {
            anyhow::bail!(
                "--aggregate host is for homogeneous models; a typed model's relations aggregate with torch's ops on --device"
            );
        }
        if method != "streamed" {
            anyhow::bail!(
                "--method {method}: a typed model's inference has one method, layer by layer per relation"
            );
        }
        let summary = crate::hetero::infer::infer(cfg, engine)?;
        report::typed_infer_summary(&summary);
        return Ok(());
    }
    match method {
        "streamed" => {
            let summary = inference::infer(cfg, engine)?;
            report::infer_summary(&summary);
        }
        "naive" => {
            let e = inference::naive_first_layer(cfg, engine, naive_blocks)?;
            report::naive_summary(&e);
        }
        other => anyhow::bail!("--method {other}: expected streamed or naive"),
    }
    Ok(())
}

/// `--nodes`: all, a split, or a .npy file of node ids.
fn node_set(nodes: &str) -> anyhow::Result<inference::NodeSet> {
    Ok(match nodes {
        "all" => inference::NodeSet::All,
        "train" => inference::NodeSet::Split(Split::Train),
        "valid" => inference::NodeSet::Split(Split::Valid),
        "test" => inference::NodeSet::Split(Split::Test),
        path if path.ends_with(".npy") => inference::NodeSet::File(PathBuf::from(path)),
        other => anyhow::bail!(
            "--nodes {other}: expected all, train, valid, test or a .npy file of node ids"
        ),
    })
}

/// `--outputs`: the columns besides node_id and class.
fn output_columns(columns: &str) -> anyhow::Result<inference::Outputs> {
    let mut outputs = inference::Outputs::default();
    for column in columns.split(',').map(str::trim).filter(|c| !c.is_empty()) {
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
    Ok(outputs)
}

/// The inference configuration of the flags, with the values read above.
fn infer_config(
    a: InferArgs,
    nodes: inference::NodeSet,
    outputs: inference::Outputs,
    device: tch::Device,
    memory: u64,
) -> anyhow::Result<inference::InferConfig> {
    let work_dir = a.work_dir.unwrap_or_else(|| {
        if a.out.contains("://") {
            PathBuf::from("offgnn-infer-work")
        } else {
            PathBuf::from(format!("{}.work", a.out.trim_end_matches('/')))
        }
    });
    Ok(inference::InferConfig {
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
        graph_override: a.graph_override,
        chunk_rows: a.chunk_rows,
        show_progress: true,
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
    })
}
