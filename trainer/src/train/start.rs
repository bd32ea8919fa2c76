//! Where a run starts: refusals before any work (an earlier run's
//! checkpoint, metrics or export in the way), the checkpoint it resumes
//! from, and in a data-parallel group, rank 0's start shared with every
//! rank.

use std::path::Path;

use tch::{Device, Tensor, nn};

use super::checkpoint::{
    Best, CheckpointMeta, Hyper, META, best_of, load_tensors, tensor_file, with_prefix,
};
use super::config::TrainConfig;
use super::metrics::{EpochMetrics, EpochProgress};
use super::ranks::Ranks;
use crate::distributed::Group;
use crate::error::{Error, Result};
use crate::export;
use crate::model::{Adam, ModelConfig, ModelKind};

/// Where a run starts: completed epochs, progress inside the next.
pub(super) struct Start {
    pub(super) history: Vec<EpochMetrics>,
    pub(super) in_epoch: Option<EpochProgress>,
    pub(super) resumed_from: Option<(u32, u64)>,
    pub(super) best: Option<Best>,
}

impl Start {
    fn fresh() -> Self {
        Start {
            history: Vec::new(),
            in_epoch: None,
            resumed_from: None,
            best: None,
        }
    }
}

/// Loads the checkpoint in `dir` into the model and optimizer, after
/// checking that it belongs to this model and this layout.
fn resume(
    dir: &Path,
    vs: &nn::VarStore,
    adam: &mut Adam,
    cfg: &TrainConfig,
    m: &offgnn_manifests::Manifest,
    world: u32,
) -> Result<Start> {
    let meta_path = dir.join(META);
    if !meta_path.exists() {
        tracing::info!("no checkpoint in {}: starting from scratch", dir.display());
        return Ok(Start::fresh());
    }
    let bytes = std::fs::read(&meta_path).map_err(|e| Error::io(meta_path.display(), e))?;
    let meta: CheckpointMeta = serde_json::from_slice(&bytes).map_err(|e| {
        Error::Checkpoint(format!(
            "{}: malformed checkpoint: {e}",
            meta_path.display()
        ))
    })?;
    super::checkpoint::check_epochs(&meta_path, meta.epoch, meta.history.len())?;
    let changed = model_changes(&meta.model, &cfg.model);
    if !changed.is_empty() {
        return Err(Error::Checkpoint(format!(
            "{}: the checkpoint is of another model: {}; resume with the flags it was taken with, or start a new run with --overwrite",
            dir.display(),
            changed.join(", ")
        )));
    }
    if meta.manifest_run_sha256 != m.samples.run_sha256
        || meta.dataset_fingerprint != m.dataset.dataset_fingerprint
    {
        return Err(Error::Checkpoint(format!(
            "{}: the checkpoint was trained on another layout (other samples or dataset)",
            dir.display()
        )));
    }
    same_world(dir, meta.world_size, world)?;
    if let Some(saved) = &meta.hyper {
        let now = Hyper::of(cfg);
        crate::historical::warn_if_changed(saved.historical.as_ref(), now.historical.as_ref());
        let mut changed = Vec::new();
        if saved.lr != now.lr {
            changed.push(format!("--lr {:?} (now {:?})", saved.lr, now.lr));
        }
        if saved.seed != now.seed {
            changed.push(format!("--seed {} (now {})", saved.seed, now.seed));
        }
        if saved.max_batches != now.max_batches {
            changed.push(max_batches_changed(saved.max_batches, now.max_batches));
        }
        if !changed.is_empty() {
            return Err(Error::Checkpoint(format!(
                "{}: the checkpoint's run used {}; a resume continues the same run, so pass the same settings, or start a new run with --overwrite",
                dir.display(),
                changed.join(", ")
            )));
        }
    }
    let tensors = tensor_file(dir, &meta)?;
    let named = load_tensors(&tensors, meta.tensors_digest, cfg.device)?;
    export::load_into(
        vs,
        &with_prefix(&named, "model."),
        &tensors.display().to_string(),
    )?;
    let best = best_of(&meta, &named, &tensors)?;
    adam.load_state(&named)
        .map_err(|e| Error::Checkpoint(format!("{}: {e}", tensors.display())))?;
    let position = meta.in_epoch.as_ref().map_or(0, |p| p.batches);
    tracing::info!(
        "resumed from {} at epoch {}, batch {position}",
        dir.display(),
        meta.epoch
    );
    Ok(Start {
        history: meta.history,
        in_epoch: meta.in_epoch,
        resumed_from: Some((meta.epoch, position)),
        best,
    })
}

