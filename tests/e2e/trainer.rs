//! The trainer as a user runs it: training on a packed layout (DiskGNN §5.3)
//! with metrics and checkpoints, its memory statement, a layout staged over
//! HTTP, the three programs over WebDAV, and what it refuses (bad flags, a
//! checkpoint of another run, a diverged run, a future manifest, damaged
//! segments).

use offgnn_e2e::{cora_pack, run};

#[test]
fn cora_trains_through_the_binary_and_refuses_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = cora_pack(dir.path());
    let m = manifest.to_str().unwrap();
    let metrics = dir.path().join("metrics.jsonl");
    let ckpt = dir.path().join("ckpt");
    let train = |extra: &[&str]| {
        let mut args = vec!["--manifest", m, "--epochs", "3", "--hidden", "64"];
        args.extend_from_slice(extra);
        run("trainer", &args)
    };
    let r = train(&[
        "--metrics",
        metrics.to_str().unwrap(),
        "--checkpoint-dir",
        ckpt.to_str().unwrap(),
    ]);
    assert!(r.status.success(), "{}", r.stderr);
    let s = &r.json()["summary"];
    assert_eq!(s["epochs"].as_array().unwrap().len(), 3);
    // Seven classes; chance is below 0.3.
    let acc = s["test_acc_at_best_valid"].as_f64().unwrap();
    assert!(acc > 0.6, "Cora test accuracy {acc}");
    let lines = std::fs::read_to_string(&metrics).unwrap();
    let rows: Vec<serde_json::Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3);
    for key in [
        "wall_seconds",
        "stage_busy",
        "disk_bytes",
        "read_amplification",
        "hit_gpu",
        "hit_cpu",
        "hit_disk",
        "loss",
        "train_acc",
        "valid_acc",
        "test_acc",
    ] {
        assert!(rows[2].get(key).is_some(), "metrics lack {key}");
    }

    // Bad input: one line, a failing exit.
    let one_line = offgnn_e2e::assert_one_line;
    // cuda where libtorch sees no GPU (this suite runs on CPU machines).
    one_line(&train(&["--device", "cuda"]), "no CUDA device");
    // A checkpoint of another model.
    one_line(
        &train(&[
            "--model",
            "gat",
            "--resume",
            "--checkpoint-dir",
            ckpt.to_str().unwrap(),
        ]),
        "another model: --model sage (now gat)",
    );
    // An earlier run's checkpoint or metrics are not replaced unless asked.
    let (c, mf) = (ckpt.to_str().unwrap(), metrics.to_str().unwrap());
    one_line(
        &train(&["--checkpoint-dir", c]),
        "holds a checkpoint of an earlier run",
    );
    one_line(&train(&["--metrics", mf]), "the metrics file exists");
    // A resume must keep the settings that fix the results.
    one_line(
        &train(&["--checkpoint-dir", c, "--resume", "--lr", "0.01"]),
        "a resume continues the same run",
    );
    // A diverged run stops with a failing exit and keeps its last checkpoint.
    let diverged = dir.path().join("ckpt-diverged");
    let r = train(&[
        "--lr",
        "1e30",
        "--checkpoint-dir",
        diverged.to_str().unwrap(),
        "--checkpoint-every",
        "1",
    ]);
    one_line(&r, "training diverged and stopped");
    assert!(r.stderr.contains("is kept"), "{}", r.stderr);
    assert!(
        r.stdout.is_empty(),
        "a diverged run reports no figures: {}",
        r.stdout
    );
    assert!(diverged.join("checkpoint.json").exists());

    // A manifest of a future format version.
    let text = std::fs::read_to_string(&manifest).unwrap();
    let future = dir.path().join("pack/future.json");
    std::fs::write(
        &future,
        text.replacen("\"format_version\": 3", "\"format_version\": 7", 1),
    )
    .unwrap();
    one_line(
        &run("trainer", &["--manifest", future.to_str().unwrap()]),
        "newer than this build",
    );
    // A flipped bit in a segment, then a missing one.
    let seg = dir.path().join("pack").join(offgnn_e2e::first_segment(
        &dir.path().join("pack/manifest.json"),
    ));
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[4096] ^= 0x01;
    std::fs::write(&seg, &bytes).unwrap();
    one_line(&train(&[]), "checksum mismatch");
    std::fs::remove_file(&seg).unwrap();
    one_line(&train(&[]), "missing object");
}

