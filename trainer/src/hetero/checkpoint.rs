//! A typed run's checkpoint, taken after every epoch in `--checkpoint-dir`:
//! the model's parameters, the optimizer's state and the best validation
//! epoch's parameters in one tensor file, and `checkpoint.json` (the
//! model's shape, the run's settings and history, the file's digest),
//! written as homogeneous checkpoints are (the tensor file, then the JSON
//! as the commit). With `--checkpoint-every N` one is also taken every N
//! steps inside an epoch, with the steps done and their sums. Each batch
//! seeds libtorch's generator from the run's seed, its epoch and its place
//! in it, so a resumed run continues exactly as one never stopped.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::{Device, Tensor, nn};

use super::RgnnConfig;
use super::train::{Started, TypedEpoch, TypedTrainConfig};
use crate::error::{Error, Result};
use crate::model::Adam;
use crate::train::{FileDigest, META, commit_meta, load_tensors, write_tensor_file};
use offgnn_shared::report;

const FORMAT: &str = "offgnn-typed-checkpoint";

/// `checkpoint.json` of a typed run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TypedCheckpoint {
    pub format: String,
    pub model: RgnnConfig,
    pub lr: f64,
    pub seed: u64,
    pub samples_run_sha256: String,
    pub dataset_fingerprint: String,
    /// Where the run read its layout's manifest (`trainer export` reads it
    /// from there unless `--manifest` says otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<String>,
    /// `--historical`'s settings (absent without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub historical: Option<crate::historical::HistoricalConfig>,
    /// The ranks that took it (absent in checkpoints from before it was
    /// recorded: one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world_size: Option<u32>,
    /// `--max-batches` (absent: every batch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_batches: Option<usize>,
    /// Epochs completed, and their figures.
    pub epoch: u32,
    pub history: Vec<TypedEpoch>,
    pub best_epoch: Option<u32>,
    /// Taken inside the epoch after `epoch`: where it stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_epoch: Option<InEpoch>,
    pub tensors: String,
    pub(crate) tensors_digest: FileDigest,
}

/// Where a checkpoint taken inside an epoch stands: the epoch's steps done
/// and their sums over the ranks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct InEpoch {
    pub steps: u64,
    pub loss_sum: f64,
    pub right: f64,
    pub seen: f64,
    pub disk_bytes: f64,
    #[serde(default)]
    pub disk_rows_bytes: f64,
}

impl InEpoch {
    /// `steps` done and the sums of their loss, seeds right, seeds seen,
    /// disk bytes and row bytes, in that order.
    pub fn of(steps: u64, sums: &[f64]) -> InEpoch {
        let at = |i: usize| sums.get(i).copied().unwrap_or(0.0);
        InEpoch {
            steps,
            loss_sum: at(0),
            right: at(1),
            seen: at(2),
            disk_bytes: at(3),
            disk_rows_bytes: at(4),
        }
    }
}

/// What a run saves and resumes: its model, optimizer and best parameters.
pub struct State<'a> {
    pub vs: &'a nn::VarStore,
    pub adam: &'a Adam,
    pub best: Option<&'a [(String, Tensor)]>,
}

/// The run a checkpoint belongs to, which a resume must match.
pub struct RunKey<'a> {
    pub model: &'a RgnnConfig,
    pub lr: f64,
    pub seed: u64,
    pub manifest: &'a offgnn_manifests::TypedManifest,
    /// Where the run read that manifest.
    pub layout: Option<&'a str>,
    pub historical: Option<&'a crate::historical::HistoricalConfig>,
    /// The ranks taking part.
    pub world: u32,
    pub max_batches: Option<usize>,
}

/// Saves the state after `history`'s epochs (and `in_epoch`'s steps of
/// the next).
pub fn save(
    dir: &Path,
    state: &State<'_>,
    key: &RunKey<'_>,
    (history, best_epoch): (&[TypedEpoch], Option<u32>),
    in_epoch: Option<InEpoch>,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.display(), e))?;
    let epoch = history.len() as u32;
    let tensors = match in_epoch {
        Some(p) => format!("checkpoint-e{epoch:05}-s{:06}.ot", p.steps),
        None => format!("checkpoint-e{epoch:05}.ot"),
    };
    let mut named: Vec<(String, Tensor)> = state
        .vs
        .variables()
        .into_iter()
        .map(|(k, v)| (format!("model.{k}"), v))
        .collect();
    named.extend(state.adam.state());
    if let Some(best) = state.best {
        named.extend(
            best.iter()
                .map(|(k, v)| (format!("best.model.{k}"), v.shallow_clone())),
        );
    }
    let digest = write_tensor_file(dir, &tensors, &named)?;
    let meta = TypedCheckpoint {
        format: FORMAT.into(),
        model: key.model.clone(),
        lr: key.lr,
        seed: key.seed,
        samples_run_sha256: key.manifest.samples.run_sha256.clone(),
        dataset_fingerprint: key.manifest.dataset.dataset_fingerprint.clone(),
        layout: key.layout.map(str::to_string),
        historical: key.historical.cloned(),
        world_size: Some(key.world),
        max_batches: key.max_batches,
        epoch,
        history: history.to_vec(),
        best_epoch,
        in_epoch,
        tensors: tensors.clone(),
        tensors_digest: digest,
    };
    let body = serde_json::to_vec_pretty(&meta).expect("checkpoints serialize");
    commit_meta(dir, &body, &tensors)
}

