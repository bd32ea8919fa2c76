//! What `packer` prints at the end of each command: a table, then JSON.

use offgnn_manifests::{Manifest, Split, TypedManifest};
use offgnn_shared::report::{human_bytes, print_summary};

use crate::pack::{PackConfig, PackSummary};
use crate::typed::TypedPackSummary;
use crate::verify::VerifySummary;

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

pub fn packed(cfg: &PackConfig, s: &PackSummary) {
    let read_rate = s.feature_bytes_read as f64 / s.pack_seconds.max(1e-9) / 1e6;
    let rows = vec![
        ("manifest", s.manifest.clone()),
        (
            "packing",
            format!("{:?}, disk cache {:?}", cfg.packing, cfg.disk_cache).to_lowercase(),
        ),
        (
            "rows stored as",
            if s.store_dtype == s.feature_dtype {
                s.store_dtype.clone()
            } else {
                format!("{}, converted from {}", s.store_dtype, s.feature_dtype)
            },
        ),
        ("tiers", tiers(s)),
        ("CPU cache policy", cpu_policy(s)),
        (
            "segment size",
            match (s.algorithm2_segment_size, s.estimated_bytes) {
                (Some(a2), Some(est)) => format!(
                    "{} batches, {} of training segments (Algorithm 2 chose {a2}, estimating {})",
                    s.segment_size,
                    human_bytes(s.train_segment_bytes),
                    human_bytes(est),
                ),
                _ => format!(
                    "{} batches, {} of training segments",
                    s.segment_size,
                    human_bytes(s.train_segment_bytes)
                ),
            },
        ),
        ("segments", s.segments.to_string()),
        (
            "disk",
            format!(
                "{} of a {} budget: features {}, address tables {} ({:.0}%); blow-up {:.2}x",
                human_bytes(s.disk_bytes),
                human_bytes(s.disk_budget),
                human_bytes(s.feature_disk_bytes),
                human_bytes(s.table_bytes),
                100.0 * s.table_bytes as f64 / s.disk_bytes.max(1) as f64,
                s.blow_up
            ),
        ),
        (
            "predicted read amp.",
            format!(
                "{:.3} (lower bound {:.3}; disk-cache pages {:.3}x their rows, {:.0}% of reads; packed chunks {:.3}x)",
                s.predicted_read_amplification,
                s.amplification.lower_bound,
                s.amplification.disk_cache,
                100.0 * s.amplification.disk_cache_read_share,
                s.amplification.packed
            ),
        ),
        (
            "access shares",
            format!(
                "GPU {}, CPU {}, disk cache {}, packed {}",
                pct(s.access_shares.gpu),
                pct(s.access_shares.cpu),
                pct(s.access_shares.disk_cache),
                pct(s.access_shares.packed)
            ),
        ),
        (
            "memory",
            format!(
                "at most {} of --memory {}: loading {} ({} samples file{} at a time), then plan {}, read pieces 2 x {}, disk-cache staging {} ({} partition{}), buffers and runtime {}",
                human_bytes(s.memory.total_bytes),
                human_bytes(s.memory.limit_bytes),
                human_bytes(s.memory.loading_bytes),
                s.memory.loaders,
                if s.memory.loaders == 1 { "" } else { "s" },
                human_bytes(s.plan_bytes),
                human_bytes(s.piece_bytes),
                human_bytes(s.staging_bytes),
                s.partitions,
                if s.partitions == 1 { "" } else { "s" },
                human_bytes(s.memory.baseline_bytes)
            ),
        ),
        (
            "read / written",
            format!(
                "{} / {}",
                human_bytes(s.feature_bytes_read),
                human_bytes(s.bytes_written)
            ),
        ),
        (
            "phases",
            format!(
                "load {:.2}s, plan {:.2}s, pack {:.2}s ({read_rate:.0} MB/s read), tables {:.2}s, commit {:.2}s, total {:.2}s",
                s.load_seconds,
                s.plan_seconds,
                s.pack_seconds,
                s.table_seconds,
                s.commit_seconds,
                s.total_seconds
            ),
        ),
    ];
    print_summary(
        "packed layout",
        &rows,
        &serde_json::json!({ "command": "pack", "summary": s }),
    );
}

