//! Checks every part of a dataset shares: paths from `metadata.yaml` stay
//! inside the dataset, id arrays are integers, labels fit the class count.

use std::path::{Component, Path, PathBuf};

use crate::error::{Error, Result};
use crate::npy::NpyFile;

/// Resolves a path from metadata.yaml inside the dataset root, refusing
/// absolute paths, `..` and symbolic links that lead outside it.
pub(super) fn resolve(root: &Path, meta_path: &Path, rel: &str) -> Result<PathBuf> {
    let p = Path::new(rel);
    if p.is_absolute()
        || p.components()
            .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(Error::dataset(
            meta_path,
            format!(
                "path '{rel}' leaves the dataset directory; paths must be relative and inside it"
            ),
        ));
    }
    let full = root.join(p);
    if let (Ok(canon_root), Ok(canon)) = (root.canonicalize(), full.canonicalize())
        && !canon.starts_with(&canon_root)
    {
        return Err(Error::dataset(
            meta_path,
            format!(
                "path '{rel}' resolves to {} outside the dataset directory",
                canon.display()
            ),
        ));
    }
    Ok(full)
}

pub(super) fn require_integer(f: &NpyFile) -> Result<()> {
    if f.dtype().is_integer() {
        Ok(())
    } else {
        Err(Error::npy(
            f.path(),
            format!(
                "unsupported dtype {}: an integer array is required",
                f.dtype()
            ),
        ))
    }
}

pub(super) fn check_labels(path: &Path, labels: &[u64], num_classes: u64) -> Result<()> {
    if let Some((i, &l)) = labels.iter().enumerate().find(|(_, l)| **l >= num_classes) {
        return Err(Error::npy(
            path,
            format!("label {l} at element {i} is out of range for num_classes {num_classes}"),
        ));
    }
    Ok(())
}
