//! One sampling run (or one shard of it): plan the batches of every split and
//! epoch, sample them on a thread pool, stream them as Parquet into the
//! object store, and commit with the run summary (DiskGNN §3: all sampling
//! happens before training, so the packer can see every access).
//!
//! The plan (`batches`) is fixed by the dataset, the parameters and the
//! seed. Each batch has its own generator, so threads and shards change who
//! samples a batch, never what is sampled.

use std::time::Instant;

use offgnn_shared::commit::{self, Previous, RunId};
use offgnn_shared::dataset::{Dataset, LinkTask, Split, TypedDataset, is_typed};
use offgnn_shared::lease::{self, LEASE, Lease, Swept};
use offgnn_shared::samples::{
    FORMAT, FORMAT_VERSION, RUN_SUMMARY, RunSummary, SampleFile, ShardFiles, ShardSummary,
    SplitCounts,
};
use offgnn_shared::store::Store;

use crate::batches::{Links, Task};
use crate::config::{LinkOptions, NegativeKind, SampleConfig};
use crate::error::{Error, Result};
use crate::input::{Graph, Input};
use crate::link_sampling::{BlockSource, LinkSampler, NegativeSampler};
use crate::memory::MemoryEstimate;
use crate::sample_files::write_units;
use crate::shards;
use offgnn_shared::report::human_bytes;

/// What a run (or shard) did.
#[derive(Debug)]
pub struct Outcome {
    pub shard: ShardSummary,
    /// Present when this process wrote the run summary.
    pub run: Option<RunSummary>,
    pub batches: u64,
    pub edges: u64,
    pub sample_seconds: f64,
    pub csr_seconds: f64,
    /// Repeated edges the topology dropped (0 with --keep-duplicate-edges).
    pub duplicate_edges_dropped: u64,
    pub memory: MemoryEstimate,
    /// The objects of runs killed before committing, removed at start.
    pub leftovers_removed: Swept,
}

/// The sampler's runs, for the removal of those killed before committing.
const SAMPLER_RUNS: lease::Kind = lease::Kind {
    what: "sampler runs",
    roots: &["samples", "_shards"],
    owns: &sampler_object,
    commit: RUN_SUMMARY,
};

/// Whether `name` is one of the objects a sampler writes: a samples file
/// (`samples/RUN/split=S/epoch=NNNN/part-NNNNN.parquet`) or a shard summary
/// (`_shards/RUN/shard-NNNNN-of-NNNNN.json`), or either as runs from before
/// run ids named them (without `RUN/`), or a run's lease (`samples/RUN/_live`).
fn sampler_object(name: &str) -> bool {
    let digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
    let parts: Vec<&str> = name.split('/').collect();
    let samples_file = |split: &str, epoch: &str, part: &str| {
        ["split=train", "split=valid", "split=test"].contains(&split)
            && epoch.strip_prefix("epoch=").is_some_and(|e| digits(e, 4))
            && part
                .strip_prefix("part-")
                .and_then(|p| p.strip_suffix(".parquet"))
                .is_some_and(|p| digits(p, 5))
    };
    let shard_file = |shard: &str| {
        shard
            .strip_prefix("shard-")
            .and_then(|s| s.strip_suffix(".json"))
            .and_then(|s| s.split_once("-of-"))
            .is_some_and(|(a, b)| digits(a, 5) && digits(b, 5))
    };
    match parts.as_slice() {
        ["samples", run, file] => RunId::is_run_id(run) && lease::is_lease(file),
        ["samples", run, split, epoch, part] => {
            RunId::is_run_id(run) && samples_file(split, epoch, part)
        }
        ["samples", split, epoch, part] => samples_file(split, epoch, part),
        ["_shards", run, shard] => RunId::is_run_id(run) && shard_file(shard),
        ["_shards", shard] => shard_file(shard),
        _ => false,
    }
}

fn shard_name(run_id: &RunId, shard: u32, num_shards: u32) -> String {
    format!("_shards/{run_id}/shard-{shard:05}-of-{num_shards:05}.json")
}

/// This run's id. The shards of a sharded run are processes that never
/// meet: they share an id derived from the dataset and the parameters.
fn run_id(ds: Input, cfg: &SampleConfig) -> Result<RunId> {
    if cfg.num_shards == 1 {
        return Ok(RunId::new());
    }
    let params = serde_json::to_vec(&cfg.params()).expect("parameters serialize");
    Ok(RunId::derived(&[
        ds.fingerprint()?.as_bytes(),
        &params,
        &cfg.num_shards.to_le_bytes(),
    ]))
}

