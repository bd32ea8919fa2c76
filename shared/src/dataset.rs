//! The canonical dataset input: the homogeneous subset of DGL GraphBolt's
//! `OnDiskDataset` directory. A `metadata.yaml` names the node count, the
//! edges (`.npy` of shape `[2, E]` or a CSV of `src,dst` lines), node features
//! (`.npy`, f32 or f16, `N x d`), labels, `num_classes` and the train,
//! validation and test sets. Opening a dataset validates everything that can be
//! checked without reading the edges or features; edge ids are checked as the
//! edges stream past (see [`EdgeList::for_each_chunk`]).
//!
//! The writer side ([`DatasetWriter`]) is used by the Parquet importer and the
//! synthetic generator; it builds in a temporary directory and renames it into
//! place last, so a dataset directory is either whole or absent.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::npy::{self, DType, NpyFile};

pub const METADATA_FILE: &str = "metadata.yaml";

/// The three seed splits of a node-classification task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    Train,
    Valid,
    Test,
}

impl Split {
    pub const ALL: [Split; 3] = [Split::Train, Split::Valid, Split::Test];

    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Valid => "valid",
            Split::Test => "test",
        }
    }

    fn yaml_key(self) -> &'static str {
        match self {
            Split::Train => "train_set",
            Split::Valid => "validation_set",
            Split::Test => "test_set",
        }
    }
}

impl std::fmt::Display for Split {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

// ---- metadata.yaml, as GraphBolt writes it -------------------------------

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

#[derive(Debug, Serialize, Deserialize)]
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

#[derive(Debug, Serialize, Deserialize)]
pub struct SetMeta {
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub node_type: Option<String>,
    pub data: Vec<SetDataMeta>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct SetDataMeta {
    pub name: String,
    pub format: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_memory: Option<bool>,
    pub path: String,
}

// ---- the validated dataset ------------------------------------------------

/// Where the edges live.
#[derive(Debug)]
pub enum EdgeSource {
    /// `[2, E]` integer array: row 0 sources, row 1 destinations.
    Numpy(NpyFile),
    /// One `src,dst` pair per line, no header.
    Csv(PathBuf),
}

/// The edge list of a dataset, with the node count it must respect.
#[derive(Debug)]
pub struct EdgeList {
    pub source: EdgeSource,
    pub num_nodes: u64,
}

/// One split's seeds and their labels, checked against the node count and
/// the class count.
#[derive(Clone, Debug, Default)]
pub struct SeedSet {
    pub seeds: Vec<u32>,
    pub labels: Vec<u32>,
}

#[derive(Debug)]
pub struct Dataset {
    pub root: PathBuf,
    pub name: String,
    pub num_nodes: u64,
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
        let text = fs::read_to_string(&meta_path).map_err(|e| Error::io(&meta_path, e))?;
        let meta: Metadata = serde_yaml_ng::from_str(&text)
            .map_err(|e| Error::dataset(&meta_path, format!("malformed metadata: {e}")))?;
        let bad = |fault: String| Error::dataset(&meta_path, fault);

        let [node] = meta.graph.nodes.as_slice() else {
            return Err(bad(format!(
                "graph.nodes has {} entries; only homogeneous graphs (one node type) are supported",
                meta.graph.nodes.len()
            )));
        };
        if node.node_type.is_some() {
            return Err(bad(
                "typed nodes: only homogeneous graphs are supported".into()
            ));
        }
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

        let [edge] = meta.graph.edges.as_slice() else {
            return Err(bad(format!(
                "graph.edges has {} entries; only homogeneous graphs (one edge type) are supported",
                meta.graph.edges.len()
            )));
        };
        if edge.edge_type.is_some() {
            return Err(bad(
                "typed edges: only homogeneous graphs are supported".into()
            ));
        }
        let edge_path = resolve(&root, &meta_path, &edge.path)?;
        let source = match edge.format.as_str() {
            "numpy" => {
                let f = NpyFile::open(&edge_path)?;
                if f.shape().len() != 2 || f.shape()[0] != 2 {
                    return Err(Error::npy(
                        &edge_path,
                        format!("edges must have shape [2, E], found {:?}", f.shape()),
                    ));
                }
                require_integer(&f)?;
                EdgeSource::Numpy(f)
            }
            "csv" => {
                fs::metadata(&edge_path).map_err(|e| Error::io(&edge_path, e))?;
                EdgeSource::Csv(edge_path)
            }
            other => {
                return Err(bad(format!(
                    "edge format '{other}' is not supported (numpy or csv)"
                )));
            }
        };

