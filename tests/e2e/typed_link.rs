//! Link prediction on a typed graph (issues 36 and 38): one relation split
//! into a GraphBolt heterogeneous link task, and its training pairs
//! sampled with typed blocks that never hold the pairs' own edges, over
//! the relation or its reverse.

use std::collections::HashSet;
use std::path::Path;

use offgnn_e2e::{assert_one_line, run, split_edges, workspace};
use offgnn_shared::dataset::{LinkTask, Split, TypedDataset};
use offgnn_shared::npy::NpyFile;
use offgnn_shared::samples::{RunSummary, SampledBatch, read_file};

const RELATION: &str = "paper:written_by:author";
const REVERSE: &str = "author:rev_written_by:paper";

fn read(path: &Path) -> Vec<u64> {
    NpyFile::open(path).unwrap().read_all_u64().unwrap()
}

/// A relation's edges as (source, destination) pairs, type-local.
fn edges(ds: &Path, relation: &str) -> HashSet<(u64, u64)> {
    let e = read(&ds.join(format!("edges/{}.npy", relation.replace(':', "__"))));
    let n = e.len() / 2;
    (0..n).map(|i| (e[i], e[n + i])).collect()
}

/// One node pair as an `[1, 2]` int64 `.npy`.
fn write_pair(path: &Path, (u, v): (u64, u64)) {
    use offgnn_shared::npy::{DType, NpyWriter};
    let mut w = NpyWriter::create(path, DType::I64, &[1, 2]).unwrap();
    w.write_bytes(&[u.to_le_bytes(), v.to_le_bytes()].concat())
        .unwrap();
    w.finish().unwrap();
}

fn batches(out: &Path) -> (RunSummary, Vec<SampledBatch>) {
    let store = offgnn_shared::store::Store::open(out.to_str().unwrap()).unwrap();
    let run = RunSummary::read(&store).unwrap();
    let batches = run
        .files
        .iter()
        .flat_map(|f| read_file(&store, f).unwrap())
        .collect();
    (run, batches)
}