pub fn verified(s: &VerifySummary) {
    print_summary(
        "verified layout",
        &[
            ("manifest", s.manifest.clone()),
            (
                "objects",
                format!(
                    "{} ({}), sizes and CRC32C match",
                    s.objects,
                    human_bytes(s.object_bytes)
                ),
            ),
            (
                "batches",
                format!(
                    "{} rebuilt, {} rows equal to the feature file",
                    s.batches, s.rows
                ),
            ),
            ("wall time", format!("{:.2} s", s.seconds)),
        ],
        &serde_json::json!({ "command": "verify", "ok": true, "summary": s }),
    );
}

pub fn inspect(origin: &str, m: &Manifest) {
    let train_epochs = m.schedule.get(&Split::Train).map_or(0, Vec::len);
    let mut rows = vec![
        ("manifest", origin.to_string()),
        (
            "dataset",
            format!(
                "{} ({} nodes, {}-d {})",
                m.dataset.name, m.dataset.num_nodes, m.dataset.feature_dim, m.dataset.feature_dtype
            ),
        ),
        (
            "samples",
            format!(
                "{} (fan-outs {:?}, batch {}, {} epochs)",
                m.samples.location, m.samples.fanouts, m.samples.batch_size, train_epochs
            ),
        ),
        (
            "rows stored as",
            format!(
                "{} ({} bytes a row)",
                m.dataset.store_dtype(),
                m.dataset.store_row_bytes()
            ),
        ),
        ("GPU cache", format!("{} rows", m.gpu_cache.rows)),
        (
            "CPU cache",
            format!("{} rows, {}", m.cpu_cache.rows, m.cpu_cache.policy.name()),
        ),
        (
            "packing",
            format!(
                "{}, disk cache {} in {} order, segment size {}",
                m.packing.mode,
                m.packing.disk_cache,
                m.packing.row_order(),
                m.packing.segment_size
            ),
        ),
        (
            "disk",
            format!(
                "{} in {} objects (features {}, address tables {}), blow-up {:.2}x",
                human_bytes(m.disk_bytes),
                m.objects.len(),
                human_bytes(m.feature_disk_bytes),
                human_bytes(m.disk_bytes.saturating_sub(m.feature_disk_bytes)),
                m.blow_up
            ),
        ),
        (
            "predicted read amp.",
            format!("{:.3}", m.predicted_read_amplification),
        ),
    ];
    let seg_rows: Vec<(String, String)> = m
        .segments
        .iter()
        .enumerate()
        .map(|(i, s)| {
            (
                format!("segment {i}"),
                format!(
                    "{} x{} batches: disk cache {} rows ({}), packed {} rows ({})",
                    s.split,
                    s.batches,
                    s.disk_cache_rows,
                    human_bytes(s.disk_cache_bytes),
                    s.packed_rows,
                    human_bytes(s.chunk_bytes)
                ),
            )
        })
        .collect();
    for (k, v) in seg_rows.iter().take(20) {
        rows.push((k.as_str(), v.clone()));
    }
    let more = seg_rows.len().saturating_sub(20);
    let more_line = format!("{more} more");
    if more > 0 {
        rows.push(("...", more_line));
    }
    print_summary(
        "packed layout",
        &rows,
        &serde_json::json!({ "command": "inspect", "manifest": m }),
    );
}

/// The tiers' rows and what ranked them.
fn tiers(s: &PackSummary) -> String {
    format!(
        "GPU {} rows, CPU {} rows, ranked by {}",
        s.gpu_rows,
        s.cpu_rows,
        match s.rank_by {
            Some(crate::pack::RankBy::Graph) => "expected reads from the graph",
            _ => "sampled reads",
        }
    )
}

/// The CPU cache's policy and, where both were weighed, the rows from disk
/// each would read over the sampled training batches.
fn cpu_policy(s: &PackSummary) -> String {
    let chosen = match s.cpu_cache_policy {
        offgnn_manifests::CachePolicy::Static => "static",
        offgnn_manifests::CachePolicy::Belady | offgnn_manifests::CachePolicy::Window => &format!(
            "{} (one process trains this layout, in the sampled order)",
            s.cpu_cache_policy.name()
        ),
    };
    match &s.cpu_cache_forecast {
        Some(f) => format!(
            "{chosen}; rows (bytes) read from disk over the sampled epochs: static {} ({}), {} {} ({}) + {} rows changed, restored at epoch ends ({})",
            f.static_rows,
            human_bytes(f.static_bytes),
            f.policy,
            f.rows,
            human_bytes(f.bytes),
            f.restore_rows,
            human_bytes(f.restore_bytes),
        ),
        None => chosen.to_string(),
    }
}

