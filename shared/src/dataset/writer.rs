//! The writer side: [`DatasetWriter`] builds a dataset directory beside its
//! final place and renames it in last, so a dataset is whole or absent; a
//! program stopped by a signal removes what it was writing.

use std::fs;
use std::path::{Path, PathBuf};

use super::metadata::{
    EdgeMeta, FeatureMeta, GraphMeta, METADATA_FILE, Metadata, NodeMeta, SetDataMeta, SetMeta,
    TaskMeta,
};
use super::open::Dataset;
use super::tasks::Split;
use super::typed::{TypedDataset, describes_typed};
use crate::error::{Error, Result};
use crate::npy;

/// Builds a dataset directory in `<out>.partial-<pid>` and renames it into
/// place on [`DatasetWriter::commit`]; dropped uncommitted, it removes the
/// partial directory.
pub struct DatasetWriter {
    out: PathBuf,
    tmp: PathBuf,
    /// Whether a dataset found at `out` when committing may be replaced.
    overwrite: bool,
    committed: bool,
}

/// The partial directories of the datasets this process is writing, shared
/// with [`abandon_partial`]: a program stopped by a signal removes them from
/// a thread of its own, and a commit holds this lock while it puts a
/// dataset in place, so the two never cross.
static WRITING: std::sync::Mutex<Writing> = std::sync::Mutex::new(Writing {
    partial: Vec::new(),
    committed: Vec::new(),
    abandoned: false,
});

struct Writing {
    partial: Vec<PathBuf>,
    committed: Vec<PathBuf>,
    /// Set by [`abandon_partial`]: no dataset is committed after it.
    abandoned: bool,
}

fn writing() -> std::sync::MutexGuard<'static, Writing> {
    // A panic while holding it leaves plain data behind: still usable.
    WRITING.lock().unwrap_or_else(|e| e.into_inner())
}

/// What [`abandon_partial`] found.
#[derive(Debug, Default)]
pub struct Abandoned {
    /// The partial directories it removed.
    pub removed: Vec<PathBuf>,
    /// Datasets this process committed before it was stopped.
    pub committed: Vec<PathBuf>,
}

/// Removes the partial directory of every dataset this process is writing
/// and keeps any from being committed afterwards: for `sampler generate`
/// and `import-parquet` stopped by a signal. Those it could not remove are
/// logged.
pub fn abandon_partial() -> Abandoned {
    let mut w = writing();
    w.abandoned = true;
    let mut removed = Vec::new();
    for dir in w.partial.drain(..) {
        // The writing thread may create a file while the tree is being
        // removed (`Directory not empty`): try again a few times.
        let mut result = fs::remove_dir_all(&dir);
        for _ in 0..20 {
            if result.is_ok() || !dir.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
            result = fs::remove_dir_all(&dir);
        }
        match result {
            Err(e) if dir.exists() => {
                tracing::warn!("could not remove {}: {e}", dir.display());
            }
            _ => removed.push(dir),
        }
    }
    Abandoned {
        removed,
        committed: w.committed.clone(),
    }
}

