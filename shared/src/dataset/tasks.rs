//! The node-classification task: its three seed splits, each split's seeds
//! and labels as `metadata.yaml` names them, checked against the node and
//! class counts, and the seeded split a writer makes of a node range.

use std::path::Path;

use super::checks::{check_labels, require_integer, resolve};
use super::metadata::{Metadata, SetMeta, TaskMeta};
use crate::error::{Error, Result};
use crate::npy::NpyFile;

pub use offgnn_manifests::Split;

/// The key of a split's set in a task of `metadata.yaml`.
pub(super) fn yaml_key(split: Split) -> &'static str {
    match split {
        Split::Train => "train_set",
        Split::Valid => "validation_set",
        Split::Test => "test_set",
    }
}

/// One split's seeds and their labels, checked against the node count and
/// the class count.
#[derive(Clone, Debug, Default)]
pub struct SeedSet {
    pub seeds: Vec<u32>,
    pub labels: Vec<u32>,
}

/// The node classification task: the one named `node_classification`,
/// else the first task that is not `link_prediction`; and its class count,
/// which must fit 32 bits and not be 0. `None` where `link_prediction` is
/// the dataset's only task (a graph for link prediction alone, as
/// GraphBolt's ogbl-citation2 is).
pub(super) fn classification_task<'m>(
    meta: &'m Metadata,
    meta_path: &Path,
) -> Result<Option<(&'m TaskMeta, u64)>> {
    let bad = |fault: String| Error::dataset(meta_path, fault);
    let task = meta
        .tasks
        .iter()
        .find(|t| t.name == "node_classification")
        .or_else(|| meta.tasks.iter().find(|t| t.name != LINK_TASK));
    let Some(task) = task else {
        if meta.tasks.is_empty() {
            return Err(bad(
                "no task: a node classification or link_prediction task is required".into(),
            ));
        }
        return Ok(None);
    };
    let num_classes = task
        .num_classes
        .ok_or_else(|| bad(format!("task '{}' has no num_classes", task.name)))?;
    if num_classes == 0 || num_classes > u32::MAX as u64 {
        return Err(bad(format!("num_classes {num_classes} is out of range")));
    }
    Ok(Some((task, num_classes)))
}

/// The name of GraphBolt's link prediction task.
pub(super) const LINK_TASK: &str = "link_prediction";

/// The entries of `task`'s set for `split`, which it must have.
pub(super) fn task_set<'t>(
    task: &'t TaskMeta,
    split: Split,
    meta_path: &Path,
) -> Result<&'t [SetMeta]> {
    let set = match split {
        Split::Train => &task.train_set,
        Split::Valid => &task.validation_set,
        Split::Test => &task.test_set,
    };
    set.as_deref().ok_or_else(|| {
        Error::dataset(
            meta_path,
            format!("task '{}' has no {}", task.name, yaml_key(split)),
        )
    })
}

/// The task's train, validation and test sets, in that order; the train
/// set must not be empty.
pub(super) fn load_sets(
    root: &Path,
    meta_path: &Path,
    task: &TaskMeta,
    num_nodes: u64,
    num_classes: u64,
    node_labels: Option<&[u64]>,
) -> Result<[SeedSet; 3]> {
    let bad = |fault: String| Error::dataset(meta_path, fault);
    let mut sets = Vec::with_capacity(3);
    for split in Split::ALL {
        let set = task_set(task, split, meta_path)?;
        sets.push(load_set(
            root,
            meta_path,
            split,
            set,
            num_nodes,
            num_classes,
            node_labels,
        )?);
    }
    let test = sets.pop().expect("three sets");
    let valid = sets.pop().expect("three sets");
    let train = sets.pop().expect("three sets");
    if train.seeds.is_empty() {
        return Err(bad("the train set is empty".into()));
    }
    Ok([train, valid, test])
}

fn load_set(
    root: &Path,
    meta_path: &Path,
    split: Split,
    set: &[SetMeta],
    num_nodes: u64,
    num_classes: u64,
    node_labels: Option<&[u64]>,
) -> Result<SeedSet> {
    let bad = |fault: String| Error::dataset(meta_path, fault);
    let [entry] = set else {
        return Err(bad(format!(
            "{} has {} entries; only homogeneous sets (one) are supported",
            yaml_key(split),
            set.len()
        )));
    };
    if entry.node_type.is_some() {
        return Err(bad(format!(
            "{} is typed but graph.nodes is not: give the nodes their types",
            yaml_key(split)
        )));
    }
    read_set_entry(
        root,
        meta_path,
        split,
        entry,
        (num_nodes, None),
        num_classes,
        node_labels,
    )
}

