//! The Parquet importer: Cora from the graphdatascience wheel (fetched by
//! `scripts/setup` into `.cache/cora`), and hand-made tables for the faults.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, Float32Builder, Int64Array, ListBuilder, RecordBatch, StringArray};
use offgnn_shared::dataset::{Dataset, TypedDataset};
use offgnn_shared::npy::DType;
use parquet::arrow::ArrowWriter;
use sampler::parquet_import::{Columns, ImportConfig, TypedImportConfig, import, import_typed};
use sampler::topology::{Csr, CsrOptions};

fn cora_dir() -> PathBuf {
    let dir = std::env::var_os("OFFGNN_CORA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.cache/cora"));
    assert!(
        dir.join("cora_nodes.parquet.gzip").exists(),
        "the Cora tables are missing from {}: run scripts/setup (or scripts/test)",
        dir.display()
    );
    dir
}

#[test]
fn imports_cora() {
    let cora = cora_dir();
    let out = tempfile::tempdir().unwrap();
    let cfg = ImportConfig::cora(
        cora.join("cora_nodes.parquet.gzip"),
        cora.join("cora_rels.parquet.gzip"),
    );
    let s = import(&out.path().join("cora"), &cfg, false).unwrap();
    assert_eq!(s.num_nodes, 2708);
    assert_eq!(s.input_edges, 5429);
    assert_eq!(s.num_edges, 2 * 5429);
    assert_eq!(s.num_classes, 7);
    assert_eq!(s.feature_dim, 1433);
    assert_eq!(s.train + s.valid + s.test, 2708);
    assert_eq!(s.train, 1625); // round(0.6 * 2708)

    let ds = Dataset::open(out.path().join("cora")).unwrap();
    assert_eq!(ds.num_nodes, 2708);
    assert_eq!(ds.num_classes, 7);
    assert_eq!(ds.features.shape(), &[2708, 1433]);
    // Cora's features are binary word occurrences.
    let mut row = vec![0u8; 1433 * 4];
    ds.features.read_data_at(0, &mut row).unwrap();
    let values: Vec<f32> = row
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert!(values.iter().all(|&v| v == 0.0 || v == 1.0));
    assert!(values.contains(&1.0));
    // Every class occurs; the largest (Neural_Networks) has 818 papers.
    let mut counts = [0usize; 7];
    for set in [&ds.train, &ds.valid, &ds.test] {
        for &l in &set.labels {
            counts[l as usize] += 1;
        }
    }
    assert_eq!(counts.iter().sum::<usize>(), 2708);
    assert_eq!(*counts.iter().max().unwrap(), 818);
    // Reverse edges make the graph symmetric.
    let csr = Csr::from_edge_list(&ds.edges, CsrOptions::default(), |_| {}).unwrap();
    assert_eq!(csr.num_edges(), 2 * 5429);
    for v in 0..2708u32 {
        for &u in csr.neighbors(v) {
            assert!(
                csr.neighbors(u).binary_search(&v).is_ok(),
                "{u}->{v} has no reverse"
            );
        }
    }

    // The split is fixed by its seed: a second import is identical.
    let again = tempfile::tempdir().unwrap();
    import(&again.path().join("cora"), &cfg, false).unwrap();
    for file in [
        "set/train_seeds.npy",
        "set/test_labels.npy",
        "data/feat.npy",
        "edges/edges.npy",
    ] {
        assert_eq!(
            std::fs::read(out.path().join("cora").join(file)).unwrap(),
            std::fs::read(again.path().join("cora").join(file)).unwrap(),
            "{file} differs between two imports"
        );
    }
}

/// The tables' column names.
fn columns() -> Columns {
    Columns {
        id: "id".into(),
        features: "features".into(),
        label: "label".into(),
        source: "source".into(),
        target: "target".into(),
    }
}

