//! The orchestrator of `trainer infer`: checks the model against the
//! dataset and the output, plans the run, resumes where a killed run of
//! the same plan stopped, buckets the edges, runs the layers' passes, and
//! commits the result.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use offgnn_manifests::GraphOptions;
use offgnn_shared::commit::{self, Previous, RunId};
use offgnn_shared::dataset::Dataset;
use offgnn_shared::io_engine::IoEngine;
use offgnn_shared::lease::Lease;
use offgnn_shared::report::human_bytes;
use offgnn_shared::store::Store;

use super::edges::{bucket_edges, edge_file};
use super::hidden_rows::hidden_elem;
use super::layers::{Model, graph_layers_of};
use super::output::{OutputWriter, selection};
use super::passes::Passes;
use super::plan::{RunPlan, plan_run};
use super::resume::{
    Claim, Progress, claim, clear_work_dir, forget_progress, hold_work_dir, missing_parts, run_key,
    save_progress,
};
use super::stream::Input;
use super::{COMMIT, InferConfig, InferSummary, Outputs, PAGE};
use crate::error::{Error, Result};
use crate::export::ModelCard;

/// Runs inference as configured. Stopped by SIGINT or SIGTERM, it keeps
/// the groups it finished, for the same command to resume.
pub fn infer(cfg: &InferConfig, engine: &IoEngine) -> Result<InferSummary> {
    let result = infer_run(cfg, engine);
    match offgnn_shared::signals::received() {
        Some(signal) if result.is_err() => Err(Error::Stopped(format!(
            "stopped by {signal}: the groups finished so far are kept in {} (and their parts under --out, uncommitted); run the same command again to resume",
            cfg.work_dir.display()
        ))),
        _ => result.map_err(|e| {
            if e.disk_full() {
                Error::Stopped(format!(
                    "{e}: the disk is full; the groups finished so far are kept in {} (and their parts under --out, uncommitted): free space and run the same command again to resume",
                    cfg.work_dir.display()
                ))
            } else {
                e
            }
        }),
    }
}

/// The dataset's local directory: `--dataset` itself, or for a URL its
/// copy staged into the work directory (kept there, so a rerun downloads
/// nothing again).
pub(crate) fn local_dataset(cfg: &InferConfig) -> Result<PathBuf> {
    crate::staging::resolve_dataset(
        &cfg.dataset,
        &cfg.work_dir.join("dataset"),
        cfg.show_progress,
    )
}

fn infer_run(cfg: &InferConfig, engine: &IoEngine) -> Result<InferSummary> {
    let started = Instant::now();
    let model = Model::load(&cfg.model, cfg.device)?;
    let card = &model.card;
    let cfg = &outputs_of(cfg, card.scorer)?;
    let (cfg, graph_override) = &graph_of(cfg, card)?;
    let ds = Dataset::open(&local_dataset(cfg)?)?;
    let fingerprint = ds.fingerprint()?;
    check_dataset(cfg, card, &ds, &fingerprint)?;
    let out = Store::open(&cfg.out)?;
    let previous = commit::read(&out, COMMIT)?;
    check_output(cfg, card, &out, previous.as_ref())?;
    let bits = selection(&ds, &cfg.nodes)?;
    let _held = hold_work_dir(&cfg.work_dir)?;
    let run_plan = plan_run(cfg, &model, &ds, &bits, &out)?;
    let plan = &run_plan.plan;
    // Resume where a run of the same model, data and plan stopped.
    let key = run_key(cfg, &card.weights_sha256, &fingerprint, plan, &bits);
    let Claim {
        mut progress,
        run_id,
        lease,
        swept,
    } = claim::<Progress>(&cfg.work_dir, &out, &key, previous.as_ref())?;
    let edges_bucketed = prepare_work_dir(cfg, &ds, &model, &run_plan, &mut progress)?;
    let features = Input {
        path: ds.features.path().to_path_buf(),
        data_offset: ds.features.header().data_offset,
        rows: ds.num_nodes,
        width: ds.feature_dim() as usize,
        dtype: ds.features.dtype(),
        pinned: cfg.device.is_cuda(),
        features: true,
    };
    let classes = card.out_channels as usize;
    let output = OutputWriter::new(&out, &run_id, cfg.outputs, classes, &run_plan.output)?;
    let mut passes = Passes::new(cfg, engine, &model, &run_plan, &bits, features, output);
    passes.run(&mut progress)?;
    let edges = match edges_bucketed {
        Some(edges) => edges,
        None => bucketed_edges(cfg, &model, &run_plan, ds.num_nodes),
    };
    let summary = InferSummary {
        format_version: 1,
        run_id: run_id.to_string(),
        model: offgnn_shared::store::redact(&cfg.model),
        architecture: card.architecture,
        weights_sha256: card.weights_sha256.clone(),
        dataset: cfg.dataset.clone(),
        dataset_fingerprint: fingerprint,
        num_nodes: ds.num_nodes,
        edges,
        nodes_written: progress.nodes_written,
        columns: columns(cfg),
        files: progress.run.output_files.clone(),
        groups: plan.groups.len() as u64,
        chunk_rows: plan.chunk_rows,
        omp_wait_policy: std::env::var(crate::OMP_WAIT_POLICY).unwrap_or_default(),
        memory_limit: cfg.memory,
        memory_planned: plan.planned_bytes,
        layers: progress.figures.clone(),
        edge_bucketing_seconds: progress.edge_bucketing_seconds,
        seconds: started.elapsed().as_secs_f64(),
        device: format!("{:?}", cfg.device),
        aggregate: cfg.aggregate,
        graph_override: graph_override.clone(),
        leftovers_removed: swept,
    };
    let json = serde_json::to_vec_pretty(&summary).expect("summary serializes");
    let clear = || clear_work_dir(&cfg.work_dir, card.num_layers, plan.groups.len());
    commit_result(
        (&cfg.work_dir, &clear),
        &out,
        (json, &summary.files),
        (&run_id, &lease),
        previous.as_ref(),
    )?;
    // The work directory's files are ours; the result is committed.
    clear();
    Ok(summary)
}