#[test]
fn trainer_states_its_memory_and_holds_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = cora_pack(dir.path());
    let m = manifest.to_str().unwrap();
    let train = |memory: &str| {
        offgnn_e2e::run_peak(
            "trainer",
            &[
                "--manifest",
                m,
                "--epochs",
                "2",
                "--hidden",
                "64",
                "--loaders",
                "1",
                "--queue-depth",
                "1",
                "--memory",
                memory,
            ],
        )
    };
    // Too small a budget is refused before training, in one line.
    let (r, _) = train("100M");
    assert!(!r.status.success());
    assert!(r.stderr.contains("--memory 100.00 MiB"), "{}", r.stderr);
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);

    let (r, peak) = train("1300M");
    assert!(r.status.success(), "{}", r.stderr);
    let stated = r.json()["memory"]["total_bytes"].as_u64().unwrap();
    assert!(stated <= 1300 << 20);
    eprintln!("trainer on Cora: peak RSS {peak} bytes, stated {stated}");
    assert!(
        peak <= stated,
        "peak RSS {peak} bytes over the stated {stated}"
    );
}

/// A layout served over plain HTTP (an object host with byte ranges, here
/// tests/support/http_range_server.py) stages and trains: `http://`
/// locations are enabled, not refused with "feature for Http not enabled".
#[test]
fn a_layout_served_over_http_stages_and_trains() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = cora_pack(dir.path());
    assert!(manifest.starts_with(dir.path()));
    let (mut server, port) = offgnn_e2e::http_server(dir.path());
    let url = format!("http://127.0.0.1:{port}/pack/manifest.json");
    let stage = dir.path().join("stage");
    let r = run("trainer", &staged_quick_run(&url, &stage));
    let _ = server.kill();
    let _ = server.wait();
    assert!(r.status.success(), "{}", r.stderr);
    assert!(stage.join("manifest.json").exists());
    assert_eq!(r.json()["summary"]["epochs"].as_array().unwrap().len(), 1);
}

