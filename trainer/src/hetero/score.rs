//! `trainer score` for a typed link-prediction model: its pairs are of the
//! relation it was trained on, in type-local ids (sources of the relation's
//! source type, destinations of its destination type), and each side's
//! embeddings come from that type's parts of `trainer infer --outputs
//! embeddings` with the same model.

use std::time::Instant;

use tch::{Device, Tensor, nn};

use super::Rgnn;
use super::infer::TypedInferSummary;
use crate::error::{Error, Result};
use crate::link::score::{ScoreConfig, ScoreSummary, endpoints, open_pairs, read_embeddings};

/// Scores `cfg.pairs` with the typed model's scorer.
pub fn score_typed(cfg: &ScoreConfig, started: Instant) -> Result<ScoreSummary> {
    let shown = offgnn_shared::store::redact(&cfg.model);
    let (card, named) = super::export::read(&cfg.model)?;
    let (Some(kind), Some(relation)) = (card.scorer, card.link_relation.clone()) else {
        return Err(Error::InvalidArgument(format!(
            "{shown}: a node-classification model; `trainer score` scores pairs with a link-prediction model's scorer"
        )));
    };
    let summary: TypedInferSummary = crate::link::score::committed(
        cfg,
        |s: &TypedInferSummary| &s.weights_sha256,
        &card.weights_sha256,
    )?;
    // The model whole, as exported, for its scorer.
    let mut offset = 0;
    let types: Vec<(String, u64, u64)> = summary
        .node_types
        .iter()
        .map(|t| {
            offset += t.nodes;
            (t.name.clone(), offset - t.nodes, t.nodes)
        })
        .collect();
    let (schema, model_cfg) = card.model(types)?;
    let vs = nn::VarStore::new(Device::Cpu);
    let model = Rgnn::new(&vs.root(), &schema, &model_cfg)?;
    crate::export::load_into(&vs, &named, &shown)?;
    let scorer = model.scorer().expect("a link model has a scorer");
    // The relation's endpoint types.
    let ends: Vec<&str> = relation.split(':').collect();
    let [src_type, _, dst_type] = ends[..] else {
        return Err(Error::InvalidArgument(format!(
            "{shown}: link relation '{relation}' is not src:relation:dst"
        )));
    };
    let pairs = open_pairs(&cfg.pairs)?;
    let width = card.hidden_channels as usize;
    let mut table = Vec::new();
    let mut sides = Vec::with_capacity(2);
    for (side, name) in [src_type, dst_type].into_iter().enumerate() {
        let t = summary
            .node_types
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{}: holds no rows of node type '{name}'",
                    offgnn_shared::store::redact(&cfg.embeddings)
                ))
            })?;
        let ids = endpoints(&pairs, Some(side), t.nodes)?;
        let prefix = format!("{}/{name}/", summary.run_id);
        let files: Vec<String> = (summary.files.iter())
            .filter(|f| f.starts_with(&prefix))
            .cloned()
            .collect();
        let of_type = format!(" of type '{name}'");
        table.extend(read_embeddings(
            cfg,
            &files,
            &ids,
            width,
            (t.nodes_written, &of_type),
        )?);
        sides.push(ids);
    }
    let held = (sides[0].len() + sides[1].len()) as i64;
    let rows = Tensor::f_from_slice(&table)?.f_view([held, width as i64])?;
    let first_dst = sides[0].len() as i64;
    let position = |side: usize, v: u64| {
        let at = sides[side].binary_search(&v).expect("an endpoint") as i64;
        if side == 0 { at } else { first_dst + at }
    };
    crate::link::score::write_scores(cfg, &pairs, (scorer, &rows), &position)?;
    Ok(ScoreSummary {
        model: shown,
        scorer: kind.name().into(),
        embeddings: offgnn_shared::store::redact(&cfg.embeddings),
        pairs: pairs.shape()[0],
        endpoints: held as u64,
        embedding_width: width as u64,
        embedding_bytes: table.len() as u64 * 4,
        out: cfg.out.display().to_string(),
        seconds: started.elapsed().as_secs_f64(),
    })
}