/// One set entry's seeds and labels: seeds below `num_nodes` (of the type
/// `nodes.1`, named in errors), each once; labels from the entry, else from
/// `node_labels` (the nodes' `label` feature).
pub(super) fn read_set_entry(
    root: &Path,
    meta_path: &Path,
    split: Split,
    entry: &SetMeta,
    (num_nodes, of_type): (u64, Option<&str>),
    num_classes: u64,
    node_labels: Option<&[u64]>,
) -> Result<SeedSet> {
    let bad = |fault: String| Error::dataset(meta_path, fault);
    let nodes = match of_type {
        Some(t) => format!("{num_nodes} nodes of type '{t}'"),
        None => format!("{num_nodes} nodes"),
    };
    let mut seeds = None;
    let mut labels = None;
    for data in &entry.data {
        if data.format != "numpy" {
            return Err(bad(format!(
                "{} '{}' has format '{}'; only numpy is supported",
                yaml_key(split),
                data.name,
                data.format
            )));
        }
        let path = resolve(root, meta_path, &data.path)?;
        if !path.exists() {
            // metadata.yaml may be the damaged file: a truncated one names
            // a path cut short.
            return Err(bad(format!(
                "{} '{}' names {}, which does not exist",
                yaml_key(split),
                data.name,
                path.display()
            )));
        }
        match data.name.as_str() {
            // GraphBolt named the column `seed_nodes` before 2.1 and `seeds` since.
            "seeds" | "seed_nodes" => seeds = Some(path),
            "labels" => labels = Some(path),
            _ => {}
        }
    }
    let seeds_path = seeds.ok_or_else(|| {
        bad(format!(
            "{} has no 'seeds' (or 'seed_nodes') data",
            yaml_key(split)
        ))
    })?;
    let f = NpyFile::open(&seeds_path)?;
    require_integer(&f)?;
    if f.shape().len() != 1 {
        return Err(Error::npy(
            &seeds_path,
            format!("seeds must be one-dimensional, found shape {:?}", f.shape()),
        ));
    }
    let seeds = f.read_all_u64()?;
    if let Some((i, &s)) = seeds.iter().enumerate().find(|(_, s)| **s >= num_nodes) {
        return Err(Error::npy(
            &seeds_path,
            format!("seed {s} at element {i} is out of range for {nodes}"),
        ));
    }
    let mut sorted = seeds.clone();
    sorted.sort_unstable();
    if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(Error::npy(
            &seeds_path,
            format!("seed {} appears more than once", w[0]),
        ));
    }
    drop(sorted);
    let labels = match labels {
        Some(path) => {
            let f = NpyFile::open(&path)?;
            require_integer(&f)?;
            if f.shape() != [seeds.len() as u64] {
                return Err(Error::npy(
                    &path,
                    format!(
                        "labels must have shape [{}] to match the seeds, found {:?}",
                        seeds.len(),
                        f.shape()
                    ),
                ));
            }
            let labels = f.read_all_u64()?;
            check_labels(&path, &labels, num_classes)?;
            labels
        }
        None => match node_labels {
            Some(all) => seeds.iter().map(|&s| all[s as usize]).collect(),
            None => {
                let of = of_type.map_or(String::new(), |t| format!(" of type '{t}'"));
                return Err(bad(format!(
                    "{} has no 'labels' and there is no node feature 'label'{of}",
                    yaml_key(split)
                )));
            }
        },
    };
    Ok(SeedSet {
        seeds: seeds.into_iter().map(|s| s as u32).collect(),
        labels: labels.into_iter().map(|l| l as u32).collect(),
    })
}

/// A deterministic split of `n` items into train, validation and test by a
/// seeded shuffle: the first `train` fraction of the permutation is the train
/// set, the next `valid` fraction the validation set, then the next `test`
/// fraction (or, with `None`, the rest) the test set. Items left over belong
/// to no set. Each part is returned sorted.
pub fn seeded_split(
    n: u64,
    train: f64,
    valid: f64,
    test_fraction: Option<f64>,
    seed: u64,
) -> Result<[Vec<u64>; 3]> {
    use rand::SeedableRng;
    use rand::seq::SliceRandom;
    let test_ok = test_fraction.is_none_or(|t| t >= 0.0 && train + valid + t <= 1.0 + 1e-12);
    if !(train > 0.0 && valid >= 0.0 && train + valid <= 1.0 && test_ok) {
        return Err(Error::InvalidArgument(format!(
            "split fractions train {train}, valid {valid}, test {} must be non-negative, train positive, and add up to at most 1",
            test_fraction.map_or("(the rest)".to_string(), |t| t.to_string())
        )));
    }
    let mut ids: Vec<u64> = (0..n).collect();
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(seed);
    ids.shuffle(&mut rng);
    let n_train = ((n as f64 * train).round() as u64).max(1).min(n) as usize;
    let n_valid = ((n as f64 * valid).round() as usize).min(ids.len() - n_train);
    let mut test = ids.split_off(n_train + n_valid);
    if let Some(t) = test_fraction {
        test.truncate(((n as f64 * t).round() as usize).min(test.len()));
    }
    let mut valid = ids.split_off(n_train);
    let mut train = ids;
    train.sort_unstable();
    valid.sort_unstable();
    test.sort_unstable();
    Ok([train, valid, test])
}

#[cfg(test)]
mod tests {
    use super::seeded_split;

    #[test]
    fn seeded_split_partitions_and_honours_a_test_fraction() {
        let [train, valid, test] = seeded_split(1000, 0.6, 0.2, None, 3).unwrap();
        assert_eq!((train.len(), valid.len(), test.len()), (600, 200, 200));
        let mut all: Vec<u64> = [&train, &valid, &test]
            .into_iter()
            .flatten()
            .copied()
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..1000).collect::<Vec<_>>());
        assert_eq!(seeded_split(1000, 0.6, 0.2, None, 3).unwrap()[0], train);
        assert_ne!(seeded_split(1000, 0.6, 0.2, None, 4).unwrap()[0], train);

        // A test fraction leaves the rest in no set; train and validation
        // are the same as without it.
        let [t2, v2, s2] = seeded_split(1000, 0.6, 0.2, Some(0.05), 3).unwrap();
        assert_eq!((t2, v2), (train, valid));
        assert_eq!(s2.len(), 50);
        assert!(s2.iter().all(|x| test.binary_search(x).is_ok()));

        let err = seeded_split(1000, 0.6, 0.2, Some(0.3), 3).unwrap_err();
        assert!(err.to_string().contains("at most 1"), "{err}");
    }
}