#[test]
fn a_typed_relation_splits_into_a_link_task_and_samples_without_its_own_edges() {
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name);
    let ds = path("igbh");
    let r = run(
        "sampler",
        &[
            "generate",
            "--schema",
            "igbh",
            "--nodes",
            "3000",
            "--feature-dim",
            "8",
            "--out",
            ds.to_str().unwrap(),
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);
    let lp = path("lp");
    let split = |extra: &[&str]| split_edges(&ds, &lp, &[&["--negatives", "10"], extra].concat());
    let r = split(&["--relation", RELATION]);
    assert!(r.status.success(), "{}", r.stderr);
    let s = r.json()["summary"].clone();
    assert_eq!(s["relation"], RELATION, "{s}");
    assert_eq!(s["reverse"], REVERSE, "{s}");

    // The held-out pairs left the relation and its reverse; the other
    // relations' files are the input's.
    let task_ds = TypedDataset::open(&lp).unwrap();
    let task = LinkTask::open_typed(&task_ds).unwrap().unwrap();
    let rel = task.relation.expect("a typed task's relation");
    assert_eq!(task_ds.relations[rel].name, RELATION);
    let (paper, author) = (
        task_ds.node_type("paper").unwrap(),
        task_ds.node_type("author").unwrap(),
    );
    let local = |(u, v): (u32, u32)| {
        (
            u64::from(u) - task_ds.node_types[paper].offset,
            u64::from(v) - task_ds.node_types[author].offset,
        )
    };
    let (forward, backward) = (edges(&lp, RELATION), edges(&lp, REVERSE));
    let held: Vec<(u64, u64)> = (task.valid.positives.iter().chain(&task.test.positives))
        .map(|&p| local(p))
        .collect();
    assert_eq!(
        held.len() as u64,
        s["valid_pairs"].as_u64().unwrap() + s["test_pairs"].as_u64().unwrap()
    );
    let input = edges(&ds, RELATION);
    for &(p, a) in &held {
        assert!(
            input.contains(&(p, a)),
            "({p}, {a}) is an edge of the input"
        );
        assert!(
            !forward.contains(&(p, a)) && !backward.contains(&(a, p)),
            "({p}, {a}) held out"
        );
    }
    assert_eq!(forward.len(), input.len() - held.len());
    let cites = "paper__cites__paper.npy";
    assert_eq!(
        std::fs::read(lp.join("edges").join(cites)).unwrap(),
        std::fs::read(ds.join("edges").join(cites)).unwrap()
    );
    // Evaluation negatives are authors; training pairs the rest of the
    // relation, in type-local ids in the files.
    let papers = task_ds.node_types[paper].offset..task_ds.node_types[author].offset;
    let authors = task_ds.node_types[author].offset
        ..task_ds.node_types[author].offset + task_ds.node_types[author].num;
    for &(u, v) in task.valid.negatives.iter().chain(&task.test.negatives) {
        assert!(papers.contains(&u64::from(u)) && authors.contains(&u64::from(v)));
    }
    let train = read(&lp.join("set/lp_train_seeds.npy"));
    assert_eq!(train.len() / 2, task.train.pairs.len());
    assert!(train.chunks(2).all(|p| forward.contains(&(p[0], p[1]))));

    // Sampling: pairs of the relation, negatives of its destination type,
    // typed blocks without the batch's positive edges in either direction.
    let sample = |out: &str, extra: &[&str]| {
        let out = path(out);
        let mut flags = vec!["--task", "link", "--negatives", "3", "--fanout", "4,3"];
        flags.extend_from_slice(&["--batch-size", "64", "--epochs", "2"]);
        flags.extend_from_slice(extra);
        offgnn_e2e::sample(&lp, &out, &flags);
        out
    };
    let out = sample("samples", &[]);
    let (summary, all) = batches(&out);
    assert_eq!(summary.dataset.link_relation, RELATION);
    assert_eq!(summary.dataset.relations.len(), task_ds.relations.len());
    let key = |u: u32, v: u32| (u.min(v), u.max(v));
    let (mut pairs, mut queries) = (0, 0);
    for b in &all {
        let p = &b.pairs;
        let global = |r: usize| (b.seeds[p.src[r] as usize], b.seeds[p.dst[r] as usize]);
        for r in 0..p.len() {
            let (u, v) = global(r);
            assert!(papers.contains(&u64::from(u)) && authors.contains(&u64::from(v)));
        }
        for block in &b.blocks {
            assert_eq!(block.relations.len(), task_ds.relations.len() + 1);
        }
        if b.split != Split::Train {
            queries += p.label.iter().sum::<u32>() as usize;
            continue;
        }
        let positives: HashSet<(u32, u32)> = (0..p.len())
            .filter(|&r| p.label[r] == 1)
            .map(|r| key(global(r).0, global(r).1))
            .collect();
        pairs += positives.len();
        for block in &b.blocks {
            for (&s, &d) in block.src.iter().zip(&block.dst) {
                let e = key(b.input_nodes[s as usize], b.input_nodes[d as usize]);
                assert!(
                    !positives.contains(&e),
                    "batch {}: {e:?} in a block",
                    b.index
                );
            }
        }
    }
    assert_eq!(pairs, 2 * task.train.pairs.len());
    assert_eq!(queries, held.len());
    // Threads never change what is sampled.
    let again = sample("again", &["--threads", "1"]);
    assert_eq!(batches(&again).1, all);

    // Bad input, one line each.
    let none = path("none");
    for (flags, says) in [
        (vec![], "--relation names the relation to split"),
        (vec!["--relation", "paper:likes:paper"], "no such relation"),
        (
            vec!["--relation", RELATION, "--reverse", "paper:cites:paper"],
            "another relation from 'author' to 'paper'",
        ),
    ] {
        assert_one_line(&split_edges(&ds, &none, &flags), says);
        assert!(!none.exists());
    }
    // A task of a relation the graph lacks, or a pair out of its type's
    // range, stops sampling in one line naming the file.
    let broken = |name: &str, edit: &dyn Fn(&Path)| {
        let copy = path(name);
        let cp = std::process::Command::new("cp")
            .args(["-r", lp.to_str().unwrap(), copy.to_str().unwrap()])
            .status()
            .unwrap();
        assert!(cp.success());
        edit(&copy);
        let out = path(&format!("{name}-samples"));
        run(
            "sampler",
            &[
                "--dataset",
                copy.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
                "--task",
                "link",
            ],
        )
    };
    let r = broken("no-relation", &|d| {
        let meta = std::fs::read_to_string(d.join("metadata.yaml")).unwrap();
        let at = meta.find("name: link_prediction").unwrap();
        let tasks = meta[at..].replace(RELATION, "paper:likes:author");
        std::fs::write(d.join("metadata.yaml"), format!("{}{tasks}", &meta[..at])).unwrap();
    });
    assert_one_line(
        &r,
        "is of relation 'paper:likes:author', which is not in graph.edges",
    );
    let authors_count = task_ds.node_types[author].num;
    let r = broken("out-of-range", &|d| {
        let f = d.join("set/lp_train_seeds.npy");
        std::fs::remove_file(&f).unwrap();
        write_pair(&f, (0, authors_count));
    });
    assert_one_line(
        &r,
        &format!(
            "pair 0 holds node {authors_count}, out of range for {authors_count} nodes of type 'author'"
        ),
    );
    // Packed, verified, and trained: R-SAGE encodes both types, the MLP
    // scores pairs, evaluation ranks each held-out pair against its 10
    // negatives.
    let pack = path("pack");
    let r = run(
        "packer",
        &[
            "--samples",
            out.to_str().unwrap(),
            "--out",
            pack.to_str().unwrap(),
            "--gpu-cache",
            "8K",
            "--cpu-cache",
            "16K",
            "--disk-budget",
            "64M",
        ],
    );
    assert!(r.status.success(), "{}", r.stderr);
    let manifest = pack.join("manifest.json");
    let m: serde_json::Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    assert_eq!(m["dataset"]["link_relation"], RELATION);
    assert_eq!(m["samples"]["link"]["negatives"], 3);
    let r = run(
        "packer",
        &["verify", "--manifest", manifest.to_str().unwrap()],
    );
    assert!(r.status.success(), "{}", r.stderr);
    let train = |extra: &[&str]| {
        let mut args = vec![
            "--manifest",
            manifest.to_str().unwrap(),
            "--model",
            "sage",
            "--hidden",
            "32",
            "--epochs",
            "4",
            "--lr",
            "0.01",
        ];
        args.extend_from_slice(extra);
        run("trainer", &args)
    };
    let export = path("model");
    let r = train(&["--export", export.to_str().unwrap()]);
    assert!(r.status.success(), "{}", r.stderr);
    let s = &r.json()["summary"];
    let mrr = |v: &serde_json::Value| v["mrr"].as_f64().unwrap();
    // Ranking a positive among 10 negatives at random gives an MRR of
    // H(11) / 11 = 0.27; a model that knew each node's community would
    // reach about 0.7 (a negative shares it one time in 16, a positive
    // four times in five). Four epochs here reach about 0.4.
    let (valid, test) = (&s["best_valid_rank"], &s["test_rank_at_best_valid"]);
    assert!(mrr(valid) > 0.34 && mrr(test) > 0.34, "{s}");
    assert_eq!(
        test["queries"].as_u64(),
        Some(task.test.positives.len() as u64)
    );
    let epochs = s["epochs"].as_array().unwrap();
    assert!(
        epochs[3]["loss"].as_f64() < epochs[0]["loss"].as_f64(),
        "{s}"
    );
    // The export: the encoder and the scorer, loading strictly into the
    // PyG model its card describes; every type's embedding over the whole
    // graph, PyG's own within 1e-4; scores for given pairs from them.
    let card: serde_json::Value =
        serde_json::from_slice(&std::fs::read(export.join("model.json")).unwrap()).unwrap();
    assert_eq!(card["format_version"], 4);
    assert_eq!(card["scorer"], "mlp");
    assert_eq!(card["link_relation"], RELATION);
    assert!(card["valid_mrr"].as_f64().is_some(), "{card}");
    let parity = |args: &[&str]| {
        let out = std::process::Command::new(workspace().join(".venv/bin/python"))
            .arg(workspace().join("python/hetero_parity.py"))
            .args(args)
            .output()
            .expect("python starts");
        let said = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        said
    };
    parity(&["--export", export.to_str().unwrap()]);
    let emb = path("emb");
    let infer = |outputs: &str| {
        run(
            "trainer",
            &[
                "infer",
                "--model",
                export.to_str().unwrap(),
                "--dataset",
                lp.to_str().unwrap(),
                "--out",
                emb.to_str().unwrap(),
                "--outputs",
                outputs,
                "--memory",
                "1G",
            ],
        )
    };
    assert_one_line(&infer("class"), "has no classes; pass --outputs embeddings");
    let r = infer("embeddings");
    assert!(r.status.success(), "{}", r.stderr);
    for t in r.json()["summary"]["node_types"].as_array().unwrap() {
        assert_eq!(t["nodes_written"], t["nodes"], "{t}");
        assert_eq!(
            t["columns"],
            serde_json::json!(["node_id", "embedding"]),
            "{t}"
        );
    }
    let said = parity(&[
        "--infer",
        export.to_str().unwrap(),
        lp.to_str().unwrap(),
        emb.to_str().unwrap(),
    ]);
    eprintln!("typed link embeddings against PyG: {said}");
    // The test queries' pairs, type-local, scored.
    let score = |pairs: &Path, out: &Path| {
        let args = [
            "score",
            "--model",
            export.to_str().unwrap(),
            "--embeddings",
            emb.to_str().unwrap(),
            "--pairs",
            pairs.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        run("trainer", &args)
    };
    let scores = path("scores.npy");
    let seeds = lp.join("set/lp_test_seeds.npy");
    let r = score(&seeds, &scores);
    assert!(r.status.success(), "{}", r.stderr);
    let rows = read(&seeds).len() / 2;
    let f = NpyFile::open(&scores).unwrap();
    assert_eq!(f.shape(), [rows as u64]);
    let mut raw = vec![0u8; rows * 4];
    f.read_data_at(0, &mut raw).unwrap();
    let values: Vec<f32> = raw
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    // Each held-out pair, then its 10 negatives: the pairs rank above
    // their negatives more often than not.
    let (mut above, mut total) = (0, 0);
    for q in values.chunks(11) {
        above += q[1..].iter().filter(|&&n| q[0] > n).count();
        total += 10;
    }
    assert!(
        values.iter().all(|v| v.is_finite()) && above * 10 > total * 6,
        "{above} of {total}"
    );
    // Pairs out of the relation's types' ranges are refused in one line.
    let bad = path("bad.npy");
    write_pair(&bad, (0, 999_999));
    let bad2 = path("bad2.npy");
    assert_one_line(
        &score(&bad, &bad2),
        "holds node 999999, out of range for the",
    );
    assert!(!bad2.exists());
}
