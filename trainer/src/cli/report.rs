//! What the trainer prints for people and as JSON: a row per epoch, then
//! each command's summary table and JSON.

use offgnn_shared::report::{human_bytes, print_summary};

use crate::export::Written;
use crate::inference::{InferSummary, NaiveEstimate};
use crate::memory::MemoryEstimate;
use crate::train::{EpochMetrics, TrainSummary};

pub fn epoch_row(e: &EpochMetrics) {
    println!(
        "epoch {:>3}  {:>7.2}s  loss {:.4}  train {:.4}  valid {:.4}  test {:.4}  disk {} (amp {:.2})  hits gpu/cpu/disk {:.2}/{:.2}/{:.2}  busy load {:.2}s asm {:.2}s graph {:.2}s model {:.2}s",
        e.epoch,
        e.wall_seconds,
        e.loss,
        e.train_acc,
        e.valid_acc,
        e.test_acc,
        human_bytes(e.disk_bytes),
        e.read_amplification,
        e.hit_gpu,
        e.hit_cpu,
        e.hit_disk,
        e.stage_busy.load,
        e.stage_busy.assemble,
        e.stage_busy.graph,
        e.stage_busy.model,
    );
    if let (Some(v), Some(t)) = (&e.valid_rank, &e.test_rank) {
        println!("{}", ranking_row(v, t));
    }
    if let Some(d) = &e.stage_busy.device {
        println!(
            "          device time (CUDA events): asm {:.2}s graph {:.2}s model {:.2}s",
            d.assemble, d.graph, d.model
        );
    }
}

/// A link-prediction epoch's ranking figures, homogeneous or typed, on
/// one line under its epoch's.
pub(super) fn ranking_row(v: &crate::link::RankMetrics, t: &crate::link::RankMetrics) -> String {
    format!(
        "          ranking: valid MRR {:.4} hits@10/50/100 {:.3}/{:.3}/{:.3}  test MRR {:.4} hits@10/50/100 {:.3}/{:.3}/{:.3}",
        v.mrr,
        v.hits_at_10,
        v.hits_at_50,
        v.hits_at_100,
        t.mrr,
        t.hits_at_10,
        t.hits_at_50,
        t.hits_at_100
    )
}

