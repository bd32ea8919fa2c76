//! Checkpoints: what one records (the model, the optimizer's state, the
//! best validation epoch's parameters, the run's history and settings),
//! how one is written so that a crash leaves the previous one or the new
//! one whole, how its tensors are read back, and `trainer export` of the
//! model one holds.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::{Device, Tensor, nn};

use super::config::TrainConfig;
use super::metrics::{EpochMetrics, EpochProgress};
use crate::error::{Error, Result};
use crate::export;
use crate::model::{self, Adam, ModelConfig};

/// What a checkpoint records besides tensors. `checkpoint.json` is the
/// commit point: it names the tensor file written before it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub(super) struct CheckpointMeta {
    pub(super) model: ModelConfig,
    pub(super) manifest_run_sha256: String,
    pub(super) dataset_fingerprint: String,
    /// The feature file's fingerprint, for exports. Empty in checkpoints
    /// of older trainers.
    #[serde(default)]
    pub(super) feature_fingerprint: String,
    /// Epochs completed.
    pub(super) epoch: u32,
    /// Progress inside epoch `epoch`, when taken mid-epoch.
    pub(super) in_epoch: Option<EpochProgress>,
    pub(super) history: Vec<EpochMetrics>,
    /// The tensor file (model and optimizer) of this checkpoint.
    pub(super) tensors: String,
    /// The tensor file's size and CRC32C as written, checked before it is
    /// read: libtorch reads a file with flipped bytes as other numbers.
    /// Absent in checkpoints of older trainers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) tensors_digest: Option<FileDigest>,
    /// The epoch whose parameters the tensor file also holds as `best.*`:
    /// the best validation so far. Absent in checkpoints of older trainers.
    #[serde(default)]
    pub(super) best_epoch: Option<u32>,
    #[serde(default)]
    pub(super) feature_dtype: String,
    /// What else fixes the run's results: a resume must keep them.
    #[serde(default)]
    pub(super) hyper: Option<Hyper>,
    /// The data-parallel ranks that trained it (absent: one process).
    #[serde(default)]
    pub(super) world_size: Option<u32>,
    /// The graph the layout's samples were drawn from, for exports. Absent
    /// in checkpoints of older trainers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) graph: Option<offgnn_manifests::GraphOptions>,
}

/// The settings besides the model's shape that a resumed run must share
/// with the run it continues, for resume to be exact.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub(super) struct Hyper {
    pub(super) lr: f64,
    pub(super) seed: u64,
    pub(super) max_batches: Option<usize>,
    /// `--historical`'s settings (absent without it, and in checkpoints of
    /// older trainers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) historical: Option<crate::historical::HistoricalConfig>,
}

impl Hyper {
    pub(super) fn of(cfg: &TrainConfig) -> Self {
        Hyper {
            lr: cfg.lr,
            seed: cfg.seed,
            max_batches: cfg.max_batches,
            historical: cfg.historical.clone(),
        }
    }
}

/// A file's size and CRC32C (Castagnoli), as the manifest records objects.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct FileDigest {
    pub(crate) bytes: u64,
    pub(crate) crc32c: u32,
}

impl FileDigest {
    fn of(bytes: &[u8]) -> Self {
        FileDigest {
            bytes: bytes.len() as u64,
            crc32c: crc32c::crc32c(bytes),
        }
    }
}

/// What a checkpoint saves of the model: its parameters, the optimizer's
/// state, and the best validation epoch's parameters so far.
#[derive(Clone, Copy)]
pub(super) struct State<'a> {
    pub(super) vs: &'a nn::VarStore,
    pub(super) adam: &'a Adam,
    pub(super) best: Option<&'a Best>,
}

/// The parameters of the best validation epoch so far.
pub(super) struct Best {
    pub(super) epoch: u32,
    /// Its validation score ([`EpochMetrics::valid_score`]).
    pub(super) valid_score: f64,
    pub(super) params: Vec<(String, Tensor)>,
}

pub(crate) const META: &str = "checkpoint.json";

