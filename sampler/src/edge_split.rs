//! Link prediction's task from a graph alone (issue 38): `sampler
//! split-edges` holds out a share of the edges for validation and test,
//! removes them (both directions) from the training graph, and writes a
//! new dataset whose `link_prediction` task has GraphBolt's layout:
//! `train_set` of node pairs (`seeds`, `[N, 2]`), `validation_set` and
//! `test_set` each with `seeds`, `labels` (1 for the held-out edge, 0 for
//! its negatives) and `indexes` (the positive each row belongs to), each
//! positive followed by its negatives.
//!
//! An edge is a node pair whatever its direction: a graph that stores
//! each edge both ways holds out both, and the training pairs are its
//! pairs once each, in the direction first stored. Self-loops stay in the
//! training graph and are never held out. Negatives keep the positive's
//! source and draw the destination uniformly among the nodes that are
//! neither it nor its neighbour (OGB's corruption of the tail). Everything
//! follows from `--seed`.
//!
//! On a typed graph one relation `src:relation:dst` is split (`--relation`):
//! its held-out pairs leave it and its reverse relation (`--reverse`, by
//! default `dst:rev_relation:src` where the graph has it), negatives are
//! drawn among the destination type's nodes, and the task's sets name the
//! relation as their type, the pairs in type-local ids, as GraphBolt's
//! heterogeneous link tasks hold them. Every other file is the input's.

use std::collections::HashSet;
use std::ops::Range;
use std::path::Path;
use std::time::Instant;

use offgnn_shared::dataset::{
    Dataset, DatasetSpec, DatasetWriter, EdgeList, EdgeMeta, Metadata, SetDataMeta, SetMeta, Split,
    TaskMeta, TypedDataset, is_typed, layout,
};
use offgnn_shared::npy::{DType, NpyWriter};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::Serialize;

use crate::derived_features::link_or_copy;
use crate::error::{Error, Result};

/// The random stream of the split, apart from sampling's.
const SPLIT_STREAM: u64 = 0x6c70_5f73_706c_6974;

/// The undirected key of a node pair: the same whichever way it is stored.
pub(crate) fn pair_key(u: u32, v: u32) -> u64 {
    let (a, b) = if u <= v { (u, v) } else { (v, u) };
    (u64::from(a) << 32) | u64::from(b)
}

/// How the edges are split.
#[derive(Clone, Debug)]
pub struct SplitConfig {
    /// Shares of the node pairs held out for validation and test.
    pub valid: f64,
    pub test: f64,
    /// Negatives drawn for each held-out pair.
    pub negatives: u32,
    pub seed: u64,
    /// Typed graphs: the relation `src:relation:dst` to split, and its
    /// reverse where it is not `dst:rev_relation:src`.
    pub relation: Option<String>,
    pub reverse: Option<String>,
}

impl SplitConfig {
    /// Refuses shares outside `[0, 1)` that leave no training pair, and
    /// evaluation without negatives, in one line.
    pub fn check(&self) -> Result<(), String> {
        for (flag, v) in [("--valid", self.valid), ("--test", self.test)] {
            if !(0.0..1.0).contains(&v) {
                return Err(format!("{flag} {v} is not a share in [0, 1)"));
            }
        }
        if self.valid + self.test >= 1.0 {
            return Err(format!(
                "--valid {} and --test {} hold out every edge: none would be left to train on",
                self.valid, self.test
            ));
        }
        if self.negatives == 0 {
            return Err("--negatives must be at least 1: validation and test rank each held-out edge against its negatives".into());
        }
        Ok(())
    }
}

/// Held-out pairs and their negatives.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Held {
    pub pairs: Vec<(u32, u32)>,
    /// `negatives` destinations per pair, pair by pair.
    pub negatives: Vec<u32>,
}

/// The split.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct EdgeSplit {
    /// The training graph's edges, as stored, less the held-out pairs.
    pub train_edges: Vec<(u32, u32)>,
    /// The training graph's node pairs, once each (self-loops apart).
    pub train_pairs: Vec<(u32, u32)>,
    pub valid: Held,
    pub test: Held,
}

