//! The training step: each batch's forward and backward pass, then the
//! step over every local rank's batch of it (gradients averaged over the
//! ranks, checked for NaN and infinity, applied), and what a step may end
//! with: a checkpoint inside the epoch, a test's interruption, or a stop
//! on a signal.

use std::path::Path;
use std::time::Instant;

use tch::{Device, Kind, Reduction, TchError, Tensor};

use super::checkpoint::{META, save_checkpoint};
use super::context::{Job, ModelState, RunState};
use super::historical_step;
use super::metrics::{DeviceSums, EpochProgress, correct};
use super::order::batch_seed;
use super::ranks::{Ranks, all_reduce_gradients, divide_gradients, summed};
use crate::error::{Error, Result};
use crate::link::{self, Scorer};
use crate::model::{Adam, Gnn};
use crate::pipeline::Ready;

/// An epoch in progress on this process: where it is and its running sums.
pub(super) struct EpochRun {
    pub(super) t: u32,
    pub(super) started: Instant,
    /// Steps in the epoch.
    pub(super) steps: usize,
    /// Training seconds of the epoch before a resume.
    pub(super) seconds_before: f64,
    pub(super) p: EpochProgress,
    pub(super) sums: DeviceSums,
    pub(super) reduce_seconds: f64,
    pub(super) reduce_bytes: u64,
    pub(super) pb: indicatif::ProgressBar,
}

/// One batch's forward and backward pass, at `position` in the epoch's
/// order, its loss and hits added to the epoch's sums; a step's `first`
/// batch starts its gradients from zero. With the historical cache, the
/// batch is training step `step_no` and publishes the cache's update.
pub(super) fn train_batch(
    job: &Job,
    model: &mut ModelState,
    ep: &mut EpochRun,
    r: Ready,
    (first, position, step_no): (bool, usize, u64),
) -> Result<()> {
    if first {
        model.adam.zero_grad();
    }
    // Dropout draws follow the batch's place in the epoch's
    // order, whichever rank trains it.
    tch::manual_seed(batch_seed(job.cfg.seed, ep.t, position as u64));
    let scorer = model.scorer.as_ref();
    match (job.historical, &r.plan) {
        (Some(h), Some(plan)) => {
            let net = model.net.as_ref();
            let (out, levels) =
                historical_step::forward(net, &r.x, &r.blocks, plan, job.cfg.model.hidden)?;
            loss_backward(&out, &r, scorer, &mut ep.sums)?;
            historical_step::publish(h, step_no, plan, &levels)?;
        }
        (Some(h), None) => {
            forward_backward((model.net.as_ref(), scorer), &r, &mut ep.sums)?;
            h.publish(step_no, Vec::new());
        }
        (None, _) => forward_backward((model.net.as_ref(), scorer), &r, &mut ep.sums)?,
    }
    let p = &mut ep.p;
    p.seen += r.targets();
    p.disk_bytes += r.disk_bytes;
    p.disk_rows_bytes += r.disk_rows * job.src.load.row_bytes as u64;
    for (a, b) in p.tiers.iter_mut().zip(r.tiers) {
        *a += b;
    }
    Ok(())
}

/// The batch's forward pass, loss and backward pass, its loss and hits
/// added to `sums`. Every libtorch call here is fallible: on a GPU each can
/// run out of memory.
fn forward_backward(
    (net, scorer): (&dyn Gnn, Option<&Scorer>),
    r: &Ready,
    sums: &mut DeviceSums,
) -> Result<(), TchError> {
    let out = net.forward(&r.x, &r.blocks, true)?;
    loss_backward(&out, r, scorer, sums)
}

/// The batch's loss on the model's output `out` and its backward pass: the
/// cross-entropy of the seeds' logits, or in a link-prediction batch the
/// binary cross-entropy of its pairs' scores.
fn loss_backward(
    out: &Tensor,
    r: &Ready,
    scorer: Option<&Scorer>,
    sums: &mut DeviceSums,
) -> Result<(), TchError> {
    let (loss, right) = match (&r.pairs, scorer) {
        (Some(pairs), Some(scorer)) => {
            let scores = scorer.score(out, &pairs.src, &pairs.dst)?;
            (
                link::pair_loss(&scores, pairs)?,
                link::pairs_right(&scores, pairs)?,
            )
        }
        _ => (
            out.f_log_softmax(-1, Kind::Float)?.f_nll_loss::<Tensor>(
                &r.labels,
                None,
                Reduction::Mean,
                -100,
            )?,
            correct(out, &r.labels)?,
        ),
    };
    // No read-back here: a NaN or infinite loss is caught with
    // the gradients, once per step, before the optimizer runs.
    loss.f_backward()?;
    sums.add(&loss, &right)
}

