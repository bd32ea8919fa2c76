//! `trainer score`: a link-prediction model's scores for given node pairs,
//! from the embeddings `trainer infer --outputs embeddings` wrote with the
//! same model. Only the pairs' endpoints' embeddings are held; the pairs
//! stream through in chunks, and the scores go to a `.npy` file that is
//! whole or absent. A typed model's pairs are of its relation, in
//! type-local ids: sources of its source type, destinations of its
//! destination type ([`crate::hetero::score`]).

use std::path::{Path, PathBuf};
use std::time::Instant;

use arrow::array::{Array, FixedSizeListArray, Float32Array, UInt64Array};
use offgnn_shared::npy::{DType, NpyFile, NpyWriter};
use offgnn_shared::store::Store;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde::Serialize;
use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};
use crate::export::{self, ModelCard};
use crate::inference::{COMMIT, InferSummary};

/// Pairs scored at once.
const CHUNK: u64 = 1 << 20;

/// What `trainer score` is asked to do.
#[derive(Clone, Debug)]
pub struct ScoreConfig {
    /// The export of a link-prediction model.
    pub model: String,
    /// The committed output of `trainer infer --outputs embeddings` with it.
    pub embeddings: String,
    /// A `.npy` of node pairs, `[N, 2]`, any integer type.
    pub pairs: PathBuf,
    /// Where the scores go: a `.npy` of `N` float32 logits.
    pub out: PathBuf,
    pub overwrite: bool,
}

/// What a `trainer score` run did.
#[derive(Clone, Debug, Serialize)]
pub struct ScoreSummary {
    pub model: String,
    pub scorer: String,
    pub embeddings: String,
    pub pairs: u64,
    /// Distinct nodes among the pairs, whose embeddings were held.
    pub endpoints: u64,
    pub embedding_width: u64,
    /// Bytes of the endpoints' embeddings held in memory.
    pub embedding_bytes: u64,
    pub out: String,
    pub seconds: f64,
}

