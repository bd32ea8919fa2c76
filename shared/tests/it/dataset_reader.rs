//! The OnDiskDataset reader: a valid dataset opens with the right shape, and
//! each fault of the format is refused with one line naming the file.

use std::fs;
use std::path::{Path, PathBuf};

use offgnn_shared::Error;
use offgnn_shared::dataset::{Dataset, Split};
use offgnn_shared::npy::{DType, encode_header};
use sampler::topology::{Csr, CsrOptions};

/// Writes raw little-endian bytes under a header for `dtype` and `shape`.
pub(crate) fn npy(path: &Path, dtype: DType, shape: &[u64], data: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut bytes = encode_header(dtype, shape);
    bytes.extend_from_slice(data);
    fs::write(path, bytes).unwrap();
}

pub(crate) fn i64s(values: &[i64]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub(crate) fn f32s(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

const METADATA: &str = "\
dataset_name: tiny
graph:
  nodes:
    - num: 6
  edges:
    - format: numpy
      path: edges/edges.npy
feature_data:
  - domain: node
    name: feat
    format: numpy
    in_memory: false
    path: data/feat.npy
  - domain: node
    name: label
    format: numpy
    path: data/label.npy
tasks:
  - name: node_classification
    num_classes: 3
    train_set:
      - data:
          - name: seeds
            format: numpy
            path: set/train_seeds.npy
          - name: labels
            format: numpy
            path: set/train_labels.npy
    validation_set:
      - data:
          - name: seed_nodes
            format: numpy
            path: set/valid_seeds.npy
    test_set:
      - data:
          - name: seeds
            format: numpy
            path: set/test_seeds.npy
";

/// A valid 6-node dataset: a ring plus one chord, 4-d features, 3 classes.
/// The validation set uses GraphBolt's older `seed_nodes` name and takes its
/// labels from the node feature `label`.
fn tiny(dir: &Path) -> PathBuf {
    let root = dir.join("tiny");
    fs::create_dir_all(&root).unwrap();
    fs::write(root.join("metadata.yaml"), METADATA).unwrap();
    let src = [0, 1, 2, 3, 4, 5, 0];
    let dst = [1, 2, 3, 4, 5, 0, 3];
    let edges: Vec<i64> = src.iter().chain(dst.iter()).copied().collect();
    npy(
        &root.join("edges/edges.npy"),
        DType::I64,
        &[2, 7],
        &i64s(&edges),
    );
    let feat: Vec<f32> = (0..24).map(|i| i as f32).collect();
    npy(
        &root.join("data/feat.npy"),
        DType::F32,
        &[6, 4],
        &f32s(&feat),
    );
    npy(
        &root.join("data/label.npy"),
        DType::I64,
        &[6],
        &i64s(&[0, 1, 2, 0, 1, 2]),
    );
    npy(
        &root.join("set/train_seeds.npy"),
        DType::I64,
        &[3],
        &i64s(&[0, 1, 2]),
    );
    npy(
        &root.join("set/train_labels.npy"),
        DType::I64,
        &[3],
        &i64s(&[0, 1, 2]),
    );
    npy(
        &root.join("set/valid_seeds.npy"),
        DType::I32,
        &[2],
        &[3, 0, 0, 0, 4, 0, 0, 0],
    );
    npy(
        &root.join("set/test_seeds.npy"),
        DType::I64,
        &[1],
        &i64s(&[5]),
    );
    root
}

/// The error of opening (and fully validating) the dataset, as one line.
fn open_err(root: &Path) -> String {
    let line = match Dataset::open(root) {
        Ok(ds) => Csr::from_edge_list(&ds.edges, CsrOptions::default(), |_| {})
            .err()
            .map(|e| e.to_string())
            .or_else(|| {
                let streamed = ds.edges.for_each_chunk(4, |_, _| Ok::<_, Error>(()));
                streamed.err().map(|e| e.to_string())
            })
            .expect("the dataset should have been refused"),
        Err(e) => e.to_string(),
    };
    assert!(!line.contains('\n'), "errors are one line: {line}");
    line
}

pub(crate) fn set_metadata(root: &Path, from: &str, to: &str) {
    let text = fs::read_to_string(root.join("metadata.yaml")).unwrap();
    assert!(text.contains(from), "metadata has no '{from}'");
    fs::write(root.join("metadata.yaml"), text.replacen(from, to, 1)).unwrap();
}

#[test]
fn opens_a_valid_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let ds = Dataset::open(tiny(dir.path())).unwrap();
    assert_eq!(ds.name, "tiny");
    assert_eq!(ds.num_nodes, 6);
    assert_eq!(ds.num_classes, 3);
    assert_eq!(ds.feature_dim(), 4);
    assert_eq!(ds.features.dtype(), DType::F32);
    assert_eq!(ds.edges.len_hint(), Some(7));
    assert_eq!(ds.train.seeds, vec![0, 1, 2]);
    assert_eq!(ds.split(Split::Valid).seeds, vec![3, 4]);
    // No labels file for the validation set: taken from the node labels.
    assert_eq!(ds.valid.labels, vec![0, 1]);
    assert_eq!(ds.test.labels, vec![2]);
    let mut row = vec![0u8; 16];
    ds.features.read_data_at(2 * 16, &mut row).unwrap();
    assert_eq!(row, f32s(&[8.0, 9.0, 10.0, 11.0]));
    let csr = Csr::from_edge_list(&ds.edges, CsrOptions::default(), |_| {}).unwrap();
    assert_eq!(csr.neighbors(3), &[0, 2]);
    assert_eq!(csr.num_edges(), 7);
}

#[test]
fn reads_csv_edges() {
    let dir = tempfile::tempdir().unwrap();
    let root = tiny(dir.path());
    fs::write(root.join("edges/edges.csv"), "0,1\n1,2\n\n2,0\n").unwrap();
    set_metadata(
        &root,
        "format: numpy\n      path: edges/edges.npy",
        "format: csv\n      path: edges/edges.csv",
    );
    let ds = Dataset::open(&root).unwrap();
    let csr = Csr::from_edge_list(&ds.edges, CsrOptions::default(), |_| {}).unwrap();
    assert_eq!(csr.num_edges(), 3);
    assert_eq!(csr.neighbors(0), &[2]);

    fs::write(root.join("edges/edges.csv"), "0,1\n1,x\n").unwrap();
    let err = open_err(&root);
    assert!(err.contains("edges.csv") && err.contains("line 2"), "{err}");
    fs::write(root.join("edges/edges.csv"), "src,dst\n0,1\n").unwrap();
    let err = open_err(&root);
    assert!(err.contains("line 1 'src,dst' is a header"), "{err}");
    fs::write(root.join("edges/edges.csv"), "0,1\n1,9\n").unwrap();
    let err = open_err(&root);
    assert!(err.contains("edges.csv") && err.contains("id 9"), "{err}");
}

#[test]
fn refuses_wrong_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let root = tiny(dir.path());
    npy(&root.join("data/feat.npy"), DType::F32, &[5, 4], &[0; 80]);
    let err = open_err(&root);
    assert!(err.contains("feat.npy") && err.contains("[6, d]"), "{err}");

    let root = tiny(&dir.path().join("b"));
    npy(&root.join("edges/edges.npy"), DType::I64, &[3, 2], &[0; 48]);
    let err = open_err(&root);
    assert!(err.contains("edges.npy") && err.contains("[2, E]"), "{err}");

    let root = tiny(&dir.path().join("c"));
    npy(
        &root.join("set/train_labels.npy"),
        DType::I64,
        &[2],
        &i64s(&[0, 1]),
    );
    let err = open_err(&root);
    assert!(
        err.contains("train_labels.npy") && err.contains("match the seeds"),
        "{err}"
    );

    let root = tiny(&dir.path().join("d"));
    npy(
        &root.join("set/test_seeds.npy"),
        DType::I64,
        &[1, 1],
        &i64s(&[5]),
    );
    let err = open_err(&root);
    assert!(
        err.contains("test_seeds.npy") && err.contains("one-dimensional"),
        "{err}"
    );
}

