//! Imports a typed graph from Parquet: one node table per node type (an id
//! column; a feature-list column where the type has features; the target
//! type's label column) and one edge table per relation `src:relation:dst`
//! (source ids from the source type's table, target ids from the
//! destination type's). Each type's ids are remapped to dense type-local
//! ids in its table's row order; the split is the homogeneous importer's
//! seeded shuffle, over the target type's labeled nodes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use offgnn_shared::dataset::{DatasetWriter, Split, TypedSpec, layout};
use offgnn_shared::npy::DType;

use super::{Columns, EdgeTable, NodeTable, Reverse, Task, read_node_table, write_edge_table};
use crate::error::{Error, Result};

/// The tables of a typed import, and the columns they share.
#[derive(Clone, Debug)]
pub struct TypedImportConfig {
    pub name: String,
    /// Node type and its table, in the order the types take.
    pub node_tables: Vec<(String, PathBuf)>,
    /// Relation `src:relation:dst` and its table.
    pub edge_tables: Vec<(String, PathBuf)>,
    /// The node type whose labels the task learns.
    pub target: String,
    pub columns: Columns,
    /// Also write each relation's reverse: in its own file as
    /// `dst:rev_relation:src`, or, between nodes of one type, after the
    /// edges in the same file.
    pub add_reverse: bool,
    pub dtype: DType,
    pub train_fraction: f64,
    pub valid_fraction: f64,
    pub split_seed: u64,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct TypedImportSummary {
    pub dataset: PathBuf,
    pub node_types: Vec<ImportedType>,
    pub relations: Vec<ImportedRelation>,
    pub num_classes: u32,
    /// Target nodes whose label is null: in the graph, in no split.
    pub unlabeled: u64,
    pub train: usize,
    pub valid: usize,
    pub test: usize,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct ImportedType {
    pub name: String,
    pub nodes: u64,
    pub feature_dim: Option<u64>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct ImportedRelation {
    pub name: String,
    /// Edges in its file (a reverse relation's are its forward table's).
    pub edges: u64,
}

/// One relation to write: its name, endpoint types and table; where its
/// reverse goes.
struct Planned<'a> {
    name: &'a str,
    src: usize,
    dst: usize,
    path: &'a Path,
    reverse: Option<String>,
}

/// Checks the types and relations before any table is read: each type
/// once, each relation `src:relation:dst` between given types and once
/// (its reverse too, where `--add-reverse` writes one), the target a type.
fn plan(cfg: &TypedImportConfig) -> Result<Vec<Planned<'_>>> {
    let bad = |msg: String| Err(Error::InvalidArgument(msg));
    let types: Vec<&str> = cfg.node_tables.iter().map(|(t, _)| t.as_str()).collect();
    for (i, t) in types.iter().enumerate() {
        if t.is_empty() || t.contains(':') {
            return bad(format!(
                "node type '{t}' must be a non-empty name without ':'"
            ));
        }
        if types[..i].contains(t) {
            return bad(format!("node type '{t}' has two node tables"));
        }
    }
    if !types.contains(&cfg.target.as_str()) {
        return bad(format!(
            "--target-type {}: no node table of that type (the types are {})",
            cfg.target,
            types.join(", ")
        ));
    }
    if cfg.edge_tables.is_empty() {
        return bad("a typed import needs at least one edge table (--edges REL=PATH)".into());
    }
    let mut planned: Vec<Planned> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for (name, path) in &cfg.edge_tables {
        let parts: Vec<&str> = name.split(':').collect();
        let [src, rel, dst] = parts.as_slice() else {
            return bad(format!(
                "edge table {}: relation '{name}' is not of the form 'src:relation:dst'",
                path.display()
            ));
        };
        let index = |t: &str| -> Result<usize> {
            types.iter().position(|x| *x == t).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "edge table {}: relation '{name}': node type '{t}' has no node table",
                    path.display()
                ))
            })
        };
        let (s, d) = (index(src)?, index(dst)?);
        if rel.is_empty() {
            return bad(format!("relation '{name}' has an empty relation name"));
        }
        let reverse = (cfg.add_reverse && s != d).then(|| format!("{dst}:rev_{rel}:{src}"));
        for n in std::iter::once(name.clone()).chain(reverse.clone()) {
            if names.contains(&n) {
                return bad(format!("relation '{n}' is given twice"));
            }
            names.push(n);
        }
        planned.push(Planned {
            name,
            src: s,
            dst: d,
            path,
            reverse,
        });
    }
    Ok(planned)
}

