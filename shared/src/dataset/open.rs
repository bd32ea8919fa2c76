//! The validated dataset, [`Dataset`], and its opening: a pipeline of named
//! steps that each check one part of `metadata.yaml` and the files it names.

use std::path::{Path, PathBuf};

use super::checks::check_labels;
use super::edges::{EdgeList, open_edges};
use super::features::{node_features, open_features, open_node_labels};
use super::metadata::{METADATA_FILE, Metadata, read_metadata};
use super::tasks::{SeedSet, Split, classification_task, load_sets};
use super::typed::describes_typed;
use crate::error::{Error, Result};
use crate::npy::NpyFile;

#[derive(Debug)]
pub struct Dataset {
    pub root: PathBuf,
    pub name: String,
    pub num_nodes: u64,
    /// 0 for a graph for link prediction alone (its seed sets are empty).
    pub num_classes: u32,
    pub edges: EdgeList,
    pub features: NpyFile,
    pub train: SeedSet,
    pub valid: SeedSet,
    pub test: SeedSet,
}

impl Dataset {
    /// Opens and validates a dataset directory. Each fault is one error that
    /// names the file at fault.
    pub fn open(root: impl AsRef<Path>) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        let meta_path = root.join(METADATA_FILE);
        let meta = read_metadata(&meta_path)?;
        if describes_typed(&meta) {
            return Err(Error::dataset(
                &meta_path,
                format!(
                    "a typed graph ({} node types, {} edge types): `sampler inspect` checks it, but typed graphs are not sampled yet",
                    meta.graph.nodes.len(),
                    meta.graph.edges.len()
                ),
            ));
        }
        let num_nodes = node_count(&meta, &meta_path)?;
        let source = open_edges(&root, &meta_path, &meta)?;
        let node_features = node_features(&meta);
        let features = open_features(&root, &meta_path, &node_features, num_nodes)?;
        let node_labels = open_node_labels(&root, &meta_path, &node_features, num_nodes)?;
        // A graph for link prediction alone has no classes and no seed sets.
        let (num_classes, [train, valid, test]) = match classification_task(&meta, &meta_path)? {
            Some((task, num_classes)) => {
                if let Some((path, labels)) = &node_labels {
                    check_labels(path, labels, num_classes)?;
                }
                let sets = load_sets(
                    &root,
                    &meta_path,
                    task,
                    num_nodes,
                    num_classes,
                    node_labels.as_ref().map(|(_, l)| l.as_slice()),
                )?;
                (num_classes, sets)
            }
            None => (0, Default::default()),
        };
        Ok(Dataset {
            name: dataset_name(&meta, &root),
            root,
            num_nodes,
            num_classes: num_classes as u32,
            edges: EdgeList {
                source,
                num_nodes,
                num_dst_nodes: num_nodes,
                endpoint_types: None,
            },
            features,
            train,
            valid,
            test,
        })
    }

    pub fn split(&self, split: Split) -> &SeedSet {
        match split {
            Split::Train => &self.train,
            Split::Valid => &self.valid,
            Split::Test => &self.test,
        }
    }

    /// Feature dimension `d`.
    pub fn feature_dim(&self) -> u64 {
        self.features.shape()[1]
    }
}

/// The node count of the one (untyped) node type: at least 1, and below 2^32 since
/// node ids are 32-bit.
fn node_count(meta: &Metadata, meta_path: &Path) -> Result<u64> {
    let bad = |fault: String| Error::dataset(meta_path, fault);
    let [node] = meta.graph.nodes.as_slice() else {
        return Err(bad("graph.nodes is empty".into()));
    };
    let num_nodes = node.num;
    if num_nodes == 0 {
        return Err(bad("graph.nodes[0].num is 0".into()));
    }
    if num_nodes >= 1 << 32 {
        return Err(bad(format!(
            "{num_nodes} nodes: node ids are 32-bit, so at most {} nodes are supported",
            u32::MAX
        )));
    }
    Ok(num_nodes)
}

/// The name `metadata.yaml` gives, else the directory's.
pub(super) fn dataset_name(meta: &Metadata, root: &Path) -> String {
    meta.dataset_name.clone().unwrap_or_else(|| {
        root.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    })
}