/// Splits `edges` as `cfg` says, drawing negatives' destinations from
/// `targets` (every node of a graph of one type; the destination type's
/// homogenized ids on a typed graph).
pub fn split_edges(edges: &[(u32, u32)], targets: Range<u32>, cfg: &SplitConfig) -> EdgeSplit {
    // Each pair once, in the direction it was first stored.
    let mut first: Vec<(u64, usize)> = edges
        .iter()
        .enumerate()
        .filter(|(_, (u, v))| u != v)
        .map(|(i, &(u, v))| (pair_key(u, v), i))
        .collect();
    first.sort_unstable();
    first.dedup_by_key(|(k, _)| *k);
    let keys: Vec<u64> = first.iter().map(|&(k, _)| k).collect();
    let mut order: Vec<usize> = (0..first.len()).collect();
    let mut rng = Pcg64Mcg::seed_from_u64(cfg.seed ^ SPLIT_STREAM);
    order.shuffle(&mut rng);
    let n = first.len() as f64;
    let n_valid = (cfg.valid * n).round() as usize;
    let n_test = ((cfg.test * n).round() as usize).min(first.len() - n_valid);
    let mut held_out = vec![false; first.len()];
    for &j in &order[..n_valid + n_test] {
        held_out[j] = true;
    }
    let is_held = |u: u32, v: u32| {
        u != v
            && keys
                .binary_search(&pair_key(u, v))
                .is_ok_and(|j| held_out[j])
    };
    let train_edges = edges
        .iter()
        .copied()
        .filter(|&(u, v)| !is_held(u, v))
        .collect();
    let mut kept: Vec<usize> = first
        .iter()
        .zip(&held_out)
        .filter(|(_, h)| !**h)
        .map(|(&(_, i), _)| i)
        .collect();
    kept.sort_unstable();
    let train_pairs = kept.into_iter().map(|i| edges[i]).collect();
    let held = |picks: &[usize], rng: &mut Pcg64Mcg| {
        let mut picks = picks.to_vec();
        picks.sort_unstable_by_key(|&j| first[j].1);
        let pairs: Vec<(u32, u32)> = picks.iter().map(|&j| edges[first[j].1]).collect();
        let mut negatives = Vec::with_capacity(pairs.len() * cfg.negatives as usize);
        for &(u, v) in &pairs {
            for _ in 0..cfg.negatives {
                negatives.push(negative(u, v, targets.clone(), &keys, rng));
            }
        }
        Held { pairs, negatives }
    };
    let valid = held(&order[..n_valid], &mut rng);
    let test = held(&order[n_valid..n_valid + n_test], &mut rng);
    EdgeSplit {
        train_edges,
        train_pairs,
        valid,
        test,
    }
}

/// Refuses more negatives per held-out edge than there are other
/// destinations to draw (`others`: the candidates less the positive and,
/// where it is one, the source): they would repeat.
fn enough_negatives(negatives: u32, others: u64, what: &str) -> Result<()> {
    if u64::from(negatives) > others {
        return Err(Error::InvalidArgument(format!(
            "--negatives {negatives}: a held-out edge has at most {others} other {what} to rank against; ask for at most that many"
        )));
    }
    Ok(())
}

/// A destination in `targets` for source `u` that is neither `v`, `u` nor
/// a neighbour of `u` in the whole graph; after 64 draws that all hit one
/// (a node joined to nearly every other), any node but `v`.
fn negative(u: u32, v: u32, targets: Range<u32>, keys: &[u64], rng: &mut Pcg64Mcg) -> u32 {
    let mut w = v;
    for _ in 0..64 {
        w = rng.random_range(targets.clone());
        if w != u && w != v && keys.binary_search(&pair_key(u, w)).is_err() {
            return w;
        }
    }
    if w == v {
        targets.start + (v - targets.start + 1) % targets.len() as u32
    } else {
        w
    }
}

/// What `split-edges` wrote.
#[derive(Debug, Serialize)]
pub struct SplitSummary {
    pub num_nodes: u64,
    /// Typed graphs: the relation split, and the reverse relation that lost
    /// the held-out pairs too (if the graph has one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relation: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reverse: Option<String>,
    /// Edges as stored in the input, and in the training graph.
    pub edges: u64,
    pub train_edges: u64,
    /// Node pairs (self-loops apart): for training, validation and test.
    pub train_pairs: u64,
    pub valid_pairs: u64,
    pub test_pairs: u64,
    pub negatives: u32,
    pub seconds: f64,
}