pub fn summary(s: &TrainSummary, memory: &MemoryEstimate) {
    let link = s.best_valid_rank.is_some();
    let rows = vec![
        (
            "device",
            format!(
                "{} (I/O: {}, {}{}, gaps of up to {} read through)",
                s.device,
                s.io_backend,
                if s.io_backend == "pread" {
                    // Each thread of the pool has one read in flight.
                    offgnn_shared::report::count(s.io_rings as u64, "thread", "threads")
                } else {
                    format!("{} x {} reads in flight", s.io_rings, s.io_depth)
                },
                match &s.io_depth_probe {
                    Some(p) if p.depth_auto => format!(", the knee of {}'s curve", p.probe.disk),
                    _ => String::new(),
                },
                offgnn_shared::report::count(s.read_through_pages as u64, "page", "pages")
            ),
        ),
        (
            "features / pipeline",
            format!(
                "{} ({} rows, {} CPU cache) / {}",
                format!("{:?}", s.features).to_lowercase(),
                s.rows_dtype,
                s.cpu_cache_policy.name(),
                if s.pipelined { "on" } else { "off" }
            ),
        ),
        ("epochs", s.epochs.len().to_string()),
        (
            "best validation",
            if link {
                // The epoch of the best validation MRR; the accuracy is
                // the share of pairs its scores classify right.
                format!(
                    "MRR at epoch {}, pair accuracy {:.4}",
                    s.best_epoch, s.best_valid_acc
                )
            } else {
                format!("{:.4} at epoch {}", s.best_valid_acc, s.best_epoch)
            },
        ),
        (
            "test at best validation",
            if link {
                format!("pair accuracy {:.4}", s.test_acc_at_best_valid)
            } else {
                format!("{:.4}", s.test_acc_at_best_valid)
            },
        ),
        (
            "mean epoch time",
            format!(
                "{:.3} s (first epoch excluded)",
                s.mean_epoch_seconds_excl_first
            ),
        ),
        ("memory (stated peak)", human_bytes(memory.total_bytes)),
    ];
    let mut rows = rows;
    if let (Some(v), Some(t)) = (&s.best_valid_rank, &s.test_rank_at_best_valid) {
        rows.push((
            "ranking at best validation",
            format!(
                "valid MRR {:.4}; test MRR {:.4}, hits@10 {:.4}, hits@50 {:.4}, hits@100 {:.4} ({} queries)",
                v.mrr, t.mrr, t.hits_at_10, t.hits_at_50, t.hits_at_100, t.queries
            ),
        ));
    }
    if memory.gpu_bytes > 0 {
        rows.push(("GPU memory (stated peak)", human_bytes(memory.gpu_bytes)));
    }
    if let Some(h) = &s.historical {
        rows.push(("historical cache", historical_row(h)));
    }
    if s.world_size > 1 {
        let steps: u64 = s.epochs.iter().map(|e| e.batches).sum::<u64>() / s.world_size as u64;
        let seconds: f64 = s.epochs.iter().map(|e| e.allreduce_seconds).sum();
        let bytes: u64 = s.epochs.iter().map(|e| e.allreduce_bytes).sum();
        rows.push((
            "data-parallel",
            format!(
                "{} ranks; rank 0's gradient all-reduce {:.2} ms a step, {} a step",
                s.world_size,
                1e3 * seconds / steps.max(1) as f64,
                human_bytes(bytes / steps.max(1))
            ),
        ));
    }
    if let Some(m) = &s.machine_share {
        rows.push((
            "this machine reads",
            format!(
                "{} of {} segments, {} of the layout's {}",
                m.segments,
                m.of_segments,
                human_bytes(m.bytes),
                human_bytes(m.of_bytes)
            ),
        ));
    }
    for w in &s.exports {
        rows.push((
            "export",
            format!("{} ({} epoch {})", w.location, w.card.which, w.card.epoch),
        ));
    }
    if let Some(d) = &s.dump {
        rows.push(("batch dump", d.display().to_string()));
    }
    print_summary(
        "training",
        &rows,
        &serde_json::json!({ "command": "train", "summary": s, "memory": memory }),
    );
}

/// The historical cache's settings and what it did, in one row.
pub(super) fn historical_row(h: &crate::historical::HistoricalSummary) -> String {
    let levels: Vec<String> = h
        .stats
        .level_cached
        .iter()
        .zip(&h.stats.level_nodes)
        .enumerate()
        .map(|(l, (c, n))| {
            format!(
                "level {}: {:.1}%",
                l + 1,
                100.0 * *c as f64 / (*n).max(1) as f64
            )
        })
        .collect();
    format!(
        "p_grad {}, t_stale {}, from step {}: {:.1}% of input rows needed; embeddings from the cache ({})",
        h.config.p_grad,
        h.config.t_stale,
        h.config.start,
        100.0 * h.inputs_kept(),
        levels.join(", ")
    )
}

pub fn export_summary(command: &str, w: &Written) {
    let c = &w.card;
    let rows = vec![
        ("export", w.location.clone()),
        (
            "model",
            format!(
                "PyG {}, {} layers, {} -> {} -> {}, act {}{}",
                c.pyg.class,
                c.num_layers,
                c.in_channels,
                c.hidden_channels,
                c.out_channels,
                c.act,
                c.scorer
                    .map_or(String::new(), |s| format!(", scorer {s:?}").to_lowercase())
            ),
        ),
        (
            "parameters",
            format!("{} ({})", c.parameters, human_bytes(w.weights_bytes)),
        ),
        (
            "epoch",
            format!(
                "{} ({}): {}",
                c.epoch,
                c.which,
                epoch_figures((c.valid_acc, c.test_acc), c.valid_mrr.zip(c.test_mrr))
            ),
        ),
    ];
    print_summary(
        command,
        &rows,
        &serde_json::json!({ "command": command, "export": w }),
    );
}

