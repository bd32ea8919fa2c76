//! A typed graph through the programs as a user runs them: generated with
//! IGBH's schema at mixed widths, sampled, packed without naming its
//! feature files (the dataset names them), verified and inspected; the
//! trainer says in one line that it does not train typed layouts yet.

use offgnn_e2e::{assert_one_line, run};

#[test]
fn a_typed_graph_samples_packs_and_verifies_through_the_binaries() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (ds, samples, pack) = (path("igbh"), path("samples"), path("pack"));
    let r = run(
        "sampler",
        &[
            "generate",
            "--schema",
            "igbh",
            "--nodes",
            "3000",
            "--feature-dim",
            "16",
            "--type-dims",
            "author=8,fos=4",
            "--no-features",
            "institute",
            "--classes",
            "4",
            "--out",
            &ds,
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);
    let dims: Vec<serde_json::Value> = r.json()["summary"]["node_types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["feature_dim"].clone())
        .collect();
    assert_eq!(
        dims,
        [16.into(), 8.into(), serde_json::Value::Null, 4.into()]
    );

    let r = run(
        "sampler",
        &[
            "--dataset",
            &ds,
            "--fanout",
            "5,3",
            "--batch-size",
            "128",
            "--epochs",
            "2",
            "--out",
            &samples,
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);

    let args = [
        "--samples",
        &samples,
        "--out",
        &pack,
        "--gpu-cache",
        "8K",
        "--cpu-cache",
        "16K",
        "--disk-budget",
        "10x",
    ];
    let r = run("packer", &args);
    assert!(r.status.success(), "{}", r.stderr);
    let s = &r.json()["summary"];
    assert_eq!(r.json()["typed"], true);
    assert!(s["disk_bytes"].as_u64().unwrap() <= s["disk_budget"].as_u64().unwrap());
    let types = s["node_types"].as_array().unwrap();
    assert_eq!(types.len(), 4);
    assert!(types[2]["layout"].is_null(), "institutes have no features");
    assert!(types[0]["layout"]["gpu_rows"].as_u64().unwrap() > 0);

    let manifest = format!("{pack}/manifest.json");
    let r = run("packer", &["verify", "--manifest", &manifest]);
    assert!(r.status.success(), "{}", r.stderr);
    assert_eq!(r.json()["ok"], true);
    let r = run("packer", &["inspect", "--manifest", &pack]);
    assert!(r.status.success(), "{}", r.stderr);
    assert_eq!(r.json()["manifest"]["format_version"], 6);
    assert!(r.stdout.contains("type author"), "{}", r.stdout);

    // A committed layout is refused as a homogeneous one is.
    let again = run("packer", &args);
    assert!(
        again.stderr.contains("already holds a committed layout"),
        "{}",
        again.stderr
    );
    assert_one_line(&run("trainer", &["--manifest", &manifest]), "typed graph");
}