#[test]
fn refuses_ids_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    let root = tiny(dir.path());
    npy(
        &root.join("set/train_seeds.npy"),
        DType::I64,
        &[3],
        &i64s(&[0, 6, 2]),
    );
    let err = open_err(&root);
    assert!(
        err.contains("train_seeds.npy") && err.contains("seed 6 at element 1"),
        "{err}"
    );

    let root = tiny(&dir.path().join("e"));
    npy(
        &root.join("set/train_seeds.npy"),
        DType::I64,
        &[3],
        &i64s(&[0, 2, 2]),
    );
    let err = open_err(&root);
    assert!(
        err.contains("train_seeds.npy") && err.contains("seed 2 appears more than once"),
        "{err}"
    );

    let root = tiny(&dir.path().join("b"));
    npy(
        &root.join("set/test_seeds.npy"),
        DType::I64,
        &[1],
        &i64s(&[-1]),
    );
    let err = open_err(&root);
    assert!(
        err.contains("test_seeds.npy") && err.contains("negative"),
        "{err}"
    );

    let root = tiny(&dir.path().join("c"));
    let mut edges: Vec<i64> = vec![0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 0, 3];
    edges[9] = 17; // destination of edge 2
    npy(
        &root.join("edges/edges.npy"),
        DType::I64,
        &[2, 7],
        &i64s(&edges),
    );
    let err = open_err(&root);
    assert!(
        err.contains("edges.npy") && err.contains("destination id 17 of edge 2"),
        "{err}"
    );

    let root = tiny(&dir.path().join("d"));
    npy(
        &root.join("data/label.npy"),
        DType::I64,
        &[6],
        &i64s(&[0, 1, 2, 3, 1, 2]),
    );
    let err = open_err(&root);
    assert!(
        err.contains("label.npy") && err.contains("label 3 at element 3"),
        "{err}"
    );
}