/// Removes every object of run `run_id`; returns how many went. Failures
/// are logged, not returned: this runs on the way out of a failed run.
pub(crate) fn remove_run(store: &Store, run_id: &RunId) -> usize {
    let mut removed = 0;
    for prefix in [format!("samples/{run_id}"), format!("_shards/{run_id}")] {
        match store.delete_prefix(&prefix) {
            Ok(n) => removed += n,
            Err(e) => tracing::warn!("could not remove this run's objects: {e}"),
        }
    }
    removed
}

/// After this run's commit replaced `old`, removes the replaced run's
/// objects (none when it was this same sharded run).
fn remove_replaced(store: &Store, old: &Previous, run_id: &RunId) {
    let removed = match old.run_id.as_deref() {
        Some(id) if id == run_id.as_str() => return,
        Some(id) => [format!("samples/{id}"), format!("_shards/{id}")]
            .iter()
            .map(|p| store.delete_prefix(p))
            .sum::<std::result::Result<usize, _>>(),
        // A run from before run ids: its files as its summary names them,
        // and its shard summaries.
        None => {
            let mut names: Vec<String> = serde_json::from_slice::<RunSummary>(&old.body)
                .map(|r| r.files.into_iter().map(|f| f.object.name).collect())
                .unwrap_or_default();
            if let Ok(shards) = store.list("_shards") {
                names.extend(
                    shards
                        .into_iter()
                        .map(|(n, _)| n)
                        .filter(|n| n.matches('/').count() == 1),
                );
            }
            names.iter().map(|n| store.delete(n).map(|()| 1)).sum()
        }
    };
    match removed {
        Ok(n) => tracing::info!("removed the replaced run's {n} objects"),
        Err(e) => tracing::warn!("could not remove all of the replaced run's objects: {e}"),
    }
}

/// Runs sampling as configured, into the store that `cfg.out` names.
pub fn run(cfg: &SampleConfig) -> Result<Outcome> {
    cfg.validate()?;
    let created = Store::to_be_created(&cfg.out);
    let store = Store::open(&cfg.out)?;
    let result = (|| {
        if is_typed(&cfg.dataset)? {
            return run_typed_in(cfg, &TypedDataset::open(&cfg.dataset)?, &store);
        }
        run_in(cfg, &Dataset::open(&cfg.dataset)?, &store)
    })();
    if result.is_err() {
        offgnn_shared::store::remove_if_empty(created.as_deref());
    }
    result
}

/// Runs sampling into an already opened store (tests use an in-memory one).
pub fn run_in(cfg: &SampleConfig, ds: &Dataset, store: &Store) -> Result<Outcome> {
    if !cfg.relation_fanouts.is_empty() {
        return Err(Error::InvalidArgument(
            "per-relation fan-outs are for typed graphs; this one has one edge type".into(),
        ));
    }
    run_input(cfg, Input::Plain(ds), store)
}

/// [`run_in`] for a typed dataset: `cfg.relation_fanouts` gives each
/// relation's fan-outs.
pub fn run_typed_in(cfg: &SampleConfig, ds: &TypedDataset, store: &Store) -> Result<Outcome> {
    // Per layer, one fan-out per relation.
    let per_layer = cfg.relation_fanouts.first().map_or(0, Vec::len);
    if per_layer != ds.relations.len() {
        return Err(Error::InvalidArgument(format!(
            "a typed graph of {} relations samples with a fan-out per relation and layer",
            ds.relations.len()
        )));
    }
    run_input(cfg, Input::Typed(ds), store)
}

