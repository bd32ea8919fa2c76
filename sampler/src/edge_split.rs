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

use std::path::Path;
use std::time::Instant;

use offgnn_shared::dataset::{
    Dataset, DatasetSpec, DatasetWriter, SetDataMeta, SetMeta, Split, TaskMeta, layout,
};
use offgnn_shared::npy::{DType, NpyWriter};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::link_sampling::pair_key as key;

/// The random stream of the split, apart from sampling's.
const SPLIT_STREAM: u64 = 0x6c70_5f73_706c_6974;

/// How the edges are split.
#[derive(Clone, Debug)]
pub struct SplitConfig {
    /// Shares of the node pairs held out for validation and test.
    pub valid: f64,
    pub test: f64,
    /// Negatives drawn for each held-out pair.
    pub negatives: u32,
    pub seed: u64,
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

/// Splits `edges` (`num_nodes` nodes) as `cfg` says.
pub fn split_edges(edges: &[(u32, u32)], num_nodes: u32, cfg: &SplitConfig) -> EdgeSplit {
    // Each pair once, in the direction it was first stored.
    let mut first: Vec<(u64, usize)> = edges
        .iter()
        .enumerate()
        .filter(|(_, (u, v))| u != v)
        .map(|(i, &(u, v))| (key(u, v), i))
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
    let is_held =
        |u: u32, v: u32| u != v && keys.binary_search(&key(u, v)).is_ok_and(|j| held_out[j]);
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
                negatives.push(negative(u, v, num_nodes, &keys, rng));
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

/// A destination for source `u` that is neither `v`, `u` nor a neighbour
/// of `u` in the whole graph; after 64 draws that all hit one (a node
/// joined to nearly every other), any node but `v`.
fn negative(u: u32, v: u32, num_nodes: u32, keys: &[u64], rng: &mut Pcg64Mcg) -> u32 {
    let mut w = v;
    for _ in 0..64 {
        w = rng.random_range(0..num_nodes);
        if w != u && w != v && keys.binary_search(&key(u, w)).is_err() {
            return w;
        }
    }
    if w == v { (v + 1) % num_nodes } else { w }
}

/// What `split-edges` wrote.
#[derive(Debug, Serialize)]
pub struct SplitSummary {
    pub num_nodes: u64,
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
    let started = Instant::now();
    let ds = Dataset::open(dataset)?;
    if ds.num_nodes < 3 {
        return Err(Error::InvalidArgument(format!(
            "{}: {} nodes leave no negative for a held-out edge",
            dataset.display(),
            ds.num_nodes
        )));
    }
    let edges = read_edges(&ds, show_progress)?;
    let split = split_edges(&edges, ds.num_nodes as u32, cfg);
    let writer = DatasetWriter::create(out, overwrite)?;
    write_edges(&writer.path(layout::EDGES), &split.train_edges)?;
    link_features(ds.features.path(), &writer.path(layout::FEATURES))?;
    for s in Split::ALL {
        let set = ds.split(s);
        let seeds: Vec<u64> = set.seeds.iter().map(|&v| u64::from(v)).collect();
        let labels: Vec<u64> = set.labels.iter().map(|&v| u64::from(v)).collect();
        writer.write_split(s, &seeds, &labels)?;
    }
    write_pairs(
        &writer.path(&layout::link("train_seeds")),
        &split.train_pairs,
    )?;
    for (name, held) in [("valid", &split.valid), ("test", &split.test)] {
        write_held(&writer, name, held, cfg.negatives)?;
    }
    writer.commit(&DatasetSpec {
        name: format!("{}-split-edges", ds.name),
        num_nodes: ds.num_nodes,
        num_classes: ds.num_classes,
        node_labels: false,
        extra_tasks: vec![link_task()],
    })?;
    Ok(SplitSummary {
        num_nodes: ds.num_nodes,
        edges: edges.len() as u64,
        train_edges: split.train_edges.len() as u64,
        train_pairs: split.train_pairs.len() as u64,
        valid_pairs: split.valid.pairs.len() as u64,
        test_pairs: split.test.pairs.len() as u64,
        negatives: cfg.negatives,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Every edge of the dataset, in memory (ids checked as they stream).
fn read_edges(ds: &Dataset, show_progress: bool) -> Result<Vec<(u32, u32)>> {
    let pb = offgnn_shared::progress::bar_if(
        show_progress,
        ds.edges.len_hint().unwrap_or(0),
        "edges",
        "edges",
    );
    let mut edges = Vec::with_capacity(ds.edges.len_hint().unwrap_or(0) as usize);
    ds.edges.for_each_chunk::<Error>(1 << 20, |src, dst| {
        edges.extend(src.iter().zip(dst).map(|(&u, &v)| (u as u32, v as u32)));
        pb.inc(src.len() as u64);
        Ok(())
    })?;
    pb.finish_and_clear();
    Ok(edges)
}

/// The training graph as `[2, E]` int64.
fn write_edges(path: &Path, edges: &[(u32, u32)]) -> Result<()> {
    let mut w = NpyWriter::create(path, DType::I64, &[2, edges.len() as u64])?;
    for side in [0, 1] {
        let bytes: Vec<u8> = edges
            .iter()
            .flat_map(|&(u, v)| i64::from(if side == 0 { u } else { v }).to_le_bytes())
            .collect();
        w.write_bytes(&bytes)?;
    }
    Ok(w.finish()?)
}

/// Node pairs as `[N, 2]` int64.
fn write_pairs(path: &Path, pairs: &[(u32, u32)]) -> Result<()> {
    let mut w = NpyWriter::create(path, DType::I64, &[pairs.len() as u64, 2])?;
    let bytes: Vec<u8> = pairs
        .iter()
        .flat_map(|&(u, v)| [i64::from(u), i64::from(v)])
        .flat_map(i64::to_le_bytes)
        .collect();
    w.write_bytes(&bytes)?;
    Ok(w.finish()?)
}

/// A held-out set as GraphBolt lays it out: each positive, then its
/// negatives, with their labels (1, then 0s) and the positive's index.
fn write_held(writer: &DatasetWriter, name: &str, held: &Held, negatives: u32) -> Result<()> {
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

/// The output's feature file: the input's, hard-linked; copied where the
/// two directories are on different filesystems (a dataset's files may not
/// resolve outside its directory, so a symbolic link would not do).
fn link_features(from: &Path, to: &Path) -> Result<()> {
    if std::fs::hard_link(from, to).is_ok() {
        return Ok(());
    }
    let bytes = std::fs::metadata(from)
        .map_err(|e| offgnn_shared::Error::io(from, e))?
        .len();
    tracing::info!(
        "copying the features ({}): --out is on another filesystem than {}, so they cannot be hard-linked",
        offgnn_shared::report::human_bytes(bytes),
        from.display()
    );
    std::fs::copy(from, to).map_err(|e| offgnn_shared::Error::io(to, e))?;
    Ok(())
}

/// The `link_prediction` task's entry in metadata.yaml.
fn link_task() -> TaskMeta {
    let data = |name: &str, file: &str| SetDataMeta {
        name: name.into(),
        format: "numpy".into(),
        in_memory: None,
        path: layout::link(file),
    };
    let held = |set: &str| {
        Some(vec![SetMeta {
            node_type: None,
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
            node_type: None,
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
        let s = split_edges(&edges, 200, &cfg(0.1, 0.2, 5, 7));
        let pairs = |v: &[(u32, u32)]| -> std::collections::BTreeSet<u64> {
            v.iter().map(|&(u, w)| key(u, w)).collect()
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
            assert!(!valid.contains(&key(u, v)) && !test.contains(&key(u, v)));
        }
        // The rest of the graph is all there, self-loop included.
        let kept = edges
            .iter()
            .filter(|&&(u, v)| train.contains(&key(u, v)) || u == v)
            .count();
        assert_eq!(s.train_edges.len(), kept);
        assert!(s.train_edges.contains(&(5, 5)));
        // Negatives keep the source and avoid the graph's edges.
        for held in [&s.valid, &s.test] {
            assert_eq!(held.negatives.len(), held.pairs.len() * 5);
            for (i, &(u, v)) in held.pairs.iter().enumerate() {
                for &w in &held.negatives[i * 5..i * 5 + 5] {
                    assert!(w != u && w != v && !all.contains(&key(u, w)), "{u} {v} {w}");
                }
            }
        }
        // The same seed, the same split; another seed, another.
        assert_eq!(split_edges(&edges, 200, &cfg(0.1, 0.2, 5, 7)), s);
        assert_ne!(
            split_edges(&edges, 200, &cfg(0.1, 0.2, 5, 8)).valid,
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