/// The tensor file a checkpoint's metadata names, which must be in `dir`.
pub(super) fn tensor_file(dir: &Path, meta: &CheckpointMeta) -> Result<PathBuf> {
    let tensors = dir.join(&meta.tensors);
    if meta.tensors.contains('/') || !tensors.exists() {
        return Err(Error::Checkpoint(format!(
            "{}: names tensor file {:?}, which is not in {}",
            dir.join(META).display(),
            meta.tensors,
            dir.display()
        )));
    }
    Ok(tensors)
}

/// A checkpoint's tensor file, by name, after checking it against the
/// digest its metadata records (checkpoints of older trainers record none:
/// read unchecked, with a warning).
pub(crate) fn load_tensors(
    path: &Path,
    digest: Option<FileDigest>,
    device: Device,
) -> Result<HashMap<String, Tensor>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path.display(), e))?;
    if let Some(want) = digest {
        let found = FileDigest::of(&bytes);
        if found.bytes != want.bytes {
            return Err(Error::Corrupt {
                path: path.display().to_string(),
                fault: format!(
                    "{} bytes where the checkpoint wrote {}: cut short or altered since; resume from another checkpoint or train again",
                    found.bytes, want.bytes
                ),
            });
        }
        if found.crc32c != want.crc32c {
            return Err(Error::Corrupt {
                path: path.display().to_string(),
                fault: format!(
                    "CRC32C {:08x} where the checkpoint wrote {:08x}: its bytes changed since it was written; resume from another checkpoint or train again",
                    found.crc32c, want.crc32c
                ),
            });
        }
    }
    let named = Tensor::load_multi_from_stream_with_device(std::io::Cursor::new(bytes), device)
        .map_err(|e| Error::torch(format!("reading checkpoint {}", path.display()), e))?
        .into_iter()
        .collect();
    // Said once the tensors are read: an unreadable file gets its one line.
    if digest.is_none() {
        tracing::warn!(
            "{}: an older trainer wrote this checkpoint without a digest of its tensors; they were read unchecked",
            path.display()
        );
    }
    Ok(named)
}

/// The tensors named `prefix` + name, by name.
pub(super) fn with_prefix(
    named: &HashMap<String, Tensor>,
    prefix: &str,
) -> HashMap<String, Tensor> {
    named
        .iter()
        .filter_map(|(k, v)| {
            k.strip_prefix(prefix)
                .map(|name| (name.to_string(), v.shallow_clone()))
        })
        .collect()
}

/// The best epoch's parameters that a checkpoint holds, if it names one.
pub(super) fn best_of(
    meta: &CheckpointMeta,
    named: &HashMap<String, Tensor>,
    tensors: &Path,
) -> Result<Option<Best>> {
    let Some(epoch) = meta.best_epoch else {
        return Ok(None);
    };
    let valid_score = meta
        .history
        .get(epoch as usize)
        .map(|e| e.valid_score())
        .ok_or_else(|| {
            Error::Checkpoint(format!(
                "{}: names best epoch {epoch}, which its history lacks",
                tensors.display()
            ))
        })?;
    let mut params: Vec<(String, Tensor)> = with_prefix(named, "best.model.")
        .into_iter()
        .map(|(k, v)| Ok((k, v.f_to_device(Device::Cpu)?)))
        .collect::<Result<_>>()?;
    params.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Some(Best {
        epoch,
        valid_score,
        params,
    }))
}