/// Scores every pair of `cfg.pairs` with the model's scorer over the
/// embeddings at `cfg.embeddings`.
pub fn score(cfg: &ScoreConfig) -> Result<ScoreSummary> {
    let started = Instant::now();
    if cfg.out.exists() && !cfg.overwrite {
        return Err(Error::InvalidArgument(format!(
            "{}: exists; pass --overwrite to replace it",
            cfg.out.display()
        )));
    }
    if crate::hetero::infer::is_typed_model(&cfg.model)? {
        return crate::hetero::score::score_typed(cfg, started);
    }
    let (card, _vs, scorer) = export::read_with_scorer(&cfg.model, Device::Cpu)?;
    let (Some(kind), Some(scorer)) = (card.scorer, scorer) else {
        return Err(Error::InvalidArgument(format!(
            "{}: a node-classification model; `trainer score` scores pairs with a link-prediction model's scorer",
            offgnn_shared::store::redact(&cfg.model)
        )));
    };
    let pairs = open_pairs(&cfg.pairs)?;
    let n = pairs.shape()[0];
    let summary = infer_summary(cfg, &card)?;
    let endpoints = endpoints(&pairs, None, summary.num_nodes)?;
    let width = card.out_channels as usize;
    let written = (summary.nodes_written, "");
    let table = read_embeddings(cfg, &summary.files, &endpoints, width, written)?;
    let rows = Tensor::f_from_slice(&table)?.f_view([endpoints.len() as i64, width as i64])?;
    let position = |_: usize, v: u64| endpoints.binary_search(&v).expect("an endpoint") as i64;
    write_scores(cfg, &pairs, (&scorer, &rows), &position)?;
    Ok(ScoreSummary {
        model: offgnn_shared::store::redact(&cfg.model),
        scorer: kind.name().into(),
        embeddings: offgnn_shared::store::redact(&cfg.embeddings),
        pairs: n,
        endpoints: endpoints.len() as u64,
        embedding_width: width as u64,
        embedding_bytes: table.len() as u64 * 4,
        out: cfg.out.display().to_string(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Scores every pair of `pairs` with `scorer` over `rows`, where
/// `position(side, id)` is a pair's endpoint's row (side 0 its source, 1
/// its destination), into `cfg.out` (whole or absent), in chunks.
pub(crate) fn write_scores(
    cfg: &ScoreConfig,
    pairs: &NpyFile,
    (scorer, rows): (&super::Scorer, &Tensor),
    position: &dyn Fn(usize, u64) -> i64,
) -> Result<()> {
    let n = pairs.shape()[0];
    let parent = cfg.out.parent().filter(|p| !p.as_os_str().is_empty());
    if let Some(dir) = parent.filter(|p| !p.is_dir()) {
        return Err(Error::InvalidArgument(format!(
            "--out {}: {} is not a directory",
            cfg.out.display(),
            dir.display()
        )));
    }
    let tmp = cfg.out.with_extension("npy.partial");
    let mut w = NpyWriter::create(&tmp, DType::F32, &[n])?;
    let mut at = 0;
    while at < n {
        offgnn_shared::signals::check()?;
        let count = CHUNK.min(n - at);
        let ids = pairs.read_u64(2 * at, 2 * count as usize)?;
        let src: Vec<i64> = ids.iter().step_by(2).map(|&v| position(0, v)).collect();
        let dst: Vec<i64> = ids
            .iter()
            .skip(1)
            .step_by(2)
            .map(|&v| position(1, v))
            .collect();
        let scores = tch::no_grad(|| {
            scorer.score(rows, &Tensor::from_slice(&src), &Tensor::from_slice(&dst))
        })?;
        let values = Vec::<f32>::try_from(&scores.f_to_kind(Kind::Float)?)?;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        w.write_bytes(&bytes)?;
        at += count;
    }
    w.finish()?;
    std::fs::rename(&tmp, &cfg.out).map_err(|e| Error::io(cfg.out.display(), e))?;
    Ok(())
}

/// The pairs file, checked: integers of shape `[N, 2]`.
pub(crate) fn open_pairs(path: &Path) -> Result<NpyFile> {
    let f = NpyFile::open(path)?;
    if !f.dtype().is_integer() || f.shape().len() != 2 || f.shape()[1] != 2 {
        return Err(Error::InvalidArgument(format!(
            "{}: node pairs must be integers of shape [N, 2], found {} of shape {:?}",
            path.display(),
            f.dtype(),
            f.shape()
        )));
    }
    Ok(f)
}

/// The commit of the embeddings (a summary of `trainer infer`'s, whose
/// weights `weights_of` gives), checked to be of the model whose weights
/// are `weights_sha256`.
pub(crate) fn committed<T: serde::de::DeserializeOwned>(
    cfg: &ScoreConfig,
    weights_of: impl Fn(&T) -> &str,
    weights_sha256: &str,
) -> Result<T> {
    let store = Store::open_read(&cfg.embeddings)?;
    let shown = offgnn_shared::store::redact(&cfg.embeddings);
    let commit = offgnn_shared::commit::read(&store, COMMIT)?.ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{shown}: no {COMMIT}; is it the output of `trainer infer --outputs embeddings`?"
        ))
    })?;
    let summary: T = serde_json::from_slice(&commit.body).map_err(|e| {
        Error::InvalidArgument(format!(
            "{shown}/{COMMIT}: not the output of a model of this kind ({e})"
        ))
    })?;
    if weights_of(&summary) != weights_sha256 {
        return Err(Error::InvalidArgument(format!(
            "{shown}: holds another model's output (weights {}), not {}'s; run trainer infer --outputs embeddings with this model",
            weights_of(&summary),
            offgnn_shared::store::redact(&cfg.model)
        )));
    }
    Ok(summary)
}