/// Imports the tables into a typed dataset at `out`.
pub fn import_typed(
    out: &Path,
    cfg: &TypedImportConfig,
    overwrite: bool,
) -> Result<TypedImportSummary> {
    if !matches!(cfg.dtype, DType::F32 | DType::F16) {
        return Err(Error::InvalidArgument(format!(
            "feature dtype {} is not supported (float32 or float16)",
            cfg.dtype
        )));
    }
    let planned = plan(cfg)?;
    let writer = DatasetWriter::create(out, overwrite)?;
    let mut ids: Vec<HashMap<i64, u32>> = Vec::new();
    let mut node_types = Vec::new();
    let mut target_labels = None;
    for (t, path) in &cfg.node_tables {
        let is_target = *t == cfg.target;
        let features_out = layout::typed_features(t);
        let nodes = read_node_table(
            &writer,
            &NodeTable {
                path,
                id_column: &cfg.columns.id,
                features_column: &cfg.columns.features,
                features_required: false,
                label_column: is_target.then_some(cfg.columns.label.as_str()),
                features_out: &features_out,
                dtype: cfg.dtype,
            },
        )?;
        if is_target {
            target_labels = nodes.labels;
        }
        ids.push(nodes.ids);
        node_types.push(ImportedType {
            name: t.clone(),
            nodes: nodes.num_nodes,
            feature_dim: nodes.feature_dim,
        });
    }
    let labels = target_labels.expect("the target type's table was read");
    let target_path = &cfg.node_tables[planned_target(cfg)].1;
    let task = Task::of(
        &writer,
        (target_path, &cfg.columns.label),
        &labels,
        &layout::typed_labels(&cfg.target),
        (cfg.train_fraction, cfg.valid_fraction, cfg.split_seed),
    )?;

    let mut relations = Vec::new();
    for p in &planned {
        let out_path = layout::typed_edges(p.name);
        let rev_path = p.reverse.as_deref().map(layout::typed_edges);
        let (_, written) = write_edge_table(
            &writer,
            &EdgeTable {
                path: p.path,
                source_column: &cfg.columns.source,
                target_column: &cfg.columns.target,
                src_ids: &ids[p.src],
                dst_ids: &ids[p.dst],
                out: &out_path,
                reverse: match (&rev_path, cfg.add_reverse) {
                    (Some(rev), _) => Reverse::OtherFile(rev),
                    (None, true) => Reverse::SameFile,
                    (None, false) => Reverse::None,
                },
            },
        )?;
        relations.push(ImportedRelation {
            name: p.name.to_string(),
            edges: written,
        });
        if let Some(rev) = &p.reverse {
            relations.push(ImportedRelation {
                name: rev.clone(),
                edges: written,
            });
        }
    }

    for (split, (seeds, labels)) in Split::ALL.into_iter().zip(&task.sets) {
        writer.write_typed_split(&cfg.target, split, seeds, labels)?;
    }
    let dataset = writer.commit_typed(&TypedSpec {
        name: cfg.name.clone(),
        node_types: node_types
            .iter()
            .map(|t| (t.name.clone(), t.nodes, t.feature_dim.is_some()))
            .collect(),
        relations: relations.iter().map(|r| r.name.clone()).collect(),
        target: cfg.target.clone(),
        num_classes: task.num_classes,
        node_labels: task.unlabeled == 0,
    })?;
    let [train, valid, test] = task.sizes();
    Ok(TypedImportSummary {
        dataset,
        node_types,
        relations,
        num_classes: task.num_classes,
        unlabeled: task.unlabeled,
        train,
        valid,
        test,
    })
}

/// The target type's index among the node tables.
fn planned_target(cfg: &TypedImportConfig) -> usize {
    cfg.node_tables
        .iter()
        .position(|(t, _)| *t == cfg.target)
        .expect("plan checked the target")
}