/// The checkpoint in `dir`, if any.
pub fn read(dir: &Path) -> Result<Option<TypedCheckpoint>> {
    let path = dir.join(META);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(path.display(), e)),
    };
    let meta: TypedCheckpoint = serde_json::from_slice(&bytes).map_err(|e| {
        Error::Checkpoint(format!(
            "{}: not a typed run's checkpoint: {e}",
            path.display()
        ))
    })?;
    crate::train::check_epochs(&path, meta.epoch, meta.history.len())?;
    if meta.format != FORMAT {
        return Err(Error::Checkpoint(format!(
            "{}: a checkpoint of format {:?}, not a typed run's",
            path.display(),
            meta.format
        )));
    }
    Ok(Some(meta))
}

/// Loads `meta`'s tensors into `state` (its model and optimizer) after
/// checking that it is this run's; returns the best parameters it holds.
pub fn resume(
    dir: &Path,
    meta: &TypedCheckpoint,
    (vs, adam): (&nn::VarStore, &mut Adam),
    key: &RunKey<'_>,
    device: Device,
) -> Result<Option<Vec<(String, Tensor)>>> {
    let differs = |what: &str| {
        Error::Checkpoint(format!(
            "{}: taken with another {what}; resume with the flags and layout it was taken with, or start afresh with --overwrite",
            dir.join(META).display()
        ))
    };
    if &meta.model != key.model {
        return Err(differs(
            "model (--model, --hidden, --heads, --dropout, --root-weight, --init, --scorer, or the layout's types)",
        ));
    }
    if meta.lr != key.lr || meta.seed != key.seed {
        return Err(differs("--lr or --seed"));
    }
    crate::train::start::same_world(dir, meta.world_size, key.world)?;
    if meta.max_batches != key.max_batches {
        return Err(Error::Checkpoint(format!(
            "{}: the checkpoint's run used {}; a resume continues the same run, so pass the same settings, or start a new run with --overwrite",
            dir.display(),
            crate::train::start::max_batches_changed(meta.max_batches, key.max_batches)
        )));
    }
    crate::historical::warn_if_changed(meta.historical.as_ref(), key.historical);
    if meta.samples_run_sha256 != key.manifest.samples.run_sha256
        || meta.dataset_fingerprint != key.manifest.dataset.dataset_fingerprint
    {
        return Err(differs("layout (its samples or dataset differ)"));
    }
    let named = tensors(dir, meta, device)?;
    let prefixed = |prefix: &str| -> HashMap<String, Tensor> {
        named
            .iter()
            .filter_map(|(k, v)| {
                k.strip_prefix(prefix)
                    .map(|k| (k.to_string(), v.shallow_clone()))
            })
            .collect()
    };
    crate::export::load_into(vs, &prefixed("model."), "the checkpoint's model")?;
    adam.load_state(&named)
        .map_err(|e| Error::Checkpoint(format!("{}: {e}", dir.join(&meta.tensors).display())))?;
    let best = prefixed("best.model.");
    if best.is_empty() {
        return Ok(None);
    }
    let mut best: Vec<(String, Tensor)> = best.into_iter().collect();
    best.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Some(best))
}

/// The tensors of `meta`'s file in `dir` (which it must name), checked
/// against the digest it records.
fn tensors(dir: &Path, meta: &TypedCheckpoint, device: Device) -> Result<HashMap<String, Tensor>> {
    if meta.tensors.contains('/') {
        return Err(Error::Checkpoint(format!(
            "{}: names tensor file {:?} outside {}",
            dir.join(META).display(),
            meta.tensors,
            dir.display()
        )));
    }
    load_tensors(&dir.join(&meta.tensors), Some(meta.tensors_digest), device)
}

