//! Imports a graph exported as two Parquet tables — nodes (id, feature list,
//! label) and edges (source id, target id) — into the `OnDiskDataset` layout.
//! Arbitrary 64-bit node ids are remapped to dense ids in the node table's row
//! order; features stream to the `.npy` file as the table is read, so only the
//! id map and the labels are held in memory.
//!
//! Typed graphs, one table per node type and per relation, are imported
//! by `typed` with the same readers.
//!
//! The split is fixed and documented: a seeded shuffle of the labeled
//! nodes' dense ids ([`offgnn_shared::dataset::seeded_split`]), by default
//! seed 0 with 60% train, 20% validation and 20% test. A null label leaves
//! its node unlabeled, in the graph and in no split.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float32Type, Int64Type};
use half::f16;
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

use offgnn_shared::dataset::{DatasetSpec, DatasetWriter, Split, layout, seeded_split};
use offgnn_shared::npy::{self, DType, NpyWriter};

use crate::error::{Error, Result};

mod typed;
pub use typed::{
    ImportedRelation, ImportedType, TypedImportConfig, TypedImportSummary, import_typed,
};

/// Which columns of the tables hold what.
#[derive(Clone, Debug)]
pub struct Columns {
    /// Node tables: the node id, the feature list and the label.
    pub id: String,
    pub features: String,
    pub label: String,
    /// Edge tables: the source and target node ids.
    pub source: String,
    pub target: String,
}

/// Where the tables are and which columns hold what.
#[derive(Clone, Debug)]
pub struct ImportConfig {
    pub name: String,
    pub nodes: PathBuf,
    pub edges: PathBuf,
    pub columns: Columns,
    /// Also write `v -> u` for every `u -> v`.
    pub add_reverse: bool,
    /// Feature dtype on disk: F32 or F16.
    pub dtype: DType,
    pub train_fraction: f64,
    pub valid_fraction: f64,
    pub split_seed: u64,
}

impl ImportConfig {
    /// Column names of the Cora tables shipped in `graphdatascience`
    /// (`graphdatascience/resources/cora/`), with reverse edges added because
    /// citations are messages in both directions for classification.
    pub fn cora(nodes: PathBuf, edges: PathBuf) -> Self {
        ImportConfig {
            name: "cora".into(),
            nodes,
            edges,
            columns: Columns {
                id: "nodeId".into(),
                features: "features".into(),
                label: "subject".into(),
                source: "sourceNodeId".into(),
                target: "targetNodeId".into(),
            },
            add_reverse: true,
            dtype: DType::F32,
            train_fraction: 0.6,
            valid_fraction: 0.2,
            split_seed: 0,
        }
    }
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct ImportSummary {
    pub dataset: PathBuf,
    pub num_nodes: u64,
    /// Edges in the input table.
    pub input_edges: u64,
    /// Edges written (doubled when reverse edges are added).
    pub num_edges: u64,
    pub num_classes: u32,
    pub feature_dim: u64,
    /// Nodes whose label is null: in the graph, in no split.
    pub unlabeled: u64,
    pub train: usize,
    pub valid: usize,
    pub test: usize,
}

fn open_table(
    path: &Path,
) -> Result<(u64, parquet::arrow::arrow_reader::ParquetRecordBatchReader)> {
    let file = File::open(path).map_err(|e| offgnn_shared::Error::io(path, e))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file)
        .map_err(|e| Error::parquet(path, format!("not a readable Parquet file: {e}")))?;
    let rows = builder.metadata().file_metadata().num_rows().max(0) as u64;
    let reader = builder
        .with_batch_size(8192)
        .build()
        .map_err(|e| Error::parquet(path, e.to_string()))?;
    Ok((rows, reader))
}

fn column<'a>(path: &Path, batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef> {
    batch.column_by_name(name).ok_or_else(|| {
        let have: Vec<_> = batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        Error::parquet(
            path,
            format!("no column '{name}' (columns: {})", have.join(", ")),
        )
    })
}

/// A column of integers as i64, nulls kept.
fn nullable_int_column(
    path: &Path,
    batch: &RecordBatch,
    name: &str,
) -> Result<arrow::array::Int64Array> {
    let col = column(path, batch, name)?;
    if !col.data_type().is_integer() {
        return Err(Error::parquet(
            path,
            format!(
                "column '{name}' has type {}, an integer column is required",
                col.data_type()
            ),
        ));
    }
    let cast = arrow::compute::cast(col, &DataType::Int64)
        .map_err(|e| Error::parquet(path, format!("column '{name}': {e}")))?;
    Ok(cast.as_primitive::<Int64Type>().clone())
}

