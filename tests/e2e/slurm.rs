//! The sampler's shards as a real Slurm job array (issue 18): four tasks of
//! `sbatch --array=0-3` run the sampler with no --shard or --num-shards, so
//! Slurm's SLURM_ARRAY_TASK_* variables choose each task's shard, and the
//! run the last of them commits is byte for byte the one-process run.
//! `scripts/test` starts a one-node cluster on localhost (`scripts/slurm-local`).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use offgnn_e2e::{binary, run};
use offgnn_shared::samples::RunSummary;
use offgnn_shared::store::Store;

/// How long the array may take, queueing included, before the test gives
/// up and cancels it: several times what it needs on a small machine.
const DEADLINE: Duration = Duration::from_secs(120);

/// Whether a Slurm controller answers here; where none does, the test is
/// [`offgnn_e2e::skip`]ped (a failure under `OFFGNN_REQUIRE_SLURM=1`, as
/// `scripts/test` sets).
fn slurm_answers() -> bool {
    let answers = Command::new("squeue")
        .arg("--noheader")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !answers {
        offgnn_e2e::skip(
            offgnn_e2e::Need::Slurm,
            "no Slurm controller answers squeue (sbatch or slurmctld missing)",
        );
    }
    answers
}

/// Every file a committed samples run names, by its name within the run
/// (without the run id), with its bytes.
fn committed_files(out: &Path) -> (RunSummary, BTreeMap<String, Vec<u8>>) {
    let store = Store::open(out.to_str().expect("a UTF-8 path")).unwrap();
    let run = RunSummary::read(&store).unwrap();
    let prefix = format!("samples/{}/", run.run_id);
    let files = run
        .files
        .iter()
        .map(|f| {
            let name = f.object.name.strip_prefix(&prefix).unwrap_or_else(|| {
                panic!("{} is not under {prefix}", f.object.name);
            });
            let bytes = std::fs::read(out.join(&f.object.name)).unwrap();
            assert_eq!(bytes.len() as u64, f.object.size, "{}", f.object.name);
            (name.to_string(), bytes)
        })
        .collect();
    (run, files)
}

