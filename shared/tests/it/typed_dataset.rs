//! The typed dataset reader: GraphBolt's heterogeneous `OnDiskDataset`
//! opens with its types, relations and per-type features, and each fault is
//! refused in one line naming what is wrong.

use std::fs;
use std::path::{Path, PathBuf};

use offgnn_shared::Error;
use offgnn_shared::dataset::{Dataset, TypedDataset, is_typed};
use offgnn_shared::npy::DType;

use super::dataset_reader::{f32s, i64s, npy, set_metadata};

const METADATA: &str = "\
dataset_name: tiny-typed
graph:
  nodes:
    - type: author
      num: 4
    - type: paper
      num: 5
  edges:
    - type: paper:cites:paper
      format: csv
      path: edges/cites.csv
    - type: paper:written_by:author
      format: numpy
      path: edges/written_by.npy
    - type: author:writes:paper
      format: numpy
      path: edges/writes.npy
feature_data:
  - domain: node
    type: paper
    name: feat
    format: numpy
    path: data/paper-feat.npy
  - domain: node
    type: author
    name: feat
    format: numpy
    path: data/author-feat.npy
  - domain: node
    type: paper
    name: label
    format: numpy
    path: data/paper-label.npy
tasks:
  - name: node_classification
    num_classes: 3
    train_set:
      - type: paper
        data:
          - name: seeds
            format: numpy
            path: set/train_seeds.npy
          - name: labels
            format: numpy
            path: set/train_labels.npy
    validation_set:
      - type: paper
        data:
          - name: seeds
            format: numpy
            path: set/valid_seeds.npy
    test_set:
      - type: paper
        data:
          - name: seeds
            format: numpy
            path: set/test_seeds.npy
";

/// A valid typed dataset: 4 authors (2-d float16 features), 5 papers (3-d
/// float32 features and labels), citations in CSV, authorship both ways.
fn tiny_typed(dir: &Path) -> PathBuf {
    let root = dir.join("tiny-typed");
    fs::create_dir_all(root.join("edges")).unwrap();
    fs::write(root.join("metadata.yaml"), METADATA).unwrap();
    fs::write(root.join("edges/cites.csv"), "0,1\n1,2\n2,3\n3,4\n4,0\n").unwrap();
    write_authorship(&root, &[0, 1, 2, 3, 4], &[0, 1, 1, 2, 3]);
    let paper: Vec<f32> = (0..15).map(|i| i as f32).collect();
    npy(
        &root.join("data/paper-feat.npy"),
        DType::F32,
        &[5, 3],
        &f32s(&paper),
    );
    let author: Vec<u8> = (0..8)
        .flat_map(|i| half::f16::from_f32(i as f32).to_le_bytes())
        .collect();
    npy(
        &root.join("data/author-feat.npy"),
        DType::F16,
        &[4, 2],
        &author,
    );
    npy(
        &root.join("data/paper-label.npy"),
        DType::I64,
        &[5],
        &i64s(&[0, 1, 2, 0, 1]),
    );
    let ids = |name: &str, values: &[i64]| {
        npy(
            &root.join(format!("set/{name}.npy")),
            DType::I64,
            &[values.len() as u64],
            &i64s(values),
        )
    };
    ids("train_seeds", &[0, 1]);
    ids("train_labels", &[0, 1]);
    ids("valid_seeds", &[2]);
    ids("test_seeds", &[3, 4]);
    root
}

/// `paper:written_by:author` from `papers` to `authors`, and its reverse.
fn write_authorship(root: &Path, papers: &[i64], authors: &[i64]) {
    let n = papers.len() as u64;
    let forward: Vec<i64> = papers.iter().chain(authors).copied().collect();
    let reverse: Vec<i64> = authors.iter().chain(papers).copied().collect();
    npy(
        &root.join("edges/written_by.npy"),
        DType::I64,
        &[2, n],
        &i64s(&forward),
    );
    npy(
        &root.join("edges/writes.npy"),
        DType::I64,
        &[2, n],
        &i64s(&reverse),
    );
}

/// The error of opening the dataset and streaming every relation's edges,
/// as one line.
fn open_err(root: &Path) -> String {
    let line = match TypedDataset::open(root) {
        Ok(ds) => ds
            .relations
            .iter()
            .find_map(|r| r.edges.for_each_chunk(2, |_, _| Ok::<_, Error>(())).err())
            .map(|e| e.to_string())
            .expect("the dataset should have been refused"),
        Err(e) => e.to_string(),
    };
    assert!(!line.contains('\n'), "errors are one line: {line}");
    line
}

