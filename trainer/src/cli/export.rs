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
    /// Refuse unless the checkpoint was trained on this layout's manifest
    /// (a directory or its manifest.json). A typed run's checkpoint reads
    /// the layout it records without it (its types and relations name the
    /// export's parameters); this names the layout where it has moved.
    #[arg(long)]
    pub manifest: Option<String>,
}

/// `trainer show-model`: reads the export at `model` (checking it) and
/// prints what it holds.
pub(super) fn show_model(model: &str) -> anyhow::Result<()> {
    if crate::hetero::infer::is_typed_model(model)? {
        let (card, named) = crate::hetero::export::read(model)?;
        let weights_bytes = named.values().map(|t| t.numel() as u64 * 4).sum();
        let location = offgnn_shared::store::redact(model);
        report::typed_export_summary("show-model", &location, weights_bytes, &card);
        return Ok(());
    }
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
/// it must have been trained on (if given; a typed run's checkpoint reads
/// the one it records otherwise, for its types and relations), written to
/// `--out`.
pub(super) fn export_command(a: ExportArgs) -> anyhow::Result<()> {
    let manifest = a
        .manifest
        .as_deref()
        .map(|location| anyhow::Ok((location, read_manifest(location)?)))
        .transpose()?;
    if crate::hetero::checkpoint::is_typed(&a.checkpoint_dir) {
        let (location, bytes) = match manifest {
            Some((location, bytes)) => (location.to_string(), bytes),
            None => recorded_layout(&a.checkpoint_dir)?,
        };
        let m = offgnn_manifests::TypedManifest::parse(&location, &bytes)?;
        let (location, card) = crate::hetero::checkpoint::export(
            &a.checkpoint_dir,
            &a.out,
            (a.last, a.overwrite),
            &m,
        )?;
        let weights_bytes = card.parameters as u64 * 4;
        report::typed_export_summary("export", &location, weights_bytes, &card);
        return Ok(());
    }
    let manifest = manifest
        .map(|(location, bytes)| {
            if offgnn_manifests::is_typed(&bytes) {
                anyhow::bail!(
                    "{}: a typed layout, and {} holds a homogeneous run's checkpoint",
                    offgnn_shared::store::redact(location),
                    a.checkpoint_dir.display()
                );
            }
            anyhow::Ok(offgnn_manifests::Manifest::parse(location, &bytes)?)
        })
        .transpose()?;
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

/// The manifest at `location` (a layout's directory or its manifest file,
/// local or in an object store).
fn read_manifest(location: &str) -> anyhow::Result<Vec<u8>> {
    use anyhow::Context;
    let (dir, name) = crate::staging::split_location(location);
    let read = || {
        anyhow::Ok(Vec::from(
            offgnn_shared::store::Store::open_read(&dir)?.get(&name)?,
        ))
    };
    read().with_context(|| format!("reading {}", offgnn_shared::store::redact(location)))
}

/// The layout a typed checkpoint in `dir` records it was trained on: its
/// location and manifest.
fn recorded_layout(dir: &std::path::Path) -> anyhow::Result<(String, Vec<u8>)> {
    let recorded = crate::hetero::checkpoint::read(dir)?.and_then(|m| m.layout);
    let Some(location) = recorded else {
        anyhow::bail!(
            "{} holds a typed run's checkpoint that does not record its layout: pass --manifest with the layout it was trained on (its types and relations name the export's parameters)",
            dir.display()
        );
    };
    let bytes = read_manifest(&location).map_err(|e| {
        anyhow::anyhow!(
            "{}: the layout it was trained on, {location}, cannot be read ({e:#}); pass --manifest with that layout where it is now",
            dir.display()
        )
    })?;
    tracing::info!("the layout {location}, as the checkpoint records it");
    Ok((location, bytes))
}
