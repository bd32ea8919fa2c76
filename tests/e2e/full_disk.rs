//! A full disk (issue 19, item 6), on small tmpfs file systems the tests
//! mount: the packer refuses a layout the disk cannot hold before writing
//! any of it, with the figures; the sampler whose disk fills mid-run fails
//! in one line and removes what it wrote; a checkpoint that does not fit
//! fails in one line, naming the space, and leaves no partial file; an
//! inference whose output does not fit commits nothing.

use std::path::Path;

use offgnn_e2e::{Run, SmallFs, assert_one_line, run};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Every file under `dir`, relative (none when it is absent).
fn files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            if e.path().is_dir() {
                todo.push(e.path());
            } else {
                out.push(e.path().strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

/// A graph, its samples (on the ordinary disk) and the packer's flags.
fn sampled(dir: &Path, nodes: &str, dim: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let ds = offgnn_e2e::generate(
        dir,
        &["--nodes", nodes, "--feature-dim", dim, "--classes", "4"],
    );
    let samples = dir.join("samples");
    let r = run(
        "sampler",
        &[
            "--dataset",
            s(&ds),
            "--out",
            s(&samples),
            "--fanout",
            "5,5",
            "--batch-size",
            "256",
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);
    (ds, samples)
}

/// The packer over `sampled`'s graph and samples into `out`, with small
/// caches and `budget` of disk, with extra environment variables `env`.
fn pack_with(ds: &Path, samples: &Path, out: &str, budget: &str, env: &[(String, String)]) -> Run {
    offgnn_e2e::run_env(
        "packer",
        &[
            "--samples",
            s(samples),
            "--features",
            s(&ds.join("data/feat.npy")),
            "--out",
            out,
            "--gpu-cache",
            "64K",
            "--cpu-cache",
            "64K",
            "--disk-budget",
            budget,
        ],
        env,
    )
}

/// [`sampled`], packed on the ordinary disk into `dir/pack` with small
/// caches: the graph and the pack.
fn packed(dir: &Path, nodes: &str, dim: &str) -> (std::path::PathBuf, std::path::PathBuf) {
    let (ds, samples) = sampled(dir, nodes, dim);
    let pack = dir.join("pack");
    let r = pack_with(&ds, &samples, s(&pack), "8x", &[]);
    assert!(r.status.success(), "{}", r.stderr);
    (ds, pack)
}

#[test]
fn the_packer_refuses_a_layout_the_disk_cannot_hold() {
    let Some(fs) = SmallFs::mount(4 << 20) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // 20000 x 128 float32: 10 MB of features, a layout of several times that.
    let (ds, samples) = sampled(dir.path(), "20000", "128");
    let out = fs.path().join("pack");
    let r = pack_with(&ds, &samples, s(&out), "4x", &[]);
    assert_one_line(
        &r,
        "free, the layout (feature rows and address tables) needs",
    );
    assert!(files(fs.path()).is_empty(), "{:?}", files(fs.path()));
}

#[test]
fn a_sampler_whose_disk_fills_removes_what_it_wrote() {
    let Some(fs) = SmallFs::mount(1 << 20) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ds = offgnn_e2e::generate(
        dir.path(),
        &["--nodes", "50000", "--feature-dim", "4", "--classes", "4"],
    );
    let out = fs.path().join("samples");
    let r = run(
        "sampler",
        &[
            "--dataset",
            s(&ds),
            "--out",
            s(&out),
            "--fanout",
            "10,10",
            "--batch-size",
            "256",
            "--epochs",
            "4",
        ],
    );
    assert_one_line(&r, "No space left on device");
    // Told apart by its kind (not its text): the line says how full the
    // disk is and what went.
    assert!(
        r.stderr.contains("free there") && r.stderr.contains("removed the"),
        "{}",
        r.stderr
    );
    assert!(files(&out).is_empty(), "left behind: {:?}", files(&out));
}

#[test]
fn a_checkpoint_that_does_not_fit_keeps_nothing_partial() {
    let Some(fs) = SmallFs::mount(64 << 10) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (_, pack) = packed(dir.path(), "3000", "64");
    let ckpt = fs.path().join("ckpt");
    // 64 x 256 + 256 x 4 parameters, Adam's two moments and the best
    // epoch's copy: about 300 KB, over the 64 KiB there.
    let r = run(
        "trainer",
        &[
            "--manifest",
            s(&pack.join("manifest.json")),
            "--epochs",
            "1",
            "--hidden",
            "256",
            "--checkpoint-dir",
            s(&ckpt),
        ],
    );
    assert_one_line(&r, "free, a checkpoint needs about");
    let left: Vec<String> = files(&ckpt).into_iter().filter(|f| f != ".lock").collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Staging a remote layout onto a disk that cannot hold it is refused
/// before any download, with the figures; nothing is left there.
#[test]
fn staging_onto_a_disk_too_small_is_refused_up_front() {
    let Some(s3) = offgnn_e2e::S3::from_env() else {
        return;
    };
    let Some(fs) = SmallFs::mount(1 << 20) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (ds, samples) = sampled(dir.path(), "20000", "64");
    let env = s3.env();
    let pack = s3.url(&format!("staging-{}/pack", std::process::id()));
    let r = pack_with(&ds, &samples, &pack, "4x", &env);
    assert!(r.status.success(), "{}", r.stderr);
    let local = fs.path().join("stage");
    let r = offgnn_e2e::run_env(
        "trainer",
        &[
            "--manifest",
            &format!("{pack}/manifest.json"),
            "--local-dir",
            s(&local),
            "--epochs",
            "1",
        ],
        &env,
    );
    assert_one_line(&r, "staging the layout needs");
    assert!(files(&local).is_empty(), "{:?}", files(&local));
}

/// `trainer infer` whose --out fills as its parts are stored fails in one
/// line naming the space and what a rerun resumes from, commits nothing,
/// and leaves no staging file there.
#[test]
fn inference_whose_output_does_not_fit_commits_nothing() {
    let Some(fs) = SmallFs::mount(1 << 20) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (ds, pack) = packed(dir.path(), "20000", "64");
    let export = dir.path().join("export");
    offgnn_e2e::export_small_model(&pack.join("manifest.json"), &export);
    // 20000 rows of a class, 4 probabilities and a 64-d embedding: about
    // 5.8 MB of Parquet, over the 1 MiB there.
    let preds = fs.path().join("preds");
    let r = run(
        "trainer",
        &[
            "infer",
            "--model",
            s(&export),
            "--dataset",
            s(&ds),
            "--out",
            s(&preds),
            "--work-dir",
            s(&dir.path().join("work")),
            "--outputs",
            "class,probabilities,embeddings",
        ],
    );
    assert_one_line(&r, "No space left on device");
    assert!(
        r.stderr
            .contains("the disk is full; the groups finished so far are kept in")
            && r.stderr.contains("run the same command again to resume"),
        "{}",
        r.stderr
    );
    let left = files(&preds);
    assert!(
        !left
            .iter()
            .any(|f| f.contains("_SUCCESS") || f.contains('#')),
        "left behind: {left:?}"
    );
}
