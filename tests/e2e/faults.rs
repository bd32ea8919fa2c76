//! Faults: a flaky store (injected failures and stalls), an S3 server that
//! dies and comes back mid-run, and programs killed at random points. Retries
//! carry the runs through; a killed sampler or packer leaves nothing
//! committed and a rerun succeeds; a killed trainer resumes from its
//! checkpoint and ends exactly where an uninterrupted run ends.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use offgnn_e2e::{S3, S3Server, binary, run, run_env};

fn generate(dir: &Path, nodes: &str) -> PathBuf {
    offgnn_e2e::generate(
        dir,
        &[
            "--nodes",
            nodes,
            "--feature-dim",
            "16",
            "--classes",
            "4",
            "--train-fraction",
            "0.3",
            "--valid-fraction",
            "0.1",
        ],
    )
}

fn sample_args<'a>(ds: &'a Path, out: &'a str) -> Vec<&'a str> {
    vec![
        "--dataset",
        ds.to_str().unwrap(),
        "--out",
        out,
        "--fanout",
        "4,6",
        "--batch-size",
        "64",
        "--epochs",
        "2",
        "--batches-per-file",
        "2",
    ]
}

fn pack_args<'a>(samples: &'a str, feat: &'a str, out: &'a str) -> Vec<&'a str> {
    vec![
        "--samples",
        samples,
        "--features",
        feat,
        "--out",
        out,
        "--gpu-cache",
        "8K",
        "--cpu-cache",
        "16K",
        "--disk-budget",
        "8x",
    ]
}

/// (name without the run's id, size, checksum) of every file a run names.
fn run_files(dir: &Path) -> Vec<serde_json::Value> {
    let run: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("run.json")).unwrap()).unwrap();
    let prefix = format!("samples/{}/", run["run_id"].as_str().unwrap());
    run["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let name = f["name"].as_str().unwrap().replacen(&prefix, "samples/", 1);
            serde_json::json!([name, f["size"], f["crc32c"]])
        })
        .collect()
}

fn faults(plan: &str) -> Vec<(String, String)> {
    vec![("OFFGNN_STORE_FAULTS".to_string(), plan.to_string())]
}

#[test]
fn transient_store_faults_are_retried_through_the_binaries() {
    let dir = tempfile::tempdir().unwrap();
    let ds = generate(dir.path(), "3000");
    let (clean, flaky) = (dir.path().join("clean"), dir.path().join("flaky"));
    let r = run("sampler", &sample_args(&ds, clean.to_str().unwrap()));
    assert!(r.status.success(), "{}", r.stderr);
    // One request in ten fails, one in twenty stalls (four tries each: a
    // request fails for good once in 10^4; the seed fixes the draws, and
    // seed 5's happen to fail one request four times running).
    let plan = faults("fail=0.1,stall=0.05,stall_ms=20,seed=7");
    let r = run_env("sampler", &sample_args(&ds, flaky.to_str().unwrap()), &plan);
    assert!(r.status.success(), "sampler under faults: {}", r.stderr);
    assert_eq!(
        run_files(&flaky),
        run_files(&clean),
        "faults changed the output"
    );

    let feat = ds.join("data/feat.npy");
    let pack = dir.path().join("pack");
    let r = run_env(
        "packer",
        &pack_args(
            flaky.to_str().unwrap(),
            feat.to_str().unwrap(),
            pack.to_str().unwrap(),
        ),
        &plan,
    );
    assert!(r.status.success(), "packer under faults: {}", r.stderr);
    let manifest = pack.join("manifest.json");
    let r = run(
        "packer",
        &["verify", "--manifest", manifest.to_str().unwrap()],
    );
    assert!(r.status.success(), "verify: {}", r.stderr);

    // A store that always fails: a clear error after the retries, no commit.
    let dead = dir.path().join("dead");
    let r = run_env(
        "sampler",
        &sample_args(&ds, dead.to_str().unwrap()),
        &faults("fail=1.0"),
    );
    assert!(!r.status.success());
    assert!(r.stderr.contains("injected fault"), "{}", r.stderr);
    // One error line beside the warning that fault injection is on.
    let errors: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| !l.contains("fault injection is on"))
        .collect();
    assert_eq!(errors.len(), 1, "{}", r.stderr);
    assert!(!dead.join("run.json").exists());
}

