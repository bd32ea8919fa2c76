//! A run's figures: each epoch's (also the JSON lines of `--metrics`), the
//! running sums an epoch keeps while it trains (on the device, and in a
//! mid-epoch checkpoint), and the summary of the whole run.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, TchError, Tensor};

use super::config::TrainConfig;
use crate::error::{Error, Result};
use crate::export;
use crate::link::RankMetrics;
use crate::pipeline::{DeviceTimes, FeatureMode, StageTimes};

/// One epoch's figures; also the JSON line written to --metrics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EpochMetrics {
    pub epoch: u32,
    pub sampled_epoch: u32,
    pub batches: u64,
    pub wall_seconds: f64,
    pub train_seconds: f64,
    pub eval_seconds: f64,
    pub stage_busy: StageBusy,
    /// Every byte the epoch read from disk: its batches' reads and, where
    /// the CPU cache follows the batch order, the rows it restored at the
    /// epoch's end (`cpu_cache_restored_bytes`).
    pub disk_bytes: u64,
    #[serde(default)]
    pub cpu_cache_restored_bytes: u64,
    pub disk_rows_bytes: u64,
    pub read_amplification: f64,
    pub hit_gpu: f64,
    pub hit_cpu: f64,
    pub hit_disk: f64,
    pub loss: f64,
    pub train_acc: f64,
    pub valid_acc: f64,
    pub test_acc: f64,
    /// Link prediction: the ranking figures of the validation and test
    /// sets (their `_acc` is then the share of pairs classified right).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_rank: Option<RankMetrics>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_rank: Option<RankMetrics>,
    /// Data-parallel runs: seconds this rank spent in the gradient
    /// all-reduce, and the bytes of gradients it reduced (each step's).
    #[serde(default)]
    pub allreduce_seconds: f64,
    #[serde(default)]
    pub allreduce_bytes: u64,
}

impl EpochMetrics {
    /// `disk_bytes` over `disk_rows_bytes`: every byte read, the CPU
    /// cache's restore included, over the bytes of the rows the batches
    /// needed from disk.
    pub(super) fn set_read_amplification(&mut self) {
        self.read_amplification = if self.disk_rows_bytes == 0 {
            1.0
        } else {
            self.disk_bytes as f64 / self.disk_rows_bytes as f64
        };
    }

    /// Counts the CPU cache's restore at the epoch's end among the
    /// epoch's reads.
    pub(super) fn add_restored(&mut self, bytes: u64) {
        self.cpu_cache_restored_bytes = bytes;
        self.disk_bytes += bytes;
        self.set_read_amplification();
    }

