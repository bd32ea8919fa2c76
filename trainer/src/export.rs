//! The trained model as a portable artifact: `model-RUN.safetensors` (one
//! float32 tensor per parameter, named as PyTorch Geometric's model class
//! names it; `RUN` is the writing run's id) and `model.json` (the
//! architecture under PyG's constructor argument names, where it came from,
//! what it reached). `model.json` is created last, conditionally, and is the
//! commit: a location without it holds no export, and it names the weights
//! object it belongs to and their SHA-256, which readers check.

use std::collections::HashMap;

use offgnn_manifests::GraphOptions;
use offgnn_shared::commit::{self, Previous, RunId};
use offgnn_shared::store::Store;
use serde::{Deserialize, Serialize};
use sha2::Digest;
use tch::{Device, Kind, Tensor, nn};

use crate::error::{Error, Result};
use crate::link::{Scorer, ScorerKind};
use crate::model::{self, ModelConfig, ModelKind};

/// The newest export format this trainer reads. Format 2 is a
/// link-prediction model: its card names a `scorer`, whose parameters are
/// in the weights under `scorer.`; node models keep format 1, which older
/// trainers read.
pub const FORMAT_VERSION: u32 = 2;
/// The format of a node model's export.
pub const NODE_FORMAT_VERSION: u32 = 1;
pub const CARD: &str = "model.json";

/// The weights object of run `run_id`: each export names its own, so two
/// runs exporting to one location never write one object; `model.json`
/// names the one it commits.
pub fn weights_name(run_id: &RunId) -> String {
    format!("model-{run_id}.safetensors")
}

/// How to build the model in PyTorch Geometric: the class in
/// `torch_geometric.nn.models` and its keyword arguments, so that
/// `getattr(models, pyg["class"])(**pyg["kwargs"])` takes the weights with
/// `load_state_dict(..., strict=True)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PygModel {
    pub class: String,
    pub kwargs: serde_json::Map<String, serde_json::Value>,
}

/// `model.json`. Keys name what PyG's constructors call them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelCard {
    pub format_version: u32,
    /// The run that wrote this export (its weights are named after it).
    #[serde(default)]
    pub run_id: String,
    /// sage | gat | mlp.
    pub architecture: ModelKind,
    pub num_layers: usize,
    pub in_channels: i64,
    pub hidden_channels: i64,
    pub out_channels: i64,
    /// Attention heads (GAT only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heads: Option<i64>,
    /// Neighbor aggregation (GraphSAGE: mean; GAT: attention-weighted sum).
    pub aggr: String,
    /// The activation between layers.
    pub act: String,
    pub dropout: f64,
    /// GAT: a residual projection of each destination (PyG's `residual`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub residual: Option<bool>,
    /// GAT: every destination attends to itself (PyG's `add_self_loops`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub add_self_loops: Option<bool>,
    pub pyg: PygModel,
    /// Link prediction: how two nodes' outputs (their embeddings, of
    /// `out_channels`) score as an edge. `mlp`'s parameters are in the
    /// weights under `scorer.`, as a `torch.nn.Sequential` of `Linear(d,
    /// d), ReLU(), Linear(d, d), ReLU(), Linear(d, 1)` names them; `dot` has
    /// none. Absent in node models.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scorer: Option<ScorerKind>,
    /// The dtype of the feature file the model was trained on; the model
    /// itself takes float32 rows.
    pub feature_dtype: String,
    pub dataset_fingerprint: String,
    /// The feature file's fingerprint (its size and 17 sampled blocks,
    /// `offgnn_shared::dataset::file_fingerprint`): the dataset's covers
    /// topology and task only, so that features can be packed again over
    /// the same samples. Empty in exports of older trainers.
    #[serde(default)]
    pub feature_fingerprint: String,
    pub samples_run_sha256: String,
    /// The graph the model was trained on, as the sampler built it from
    /// the edges; inference builds the same unless told otherwise. Absent
    /// in exports of older trainers, or of layouts that do not record it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graph: Option<GraphOptions>,
    pub offgnn_version: String,
    /// Which epoch's parameters these are: `best` (best validation) or `last`.
    pub which: String,
    pub epoch: u32,
    pub valid_acc: f64,
    pub test_acc: f64,
    /// A link-prediction model's epoch: its validation and test MRR (the
    /// accuracies are then the share of pairs scored on their label's
    /// side of 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_mrr: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_mrr: Option<f64>,
    pub parameters: i64,
    pub weights: String,
    pub weights_sha256: String,
}