/// Where the run starts: afresh, or after the epochs of the checkpoint it
/// resumes (with the best parameters it holds). A checkpoint is not
/// replaced without `overwrite`.
pub(super) fn start(
    cfg: &TypedTrainConfig,
    (vs, adam): (&nn::VarStore, &mut Adam),
    key: &RunKey<'_>,
) -> Result<Started> {
    let Some(dir) = &cfg.checkpoint_dir else {
        if cfg.resume {
            return Err(Error::InvalidArgument(
                "--resume needs --checkpoint-dir".into(),
            ));
        }
        return Ok((Vec::new(), None, None));
    };
    match (read(dir)?, cfg.resume) {
        (Some(meta), true) => {
            let best = resume(dir, &meta, (vs, adam), key, cfg.device)?;
            // Epochs count from 0, as the epoch lines number them.
            tracing::info!(
                "resuming {} from {}",
                match meta.in_epoch {
                    Some(p) => format!(
                        "inside epoch {}, after its first {} steps",
                        meta.epoch, p.steps
                    ),
                    None => format!(
                        "at epoch {}, {} done",
                        meta.epoch,
                        report::count(u64::from(meta.epoch), "epoch", "epochs")
                    ),
                },
                dir.display()
            );
            Ok((meta.history, best, meta.in_epoch))
        }
        (Some(_), false) if !cfg.overwrite => Err(Error::InvalidArgument(format!(
            "{} holds a checkpoint: pass --resume to continue it or --overwrite to start afresh",
            dir.display()
        ))),
        (None, true) => Err(Error::InvalidArgument(format!(
            "--resume: {} holds no checkpoint",
            dir.display()
        ))),
        _ => Ok((Vec::new(), None, None)),
    }
}

/// Whether `dir`'s `checkpoint.json` is a typed run's, by its `format`; a
/// file damaged past parsing that still names the format goes to the typed
/// reader too, which says what is wrong with it (the homogeneous one would
/// say it knows no model 'rsage').
pub fn is_typed(dir: &Path) -> bool {
    let Ok(bytes) = std::fs::read(dir.join(META)) else {
        return false;
    };
    match serde_json::from_slice::<serde_json::Value>(&bytes) {
        Ok(v) => v.get("format").and_then(|f| f.as_str()) == Some(FORMAT),
        Err(_) => String::from_utf8_lossy(&bytes).contains(&format!("\"{FORMAT}\"")),
    }
}

/// `trainer export` of a typed checkpoint: its best validation epoch's
/// parameters (or with `last` those it was taken with) to `out`. The
/// layout it was trained on gives the types and relations the export
/// names, and must be that layout.
pub fn export(
    dir: &Path,
    out: &str,
    (last, overwrite): (bool, bool),
    manifest: &offgnn_manifests::TypedManifest,
) -> Result<(String, super::export::TypedModelCard)> {
    let meta = read(dir)?.ok_or_else(|| {
        Error::Checkpoint(format!(
            "{}: no checkpoint (checkpoint.json) there",
            dir.display()
        ))
    })?;
    if meta.samples_run_sha256 != manifest.samples.run_sha256
        || meta.dataset_fingerprint != manifest.dataset.dataset_fingerprint
    {
        return Err(Error::Checkpoint(format!(
            "{}: the checkpoint was trained on another layout than that manifest (other samples or dataset)",
            dir.display()
        )));
    }
    crate::export::check_target(out, overwrite)?;
    if meta.history.is_empty() {
        return Err(Error::Checkpoint(format!(
            "{}: taken inside epoch 0, before any epoch ended: nothing to export yet; resume the run (--resume) to finish an epoch",
            dir.display()
        )));
    }
    let (which, prefix, epoch) = if last {
        if meta.in_epoch.is_some() {
            tracing::warn!(
                "the checkpoint was taken inside epoch {}: its parameters are those of that moment",
                meta.epoch
            );
        }
        ("last", "model.", meta.history.last().map(|e| e.epoch))
    } else {
        let best = meta.best_epoch.ok_or_else(|| {
            Error::Checkpoint(format!(
                "{}: no epoch with a validation figure yet; pass --last to export the parameters it holds",
                dir.display()
            ))
        })?;
        ("best", "best.model.", Some(best))
    };
    let figures = epoch
        .and_then(|e| meta.history.iter().find(|h| h.epoch == e))
        .ok_or_else(|| {
            Error::Checkpoint(format!(
                "{}: no completed epoch to export",
                dir.join(META).display()
            ))
        })?;
    let named = tensors(dir, &meta, Device::Cpu)?;
    let params: HashMap<String, Tensor> = named
        .iter()
        .filter_map(|(k, v)| {
            k.strip_prefix(prefix)
                .map(|k| (k.to_string(), v.shallow_clone()))
        })
        .collect();
    // Through a fresh model: every parameter present, with its shape.
    let schema = super::Schema::of(manifest)?;
    let vs = nn::VarStore::new(Device::Cpu);
    super::Rgnn::new(&vs.root(), &schema, &meta.model)?;
    let tensors = dir.join(&meta.tensors).display().to_string();
    crate::export::load_into(&vs, &params, &tensors)?;
    let from = super::export::TypedProvenance {
        manifest,
        which,
        epoch: figures.epoch,
        valid_acc: figures.valid_accuracy.unwrap_or(0.0),
        test_acc: figures.test_accuracy.unwrap_or(0.0),
        mrr: figures
            .valid_rank
            .zip(figures.test_rank)
            .map(|(v, t)| (v.mrr, t.mrr)),
    };
    super::export::write(
        out,
        (&schema, &meta.model),
        &crate::export::snapshot(&vs)?,
        &from,
        overwrite,
    )
}
