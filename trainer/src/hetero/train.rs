//! Training a typed layout: each batch's rows read and assembled from each
//! node type's layout by the homogeneous stages (its caches, disk-cache
//! pages and packed chunk), its typed blocks from the topology tables,
//! then R-SAGE's or R-GAT's step. With the pipeline on, a loader thread
//! reads the next batches (tables, disk reads, topology) while this thread
//! assembles and steps. Ranks of a data-parallel launch share each epoch
//! ([`super::ranks`]). `--features naive` reads each type's rows from its
//! feature file instead, one aligned read per row: the baseline the packed
//! layout is measured against.

use std::path::{Path, PathBuf};
use std::time::Instant;

use offgnn_manifests::{Split, TypedManifest};
use offgnn_shared::io_engine::IoEngine;
use tch::nn;
use tch::{Device, Kind, Reduction, Tensor};

use super::checkpoint::InEpoch;
pub(crate) use super::fetch::Batch;
use super::ranks::Named;
use super::{RelationalKind, Rgnn, RgnnConfig, Schema, checkpoint, first_layer};
use crate::error::{Error, Result};
use crate::historical::{Historical, HistoricalConfig};
use crate::layout::{Layout, TableFile};
use crate::link::{self, RankMetrics, RankSums};
use crate::model::Adam;
use crate::pipeline::{AssembleSources, FeatureMode, LoadSources, Sources};
use crate::train::Ranks;

mod batches;
mod cpu_caches;

pub use super::figures::{StageSeconds, TypedEpoch, TypedTrainSummary};

/// What a typed training run is asked.
#[derive(Clone, Debug)]
pub struct TypedTrainConfig {
    pub kind: RelationalKind,
    pub hidden: i64,
    pub heads: i64,
    pub dropout: f64,
    /// R-SAGE with `lin_r` on the destinations' own rows.
    pub root_weight: bool,
    /// How R-SAGE's linear maps start.
    pub init: super::LinearInit,
    pub lr: f64,
    pub epochs: u32,
    pub seed: u64,
    pub device: Device,
    /// Train at most this many batches of each epoch (quick checks).
    pub max_batches: Option<usize>,
    /// A loader thread reads ahead (else every stage on this thread).
    pub pipelined: bool,
    /// Where the best validation epoch's model goes (and with `last`, the
    /// last epoch's to `EXPORT/last`).
    pub export: Option<crate::train::ExportTarget>,
    /// A checkpoint after every epoch goes here; `resume` continues from
    /// the one there, `overwrite` starts afresh over it.
    pub checkpoint_dir: Option<PathBuf>,
    /// Where the layout's manifest was given (a local file made absolute,
    /// or an object store's URL without its credentials): checkpoints
    /// record it, so that `trainer export` reads the layout from there.
    pub layout_location: Option<String>,
    /// Also a checkpoint every this many steps inside an epoch.
    pub checkpoint_every: Option<u64>,
    pub resume: bool,
    pub overwrite: bool,
    pub show_progress: bool,
    /// The first test batches, as the best epoch's model sees them.
    pub dump: Option<crate::train::DumpTarget>,
    /// A link-prediction layout's scorer (none for node classification).
    pub scorer: Option<crate::link::ScorerKind>,
    /// FreshGNN's historical embedding cache, off without it.
    pub historical: Option<HistoricalConfig>,
}

/// A typed layout opened for training: each featured type's layout and
/// feature sources, and the topology tables.
pub struct TypedLayout {
    pub manifest: TypedManifest,
    pub schema: Schema,
    /// Where the rows come from.
    pub features: FeatureMode,
    /// Each type's layout and what its loading reads (shared with the
    /// loader thread), and what its assembly reads (this thread's).
    reads: Vec<Option<(Layout, LoadSources)>>,
    assembles: Vec<Option<AssembleSources>>,
    topology: Vec<TableFile>,
}

