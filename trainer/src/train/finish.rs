//! The end of a run: the best validation epoch (test accuracy there is the
//! run's result), the exports and batch dump asked for, and the summary.

use std::collections::HashMap;
use std::path::PathBuf;

use offgnn_manifests::BatchRef;
use offgnn_shared::io_engine::IoEngine;
use tch::{Device, Kind, Tensor};

use super::checkpoint::Best;
use super::config::{DumpTarget, ExportTarget, TrainConfig};
use super::context::{Job, ModelState, RunState};
use super::metrics::{EpochMetrics, TrainSummary};
use crate::error::{Error, Result};
use crate::export;
use crate::layout::Layout;
use crate::model;
use crate::pipeline::{self, FeatureMode, Ready, Sources};

/// The run's summary, after writing the exports and dump `job` asks for.
pub(super) fn finish(
    job: &Job,
    model: &ModelState,
    run: RunState,
    eval_sets: &[(&str, Vec<BatchRef>)],
    resumed_from: Option<(u32, u64)>,
) -> Result<TrainSummary> {
    let cfg = job.cfg;
    let history = run.history;
    let (best_epoch, best) = best_epoch(&history);
    let rest: Vec<f64> = history.iter().skip(1).map(|e| e.wall_seconds).collect();
    let (exports, dump) = if job.writer() && (cfg.export.is_some() || cfg.dump.is_some()) {
        let params = run.best.filter(|b| b.epoch == best_epoch).ok_or_else(|| {
            Error::Checkpoint(format!(
                "the parameters of the best epoch ({best_epoch}) are not in the checkpoint this run resumed from (an older trainer wrote it); export the last epoch with `trainer export --last`"
            ))
        })?;
        write_outputs(job, model, &params, &history, eval_sets)?
    } else {
        (Vec::new(), None)
    };
    let layout = job.layout;
    Ok(TrainSummary {
        mean_epoch_seconds_excl_first: if rest.is_empty() {
            history.first().map_or(0.0, |e| e.wall_seconds)
        } else {
            rest.iter().sum::<f64>() / rest.len() as f64
        },
        best_epoch,
        best_valid_acc: best.valid_acc,
        test_acc_at_best_valid: best.test_acc,
        best_valid_rank: best.valid_rank,
        test_rank_at_best_valid: best.test_rank,
        epochs: history,
        device: format!("{:?}", cfg.device),
        io_backend: job.engine.backend().to_string(),
        io_rings: job.engine.options().rings,
        io_depth: job.engine.options().queue_depth,
        read_through_pages: job.engine.options().read_through / offgnn_shared::io_engine::PAGE,
        io_depth_probe: None,
        features: cfg.features,
        rows_dtype: match cfg.features {
            FeatureMode::Packed => layout.manifest.dataset.store_dtype(),
            FeatureMode::Naive | FeatureMode::Memory => layout.manifest.dataset.feature_dtype,
        }
        .to_string(),
        cpu_cache_policy: layout.manifest.cpu_cache.policy,
        pipelined: cfg.pipelined,
        resumed_from,
        exports,
        dump,
        world_size: job.world(),
        machine_share: None,
        historical: job.historical.map(|h| h.summary()),
    })
}

/// The epoch of the best validation score (accuracy, or a link run's MRR;
/// ties keep the earlier) and its figures.
fn best_epoch(history: &[EpochMetrics]) -> (u32, EpochMetrics) {
    history
        .iter()
        .enumerate()
        .max_by(|a, b| {
            a.1.valid_score()
                .partial_cmp(&b.1.valid_score())
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(b.0.cmp(&a.0))
        })
        .map(|(i, e)| (i as u32, e.clone()))
        .unwrap_or_default()
}

/// Writes the batch dump (of the `best` parameters) and the exports that
/// the configuration asks for: the best epoch's model, and the last
/// epoch's if asked.
fn write_outputs(
    job: &Job,
    model: &ModelState,
    best: &Best,
    history: &[EpochMetrics],
    eval_sets: &[(&str, Vec<BatchRef>)],
) -> Result<(Vec<export::Written>, Option<PathBuf>)> {
    let cfg = job.cfg;
    let last = export::snapshot(&model.vs)?;
    let mut dump = None;
    if let Some(target) = &cfg.dump {
        let params: HashMap<String, Tensor> = best
            .params
            .iter()
            .map(|(k, v)| (k.clone(), v.shallow_clone()))
            .collect();
        export::load_into(&model.vs, &params, "the best epoch's parameters")?;
        let test = eval_sets
            .iter()
            .find(|(name, _)| *name == "test")
            .map(|(_, refs)| refs.as_slice())
            .unwrap_or_default();
        dump_batches(
            job.layout,
            job.engine,
            job.src,
            cfg,
            model.net.as_ref(),
            test,
            target,
        )?;
        dump = Some(target.path.clone());
    }
    let mut exports = Vec::new();
    if let Some(x) = &cfg.export {
        exports = write_exports(job.manifest(), cfg, x, best, &last, history)?;
    }
    Ok((exports, dump))
}

