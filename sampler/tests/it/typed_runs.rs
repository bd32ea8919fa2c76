//! Sampling runs over a typed graph: every batch's blocks hold true
//! in-neighbours per relation within their fan-outs, the run summary
//! records the types, and the output does not depend on threads or shards.

use std::path::{Path, PathBuf};

use offgnn_shared::dataset::{Split, TypedDataset};
use offgnn_shared::samples::{RunSummary, read_file};
use offgnn_shared::store::Store;
use sampler::config::{SampleConfig, resolve_fanouts};
use sampler::sample_run::run;
use sampler::synthetic::{GeneratorConfig, TypedFeatures, generate_typed};
use sampler::typed_sampling::TypedGraph;

use super::{config, files};

fn typed_dataset(dir: &Path) -> PathBuf {
    let out = dir.join("igbh");
    let cfg = GeneratorConfig {
        num_nodes: 1500,
        feature_dim: 4,
        num_classes: 4,
        train_fraction: 0.2,
        valid_fraction: 0.1,
        seed: 3,
        ..Default::default()
    };
    generate_typed(
        &out,
        &cfg,
        &TypedFeatures::without(&["institute"]),
        false,
        false,
    )
    .unwrap();
    out
}

fn typed_config(ds: &Path, out: &str, specs: &[&str]) -> SampleConfig {
    let specs: Vec<String> = specs.iter().map(|s| s.to_string()).collect();
    let (fanouts, relation_fanouts) = resolve_fanouts(&specs, ds).unwrap();
    SampleConfig {
        fanouts,
        relation_fanouts,
        ..config(ds, out)
    }
}

#[test]
fn a_typed_run_samples_every_relation_within_its_fanouts() {
    let dir = tempfile::tempdir().unwrap();
    let ds_path = typed_dataset(dir.path());
    let out = dir.path().join("s");
    let cfg = typed_config(
        &ds_path,
        out.to_str().unwrap(),
        &["4,3,2", "paper:cites:paper=6,5,4"],
    );
    run(&cfg).unwrap();
    let store = Store::open(out.to_str().unwrap()).unwrap();
    let summary = RunSummary::read(&store).unwrap();
    let ds = TypedDataset::open(&ds_path).unwrap();
    let g = TypedGraph::from_dataset(&ds, true, u64::MAX, |_| {}).unwrap();
    let names: Vec<String> = ds.relations.iter().map(|r| r.name.clone()).collect();
    assert_eq!(summary.dataset.relations, names);
    let types: Vec<(&str, u64, Option<u64>)> = summary
        .dataset
        .node_types
        .iter()
        .map(|t| (t.name.as_str(), t.offset, t.feature_dim))
        .collect();
    assert_eq!(
        types,
        [
            ("paper", 0, Some(4)),
            ("author", ds.node_types[1].offset, Some(4)),
            ("institute", ds.node_types[2].offset, None),
            ("fos", ds.node_types[3].offset, Some(4))
        ]
    );
    assert_eq!(summary.params.relation_fanouts[0][0], 6);
    assert_eq!(summary.params.relation_fanouts[0][1], 4);
    assert_eq!(summary.params.fanouts, [6, 5, 4]);

    let mut batches = 0;
    for file in &summary.files {
        for b in read_file(&store, file).unwrap() {
            batches += 1;
            // Seeds are papers, with their labels.
            assert!(b.seeds.iter().all(|&s| g.type_of(s) == 0));
            let set = ds.split(b.split);
            for (s, l) in b.seeds.iter().zip(&b.labels) {
                let i = set.seeds.iter().position(|x| x == s).unwrap();
                assert_eq!(set.labels[i], *l);
            }
            for (l, block) in b.blocks.iter().enumerate() {
                assert_eq!(block.relations.len(), names.len() + 1);
                for (r, rel) in g.relations.iter().enumerate() {
                    let run = block.relations[r] as usize..block.relations[r + 1] as usize;
                    let mut per_dst = std::collections::HashMap::new();
                    for (&s, &d) in block.src[run.clone()].iter().zip(&block.dst[run]) {
                        let (u, v) = (b.input_nodes[s as usize], b.input_nodes[d as usize]);
                        assert_eq!((g.type_of(u), g.type_of(v)), (rel.src, rel.dst));
                        let row = rel.csr.neighbors((v as u64 - g.offsets[rel.dst]) as u32);
                        let local = (u as u64 - g.offsets[rel.src]) as u32;
                        assert!(row.binary_search(&local).is_ok(), "{} is no edge", rel.name);
                        *per_dst.entry(d).or_insert(0usize) += 1;
                    }
                    let fanout = summary.params.relation_fanouts[l][r];
                    assert!(per_dst.values().all(|&n| n <= fanout), "{}", rel.name);
                }
            }
        }
    }
    let expected: u64 = Split::ALL
        .iter()
        .map(|&s| {
            let c = &summary.counts[&s];
            c.batches_per_epoch as u64 * c.epochs as u64
        })
        .sum();
    assert_eq!(batches, expected);
}

#[test]
fn a_typed_run_is_the_same_on_any_thread_count_and_in_shards() {
    let dir = tempfile::tempdir().unwrap();
    let ds_path = typed_dataset(dir.path());
    let out = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let specs = ["3,2"];
    let one = SampleConfig {
        threads: 1,
        ..typed_config(&ds_path, &out("one"), &specs)
    };
    run(&one).unwrap();
    let two = typed_config(&ds_path, &out("two"), &specs);
    run(&two).unwrap();
    for shard in 0..3 {
        run(&SampleConfig {
            shard,
            num_shards: 3,
            ..typed_config(&ds_path, &out("sharded"), &specs)
        })
        .unwrap();
    }
    let read = |name: &str| files(&Store::open(&out(name)).unwrap());
    assert_eq!(read("one"), read("two"));
    assert_eq!(read("one"), read("sharded"));
}

#[test]
fn typed_fanouts_and_tasks_are_checked_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let ds_path = typed_dataset(dir.path());
    let specs = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let e = resolve_fanouts(&specs(&["3", "paper:cites:venue=2"]), &ds_path)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no relation 'paper:cites:venue'"), "{e}");
    let plain = dir.path().join("plain");
    sampler::synthetic::generate(
        &plain,
        &GeneratorConfig {
            num_nodes: 200,
            ..Default::default()
        },
        false,
        false,
    )
    .unwrap();
    let e = resolve_fanouts(&specs(&["3", "a:b:c=2"]), &plain)
        .unwrap_err()
        .to_string();
    assert!(e.contains("a graph of one edge type takes one list"), "{e}");
    // Link prediction needs the dataset's link task, typed or not.
    let cfg = SampleConfig {
        link: Some(sampler::config::LinkOptions {
            negatives: 1,
            sampler: sampler::config::NegativeKind::Uniform,
        }),
        ..typed_config(&ds_path, dir.path().join("l").to_str().unwrap(), &["3"])
    };
    let e = run(&cfg).unwrap_err().to_string();
    assert!(
        e.contains("has no link_prediction task (sampler split-edges writes one"),
        "{e}"
    );
}
