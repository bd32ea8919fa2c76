//! Two runs, one location (issue 19, item 2): two samplers, two packers and
//! two trainers exporting, started at once on one output, locally and on the
//! S3 server. Every round: exactly one commits, its output is whole (its
//! commit names only objects that are there, with their sizes), every object
//! left is one its commit names (the loser's are gone), and the loser says
//! so in one line.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

use offgnn_e2e::{S3, binary};
use offgnn_shared::store::Store;

const ROUNDS: usize = 20;

/// The races of this file run one at a time: each starts two processes at
/// once and is about their interleaving, not about a loaded machine.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// One program's outcome in a race.
struct Ran {
    ok: bool,
    stderr: String,
}

/// Starts `program` twice at once with `args`, and waits for both.
fn race(program: &str, args: &[String], env: &[(String, String)]) -> [Ran; 2] {
    race_each(program, [args.to_vec(), args.to_vec()], env)
}

/// Checks one round: one run committed; the other lost the commit or was
/// refused at the start (the winner had committed before it looked), in one
/// line either way. Returns whether the loser got as far as the commit.
fn one_winner(program: &str, round: usize, ran: &[Ran; 2], refused: &str) -> bool {
    let winners = ran.iter().filter(|r| r.ok).count();
    assert_eq!(
        winners, 1,
        "{program} round {round}: {winners} runs committed; stderr: {:?} / {:?}",
        ran[0].stderr, ran[1].stderr
    );
    let loser = ran.iter().find(|r| !r.ok).expect("one lost");
    assert_eq!(
        loser.stderr.trim().lines().count(),
        1,
        "{program} round {round}: {}",
        loser.stderr
    );
    let raced = loser.stderr.contains("committed here first");
    assert!(
        raced || loser.stderr.contains(refused),
        "{program} round {round}: {}",
        loser.stderr
    );
    if raced {
        assert!(
            loser.stderr.contains("another run (run r"),
            "the loser names the winner: {}",
            loser.stderr
        );
    }
    raced
}

/// Every object under `prefixes` of `store`, by name and size.
fn objects(store: &Store, prefixes: &[&str]) -> BTreeMap<String, u64> {
    prefixes
        .iter()
        .flat_map(|p| store.list(p).unwrap())
        .collect()
}

/// The objects a committed samples run names are there with their sizes,
/// and nothing else is under samples/ or _shards/.
fn samples_whole(store: &Store) {
    let run = offgnn_shared::samples::RunSummary::read(store).unwrap();
    let named: BTreeMap<String, u64> = run
        .files
        .iter()
        .map(|f| (f.object.name.clone(), f.object.size))
        .collect();
    assert_eq!(objects(store, &["samples", "_shards"]), named);
}

/// The objects a committed layout names are there with their sizes, and
/// nothing else is under pack/.
fn layout_whole(store: &Store) {
    let m: offgnn_manifests::Manifest =
        serde_json::from_slice(&store.get("manifest.json").unwrap()).unwrap();
    let named: BTreeMap<String, u64> = m.objects.iter().map(|o| (o.name.clone(), o.size)).collect();
    assert_eq!(objects(store, &["pack"]), named);
}

/// The committed export's weights are there and are all there is beside
/// model.json.
fn export_whole(store: &Store) {
    let card: serde_json::Value =
        serde_json::from_slice(&store.get("model.json").unwrap()).unwrap();
    let weights = card["weights"].as_str().unwrap().to_string();
    // (A local commit's lock file, `.model.json.lock`, is not an object of the export.)
    let all: Vec<String> = store
        .list("")
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| !n.starts_with('.'))
        .collect();
    assert_eq!(all, vec![weights, "model.json".to_string()]);
}

/// A small graph, sampled and packed once, and a checkpoint trained on it:
/// the inputs of the races.
struct Inputs {
    _dir: tempfile::TempDir,
    dataset: String,
    samples: String,
    features: String,
    checkpoint: String,
}