/// A column of integer ids as i64, refusing nulls.
fn int_column(path: &Path, batch: &RecordBatch, name: &str) -> Result<Vec<i64>> {
    let col = nullable_int_column(path, batch, name)?;
    if col.null_count() > 0 {
        return Err(Error::parquet(path, format!("column '{name}' holds nulls")));
    }
    Ok(col.values().to_vec())
}

/// Imports the tables, writing the dataset to `out` (refused when it exists,
/// unless `overwrite`).
pub fn import(out: &Path, cfg: &ImportConfig, overwrite: bool) -> Result<ImportSummary> {
    if !matches!(cfg.dtype, DType::F32 | DType::F16) {
        return Err(Error::InvalidArgument(format!(
            "feature dtype {} is not supported (float32 or float16)",
            cfg.dtype
        )));
    }
    let writer = DatasetWriter::create(out, overwrite)?;
    let nodes = read_node_table(
        &writer,
        &NodeTable {
            path: &cfg.nodes,
            id_column: &cfg.columns.id,
            features_column: &cfg.columns.features,
            features_required: true,
            label_column: Some(&cfg.columns.label),
            features_out: layout::FEATURES,
            dtype: cfg.dtype,
        },
    )?;
    let labels = nodes.labels.expect("a label column was read");
    let task = Task::of(
        &writer,
        (&cfg.nodes, &cfg.columns.label),
        &labels,
        layout::LABELS,
        (cfg.train_fraction, cfg.valid_fraction, cfg.split_seed),
    )?;
    let (input_edges, num_edges) = write_edge_table(
        &writer,
        &EdgeTable {
            path: &cfg.edges,
            source_column: &cfg.columns.source,
            target_column: &cfg.columns.target,
            src_ids: &nodes.ids,
            dst_ids: &nodes.ids,
            out: layout::EDGES,
            reverse: if cfg.add_reverse {
                Reverse::SameFile
            } else {
                Reverse::None
            },
        },
    )?;

    for (split, (seeds, labels)) in Split::ALL.into_iter().zip(&task.sets) {
        writer.write_split(split, seeds, labels)?;
    }
    let dataset = writer.commit(&DatasetSpec {
        name: cfg.name.clone(),
        num_nodes: nodes.num_nodes,
        num_classes: task.num_classes,
        node_labels: task.unlabeled == 0,
        extra_tasks: Vec::new(),
    })?;
    let [train, valid, test] = task.sizes();
    Ok(ImportSummary {
        dataset,
        num_nodes: nodes.num_nodes,
        input_edges,
        num_edges,
        num_classes: task.num_classes,
        feature_dim: nodes.feature_dim.expect("features are required"),
        unlabeled: task.unlabeled,
        train,
        valid,
        test,
    })
}

/// A node table to read, and where its features go.
pub(crate) struct NodeTable<'a> {
    pub path: &'a Path,
    pub id_column: &'a str,
    pub features_column: &'a str,
    /// Refuse a table without the features column (else: no features).
    pub features_required: bool,
    /// The label column to read, if any.
    pub label_column: Option<&'a str>,
    /// The feature file's path in the dataset.
    pub features_out: &'a str,
    pub dtype: DType,
}

/// What a node table gave: each node id's dense id (its row), the labels in
/// row order ([`UNLABELED`] where null), and the feature width (where it has
/// features).
pub(crate) struct Nodes {
    pub ids: HashMap<i64, u32>,
    pub labels: Option<Vec<u64>>,
    pub num_nodes: u64,
    pub feature_dim: Option<u64>,
}

