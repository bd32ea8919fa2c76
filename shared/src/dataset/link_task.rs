//! GraphBolt's `link_prediction` task, read and checked: `train_set` of
//! node pairs (`seeds`, `[N, 2]`), `validation_set` and `test_set` with
//! `seeds`, `labels` (1 a true edge, 0 a negative) and `indexes` (the
//! query each row belongs to). Each evaluation query must hold one positive
//! and at least one negative: MRR and Hits@K rank the positive among them.
//!
//! On a typed graph every set is of one relation `src:relation:dst` (its
//! `type`, as GraphBolt's heterogeneous link tasks name it), the pairs in
//! type-local ids (a source of `src`, a destination of `dst`); they are held
//! here in homogenized ids, as the typed dataset holds its seeds.

use std::path::Path;

use super::checks::{require_integer, resolve};
use super::metadata::{METADATA_FILE, Metadata, SetMeta, read_metadata};
use super::tasks::{LINK_TASK, Split};
use super::typed::TypedDataset;
use crate::error::{Error, Result};
use crate::npy::NpyFile;

/// Node pairs for training.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PairSet {
    pub pairs: Vec<(u32, u32)>,
}

/// Evaluation queries: each positive pair and its negatives.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RankedSet {
    /// Per query, its positive pair.
    pub positives: Vec<(u32, u32)>,
    /// Per query, its negatives: `negatives[offsets[q]..offsets[q + 1]]`.
    pub negatives: Vec<(u32, u32)>,
    pub offsets: Vec<u64>,
}

impl RankedSet {
    /// Queries per batch of `batch_size` pairs: as many whole queries (a
    /// positive and its negatives, at their mean count) as fit, at least one.
    pub fn queries_per_batch(&self, batch_size: usize) -> usize {
        let queries = self.positives.len().max(1);
        let per_query = 1 + self.negatives.len().div_ceil(queries);
        (batch_size / per_query).max(1)
    }

    /// Pairs in a batch of `batch_size` at the most: its queries, each at
    /// the most negatives any query has.
    pub fn most_pairs_per_batch(&self, batch_size: usize) -> u64 {
        let most_negatives = (self.offsets.windows(2))
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or(0);
        self.queries_per_batch(batch_size) as u64 * (1 + most_negatives)
    }
}

/// The task.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkTask {
    pub train: PairSet,
    pub valid: RankedSet,
    pub test: RankedSet,
    /// On a typed graph, the relation whose edges are predicted (an index
    /// into [`TypedDataset::relations`]).
    pub relation: Option<usize>,
}

/// Where a set's pairs may point: each side's first homogenized id and
/// node count, and how to name its type in an error.
struct Ends {
    src: (u64, u64, String),
    dst: (u64, u64, String),
}

impl LinkTask {
    /// A split's items (training pairs, or evaluation queries) and how many
    /// make a batch of `batch_size` pairs.
    pub fn split_items(&self, split: Split, batch_size: usize) -> (u64, usize) {
        let ranked = |set: &RankedSet| {
            (
                set.positives.len() as u64,
                set.queries_per_batch(batch_size),
            )
        };
        match split {
            Split::Train => (self.train.pairs.len() as u64, batch_size),
            Split::Valid => ranked(&self.valid),
            Split::Test => ranked(&self.test),
        }
    }

    /// The `link_prediction` task of the dataset at `root` (`num_nodes`
    /// nodes), or `None` if it has none. Each fault is one error naming
    /// its file.
    pub fn open(root: &Path, num_nodes: u64) -> Result<Option<LinkTask>> {
        let everyone = || (0, num_nodes, String::new());
        Self::open_with(root, |meta_path, set, entry| {
            if entry.node_type.is_some() {
                return Err(Error::dataset(
                    meta_path,
                    format!("link_prediction's {set} is typed, but the graph has one node type"),
                ));
            }
            Ok((
                None,
                Ends {
                    src: everyone(),
                    dst: everyone(),
                },
            ))
        })
    }

