//! Data-parallel ranks train one model only where they agree on what
//! shapes it, its optimizer, its schedule and its data. Before the first
//! collective whose shapes depend on them, rank 0 hands every rank its
//! settings, and a rank launched with others stops in one line naming the
//! first setting that differs, where it would train another model or abort
//! in Gloo. Settings that may differ per rank (the device index, local
//! directories, the pipeline's depth and threads, progress bars) are not
//! compared.

use sha2::Digest;
use tch::{Device, Kind, Tensor};

use super::config::TrainConfig;
use crate::distributed::Group;
use crate::error::{Error, Result};

/// The settings every rank must share, by the flag a user sets them with.
pub(super) fn settings(cfg: &TrainConfig, m: &offgnn_manifests::Manifest) -> Vec<(String, String)> {
    let layout = serde_json::to_vec(m).unwrap_or_default();
    let digest = offgnn_shared::store::hex(&sha2::Sha256::digest(&layout));
    let model = &cfg.model;
    [
        (
            "--manifest",
            format!("run '{}' (manifest {})", m.run_id, &digest[..16]),
        ),
        ("--model", format!("{:?}", model.kind).to_lowercase()),
        ("--hidden", model.hidden.to_string()),
        ("--heads", model.heads.to_string()),
        ("--dropout", model.dropout.to_string()),
        (
            "--scorer",
            model.scorer.map_or("none", |s| s.name()).to_string(),
        ),
        ("--lr", cfg.lr.to_string()),
        ("--epochs", cfg.epochs.to_string()),
        ("--seed", cfg.seed.to_string()),
        ("--features", format!("{:?}", cfg.features).to_lowercase()),
        ("--max-batches", or_none(cfg.max_batches)),
        (
            "--checkpoint-dir",
            if cfg.checkpoint_dir.is_some() {
                "given"
            } else {
                "none"
            }
            .to_string(),
        ),
        ("--checkpoint-every", or_none(cfg.checkpoint_every)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// A flag's value as a user would write it, `none` where it is not given.
fn or_none(value: Option<impl std::fmt::Display>) -> String {
    value.map_or_else(|| "none".to_string(), |v| v.to_string())
}

/// The first setting of `ours` that differs from rank 0's `theirs`.
fn first_difference(ours: &[(String, String)], theirs: &[(String, String)]) -> Option<String> {
    if ours.len() != theirs.len() {
        return Some(format!(
            "the settings compared ({} here, {} on rank 0: another offgnn build)",
            ours.len(),
            theirs.len()
        ));
    }
    ours.iter()
        .zip(theirs)
        .find(|(a, b)| a != b)
        .map(|((name, ours), (_, theirs))| format!("{name} {ours} here, {theirs} on rank 0"))
}

/// Rank 0's settings on every rank: their length, then their bytes, one
/// value each (collectives take tensors of the device's kinds).
fn rank0_settings(
    g: &Group,
    ours: &[(String, String)],
    device: Device,
) -> Result<Vec<(String, String)>> {
    let bytes = serde_json::to_vec(ours).unwrap_or_default();
    let len = Tensor::f_from_slice(&[bytes.len() as i64])?.f_to_device(device)?;
    g.broadcast(&len, 0)?;
    let len = len.f_int64_value(&[0])?;
    let values: Vec<i64> = if g.rank == 0 {
        bytes.iter().map(|&b| i64::from(b)).collect()
    } else {
        vec![0; len.max(0) as usize]
    };
    let t = Tensor::f_from_slice(&values)?.f_to_device(device)?;
    g.broadcast(&t, 0)?;
    let got = Vec::<i64>::try_from(t.f_to_device(Device::Cpu)?.f_to_kind(Kind::Int64)?)?;
    let got: Vec<u8> = got.into_iter().map(|v| v as u8).collect();
    serde_json::from_slice(&got).map_err(|e| {
        Error::Distributed(format!(
            "rank {}: rank 0's settings do not read: {e}",
            g.rank
        ))
    })
}

/// Stops every rank where any was launched with settings other than rank
/// 0's: that rank names the setting, the others say that one did.
pub(super) fn check(g: &Group, ours: &[(String, String)], device: Device) -> Result<()> {
    let theirs = rank0_settings(g, ours, device)?;
    let differs = first_difference(ours, &theirs);
    let differing = g.sum_f64(&[f64::from(u8::from(differs.is_some()))], device)?[0];
    if let Some(what) = differs {
        return Err(Error::InvalidArgument(format!(
            "rank {} of {}: {what}; data-parallel ranks must be launched with the same settings (only the device index, local paths, the pipeline's depth and threads, and progress output may differ)",
            g.rank, g.world
        )));
    }
    if differing > 0.0 {
        return Err(Error::Distributed(format!(
            "rank {} of {}: {differing} other rank(s) were launched with other settings than rank 0; their messages name the setting",
            g.rank, g.world
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn the_first_differing_setting_is_named_with_both_values() {
        let rank0 = pairs(&[("--model", "sage"), ("--lr", "0.01"), ("--epochs", "3")]);
        assert_eq!(first_difference(&rank0, &rank0), None);
        let ours = pairs(&[("--model", "sage"), ("--lr", "0.1"), ("--epochs", "4")]);
        assert_eq!(
            first_difference(&ours, &rank0).as_deref(),
            Some("--lr 0.1 here, 0.01 on rank 0")
        );
        assert!(first_difference(&ours[..2], &rank0).is_some());
    }
}