/// The columns a model writes: a link-prediction model (one with a
/// `scorer`) has no classes, and `--outputs embeddings` is its output, the
/// embedding its scorer takes.
pub(crate) fn outputs_of(
    cfg: &InferConfig,
    scorer: Option<crate::link::ScorerKind>,
) -> Result<InferConfig> {
    let o = cfg.outputs;
    match scorer {
        None => Ok(cfg.clone()),
        Some(_) if o.embeddings && !o.probabilities && !o.logits => Ok(InferConfig {
            outputs: Outputs {
                link_embedding: true,
                ..Default::default()
            },
            ..cfg.clone()
        }),
        Some(scorer) => Err(Error::InvalidArgument(format!(
            "{}: a link-prediction model ({} scorer) has no classes; pass --outputs embeddings for every node's embedding",
            offgnn_shared::store::redact(&cfg.model),
            scorer.name()
        ))),
    }
}

/// The configuration to run with: the graph the model was trained on, as
/// its card records it, built from the edges unless the flags contradict
/// it (refused in one line) or `graph_override` makes the flags win (then
/// the second value says so). A card that records no graph (an older
/// trainer's) leaves the flags as given.
fn graph_of(cfg: &InferConfig, card: &ModelCard) -> Result<(InferConfig, Option<String>)> {
    let Some(trained) = card.graph else {
        return Ok((cfg.clone(), None));
    };
    let given = GraphOptions {
        add_reverse_edges: cfg.add_reverse_edges,
        dedup_edges: !cfg.keep_duplicate_edges,
        keep_self_loops: cfg.keep_self_loops,
    };
    if cfg.graph_override {
        let note = (given != trained).then(|| {
            format!(
                "built the graph as the flags give it ({}), not as the model was trained ({}), by --graph-override",
                describe_graph(given),
                describe_graph(trained)
            )
        });
        if let Some(note) = &note {
            tracing::warn!("{note}");
        }
        return Ok((cfg.clone(), note));
    }
    // Each flag asks for what the sampler does not do by default, so a
    // flag left out takes the card's choice, and a flag given contradicts
    // a card that records the default.
    let flags = [
        (
            "--add-reverse-edges",
            given.add_reverse_edges,
            trained.add_reverse_edges,
        ),
        (
            "--drop-self-loops",
            !given.keep_self_loops,
            !trained.keep_self_loops,
        ),
        (
            "--keep-duplicate-edges",
            !given.dedup_edges,
            !trained.dedup_edges,
        ),
    ];
    if let Some((flag, _, _)) = flags.iter().find(|(_, given, trained)| *given && !*trained) {
        return Err(Error::InvalidArgument(format!(
            "{flag}: the model in {} was trained on the graph without it ({}); leave the flag out to build that graph, or pass --graph-override to build another",
            cfg.model,
            describe_graph(trained)
        )));
    }
    let mut resolved = cfg.clone();
    resolved.add_reverse_edges = trained.add_reverse_edges;
    resolved.keep_self_loops = trained.keep_self_loops;
    resolved.keep_duplicate_edges = !trained.dedup_edges;
    Ok((resolved, None))
}