        let node_features: Vec<&FeatureMeta> = meta
            .feature_data
            .iter()
            .filter(|f| f.domain == "node")
            .collect();
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
        if feat_meta.format != "numpy" {
            return Err(bad(format!(
                "feature '{}' has format '{}'; only numpy is supported",
                feat_meta.name, feat_meta.format
            )));
        }
        let feat_path = resolve(&root, &meta_path, &feat_meta.path)?;
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
                    format!(
                        "features must have shape [{num_nodes}, d] with d > 0, found {shape:?}"
                    ),
                ));
            }
        }

        let node_labels = match node_features.iter().find(|f| f.name == "label") {
            Some(m) => {
                let path = resolve(&root, &meta_path, &m.path)?;
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
                Some((path, f.read_all_u64()?))
            }
            None => None,
        };

        let task = meta
            .tasks
            .iter()
            .find(|t| t.name == "node_classification")
            .or(meta.tasks.first())
            .ok_or_else(|| bad("no task: a node classification task is required".into()))?;
        let num_classes = task
            .num_classes
            .ok_or_else(|| bad(format!("task '{}' has no num_classes", task.name)))?;
        if num_classes == 0 || num_classes > u32::MAX as u64 {
            return Err(bad(format!("num_classes {num_classes} is out of range")));
        }
        if let Some((path, labels)) = &node_labels {
            check_labels(path, labels, num_classes)?;
        }

        let mut sets = Vec::with_capacity(3);
        for split in Split::ALL {
            let set = match split {
                Split::Train => &task.train_set,
                Split::Valid => &task.validation_set,
                Split::Test => &task.test_set,
            };
            let set = set
                .as_deref()
                .ok_or_else(|| bad(format!("task '{}' has no {}", task.name, split.yaml_key())))?;
            sets.push(load_set(
                &root,
                &meta_path,
                split,
                set,
                num_nodes,
                num_classes,
                node_labels.as_ref().map(|(_, l)| l.as_slice()),
            )?);
        }
        let test = sets.pop().expect("three sets");
        let valid = sets.pop().expect("three sets");
        let train = sets.pop().expect("three sets");
        if train.seeds.is_empty() {
            return Err(bad("the train set is empty".into()));
        }

        Ok(Dataset {
            name: meta.dataset_name.clone().unwrap_or_else(|| {
                root.file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default()
            }),
            root,
            num_nodes,
            num_classes: num_classes as u32,
            edges: EdgeList { source, num_nodes },
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

    /// A SHA-256 fingerprint of everything but the features: metadata.yaml,
    /// the edge file (by size and sampled contents), and every seed and label.
    /// Two datasets with the same fingerprint have the same topology and task.
    pub fn fingerprint(&self) -> Result<String> {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        let meta = self.root.join(METADATA_FILE);
        h.update(fs::read(&meta).map_err(|e| Error::io(&meta, e))?);
        for split in Split::ALL {
            let set = self.split(split);
            h.update(split.name());
            h.update((set.seeds.len() as u64).to_le_bytes());
            for (&s, &l) in set.seeds.iter().zip(&set.labels) {
                h.update(s.to_le_bytes());
                h.update(l.to_le_bytes());
            }
        }
        h.update(file_fingerprint(self.edges.path())?);
        Ok(crate::store::hex(&h.finalize()))
    }

    /// Feature dimension `d`.
    pub fn feature_dim(&self) -> u64 {
        self.features.shape()[1]
    }
}

/// A SHA-256 over a file's size and 64 KiB read at 17 evenly spaced offsets
/// (start and end included): cheap for files of any size, and it changes
/// when a file is swapped for another, truncated or regenerated.
pub fn file_fingerprint(path: &Path) -> Result<String> {
    use sha2::Digest;
    use std::os::unix::fs::FileExt;
    const SAMPLE: u64 = 64 << 10;
    const POINTS: u64 = 16;
    let file = fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    let mut h = sha2::Sha256::new();
    h.update(len.to_le_bytes());
    let mut buf = vec![0u8; SAMPLE as usize];
    for i in 0..=POINTS {
        let at = (len.saturating_sub(SAMPLE)) * i / POINTS;
        let n = SAMPLE.min(len - at) as usize;
        file.read_exact_at(&mut buf[..n], at)
            .map_err(|e| Error::io(path, e))?;
        h.update(&buf[..n]);
    }
    Ok(crate::store::hex(&h.finalize()))
}

fn require_integer(f: &NpyFile) -> Result<()> {
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

fn check_labels(path: &Path, labels: &[u64], num_classes: u64) -> Result<()> {
    if let Some((i, &l)) = labels.iter().enumerate().find(|(_, l)| **l >= num_classes) {
        return Err(Error::npy(
            path,
            format!("label {l} at element {i} is out of range for num_classes {num_classes}"),
        ));
    }
    Ok(())
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
            split.yaml_key(),
            set.len()
        )));
    };
    if entry.node_type.is_some() {
        return Err(bad(format!(
            "{} is typed: only homogeneous graphs are supported",
            split.yaml_key()
        )));
    }
    let mut seeds = None;
    let mut labels = None;
    for data in &entry.data {
        if data.format != "numpy" {
            return Err(bad(format!(
                "{} '{}' has format '{}'; only numpy is supported",
                split.yaml_key(),
                data.name,
                data.format
            )));
        }
        let path = resolve(root, meta_path, &data.path)?;
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
            split.yaml_key()
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
            format!("seed {s} at element {i} is out of range for {num_nodes} nodes"),
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
                return Err(bad(format!(
                    "{} has no 'labels' and there is no node feature 'label'",
                    split.yaml_key()
                )));
            }
        },
    };
    Ok(SeedSet {
        seeds: seeds.into_iter().map(|s| s as u32).collect(),
        labels: labels.into_iter().map(|l| l as u32).collect(),
    })
}

