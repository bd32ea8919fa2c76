//! `trainer export` and `trainer show-model`: a checkpoint's model written
//! as an export, and an export checked and shown.

use std::path::PathBuf;

use clap::Args;

use super::report;
use crate::{export, train};

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// The --checkpoint-dir of a training run.
    #[arg(long)]
    pub checkpoint_dir: PathBuf,
    /// Where the export goes: a directory or an object-store URL.
    #[arg(long)]
    pub out: String,
    /// Export the parameters the checkpoint was taken with, not those of
    /// the best validation epoch.
    #[arg(long)]
    pub last: bool,
    /// Replace an export already at --out.
    #[arg(long)]
    pub overwrite: bool,
    /// Refuse unless the checkpoint was trained on this layout's manifest.
    #[arg(long)]
    pub manifest: Option<String>,
}

/// `trainer show-model`: reads the export at `model` (checking it) and
/// prints what it holds.
pub(super) fn show_model(model: &str) -> anyhow::Result<()> {
    let (card, vs) = export::read(model, tch::Device::Cpu)?;
    let weights_bytes = vs.variables().values().map(|t| t.numel() as u64 * 4).sum();
    report::export_summary(
        "show-model",
        &export::Written {
            location: offgnn_shared::store::redact(model),
            weights_bytes,
            card,
        },
    );
    Ok(())
}

/// `trainer export`: the model of a checkpoint, read with the manifest
/// it must have been trained on (if given), written to `--out`.
pub(super) fn export_command(a: ExportArgs) -> anyhow::Result<()> {
    use anyhow::Context;
    let manifest = a
        .manifest
        .as_deref()
        .map(|location| {
            let (dir, name) = location.rsplit_once('/').unwrap_or((".", location));
            let store = offgnn_shared::store::Store::open(dir)?;
            let bytes = store.get(name)?;
            anyhow::Ok(offgnn_manifests::Manifest::parse(location, &bytes)?)
        })
        .transpose()
        .with_context(|| {
            format!(
                "reading {}",
                offgnn_shared::store::redact(a.manifest.as_deref().unwrap_or_default())
            )
        })?;
    let written = train::export_checkpoint(
        &a.checkpoint_dir,
        &a.out,
        a.last,
        a.overwrite,
        manifest.as_ref(),
    )?;
    report::export_summary("export", &written);
    Ok(())
}
