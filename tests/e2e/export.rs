//! The trained model as an export: PyTorch Geometric loads it and computes
//! the same logits (python/pyg_parity.py, a real PyG client), and bad
//! export targets and inputs are refused in one line.

use std::path::{Path, PathBuf};

use offgnn_e2e::{binary, cora_dir, run, workspace};

/// The parity test of the export issue: GraphSAGE and GAT (and the MLP
/// baseline) trained by the binaries on a generated graph and on Cora,
/// exported, loaded into PyG's model classes with strict=True, and run by
/// PyG on the same sampled test blocks: logits within 1e-4, classes equal.
/// Then `trainer infer` over each whole graph, out of core, against PyG's
/// full-graph forward pass with the same weights; and a link-prediction
/// model's encoder and scorer, with `trainer infer` and `trainer score`.
#[test]
fn exports_compute_the_same_logits_in_pytorch_geometric() {
    let python = workspace().join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup",
        python.display()
    );
    let work = tempfile::tempdir().unwrap();
    let bin_dir = binary("trainer").parent().unwrap().to_path_buf();
    let out = std::process::Command::new(&python)
        .arg(workspace().join("python/pyg_parity.py"))
        .arg("--bin-dir")
        .arg(&bin_dir)
        .arg("--work")
        .arg(work.path())
        .arg("--cora-dir")
        .arg(cora_dir())
        .output()
        .expect("python starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "pyg_parity.py failed:\n{stdout}\n{stderr}"
    );
    let summary: serde_json::Value =
        serde_json::from_str(stdout.trim().lines().last().unwrap()).unwrap();
    let cases = summary["cases"].as_array().unwrap();
    let names: Vec<String> = cases
        .iter()
        .map(|c| {
            let check = c["check"].as_str().unwrap_or("blocks");
            format!("{} {} {check}", c["graph"], c["model"]).replace('"', "")
        })
        .collect();
    for graph in ["generated", "cora"] {
        for model in ["sage", "gat"] {
            for check in ["blocks", "full_graph_infer"] {
                let want = format!("{graph} {model} {check}");
                assert!(names.contains(&want), "{want} not checked: {names:?}");
            }
        }
    }
    let link = "generated sage link_full_graph".to_string();
    assert!(names.contains(&link), "{link} not checked: {names:?}");
    for c in cases {
        assert!(c["max_abs_logit_diff"].as_f64().unwrap() <= 1e-4, "{c}");
        if c.get("check").is_none() {
            assert!(c["seed_nodes"].as_u64().unwrap() > 0, "{c}");
        }
    }
}

/// Bad export input, each refused with one line and a failing exit, and
/// nothing written: an occupied target, a checkpoint of another manifest, a
/// corrupted checkpoint, non-finite weights, a model.json of a newer format
/// or given for its directory, GAT widths PyG cannot split over heads.
#[test]
fn export_refuses_bad_input_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let t = Trained::new(dir.path());
    an_occupied_target_is_refused(&t);
    export_last_checks_both_targets_first(&t);
    a_checkpoint_of_another_layout_is_refused(&t);
    a_corrupted_checkpoint_is_refused(&t);
    non_finite_weights_are_refused(&t);
    a_model_of_a_newer_format_is_refused(&t);
    a_card_given_for_its_export_is_refused(&t);
    gat_widths_split_over_heads(&t);
}

/// A short run on Cora with a checkpoint and an export, under `dir`.
struct Trained {
    dir: PathBuf,
    manifest: PathBuf,
    ckpt: String,
    export: PathBuf,
}