impl SplitSummary {
    /// The summary of `split` (of `edges` edges over `num_nodes` nodes),
    /// the typed graph's relation and reverse named.
    fn of(
        (num_nodes, edges): (u64, usize),
        split: &EdgeSplit,
        cfg: &SplitConfig,
        (relation, reverse): (Option<String>, Option<String>),
        started: Instant,
    ) -> SplitSummary {
        SplitSummary {
            num_nodes,
            relation,
            reverse,
            edges: edges as u64,
            train_edges: split.train_edges.len() as u64,
            train_pairs: split.train_pairs.len() as u64,
            valid_pairs: split.valid.pairs.len() as u64,
            test_pairs: split.test.pairs.len() as u64,
            negatives: cfg.negatives,
            seconds: started.elapsed().as_secs_f64(),
        }
    }
}

/// Splits the edges of the dataset at `dataset` as `cfg` says and writes
/// the dataset with the training graph and the `link_prediction` task to
/// `out` (whole or not at all; `overwrite` replaces a dataset this program
/// wrote). The features are the input's, hard-linked (copied where the two
/// are on different filesystems); its node-classification task is carried
/// over.
pub fn split_dataset(
    dataset: &Path,
    out: &Path,
    cfg: &SplitConfig,
    overwrite: bool,
    show_progress: bool,
) -> Result<SplitSummary> {
    cfg.check().map_err(Error::InvalidArgument)?;
    if is_typed(dataset)? {
        return split_typed(dataset, out, cfg, overwrite, show_progress);
    }
    if let Some(r) = &cfg.relation {
        return Err(Error::InvalidArgument(format!(
            "--relation {r}: {} has one edge type; --relation names the relation to split on typed graphs",
            dataset.display()
        )));
    }
    let started = Instant::now();
    let ds = Dataset::open(dataset)?;
    if ds.num_nodes < 3 {
        return Err(Error::InvalidArgument(format!(
            "{}: {} nodes leave no negative for a held-out edge",
            dataset.display(),
            ds.num_nodes
        )));
    }
    enough_negatives(cfg.negatives, ds.num_nodes - 2, "nodes")?;
    let edges = read_edges(&ds.edges, (0, 0), show_progress)?;
    let split = split_edges(&edges, 0..ds.num_nodes as u32, cfg);
    let writer = DatasetWriter::create(out, overwrite)?;
    write_edges(&writer.path(layout::EDGES), &split.train_edges, (0, 0))?;
    link_or_copy(ds.features.path(), &writer.path(layout::FEATURES))?;
    // The node-classification task carried over, where there is one.
    for s in Split::ALL.into_iter().filter(|_| ds.num_classes > 0) {
        let set = ds.split(s);
        let seeds: Vec<u64> = set.seeds.iter().map(|&v| u64::from(v)).collect();
        let labels: Vec<u64> = set.labels.iter().map(|&v| u64::from(v)).collect();
        writer.write_split(s, &seeds, &labels)?;
    }
    write_task(&writer, &split, cfg.negatives, (0, 0))?;
    writer.commit(&DatasetSpec {
        name: format!("{}-split-edges", ds.name),
        num_nodes: ds.num_nodes,
        num_classes: ds.num_classes,
        node_labels: false,
        extra_tasks: vec![link_task(None)],
    })?;
    Ok(SplitSummary::of(
        (ds.num_nodes, edges.len()),
        &split,
        cfg,
        (None, None),
        started,
    ))
}

