//! FreshGNN's historical embedding cache (issue 39, item 1): a trainer
//! option that prunes each batch below the nodes whose cached embeddings
//! stand in for their subtrees, reading and computing less.

use std::path::Path;

use offgnn_e2e::run_env;

/// A packed power-law graph, three layers sampled, whose caches hold few
/// rows: most input rows come from disk.
fn layout(dir: &Path) -> String {
    let ds = offgnn_e2e::generate(
        dir,
        &[
            "--nodes",
            "20000",
            "--feature-dim",
            "64",
            "--classes",
            "4",
            "--power-law",
            "2.1",
            "--train-fraction",
            "0.3",
            "--valid-fraction",
            "0.05",
            "--test-fraction",
            "0.1",
        ],
    );
    let samples = dir.join("samples");
    let flags = ["--fanout", "5,5,5", "--batch-size", "256", "--epochs", "2"];
    offgnn_e2e::sample(&ds, &samples, &flags);
    let flags = [
        "--gpu-cache",
        "32K",
        "--cpu-cache",
        "64K",
        "--disk-budget",
        "8x",
    ];
    let manifest = offgnn_e2e::pack(&ds, &samples, &dir.join("pack"), &flags);
    manifest.to_str().unwrap().to_string()
}

/// One thread for libtorch: identical inputs then give identical losses.
fn train(manifest: &str, extra: &[&str]) -> offgnn_e2e::Run {
    let mut args = vec![
        "--manifest",
        manifest,
        "--hidden",
        "32",
        "--seed",
        "5",
        "--epochs",
        "4",
    ];
    args.extend_from_slice(extra);
    let env = [
        ("OMP_NUM_THREADS".to_string(), "1".to_string()),
        ("RUST_LOG".to_string(), "info".to_string()),
    ];
    let r = run_env("trainer", &args, &env);
    assert!(r.status.success(), "{:?}: {}", extra, r.stderr);
    r
}

