//! The dataset commands: `generate` (synthetic graphs), `import-parquet`
//! (node and edge tables) and `inspect` (full validation and a summary).

use std::path::PathBuf;
use std::time::Instant;

use crate::parquet_import::{self, ImportConfig};
use crate::synthetic::{self, GeneratorConfig};
use crate::topology::{Csr, CsrOptions};
use anyhow::Context;
use offgnn_shared::dataset::{Dataset, TypedDataset, is_typed};
use offgnn_shared::report::{human_bytes, print_summary};
use offgnn_shared::{npy, progress};

use super::{DeriveArgs, GenerateArgs, ImportArgs, InspectArgs, Preset, Schema, SplitEdgesArgs};

pub fn generate(args: &GenerateArgs) -> anyhow::Result<()> {
    let cfg = GeneratorConfig {
        name: args
            .out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "synthetic".into()),
        num_nodes: args.nodes,
        avg_degree: args.avg_degree,
        feature_dim: args.feature_dim,
        dtype: args.dtype.into(),
        num_classes: args.classes,
        train_fraction: args.train_fraction,
        valid_fraction: args.valid_fraction,
        test_fraction: args.test_fraction,
        homophily: args.homophily,
        power_law_exponent: args.power_law,
        signal: args.signal,
        seed: args.seed,
    };
    if args.schema == Schema::Igbh {
        return generate_typed(args, &cfg);
    }
    if !args.no_features.is_empty() || !args.type_dims.is_empty() {
        anyhow::bail!("--no-features and --type-dims name node types: they go with --schema igbh");
    }
    let summary = synthetic::generate(&args.out, &cfg, args.overwrite, true)
        .with_context(|| format!("generating {}", args.out.display()))?;
    print_summary(
        &format!("generated {}", args.out.display()),
        &[
            ("nodes", summary.num_nodes.to_string()),
            ("edges (directed)", summary.num_edges.to_string()),
            (
                "features",
                format!(
                    "{} x {} {}",
                    summary.num_nodes, summary.feature_dim, summary.dtype
                ),
            ),
            ("feature file", human_bytes(summary.feature_bytes)),
            ("edge file", human_bytes(summary.edge_bytes)),
            ("wall time", format!("{:.1} s", summary.seconds)),
            (
                "throughput",
                format!(
                    "{:.0} rows/s, {:.1} MB/s of features",
                    summary.rows_per_sec, summary.feature_mb_per_sec
                ),
            ),
        ],
        &serde_json::json!({ "command": "generate", "dataset": args.out, "summary": summary }),
    );
    Ok(())
}

/// The column names `import-parquet` was given.
fn columns(args: &ImportArgs) -> parquet_import::Columns {
    parquet_import::Columns {
        id: args.id_column.clone(),
        features: args.features_column.clone(),
        label: args.label_column.clone(),
        source: args.source_column.clone(),
        target: args.target_column.clone(),
    }
}

/// `TYPE=PATH`, or `None` for a plain path.
fn typed_table(arg: &str) -> Option<(String, PathBuf)> {
    let (name, path) = arg.split_once('=')?;
    (!name.is_empty() && !name.contains('/')).then(|| (name.to_string(), PathBuf::from(path)))
}