/// Where the parameters came from, besides the model's shape.
#[derive(Clone, Debug)]
pub struct Provenance {
    pub feature_dtype: String,
    pub dataset_fingerprint: String,
    pub feature_fingerprint: String,
    pub samples_run_sha256: String,
    pub graph: Option<GraphOptions>,
    pub which: String,
    pub epoch: u32,
    pub valid_acc: f64,
    pub test_acc: f64,
    /// A link model's epoch: its validation and test MRR.
    pub mrr: Option<(f64, f64)>,
}

impl ModelCard {
    fn new(
        cfg: &ModelConfig,
        from: &Provenance,
        parameters: i64,
        run_id: &RunId,
        weights_sha256: String,
    ) -> Self {
        let gat = cfg.kind == ModelKind::Gat;
        let act = model::activation(cfg.kind).to_string();
        let mut kwargs = serde_json::Map::new();
        let mut arg = |k: &str, v: serde_json::Value| {
            kwargs.insert(k.to_string(), v);
        };
        arg("in_channels", cfg.in_dim.into());
        arg("hidden_channels", cfg.hidden.into());
        arg("out_channels", cfg.classes.into());
        arg("num_layers", cfg.layers.into());
        arg("dropout", cfg.dropout.into());
        arg("act", act.clone().into());
        let class = match cfg.kind {
            ModelKind::Sage => {
                arg("aggr", "mean".into());
                "GraphSAGE"
            }
            ModelKind::Gat => {
                arg("heads", cfg.heads.into());
                arg("residual", true.into());
                arg("add_self_loops", true.into());
                "GAT"
            }
            ModelKind::Mlp => {
                // PyG's MLP normalises with batch norm unless told not to.
                arg("norm", serde_json::Value::Null);
                "MLP"
            }
        };
        ModelCard {
            format_version: match cfg.scorer {
                Some(_) => FORMAT_VERSION,
                None => NODE_FORMAT_VERSION,
            },
            run_id: run_id.to_string(),
            architecture: cfg.kind,
            num_layers: cfg.layers,
            in_channels: cfg.in_dim,
            hidden_channels: cfg.hidden,
            out_channels: cfg.classes,
            heads: gat.then_some(cfg.heads),
            aggr: aggregation(cfg.kind).into(),
            act,
            dropout: cfg.dropout,
            residual: gat.then_some(true),
            add_self_loops: gat.then_some(true),
            pyg: PygModel {
                class: class.into(),
                kwargs,
            },
            scorer: cfg.scorer,
            feature_dtype: from.feature_dtype.clone(),
            dataset_fingerprint: from.dataset_fingerprint.clone(),
            feature_fingerprint: from.feature_fingerprint.clone(),
            samples_run_sha256: from.samples_run_sha256.clone(),
            graph: from.graph,
            offgnn_version: env!("CARGO_PKG_VERSION").into(),
            which: from.which.clone(),
            epoch: from.epoch,
            valid_acc: from.valid_acc,
            test_acc: from.test_acc,
            valid_mrr: from.mrr.map(|m| m.0),
            test_mrr: from.mrr.map(|m| m.1),
            parameters,
            weights: weights_name(run_id),
            weights_sha256,
        }
    }

    /// Refuses a card whose function is not the one this trainer computes
    /// for its architecture (an edited card, or another tool's): its
    /// weights would load and then be run through another function.
    fn check_function(&self, card_url: &str) -> Result<()> {
        let kind = self.architecture;
        let gat = kind == ModelKind::Gat;
        let expected = [
            ("aggr", self.aggr.clone(), aggregation(kind).to_string()),
            ("act", self.act.clone(), model::activation(kind).to_string()),
            (
                "residual",
                format!("{:?}", self.residual),
                format!("{:?}", gat.then_some(true)),
            ),
            (
                "add_self_loops",
                format!("{:?}", self.add_self_loops),
                format!("{:?}", gat.then_some(true)),
            ),
        ];
        for (key, found, want) in expected {
            if found != want {
                return Err(Error::Checkpoint(format!(
                    "{card_url}: {key} is {found} where this trainer's {kind:?} computes {want}; the card was edited or not written by offgnn"
                )));
            }
        }
        Ok(())
    }

