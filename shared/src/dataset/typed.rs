//! Typed (heterogeneous) datasets: GraphBolt's `OnDiskDataset` with node
//! types and relations. `graph.nodes` lists `{type, num}`, `graph.edges`
//! one file per relation `src:relation:dst` in type-local ids, and
//! `feature_data` at most one feature file per node type (widths may differ
//! from type to type, and a type may have none) besides its `label`. The
//! node-classification task's sets all name one node type, the target.
//!
//! Inside, node ids are homogenized: each type is a contiguous range of one
//! id space, in the order of `graph.nodes`, starting at its `offset`. Seeds
//! are held in that space; edges stay type-local in their files and are
//! checked against their endpoint types as they stream.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::checks::check_labels;
use super::edges::{EdgeList, open_edge_file};
use super::features::{open_feature_file, open_label_file};
use super::metadata::{METADATA_FILE, Metadata, TaskMeta, read_metadata};
use super::open::dataset_name;
use super::tasks::{
    LINK_TASK, SeedSet, Split, classification_task, read_set_entry, task_set, yaml_key,
};
use crate::error::{Error, Result};
use crate::npy::NpyFile;

/// One node type: its name, node count, first homogenized id, feature file
/// (if it has one) and labels (if it has a `label` feature).
#[derive(Debug)]
pub struct NodeType {
    pub name: String,
    pub num: u64,
    pub offset: u64,
    pub features: Option<NpyFile>,
    pub labels: Option<(PathBuf, Vec<u64>)>,
}

/// One relation `src:name:dst`: its endpoint types (indices into
/// [`TypedDataset::node_types`]) and its edges, in type-local ids.
#[derive(Debug)]
pub struct Relation {
    /// The canonical `src:relation:dst` as `metadata.yaml` names it.
    pub name: String,
    pub src: usize,
    pub dst: usize,
    pub edges: EdgeList,
}

#[derive(Debug)]
pub struct TypedDataset {
    pub root: PathBuf,
    pub name: String,
    pub node_types: Vec<NodeType>,
    pub relations: Vec<Relation>,
    /// 0 for a graph for link prediction alone (its seed sets are empty).
    pub num_classes: u32,
    /// The node type the task's seeds are of (for link prediction alone,
    /// the source type of the task's relation).
    pub target: usize,
    /// Seeds in homogenized ids.
    pub train: SeedSet,
    pub valid: SeedSet,
    pub test: SeedSet,
}

/// Whether the dataset at `root` is typed (see [`describes_typed`]); its
/// `metadata.yaml` read and parsed, not yet validated.
pub fn is_typed(root: &Path) -> Result<bool> {
    Ok(describes_typed(&Metadata::read(root)?))
}

/// Whether `metadata.yaml` describes a typed graph: more than one node type,
/// or any node type or edge type named.
pub(super) fn describes_typed(meta: &Metadata) -> bool {
    meta.graph.nodes.len() > 1
        || meta.graph.nodes.iter().any(|n| n.node_type.is_some())
        || meta.graph.edges.iter().any(|e| e.edge_type.is_some())
}

impl TypedDataset {
    /// Opens and validates a typed dataset directory: every fault is one
    /// error naming the file at fault and what is wrong. Edge ids are
    /// checked as the edges stream ([`EdgeList::for_each_chunk`]).
    pub fn open(root: impl AsRef<Path>) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        let meta_path = root.join(METADATA_FILE);
        let meta = read_metadata(&meta_path)?;
        let mut node_types = node_types(&meta, &meta_path)?;
        let relations = relations(&root, &meta_path, &meta, &node_types)?;
        attach_features(&root, &meta_path, &meta, &mut node_types)?;
        let (num_classes, target, [train, valid, test]) =
            match classification_task(&meta, &meta_path)? {
                Some((task, num_classes)) => {
                    let (target, sets) =
                        node_task(&root, &meta_path, task, num_classes, &node_types)?;
                    (num_classes, target, sets)
                }
                // A graph for link prediction alone: no classes, no seed
                // sets, and the pairs' source type in the summaries.
                None => (
                    0,
                    link_source_type(&meta, &meta_path, &node_types)?,
                    Default::default(),
                ),
            };
        Ok(TypedDataset {
            name: dataset_name(&meta, &root),
            root,
            node_types,
            relations,
            num_classes: num_classes as u32,
            target,
            train,
            valid,
            test,
        })
    }

    /// Nodes of every type.
    pub fn num_nodes(&self) -> u64 {
        self.node_types.iter().map(|t| t.num).sum()
    }

    /// The index of the node type named `name`.
    pub fn node_type(&self, name: &str) -> Option<usize> {
        self.node_types.iter().position(|t| t.name == name)
    }

    /// The type of homogenized node `id` and its type-local id.
    pub fn type_of(&self, id: u64) -> (usize, u64) {
        let t = self.node_types.partition_point(|t| t.offset <= id) - 1;
        (t, id - self.node_types[t].offset)
    }

    pub fn split(&self, split: Split) -> &SeedSet {
        match split {
            Split::Train => &self.train,
            Split::Valid => &self.valid,
            Split::Test => &self.test,
        }
    }
}