#[test]
fn a_typed_dataset_opens_with_its_types_and_relations() {
    let dir = tempfile::tempdir().unwrap();
    let root = tiny_typed(dir.path());
    assert!(is_typed(&root).unwrap());
    let ds = TypedDataset::open(&root).unwrap();
    assert_eq!(ds.name, "tiny-typed");
    let types: Vec<(&str, u64, u64)> = ds
        .node_types
        .iter()
        .map(|t| (t.name.as_str(), t.num, t.offset))
        .collect();
    assert_eq!(types, [("author", 4, 0), ("paper", 5, 4)]);
    assert_eq!(ds.num_nodes(), 9);
    // Widths and dtypes per type.
    let author = ds.node_types[0].features.as_ref().unwrap();
    let paper = ds.node_types[1].features.as_ref().unwrap();
    assert_eq!((author.shape(), author.dtype()), (&[4, 2][..], DType::F16));
    assert_eq!((paper.shape(), paper.dtype()), (&[5, 3][..], DType::F32));
    assert!(ds.node_types[0].labels.is_none());
    // Seeds move into the homogenized id space; labels follow them.
    assert_eq!(ds.target, 1);
    assert_eq!(ds.train.seeds, [4, 5]);
    assert_eq!(ds.train.labels, [0, 1]);
    assert_eq!(ds.valid.seeds, [6]);
    assert_eq!(ds.valid.labels, [2]);
    assert_eq!(ds.test.seeds, [7, 8]);
    assert_eq!(ds.type_of(3), (0, 3));
    assert_eq!(ds.type_of(4), (1, 0));
    assert_eq!(ds.type_of(8), (1, 4));
    let relations: Vec<(&str, usize, usize)> = ds
        .relations
        .iter()
        .map(|r| (r.name.as_str(), r.src, r.dst))
        .collect();
    assert_eq!(
        relations,
        [
            ("paper:cites:paper", 1, 1),
            ("paper:written_by:author", 1, 0),
            ("author:writes:paper", 0, 1)
        ]
    );
    // Edges stream in type-local ids.
    let mut written_by = Vec::new();
    ds.relations[1]
        .edges
        .for_each_chunk(2, |s, d| {
            written_by.extend(s.iter().zip(d).map(|(&s, &d)| (s, d)));
            Ok::<_, Error>(())
        })
        .unwrap();
    assert_eq!(written_by, [(0, 0), (1, 1), (2, 1), (3, 2), (4, 3)]);
    // The homogeneous reader names a typed graph in one line.
    let err = Dataset::open(&root).unwrap_err().to_string();
    assert!(
        err.contains("a typed graph (2 node types, 3 edge types)"),
        "{err}"
    );
}

#[test]
fn an_edge_type_between_unknown_types_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = tiny_typed(dir.path());
    set_metadata(&root, "type: paper:cites:paper", "type: paper:cites:venue");
    let err = open_err(&root);
    assert!(
        err.contains("edge type 'paper:cites:venue': node type 'venue' is not in graph.nodes"),
        "{err}"
    );

    let root = tiny_typed(&dir.path().join("b"));
    set_metadata(&root, "type: paper:cites:paper", "type: paper-cites-paper");
    let err = open_err(&root);
    assert!(
        err.contains("is not of the form 'src:relation:dst'"),
        "{err}"
    );

    let root = tiny_typed(&dir.path().join("c"));
    set_metadata(
        &root,
        "type: author:writes:paper",
        "type: paper:cites:paper",
    );
    let err = open_err(&root);
    assert!(err.contains("listed twice"), "{err}");
}

