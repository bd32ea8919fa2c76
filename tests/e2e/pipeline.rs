//! Whole runs, sampler -> packer -> trainer, on settings that cross all
//! three programs: feature rows stored as bfloat16, and repeated edges
//! kept through to training.

use offgnn_e2e::{cora_pack_args, cora_samples, run};

/// `packer --store-dtype bf16`: the layout verifies, records both types in
/// its manifest, takes fewer bytes than float32's, and trains.
#[test]
fn cora_packs_and_trains_on_bfloat16_rows_through_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let (ds, samples) = cora_samples(dir.path());
    let feat = ds.join("data/feat.npy");
    let (s, f) = (samples.to_str().unwrap(), feat.to_str().unwrap());
    let mut bytes = Vec::new();
    for dtype in ["f32", "bf16"] {
        let out = dir.path().join(dtype);
        let mut args = cora_pack_args(s, f, out.to_str().unwrap());
        args.extend(["--store-dtype", dtype]);
        let r = run("packer", &args);
        assert!(r.status.success(), "{}", r.stderr);
        bytes.push(r.json()["summary"]["feature_disk_bytes"].as_u64().unwrap());
        let manifest = out.join("manifest.json");
        let m = manifest.to_str().unwrap();
        let r = run("packer", &["verify", "--manifest", m]);
        assert!(r.status.success(), "{}", r.stderr);
        let r = run("packer", &["inspect", "--manifest", m]);
        assert!(r.status.success(), "{}", r.stderr);
        let d = &r.json()["manifest"]["dataset"];
        assert_eq!(d["feature_dtype"], "float32");
        if dtype == "bf16" {
            assert_eq!(r.json()["manifest"]["format_version"], 3);
            assert_eq!(d["store_dtype"], "bfloat16");
            let r = run(
                "trainer",
                &["--manifest", m, "--epochs", "3", "--hidden", "64"],
            );
            assert!(r.status.success(), "{}", r.stderr);
            let t = &r.json()["summary"];
            assert_eq!(t["rows_dtype"], "bfloat16");
            let acc = t["test_acc_at_best_valid"].as_f64().unwrap();
            assert!(acc > 0.6, "Cora test accuracy on bfloat16 rows {acc}");
        } else {
            assert_eq!(r.json()["manifest"]["format_version"], 3);
            assert!(d.get("store_dtype").is_none());
        }
    }
    // The same budgets hold twice the rows in the caches, so the segments
    // shrink by more than half of what the caches leave.
    assert!(
        bytes[1] < bytes[0] * 6 / 10,
        "bfloat16 {} bytes against float32 {}",
        bytes[1],
        bytes[0]
    );
    let mut args = cora_pack_args(s, f, "unused");
    args.extend(["--store-dtype", "f8"]);
    let r = run("packer", &args);
    assert!(
        !r.status.success() && r.stderr.contains("f8"),
        "{}",
        r.stderr
    );
}

/// Repeated edges: dropped by default, counted in the summary; kept with
/// --keep-duplicate-edges (as DGL keeps them), and then the packer and the
/// trainer take batches whose blocks can repeat an edge.
#[test]
fn repeated_edges_are_counted_or_kept() {
    let dir = tempfile::tempdir().unwrap();
    // 400 nodes with 20 edges each, drawn at random: some pairs repeat.
    let ds = offgnn_e2e::generate(
        dir.path(),
        &[
            "--nodes",
            "400",
            "--avg-degree",
            "20",
            "--feature-dim",
            "8",
            "--classes",
            "3",
        ],
    );
    let sample = |out: &str, extra: &[&str]| {
        let out = dir.path().join(out);
        let mut args = vec![
            "--dataset",
            ds.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--fanout",
            "20,20",
            "--batch-size",
            "64",
        ];
        args.extend_from_slice(extra);
        let r = run("sampler", &args);
        assert!(r.status.success(), "{}", r.stderr);
        (out, r.json())
    };
    let (_, dropped) = sample("dedup", &[]);
    let n = dropped["duplicate_edges_dropped"].as_u64().unwrap();
    assert!(n > 0, "no repeated edge in the generated graph: {dropped}");
    assert_eq!(dropped["run"]["params"]["dedup_edges"], true);
    let (kept_dir, kept) = sample("kept", &["--keep-duplicate-edges"]);
    assert_eq!(kept["duplicate_edges_dropped"], 0);
    assert_eq!(kept["run"]["params"]["dedup_edges"], false);
    assert_eq!(
        kept["run"]["dataset"]["graph_edges"].as_u64().unwrap(),
        dropped["run"]["dataset"]["graph_edges"].as_u64().unwrap() + n
    );
    let pack = dir.path().join("pack");
    let feat = ds.join("data/feat.npy");
    let r = run(
        "packer",
        &cora_pack_args(
            kept_dir.to_str().unwrap(),
            feat.to_str().unwrap(),
            pack.to_str().unwrap(),
        ),
    );
    assert!(r.status.success(), "{}", r.stderr);
    let manifest = pack.join("manifest.json");
    for model in ["sage", "gat"] {
        let r = run(
            "trainer",
            &[
                "--manifest",
                manifest.to_str().unwrap(),
                "--model",
                model,
                "--epochs",
                "1",
                "--hidden",
                "8",
            ],
        );
        assert!(r.status.success(), "{model}: {}", r.stderr);
    }
}
