//! The packer as a user runs it: packing, `verify` and `inspect` of a
//! layout (DiskGNN §5.1-§5.2), its memory budget, relative paths, and what it
//! refuses (a committed layout, bad sizes, files it did not write, a
//! feature file changed after packing).

use offgnn_e2e::{cora_pack_args, cora_samples, run};

#[test]
fn cora_packs_verifies_and_inspects_through_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let (ds, samples) = cora_samples(dir.path());
    let feat = ds.join("data/feat.npy");
    let out = dir.path().join("pack");
    let args = cora_pack_args(
        samples.to_str().unwrap(),
        feat.to_str().unwrap(),
        out.to_str().unwrap(),
    );
    let r = run("packer", &args);
    assert!(r.status.success(), "{}", r.stderr);
    let s = &r.json()["summary"];
    // The budget holds everything the layout writes, address tables included.
    assert!(s["disk_bytes"].as_u64().unwrap() <= s["disk_budget"].as_u64().unwrap());
    assert!(s["table_bytes"].as_u64().unwrap() > 0);
    assert_eq!(
        s["feature_disk_bytes"].as_u64().unwrap() + s["table_bytes"].as_u64().unwrap(),
        s["disk_bytes"].as_u64().unwrap()
    );
    assert!(s["predicted_read_amplification"].as_f64().unwrap() >= 1.0);
    assert!(s["gpu_rows"].as_u64().unwrap() > 0);

    let manifest = out.join("manifest.json");
    let r = run(
        "packer",
        &["verify", "--manifest", manifest.to_str().unwrap()],
    );
    assert!(r.status.success(), "{}", r.stderr);
    assert_eq!(r.json()["ok"], true);
    // 1625 training seeds, batch 256, 2 epochs; 542 valid; 541 test.
    assert_eq!(r.json()["summary"]["batches"], 2 * 7 + 3 + 3);

    let r = run(
        "packer",
        &["inspect", "--manifest", manifest.to_str().unwrap()],
    );
    assert!(r.status.success(), "{}", r.stderr);
    assert_eq!(r.json()["manifest"]["format_version"], 3);

    // Committed layouts are refused; bad sizes and budgets are one line.
    let again = run("packer", &args);
    assert!(!again.status.success());
    assert!(
        again.stderr.contains("already holds a committed layout"),
        "{}",
        again.stderr
    );
    let other = dir.path().join("other");
    for (flag, value, want) in [
        ("--disk-budget", "1K", "raise --disk-budget to at least"),
        ("--disk-budget", "-3x", "-3x"),
        ("--gpu-cache", "lots", "lots"),
    ] {
        let mut a: Vec<&str> = args.to_vec();
        a[5] = other.to_str().unwrap();
        let i = a.iter().position(|x| *x == flag).unwrap();
        a[i + 1] = value;
        let r = run("packer", &a);
        assert!(!r.status.success(), "{flag} {value}");
        assert!(r.stderr.contains(want), "{flag} {value}: {}", r.stderr);
        assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
        // Nothing is left: not even the directory the run made.
        assert!(!other.exists(), "{flag} {value}");
    }
}

/// The packer's peak RSS against its statement and --memory, on a wide
/// feature file whose disk caches take several partitions, and on the
/// reliability issue's graph (1M nodes, 32-d, fan-out 10,15,20), whose
/// samples files are large beside the features. There the peak once passed
/// the budget in two ways: the decoding of a samples file was not counted
/// whole, and memory freed by one thread stayed in its own glibc arena
/// (the packer's threads now share one arena, trimmed between phases:
/// packer/src/heap.rs).
#[test]
fn packer_peak_memory_stays_within_its_budget() {
    packer_peak(
        &[
            "--nodes",
            "100000",
            "--feature-dim",
            "256",
            "--train-fraction",
            "0.01",
        ],
        &["--fanout", "5,5", "--batch-size", "200"],
        &[
            "--gpu-cache",
            "0",
            "--cpu-cache",
            "0",
            "--disk-budget",
            "5x",
        ],
        168,
        true,
    );
    packer_peak(
        &[
            "--nodes",
            "1000000",
            "--feature-dim",
            "32",
            "--valid-fraction",
            "0.01",
            "--test-fraction",
            "0.01",
        ],
        &["--fanout", "10,15,20", "--batch-size", "1024"],
        &[
            "--gpu-cache",
            "8M",
            "--cpu-cache",
            "16M",
            "--disk-budget",
            "6x",
        ],
        1300,
        false,
    );
}

fn packer_peak(
    graph: &[&str],
    sampling: &[&str],
    packing: &[&str],
    budget_mib: u64,
    several_partitions: bool,
) {
    if !std::path::Path::new("/usr/bin/time").exists() {
        panic!("/usr/bin/time is missing: scripts/setup installs it");
    }
    let dir = tempfile::tempdir().unwrap();
    let ds = offgnn_e2e::generate(dir.path(), graph);
    let samples = dir.path().join("s");
    let mut args = vec![
        "--dataset",
        ds.to_str().unwrap(),
        "--out",
        samples.to_str().unwrap(),
    ];
    args.extend_from_slice(sampling);
    let r = run("sampler", &args);
    assert!(r.status.success(), "{}", r.stderr);
    let budget = format!("{budget_mib}M");
    let (feat, out) = (ds.join("data/feat.npy"), dir.path().join("p"));
    let mut args = vec![
        "--samples",
        samples.to_str().unwrap(),
        "--features",
        feat.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--memory",
        &budget,
    ];
    args.extend_from_slice(packing);
    let (r, peak) = offgnn_e2e::run_peak("packer", &args);
    assert!(r.status.success(), "{}", r.stderr);
    if several_partitions {
        assert!(
            r.json()["summary"]["partitions"].as_u64().unwrap() > 1,
            "the budget must force several partitions"
        );
    }
    let stated = r.json()["summary"]["memory"]["total_bytes"]
        .as_u64()
        .unwrap();
    eprintln!("packer: peak RSS {peak} bytes, stated {stated}, --memory {budget_mib} MiB");
    assert!(
        peak <= budget_mib << 20,
        "peak {peak} bytes over the {budget_mib} MiB budget"
    );
    // The statement is an upper bound, and within the budget.
    assert!(stated <= budget_mib << 20, "stated {stated} bytes");
    assert!(peak <= stated, "peak {peak} bytes over the stated {stated}");
}

