//! End-to-end: the three binaries as a user runs them.

use offgnn_e2e::{cora_dir, run, run_with_env};

#[test]
fn every_binary_has_help_with_a_worked_example() {
    for name in ["sampler", "packer", "trainer"] {
        let r = run(name, &["--help"]);
        assert!(r.status.success(), "{name} --help failed: {}", r.stderr);
        assert!(
            r.stdout.contains("Examples:"),
            "{name} --help shows no example"
        );
        assert!(
            r.stdout.contains(&format!("  {name} ")),
            "{name}'s examples do not run {name}"
        );
    }
}

#[test]
fn cora_imports_and_inspects_through_the_binary() {
    let cora = cora_dir();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("cora");
    let nodes = cora.join("cora_nodes.parquet.gzip");
    let edges = cora.join("cora_rels.parquet.gzip");
    let args = [
        "import-parquet",
        "--preset",
        "cora",
        "--nodes",
        nodes.to_str().unwrap(),
        "--edges",
        edges.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    let r = run("sampler", &args);
    assert!(r.status.success(), "import failed: {}", r.stderr);
    let s = &r.json()["summary"];
    assert_eq!(s["num_nodes"], 2708);
    assert_eq!(s["input_edges"], 5429);
    assert_eq!(s["num_classes"], 7);

    // A second import into the same place is refused, and leaves it intact.
    let again = run("sampler", &args);
    assert!(!again.status.success());
    assert!(again.stderr.contains("already exists"), "{}", again.stderr);
    assert_eq!(
        again.stderr.trim().lines().count(),
        1,
        "one line: {}",
        again.stderr
    );

    let r = run("sampler", &["inspect", "--dataset", out.to_str().unwrap()]);
    assert!(r.status.success(), "inspect failed: {}", r.stderr);
    let j = r.json();
    assert_eq!(j["num_nodes"], 2708);
    assert_eq!(j["num_edges_csr"], 2 * 5429);
    assert_eq!(j["feature_dim"], 1433);
    assert_eq!(
        j["train"].as_u64().unwrap() + j["valid"].as_u64().unwrap() + j["test"].as_u64().unwrap(),
        2708
    );
}

#[test]
fn generate_writes_a_dataset_that_inspect_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("synth");
    let r = run(
        "sampler",
        &[
            "generate",
            "--out",
            out.to_str().unwrap(),
            "--nodes",
            "5000",
            "--feature-dim",
            "16",
            "--classes",
            "4",
            "--dtype",
            "f16",
        ],
    );
    assert!(r.status.success(), "generate failed: {}", r.stderr);
    assert_eq!(r.json()["summary"]["num_nodes"], 5000);
    let r = run("sampler", &["inspect", "--dataset", out.to_str().unwrap()]);
    assert!(r.status.success(), "inspect failed: {}", r.stderr);
    assert_eq!(r.json()["feature_dtype"], "f16");
    assert_eq!(r.json()["num_classes"], 4);
}

#[test]
fn bad_input_is_one_line_and_a_failing_exit() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let r = run(
        "sampler",
        &["inspect", "--dataset", missing.to_str().unwrap()],
    );
    assert!(!r.status.success());
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    assert!(r.stderr.contains("metadata.yaml"), "{}", r.stderr);

    let r = run(
        "sampler",
        &[
            "generate",
            "--out",
            dir.path().join("g").to_str().unwrap(),
            "--nodes",
            "3",
            "--classes",
            "4",
        ],
    );
    assert!(!r.status.success());
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    assert!(
        !dir.path().join("g").exists(),
        "nothing written for a refused run"
    );

    let r = run("trainer", &["--manifest", "m.json", "--device", "tpu"]);
    assert!(!r.status.success());
    assert!(r.stderr.contains("unknown device 'tpu'"), "{}", r.stderr);
}