/// Reads a node table: ids, labels, and features streamed to disk in row
/// order.
pub(crate) fn read_node_table(writer: &DatasetWriter, t: &NodeTable) -> Result<Nodes> {
    let (num_nodes, reader) = open_table(t.path)?;
    if num_nodes == 0 {
        return Err(Error::parquet(t.path, "the node table is empty"));
    }
    let has_features = t.features_required
        || arrow::array::RecordBatchReader::schema(&reader)
            .fields()
            .iter()
            .any(|f| f.name() == t.features_column);
    let mut ids: HashMap<i64, u32> = HashMap::with_capacity(num_nodes as usize);
    let mut labels: Vec<u64> = Vec::new();
    let mut features: Option<(NpyWriter, u64)> = None;
    let mut row = 0u64;
    for batch in reader {
        let batch = batch.map_err(|e| Error::parquet(t.path, e.to_string()))?;
        let batch_ids = int_column(t.path, &batch, t.id_column)?;
        add_ids(t.path, &mut ids, batch_ids, row)?;
        if let Some(label_column) = t.label_column {
            add_labels(t.path, &mut labels, (&batch, label_column), row)?;
        }
        if has_features {
            write_feature_rows(writer, t, num_nodes, &batch, row, &mut features)?;
        }
        row += batch.num_rows() as u64;
    }
    let feature_dim = match features {
        Some((w, d)) => {
            w.finish()?;
            Some(d)
        }
        None => None,
    };
    Ok(Nodes {
        ids,
        labels: t.label_column.map(|_| labels),
        num_nodes,
        feature_dim,
    })
}

/// A node's label where its label column is null: the node is in the
/// graph and in no split.
pub(crate) const UNLABELED: u64 = u64::MAX;

/// The classification task of an import: the class count, the nodes
/// without a label, and each split's nodes (train, validation, test) with
/// their labels.
pub(crate) struct Task {
    pub num_classes: u32,
    pub unlabeled: u64,
    pub sets: [(Vec<u64>, Vec<u64>); 3],
}

impl Task {
    /// The task over `labels`, read from `column` of `path`, split by
    /// `(train, valid, seed)` ([`split_labeled`]); every node's label is
    /// written to the dataset's `label_file` where each node has one.
    pub(crate) fn of(
        writer: &DatasetWriter,
        (path, column): (&Path, &str),
        labels: &[u64],
        label_file: &str,
        (train, valid, seed): (f64, f64, u64),
    ) -> Result<Task> {
        let num_classes = class_count(path, column, labels)?;
        let unlabeled = labels.iter().filter(|&&l| l == UNLABELED).count() as u64;
        if unlabeled == 0 {
            npy::write_i64(writer.path(label_file), labels)?;
        }
        let sets = split_labeled(labels, (train, valid), seed)?.map(|seeds| {
            let of_seeds = seeds.iter().map(|&s| labels[s as usize]).collect();
            (seeds, of_seeds)
        });
        Ok(Task {
            num_classes,
            unlabeled,
            sets,
        })
    }

    /// Each split's nodes.
    pub(crate) fn sizes(&self) -> [usize; 3] {
        self.sets.each_ref().map(|(seeds, _)| seeds.len())
    }
}

/// The class count of the labels read from `column` of `path`: at least 2,
/// below 2^32; refuses a column that labels no node.
fn class_count(path: &Path, column: &str, labels: &[u64]) -> Result<u32> {
    let labeled = labels.iter().filter(|&&l| l != UNLABELED);
    let Some(&max) = labeled.max() else {
        return Err(Error::parquet(
            path,
            format!("column '{column}' is null in every row: no node has a label"),
        ));
    };
    let num_classes = max + 1;
    if num_classes < 2 || num_classes > u32::MAX as u64 {
        return Err(Error::parquet(
            path,
            format!("labels span {num_classes} classes; at least 2 are required"),
        ));
    }
    Ok(num_classes as u32)
}

/// The train, validation and test nodes: a seeded shuffle of the labeled
/// nodes ([`seeded_split`] over them, so that a table whose every node is
/// labeled splits as the whole table), the test set the rest.
fn split_labeled(labels: &[u64], (train, valid): (f64, f64), seed: u64) -> Result<[Vec<u64>; 3]> {
    let labeled: Vec<u64> = (0..labels.len() as u64)
        .filter(|&v| labels[v as usize] != UNLABELED)
        .collect();
    let sets = seeded_split(labeled.len() as u64, train, valid, None, seed)?;
    // Ascending positions map to ascending nodes: each set stays sorted.
    Ok(sets.map(|set| set.into_iter().map(|i| labeled[i as usize]).collect()))
}