fn spawn(name: &str, args: &[&str], env: &[(String, String)]) -> Child {
    Command::new(binary(name))
        .args(args)
        .env("RUST_LOG", "error")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {name}: {e}"))
}

#[test]
fn an_s3_outage_mid_run_is_retried() {
    let Some(s3) = S3::from_env() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let ds = generate(dir.path(), "3000");
    let mut server = S3Server::start(&s3.bin, "outage");
    // Every request held 100 ms, so the run spans the outage.
    let mut env = server.env();
    env.extend(faults("stall=1.0,stall_ms=100"));
    let out = server.url("samples");
    let started = Instant::now();
    let mut child = spawn("sampler", &sample_args(&ds, &out), &env);
    // The outage starts once the run has put its first samples file.
    let objects = server.root.path().join("outage/samples/samples");
    let sampling = || !offgnn_e2e::files_under(&objects).is_empty();
    offgnn_e2e::wait_until_ready(&mut child, "sampler", "its first samples file", &sampling);
    server.kill();
    std::thread::sleep(Duration::from_millis(1500));
    server.restart();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "the sampler did not ride out a 1.5 s outage: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(server.has("samples/run.json"));
    assert!(started.elapsed() < Duration::from_secs(120));
    // The server gone for good: a clear error, bounded in time, no commit.
    server.kill();
    let started = Instant::now();
    let r = run_env(
        "sampler",
        &sample_args(&ds, &server.url("gone")),
        &server.env(),
    );
    assert!(!r.status.success());
    assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
    assert!(r.stderr.contains("s3://outage/gone"), "{}", r.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(90),
        "took {:?}",
        started.elapsed()
    );
    server.restart();
    assert!(!server.has("gone/run.json"));
}

/// Starts `name`, waits until the files it has written under `dir` (those
/// there before it started do not count) satisfy `enough`, which `stage`
/// describes, and kills it (SIGKILL) there, mid-run.
fn kill_once_written(
    name: &str,
    args: &[&str],
    env: &[(String, String)],
    dir: &Path,
    stage: &str,
    enough: &dyn Fn(&[String]) -> bool,
) {
    let before = offgnn_e2e::files_under(dir);
    let mut child = spawn(name, args, env);
    let written = || {
        let new: Vec<String> = offgnn_e2e::files_under(dir)
            .into_iter()
            .filter(|f| !before.contains(f))
            .collect();
        enough(&new)
    };
    offgnn_e2e::wait_until_ready(&mut child, name, stage, &written);
    child.kill().unwrap();
    let _ = child.wait();
}

#[test]
fn a_killed_sampler_or_packer_leaves_nothing_committed() {
    let dir = tempfile::tempdir().unwrap();
    let ds = generate(dir.path(), "3000");
    let samples = dir.path().join("samples");
    let s = samples.to_str().unwrap();
    // Stalled requests stretch the runs between the points each is
    // killed at: after its first samples file, and after several.
    let slow = faults("stall=1.0,stall_ms=60");
    for files in [1, 5] {
        kill_once_written(
            "sampler",
            &sample_args(&ds, s),
            &slow,
            &samples.join("samples"),
            &format!("its samples file {files}"),
            &|new| new.len() >= files,
        );
        assert!(
            !samples.join("run.json").exists(),
            "killed after {files} samples files, yet committed"
        );
    }
    let r = run("sampler", &sample_args(&ds, s));
    assert!(r.status.success(), "rerun after kills: {}", r.stderr);
    assert!(samples.join("run.json").exists());

    let feat = ds.join("data/feat.npy");
    let pack = dir.path().join("pack");
    let args = pack_args(s, feat.to_str().unwrap(), pack.to_str().unwrap());
    // Once its objects are created, and once it writes address tables.
    let objects = |new: &[String]| !new.is_empty();
    let tables = |new: &[String]| new.iter().any(|f| f.contains("/table-"));
    for (stage, enough) in [
        ("its objects", &objects as &dyn Fn(&[String]) -> bool),
        ("its first address table", &tables),
    ] {
        kill_once_written("packer", &args, &slow, &pack.join("pack"), stage, enough);
        assert!(
            !pack.join("manifest.json").exists(),
            "killed at {stage}, yet committed"
        );
    }
    let r = run("packer", &args);
    assert!(r.status.success(), "rerun after kills: {}", r.stderr);
    let r = run(
        "packer",
        &[
            "verify",
            "--manifest",
            pack.join("manifest.json").to_str().unwrap(),
        ],
    );
    assert!(r.status.success(), "verify after kills: {}", r.stderr);
}

