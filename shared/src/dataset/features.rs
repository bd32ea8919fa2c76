//! The node features (`N x d`, float32 or float16) and the optional node
//! labels that `metadata.yaml`'s `feature_data` names.

use std::path::{Path, PathBuf};

use super::checks::{require_integer, resolve};
use super::metadata::{FeatureMeta, Metadata};
use crate::error::{Error, Result};
use crate::npy::{DType, NpyFile};

/// The entries of `feature_data` that describe nodes.
pub(super) fn node_features(meta: &Metadata) -> Vec<&FeatureMeta> {
    meta.feature_data
        .iter()
        .filter(|f| f.domain == "node")
        .collect()
}

/// The feature file: the node feature named `feat` (or the only one that is
/// not `label`), opened and checked to be float `[num_nodes, d]` with `d > 0`.
pub(super) fn open_features(
    root: &Path,
    meta_path: &Path,
    node_features: &[&FeatureMeta],
    num_nodes: u64,
) -> Result<NpyFile> {
    let bad = |fault: String| Error::dataset(meta_path, fault);
    let feat_meta = node_features
        .iter()
        .find(|f| f.name == "feat")
        .or_else(|| {
            let mut others = node_features.iter().filter(|f| f.name != "label");
            match (others.next(), others.next()) {
                (Some(f), None) => Some(f),
                _ => None,
            }
        })
        .ok_or_else(|| bad("no node feature named 'feat' in feature_data".into()))?;
    open_feature_file(root, meta_path, feat_meta, num_nodes)
}

/// One node feature file, opened and checked to be float32 or float16
/// `[num_nodes, d]` with `d > 0`.
pub(super) fn open_feature_file(
    root: &Path,
    meta_path: &Path,
    feat_meta: &FeatureMeta,
    num_nodes: u64,
) -> Result<NpyFile> {
    if feat_meta.format != "numpy" {
        return Err(Error::dataset(
            meta_path,
            format!(
                "feature '{}' has format '{}'; only numpy is supported",
                feat_meta.name, feat_meta.format
            ),
        ));
    }
    let feat_path = resolve(root, meta_path, &feat_meta.path)?;
    if !feat_path.exists() {
        let of_type = feat_meta
            .node_type
            .as_ref()
            .map_or(String::new(), |t| format!(" of node type '{t}'"));
        return Err(Error::dataset(
            meta_path,
            format!(
                "feature '{}'{of_type} names {}, which does not exist",
                feat_meta.name,
                feat_path.display()
            ),
        ));
    }
    let features = NpyFile::open(&feat_path)?;
    if !matches!(features.dtype(), DType::F32 | DType::F16) {
        return Err(Error::npy(
            &feat_path,
            format!(
                "unsupported feature dtype {}: features must be float32 or float16",
                features.dtype()
            ),
        ));
    }
    match features.shape() {
        [n, d] if *n == num_nodes && *d > 0 => {}
        shape => {
            return Err(Error::npy(
                &feat_path,
                format!("features must have shape [{num_nodes}, d] with d > 0, found {shape:?}"),
            ));
        }
    }
    Ok(features)
}

/// The node feature `label`, if there is one: an integer array of one label
/// per node, read whole (its range is checked once the class count is known).
pub(super) fn open_node_labels(
    root: &Path,
    meta_path: &Path,
    node_features: &[&FeatureMeta],
    num_nodes: u64,
) -> Result<Option<(PathBuf, Vec<u64>)>> {
    node_features
        .iter()
        .find(|f| f.name == "label")
        .map(|m| open_label_file(root, meta_path, m, num_nodes))
        .transpose()
}

/// One `label` node feature: an integer array of one label per node, read
/// whole.
pub(super) fn open_label_file(
    root: &Path,
    meta_path: &Path,
    label_meta: &FeatureMeta,
    num_nodes: u64,
) -> Result<(PathBuf, Vec<u64>)> {
    let path = resolve(root, meta_path, &label_meta.path)?;
    let f = NpyFile::open(&path)?;
    require_integer(&f)?;
    if f.shape() != [num_nodes] {
        return Err(Error::npy(
            &path,
            format!(
                "labels must have shape [{num_nodes}], found {:?}",
                f.shape()
            ),
        ));
    }
    Ok((path, f.read_all_u64()?))
}