/// The commit of the embeddings, checked to be this model's embeddings.
fn infer_summary(cfg: &ScoreConfig, card: &ModelCard) -> Result<InferSummary> {
    let shown = offgnn_shared::store::redact(&cfg.embeddings);
    let summary: InferSummary = committed(
        cfg,
        |s: &InferSummary| &s.weights_sha256,
        &card.weights_sha256,
    )?;
    if summary.columns != ["node_id", "embedding"] {
        return Err(Error::InvalidArgument(format!(
            "{shown}: has columns {:?}, not a link model's node_id and embedding",
            summary.columns
        )));
    }
    Ok(summary)
}

/// The distinct nodes of the pairs (of one `side`, 0 the sources and 1 the
/// destinations, or both), sorted, each below `num_nodes`.
pub(crate) fn endpoints(pairs: &NpyFile, side: Option<usize>, num_nodes: u64) -> Result<Vec<u64>> {
    let n = pairs.shape()[0];
    let mut seen = vec![0u64; num_nodes.div_ceil(64) as usize];
    let mut at = 0;
    while at < n {
        let count = CHUNK.min(n - at);
        let ids = pairs.read_u64(2 * at, 2 * count as usize)?;
        for (i, &v) in ids.iter().enumerate() {
            if side.is_some_and(|s| s != i % 2) {
                continue;
            }
            if v >= num_nodes {
                return Err(Error::InvalidArgument(format!(
                    "{}: pair {} holds node {v}, out of range for the {num_nodes} nodes the embeddings are of",
                    pairs.path().display(),
                    at + i as u64 / 2
                )));
            }
            seen[(v / 64) as usize] |= 1 << (v % 64);
        }
        at += count;
    }
    Ok((0..num_nodes)
        .filter(|&v| seen[(v / 64) as usize] >> (v % 64) & 1 == 1)
        .collect())
}

/// The embeddings of `endpoints` (sorted), row by row, read from the
/// output's parts `files`; `written` says how many rows they hold (of what
/// type) where one is missing.
pub(crate) fn read_embeddings(
    cfg: &ScoreConfig,
    files: &[String],
    endpoints: &[u64],
    width: usize,
    written: (u64, &str),
) -> Result<Vec<f32>> {
    let store = Store::open_read(&cfg.embeddings)?;
    let mut table = vec![0f32; endpoints.len() * width];
    let mut found = vec![false; endpoints.len()];
    let bad = |name: &str, what: String| {
        Error::InvalidArgument(format!(
            "{}: {what}",
            offgnn_shared::store::redact(&store.join(name))
        ))
    };
    for name in files {
        let bytes = store.get(name)?;
        let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
            .and_then(|b| b.build())
            .map_err(|e| bad(name, e.to_string()))?;
        for batch in reader {
            let batch = batch.map_err(|e| bad(name, e.to_string()))?;
            let ids = batch
                .column_by_name("node_id")
                .and_then(|c| c.as_any().downcast_ref::<UInt64Array>());
            let emb = batch
                .column_by_name("embedding")
                .and_then(|c| c.as_any().downcast_ref::<FixedSizeListArray>());
            let (Some(ids), Some(emb)) = (ids, emb) else {
                return Err(bad(name, "no node_id or embedding column".into()));
            };
            let values = emb.values().as_any().downcast_ref::<Float32Array>();
            let Some(values) = values.filter(|_| emb.value_length() as usize == width) else {
                return Err(bad(
                    name,
                    format!("embeddings are not float32 rows of {width}"),
                ));
            };
            let values = values.values();
            for (r, &v) in ids.values().iter().enumerate() {
                if let Ok(k) = endpoints.binary_search(&v) {
                    let at = (emb.offset() + r) * width;
                    table[k * width..][..width].copy_from_slice(&values[at..at + width]);
                    found[k] = true;
                }
            }
        }
    }
    if let Some(k) = found.iter().position(|f| !f) {
        return Err(Error::InvalidArgument(format!(
            "{}: node {}{} of the pairs has no embedding there (trainer infer wrote {} nodes; run it with --nodes all)",
            offgnn_shared::store::redact(&cfg.embeddings),
            endpoints[k],
            written.1,
            written.0
        )));
    }
    Ok(table)
}
