//! What a sampling run is asked to do: its flags as one value, checked
//! before any work starts, and the sampling parameters a run records.

use offgnn_shared::dataset::Split;
use offgnn_shared::samples::SamplingParams;

use crate::error::{Error, Result};
use crate::topology::CsrOptions;

/// Pairs per link-prediction evaluation batch at the least, unless given.
pub const LINK_EVAL_PAIRS: usize = 4096;

/// What one sampling run (or one shard of it) is to do.
#[derive(Clone, Debug)]
pub struct SampleConfig {
    pub dataset: std::path::PathBuf,
    pub out: String,
    /// Per layer, input layer first; a typed graph's: the most any
    /// relation draws.
    pub fanouts: Vec<usize>,
    /// A typed graph: per layer, each relation's fan-out (see
    /// [`resolve_fanouts`]); empty for one edge type.
    pub relation_fanouts: Vec<Vec<usize>>,
    pub batch_size: usize,
    /// Validation and test batches: seeds, or a link task's pairs (whole
    /// queries, one at the least); `None`: `batch_size`.
    pub eval_batch_size: Option<usize>,
    pub epochs: u32,
    pub seed: u64,
    pub threads: usize,
    pub shard: u32,
    pub num_shards: u32,
    pub overwrite: bool,
    pub batches_per_file: u32,
    pub csr: CsrOptions,
    pub show_progress: bool,
    /// Refuse to start when the stated peak memory exceeds this.
    pub memory_limit: Option<u64>,
    /// Link prediction (`--task link`): the dataset's link_prediction task
    /// instead of its node classification.
    pub link: Option<LinkOptions>,
}

/// How link-prediction training batches draw their negatives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkOptions {
    /// Negatives per positive pair.
    pub negatives: u32,
    pub sampler: NegativeKind,
}

/// Where a negative's destination comes from.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum NegativeKind {
    /// Uniformly among the nodes.
    Uniform,
    /// In proportion to degree^0.75.
    Degree,
}

/// The fan-outs of `--fanout` for the dataset at `dataset`: one list for a
/// graph of one edge type; for a typed graph, a list for every relation
/// and `REL=LIST` overrides, resolved per layer and relation (returned
/// second, with the per-layer most first).
pub fn resolve_fanouts(
    specs: &[String],
    dataset: &std::path::Path,
) -> Result<(Vec<usize>, Vec<Vec<usize>>)> {
    if !offgnn_shared::dataset::is_typed(dataset)? {
        return match specs {
            [one] if !one.contains('=') => Ok((parse_fanouts(one)?, Vec::new())),
            _ => Err(Error::InvalidArgument(format!(
                "--fanout {}: a graph of one edge type takes one list (REL=LIST names a relation of a typed graph)",
                specs.join(" --fanout ")
            ))),
        };
    }
    let meta = offgnn_shared::dataset::Metadata::read(dataset)?;
    let relations: Vec<String> = meta
        .graph
        .edges
        .iter()
        .map(|e| e.edge_type.clone().unwrap_or_default())
        .collect();
    let layers = crate::typed_sampling::RelationFanouts::parse(specs, &relations)?.layers;
    let most = layers
        .iter()
        .map(|l| l.iter().copied().max().unwrap_or(0))
        .collect();
    Ok((most, layers))
}

/// Parses `10,15,20`: positive fan-outs, input layer first.
pub fn parse_fanouts(text: &str) -> Result<Vec<usize>> {
    if text.trim().is_empty() {
        return Err(Error::InvalidArgument(
            "--fanout is empty: give one fan-out per layer, e.g. 10,15,20".into(),
        ));
    }
    let parts: Vec<&str> = text.split(',').map(str::trim).collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(Error::InvalidArgument(format!(
            "--fanout {text}: a layer's fan-out is missing between commas"
        )));
    }
    parts
        .iter()
        .map(|p| match p.parse::<usize>() {
            Ok(0) => Err(Error::InvalidArgument(format!(
                "--fanout {text}: a fan-out of 0 samples nothing"
            ))),
            Ok(k) => Ok(k),
            Err(_) => Err(Error::InvalidArgument(format!(
                "--fanout {text}: '{p}' is not a positive integer"
            ))),
        })
        .collect()
}

impl SampleConfig {
    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if self.fanouts.is_empty() || self.fanouts.contains(&0) {
            return bad("fan-outs must be a non-empty list of positive integers".into());
        }
        if self.batch_size == 0 {
            return bad("--batch-size must be at least 1".into());
        }
        if self.eval_batch_size == Some(0) {
            return bad("--eval-batch-size must be at least 1".into());
        }
        if self.epochs == 0 {
            return bad("--epochs must be at least 1".into());
        }
        if self.num_shards == 0 {
            return bad("--num-shards must be at least 1".into());
        }
        if self.shard >= self.num_shards {
            return bad(format!(
                "--shard {} is out of range for --num-shards {} (shards are 0..{})",
                self.shard, self.num_shards, self.num_shards
            ));
        }
        if self.batches_per_file == 0 {
            return bad("--batches-per-file must be at least 1".into());
        }
        if self.link.is_some_and(|l| l.negatives == 0) {
            return bad("--negatives must be at least 1: a link-prediction batch scores its pairs against negatives".into());
        }
        if self.threads == 0 {
            return bad("--threads must be at least 1".into());
        }
        Ok(())
    }

    /// Seeds (or a link task's pairs) per batch of `split`.
    pub fn batch_size_for(&self, split: Split) -> usize {
        match split {
            Split::Train => self.batch_size,
            Split::Valid | Split::Test => self.eval_batch_size.unwrap_or(self.batch_size),
        }
    }

    pub(crate) fn params(&self) -> SamplingParams {
        SamplingParams {
            fanouts: self.fanouts.clone(),
            relation_fanouts: self.relation_fanouts.clone(),
            batch_size: self.batch_size,
            eval_batch_size: self.eval_batch_size.filter(|&size| size != self.batch_size),
            epochs: self.epochs,
            seed: self.seed,
            batches_per_file: self.batches_per_file,
            add_reverse_edges: self.csr.add_reverse,
            dedup_edges: self.csr.dedup,
            keep_self_loops: self.csr.keep_self_loops,
            link: self.link.map(|l| offgnn_shared::samples::LinkParams {
                negatives: l.negatives,
                negative_sampler: match l.sampler {
                    NegativeKind::Uniform => "uniform",
                    NegativeKind::Degree => "degree",
                }
                .into(),
            }),
        }
    }
}