/// The node classification task's target type and its three sets, seeds
/// in homogenized ids, checked against their type and its labels.
fn node_task(
    root: &Path,
    meta_path: &Path,
    task: &TaskMeta,
    num_classes: u64,
    node_types: &[NodeType],
) -> Result<(usize, [SeedSet; 3])> {
    let bad = |fault: String| Error::dataset(meta_path, fault);
    let by_name = index_by_name(node_types);
    let mut target: Option<usize> = None;
    let mut sets = Vec::with_capacity(3);
    for split in Split::ALL {
        let set = task_set(task, split, meta_path)?;
        let [entry] = set else {
            return Err(bad(format!(
                "{} has {} entries; node classification trains one node type, so one",
                yaml_key(split),
                set.len()
            )));
        };
        let type_name = entry.node_type.as_deref().ok_or_else(|| {
            bad(format!(
                "{} names no node type; in a typed graph each set names the type of its seeds",
                yaml_key(split)
            ))
        })?;
        let &t = by_name.get(type_name).ok_or_else(|| {
            bad(format!(
                "{} is of node type '{type_name}', which is not in graph.nodes",
                yaml_key(split)
            ))
        })?;
        if let Some(first) = target
            && first != t
        {
            return Err(bad(format!(
                "{} is of node type '{type_name}' but train_set of '{}': the sets of one task are of one type",
                yaml_key(split),
                node_types[first].name
            )));
        }
        target = Some(t);
        let node = &node_types[t];
        let node_labels = node.labels.as_ref().map(|(_, l)| l.as_slice());
        let mut seeds = read_set_entry(
            root,
            meta_path,
            split,
            entry,
            (node.num, Some(&node.name)),
            num_classes,
            node_labels,
        )?;
        for s in &mut seeds.seeds {
            *s += node.offset as u32;
        }
        sets.push(seeds);
    }
    let target = target.expect("three sets");
    if let Some((path, labels)) = &node_types[target].labels {
        check_labels(path, labels, num_classes)?;
    }
    let sets: [SeedSet; 3] = sets.try_into().expect("three sets");
    if sets[0].seeds.is_empty() {
        return Err(bad("the train set is empty".into()));
    }
    Ok((target, sets))
}

/// The node type a link-prediction-only dataset names as its target: the
/// source type of the relation its `link_prediction` task's train set is
/// of (the task itself is checked as [`crate::dataset::LinkTask`] opens it).
fn link_source_type(meta: &Metadata, meta_path: &Path, node_types: &[NodeType]) -> Result<usize> {
    let relation = meta
        .tasks
        .iter()
        .find(|t| t.name == LINK_TASK)
        .and_then(|t| t.train_set.as_deref())
        .and_then(|set| set.first())
        .and_then(|entry| entry.node_type.as_deref());
    let source = relation.and_then(|r| r.split(':').next());
    source
        .and_then(|name| node_types.iter().position(|t| t.name == name))
        .ok_or_else(|| {
            Error::dataset(
                meta_path,
                format!(
                    "link_prediction's train_set is of relation {}: in a typed graph it names one relation of graph.edges as 'src:relation:dst'",
                    relation.map_or("(none)".to_string(), |r| format!("'{r}'"))
                ),
            )
        })
}

fn index_by_name(node_types: &[NodeType]) -> HashMap<&str, usize> {
    node_types
        .iter()
        .enumerate()
        .map(|(i, t)| (t.name.as_str(), i))
        .collect()
}

