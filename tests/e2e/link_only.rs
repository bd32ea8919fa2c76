//! A graph for link prediction alone (issue 38): a `metadata.yaml` whose
//! only task is `link_prediction`, as GraphBolt's ogbl-citation2 is, opens,
//! samples, packs and trains, untyped and typed; a node-task run on it is
//! refused in one line.

use std::path::Path;

use offgnn_e2e::{assert_one_line, generate, run, sample, split_edges};
use offgnn_shared::dataset::{Dataset, Metadata, TypedDataset};

/// Drops every task of the dataset at `root` but `link_prediction`.
fn keep_link_task_only(root: &Path) {
    let mut meta = Metadata::read(root).unwrap();
    meta.tasks.retain(|t| t.name == "link_prediction");
    assert_eq!(meta.tasks.len(), 1);
    let yaml = serde_yaml_ng::to_string(&meta).unwrap();
    std::fs::write(root.join("metadata.yaml"), yaml).unwrap();
}

/// Samples `lp` without `--task link` (refused), then with it, packs
/// (`packing`: the packer's further flags) and trains (`training`);
/// returns the training summary.
fn sample_pack_train(
    dir: &Path,
    lp: &Path,
    packing: &[&str],
    training: &[&str],
) -> serde_json::Value {
    let refused = run(
        "sampler",
        &[
            "--dataset",
            lp.to_str().unwrap(),
            "--out",
            dir.join("node-samples").to_str().unwrap(),
            "--fanout",
            "5,5",
        ],
    );
    assert_one_line(
        &refused,
        "has no node classification task (its only task is link_prediction): sample it with --task link",
    );
    let samples = dir.join("samples");
    let flags = ["--task", "link", "--negatives", "3", "--fanout", "5,5"];
    sample(
        lp,
        &samples,
        &[&flags[..], &["--batch-size", "128"]].concat(),
    );
    let out = dir.join("pack");
    let (samples, out) = (samples.to_str().unwrap(), out.to_str().unwrap());
    let mut args = vec!["--samples", samples, "--out", out];
    args.extend_from_slice(&[
        "--gpu-cache",
        "8K",
        "--cpu-cache",
        "16K",
        "--disk-budget",
        "30x",
    ]);
    args.extend_from_slice(packing);
    let r = run("packer", &args);
    assert!(r.status.success(), "{}", r.stderr);
    let manifest = dir.join("pack/manifest.json");
    let mut args = vec!["--manifest", manifest.to_str().unwrap()];
    args.extend_from_slice(&["--hidden", "32", "--epochs", "2"]);
    args.extend_from_slice(training);
    let r = run("trainer", &args);
    assert!(r.status.success(), "{}", r.stderr);
    r.json()["summary"].clone()
}

#[test]
fn a_graph_for_link_prediction_alone_samples_packs_and_trains() {
    let dir = tempfile::tempdir().unwrap();
    let ds = generate(
        &dir.path().join("plain"),
        &["--nodes", "1500", "--feature-dim", "16", "--classes", "4"],
    );
    let lp = dir.path().join("plain-lp");
    let r = split_edges(&ds, &lp, &["--negatives", "10"]);
    assert!(r.status.success(), "{}", r.stderr);
    keep_link_task_only(&lp);
    let opened = Dataset::open(&lp).unwrap();
    assert_eq!(opened.num_classes, 0);
    assert!(opened.train.seeds.is_empty());
    // It splits anew: the link task replaced, still no node task.
    let again = dir.path().join("plain-lp-again");
    let r = split_edges(&lp, &again, &["--negatives", "5"]);
    assert!(r.status.success(), "{}", r.stderr);
    let meta = Metadata::read(&again).unwrap();
    let tasks: Vec<&str> = meta.tasks.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(tasks, ["link_prediction"]);
    let features = lp.join("data/feat.npy");
    // The tiers ranked from the graph start from the training pairs'
    // endpoints (the node task's seeds, of which there are none here).
    let packing = [
        "--features",
        features.to_str().unwrap(),
        "--rank-by",
        "graph",
        "--cpu-cache-policy",
        "static",
    ];
    let s = sample_pack_train(&dir.path().join("plain-run"), &lp, &packing, &[]);
    assert!(
        s["test_rank_at_best_valid"]["mrr"].as_f64().unwrap() > 0.0,
        "{s}"
    );
    let cached = &s["epochs"][0];
    assert!(
        cached["hit_gpu"].as_f64().unwrap() + cached["hit_cpu"].as_f64().unwrap() > 0.0,
        "{cached}"
    );

    let typed = generate(
        &dir.path().join("igbh"),
        &["--schema", "igbh", "--nodes", "1500", "--feature-dim", "8"],
    );
    let lp = dir.path().join("igbh-lp");
    let flags = ["--negatives", "10", "--relation", "paper:written_by:author"];
    let r = split_edges(&typed, &lp, &flags);
    assert!(r.status.success(), "{}", r.stderr);
    keep_link_task_only(&lp);
    let again = dir.path().join("igbh-lp-again");
    let r = split_edges(&lp, &again, &flags);
    assert!(r.status.success(), "{}", r.stderr);
    let meta = Metadata::read(&again).unwrap();
    let tasks: Vec<&str> = meta.tasks.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(tasks, ["link_prediction"]);
    let opened = TypedDataset::open(&lp).unwrap();
    assert_eq!(opened.num_classes, 0);
    assert_eq!(opened.node_types[opened.target].name, "paper");
    let r = run("sampler", &["inspect", "--dataset", lp.to_str().unwrap()]);
    assert!(r.status.success(), "{}", r.stderr);
    let inspected = r.json();
    assert_eq!(inspected["num_classes"], 0);
    let task = &inspected["link_prediction"];
    assert_eq!(task["relation"], "paper:written_by:author", "{inspected}");
    assert!(task["train_pairs"].as_u64().unwrap() > 0, "{inspected}");
    let s = sample_pack_train(&dir.path().join("igbh-run"), &lp, &[], &["--model", "sage"]);
    assert!(
        s["test_rank_at_best_valid"]["mrr"].as_f64().unwrap() > 0.0,
        "{s}"
    );

    // With no task at all, the dataset is refused in one line.
    let mut meta = Metadata::read(&lp).unwrap();
    meta.tasks.clear();
    std::fs::write(
        lp.join("metadata.yaml"),
        serde_yaml_ng::to_string(&meta).unwrap(),
    )
    .unwrap();
    let err = TypedDataset::open(&lp).unwrap_err().to_string();
    assert!(
        err.contains("no task: a node classification or link_prediction task is required"),
        "{err}"
    );
}