    /// The `link_prediction` task of the typed dataset `ds`, or `None` if
    /// it has none: every set of one relation of its graph.
    pub fn open_typed(ds: &TypedDataset) -> Result<Option<LinkTask>> {
        let ends = |t: usize| {
            let n = &ds.node_types[t];
            (n.offset, n.num, format!(" of type '{}'", n.name))
        };
        let mut relation: Option<usize> = None;
        Self::open_with(&ds.root, |meta_path, set, entry| {
            let bad = |fault: String| {
                Error::dataset(meta_path, format!("link_prediction's {set} {fault}"))
            };
            let name = entry.node_type.as_deref().ok_or_else(|| {
                bad("names no relation; on a typed graph each set's type is the relation 'src:relation:dst' it predicts".into())
            })?;
            let r = ds
                .relations
                .iter()
                .position(|r| r.name == name)
                .ok_or_else(|| {
                    bad(format!(
                        "is of relation '{name}', which is not in graph.edges (the graph's are {})",
                        ds.relations
                            .iter()
                            .map(|r| r.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ))
                })?;
            if let Some(first) = relation
                && first != r
            {
                return Err(bad(format!(
                    "is of relation '{name}' but train_set of '{}': the sets of one task predict one relation",
                    ds.relations[first].name
                )));
            }
            relation = Some(r);
            let rel = &ds.relations[r];
            Ok((
                Some(r),
                Ends {
                    src: ends(rel.src),
                    dst: ends(rel.dst),
                },
            ))
        })
    }

    /// The task, each set's entry checked by `ends` (which says the pairs'
    /// relation and where they may point).
    fn open_with(
        root: &Path,
        mut ends: impl FnMut(&Path, &str, &SetMeta) -> Result<(Option<usize>, Ends)>,
    ) -> Result<Option<LinkTask>> {
        let meta_path = root.join(METADATA_FILE);
        let meta: Metadata = read_metadata(&meta_path)?;
        let Some(task) = meta.tasks.iter().find(|t| t.name == LINK_TASK) else {
            return Ok(None);
        };
        let bad = |fault: String| Error::dataset(&meta_path, fault);
        type Files = (Vec<(String, NpyFile)>, Ends);
        let mut relation = None;
        let mut set = |name: &str, set: &Option<Vec<SetMeta>>| -> Result<Files> {
            let Some([entry]) = set.as_deref() else {
                return Err(bad(format!("link_prediction has no {name} of one entry")));
            };
            let (r, ends) = ends(&meta_path, name, entry)?;
            relation = r;
            let files = entry
                .data
                .iter()
                .map(|d| {
                    let f = NpyFile::open(resolve(root, &meta_path, &d.path)?)?;
                    require_integer(&f)?;
                    Ok((d.name.clone(), f))
                })
                .collect::<Result<_>>()?;
            Ok((files, ends))
        };
        let find = |files: &[(String, NpyFile)], set: &str, name: &str| -> Result<Vec<u64>> {
            let (_, f) = files
                .iter()
                .find(|(n, _)| n == name)
                .ok_or_else(|| bad(format!("link_prediction's {set} has no '{name}' data")))?;
            f.read_all_u64()
        };
        let pairs_of = |(files, ends): &Files, set: &str| -> Result<Vec<(u32, u32)>> {
            let (_, f) = files
                .iter()
                .find(|(n, _)| n == "seeds")
                .ok_or_else(|| bad(format!("link_prediction's {set} has no 'seeds' data")))?;
            if f.shape().len() != 2 || f.shape()[1] != 2 {
                return Err(Error::npy(
                    f.path(),
                    format!("node pairs must have shape [N, 2], found {:?}", f.shape()),
                ));
            }
            let ids = f.read_all_u64()?;
            for (i, &v) in ids.iter().enumerate() {
                let (_, num, of_type) = if i % 2 == 0 { &ends.src } else { &ends.dst };
                if v >= *num {
                    return Err(Error::npy(
                        f.path(),
                        format!(
                            "pair {} holds node {v}, out of range for {num} nodes{of_type}",
                            i / 2
                        ),
                    ));
                }
            }
            Ok(ids
                .chunks(2)
                .map(|p| ((p[0] + ends.src.0) as u32, (p[1] + ends.dst.0) as u32))
                .collect())
        };
        let train = set("train_set", &task.train_set)?;
        let train = PairSet {
            pairs: pairs_of(&train, "train_set")?,
        };
        let mut ranked = |name: &str, s: &Option<Vec<SetMeta>>| -> Result<RankedSet> {
            let files = set(name, s)?;
            let pairs = pairs_of(&files, name)?;
            let labels = find(&files.0, name, "labels")?;
            let indexes = find(&files.0, name, "indexes")?;
            ranked_set(&meta_path, name, &pairs, &labels, &indexes)
        };
        let valid = ranked("validation_set", &task.validation_set)?;
        let test = ranked("test_set", &task.test_set)?;
        Ok(Some(LinkTask {
            train,
            valid,
            test,
            relation,
        }))
    }
}

/// Rows grouped into queries by `indexes`: each query's one positive (label
/// 1) and its negatives (label 0).
fn ranked_set(
    meta_path: &Path,
    name: &str,
    pairs: &[(u32, u32)],
    labels: &[u64],
    indexes: &[u64],
) -> Result<RankedSet> {
    let bad =
        |fault: String| Error::dataset(meta_path, format!("link_prediction's {name}: {fault}"));
    if labels.len() != pairs.len() || indexes.len() != pairs.len() {
        return Err(bad(format!(
            "{} pairs, {} labels and {} indexes: one of each per row",
            pairs.len(),
            labels.len(),
            indexes.len()
        )));
    }
    if let Some((row, &l)) = labels.iter().enumerate().find(|(_, l)| **l > 1) {
        return Err(bad(format!(
            "label {l} at row {row}: labels are 1 (edge) or 0 (negative)"
        )));
    }
    // Queries are numbered 0.. and each has at least two rows.
    if let Some((row, &q)) = indexes
        .iter()
        .enumerate()
        .find(|(_, q)| **q >= pairs.len() as u64)
    {
        return Err(bad(format!(
            "index {q} at row {row}: queries are numbered from 0, fewer than the {} rows",
            pairs.len()
        )));
    }
    let queries = indexes.iter().max().map_or(0, |&m| m as usize + 1);
    let mut positive: Vec<Option<(u32, u32)>> = vec![None; queries];
    let mut counts = vec![0u64; queries];
    for (row, (&q, &l)) in indexes.iter().zip(labels).enumerate() {
        let q = q as usize;
        if l == 1 {
            if positive[q].is_some() {
                return Err(bad(format!("query {q} has a second positive at row {row}")));
            }
            positive[q] = Some(pairs[row]);
        } else {
            counts[q] += 1;
        }
    }
    if let Some(q) = (0..queries).find(|&q| positive[q].is_none()) {
        return Err(bad(format!("query {q} has no positive (label 1)")));
    }
    if let Some(q) = (0..queries).find(|&q| counts[q] == 0) {
        return Err(bad(format!(
            "query {q} has no negatives: evaluation ranks each positive against its negatives"
        )));
    }
    let mut offsets = Vec::with_capacity(queries + 1);
    offsets.push(0);
    let mut at = 0;
    for &c in &counts {
        at += c;
        offsets.push(at);
    }
    let mut fill = offsets[..queries].to_vec();
    let mut negatives = vec![(0, 0); at as usize];
    for (row, (&q, &l)) in indexes.iter().zip(labels).enumerate() {
        if l == 0 {
            negatives[fill[q as usize] as usize] = pairs[row];
            fill[q as usize] += 1;
        }
    }
    Ok(RankedSet {
        positives: positive
            .into_iter()
            .map(|p| p.expect("checked above"))
            .collect(),
        negatives,
        offsets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranked(labels: &[u64], indexes: &[u64]) -> Result<RankedSet> {
        let pairs: Vec<(u32, u32)> = (0..labels.len() as u32).map(|i| (0, i)).collect();
        ranked_set(Path::new("m.yaml"), "test_set", &pairs, labels, indexes)
    }

    #[test]
    fn queries_group_each_positive_with_its_negatives_in_any_row_order() {
        let s = ranked(&[0, 1, 0, 1, 0, 0], &[1, 1, 0, 0, 0, 1]).unwrap();
        assert_eq!(s.positives, vec![(0, 3), (0, 1)]);
        assert_eq!(s.offsets, vec![0, 2, 4]);
        assert_eq!(s.negatives, vec![(0, 2), (0, 4), (0, 0), (0, 5)]);
    }

    #[test]
    fn a_query_without_negatives_or_positive_and_bad_labels_are_refused_in_one_line() {
        for (labels, indexes, says) in [
            (vec![1, 1, 0], vec![0, 1, 1], "query 0 has no negatives"),
            (vec![0, 1, 0], vec![0, 1, 1], "query 0 has no positive"),
            (
                vec![1, 1, 0],
                vec![0, 0, 0],
                "query 0 has a second positive at row 1",
            ),
            (vec![1, 2], vec![0, 0], "label 2 at row 1"),
            (vec![1, 0], vec![0], "2 pairs, 2 labels and 1 indexes"),
            (vec![1, 0], vec![0, 7], "index 7 at row 1"),
        ] {
            let e = ranked(&labels, &indexes).unwrap_err().to_string();
            assert!(e.contains(says) && !e.contains('\n'), "{e}");
        }
    }
}
