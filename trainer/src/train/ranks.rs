//! Data-parallel training: how this process takes part (alone, as one
//! rank of a c10d group, or standing in for several ranks), the gradients
//! averaged over the ranks before each step, and the running sums they add
//! up.

use tch::{Device, Kind, TchError, Tensor};

use super::metrics::EpochProgress;
use crate::distributed::Group;
use crate::error::Result;
use crate::model::Adam;

/// How this process takes part in training.
#[derive(Clone, Copy)]
pub enum Ranks<'a> {
    /// One process, alone.
    One,
    /// One rank of a c10d process group: it trains its share of every
    /// epoch, and gradients are averaged over the group before each step.
    Group(&'a Group),
    /// One process standing in for this many ranks: each step trains every
    /// rank's batch of that step and averages their gradients by hand. The
    /// check that a data-parallel run computes what it should.
    Emulated(u32),
}

impl Ranks<'_> {
    pub fn world(&self) -> u32 {
        match self {
            Ranks::One => 1,
            Ranks::Group(g) => g.world,
            Ranks::Emulated(n) => *n,
        }
    }

    /// The ranks whose batches this process trains.
    pub(crate) fn local(&self) -> Vec<u32> {
        match self {
            Ranks::One => vec![0],
            Ranks::Group(g) => vec![g.rank],
            Ranks::Emulated(n) => (0..*n).collect(),
        }
    }

    /// Whether this process writes metrics, checkpoints and exports.
    pub fn writer(&self) -> bool {
        match self {
            Ranks::Group(g) => g.rank == 0,
            _ => true,
        }
    }

    pub(crate) fn group(&self) -> Option<&Group> {
        match self {
            Ranks::Group(g) => Some(g),
            _ => None,
        }
    }
}

/// The flattened gradients of `params` (zeros where a parameter has none),
/// with `flags` after them.
fn flat_grads(params: &[(String, Tensor)], flags: &Tensor) -> Result<Tensor, TchError> {
    let mut parts = params
        .iter()
        .map(|(_, p)| {
            let g = p.grad();
            if g.defined() {
                g.f_flatten(0, -1)
            } else {
                p.f_zeros_like()?.f_flatten(0, -1)
            }
        })
        .collect::<Result<Vec<Tensor>, TchError>>()?;
    parts.push(flags.shallow_clone());
    Tensor::f_cat(&parts, 0)
}

/// Running sums that ranks add up: an epoch's figures, or a checkpoint's.
/// The collectives' tensors live on the training `device` (NCCL reduces
/// device tensors only).
pub(super) fn summed(p: &EpochProgress, ranks: Ranks, device: Device) -> Result<EpochProgress> {
    let Some(g) = ranks.group() else {
        return Ok(p.clone());
    };
    let v = g.sum_f64(
        &[
            p.loss_sum,
            p.correct as f64,
            p.seen as f64,
            p.disk_bytes as f64,
            p.disk_rows_bytes as f64,
            p.tiers[0] as f64,
            p.tiers[1] as f64,
            p.tiers[2] as f64,
        ],
        device,
    )?;
    Ok(EpochProgress {
        loss_sum: v[0],
        correct: v[1] as i64,
        seen: v[2] as i64,
        disk_bytes: v[3] as u64,
        disk_rows_bytes: v[4] as u64,
        tiers: [v[5] as u64, v[6] as u64, v[7] as u64],
        ..p.clone()
    })
}

/// One process standing in for `n` ranks: the summed gradients of every
/// rank's batch of the step, divided by `n`.
pub(crate) fn divide_gradients(adam: &Adam, n: u32) -> Result<(), TchError> {
    tch::no_grad(|| {
        for (_, w) in adam.params() {
            let mut g = w.grad();
            if g.defined() {
                let _ = g.f_divide_scalar_(n as f64)?;
            }
        }
        Ok(())
    })
}

/// Averages the step's gradients over the group in one all-reduce, with
/// this rank's `flags[0]` (its loss diverged) and `stop` (it was
/// signalled) after them; pushes whether any rank's loss diverged and
/// whether any rank was signalled onto `flags`. Returns the bytes reduced.
pub(crate) fn all_reduce_gradients(
    g: &Group,
    adam: &Adam,
    world: u32,
    stop: bool,
    flags: &mut Vec<Tensor>,
) -> Result<u64> {
    let params = adam.params();
    let device = params[0].1.device();
    let signalled = Tensor::from_slice(&[f32::from(u8::from(stop))]);
    let mine = Tensor::f_cat(
        &[
            flags[0].f_to_kind(Kind::Float)?.f_reshape([1])?,
            signalled.f_to_device(device)?,
        ],
        0,
    )?;
    let flat = flat_grads(params, &mine)?;
    g.all_reduce_sum(&flat)?;
    let n = flat.size()[0];
    flags.push(flat.f_narrow(0, n - 2, 1)?.f_gt(0.0)?);
    flags.push(flat.f_narrow(0, n - 1, 1)?.f_gt(0.0)?);
    tch::no_grad(|| -> Result<(), TchError> {
        let flat = flat.f_divide_scalar(world as f64)?;
        let mut offset = 0;
        for (_, w) in params {
            let len = w.numel() as i64;
            let mut g = w.grad();
            if g.defined() {
                g.f_copy_(&flat.f_narrow(0, offset, len)?.f_view_as(&g)?)?;
            }
            offset += len;
        }
        Ok(())
    })?;
    Ok((n as u64) * 4)
}