fn run_input(cfg: &SampleConfig, input: Input, store: &Store) -> Result<Outcome> {
    cfg.validate()?;
    let started = Instant::now();
    let previous = check_output(store, cfg)?;
    let link_task = match cfg.link {
        None if input.split(Split::Train).seeds.is_empty() => {
            return Err(Error::InvalidArgument(format!(
                "{} has no node classification task (its only task is link_prediction): sample it with --task link",
                input.root().display()
            )));
        }
        None => None,
        Some(_) => {
            let task = match input {
                Input::Plain(ds) => LinkTask::open(&ds.root, ds.num_nodes)?,
                Input::Typed(ds) => LinkTask::open_typed(ds)?,
            };
            Some(task.ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "--task link: {} has no link_prediction task (sampler split-edges writes one from the graph)",
                    input.root().display()
                ))
            })?)
        }
    };
    let memory = state_memory(&input.shape(cfg), cfg, link_task.as_ref())?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(cfg.threads)
        .build()
        .map_err(|e| {
            Error::InvalidArgument(format!("cannot start {} threads: {e}", cfg.threads))
        })?;
    let (graph, csr_seconds) = input.build_graph(cfg, memory.graph_hold_bytes, &pool)?;
    log_graph(&graph, csr_seconds);

    if let Some(signal) = offgnn_shared::signals::received() {
        return Err(Error::Ended(format!(
            "stopped by {signal} before sampling; nothing was written"
        )));
    }
    // This run's objects go under names of its own; a committed run's stay
    // as they are until this one has committed.
    let run_id = run_id(input, cfg)?;
    tracing::info!("run {run_id}");
    // Each shard of a sharded run holds a lease of its own.
    let lease_name = match cfg.num_shards {
        1 => format!("samples/{run_id}/{LEASE}"),
        _ => format!("samples/{run_id}/{LEASE}-{:05}", cfg.shard),
    };
    let lease = Lease::take(store, &lease_name, &run_id)?;
    let leftovers_removed = lease::sweep(store, &SAMPLER_RUNS, &lease);
    let mut dataset = input.info(&graph)?;
    if let (Input::Typed(ds), Some(r)) = (input, link_task.as_ref().and_then(|t| t.relation)) {
        dataset.link_relation = ds.relations[r].name.clone();
    }
    let task = Task {
        input,
        links: link_task
            .as_ref()
            .zip(cfg.link.as_ref())
            .map(|(task, o)| Links {
                task,
                sampler: link_sampler(&graph, &cfg.fanouts, task, o),
            }),
    };
    let units = task.plan(cfg, true);
    let (files, sample_seconds) = write_units(
        store,
        &task,
        &graph,
        cfg,
        &run_id,
        &units,
        &pool,
        previous.is_some(),
    )?;
    let (batches, edges) = files.iter().fold((0u64, 0u64), |(b, e), f| {
        (b + f.batches as u64, e + f.edges)
    });

    let shard = ShardSummary {
        format: FORMAT.into(),
        format_version: FORMAT_VERSION,
        run_id: run_id.to_string(),
        shard: cfg.shard,
        num_shards: cfg.num_shards,
        dataset,
        params: cfg.params(),
        files,
        seconds: started.elapsed().as_secs_f64(),
    };
    // A commit that fails (a full disk) leaves nothing of the run behind.
    let run = commit_shard(store, &task, cfg, &run_id, &shard, previous.as_ref())
        .map_err(|e| crate::sample_files::abandon(store, cfg, &run_id, previous.is_some(), e))?;
    // Committed, or a finished shard of a run whose other shards commit it.
    lease.release();
    Ok(Outcome {
        shard,
        run,
        batches,
        edges,
        sample_seconds,
        csr_seconds,
        duplicate_edges_dropped: graph.duplicates_dropped(),
        memory,
        leftovers_removed,
    })
}

/// How the run's training pairs are sampled: `fanouts` on a graph of one
/// edge type; negatives among all nodes, or the predicted relation's
/// destination type, by `o.sampler`.
fn link_sampler<'a>(
    graph: &'a Graph,
    fanouts: &'a [usize],
    task: &LinkTask,
    o: &LinkOptions,
) -> LinkSampler<'a> {
    let (source, negatives) = match graph {
        Graph::Plain(csr) => (
            BlockSource::Plain(csr, fanouts),
            match o.sampler {
                NegativeKind::Uniform => NegativeSampler::uniform(0..csr.num_nodes() as u32),
                NegativeKind::Degree => NegativeSampler::by_degree(csr, 0),
            },
        ),
        Graph::Typed(g, fanouts) => {
            let rel = &g.relations[task.relation.expect("a typed graph's task has a relation")];
            let first = g.offsets[rel.dst] as u32;
            (
                BlockSource::Typed(g, fanouts),
                match o.sampler {
                    NegativeKind::Uniform => {
                        NegativeSampler::uniform(first..g.offsets[rel.dst + 1] as u32)
                    }
                    NegativeKind::Degree => NegativeSampler::by_degree(&rel.csr, first),
                },
            )
        }
    };
    LinkSampler {
        graph: source,
        k: o.negatives as usize,
        negatives,
        exclude: true,
    }
}