fn write_table(path: &Path, columns: Vec<(&str, ArrayRef)>) {
    let batch = RecordBatch::try_from_iter(columns).unwrap();
    let mut w = ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

fn features(rows: &[&[f32]]) -> ArrayRef {
    let mut b = ListBuilder::new(Float32Builder::new());
    for r in rows {
        b.values().append_slice(r);
        b.append(true);
    }
    Arc::new(b.finish())
}

/// Nodes with sparse 64-bit ids 1000, 1 << 40, 7; labels 0, 1, 1.
fn tables(dir: &Path, feats: ArrayRef, ids: Vec<i64>, edge_src: Vec<i64>) -> ImportConfig {
    let nodes = dir.join("nodes.parquet");
    let edges = dir.join("edges.parquet");
    write_table(
        &nodes,
        vec![
            ("id", Arc::new(Int64Array::from(ids)) as ArrayRef),
            ("features", feats),
            (
                "label",
                Arc::new(Int64Array::from(vec![0, 1, 1])) as ArrayRef,
            ),
        ],
    );
    let n = edge_src.len();
    write_table(
        &edges,
        vec![
            ("source", Arc::new(Int64Array::from(edge_src)) as ArrayRef),
            (
                "target",
                Arc::new(Int64Array::from(vec![7i64; n])) as ArrayRef,
            ),
        ],
    );
    ImportConfig {
        name: "t".into(),
        nodes,
        edges,
        columns: columns(),
        add_reverse: false,
        dtype: DType::F16,
        train_fraction: 0.34,
        valid_fraction: 0.33,
        split_seed: 1,
    }
}

#[test]
fn remaps_sparse_ids_and_writes_f16() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = tables(
        dir.path(),
        features(&[&[1.0, 2.0], &[3.0, 4.0], &[5.0, 0.5]]),
        vec![1000, 1 << 40, 7],
        vec![1000, 1 << 40],
    );
    let s = import(&dir.path().join("out"), &cfg, false).unwrap();
    assert_eq!(
        (s.num_nodes, s.num_edges, s.num_classes, s.feature_dim),
        (3, 2, 2, 2)
    );
    let ds = Dataset::open(dir.path().join("out")).unwrap();
    assert_eq!(ds.features.dtype(), DType::F16);
    let mut row = vec![0u8; 4];
    ds.features.read_data_at(4, &mut row).unwrap();
    assert_eq!(
        row,
        [
            half::f16::from_f32(3.0).to_le_bytes(),
            half::f16::from_f32(4.0).to_le_bytes()
        ]
        .concat()
    );
    let csr = Csr::from_edge_list(&ds.edges, CsrOptions::default(), |_| {}).unwrap();
    // Dense ids follow the node table's row order: 7 is node 2.
    assert_eq!(csr.neighbors(2), &[0, 1]);
}

#[test]
fn refuses_bad_tables() {
    let dir = tempfile::tempdir().unwrap();
    let ok_feats = || features(&[&[1.0], &[2.0], &[3.0]]);

    let cfg = tables(dir.path(), ok_feats(), vec![1, 2, 1], vec![1]);
    let err = import(&dir.path().join("a"), &cfg, false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("nodes.parquet") && err.contains("node id 1 appears twice"),
        "{err}"
    );
    assert!(!dir.path().join("a").exists(), "nothing is left behind");

    let cfg = tables(dir.path(), ok_feats(), vec![1, 2, 7], vec![99]);
    let err = import(&dir.path().join("b"), &cfg, false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("edges.parquet") && err.contains("source 99 at row 0"),
        "{err}"
    );
    assert!(!dir.path().join("b").exists());

    let cfg = tables(
        dir.path(),
        features(&[&[1.0], &[2.0, 3.0], &[3.0]]),
        vec![1, 2, 7],
        vec![1],
    );
    let err = import(&dir.path().join("c"), &cfg, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("row 1 has length 2, expected 1"), "{err}");

    let mut cfg = tables(dir.path(), ok_feats(), vec![1, 2, 7], vec![1]);
    cfg.columns.label = "subject".into();
    let err = import(&dir.path().join("d"), &cfg, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("no column 'subject'"), "{err}");

    let cfg = tables(
        dir.path(),
        Arc::new(StringArray::from(vec!["a", "b", "c"])),
        vec![1, 2, 7],
        vec![1],
    );
    let err = import(&dir.path().join("e"), &cfg, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("a list of numbers is required"), "{err}");

    std::fs::write(dir.path().join("junk.parquet"), b"not parquet at all").unwrap();
    let mut cfg = tables(dir.path(), ok_feats(), vec![1, 2, 7], vec![1]);
    cfg.nodes = dir.path().join("junk.parquet");
    let err = import(&dir.path().join("f"), &cfg, false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("junk.parquet") && err.contains("not a readable Parquet file"),
        "{err}"
    );

    // An existing output is refused unless asked to overwrite.
    std::fs::create_dir(dir.path().join("g")).unwrap();
    let cfg = tables(dir.path(), ok_feats(), vec![1, 2, 7], vec![1]);
    let err = import(&dir.path().join("g"), &cfg, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("already exists"), "{err}");
    import(&dir.path().join("g"), &cfg, true).unwrap();
}