/// A graph's options in words.
fn describe_graph(g: GraphOptions) -> String {
    [
        if g.add_reverse_edges {
            "reverse edges added"
        } else {
            "no reverse edges added"
        },
        if g.keep_self_loops {
            "self-loops kept"
        } else {
            "self-loops dropped"
        },
        if g.dedup_edges {
            "duplicate edges merged"
        } else {
            "duplicate edges kept"
        },
    ]
    .join(", ")
}

/// Checks that the model was trained on this dataset and these features,
/// whose fingerprint is `fingerprint`, and that it takes their width.
fn check_dataset(
    cfg: &InferConfig,
    card: &ModelCard,
    ds: &Dataset,
    fingerprint: &str,
) -> Result<()> {
    if fingerprint != card.dataset_fingerprint {
        return Err(Error::InvalidArgument(format!(
            "{}: the model was trained on another dataset (fingerprint {}, this dataset's is {})",
            cfg.dataset,
            short(&card.dataset_fingerprint),
            short(fingerprint)
        )));
    }
    let d = ds.feature_dim() as i64;
    if d != card.in_channels {
        return Err(Error::InvalidArgument(format!(
            "{}: features are {d} wide, the model takes {}",
            ds.features.path().display(),
            card.in_channels
        )));
    }
    // The dataset's fingerprint leaves the features out (they may be packed
    // again over the same samples); the export records theirs apart.
    if card.feature_fingerprint.is_empty() {
        tracing::warn!(
            "{}: the export does not record its feature file's fingerprint (an older trainer wrote it), so the features cannot be checked against those it was trained on",
            cfg.model
        );
    } else {
        let features = offgnn_shared::dataset::file_fingerprint(ds.features.path())?;
        if features != card.feature_fingerprint {
            return Err(Error::InvalidArgument(format!(
                "{}: not the features the model was trained on (fingerprint {}, this file's is {}); the topology and labels match",
                ds.features.path().display(),
                short(&card.feature_fingerprint),
                short(&features)
            )));
        }
    }
    Ok(())
}

/// Checks that `out` may take the result (`previous`, a committed one, is
/// replaced only with `--overwrite`) and that the hidden layers can be
/// stored as asked.
fn check_output(
    cfg: &InferConfig,
    card: &ModelCard,
    out: &Store,
    previous: Option<&Previous>,
) -> Result<()> {
    if previous.is_some() && !cfg.overwrite {
        return Err(Error::InvalidArgument(format!(
            "{}: holds a committed inference result; pass --overwrite to replace it",
            out.url()
        )));
    }
    if cfg.hidden_f16 && card.hidden_channels % 2 == 1 {
        return Err(Error::InvalidArgument(format!(
            "--hidden-dtype f16 needs an even hidden width (groups start on 4 KiB pages), this model's is {}",
            card.hidden_channels
        )));
    }
    Ok(())
}