#[test]
fn a_trainer_killed_mid_epoch_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let ds = generate(dir.path(), "6000");
    let samples = dir.path().join("samples");
    let r = run("sampler", &sample_args(&ds, samples.to_str().unwrap()));
    assert!(r.status.success(), "{}", r.stderr);
    let pack = dir.path().join("pack");
    let feat = ds.join("data/feat.npy");
    let r = run(
        "packer",
        &pack_args(
            samples.to_str().unwrap(),
            feat.to_str().unwrap(),
            pack.to_str().unwrap(),
        ),
    );
    assert!(r.status.success(), "{}", r.stderr);
    let manifest = pack.join("manifest.json");
    let m = manifest.to_str().unwrap();
    let base = [
        "--manifest",
        m,
        "--model",
        "gat",
        "--hidden",
        "256",
        "--epochs",
        "3",
    ];
    // One thread for libtorch in every run: with more, identical runs of
    // this training can differ in the last digits of a loss (the threads'
    // sums add in varying order), and the comparison would test the
    // threads' timing, not the resume.
    let one_thread = [("OMP_NUM_THREADS".to_string(), "1".to_string())];
    let straight = run_env("trainer", &base, &one_thread);
    assert!(straight.status.success(), "{}", straight.stderr);

    let ckpt = dir.path().join("ckpt");
    let c = ckpt.to_str().unwrap();
    let mut args = base.to_vec();
    args.extend(["--checkpoint-dir", c, "--checkpoint-every", "2"]);
    // Kill it as soon as a checkpoint taken inside epoch 1 is committed.
    let mut child = spawn("trainer", &args, &one_thread);
    let started = Instant::now();
    let position = loop {
        let meta: Option<serde_json::Value> = std::fs::read(ckpt.join("checkpoint.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        if let Some(meta) = meta
            && meta["epoch"] == 1
            && !meta["in_epoch"].is_null()
        {
            child.kill().unwrap();
            break meta["in_epoch"]["batches"].as_u64().unwrap();
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the trainer finished before it was killed"
        );
        assert!(started.elapsed() < Duration::from_secs(120));
        std::thread::sleep(Duration::from_millis(2));
    };
    let _ = child.wait();
    assert!(position >= 2);
    let mut resume = args.clone();
    resume.push("--resume");
    let resumed = run_env("trainer", &resume, &one_thread);
    assert!(resumed.status.success(), "{}", resumed.stderr);
    let s = &resumed.json()["summary"];
    assert_eq!(s["resumed_from"][0], 1);
    let losses = |j: &serde_json::Value| -> Vec<(u64, f64)> {
        j["summary"]["epochs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["batches"].as_u64().unwrap(), e["loss"].as_f64().unwrap()))
            .collect()
    };
    assert_eq!(
        losses(&resumed.json()),
        losses(&straight.json()),
        "resumed at batch {position}"
    );
}

/// A run crashed (`OFFGNN_FAULT_AT`, which aborts) at each phase boundary
/// of its commit (issue 19): `objects-written` leaves the previous output
/// whole (or nothing, where there was none); `committed` leaves the new
/// one whole; `replaced-removed` too, where the program marks it. Never a
/// mix; and a rerun with --overwrite succeeds over what the crash left.
struct Phases<'a> {
    program: &'a str,
    /// The command line, without --overwrite.
    args: Vec<String>,
    /// What identifies the committed output (its commit object), if any.
    commit: &'a dyn Fn() -> Option<Vec<u8>>,
    /// Whether the program marks `replaced-removed` (the caller that
    /// removes the replaced objects calls the fault point).
    marks_removal: bool,
    /// Asserts that the committed output is whole.
    whole: &'a dyn Fn(),
}

const PHASES: [&str; 3] = ["objects-written", "committed", "replaced-removed"];

/// Runs `p` under `OFFGNN_FAULT_AT=phase`, with --overwrite if `overwrite`.
fn crash_at(p: &Phases, phase: &str, overwrite: bool) -> offgnn_e2e::Run {
    let mut args: Vec<&str> = p.args.iter().map(String::as_str).collect();
    if overwrite {
        args.push("--overwrite");
    }
    run_env(
        p.program,
        &args,
        &[("OFFGNN_FAULT_AT".to_string(), phase.to_string())],
    )
}

fn aborted(r: &offgnn_e2e::Run) -> bool {
    use std::os::unix::process::ExitStatusExt;
    r.status.signal() == Some(6)
}

fn crash_at_every_phase(p: &Phases) {
    let read = p.commit;
    let label = match p.args.first() {
        Some(sub) if !sub.starts_with('-') => format!("{} {sub}", p.program),
        _ => p.program.to_string(),
    };
    let started = Instant::now();
    // Nothing there: a crash before the commit leaves nothing.
    let r = crash_at(p, "objects-written", false);
    assert!(aborted(&r), "{}: no crash: {}", label, r.stderr);
    assert!(read().is_none(), "{}: committed, yet crashed", label);
    // What the crash left does not stop a run.
    let args: Vec<&str> = p.args.iter().map(String::as_str).collect();
    let r = run(p.program, &args);
    assert!(r.status.success(), "{} after a crash: {}", label, r.stderr);
    (p.whole)();
    let mut before = read().unwrap();
    for phase in PHASES {
        let r = crash_at(p, phase, true);
        let fires = phase != "replaced-removed" || p.marks_removal;
        if fires {
            assert!(aborted(&r), "{} {phase}: no crash: {}", label, r.stderr);
        } else {
            assert!(r.status.success(), "{} {phase}: {}", label, r.stderr);
        }
        let now = read().unwrap_or_else(|| panic!("{} {phase}: no commit left", label));
        // Compared as text: a failure shows JSON, not bytes.
        let (now_text, before_text) = (
            String::from_utf8_lossy(&now),
            String::from_utf8_lossy(&before),
        );
        if phase == "objects-written" {
            assert_eq!(
                now_text, before_text,
                "{} {phase}: the previous commit changed",
                label
            );
        } else if fires {
            assert_ne!(
                now_text, before_text,
                "{} {phase}: the new run did not commit",
                label
            );
        }
        // Where the phase is not marked the run went through.
        (p.whole)();
        before = now;
    }
    let mut args = args;
    args.push("--overwrite");
    let r = run(p.program, &args);
    assert!(
        r.status.success(),
        "{} after the crashes: {}",
        label,
        r.stderr
    );
    (p.whole)();
    eprintln!(
        "faults: {} crashed at every phase in {:.1} s",
        label,
        started.elapsed().as_secs_f64()
    );
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| a.to_string()).collect()
}