#[test]
fn refuses_unsupported_dtypes() {
    let dir = tempfile::tempdir().unwrap();
    let root = tiny(dir.path());
    npy(&root.join("data/feat.npy"), DType::F64, &[6, 4], &[0; 192]);
    let err = open_err(&root);
    assert!(err.contains("feat.npy") && err.contains("float64"), "{err}");

    let root = tiny(&dir.path().join("b"));
    npy(
        &root.join("set/train_seeds.npy"),
        DType::F32,
        &[3],
        &[0; 12],
    );
    let err = open_err(&root);
    assert!(
        err.contains("train_seeds.npy") && err.contains("integer"),
        "{err}"
    );

    let root = tiny(&dir.path().join("c"));
    let mut bytes = encode_header(DType::F32, &[6, 4]);
    let at = bytes.windows(3).position(|w| w == b"<f4").unwrap();
    bytes[at] = b'>';
    bytes.extend_from_slice(&[0; 96]);
    fs::write(root.join("data/feat.npy"), bytes).unwrap();
    let err = open_err(&root);
    assert!(
        err.contains("feat.npy") && err.contains("big-endian"),
        "{err}"
    );
}

#[test]
fn refuses_fortran_order() {
    let dir = tempfile::tempdir().unwrap();
    let root = tiny(dir.path());
    let mut bytes = encode_header(DType::F32, &[6, 4]);
    let at = bytes.windows(5).position(|w| w == b"False").unwrap();
    bytes[at..at + 5].copy_from_slice(b"True ");
    bytes.extend_from_slice(&[0; 96]);
    fs::write(root.join("data/feat.npy"), bytes).unwrap();
    let err = open_err(&root);
    assert!(err.contains("feat.npy") && err.contains("Fortran"), "{err}");
}

