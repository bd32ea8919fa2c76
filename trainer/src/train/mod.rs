//! The training job: epochs over the sampled batches through the pipeline,
//! validation and test accuracy every epoch, checkpoints (every epoch, and
//! every `checkpoint_every` batches within one), per-epoch metrics, and the
//! final report (test accuracy at the best validation epoch).
//!
//! Epoch `t` trains on sampled epoch `t mod E` (E sampled epochs); past the
//! sampled ones, the batch order is reshuffled with a generator of
//! (seed, t), so no two passes see batches in the same order.
//!
//! Resume is exact: dropout draws are seeded per (seed, epoch, position),
//! the optimizer's moments and step are in the checkpoint, and a checkpoint
//! taken inside an epoch records the position and the epoch's running
//! sums, so a resumed run trains every batch once and reports the same
//! losses as one that was never stopped.
//!
//! [`train_ranks`] is the pipeline: the run's start (`start`: refusals,
//! resume), then per epoch the training (`epoch`, `step`), the evaluation
//! (`eval`) and the epoch's record and checkpoint (`checkpoint`), then the
//! exports and summary (`finish`).

mod agreement;
mod checkpoint;
mod config;
mod context;
mod epoch;
mod eval;
mod finish;
mod historical_step;
pub(crate) mod metrics;
mod order;
mod ranks;
mod sources;
pub(crate) mod start;
mod step;

use offgnn_manifests::{BatchRef, Split};
use offgnn_shared::io_engine::IoEngine;

pub use checkpoint::export_checkpoint;
pub(crate) use checkpoint::{
    FileDigest, META, check_epochs, commit_meta, load_tensors, write_tensor_file,
};
pub use config::{DumpTarget, ExportTarget, TrainConfig};
use context::{Job, ModelState, RunState};
pub(crate) use metrics::correct;
pub use metrics::{EpochMetrics, MachineShare, StageBusy, TrainSummary};
pub(crate) use order::batch_seed;
pub use order::{segments_read, split_order};
pub use ranks::Ranks;
pub(crate) use ranks::{all_reduce_gradients, divide_gradients};
pub use sources::sources;
pub(crate) use start::share_model;
pub(crate) use step::stopped;

use crate::error::{Error, Result};
use crate::historical::Historical;
use crate::layout::Layout;
use crate::model::ModelKind;

/// Trains as configured on an opened layout, as one process.
pub fn train(layout: &Layout, engine: &IoEngine, cfg: &TrainConfig) -> Result<TrainSummary> {
    train_ranks(layout, engine, cfg, Ranks::One, &mut |_| {})
}