/// The run committed at the output before, if any. Refuses a committed run
/// without `--overwrite`, and an output whose `samples/` or `_shards/` holds
/// what no sampler wrote: a rerun replaces what is under them.
fn check_output(store: &Store, cfg: &SampleConfig) -> Result<Option<Previous>> {
    let previous = commit::read(store, RUN_SUMMARY)?;
    if previous.is_some() && !cfg.overwrite {
        return Err(Error::Committed(store.url().to_string()));
    }
    for prefix in ["samples", "_shards"] {
        if let Some((name, _)) = store
            .list(prefix)?
            .into_iter()
            .find(|(name, _)| !sampler_object(name))
        {
            return Err(Error::InvalidArgument(format!(
                "{}: holds {name}, which no sampler wrote; a run replaces what is under {prefix}/, so remove it or choose another --out",
                store.url()
            )));
        }
    }
    Ok(previous)
}

/// States the run's peak memory in the log, and refuses the run when it
/// exceeds `--memory`.
fn state_memory(
    shape: &crate::memory::InputShape,
    cfg: &SampleConfig,
    link: Option<&LinkTask>,
) -> Result<MemoryEstimate> {
    let memory = crate::memory::estimate(shape, cfg, link);
    tracing::info!(
        "memory: at most {} (graph {}, build {}, thread scratch {}, batches in flight {}, output buffers {})",
        human_bytes(memory.total_bytes),
        human_bytes(memory.graph_bytes),
        human_bytes(memory.graph_build_bytes),
        human_bytes(memory.scratch_bytes),
        human_bytes(memory.batches_in_flight_bytes),
        human_bytes(memory.output_bytes),
    );
    if let Some(limit) = cfg.memory_limit
        && memory.total_bytes > limit
    {
        return Err(Error::InvalidArgument(format!(
            "--memory {}: this run needs up to {} (runtime {}, graph {}, and the more of its build {} and the sampling: {} threads' scratch {}, batches in flight {}, output buffers {}, seeds {}); give more memory, or fewer --threads or a smaller --batch-size",
            human_bytes(limit),
            human_bytes(memory.total_bytes),
            human_bytes(memory.runtime_bytes),
            human_bytes(memory.graph_bytes),
            human_bytes(memory.graph_build_bytes),
            cfg.threads,
            human_bytes(memory.scratch_bytes),
            human_bytes(memory.batches_in_flight_bytes),
            human_bytes(memory.output_bytes),
            human_bytes(memory.plan_bytes),
        )));
    }
    Ok(memory)
}

/// Logs the sampling graph's size, and the repeated edges it dropped.
fn log_graph(graph: &Graph, seconds: f64) {
    tracing::info!(
        "topology: {} nodes, {} edges in CSR ({seconds:.2} s)",
        graph.num_nodes(),
        graph.num_edges(),
    );
    if graph.duplicates_dropped() > 0 {
        tracing::info!(
            "dropped {} repeated edges (each (source, destination) pair is kept once; --keep-duplicate-edges keeps them)",
            graph.duplicates_dropped()
        );
    }
}

/// Commits an unsharded run; in a sharded run, writes this shard's summary
/// and commits when it is the last to finish.
fn commit_shard(
    store: &Store,
    task: &Task,
    cfg: &SampleConfig,
    run_id: &RunId,
    shard: &ShardSummary,
    previous: Option<&Previous>,
) -> Result<Option<RunSummary>> {
    if cfg.num_shards == 1 {
        commit_run(store, task, cfg, run_id, vec![shard.clone()], previous)
    } else {
        let body = serde_json::to_vec_pretty(shard).expect("summaries serialize");
        store.put(&shard_name(run_id, cfg.shard, cfg.num_shards), body)?;
        try_commit_shards(store, task, cfg, run_id, shard, previous)
    }
}