/// An export's epoch figures: a link model's MRR, a node model's
/// accuracy.
fn epoch_figures((valid_acc, test_acc): (f64, f64), mrr: Option<(f64, f64)>) -> String {
    match mrr {
        Some((v, t)) => format!("validation MRR {v:.4}, test MRR {t:.4}"),
        None => format!("validation {valid_acc:.4}, test {test_acc:.4}"),
    }
}

/// What `trainer export` wrote or `trainer show-model` read of a typed
/// model: the card and the weights' size.
pub fn typed_export_summary(
    command: &str,
    location: &str,
    weights_bytes: u64,
    c: &crate::hetero::export::TypedModelCard,
) {
    let figures = epoch_figures((c.valid_acc, c.test_acc), c.valid_mrr.zip(c.test_mrr));
    let types: Vec<String> = c
        .node_types
        .iter()
        .map(|t| format!("{} ({})", t.name, t.in_channels))
        .collect();
    let rows = vec![
        ("export", location.to_string()),
        (
            "model",
            format!(
                "{}, {} layers, hidden {}, {} relations, target {}{}",
                match c.architecture {
                    crate::hetero::RelationalKind::Rsage => "R-SAGE",
                    crate::hetero::RelationalKind::Rgat => "R-GAT",
                },
                c.num_layers,
                c.hidden_channels,
                c.relations.len(),
                c.target,
                c.scorer
                    .map_or(String::new(), |s| format!(", scorer {s:?}").to_lowercase()),
            ),
        ),
        ("node types (width)", types.join(", ")),
        (
            "parameters",
            format!("{} ({})", c.parameters, human_bytes(weights_bytes)),
        ),
        ("epoch", format!("{} ({}): {figures}", c.epoch, c.which)),
    ];
    print_summary(
        command,
        &rows,
        &serde_json::json!({
            "command": command,
            "export": { "location": location, "weights_bytes": weights_bytes, "card": c },
        }),
    );
}

pub fn infer_summary(s: &InferSummary) {
    let mut rows = vec![
        (
            "model",
            format!("{} ({:?})", s.model, s.architecture).to_lowercase(),
        ),
        (
            "dataset",
            format!("{} ({} nodes, {} edges)", s.dataset, s.num_nodes, s.edges),
        ),
        (
            "written",
            format!(
                "{} nodes, {} files, columns {}",
                s.nodes_written,
                s.files.len(),
                s.columns.join(",")
            ),
        ),
        (
            "plan",
            format!(
                "{} groups, source chunks of {} rows, memory {} (limit {})",
                s.groups,
                s.chunk_rows,
                human_bytes(s.memory_planned),
                human_bytes(s.memory_limit)
            ),
        ),
        (
            "device",
            format!(
                "{}, aggregating on the {}",
                s.device.to_lowercase(),
                match s.aggregate {
                    crate::inference::Aggregate::Host => "host",
                    crate::inference::Aggregate::Device => "device",
                }
            ),
        ),
        (
            "edge bucketing",
            format!("{:.2} s", s.edge_bucketing_seconds),
        ),
    ];
    if let Some(note) = &s.graph_override {
        rows.push(("graph", note.clone()));
    }
    let names: Vec<String> = s
        .layers
        .iter()
        .map(|l| format!("layer {}", l.layer))
        .collect();
    for (l, name) in s.layers.iter().zip(&names) {
        rows.push((
            name.as_str(),
            format!(
                "{} -> {}: {} passes, read {} (and {} of edges), wrote {}, {:.2} s (waiting on the disk {:.2} s, projecting and scattering {:.2} s){}",
                l.in_width,
                l.out_width,
                l.passes,
                human_bytes(l.bytes_read),
                human_bytes(l.edge_bytes_read),
                human_bytes(l.bytes_written),
                l.seconds,
                l.io_wait_seconds,
                l.scatter_seconds,
                if l.groups_resumed > 0 {
                    format!(" ({} groups from an earlier run)", l.groups_resumed)
                } else {
                    String::new()
                }
            ),
        ));
    }
    rows.push(("total", format!("{:.2} s on {}", s.seconds, s.device)));
    print_summary(
        "inference",
        &rows,
        &serde_json::json!({ "command": "infer", "summary": s }),
    );
}