/// Gives a batch's node ids, from table row `row` on, their dense ids (their
/// rows); refuses an id seen before.
fn add_ids(path: &Path, ids: &mut HashMap<i64, u32>, batch_ids: Vec<i64>, row: u64) -> Result<()> {
    for (k, id) in batch_ids.into_iter().enumerate() {
        let dense = u32::try_from(row + k as u64)
            .map_err(|_| Error::parquet(path, "more than 2^32 - 1 nodes are not supported"))?;
        if ids.insert(id, dense).is_some() {
            return Err(Error::parquet(
                path,
                format!("node id {id} appears twice (row {})", row + k as u64),
            ));
        }
    }
    Ok(())
}

/// Appends the labels in `column` of a batch, from table row `row` on:
/// [`UNLABELED`] where null; refuses a negative one.
fn add_labels(
    path: &Path,
    labels: &mut Vec<u64>,
    (batch, name): (&RecordBatch, &str),
    row: u64,
) -> Result<()> {
    let col = nullable_int_column(path, batch, name)?;
    for (k, l) in col.iter().enumerate() {
        match l {
            None => labels.push(UNLABELED),
            Some(l) if l < 0 => {
                return Err(Error::parquet(
                    path,
                    format!("negative label {l} at row {}", row + k as u64),
                ));
            }
            Some(l) => labels.push(l as u64),
        }
    }
    Ok(())
}

/// Appends a batch's feature rows to the feature file, which the first
/// batch creates with its width; refuses a batch of another width.
fn write_feature_rows(
    writer: &DatasetWriter,
    t: &NodeTable,
    num_nodes: u64,
    batch: &RecordBatch,
    row: u64,
    features: &mut Option<(NpyWriter, u64)>,
) -> Result<()> {
    let (values, dim) = feature_rows(t.path, batch, t.features_column, row)?;
    let (w, d) = match features {
        Some(f) => f,
        None => {
            let w = NpyWriter::create(writer.path(t.features_out), t.dtype, &[num_nodes, dim])?;
            features.insert((w, dim))
        }
    };
    if dim != *d {
        return Err(Error::parquet(
            t.path,
            format!("feature lists change length from {d} to {dim} near row {row}"),
        ));
    }
    match t.dtype {
        DType::F16 => {
            let halves: Vec<f16> = values.iter().map(|&v| f16::from_f32(v)).collect();
            let bytes: Vec<u8> = halves.iter().flat_map(|h| h.to_le_bytes()).collect();
            w.write_bytes(&bytes)?;
        }
        _ => {
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            w.write_bytes(&bytes)?;
        }
    }
    Ok(())
}

/// Where an edge table's reverse edges go.
pub(crate) enum Reverse<'a> {
    None,
    /// After the edges, in the same file (a graph of one node type).
    SameFile,
    /// In a file of their own: the reverse relation's, at this path.
    OtherFile(&'a str),
}

/// An edge table to read: its columns, the id maps of its endpoint types,
/// and where its `[2, E]` array goes.
pub(crate) struct EdgeTable<'a> {
    pub path: &'a Path,
    pub source_column: &'a str,
    pub target_column: &'a str,
    pub src_ids: &'a HashMap<i64, u32>,
    pub dst_ids: &'a HashMap<i64, u32>,
    pub out: &'a str,
    pub reverse: Reverse<'a>,
}