/// Tables of a typed graph: papers (features, labels, sparse ids),
/// authors (features of another width), institutes (no features);
/// citations, authorship and affiliations.
fn typed_tables(dir: &Path) -> TypedImportConfig {
    write_table(
        &dir.join("papers.parquet"),
        vec![
            ("id", Arc::new(Int64Array::from(vec![100, 200, 300, 400]))),
            (
                "features",
                features(&[&[1.0, 0.0], &[0.0, 1.0], &[1.0, 1.0], &[0.5, 0.5]]),
            ),
            ("label", Arc::new(Int64Array::from(vec![0, 1, 1, 0]))),
        ],
    );
    write_table(
        &dir.join("authors.parquet"),
        vec![
            ("id", Arc::new(Int64Array::from(vec![7, 8, 9]))),
            (
                "features",
                features(&[&[1.0, 2.0, 3.0], &[4.0, 5.0, 6.0], &[7.0, 8.0, 9.0]]),
            ),
        ],
    );
    write_table(
        &dir.join("institutes.parquet"),
        vec![("id", Arc::new(Int64Array::from(vec![-5, 5])))],
    );
    let edges = |name: &str, src: Vec<i64>, dst: Vec<i64>| {
        write_table(
            &dir.join(name),
            vec![
                ("source", Arc::new(Int64Array::from(src))),
                ("target", Arc::new(Int64Array::from(dst))),
            ],
        );
        dir.join(name)
    };
    TypedImportConfig {
        name: "typed".into(),
        node_tables: vec![
            ("paper".into(), dir.join("papers.parquet")),
            ("author".into(), dir.join("authors.parquet")),
            ("institute".into(), dir.join("institutes.parquet")),
        ],
        edge_tables: vec![
            (
                "paper:cites:paper".into(),
                edges("cites.parquet", vec![100, 200, 300], vec![200, 300, 400]),
            ),
            (
                "paper:written_by:author".into(),
                edges("wb.parquet", vec![100, 200, 400, 400], vec![7, 8, 8, 9]),
            ),
            (
                "author:affiliated_to:institute".into(),
                edges("aff.parquet", vec![7, 8, 9], vec![5, -5, 5]),
            ),
        ],
        target: "paper".into(),
        columns: columns(),
        add_reverse: true,
        dtype: DType::F32,
        train_fraction: 0.5,
        valid_fraction: 0.25,
        split_seed: 0,
    }
}

fn relation_edges(ds: &TypedDataset, name: &str) -> Vec<(u64, u64)> {
    let r = ds.relations.iter().find(|r| r.name == name).unwrap();
    let mut out = Vec::new();
    r.edges
        .for_each_chunk(16, |s, d| {
            out.extend(s.iter().copied().zip(d.iter().copied()));
            Ok::<_, offgnn_shared::Error>(())
        })
        .unwrap();
    out
}

#[test]
fn imports_a_typed_graph_one_table_per_type_and_relation() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = typed_tables(dir.path());
    let out = dir.path().join("typed");
    let s = import_typed(&out, &cfg, false).unwrap();
    assert_eq!(s.num_classes, 2);
    let ds = TypedDataset::open(&out).unwrap();
    let types: Vec<(&str, u64, Option<u64>)> = ds
        .node_types
        .iter()
        .map(|t| {
            (
                t.name.as_str(),
                t.num,
                t.features.as_ref().map(|f| f.shape()[1]),
            )
        })
        .collect();
    assert_eq!(
        types,
        [
            ("paper", 4, Some(2)),
            ("author", 3, Some(3)),
            ("institute", 2, None)
        ]
    );
    // Ids become type-local rows; citations gain their reverses in the
    // same file, bipartite relations a reverse relation of their own.
    assert_eq!(
        relation_edges(&ds, "paper:cites:paper"),
        [(0, 1), (1, 2), (2, 3), (1, 0), (2, 1), (3, 2)]
    );
    assert_eq!(
        relation_edges(&ds, "paper:written_by:author"),
        [(0, 0), (1, 1), (3, 1), (3, 2)]
    );
    assert_eq!(
        relation_edges(&ds, "author:rev_written_by:paper"),
        [(0, 0), (1, 1), (1, 3), (2, 3)]
    );
    assert_eq!(
        relation_edges(&ds, "institute:rev_affiliated_to:author"),
        [(1, 0), (0, 1), (1, 2)]
    );
    assert_eq!(ds.relations.len(), 5);
    // The task is the papers', labelled from their table.
    assert_eq!(ds.node_types[ds.target].name, "paper");
    let mut seeds: Vec<u32> = [&ds.train, &ds.valid, &ds.test]
        .iter()
        .flat_map(|s| s.seeds.clone())
        .collect();
    seeds.sort_unstable();
    assert_eq!(seeds, [0, 1, 2, 3]);
    for set in [&ds.train, &ds.valid, &ds.test] {
        for (&s, &l) in set.seeds.iter().zip(&set.labels) {
            assert_eq!(l, [0, 1, 1, 0][s as usize]);
        }
    }
}