/// `trainer export`: the model of a checkpoint (its best validation epoch,
/// or with `last` the parameters it was taken with) to `out`. With a
/// manifest, the checkpoint must have been trained on that layout.
pub fn export_checkpoint(
    dir: &Path,
    out: &str,
    last: bool,
    overwrite: bool,
    manifest: Option<&offgnn_manifests::Manifest>,
) -> Result<export::Written> {
    let meta_path = dir.join(META);
    let bytes = std::fs::read(&meta_path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Error::Checkpoint(format!(
                "{}: no checkpoint (checkpoint.json) there",
                dir.display()
            ))
        } else {
            Error::io(meta_path.display(), e)
        }
    })?;
    let meta: CheckpointMeta = serde_json::from_slice(&bytes).map_err(|e| {
        Error::Checkpoint(format!(
            "{}: malformed checkpoint: {e}",
            meta_path.display()
        ))
    })?;
    if let Some(m) = manifest
        && (meta.manifest_run_sha256 != m.samples.run_sha256
            || meta.dataset_fingerprint != m.dataset.dataset_fingerprint)
    {
        return Err(Error::Checkpoint(format!(
            "{}: the checkpoint was trained on another layout than that manifest (other samples or dataset)",
            dir.display()
        )));
    }
    export::check_target(out, overwrite)?;
    let tensors = tensor_file(dir, &meta)?;
    let named = load_tensors(&tensors, meta.tensors_digest, Device::Cpu)?;
    if meta.history.is_empty() {
        return Err(Error::Checkpoint(format!(
            "{}: taken inside epoch 0, before any epoch ended: nothing to export yet; resume the run (--resume) to finish an epoch",
            dir.display()
        )));
    }
    let (which, epoch, prefix) = if last {
        if meta.in_epoch.is_some() {
            tracing::warn!(
                "the checkpoint was taken inside epoch {}: its parameters are those of that moment",
                meta.epoch
            );
        }
        ("last", meta.epoch.saturating_sub(1), "model.")
    } else {
        let epoch = meta.best_epoch.ok_or_else(|| {
            Error::Checkpoint(format!(
                "{}: holds no best-epoch parameters (an older trainer wrote it); pass --last to export the parameters it holds",
                dir.display()
            ))
        })?;
        ("best", epoch, "best.model.")
    };
    let figures = meta.history.get(epoch as usize).cloned().ok_or_else(|| {
        Error::Checkpoint(format!(
            "{}: no completed epoch to export",
            meta_path.display()
        ))
    })?;
    // Through a fresh model: every parameter present, with its shape.
    let vs = nn::VarStore::new(Device::Cpu);
    let _model = model::build_with_scorer(&vs.root(), &meta.model);
    export::load_into(
        &vs,
        &with_prefix(&named, prefix),
        &tensors.display().to_string(),
    )?;
    let provenance = export::Provenance {
        feature_dtype: meta.feature_dtype.clone(),
        dataset_fingerprint: meta.dataset_fingerprint.clone(),
        feature_fingerprint: meta.feature_fingerprint.clone(),
        samples_run_sha256: meta.manifest_run_sha256.clone(),
        graph: meta.graph.or(manifest.and_then(|m| m.samples.graph)),
        which: which.into(),
        epoch,
        valid_acc: figures.valid_acc,
        test_acc: figures.test_acc,
        mrr: figures
            .valid_rank
            .zip(figures.test_rank)
            .map(|(v, t)| (v.mrr, t.mrr)),
    };
    export::write(
        out,
        &meta.model,
        &export::snapshot(&vs)?,
        &provenance,
        overwrite,
    )
}

/// Writes a checkpoint: a new tensor file, then `checkpoint.json` naming it
/// by rename (the commit), then the older tensor files go. A crash at any
/// point leaves the previous checkpoint or the new one whole.
pub(super) fn save_checkpoint(
    dir: &Path,
    state: &State,
    cfg: &TrainConfig,
    m: &offgnn_manifests::Manifest,
    history: &[EpochMetrics],
    in_epoch: Option<&EpochProgress>,
    world: u32,
) -> Result<()> {
    let State { vs, adam, best } = *state;
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir.display(), e))?;
    let epoch = history.len() as u32;
    let position = in_epoch.map_or(0, |p| p.batches);
    let tensors = format!("checkpoint-e{epoch:05}-b{position:08}.ot");
    let mut named: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .map(|(k, v)| (format!("model.{k}"), v))
        .collect();
    named.extend(adam.state());
    if let Some(b) = best {
        named.extend(
            b.params
                .iter()
                .map(|(k, v)| (format!("best.model.{k}"), v.shallow_clone())),
        );
    }
    let digest = write_tensor_file(dir, &tensors, &named)?;
    let meta = CheckpointMeta {
        model: cfg.model.clone(),
        manifest_run_sha256: m.samples.run_sha256.clone(),
        dataset_fingerprint: m.dataset.dataset_fingerprint.clone(),
        feature_fingerprint: m.dataset.feature_fingerprint.clone(),
        epoch,
        in_epoch: in_epoch.cloned(),
        history: history.to_vec(),
        tensors: tensors.clone(),
        tensors_digest: Some(digest),
        best_epoch: best.map(|b| b.epoch),
        feature_dtype: m.dataset.feature_dtype.to_string(),
        hyper: Some(Hyper::of(cfg)),
        world_size: (world > 1).then_some(world),
        graph: m.samples.graph,
    };
    let body = serde_json::to_vec_pretty(&meta).expect("checkpoint metadata serializes");
    commit_meta(dir, &body, &tensors)
}

