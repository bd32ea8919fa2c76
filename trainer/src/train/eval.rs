//! Evaluation after each epoch: the model's accuracy on the validation and
//! test batches, each rank over its part of them, one process over all.

use std::time::Instant;

use offgnn_manifests::{BatchRef, Split};
use tch::Tensor;

use super::context::Job;
use super::metrics::{EpochMetrics, correct};
use crate::distributed;
use crate::error::Result;
use crate::link::{RankMetrics, RankSums, Scorer};
use crate::model::Gnn;
use crate::pipeline::{self, Ready};

/// The evaluation sets of a layout, validation then test: the batches of
/// their first sampled epoch (none where the layout has none).
pub(super) fn eval_sets(m: &offgnn_manifests::Manifest) -> Vec<(&'static str, Vec<BatchRef>)> {
    [Split::Valid, Split::Test]
        .iter()
        .map(|s| {
            (
                s.name(),
                m.schedule
                    .get(s)
                    .and_then(|e| e.first())
                    .cloned()
                    .unwrap_or_default(),
            )
        })
        .collect()
}

/// Fills in `e`'s validation and test figures of the model, and the time
/// the evaluation took: accuracy, and in a link-prediction run the ranking
/// figures (its accuracy is then the share of pairs classified right).
pub(super) fn evaluate(
    job: &Job,
    model: (&dyn Gnn, Option<&Scorer>),
    eval_sets: &[(&str, Vec<BatchRef>)],
    e: &mut EpochMetrics,
) -> Result<()> {
    let eval_started = Instant::now();
    for (name, refs) in eval_sets {
        let (acc, rank) = match model.1 {
            Some(scorer) => ranking(job, (model.0, scorer), name, refs)?,
            None => (accuracy(job, model.0, name, refs)?, None),
        };
        if *name == "valid" {
            (e.valid_acc, e.valid_rank) = (acc, rank)
        } else {
            (e.test_acc, e.test_rank) = (acc, rank)
        }
    }
    e.eval_seconds = eval_started.elapsed().as_secs_f64();
    e.wall_seconds = e.train_seconds + e.eval_seconds;
    Ok(())
}

/// `each` over this rank's part of `refs` (one process: all of them),
/// without gradients. A libtorch failure of the model (on a GPU, most
/// often out of memory) learns here where it happened.
fn each_batch(
    job: &Job,
    name: &str,
    refs: &[BatchRef],
    each: impl FnMut(Ready) -> Result<()>,
) -> Result<()> {
    let part = match job.ranks.group() {
        Some(g) => {
            &refs[distributed::eval_share(refs.len(), job.world() as usize, g.rank as usize)]
        }
        None => refs,
    };
    let opts = job.cfg.pipeline_options();
    tch::no_grad(|| pipeline::run_batches(job.layout, job.engine, job.src, part, opts, None, each))
        .map_err(|e| e.during(|| format!("evaluating the {name} batches")))?;
    Ok(())
}

/// The share of `refs`' seeds (the set `name`) that `net` classifies
/// right, over every rank's part.
fn accuracy(job: &Job, net: &dyn Gnn, name: &str, refs: &[BatchRef]) -> Result<f64> {
    let cfg = job.cfg;
    let (mut right, mut n) = (Tensor::from(0i64).f_to_device(cfg.device)?, 0i64);
    each_batch(job, name, refs, |r: Ready| {
        let logits = net.forward(&r.x, &r.blocks, false)?;
        let _ = right.f_add_(&correct(&logits, &r.labels)?)?;
        n += r.labels.size()[0];
        Ok(())
    })?;
    let mut c = right.int64_value(&[]);
    if let Some(g) = job.ranks.group() {
        let v = g.sum_f64(&[c as f64, n as f64], cfg.device)?;
        (c, n) = (v[0] as i64, v[1] as i64);
    }
    Ok(c as f64 / n.max(1) as f64)
}

/// The ranking figures of a link-prediction set (each positive against
/// its given negatives) over every rank's part, and the share of its pairs
/// classified right.
fn ranking(
    job: &Job,
    (net, scorer): (&dyn Gnn, &Scorer),
    name: &str,
    refs: &[BatchRef],
) -> Result<(f64, Option<RankMetrics>)> {
    let cfg = job.cfg;
    let mut sums = RankSums::new(cfg.device);
    each_batch(job, name, refs, |r: Ready| {
        let pairs = r.pairs.as_ref().ok_or_else(|| {
            crate::error::Error::InvalidArgument(
                "a batch without node pairs in a link-prediction layout".into(),
            )
        })?;
        let out = net.forward(&r.x, &r.blocks, false)?;
        sums.add(&scorer.score(&out, &pairs.src, &pairs.dst)?, pairs)?;
        Ok(())
    })?;
    let mut v = sums.values()?;
    if let Some(g) = job.ranks.group() {
        v = g.sum_f64(&v, cfg.device)?;
    }
    let (rank, acc) = RankMetrics::of(&v);
    Ok((acc, Some(rank)))
}