/// Resolves a path from metadata.yaml inside the dataset root, refusing
/// absolute paths, `..` and symbolic links that lead outside it.
fn resolve(root: &Path, meta_path: &Path, rel: &str) -> Result<PathBuf> {
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

impl EdgeList {
    /// Number of edges, when known without a scan (numpy).
    pub fn len_hint(&self) -> Option<u64> {
        match &self.source {
            EdgeSource::Numpy(f) => Some(f.shape()[1]),
            EdgeSource::Csv(_) => None,
        }
    }

    pub fn path(&self) -> &Path {
        match &self.source {
            EdgeSource::Numpy(f) => f.path(),
            EdgeSource::Csv(p) => p,
        }
    }

    /// Streams the edges in chunks of at most `chunk` pairs, checking every
    /// id against the node count. Memory stays at `O(chunk)`.
    pub fn for_each_chunk(
        &self,
        chunk: usize,
        mut f: impl FnMut(&[u64], &[u64]) -> Result<()>,
    ) -> Result<()> {
        let chunk = chunk.max(1);
        let check = |path: &Path, ids: &[u64], base: u64, what: &str| -> Result<()> {
            if let Some((i, &v)) = ids.iter().enumerate().find(|(_, v)| **v >= self.num_nodes) {
                return Err(Error::npy(
                    path,
                    format!(
                        "{what} id {v} of edge {} is out of range for {} nodes",
                        base + i as u64,
                        self.num_nodes
                    ),
                ));
            }
            Ok(())
        };
        match &self.source {
            EdgeSource::Numpy(file) => {
                let e = file.shape()[1];
                let mut start = 0u64;
                while start < e {
                    let n = chunk.min((e - start) as usize);
                    let src = file.read_u64(start, n)?;
                    let dst = file.read_u64(e + start, n)?;
                    check(file.path(), &src, start, "source")?;
                    check(file.path(), &dst, start, "destination")?;
                    f(&src, &dst)?;
                    start += n as u64;
                }
                Ok(())
            }
            EdgeSource::Csv(path) => {
                let file = fs::File::open(path).map_err(|e| Error::io(path, e))?;
                let reader = BufReader::with_capacity(1 << 20, file);
                let (mut src, mut dst) = (Vec::with_capacity(chunk), Vec::with_capacity(chunk));
                let mut base = 0u64;
                for (lineno, line) in reader.lines().enumerate() {
                    let line = line.map_err(|e| Error::io(path, e))?;
                    let line = line.trim();
                    if line.is_empty() {
                        continue;
                    }
                    let parse = |s: Option<&str>| -> Result<u64> {
                        let s = s.map(str::trim).unwrap_or("");
                        s.parse::<u64>().map_err(|_| {
                            Error::dataset(
                                path,
                                format!(
                                    "line {}: expected 'src,dst' with non-negative integer ids, found '{line}'",
                                    lineno + 1
                                ),
                            )
                        })
                    };
                    // GraphBolt reads edge CSV without a header: a first line
                    // of names is refused as such, not as a bad edge.
                    if lineno == 0 && line.chars().any(|c| c.is_ascii_alphabetic()) {
                        return Err(Error::dataset(
                            path,
                            format!(
                                "line 1 '{line}' is a header; GraphBolt's edge CSV has none (one 'src,dst' pair of integer ids per line): remove it"
                            ),
                        ));
                    }
                    let mut parts = line.split(',');
                    let (s, d) = (parse(parts.next())?, parse(parts.next())?);
                    if parts.next().is_some() {
                        return Err(Error::dataset(
                            path,
                            format!("line {}: more than two columns", lineno + 1),
                        ));
                    }
                    src.push(s);
                    dst.push(d);
                    if src.len() == chunk {
                        check(path, &src, base, "source")?;
                        check(path, &dst, base, "destination")?;
                        f(&src, &dst)?;
                        base += src.len() as u64;
                        src.clear();
                        dst.clear();
                    }
                }
                if !src.is_empty() {
                    check(path, &src, base, "source")?;
                    check(path, &dst, base, "destination")?;
                    f(&src, &dst)?;
                }
                Ok(())
            }
        }
    }
}

// ---- writing ----------------------------------------------------------------

/// Builds a dataset directory in `<out>.partial-<pid>` and renames it into
/// place on [`DatasetWriter::commit`]; dropped uncommitted, it removes the
/// partial directory.
pub struct DatasetWriter {
    out: PathBuf,
    tmp: PathBuf,
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
    pub num_classes: u32,
}

/// Relative paths of the files a [`DatasetWriter`] lays out.
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
            committed: false,
        })
    }

    /// Where a file of the layout goes while the dataset is being built.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.tmp.join(rel)
    }

    /// Writes one split's seeds and labels.
    pub fn write_split(&self, split: Split, seeds: &[u64], labels: &[u64]) -> Result<()> {
        npy::write_i64(self.path(&layout::seeds(split)), seeds)?;
        npy::write_i64(self.path(&layout::labels(split)), labels)
    }

    /// Writes metadata.yaml (naming every file of [`layout`]), validates the
    /// whole dataset by opening it, and renames it into place.
    pub fn commit(mut self, spec: &DatasetSpec) -> Result<PathBuf> {
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
            feature_data: vec![
                FeatureMeta {
                    domain: "node".into(),
                    node_type: None,
                    name: "feat".into(),
                    format: "numpy".into(),
                    in_memory: Some(false),
                    path: layout::FEATURES.into(),
                },
                FeatureMeta {
                    domain: "node".into(),
                    node_type: None,
                    name: "label".into(),
                    format: "numpy".into(),
                    in_memory: Some(true),
                    path: layout::LABELS.into(),
                },
            ],
            tasks: vec![TaskMeta {
                name: "node_classification".into(),
                num_classes: Some(spec.num_classes as u64),
                train_set: set(Split::Train),
                validation_set: set(Split::Valid),
                test_set: set(Split::Test),
            }],
        };
        let text = serde_yaml_ng::to_string(&meta)
            .map_err(|e| Error::dataset(&self.tmp, format!("cannot encode metadata: {e}")))?;
        let meta_path = self.tmp.join(METADATA_FILE);
        fs::write(&meta_path, text).map_err(|e| Error::io(&meta_path, e))?;
        Dataset::open(&self.tmp)?;
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
        // old one, now at the partial name, goes after.
        let replaced = self.out.exists();
        if replaced {
            rustix::fs::renameat_with(
                rustix::fs::CWD,
                &self.tmp,
                rustix::fs::CWD,
                &self.out,
                rustix::fs::RenameFlags::EXCHANGE,
            )
            .map_err(|e| Error::io(&self.out, std::io::Error::from(e)))?;
        } else {
            fs::rename(&self.tmp, &self.out).map_err(|e| Error::io(&self.out, e))?;
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
