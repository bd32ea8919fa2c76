//! Bad input, one table for all three programs: each case is one clear line
//! on stderr naming what is wrong, a failing exit, and nothing written under
//! a committed name.

use std::path::{Path, PathBuf};

use offgnn_e2e::run;

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    ds: PathBuf,
    samples: PathBuf,
    pack: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let ds = offgnn_e2e::generate(
        &root,
        &["--nodes", "2000", "--feature-dim", "8", "--classes", "4"],
    );
    let ok = |r: offgnn_e2e::Run| assert!(r.status.success(), "{}", r.stderr);
    let samples = root.join("samples");
    ok(run(
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
    ));
    let pack = root.join("pack");
    ok(run(
        "packer",
        &[
            "--samples",
            samples.to_str().unwrap(),
            "--features",
            ds.join("data/feat.npy").to_str().unwrap(),
            "--out",
            pack.to_str().unwrap(),
            "--gpu-cache",
            "4K",
            "--cpu-cache",
            "4K",
            "--disk-budget",
            "8x",
        ],
    ));
    Fixture {
        _dir: dir,
        root,
        ds,
        samples,
        pack,
    }
}

/// A copy of the fixture's dataset with `edit` applied, in a new folder.
fn edited_dataset(f: &Fixture, name: &str, edit: impl FnOnce(&Path)) -> PathBuf {
    let out = f.root.join(name);
    copy_dir(&f.ds, &out);
    edit(&out);
    out
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Replaces `from` with `to` in `file`.
fn rewrite(file: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(file).unwrap();
    assert!(text.contains(from), "{} lacks {from:?}", file.display());
    std::fs::write(file, text.replacen(from, to, 1)).unwrap();
}

/// Writes a `.npy` of little-endian i64 with `shape` from `values`.
fn write_npy_i64(path: &Path, shape: &[usize], values: &[i64]) {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape = if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    };
    let mut header = format!("{{'descr': '<i8', 'fortran_order': False, 'shape': {shape}, }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    for v in values {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(path, bytes).unwrap();
}

/// Flips one byte in the middle of `file`.
fn flip_byte(file: &Path) {
    let mut bytes = std::fs::read(file).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x5a;
    std::fs::write(file, bytes).unwrap();
}

fn first_file(dir: &Path, ext: &str) -> PathBuf {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == ext) {
                return p;
            }
        }
    }
    panic!("no .{ext} file under {}", dir.display())
}

/// Inputs broken in the ways a user's files break, and samples and layouts
/// damaged after they were committed, beside the fixture's good ones.
struct Broken {
    out_of_range: PathBuf,
    negative: PathBuf,
    empty_train: PathBuf,
    escaping: PathBuf,
    csv_header: PathBuf,
    /// An --out that holds something other than a dataset offgnn wrote.
    foreign: PathBuf,
    wrong_dtype: PathBuf,
    bad_samples: PathBuf,
    future: PathBuf,
    escape_manifest: PathBuf,
    missing_field: PathBuf,
}