/// Removes the partial directories `.NAME.partial-PID` beside `out` whose
/// process is gone (killed before it could remove its own): a later run
/// cleans up after a crashed one.
fn remove_stale_partials(out: &Path, name: &str) {
    let Some(parent) = out.parent() else {
        return;
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    let prefix = format!(".{name}.partial-");
    for entry in entries.flatten() {
        let file_name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = file_name
            .strip_prefix(&prefix)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let alive = Path::new(&format!("/proc/{pid}")).exists();
        if !alive && pid != std::process::id() {
            let path = entry.path();
            match fs::remove_dir_all(&path) {
                Ok(()) => tracing::info!(
                    "removed {}, left by a run that ended before its commit",
                    path.display()
                ),
                Err(e) => tracing::warn!("could not remove {}: {e}", path.display()),
            }
        }
    }
}

/// What the writer puts in metadata.yaml.
pub struct DatasetSpec {
    pub name: String,
    pub num_nodes: u64,
    /// 0 for a graph for link prediction alone: no node-classification
    /// task (and no split files) then.
    pub num_classes: u32,
    /// Whether `data/label.npy` (every node's label) was written; without
    /// it, the splits' label files carry the labels.
    pub node_labels: bool,
    /// Tasks after the node-classification one (`link_prediction`).
    pub extra_tasks: Vec<TaskMeta>,
}

/// Relative paths of the files a [`DatasetWriter`] lays out.
/// A typed dataset as [`DatasetWriter::commit_typed`] writes it, its files
/// at the [`layout`]'s `typed_*` paths.
pub struct TypedSpec {
    pub name: String,
    /// Each type's name, node count and whether it has a feature file.
    pub node_types: Vec<(String, u64, bool)>,
    /// Relations `src:relation:dst`.
    pub relations: Vec<String>,
    /// The node type the task classifies.
    pub target: String,
    pub num_classes: u32,
    /// Whether the target type's label file (every node's label) was
    /// written; without it, the splits' label files carry the labels.
    pub node_labels: bool,
}

pub mod layout {
    pub const EDGES: &str = "edges/edges.npy";
    pub const FEATURES: &str = "data/feat.npy";
    pub const LABELS: &str = "data/label.npy";
    pub fn seeds(split: super::Split) -> String {
        format!("set/{}_seeds.npy", split.name())
    }
    pub fn labels(split: super::Split) -> String {
        format!("set/{}_labels.npy", split.name())
    }
    /// The link-prediction task's files (`train_seeds`, `valid_labels`, ...).
    pub fn link(name: &str) -> String {
        format!("set/lp_{name}.npy")
    }
    /// Every file [`link`] names.
    /// A typed dataset's relation `src:relation:dst`.
    pub fn typed_edges(relation: &str) -> String {
        format!("edges/{}.npy", relation.replace(':', "__"))
    }
    pub fn typed_features(node_type: &str) -> String {
        format!("data/{node_type}-feat.npy")
    }
    pub fn typed_labels(node_type: &str) -> String {
        format!("data/{node_type}-label.npy")
    }
    pub fn typed_seeds(node_type: &str, split: super::Split) -> String {
        format!("set/{node_type}_{}_seeds.npy", split.name())
    }
    pub fn typed_set_labels(node_type: &str, split: super::Split) -> String {
        format!("set/{node_type}_{}_labels.npy", split.name())
    }
    pub const LINK_FILES: [&str; 7] = [
        "train_seeds",
        "valid_seeds",
        "valid_labels",
        "valid_indexes",
        "test_seeds",
        "test_labels",
        "test_indexes",
    ];
}

/// The first file under `dir` that a [`DatasetWriter`] does not write, if
/// any: what `--overwrite` must not remove. `dir` may be a file itself.
fn foreign_file(dir: &Path) -> Result<Option<PathBuf>> {
    if !dir.is_dir() {
        return Ok(Some(dir.to_path_buf()));
    }
    let mut ours: Vec<String> = vec![
        METADATA_FILE.to_string(),
        layout::EDGES.to_string(),
        layout::FEATURES.to_string(),
        layout::LABELS.to_string(),
    ];
    for split in Split::ALL {
        ours.push(layout::seeds(split));
        ours.push(layout::labels(split));
    }
    ours.extend(layout::LINK_FILES.iter().map(|f| layout::link(f)));
    // A typed dataset's files are those its metadata names.
    if let Ok(meta) = Metadata::read(dir) {
        ours.extend(meta.named_paths());
    }
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).map_err(|e| Error::io(&d, e))? {
            let path = entry.map_err(|e| Error::io(&d, e))?.path();
            let rel = path
                .strip_prefix(dir)
                .expect("listed under dir")
                .to_string_lossy()
                .into_owned();
            if path.is_dir() && ["edges", "data", "set"].contains(&rel.as_str()) {
                stack.push(path);
            } else if !ours.contains(&rel) {
                return Ok(Some(path));
            }
        }
    }
    Ok(None)
}