/// Writes the run summary from every shard's summary: the commit point.
/// Returns the summary when this process committed it, `None` when another
/// shard of this run did; fails, having removed this run's objects, when
/// another run committed first.
fn commit_run(
    store: &Store,
    task: &Task,
    cfg: &SampleConfig,
    run_id: &RunId,
    shards: Vec<ShardSummary>,
    previous: Option<&Previous>,
) -> Result<Option<RunSummary>> {
    let mut counts = std::collections::BTreeMap::new();
    for split in Split::ALL {
        // Seeds, or a link task's pairs and queries.
        let (seeds, per_batch) = task.split_size(split, cfg);
        let epochs = if split == Split::Train { cfg.epochs } else { 1 };
        counts.insert(
            split,
            SplitCounts {
                epochs,
                batches_per_epoch: seeds.div_ceil(per_batch as u64) as u32,
                seeds,
                ..Default::default()
            },
        );
    }
    let mut files: Vec<SampleFile> = shards
        .iter()
        .flat_map(|s| s.files.iter().cloned())
        .collect();
    files.sort_by(|a, b| a.object.name.cmp(&b.object.name));
    for f in &files {
        let c = counts.get_mut(&f.split).expect("every split is counted");
        c.batches += f.batches as u64;
        c.edges += f.edges;
        c.input_nodes += f.input_nodes;
    }
    let expected: u64 = counts
        .values()
        .map(|c| c.batches_per_epoch as u64 * c.epochs as u64)
        .sum();
    let found: u64 = counts.values().map(|c| c.batches).sum();
    if expected != found {
        return Err(Error::InvalidArgument(format!(
            "the shards hold {found} batches, the plan has {expected}: shards of different runs?"
        )));
    }
    let run = RunSummary {
        format: FORMAT.into(),
        format_version: FORMAT_VERSION,
        run_id: run_id.to_string(),
        dataset: shards[0].dataset.clone(),
        params: shards[0].params.clone(),
        num_shards: cfg.num_shards,
        counts,
        files,
        shards: shards
            .iter()
            .map(|s| ShardFiles {
                shard: s.shard,
                files: s.files.iter().map(|f| f.object.name.clone()).collect(),
            })
            .collect(),
        seconds: shards.iter().map(|s| s.seconds).fold(0.0, f64::max),
    };
    let body = serde_json::to_vec_pretty(&run).expect("summaries serialize");
    match commit::commit(store, RUN_SUMMARY, body, run_id, previous)? {
        commit::Outcome::Committed => {
            if let Some(old) = previous {
                remove_replaced(store, old, run_id);
                commit::fault_point(commit::REPLACED_REMOVED);
            }
            Ok(Some(run))
        }
        commit::Outcome::Lost { winner } => {
            let removed = remove_run(store, run_id);
            Err(commit::lost(&store.join(RUN_SUMMARY), &winner, removed).into())
        }
    }
}

/// In a sharded run, the shard that finds every shard's summary present
/// writes the run summary. Shards of another run (different dataset or
/// parameters) are refused rather than mixed; where a shard this run lacks
/// was run under other settings, the run can never complete, and this
/// shard says so.
fn try_commit_shards(
    store: &Store,
    task: &Task,
    cfg: &SampleConfig,
    run_id: &RunId,
    own: &ShardSummary,
    previous: Option<&Previous>,
) -> Result<Option<RunSummary>> {
    let mut missing = Vec::new();
    for i in 0..cfg.num_shards {
        if !store.exists(&shard_name(run_id, i, cfg.num_shards))? {
            missing.push(i);
        }
    }
    if !missing.is_empty() {
        if let Some(conflict) = shards::conflict(store, own, &missing)? {
            return Err(conflict);
        }
        tracing::info!(
            "{} of {} shards have not finished (first: shard {}): not committing yet",
            missing.len(),
            cfg.num_shards,
            missing[0]
        );
        return Ok(None);
    }
    let mut shards = Vec::with_capacity(cfg.num_shards as usize);
    for i in 0..cfg.num_shards {
        let name = shard_name(run_id, i, cfg.num_shards);
        let summary: ShardSummary =
            serde_json::from_slice(&store.get(&name)?).map_err(|e| Error::Write {
                file: name.clone(),
                fault: format!("malformed shard summary: {e}"),
                kind: None,
            })?;
        if summary.params != cfg.params()
            || summary.dataset.fingerprint != task.input.fingerprint()?
        {
            return Err(Error::InvalidArgument(format!(
                "{name} was written by a run with other parameters or another dataset; rerun it or pass --overwrite"
            )));
        }
        shards.push(summary);
    }
    let run = commit_run(store, task, cfg, run_id, shards, previous)?;
    if run.is_none() {
        tracing::info!("another shard of this run committed it");
    }
    Ok(run)
}
