//! The sampler as a user runs it: importing, generating and inspecting
//! datasets, offline sampling runs (DiskGNN §3), its memory statement, and what it
//! refuses (a committed run, bad flags, a store it cannot reach, non-finite
//! features, files it did not write).

use offgnn_e2e::{cora_dir, cora_pack_args, run, run_with_env};

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
    let run_id = j["run"]["run_id"].as_str().unwrap();
    assert!(
        out.join(format!(
            "samples/{run_id}/split=train/epoch=0001/part-00000.parquet"
        ))
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

#[test]
fn sampler_states_its_memory_and_holds_to_it() {
    let dir = tempfile::tempdir().unwrap();
    // 300K nodes, about 3M edges: a graph of some 25 MB.
    let ds = offgnn_e2e::generate(
        dir.path(),
        &[
            "--nodes",
            "300000",
            "--feature-dim",
            "4",
            "--train-fraction",
            "0.05",
        ],
    );
    let sample = |out: &str, memory: &str| {
        offgnn_e2e::run_peak(
            "sampler",
            &[
                "--dataset",
                ds.to_str().unwrap(),
                "--out",
                dir.path().join(out).to_str().unwrap(),
                "--fanout",
                "10,10",
                "--batch-size",
                "512",
                "--threads",
                "2",
                "--memory",
                memory,
            ],
        )
    };
    // Too small a budget is refused up front, and nothing is written.
    let (r, _) = sample("small", "64M");
    assert!(!r.status.success());
    assert!(r.stderr.contains("--memory 64.00 MiB"), "{}", r.stderr);
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    assert!(!dir.path().join("small/run.json").exists());

    let (r, peak) = sample("s", "1G");
    assert!(r.status.success(), "{}", r.stderr);
    let stated = r.json()["memory"]["total_bytes"].as_u64().unwrap();
    eprintln!("sampler on 300K nodes: peak RSS {peak} bytes, stated {stated}");
    assert!(stated <= 1 << 30);
    assert!(
        peak <= stated,
        "peak RSS {peak} bytes over the stated {stated}"
    );
    // The summary's own measured peak is the same high-water mark, taken
    // just before the process exits.
    let reported = r.json()["peak_rss_bytes"].as_u64().unwrap();
    assert!(
        reported <= peak && reported * 2 >= peak,
        "summary's peak {reported} bytes against {peak} measured from outside"
    );
}

/// On small graphs of each kind (node labels, typed, links) the statement
/// still covers the run's peak, and is not a fixed few hundred MiB of
/// buffers sized for large graphs: each part stops at what the run's
/// files and edges can hold.
#[test]
fn a_small_graphs_statement_fits_its_size() {
    let dir = tempfile::tempdir().unwrap();
    let plain = offgnn_e2e::generate(&dir.path().join("p"), &["--nodes", "3000"]);
    let typed = offgnn_e2e::generate(
        &dir.path().join("t"),
        &["--schema", "igbh", "--nodes", "3000", "--feature-dim", "8"],
    );
    let lp = dir.path().join("lp");
    let r = offgnn_e2e::split_edges(&plain, &lp, &["--negatives", "20"]);
    assert!(r.status.success(), "{}", r.stderr);
    let cases: [(&str, &std::path::Path, &[&str]); 3] = [
        ("node", &plain, &[]),
        ("typed", &typed, &[]),
        ("link", &lp, &["--task", "link", "--negatives", "3"]),
    ];
    for (name, ds, extra) in cases {
        let out = dir.path().join(format!("s-{name}"));
        let mut args = vec![
            "--dataset",
            ds.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--fanout",
            "10,10",
            "--threads",
            "2",
        ];
        args.extend_from_slice(extra);
        let (r, peak) = offgnn_e2e::run_peak("sampler", &args);
        assert!(r.status.success(), "{name}: {}", r.stderr);
        let stated = r.json()["memory"]["total_bytes"].as_u64().unwrap();
        eprintln!("sampler, {name} task on 3000 nodes: peak RSS {peak} bytes, stated {stated}");
        assert!(
            peak <= stated,
            "{name}: peak {peak} bytes over the stated {stated}"
        );
        assert!(stated <= 256 << 20, "{name}: stated {stated} bytes");
    }
}

/// --overwrite replaces an earlier output of the same kind and nothing
/// more: `sampler generate` refuses a directory that is not a dataset it
/// wrote, and sampling refuses a samples/ prefix holding a user's file;
/// both in one line, the files untouched.
#[test]
fn overwrite_replaces_only_what_offgnn_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let one_line = offgnn_e2e::assert_one_line;
    let mixed = dir.path().join("mixed");
    std::fs::create_dir_all(mixed.join("other-dataset")).unwrap();
    std::fs::write(mixed.join("other-dataset/metadata.yaml"), b"mine").unwrap();
    let generate = |out: &std::path::Path| {
        run(
            "sampler",
            &[
                "generate",
                "--out",
                out.to_str().unwrap(),
                "--nodes",
                "300",
                "--feature-dim",
                "4",
                "--overwrite",
            ],
        )
    };
    one_line(&generate(&mixed), "is not a dataset this program wrote");
    assert_eq!(
        std::fs::read(mixed.join("other-dataset/metadata.yaml")).unwrap(),
        b"mine"
    );
    // A dataset it wrote is replaced.
    let ds = dir.path().join("g");
    assert!(generate(&ds).status.success());
    assert!(generate(&ds).status.success());

    let samples = dir.path().join("samples");
    let sample = || {
        run(
            "sampler",
            &[
                "--dataset",
                ds.to_str().unwrap(),
                "--out",
                samples.to_str().unwrap(),
                "--fanout",
                "3,3",
                "--batch-size",
                "64",
                "--overwrite",
            ],
        )
    };
    assert!(sample().status.success());
    let note = samples.join("samples/notes.txt");
    std::fs::write(&note, b"mine").unwrap();
    one_line(&sample(), "which no sampler wrote");
    assert_eq!(std::fs::read(&note).unwrap(), b"mine");
}