/// [`split_dataset`] on a typed graph: `cfg.relation` split, the held-out
/// pairs taken out of it and of its reverse, every other file the input's.
fn split_typed(
    dataset: &Path,
    out: &Path,
    cfg: &SplitConfig,
    overwrite: bool,
    show_progress: bool,
) -> Result<SplitSummary> {
    let started = Instant::now();
    let ds = TypedDataset::open(dataset)?;
    let (r, reverse) = typed_relations(&ds, cfg)?;
    let rel = &ds.relations[r];
    let (src, dst) = (&ds.node_types[rel.src], &ds.node_types[rel.dst]);
    let offsets = (src.offset as u32, dst.offset as u32);
    let edges = read_edges(&rel.edges, offsets, show_progress)?;
    let targets = dst.offset as u32..(dst.offset + dst.num) as u32;
    if targets.len() < 2 || (rel.src == rel.dst && targets.len() < 3) {
        return Err(Error::InvalidArgument(format!(
            "--relation {}: {} nodes of type '{}' leave no negative for a held-out edge",
            rel.name, dst.num, dst.name
        )));
    }
    let others = dst.num - 1 - u64::from(rel.src == rel.dst);
    enough_negatives(
        cfg.negatives,
        others,
        &format!("nodes of type '{}'", dst.name),
    )?;
    let split = split_edges(&edges, targets, cfg);
    let writer = DatasetWriter::create(out, overwrite)?;
    let mut meta = Metadata::read(dataset)?;
    // The split relations' files are written anew, the old task's dropped,
    // everything else linked.
    let mut replaced: HashSet<String> = meta
        .tasks
        .iter()
        .filter(|t| t.name == "link_prediction")
        .flat_map(|t| [&t.train_set, &t.validation_set, &t.test_set])
        .flatten()
        .flatten()
        .flat_map(|e| e.data.iter().map(|d| d.path.clone()))
        .collect();
    let split_relations: Vec<usize> = std::iter::once(r).chain(reverse).collect();
    for edge in &meta.graph.edges {
        if split_relations
            .iter()
            .any(|&i| Some(&ds.relations[i].name) == edge.edge_type.as_ref())
        {
            replaced.insert(edge.path.clone());
        }
    }
    for path in meta.named_paths().filter(|p| !replaced.contains(p)) {
        link_or_copy(&dataset.join(&path), &writer.path(&path))?;
    }
    write_edges(
        &writer.path(&layout::typed_edges(&rel.name)),
        &split.train_edges,
        offsets,
    )?;
    let held: HashSet<u64> = (split.valid.pairs.iter().chain(&split.test.pairs))
        .map(|&(u, v)| pair_key(u, v))
        .collect();
    if let Some(rev) = reverse.map(|i| &ds.relations[i]) {
        let kept: Vec<(u32, u32)> = read_edges(&rev.edges, (offsets.1, offsets.0), show_progress)?
            .into_iter()
            .filter(|&(u, v)| !held.contains(&pair_key(u, v)))
            .collect();
        write_edges(
            &writer.path(&layout::typed_edges(&rev.name)),
            &kept,
            (offsets.1, offsets.0),
        )?;
    }
    for edge in &mut meta.graph.edges {
        if let Some(name) = edge.edge_type.as_ref()
            && split_relations
                .iter()
                .any(|&i| &ds.relations[i].name == name)
        {
            *edge = EdgeMeta {
                edge_type: Some(name.clone()),
                format: "numpy".into(),
                path: layout::typed_edges(name),
            };
        }
    }
    write_task(&writer, &split, cfg.negatives, offsets)?;
    meta.tasks.retain(|t| t.name != "link_prediction");
    meta.tasks.push(link_task(Some(&rel.name)));
    meta.dataset_name = Some(format!("{}-split-edges", ds.name));
    writer.commit_metadata(&meta)?;
    let names = (
        Some(rel.name.clone()),
        reverse.map(|i| ds.relations[i].name.clone()),
    );
    Ok(SplitSummary::of(
        (ds.num_nodes(), edges.len()),
        &split,
        cfg,
        names,
        started,
    ))
}

/// The relation `--relation` names and its reverse (`--reverse`, else
/// `dst:rev_relation:src` if the graph has it), as indices.
fn typed_relations(ds: &TypedDataset, cfg: &SplitConfig) -> Result<(usize, Option<usize>)> {
    let names = || {
        ds.relations
            .iter()
            .map(|r| r.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let find = |flag: &str, name: &str| {
        ds.relations
            .iter()
            .position(|r| r.name == name)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "{flag} {name}: no such relation (the graph's are {})",
                    names()
                ))
            })
    };
    let Some(name) = &cfg.relation else {
        return Err(Error::InvalidArgument(format!(
            "a typed graph: --relation names the relation to split (one of {})",
            names()
        )));
    };
    let r = find("--relation", name)?;
    let rel = &ds.relations[r];
    let (src, dst) = (&ds.node_types[rel.src].name, &ds.node_types[rel.dst].name);
    let reverse = match &cfg.reverse {
        Some(rev) => {
            let i = find("--reverse", rev)?;
            let back = &ds.relations[i];
            if (back.src, back.dst) != (rel.dst, rel.src) || i == r {
                return Err(Error::InvalidArgument(format!(
                    "--reverse {rev}: the reverse of {name} is another relation from '{dst}' to '{src}'"
                )));
            }
            Some(i)
        }
        None => {
            let middle = name.split(':').nth(1).unwrap_or_default();
            let guess = format!("{dst}:rev_{middle}:{src}");
            ds.relations.iter().position(|r| r.name == guess)
        }
    };
    Ok((r, reverse))
}