impl DatasetWriter {
    /// Starts a dataset at `out`. An existing `out` is refused unless
    /// `overwrite`, in which case it is replaced only at commit.
    pub fn create(out: impl AsRef<Path>, overwrite: bool) -> Result<Self> {
        let out = out.as_ref().to_path_buf();
        if out.exists() && !overwrite {
            return Err(Error::InvalidArgument(format!(
                "{} already exists; pass --overwrite to replace it",
                out.display()
            )));
        }
        if out.exists()
            && let Some(foreign) = foreign_file(&out)?
        {
            return Err(Error::InvalidArgument(format!(
                "{} is not a dataset this program wrote (it holds {}); --overwrite replaces only such a dataset: choose another --out",
                out.display(),
                foreign.display()
            )));
        }
        let name = out
            .file_name()
            .ok_or_else(|| {
                Error::InvalidArgument(format!("{} is not a directory name", out.display()))
            })?
            .to_string_lossy()
            .into_owned();
        remove_stale_partials(&out, &name);
        let tmp = out.with_file_name(format!(".{name}.partial-{}", std::process::id()));
        let mut w = writing();
        if w.abandoned {
            return Err(Error::InvalidArgument(format!(
                "{}: this process is stopping; nothing was written",
                out.display()
            )));
        }
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
        }
        w.partial.push(tmp.clone());
        drop(w);
        for sub in ["edges", "data", "set"] {
            let dir = tmp.join(sub);
            fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        }
        Ok(DatasetWriter {
            out,
            tmp,
            overwrite,
            committed: false,
        })
    }

    /// Where a file of the layout goes while the dataset is being built.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.tmp.join(rel)
    }

    /// Writes one split's seeds and labels.
    /// A typed dataset's split of its target type: type-local seeds.
    pub fn write_typed_split(
        &self,
        node_type: &str,
        split: Split,
        seeds: &[u64],
        labels: &[u64],
    ) -> Result<()> {
        npy::write_i64(self.path(&layout::typed_seeds(node_type, split)), seeds)?;
        npy::write_i64(
            self.path(&layout::typed_set_labels(node_type, split)),
            labels,
        )
    }

    /// Commits a typed dataset whose files are at the layout's `typed_*`
    /// paths.
    pub fn commit_typed(self, spec: &TypedSpec) -> Result<PathBuf> {
        let data = |name: &str, path: String| SetDataMeta {
            name: name.into(),
            format: "numpy".into(),
            in_memory: None,
            path,
        };
        let target = spec.target.as_str();
        let set = |split: Split| {
            Some(vec![SetMeta {
                node_type: Some(target.into()),
                data: vec![
                    data("seeds", layout::typed_seeds(target, split)),
                    data("labels", layout::typed_set_labels(target, split)),
                ],
            }])
        };
        let feature = |node_type: &str, name: &str, path: String, in_memory: bool| FeatureMeta {
            domain: "node".into(),
            node_type: Some(node_type.into()),
            name: name.into(),
            format: "numpy".into(),
            in_memory: Some(in_memory),
            path,
        };
        let mut feature_data: Vec<FeatureMeta> = spec
            .node_types
            .iter()
            .filter(|(_, _, features)| *features)
            .map(|(t, _, _)| feature(t, "feat", layout::typed_features(t), false))
            .collect();
        if spec.node_labels {
            feature_data.push(feature(target, "label", layout::typed_labels(target), true));
        }
        let meta = Metadata {
            dataset_name: Some(spec.name.clone()),
            graph: GraphMeta {
                nodes: spec
                    .node_types
                    .iter()
                    .map(|(t, num, _)| NodeMeta {
                        node_type: Some(t.clone()),
                        num: *num,
                    })
                    .collect(),
                edges: spec
                    .relations
                    .iter()
                    .map(|r| EdgeMeta {
                        edge_type: Some(r.clone()),
                        format: "numpy".into(),
                        path: layout::typed_edges(r),
                    })
                    .collect(),
            },
            feature_data,
            tasks: vec![TaskMeta {
                name: "node_classification".into(),
                num_classes: Some(spec.num_classes as u64),
                train_set: set(Split::Train),
                validation_set: set(Split::Valid),
                test_set: set(Split::Test),
            }],
        };
        self.commit_metadata(&meta)
    }

    pub fn write_split(&self, split: Split, seeds: &[u64], labels: &[u64]) -> Result<()> {
        npy::write_i64(self.path(&layout::seeds(split)), seeds)?;
        npy::write_i64(self.path(&layout::labels(split)), labels)
    }

    /// Writes metadata.yaml (naming every file of [`layout`]), validates the
    /// whole dataset by opening it, and renames it into place.
    pub fn commit(self, spec: &DatasetSpec) -> Result<PathBuf> {
        let data = |name: &str, path: String| SetDataMeta {
            name: name.into(),
            format: "numpy".into(),
            in_memory: None,
            path,
        };
        let set = |split: Split| {
            Some(vec![SetMeta {
                node_type: None,
                data: vec![
                    data("seeds", layout::seeds(split)),
                    data("labels", layout::labels(split)),
                ],
            }])
        };
        let meta = Metadata {
            dataset_name: Some(spec.name.clone()),
            graph: GraphMeta {
                nodes: vec![NodeMeta {
                    node_type: None,
                    num: spec.num_nodes,
                }],
                edges: vec![EdgeMeta {
                    edge_type: None,
                    format: "numpy".into(),
                    path: layout::EDGES.into(),
                }],
            },
            feature_data: std::iter::once(FeatureMeta {
                domain: "node".into(),
                node_type: None,
                name: "feat".into(),
                format: "numpy".into(),
                in_memory: Some(false),
                path: layout::FEATURES.into(),
            })
            .chain(spec.node_labels.then(|| FeatureMeta {
                domain: "node".into(),
                node_type: None,
                name: "label".into(),
                format: "numpy".into(),
                in_memory: Some(true),
                path: layout::LABELS.into(),
            }))
            .collect(),
            tasks: (spec.num_classes > 0)
                .then(|| TaskMeta {
                    name: "node_classification".into(),
                    num_classes: Some(spec.num_classes as u64),
                    train_set: set(Split::Train),
                    validation_set: set(Split::Valid),
                    test_set: set(Split::Test),
                })
                .into_iter()
                .chain(spec.extra_tasks.iter().cloned())
                .collect(),
        };
        self.commit_metadata(&meta)
    }

    /// Writes `meta` as the dataset's `metadata.yaml`, opens the dataset to
    /// validate it (typed or not) and puts it in place.
    pub fn commit_metadata(mut self, meta: &Metadata) -> Result<PathBuf> {
        let text = serde_yaml_ng::to_string(meta)
            .map_err(|e| Error::dataset(&self.tmp, format!("cannot encode metadata: {e}")))?;
        let meta_path = self.tmp.join(METADATA_FILE);
        fs::write(&meta_path, text).map_err(|e| Error::io(&meta_path, e))?;
        if describes_typed(meta) {
            TypedDataset::open(&self.tmp)?;
        } else {
            Dataset::open(&self.tmp)?;
        }
        crate::commit::fault_point(crate::commit::OBJECTS_WRITTEN);
        // Under the lock, so that a signal's cleanup comes wholly before
        // (and this commit then refuses) or wholly after.
        let mut w = writing();
        if w.abandoned {
            return Err(Error::InvalidArgument(format!(
                "{}: this process is stopping; the dataset was not committed",
                self.out.display()
            )));
        }
        // The new dataset goes in first, in one step: over an old one the
        // two directories are swapped (renameat2's RENAME_EXCHANGE), so a
        // reader sees the old dataset or the new one, never neither; the
        // old one, now at the partial name, goes after. Without
        // `overwrite`, a dataset another run put there meanwhile stays.
        let replaced = self.overwrite && self.out.exists();
        let flags = match replaced {
            true => rustix::fs::RenameFlags::EXCHANGE,
            false => rustix::fs::RenameFlags::NOREPLACE,
        };
        let moved = rustix::fs::renameat_with(
            rustix::fs::CWD,
            &self.tmp,
            rustix::fs::CWD,
            &self.out,
            flags,
        );
        match moved {
            Ok(()) => {}
            Err(rustix::io::Errno::EXIST | rustix::io::Errno::NOTEMPTY) => {
                return Err(Error::InvalidArgument(format!(
                    "{}: another run put a dataset there while this one wrote its own; it stays, and this one was not committed (pass --overwrite to replace it)",
                    self.out.display()
                )));
            }
            Err(e) => return Err(Error::io(&self.out, std::io::Error::from(e))),
        }
        w.committed.push(self.out.clone());
        self.committed = true;
        crate::commit::fault_point(crate::commit::COMMITTED);
        if replaced {
            // A crash here leaves the old dataset at the partial name,
            // which the next run removes as a dead process's partial.
            if let Err(e) = fs::remove_dir_all(&self.tmp) {
                tracing::warn!(
                    "could not remove the replaced dataset, now at {}: {e}",
                    self.tmp.display()
                );
            }
        }
        w.partial.retain(|p| *p != self.tmp);
        Ok(self.out.clone())
    }
}

impl Drop for DatasetWriter {
    fn drop(&mut self) {
        if !self.committed {
            let mut w = writing();
            let _ = fs::remove_dir_all(&self.tmp);
            w.partial.retain(|p| *p != self.tmp);
        }
    }
}