#[test]
fn a_crash_at_each_commit_phase_leaves_datasets_samples_and_layouts_whole() {
    let dir = tempfile::tempdir().unwrap();
    let ds = generate(dir.path(), "3000");
    // A dataset is committed by renaming its directory into place: its
    // inode tells which one is there.
    let written = dir.path().join("written");
    let dataset_whole = || {
        let r = run(
            "sampler",
            &["inspect", "--dataset", written.to_str().unwrap()],
        );
        assert!(r.status.success(), "dataset not whole: {}", r.stderr);
    };
    crash_at_every_phase(&Phases {
        program: "sampler",
        args: strings(&[
            "generate",
            "--out",
            written.to_str().unwrap(),
            "--nodes",
            "2000",
            "--feature-dim",
            "8",
        ]),
        // The dataset in place, told apart by its directory's inode and
        // its creation time to the nanosecond: an inode freed by one run's
        // removal of the replaced dataset can come back for a later run's.
        commit: &|| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(written.join("metadata.yaml"))
                .ok()
                .and_then(|m| Some((m, std::fs::metadata(&written).ok()?)))
                .map(|(file, dir)| {
                    format!("{} {} {}", dir.ino(), file.mtime(), file.mtime_nsec()).into_bytes()
                })
        },
        marks_removal: false,
        whole: &dataset_whole,
    });
    // What the crashes left beside it (.written.partial-PID) went with
    // the next run.
    let partials = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(".partial-"))
        .count();
    assert_eq!(partials, 0);

    let samples = dir.path().join("samples");
    let s = samples.to_str().unwrap();
    // The sampler's own check: every file the run names, its size and
    // checksum, and the batches it holds.
    let samples_whole = || {
        let store = offgnn_shared::store::Store::open(s).unwrap();
        let run = offgnn_shared::samples::RunSummary::read(&store).unwrap();
        assert!(!run.files.is_empty());
        for f in &run.files {
            offgnn_shared::samples::read_file(&store, f)
                .unwrap_or_else(|e| panic!("samples not whole: {e}"));
        }
    };
    crash_at_every_phase(&Phases {
        program: "sampler",
        args: strings(&sample_args(&ds, s)),
        commit: &|| std::fs::read(samples.join("run.json")).ok(),
        marks_removal: true,
        whole: &samples_whole,
    });

    let feat = ds.join("data/feat.npy");
    let pack = dir.path().join("pack");
    let manifest = pack.join("manifest.json");
    let layout_whole = || {
        let r = run(
            "packer",
            &["verify", "--manifest", manifest.to_str().unwrap()],
        );
        assert!(r.status.success(), "layout not whole: {}", r.stderr);
    };
    crash_at_every_phase(&Phases {
        program: "packer",
        args: strings(&pack_args(
            s,
            feat.to_str().unwrap(),
            pack.to_str().unwrap(),
        )),
        commit: &|| std::fs::read(&manifest).ok(),
        marks_removal: true,
        whole: &layout_whole,
    });
}

