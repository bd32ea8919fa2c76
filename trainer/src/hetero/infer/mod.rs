//! `trainer infer` for a typed model: R-SAGE's or R-GAT's exact function
//! on every node of every type, layer by layer over full neighbourhoods,
//! per relation, out of core.
//!
//! Each type's destinations are cut into contiguous groups whose working
//! state (their in-edges over every relation, the sources' rows, the
//! convolutions' activations) fits `--memory`. Each relation's edges are
//! bucketed once on disk by destination group. At layer `l`, a group of
//! type `T` sums, over the relations that reach `T`, that relation's
//! convolution of its sources' rows of layer `l - 1` (read in ascending
//! order, neighbours in one read) into the group's rows; the sum, after
//! leaky ReLU, is the group's rows of layer `l`, written front to back to
//! the work directory. The last layer's rows go to Parquet under `--out`
//! (each type's embedding, and the target type's classes through the
//! classifier), committed by `_SUCCESS.json`. The functions are the
//! training model's own ([`super::Rgnn::messages`]), so inference is the
//! trained model on blocks holding every in-edge. The work directory keeps
//! the run's progress after every group; a killed run's command, run
//! again, resumes from it ([`progress`]).

mod edges;
mod memory;
mod output;
mod progress;
mod rows;

use std::path::Path;
use std::time::Instant;

use offgnn_shared::commit::{self, RunId};
use offgnn_shared::dataset::TypedDataset;
use offgnn_shared::io_engine::IoEngine;
use offgnn_shared::lease::Swept;
use offgnn_shared::npy::DType;
use offgnn_shared::store::Store;
use serde::{Deserialize, Serialize};
use tch::{Device, Tensor, nn};

use super::export::TypedModelCard;
use super::{RelationalKind, Rgnn, RgnnConfig};
use crate::error::{Error, Result};
use crate::inference::resume::{Claim, claim, forget_progress, hold_work_dir, save_progress};
use crate::inference::{Aggregate, COMMIT, InferConfig, NodeSet};
use memory::{Room, chunk_bytes, costs, working_memory};
use progress::TypedProgress;
use rows::{HiddenWriter, Rows};

/// Whether the export at `location` is a typed model's.
pub fn is_typed_model(location: &str) -> Result<bool> {
    crate::export::refuse_a_file(location)?;
    let store = Store::open_read(location)?;
    if !store.exists(crate::export::CARD)? {
        return Ok(false);
    }
    let card: serde_json::Value =
        serde_json::from_slice(&store.get(crate::export::CARD)?).unwrap_or_default();
    let typed = [
        super::export::TYPED_FORMAT_VERSION,
        super::export::TYPED_LINK_FORMAT_VERSION,
    ];
    Ok(card["format_version"]
        .as_u64()
        .is_some_and(|v| typed.contains(&(v as u32))))
}

/// One node type's figures.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TypeFigures {
    pub name: String,
    pub nodes: u64,
    pub groups: u64,
    pub nodes_written: u64,
    pub columns: Vec<String>,
}

/// One layer's figures.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct TypedLayerFigures {
    pub layer: usize,
    /// Groups computed, over every type.
    #[serde(default)]
    pub groups: u64,
    /// Of those, groups an earlier run of the same command computed.
    #[serde(default)]
    pub groups_resumed: u64,
    /// Bytes of the layer's inputs read (feature files, then the previous
    /// layer's outputs).
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub seconds: f64,
}

/// What a typed `trainer infer` reports, and what `_SUCCESS.json` holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TypedInferSummary {
    pub format_version: u32,
    pub run_id: String,
    pub model: String,
    pub architecture: RelationalKind,
    pub weights_sha256: String,
    pub dataset: String,
    pub dataset_fingerprint: String,
    pub target: String,
    pub node_types: Vec<TypeFigures>,
    /// Edges over every relation, as the model's graph has them (each pair
    /// once where the sampler kept it once).
    pub edges: u64,
    pub files: Vec<String>,
    /// The OpenMP wait policy libtorch's threads ran with
    /// (`OMP_WAIT_POLICY`).
    #[serde(default)]
    pub omp_wait_policy: String,
    pub memory_limit: u64,
    /// What the run holds at most, as planned: the process's runtime, the
    /// model, the in-degrees and the largest group's working state.
    pub memory_planned: u64,
    pub layers: Vec<TypedLayerFigures>,
    pub edge_bucketing_seconds: f64,
    pub seconds: f64,
    pub device: String,
    pub leftovers_removed: Swept,
}