/// The summary of a typed graph's packing: the whole, then each type.
pub fn packed_typed(s: &TypedPackSummary) {
    let mut rows: Vec<(String, String)> = vec![
        ("manifest".into(), s.manifest.clone()),
        (
            "disk".into(),
            format!(
                "{} of a {} budget ({} of features as stored): topology tables {}; blow-up {:.2}x",
                human_bytes(s.disk_bytes),
                human_bytes(s.disk_budget),
                human_bytes(s.feature_file_bytes),
                human_bytes(s.topology_bytes),
                s.blow_up
            ),
        ),
    ];
    for t in &s.node_types {
        let line = match (&t.layout, t.feature_dim, &t.store_dtype) {
            (Some(l), Some(dim), Some(dtype)) => format!(
                "{} rows of {dim} x {dtype}: {}, CPU cache {}; {} of a {} share, {} segments of {} batches; predicted read amp. {:.3}",
                t.rows,
                tiers(l),
                format!("{:?}", l.cpu_cache_policy).to_lowercase(),
                human_bytes(l.disk_bytes),
                human_bytes(t.disk_budget),
                l.segments,
                l.segment_size,
                l.predicted_read_amplification
            ),
            _ => format!("{} rows, no features (never read)", t.rows),
        };
        rows.push((format!("type {}", t.name), line));
    }
    if let Some(m) = &s.memory {
        rows.push((
            "memory (stated peak)".into(),
            format!(
                "at most {} of --memory {} (the most of any type's packing; types pack one after another)",
                human_bytes(m.total_bytes),
                human_bytes(m.limit_bytes)
            ),
        ));
    }
    rows.push((
        "phases".into(),
        format!(
            "load {:.2}s, types {:.2}s, topology {:.2}s, total {:.2}s",
            s.load_seconds,
            s.node_types
                .iter()
                .filter_map(|t| t.layout.as_ref())
                .map(|l| l.plan_seconds + l.pack_seconds + l.commit_seconds)
                .sum::<f64>(),
            s.topology_seconds,
            s.total_seconds
        ),
    ));
    let rows: Vec<(&str, String)> = rows.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    print_summary(
        "packed typed layout",
        &rows,
        &serde_json::json!({ "command": "pack", "typed": true, "summary": s }),
    );
}

/// `inspect` of a typed layout: its types, relations and topology.
pub fn inspect_typed(origin: &str, m: &TypedManifest) {
    let mut rows: Vec<(String, String)> = vec![
        ("manifest".into(), origin.to_string()),
        (
            "dataset".into(),
            format!(
                "{} ({} nodes of {} types, {} relations; target type {}, {} classes)",
                m.dataset.name,
                m.dataset.num_nodes,
                m.node_types.len(),
                m.relations.len(),
                m.dataset.target_type,
                m.dataset.num_classes
            ),
        ),
    ];
    for t in &m.node_types {
        let line = match (&t.layout, t.feature_dim, t.dtype) {
            (Some(l), Some(dim), Some(dtype)) => format!(
                "ids {}..{}: {dim} x {dtype}, GPU {} rows, CPU {} rows, {} segments, {}",
                t.offset,
                t.offset + t.rows,
                l.gpu_cache.rows,
                l.cpu_cache.rows,
                l.segments.len(),
                human_bytes(l.disk_bytes)
            ),
            _ => format!("ids {}..{}: no features", t.offset, t.offset + t.rows),
        };
        rows.push((format!("type {}", t.name), line));
    }
    let batches: u32 = m.topology.tables.iter().map(|t| t.batches).sum();
    rows.push((
        "topology".into(),
        format!(
            "{} tables, {batches} batches, {}",
            m.topology.tables.len(),
            human_bytes(m.topology.bytes)
        ),
    ));
    rows.push((
        "disk".into(),
        format!(
            "{} of a {} budget, {} objects; blow-up {:.2}x",
            human_bytes(m.disk_bytes),
            human_bytes(m.disk_budget),
            m.objects.len(),
            m.blow_up
        ),
    ));
    let rows: Vec<(&str, String)> = rows.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    print_summary(
        "packed typed layout",
        &rows,
        &serde_json::json!({ "command": "inspect", "manifest": m }),
    );
}