/// The step, once every local rank's batch of it is through its backward
/// pass: the gradients averaged and checked, the optimizer's step, then
/// the checkpoint, interruption or stop due there.
pub(super) fn step(
    job: &Job,
    model: &mut ModelState,
    run: &mut RunState,
    ep: &mut EpochRun,
) -> Result<()> {
    let cfg = job.cfg;
    let signal = offgnn_shared::signals::received();
    let stop = average_and_check(job, model, ep, signal.is_some())?;
    model.adam.step()?;
    ep.p.batches += 1;
    ep.pb.inc(1);
    run.trained_here += 1;
    if let Some(dir) = &job.hooks.trace_params {
        trace_params(dir, job.local[0], ep.t, ep.p.batches, &model.adam)?;
    }
    if let (Some(dir), Some(every)) = (&cfg.checkpoint_dir, cfg.checkpoint_every)
        && ep.p.batches.is_multiple_of(every)
        && (ep.p.batches as usize) < ep.steps
    {
        checkpoint_step(job, model, run, ep, dir)?;
    }
    if job.hooks.interrupt_after == Some(run.trained_here) {
        return Err(Error::Interrupted(run.trained_here, "training batches"));
    }
    // SIGINT or SIGTERM (on any rank): stop at this step's
    // boundary, keeping a checkpoint of it when there is a
    // checkpoint directory. (At the epoch's last step the epoch
    // ends first and its own checkpoint is kept.)
    if stop && (ep.p.batches as usize) < ep.steps {
        if let Some(dir) = &cfg.checkpoint_dir {
            checkpoint_step(job, model, run, ep, dir)?;
        }
        let place = format!("at epoch {}, batch {}", ep.t, ep.p.batches);
        return Err(stopped(cfg.checkpoint_dir.as_deref(), &place, "step"));
    }
    Ok(())
}

/// The one line of a run a signal stopped `place` (`at epoch 3, batch 7`,
/// `after epoch 3`): which signal, and whether the checkpoint of that
/// `what` (step, epoch) was kept in `dir`.
pub(crate) fn stopped(dir: Option<&std::path::Path>, place: &str, what: &str) -> Error {
    let kept = match dir {
        Some(dir) => format!(
            "checkpoint of that {what} written to {}; run again with --resume to continue",
            dir.display()
        ),
        None => "no --checkpoint-dir, so nothing of this run was kept".into(),
    };
    let signal = offgnn_shared::signals::received();
    Error::Stopped(format!(
        "stopped by {} {place}: {kept}",
        signal.map_or_else(|| "a signal to another rank".to_string(), |s| s.to_string()),
    ))
}

/// Every rank's gradient of the step, averaged, and in one read-back
/// whether the loss or a gradient turned NaN or infinite and (in a group)
/// whether any rank was signalled. A diverged run stops here, before the
/// step that would spread NaN into every parameter; the last checkpoint
/// stays. Returns whether to stop after this step.
fn average_and_check(
    job: &Job,
    model: &ModelState,
    ep: &mut EpochRun,
    signalled: bool,
) -> Result<bool> {
    let cfg = job.cfg;
    let mut stop = signalled;
    // Device flags, read back with the gradients' check: this
    // rank's loss turned NaN or infinite; then, in a group, any
    // rank's did, and any rank was signalled.
    let mut flags = vec![ep.sums.loss_diverged()];
    match job.ranks {
        Ranks::One => {}
        Ranks::Emulated(n) => divide_gradients(&model.adam, n)?,
        Ranks::Group(g) => {
            let reduce_started = Instant::now();
            let bytes = all_reduce_gradients(g, &model.adam, job.world(), stop, &mut flags)?;
            ep.reduce_seconds += reduce_started.elapsed().as_secs_f64();
            ep.reduce_bytes += bytes;
        }
    }
    // A finite loss can still give an infinite or NaN gradient
    // (an overflow in the backward pass); after the all-reduce
    // every rank holds the same gradients, so all agree.
    let (read, bad_grads) = read_flags(model.adam.params(), &flags)?;
    let loss_here = read[0];
    let loss_anywhere = read.get(1).copied().unwrap_or(loss_here);
    if let Some(&s) = read.get(2) {
        stop = s;
    }
    if loss_anywhere || bad_grads {
        return Err(Error::Diverged {
            epoch: ep.t,
            batch: ep.p.batches,
            what: if loss_here {
                format!("the loss became {}", ep.sums.bad_loss.double_value(&[]))
            } else if loss_anywhere {
                "the loss became NaN or infinite on another rank".into()
            } else {
                "a gradient became NaN or infinite".into()
            },
            kept: cfg
                .checkpoint_dir
                .as_ref()
                .filter(|d| d.join(META).exists())
                .map(|d| d.display().to_string()),
        });
    }
    Ok(stop)
}

/// A checkpoint of this step: every rank adds its sums in, rank 0 writes
/// it.
fn checkpoint_step(
    job: &Job,
    model: &ModelState,
    run: &RunState,
    ep: &mut EpochRun,
    dir: &Path,
) -> Result<()> {
    ep.sums.store(&mut ep.p);
    ep.p.train_seconds = ep.seconds_before + ep.started.elapsed().as_secs_f64();
    let all = summed(&ep.p, job.ranks, job.cfg.device)?;
    if job.writer() {
        let state = model.state(run.best.as_ref());
        save_checkpoint(
            dir,
            &state,
            job.cfg,
            job.manifest(),
            &run.history,
            Some(&all),
            job.world(),
        )?;
    }
    Ok(())
}