/// Readies the work directory: on a fresh start, checks that it has room
/// for the run's files; buckets the edges unless an earlier run did.
/// Returns the distinct edges where it bucketed them.
fn prepare_work_dir(
    cfg: &InferConfig,
    ds: &Dataset,
    model: &Model,
    run_plan: &RunPlan,
    progress: &mut Progress,
) -> Result<Option<u64>> {
    let plan = &run_plan.plan;
    let n = ds.num_nodes;
    if !progress.edges_ready && progress.layer == 0 && progress.groups_done == 0 {
        // What the work directory will hold at most: the hidden layers'
        // outputs and the bucketed edges (counted with duplicates).
        let hidden: u64 = (1..graph_layers_of(model))
            .map(|l| (n * model.widths[l] as u64 * hidden_elem(cfg)).div_ceil(PAGE) * PAGE)
            .sum();
        let edges_bytes = if model.mlp.is_empty() {
            run_plan.edge_upper_bound * 8
                + plan.groups.len() as u64 * (plan.chunks(n) as u64 + 1) * 8
        } else {
            0
        };
        let free = offgnn_shared::io_engine::free_bytes(&cfg.work_dir)?;
        if hidden + edges_bytes > free {
            return Err(Error::InvalidArgument(format!(
                "--work-dir {}: {} free, this run needs up to {} there (hidden layers {}, bucketed edges {}); free some space or point --work-dir elsewhere",
                cfg.work_dir.display(),
                human_bytes(free),
                human_bytes(hidden + edges_bytes),
                human_bytes(hidden),
                human_bytes(edges_bytes)
            )));
        }
    }
    if !model.mlp.is_empty() || progress.edges_ready {
        return Ok(None);
    }
    let t = Instant::now();
    let edges = bucket_edges(ds, cfg, plan)?;
    progress.edges_ready = true;
    progress.edge_bucketing_seconds = t.elapsed().as_secs_f64();
    save_progress(&cfg.work_dir, progress)?;
    Ok(Some(edges))
}

/// The distinct edges, as an earlier run bucketed them (0 for the MLP).
fn bucketed_edges(cfg: &InferConfig, model: &Model, run_plan: &RunPlan, n: u64) -> u64 {
    let plan = &run_plan.plan;
    if !model.mlp.is_empty() {
        return 0;
    }
    let chunks = plan.chunks(n);
    (0..plan.groups.len())
        .map(|g| {
            // A file shorter than its index is refused when it is loaded.
            std::fs::metadata(edge_file(&cfg.work_dir, g))
                .map(|m| m.len().saturating_sub((chunks as u64 + 1) * 8) / 8)
                .unwrap_or(0)
        })
        .sum()
}

/// The output's columns, as `--outputs` asks for them.
fn columns(cfg: &InferConfig) -> Vec<String> {
    let mut columns = vec!["node_id".to_string()];
    let o = cfg.outputs;
    for (on, name) in [
        (o.class(), "class"),
        (o.probabilities, "probabilities"),
        (o.logits, "logits"),
        (o.embedding(), "embedding"),
    ] {
        if on {
            columns.push(name.into());
        }
    }
    columns
}

/// Commits `summary` (its JSON, naming its parts `files`) as the result in
/// `out`; a replaced result's parts (`previous`'s) go only once it is in
/// place. A run that lost the commit to another removes its parts and
/// its work in `work` (`clear`: its files, then its progress), which no
/// rerun on `out` would resume.
pub(crate) fn commit_result(
    (work, clear): (&Path, &dyn Fn()),
    out: &Store,
    (summary, files): (Vec<u8>, &[String]),
    (run_id, lease): (&RunId, &Lease),
    previous: Option<&Previous>,
) -> Result<()> {
    check_parts(out, run_id, files)?;
    match commit::commit(out, COMMIT, summary, run_id, previous)? {
        commit::Outcome::Committed => lease.release(),
        commit::Outcome::Lost { winner } => {
            let removed = files.iter().filter(|f| out.delete(f).is_ok()).count();
            lease.release();
            clear();
            forget_progress(work);
            return Err(commit::lost(&out.join(COMMIT), &winner, removed).into());
        }
    }
    if let Some(old) = previous {
        remove_replaced(out, &old.body, files);
        commit::fault_point(commit::REPLACED_REMOVED);
    }
    Ok(())
}

/// Removes the parts that the replaced result `old` (its `_SUCCESS.json`)
/// lists and this one (`ours`) does not.
fn remove_replaced(out: &Store, old: &[u8], ours: &[String]) {
    let ours: HashSet<&String> = ours.iter().collect();
    let old_files = serde_json::from_slice::<serde_json::Value>(old)
        .ok()
        .and_then(|v| serde_json::from_value::<Vec<String>>(v["files"].clone()).ok())
        .unwrap_or_default();
    for name in old_files.iter().filter(|f| !ours.contains(f)) {
        if let Err(e) = out.delete(name) {
            tracing::warn!("could not remove the replaced result's parts: {e}");
            break;
        }
    }
}