/// Trains as configured on an opened layout, as `ranks` says: one process,
/// one rank of a data-parallel group, or one process standing in for
/// several ranks. `trace` writes every step's parameters there. On the
/// rank that writes, `on_epoch` gets each epoch's figures as it ends.
pub fn train_ranks(
    layout: &Layout,
    engine: &IoEngine,
    cfg: &TrainConfig,
    ranks: Ranks,
    on_epoch: &mut dyn FnMut(&EpochMetrics),
) -> Result<TrainSummary> {
    let m = &layout.manifest;
    let schedule = training_schedule(m)?;
    let eval_sets = eval::eval_sets(m);
    if cfg.checkpoint_every == Some(0) {
        return Err(Error::InvalidArgument(
            "--checkpoint-every must be at least 1".into(),
        ));
    }
    let _held = hold_checkpoint_dir(cfg, ranks.writer())?;
    tch::manual_seed(cfg.seed as i64);
    let mut model = ModelState::new(cfg);
    let src = sources(layout, engine, (cfg.features, cfg.device))?;
    if ranks.world() > 1 && src.assemble.cpu_rows.as_ref().is_some_and(|c| c.follows) {
        return Err(Error::Layout(
            "this layout's CPU cache follows the sampled batch order (packer --cpu-cache-policy belady, window or auto), which one process trains; for data-parallel training pack it with --cpu-cache-policy static".into(),
        ));
    }
    let historical = historical_cache(cfg, ranks.world())?;
    let start = start::start_run(cfg, &model.vs, &mut model.adam, m, ranks)?;
    let job = Job {
        layout,
        engine,
        src: &src,
        cfg,
        ranks,
        local: ranks.local(),
        hooks: crate::test_hooks::current(),
        historical: historical.as_ref(),
    };
    let mut run = RunState {
        history: start.history,
        best: start.best,
        trained_here: 0,
        metrics_file: metrics::open_metrics_file(cfg, job.writer())?,
    };
    if historical.is_some() && start.resumed_from.is_some() && job.writer() {
        tracing::info!(
            "resumed with --historical: the historical cache is not in the checkpoint and starts empty, so from here the run differs from one never stopped"
        );
    }
    let mut in_epoch = start.in_epoch;
    if cfg.epochs as usize > schedule.len() && job.writer() {
        tracing::info!(
            "{} epochs over {} sampled: {} the sampled batches, {}",
            cfg.epochs,
            schedule.len(),
            match cfg.epochs as usize - 1 {
                last if last == schedule.len() => format!("epoch {last} reuses"),
                last => format!("epochs {}..{last} reuse", schedule.len()),
            },
            if job.cpu_cache_follows() {
                "in the sampled order, which the layout's CPU cache follows (sample more epochs for new orders)"
            } else {
                "in a new order each epoch"
            }
        );
    }
    if job.writer() {
        let n = schedule[0].len();
        let n = cfg.max_batches.map_or(n, |m| m.min(n));
        crate::distributed::say_padding(n, job.world() as usize);
    }
    for t in run.history.len() as u32..cfg.epochs {
        let mut e = epoch::train_epoch(&job, schedule, &mut model, &mut run, t, in_epoch.take())?;
        // Evaluation and the next epoch read the static rows again.
        if let Some(cache) = job.src.assemble.cpu_rows.as_ref() {
            e.add_restored(cache.restore()?);
        }
        eval::evaluate(
            &job,
            (model.net.as_ref(), model.scorer.as_ref()),
            &eval_sets,
            &mut e,
        )?;
        epoch::record(&job, &model, &mut run, e, on_epoch)?;
        epoch::stop_on_signal(&job, t)?;
    }
    finish::finish(&job, &model, run, &eval_sets, start.resumed_from)
}

/// FreshGNN's historical cache as `--historical` asks, refused where it
/// does not apply: a model without levels between layers, and
/// data-parallel training ([`crate::historical::for_run`]).
fn historical_cache(cfg: &TrainConfig, world: u32) -> Result<Option<Historical>> {
    let Some(h) = &cfg.historical else {
        return Ok(None);
    };
    let m = &cfg.model;
    if m.kind == ModelKind::Mlp || m.layers < 2 {
        return Err(Error::InvalidArgument(
            "--historical caches embeddings between GNN layers: it needs --model sage or gat with at least 2 layers".into(),
        ));
    }
    let lag = cfg.pipeline_options().lookahead();
    crate::historical::for_run(h, world, (m.layers - 1, m.hidden as usize, lag)).map(Some)
}

/// The sampled epochs of training batches; a layout without any is refused.
fn training_schedule(m: &offgnn_manifests::Manifest) -> Result<&[Vec<BatchRef>]> {
    m.schedule
        .get(&Split::Train)
        .filter(|s| !s.is_empty())
        .map(Vec::as_slice)
        .ok_or_else(|| Error::Layout("the layout has no training batches".into()))
}

/// One run at a time writes a checkpoint directory: held until this run
/// ends, so a second trainer on it is refused before it writes.
fn hold_checkpoint_dir(
    cfg: &TrainConfig,
    writer: bool,
) -> Result<Option<offgnn_shared::commit::HeldDir>> {
    Ok(cfg
        .checkpoint_dir
        .as_deref()
        .filter(|_| writer)
        .map(|dir| {
            offgnn_shared::commit::hold_dir(
                dir,
                "another trainer is writing checkpoints here; wait for it to end or choose another --checkpoint-dir",
            )
        })
        .transpose()?)
}