#[test]
fn a_crash_at_each_commit_phase_leaves_exports_and_predictions_whole() {
    let dir = tempfile::tempdir().unwrap();
    let ds = generate(dir.path(), "3000");
    let samples = dir.path().join("samples");
    let s = samples.to_str().unwrap();
    let r = run("sampler", &sample_args(&ds, s));
    assert!(r.status.success(), "{}", r.stderr);
    let feat = ds.join("data/feat.npy");
    let pack = dir.path().join("pack");
    let r = run(
        "packer",
        &pack_args(s, feat.to_str().unwrap(), pack.to_str().unwrap()),
    );
    assert!(r.status.success(), "{}", r.stderr);
    let ckpt = dir.path().join("ckpt");
    let r = run(
        "trainer",
        &[
            "--manifest",
            pack.join("manifest.json").to_str().unwrap(),
            "--epochs",
            "1",
            "--hidden",
            "16",
            "--max-batches",
            "2",
            "--checkpoint-dir",
            ckpt.to_str().unwrap(),
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);

    let export = dir.path().join("export");
    let x = export.to_str().unwrap();
    // show-model reads the card and checks the weights against its checksum.
    let export_whole = || {
        let r = run("trainer", &["show-model", "--model", x]);
        assert!(r.status.success(), "export not whole: {}", r.stderr);
    };
    crash_at_every_phase(&Phases {
        program: "trainer",
        args: strings(&[
            "export",
            "--checkpoint-dir",
            ckpt.to_str().unwrap(),
            "--out",
            x,
        ]),
        commit: &|| std::fs::read(export.join("model.json")).ok(),
        marks_removal: true,
        whole: &export_whole,
    });

    let preds = dir.path().join("preds");
    let work = dir.path().join("work");
    // Every part the commit names is there.
    let preds_whole = || {
        let commit: serde_json::Value =
            serde_json::from_slice(&std::fs::read(preds.join("_SUCCESS.json")).unwrap()).unwrap();
        let files = commit["files"].as_array().unwrap();
        assert!(!files.is_empty(), "{commit}");
        for f in files {
            let path = preds.join(f.as_str().unwrap());
            let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            assert!(
                len > 0,
                "predictions not whole: {} is missing",
                path.display()
            );
        }
    };
    crash_at_every_phase(&Phases {
        program: "trainer",
        args: strings(&[
            "infer",
            "--model",
            x,
            "--dataset",
            ds.to_str().unwrap(),
            "--out",
            preds.to_str().unwrap(),
            "--work-dir",
            work.to_str().unwrap(),
            "--nodes",
            "test",
        ]),
        commit: &|| std::fs::read(preds.join("_SUCCESS.json")).ok(),
        marks_removal: true,
        whole: &preds_whole,
    });
}

/// The run directories (named by run ids) under `dir`, sorted.
fn run_dirs(dir: &Path) -> Vec<String> {
    let mut runs: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| offgnn_shared::commit::RunId::is_run_id(n))
                .collect()
        })
        .unwrap_or_default();
    runs.sort();
    runs
}

/// The runs a summary's `leftovers_removed` names.
fn removed_runs(leftovers: &serde_json::Value) -> Vec<String> {
    leftovers["runs"]
        .as_array()
        .unwrap_or_else(|| panic!("no runs in {leftovers}"))
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect()
}

