//! The Parquet importer: Cora from the graphdatascience wheel (fetched by
//! `scripts/setup` into `.cache/cora`), and hand-made tables for the faults.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, Float32Builder, Int64Array, ListBuilder, RecordBatch, StringArray};
use offgnn_shared::dataset::Dataset;
use offgnn_shared::npy::DType;
use parquet::arrow::ArrowWriter;
use sampler::parquet_import::{ImportConfig, import};
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
        id_column: "id".into(),
        features_column: "features".into(),
        label_column: "label".into(),
        source_column: "source".into(),
        target_column: "target".into(),
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
    cfg.label_column = "subject".into();
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
