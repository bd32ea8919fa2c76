//! SIGINT and SIGTERM mid-run (issue 19, item 7): each program stops within
//! a few seconds with one line saying what it kept, and exits with 128 + the
//! signal's number. The sampler and packer remove what they wrote (a
//! committed output stays whole); the trainer keeps a checkpoint that a
//! resume continues from.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use offgnn_e2e::{binary, files_under, run, wait_until_ready};

/// What a run stopped by a signal showed.
struct Stopped {
    code: Option<i32>,
    stderr: String,
    /// From the signal to the exit.
    seconds: f64,
}

/// Starts `program`, waits until `ready` says it has reached `stage`,
/// sends it `signals` (`TERM`, `INT`) in turn, and waits for it to end.
/// Fails the test when it ended before the stage (the workload is then too
/// small to test anything) or never reached it.
fn stop_when(
    program: &str,
    args: &[&str],
    stage: &str,
    ready: &dyn Fn() -> bool,
    signals: &[&str],
) -> Stopped {
    let mut child = Command::new(binary(program))
        .args(args)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
    wait_until_ready(&mut child, program, stage, ready);
    let sent = Instant::now();
    for s in signals {
        let status = Command::new("kill")
            .args([format!("-{s}"), child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{s}");
    }
    let out = child.wait_with_output().unwrap();
    Stopped {
        code: out.status.code(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        seconds: sent.elapsed().as_secs_f64(),
    }
}

/// Two SIGINTs once `program` has reached `stage`: the second ends it at
/// once, cleanup or not.
fn a_second_sigint_exits_at_once(
    program: &str,
    args: &[&str],
    stage: &str,
    ready: &dyn Fn() -> bool,
) {
    let st = stop_when(program, args, stage, ready, &["INT", "INT"]);
    assert_eq!(st.code, Some(130), "{}", st.stderr);
    assert!(st.seconds < 2.0, "took {:.1} s", st.seconds);
}

/// One line, naming the signal and `kept`, within a few seconds, with the
/// signal's exit status.
fn stopped_well(s: &Stopped, signal: &str, code: i32, kept: &str) {
    assert_eq!(s.code, Some(code), "{}", s.stderr);
    assert_eq!(s.stderr.trim().lines().count(), 1, "{}", s.stderr);
    assert!(
        s.stderr.contains(&format!("stopped by {signal}")) && s.stderr.contains(kept),
        "{}",
        s.stderr
    );
    eprintln!("signals: stopped by {signal} in {:.2} s", s.seconds);
    // A few seconds; the bound leaves room for a loaded CI machine.
    assert!(s.seconds < 8.0, "took {:.1} s to stop", s.seconds);
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A graph whose sampling and packing take seconds, not milliseconds.
fn big_graph(dir: &Path) -> std::path::PathBuf {
    offgnn_e2e::generate(
        dir,
        &[
            "--nodes",
            "300000",
            "--feature-dim",
            "128",
            "--classes",
            "8",
        ],
    )
}

#[test]
fn the_sampler_stops_and_removes_what_it_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let ds = big_graph(dir.path());
    let out = dir.path().join("samples");
    let args = [
        "--dataset",
        s(&ds),
        "--out",
        s(&out),
        "--fanout",
        "10,10",
        "--batch-size",
        "256",
        "--epochs",
        "12",
    ];
    // Sampling has begun once its first samples file is written.
    let stage = "its first samples file";
    let sampling = || !files_under(&out.join("samples")).is_empty();
    let st = stop_when("sampler", &args, stage, &sampling, &["TERM"]);
    stopped_well(&st, "SIGTERM", 143, "removed the");
    assert!(!out.join("run.json").exists());
    let left: Vec<_> = files_under(&out.join("samples"));
    assert!(left.is_empty(), "left behind: {left:?}");

    // One SIGINT: the same cleanup.
    let st = stop_when("sampler", &args, stage, &sampling, &["INT"]);
    stopped_well(&st, "SIGINT", 130, "removed the");
    assert!(!out.join("run.json").exists());
    let left: Vec<_> = files_under(&out.join("samples"));
    assert!(left.is_empty(), "left behind: {left:?}");

    a_second_sigint_exits_at_once("sampler", &args, stage, &sampling);
}

#[test]
fn the_packer_stops_removes_its_objects_and_keeps_a_committed_layout() {
    let dir = tempfile::tempdir().unwrap();
    let ds = big_graph(dir.path());
    let samples = dir.path().join("samples");
    let r = run(
        "sampler",
        &[
            "--dataset",
            s(&ds),
            "--out",
            s(&samples),
            "--fanout",
            "10,10",
            "--batch-size",
            "256",
            "--epochs",
            "3",
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);
    let out = dir.path().join("pack");
    let feat = ds.join("data/feat.npy");
    let mut args = vec![
        "--samples",
        s(&samples),
        "--features",
        s(&feat),
        "--out",
        s(&out),
        "--gpu-cache",
        "1M",
        "--cpu-cache",
        "4M",
        "--disk-budget",
        "4x",
    ];
    // Packing has begun once the run's objects are created under pack/.
    let stage = "the packing of its objects";
    let packing = || !files_under(&out.join("pack")).is_empty();
    let st = stop_when("packer", &args, stage, &packing, &["INT"]);
    stopped_well(&st, "SIGINT", 130, "removed the objects this run wrote");
    assert!(!out.join("manifest.json").exists());
    assert!(files_under(&out.join("pack")).is_empty());

    // Over a committed layout, a stopped --overwrite leaves it whole.
    let r = run("packer", &args);
    assert!(r.status.success(), "{}", r.stderr);
    let before = files_under(&out.join("pack"));
    args.push("--overwrite");
    // This run's objects go beside the committed layout's.
    let packing = || files_under(&out.join("pack")) != before;
    let st = stop_when("packer", &args, stage, &packing, &["TERM"]);
    stopped_well(&st, "SIGTERM", 143, "is untouched");
    assert_eq!(files_under(&out.join("pack")), before);
    let manifest = out.join("manifest.json");
    let r = run("packer", &["verify", "--manifest", s(&manifest)]);
    assert!(r.status.success(), "{}", r.stderr);
}

/// A small layout: 3000 nodes, 16-d features; returns its manifest.
fn small_layout(dir: &Path) -> std::path::PathBuf {
    let ds = offgnn_e2e::generate(
        dir,
        &["--nodes", "3000", "--feature-dim", "16", "--classes", "4"],
    );
    layout(dir, &ds, "64", ("16K", "32K"))
}

/// Samples `ds` (fan-out 3,3, batches of `batch_size`) and packs it under
/// `dir` with the GPU and CPU caches `caches` and an 8x disk budget;
/// returns the manifest.
fn layout(dir: &Path, ds: &Path, batch_size: &str, caches: (&str, &str)) -> std::path::PathBuf {
    let samples = dir.join("samples");
    let pack = dir.join("pack");
    let ok = |r: offgnn_e2e::Run| assert!(r.status.success(), "{}", r.stderr);
    ok(run(
        "sampler",
        &[
            "--dataset",
            s(ds),
            "--out",
            s(&samples),
            "--fanout",
            "3,3",
            "--batch-size",
            batch_size,
        ],
    ));
    let feat = ds.join("data/feat.npy");
    ok(run(
        "packer",
        &[
            "--samples",
            s(&samples),
            "--features",
            s(&feat),
            "--out",
            s(&pack),
            "--gpu-cache",
            caches.0,
            "--cpu-cache",
            caches.1,
            "--disk-budget",
            "8x",
        ],
    ));
    pack.join("manifest.json")
}

/// Trains on `manifest` with checkpoints in `ckpt` until `signal` (`TERM`
/// or `INT`) stops it; checks the one line and that a resume finishes
/// the interrupted epoch and one more.
fn trainer_stops_and_resumes(manifest: &Path, ckpt: &Path, signal: &str) {
    let train = |epochs: &str, extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = [
            "--manifest",
            s(manifest),
            "--hidden",
            "16",
            "--epochs",
            epochs,
            "--checkpoint-dir",
            s(ckpt),
            "--checkpoint-every",
            "3",
        ]
        .map(String::from)
        .to_vec();
        a.extend(extra.iter().map(|x| x.to_string()));
        a
    };
    let args = train("1000", &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // Training has begun once the first checkpoint (batch 3) is kept.
    let training = || ckpt.join("checkpoint.json").exists();
    let st = stop_when(
        "trainer",
        &args,
        "its first checkpoint",
        &training,
        &[signal],
    );
    let (name, code) = if signal == "TERM" {
        ("SIGTERM", 143)
    } else {
        ("SIGINT", 130)
    };
    stopped_well(&st, name, code, "run again with --resume");
    // "… at epoch T, batch B: …" or "… after epoch T: …": the resume
    // finishes epoch T (and, after a finished epoch, one more).
    let epoch: u32 = st
        .stderr
        .split("epoch ")
        .nth(1)
        .and_then(|rest| rest.split([',', ':']).next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no epoch in {}", st.stderr));
    let resume = train(&(epoch + 2).to_string(), &["--resume"]);
    let resume: Vec<&str> = resume.iter().map(String::as_str).collect();
    let r = run("trainer", &resume);
    assert!(r.status.success(), "{}", r.stderr);
    let j = &r.json()["summary"];
    assert_eq!(
        j["epochs"].as_array().unwrap().len() as u32,
        epoch + 2,
        "{j}"
    );
    assert!(!j["resumed_from"].is_null(), "{j}");
}

#[test]
fn the_trainer_stops_with_a_checkpoint_that_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = small_layout(dir.path());
    trainer_stops_and_resumes(&manifest, &dir.path().join("ckpt"), "TERM");
}

/// A typed run (R-SAGE) stops as a homogeneous one: at the next step or
/// epoch boundary, with a checkpoint of it that resumes.
#[test]
fn the_typed_trainer_stops_with_a_checkpoint_that_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let pack = offgnn_e2e::typed_pack(dir.path());
    trainer_stops_and_resumes(&pack.join("manifest.json"), &dir.path().join("ckpt"), "INT");
}

/// SIGINT (Ctrl-C) as SIGTERM: a checkpoint at the next batch boundary
/// that resumes. A second SIGINT ends the run at once.
#[test]
fn the_trainer_stops_on_sigint_and_a_second_exits_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = small_layout(dir.path());
    trainer_stops_and_resumes(&manifest, &dir.path().join("ckpt"), "INT");
    // Without a checkpoint directory, the metrics of a first finished epoch
    // say that training is under way.
    let metrics = dir.path().join("metrics.jsonl");
    let an_epoch_done = || std::fs::read(&metrics).is_ok_and(|b| b.contains(&b'\n'));
    a_second_sigint_exits_at_once(
        "trainer",
        &[
            "--manifest",
            s(&manifest),
            "--hidden",
            "16",
            "--epochs",
            "1000",
            "--metrics",
            s(&metrics),
        ],
        "its first epoch's metrics",
        &an_epoch_done,
    );
}

/// `trainer infer` stops after its current group on SIGTERM, keeps the
/// groups it finished in its work directory, and the same command run
/// again resumes from them and commits the whole result.
#[test]
fn inference_stops_and_a_rerun_resumes() {
    let dir = tempfile::tempdir().unwrap();
    // 200K nodes of degree 40 in 11 groups a layer (--memory 860M, 30 MB
    // above what the run needs before any group).
    let ds = offgnn_e2e::generate(
        dir.path(),
        &[
            "--nodes",
            "200000",
            "--avg-degree",
            "40",
            "--feature-dim",
            "32",
            "--classes",
            "8",
            "--train-fraction",
            "0.003",
            "--valid-fraction",
            "0.001",
            "--test-fraction",
            "0.001",
        ],
    );
    let manifest = layout(dir.path(), &ds, "128", ("0", "0"));
    let export = dir.path().join("export");
    offgnn_e2e::export_small_model(&manifest, &export);
    let (preds, work) = (dir.path().join("preds"), dir.path().join("work"));
    let args = [
        "infer",
        "--model",
        s(&export),
        "--dataset",
        s(&ds),
        "--out",
        s(&preds),
        "--work-dir",
        s(&work),
        "--nodes",
        "all",
        "--memory",
        "860M",
    ];
    // Once the work directory records a finished group.
    let a_group_done = || {
        std::fs::read(work.join("progress.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|p| {
                p["groups_done"].as_u64().unwrap_or(0) > 0 || p["layer"].as_u64().unwrap_or(0) > 0
            })
    };
    let st = stop_when(
        "trainer",
        &args,
        "its first finished group",
        &a_group_done,
        &["TERM"],
    );
    stopped_well(&st, "SIGTERM", 143, "run the same command again to resume");
    assert!(!preds.join("_SUCCESS.json").exists());
    let r = run("trainer", &args);
    assert!(r.status.success(), "{}", r.stderr);
    let j = &r.json()["summary"];
    assert_eq!(j["nodes_written"], 200000, "{j}");
    let resumed: u64 = j["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["groups_resumed"].as_u64().unwrap_or(0))
        .sum();
    assert!(resumed > 0, "the rerun resumed no group: {j}");
    assert!(preds.join("_SUCCESS.json").exists());
}

/// `sampler generate` and `import-parquet` stop on SIGINT and SIGTERM
/// with one line, and remove their partial dataset (`.NAME.partial-PID`);
/// a dataset already at --out is untouched. A partial dataset a killed
/// run left is removed by the next run.
#[test]
fn dataset_writing_stops_and_removes_its_partial_directory() {
    let dir = tempfile::tempdir().unwrap();
    let partials = || -> Vec<String> {
        std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".partial-"))
            .collect()
    };
    // Files written into a partial dataset: its writing has begun.
    let writing = || {
        partials()
            .iter()
            .any(|p| !files_under(&dir.path().join(p)).is_empty())
    };
    // 4M nodes, 32-d: enough writing that the signal lands within it.
    let big = dir.path().join("big");
    let generate = [
        "generate",
        "--out",
        s(&big),
        "--nodes",
        "4000000",
        "--feature-dim",
        "32",
    ];
    for (signal, name, code) in [("INT", "SIGINT", 130), ("TERM", "SIGTERM", 143)] {
        let st = stop_when(
            "sampler",
            &generate,
            "the writing of its partial dataset",
            &writing,
            &[signal],
        );
        stopped_well(&st, name, code, "removed the partial dataset");
        assert!(!big.exists());
        assert_eq!(partials(), Vec::<String>::new());
    }

    // Import: the node table is a FIFO nobody writes, so the run waits
    // on it with its partial dataset started; over a dataset of its own
    // with --overwrite.
    let small = offgnn_e2e::generate(dir.path(), &["--nodes", "300", "--feature-dim", "4"]);
    let meta = std::fs::read(small.join("metadata.yaml")).unwrap();
    let fifo = dir.path().join("nodes.parquet");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let import = [
        "import-parquet",
        "--nodes",
        s(&fifo),
        "--edges",
        s(&fifo),
        "--out",
        s(&small),
        "--overwrite",
    ];
    let started = || !partials().is_empty();
    let st = stop_when(
        "sampler",
        &import,
        "its partial dataset",
        &started,
        &["TERM"],
    );
    stopped_well(&st, "SIGTERM", 143, "the dataset there is untouched");
    assert_eq!(std::fs::read(small.join("metadata.yaml")).unwrap(), meta);
    assert_eq!(partials(), Vec::<String>::new());

    // SIGKILL leaves a partial directory; the next run removes it.
    let mut child = Command::new(binary("sampler"))
        .args(generate)
        .env("RUST_LOG", "error")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_until_ready(
        &mut child,
        "sampler",
        "the writing of its partial dataset",
        &writing,
    );
    child.kill().unwrap();
    let _ = child.wait();
    assert_eq!(partials().len(), 1, "the kill left no partial dataset");
    let r = run(
        "sampler",
        &[
            "generate",
            "--out",
            s(&big),
            "--nodes",
            "300",
            "--feature-dim",
            "4",
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);
    assert_eq!(partials(), Vec::<String>::new());
}
