//! The schema of `metadata.yaml`, as GraphBolt's `OnDiskDataset` writes it,
//! and its parsing.

use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

pub const METADATA_FILE: &str = "metadata.yaml";

#[derive(Debug, Serialize, Deserialize)]
pub struct Metadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset_name: Option<String>,
    pub graph: GraphMeta,
    #[serde(default)]
    pub feature_data: Vec<FeatureMeta>,
    #[serde(default)]
    pub tasks: Vec<TaskMeta>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct GraphMeta {
    pub nodes: Vec<NodeMeta>,
    pub edges: Vec<EdgeMeta>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct NodeMeta {
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub node_type: Option<String>,
    pub num: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct EdgeMeta {
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub edge_type: Option<String>,
    pub format: String,
    pub path: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct FeatureMeta {
    pub domain: String,
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub node_type: Option<String>,
    pub name: String,
    pub format: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_memory: Option<bool>,
    pub path: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TaskMeta {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_classes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_set: Option<Vec<SetMeta>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation_set: Option<Vec<SetMeta>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test_set: Option<Vec<SetMeta>>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SetMeta {
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub node_type: Option<String>,
    pub data: Vec<SetDataMeta>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SetDataMeta {
    pub name: String,
    pub format: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_memory: Option<bool>,
    pub path: String,
}

impl Metadata {
    /// The `metadata.yaml` of the dataset at `root`, parsed, not validated.
    pub fn read(root: &Path) -> Result<Metadata> {
        read_metadata(&root.join(METADATA_FILE))
    }

    /// Every file path it names: edges, features and the tasks' set data.
    pub fn named_paths(&self) -> impl Iterator<Item = String> + '_ {
        let edges = self.graph.edges.iter().map(|e| e.path.clone());
        let features = self.feature_data.iter().map(|f| f.path.clone());
        let sets = self.tasks.iter().flat_map(|t| {
            [&t.train_set, &t.validation_set, &t.test_set]
                .into_iter()
                .flatten()
                .flatten()
                .flat_map(|e| e.data.iter().map(|d| d.path.clone()))
        });
        edges.chain(features).chain(sets)
    }
}

/// Reads and parses `metadata.yaml`; a file that is not valid YAML of this
/// schema is one error naming it.
pub(super) fn read_metadata(meta_path: &Path) -> Result<Metadata> {
    let text = fs::read_to_string(meta_path).map_err(|e| Error::io(meta_path, e))?;
    serde_yaml_ng::from_str(&text)
        .map_err(|e| Error::dataset(meta_path, format!("malformed metadata: {e}")))
}
