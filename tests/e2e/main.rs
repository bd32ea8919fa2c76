//! End-to-end: the three binaries as a user runs them.

use offgnn_e2e::{cora_dir, run};

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
