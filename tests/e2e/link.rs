//! Link prediction through all three programs (issue 38): a split of a
//! graph's edges, link samples packed like node samples, and the trainer's
//! encoder and scorer trained on them and ranked against the given
//! negatives.

use std::path::Path;

use offgnn_e2e::{assert_one_line, run, run_env};
use offgnn_shared::dataset::LinkTask;
use offgnn_shared::npy::{DType, NpyFile, NpyWriter};

/// A positive ranked at random among 20 negatives has an expected
/// reciprocal rank of H(21)/21 = 0.173.
fn chance() -> f64 {
    (1..=21).map(|r| 1.0 / r as f64).sum::<f64>() / 21.0
}

/// One thread for libtorch: identical inputs then give identical losses.
fn train_env(manifest: &Path, extra: &[&str], env: &[(&str, &str)]) -> offgnn_e2e::Run {
    let mut args = vec!["--manifest", manifest.to_str().unwrap()];
    args.extend_from_slice(&["--hidden", "64", "--dropout", "0", "--epochs", "4"]);
    args.extend_from_slice(&["--lr", "0.005"]);
    args.extend_from_slice(extra);
    let mut vars = vec![("OMP_NUM_THREADS".to_string(), "1".to_string())];
    vars.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    run_env("trainer", &args, &vars)
}

fn train(manifest: &Path, extra: &[&str]) -> offgnn_e2e::Run {
    let r = train_env(manifest, extra, &[]);
    assert!(r.status.success(), "{extra:?}: {}", r.stderr);
    r
}

fn losses(r: &offgnn_e2e::Run) -> Vec<f64> {
    let s = &r.json()["summary"];
    let epochs = s["epochs"].as_array().unwrap();
    epochs.iter().map(|e| e["loss"].as_f64().unwrap()).collect()
}

