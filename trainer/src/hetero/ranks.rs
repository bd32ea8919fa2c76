//! Typed training over data-parallel ranks, as homogeneous training does
//! it: every rank starts from rank 0's model (and the checkpoint only rank
//! 0 reads), each step averages the ranks' gradients in one all-reduce that
//! also carries whether a rank's loss diverged or it was signalled, and the
//! epoch's and the evaluation's sums add over the ranks.

use tch::{Device, Kind, Tensor};

use super::checkpoint::InEpoch;
use super::train::{Started, TypedEpoch, TypedTrainConfig};
use crate::distributed::Group;
use crate::error::Result;
use crate::model::Adam;
use crate::train::{Ranks, all_reduce_gradients, divide_gradients, share_model};

/// A model's parameters by name, as an export holds them.
pub(super) type Named = Vec<(String, Tensor)>;

/// Gives every rank rank 0's start: whether it could start at all, how
/// many epochs (and steps of the next) are done, then its parameters and
/// Adam's state. The other ranks' history holds placeholders and their
/// sums of the epoch start at zero (rank 0 alone checkpoints, exports and
/// reports, and holds the sums so far).
pub(super) fn share_start(
    g: &Group,
    decided: Result<Started>,
    adam: &mut Adam,
    device: Device,
) -> Result<Started> {
    let figures = match &decided {
        Ok((history, _, at)) => [history.len() as i64, at.map_or(-1, |p| p.steps as i64)],
        Err(_) => [0, -1],
    };
    let (mine, header) = share_model(g, decided, &figures, adam, device)?;
    Ok(mine.unwrap_or_else(|| {
        let at = (header[1] >= 0).then(|| InEpoch {
            steps: header[1] as u64,
            ..Default::default()
        });
        (vec![TypedEpoch::default(); header[0] as usize], None, at)
    }))
}

/// The step's gradients averaged over the ranks (by hand for emulated
/// ranks), and whether any rank's loss was not finite (`diverged` here)
/// and whether any rank was signalled: every rank then stops after the
/// same step.
pub(super) fn average_gradients(
    ranks: Ranks<'_>,
    adam: &Adam,
    diverged: bool,
    device: Device,
) -> Result<(bool, bool)> {
    let signalled = offgnn_shared::signals::received().is_some();
    match ranks {
        Ranks::One => Ok((diverged, signalled)),
        Ranks::Emulated(n) => {
            divide_gradients(adam, n)?;
            Ok((diverged, signalled))
        }
        Ranks::Group(g) => {
            let mut flags =
                vec![Tensor::f_from_slice(&[f32::from(u8::from(diverged))])?.f_to_device(device)?];
            all_reduce_gradients(g, adam, g.world, signalled, &mut flags)?;
            let set = |t: &Tensor| -> Result<bool> {
                Ok(t.f_to_kind(Kind::Int64)?.f_int64_value(&[0])? != 0)
            };
            Ok((set(&flags[1])?, set(&flags[2])?))
        }
    }
}

/// A signal to any rank stops every rank after epoch `epoch`, whose
/// checkpoint is written.
pub(super) fn stop_on_signal(ranks: Ranks<'_>, cfg: &TypedTrainConfig, epoch: u32) -> Result<()> {
    let mine = f64::from(u8::from(offgnn_shared::signals::received().is_some()));
    if summed(ranks, &[mine], cfg.device)?[0] == 0.0 {
        return Ok(());
    }
    let place = format!("after epoch {epoch}");
    Err(crate::train::stopped(
        cfg.checkpoint_dir.as_deref(),
        &place,
        "epoch",
    ))
}

/// `values` summed over the ranks of a group (as they are elsewhere).
pub(super) fn summed(ranks: Ranks<'_>, values: &[f64], device: Device) -> Result<Vec<f64>> {
    match ranks.group() {
        Some(g) => Ok(g.sum_f64(values, device)?),
        None => Ok(values.to_vec()),
    }
}