#[test]
fn cora_samples_through_the_binary_and_refuses_a_second_run() {
    let cora = cora_dir();
    let dir = tempfile::tempdir().unwrap();
    let ds = dir.path().join("cora");
    let r = run(
        "sampler",
        &[
            "import-parquet",
            "--preset",
            "cora",
            "--nodes",
            cora.join("cora_nodes.parquet.gzip").to_str().unwrap(),
            "--edges",
            cora.join("cora_rels.parquet.gzip").to_str().unwrap(),
            "--out",
            ds.to_str().unwrap(),
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);
    let out = dir.path().join("samples");
    let args = [
        "--dataset",
        ds.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--epochs",
        "2",
        "--batch-size",
        "256",
    ];
    let r = run("sampler", &args);
    assert!(r.status.success(), "{}", r.stderr);
    let j = r.json();
    assert_eq!(j["committed"], true);
    // 1625 training seeds in batches of 256: 7 per epoch; 542 valid: 3; 541 test: 3.
    assert_eq!(j["batches"], 2 * 7 + 3 + 3);
    assert_eq!(j["run"]["counts"]["train"]["batches"], 14);
    assert!(out.join("run.json").exists());
    assert!(
        out.join("samples/split=train/epoch=0001/part-00000.parquet")
            .exists()
    );

    let again = run("sampler", &args);
    assert!(!again.status.success());
    assert!(
        again
            .stderr
            .contains("already holds a committed sampling run"),
        "{}",
        again.stderr
    );
    assert_eq!(again.stderr.trim().lines().count(), 1, "{}", again.stderr);

    for (bad, want) in [
        (vec!["--fanout", ""], "--fanout is empty"),
        (vec!["--fanout", "5,0"], "a fan-out of 0"),
        (vec!["--batch-size", "0"], "--batch-size"),
        (
            vec!["--shard", "2", "--num-shards", "2"],
            "--shard 2 is out of range",
        ),
    ] {
        let x = dir.path().join("x");
        let mut a: Vec<&str> = vec![
            "--dataset",
            ds.to_str().unwrap(),
            "--out",
            x.to_str().unwrap(),
        ];
        a.extend(bad);
        let r = run("sampler", &a);
        assert!(!r.status.success());
        assert!(r.stderr.contains(want), "{want}: {}", r.stderr);
        assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
        assert!(!dir.path().join("x/run.json").exists());
    }
}

#[test]
fn unreachable_store_is_a_clear_error_without_credentials() {
    let cora = cora_dir();
    let dir = tempfile::tempdir().unwrap();
    let ds = dir.path().join("cora");
    let r = run(
        "sampler",
        &[
            "import-parquet",
            "--preset",
            "cora",
            "--nodes",
            cora.join("cora_nodes.parquet.gzip").to_str().unwrap(),
            "--edges",
            cora.join("cora_rels.parquet.gzip").to_str().unwrap(),
            "--out",
            ds.to_str().unwrap(),
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);
    // A loopback port that nothing listens on.
    let env = [
        ("AWS_ENDPOINT", "http://127.0.0.1:9"),
        ("AWS_ALLOW_HTTP", "true"),
        ("AWS_ACCESS_KEY_ID", "offgnn-test"),
        ("AWS_SECRET_ACCESS_KEY", "very-secret-value"),
        ("AWS_REGION", "us-east-1"),
    ];
    let started = std::time::Instant::now();
    let r = run_with_env(
        "sampler",
        &[
            "--dataset",
            ds.to_str().unwrap(),
            "--out",
            "s3://bucket/samples",
        ],
        &env,
    );
    assert!(!r.status.success());
    assert!(r.stderr.contains("s3://bucket/samples"), "{}", r.stderr);
    assert!(
        !r.stderr.contains("very-secret-value"),
        "credentials leaked: {}",
        r.stderr
    );
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    assert!(
        started.elapsed().as_secs() < 120,
        "took {:?}",
        started.elapsed()
    );
}
