//! The CPU cache's policies (issue 39, item 2): the static tier of the
//! most-read rows (DiskGNN) and Belady's policy over the sampled batch
//! order (Ginex), on the same samples.

use std::path::Path;

use offgnn_e2e::{run, run_env};

/// Samples of a power-law graph whose CPU cache holds a tenth of its rows.
fn samples(dir: &Path) -> (String, String) {
    let ds = offgnn_e2e::generate(
        dir,
        &[
            "--nodes",
            "20000",
            "--feature-dim",
            "32",
            "--classes",
            "4",
            "--power-law",
            "2.1",
            "--train-fraction",
            "0.3",
            "--valid-fraction",
            "0.05",
            "--test-fraction",
            "0.05",
        ],
    );
    let out = dir.join("samples");
    let args = [
        "--dataset",
        ds.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--fanout",
        "5,10",
        "--batch-size",
        "256",
        "--epochs",
        "2",
    ];
    let r = run("sampler", &args);
    assert!(r.status.success(), "{}", r.stderr);
    let feat = ds.join("data/feat.npy");
    (
        out.to_str().unwrap().to_string(),
        feat.to_str().unwrap().to_string(),
    )
}

/// Packs with `policy`; returns the manifest's path and the summary.
fn pack(dir: &Path, s: &(String, String), policy: &str) -> (String, serde_json::Value) {
    pack_with(dir, s, &["--cpu-cache-policy", policy], policy)
}

/// Packs with `flags` into `dir/pack-NAME`; returns the manifest's path
/// and the summary.
fn pack_with(
    dir: &Path,
    (samples, feat): &(String, String),
    flags: &[&str],
    name: &str,
) -> (String, serde_json::Value) {
    let out = dir.join(format!("pack-{name}"));
    let args = [
        "--samples",
        samples,
        "--features",
        feat,
        "--out",
        out.to_str().unwrap(),
        "--gpu-cache",
        "32K",
        "--cpu-cache",
        "256K",
        "--disk-budget",
        "8x",
    ];
    let args: Vec<&str> = args.iter().chain(flags).copied().collect();
    let r = run("packer", &args);
    assert!(r.status.success(), "{}", r.stderr);
    let manifest = out.join("manifest.json");
    (
        manifest.to_str().unwrap().to_string(),
        r.json()["summary"].clone(),
    )
}

/// One thread for libtorch: identical inputs then give identical losses.
fn train(manifest: &str, extra: &[&str]) -> offgnn_e2e::Run {
    let mut args = vec!["--manifest", manifest, "--hidden", "16", "--seed", "3"];
    args.extend_from_slice(extra);
    let env = [
        ("OMP_NUM_THREADS".to_string(), "1".to_string()),
        ("RUST_LOG".to_string(), "info".to_string()),
    ];
    run_env("trainer", &args, &env)
}

fn epochs(r: &offgnn_e2e::Run) -> Vec<serde_json::Value> {
    r.json()["summary"]["epochs"].as_array().unwrap().clone()
}

/// Each epoch's loss and accuracies: equal only where every batch's input
/// rows are.
fn learning(r: &offgnn_e2e::Run) -> Vec<(f64, f64, f64)> {
    epochs(r)
        .iter()
        .map(|e| {
            let f = |k: &str| e[k].as_f64().unwrap();
            (f("loss"), f("valid_acc"), f("test_acc"))
        })
        .collect()
}

fn disk_bytes(r: &offgnn_e2e::Run) -> Vec<u64> {
    epochs(r)
        .iter()
        .map(|e| e["disk_bytes"].as_u64().unwrap())
        .collect()
}