pub fn import_parquet(args: &ImportArgs) -> anyhow::Result<()> {
    let typed = args
        .nodes
        .iter()
        .chain(&args.edges)
        .any(|a| typed_table(a).is_some());
    if typed {
        return import_typed(args);
    }
    let (nodes, edges) = match (args.nodes.as_slice(), args.edges.as_slice()) {
        ([n], [e]) => (PathBuf::from(n), PathBuf::from(e)),
        _ => anyhow::bail!(
            "one --nodes and one --edges table, or TYPE=PATH tables for a typed graph"
        ),
    };
    if args.target_type.is_some() {
        anyhow::bail!("--target-type goes with typed tables (--nodes TYPE=PATH)");
    }
    let mut cfg = match args.preset {
        Some(Preset::Cora) => ImportConfig::cora(nodes, edges),
        None => ImportConfig {
            name: String::new(),
            nodes,
            edges,
            columns: columns(args),
            add_reverse: args.add_reverse,
            dtype: npy::DType::F32,
            train_fraction: 0.0,
            valid_fraction: 0.0,
            split_seed: 0,
        },
    };
    cfg.name = args.name.clone().unwrap_or_else(|| {
        args.out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    cfg.add_reverse |= args.add_reverse;
    cfg.dtype = args.dtype.into();
    cfg.train_fraction = args.train_fraction;
    cfg.valid_fraction = args.valid_fraction;
    cfg.split_seed = args.split_seed;
    let started = Instant::now();
    let s = parquet_import::import(&args.out, &cfg, args.overwrite)
        .with_context(|| format!("importing into {}", args.out.display()))?;
    print_summary(
        &format!("imported {}", s.dataset.display()),
        &[
            ("nodes", s.num_nodes.to_string()),
            ("edges in table", s.input_edges.to_string()),
            (
                "edges written",
                format!(
                    "{}{}",
                    s.num_edges,
                    if cfg.add_reverse {
                        " (with reverse)"
                    } else {
                        ""
                    }
                ),
            ),
            ("classes", s.num_classes.to_string()),
            ("feature dim", s.feature_dim.to_string()),
            (
                "split",
                format!(
                    "train {} / valid {} / test {} (seed {}){}",
                    s.train,
                    s.valid,
                    s.test,
                    cfg.split_seed,
                    unlabeled_note(s.unlabeled)
                ),
            ),
            (
                "wall time",
                format!("{:.2} s", started.elapsed().as_secs_f64()),
            ),
        ],
        &serde_json::json!({ "command": "import-parquet", "summary": s }),
    );
    Ok(())
}

pub fn split_edges(args: &SplitEdgesArgs) -> anyhow::Result<()> {
    let cfg = crate::edge_split::SplitConfig {
        valid: args.valid,
        test: args.test,
        negatives: args.negatives,
        seed: args.seed,
        relation: args.relation.clone(),
        reverse: args.reverse.clone(),
    };
    let s = crate::edge_split::split_dataset(&args.dataset, &args.out, &cfg, args.overwrite, true)
        .with_context(|| format!("splitting the edges of {}", args.dataset.display()))?;
    print_summary(
        &format!(
            "split the edges of {} into {}",
            args.dataset.display(),
            args.out.display()
        ),
        &[
            ("nodes", s.num_nodes.to_string()),
            (
                "relation",
                match (&s.relation, &s.reverse) {
                    (None, _) => "the graph's one edge type".into(),
                    (Some(r), None) => format!("{r} (no reverse relation)"),
                    (Some(r), Some(rev)) => format!("{r}, and its reverse {rev}"),
                },
            ),
            (
                "edges",
                format!("{} stored, {} left to train on", s.edges, s.train_edges),
            ),
            (
                "node pairs",
                format!(
                    "{} train, {} validation, {} test",
                    s.train_pairs, s.valid_pairs, s.test_pairs
                ),
            ),
            ("negatives per held-out pair", s.negatives.to_string()),
            ("wall time", format!("{:.1} s", s.seconds)),
        ],
        &serde_json::json!({ "command": "split-edges", "dataset": args.out, "summary": s }),
    );
    Ok(())
}

pub fn inspect(args: &InspectArgs) -> anyhow::Result<()> {
    if is_typed(&args.dataset)? {
        return inspect_typed(args);
    }
    let ds = Dataset::open(&args.dataset)?;
    let opts = CsrOptions {
        add_reverse: args.add_reverse,
        dedup: args.dedup,
        keep_self_loops: !args.drop_self_loops,
        hold_bytes: 0,
    };
    let started = Instant::now();
    let bar = progress::bar(ds.edges.len_hint().unwrap_or(0) * 2, "edges", "edges");
    let csr = Csr::from_edge_list(&ds.edges, opts, |n| bar.inc(n))?;
    bar.finish_and_clear();
    let csr_seconds = started.elapsed().as_secs_f64();
    let max_degree = (0..csr.num_nodes() as u32)
        .map(|v| csr.degree(v))
        .max()
        .unwrap_or(0);
    let link = offgnn_shared::dataset::LinkTask::open(&ds.root, ds.num_nodes)?;
    let feature_bytes = ds.features.row_bytes() * ds.num_nodes;
    // NaN or Inf in one row spreads to every node that aggregates it, and a
    // model trained on them diverges: every value is checked.
    let bar = progress::bytes_bar(feature_bytes, "features");
    let non_finite = ds.features.first_non_finite(|n| bar.inc(n))?;
    bar.finish_and_clear();
    if let Some((row, col, value)) = non_finite {
        anyhow::bail!(
            "{}: row {row}, column {col} is {value}: features must be finite (NaN or Inf spreads to every neighbor and breaks training)",
            ds.features.path().display()
        );
    }
    let (link_row, link_json) = link_summary(link.as_ref(), None);
    let mut rows = vec![
        ("nodes", ds.num_nodes.to_string()),
        (
            "edges in file",
            ds.edges.len_hint().map_or("csv".into(), |e| e.to_string()),
        ),
        ("csr edges", csr.num_edges().to_string()),
        (
            "mean / max in-degree",
            format!(
                "{:.2} / {max_degree}",
                csr.num_edges() as f64 / ds.num_nodes as f64
            ),
        ),
        (
            "features",
            format!(
                "{} x {} {} ({})",
                ds.num_nodes,
                ds.feature_dim(),
                ds.features.dtype(),
                human_bytes(feature_bytes)
            ),
        ),
        ("feature values", "all finite".to_string()),
        ("classes", ds.num_classes.to_string()),
        (
            "train / valid / test",
            format!(
                "{} / {} / {}",
                ds.train.seeds.len(),
                ds.valid.seeds.len(),
                ds.test.seeds.len()
            ),
        ),
        (
            "csr build",
            format!("{csr_seconds:.2} s, {}", human_bytes(csr.memory_bytes())),
        ),
    ];
    if let Some(row) = link_row {
        rows.push(("link prediction", row));
    }
    print_summary(
        &format!("dataset {} ({})", ds.name, ds.root.display()),
        &rows,
        &serde_json::json!({
            "command": "inspect",
            "dataset": ds.root,
            "name": ds.name,
            "num_nodes": ds.num_nodes,
            "num_edges_file": ds.edges.len_hint(),
            "num_edges_csr": csr.num_edges(),
            "max_in_degree": max_degree,
            "feature_dim": ds.feature_dim(),
            "feature_dtype": ds.features.dtype(),
            "feature_bytes": feature_bytes,
            "features_finite": true,
            "num_classes": ds.num_classes,
            "train": ds.train.seeds.len(),
            "valid": ds.valid.seeds.len(),
            "test": ds.test.seeds.len(),
            "csr_seconds": csr_seconds,
            "link_prediction": link_json,
        }),
    );
    Ok(())
}

/// `inspect`'s line and JSON of a dataset's link prediction task (`relation`:
/// a typed task's, named in both).
fn link_summary(
    link: Option<&offgnn_shared::dataset::LinkTask>,
    relation: Option<&str>,
) -> (Option<String>, serde_json::Value) {
    let Some(t) = link else {
        return (None, serde_json::Value::Null);
    };
    let row = format!(
        "{}{} train pairs; {} validation and {} test queries, {} and {} negatives",
        relation.map_or(String::new(), |r| format!("{r}: ")),
        t.train.pairs.len(),
        t.valid.positives.len(),
        t.test.positives.len(),
        t.valid.negatives.len(),
        t.test.negatives.len()
    );
    let json = serde_json::json!({
        "relation": relation,
        "train_pairs": t.train.pairs.len(),
        "valid_queries": t.valid.positives.len(),
        "valid_negatives": t.valid.negatives.len(),
        "test_queries": t.test.positives.len(),
        "test_negatives": t.test.negatives.len(),
    });
    (Some(row), json)
}

/// `generate --schema igbh`: a typed graph of IGBH's schema.
fn generate_typed(args: &GenerateArgs, cfg: &GeneratorConfig) -> anyhow::Result<()> {
    let features = synthetic::TypedFeatures {
        without: args.no_features.clone(),
        widths: args.type_dims.clone(),
    };
    let summary = synthetic::generate_typed(&args.out, cfg, &features, args.overwrite, true)
        .with_context(|| format!("generating {}", args.out.display()))?;
    let mut rows: Vec<(String, String)> = summary
        .node_types
        .iter()
        .map(|t| {
            let features = match t.feature_dim {
                Some(dim) => format!("{} x {dim} {}", t.nodes, summary.dtype),
                None => format!("{} nodes, no features", t.nodes),
            };
            (format!("nodes: {}", t.name), features)
        })
        .collect();
    rows.extend(
        summary
            .relations
            .iter()
            .map(|r| (format!("edges: {}", r.name), r.edges.to_string())),
    );
    rows.push(("feature files".into(), human_bytes(summary.feature_bytes)));
    rows.push(("edge files".into(), human_bytes(summary.edge_bytes)));
    rows.push(("wall time".into(), format!("{:.1} s", summary.seconds)));
    let rows: Vec<(&str, String)> = rows.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    print_summary(
        &format!("generated {}", args.out.display()),
        &rows,
        &serde_json::json!({ "command": "generate", "dataset": args.out, "schema": "igbh", "summary": summary }),
    );
    Ok(())
}

/// `inspect` of a typed dataset: every relation's edges streamed and
/// checked against its endpoint types, every feature value checked finite.
fn inspect_typed(args: &InspectArgs) -> anyhow::Result<()> {
    let ds = TypedDataset::open(&args.dataset)?;
    let mut rows: Vec<(String, String)> = Vec::new();
    let mut types_json = Vec::new();
    for t in &ds.node_types {
        let features = match &t.features {
            Some(f) => {
                let bytes = f.row_bytes() * t.num;
                let bar = progress::bytes_bar(bytes, &format!("{} features", t.name));
                let non_finite = f.first_non_finite(|n| bar.inc(n))?;
                bar.finish_and_clear();
                if let Some((row, col, value)) = non_finite {
                    anyhow::bail!(
                        "{}: row {row}, column {col} is {value}: features must be finite (NaN or Inf spreads to every neighbor and breaks training)",
                        f.path().display()
                    );
                }
                format!(
                    "{} x {} {} ({})",
                    t.num,
                    f.shape()[1],
                    f.dtype(),
                    human_bytes(bytes)
                )
            }
            None => "none".into(),
        };
        rows.push((
            format!("nodes: {}", t.name),
            format!("{}; features {features}", t.num),
        ));
        types_json.push(serde_json::json!({
            "name": t.name,
            "num": t.num,
            "offset": t.offset,
            "feature_dim": t.features.as_ref().map(|f| f.shape()[1]),
            "feature_dtype": t.features.as_ref().map(|f| f.dtype()),
            "labels": t.labels.is_some(),
        }));
    }
    let mut relations_json = Vec::new();
    for r in &ds.relations {
        let bar = progress::bar(r.edges.len_hint().unwrap_or(0), "edges", &r.name);
        let mut edges = 0u64;
        r.edges
            .for_each_chunk::<offgnn_shared::Error>(crate::topology::CHUNK, |src, _| {
                edges += src.len() as u64;
                bar.inc(src.len() as u64);
                Ok(())
            })?;
        bar.finish_and_clear();
        rows.push((format!("edges: {}", r.name), edges.to_string()));
        relations_json.push(serde_json::json!({ "name": r.name, "edges": edges }));
    }
    let target = &ds.node_types[ds.target].name;
    rows.push((
        "classes".into(),
        format!("{} (of {target})", ds.num_classes),
    ));
    rows.push((
        "train / valid / test".into(),
        format!(
            "{} / {} / {}",
            ds.train.seeds.len(),
            ds.valid.seeds.len(),
            ds.test.seeds.len()
        ),
    ));
    let link = offgnn_shared::dataset::LinkTask::open_typed(&ds)?;
    let relation = link
        .as_ref()
        .and_then(|t| t.relation)
        .map(|r| ds.relations[r].name.as_str());
    let (link_row, link_json) = link_summary(link.as_ref(), relation);
    if let Some(row) = link_row {
        rows.push(("link prediction".into(), row));
    }
    let rows: Vec<(&str, String)> = rows.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    print_summary(
        &format!("dataset {} ({}), typed", ds.name, ds.root.display()),
        &rows,
        &serde_json::json!({
            "command": "inspect",
            "dataset": ds.root,
            "name": ds.name,
            "typed": true,
            "num_nodes": ds.num_nodes(),
            "node_types": types_json,
            "relations": relations_json,
            "features_finite": true,
            "target": target,
            "num_classes": ds.num_classes,
            "train": ds.train.seeds.len(),
            "valid": ds.valid.seeds.len(),
            "test": ds.test.seeds.len(),
            "link_prediction": link_json,
        }),
    );
    Ok(())
}

/// `derive-features`: rows for featureless types, as means over relations.
pub fn derive_features(args: &DeriveArgs) -> anyhow::Result<()> {
    let memory = offgnn_shared::sizes::parse_bytes(&args.memory)
        .with_context(|| format!("--memory {}", args.memory))?;
    let cfg = crate::derived_features::DeriveConfig {
        relations: args.relations.clone(),
        memory,
    };
    let summary = crate::derived_features::derive_features(
        &args.dataset,
        &args.out,
        &cfg,
        args.overwrite,
        true,
    )
    .with_context(|| format!("deriving features into {}", args.out.display()))?;
    let mut rows: Vec<(String, String)> = summary
        .derived
        .iter()
        .map(|d| {
            (
                format!("features: {}", d.node_type),
                format!(
                    "{} x {} {}, means over {} ({} edges; {} nodes without one get zeros), {} passes, {:.1} s",
                    d.rows, d.dim, d.dtype, d.relation, d.edges, d.rows_without_neighbours, d.passes, d.seconds
                ),
            )
        })
        .collect();
    rows.push(("wall time".into(), format!("{:.1} s", summary.seconds)));
    let rows: Vec<(&str, String)> = rows.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    print_summary(
        &format!("derived features into {}", args.out.display()),
        &rows,
        &serde_json::json!({ "command": "derive-features", "summary": summary }),
    );
    Ok(())
}

/// What the split line adds where some labels were null.
fn unlabeled_note(unlabeled: u64) -> String {
    match unlabeled {
        0 => String::new(),
        n => format!("; {n} unlabeled (null label), in no split"),
    }
}

/// `import-parquet` with `TYPE=PATH` tables: a typed graph.
fn import_typed(args: &ImportArgs) -> anyhow::Result<()> {
    let tables = |list: &[String], what: &str| -> anyhow::Result<Vec<(String, PathBuf)>> {
        list.iter()
            .map(|a| {
                typed_table(a).ok_or_else(|| {
                    anyhow::anyhow!("{what} '{a}': a typed import names every table TYPE=PATH")
                })
            })
            .collect()
    };
    if args.preset.is_some() {
        anyhow::bail!("--preset describes a homogeneous export; typed tables take none");
    }
    let target = args.target_type.clone().ok_or_else(|| {
        anyhow::anyhow!(
            "typed tables: --target-type names the node type whose labels the task learns"
        )
    })?;
    let cfg = parquet_import::TypedImportConfig {
        name: args.name.clone().unwrap_or_else(|| {
            args.out
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        }),
        node_tables: tables(&args.nodes, "--nodes")?,
        edge_tables: tables(&args.edges, "--edges")?,
        target,
        columns: columns(args),
        add_reverse: args.add_reverse,
        dtype: args.dtype.into(),
        train_fraction: args.train_fraction,
        valid_fraction: args.valid_fraction,
        split_seed: args.split_seed,
    };
    let s = parquet_import::import_typed(&args.out, &cfg, args.overwrite)
        .with_context(|| format!("importing into {}", args.out.display()))?;
    let mut rows: Vec<(String, String)> = s
        .node_types
        .iter()
        .map(|t| {
            let features = t
                .feature_dim
                .map_or("no features".to_string(), |d| format!("{d}-d features"));
            (
                format!("nodes: {}", t.name),
                format!("{}, {features}", t.nodes),
            )
        })
        .collect();
    rows.extend(
        s.relations
            .iter()
            .map(|r| (format!("edges: {}", r.name), r.edges.to_string())),
    );
    rows.push((
        "classes".into(),
        format!("{} (of {})", s.num_classes, cfg.target),
    ));
    rows.push((
        "train / valid / test".into(),
        format!(
            "{} / {} / {}{}",
            s.train,
            s.valid,
            s.test,
            unlabeled_note(s.unlabeled)
        ),
    ));
    let rows: Vec<(&str, String)> = rows.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    print_summary(
        &format!("imported {}", s.dataset.display()),
        &rows,
        &serde_json::json!({ "command": "import-parquet", "typed": true, "summary": s }),
    );
    Ok(())
}