/// A WebDAV server as the store between the programs (`http://`
/// locations, written with PUT and MKCOL and listed with PROPFIND): the
/// sampler commits its run there, the packer reads it and commits the
/// layout there, `packer verify` checks it, and the trainer stages it and
/// writes its export there.
#[test]
fn a_webdav_server_carries_samples_layout_and_export() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dir.path().join("cora");
    offgnn_e2e::import_cora(&ds, &[]);
    let root = dir.path().join("dav");
    std::fs::create_dir(&root).unwrap();
    let (mut server, port) = offgnn_e2e::webdav_server(&root);
    let url = |rel: &str| format!("http://127.0.0.1:{port}/{rel}");
    let (samples, pack, manifest) = (url("samples"), url("pack"), url("pack/manifest.json"));
    let feat = ds.join("data/feat.npy");
    let (stage, model) = (dir.path().join("stage"), url("model"));
    let ds = ds.to_str().unwrap();
    let runs = [
        run(
            "sampler",
            &["--dataset", ds, "--out", &samples, "--batch-size", "256"],
        ),
        run(
            "packer",
            &offgnn_e2e::cora_pack_args(&samples, feat.to_str().unwrap(), &pack),
        ),
        run("packer", &["verify", "--manifest", &manifest]),
        run(
            "trainer",
            &[
                &staged_quick_run(&manifest, &stage)[..],
                &["--export", &model],
            ]
            .concat(),
        ),
    ];
    let _ = server.kill();
    let _ = server.wait();
    for r in &runs {
        assert!(r.status.success(), "{}", r.stderr);
    }
    assert_eq!(runs[2].json()["ok"], true);
    assert_eq!(
        runs[3].json()["summary"]["epochs"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    // What the server holds: each program's commit.
    for committed in ["samples/run.json", "pack/manifest.json", "model/model.json"] {
        assert!(root.join(committed).is_file(), "{committed}");
    }
}

/// A trainer's arguments for one epoch of two batches of the layout at
/// `manifest`, staged into `stage`.
fn staged_quick_run<'a>(manifest: &'a str, stage: &'a std::path::Path) -> Vec<&'a str> {
    vec![
        "--manifest",
        manifest,
        "--local-dir",
        stage.to_str().unwrap(),
        "--epochs",
        "1",
        "--max-batches",
        "2",
    ]
}

/// `--io-depth auto` (GIDS §3.2) and `--read-through auto`: the first run
/// measures the curve of the disk holding the layout (and its reads of one
/// page and of 16) and keeps it in the cache directory; the next run takes
/// it from there. A depth or gap that is neither is refused.
#[test]
fn io_depth_auto_measures_the_disk_once_and_keeps_its_curve() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = cora_pack(dir.path());
    let cache = dir.path().join("cache");
    let env = [
        ("XDG_CACHE_HOME", cache.to_str().unwrap()),
        ("RUST_LOG", "info"),
    ];
    let train = |flags: &[&str]| {
        let mut args = vec![
            "--manifest",
            manifest.to_str().unwrap(),
            "--epochs",
            "1",
            "--max-batches",
            "2",
            "--hidden",
            "16",
        ];
        args.extend(flags);
        offgnn_e2e::run_with_env("trainer", &args, &env)
    };
    let r = train(&["--io-depth", "auto"]);
    assert!(r.status.success(), "{}", r.stderr);
    assert!(r.stderr.contains("probing the read depth"), "{}", r.stderr);
    assert!(
        r.stderr.contains("--io-depth auto, --read-through auto: "),
        "{}",
        r.stderr
    );
    let kept: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cache.join("offgnn/io-depth.json")).unwrap())
            .unwrap();
    let disks = kept.as_object().unwrap();
    assert_eq!(disks.len(), 1, "{kept}");
    let probe = disks.values().next().unwrap();
    assert_eq!(probe["points"].as_array().unwrap().len(), 9, "{probe}");
    assert_eq!(probe["span"]["pages"], 16, "{probe}");
    // The summary states the depth and the gap taken, and the curve they
    // came from.
    let s = &r.json()["summary"];
    assert_eq!(s["io_depth_probe"]["probe"], *probe, "{s}");
    assert_eq!(s["io_depth_probe"]["cached"], false);
    let chosen = probe["chosen"].as_u64().unwrap();
    let rings = s["io_rings"].as_u64().unwrap();
    assert_eq!(
        s["io_depth"].as_u64().unwrap(),
        chosen.div_ceil(rings).max(1)
    );
    let through = s["read_through_pages"].as_u64().unwrap();
    assert!(through <= 64, "{s}");
    let r = train(&[]);
    assert!(r.status.success(), "{}", r.stderr);
    assert!(!r.stderr.contains("probing the read depth"), "{}", r.stderr);
    assert!(r.stderr.contains("(measured before)"), "{}", r.stderr);
    let s = &r.json()["summary"];
    assert_eq!(s["io_depth_probe"]["cached"], true);
    assert_eq!(s["read_through_pages"], through, "{s}");
    // A depth given keeps the curve for the gap; both given, no curve.
    let r = train(&["--io-depth", "3"]);
    assert!(r.status.success(), "{}", r.stderr);
    let s = &r.json()["summary"];
    assert_eq!(
        (&s["io_depth"], &s["read_through_pages"]),
        (&3.into(), &through.into())
    );
    assert_eq!(s["io_depth_probe"]["cached"], true);
    let r = train(&["--io-depth", "3", "--read-through", "5"]);
    assert!(r.status.success(), "{}", r.stderr);
    let s = &r.json()["summary"];
    assert_eq!(
        (&s["io_depth"], &s["read_through_pages"]),
        (&3.into(), &5.into())
    );
    assert!(s["io_depth_probe"].is_null());
    for bad in ["65", "wide"] {
        let r = train(&["--read-through", bad]);
        assert!(!r.status.success());
        assert!(r.stderr.contains("--read-through"), "{}", r.stderr);
    }
    for bad in ["0", "deep"] {
        let r = train(&["--io-depth", bad]);
        assert!(!r.status.success());
        assert!(r.stderr.contains("--io-depth"), "{}", r.stderr);
    }
    // The curve kept names the file it was measured on by its whole path.
    let file = probe["file"].as_str().unwrap();
    assert!(std::path::Path::new(file).is_absolute(), "{probe}");
    // probe-disk refuses a file too small to stand for the disk.
    let tiny = dir.path().join("tiny.bin");
    std::fs::write(&tiny, vec![0u8; 1 << 20]).unwrap();
    let r = offgnn_e2e::run_with_env(
        "trainer",
        &["probe-disk", "--file", tiny.to_str().unwrap()],
        &env,
    );
    offgnn_e2e::assert_one_line(&r, "too small to measure the disk by");
}