/// Each epoch's loss, accuracies and disk bytes.
fn epochs(r: &offgnn_e2e::Run) -> Vec<(f64, f64, f64, u64)> {
    r.json()["summary"]["epochs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let f = |k: &str| e[k].as_f64().unwrap();
            (
                f("loss"),
                f("valid_acc"),
                f("test_acc"),
                e["disk_bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn total_bytes(r: &offgnn_e2e::Run) -> u64 {
    epochs(r).iter().map(|e| e.3).sum()
}

#[test]
fn historical_embeddings_prune_reads_and_keep_accuracy_and_admitting_nothing_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = layout(dir.path());
    let plain = train(&manifest, &[]);
    assert!(plain.json()["summary"]["historical"].is_null());

    // Admitting nothing prunes nothing: the same rows read, the same
    // losses, bit for bit.
    let none = train(&manifest, &["--historical", "p_grad=0"]);
    assert_eq!(epochs(&none), epochs(&plain));
    let h = &none.json()["summary"]["historical"];
    assert_eq!(h["inputs"], h["inputs_kept"], "{h}");

    // Embeddings from the cache, fewer rows read, accuracy kept within a
    // few points. The run is 96 steps: entries live 10 of them, where the
    // default 200 would outlive the run and train on the first steps'
    // embeddings throughout (tried: 26 points lost).
    let cache = ["--historical", "t_stale=10"];
    let hist = train(&manifest, &cache);
    let summary = hist.json()["summary"].clone();
    let h = &summary["historical"];
    assert_eq!(
        (h["p_grad"].as_f64(), h["t_stale"].as_u64()),
        (Some(0.9), Some(10))
    );
    let cached: Vec<u64> = h["level_cached"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(cached.len(), 2, "two levels between three layers: {h}");
    assert!(cached.iter().all(|&c| c > 0), "{h}");
    assert!(
        h["inputs_kept"].as_u64().unwrap() < h["inputs"].as_u64().unwrap(),
        "{h}"
    );
    let (read, plain_read) = (total_bytes(&hist), total_bytes(&plain));
    assert!(
        read < plain_read,
        "historical read {read} bytes, plain {plain_read}"
    );
    let acc = |r: &offgnn_e2e::Run| {
        r.json()["summary"]["test_acc_at_best_valid"]
            .as_f64()
            .unwrap()
    };
    assert!(
        acc(&hist) > acc(&plain) - 0.05,
        "test accuracy {} against plain {}",
        acc(&hist),
        acc(&plain)
    );
    assert!(
        hist.stderr.contains("historical embeddings"),
        "{}",
        hist.stderr
    );

    // Lookups wait for the update `lag` steps back, however the threads
    // run: the pipeline off gives the same run.
    let seq = train(&manifest, &[&cache[..], &["--pipeline", "off"]].concat());
    assert_eq!(epochs(&seq), epochs(&hist));

    // The in-memory and naive baselines prune the same batches; naive
    // reads fewer rows too.
    let naive = train(&manifest, &[&cache[..], &["--features", "naive"]].concat());
    assert_eq!(
        epochs(&naive).iter().map(|e| e.0).collect::<Vec<_>>(),
        epochs(&hist).iter().map(|e| e.0).collect::<Vec<_>>()
    );
    let naive_plain = train(&manifest, &["--features", "naive"]);
    assert!(total_bytes(&naive) < total_bytes(&naive_plain));

    // Refused in one line: a model without levels, data-parallel runs, a
    // bad setting.
    let env = [("OMP_NUM_THREADS".to_string(), "1".to_string())];
    for (flags, says) in [
        (
            vec!["--historical", "--model", "mlp"],
            "it needs --model sage or gat",
        ),
        (
            vec!["--historical", "--emulate-ranks", "2"],
            "not built for data-parallel training",
        ),
        (vec!["--historical", "stale=3"], "unknown key \"stale\""),
    ] {
        let mut args = vec!["--manifest", manifest.as_str(), "--epochs", "1"];
        args.extend(flags);
        let r = run_env("trainer", &args, &env);
        assert!(!r.status.success(), "{args:?}");
        assert!(r.stderr.contains(says), "{args:?}: {}", r.stderr);
    }
}

/// Each typed epoch's loss and disk bytes.
fn typed_epochs(r: &offgnn_e2e::Run) -> Vec<(f64, u64)> {
    r.json()["summary"]["epochs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["loss"].as_f64().unwrap(),
                e["disk_bytes"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// On a typed layout (issue 36) the cache is the same, over homogenized
/// node ids: each type reads only the rows its pruned batch needs, and
/// each block computes only the nodes no cached embedding stands in for.
#[test]
fn typed_batches_prune_against_the_historical_cache() {
    let dir = tempfile::tempdir().unwrap();
    let pack = offgnn_e2e::typed_pack(dir.path());
    let pack = pack.to_str().unwrap();
    let sage = |extra: &[&str]| train(pack, &[&["--model", "sage"][..], extra].concat());
    let plain = sage(&[]);
    assert!(plain.json()["summary"]["historical"].is_null());
    // Each epoch states the row bytes it needed from disk beside the pages
    // it read.
    for e in plain.json()["summary"]["epochs"].as_array().unwrap() {
        let (read, rows) = (&e["disk_bytes"], &e["disk_rows_bytes"]);
        let (read, rows) = (read.as_u64().unwrap(), rows.as_u64().unwrap());
        assert!(0 < rows && rows <= read, "{e}");
    }
    // Admitting nothing prunes nothing: the same rows, the same losses.
    let none = sage(&["--historical", "p_grad=0"]);
    assert_eq!(typed_epochs(&none), typed_epochs(&plain));
    let h = &none.json()["summary"]["historical"];
    assert_eq!(h["inputs"], h["inputs_kept"], "{h}");

    let cache = ["--historical", "t_stale=10"];
    let hist = sage(&cache);
    let h = &hist.json()["summary"]["historical"];
    let cached = h["level_cached"].as_array().unwrap();
    assert_eq!(cached.len(), 1, "one level between two layers: {h}");
    assert!(cached[0].as_u64().unwrap() > 0, "{h}");
    assert!(
        h["inputs_kept"].as_u64().unwrap() < h["inputs"].as_u64().unwrap(),
        "{h}"
    );
    assert!(
        hist.stderr.contains("historical embeddings"),
        "{}",
        hist.stderr
    );
    // The pipeline off prunes against the same steps' caches.
    let seq = sage(&[&cache[..], &["--pipeline", "off"]].concat());
    assert_eq!(typed_epochs(&seq), typed_epochs(&hist));
    // Read a row at a time, the rows left out are bytes not read.
    let naive = sage(&[&cache[..], &["--features", "naive"]].concat());
    let naive_plain = sage(&["--features", "naive"]);
    let bytes = |r: &offgnn_e2e::Run| typed_epochs(r).iter().map(|e| e.1).sum::<u64>();
    assert!(
        bytes(&naive) < bytes(&naive_plain),
        "{} against {}",
        bytes(&naive),
        bytes(&naive_plain)
    );
    // A resume without the cache's settings goes on without it, and says so.
    let ck = dir.path().join("ck");
    let ck = ck.to_str().unwrap();
    let with_ck = |extra: &[&str]| {
        let mut args = vec![
            "--manifest",
            pack,
            "--max-batches",
            "3",
            "--checkpoint-dir",
            ck,
        ];
        args.extend_from_slice(extra);
        run_env("trainer", &args, &[])
    };
    let r = with_ck(&["--historical", "t_stale=10", "--epochs", "2"]);
    assert!(r.status.success(), "{}", r.stderr);
    let r = with_ck(&["--resume", "--epochs", "3"]);
    assert!(r.status.success(), "{}", r.stderr);
    assert!(
        r.stderr
            .contains("the checkpoint's run trained with --historical p_grad=0.9,t_stale=10"),
        "{}",
        r.stderr
    );
    // R-GAT reads its destinations' own rows: they stay among those read.
    let gat = train(pack, &[&["--model", "gat"][..], &cache[..]].concat());
    let h = &gat.json()["summary"]["historical"];
    assert!(h["level_cached"][0].as_u64().unwrap() > 0, "{h}");
    // Refused before the memory statement, which would fail first here.
    let r = run_env(
        "trainer",
        &[
            "--manifest",
            pack,
            "--historical",
            "--emulate-ranks",
            "2",
            "--memory",
            "1M",
        ],
        &[],
    );
    assert!(!r.status.success());
    assert!(
        r.stderr.contains("not built for data-parallel training"),
        "{}",
        r.stderr
    );
}
