//! One training epoch: its batches through the pipeline into the training
//! step, its figures, and its end: the figures recorded and handed out,
//! the best parameters kept, the epoch's checkpoint, and a stop on a
//! signal.

use std::time::Instant;

use offgnn_manifests::BatchRef;

use super::checkpoint::{Best, save_checkpoint};
use super::context::{Job, ModelState, RunState};
use super::metrics::{DeviceSums, EpochMetrics, EpochProgress, StageBusy, append_metrics};
use super::order::EpochPlan;
use super::ranks::summed;
use super::step::{EpochRun, step, train_batch};
use crate::error::Result;
use crate::export;
use crate::pipeline::{self, Ready};

/// Trains epoch `t` of `schedule`, from the progress a mid-epoch
/// checkpoint restored (`resumed`) on, and returns its training figures
/// (evaluation comes after).
pub(super) fn train_epoch(
    job: &Job,
    schedule: &[Vec<BatchRef>],
    model: &mut ModelState,
    run: &mut RunState,
    t: u32,
    resumed: Option<EpochProgress>,
) -> Result<EpochMetrics> {
    let started = Instant::now();
    let follows = job.cpu_cache_follows();
    let plan = EpochPlan::of(schedule, t, job.cfg, (job.world(), &job.local), follows);
    let p = resumed.unwrap_or_default();
    let skip = (p.batches as usize).min(plan.steps);
    if follows && skip > 0 {
        rebuild_cpu_cache(job, &plan.order[..skip], t)?;
    }
    let mine = plan.batches_from(skip);
    let refs: Vec<BatchRef> = mine.iter().map(|(b, _)| *b).collect();
    let pb = if job.cfg.show_progress && job.writer() {
        let pb = offgnn_shared::progress::bar(plan.steps as u64, &format!("epoch {t}"), "steps");
        pb.set_position(skip as u64);
        pb
    } else {
        indicatif::ProgressBar::hidden()
    };
    let times_before = p.stage_busy.clone();
    let mut ep = EpochRun {
        t,
        started,
        steps: plan.steps,
        seconds_before: p.train_seconds,
        sums: DeviceSums::new(&p, job.cfg.device),
        p,
        reduce_seconds: 0.0,
        reduce_bytes: 0,
        pb,
    };
    let ranks_here = job.local.len();
    let mut k = 0usize;
    // With the historical cache, one process trains one batch a step.
    let first_step = model.adam.step as u64;
    let times = pipeline::run_batches(
        job.layout,
        job.engine,
        job.src,
        &refs,
        job.cfg.pipeline_options(),
        job.historical.map(|h| (h, first_step)),
        |r: Ready| {
            let j = k % ranks_here;
            let position = mine[k].1;
            let step_no = first_step + k as u64;
            k += 1;
            let batch = ep.p.batches;
            train_batch(job, model, &mut ep, r, (j == 0, position, step_no))
                .and_then(|()| {
                    if j + 1 < ranks_here {
                        return Ok(());
                    }
                    step(job, model, run, &mut ep)
                })
                // The one place a libtorch failure of the step (on a GPU,
                // most often out of memory) learns where it happened.
                .map_err(|e| e.during(|| format!("training at epoch {t}, batch {batch}")))
        },
    )?;
    ep.pb.finish_and_clear();
    ep.sums.store(&mut ep.p);
    let all = summed(&ep.p, job.ranks, job.cfg.device)?;
    Ok(figures(job, &plan, &ep, &all, times_before.plus(&times)))
}

