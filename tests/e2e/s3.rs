//! The three programs with every location an s3:// URL, against the
//! S3-compatible server `scripts/test` starts on loopback.

use std::path::{Path, PathBuf};

use offgnn_e2e::{Run, S3, run_env};

/// Generates a small graph locally and uploads its feature file.
fn graph_with_remote_features(dir: &Path, s3: &S3, prefix: &str) -> PathBuf {
    let ds = offgnn_e2e::generate(
        dir,
        &[
            "--nodes",
            "4000",
            "--feature-dim",
            "16",
            "--classes",
            "4",
            "--train-fraction",
            "0.2",
            "--valid-fraction",
            "0.1",
        ],
    );
    s3.store(prefix)
        .put("feat.npy", std::fs::read(ds.join("data/feat.npy")).unwrap())
        .unwrap();
    ds
}

#[test]
fn sample_pack_and_train_through_s3() {
    let Some(s3) = S3::from_env() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let prefix = format!("e2e-{}", std::process::id());
    let ds = graph_with_remote_features(dir.path(), &s3, &prefix);
    let mut outputs = Vec::new();
    let manifest = sample_and_pack(&s3, &ds, &prefix, &mut outputs);
    let export = train_twice(&s3, &manifest, dir.path(), &mut outputs);
    infer_through_the_store(&s3, &ds, &prefix, &export, dir.path(), &mut outputs);
    for r in &outputs {
        assert!(
            !r.stdout.contains(&s3.secret_key) && !r.stderr.contains(&s3.secret_key),
            "the secret key leaked"
        );
    }
}

/// Samples `ds` into the store and packs it there, features read from the
/// store too; returns the manifest's URL. The runs go to `outputs`.
fn sample_and_pack(s3: &S3, ds: &Path, prefix: &str, outputs: &mut Vec<Run>) -> String {
    let env = s3.env();
    let (samples, features, pack) = (
        s3.url(&format!("{prefix}/samples")),
        s3.url(&format!("{prefix}/feat.npy")),
        s3.url(&format!("{prefix}/pack")),
    );
    let r = run_env(
        "sampler",
        &[
            "--dataset",
            ds.to_str().unwrap(),
            "--out",
            &samples,
            "--fanout",
            "4,6",
            "--batch-size",
            "128",
            "--epochs",
            "2",
        ],
        &env,
    );
    assert!(r.status.success(), "sampler: {}", r.stderr);
    outputs.push(r);
    let r = run_env(
        "packer",
        &[
            "--samples",
            &samples,
            "--features",
            &features,
            "--out",
            &pack,
            "--gpu-cache",
            "32K",
            "--cpu-cache",
            "64K",
            "--disk-budget",
            "6x",
        ],
        &env,
    );
    assert!(r.status.success(), "packer: {}", r.stderr);
    assert!(
        r.json()["summary"]["manifest"]
            .as_str()
            .unwrap()
            .starts_with("s3://")
    );
    outputs.push(r);
    let manifest = format!("{pack}/manifest.json");
    let r = run_env("packer", &["verify", "--manifest", &manifest], &env);
    assert!(r.status.success(), "verify: {}", r.stderr);
    assert_eq!(r.json()["ok"], true);
    outputs.push(r);
    manifest
}

/// Trains from the store's layout, staged into `dir`, twice: the second
/// run finds the staged layout whole, trains the same and exports the
/// model, whose folder it returns. The runs go to `outputs`.
fn train_twice(s3: &S3, manifest: &str, dir: &Path, outputs: &mut Vec<Run>) -> PathBuf {
    let env = s3.env();
    let stage = dir.join("stage");
    let train = |extra: &[&str]| {
        let mut args = vec![
            "--manifest",
            manifest,
            "--local-dir",
            stage.to_str().unwrap(),
            "--epochs",
            "6",
            "--hidden",
            "64",
            "--lr",
            "0.01",
        ];
        args.extend_from_slice(extra);
        run_env("trainer", &args, &env)
    };
    let r = train(&[]);
    assert!(r.status.success(), "trainer: {}", r.stderr);
    let acc = r.json()["summary"]["test_acc_at_best_valid"]
        .as_f64()
        .unwrap();
    assert!(acc > 0.4, "four classes, test accuracy {acc}");
    // A second run finds the staged layout whole and trains the same; it
    // exports the model, for inference.
    let export = dir.join("export");
    let again = train(&["--export", export.to_str().unwrap()]);
    assert!(again.status.success(), "trainer again: {}", again.stderr);
    assert_eq!(
        again.json()["summary"]["epochs"][0]["loss"],
        r.json()["summary"]["epochs"][0]["loss"]
    );
    outputs.extend([r, again]);
    export
}