/// Writes an edge table, remapped to dense ids, as the `[2, E]` edge array
/// (the table's row count fixes its shape); returns the table's edges and
/// the edges written to its file.
pub(crate) fn write_edge_table(writer: &DatasetWriter, t: &EdgeTable) -> Result<(u64, u64)> {
    let (input_edges, reader) = open_table(t.path)?;
    let copies = if matches!(t.reverse, Reverse::SameFile) {
        2
    } else {
        1
    };
    let num_edges = input_edges * copies;
    let mut edges = NpyWriter::create(writer.path(t.out), DType::I64, &[2, num_edges])?;
    let mut reversed = match t.reverse {
        Reverse::OtherFile(out) => Some(NpyWriter::create(
            writer.path(out),
            DType::I64,
            &[2, input_edges],
        )?),
        _ => None,
    };
    let mut at = 0u64;
    for batch in reader {
        let batch = batch.map_err(|e| Error::parquet(t.path, e.to_string()))?;
        let dense = |name: &str, ids: &HashMap<i64, u32>, table: &str| -> Result<Vec<u8>> {
            let col = int_column(t.path, &batch, name)?;
            let mut out = Vec::with_capacity(col.len() * 8);
            for (k, id) in col.into_iter().enumerate() {
                let d = ids.get(&id).ok_or_else(|| {
                    Error::parquet(
                        t.path,
                        format!("{name} {id} at row {} is not in the {table}", at + k as u64),
                    )
                })?;
                out.extend_from_slice(&(*d as i64).to_le_bytes());
            }
            Ok(out)
        };
        let (src_table, dst_table) = if std::ptr::eq(t.src_ids, t.dst_ids) {
            ("node table", "node table")
        } else {
            ("source type's node table", "destination type's node table")
        };
        let src = dense(t.source_column, t.src_ids, src_table)?;
        let dst = dense(t.target_column, t.dst_ids, dst_table)?;
        // Row 0 of the [2, E] array holds sources, row 1 destinations; the
        // reversed copies follow the originals in each row.
        edges.write_at(at * 8, &src)?;
        edges.write_at((num_edges + at) * 8, &dst)?;
        match (&t.reverse, reversed.as_mut()) {
            (Reverse::SameFile, _) => {
                edges.write_at((input_edges + at) * 8, &dst)?;
                edges.write_at((num_edges + input_edges + at) * 8, &src)?;
            }
            (Reverse::OtherFile(_), Some(rev)) => {
                rev.write_at(at * 8, &dst)?;
                rev.write_at((input_edges + at) * 8, &src)?;
            }
            _ => {}
        }
        at += batch.num_rows() as u64;
    }
    if at != input_edges {
        return Err(Error::parquet(
            t.path,
            format!("metadata promises {input_edges} rows, read {at}"),
        ));
    }
    edges.finish()?;
    if let Some(rev) = reversed {
        rev.finish()?;
    }
    Ok((input_edges, num_edges))
}

/// The feature lists of a batch flattened to f32, with their common length.
fn feature_rows(
    path: &Path,
    batch: &RecordBatch,
    name: &str,
    first_row: u64,
) -> Result<(Vec<f32>, u64)> {
    let col = column(path, batch, name)?;
    if col.null_count() > 0 {
        return Err(Error::parquet(
            path,
            format!("column '{name}' holds null feature lists"),
        ));
    }
    let (offsets, values): (Vec<usize>, ArrayRef) = match col.data_type() {
        DataType::List(_) => {
            let l = col.as_list::<i32>();
            (
                l.value_offsets().iter().map(|&o| o as usize).collect(),
                Arc::clone(l.values()),
            )
        }
        DataType::LargeList(_) => {
            let l = col.as_list::<i64>();
            (
                l.value_offsets().iter().map(|&o| o as usize).collect(),
                Arc::clone(l.values()),
            )
        }
        DataType::FixedSizeList(_, n) => {
            let l = col.as_fixed_size_list();
            let n = *n as usize;
            (
                (0..=l.len())
                    .map(|i| l.value_offset_at(0) + i * n)
                    .collect(),
                Arc::clone(l.values()),
            )
        }
        other => {
            return Err(Error::parquet(
                path,
                format!("column '{name}' has type {other}, a list of numbers is required"),
            ));
        }
    };
    if !(values.data_type().is_numeric()) {
        return Err(Error::parquet(
            path,
            format!(
                "column '{name}' holds {} values, numbers are required",
                values.data_type()
            ),
        ));
    }
    let values = arrow::compute::cast(&values, &DataType::Float32)
        .map_err(|e| Error::parquet(path, format!("column '{name}': {e}")))?;
    let values = values.as_primitive::<Float32Type>();
    let dim = offsets.get(1).map_or(0, |&e| e - offsets[0]);
    if dim == 0 {
        return Err(Error::parquet(
            path,
            format!("column '{name}' has empty feature lists"),
        ));
    }
    let mut out = Vec::with_capacity(dim * batch.num_rows());
    for (r, w) in offsets.windows(2).enumerate() {
        if w[1] - w[0] != dim {
            return Err(Error::parquet(
                path,
                format!(
                    "feature list at row {} has length {}, expected {dim}",
                    first_row + r as u64,
                    w[1] - w[0]
                ),
            ));
        }
        out.extend_from_slice(&values.values()[w[0]..w[1]]);
    }
    Ok((out, dim as u64))
}