/// Where training starts, as rank 0 decides it: refusals before any work
/// (a checkpoint or metrics file not to be replaced, an export target), the
/// checkpoint resumed. The other ranks only learn the outcome.
fn start_of(
    cfg: &TrainConfig,
    vs: &nn::VarStore,
    adam: &mut Adam,
    m: &offgnn_manifests::Manifest,
    world: u32,
) -> Result<Start> {
    let start = match (&cfg.checkpoint_dir, cfg.resume) {
        (Some(dir), true) => resume(dir, vs, adam, cfg, m, world)?,
        (None, true) => {
            return Err(Error::InvalidArgument(
                "--resume needs --checkpoint-dir".into(),
            ));
        }
        (Some(dir), false) => {
            if dir.join(META).exists() && !cfg.overwrite {
                return Err(Error::InvalidArgument(format!(
                    "{}: holds a checkpoint of an earlier run; pass --resume to continue it or --overwrite to start afresh",
                    dir.display()
                )));
            }
            Start::fresh()
        }
        (None, false) => Start::fresh(),
    };
    if let Some(path) = &cfg.metrics
        && !cfg.resume
        && !cfg.overwrite
        && std::fs::metadata(path).is_ok_and(|md| md.len() > 0)
    {
        return Err(Error::InvalidArgument(format!(
            "{}: the metrics file exists; pass --overwrite to replace it (or --resume to append to it)",
            path.display()
        )));
    }
    if let Some(x) = &cfg.export {
        // Refused before any training, not after it: the last epoch's
        // export too, or an occupied `last/` would fail the run after the
        // best export had committed.
        export::check_target(&x.location, x.overwrite)?;
        if x.last {
            let last = offgnn_shared::store::Store::open(&x.location)?.join("last");
            export::check_target(&last, x.overwrite)?;
        }
    }
    Ok(start)
}

/// Gives every rank rank 0's start: whether it could start at all, then
/// where (epoch, batch), then its parameters and optimizer state, as
/// DistributedDataParallel broadcasts a model at its start.
fn share_start(
    g: &Group,
    decided: Result<Start>,
    adam: &mut Adam,
    device: Device,
) -> Result<Start> {
    let figures = match &decided {
        Ok(s) => vec![
            s.history.len() as i64,
            s.in_epoch.as_ref().map_or(-1, |p| p.batches as i64),
        ],
        Err(_) => vec![0, -1],
    };
    let (mine, header) = share_model(g, decided, &figures, adam, device)?;
    Ok(mine.unwrap_or_else(|| Start {
        history: vec![EpochMetrics::default(); header[0] as usize],
        in_epoch: (header[1] >= 0).then(|| EpochProgress {
            batches: header[1] as u64,
            ..Default::default()
        }),
        resumed_from: (header[0] > 0 || header[1] > 0)
            .then_some((header[0] as u32, header[1].max(0) as u64)),
        best: None,
    }))
}

/// Rank 0's start on every rank of `g`: whether it could start at all
/// (`decided`; rank 0's error there, a line naming it on the others), its
/// `figures` of where it starts, then its parameters and Adam's state.
/// Returns rank 0 its own start and every rank rank 0's figures (the
/// other ranks' own decisions give way to rank 0's).
pub(crate) fn share_model<T>(
    g: &Group,
    decided: Result<T>,
    figures: &[i64],
    adam: &mut Adam,
    device: Device,
) -> Result<(Option<T>, Vec<i64>)> {
    let mut header = vec![i64::from(decided.is_ok())];
    header.extend_from_slice(figures);
    let h = Tensor::f_from_slice(&header)?.f_to_device(device)?;
    g.broadcast(&h, 0)?;
    let header = Vec::<i64>::try_from(h.f_to_device(Device::Cpu)?)?;
    if header[0] == 0 {
        return match decided {
            Err(e) => Err(e),
            Ok(_) => Err(Error::Distributed(format!(
                "rank {} of {}: rank 0 could not start the run; its message says why",
                g.rank, g.world
            ))),
        };
    }
    tch::no_grad(|| -> Result<()> {
        for (_, p) in adam.params() {
            g.broadcast(p, 0)?;
        }
        for (name, t) in adam.state() {
            if name != "adam.step" {
                g.broadcast(&t, 0)?;
            }
        }
        Ok(())
    })?;
    let step = Tensor::f_from_slice(&[adam.step])?.f_to_device(device)?;
    g.broadcast(&step, 0)?;
    adam.step = step.f_int64_value(&[0])?;
    let mine = decided.ok().filter(|_| g.rank == 0);
    Ok((mine, header[1..].to_vec()))
}