#[test]
fn link_prediction_packs_trains_and_ranks_held_out_edges_above_chance() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = offgnn_e2e::link_pack(dir.path());
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    assert_eq!(m["format_version"], 5, "a link layout has its own format");
    assert_eq!(m["samples"]["link"]["negatives"], 3);
    let r = run(
        "packer",
        &["verify", "--manifest", manifest.to_str().unwrap()],
    );
    assert!(r.status.success(), "packer verify: {}", r.stderr);

    let chance = chance();
    let r = train(&manifest, &[]);
    let s = &r.json()["summary"];
    let test = &s["test_rank_at_best_valid"];
    let mrr = test["mrr"].as_f64().unwrap();
    assert!(
        mrr > 2.0 * chance,
        "MLP scorer: test MRR {mrr}, chance {chance:.3}"
    );
    // The best epoch is the best validation MRR's.
    let epochs = s["epochs"].as_array().unwrap();
    let best = s["best_epoch"].as_u64().unwrap() as usize;
    let valid_mrr = |e: &serde_json::Value| e["valid_rank"]["mrr"].as_f64().unwrap();
    assert!(
        epochs
            .iter()
            .all(|e| valid_mrr(e) <= valid_mrr(&epochs[best]))
    );
    assert!(
        r.stdout.contains("ranking at best validation"),
        "{}",
        r.stdout
    );
    // Its accuracies are said to be the pairs'.
    assert!(
        r.stdout
            .contains(&format!("MRR at epoch {best}, pair accuracy"))
            && r.stdout.contains("pair accuracy 0."),
        "{}",
        r.stdout
    );

    // A dump holds each batch's pairs among its seeds' embeddings.
    let dump = dir.path().join("dump.safetensors");
    train(&manifest, &["--dump-batches", dump.to_str().unwrap()]);
    let bytes = std::fs::read(&dump).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let ints = |name: &str| -> Vec<i64> {
        let t = tensors.tensor(name).unwrap();
        t.data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let seeds = tensors.tensor("batch0.embeddings").unwrap().shape()[0] as i64;
    let (src, dst, label) = (
        ints("batch0.pairs.src"),
        ints("batch0.pairs.dst"),
        ints("batch0.pairs.label"),
    );
    assert!(!src.is_empty() && src.len() == dst.len() && dst.len() == label.len());
    assert!(src.iter().chain(&dst).all(|&s| (0..seeds).contains(&s)));
    assert!(label.contains(&0) && label.contains(&1), "{label:?}");

    let dot = train(&manifest, &["--scorer", "dot"]);
    let mrr = dot.json()["summary"]["test_rank_at_best_valid"]["mrr"]
        .as_f64()
        .unwrap();
    assert!(mrr > 1.5 * chance, "dot scorer: test MRR {mrr}");
    // The naive baseline reads the same rows by node id: the same run.
    let naive = train(&manifest, &["--features", "naive"]);
    assert_eq!(losses(&naive), losses(&r));

    // A checkpoint holds the scorer and its optimizer state: a run stopped
    // at batch 50 of its second epoch and resumed trains as one run
    // straight through.
    let steps = r.json()["summary"]["epochs"][0]["batches"]
        .as_u64()
        .unwrap();
    assert!(steps > 50, "{steps} batches an epoch");
    let ckpt = dir.path().join("ckpt");
    let flags = [
        "--checkpoint-dir",
        ckpt.to_str().unwrap(),
        "--checkpoint-every",
        "50",
    ];
    let stop = (steps + 50).to_string();
    let stopped = train_env(&manifest, &flags, &[("OFFGNN_TEST_INTERRUPT_AFTER", &stop)]);
    assert!(!stopped.status.success());
    let resumed = train(&manifest, &[&flags[..], &["--resume"]].concat());
    assert_eq!(
        resumed.json()["summary"]["resumed_from"],
        serde_json::json!([1, 50])
    );
    assert_eq!(losses(&resumed), losses(&r));
    // `trainer export` of the checkpoint holds the scorer as well.
    let x = dir.path().join("from-checkpoint");
    let r = run(
        "trainer",
        &[
            "export",
            "--checkpoint-dir",
            flags[1],
            "--out",
            x.to_str().unwrap(),
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);
    assert_eq!(r.json()["export"]["card"]["scorer"], "mlp");

    // --scorer belongs to link layouts.
    let node = dir.path().join("node");
    let ds = dir.path().join("g");
    offgnn_e2e::sample(&ds, &dir.path().join("ns"), &["--fanout", "5,5"]);
    let flags = [
        "--gpu-cache",
        "16K",
        "--cpu-cache",
        "16K",
        "--disk-budget",
        "10x",
    ];
    let nm = offgnn_e2e::pack(&ds, &dir.path().join("ns"), &node, &flags);
    let r = run(
        "trainer",
        &["--manifest", nm.to_str().unwrap(), "--scorer", "dot"],
    );
    assert_one_line(&r, "--scorer is for link-prediction layouts");
}

#[test]
fn link_models_export_and_give_every_nodes_embedding_and_scores_for_pairs() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = offgnn_e2e::link_pack(dir.path());
    // The export holds the encoder and the scorer (under `scorer.`), and
    // says so in a format older trainers refuse.
    let x = dir.path().join("export");
    let x = x.to_str().unwrap();
    let trained = train(&manifest, &["--export", x]);
    let sampled_mrr = trained.json()["summary"]["test_rank_at_best_valid"]["mrr"]
        .as_f64()
        .unwrap();
    let card = &trained.json()["summary"]["exports"][0]["card"];
    assert_eq!(
        (&card["format_version"], &card["scorer"]),
        (&2.into(), &"mlp".into())
    );
    assert_eq!(card["test_mrr"].as_f64(), Some(sampled_mrr), "{card}");
    let shown = run("trainer", &["show-model", "--model", x]);
    assert!(shown.status.success(), "{}", shown.stderr);
    assert!(shown.stdout.contains("test MRR"), "{}", shown.stdout);

    // Every node's embedding, over its whole neighbourhood, out of core.
    let lp = dir.path().join("lp");
    let emb = dir.path().join("emb");
    let (lp, emb) = (lp.to_str().unwrap(), emb.to_str().unwrap());
    let infer = |extra: &[&str]| {
        let mut args = vec!["infer", "--model", x, "--dataset", lp, "--out", emb];
        args.extend_from_slice(extra);
        run("trainer", &args)
    };
    assert_one_line(&infer(&[]), "has no classes; pass --outputs embeddings");
    let r = infer(&["--outputs", "embeddings"]);
    assert!(r.status.success(), "{}", r.stderr);
    let s = &r.json()["summary"];
    assert_eq!(s["columns"], serde_json::json!(["node_id", "embedding"]));
    assert_eq!(s["nodes_written"], 3000);

    // Scores for the test set's pairs rank its held-out edges as the
    // trainer's sampled evaluation did (full neighbourhoods here, so not
    // the same figure).
    let task = LinkTask::open(Path::new(lp), 3000).unwrap().unwrap();
    let t = &task.test;
    let mut pairs = Vec::new();
    for q in 0..t.positives.len() {
        pairs.push(t.positives[q]);
        pairs.extend_from_slice(&t.negatives[t.offsets[q] as usize..t.offsets[q + 1] as usize]);
    }
    let pairs_path = dir.path().join("pairs.npy");
    let mut w = NpyWriter::create(&pairs_path, DType::U32, &[pairs.len() as u64, 2]).unwrap();
    let bytes: Vec<u8> = pairs
        .iter()
        .flat_map(|&(u, v)| [u.to_le_bytes(), v.to_le_bytes()])
        .flatten()
        .collect();
    w.write_bytes(&bytes).unwrap();
    w.finish().unwrap();
    let scores = dir.path().join("scores.npy");
    let score = |pairs: &Path| {
        let (p, s) = (pairs.to_str().unwrap(), scores.to_str().unwrap());
        let args = [
            "score",
            "--model",
            x,
            "--embeddings",
            emb,
            "--pairs",
            p,
            "--out",
            s,
        ];
        run("trainer", &[&args[..], &["--overwrite"]].concat())
    };
    let r = score(&pairs_path);
    assert!(r.status.success(), "{}", r.stderr);
    assert_eq!(r.json()["summary"]["pairs"], pairs.len());
    let f = NpyFile::open(&scores).unwrap();
    assert_eq!(f.shape(), [pairs.len() as u64]);
    let mut raw = vec![0u8; pairs.len() * 4];
    f.read_data_at(0, &mut raw).unwrap();
    let s: Vec<f32> = raw
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let mut at = 0;
    let mut reciprocal = 0.0;
    for q in 0..t.positives.len() {
        let k = (t.offsets[q + 1] - t.offsets[q]) as usize;
        let (pos, neg) = (s[at], &s[at + 1..at + 1 + k]);
        let above = neg.iter().filter(|&&n| n > pos).count() as f64;
        let tied = neg.iter().filter(|&&n| n == pos).count() as f64;
        reciprocal += 1.0 / (1.0 + above + tied / 2.0);
        at += 1 + k;
    }
    let mrr = reciprocal / t.positives.len() as f64;
    assert!(mrr > 2.0 * chance(), "full-graph test MRR {mrr}");
    assert!(
        (mrr - sampled_mrr).abs() < 0.1,
        "full-graph test MRR {mrr}, sampled {sampled_mrr}"
    );

    // Bad pairs, one line each.
    let bad = dir.path().join("bad.npy");
    let mut w = NpyWriter::create(&bad, DType::U32, &[1, 2]).unwrap();
    w.write_bytes(&[0, 0, 0, 0, 0xb8, 0x0b, 0, 0]).unwrap(); // (0, 3000)
    w.finish().unwrap();
    assert_one_line(&score(&bad), "pair 0 holds node 3000, out of range");
    let mut w = NpyWriter::create(&bad, DType::U32, &[2]).unwrap();
    w.write_bytes(&[0; 8]).unwrap();
    w.finish().unwrap();
    assert_one_line(&score(&bad), "node pairs must be integers of shape [N, 2]");
}