/// The model, loaded, over the dataset's schema.
struct Loaded {
    card: TypedModelCard,
    cfg: RgnnConfig,
    model: Rgnn,
    _vs: nn::VarStore,
}

/// Runs typed inference as configured.
pub fn infer(cfg: &InferConfig, engine: &IoEngine) -> Result<TypedInferSummary> {
    crate::runtime::return_freed_memory();
    let result = infer_run(cfg, engine);
    match offgnn_shared::signals::received() {
        Some(signal) if result.is_err() => Err(Error::Stopped(format!(
            "stopped by {signal}: the groups finished so far are kept in {} (and their parts under --out, uncommitted); run the same command again to resume",
            cfg.work_dir.display()
        ))),
        _ => result,
    }
}

fn infer_run(cfg: &InferConfig, engine: &IoEngine) -> Result<TypedInferSummary> {
    let started = Instant::now();
    check_flags(cfg)?;
    let ds = TypedDataset::open(crate::inference::local_dataset(cfg)?)?;
    let fingerprint = ds.fingerprint()?;
    let m = load(cfg, &ds, &fingerprint)?;
    let cfg = &crate::inference::outputs_of(cfg, m.card.scorer)?;
    let out = Store::open(&cfg.out)?;
    let previous = commit::read(&out, COMMIT)?;
    if previous.is_some() && !cfg.overwrite {
        return Err(Error::InvalidArgument(format!(
            "{}: holds a committed inference result; pass --overwrite to replace it",
            out.url()
        )));
    }
    let _held = hold_work_dir(&cfg.work_dir)?;
    let mut run = Run::plan((cfg, engine), &ds, &m)?;
    let key = progress::run_key(
        cfg,
        &m.card.weights_sha256,
        &fingerprint,
        (&run.groups, run.dedup),
    );
    let Claim {
        mut progress,
        run_id,
        lease,
        swept,
    } = claim::<TypedProgress>(&cfg.work_dir, &out, &key, previous.as_ref())?;
    if progress.edges.is_none() {
        let bucketing = Instant::now();
        progress.edges = Some(run.bucket(&ds)?);
        progress.edge_bucketing_seconds = bucketing.elapsed().as_secs_f64();
        save_progress(&cfg.work_dir, &progress)?;
    }
    let keep = selection(cfg, &ds)?;
    progress.written.resize(ds.node_types.len(), 0);
    while progress.layer < m.cfg.layers {
        run.layer(&ds, &m, (&out, &run_id), &keep, &mut progress)?;
    }
    let (target_columns, other_columns) = output::columns(cfg.outputs);
    let summary = TypedInferSummary {
        format_version: 1,
        run_id: run_id.to_string(),
        model: offgnn_shared::store::redact(&cfg.model),
        architecture: m.card.architecture,
        weights_sha256: m.card.weights_sha256.clone(),
        dataset: cfg.dataset.clone(),
        dataset_fingerprint: fingerprint,
        target: m.card.target.clone(),
        node_types: ds
            .node_types
            .iter()
            .enumerate()
            .map(|(t, nt)| TypeFigures {
                name: nt.name.clone(),
                nodes: nt.num,
                groups: run.groups[t].len() as u64,
                nodes_written: progress.written[t],
                columns: if t == ds.target {
                    target_columns.clone()
                } else if progress.written[t] > 0 {
                    other_columns.clone()
                } else {
                    Vec::new()
                },
            })
            .collect(),
        edges: progress.edges.unwrap_or(0),
        files: progress.run.output_files.clone(),
        omp_wait_policy: std::env::var(crate::OMP_WAIT_POLICY).unwrap_or_default(),
        memory_limit: cfg.memory,
        memory_planned: run.planned,
        layers: progress.figures.clone(),
        edge_bucketing_seconds: progress.edge_bucketing_seconds,
        seconds: started.elapsed().as_secs_f64(),
        device: format!("{:?}", cfg.device),
        leftovers_removed: swept,
    };
    let json = serde_json::to_vec_pretty(&summary).expect("summary serializes");
    crate::inference::commit_result(
        (&cfg.work_dir, &|| run.clear(&ds)),
        &out,
        (json, &summary.files),
        (&run_id, &lease),
        previous.as_ref(),
    )?;
    run.clear(&ds);
    forget_progress(&cfg.work_dir);
    Ok(summary)
}