fn inputs() -> Inputs {
    let dir = tempfile::tempdir().unwrap();
    let ds = offgnn_e2e::generate(
        dir.path(),
        &["--nodes", "3000", "--feature-dim", "16", "--classes", "4"],
    );
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let samples = dir.path().join("samples");
    let pack = dir.path().join("pack");
    let ckpt = dir.path().join("ckpt");
    let ok = |r: offgnn_e2e::Run| assert!(r.status.success(), "{}", r.stderr);
    ok(offgnn_e2e::run(
        "sampler",
        &sample_args(&s(&ds), &s(&samples)),
    ));
    let features = ds.join("data/feat.npy");
    ok(offgnn_e2e::run(
        "packer",
        &pack_args(&s(&samples), &s(&features), &s(&pack))
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    ));
    ok(offgnn_e2e::run(
        "trainer",
        &[
            "--manifest",
            &s(&pack.join("manifest.json")),
            "--epochs",
            "1",
            "--hidden",
            "16",
            "--checkpoint-dir",
            &s(&ckpt),
        ],
    ));
    Inputs {
        dataset: s(&ds),
        samples: s(&samples),
        features: s(&features),
        checkpoint: s(&ckpt),
        _dir: dir,
    }
}

fn sample_args<'a>(dataset: &'a str, out: &'a str) -> Vec<&'a str> {
    vec![
        "--dataset",
        dataset,
        "--out",
        out,
        "--fanout",
        "3,3",
        "--batch-size",
        "128",
        "--epochs",
        "2",
    ]
}

fn pack_args(samples: &str, features: &str, out: &str) -> Vec<String> {
    [
        "--samples",
        samples,
        "--features",
        features,
        "--out",
        out,
        "--gpu-cache",
        "16K",
        "--cpu-cache",
        "32K",
        "--disk-budget",
        "8x",
    ]
    .map(String::from)
    .to_vec()
}

/// Where the races write: a local directory per round, or a key per round
/// on the S3 server.
enum Target<'a> {
    Local(&'a Path),
    S3(&'a S3, String),
}

impl Target<'_> {
    fn location(&self, name: &str) -> String {
        match self {
            Target::Local(dir) => dir.join(name).to_str().unwrap().to_string(),
            Target::S3(s3, prefix) => s3.url(&format!("{prefix}/{name}")),
        }
    }

    fn store(&self, name: &str) -> Store {
        match self {
            Target::Local(dir) => Store::open(dir.join(name).to_str().unwrap()).unwrap(),
            Target::S3(s3, prefix) => s3.store(&format!("{prefix}/{name}")),
        }
    }

    fn env(&self) -> Vec<(String, String)> {
        match self {
            Target::Local(_) => Vec::new(),
            Target::S3(s3, _) => s3.env(),
        }
    }
}