/// Refuses to commit `files` unless every one is in `out`: a process that
/// took this run for dead (its lease lost) may have removed some.
fn check_parts(out: &Store, run_id: &RunId, files: &[String]) -> Result<()> {
    match missing_parts(out, run_id, files)?.first() {
        Some(gone) => Err(Error::InvalidArgument(format!(
            "{}: this run's part {gone} is gone (another process removed it while this run went on); nothing was committed, run again",
            out.url()
        ))),
        None => Ok(()),
    }
}

pub(crate) fn short(s: &str) -> &str {
    &s[..s.len().min(12)]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export;
    use crate::inference::{Aggregate, NodeSet};
    use crate::model::{self, ModelConfig, ModelKind};

    /// The card of a small export trained on `graph`.
    fn card(graph: Option<GraphOptions>) -> ModelCard {
        let dir = tempfile::tempdir().unwrap();
        let cfg = ModelConfig {
            kind: ModelKind::Sage,
            in_dim: 4,
            hidden: 4,
            classes: 2,
            layers: 1,
            heads: 1,
            dropout: 0.0,
            scorer: None,
        };
        let vs = tch::nn::VarStore::new(tch::Device::Cpu);
        let _net = model::build(&vs.root(), &cfg);
        let from = export::Provenance {
            feature_dtype: "float32".into(),
            dataset_fingerprint: "d".into(),
            feature_fingerprint: "f".into(),
            samples_run_sha256: "s".into(),
            graph,
            which: "best".into(),
            epoch: 0,
            valid_acc: 0.0,
            test_acc: 0.0,
            mrr: None,
        };
        let named = export::snapshot(&vs).unwrap();
        export::write(dir.path().to_str().unwrap(), &cfg, &named, &from, false)
            .unwrap()
            .card
    }

    /// `--add-reverse-edges`, `--drop-self-loops`, `--keep-duplicate-edges`
    /// and `--graph-override` as given.
    fn flags(reverse: bool, drop_loops: bool, keep_dups: bool, force: bool) -> InferConfig {
        InferConfig {
            model: "m".into(),
            dataset: "d".into(),
            out: "o".into(),
            nodes: NodeSet::All,
            outputs: Default::default(),
            device: tch::Device::Cpu,
            memory: 0,
            work_dir: PathBuf::new(),
            overwrite: false,
            add_reverse_edges: reverse,
            keep_self_loops: !drop_loops,
            keep_duplicate_edges: keep_dups,
            graph_override: force,
            chunk_rows: None,
            show_progress: false,
            hidden_f16: false,
            aggregate: Aggregate::Host,
        }
    }

    /// The card's graph is built where no flag is given or the flags agree
    /// with it; a contradicting flag is refused naming it and the graph the
    /// model was trained on; --graph-override builds the flags' graph and
    /// says so; a card without a graph takes the flags as given.
    #[test]
    fn inference_builds_the_graph_the_model_was_trained_on() {
        let trained = GraphOptions {
            add_reverse_edges: true,
            dedup_edges: true,
            keep_self_loops: false,
        };
        let c = card(Some(trained));
        let built = |cfg: &InferConfig| {
            (
                cfg.add_reverse_edges,
                cfg.keep_self_loops,
                cfg.keep_duplicate_edges,
            )
        };
        for agreeing in [
            flags(false, false, false, false),
            flags(true, true, false, false),
        ] {
            let (cfg, note) = graph_of(&agreeing, &c).unwrap();
            assert_eq!(built(&cfg), (true, false, false));
            assert_eq!(note, None);
        }
        let err = graph_of(&flags(true, false, true, false), &c)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "--keep-duplicate-edges: the model in m was trained on the graph without it (reverse edges added, self-loops dropped, duplicate edges merged); leave the flag out to build that graph, or pass --graph-override to build another"
        );
        let (cfg, note) = graph_of(&flags(false, false, true, true), &c).unwrap();
        assert_eq!(built(&cfg), (false, true, true));
        let note = note.expect("the override is stated");
        assert!(
            note.contains("(no reverse edges added, self-loops kept, duplicate edges kept), not as the model was trained (reverse edges added, self-loops dropped,"),
            "{note}"
        );
        let older = card(None);
        let (cfg, note) = graph_of(&flags(true, false, true, false), &older).unwrap();
        assert_eq!(built(&cfg), (true, true, true));
        assert_eq!(note, None);
    }
}