#[test]
fn a_cpu_cache_that_follows_the_batch_order_trains_on_the_same_rows_and_reads_fewer_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let s = samples(dir.path());
    let (fixed, packed_static) = pack(dir.path(), &s, "static");
    let (follows, packed_auto) = pack(dir.path(), &s, "auto");
    assert_eq!(packed_static["cpu_cache_policy"], "static");
    assert!(packed_static["cpu_cache_forecast"].is_null());
    // Auto weighed both and took Belady, which reads fewer bytes from
    // disk, restores included.
    assert_eq!(packed_auto["cpu_cache_policy"], "belady", "{packed_auto}");
    let f = &packed_auto["cpu_cache_forecast"];
    let n = |k: &str| f[k].as_u64().unwrap();
    assert_eq!(f["policy"], "belady");
    assert!(n("bytes") + n("restore_bytes") < n("static_bytes"), "{f}");
    assert!(n("rows") < n("static_rows"), "{f}");
    // The layout rebuilds every batch's rows exactly, the cache replayed.
    let r = run("packer", &["verify", "--manifest", &follows]);
    assert!(r.status.success(), "{}", r.stderr);

    let a = train(&fixed, &["--epochs", "2"]);
    assert!(a.status.success(), "{}", a.stderr);
    let b = train(&follows, &["--epochs", "2"]);
    assert!(b.status.success(), "{}", b.stderr);
    assert_eq!(b.json()["summary"]["cpu_cache_policy"], "belady");
    assert_eq!(learning(&a), learning(&b));
    for (e, (s, d)) in disk_bytes(&a).iter().zip(disk_bytes(&b)).enumerate() {
        assert!(d < *s, "epoch {e}: belady read {d} bytes, static {s}");
    }
    assert!(
        epochs(&b)
            .iter()
            .all(|e| e["cpu_cache_restored_bytes"].as_u64().unwrap() > 0)
    );

    // Past the sampled epochs the order is the sampled one again, so an
    // epoch reads what its sampled epoch read.
    let c = train(&follows, &["--epochs", "3"]);
    assert!(c.status.success(), "{}", c.stderr);
    assert!(c.stderr.contains("in the sampled order"), "{}", c.stderr);
    let bytes = disk_bytes(&c);
    assert_eq!(bytes[2], bytes[0]);
    assert_eq!(learning(&c)[..2], learning(&b)[..]);

    // A run resumed inside an epoch rebuilds the cache and trains on.
    let ckpt = dir.path().join("ckpt");
    let ckpt = ckpt.to_str().unwrap();
    let stop = [
        "--epochs",
        "2",
        "--checkpoint-dir",
        ckpt,
        "--checkpoint-every",
        "3",
    ];
    let mut args = vec!["--manifest", follows.as_str(), "--hidden", "16"];
    args.extend(["--seed", "3"]);
    args.extend_from_slice(&stop);
    // Interrupted after the checkpoint at epoch 1's third batch (the
    // first epoch has more than 3 batches: 6000 seeds in 256s).
    let steps = epochs(&b)[0]["batches"].as_u64().unwrap();
    let after = (steps + 3).to_string();
    let env = [
        ("OMP_NUM_THREADS".to_string(), "1".to_string()),
        ("RUST_LOG".to_string(), "info".to_string()),
        ("OFFGNN_TEST_INTERRUPT_AFTER".to_string(), after),
    ];
    let stopped = run_env("trainer", &args, &env);
    assert!(!stopped.status.success(), "{}", stopped.stderr);
    let mut resume: Vec<&str> = stop.to_vec();
    resume.push("--resume");
    let resumed = train(&follows, &resume);
    assert!(resumed.status.success(), "{}", resumed.stderr);
    assert!(
        resumed.stderr.contains("rebuilt the CPU cache"),
        "{}",
        resumed.stderr
    );
    assert_eq!(resumed.json()["summary"]["resumed_from"][0], 1);
    assert_eq!(learning(&resumed), learning(&b));

    // GIDS's window over random eviction: another order of admissions,
    // the same rows for every batch.
    let (window, packed_window) = pack(dir.path(), &s, "window");
    assert_eq!(packed_window["cpu_cache_policy"], "window");
    assert_eq!(
        packed_window["cpu_cache_forecast"]["policy"],
        "window of 8 batches"
    );
    let r = run("packer", &["verify", "--manifest", &window]);
    assert!(r.status.success(), "{}", r.stderr);
    let w = train(&window, &["--epochs", "2"]);
    assert!(w.status.success(), "{}", w.stderr);
    assert_eq!(learning(&w), learning(&a));

    // Data-parallel training deals the batches out: refused in one line.
    let r = train(&follows, &["--epochs", "1", "--emulate-ranks", "2"]);
    assert!(!r.status.success());
    assert!(
        r.stderr
            .contains("for data-parallel training pack it with --cpu-cache-policy static"),
        "{}",
        r.stderr
    );
}

/// GIDS's hot set without samples: the tiers ranked by each row's expected
/// reads from the graph and the fan-outs. The sampled counts are what the
/// batches read, so no ranking serves more of them from a cache of that
/// size; the graph's comes close, and the layout is as exact.
#[test]
fn tiers_ranked_from_the_graph_alone_serve_no_more_than_the_samples_ranking() {
    let dir = tempfile::tempdir().unwrap();
    let s = samples(dir.path());
    let by = |what: &str| {
        let flags = ["--cpu-cache-policy", "static", "--rank-by", what];
        pack_with(dir.path(), &s, &flags, what)
    };
    let (_, sampled) = by("samples");
    let (graph, ranked) = by("graph");
    assert_eq!(ranked["rank_by"], "graph");
    let cached = |j: &serde_json::Value| {
        let a = &j["access_shares"];
        a["gpu"].as_f64().unwrap() + a["cpu"].as_f64().unwrap()
    };
    let (from_samples, from_graph) = (cached(&sampled), cached(&ranked));
    assert!(
        from_graph <= from_samples && from_graph > 0.5 * from_samples,
        "cached shares: graph {from_graph}, samples {from_samples}"
    );
    let r = run("packer", &["verify", "--manifest", &graph]);
    assert!(r.status.success(), "{}", r.stderr);
    // Without the dataset the samples came from: one line naming it.
    std::fs::rename(dir.path().join("g"), dir.path().join("moved")).unwrap();
    let out = dir.path().join("pack-lost");
    let args = [
        "--samples",
        &s.0,
        "--features",
        &dir.path().join("moved/data/feat.npy").to_string_lossy(),
        "--out",
        out.to_str().unwrap(),
        "--gpu-cache",
        "0",
        "--cpu-cache",
        "256K",
        "--disk-budget",
        "8x",
        "--rank-by",
        "graph",
    ]
    .map(str::to_string);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = run("packer", &args);
    assert!(!r.status.success());
    assert!(
        r.stderr
            .contains("--rank-by graph reads the graph the samples came from"),
        "{}",
        r.stderr
    );
}