#[test]
fn an_id_out_of_its_types_range_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // Author 4 of 4 authors: in range of the 9 nodes, not of its type.
    let root = tiny_typed(dir.path());
    write_authorship(&root, &[0, 1, 2, 3, 4], &[0, 1, 1, 4, 3]);
    let err = open_err(&root);
    assert!(
        err.contains("written_by.npy")
            && err.contains(
                "destination id 4 of edge 3 is out of range for 4 nodes of type 'author'"
            ),
        "{err}"
    );

    // A negative id, read straight into the unsigned ids, is named as such
    // (element 4: the destination row's second).
    let root = tiny_typed(&dir.path().join("n"));
    write_authorship(&root, &[0, 1, 2], &[0, -1, 1]);
    let err = open_err(&root);
    assert!(
        err.contains("written_by.npy") && err.contains("negative value -1 at element 4"),
        "{err}"
    );

    let root = tiny_typed(&dir.path().join("b"));
    fs::write(root.join("edges/cites.csv"), "0,1\n5,2\n").unwrap();
    let err = open_err(&root);
    assert!(
        err.contains("source id 5 of edge 1 is out of range for 5 nodes of type 'paper'"),
        "{err}"
    );

    // A seed is checked against its own type too.
    let root = tiny_typed(&dir.path().join("c"));
    npy(
        &root.join("set/test_seeds.npy"),
        DType::I64,
        &[1],
        &i64s(&[5]),
    );
    let err = open_err(&root);
    assert!(
        err.contains("seed 5 at element 0 is out of range for 5 nodes of type 'paper'"),
        "{err}"
    );
}

#[test]
fn a_task_on_a_type_without_labels_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = tiny_typed(dir.path());
    let text = fs::read_to_string(root.join("metadata.yaml")).unwrap();
    let on_authors = text.replace("      - type: paper\n", "      - type: author\n");
    fs::write(root.join("metadata.yaml"), on_authors).unwrap();
    let err = open_err(&root);
    assert!(
        err.contains(
            "validation_set has no 'labels' and there is no node feature 'label' of type 'author'"
        ),
        "{err}"
    );

    // The sets of one task are of one type.
    let root = tiny_typed(&dir.path().join("b"));
    set_metadata(
        &root,
        "    validation_set:\n      - type: paper",
        "    validation_set:\n      - type: author",
    );
    let err = open_err(&root);
    assert!(
        err.contains("validation_set is of node type 'author' but train_set of 'paper'"),
        "{err}"
    );

    // A set must name its type.
    let root = tiny_typed(&dir.path().join("c"));
    set_metadata(
        &root,
        "    test_set:\n      - type: paper\n        data:",
        "    test_set:\n      - data:",
    );
    let err = open_err(&root);
    assert!(err.contains("test_set names no node type"), "{err}");
}

#[test]
fn two_feature_files_of_one_type_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = tiny_typed(dir.path());
    set_metadata(
        &root,
        "    name: feat\n    format: numpy\n    path: data/author-feat.npy\n",
        "    name: feat\n    format: numpy\n    path: data/author-feat.npy\n  - domain: node\n    type: author\n    name: emb\n    format: numpy\n    path: data/author-feat.npy\n",
    );
    let err = open_err(&root);
    assert!(
        err.contains(
            "node type 'author' has two feature files, 'feat' (data/author-feat.npy) and 'emb' (data/author-feat.npy): keep one"
        ),
        "{err}"
    );

    // A feature of an unknown type, one without a type, one of the wrong
    // row count.
    let root = tiny_typed(&dir.path().join("b"));
    set_metadata(
        &root,
        "    type: author\n    name: feat",
        "    type: venue\n    name: feat",
    );
    let err = open_err(&root);
    assert!(
        err.contains("node feature 'feat' is of node type 'venue'"),
        "{err}"
    );

    let root = tiny_typed(&dir.path().join("c"));
    set_metadata(&root, "    type: author\n    name: feat", "    name: feat");
    let err = open_err(&root);
    assert!(err.contains("node feature 'feat' names no type"), "{err}");

    let root = tiny_typed(&dir.path().join("d"));
    npy(
        &root.join("data/author-feat.npy"),
        DType::F32,
        &[5, 2],
        &f32s(&[0.0; 10]),
    );
    let err = open_err(&root);
    assert!(
        err.contains("author-feat.npy") && err.contains("features must have shape [4, d]"),
        "{err}"
    );
}

#[test]
fn malformed_node_types_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = tiny_typed(dir.path());
    set_metadata(&root, "    - type: paper\n      num: 5", "    - num: 5");
    let err = open_err(&root);
    assert!(err.contains("graph.nodes[1] has no type"), "{err}");

    let root = tiny_typed(&dir.path().join("b"));
    set_metadata(
        &root,
        "    - type: paper\n      num: 5",
        "    - type: author\n      num: 5",
    );
    let err = open_err(&root);
    assert!(err.contains("node type 'author' is listed twice"), "{err}");
}