impl TypedLayout {
    /// Opens the typed layout in `dir`, checking every type's objects, and
    /// loads each type's caches for `device`; `features` says where the
    /// rows come from (the packed layout, or the baselines' feature files).
    pub fn open(
        dir: &Path,
        manifest: TypedManifest,
        engine: &IoEngine,
        (features, device): (FeatureMode, Device),
        show: bool,
    ) -> Result<TypedLayout> {
        let schema = Schema::of(&manifest)?;
        let (mut reads, mut assembles) = (Vec::new(), Vec::new());
        for t in &manifest.node_types {
            let Some(m) = &t.layout else {
                reads.push(None);
                assembles.push(None);
                continue;
            };
            let layout = Layout::open(dir, m.clone(), engine, show)?;
            let Sources { load, assemble } =
                crate::train::sources(&layout, engine, (features, device))?;
            reads.push(Some((layout, load)));
            assembles.push(Some(assemble));
        }
        check_topology(dir, &manifest, engine)?;
        let topology = manifest
            .topology
            .tables
            .iter()
            .map(|t| TableFile::open(dir.join(&t.object)))
            .collect::<Result<_>>()?;
        Ok(TypedLayout {
            manifest,
            schema,
            features,
            reads,
            assembles,
            topology,
        })
    }

    /// The batches of `split` in sampled epoch `epoch`, in order.
    pub(crate) fn batches(&self, split: Split, epoch: u32) -> usize {
        self.manifest
            .topology
            .schedule
            .get(&split)
            .and_then(|e| e.get(epoch as usize))
            .map_or(0, Vec::len)
    }

    /// Sampled epochs of training batches.
    pub(crate) fn sampled_epochs(&self) -> u32 {
        self.manifest
            .topology
            .schedule
            .get(&Split::Train)
            .map_or(0, |e| e.len() as u32)
    }
}

/// Trains `cfg`'s model on `layout` as `ranks` take part: every epoch's
/// training batches, then the validation and test batches; `on_epoch`
/// sees each epoch's figures (summed over the ranks).
pub fn train_typed(
    layout: &TypedLayout,
    engine: &IoEngine,
    cfg: &TypedTrainConfig,
    ranks: Ranks<'_>,
    on_epoch: &mut dyn FnMut(&TypedEpoch),
) -> Result<TypedTrainSummary> {
    let started = Instant::now();
    let sampled = check_run(layout, cfg, ranks)?;
    tch::manual_seed(cfg.seed as i64);
    let model_cfg = model_config(&layout.manifest, cfg);
    let vs = nn::VarStore::new(cfg.device);
    let model = Rgnn::new(&vs.root(), &layout.schema, &model_cfg)?;
    let mut opt = Adam::new(&vs, cfg.lr);
    let cache = super::historical::cache(cfg, &model_cfg, ranks)?;
    let writer = ranks.writer();
    // An export target that would be refused is refused before training.
    if let Some(x) = cfg.export.as_ref().filter(|_| writer) {
        crate::export::check_target(&x.location, x.overwrite)?;
    }
    let key = checkpoint::RunKey {
        model: &model_cfg,
        lr: cfg.lr,
        seed: cfg.seed,
        manifest: &layout.manifest,
        layout: cfg.layout_location.as_deref(),
        historical: cfg.historical.as_ref(),
        world: ranks.world(),
        max_batches: cfg.max_batches,
    };
    let (mut epochs, mut best_params, mut resume_at) =
        start(cfg, (&vs, &mut opt), &key, (ranks, cache.is_some()))?;
    let resumed_from = (!epochs.is_empty() || resume_at.is_some())
        .then(|| (epochs.len() as u32, resume_at.map_or(0, |p| p.steps)));
    let mut done = Done {
        here: 0,
        interrupt_after: crate::test_hooks::current().interrupt_after,
    };
    let keep_best =
        writer && (cfg.export.is_some() || cfg.checkpoint_dir.is_some() || cfg.dump.is_some());
    let run = Run::training(engine, cfg, &model, ranks);
    // Only the training batches are pruned against the cache.
    let training = Run {
        historical: cache.as_ref().map(|h| (h, 0)),
        ..run
    };
    for epoch in epochs.len() as u32..cfg.epochs {
        // A checkpoint inside the epoch (rank 0's; every rank sums).
        let mut inside = |adam: &Adam, p: InEpoch| -> Result<()> {
            let Some(dir) = cfg.checkpoint_dir.as_ref().filter(|_| writer) else {
                return Ok(());
            };
            let state = checkpoint::State {
                vs: &vs,
                adam,
                best: best_params.as_deref(),
            };
            let best = best_epoch(&epochs).map(|e| e.epoch);
            checkpoint::save(dir, &state, &key, (&epochs, best), Some(p))
        };
        let at = (resume_at.take(), &mut inside as &mut MidEpoch, &mut done);
        let row = run_epoch(
            layout,
            (&model, &mut opt),
            (epoch, sampled),
            training,
            cfg,
            at,
        )?;
        on_epoch(&row);
        let improved = epochs
            .iter()
            .all(|e| e.valid_score() < row.valid_score() || row.valid_score().is_none());
        if keep_best && (improved || best_params.is_none()) {
            best_params = Some(crate::export::snapshot(&vs)?);
        }
        epochs.push(row);
        if let Some(dir) = cfg.checkpoint_dir.as_ref().filter(|_| writer) {
            let state = checkpoint::State {
                vs: &vs,
                adam: &opt,
                best: best_params.as_deref(),
            };
            let best = best_epoch(&epochs).map(|e| e.epoch);
            checkpoint::save(dir, &state, &key, (&epochs, best), None)?;
        }
        if epoch + 1 < cfg.epochs {
            super::ranks::stop_on_signal(ranks, cfg, epoch)?;
        }
    }
    let best = best_epoch(&epochs);
    let last_params = crate::export::snapshot(&vs)?;
    if let Some(target) = cfg.dump.as_ref().filter(|_| writer) {
        let params = best_params.as_deref().expect("an epoch ran");
        let params = params.iter().map(|(k, v)| (k.clone(), v.shallow_clone()));
        crate::export::load_into(&vs, &params.collect(), "the best epoch's parameters")?;
        super::dump::dump_batches(layout, &model, run, target)?;
    }
    let exports = match cfg.export.as_ref().filter(|_| writer) {
        Some(x) => super::export::run_exports(
            x,
            (layout, &model_cfg),
            (&epochs, best),
            (best_params.take().expect("an epoch ran"), last_params),
        )?,
        None => Vec::new(),
    };
    let historical = cache.as_ref().map(Historical::summary);
    let run_of = (ranks, engine, started);
    Ok(summary(
        layout,
        cfg,
        run_of,
        &vs,
        (epochs, exports),
        historical,
        resumed_from,
    ))
}