/// The graph flags a typed model takes: its relations (reverses included)
/// are the dataset's, and repeated edges count as its card says.
fn check_flags(cfg: &InferConfig) -> Result<()> {
    let bad = |m: &str| Err(Error::InvalidArgument(m.into()));
    if cfg.add_reverse_edges || !cfg.keep_self_loops {
        return bad(
            "--add-reverse-edges and --drop-self-loops are for homogeneous graphs; a typed graph's reverse relations are the dataset's own",
        );
    }
    if matches!(cfg.nodes, NodeSet::File(_)) {
        return bad(
            "--nodes FILE.npy names homogeneous node ids; for a typed model pass all or a split (train, valid, test) of the target type",
        );
    }
    if cfg.device.is_cuda() && cfg.aggregate == Aggregate::Host {
        return bad(
            "--aggregate host is for homogeneous models; a typed model's relations aggregate with torch's ops on --device",
        );
    }
    Ok(())
}

/// Reads the export, checks it against the dataset and builds the model.
fn load(cfg: &InferConfig, ds: &TypedDataset, fingerprint: &str) -> Result<Loaded> {
    let (card, named) = super::export::read(&cfg.model)?;
    let model_url = offgnn_shared::store::redact(&cfg.model);
    if card.dataset_fingerprint != fingerprint {
        return Err(Error::InvalidArgument(format!(
            "{model_url} was trained on dataset {}, and {} is {fingerprint}: infer on the dataset it was trained on",
            card.dataset_fingerprint, cfg.dataset
        )));
    }
    if cfg.keep_duplicate_edges && card.dedup_edges && !cfg.graph_override {
        return Err(Error::InvalidArgument(format!(
            "--keep-duplicate-edges: {model_url} was trained on a graph that kept each edge once; pass --graph-override to infer on another"
        )));
    }
    let types = ds
        .node_types
        .iter()
        .map(|t| (t.name.clone(), t.offset, t.num))
        .collect();
    let (schema, model_cfg) = card.model(types)?;
    let dataset_relations: Vec<&str> = ds.relations.iter().map(|r| r.name.as_str()).collect();
    let card_relations: Vec<String> = card.relations.iter().map(|r| r.join(":")).collect();
    if dataset_relations != card_relations {
        return Err(Error::InvalidArgument(format!(
            "{model_url} convolves relations {card_relations:?}, the dataset has {dataset_relations:?}"
        )));
    }
    check_features(ds, &card, &model_cfg, &model_url)?;
    if let Some(t) = ds.node_types.iter().find(|t| t.num > u64::from(u32::MAX)) {
        return Err(Error::InvalidArgument(format!(
            "node type '{}' has {} nodes; inference takes up to {} of a type",
            t.name,
            t.num,
            u32::MAX
        )));
    }
    let vs = nn::VarStore::new(cfg.device);
    let model = Rgnn::new(&vs.root(), &schema, &model_cfg)?;
    crate::export::load_into(&vs, &named, &model_url)?;
    Ok(Loaded {
        card,
        cfg: model_cfg,
        model,
        _vs: vs,
    })
}