/// Every edge of `edges`, in memory (ids checked as they stream), each
/// side moved by its `offsets` (into homogenized ids on a typed graph).
fn read_edges(
    edges: &EdgeList,
    offsets: (u32, u32),
    show_progress: bool,
) -> Result<Vec<(u32, u32)>> {
    let hint = edges.len_hint().unwrap_or(0);
    let pb = offgnn_shared::progress::bar_if(show_progress, hint, "edges", "edges");
    let mut out = Vec::with_capacity(hint as usize);
    edges.for_each_chunk::<Error>(1 << 20, |src, dst| {
        out.extend(
            src.iter()
                .zip(dst)
                .map(|(&u, &v)| (u as u32 + offsets.0, v as u32 + offsets.1)),
        );
        pb.inc(src.len() as u64);
        Ok(())
    })?;
    pb.finish_and_clear();
    Ok(out)
}

/// Edges as `[2, E]` int64, each side less its `offsets` (back to
/// type-local ids).
fn write_edges(path: &Path, edges: &[(u32, u32)], offsets: (u32, u32)) -> Result<()> {
    let mut w = NpyWriter::create(path, DType::I64, &[2, edges.len() as u64])?;
    for side in [0, 1] {
        let bytes: Vec<u8> = edges
            .iter()
            .flat_map(|&(u, v)| {
                let id = if side == 0 {
                    u - offsets.0
                } else {
                    v - offsets.1
                };
                i64::from(id).to_le_bytes()
            })
            .collect();
        w.write_bytes(&bytes)?;
    }
    Ok(w.finish()?)
}

/// Node pairs as `[N, 2]` int64, each side less its `offsets`.
fn write_pairs(path: &Path, pairs: &[(u32, u32)], offsets: (u32, u32)) -> Result<()> {
    let mut w = NpyWriter::create(path, DType::I64, &[pairs.len() as u64, 2])?;
    let bytes: Vec<u8> = pairs
        .iter()
        .flat_map(|&(u, v)| [i64::from(u - offsets.0), i64::from(v - offsets.1)])
        .flat_map(i64::to_le_bytes)
        .collect();
    w.write_bytes(&bytes)?;
    Ok(w.finish()?)
}

/// The task's files: the training pairs and both held-out sets.
fn write_task(
    writer: &DatasetWriter,
    split: &EdgeSplit,
    negatives: u32,
    offsets: (u32, u32),
) -> Result<()> {
    write_pairs(
        &writer.path(&layout::link("train_seeds")),
        &split.train_pairs,
        offsets,
    )?;
    for (name, held) in [("valid", &split.valid), ("test", &split.test)] {
        write_held(writer, name, held, negatives, offsets)?;
    }
    Ok(())
}

/// A held-out set as GraphBolt lays it out: each positive, then its
/// negatives, with their labels (1, then 0s) and the positive's index.
fn write_held(
    writer: &DatasetWriter,
    name: &str,
    held: &Held,
    negatives: u32,
    offsets: (u32, u32),
) -> Result<()> {
    let k = negatives as usize;
    let mut seeds = Vec::with_capacity(held.pairs.len() * (k + 1));
    let mut labels = Vec::with_capacity(seeds.capacity());
    let mut indexes = Vec::with_capacity(seeds.capacity());
    for (i, &(u, v)) in held.pairs.iter().enumerate() {
        seeds.push((u, v));
        labels.push(1);
        indexes.push(i as u64);
        for &w in &held.negatives[i * k..(i + 1) * k] {
            seeds.push((u, w));
            labels.push(0);
            indexes.push(i as u64);
        }
    }
    write_pairs(
        &writer.path(&layout::link(&format!("{name}_seeds"))),
        &seeds,
        offsets,
    )?;
    offgnn_shared::npy::write_i64(
        writer.path(&layout::link(&format!("{name}_labels"))),
        &labels,
    )?;
    offgnn_shared::npy::write_i64(
        writer.path(&layout::link(&format!("{name}_indexes"))),
        &indexes,
    )?;
    Ok(())
}