/// The best epoch's model to `x.location`, and with `x.last` the last
/// epoch's (`last`) to `x.location/last`.
fn write_exports(
    m: &offgnn_manifests::Manifest,
    cfg: &TrainConfig,
    x: &ExportTarget,
    best: &Best,
    last: &[(String, Tensor)],
    history: &[EpochMetrics],
) -> Result<Vec<export::Written>> {
    let provenance = |which: &str, e: &EpochMetrics| export::Provenance {
        feature_dtype: m.dataset.feature_dtype.to_string(),
        dataset_fingerprint: m.dataset.dataset_fingerprint.clone(),
        feature_fingerprint: m.dataset.feature_fingerprint.clone(),
        samples_run_sha256: m.samples.run_sha256.clone(),
        graph: m.samples.graph,
        which: which.into(),
        epoch: e.epoch,
        valid_acc: e.valid_acc,
        test_acc: e.test_acc,
        mrr: e.valid_rank.zip(e.test_rank).map(|(v, t)| (v.mrr, t.mrr)),
    };
    let mut exports = Vec::new();
    let at_best = &history[best.epoch as usize];
    exports.push(export::write(
        &x.location,
        &cfg.model,
        &best.params,
        &provenance("best", at_best),
        x.overwrite,
    )?);
    if x.last {
        let last_epoch = history.last().expect("at least one epoch ran");
        let location = offgnn_shared::store::Store::open(&x.location)?.join("last");
        exports.push(export::write(
            &location,
            &cfg.model,
            last,
            &provenance("last", last_epoch),
            x.overwrite,
        )?);
    }
    Ok(exports)
}

/// Runs the model on the first `target.batches` of `refs` and writes, per
/// batch `k`: `batch{k}.x` (input rows, float32), `batch{k}.n_id` (their
/// global node ids, int64), `batch{k}.block{l}.src`,
/// `.dst` (int64 local ids, edges sorted by destination) and `.size`
/// (`[num_src, num_dst]`) for each layer `l`, `batch{k}.logits` and
/// `batch{k}.labels`; a link batch's `batch{k}.embeddings` (its seeds')
/// in place of logits, and its pairs as `batch{k}.pairs.src`, `.dst` (seed
/// rows), `.label` and `.query`. Written to a temporary name, then
/// renamed.
fn dump_batches(
    layout: &Layout,
    engine: &IoEngine,
    src: &Sources,
    cfg: &TrainConfig,
    net: &dyn model::Gnn,
    refs: &[BatchRef],
    target: &DumpTarget,
) -> Result<()> {
    let refs = &refs[..target.batches.min(refs.len())];
    let mut named: Vec<(String, Tensor)> = Vec::new();
    let mut k = 0;
    tch::no_grad(|| {
        pipeline::run_batches(
            layout,
            engine,
            src,
            refs,
            cfg.pipeline_options(),
            None,
            |r: Ready| {
                let logits = net.forward(&r.x, &r.blocks, false)?;
                let mut add = |name: String, t: Tensor| -> Result<()> {
                    named.push((name, t.f_to_device(Device::Cpu)?));
                    Ok(())
                };
                add(format!("batch{k}.x"), r.x.f_to_kind(Kind::Float)?)?;
                let n_id: Vec<i64> = r.n_id.iter().map(|&v| i64::from(v)).collect();
                add(format!("batch{k}.n_id"), Tensor::from_slice(&n_id))?;
                for (l, b) in r.blocks.iter().enumerate() {
                    add(
                        format!("batch{k}.block{l}.src"),
                        b.src.f_to_kind(Kind::Int64)?,
                    )?;
                    add(
                        format!("batch{k}.block{l}.dst"),
                        b.dst.f_to_kind(Kind::Int64)?,
                    )?;
                    add(
                        format!("batch{k}.block{l}.size"),
                        Tensor::from_slice(&[b.num_src, b.num_dst]),
                    )?;
                }
                // A link model's outputs are its seeds' embeddings.
                let out = if r.pairs.is_some() {
                    "embeddings"
                } else {
                    "logits"
                };
                add(format!("batch{k}.{out}"), logits)?;
                add(format!("batch{k}.labels"), r.labels.f_to_kind(Kind::Int64)?)?;
                for (name, t) in crate::link::dumped_pairs(r.pairs.as_ref()) {
                    add(format!("batch{k}.pairs.{name}"), t.shallow_clone())?;
                }
                k += 1;
                Ok(())
            },
        )
    })
    .map_err(|e| e.during(|| format!("dumping batches to {}", target.path.display())))?;
    export::write_tensors(&target.path, &named)
}