/// Refuses the checkpoint at `path` whose `epoch` (epochs done) its
/// history of `history` epochs contradicts: edited or damaged.
pub(crate) fn check_epochs(path: &Path, epoch: u32, history: usize) -> Result<()> {
    if epoch as usize == history {
        return Ok(());
    }
    Err(Error::Checkpoint(format!(
        "{}: says {epoch} epochs done but holds the figures of {history}: edited or damaged",
        path.display()
    )))
}

/// Writes `named` as the checkpoint's tensor file `tensors` in `dir`: a
/// partial file first, synced, then renamed; refused before writing where
/// the disk cannot hold it. Returns its digest.
pub(crate) fn write_tensor_file(
    dir: &Path,
    tensors: &str,
    named: &[(String, Tensor)],
) -> Result<FileDigest> {
    // libtorch aborts the process when its writer meets a full disk: the
    // space is checked first (the tensors' bytes plus a little per tensor
    // for the archive's records).
    let need: u64 = named
        .iter()
        .map(|(_, t)| t.numel() as u64 * t.kind().elt_size_in_bytes() as u64 + 1024)
        .sum::<u64>()
        + (64 << 10);
    let free = offgnn_shared::io_engine::free_bytes(dir)?;
    if need > free {
        return Err(Error::Checkpoint(format!(
            "{}: {} free, a checkpoint needs about {}; any previous checkpoint is kept; free some space or choose another --checkpoint-dir",
            dir.display(),
            offgnn_shared::report::human_bytes(free),
            offgnn_shared::report::human_bytes(need)
        )));
    }
    let tmp = dir.join(format!("{tensors}.partial"));
    let written = Tensor::save_multi(named, &tmp)
        .map_err(|e| Error::Checkpoint(format!("writing {}: {e}", tmp.display())))
        .and_then(|()| {
            std::fs::File::open(&tmp)
                .and_then(|f| f.sync_all())
                .and_then(|()| std::fs::read(&tmp))
                .map(|bytes| FileDigest::of(&bytes))
                .map_err(|e| Error::io(tmp.display(), e))
        })
        .and_then(|digest| {
            std::fs::rename(&tmp, dir.join(tensors))
                .map(|()| digest)
                .map_err(|e| Error::io(dir.display(), e))
        });
    match written {
        Ok(digest) => Ok(digest),
        Err(e) => {
            // A full disk, most likely: the partial file goes, the previous
            // checkpoint stays.
            let _ = std::fs::remove_file(&tmp);
            let free = offgnn_shared::io_engine::free_bytes(dir).unwrap_or(0);
            Err(Error::Checkpoint(format!(
                "{e} ({} free in {}); the previous checkpoint is kept",
                offgnn_shared::report::human_bytes(free),
                dir.display()
            )))
        }
    }
}

/// Commits a checkpoint: `body` as `checkpoint.json` (a partial file,
/// synced, renamed), then the tensor files other than `tensors`, which it
/// no longer names, go.
pub(crate) fn commit_meta(dir: &Path, body: &[u8], tensors: &str) -> Result<()> {
    let meta_tmp = dir.join(format!("{META}.partial"));
    let committed = std::fs::File::create(&meta_tmp)
        .and_then(|mut f| {
            f.write_all(body)?;
            f.sync_all()
        })
        .map_err(|e| Error::io(meta_tmp.display(), e))
        .and_then(|()| {
            std::fs::rename(&meta_tmp, dir.join(META)).map_err(|e| Error::io(dir.display(), e))
        });
    if let Err(e) = committed {
        // The new tensor file stays unnamed (the next checkpoint removes
        // it); the previous checkpoint.json still names its own.
        let _ = std::fs::remove_file(&meta_tmp);
        return Err(e);
    }
    // Older tensor files are no longer named by the commit point.
    let entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir.display(), e))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("checkpoint-") && name != tensors {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    Ok(())
}