/// `sampler inspect` reads every feature value: a NaN or an infinity is
/// refused in one line naming the file, the row and the column.
#[test]
fn inspect_refuses_non_finite_features() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let ds = offgnn_e2e::generate(dir.path(), &["--nodes", "500", "--feature-dim", "8"]);
    let r = run("sampler", &["inspect", "--dataset", ds.to_str().unwrap()]);
    assert!(r.status.success(), "{}", r.stderr);
    assert_eq!(r.json()["features_finite"], true);
    let feat = ds.join("data/feat.npy");
    let offset = offgnn_shared::npy::NpyFile::open(&feat)
        .unwrap()
        .header()
        .data_offset;
    for (value, shown) in [(f32::NAN, "NaN"), (f32::NEG_INFINITY, "-inf")] {
        let f = std::fs::OpenOptions::new().write(true).open(&feat).unwrap();
        // Row 42, column 5.
        f.write_all_at(&value.to_le_bytes(), offset + (42 * 8 + 5) * 4)
            .unwrap();
        let r = run("sampler", &["inspect", "--dataset", ds.to_str().unwrap()]);
        assert!(!r.status.success());
        assert!(
            r.stderr.contains(&format!("row 42, column 5 is {shown}")),
            "{}",
            r.stderr
        );
        assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    }
    // The packer's pass reads every value too: it refuses the same one and
    // leaves nothing behind.
    let samples = dir.path().join("samples");
    let r = run(
        "sampler",
        &[
            "--dataset",
            ds.to_str().unwrap(),
            "--out",
            samples.to_str().unwrap(),
            "--fanout",
            "3,3",
            "--batch-size",
            "64",
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);
    let pack = dir.path().join("pack");
    let r = run(
        "packer",
        &cora_pack_args(
            samples.to_str().unwrap(),
            feat.to_str().unwrap(),
            pack.to_str().unwrap(),
        ),
    );
    offgnn_e2e::assert_one_line(&r, "row 42, column 5 is -inf");
    assert!(!pack.join("manifest.json").exists());
    let left = std::fs::read_dir(pack.join("pack"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(left, 0, "the refused run left objects");
}

/// A server that cannot take writes (a read-only file server answers PUT
/// with 501 Not Implemented) is refused at once, in one line that names the
/// method, not retried ten times and then dumped as its HTML page.
#[test]
fn a_read_only_http_server_is_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let (ds, _) = offgnn_e2e::cora_samples(dir.path());
    let (mut server, port) = offgnn_e2e::http_server(dir.path());
    let out = format!("http://127.0.0.1:{port}/samples-over-http");
    let started = std::time::Instant::now();
    let r = run(
        "sampler",
        &[
            "--dataset",
            ds.to_str().unwrap(),
            "--out",
            &out,
            "--epochs",
            "1",
        ],
    );
    let took = started.elapsed();
    server.kill().unwrap();
    server.wait().unwrap();
    assert!(!r.status.success());
    let err = r.stderr.trim();
    assert!(
        err.contains("the server does not support") && err.contains("(HTTP 501)"),
        "{err}"
    );
    assert!(!err.to_lowercase().contains("<html"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(took < std::time::Duration::from_secs(15), "{took:?}");
}

/// `sampler split-edges` (issue 38, item 1): a dataset whose graph lacks the
/// held-out pairs and whose link-prediction task GraphBolt's layout holds.
#[test]
fn split_edges_writes_a_link_prediction_dataset_without_its_held_out_edges() {
    let dir = tempfile::tempdir().unwrap();
    let ds = offgnn_e2e::generate(dir.path(), &["--nodes", "3000", "--feature-dim", "8"]);
    let out = dir.path().join("lp");
    let split = |extra: &[&str]| {
        offgnn_e2e::split_edges(&ds, &out, &[&["--negatives", "20"], extra].concat())
    };
    let r = split(&[]);
    assert!(r.status.success(), "{}", r.stderr);
    let s = r.json()["summary"].clone();
    let n = |k: &str| s[k].as_u64().unwrap();
    let pairs = n("train_pairs") + n("valid_pairs") + n("test_pairs");
    assert!(
        n("valid_pairs") > 0 && n("test_pairs") > n("valid_pairs"),
        "{s}"
    );
    assert_eq!(
        n("valid_pairs"),
        (0.05 * pairs as f64).round() as u64,
        "{s}"
    );
    // Every held-out pair left the graph, both ways (the generator stores
    // each edge twice, a repeated one more often).
    assert!(
        n("edges") - n("train_edges") >= 2 * (n("valid_pairs") + n("test_pairs")),
        "{s}"
    );
    let read = |f: &str| {
        offgnn_shared::npy::NpyFile::open(out.join(f))
            .unwrap()
            .read_all_u64()
            .unwrap()
    };
    let edges = read("edges/edges.npy");
    let e = edges.len() / 2;
    let key = |u: u64, v: u64| (u.min(v), u.max(v));
    let graph: std::collections::HashSet<(u64, u64)> =
        (0..e).map(|i| key(edges[i], edges[e + i])).collect();
    for set in ["valid", "test"] {
        let seeds = read(&format!("set/lp_{set}_seeds.npy"));
        let labels = read(&format!("set/lp_{set}_labels.npy"));
        let indexes = read(&format!("set/lp_{set}_indexes.npy"));
        for (row, (&label, &index)) in labels.iter().zip(&indexes).enumerate() {
            // Each positive, then its 20 negatives, under its index.
            assert_eq!(label, u64::from(row % 21 == 0), "{set} row {row}");
            assert_eq!(index, (row / 21) as u64, "{set} row {row}");
            let (u, v) = (seeds[2 * row], seeds[2 * row + 1]);
            assert!(
                !graph.contains(&key(u, v)),
                "{set} row {row}: ({u}, {v}) is in the training graph"
            );
        }
    }
    let meta = std::fs::read_to_string(out.join("metadata.yaml")).unwrap();
    assert!(meta.contains("name: link_prediction"), "{meta}");
    assert!(meta.contains("set/lp_valid_indexes.npy"), "{meta}");
    let shape = |f: &str| {
        offgnn_shared::npy::NpyFile::open(out.join(f))
            .unwrap()
            .shape()
            .to_vec()
    };
    assert_eq!(shape("set/lp_train_seeds.npy"), vec![n("train_pairs"), 2]);
    assert_eq!(
        shape("set/lp_valid_seeds.npy"),
        vec![21 * n("valid_pairs"), 2]
    );
    assert_eq!(shape("set/lp_test_labels.npy"), vec![21 * n("test_pairs")]);
    // The new dataset is whole: it opens, its link task reads back as
    // written (each query one positive and its 20 negatives).
    let r = run("sampler", &["inspect", "--dataset", out.to_str().unwrap()]);
    assert!(r.status.success(), "{}", r.stderr);
    let lp = &r.json()["link_prediction"];
    assert_eq!(lp["train_pairs"].as_u64(), Some(n("train_pairs")), "{lp}");
    assert_eq!(lp["valid_queries"].as_u64(), Some(n("valid_pairs")), "{lp}");
    assert_eq!(
        lp["test_negatives"].as_u64(),
        Some(20 * n("test_pairs")),
        "{lp}"
    );
    // The same seed writes the same files.
    let first = std::fs::read(out.join("set/lp_test_seeds.npy")).unwrap();
    let r = split(&["--overwrite"]);
    assert!(r.status.success(), "{}", r.stderr);
    assert_eq!(
        std::fs::read(out.join("set/lp_test_seeds.npy")).unwrap(),
        first
    );
    // Bad input: one line each, nothing written.
    let other = dir.path().join("none");
    for (flags, says) in [
        (
            vec!["--valid", "0.6", "--test", "0.5"],
            "none would be left to train on",
        ),
        (vec!["--negatives", "0"], "--negatives must be at least 1"),
        (
            vec!["--negatives", "100000"],
            "--negatives 100000: a held-out edge has at most",
        ),
    ] {
        let r = offgnn_e2e::split_edges(&ds, &other, &flags);
        assert!(!r.status.success());
        assert!(r.stderr.contains(says), "{}", r.stderr);
        assert!(!other.exists());
    }
    // A task whose queries lack negatives is refused in one line naming
    // the metadata.
    let copy = dir.path().join("no-negatives");
    let r = split(&["--overwrite"]);
    assert!(r.status.success(), "{}", r.stderr);
    std::fs::rename(&out, &copy).unwrap();
    let rows = 21 * n("valid_pairs");
    let ones: Vec<u64> = vec![1; rows as usize];
    let indexes: Vec<u64> = (0..rows).collect();
    offgnn_shared::npy::write_i64(copy.join("set/lp_valid_labels.npy"), &ones).unwrap();
    offgnn_shared::npy::write_i64(copy.join("set/lp_valid_indexes.npy"), &indexes).unwrap();
    let r = run("sampler", &["inspect", "--dataset", copy.to_str().unwrap()]);
    assert!(!r.status.success());
    assert!(
        r.stderr.contains("metadata.yaml") && r.stderr.contains("query 0 has no negatives"),
        "{}",
        r.stderr
    );
    std::fs::rename(&copy, &out).unwrap();
    // An existing output is refused without --overwrite.
    let r = split(&[]);
    assert!(!r.status.success());
    assert!(r.stderr.contains("already exists"), "{}", r.stderr);
}

/// Every batch of the link-prediction run at `out`, by split.
fn link_batches(out: &std::path::Path) -> Vec<offgnn_shared::samples::SampledBatch> {
    use offgnn_shared::samples::{RunSummary, read_file};
    let store = offgnn_shared::store::Store::open(out.to_str().unwrap()).unwrap();
    let run = RunSummary::read(&store).unwrap();
    run.files
        .iter()
        .flat_map(|f| read_file(&store, f).unwrap())
        .collect()
}

/// `sampler --task link` (issue 38, item 2): training pairs with drawn
/// negatives and without their own edges in their blocks, evaluation
/// queries with their given negatives, as Parquet.
#[test]
fn link_prediction_batches_never_hold_their_own_edges_and_rank_the_given_negatives() {
    use offgnn_shared::dataset::{LinkTask, Split};
    let dir = tempfile::tempdir().unwrap();
    let ds = offgnn_e2e::generate(dir.path(), &["--nodes", "3000", "--feature-dim", "8"]);
    let lp = dir.path().join("lp");
    let r = offgnn_e2e::split_edges(&ds, &lp, &["--negatives", "20"]);
    assert!(r.status.success(), "{}", r.stderr);
    let task = LinkTask::open(&lp, 3000).unwrap().unwrap();
    let sample = |out: &str, extra: &[&str]| {
        let out = dir.path().join(out);
        let mut flags = vec!["--task", "link", "--negatives", "3", "--fanout", "5,5"];
        flags.extend_from_slice(&["--batch-size", "128", "--epochs", "2"]);
        flags.extend_from_slice(extra);
        offgnn_e2e::sample(&lp, &out, &flags);
        out
    };
    let out = sample("samples", &[]);
    let batches = link_batches(&out);
    let key = |u: u32, v: u32| (u.min(v), u.max(v));
    let mut train_pairs = 0;
    let mut queries = 0;
    for b in &batches {
        let p = &b.pairs;
        assert!(b.labels.is_empty() && !p.is_empty());
        let global = |r: usize| (b.seeds[p.src[r] as usize], b.seeds[p.dst[r] as usize]);
        let positives: std::collections::HashSet<(u32, u32)> = (0..p.len())
            .filter(|&r| p.label[r] == 1)
            .map(|r| key(global(r).0, global(r).1))
            .collect();
        if b.split == Split::Train {
            train_pairs += positives.len();
            // Each positive, then its 3 negatives from its source.
            for r in (0..p.len()).step_by(4) {
                assert_eq!(p.label[r..r + 4], [1, 0, 0, 0]);
                assert!((r + 1..r + 4).all(|n| p.src[n] == p.src[r] && p.query[n] == p.query[r]));
            }
            // No block holds an edge of one of the batch's positive pairs.
            for block in &b.blocks {
                for (&s, &d) in block.src.iter().zip(&block.dst) {
                    let e = key(b.input_nodes[s as usize], b.input_nodes[d as usize]);
                    assert!(
                        !positives.contains(&e),
                        "batch {}: its positive edge {e:?} in a block",
                        b.index
                    );
                }
            }
        } else {
            // Each query: the task's positive and its 20 negatives.
            let set = if b.split == Split::Valid {
                &task.valid
            } else {
                &task.test
            };
            for r in (0..p.len()).step_by(21) {
                let q = queries_in(set, global(r));
                assert_eq!(p.label[r..r + 21].iter().sum::<u32>(), 1);
                let negatives: Vec<(u32, u32)> = (r + 1..r + 21).map(global).collect();
                let range = set.offsets[q] as usize..set.offsets[q + 1] as usize;
                assert_eq!(negatives, set.negatives[range]);
                queries += 1;
            }
        }
    }
    // Every training pair in each of the two epochs; every query once.
    assert!(
        train_pairs >= 2 * task.train.pairs.len() - 2 * batches.len(),
        "{train_pairs}"
    );
    assert_eq!(
        queries,
        task.valid.positives.len() + task.test.positives.len()
    );
    // Evaluation batches hold whole queries: 4096 pairs' worth by default
    // (195 queries of 21 pairs), --eval-batch-size's when given; only a
    // split's last batch holds fewer.
    let queries_per_batch = |batches: &[offgnn_shared::samples::SampledBatch], split| {
        let mut per: Vec<(u32, usize)> = (batches.iter())
            .filter(|b| b.split == split)
            .map(|b| (b.index, b.pairs.len() / 21))
            .collect();
        per.sort();
        per.into_iter().map(|(_, q)| q).collect::<Vec<_>>()
    };
    let small = link_batches(&sample("small-eval", &["--eval-batch-size", "42"]));
    for split in [Split::Valid, Split::Test] {
        for (batches, want) in [(&batches, 195), (&small, 2)] {
            let per = queries_per_batch(batches, split);
            let (last, full) = per.split_last().unwrap();
            assert!(full.iter().all(|&q| q == want), "{split:?}: {per:?}");
            assert!((1..=want).contains(last), "{split:?}: {per:?}");
        }
    }
    let params = |out: &str| {
        let store = offgnn_shared::store::Store::open(dir.path().join(out).to_str().unwrap());
        offgnn_shared::samples::RunSummary::read(&store.unwrap())
            .unwrap()
            .params
    };
    assert_eq!(params("samples").eval_batch_size, Some(4096));
    assert_eq!(params("small-eval").eval_batch_size, Some(42));
    // Training batches are the same whatever the evaluation batches.
    let train = |b: &[offgnn_shared::samples::SampledBatch]| {
        b.iter()
            .filter(|b| b.split == Split::Train)
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(train(&small), train(&batches));
    // Threads change who samples a batch, never what is sampled.
    let again = sample("again", &["--threads", "1"]);
    assert_eq!(link_batches(&again), batches);
    // Bad input, one line each.
    let none = dir.path().join("none");
    for (dataset, flags, says) in [
        (
            &ds,
            vec!["--task", "link"],
            "has no link_prediction task (sampler split-edges writes one",
        ),
        (
            &lp,
            vec!["--task", "link", "--negatives", "0"],
            "--negatives must be at least 1",
        ),
    ] {
        let mut args = vec![
            "--dataset",
            dataset.to_str().unwrap(),
            "--out",
            none.to_str().unwrap(),
        ];
        args.extend(flags);
        let r = run("sampler", &args);
        assert!(!r.status.success());
        offgnn_e2e::assert_one_line(&r, says);
        // The refused run leaves no output directory behind.
        assert!(!none.exists(), "{}", none.display());
    }
    // Reading a model that is not there creates nothing either.
    let r = run(
        "trainer",
        &["show-model", "--model", none.to_str().unwrap()],
    );
    offgnn_e2e::assert_one_line(&r, "no such directory");
    assert!(!none.exists());
}

/// The query of `set` whose positive is `pair`.
fn queries_in(set: &offgnn_shared::dataset::RankedSet, pair: (u32, u32)) -> usize {
    set.positives
        .iter()
        .position(|&p| p == pair)
        .expect("a positive of the task")
}