    /// The model configuration this card describes.
    pub fn config(&self) -> ModelConfig {
        ModelConfig {
            kind: self.architecture,
            in_dim: self.in_channels,
            hidden: self.hidden_channels,
            classes: self.out_channels,
            layers: self.num_layers,
            heads: self.heads.unwrap_or(1),
            dropout: self.dropout,
            scorer: self.scorer,
        }
    }
}

/// The neighbor aggregation a model card names for an architecture.
fn aggregation(kind: ModelKind) -> &'static str {
    match kind {
        ModelKind::Sage => "mean",
        ModelKind::Gat => "attention",
        ModelKind::Mlp => "none",
    }
}

/// Copies of named parameters on the CPU, detached: a snapshot that later
/// optimizer steps do not touch.
pub fn snapshot(vs: &nn::VarStore) -> Result<Vec<(String, Tensor)>> {
    let mut named: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .map(|(k, v)| Ok((k, v.f_detach()?.f_to_device(Device::Cpu)?.f_detach_copy()?)))
        .collect::<Result<_>>()?;
    named.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(named)
}

/// Copies `named` into the store's variables; every variable must be there
/// with its shape.
pub fn load_into(vs: &nn::VarStore, named: &HashMap<String, Tensor>, what: &str) -> Result<()> {
    tch::no_grad(|| {
        for (name, mut var) in vs.variables() {
            let saved = named
                .get(&name)
                .ok_or_else(|| Error::Checkpoint(format!("{what}: lacks parameter {name}")))?;
            if saved.size() != var.size() {
                return Err(Error::Checkpoint(format!(
                    "{what}: parameter {name} has shape {:?}, the model needs {:?}",
                    saved.size(),
                    var.size()
                )));
            }
            var.f_copy_(&saved.f_to_device(var.device())?.f_to_kind(var.kind())?)?;
        }
        if named.len() != vs.variables().len() {
            let mut extra: Vec<&String> = named
                .keys()
                .filter(|k| !vs.variables().contains_key(*k))
                .collect();
            extra.sort();
            return Err(Error::Checkpoint(format!(
                "{what}: holds parameters the model does not have: {extra:?}"
            )));
        }
        Ok(())
    })
}

/// The safetensors encoding of `named`: float tensors as float32, integer
/// tensors as int64, little-endian.
fn encode(named: &[(String, Tensor)]) -> Result<Vec<u8>> {
    let mut bufs = Vec::with_capacity(named.len());
    for (name, t) in named {
        let shape: Vec<usize> = t.size().iter().map(|&d| d as usize).collect();
        let t = t.f_to_device(Device::Cpu)?.f_contiguous()?.f_view([-1])?;
        let (dtype, bytes): (safetensors::Dtype, Vec<u8>) = if t.is_floating_point() {
            let values = Vec::<f32>::try_from(&t.f_to_kind(Kind::Float)?)?;
            let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            (safetensors::Dtype::F32, bytes)
        } else {
            let values = Vec::<i64>::try_from(&t.f_to_kind(Kind::Int64)?)?;
            let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            (safetensors::Dtype::I64, bytes)
        };
        bufs.push((name.clone(), dtype, shape, bytes));
    }
    let views = bufs
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Checkpoint(format!("encoding tensors: {e}")))?;
    // `format: pt` is what the Hugging Face tools look for in PyTorch weights.
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::tensor::serialize(views, Some(meta))
        .map_err(|e| Error::Checkpoint(format!("encoding tensors: {e}")))
}