#[test]
fn refuses_truncated_and_padded_files() {
    let dir = tempfile::tempdir().unwrap();
    let root = tiny(dir.path());
    npy(&root.join("data/feat.npy"), DType::F32, &[6, 4], &[0; 95]);
    let err = open_err(&root);
    assert!(
        err.contains("feat.npy") && err.contains("truncated"),
        "{err}"
    );

    let root = tiny(&dir.path().join("b"));
    npy(
        &root.join("edges/edges.npy"),
        DType::I64,
        &[2, 7],
        &[0; 104],
    );
    let err = open_err(&root);
    assert!(
        err.contains("edges.npy") && err.contains("truncated"),
        "{err}"
    );

    let root = tiny(&dir.path().join("c"));
    fs::write(
        root.join("set/train_seeds.npy"),
        &encode_header(DType::I64, &[3])[..20],
    )
    .unwrap();
    let err = open_err(&root);
    assert!(
        err.contains("train_seeds.npy") && err.contains("truncated"),
        "{err}"
    );

    let root = tiny(&dir.path().join("d"));
    npy(&root.join("data/feat.npy"), DType::F32, &[6, 4], &[0; 100]);
    let err = open_err(&root);
    assert!(
        err.contains("feat.npy") && err.contains("4 bytes after the data"),
        "{err}"
    );
}

#[test]
fn refuses_missing_files() {
    let dir = tempfile::tempdir().unwrap();
    let root = tiny(dir.path());
    fs::remove_file(root.join("data/feat.npy")).unwrap();
    let err = open_err(&root);
    assert!(
        err.contains("feature 'feat' names") && err.contains("feat.npy, which does not exist"),
        "{err}"
    );

    let root = tiny(&dir.path().join("b"));
    fs::remove_file(root.join("metadata.yaml")).unwrap();
    let err = open_err(&root);
    assert!(
        err.contains("metadata.yaml") && err.contains("No such file"),
        "{err}"
    );

    let root = tiny(&dir.path().join("c"));
    set_metadata(&root, "    num_classes: 3\n", "");
    let err = open_err(&root);
    assert!(
        err.contains("metadata.yaml") && err.contains("num_classes"),
        "{err}"
    );

    let root = tiny(&dir.path().join("d"));
    fs::write(root.join("metadata.yaml"), "graph: [unclosed").unwrap();
    let err = open_err(&root);
    assert!(
        err.contains("metadata.yaml") && err.contains("malformed"),
        "{err}"
    );

    // A set file or an edge file that is not there is named against
    // metadata.yaml (which may be the damaged file), not as a bare path.
    for (name, file) in [("e", "edges/edges.npy"), ("f", "set/train_seeds.npy")] {
        let root = tiny(&dir.path().join(name));
        fs::remove_file(root.join(file)).unwrap();
        let err = open_err(&root);
        assert!(
            err.contains("metadata.yaml: ") && err.contains("which does not exist"),
            "{file}: {err}"
        );
    }
}

#[test]
fn refuses_paths_outside_the_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let root = tiny(dir.path());
    set_metadata(&root, "path: data/feat.npy", "path: ../elsewhere/feat.npy");
    let err = open_err(&root);
    assert!(
        err.contains("metadata.yaml") && err.contains("leaves the dataset directory"),
        "{err}"
    );

    let root = tiny(&dir.path().join("b"));
    set_metadata(&root, "path: data/feat.npy", "path: /etc/passwd");
    let err = open_err(&root);
    assert!(err.contains("leaves the dataset directory"), "{err}");

    let root = tiny(&dir.path().join("c"));
    let outside = dir.path().join("outside.npy");
    fs::copy(root.join("data/feat.npy"), &outside).unwrap();
    fs::remove_file(root.join("data/feat.npy")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("data/feat.npy")).unwrap();
    let err = open_err(&root);
    assert!(err.contains("outside the dataset directory"), "{err}");
}

#[test]
fn a_typed_graph_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let root = tiny(dir.path());
    set_metadata(&root, "    - num: 6", "    - type: paper\n      num: 6");
    let err = open_err(&root);
    assert!(
        err.contains("a typed graph (1 node types, 1 edge types)"),
        "{err}"
    );
}