/// The `link_prediction` task's entry in metadata.yaml; on a typed graph
/// each set names `relation`.
fn link_task(relation: Option<&str>) -> TaskMeta {
    let data = |name: &str, file: &str| SetDataMeta {
        name: name.into(),
        format: "numpy".into(),
        in_memory: None,
        path: layout::link(file),
    };
    let held = |set: &str| {
        Some(vec![SetMeta {
            node_type: relation.map(String::from),
            data: vec![
                data("seeds", &format!("{set}_seeds")),
                data("labels", &format!("{set}_labels")),
                data("indexes", &format!("{set}_indexes")),
            ],
        }])
    };
    TaskMeta {
        name: "link_prediction".into(),
        num_classes: Some(2),
        train_set: Some(vec![SetMeta {
            node_type: relation.map(String::from),
            data: vec![data("seeds", "train_seeds")],
        }]),
        validation_set: held("valid"),
        test_set: held("test"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(valid: f64, test: f64, negatives: u32, seed: u64) -> SplitConfig {
        SplitConfig {
            valid,
            test,
            negatives,
            seed,
            relation: None,
            reverse: None,
        }
    }

    /// A ring of 200 nodes stored both ways, chords one way, a self-loop.
    fn graph() -> Vec<(u32, u32)> {
        let mut e = Vec::new();
        for u in 0..200u32 {
            e.push((u, (u + 1) % 200));
            e.push(((u + 1) % 200, u));
            if u % 3 == 0 {
                e.push((u, (u * 7 + 11) % 200));
            }
        }
        e.push((5, 5));
        e
    }

    #[test]
    fn held_out_pairs_leave_the_training_graph_both_ways_and_the_sets_are_disjoint() {
        let edges = graph();
        let s = split_edges(&edges, 0..200, &cfg(0.1, 0.2, 5, 7));
        let pairs = |v: &[(u32, u32)]| -> std::collections::BTreeSet<u64> {
            v.iter().map(|&(u, w)| pair_key(u, w)).collect()
        };
        let (train, valid, test) = (
            pairs(&s.train_pairs),
            pairs(&s.valid.pairs),
            pairs(&s.test.pairs),
        );
        let all = pairs(
            &edges
                .iter()
                .copied()
                .filter(|(u, v)| u != v)
                .collect::<Vec<_>>(),
        );
        assert_eq!(train.len() + valid.len() + test.len(), all.len());
        assert!(train.is_disjoint(&valid) && train.is_disjoint(&test) && valid.is_disjoint(&test));
        assert_eq!(valid.len(), (0.1 * all.len() as f64).round() as usize);
        assert_eq!(test.len(), (0.2 * all.len() as f64).round() as usize);
        // No held-out pair is left in the training graph, in either direction.
        for &(u, v) in &s.train_edges {
            assert!(!valid.contains(&pair_key(u, v)) && !test.contains(&pair_key(u, v)));
        }
        // The rest of the graph is all there, self-loop included.
        let kept = edges
            .iter()
            .filter(|&&(u, v)| train.contains(&pair_key(u, v)) || u == v)
            .count();
        assert_eq!(s.train_edges.len(), kept);
        assert!(s.train_edges.contains(&(5, 5)));
        // Negatives keep the source and avoid the graph's edges.
        for held in [&s.valid, &s.test] {
            assert_eq!(held.negatives.len(), held.pairs.len() * 5);
            for (i, &(u, v)) in held.pairs.iter().enumerate() {
                for &w in &held.negatives[i * 5..i * 5 + 5] {
                    assert!(
                        w != u && w != v && !all.contains(&pair_key(u, w)),
                        "{u} {v} {w}"
                    );
                }
            }
        }
        // The same seed, the same split; another seed, another.
        assert_eq!(split_edges(&edges, 0..200, &cfg(0.1, 0.2, 5, 7)), s);
        assert_ne!(
            split_edges(&edges, 0..200, &cfg(0.1, 0.2, 5, 8)).valid,
            s.valid
        );
    }

    #[test]
    fn bad_shares_and_no_negatives_are_refused_in_one_line() {
        for (c, says) in [
            (cfg(0.5, 0.5, 5, 0), "hold out every edge"),
            (cfg(1.2, 0.0, 5, 0), "--valid 1.2 is not a share"),
            (cfg(0.1, -0.1, 5, 0), "--test -0.1 is not a share"),
            (cfg(0.1, 0.1, 0, 0), "--negatives must be at least 1"),
        ] {
            let e = c.check().unwrap_err();
            assert!(e.contains(says) && !e.contains('\n'), "{e}");
        }
        assert!(cfg(0.05, 0.1, 1000, 0).check().is_ok());
    }
}