/// A run resumed inside epoch `t` finds its CPU cache as the epoch's
/// first batches (`done`) left it, when the cache follows the batch
/// order: their admissions again, from their reads again (one process:
/// the order is its own). The bytes are said, not counted in the epoch's.
fn rebuild_cpu_cache(job: &Job, done: &[BatchRef], t: u32) -> Result<()> {
    let Some(cache) = job.src.assemble.cpu_rows.as_ref() else {
        return Ok(());
    };
    let started = Instant::now();
    let mut bytes = 0u64;
    let mut buf = offgnn_shared::io_engine::AlignedBuf::new(0);
    for &r in done {
        let l = pipeline::load(job.layout, job.engine, &job.src.load, r, buf, None)?;
        cache.admit(&l)?;
        bytes += l.disk_bytes;
        buf = l.buf;
    }
    if job.writer() {
        tracing::info!(
            "resumed inside epoch {t}: rebuilt the CPU cache, which follows the batch order, from the epoch's first {} batches ({} read again in {:.1} s)",
            done.len(),
            offgnn_shared::report::human_bytes(bytes),
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// The epoch's training figures: this rank's batches and times, and the
/// sums `all` of every rank.
fn figures(
    job: &Job,
    plan: &EpochPlan,
    ep: &EpochRun,
    all: &EpochProgress,
    stage_busy: StageBusy,
) -> EpochMetrics {
    let mut e = EpochMetrics {
        epoch: ep.t,
        sampled_epoch: plan.sampled,
        batches: ep.p.batches * job.world() as u64,
        ..Default::default()
    };
    e.train_seconds = ep.seconds_before + ep.started.elapsed().as_secs_f64();
    e.stage_busy = stage_busy;
    e.loss = all.loss_sum / e.batches.max(1) as f64;
    e.train_acc = all.correct as f64 / all.seen.max(1) as f64;
    e.disk_bytes = all.disk_bytes;
    e.disk_rows_bytes = all.disk_rows_bytes;
    e.set_read_amplification();
    let total: u64 = all.tiers.iter().sum::<u64>().max(1);
    (e.hit_gpu, e.hit_cpu, e.hit_disk) = (
        all.tiers[0] as f64 / total as f64,
        all.tiers[1] as f64 / total as f64,
        all.tiers[2] as f64 / total as f64,
    );
    e.allreduce_seconds = ep.reduce_seconds;
    e.allreduce_bytes = ep.reduce_bytes;
    e
}

/// An evaluated epoch's end: its figures to the `--metrics` file and, on
/// the rank that writes, to `on_epoch`; its parameters kept if its
/// validation is the best so far; the epoch's checkpoint.
pub(super) fn record(
    job: &Job,
    model: &ModelState,
    run: &mut RunState,
    e: EpochMetrics,
    on_epoch: &mut dyn FnMut(&EpochMetrics),
) -> Result<()> {
    let cfg = job.cfg;
    if let (Some(f), Some(path)) = (run.metrics_file.as_mut(), cfg.metrics.as_deref()) {
        append_metrics(f, path, &e)?;
    }
    if job.writer() {
        on_epoch(&e);
    }
    // Ties keep the earlier epoch, as the summary's pick does.
    if run
        .best
        .as_ref()
        .is_none_or(|b| e.valid_score() > b.valid_score)
    {
        run.best = Some(Best {
            epoch: e.epoch,
            valid_score: e.valid_score(),
            params: export::snapshot(&model.vs)?,
        });
    }
    run.history.push(e);
    if let Some(dir) = cfg.checkpoint_dir.as_ref().filter(|_| job.writer()) {
        let state = model.state(run.best.as_ref());
        save_checkpoint(
            dir,
            &state,
            cfg,
            job.manifest(),
            &run.history,
            None,
            job.world(),
        )?;
    }
    Ok(())
}

/// A signal to any rank stops every rank after epoch `t`, whose checkpoint
/// is written.
pub(super) fn stop_on_signal(job: &Job, t: u32) -> Result<()> {
    let cfg = job.cfg;
    let signal = offgnn_shared::signals::received();
    let stop = match job.ranks.group() {
        Some(g) => g.sum_f64(&[f64::from(u8::from(signal.is_some()))], cfg.device)?[0] > 0.0,
        None => signal.is_some(),
    };
    if stop {
        let place = format!("after epoch {t}");
        return Err(super::step::stopped(
            cfg.checkpoint_dir.as_deref(),
            &place,
            "epoch",
        ));
    }
    Ok(())
}