fn broken_inputs(f: &Fixture) -> Broken {
    let manifest = s(&f.pack.join("manifest.json"));
    // Datasets broken in the ways a user's files break.
    let out_of_range = edited_dataset(f, "oor", |d| {
        let train = d.join("set/train_seeds.npy");
        write_npy_i64(&train, &[2], &[1, 2000]);
    });
    let negative = edited_dataset(f, "neg", |d| {
        write_npy_i64(&d.join("set/train_seeds.npy"), &[2], &[1, -4]);
    });
    let empty_train = edited_dataset(f, "empty", |d| {
        write_npy_i64(&d.join("set/train_seeds.npy"), &[0], &[]);
        write_npy_i64(&d.join("set/train_labels.npy"), &[0], &[]);
    });
    let escaping = edited_dataset(f, "escape", |d| {
        rewrite(
            &d.join("metadata.yaml"),
            "data/feat.npy",
            "../../etc/passwd",
        );
    });
    // A CSV edge file that starts with a header line (GraphBolt's has none).
    let csv_header = edited_dataset(f, "csvhead", |d| {
        std::fs::write(d.join("edges/edges.csv"), "src,dst\n0,1\n1,2\n").unwrap();
        rewrite(
            &d.join("metadata.yaml"),
            "edges/edges.npy",
            "edges/edges.csv",
        );
        rewrite(&d.join("metadata.yaml"), "format: numpy", "format: csv");
    });
    // An --out that holds something other than a dataset offgnn wrote.
    let foreign = f.root.join("foreign");
    std::fs::create_dir_all(foreign.join("notes")).unwrap();
    std::fs::write(foreign.join("notes/mine.txt"), b"mine").unwrap();
    let wrong_dtype = edited_dataset(f, "dtype", |d| {
        write_npy_i64(&d.join("data/feat.npy"), &[2000, 8], &vec![0; 16000]);
    });

    // Samples and layouts damaged after they were committed.
    let bad_samples = f.root.join("bad-samples");
    copy_dir(&f.samples, &bad_samples);
    flip_byte(&first_file(&bad_samples, "parquet"));
    let future = f.pack.join("future.json");
    let escape_manifest = f.pack.join("escape.json");
    let missing_field = f.pack.join("missing.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let mut doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    doc["format_version"] = 99.into();
    std::fs::write(&future, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    std::fs::write(
        &escape_manifest,
        text.replace(
            &format!(
                "\"{}\"",
                offgnn_e2e::first_segment(std::path::Path::new(&manifest))
            ),
            "\"../../segment.bin\"",
        ),
    )
    .unwrap();
    let mut j: serde_json::Value = serde_json::from_str(&text).unwrap();
    j.as_object_mut().unwrap().remove("objects");
    std::fs::write(&missing_field, serde_json::to_vec(&j).unwrap()).unwrap();

    Broken {
        out_of_range,
        negative,
        empty_train,
        escaping,
        csv_header,
        foreign,
        wrong_dtype,
        bad_samples,
        future,
        escape_manifest,
        missing_field,
    }
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

/// A path for an output under the fixture's folder, which no run creates.
fn new_out(f: &Fixture, name: &str) -> String {
    s(&f.root.join(name))
}

fn sampler_args(ds: &Path, out: &str, extra: &[&str]) -> Vec<String> {
    let mut a = vec![
        "--dataset".to_string(),
        s(ds),
        "--out".into(),
        out.to_string(),
    ];
    a.extend(extra.iter().map(|x| x.to_string()));
    a
}

/// The fixture's packer flags with `extra`'s pairs replacing or added.
fn packer_args(samples: &str, features: &str, out: &str, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "--samples",
        samples,
        "--features",
        features,
        "--out",
        out,
        "--gpu-cache",
        "4K",
        "--cpu-cache",
        "4K",
        "--disk-budget",
        "8x",
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    for pair in extra.chunks(2) {
        match a.iter().position(|x| x == pair[0]) {
            Some(i) => a[i + 1] = pair[1].to_string(),
            None => a.extend(pair.iter().map(|x| x.to_string())),
        }
    }
    a
}

fn trainer_args(m: &str, extra: &[&str]) -> Vec<String> {
    let mut a = vec![
        "--manifest".to_string(),
        m.to_string(),
        "--epochs".into(),
        "1".into(),
    ];
    a.extend(extra.iter().map(|x| x.to_string()));
    a
}

/// One refusal: the program, its arguments, what its one line must say,
/// and the commit that must not appear.
type Case = (&'static str, Vec<String>, &'static str, Option<PathBuf>);

fn sampler_cases(f: &Fixture, b: &Broken) -> Vec<Case> {
    let cora = offgnn_e2e::cora_dir();
    vec![
        (
            "sampler",
            sampler_args(&b.out_of_range, &new_out(f, "s1"), &[]),
            "out of range",
            Some(f.root.join("s1/run.json")),
        ),
        (
            "sampler",
            sampler_args(&b.negative, &new_out(f, "s2"), &[]),
            "negative",
            Some(f.root.join("s2/run.json")),
        ),
        (
            "sampler",
            sampler_args(&b.empty_train, &new_out(f, "s3"), &[]),
            "train",
            Some(f.root.join("s3/run.json")),
        ),
        (
            "sampler",
            sampler_args(&b.escaping, &new_out(f, "s4"), &[]),
            "leaves the dataset directory",
            Some(f.root.join("s4/run.json")),
        ),
        (
            "sampler",
            sampler_args(&b.wrong_dtype, &new_out(f, "s5"), &[]),
            "int64",
            Some(f.root.join("s5/run.json")),
        ),
        (
            "sampler",
            sampler_args(&f.ds, &new_out(f, "s6"), &["--fanout", "3,0"]),
            "0",
            Some(f.root.join("s6/run.json")),
        ),
        (
            "sampler",
            sampler_args(&f.ds, &new_out(f, "s7"), &["--batch-size", "0"]),
            "batch-size",
            Some(f.root.join("s7/run.json")),
        ),
        (
            "sampler",
            sampler_args(
                &f.ds,
                &new_out(f, "s8"),
                &["--shard", "4", "--num-shards", "2"],
            ),
            "out of range",
            Some(f.root.join("s8/run.json")),
        ),
        (
            "sampler",
            sampler_args(&f.ds, &new_out(f, "s9"), &["--epochs", "0"]),
            "epochs",
            Some(f.root.join("s9/run.json")),
        ),
        (
            "sampler",
            sampler_args(&b.csv_header, &new_out(f, "s10"), &[]),
            "is a header",
            Some(f.root.join("s10/run.json")),
        ),
        (
            "sampler",
            vec![
                "import-parquet".into(),
                "--preset".into(),
                "cora".into(),
                "--nodes".into(),
                s(&cora.join("cora_nodes.parquet.gzip")),
                "--edges".into(),
                s(&cora.join("cora_rels.parquet.gzip")),
                "--out".into(),
                s(&b.foreign),
                "--overwrite".into(),
            ],
            "is not a dataset this program wrote",
            Some(b.foreign.join("metadata.yaml")),
        ),
    ]
}

fn packer_cases(f: &Fixture, b: &Broken) -> Vec<Case> {
    let feat = s(&f.ds.join("data/feat.npy"));
    let samples = s(&f.samples);
    vec![
        (
            "packer",
            packer_args(&s(&b.bad_samples), &feat, &new_out(f, "p1"), &[]),
            "checksum",
            Some(f.root.join("p1/manifest.json")),
        ),
        (
            "packer",
            packer_args(
                &samples,
                &s(&b.wrong_dtype.join("data/feat.npy")),
                &new_out(f, "p2"),
                &[],
            ),
            "feat.npy",
            Some(f.root.join("p2/manifest.json")),
        ),
        (
            "packer",
            packer_args(
                &samples,
                &feat,
                &new_out(f, "p3"),
                &["--gpu-cache", "99999999999T"],
            ),
            "99999999999T",
            Some(f.root.join("p3/manifest.json")),
        ),
        (
            "packer",
            packer_args(&samples, &feat, &new_out(f, "p4"), &["--disk-budget", "0"]),
            "disk-budget",
            Some(f.root.join("p4/manifest.json")),
        ),
        (
            "packer",
            packer_args(&samples, &feat, &new_out(f, "p5"), &["--memory", "1K"]),
            "--memory",
            Some(f.root.join("p5/manifest.json")),
        ),
        (
            "packer",
            packer_args(&samples, &feat, &new_out(f, "p6"), &["--segment-size", "0"]),
            "segment-size",
            Some(f.root.join("p6/manifest.json")),
        ),
        (
            "packer",
            vec!["verify".into(), "--manifest".into(), s(&b.escape_manifest)],
            "leaves the layout",
            None,
        ),
    ]
}

fn trainer_cases(f: &Fixture, b: &Broken) -> Vec<Case> {
    let manifest = s(&f.pack.join("manifest.json"));
    vec![
        (
            "trainer",
            trainer_args(&s(&b.future), &[]),
            "newer than this build",
            None,
        ),
        (
            "trainer",
            trainer_args(&s(&b.escape_manifest), &[]),
            "leaves the layout",
            None,
        ),
        (
            "trainer",
            trainer_args(&s(&b.missing_field), &[]),
            "objects",
            None,
        ),
        (
            "trainer",
            trainer_args(&manifest, &["--lr=-1"]),
            "--lr",
            None,
        ),
        (
            "trainer",
            trainer_args(&manifest, &["--loaders", "0"]),
            "--loaders",
            None,
        ),
        (
            "trainer",
            trainer_args(&manifest, &["--queue-depth", "0"]),
            "--queue-depth",
            None,
        ),
        (
            "trainer",
            trainer_args(&manifest, &["--model", "gat", "--heads", "0"]),
            "--heads",
            None,
        ),
        (
            "trainer",
            trainer_args(&manifest, &["--max-batches", "0"]),
            "--max-batches must be at least 1",
            None,
        ),
        (
            "trainer",
            trainer_args(
                &manifest,
                &[
                    "--checkpoint-every",
                    "0",
                    "--checkpoint-dir",
                    &new_out(f, "ck"),
                ],
            ),
            "checkpoint-every",
            None,
        ),
        (
            "trainer",
            trainer_args(&manifest, &["--device", "cuda:x"]),
            "unknown device",
            None,
        ),
        (
            "trainer",
            trainer_args(&manifest, &["--root-weight"]),
            "has its root weight always",
            None,
        ),
        (
            "trainer",
            trainer_args(&manifest, &["--init", "glorot"]),
            "--init is for typed graphs",
            None,
        ),
    ]
}

/// Runs every case; fails the test listing those not refused in one line
/// with a failing exit and no commit.
fn refused_in_one_line(cases: &[Case]) {
    let mut failures = Vec::new();
    for (program, args, want, commit) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = run(program, &args);
        let line = r.stderr.trim();
        // The table the closing notes quote (shown with --nocapture).
        eprintln!("{program} | {want} | exit {:?} | {line}", r.status.code());
        let ok = !r.status.success()
            && line.lines().count() == 1
            && line.contains(want)
            && commit.as_ref().is_none_or(|c| !c.exists());
        if !ok {
            failures.push(format!(
                "{program} {args:?}: exit {:?}, stderr {line:?} (want {want:?})",
                r.status.code()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn every_bad_input_is_one_line_a_failing_exit_and_no_commit() {
    let f = fixture();
    let b = broken_inputs(&f);
    let mut cases = sampler_cases(&f, &b);
    cases.extend(packer_cases(&f, &b));
    cases.extend(trainer_cases(&f, &b));
    refused_in_one_line(&cases);
    assert_eq!(
        std::fs::read(b.foreign.join("notes/mine.txt")).unwrap(),
        b"mine",
        "a refused --overwrite removed a user's file"
    );
}

/// What changes results without failing is said once, on stderr: epochs
/// past the sampled ones reuse them, and a --local-dir a local layout does
/// not need is not used.
#[test]
fn what_changes_results_is_said() {
    let f = fixture();
    let manifest = f.pack.join("manifest.json");
    let staged = f.root.join("staged");
    let r = offgnn_e2e::run_with_env(
        "trainer",
        &[
            "--manifest",
            manifest.to_str().unwrap(),
            "--epochs",
            "3",
            "--max-batches",
            "2",
            "--local-dir",
            staged.to_str().unwrap(),
        ],
        &[("RUST_LOG", "info")],
    );
    assert!(r.status.success(), "{}", r.stderr);
    let said = |what: &str| r.stderr.lines().filter(|l| l.contains(what)).count();
    assert_eq!(
        said("epochs 1..2 reuse the sampled batches"),
        1,
        "{}",
        r.stderr
    );
    assert_eq!(said("--local-dir"), 1, "{}", r.stderr);
    assert!(
        said("is read in place") == 1 && !staged.exists(),
        "{}",
        r.stderr
    );
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