/// The boolean device scalars `flags`, and whether any gradient is NaN or
/// infinite, read back in one copy (on CUDA the step's one sync).
fn read_flags(params: &[(String, Tensor)], flags: &[Tensor]) -> Result<(Vec<bool>, bool)> {
    let all = tch::no_grad(|| -> Result<Tensor, TchError> {
        let mut bad_grads: Option<Tensor> = None;
        for (_, p) in params {
            let g = p.grad();
            if !g.defined() {
                continue;
            }
            let bad = g.f_isfinite()?.f_logical_not()?.f_any()?;
            bad_grads = Some(match bad_grads {
                Some(a) => a.f_logical_or(&bad)?,
                None => bad,
            });
        }
        let mut all = flags
            .iter()
            .map(|f| f.f_reshape([1]))
            .collect::<Result<Vec<Tensor>, TchError>>()?;
        if let Some(b) = bad_grads {
            all.push(b.f_reshape([1])?);
        }
        Tensor::f_cat(&all, 0)?.f_to_kind(Kind::Uint8)
    })?;
    let mut read: Vec<bool> = Vec::<u8>::try_from(all.f_to_device(Device::Cpu)?)?
        .into_iter()
        .map(|v| v != 0)
        .collect();
    let bad_grads = read.len() > flags.len() && read.pop() == Some(true);
    Ok((read, bad_grads))
}

/// Writes the parameters after step `step` to `dir/rank{rank}/` (the
/// data-parallel test compares ranks bit for bit, and against a run that
/// averages the ranks' gradients by hand).
fn trace_params(dir: &Path, rank: u32, epoch: u32, step: u64, adam: &Adam) -> Result<()> {
    let dir = dir.join(format!("rank{rank}"));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(dir.display(), e))?;
    let path = dir.join(format!("e{epoch:03}-s{step:06}.safetensors"));
    let named = adam
        .params()
        .iter()
        .map(|(k, v)| Ok((k.clone(), v.f_to_device(Device::Cpu)?)))
        .collect::<Result<Vec<(String, Tensor)>>>()?;
    Tensor::write_safetensors(&named, &path)
        .map_err(|e| Error::Checkpoint(format!("writing {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ModelConfig, ModelKind};
    use tch::nn;

    /// A libtorch op that fails in the step (here a label past the
    /// classes; on a GPU, most often an allocation) comes back as an
    /// error, where the panicking calls aborted the thread.
    #[test]
    fn a_failing_libtorch_op_in_the_step_is_an_error() {
        let vs = nn::VarStore::new(Device::Cpu);
        let cfg = ModelConfig {
            kind: ModelKind::Mlp,
            in_dim: 4,
            hidden: 8,
            classes: 3,
            layers: 2,
            heads: 1,
            dropout: 0.0,
            scorer: None,
        };
        let net = crate::model::build(&vs.root(), &cfg);
        let mut sums = DeviceSums::new(&EpochProgress::default(), Device::Cpu);
        let batch = |labels: &[i64]| Ready {
            x: Tensor::randn([2, 4], (Kind::Float, Device::Cpu)),
            blocks: vec![],
            labels: Tensor::from_slice(labels),
            pairs: None,
            n_id: vec![0, 1],
            disk_bytes: 0,
            disk_rows: 0,
            tiers: [0; 3],
            plan: None,
        };
        forward_backward((net.as_ref(), None), &batch(&[0, 2]), &mut sums).unwrap();
        let err = forward_backward((net.as_ref(), None), &batch(&[0, 9]), &mut sums).unwrap_err();
        let line = Error::from(err).during(|| "training at epoch 0, batch 1".into());
        let line = line.to_string();
        assert!(
            line.starts_with("training at epoch 0, batch 1: libtorch: ") && !line.contains('\n'),
            "{line}"
        );
    }

    #[test]
    fn an_infinite_or_nan_gradient_and_the_flags_come_back_in_one_read() {
        let vs = nn::VarStore::new(Device::Cpu);
        let w = vs.root().zeros("w", &[3]);
        let b = vs.root().zeros("b", &[2]);
        let params = vec![("w".to_string(), w.shallow_clone()), ("b".to_string(), b)];
        let flags = [Tensor::from(true), Tensor::from(false).reshape([1])];
        let grads_bad = |params: &[(String, Tensor)]| {
            let (read, bad) = read_flags(params, &flags).unwrap();
            assert_eq!(read, vec![true, false], "flags as given");
            bad
        };
        assert!(!grads_bad(&params), "no gradient yet");
        (&w * 2.0).sum(Kind::Float).backward();
        assert!(!grads_bad(&params));
        for bad in [f64::INFINITY, f64::NAN] {
            tch::no_grad(|| {
                let _ = w.grad().get(1).fill_(bad);
            });
            assert!(grads_bad(&params), "{bad}");
            tch::no_grad(|| {
                let _ = w.grad().get(1).fill_(2.0);
            });
        }
    }
}