/// The three races, `ROUNDS` rounds each, on `target`; then, with
/// `replacing`, a replacing round for each: two `--overwrite` runs over a
/// committed output, after which the output is whole and holds nothing of
/// the replaced run. (On the s3s-fs test server conditional writes check,
/// then write, in two steps, so a replacing race there can leave the
/// replaced run's objects behind: the local races cover it.)
fn races(inputs: &Inputs, target: &Target, replacing: bool) {
    let env = target.env();
    let mut raced = [0usize; 3];
    for round in 0..ROUNDS {
        let out = target.location(&format!("samples-{round}"));
        let args: Vec<String> = sample_args(&inputs.dataset, &out)
            .into_iter()
            .map(String::from)
            .collect();
        let ran = race("sampler", &args, &env);
        raced[0] += one_winner("sampler", round, &ran, "already holds a committed") as usize;
        samples_whole(&target.store(&format!("samples-{round}")));

        let out = target.location(&format!("pack-{round}"));
        let ran = race(
            "packer",
            &pack_args(&inputs.samples, &inputs.features, &out),
            &env,
        );
        raced[1] += one_winner("packer", round, &ran, "already holds a committed") as usize;
        layout_whole(&target.store(&format!("pack-{round}")));

        let out = target.location(&format!("export-{round}"));
        let args: Vec<String> = [
            "export",
            "--checkpoint-dir",
            &inputs.checkpoint,
            "--out",
            &out,
        ]
        .map(String::from)
        .to_vec();
        let ran = race("trainer", &args, &env);
        raced[2] += one_winner("trainer export", round, &ran, "holds an export already") as usize;
        export_whole(&target.store(&format!("export-{round}")));
    }
    eprintln!(
        "concurrency: of {ROUNDS} rounds, the loser reached the commit in {} (sampler), {} (packer), {} (export); the others were refused at the start",
        raced[0], raced[1], raced[2]
    );

    if !replacing {
        return;
    }
    // Two replacing runs over each committed output.
    let overwrite = |program: &str, mut args: Vec<String>| {
        args.push("--overwrite".into());
        let ran = race(program, &args, &env);
        assert!(
            ran.iter().any(|r| r.ok),
            "{program}: neither replaced it: {:?} / {:?}",
            ran[0].stderr,
            ran[1].stderr
        );
        for r in ran.iter().filter(|r| !r.ok) {
            assert!(r.stderr.contains("committed here first"), "{}", r.stderr);
            assert_eq!(r.stderr.trim().lines().count(), 1, "{}", r.stderr);
        }
    };
    let out = target.location("samples-0");
    overwrite(
        "sampler",
        sample_args(&inputs.dataset, &out)
            .into_iter()
            .map(String::from)
            .collect(),
    );
    samples_whole(&target.store("samples-0"));
    let out = target.location("pack-0");
    overwrite("packer", pack_args(&inputs.samples, &inputs.features, &out));
    layout_whole(&target.store("pack-0"));
    let out = target.location("export-0");
    overwrite(
        "trainer",
        [
            "export",
            "--checkpoint-dir",
            &inputs.checkpoint,
            "--out",
            &out,
        ]
        .map(String::from)
        .to_vec(),
    );
    export_whole(&target.store("export-0"));
}