/// `graph.nodes`: each entry typed, each type once and not empty, and all
/// of them together below 2^32 nodes (ids are 32-bit once homogenized).
fn node_types(meta: &Metadata, meta_path: &Path) -> Result<Vec<NodeType>> {
    let bad = |fault: String| Error::dataset(meta_path, fault);
    let mut types: Vec<NodeType> = Vec::with_capacity(meta.graph.nodes.len());
    let mut offset = 0u64;
    for (i, node) in meta.graph.nodes.iter().enumerate() {
        let name = node.node_type.clone().ok_or_else(|| {
            bad(format!(
                "graph.nodes[{i}] has no type; in a typed graph every node entry names its type"
            ))
        })?;
        if name.is_empty() || name.contains(':') {
            return Err(bad(format!(
                "node type '{name}' must be a non-empty name without ':'"
            )));
        }
        if types.iter().any(|t| t.name == name) {
            return Err(bad(format!(
                "node type '{name}' is listed twice in graph.nodes"
            )));
        }
        if node.num == 0 {
            return Err(bad(format!("node type '{name}' has num 0")));
        }
        types.push(NodeType {
            name,
            num: node.num,
            offset,
            features: None,
            labels: None,
        });
        offset += node.num;
    }
    if offset >= 1 << 32 {
        return Err(bad(format!(
            "{offset} nodes of all types: node ids are 32-bit, so at most {} nodes are supported",
            u32::MAX
        )));
    }
    Ok(types)
}

/// `graph.edges`: one entry per relation `src:relation:dst` between types of
/// `graph.nodes`, each relation once, its file opened.
fn relations(
    root: &Path,
    meta_path: &Path,
    meta: &Metadata,
    node_types: &[NodeType],
) -> Result<Vec<Relation>> {
    let bad = |fault: String| Error::dataset(meta_path, fault);
    let by_name = index_by_name(node_types);
    let mut relations: Vec<Relation> = Vec::with_capacity(meta.graph.edges.len());
    if meta.graph.edges.is_empty() {
        return Err(bad("graph.edges is empty".into()));
    }
    for (i, edge) in meta.graph.edges.iter().enumerate() {
        let name = edge.edge_type.clone().ok_or_else(|| {
            bad(format!(
                "graph.edges[{i}] has no type; in a typed graph every edge entry is 'src:relation:dst'"
            ))
        })?;
        let parts: Vec<&str> = name.split(':').collect();
        let [src, rel, dst] = parts.as_slice() else {
            return Err(bad(format!(
                "edge type '{name}' is not of the form 'src:relation:dst'"
            )));
        };
        if rel.is_empty() {
            return Err(bad(format!(
                "edge type '{name}' has an empty relation name"
            )));
        }
        let endpoint = |t: &str| {
            by_name.get(t).copied().ok_or_else(|| {
                bad(format!(
                    "edge type '{name}': node type '{t}' is not in graph.nodes"
                ))
            })
        };
        let (s, d) = (endpoint(src)?, endpoint(dst)?);
        if relations.iter().any(|r| r.name == name) {
            return Err(bad(format!(
                "edge type '{name}' is listed twice in graph.edges"
            )));
        }
        let source = open_edge_file(root, meta_path, edge)?;
        relations.push(Relation {
            edges: EdgeList {
                source,
                num_nodes: node_types[s].num,
                num_dst_nodes: node_types[d].num,
                endpoint_types: Some([src.to_string(), dst.to_string()]),
            },
            name,
            src: s,
            dst: d,
        });
    }
    Ok(relations)
}

/// `feature_data`'s node entries: each names a type of `graph.nodes`; a
/// type has at most one feature file besides its `label`.
fn attach_features(
    root: &Path,
    meta_path: &Path,
    meta: &Metadata,
    node_types: &mut [NodeType],
) -> Result<()> {
    let bad = |fault: String| Error::dataset(meta_path, fault);
    let mut feature_names: Vec<Option<(String, String)>> = vec![None; node_types.len()];
    for f in meta.feature_data.iter().filter(|f| f.domain == "node") {
        let type_name = f.node_type.as_deref().ok_or_else(|| {
            bad(format!(
                "node feature '{}' names no type; in a typed graph each node feature names its node type",
                f.name
            ))
        })?;
        let t = node_types
            .iter()
            .position(|t| t.name == type_name)
            .ok_or_else(|| {
                bad(format!(
                    "node feature '{}' is of node type '{type_name}', which is not in graph.nodes",
                    f.name
                ))
            })?;
        let node = &mut node_types[t];
        if f.name == "label" {
            if node.labels.is_some() {
                return Err(bad(format!(
                    "node type '{type_name}' has two 'label' features"
                )));
            }
            node.labels = Some(open_label_file(root, meta_path, f, node.num)?);
            continue;
        }
        if let Some((name, path)) = &feature_names[t] {
            return Err(bad(format!(
                "node type '{type_name}' has two feature files, '{name}' ({path}) and '{}' ({}): keep one",
                f.name, f.path
            )));
        }
        node.features = Some(open_feature_file(root, meta_path, f, node.num)?);
        feature_names[t] = Some((f.name.clone(), f.path.clone()));
    }
    Ok(())
}
