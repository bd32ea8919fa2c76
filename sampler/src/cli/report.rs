//! The end-of-run summary of `sampler`: a table, then the JSON summary.

use offgnn_shared::report::{human_bytes, print_summary};

use crate::config::SampleConfig;
use crate::sample_run::Outcome;

pub fn print(cfg: &SampleConfig, o: &Outcome) {
    let bytes: u64 = o.shard.files.iter().map(|f| f.object.size).sum();
    let per_sec = o.batches as f64 / o.sample_seconds.max(1e-9);
    let mut rows = vec![
        (
            "dataset",
            format!(
                "{} ({} nodes)",
                o.shard.dataset.name, o.shard.dataset.num_nodes
            ),
        ),
        (
            "fan-outs / batch size",
            format!(
                "{} / {}{}",
                fanouts(cfg),
                cfg.batch_size,
                (cfg.eval_batch_size.filter(|&e| e != cfg.batch_size))
                    .map_or(String::new(), |e| format!(" (validation and test {e})"))
            ),
        ),
        ("shard", format!("{} of {}", cfg.shard, cfg.num_shards)),
        ("batches", o.batches.to_string()),
        ("sampled edges", o.edges.to_string()),
        (
            "files",
            format!("{} ({})", o.shard.files.len(), human_bytes(bytes)),
        ),
        (
            "topology",
            format!(
                "{:.2} s, {} repeated edges dropped",
                o.csr_seconds, o.duplicate_edges_dropped
            ),
        ),
        ("memory (stated peak)", human_bytes(o.memory.total_bytes)),
        (
            "sampling",
            format!(
                "{:.2} s, {per_sec:.1} batches/s, {:.0} edges/s on {} threads",
                o.sample_seconds,
                o.edges as f64 / o.sample_seconds.max(1e-9),
                cfg.threads
            ),
        ),
    ];
    rows.push((
        "committed",
        match &o.run {
            Some(_) => format!("yes: {}/run.json", offgnn_shared::store::redact(&cfg.out)),
            None => "not yet: waiting for the other shards".into(),
        },
    ));
    let json = serde_json::json!({
        "command": "sample",
        "out": offgnn_shared::store::redact(&cfg.out),
        "committed": o.run.is_some(),
        "batches": o.batches,
        "edges": o.edges,
        "bytes": bytes,
        "threads": cfg.threads,
        "csr_seconds": o.csr_seconds,
        "duplicate_edges_dropped": o.duplicate_edges_dropped,
        "sample_seconds": o.sample_seconds,
        "batches_per_second": per_sec,
        "memory": &o.memory,
        "leftovers_removed": &o.leftovers_removed,
        "shard": &o.shard,
        "run": &o.run,
    });
    print_summary("sampling run", &rows, &json);
}

/// The fan-outs per layer; a typed graph's whose relations draw
/// differently, each list with the number of relations that draw it.
fn fanouts(cfg: &SampleConfig) -> String {
    let relations = cfg.relation_fanouts.first().map_or(0, Vec::len);
    let per_relation: Vec<Vec<usize>> = (0..relations)
        .map(|r| cfg.relation_fanouts.iter().map(|l| l[r]).collect())
        .collect();
    let mut lists: Vec<(Vec<usize>, usize)> = Vec::new();
    for f in per_relation {
        match lists.iter_mut().find(|(l, _)| *l == f) {
            Some((_, n)) => *n += 1,
            None => lists.push((f, 1)),
        }
    }
    if lists.len() < 2 {
        return format!("{:?}", cfg.fanouts);
    }
    let said: Vec<String> = lists
        .iter()
        .map(|(l, n)| {
            format!(
                "{l:?} for {}",
                offgnn_shared::report::count(*n as u64, "relation", "relations")
            )
        })
        .collect();
    said.join(", ")
}
