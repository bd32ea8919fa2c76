//! Evaluation after each epoch: the model's accuracy on the validation and
//! test batches, each rank over its part of them, one process over all.

use std::time::Instant;

use offgnn_manifests::{BatchRef, Split};
use tch::Tensor;

use super::context::Job;
use super::metrics::{EpochMetrics, correct};
use crate::distributed;
use crate::error::Result;
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

/// Fills in `e`'s validation and test accuracy of `net`, and the time the
/// evaluation took.
pub(super) fn evaluate(
    job: &Job,
    net: &dyn Gnn,
    eval_sets: &[(&str, Vec<BatchRef>)],
    e: &mut EpochMetrics,
) -> Result<()> {
    let eval_started = Instant::now();
    for (name, refs) in eval_sets {
        let acc = accuracy(job, net, name, refs)?;
        if *name == "valid" {
            e.valid_acc = acc
        } else {
            e.test_acc = acc
        }
    }
    e.eval_seconds = eval_started.elapsed().as_secs_f64();
    e.wall_seconds = e.train_seconds + e.eval_seconds;
    Ok(())
}

/// The share of `refs`' seeds (the set `name`) that `net` classifies
/// right, over every rank's part.
fn accuracy(job: &Job, net: &dyn Gnn, name: &str, refs: &[BatchRef]) -> Result<f64> {
    let cfg = job.cfg;
    let world = job.world();
    let (mut right, mut n) = (Tensor::from(0i64).f_to_device(cfg.device)?, 0i64);
    // Each rank evaluates its part; one process all of them.
    let part = match job.ranks.group() {
        Some(g) => &refs[distributed::eval_share(refs.len(), world as usize, g.rank as usize)],
        None => refs,
    };
    tch::no_grad(|| {
        pipeline::run_batches(
            job.layout,
            job.engine,
            job.src,
            part,
            cfg.pipeline_options(),
            None,
            |r: Ready| {
                let logits = net.forward(&r.x, &r.blocks, false)?;
                let _ = right.f_add_(&correct(&logits, &r.labels)?)?;
                n += r.labels.size()[0];
                Ok(())
            },
        )
    })
    // A libtorch failure of the model (on a GPU, most often out of
    // memory) learns here where it happened.
    .map_err(|e| e.during(|| format!("evaluating the {name} batches")))?;
    let mut c = right.int64_value(&[]);
    if let Some(g) = job.ranks.group() {
        let v = g.sum_f64(&[c as f64, n as f64], cfg.device)?;
        (c, n) = (v[0] as i64, v[1] as i64);
    }
    Ok(c as f64 / n.max(1) as f64)
}
