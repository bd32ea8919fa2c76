//! A typed graph through the programs as a user runs them: generated with
//! IGBH's schema at mixed widths, sampled, packed without naming its
//! feature files (the dataset names them), verified and inspected, then
//! trained with R-SAGE and R-GAT once the type without features has
//! derived ones.

use std::path::Path;

use offgnn_e2e::{assert_one_line, run, workspace};

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
    // R-SAGE reads every type's rows: the institutes have none yet.
    assert_one_line(
        &run("trainer", &["--manifest", &manifest]),
        "'institute' has no features",
    );

    // Derived from their authors' rows, they train.
    let (derived, samples2, pack2) = (path("derived"), path("samples2"), path("pack2"));
    let r = run(
        "sampler",
        &[
            "derive-features",
            "--dataset",
            &ds,
            "--out",
            &derived,
            "--derive",
            "author:affiliated_to:institute",
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);
    let r = run(
        "sampler",
        &[
            "--dataset",
            &derived,
            "--fanout",
            "5,3",
            "--batch-size",
            "128",
            "--epochs",
            "2",
            "--out",
            &samples2,
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);
    let r = run(
        "packer",
        &[
            "--samples",
            &samples2,
            "--out",
            &pack2,
            "--gpu-cache",
            "8K",
            "--cpu-cache",
            "16K",
            "--disk-budget",
            "10x",
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);
    let mut losses = Vec::new();
    // R-SAGE, R-SAGE with PyG's root weight (whose inference is checked
    // once, the kills and float16 being the same code), and R-GAT.
    for (name, model, root) in [
        ("sage", "sage", false),
        ("sage-root", "sage", true),
        ("gat", "gat", false),
    ] {
        let export = path(&format!("export-{name}"));
        let dump = path(&format!("dump-{name}.safetensors"));
        let mut args = vec![
            "--manifest",
            &pack2,
            "--model",
            model,
            "--epochs",
            "4",
            "--hidden",
            "32",
            "--export",
            &export,
            "--dump-batches",
            &dump,
            "--dump-count",
            "2",
        ];
        if root {
            args.push("--root-weight");
        }
        let r = run("trainer", &args);
        assert!(r.status.success(), "{name}: {}", r.stderr);
        let s = &r.json()["summary"];
        assert_eq!(r.json()["typed"], true);
        assert_eq!(s["root_weight"], root, "{name}");
        let epochs = s["epochs"].as_array().unwrap();
        assert_eq!(epochs.len(), 4);
        let loss = |e: &serde_json::Value| e["loss"].as_f64().unwrap();
        assert!(loss(&epochs[3]) < loss(&epochs[0]), "{name}: {}", r.stdout);
        assert!(epochs.iter().all(|e| e["disk_bytes"].as_u64().unwrap() > 0));
        assert!(s["test_accuracy_at_best"].as_f64().unwrap() > 0.0);
        losses = epochs.iter().map(loss).collect::<Vec<f64>>();
        // The export loads into PyG's HeteroConv model its card describes,
        // with strict=True.
        let python = workspace().join(".venv/bin/python");
        assert!(
            python.exists(),
            "{} is missing: run scripts/setup",
            python.display()
        );
        let out = std::process::Command::new(&python)
            .arg(workspace().join("python/hetero_parity.py"))
            .args(["--export", &export])
            .output()
            .expect("python starts");
        assert!(
            out.status.success(),
            "{name}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // The dumped batches' logits are PyG's on the same blocks.
        let out = std::process::Command::new(&python)
            .arg(workspace().join("python/hetero_parity.py"))
            .args(["--dump", &export, &dump])
            .output()
            .expect("python starts");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && said.contains("\"batches\": 2"),
            "{name}: {said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let card: serde_json::Value =
            serde_json::from_slice(&std::fs::read(Path::new(&export).join("model.json")).unwrap())
                .unwrap();
        assert_eq!(card["root_weight"], root, "{card}");
        typed_inference(&export, &derived, &path(&format!("inf-{name}")), !root);
    }
    // R-GAT on the layout for `epochs` epochs, with `extra` flags.
    let gat = |epochs: &str, extra: &[&str]| {
        let mut args = vec![
            "--manifest",
            &pack2,
            "--model",
            "gat",
            "--epochs",
            epochs,
            "--hidden",
            "32",
        ];
        args.extend_from_slice(extra);
        args.iter().map(|s| s.to_string()).collect::<Vec<String>>()
    };
    // The loader thread reads ahead; the results are the same without it
    // (within float rounding).
    let r = run("trainer", &strs(&gat("4", &["--pipeline", "off"])));
    assert!(r.status.success(), "{}", r.stderr);
    let sequential = losses_of(&r);
    // libtorch's CPU kernels may sum in another order from run to run.
    let same = |a: &[f64], b: &[f64]| {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(x, y)| (x - y).abs() <= 1e-5 * y.abs())
    };
    assert!(same(&sequential, &losses), "{sequential:?} {losses:?}");
    // A CPU cache that follows the batch order (Belady) gives every batch
    // the same rows as the static one: the same losses.
    let belady = path("pack-belady");
    let r = run(
        "packer",
        &[
            "--samples",
            &samples2,
            "--out",
            &belady,
            "--gpu-cache",
            "8K",
            "--cpu-cache",
            "16K",
            "--disk-budget",
            "10x",
            "--cpu-cache-policy",
            "belady",
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);
    let r = run(
        "trainer",
        &[
            "--manifest",
            &belady,
            "--model",
            "gat",
            "--epochs",
            "4",
            "--hidden",
            "32",
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);
    let followed = losses_of(&r);
    assert!(same(&followed, &losses), "{followed:?} {losses:?}");
    // Ranks each read a share of the batches: a cache that follows the
    // whole order is refused for them.
    assert_one_line(
        &run("trainer", &["--manifest", &belady, "--emulate-ranks", "2"]),
        "follows the sampled batch order",
    );
    // The baselines read each type's rows from its feature file (one
    // aligned read per row, or all of them in memory): the same rows, the
    // same losses.
    for features in ["naive", "memory"] {
        let r = run("trainer", &strs(&gat("4", &["--features", features])));
        assert!(r.status.success(), "{features}: {}", r.stderr);
        assert_eq!(r.json()["summary"]["features"], features);
        let baseline = losses_of(&r);
        assert!(
            same(&baseline, &losses),
            "{features}: {baseline:?} {losses:?}"
        );
    }
    // The run's memory is stated before training (from the largest batch
    // the packer recorded) and holds: too small a --memory is refused in
    // one line; the peak RSS stays within the statement.
    let stated_run =
        |memory: &str| offgnn_e2e::run_peak("trainer", &strs(&gat("2", &["--memory", memory])));
    let (r, _) = stated_run("100M");
    assert_one_line(&r, "--memory 100.00 MiB");
    let (r, peak) = stated_run("1300M");
    assert!(r.status.success(), "{}", r.stderr);
    let stated = r.json()["memory"]["total_bytes"].as_u64().unwrap();
    eprintln!("typed R-GAT: peak RSS {peak} bytes, stated {stated}");
    assert!(peak <= stated, "peak {peak} bytes over the stated {stated}");
    // A run stopped after 2 epochs and resumed to 4 ends as one never
    // stopped (within float rounding), each epoch checkpointed.
    let train = |ck: &str, epochs: &str, extra: &[&str]| {
        let mut args = vec![
            "--manifest",
            &pack2,
            "--model",
            "gat",
            "--hidden",
            "32",
            "--checkpoint-dir",
            ck,
            "--epochs",
            epochs,
        ];
        args.extend(extra);
        let r = run("trainer", &args);
        assert!(r.status.success(), "{}", r.stderr);
        losses_of(&r)
    };
    let (whole, stopped) = (path("ck-whole"), path("ck-stopped"));
    let from_run = path("export-from-run");
    let straight = train(&whole, "4", &["--export", &from_run]);
    assert_eq!(train(&stopped, "2", &[]).len(), 2);
    let resumed = train(&stopped, "4", &["--resume"]);
    assert!(same(&resumed, &straight), "{resumed:?} {straight:?}");
    // `trainer export` writes the checkpoint's best epoch as the run's own
    // export did: the same weights, from the layout the checkpoint records
    // (its types and relations name the parameters) or the one named.
    let from_checkpoint = path("export-from-checkpoint");
    let export = |ck: &str, extra: &[&str]| {
        let mut args = vec!["export", "--checkpoint-dir", ck, "--out", &from_checkpoint];
        args.extend(extra);
        run("trainer", &args)
    };
    let card = |dir: &str| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(format!("{dir}/model.json")).unwrap()).unwrap()
    };
    for extra in [&[][..], &["--manifest", &pack2, "--overwrite"]] {
        let r = export(&whole, extra);
        assert!(r.status.success(), "{extra:?}: {}", r.stderr);
        assert_eq!(
            card(&from_checkpoint)["weights_sha256"],
            card(&from_run)["weights_sha256"]
        );
        assert_eq!(card(&from_checkpoint)["epoch"], card(&from_run)["epoch"]);
    }
    // A layout moved since: refused in one line, unless --manifest names it.
    let moved = path("ck-moved");
    std::fs::create_dir(&moved).unwrap();
    for entry in std::fs::read_dir(&whole).unwrap() {
        let from = entry.unwrap().path();
        std::fs::copy(&from, Path::new(&moved).join(from.file_name().unwrap())).unwrap();
    }
    let meta = Path::new(&moved).join("checkpoint.json");
    let mut m: serde_json::Value = serde_json::from_slice(&std::fs::read(&meta).unwrap()).unwrap();
    assert!(
        m["layout"].as_str().unwrap().ends_with("manifest.json"),
        "{m}"
    );
    m["layout"] = path("gone/manifest.json").into();
    std::fs::write(&meta, serde_json::to_vec(&m).unwrap()).unwrap();
    assert_one_line(&export(&moved, &["--overwrite"]), "cannot be read");
    let r = export(&moved, &["--manifest", &pack2, "--overwrite"]);
    assert!(r.status.success(), "{}", r.stderr);
    let shown = run("trainer", &["show-model", "--model", &from_checkpoint]);
    assert!(shown.status.success(), "{}", shown.stderr);
    assert_eq!(shown.json()["export"]["card"]["architecture"], "rgat");
    assert_one_line(
        &run(
            "trainer",
            &["--manifest", &pack2, "--checkpoint-dir", &whole],
        ),
        "holds a checkpoint",
    );
    assert_one_line(
        &run(
            "trainer",
            &[
                "--manifest",
                &pack2,
                "--model",
                "sage",
                "--checkpoint-dir",
                &whole,
                "--resume",
            ],
        ),
        "taken with another model",
    );
    assert_one_line(
        &run("trainer", &["--manifest", &pack2, "--model", "mlp"]),
        "--model mlp",
    );
    assert_one_line(
        &run(
            "trainer",
            &["--manifest", &pack2, "--model", "gat", "--root-weight"],
        ),
        "R-GAT's attention has none",
    );
    // A flipped bit in a topology table is refused before training, as
    // one in any other object of the layout is.
    let manifest2: serde_json::Value =
        serde_json::from_slice(&std::fs::read(format!("{pack2}/manifest.json")).unwrap()).unwrap();
    let table = Path::new(&pack2).join(
        manifest2["topology"]["tables"][0]["object"]
            .as_str()
            .unwrap(),
    );
    let mut bytes = std::fs::read(&table).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(&table, &bytes).unwrap();
    assert_one_line(
        &run("trainer", &["--manifest", &pack2, "--epochs", "1"]),
        "checksum mismatch",
    );
}

/// Each epoch's training loss, from a trainer run's JSON summary.
fn losses_of(r: &offgnn_e2e::Run) -> Vec<f64> {
    r.json()["summary"]["epochs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["loss"].as_f64().unwrap())
        .collect()
}

/// `--checkpoint-every`: a run killed inside an epoch (the test hook stands
/// in for the kill, just after a checkpoint due there) resumes from the
/// steps it had done and ends as one never stopped; also where the CPU
/// caches follow the batch order (Belady), which the resumed run rebuilds.
#[test]
fn a_typed_run_resumes_inside_an_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let pack = offgnn_e2e::typed_pack(dir.path());
    resumes_inside_an_epoch(&pack, &dir.path().join("ck"), false);
    let belady = dir.path().join("pack-belady");
    let mut flags = offgnn_e2e::TYPED_PACK_FLAGS;
    *flags.last_mut().unwrap() = "belady";
    let samples = dir.path().join("samples");
    let mut args = vec![
        "--samples",
        samples.to_str().unwrap(),
        "--out",
        belady.to_str().unwrap(),
    ];
    args.extend(flags);
    let r = run("packer", &args);
    assert!(r.status.success(), "{}", r.stderr);
    resumes_inside_an_epoch(&belady, &dir.path().join("ck-belady"), true);
}

/// Trains `pack` for two epochs straight, then killed after the second
/// step with a checkpoint every step in `ck`, then resumed: the same
/// losses; the resumed run says it rebuilt the CPU caches where `rebuilds`.
fn resumes_inside_an_epoch(pack: &Path, ck: &Path, rebuilds: bool) {
    let (pack, ck_dir) = (pack.to_str().unwrap(), ck.to_str().unwrap());
    let common = [
        "--manifest",
        pack,
        "--model",
        "sage",
        "--epochs",
        "2",
        "--hidden",
        "32",
    ];
    let r = run("trainer", &common);
    assert!(r.status.success(), "{}", r.stderr);
    let straight = losses_of(&r);
    let metrics = ck.with_extension("metrics.jsonl");
    let with_checkpoints = [
        &common[..],
        &["--checkpoint-dir", ck_dir, "--checkpoint-every", "1"],
        &["--metrics", metrics.to_str().unwrap()],
    ]
    .concat();
    // Killed after the second step of the first epoch (of three).
    let r = offgnn_e2e::run_with_env(
        "trainer",
        &with_checkpoints,
        &[("OFFGNN_TEST_INTERRUPT_AFTER", "2")],
    );
    assert!(!r.status.success());
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ck.join("checkpoint.json")).unwrap()).unwrap();
    assert_eq!(meta["epoch"], 0);
    assert_eq!(meta["in_epoch"]["steps"], 2);
    // Before its first epoch ends, there is nothing to export.
    let out = ck.with_extension("export");
    for last in [&[][..], &["--last"]] {
        let export = [
            &["export", "--checkpoint-dir", ck_dir][..],
            &["--out", out.to_str().unwrap()],
            last,
        ];
        assert_one_line(&run("trainer", &export.concat()), "nothing to export yet");
    }
    let resumed = [&with_checkpoints[..], &["--resume"]].concat();
    // Another world or batch cap is another run: refused, not resumed
    // (a layout whose CPU caches follow the batch order refuses ranks
    // anyway).
    let others: [(&[&str], &str); 2] = [
        (
            &["--emulate-ranks", "2"],
            "a run of 1 rank(s), and this run has 2",
        ),
        (&["--max-batches", "1"], "every batch (now --max-batches 1)"),
    ];
    for (other, says) in others.iter().filter(|_| !rebuilds) {
        let r = run("trainer", &[&resumed[..], other].concat());
        offgnn_e2e::assert_one_line(&r, says);
    }
    let r = offgnn_e2e::run_with_env("trainer", &resumed, &[("RUST_LOG", "info")]);
    assert!(r.status.success(), "{}", r.stderr);
    let after = losses_of(&r);
    // The resumed run appends to the metrics file it started.
    let epochs: Vec<u64> = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["epoch"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(epochs, [0, 1]);
    let same = straight.len() == after.len()
        && straight
            .iter()
            .zip(&after)
            .all(|(x, y)| (x - y).abs() <= 1e-5 * y.abs());
    assert!(same, "{straight:?} {after:?}");
    assert_eq!(
        r.stderr.contains("rebuilt the CPU caches"),
        rebuilds,
        "{}",
        r.stderr
    );
}

/// Owned arguments as the runner takes them.
fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// `trainer infer` on a typed model, its groups small enough that every
/// type takes several: every type's embedding and the target type's logits
/// are PyG's `HeteroConv` model over the whole graph (python/hetero_parity.py
/// --infer), also for a run killed inside its second layer and resumed; a
/// split writes only its rows; bad flags are one line each. Without
/// `all`, only the first: the whole graph against PyG.
fn typed_inference(export: &str, dataset: &str, out: &str, all: bool) {
    let infer_env = |out: &str, extra: &[&str], env: &[(&str, &str)]| {
        let mut args = vec![
            "infer",
            "--model",
            export,
            "--dataset",
            dataset,
            "--out",
            out,
        ];
        args.extend_from_slice(extra);
        offgnn_e2e::run_with_env("trainer", &args, env)
    };
    let infer = |out: &str, extra: &[&str]| infer_env(out, extra, &[]);
    // Too little --memory for libtorch's runtime, the model and a group of
    // one node is refused, naming the least that works; a MiB over it
    // makes groups of a few nodes.
    let r = infer(out, &["--memory", "700M"]);
    assert_one_line(&r, "--memory 700.00 MiB is too little");
    // Refused, it leaves neither its output nor its work directory.
    assert!(!Path::new(out).exists() && !Path::new(&format!("{out}.work")).exists());
    let least: f64 = r
        .stderr
        .rsplit("at least about ")
        .next()
        .and_then(|t| t.trim().strip_suffix(" MiB"))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no least memory in {}", r.stderr));
    let memory = format!("{:.2}M", least + 1.0);
    let whole = ["--outputs", "logits,embeddings", "--memory", &memory];
    let r = infer(out, &whole);
    assert!(r.status.success(), "{}", r.stderr);
    let hidden_bytes = |r: &offgnn_e2e::Run| {
        r.json()["summary"]["layers"][0]["bytes_written"]
            .as_u64()
            .unwrap()
    };
    let float32_bytes = hidden_bytes(&r);
    let types = r.json()["summary"]["node_types"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(types.len(), 4);
    for t in &types {
        assert_eq!(t["nodes_written"], t["nodes"], "{t}");
    }
    assert!(types[0]["groups"].as_u64().unwrap() > 1, "{}", types[0]);
    let groups: u64 = types.iter().map(|t| t["groups"].as_u64().unwrap()).sum();
    let python = workspace().join(".venv/bin/python");
    let parity = |out: &str, tolerance: &str| {
        let parity = std::process::Command::new(&python)
            .arg(workspace().join("python/hetero_parity.py"))
            .args(["--infer", export, dataset, out, "--tolerance", tolerance])
            .output()
            .expect("python starts");
        let said = String::from_utf8_lossy(&parity.stdout).into_owned();
        assert!(
            parity.status.success(),
            "{out}: {said}{}",
            String::from_utf8_lossy(&parity.stderr)
        );
        said
    };
    eprintln!("typed inference against PyG: {}", parity(out, "1e-4"));
    if !all {
        return;
    }

    // Killed after the first group of the first layer (whose rows go to
    // the work directory), then again inside the second layer (past its
    // first type's groups), then the same command once more: it resumes
    // each time and commits the same result.
    let resumed = format!("{out}-resumed");
    let first_type = types[0]["groups"].as_u64().unwrap();
    for kill_at in [1, groups - 1 + first_type + 1] {
        let r = infer_env(
            &resumed,
            &whole,
            &[("OFFGNN_TEST_INTERRUPT_AFTER_GROUPS", &kill_at.to_string())],
        );
        assert!(
            !r.status.success() && r.stderr.contains("interrupted"),
            "{}",
            r.stderr
        );
        assert!(!Path::new(&resumed).join("_SUCCESS.json").exists());
    }
    let r = infer(&resumed, &whole);
    assert!(r.status.success(), "{}", r.stderr);
    let layers = r.json()["summary"]["layers"].as_array().unwrap().clone();
    let resumed_groups: Vec<u64> = layers
        .iter()
        .map(|l| l["groups_resumed"].as_u64().unwrap())
        .collect();
    assert_eq!(resumed_groups[0], groups, "{layers:?}");
    assert_eq!(resumed_groups[1], first_type + 1, "{layers:?}");
    parity(&resumed, "1e-4");

    // Hidden layers stored as float16: half the bytes in the work
    // directory, the result within float16's rounding of PyG's.
    let half = format!("{out}-f16");
    let r = infer(&half, &[&whole[..], &["--hidden-dtype", "f16"]].concat());
    assert!(r.status.success(), "{}", r.stderr);
    assert_eq!(hidden_bytes(&r) * 2, float32_bytes);
    let said: serde_json::Value = serde_json::from_str(&parity(&half, "1e-2")).unwrap();
    let diff = said["max_abs_diff"].as_f64().unwrap();
    assert!(diff > 0.0, "float16 hidden rows changed nothing: {said}");

    let valid = format!("{out}-valid");
    let r = infer(&valid, &["--nodes", "valid"]);
    assert!(r.status.success(), "{}", r.stderr);
    let written: Vec<u64> = r.json()["summary"]["node_types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["nodes_written"].as_u64().unwrap())
        .collect();
    assert!(written[0] > 0 && written[0] < types[0]["nodes"].as_u64().unwrap());
    assert_eq!(&written[1..], &[0, 0, 0]);

    assert_one_line(&infer(out, &[]), "holds a committed inference result");
    assert_one_line(
        &infer(&format!("{out}-ids"), &["--nodes", "ids.npy"]),
        "names homogeneous node ids",
    );
    assert_one_line(
        &infer(&format!("{out}-dup"), &["--keep-duplicate-edges"]),
        "kept each edge once",
    );
    assert_one_line(
        &infer(&format!("{out}-host"), &["--aggregate", "host"]),
        "--aggregate host is for homogeneous models",
    );
    // A type's feature file swapped for another of its shape (its rows'
    // values in reverse order) is refused: the topology and labels match,
    // the features are not those the model was trained on.
    let swapped = format!("{out}-swapped-dataset");
    let status = std::process::Command::new("cp")
        .args(["-r", dataset, &swapped])
        .status()
        .unwrap();
    assert!(status.success());
    let mut files: Vec<_> = std::fs::read_dir(Path::new(&swapped).join("data"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with("-feat.npy"))
        .collect();
    files.sort();
    let file = &files[0];
    let mut bytes = std::fs::read(file).unwrap();
    let start = 10 + u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let values: Vec<[u8; 4]> = bytes[start..]
        .chunks_exact(4)
        .rev()
        .map(|c| c.try_into().unwrap())
        .collect();
    bytes.truncate(start);
    bytes.extend(values.concat());
    std::fs::write(file, bytes).unwrap();
    let r = run(
        "trainer",
        &[
            "infer",
            "--model",
            export,
            "--dataset",
            &swapped,
            "--out",
            &format!("{out}-swapped"),
        ],
    );
    assert_one_line(&r, "is not the feature file");
}

/// A typed sampling run states its memory type by type (each type's nodes
/// and each relation's fan-out, not the busiest type's fan-out for every
/// node): on a 100k-paper graph of IGBH's schema at fan-out 15,10,5 the
/// statement is under 1.5 GiB (the busiest type's bound stated 3.5 GB),
/// too small a --memory is refused in one line, and the run's peak RSS
/// stays within the statement.
#[test]
fn a_typed_sampling_run_states_its_memory_type_by_type() {
    let dir = tempfile::tempdir().unwrap();
    let flags = [
        "--schema",
        "igbh",
        "--nodes",
        "100000",
        "--feature-dim",
        "4",
    ];
    let ds = offgnn_e2e::generate(dir.path(), &flags);
    let ds = ds.to_str().unwrap();
    let sample = |out: &str, memory: &str| {
        let out = dir.path().join(out).to_str().unwrap().to_string();
        offgnn_e2e::run_peak(
            "sampler",
            &[
                "--dataset",
                ds,
                "--out",
                &out,
                "--fanout",
                "15,10,5",
                "--batch-size",
                "1024",
                "--threads",
                "2",
                "--memory",
                memory,
            ],
        )
    };
    let (r, _) = sample("small", "128M");
    assert_one_line(&r, "--memory 128.00 MiB");
    let (r, peak) = sample("s", "1536M");
    assert!(r.status.success(), "{}", r.stderr);
    let stated = r.json()["memory"]["total_bytes"].as_u64().unwrap();
    eprintln!("typed sampler on 100k papers: peak RSS {peak} bytes, stated {stated}");
    assert!(
        peak <= stated,
        "peak RSS {peak} bytes over the stated {stated}"
    );
}