/// Writes `named` as a safetensors file at a local `path`: a temporary
/// name, then a rename, so the file is whole or absent.
pub fn write_tensors(path: &std::path::Path, named: &[(String, Tensor)]) -> Result<()> {
    let bytes = encode(named)?;
    let tmp = path.with_extension("partial");
    std::fs::write(&tmp, bytes).map_err(|e| Error::io(tmp.display(), e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(path.display(), e))
}

/// Decodes safetensors bytes into CPU float32 tensors.
fn decode(bytes: &[u8], what: &str) -> Result<HashMap<String, Tensor>> {
    let st = safetensors::SafeTensors::deserialize(bytes)
        .map_err(|e| Error::Checkpoint(format!("{what}: not a safetensors file: {e}")))?;
    let mut out = HashMap::new();
    for (name, view) in st.tensors() {
        if view.dtype() != safetensors::Dtype::F32 {
            return Err(Error::Checkpoint(format!(
                "{what}: tensor {name} is {:?}, not F32",
                view.dtype()
            )));
        }
        // A NaN or an infinity would turn every prediction it reaches into
        // NaN, which a checksum over the weights does not catch.
        if let Some((i, value)) =
            offgnn_shared::npy::first_non_finite_in(view.data(), offgnn_shared::npy::DType::F32)
        {
            return Err(Error::Checkpoint(format!(
                "{what}: parameter {name} holds {value} (element {i}): the weights are not finite; export a checkpoint of a run that did not diverge"
            )));
        }
        let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
        let t = Tensor::f_from_data_size(view.data(), &shape, Kind::Float)?;
        out.insert(name, t);
    }
    Ok(out)
}

/// Refuses a location that already holds an export, unless `overwrite`;
/// returns the store and the export there (what `overwrite` replaces).
pub fn check_target(location: &str, overwrite: bool) -> Result<(Store, Option<Previous>)> {
    let store = Store::open(location)?;
    let previous = commit::read(&store, CARD)?;
    if !overwrite && previous.is_some() {
        return Err(Error::InvalidArgument(format!(
            "{}: holds an export already (model.json); pass --overwrite to replace it",
            store.url()
        )));
    }
    Ok((store, previous))
}

/// What [`write`] wrote.
#[derive(Clone, Debug, Serialize)]
pub struct Written {
    pub location: String,
    pub weights_bytes: u64,
    pub card: ModelCard,
}

/// Writes the export of `named` (the parameters of a model of `cfg`) to
/// `location`: the weights under this run's name, then `model.json` as the
/// commit, created conditionally. With `overwrite`, the earlier export's
/// card is replaced only while it is still the one this run read, and its
/// weights go only after this export is committed. A run that loses the
/// commit to another removes its weights and fails, naming the winner.
pub fn write(
    location: &str,
    cfg: &ModelConfig,
    named: &[(String, Tensor)],
    from: &Provenance,
    overwrite: bool,
) -> Result<Written> {
    let mut card = None;
    let (location, weights_bytes) =
        write_with(location, named, overwrite, |run_id, sha, parameters| {
            let c = ModelCard::new(cfg, from, parameters, run_id, sha);
            let json = serde_json::to_vec_pretty(&c).expect("model card serializes");
            card = Some(c);
            json
        })?;
    Ok(Written {
        location,
        weights_bytes,
        card: card.expect("the card was made"),
    })
}

/// The card's fields every export has, whatever its model.
#[derive(Deserialize)]
struct Weights {
    weights: String,
}

/// Writes `named` as the weights of this run (`weights_name`), then the
/// card `card` makes of the run id, the weights' SHA-256 and the parameter
/// count, as the commit (see [`write`]); returns the location and the
/// weights' bytes.
pub fn write_with(
    location: &str,
    named: &[(String, Tensor)],
    overwrite: bool,
    card: impl FnOnce(&RunId, String, i64) -> Vec<u8>,
) -> Result<(String, u64)> {
    let (store, previous) = check_target(location, overwrite)?;
    let bytes = encode(named)?;
    let sha = offgnn_shared::store::hex(&sha2::Sha256::digest(&bytes));
    let parameters = named.iter().map(|(_, t)| t.numel() as i64).sum();
    let run_id = RunId::new();
    let weights = weights_name(&run_id);
    let json = card(&run_id, sha, parameters);
    let weights_bytes = bytes.len() as u64;
    if let Err(e) = store.put(&weights, bytes) {
        let _ = store.delete(&weights);
        return Err(e.into());
    }
    match commit::commit(&store, CARD, json, &run_id, previous.as_ref())? {
        commit::Outcome::Committed => {}
        commit::Outcome::Lost { winner } => {
            let removed = usize::from(store.delete(&weights).is_ok());
            return Err(commit::lost(&store.join(CARD), &winner, removed).into());
        }
    }
    // The replaced export's weights, unless (written before run ids) they
    // had the name this one has.
    if let Some(previous) = previous {
        let old_weights = serde_json::from_slice::<Weights>(&previous.body)
            .ok()
            .map(|old| old.weights)
            .filter(|w| *w != weights && !w.contains('/'));
        if let Some(old) = old_weights
            && let Err(e) = store.delete(&old)
        {
            tracing::warn!("could not remove the replaced export's weights: {e}");
        }
        commit::fault_point(commit::REPLACED_REMOVED);
    }
    Ok((store.url().to_string(), weights_bytes))
}

/// An export is a directory: a location that names its card, or any local
/// file, is refused with the directory to pass instead.
pub(crate) fn refuse_a_file(location: &str) -> Result<()> {
    let trimmed = location.trim_end_matches('/');
    let is_file = !trimmed.contains("://") && std::path::Path::new(trimmed).is_file();
    if trimmed.ends_with(CARD) || is_file {
        let dir = trimmed
            .rsplit_once('/')
            .map_or(".", |(dir, _)| if dir.is_empty() { "/" } else { dir });
        return Err(Error::InvalidArgument(format!(
            "{location} is a file; a model is the export's directory (the one holding {CARD}): pass {dir}"
        )));
    }
    Ok(())
}

/// Reads an export: the card (refusing a newer format), then the weights,
/// checked against the card's checksum and loaded into a fresh model of
/// the card's shape on `device`.
pub fn read(location: &str, device: Device) -> Result<(ModelCard, nn::VarStore)> {
    read_with_scorer(location, device).map(|(card, vs, _)| (card, vs))
}

/// [`read`], with a link-prediction model's scorer over the loaded weights.
pub fn read_with_scorer(
    location: &str,
    device: Device,
) -> Result<(ModelCard, nn::VarStore, Option<Scorer>)> {
    refuse_a_file(location)?;
    let store = Store::open_read(location)?;
    let card_url = store.join(CARD);
    if !store.exists(CARD)? {
        return Err(Error::InvalidArgument(format!(
            "{card_url}: no such file; is {} an export (trainer --export or trainer export)?",
            store.url()
        )));
    }
    let raw: serde_json::Value = serde_json::from_slice(&store.get(CARD)?)
        .map_err(|e| Error::Checkpoint(format!("{card_url}: not JSON: {e}")))?;
    let version = raw
        .get("format_version")
        .and_then(serde_json::Value::as_u64)
        .ok_or_else(|| Error::Checkpoint(format!("{card_url}: no format_version")))?;
    let typed = [
        crate::hetero::export::TYPED_FORMAT_VERSION,
        crate::hetero::export::TYPED_LINK_FORMAT_VERSION,
    ];
    if typed.contains(&(version as u32)) {
        return Err(Error::InvalidArgument(format!(
            "{card_url}: a typed graph's model (R-SAGE or R-GAT), which `trainer infer`, `trainer score` and `trainer show-model` read, and this command does not"
        )));
    }
    if version > u64::from(FORMAT_VERSION) {
        return Err(Error::Checkpoint(format!(
            "{card_url}: format version {version} is newer than this trainer reads ({FORMAT_VERSION}); use a newer offgnn"
        )));
    }
    if version == 0 {
        return Err(Error::Checkpoint(format!(
            "{card_url}: format version 0 was never written; not an offgnn model card"
        )));
    }
    let card: ModelCard = serde_json::from_value(raw)
        .map_err(|e| Error::Checkpoint(format!("{card_url}: malformed model card: {e}")))?;
    card.check_function(&card_url)?;
    let (named, weights_url) =
        read_weights(&store, &card_url, (&card.weights, &card.weights_sha256))?;
    let vs = nn::VarStore::new(device);
    let (_net, scorer) = model::build_with_scorer(&vs.root(), &card.config());
    load_into(&vs, &named, &weights_url)?;
    Ok((card, vs, scorer))
}

/// The weights object `name` of the export in `store` (whose card is at
/// `card_url`), checked against the card's `sha256`, decoded; and its URL.
pub(crate) fn read_weights(
    store: &Store,
    card_url: &str,
    (name, sha256): (&str, &str),
) -> Result<(HashMap<String, Tensor>, String)> {
    if name.contains('/') {
        return Err(Error::Checkpoint(format!(
            "{card_url}: names weights {name:?} outside the export"
        )));
    }
    let weights_url = store.join(name);
    let bytes = store.get(name)?;
    let sha = offgnn_shared::store::hex(&sha2::Sha256::digest(&bytes));
    if sha != sha256 {
        return Err(Error::Checkpoint(format!(
            "{weights_url}: SHA-256 {sha} is not the {sha256} that model.json names (another export overwrote it?)"
        )));
    }
    let named = decode(&bytes, &weights_url)?;
    Ok((named, weights_url))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(kind: ModelKind) -> ModelConfig {
        ModelConfig {
            kind,
            in_dim: 6,
            hidden: 8,
            classes: 3,
            layers: 2,
            heads: 2,
            dropout: 0.5,
            scorer: None,
        }
    }

    fn provenance() -> Provenance {
        Provenance {
            feature_dtype: "float32".into(),
            dataset_fingerprint: "fp".into(),
            feature_fingerprint: "ffp".into(),
            samples_run_sha256: "run".into(),
            graph: Some(GraphOptions {
                add_reverse_edges: true,
                dedup_edges: true,
                keep_self_loops: false,
            }),
            which: "best".into(),
            epoch: 3,
            valid_acc: 0.5,
            test_acc: 0.25,
            mrr: None,
        }
    }

    /// Every parameter comes back bit for bit, into a model of the card's
    /// shape; the card names PyG's class and arguments.
    #[test]
    fn an_export_reads_back_exactly() {
        for kind in [ModelKind::Sage, ModelKind::Gat, ModelKind::Mlp] {
            let dir = tempfile::tempdir().unwrap();
            let loc = dir.path().to_str().unwrap();
            let vs = nn::VarStore::new(Device::Cpu);
            let _net = model::build(&vs.root(), &cfg(kind));
            let named = snapshot(&vs).unwrap();
            let w = write(loc, &cfg(kind), &named, &provenance(), false).unwrap();
            let (card, back) = read(loc, Device::Cpu).unwrap();
            assert_eq!(card, w.card);
            // Heads mean nothing to GraphSAGE and the MLP; the card has none.
            let heads = if kind == ModelKind::Gat { 2 } else { 1 };
            assert_eq!(card.config(), ModelConfig { heads, ..cfg(kind) });
            let back = back.variables();
            assert_eq!(back.len(), named.len());
            for (name, t) in &named {
                assert!(t.equal(&back[name]), "{kind:?} {name}");
            }
            let class = card.pyg.class.as_str();
            match kind {
                ModelKind::Sage => assert_eq!(class, "GraphSAGE"),
                ModelKind::Gat => {
                    assert_eq!(class, "GAT");
                    assert_eq!(card.pyg.kwargs["heads"], 2);
                    assert!(named.iter().any(|(n, _)| n == "convs.1.att_src"));
                }
                ModelKind::Mlp => assert_eq!(class, "MLP"),
            }
        }
    }

    /// A second export to the same place is refused without overwrite; a
    /// newer format and weights that are not the card's are refused on read.
    #[test]
    fn bad_exports_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let loc = dir.path().to_str().unwrap();
        let c = cfg(ModelKind::Sage);
        let vs = nn::VarStore::new(Device::Cpu);
        let _net = model::build(&vs.root(), &c);
        let named = snapshot(&vs).unwrap();
        write(loc, &c, &named, &provenance(), false).unwrap();
        let again = write(loc, &c, &named, &provenance(), false).unwrap_err();
        assert!(again.to_string().contains("--overwrite"), "{again}");
        let first = std::fs::read_dir(dir.path()).unwrap().count();
        write(loc, &c, &named, &provenance(), true).unwrap();
        // The replaced export's weights are gone: still one card, one weights.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), first);

        let card_path = dir.path().join(CARD);
        let mut card: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&card_path).unwrap()).unwrap();
        // Format 3 is a typed model's, which this reader names.
        let typed = crate::hetero::export::TYPED_FORMAT_VERSION;
        card["format_version"] = typed.into();
        std::fs::write(&card_path, serde_json::to_vec(&card).unwrap()).unwrap();
        let err = read(loc, Device::Cpu).unwrap_err().to_string();
        assert!(err.contains("a typed graph's model"), "{err}");
        // ... and so is format 4, a typed link-prediction model's.
        let typed_link = crate::hetero::export::TYPED_LINK_FORMAT_VERSION;
        card["format_version"] = typed_link.into();
        std::fs::write(&card_path, serde_json::to_vec(&card).unwrap()).unwrap();
        let err = read(loc, Device::Cpu).unwrap_err().to_string();
        assert!(err.contains("a typed graph's model"), "{err}");
        card["format_version"] = (typed_link + 1).into();
        std::fs::write(&card_path, serde_json::to_vec(&card).unwrap()).unwrap();
        let newer = read(loc, Device::Cpu).unwrap_err().to_string();
        let want = format!("format version {} is newer", typed_link + 1);
        assert!(newer.contains(&want), "{newer}");
        let card_given = read(&format!("{loc}/{CARD}"), Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(
            card_given.contains("is a file; a model is the export's directory")
                && card_given.ends_with(&format!("pass {loc}")),
            "{card_given}"
        );
        card["format_version"] = 0.into();
        std::fs::write(&card_path, serde_json::to_vec(&card).unwrap()).unwrap();
        let zero = read(loc, Device::Cpu).unwrap_err().to_string();
        assert!(
            zero.contains("format version 0 was never written"),
            "{zero}"
        );

        card["format_version"] = 1.into();
        std::fs::write(&card_path, serde_json::to_vec(&card).unwrap()).unwrap();
        let weights_path = dir.path().join(card["weights"].as_str().unwrap());
        let mut weights = std::fs::read(&weights_path).unwrap();
        let last = weights.len() - 1;
        weights[last] ^= 1;
        std::fs::write(&weights_path, weights).unwrap();
        let changed = read(loc, Device::Cpu).unwrap_err().to_string();
        assert!(changed.contains("SHA-256"), "{changed}");
    }

    /// Weights holding a NaN, with a card whose SHA-256 matches them, are
    /// refused on read, naming the parameter.
    #[test]
    fn non_finite_weights_are_refused_naming_the_parameter() {
        let dir = tempfile::tempdir().unwrap();
        let loc = dir.path().to_str().unwrap();
        let c = cfg(ModelKind::Sage);
        let vs = nn::VarStore::new(Device::Cpu);
        let _net = model::build(&vs.root(), &c);
        let mut named = snapshot(&vs).unwrap();
        let (name, t) = &mut named[1];
        let _ = t.view([-1]).get(2).fill_(f64::NAN);
        let name = name.clone();
        write(loc, &c, &named, &provenance(), false).unwrap();
        let err = read(loc, Device::Cpu).unwrap_err().to_string();
        assert!(
            err.contains(&format!("parameter {name} holds NaN (element 2)")),
            "{err}"
        );
    }

    /// A card whose activation, residual or self-loops are not what the
    /// trainer computes for its architecture is refused, naming the key.
    #[test]
    fn a_card_that_names_another_function_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let loc = dir.path().to_str().unwrap();
        let c = cfg(ModelKind::Gat);
        let vs = nn::VarStore::new(Device::Cpu);
        let _net = model::build(&vs.root(), &c);
        write(loc, &c, &snapshot(&vs).unwrap(), &provenance(), false).unwrap();
        let card_path = dir.path().join(CARD);
        let good: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&card_path).unwrap()).unwrap();
        for (key, value) in [
            ("act", serde_json::json!("relu")),
            ("residual", serde_json::json!(false)),
            ("add_self_loops", serde_json::Value::Null),
            ("aggr", serde_json::json!("mean")),
        ] {
            let mut card = good.clone();
            card[key] = value;
            std::fs::write(&card_path, serde_json::to_vec(&card).unwrap()).unwrap();
            let err = read(loc, Device::Cpu).unwrap_err().to_string();
            assert!(err.contains(&format!("{key} is")), "{key}: {err}");
        }
        std::fs::write(&card_path, serde_json::to_vec(&good).unwrap()).unwrap();
        read(loc, Device::Cpu).unwrap();
    }
}