#[test]
fn typed_tables_that_do_not_fit_are_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("typed");
    let err = |cfg: &TypedImportConfig| {
        let e = import_typed(&out, cfg, false).unwrap_err().to_string();
        assert!(!e.contains('\n'), "{e}");
        e
    };
    let base = typed_tables(dir.path());

    let mut cfg = base.clone();
    cfg.edge_tables[0].0 = "paper:cites:venue".into();
    assert!(
        err(&cfg).contains("relation 'paper:cites:venue': node type 'venue' has no node table")
    );

    let mut cfg = base.clone();
    cfg.target = "author".into();
    let e = err(&cfg);
    assert!(
        e.contains("authors.parquet") && e.contains("no column 'label'"),
        "{e}"
    );

    let mut cfg = base.clone();
    cfg.node_tables
        .push(("paper".into(), dir.path().join("papers.parquet")));
    assert!(err(&cfg).contains("node type 'paper' has two node tables"));

    // An author id that is not in the authors' table.
    let mut cfg = base.clone();
    cfg.edge_tables[1].1 = dir.path().join("cites.parquet");
    let e = err(&cfg);
    assert!(
        e.contains("target 200 at row 0 is not in the destination type's node table"),
        "{e}"
    );
    assert!(!out.exists(), "a refused import leaves nothing");
}

/// Every node of a split, over the three splits, sorted, with its label.
fn split_nodes(sets: [&offgnn_shared::dataset::SeedSet; 3]) -> Vec<(u32, u32)> {
    let mut all: Vec<(u32, u32)> = sets
        .iter()
        .flat_map(|s| s.seeds.iter().copied().zip(s.labels.iter().copied()))
        .collect();
    all.sort_unstable();
    all
}

#[test]
fn a_null_label_leaves_its_node_in_the_graph_and_in_no_split() {
    let dir = tempfile::tempdir().unwrap();
    let labels = || {
        Arc::new(Int64Array::from(vec![
            Some(0),
            None,
            Some(1),
            None,
            Some(1),
            Some(0),
        ]))
    };
    write_table(
        &dir.path().join("nodes.parquet"),
        vec![
            (
                "id",
                Arc::new(Int64Array::from(vec![10, 11, 12, 13, 14, 15])),
            ),
            ("features", features(&[&[1.0f32] as &[f32]; 6])),
            ("label", labels()),
        ],
    );
    write_table(
        &dir.path().join("edges.parquet"),
        vec![
            ("source", Arc::new(Int64Array::from(vec![11, 13, 10]))),
            ("target", Arc::new(Int64Array::from(vec![10, 12, 15]))),
        ],
    );
    let cfg = ImportConfig {
        name: "partly labeled".into(),
        nodes: dir.path().join("nodes.parquet"),
        edges: dir.path().join("edges.parquet"),
        columns: columns(),
        add_reverse: false,
        dtype: DType::F32,
        train_fraction: 0.5,
        valid_fraction: 0.25,
        split_seed: 3,
    };
    let s = import(&dir.path().join("out"), &cfg, false).unwrap();
    assert_eq!((s.num_nodes, s.unlabeled, s.num_classes), (6, 2, 2));
    assert_eq!((s.train, s.valid, s.test), (2, 1, 1));
    let ds = Dataset::open(dir.path().join("out")).unwrap();
    assert_eq!(ds.num_nodes, 6);
    assert_eq!(
        split_nodes([&ds.train, &ds.valid, &ds.test]),
        [(0, 0), (2, 1), (4, 1), (5, 0)]
    );
    // No per-node label file: an unlabeled node has no value to hold there.
    assert!(!dir.path().join("out/data/label.npy").exists());

    // The typed importer's target type, the same way.
    let mut typed = typed_tables(dir.path());
    write_table(
        &dir.path().join("papers.parquet"),
        vec![
            ("id", Arc::new(Int64Array::from(vec![100, 200, 300, 400]))),
            ("features", features(&[&[1.0f32, 0.0] as &[f32]; 4])),
            (
                "label",
                Arc::new(Int64Array::from(vec![Some(1), Some(0), None, Some(1)])),
            ),
        ],
    );
    typed.train_fraction = 0.34;
    let s = import_typed(&dir.path().join("typed"), &typed, false).unwrap();
    assert_eq!((s.unlabeled, s.train + s.valid + s.test), (1, 3));
    let ds = TypedDataset::open(dir.path().join("typed")).unwrap();
    assert!(ds.node_types[ds.target].labels.is_none());
    assert_eq!(
        split_nodes([&ds.train, &ds.valid, &ds.test]),
        [(0, 1), (1, 0), (3, 1)]
    );

    // A label column null in every row labels nothing to learn.
    write_table(
        &dir.path().join("nodes.parquet"),
        vec![
            ("id", Arc::new(Int64Array::from(vec![10, 11]))),
            ("features", features(&[&[1.0f32] as &[f32]; 2])),
            ("label", Arc::new(Int64Array::from(vec![None, None]))),
        ],
    );
    let err = import(&dir.path().join("none"), &cfg, false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("column 'label' is null in every row"), "{err}");
    assert!(!dir.path().join("none").exists());
}