    /// What picks the best epoch: validation MRR in a link-prediction run,
    /// else validation accuracy.
    pub fn valid_score(&self) -> f64 {
        self.valid_rank.map_or(self.valid_acc, |r| r.mrr)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StageBusy {
    pub load: f64,
    pub assemble: f64,
    pub graph: f64,
    pub model: f64,
    /// On CUDA: each stage's time on the device, from CUDA events (the
    /// host's figures above then count queueing and waiting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceTimes>,
}

impl StageBusy {
    /// These figures with a run of batches' added.
    pub(super) fn plus(&self, t: &StageTimes) -> StageBusy {
        StageBusy {
            load: self.load + t.load,
            assemble: self.assemble + t.assemble,
            graph: self.graph + t.graph,
            model: self.model + t.model,
            device: match (self.device, t.device) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            },
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct TrainSummary {
    pub epochs: Vec<EpochMetrics>,
    pub best_epoch: u32,
    pub best_valid_acc: f64,
    pub test_acc_at_best_valid: f64,
    /// Link prediction: the best epoch's validation and test ranking
    /// figures (the epoch of the best validation MRR).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub best_valid_rank: Option<RankMetrics>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub test_rank_at_best_valid: Option<RankMetrics>,
    pub mean_epoch_seconds_excl_first: f64,
    pub device: String,
    pub io_backend: String,
    /// io_uring rings (or pread threads), and reads in flight on each.
    pub io_rings: usize,
    pub io_depth: u32,
    /// The most pages between two packed reads that were read through.
    pub read_through_pages: usize,
    /// `--io-depth auto`: the disk's curve the depth came from.
    pub io_depth_probe: Option<crate::io_depth::Resolved>,
    pub features: FeatureMode,
    /// How the rows read are stored (the layout's `store_dtype`, or the
    /// feature file's type for the baselines); batches are widened to
    /// float32 before the model.
    pub rows_dtype: String,
    /// The layout's CPU cache: `static`, or `belady` (it follows the
    /// batch order; restored at each epoch's end).
    pub cpu_cache_policy: offgnn_manifests::CachePolicy,
    pub pipelined: bool,
    /// (epoch, batches of it done) where this run picked up a checkpoint.
    pub resumed_from: Option<(u32, u64)>,
    /// The exports written: the best epoch's, then the last epoch's if asked.
    pub exports: Vec<export::Written>,
    /// The batch dump written, if asked.
    pub dump: Option<PathBuf>,
    /// Ranks that trained data-parallel (1: one process).
    pub world_size: u32,
    /// Data-parallel runs: the part of the layout this machine's ranks
    /// read (and staged, from a remote layout).
    pub machine_share: Option<MachineShare>,
    /// `--historical`: the cache's settings and what it did.
    pub historical: Option<crate::historical::HistoricalSummary>,
}

#[derive(Clone, Debug, Serialize)]
pub struct MachineShare {
    pub segments: u32,
    pub of_segments: u32,
    pub bytes: u64,
    pub of_bytes: u64,
}

impl MachineShare {
    pub fn of(m: &offgnn_manifests::Manifest, only: &std::collections::BTreeSet<u32>) -> Self {
        MachineShare {
            segments: only.len() as u32,
            of_segments: m.segments.len() as u32,
            bytes: crate::layout::objects_read(m, Some(only))
                .iter()
                .map(|o| o.size)
                .sum(),
            of_bytes: m.objects.iter().map(|o| o.size).sum(),
        }
    }
}

/// An epoch's running sums: what a mid-epoch checkpoint must carry for the
/// epoch's figures to come out whole after a resume.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(super) struct EpochProgress {
    /// Batches of the epoch's order trained.
    pub(super) batches: u64,
    pub(super) loss_sum: f64,
    pub(super) correct: i64,
    pub(super) seen: i64,
    pub(super) disk_bytes: u64,
    pub(super) disk_rows_bytes: u64,
    pub(super) tiers: [u64; 3],
    pub(super) train_seconds: f64,
    pub(super) stage_busy: StageBusy,
}

/// The batch's correct predictions, as an int64 scalar on the device (read
/// back once per epoch, not once per batch: on CUDA a read is a sync).
pub(crate) fn correct(logits: &Tensor, labels: &Tensor) -> Result<Tensor, TchError> {
    logits
        .f_argmax(-1, false)?
        .f_eq_tensor(labels)?
        .f_sum(Kind::Int64)
}

/// An epoch's loss sum and correct count, kept on the device so that a step
/// need not wait for them, and the last loss that was NaN or infinite.
/// Both sums start at the progress a resume restored and add in batch
/// order, exactly as the host summed them before.
pub(super) struct DeviceSums {
    loss: Tensor,
    correct: Tensor,
    pub(super) bad_loss: Tensor,
}

impl DeviceSums {
    pub(super) fn new(p: &EpochProgress, device: Device) -> DeviceSums {
        DeviceSums {
            loss: Tensor::from(p.loss_sum).to_device(device),
            correct: Tensor::from(p.correct).to_device(device),
            bad_loss: Tensor::from(0f32).to_device(device),
        }
    }

    /// Adds a batch's loss and its count of right predictions (an int64
    /// scalar on the device).
    pub(super) fn add(&mut self, loss: &Tensor, right: &Tensor) -> Result<(), TchError> {
        tch::no_grad(|| {
            let loss = loss.f_detach()?;
            let _ = self.loss.f_add_(&loss.f_to_kind(Kind::Double)?)?;
            let _ = self.correct.f_add_(right)?;
            // Where the loss is finite keep the last bad one, else take it.
            self.bad_loss = self.bad_loss.f_where_self(&loss.f_isfinite()?, &loss)?;
            Ok(())
        })
    }

    /// Whether a loss was NaN or infinite, as a device flag.
    pub(super) fn loss_diverged(&self) -> Tensor {
        self.bad_loss.isfinite().logical_not()
    }

    /// Reads the sums into `p` (a sync on CUDA).
    pub(super) fn store(&self, p: &mut EpochProgress) {
        p.loss_sum = self.loss.double_value(&[]);
        p.correct = self.correct.int64_value(&[]);
    }
}

/// The `--metrics` file, on the rank that writes: appended to by a resumed
/// run, else started afresh.
pub(super) fn open_metrics_file(cfg: &TrainConfig, writer: bool) -> Result<Option<std::fs::File>> {
    match cfg.metrics.as_ref().filter(|_| writer) {
        Some(p) => open_metrics(p, cfg.resume, cfg.overwrite).map(Some),
        None => Ok(None),
    }
}

/// Opens the metrics file `path` for one run: held under an exclusive lock
/// while the run writes it (a second run on it is refused, not mixed in),
/// appended to where `resume`, else emptied, which a file with lines in it
/// needs `overwrite` for.
pub(crate) fn open_metrics(path: &Path, resume: bool, overwrite: bool) -> Result<std::fs::File> {
    let io = |e| Error::io(path.display(), e);
    if path.is_dir() {
        return Err(Error::InvalidArgument(format!(
            "{}: a directory, not a metrics file",
            path.display()
        )));
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io)?;
    if !offgnn_shared::commit::try_lock_file(&f) {
        return Err(Error::InvalidArgument(format!(
            "{}: another run is writing this metrics file; give this run its own --metrics",
            path.display()
        )));
    }
    if !resume {
        if !overwrite && f.metadata().map_err(io)?.len() > 0 {
            return Err(Error::InvalidArgument(format!(
                "{}: the metrics file exists; pass --overwrite to replace it (or --resume to append to it)",
                path.display()
            )));
        }
        f.set_len(0).map_err(io)?;
    }
    Ok(f)
}

/// Appends an epoch's figures to the `--metrics` file as a JSON line.
pub(super) fn append_metrics(f: &mut std::fs::File, path: &Path, e: &EpochMetrics) -> Result<()> {
    let line = serde_json::to_string(e).expect("metrics serialize");
    writeln!(f, "{line}").map_err(|err| Error::io(path.display(), err))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CPU cache's restore counts in the epoch's reads and in their
    /// ratio to the rows needed.
    #[test]
    fn a_restore_counts_in_the_read_amplification() {
        let mut e = EpochMetrics {
            disk_bytes: 100,
            disk_rows_bytes: 80,
            ..Default::default()
        };
        e.set_read_amplification();
        assert_eq!(e.read_amplification, 1.25);
        e.add_restored(20);
        assert_eq!((e.disk_bytes, e.cpu_cache_restored_bytes), (120, 20));
        assert_eq!(e.read_amplification, 1.5);
    }

    // One run holds its metrics file: a second is refused while it does,
    // not interleaved; a resume appends, a fresh start needs --overwrite
    // over lines and then empties the file.
    #[test]
    fn a_metrics_file_is_one_runs_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.jsonl");
        let mut first = open_metrics(&path, false, false).unwrap();
        writeln!(first, "one").unwrap();
        let err = open_metrics(&path, true, false).unwrap_err().to_string();
        assert!(
            err.contains("another run is writing this metrics file"),
            "{err}"
        );
        drop(first);
        let err = open_metrics(&path, false, false).unwrap_err().to_string();
        assert!(err.contains("pass --overwrite"), "{err}");
        let mut resumed = open_metrics(&path, true, false).unwrap();
        writeln!(resumed, "two").unwrap();
        drop(resumed);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "one\ntwo\n");
        drop(open_metrics(&path, false, true).unwrap());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
        let err = open_metrics(dir.path(), false, true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("a directory"), "{err}");
    }

    // The device sums add in batch order from the restored progress, as
    // the host did: the same f64 sum bit for bit, and the last non-finite
    // loss kept for the message.
    #[test]
    fn device_sums_equal_the_host_sums_and_keep_a_bad_loss() {
        let start = EpochProgress {
            loss_sum: 0.1,
            correct: 7,
            ..Default::default()
        };
        let mut sums = DeviceSums::new(&start, Device::Cpu);
        let logits = Tensor::from_slice(&[0.0f32, 1.0, 2.0, 0.0]).view([2, 2]);
        let right = correct(&logits, &Tensor::from_slice(&[1i64, 1])).unwrap();
        let mut host = start.loss_sum;
        for v in [0.3f32, 1.7, 2.9e-3] {
            sums.add(&Tensor::from(v), &right).unwrap();
            host += v as f64;
        }
        let mut p = EpochProgress::default();
        sums.store(&mut p);
        assert_eq!(p.loss_sum.to_bits(), host.to_bits());
        assert_eq!(p.correct, 7 + 3, "one of two right, three times");
        assert!(!bool::try_from(sums.loss_diverged()).unwrap());
        sums.add(&Tensor::from(f32::INFINITY), &right).unwrap();
        sums.add(&Tensor::from(0.5f32), &right).unwrap();
        assert!(bool::try_from(sums.loss_diverged()).unwrap());
        assert_eq!(sums.bad_loss.double_value(&[]), f64::INFINITY);
    }
}