#[test]
fn two_runs_on_one_local_location_one_commits() {
    let _serial = serial();
    let inputs = inputs();
    let dir = tempfile::tempdir().unwrap();
    races(&inputs, &Target::Local(dir.path()), true);
    // The layout that won verifies against the feature file.
    let r = offgnn_e2e::run(
        "packer",
        &[
            "verify",
            "--manifest",
            dir.path().join("pack-0/manifest.json").to_str().unwrap(),
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);
}

#[test]
fn two_runs_on_one_s3_location_one_commits() {
    let Some(s3) = S3::from_env() else {
        return;
    };
    let _serial = serial();
    let inputs = inputs();
    let prefix = format!("race-{}", std::process::id());
    races(&inputs, &Target::S3(&s3, prefix), false);
}

/// Two trainers on one checkpoint directory: the second is refused at the
/// start, in one line, while the first holds it.
#[test]
fn a_checkpoint_directory_has_one_writer() {
    let _serial = serial();
    let inputs = inputs();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("ckpt");
    let manifest = Path::new(&inputs.checkpoint)
        .parent()
        .unwrap()
        .join("pack/manifest.json");
    let args: Vec<String> = [
        "--manifest",
        manifest.to_str().unwrap(),
        "--epochs",
        "3",
        "--hidden",
        "16",
        "--checkpoint-dir",
        ckpt.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    let ran = race("trainer", &args, &[]);
    assert_eq!(
        ran.iter().filter(|r| r.ok).count(),
        1,
        "{:?} / {:?}",
        ran[0].stderr,
        ran[1].stderr
    );
    let loser = ran.iter().find(|r| !r.ok).unwrap();
    assert_eq!(loser.stderr.trim().lines().count(), 1, "{}", loser.stderr);
    assert!(
        loser
            .stderr
            .contains("another trainer is writing checkpoints here")
            || loser
                .stderr
                .contains("holds a checkpoint of an earlier run"),
        "{}",
        loser.stderr
    );
}

/// Two `trainer infer` runs on one --out (each with its own --work-dir):
/// one commits, its parts are all there, the loser's are gone. Two on one
/// --work-dir: the second is refused before it writes there.
#[test]
fn two_inference_runs_on_one_out_one_commits() {
    let _serial = serial();
    let inputs = inputs();
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    let r = offgnn_e2e::run(
        "trainer",
        &[
            "export",
            "--checkpoint-dir",
            &inputs.checkpoint,
            "--out",
            model.to_str().unwrap(),
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);
    let args = |out: &Path, work: &Path| -> Vec<String> {
        [
            "infer",
            "--model",
            model.to_str().unwrap(),
            "--dataset",
            &inputs.dataset,
            "--out",
            out.to_str().unwrap(),
            "--work-dir",
            work.to_str().unwrap(),
            "--memory",
            "2G",
        ]
        .map(String::from)
        .to_vec()
    };
    let mut raced = 0;
    for round in 0..10 {
        let out = dir.path().join(format!("out-{round}"));
        let ran = race_each(
            "trainer",
            [
                args(&out, &dir.path().join(format!("work-{round}-a"))),
                args(&out, &dir.path().join(format!("work-{round}-b"))),
            ],
            &[],
        );
        raced += one_winner(
            "trainer infer",
            round,
            &ran,
            "holds a committed inference result",
        ) as usize;
        let summary: serde_json::Value =
            serde_json::from_slice(&std::fs::read(out.join("_SUCCESS.json")).unwrap()).unwrap();
        let mut listed: Vec<String> = summary["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap().to_string())
            .collect();
        listed.push("_SUCCESS.json".into());
        listed.sort();
        let store = Store::open(out.to_str().unwrap()).unwrap();
        let all: Vec<String> = store
            .list("")
            .unwrap()
            .into_iter()
            .map(|(n, _)| n)
            .filter(|n| !n.starts_with('.'))
            .collect();
        assert_eq!(all, listed, "round {round}");
        // Neither run keeps its work: the winner's is done, and no rerun
        // resumes the loser's.
        for side in ["a", "b"] {
            let work = dir.path().join(format!("work-{round}-{side}"));
            let kept: Vec<String> = std::fs::read_dir(&work)
                .into_iter()
                .flatten()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("edges-") || n.ends_with(".f32"))
                .collect();
            assert!(kept.is_empty(), "round {round}: {side} kept {kept:?}");
        }
    }
    eprintln!("concurrency: of 10 inference rounds, the loser reached the commit in {raced}");

    // One work directory: the second run is refused at once.
    let out = dir.path().join("shared-work");
    let work = dir.path().join("work-shared");
    let ran = race_each("trainer", [args(&out, &work), args(&out, &work)], &[]);
    assert_eq!(ran.iter().filter(|r| r.ok).count(), 1);
    let loser = ran.iter().find(|r| !r.ok).unwrap();
    assert_eq!(loser.stderr.trim().lines().count(), 1, "{}", loser.stderr);
    assert!(
        loser
            .stderr
            .contains("another trainer infer is working here")
            || loser.stderr.contains("holds a committed inference result"),
        "{}",
        loser.stderr
    );
}

/// Starts `program` twice at once, each with its own arguments, and waits
/// for both.
fn race_each(program: &str, args: [Vec<String>; 2], env: &[(String, String)]) -> [Ran; 2] {
    let children = args.map(|a| {
        Command::new(binary(program))
            .args(&a)
            .env("RUST_LOG", "warn")
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program}: {e}"))
    });
    children.map(|c| {
        let out = c.wait_with_output().expect("the child runs");
        Ran {
            ok: out.status.success(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    })
}