impl Trained {
    fn new(dir: &Path) -> Trained {
        let manifest = offgnn_e2e::cora_pack(dir);
        let ckpt = dir.join("ckpt").to_str().unwrap().to_string();
        let t = Trained {
            dir: dir.to_path_buf(),
            manifest,
            ckpt,
            export: dir.join("export"),
        };
        let r = t.train(&["--checkpoint-dir", &t.ckpt, "--export", t.x()]);
        assert!(r.status.success(), "{}", r.stderr);
        let exported = &r.json()["summary"]["exports"][0];
        assert_eq!(exported["card"]["which"], "best");
        assert_eq!(exported["card"]["pyg"]["class"], "GraphSAGE");
        // The graph as the sampler built it (Cora's import wrote the
        // reverse edges; the sampler added none).
        let graph = &exported["card"]["graph"];
        assert_eq!(graph["add_reverse_edges"], false, "{graph}");
        assert_eq!(graph["dedup_edges"], true, "{graph}");
        assert_eq!(graph["keep_self_loops"], true, "{graph}");
        t
    }

    /// Two epochs of two batches, 32 hidden channels, with `extra`.
    fn train(&self, extra: &[&str]) -> offgnn_e2e::Run {
        let mut args = vec![
            "--manifest",
            self.m(),
            "--epochs",
            "2",
            "--hidden",
            "32",
            "--max-batches",
            "2",
        ];
        args.extend_from_slice(extra);
        run("trainer", &args)
    }

    fn m(&self) -> &str {
        self.manifest.to_str().unwrap()
    }

    fn x(&self) -> &str {
        self.export.to_str().unwrap()
    }
}