/// Each type's feature file must be as wide as the model takes (the
/// schema's types are the dataset's, in its order) and, where the export
/// records its fingerprint, the file the model was trained on.
fn check_features(
    ds: &TypedDataset,
    card: &super::export::TypedModelCard,
    model_cfg: &RgnnConfig,
    model_url: &str,
) -> Result<()> {
    let width = |d: Option<i64>| d.map_or("none".to_string(), |d| format!("{d} wide"));
    let mut unchecked = Vec::new();
    for (t, nt) in ds.node_types.iter().enumerate() {
        let rows = nt
            .features
            .as_ref()
            .map(|f| f.shape().get(1).copied().unwrap_or(1) as i64);
        if rows != model_cfg.in_dims[t] {
            return Err(Error::InvalidArgument(format!(
                "node type '{}': the dataset's feature rows are {}, {model_url} takes {}",
                nt.name,
                width(rows),
                width(model_cfg.in_dims[t])
            )));
        }
        let recorded = card
            .node_types
            .iter()
            .find(|c| c.name == nt.name)
            .map_or("", |c| c.feature_fingerprint.as_str());
        let Some(file) = &nt.features else { continue };
        if recorded.is_empty() {
            unchecked.push(nt.name.as_str());
            continue;
        }
        let found = offgnn_shared::dataset::file_fingerprint(file.path())?;
        if found != recorded {
            return Err(Error::InvalidArgument(format!(
                "node type '{}': {} is not the feature file {model_url} was trained on (fingerprint {}, this file's is {}); the topology and labels match",
                nt.name,
                file.path().display(),
                crate::inference::run::short(recorded),
                crate::inference::run::short(&found)
            )));
        }
    }
    if !unchecked.is_empty() {
        tracing::warn!(
            "{model_url} records no feature-file fingerprint of type {} (an older trainer wrote it), so those files cannot be checked against the ones it was trained on",
            unchecked.join(", ")
        );
    }
    Ok(())
}

/// Which of each type's nodes get a row: every node of the target type
/// (of every type with `--outputs embeddings`), or a split's.
fn selection(cfg: &InferConfig, ds: &TypedDataset) -> Result<Vec<Option<Vec<bool>>>> {
    let every = |t: usize| Some(vec![true; ds.node_types[t].num as usize]);
    Ok((0..ds.node_types.len())
        .map(|t| match &cfg.nodes {
            NodeSet::All if t == ds.target || cfg.outputs.embedding() => every(t),
            NodeSet::Split(split) if t == ds.target => {
                let mut keep = vec![false; ds.node_types[t].num as usize];
                let offset = ds.node_types[t].offset;
                for &s in &ds.split(*split).seeds {
                    keep[(u64::from(s) - offset) as usize] = true;
                }
                Some(keep)
            }
            _ => None,
        })
        .collect())
}

/// The run's plan and work directory.
struct Run<'c> {
    cfg: &'c InferConfig,
    engine: &'c IoEngine,
    /// Each type's groups of type-local ids.
    groups: Vec<Vec<(u64, u64)>>,
    /// What `--memory` leaves once the process's runtime, the model and
    /// the in-degrees are counted: the groups, chunks and output buffers
    /// are planned in it.
    working: u64,
    /// The largest group's planned working state, and what the run holds
    /// besides.
    planned: u64,
    dedup: bool,
    layers: usize,
    show_progress: bool,
    /// Groups this process computed, for the tests' stand-in for a kill.
    groups_here: u64,
    interrupt_after_groups: Option<u64>,
}