pub fn typed_infer_summary(s: &crate::hetero::infer::TypedInferSummary) {
    let mut rows = vec![
        (
            "model".to_string(),
            format!("{} ({:?})", s.model, s.architecture).to_lowercase(),
        ),
        (
            "dataset".into(),
            format!(
                "{} ({} node types, {} relation edges)",
                s.dataset,
                s.node_types.len(),
                s.edges
            ),
        ),
    ];
    for t in &s.node_types {
        rows.push((
            format!("type {}", t.name),
            format!(
                "{} nodes in {} groups, {} written{}",
                t.nodes,
                t.groups,
                t.nodes_written,
                match t.columns.is_empty() {
                    true => String::new(),
                    false => format!(" (columns {})", t.columns.join(",")),
                }
            ),
        ));
    }
    rows.push((
        "plan".into(),
        format!(
            "memory planned {} (--memory {}), edge bucketing {:.2} s",
            human_bytes(s.memory_planned),
            human_bytes(s.memory_limit),
            s.edge_bucketing_seconds
        ),
    ));
    for l in &s.layers {
        rows.push((
            format!("layer {}", l.layer),
            format!(
                "{} groups, read {}, wrote {}, {:.2} s{}",
                l.groups,
                human_bytes(l.bytes_read),
                human_bytes(l.bytes_written),
                l.seconds,
                if l.groups_resumed > 0 {
                    format!(" ({} groups from an earlier run)", l.groups_resumed)
                } else {
                    String::new()
                }
            ),
        ));
    }
    rows.push((
        "total".into(),
        format!(
            "{:.2} s on {}, {} files",
            s.seconds,
            s.device,
            s.files.len()
        ),
    ));
    let rows: Vec<(&str, String)> = rows.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    print_summary(
        "typed inference",
        &rows,
        &serde_json::json!({ "command": "infer", "summary": s }),
    );
}

/// `trainer infer --method naive`: the sample timed and the first layer's
/// time extrapolated from it.
pub fn naive_summary(e: &NaiveEstimate) {
    print_summary(
        "naive first layer (one read per in-edge)",
        &[
            (
                "sample",
                format!(
                    "{} destinations, {} edges, {} reads, {}",
                    e.sample_destinations,
                    e.sample_edges,
                    e.reads,
                    human_bytes(e.bytes_read)
                ),
            ),
            ("time", format!("{:.2} s", e.seconds)),
            (
                "extrapolated",
                format!(
                    "{:.1} s for {} edges",
                    e.extrapolated_seconds, e.total_edges
                ),
            ),
        ],
        &serde_json::json!({ "command": "infer-naive", "summary": e }),
    );
}

pub fn score_summary(s: &crate::link::ScoreSummary) {
    let rows = vec![
        ("model", format!("{} ({} scorer)", s.model, s.scorer)),
        ("embeddings", s.embeddings.clone()),
        ("pairs", format!("{} over {} nodes", s.pairs, s.endpoints)),
        (
            "embeddings held",
            format!(
                "{} ({} wide)",
                human_bytes(s.embedding_bytes),
                s.embedding_width
            ),
        ),
        ("scores", s.out.clone()),
        ("seconds", format!("{:.2}", s.seconds)),
    ];
    print_summary(
        "score",
        &rows,
        &serde_json::json!({"command": "score", "summary": s}),
    );
}