/// Where the run starts: rank 0 reads the checkpoint, and every rank
/// starts from its model. A run resumed `historical` says its cache
/// starts empty.
fn start(
    cfg: &TypedTrainConfig,
    (vs, opt): (&nn::VarStore, &mut Adam),
    key: &checkpoint::RunKey<'_>,
    (ranks, historical): (Ranks<'_>, bool),
) -> Result<Started> {
    let decided = if ranks.writer() {
        checkpoint::start(cfg, (vs, opt), key)
    } else {
        Ok((Vec::new(), None, None))
    };
    let started = match ranks.group() {
        Some(g) => super::ranks::share_start(g, decided, opt, cfg.device)?,
        None => decided?,
    };
    if historical && (!started.0.is_empty() || started.2.is_some()) {
        tracing::info!(
            "resumed with --historical: the historical cache is not in the checkpoint and starts empty, so from here the run differs from one never stopped"
        );
    }
    Ok(started)
}

/// The run's summary: its model, its epochs and what they made.
fn summary(
    layout: &TypedLayout,
    cfg: &TypedTrainConfig,
    (ranks, engine, started): (Ranks<'_>, &IoEngine, Instant),
    vs: &nn::VarStore,
    (epochs, exports): (Vec<TypedEpoch>, Vec<String>),
    historical: Option<crate::historical::HistoricalSummary>,
    resumed_from: Option<(u32, u64)>,
) -> TypedTrainSummary {
    let best = best_epoch(&epochs).cloned();
    let best = best.as_ref();
    let writer = ranks.writer();
    TypedTrainSummary {
        model: cfg.kind,
        root_weight: cfg.root_weight,
        init: cfg.init,
        features: layout.features,
        world_size: ranks.world(),
        node_types: layout.schema.types.iter().map(|t| t.0.clone()).collect(),
        relations: layout.schema.relations.len(),
        parameters: vs
            .trainable_variables()
            .iter()
            .map(Tensor::numel)
            .sum::<usize>() as i64,
        best_epoch: best.map(|e| e.epoch),
        test_accuracy_at_best: best.and_then(|e| e.test_accuracy),
        best_valid_rank: best.and_then(|e| e.valid_rank),
        test_rank_at_best_valid: best.and_then(|e| e.test_rank),
        exports,
        epochs,
        dump: cfg.dump.as_ref().filter(|_| writer).map(|d| d.path.clone()),
        io_depth: engine.options().queue_depth,
        read_through_pages: engine.options().read_through / offgnn_shared::io_engine::PAGE,
        historical,
        resumed_from,
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// Refuses what the run cannot train, before anything is built: a CPU
/// cache that follows the batch order under ranks, a layout without
/// training epochs; says how the epochs are dealt and reused. Returns the
/// sampled epochs.
fn check_run(layout: &TypedLayout, cfg: &TypedTrainConfig, ranks: Ranks<'_>) -> Result<u32> {
    if ranks.world() > 1 && layout.cpu_cache_follows() {
        return Err(Error::Layout(
            "a node type's CPU cache follows the sampled batch order (packer --cpu-cache-policy belady, window or auto), which one process trains; for data-parallel training pack it with --cpu-cache-policy static".into(),
        ));
    }
    let sampled = layout.sampled_epochs();
    if sampled == 0 {
        return Err(Error::InvalidArgument(
            "the layout has no training epochs".into(),
        ));
    }
    if ranks.writer() {
        let n = layout.batches(Split::Train, 0);
        let n = cfg.max_batches.map_or(n, |m| m.min(n));
        crate::distributed::say_padding(n, ranks.world() as usize);
    }
    if cfg.epochs > sampled {
        tracing::info!(
            "{} epochs over {sampled} sampled: epoch e trains on sampled epoch e mod {sampled}",
            cfg.epochs
        );
    }
    Ok(sampled)
}

/// Where a run starts: the epochs done, the best parameters so far, and
/// where the next epoch stands when the checkpoint was taken inside it.
pub(super) type Started = (Vec<TypedEpoch>, Option<Named>, Option<InEpoch>);

/// Saves a checkpoint inside an epoch.
type MidEpoch<'a> = dyn FnMut(&Adam, InEpoch) -> Result<()> + 'a;

/// Where an epoch starts (inside it, after a checkpoint taken there), what
/// saves a checkpoint inside it, and the steps trained so far.
type At<'a> = (Option<InEpoch>, &'a mut MidEpoch<'a>, &'a mut Done);

/// Training steps this process took, and the test hook's stand-in for a
/// kill after so many.
struct Done {
    here: u64,
    interrupt_after: Option<u64>,
}

/// How batches are fetched and trained: the engine, the device, whether a
/// loader thread reads ahead, and the ranks that share the epoch.
#[derive(Clone, Copy)]
pub(crate) struct Run<'a> {
    engine: &'a IoEngine,
    device: Device,
    pipelined: bool,
    /// Whether a batch's rows are copied on every core: where the model
    /// steps between assemblies (training, evaluation), not where a
    /// caller's model runs beside them (the loader).
    parallel_assembly: bool,
    /// Whether R-SAGE's first layer takes its means where the rows lie
    /// instead of from an assembled matrix (on the CPU, where the rows are
    /// not wanted themselves: not for `--dump-batches`).
    first_means: bool,
    ranks: Ranks<'a>,
    /// The historical cache training batches are pruned against, and the
    /// training step of the first batch.
    historical: Option<(&'a Historical, u64)>,
    /// Whether a signal stops the run at its next step or epoch boundary,
    /// where a checkpoint is kept (training and its evaluation), not at
    /// its next fetch.
    stops_at_boundaries: bool,
}

impl<'a> Run<'a> {
    /// The same run with each type's rows assembled, for a caller that
    /// wants the rows themselves.
    pub(crate) fn with_rows(self) -> Run<'a> {
        Run {
            first_means: false,
            ..self
        }
    }

    /// Training `model` as `cfg` says: each batch assembled on every core
    /// between steps; R-SAGE on the CPU from its first layer's means.
    fn training(
        engine: &'a IoEngine,
        cfg: &TypedTrainConfig,
        model: &Rgnn,
        ranks: Ranks<'a>,
    ) -> Run<'a> {
        Run {
            engine,
            device: cfg.device,
            pipelined: cfg.pipelined,
            parallel_assembly: true,
            first_means: cfg.device == Device::Cpu && !model.reads_destinations(),
            ranks,
            historical: None,
            stops_at_boundaries: true,
        }
    }

    /// One process reading pipelined, as a caller's own loop does.
    pub(crate) fn one(engine: &'a IoEngine, device: Device) -> Run<'a> {
        Run {
            engine,
            device,
            pipelined: true,
            parallel_assembly: false,
            first_means: false,
            ranks: Ranks::One,
            historical: None,
            stops_at_boundaries: false,
        }
    }
}

/// Epoch `epoch` (on sampled epoch `epoch mod sampled`): its training
/// batches, the CPU caches restored, then the validation and test batches.
fn run_epoch(
    layout: &TypedLayout,
    (model, opt): (&Rgnn, &mut Adam),
    (epoch, sampled): (u32, u32),
    run: Run<'_>,
    cfg: &TypedTrainConfig,
    at: At<'_>,
) -> Result<TypedEpoch> {
    let t = Instant::now();
    let mut row = train_epoch(layout, (model, opt), (epoch, epoch % sampled), run, cfg, at)?;
    row.train_seconds = t.elapsed().as_secs_f64();
    let plain = Run {
        historical: None,
        ..run
    };
    let evaluate = |split| evaluate(layout, model, (split, 0), plain);
    (row.valid_accuracy, row.valid_rank) = evaluate(Split::Valid)?;
    (row.test_accuracy, row.test_rank) = evaluate(Split::Test)?;
    row.seconds = t.elapsed().as_secs_f64();
    row.eval_seconds = row.seconds - row.train_seconds;
    Ok(row)
}

/// The model `cfg` asks for over `m`'s types, a layer per sampled block.
pub fn model_config(m: &TypedManifest, cfg: &TypedTrainConfig) -> RgnnConfig {
    RgnnConfig {
        kind: cfg.kind,
        in_dims: m
            .node_types
            .iter()
            .map(|t| t.feature_dim.map(|d| d as i64))
            .collect(),
        hidden: cfg.hidden,
        classes: match cfg.scorer {
            Some(_) => 0,
            None => i64::from(m.dataset.num_classes),
        },
        layers: m.samples.fanouts.len(),
        heads: cfg.heads,
        dropout: cfg.dropout,
        root_weight: cfg.root_weight,
        init: cfg.init,
        scorer: cfg.scorer,
    }
}

impl TypedEpoch {
    /// What picks the best epoch: the validation MRR of a link model, else
    /// the validation accuracy.
    pub fn valid_score(&self) -> Option<f64> {
        self.valid_rank.map(|r| r.mrr).or(self.valid_accuracy)
    }
}

/// The first epoch of the best validation score.
fn best_epoch(epochs: &[TypedEpoch]) -> Option<&TypedEpoch> {
    epochs
        .iter()
        .filter(|e| e.valid_score().is_some())
        .reduce(|a, b| {
            if b.valid_score() > a.valid_score() {
                b
            } else {
                a
            }
        })
}

/// One epoch's training batches (of sampled epoch `sampled`): each
/// batch's forward and backward pass, and each step (a batch per local
/// rank, dealt as homogeneous training deals them) the gradients averaged
/// over the ranks and the optimizer's step; then the CPU caches that
/// follow the batch order restored. Its sums add over the ranks.
fn train_epoch(
    layout: &TypedLayout,
    (model, opt): (&Rgnn, &mut Adam),
    (epoch, sampled): (u32, u32),
    run: Run<'_>,
    cfg: &TypedTrainConfig,
    (resume_at, inside, done): At<'_>,
) -> Result<TypedEpoch> {
    let n = layout.batches(Split::Train, sampled);
    let n = cfg.max_batches.map_or(n, |m| m.min(n));
    let world = run.ranks.world() as usize;
    let shares: Vec<Vec<usize>> = run
        .ranks
        .local()
        .iter()
        .map(|&r| crate::distributed::deal(n, world, r as usize))
        .collect();
    let per_step = shares.len();
    let steps = shares.first().map_or(0, Vec::len) as u64;
    // Resumed inside the epoch: the steps done are skipped, their sums kept.
    let at = resume_at.unwrap_or_default();
    let from = |s: std::ops::Range<usize>| -> Vec<usize> {
        s.flat_map(|s| shares.iter().map(move |share| share[s]))
            .collect()
    };
    let skip = at.steps.min(steps) as usize;
    if skip > 0 && layout.cpu_cache_follows() {
        layout.rebuild_cpu_caches((epoch, sampled), &from(0..skip), run.engine)?;
    }
    let order = from(skip..steps as usize);
    let pb = offgnn_shared::progress::bar_if(
        cfg.show_progress,
        order.len() as u64,
        &format!("epoch {epoch}"),
        "batches",
    );
    let mut sums = [
        at.loss_sum,
        at.right,
        at.seen,
        at.disk_bytes,
        at.disk_rows_bytes,
    ];
    let mut step_no = at.steps;
    let mut diverged = None;
    // The cache counts optimizer steps across epochs.
    let run = Run {
        historical: run.historical.map(|(h, _)| (h, opt.step as u64)),
        ..run
    };
    let stages = layout.for_each_batch((Split::Train, sampled, &order), run, &mut |k, b| {
        if k % per_step == 0 {
            opt.zero_grad();
        }
        // Dropout draws follow the batch's place in the epoch, whichever
        // rank trains it: a resumed run draws what one never stopped does.
        tch::manual_seed(crate::train::batch_seed(cfg.seed, epoch, order[k] as u64));
        sums[3] += b.disk_bytes as f64;
        sums[4] += b.disk_rows_bytes as f64;
        let cache = run.historical.map(|(h, first)| (h, first + k as u64));
        let (value, right, seen) = batch_pass(model, &b, cache)?;
        if !value.is_finite() {
            diverged.get_or_insert(format!(
                "epoch {epoch} batch {}: the loss is {value}",
                order[k]
            ));
        }
        sums[0] += value * seen;
        sums[1] += right;
        sums[2] += seen;
        pb.inc(1);
        if k % per_step == per_step - 1 {
            let (any, stop) =
                super::ranks::average_gradients(run.ranks, opt, diverged.is_some(), run.device)?;
            if any {
                let another = || format!("epoch {epoch}: another rank's loss is not finite");
                let why = diverged.take().unwrap_or_else(another);
                return Err(Error::InvalidArgument(format!("{why}; lower --lr")));
            }
            opt.step()?;
            step_no += 1;
            // A checkpoint every --checkpoint-every steps, and where SIGINT
            // or SIGTERM reached any rank: every rank stops after this step
            // with a checkpoint of it. (At the epoch's last step the epoch
            // goes on to its evaluation and its own checkpoint.)
            let every = cfg
                .checkpoint_every
                .is_some_and(|n| step_no.is_multiple_of(n));
            if (every || stop) && step_no < steps {
                let total = super::ranks::summed(run.ranks, &sums, run.device)?;
                inside(opt, InEpoch::of(step_no, &total))?;
            }
            done.here += 1;
            if done.interrupt_after == Some(done.here) {
                return Err(Error::Interrupted(done.here, "training batches"));
            }
            if stop && step_no < steps {
                let place = format!("at epoch {epoch}, batch {step_no}");
                let dir = cfg.checkpoint_dir.as_deref();
                return Err(crate::train::stopped(dir, &place, "step"));
            }
        }
        Ok(())
    })?;
    pb.finish_and_clear();
    // Evaluation and the next epoch read the static rows again.
    sums[3] += layout.restore_cpu_caches()? as f64;
    let sums = super::ranks::summed(run.ranks, &sums, run.device)?;
    let seen = sums[2].max(1.0);
    Ok(TypedEpoch {
        epoch,
        loss: sums[0] / seen,
        train_accuracy: sums[1] / seen,
        disk_bytes: sums[3] as u64,
        disk_rows_bytes: sums[4] as u64,
        stages,
        ..Default::default()
    })
}

/// A training batch's forward and backward pass, as training step `cache`
/// of the historical cache where there is one (its update published once
/// the backward pass is through): the loss, the seeds or pairs right, and
/// how many the batch has.
fn batch_pass(
    model: &Rgnn,
    b: &Batch,
    cache: Option<(&Historical, u64)>,
) -> Result<(f64, f64, f64)> {
    let mut kept = Vec::new();
    let (loss, right, seen) = match &b.plan {
        Some(p) => step_loss(model, b, &mut p.lay_in(&mut kept))?,
        None => step_loss(model, b, &mut |_, h| Ok(h))?,
    };
    loss.f_backward()?;
    if let Some((h, step)) = cache {
        super::historical::publish(h, step, b.plan.as_ref(), &kept)?;
    }
    Ok((loss.f_double_value(&[])?, right, seen))
}

/// How many rows' largest logit is their label.
fn hits(logits: &Tensor, labels: &Tensor) -> Result<i64> {
    Ok(crate::train::correct(logits, labels)?.f_int64_value(&[])?)
}

/// A training batch's loss (the mean over its seeds, or over its pairs in
/// a link batch), with the seeds or pairs it got right and how many it has.
/// `level` sees each level's rows ([`Rgnn::output_levels`]).
fn step_loss(
    model: &Rgnn,
    b: &Batch,
    level: &mut super::TypedLevelHook<'_>,
) -> Result<(Tensor, f64, f64)> {
    if let (Some(pairs), Some(scorer)) = (&b.pairs, model.scorer()) {
        let h = model.output_levels(b.inputs(), &b.blocks, true, level)?;
        let scores = scorer.score(&h, &pairs.src, &pairs.dst)?;
        let right = link::pairs_right(&scores, pairs)?.f_int64_value(&[])?;
        let seen = scores.size()[0] as f64;
        return Ok((link::pair_loss(&scores, pairs)?, right as f64, seen));
    }
    refuse_pairs(model, b)?;
    let logits = model.output_levels(b.inputs(), &b.blocks, true, level)?;
    let loss = logits
        .f_log_softmax(-1, Kind::Float)?
        .f_nll_loss::<Tensor>(&b.labels, None, Reduction::Mean, -100)?;
    let right = hits(&logits, &b.labels)? as f64;
    Ok((loss, right, b.labels.size()[0] as f64))
}

/// A node batch for a link model, or a link batch for a node model.
fn refuse_pairs(model: &Rgnn, b: &Batch) -> Result<()> {
    match (b.pairs.is_some(), model.scorer().is_some()) {
        (false, false) => Ok(()),
        (true, _) => Err(Error::InvalidArgument(
            "a link-prediction batch for a node-classification model".into(),
        )),
        (false, true) => Err(Error::InvalidArgument(
            "a node-classification batch for a link-prediction model".into(),
        )),
    }
}

/// The model's accuracy on every batch of `split` (none: no such batches),
/// and a link model's ranking figures; ranks of a group each evaluate
/// their part and add up.
fn evaluate(
    layout: &TypedLayout,
    model: &Rgnn,
    (split, epoch): (Split, u32),
    run: Run<'_>,
) -> Result<(Option<f64>, Option<RankMetrics>)> {
    let n = layout.batches(split, epoch);
    if n == 0 {
        return Ok((None, None));
    }
    let part: Vec<usize> = match run.ranks.group() {
        Some(g) => crate::distributed::eval_share(n, g.world as usize, g.rank as usize).collect(),
        None => (0..n).collect(),
    };
    if let Some(scorer) = model.scorer() {
        let mut sums = RankSums::new(run.device);
        layout.for_each_batch((split, epoch, &part), run, &mut |_, b| {
            let Some(pairs) = &b.pairs else {
                return refuse_pairs(model, &b);
            };
            let scores = tch::no_grad(|| {
                let h = model.embed(b.inputs(), &b.blocks, false)?;
                scorer.score(&h, &pairs.src, &pairs.dst)
            })?;
            Ok(sums.add(&scores, pairs)?)
        })?;
        let values = super::ranks::summed(run.ranks, &sums.values()?, run.device)?;
        let (rank, right) = RankMetrics::of(&values);
        return Ok((Some(right), Some(rank)));
    }
    let (mut right, mut seen) = (0i64, 0i64);
    layout.for_each_batch((split, epoch, &part), run, &mut |_, b| {
        refuse_pairs(model, &b)?;
        let logits = tch::no_grad(|| model.forward(b.inputs(), &b.blocks, false))?;
        right += hits(&logits, &b.labels)?;
        seen += b.labels.size()[0];
        Ok(())
    })?;
    let sums = super::ranks::summed(run.ranks, &[right as f64, seen as f64], run.device)?;
    Ok((Some(sums[0] / sums[1].max(1.0)), None))
}

/// Checks the topology tables of a typed layout as every type's objects
/// are checked ([`crate::layout::check_object`]): present, their size and
/// CRC32C, unless unchanged since they last matched. A flipped bit in a
/// table would otherwise change a batch's edges without a word.
fn check_topology(dir: &Path, manifest: &TypedManifest, engine: &IoEngine) -> Result<()> {
    let verified = crate::verified::Verified::load();
    let mut buf = crate::layout::crc_buffer();
    for t in &manifest.topology.tables {
        let o = manifest
            .objects
            .iter()
            .find(|o| o.name == t.object)
            .ok_or_else(|| {
                Error::Layout(format!(
                    "{}: the manifest lists no object {} among its objects",
                    dir.display(),
                    t.object
                ))
            })?;
        crate::layout::check_object(engine, (dir, o), &mut buf, &verified)?;
    }
    verified.save();
    Ok(())
}