/// `sbatch --wait` of `script` with `args`, under `job_name`; cancelled
/// (and the test failed) past [`DEADLINE`]. The job's environment has
/// `RUST_LOG=rust_log`.
fn sbatch_wait(
    args: &[String],
    script: &Path,
    job_name: &str,
    rust_log: &str,
) -> (std::process::ExitStatus, std::process::Child) {
    let mut sbatch = Command::new("sbatch")
        .args(["--wait", "--time=5"])
        .args(args)
        .arg(format!("--job-name={job_name}"))
        .arg(script)
        .env("RUST_LOG", rust_log)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sbatch starts");
    let started = Instant::now();
    loop {
        if let Some(status) = sbatch.try_wait().unwrap() {
            return (status, sbatch);
        }
        if started.elapsed() > DEADLINE {
            let _ = sbatch.kill();
            let _ = Command::new("scancel")
                .arg(format!("--name={job_name}"))
                .status();
            let queue = Command::new("squeue").output().unwrap();
            let nodes = Command::new("sinfo").output().unwrap();
            panic!(
                "the job did not finish in {DEADLINE:?}; cancelled it. squeue:\n{}\nsinfo:\n{}",
                String::from_utf8_lossy(&queue.stdout),
                String::from_utf8_lossy(&nodes.stdout)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn slurm_array_shards_commit_the_one_process_run() {
    if !slurm_answers() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ds = offgnn_e2e::generate(
        dir.path(),
        &[
            "--nodes",
            "3000",
            "--feature-dim",
            "4",
            "--classes",
            "4",
            "--train-fraction",
            "0.3",
            "--seed",
            "18",
        ],
    );
    let single = dir.path().join("single");
    let args = sampling(&ds, &single);
    let r = run(
        "sampler",
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert!(r.status.success(), "one-process run: {}", r.stderr);

    let sharded = dir.path().join("sharded");
    let logs = sample_as_a_slurm_array(dir.path(), &sampling(&ds, &sharded));
    each_task_took_its_shard(&logs);
    same_run(&single, &sharded);
}

/// The sampler's flags in the array test: 2 epochs of 900 training seeds
/// in batches of 64, 2 batches a file: 8 train files an epoch, and valid
/// and test beside, dealt to 4 shards.
fn sampling(ds: &Path, out: &Path) -> Vec<String> {
    [
        "--dataset",
        ds.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--epochs",
        "2",
        "--batch-size",
        "64",
        "--batches-per-file",
        "2",
        "--fanout",
        "3,4",
        "--seed",
        "7",
        "--threads",
        "1",
    ]
    .map(String::from)
    .to_vec()
}

/// The logs of an array job's tasks: `task-N.out` and `task-N.err`.
struct TaskLogs {
    dir: std::path::PathBuf,
}

impl TaskLogs {
    fn read(&self, task: u32, ext: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("task-{task}.{ext}"))).unwrap_or_default()
    }

    /// Every task's stderr, for a failure's message.
    fn all(&self) -> String {
        (0..4)
            .map(|t| format!("task {t}:\n{}", self.read(t, "err")))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Runs the sampler with `args` (no --shard or --num-shards) as a Slurm
/// array of 4 tasks in `dir`, and waits for it; returns the tasks' logs.
fn sample_as_a_slurm_array(dir: &Path, args: &[String]) -> TaskLogs {
    // The job script runs the built binary alone: nothing of cargo's
    // environment is needed. No --shard or --num-shards: Slurm's array
    // variables give them.
    let script = dir.join("sample.sbatch");
    let command: Vec<String> = std::iter::once(binary("sampler").display().to_string())
        .chain(args.iter().cloned())
        .map(|a| format!("'{a}'"))
        .collect();
    std::fs::write(&script, format!("#!/bin/sh\nexec {}\n", command.join(" "))).unwrap();
    let job_name = format!("offgnn-e2e-{}", std::process::id());
    let logs = dir.join("logs");
    std::fs::create_dir(&logs).unwrap();
    let (status, _) = sbatch_wait(
        &[
            "--array=0-3".into(),
            "--cpus-per-task=1".into(),
            format!("--chdir={}", dir.display()),
            format!("--output={}/task-%a.out", logs.display()),
            format!("--error={}/task-%a.err", logs.display()),
        ],
        &script,
        &job_name,
        // The tasks say which shard Slurm gave them.
        "info",
    );
    let logs = TaskLogs { dir: logs };
    assert!(
        status.success(),
        "sbatch --array=0-3 --wait: {status}\n{}",
        logs.all()
    );
    logs
}

/// Each task took its shard from Slurm. The last to finish committed (two
/// that finish together both find every shard and both commit the same
/// run); the others found a shard missing and left it to them.
fn each_task_took_its_shard(logs: &TaskLogs) {
    let mut committed = 0;
    for task in 0..4 {
        let said = format!(
            "Slurm array job: shard {task} of 4 (SLURM_ARRAY_TASK_ID={task}, SLURM_ARRAY_TASK_COUNT=4)"
        );
        assert!(
            logs.read(task, "err").contains(&said),
            "{said}:\n{}",
            logs.all()
        );
        let stdout = logs.read(task, "out");
        let summary: serde_json::Value =
            serde_json::from_str(stdout.lines().last().unwrap_or_default())
                .unwrap_or_else(|e| panic!("task {task}'s summary ({e}): {stdout}"));
        assert_eq!(summary["shard"]["shard"], task);
        assert_eq!(summary["shard"]["num_shards"], 4);
        assert!(
            !summary["shard"]["files"].as_array().unwrap().is_empty(),
            "task {task} sampled no file"
        );
        if summary["committed"] == true {
            committed += 1;
        } else {
            assert!(
                logs.read(task, "err")
                    .contains("have not finished (first: shard"),
                "task {task} neither committed nor waited:\n{}",
                logs.all()
            );
        }
    }
    assert!(committed >= 1, "no task committed:\n{}", logs.all());
}

/// The sharded run committed the one-process run: the same counts,
/// parameters and files, byte for byte.
fn same_run(single: &Path, sharded: &Path) {
    let (one, one_files) = committed_files(single);
    let (four, four_files) = committed_files(sharded);
    assert_eq!((one.num_shards, four.num_shards), (1, 4));
    assert_eq!(four.shards.len(), 4);
    assert_eq!(four.counts, one.counts);
    assert_eq!(four.params, one.params);
    assert_eq!(
        four_files.keys().collect::<Vec<_>>(),
        one_files.keys().collect::<Vec<_>>()
    );
    for (name, bytes) in &one_files {
        assert!(four_files[name] == *bytes, "{name} differs");
    }
}

/// The trainer as `srun` starts it (deploy/slurm/train.sbatch's way): two
/// tasks of one job step on the local node train Cora data-parallel over
/// Gloo, meeting at the MASTER_ADDR:MASTER_PORT the job script sets.
#[test]
fn srun_starts_two_data_parallel_ranks() {
    if !slurm_answers() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let manifest = offgnn_e2e::cora_pack(dir.path());
    let script = dir.path().join("train.sbatch");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nexport MASTER_ADDR=127.0.0.1 MASTER_PORT={}\nexec srun --kill-on-bad-exit=1 '{}' --manifest '{}' --epochs 2 --hidden 32\n",
            offgnn_e2e::free_port(),
            binary("trainer").display(),
            manifest.display()
        ),
    )
    .unwrap();
    let out = dir.path().join("train.out");
    let err = dir.path().join("train.err");
    let (status, _) = sbatch_wait(
        &[
            "--ntasks=2".into(),
            "--cpus-per-task=1".into(),
            format!("--chdir={}", dir.path().display()),
            format!("--output={}", out.display()),
            format!("--error={}", err.display()),
        ],
        &script,
        &format!("offgnn-e2e-srun-{}", std::process::id()),
        "warn",
    );
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    assert!(status.success(), "sbatch: {status}\n{stderr}");
    let r = offgnn_e2e::Run {
        status,
        stdout: std::fs::read_to_string(&out).unwrap(),
        stderr,
    };
    // Rank 0 alone prints the summary.
    assert_eq!(r.stdout.matches("\"command\":\"train\"").count(), 1);
    let s = &r.json()["summary"];
    assert_eq!(s["world_size"], 2, "{s}");
    assert_eq!(s["epochs"].as_array().unwrap().len(), 2);
}