/// Where this process starts: as rank 0 decides it ([`start_of`]), and in
/// a group as rank 0 shares it ([`share_start`]).
pub(super) fn start_run(
    cfg: &TrainConfig,
    vs: &nn::VarStore,
    adam: &mut Adam,
    m: &offgnn_manifests::Manifest,
    ranks: Ranks,
) -> Result<Start> {
    let decided = if ranks.writer() {
        start_of(cfg, vs, adam, m, ranks.world())
    } else {
        Ok(Start::fresh())
    };
    match ranks.group() {
        Some(g) => {
            // Before the first collective that the model's shape sizes.
            super::agreement::check(g, &super::agreement::settings(cfg, m), cfg.device)?;
            share_start(g, decided, adam, cfg.device)
        }
        None => decided,
    }
}

/// A link model's scorer, as the refusal of another model's checkpoint
/// names it.
/// How model `now` differs from a checkpoint's `saved`, flag by flag
/// (`--heads` only where both are GAT: the others have no heads).
fn model_changes(saved: &ModelConfig, now: &ModelConfig) -> Vec<String> {
    let kind = |m: &ModelConfig| format!("{:?}", m.kind).to_lowercase();
    let scorer = |m: &ModelConfig| m.scorer.map_or("none", |s| s.name()).to_string();
    let gat = saved.kind == ModelKind::Gat && now.kind == ModelKind::Gat;
    let fields = [
        ("--model", kind(saved), kind(now)),
        ("--hidden", saved.hidden.to_string(), now.hidden.to_string()),
        (
            "--dropout",
            saved.dropout.to_string(),
            now.dropout.to_string(),
        ),
        ("--scorer", scorer(saved), scorer(now)),
        (
            "layers (the layout's fan-outs)",
            saved.layers.to_string(),
            now.layers.to_string(),
        ),
        (
            "feature width (the layout)",
            saved.in_dim.to_string(),
            now.in_dim.to_string(),
        ),
        (
            "outputs (the layout's classes)",
            saved.classes.to_string(),
            now.classes.to_string(),
        ),
        (
            "--heads",
            saved.heads.to_string(),
            if gat {
                now.heads.to_string()
            } else {
                saved.heads.to_string()
            },
        ),
    ];
    fields
        .into_iter()
        .filter(|(_, a, b)| a != b)
        .map(|(what, a, b)| format!("{what} {a} (now {b})"))
        .collect()
}

/// Refuses to resume in `dir` a checkpoint taken by `saved` ranks (one
/// where it does not say) with `world`.
pub(crate) fn same_world(dir: &Path, saved: Option<u32>, world: u32) -> Result<()> {
    let saved = saved.unwrap_or(1);
    if saved == world {
        return Ok(());
    }
    Err(Error::Checkpoint(format!(
        "{}: the checkpoint was taken by a run of {saved} rank(s), and this run has {world}: ranks are dealt their shares of each epoch by the world size, so resume with {saved} (torchrun --nproc-per-node, srun --ntasks, or --emulate-ranks), or start a new run with --overwrite",
        dir.display()
    )))
}

/// How `--max-batches` changed between a checkpoint's run and this one.
pub(crate) fn max_batches_changed(saved: Option<usize>, now: Option<usize>) -> String {
    let words = |cap: Option<usize>| {
        cap.map_or("every batch".to_string(), |n| format!("--max-batches {n}"))
    };
    format!("{} (now {})", words(saved), words(now))
}