/// Inference with the dataset and the result in the store: the dataset is
/// staged into the work directory (once), and the result equals the one
/// from the local dataset. The runs go to `outputs`.
fn infer_through_the_store(
    s3: &S3,
    ds: &Path,
    prefix: &str,
    export: &Path,
    dir: &Path,
    outputs: &mut Vec<Run>,
) {
    let env = s3.env();
    let remote_ds = s3.store(&format!("{prefix}/dataset"));
    for entry in walk(ds) {
        let rel = entry.strip_prefix(ds).unwrap().to_str().unwrap();
        remote_ds.put(rel, std::fs::read(&entry).unwrap()).unwrap();
    }
    let work = dir.join("infer-work");
    let infer = |dataset: &str, out: &str| {
        run_env(
            "trainer",
            &[
                "infer",
                "--model",
                export.to_str().unwrap(),
                "--dataset",
                dataset,
                "--out",
                out,
                "--work-dir",
                work.to_str().unwrap(),
                "--outputs",
                "logits",
                "--overwrite",
            ],
            &env,
        )
    };
    let remote_out = s3.url(&format!("{prefix}/preds"));
    let remote = infer(&s3.url(&format!("{prefix}/dataset")), &remote_out);
    assert!(remote.status.success(), "infer: {}", remote.stderr);
    assert!(work.join("dataset/data/feat.npy").exists());
    let local = infer(ds.to_str().unwrap(), dir.join("preds").to_str().unwrap());
    assert!(local.status.success(), "infer: {}", local.stderr);
    let figures = |r: &offgnn_e2e::Run| {
        let s = &r.json()["summary"];
        (s["nodes_written"].clone(), s["dataset_fingerprint"].clone())
    };
    assert_eq!(figures(&remote), figures(&local));
    // The parts that went up to S3 (through the store's multipart writer)
    // hold the bytes of those written to the local directory.
    let parts = |store: offgnn_shared::store::Store| -> Vec<bytes::Bytes> {
        let commit: serde_json::Value =
            serde_json::from_slice(&store.get("_SUCCESS.json").unwrap()).unwrap();
        let files = commit["files"].as_array().unwrap();
        assert!(!files.is_empty());
        files
            .iter()
            .map(|f| store.get(f.as_str().unwrap()).unwrap())
            .collect()
    };
    let local_out = offgnn_shared::store::Store::open(dir.join("preds").to_str().unwrap());
    assert!(parts(s3.store(&format!("{prefix}/preds"))) == parts(local_out.unwrap()));
    // Staged whole once: the next run downloads nothing again.
    let again = infer(&s3.url(&format!("{prefix}/dataset")), &remote_out);
    assert!(again.status.success(), "infer again: {}", again.stderr);
    outputs.extend([remote, again]);
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// A typed layout packed into the store trains from it, staged into
/// `--local-dir` (every type's objects and the topology tables, then the
/// manifest), as the same samples packed locally train.
#[test]
fn a_typed_layout_trains_from_the_store() {
    let Some(s3) = S3::from_env() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let local = offgnn_e2e::typed_pack(dir.path());
    let env = s3.env();
    let remote = s3.url(&format!("e2e-typed-{}/pack", std::process::id()));
    let samples = dir.path().join("samples");
    let mut args = vec!["--samples", samples.to_str().unwrap(), "--out", &remote];
    args.extend(offgnn_e2e::TYPED_PACK_FLAGS);
    let r = run_env("packer", &args, &env);
    assert!(r.status.success(), "packer: {}", r.stderr);
    let stage = dir.path().join("stage");
    let train = |manifest: &str, extra: &[&str]| {
        let mut args = vec!["--manifest", manifest, "--model", "sage", "--epochs", "2"];
        args.extend_from_slice(extra);
        let r = run_env("trainer", &args, &env);
        assert!(r.status.success(), "trainer: {}", r.stderr);
        r.json()["summary"]["epochs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["loss"].as_f64().unwrap())
            .collect::<Vec<f64>>()
    };
    let staged = train(&remote, &["--local-dir", stage.to_str().unwrap()]);
    assert!(stage.join("manifest.json").is_file());
    let here = train(local.to_str().unwrap(), &[]);
    assert_eq!(staged.len(), 2);
    for (a, b) in staged.iter().zip(&here) {
        assert!((a - b).abs() <= 1e-5 * b.abs(), "{staged:?} {here:?}");
    }
    // Without --local-dir a remote layout is refused in one line.
    let r = run_env("trainer", &["--manifest", &remote], &env);
    assert!(!r.status.success());
    assert!(r.stderr.contains("--local-dir"), "{}", r.stderr);
}
