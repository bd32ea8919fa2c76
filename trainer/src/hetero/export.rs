//! A typed model's export: `model-RUN.safetensors`, its parameters named
//! as PyTorch Geometric names them (see [`super`]), and `model.json`
//! (format 3), which says how to build the model in PyG: for each layer a
//! `HeteroConv` over `relations`, one `SAGEConv(in, hidden_channels,
//! root_weight=False)` or `GATConv(in, hidden_channels // heads, heads,
//! add_self_loops=False)` per relation, where `in` is the relation's
//! source and destination widths (the type's `in_channels` in the first
//! layer, `hidden_channels` after; one number where they agree, else the
//! pair); `leaky_relu` and dropout between layers; then `lin`, a `Linear`
//! from `hidden_channels` to `out_channels` on the `target` type. The
//! weights load with `strict=True` (docs/export-and-inference.md).

use serde::{Deserialize, Serialize};
use tch::Tensor;

use super::ranks::Named;
use super::train::{TypedEpoch, TypedLayout};
use super::{RelationalKind, RgnnConfig, Schema};
use crate::error::Result;

/// The export format of a typed model.
pub const TYPED_FORMAT_VERSION: u32 = 3;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TypedNodeType {
    pub name: String,
    pub in_channels: i64,
}

/// `model.json` of a typed model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TypedModelCard {
    pub format_version: u32,
    pub run_id: String,
    /// rsage | rgat.
    pub architecture: RelationalKind,
    pub num_layers: usize,
    pub node_types: Vec<TypedNodeType>,
    /// `[src, relation, dst]`, in the order of the blocks' relations.
    pub relations: Vec<[String; 3]>,
    pub target: String,
    pub hidden_channels: i64,
    pub out_channels: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heads: Option<i64>,
    /// `leaky_relu` (slope 0.01) between layers, then dropout.
    pub act: String,
    pub dropout: f64,
    /// How the relations' convolutions combine at a type.
    pub aggr: String,
    pub dataset_fingerprint: String,
    pub samples_run_sha256: String,
    pub offgnn_version: String,
    /// `best` (best validation epoch) or `last`.
    pub which: String,
    pub epoch: u32,
    pub valid_acc: f64,
    pub test_acc: f64,
    pub parameters: i64,
    pub weights: String,
    pub weights_sha256: String,
}

/// Where the parameters came from.
pub struct TypedProvenance<'a> {
    pub manifest: &'a offgnn_manifests::TypedManifest,
    pub which: &'a str,
    pub epoch: u32,
    pub valid_acc: f64,
    pub test_acc: f64,
}

/// Writes the export of `named` (a model of `cfg` over `schema`) to
/// `location`, as [`crate::export::write`] does; returns the card.
pub fn write(
    location: &str,
    (schema, cfg): (&Schema, &RgnnConfig),
    named: &[(String, Tensor)],
    from: &TypedProvenance<'_>,
    overwrite: bool,
) -> Result<(String, TypedModelCard)> {
    let mut card = None;
    let (location, _) =
        crate::export::write_with(location, named, overwrite, |run_id, sha, parameters| {
            let c = TypedModelCard {
                format_version: TYPED_FORMAT_VERSION,
                run_id: run_id.to_string(),
                architecture: cfg.kind,
                num_layers: cfg.layers,
                node_types: schema
                    .types
                    .iter()
                    .zip(&cfg.in_dims)
                    .map(|(t, d)| TypedNodeType {
                        name: t.0.clone(),
                        in_channels: d.unwrap_or(0),
                    })
                    .collect(),
                relations: schema
                    .relations
                    .iter()
                    .map(|(s, r, d)| {
                        [
                            schema.types[*s].0.clone(),
                            r.clone(),
                            schema.types[*d].0.clone(),
                        ]
                    })
                    .collect(),
                target: schema.types[schema.target].0.clone(),
                hidden_channels: cfg.hidden,
                out_channels: cfg.classes,
                heads: (cfg.kind == RelationalKind::Rgat).then_some(cfg.heads),
                act: "leaky_relu".into(),
                dropout: cfg.dropout,
                aggr: "sum".into(),
                dataset_fingerprint: from.manifest.dataset.dataset_fingerprint.clone(),
                samples_run_sha256: from.manifest.samples.run_sha256.clone(),
                offgnn_version: env!("CARGO_PKG_VERSION").into(),
                which: from.which.into(),
                epoch: from.epoch,
                valid_acc: from.valid_acc,
                test_acc: from.test_acc,
                parameters,
                weights: crate::export::weights_name(run_id),
                weights_sha256: sha,
            };
            let json = serde_json::to_vec_pretty(&c).expect("model cards serialize");
            card = Some(c);
            json
        })?;
    Ok((location, card.expect("the card was made")))
}

/// Writes the best validation epoch's parameters `best` to the export
/// target, and with `last` the last epoch's to `TARGET/last`.
pub(super) fn run_exports(
    x: &crate::train::ExportTarget,
    (layout, model_cfg): (&TypedLayout, &RgnnConfig),
    (epochs, best): (&[TypedEpoch], Option<&TypedEpoch>),
    (best_params, last_params): (Named, Named),
) -> Result<Vec<String>> {
    let last = epochs.last().expect("an epoch ran");
    let at = best.unwrap_or(last);
    let from = |which, e: &TypedEpoch| TypedProvenance {
        manifest: &layout.manifest,
        which,
        epoch: e.epoch,
        valid_acc: e.valid_accuracy.unwrap_or(0.0),
        test_acc: e.test_accuracy.unwrap_or(0.0),
    };
    let shape = (&layout.schema, model_cfg);
    let (location, _) = write(
        &x.location,
        shape,
        &best_params,
        &from("best", at),
        x.overwrite,
    )?;
    let mut written = vec![location];
    if x.last {
        let target = format!("{}/last", x.location.trim_end_matches('/'));
        let (location, _) = write(
            &target,
            shape,
            &last_params,
            &from("last", last),
            x.overwrite,
        )?;
        written.push(location);
    }
    Ok(written)
}