/// A layout packed from relative paths verifies from another working
/// directory: the manifest names its samples and features absolutely.
#[test]
fn a_layout_packed_from_relative_paths_verifies_from_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let (ds, samples) = cora_samples(dir.path());
    let rel = |p: &std::path::Path| {
        p.strip_prefix(dir.path())
            .unwrap()
            .to_str()
            .unwrap()
            .to_string()
    };
    let out = std::process::Command::new(offgnn_e2e::binary("packer"))
        .current_dir(dir.path())
        .env("RUST_LOG", "warn")
        .args(cora_pack_args(
            &rel(&samples),
            &rel(&ds.join("data/feat.npy")),
            "pack",
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let manifest = dir.path().join("pack/manifest.json");
    let r = run(
        "packer",
        &["verify", "--manifest", manifest.to_str().unwrap()],
    );
    assert!(r.status.success(), "{}", r.stderr);
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    assert!(
        m["samples"]["location"].as_str().unwrap().starts_with('/'),
        "{}",
        m["samples"]["location"]
    );
}

/// The packer removes only a layout's own objects under pack/: a user's
/// file there (at any depth) makes it refuse in one line before anything
/// is removed, with or without --overwrite.
#[test]
fn the_packer_refuses_to_remove_files_it_did_not_write() {
    let dir = tempfile::tempdir().unwrap();
    let (ds, samples) = cora_samples(dir.path());
    let out = dir.path().join("out");
    let pack = |extra: &[&str]| {
        let feat = ds.join("data/feat.npy");
        let mut args = cora_pack_args(
            samples.to_str().unwrap(),
            feat.to_str().unwrap(),
            out.to_str().unwrap(),
        );
        args.extend_from_slice(extra);
        run("packer", &args)
    };
    for user_file in ["pack/notes.txt", "pack/sub/data.csv"] {
        let path = out.join(user_file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, b"mine").unwrap();
        for extra in [&[][..], &["--overwrite"][..]] {
            let r = pack(extra);
            assert!(
                !r.status.success(),
                "{user_file}: packed over a user's file"
            );
            assert!(r.stderr.contains("that no packer wrote"), "{}", r.stderr);
            assert!(r.stderr.contains(user_file), "{}", r.stderr);
            assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
            assert_eq!(std::fs::read(&path).unwrap(), b"mine");
        }
        std::fs::remove_file(&path).unwrap();
    }
    // Without them the layout packs, and packs again with --overwrite.
    let r = pack(&[]);
    assert!(r.status.success(), "{}", r.stderr);
    let r = pack(&["--overwrite"]);
    assert!(r.status.success(), "{}", r.stderr);
}

/// A 4-byte change inside a same-shape feature file escapes the sampled
/// fingerprint; the CRC32C of every row, which the packer records while it
/// reads them all, catches it in `packer verify`.
#[test]
fn verify_catches_a_changed_feature_row_the_fingerprint_misses() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    // 20000 x 64 float32: 5 MB, so the fingerprint's 17 samples of 64 KiB
    // leave gaps.
    let ds = offgnn_e2e::generate(
        dir.path(),
        &["--nodes", "20000", "--feature-dim", "64", "--classes", "4"],
    );
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
            "512",
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);
    let feat = ds.join("data/feat.npy");
    let pack = dir.path().join("pack");
    let r = run(
        "packer",
        &cora_pack_args(
            samples.to_str().unwrap(),
            feat.to_str().unwrap(),
            pack.to_str().unwrap(),
        ),
    );
    assert!(r.status.success(), "{}", r.stderr);
    let manifest = pack.join("manifest.json");
    let verify = || {
        run(
            "packer",
            &["verify", "--manifest", manifest.to_str().unwrap()],
        )
    };
    let r = verify();
    assert!(r.status.success(), "{}", r.stderr);

    // Halfway between the fingerprint's first two samples.
    let len = std::fs::metadata(&feat).unwrap().len();
    let sample = 64u64 << 10;
    let step = (len - sample) / 16;
    assert!(step > 2 * sample, "the file is too small for a gap");
    let at = (sample + step) / 2 / 4 * 4;
    let before = offgnn_shared::dataset::file_fingerprint(&feat).unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&feat)
        .unwrap();
    let mut word = [0u8; 4];
    f.read_exact_at(&mut word, at).unwrap();
    word[3] ^= 0x40;
    f.write_all_at(&word, at).unwrap();
    assert_eq!(
        offgnn_shared::dataset::file_fingerprint(&feat).unwrap(),
        before,
        "the change must be one the fingerprint cannot see"
    );
    offgnn_e2e::assert_one_line(&verify(), "the file changed after packing");
}
