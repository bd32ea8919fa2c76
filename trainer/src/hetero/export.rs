//! A typed model's export: `model-RUN.safetensors`, its parameters named
//! as PyTorch Geometric names them (see [`super`]), and `model.json`
//! (format 3), which says how to build the model in PyG: for each layer a
//! `HeteroConv` over `relations`, one `SAGEConv(in, hidden_channels,
//! root_weight=root_weight)` or `GATConv(in, hidden_channels // heads, heads,
//! add_self_loops=False)` per relation, where `in` is the relation's
//! source and destination widths (the type's `in_channels` in the first
//! layer, `hidden_channels` after; one number where they agree, else the
//! pair); `leaky_relu` and dropout between layers; then `lin`, a `Linear`
//! from `hidden_channels` to `out_channels` on the `target` type. The
//! weights load with `strict=True` (docs/export-and-inference.md).
//!
//! A link-prediction model's export is format 4: no `lin`; its `scorer`
//! (`dot`, or `mlp` with weights under `scorer.` as the homogeneous export
//! names them) over every type's last-layer rows (`out_channels` =
//! `hidden_channels` wide), and the `link_relation` it was trained on.

use serde::{Deserialize, Serialize};
use tch::Tensor;

use super::ranks::Named;
use super::train::{TypedEpoch, TypedLayout};
use super::{RelationalKind, RgnnConfig, Schema};
use crate::error::{Error, Result};

/// The export format of a typed model.
pub const TYPED_FORMAT_VERSION: u32 = 3;
/// ... and of a typed link-prediction model (readers of format 3 refuse it:
/// it has no classifier).
pub const TYPED_LINK_FORMAT_VERSION: u32 = 4;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TypedNodeType {
    pub name: String,
    pub in_channels: i64,
    /// The type's feature file's fingerprint (its size and sampled blocks,
    /// as the layout recorded it), which inference checks; absent for a
    /// type without features and in exports of older trainers.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub feature_fingerprint: String,
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
    /// R-SAGE: `SAGEConv(..., root_weight=True)`, each convolution's
    /// `lin_r` on the destination's own row (exports before it: false).
    #[serde(default)]
    pub root_weight: bool,
    /// `leaky_relu` (slope 0.01) between layers, then dropout.
    pub act: String,
    pub dropout: f64,
    /// How the relations' convolutions combine at a type.
    pub aggr: String,
    /// Link prediction: the scorer over two endpoints' rows, and the
    /// relation `src:relation:dst` whose pairs it scores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scorer: Option<crate::link::ScorerKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_relation: Option<String>,
    pub dataset_fingerprint: String,
    /// Whether the sampler kept each (source, destination) pair of a
    /// relation once, as inference must build the graph (exports written
    /// before this was recorded: the sampler's default, once).
    #[serde(default = "dedup_by_default")]
    pub dedup_edges: bool,
    pub samples_run_sha256: String,
    pub offgnn_version: String,
    /// `best` (best validation epoch) or `last`.
    pub which: String,
    pub epoch: u32,
    pub valid_acc: f64,
    pub test_acc: f64,
    /// Link prediction: the epoch's validation and test MRR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_mrr: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_mrr: Option<f64>,
    pub parameters: i64,
    pub weights: String,
    pub weights_sha256: String,
}

fn dedup_by_default() -> bool {
    true
}

impl TypedModelCard {
    /// The model's configuration and its schema over `types` (each type's
    /// name, first homogenized id and rows, as a dataset gives them).
    pub fn model(&self, types: Vec<(String, u64, u64)>) -> Result<(Schema, RgnnConfig)> {
        let relations: Vec<String> = self.relations.iter().map(|r| r.join(":")).collect();
        let schema = Schema::new(types, &relations, &self.target)?;
        let in_dims = schema
            .types
            .iter()
            .map(|(name, _, _)| {
                self.node_types
                    .iter()
                    .find(|t| &t.name == name)
                    .map(|t| t.in_channels)
                    .filter(|&d| d > 0)
            })
            .collect();
        let cfg = RgnnConfig {
            kind: self.architecture,
            in_dims,
            hidden: self.hidden_channels,
            classes: match self.scorer {
                Some(_) => 0,
                None => self.out_channels,
            },
            layers: self.num_layers,
            heads: self.heads.unwrap_or(1),
            dropout: self.dropout,
            root_weight: self.root_weight,
            init: Default::default(),
            scorer: self.scorer,
        };
        Ok((schema, cfg))
    }
}

/// Reads a typed export at `location`: its card and weights, checked
/// against the card's checksum.
pub fn read(location: &str) -> Result<(TypedModelCard, std::collections::HashMap<String, Tensor>)> {
    let store = offgnn_shared::store::Store::open_read(location)?;
    let card_url = store.join(crate::export::CARD);
    let card: TypedModelCard = serde_json::from_slice(&store.get(crate::export::CARD)?)
        .map_err(|e| Error::Checkpoint(format!("{card_url}: malformed typed model card: {e}")))?;
    let (named, _) =
        crate::export::read_weights(&store, &card_url, (&card.weights, &card.weights_sha256))?;
    Ok((card, named))
}

/// Where the parameters came from.
pub struct TypedProvenance<'a> {
    pub manifest: &'a offgnn_manifests::TypedManifest,
    pub which: &'a str,
    pub epoch: u32,
    pub valid_acc: f64,
    pub test_acc: f64,
    /// A link model's epoch: its validation and test MRR.
    pub mrr: Option<(f64, f64)>,
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
            let link = cfg.scorer.is_some();
            let c = TypedModelCard {
                format_version: match link {
                    true => TYPED_LINK_FORMAT_VERSION,
                    false => TYPED_FORMAT_VERSION,
                },
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
                        feature_fingerprint: feature_fingerprint(from.manifest, &t.0),
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
                out_channels: match link {
                    true => cfg.hidden,
                    false => cfg.classes,
                },
                heads: (cfg.kind == RelationalKind::Rgat).then_some(cfg.heads),
                root_weight: cfg.root_weight,
                act: "leaky_relu".into(),
                dropout: cfg.dropout,
                aggr: "sum".into(),
                scorer: cfg.scorer,
                link_relation: Some(from.manifest.dataset.link_relation.clone())
                    .filter(|r| link && !r.is_empty()),
                dataset_fingerprint: from.manifest.dataset.dataset_fingerprint.clone(),
                dedup_edges: from.manifest.samples.graph.is_none_or(|g| g.dedup_edges),
                samples_run_sha256: from.manifest.samples.run_sha256.clone(),
                offgnn_version: env!("CARGO_PKG_VERSION").into(),
                which: from.which.into(),
                epoch: from.epoch,
                valid_acc: from.valid_acc,
                test_acc: from.test_acc,
                valid_mrr: from.mrr.map(|m| m.0),
                test_mrr: from.mrr.map(|m| m.1),
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

/// The fingerprint `m`'s layout recorded of type `name`'s feature file
/// (empty for a type without features).
fn feature_fingerprint(m: &offgnn_manifests::TypedManifest, name: &str) -> String {
    m.node_types
        .iter()
        .find(|t| t.name == name)
        .and_then(|t| t.layout.as_ref())
        .map(|l| l.dataset.feature_fingerprint.clone())
        .unwrap_or_default()
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
        mrr: e.valid_rank.zip(e.test_rank).map(|(v, t)| (v.mrr, t.mrr)),
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