/// An occupied target: refused before training, by both commands;
/// --overwrite replaces it, with the last epoch's parameters on request.
fn an_occupied_target_is_refused(t: &Trained) {
    let (c, x) = (t.ckpt.as_str(), t.x());
    let one_line = offgnn_e2e::assert_one_line;
    let export = &t.export;
    let card = std::fs::read(export.join("model.json")).unwrap();
    one_line(&t.train(&["--export", x]), "holds an export already");
    one_line(
        &run("trainer", &["export", "--checkpoint-dir", c, "--out", x]),
        "holds an export already",
    );
    assert_eq!(std::fs::read(export.join("model.json")).unwrap(), card);
    let r = run(
        "trainer",
        &[
            "export",
            "--checkpoint-dir",
            c,
            "--out",
            x,
            "--overwrite",
            "--last",
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);
    assert_eq!(r.json()["export"]["card"]["which"], "last");
    let r = run("trainer", &["show-model", "--model", x]);
    assert!(r.status.success(), "{}", r.stderr);
    assert_eq!(r.json()["export"]["card"]["epoch"], 1);
}

/// --export-last: the best epoch's export and the last one's under
/// last/, both checked before training, so an occupied last/ costs no
/// run and leaves no best export behind.
fn export_last_checks_both_targets_first(t: &Trained) {
    let c = t.ckpt.as_str();
    let one_line = offgnn_e2e::assert_one_line;
    let both = t.dir.join("both");
    let b = both.to_str().unwrap();
    let occupied = both.join("last");
    let r = run(
        "trainer",
        &[
            "export",
            "--checkpoint-dir",
            c,
            "--out",
            occupied.to_str().unwrap(),
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);
    one_line(
        &t.train(&["--export", b, "--export-last"]),
        "holds an export already",
    );
    assert!(!both.join("model.json").exists());
    std::fs::remove_dir_all(&both).unwrap();
    let r = t.train(&["--export", b, "--export-last"]);
    assert!(r.status.success(), "{}", r.stderr);
    let exports = r.json()["summary"]["exports"].clone();
    assert_eq!(exports[0]["card"]["which"], "best", "{exports}");
    assert_eq!(exports[1]["card"]["which"], "last", "{exports}");
    let r = run(
        "trainer",
        &["show-model", "--model", occupied.to_str().unwrap()],
    );
    assert!(r.status.success(), "{}", r.stderr);
    assert_eq!(r.json()["export"]["card"]["which"], "last");
    assert_eq!(r.json()["export"]["card"]["epoch"], 1);
}

/// A checkpoint of another manifest (another dataset fingerprint).
fn a_checkpoint_of_another_layout_is_refused(t: &Trained) {
    let c = t.ckpt.as_str();
    let text = std::fs::read_to_string(&t.manifest).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let fp = v["dataset"]["dataset_fingerprint"].as_str().unwrap();
    let other = t.dir.join("pack/other.json");
    std::fs::write(&other, text.replace(fp, &"0".repeat(fp.len()))).unwrap();
    let fresh = t.dir.join("fresh");
    offgnn_e2e::assert_one_line(
        &run(
            "trainer",
            &[
                "export",
                "--checkpoint-dir",
                c,
                "--out",
                fresh.to_str().unwrap(),
                "--manifest",
                other.to_str().unwrap(),
            ],
        ),
        "another layout",
    );
    assert!(!fresh.join("model.json").exists());
}

/// A copy of directory `from` (files only) at `to`.
fn copy_files(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

/// A checkpoint whose tensor file changed since it was written (a byte
/// flipped every 100 KB, or cut short) is refused by `trainer export` and
/// by `--resume`, in one line naming the file; nothing is exported.
fn a_corrupted_checkpoint_is_refused(t: &Trained) {
    let copy = t.dir.join("ckpt-corrupt");
    copy_files(Path::new(&t.ckpt), &copy);
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(copy.join("checkpoint.json")).unwrap()).unwrap();
    let name = meta["tensors"].as_str().unwrap();
    let tensors = copy.join(name);
    let whole = std::fs::read(&tensors).unwrap();
    let mut flipped = whole.clone();
    for at in (1000..whole.len()).step_by(100 << 10) {
        flipped[at] ^= 0x40;
    }
    std::fs::write(&tensors, &flipped).unwrap();
    let c = copy.to_str().unwrap();
    let fresh = t.dir.join("fresh-corrupt");
    let out = fresh.to_str().unwrap();
    let export = || run("trainer", &["export", "--checkpoint-dir", c, "--out", out]);
    let r = export();
    offgnn_e2e::assert_one_line(&r, "CRC32C");
    assert!(r.stderr.contains(name), "{}", r.stderr);
    assert!(!fresh.join("model.json").exists());
    let r = t.train(&["--checkpoint-dir", c, "--resume"]);
    offgnn_e2e::assert_one_line(&r, "CRC32C");
    assert!(r.stderr.contains(name), "{}", r.stderr);
    std::fs::write(&tensors, &whole[..whole.len() / 3]).unwrap();
    offgnn_e2e::assert_one_line(&export(), "cut short");
    assert!(!fresh.join("model.json").exists());
    // An older trainer's checkpoint (no digest) cut short: libtorch's
    // failure, in one line, with no warning before it.
    let mut old = meta.clone();
    old.as_object_mut().unwrap().remove("tensors_digest");
    std::fs::write(
        copy.join("checkpoint.json"),
        serde_json::to_vec(&old).unwrap(),
    )
    .unwrap();
    offgnn_e2e::assert_one_line(&export(), name);
    assert!(!fresh.join("model.json").exists());
}

/// Weights holding a NaN, under a card whose SHA-256 names them, are
/// refused by `show-model` and `infer`, naming the parameter.
fn non_finite_weights_are_refused(t: &Trained) {
    use sha2::Digest;
    let copy = t.dir.join("export-nan");
    copy_files(&t.export, &copy);
    let card_path = copy.join("model.json");
    let mut card: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&card_path).unwrap()).unwrap();
    let weights = copy.join(card["weights"].as_str().unwrap());
    let mut bytes = std::fs::read(&weights).unwrap();
    // safetensors: an 8-byte header length, the JSON header, the data.
    let header = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let data = 8 + header;
    bytes[data..data + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    let sha: String = sha2::Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    std::fs::write(&weights, &bytes).unwrap();
    card["weights_sha256"] = sha.into();
    std::fs::write(&card_path, serde_json::to_vec_pretty(&card).unwrap()).unwrap();
    let x = copy.to_str().unwrap();
    offgnn_e2e::assert_one_line(
        &run("trainer", &["show-model", "--model", x]),
        "holds NaN (element 0): the weights are not finite",
    );
    let out = t.dir.join("preds-nan");
    let ds = t.dir.join("cora");
    offgnn_e2e::assert_one_line(
        &run(
            "trainer",
            &[
                "infer",
                "--model",
                x,
                "--dataset",
                ds.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ],
        ),
        "holds NaN (element 0): the weights are not finite",
    );
    assert!(!out.join("_SUCCESS.json").exists());
}

/// `--model` given the export's model.json, not its directory: one line
/// saying which directory to pass (it said "File exists (os error 17)").
fn a_card_given_for_its_export_is_refused(t: &Trained) {
    let card = t.export.join("model.json");
    let r = run(
        "trainer",
        &["show-model", "--model", card.to_str().unwrap()],
    );
    let dir = format!("pass {}", t.export.display());
    offgnn_e2e::assert_one_line(&r, &dir);
}

/// A model.json of a newer format version.
fn a_model_of_a_newer_format_is_refused(t: &Trained) {
    let newer = String::from_utf8(std::fs::read(t.export.join("model.json")).unwrap())
        .unwrap()
        .replacen("\"format_version\": 1", "\"format_version\": 5", 1);
    std::fs::write(t.export.join("model.json"), newer).unwrap();
    // (3 and 4 are typed models' formats, named as such.)
    offgnn_e2e::assert_one_line(
        &run("trainer", &["show-model", "--model", t.x()]),
        "format version 5 is newer",
    );
}

/// GAT's hidden width must split evenly over its heads, as in PyG.
fn gat_widths_split_over_heads(t: &Trained) {
    offgnn_e2e::assert_one_line(
        &run(
            "trainer",
            &[
                "--manifest",
                t.m(),
                "--model",
                "gat",
                "--hidden",
                "30",
                "--heads",
                "4",
            ],
        ),
        "not a multiple of --heads",
    );
}

/// `trainer infer` through the binary: a Cora model's predictions for the
/// test nodes as Parquet, committed by `_SUCCESS.json`, aggregated on the
/// host and then with `--aggregate device`; then bad input, each refused
/// in one line: an unknown --aggregate, a committed result at --out,
/// --memory below one group, a feature file of another width, a model of
/// another dataset.
#[test]
fn infer_writes_parquet_and_refuses_bad_input_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = offgnn_e2e::cora_pack(dir.path());
    let ds = dir.path().join("cora");
    let export = dir.path().join("export");
    let x = export.to_str().unwrap();
    let r = run(
        "trainer",
        &[
            "--manifest",
            manifest.to_str().unwrap(),
            "--model",
            "gat",
            "--epochs",
            "1",
            "--max-batches",
            "2",
            "--export",
            x,
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);
    let one_line = offgnn_e2e::assert_one_line;
    let out = dir.path().join("preds");
    let infer_with = |dataset: &std::path::Path, memory: &str, more: &[&str]| {
        let mut args = vec![
            "infer",
            "--model",
            x,
            "--dataset",
            dataset.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--nodes",
            "test",
            "--memory",
            memory,
            "--outputs",
            "class,probabilities,embeddings",
        ];
        args.extend_from_slice(more);
        run("trainer", &args)
    };
    let infer = |dataset: &std::path::Path, memory: &str| infer_with(dataset, memory, &[]);
    let r = infer(&ds, "1G");
    assert!(r.status.success(), "{}", r.stderr);
    let s = &r.json()["summary"];
    // Cora's test split: 541 nodes.
    assert_eq!(s["nodes_written"], 541);
    // The binary re-executed itself with libgomp's idle threads passive,
    // unless the environment chose a policy.
    let policy = std::env::var("OMP_WAIT_POLICY").unwrap_or_else(|_| "PASSIVE".into());
    assert_eq!(s["omp_wait_policy"], policy.as_str());
    assert_eq!(s["layers"].as_array().unwrap().len(), 3);
    let commit: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("_SUCCESS.json")).unwrap()).unwrap();
    assert_eq!(&commit, s);
    for f in s["files"].as_array().unwrap() {
        assert!(out.join(f.as_str().unwrap()).exists(), "{f}");
    }

    // The CPU's default aggregates on the host; torch's ops on the device
    // (CUDA's default) are chosen by name (their results are checked
    // against the in-memory pass in trainer's tests).
    assert_eq!(s["aggregate"], "host");
    let on_device = infer_with(&ds, "1G", &["--aggregate", "device", "--overwrite"]);
    assert!(on_device.status.success(), "{}", on_device.stderr);
    let d = &on_device.json()["summary"];
    assert_eq!(d["aggregate"], "device");
    assert_eq!(d["nodes_written"], 541);
    one_line(
        &infer_with(&ds, "1G", &["--aggregate", "sideways"]),
        "--aggregate sideways: expected auto, host or device",
    );
    one_line(&infer(&ds, "1G"), "holds a committed inference result");
    std::fs::remove_file(out.join("_SUCCESS.json")).unwrap();
    one_line(&infer(&ds, "9M"), "least");
    // The same dataset with a feature file of another width.
    let narrow = dir.path().join("narrow");
    std::fs::create_dir_all(narrow.join("data")).unwrap();
    for sub in ["metadata.yaml", "edges", "set", "data/label.npy"] {
        let status = std::process::Command::new("cp")
            .args([
                "-r",
                ds.join(sub).to_str().unwrap(),
                narrow.join(sub).to_str().unwrap(),
            ])
            .status()
            .unwrap();
        assert!(status.success());
    }
    let mut feat = offgnn_shared::npy::encode_header(offgnn_shared::npy::DType::F32, &[2708, 10]);
    feat.extend(std::iter::repeat_n(0u8, 2708 * 10 * 4));
    std::fs::write(narrow.join("data/feat.npy"), feat).unwrap();
    one_line(
        &infer(&narrow, "1G"),
        "features are 10 wide, the model takes 1433",
    );
    // The graph the model was trained on is built by default; a flag that
    // contradicts it is refused, unless forced, which the summary states.
    std::fs::remove_file(out.join("_SUCCESS.json")).ok();
    let plain = infer_with(&ds, "1G", &["--overwrite"]);
    assert!(plain.status.success(), "{}", plain.stderr);
    assert!(plain.json()["summary"].get("graph_override").is_none());
    let r = infer_with(&ds, "1G", &["--overwrite", "--add-reverse-edges"]);
    one_line(&r, "--add-reverse-edges: the model in");
    assert!(r.stderr.contains("no reverse edges added"), "{}", r.stderr);
    one_line(
        &infer_with(&ds, "1G", &["--overwrite", "--keep-duplicate-edges"]),
        "--keep-duplicate-edges: the model in",
    );
    let forced = infer_with(
        &ds,
        "1G",
        &["--overwrite", "--add-reverse-edges", "--graph-override"],
    );
    assert!(forced.status.success(), "{}", forced.stderr);
    let note = forced.json()["summary"]["graph_override"].clone();
    assert!(
        note.as_str()
            .is_some_and(|n| n.contains("(reverse edges added,")),
        "{note}"
    );
    // NaN features, outside the blocks the feature fingerprint samples:
    // refused as they stream, naming the node and column.
    let nan = dir.path().join("nan");
    let status = std::process::Command::new("cp")
        .args(["-r", ds.to_str().unwrap(), nan.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(status.success());
    let feat_path = nan.join("data/feat.npy");
    let mut feat = std::fs::read(&feat_path).unwrap();
    let data = match feat[6] {
        1 => 10 + u16::from_le_bytes([feat[8], feat[9]]) as usize,
        _ => 12 + u32::from_le_bytes(feat[8..12].try_into().unwrap()) as usize,
    };
    // Cora: 1433 float32 values a row; node 84 lies between the
    // fingerprint's first two 64 KiB samples (~1 MB apart).
    for (node, col) in [(84usize, 2usize), (86, 7)] {
        let at = data + (node * 1433 + col) * 4;
        feat[at..at + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    }
    std::fs::write(&feat_path, feat).unwrap();
    one_line(
        &infer_with(&nan, "1G", &["--overwrite"]),
        "node 84, column 2 is NaN",
    );
    // A model of another dataset: Cora with another split.
    let other = dir.path().join("other");
    offgnn_e2e::import_cora(&other, &["--split-seed", "7"]);
    one_line(&infer(&other, "1G"), "trained on another dataset");
}