/// Issue 40: a run killed before its commit leaves its objects (samples,
/// a layout's segments, inference parts); the next run of the same kind at
/// that location removes them, since no process holds the killed run's
/// lease, and says so in its summary. A killed inference run whose parts
/// went that way starts over when it is run again.
#[test]
fn what_a_run_killed_before_its_commit_wrote_goes_with_the_next_run() {
    let dir = tempfile::tempdir().unwrap();
    let ds = generate(dir.path(), "3000");
    let crash = [("OFFGNN_FAULT_AT".to_string(), "objects-written".to_string())];
    // Crashes `program args` before its commit, runs it again, and checks
    // that the rerun removed the crashed run's directory under `runs`.
    let crash_then_run = |program: &str, args: &[&str], runs: &Path| -> offgnn_e2e::Run {
        let r = run_env(program, args, &crash);
        assert!(aborted(&r), "{program}: no crash: {}", r.stderr);
        let killed = run_dirs(runs);
        assert_eq!(killed.len(), 1, "{program}: {killed:?}");
        let r = run(program, args);
        assert!(r.status.success(), "{program}: {}", r.stderr);
        let left = run_dirs(runs);
        assert!(
            left.len() == 1 && left != killed,
            "{program}: {left:?} left, {killed:?} crashed"
        );
        let json = r.json();
        let leftovers = json
            .get("leftovers_removed")
            .unwrap_or(&json["summary"]["leftovers_removed"]);
        assert_eq!(removed_runs(leftovers), killed, "{program}: {}", r.stderr);
        r
    };

    let samples = dir.path().join("samples");
    let s = samples.to_str().unwrap();
    crash_then_run("sampler", &sample_args(&ds, s), &samples.join("samples"));

    let feat = ds.join("data/feat.npy");
    let pack = dir.path().join("pack");
    let args = pack_args(s, feat.to_str().unwrap(), pack.to_str().unwrap());
    crash_then_run("packer", &args, &pack.join("pack"));

    let export = dir.path().join("export");
    offgnn_e2e::export_small_model(&pack.join("manifest.json"), &export);
    let x = export.to_str().unwrap();

    // The case: the crashed run's parts, then a run of other
    // outputs in another work directory.
    let preds = dir.path().join("preds");
    let p = preds.to_str().unwrap();
    let infer = |work: &str, more: &[&str]| -> Vec<String> {
        let work = dir.path().join(work);
        let mut args = vec![
            "infer",
            "--model",
            x,
            "--dataset",
            ds.to_str().unwrap(),
            "--out",
            p,
            "--nodes",
            "test",
        ];
        args.extend_from_slice(&["--work-dir", work.to_str().unwrap()]);
        args.extend_from_slice(more);
        args.into_iter().map(str::to_string).collect()
    };
    let first = infer("work-1", &[]);
    let first: Vec<&str> = first.iter().map(String::as_str).collect();
    let r = run_env("trainer", &first, &crash);
    assert!(aborted(&r), "no crash: {}", r.stderr);
    let killed = run_dirs(&preds);
    assert_eq!(killed.len(), 1, "{killed:?}");
    let other = infer("work-2", &["--outputs", "class,probabilities"]);
    let other: Vec<&str> = other.iter().map(String::as_str).collect();
    let r = run("trainer", &other);
    assert!(r.status.success(), "{}", r.stderr);
    assert_eq!(
        removed_runs(&r.json()["summary"]["leftovers_removed"]),
        killed
    );
    let committed = r.json()["summary"]["run_id"].as_str().unwrap().to_string();
    assert_eq!(run_dirs(&preds), vec![committed]);

    // The crashed run again, in its own work directory: its progress names
    // parts that are gone, so it starts over, and commits them all.
    let mut again = first.clone();
    again.push("--overwrite");
    let r = run("trainer", &again);
    assert!(r.status.success(), "{}", r.stderr);
    assert!(r.stderr.contains("starting over"), "{}", r.stderr);
    let summary = &r.json()["summary"];
    let files = summary["files"].as_array().unwrap();
    assert!(!files.is_empty());
    for f in files {
        assert!(preds.join(f.as_str().unwrap()).is_file(), "{f} is missing");
    }
    assert_ne!(summary["run_id"].as_str(), Some(killed[0].as_str()));
}