impl<'c> Run<'c> {
    /// Counts in-degrees and cuts each type's groups from them, each
    /// group's working state in its [`Room`].
    fn plan(
        (cfg, engine): (&'c InferConfig, &'c IoEngine),
        ds: &TypedDataset,
        m: &Loaded,
    ) -> Result<Run<'c>> {
        let total_edges: u64 = ds.relations.iter().filter_map(|r| r.edges.len_hint()).sum();
        let pb = offgnn_shared::progress::bar_if(
            cfg.show_progress,
            total_edges,
            "counting in-degrees",
            "edges",
        );
        let degrees = edges::in_degrees(ds, &|n| pb.inc(n))?;
        pb.finish_and_clear();
        let (base, working) = working_memory(cfg, ds, m)?;
        let mut groups = Vec::with_capacity(ds.node_types.len());
        let mut planned = 0;
        let room = Room::of(cfg, working);
        for (t, deg) in degrees.iter().enumerate() {
            let (per_edge, per_node, fixed, _) = costs(m, t, working);
            let budget = room.bytes.checked_sub(fixed).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "a group's source chunk and edge slice alone take {}, more than {}: {}",
                    offgnn_shared::report::human_bytes(fixed),
                    room.what,
                    room.remedy
                ))
            })?;
            let name = &ds.node_types[t].name;
            let (g, largest) = edges::cut_groups(
                deg.iter().map(|&d| u64::from(d) * per_edge + per_node),
                budget,
                &|v, c| {
                    format!(
                        "node {v} of type '{name}' has {} in-edges, whose working state ({}) is more than {}: {}",
                        deg[v as usize],
                        offgnn_shared::report::human_bytes(c),
                        room.what,
                        room.remedy
                    )
                },
            )?;
            groups.push(g);
            planned = u64::max(planned, base + largest + fixed);
        }
        Ok(Run {
            cfg,
            engine,
            groups,
            working,
            planned,
            // A flag left out takes the card's graph; one that contradicts
            // it was refused without --graph-override.
            dedup: match cfg.graph_override {
                true => !cfg.keep_duplicate_edges,
                false => m.card.dedup_edges,
            },
            layers: m.cfg.layers,
            show_progress: cfg.show_progress,
            groups_here: 0,
            interrupt_after_groups: crate::test_hooks::current().interrupt_after_groups,
        })
    }

    fn work(&self) -> &Path {
        &self.cfg.work_dir
    }

    /// Buckets every relation's edges by destination group; returns the
    /// edges bucketed.
    fn bucket(&mut self, ds: &TypedDataset) -> Result<u64> {
        std::fs::create_dir_all(self.work()).map_err(|e| Error::io(self.work().display(), e))?;
        let passes: u64 = ds
            .relations
            .iter()
            .map(|r| {
                let windows = self.groups[r.dst].len().div_ceil(256).max(1) as u64;
                r.edges.len_hint().unwrap_or(0) * windows
            })
            .sum();
        let pb =
            offgnn_shared::progress::bar_if(self.show_progress, passes, "bucketing edges", "edges");
        let mut total = 0;
        for (r, rel) in ds.relations.iter().enumerate() {
            total +=
                edges::bucket_relation(ds, r, &self.groups[rel.dst], self.work(), &|n| pb.inc(n))?;
        }
        pb.finish_and_clear();
        Ok(total)
    }

    /// How the hidden layers' rows are stored.
    fn hidden_dtype(&self) -> DType {
        match self.cfg.hidden_f16 {
            true => DType::F16,
            false => DType::F32,
        }
    }

    fn hidden_file(&self, l: usize, t: usize) -> std::path::PathBuf {
        self.work().join(format!("hidden-{l}-t{t:03}.bin"))
    }

    /// Layer `l`'s input rows of each type.
    fn inputs(&self, l: usize, ds: &TypedDataset, m: &Loaded) -> Result<Vec<Rows<'c>>> {
        (0..ds.node_types.len())
            .map(|t| match l {
                0 => Rows::features(
                    self.engine,
                    ds.node_types[t].features.as_ref().ok_or_else(|| {
                        Error::InvalidArgument(format!(
                            "node type '{}' has no features",
                            ds.node_types[t].name
                        ))
                    })?,
                ),
                _ => Rows::hidden(
                    self.engine,
                    &self.hidden_file(l - 1, t),
                    (m.cfg.hidden as usize, self.hidden_dtype()),
                ),
            })
            .collect()
    }

    /// Runs layer `progress.layer` over every type's groups from where
    /// `progress` stands: to the work directory, or for the last layer to
    /// Parquet parts under `out`. Saves the progress after every group.
    fn layer(
        &mut self,
        ds: &TypedDataset,
        m: &Loaded,
        (out, run_id): (&Store, &RunId),
        keep: &[Option<Vec<bool>>],
        progress: &mut TypedProgress,
    ) -> Result<()> {
        let l = progress.layer;
        let last = l + 1 == m.cfg.layers;
        let inputs = self.inputs(l, ds, m)?;
        if progress.figures.len() == l {
            progress.figures.push(TypedLayerFigures {
                layer: l + 1,
                ..Default::default()
            });
        }
        let pb = offgnn_shared::progress::bar_if(
            self.show_progress,
            ds.num_nodes(),
            &format!("layer {} of {}", l + 1, m.cfg.layers),
            "nodes",
        );
        // The nodes an earlier run finished: its types done, then its groups.
        let types_done: u64 = ds.node_types[..progress.node_type]
            .iter()
            .map(|t| t.num)
            .sum();
        let groups_done = (self.groups.get(progress.node_type))
            .and_then(|g| g.get(progress.groups_done))
            .map_or(0, |g| g.0);
        pb.inc(types_done + groups_done);
        let mut since = Instant::now();
        while progress.node_type < ds.node_types.len() {
            let t = progress.node_type;
            if last && keep[t].is_none() {
                pb.inc(ds.node_types[t].num);
                progress.node_type += 1;
                continue;
            }
            let mut writer = match (last, progress.groups_done) {
                (true, _) => None,
                (false, 0) => Some(HiddenWriter::create(
                    self.hidden_file(l, t),
                    self.cfg.hidden_f16,
                )?),
                // Rows of the groups done, the type's all when every group is.
                (false, g) => {
                    let rows = self.groups[t].get(g).map_or(ds.node_types[t].num, |r| r.0);
                    let bytes = rows * m.cfg.hidden as u64 * self.hidden_dtype().size() as u64;
                    Some(HiddenWriter::reopen(
                        self.hidden_file(l, t),
                        bytes,
                        self.cfg.hidden_f16,
                    )?)
                }
            };
            while progress.groups_done < self.groups[t].len() {
                let (lo, hi) = self.groups[t][progress.groups_done];
                self.group_output(
                    (l, t),
                    (lo, hi),
                    (ds, m, &inputs),
                    (out, run_id, keep),
                    (writer.as_mut(), progress),
                )?;
                progress.figures[l].groups += 1;
                progress.groups_done += 1;
                progress.figures[l].seconds += since.elapsed().as_secs_f64();
                since = Instant::now();
                save_progress(self.work(), progress)?;
                pb.inc(hi - lo);
                self.groups_here += 1;
                if self.interrupt_after_groups == Some(self.groups_here) {
                    return Err(Error::Interrupted(self.groups_here, "groups"));
                }
            }
            if let Some(w) = writer {
                progress.figures[l].bytes_written += w.finish()?;
            }
            progress.node_type += 1;
            progress.groups_done = 0;
            progress.figures[l].seconds += since.elapsed().as_secs_f64();
            since = Instant::now();
            save_progress(self.work(), progress)?;
        }
        pb.finish_and_clear();
        progress.layer += 1;
        progress.node_type = 0;
        save_progress(self.work(), progress)?;
        // The layer's input goes once the progress no longer needs it.
        if l > 0 {
            for t in 0..ds.node_types.len() {
                let _ = std::fs::remove_file(self.hidden_file(l - 1, t));
            }
        }
        Ok(())
    }

    /// Group `(lo, hi)` of type `t` at layer `l`, computed and written: its
    /// rows appended to the layer's hidden file (`writer`, flushed), or in
    /// the last layer (no writer) its Parquet parts under `out`, named in
    /// `progress`. A killed run's group is written again whole, its parts
    /// under the same names.
    fn group_output(
        &self,
        (l, t): (usize, usize),
        (lo, hi): (u64, u64),
        (ds, m, inputs): (&TypedDataset, &Loaded, &[Rows]),
        (out, run_id, keep): (&Store, &RunId, &[Option<Vec<bool>>]),
        (writer, progress): (Option<&mut HiddenWriter>, &mut TypedProgress),
    ) -> Result<()> {
        if let Some(signal) = offgnn_shared::signals::received() {
            return Err(Error::Stopped(format!("stopped by {signal}")));
        }
        let g = progress.groups_done;
        let h = tch::no_grad(|| {
            self.group(
                l,
                (t, g),
                (lo, hi),
                inputs,
                m,
                &mut progress.figures[l].bytes_read,
            )
        })?;
        if let Some(w) = writer {
            let mut h = h;
            Rgnn::between_layers(&mut h)?;
            w.append(
                &h.f_to_device(Device::Cpu)?,
                rows::piece_bytes(self.working),
            )?;
            return w.flush();
        }
        let logits = (t == ds.target && m.card.scorer.is_none())
            .then(|| m.model.classify(&h)?.f_to_device(Device::Cpu))
            .transpose()?;
        let h = h.f_to_device(Device::Cpu)?;
        let keep = keep[t].as_ref().expect("a type the last layer writes");
        let part = output::Part {
            type_name: &ds.node_types[t].name,
            group: g,
            first: lo,
            keep: keep[lo as usize..hi as usize].to_vec(),
            embedding: &h,
            logits: logits.as_ref(),
        };
        for (name, rows) in
            output::write_parts(out, run_id, (self.cfg.outputs, self.working), &part)?
        {
            progress.run.output_files.push(name);
            progress.written[t] += rows;
        }
        Ok(())
    }

    /// Group `g` of type `t` (destinations `lo..hi`) at layer `l`: the sum
    /// over the relations that reach `t` of each one's messages, its source
    /// rows read a chunk at a time (only the rows the group's edges need)
    /// and computed on `--device`, where the sum stays.
    fn group(
        &self,
        l: usize,
        (t, g): (usize, usize),
        (lo, hi): (u64, u64),
        inputs: &[Rows],
        m: &Loaded,
        read: &mut u64,
    ) -> Result<Tensor> {
        let device = self.cfg.device;
        let x_dst = match m.model.reads_destinations() {
            true => Some(inputs[t].range((lo, hi), read)?.f_to_device(device)?),
            false => None,
        };
        let mut sum: Option<Tensor> = None;
        let mut indices: Vec<i64> = Vec::new();
        for (r, &(s, d)) in m.model.relations().iter().enumerate() {
            if d != t {
                continue;
            }
            let edges = edges::load_group(self.work(), (r, g), (lo, hi), self.dedup)?;
            let mut agg = m
                .model
                .aggregator((l, r), x_dst.as_ref(), (hi - lo) as i64)?;
            let chunk_rows =
                (chunk_bytes(self.working) / (inputs[s].width() as u64 * 4).max(1)).max(1) as u32;
            let (_, _, _, slice_edges) = costs(m, t, self.working);
            let mut i = 0;
            while i < edges.len() {
                // The edges whose sources are in the chunk of edge i's.
                let end = (edges[i].0 / chunk_rows + 1).saturating_mul(chunk_rows);
                let j = i + edges[i..].partition_point(|e| e.0 < end);
                let mut sources: Vec<u32> = edges[i..j].iter().map(|e| e.0).collect();
                sources.dedup();
                let x = agg.project(&inputs[s].gather(&sources, read)?.f_to_device(device)?)?;
                for slice in edges[i..j].chunks(slice_edges) {
                    // Sources then destinations, one copy to the device.
                    let n = slice.len() as i64;
                    indices.clear();
                    indices.extend(slice.iter().map(|e| {
                        sources.binary_search(&e.0).expect("a source of the chunk") as i64
                    }));
                    indices.extend(slice.iter().map(|e| i64::from(e.1)));
                    let both = Tensor::f_from_slice(&indices)?.f_to_device(device)?;
                    agg.add(&x, &both.f_narrow(0, 0, n)?, &both.f_narrow(0, n, n)?)?;
                }
                i = j;
            }
            let y = agg.finish()?;
            sum = Some(match sum {
                Some(mut acc) => {
                    let _ = acc.f_add_(&y)?;
                    acc
                }
                None => y,
            });
        }
        Ok(sum.expect("checked: every type is some relation's destination"))
    }

    /// Removes the work directory's files once the result is committed.
    fn clear(&self, ds: &TypedDataset) {
        for (r, rel) in ds.relations.iter().enumerate() {
            for g in 0..self.groups[rel.dst].len() {
                let _ = std::fs::remove_file(edges::bucket_file(self.work(), r, g));
            }
        }
        for t in 0..ds.node_types.len() {
            for l in 0..self.layers {
                let _ = std::fs::remove_file(self.hidden_file(l, t));
            }
        }
    }
}
