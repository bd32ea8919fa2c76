//! Sampling runs end to end through the library: determinism across thread
//! counts, shards that add up to the single run, an in-memory round trip
//! that checks every batch against the graph, and refused inputs; and the
//! Parquet importer (on Cora and on small hand-made tables).

mod parquet_importer;
mod typed_runs;

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use offgnn_shared::dataset::{Dataset, Split};
use offgnn_shared::samples::{RUN_SUMMARY, RunSummary, read_file};
use offgnn_shared::store::Store;
use sampler::config::{SampleConfig, parse_fanouts};
use sampler::error::Error;
use sampler::sample_run::{run, run_in};
use sampler::synthetic::{GeneratorConfig, generate};
use sampler::topology::{Csr, CsrOptions};

fn dataset(dir: &Path) -> PathBuf {
    let out = dir.join("g");
    let cfg = GeneratorConfig {
        num_nodes: 3000,
        avg_degree: 8.0,
        feature_dim: 4,
        num_classes: 4,
        train_fraction: 0.2,
        valid_fraction: 0.1,
        seed: 11,
        ..Default::default()
    };
    generate(&out, &cfg, false, false).unwrap();
    out
}

pub(crate) fn config(dataset: &Path, out: &str) -> SampleConfig {
    SampleConfig {
        dataset: dataset.to_path_buf(),
        out: out.to_string(),
        fanouts: vec![3, 4, 5],
        relation_fanouts: Vec::new(),
        batch_size: 64,
        eval_batch_size: None,
        epochs: 2,
        seed: 5,
        threads: 2,
        shard: 0,
        num_shards: 1,
        overwrite: false,
        batches_per_file: 3,
        // As the sampler command builds it: each repeated edge once.
        csr: CsrOptions {
            dedup: true,
            ..CsrOptions::default()
        },
        show_progress: false,
        memory_limit: None,
        link: None,
    }
}

/// (name without the run id, size, checksum) of every file of a committed
/// run; the names are the run's own.
pub(crate) fn files(store: &Store) -> Vec<(String, u64, Option<u32>)> {
    let run = RunSummary::read(store).unwrap();
    run.files
        .iter()
        .map(|f| {
            let prefix = format!("samples/{}/", run.run_id);
            assert!(f.object.name.starts_with(&prefix), "{}", f.object.name);
            (
                f.object.name.replacen(&prefix, "samples/", 1),
                f.object.size,
                f.object.crc32c,
            )
        })
        .collect()
}

#[test]
fn identical_output_for_any_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let ds_path = dataset(dir.path());
    let ds = Dataset::open(&ds_path).unwrap();
    let mut outputs = Vec::new();
    for threads in [1, 2, 3] {
        let store = Store::memory();
        let cfg = SampleConfig {
            threads,
            ..config(&ds_path, "memory://")
        };
        run_in(&cfg, &ds, &store).unwrap();
        outputs.push(files(&store));
    }
    assert!(!outputs[0].is_empty());
    assert_eq!(outputs[0], outputs[1]);
    assert_eq!(outputs[0], outputs[2]);

    // Another seed samples something else.
    let store = Store::memory();
    run_in(
        &SampleConfig {
            seed: 6,
            ..config(&ds_path, "memory://")
        },
        &ds,
        &store,
    )
    .unwrap();
    assert_ne!(files(&store), outputs[0]);
}

#[test]
fn a_fan_out_past_every_degree_takes_every_neighbour_in_bounded_memory() {
    // Stated and allocated as the graph's edges bound it, not the fan-out:
    // 2^40 a layer once asked for TiBs and aborted.
    let dir = tempfile::tempdir().unwrap();
    let ds_path = dataset(dir.path());
    let ds = Dataset::open(&ds_path).unwrap();
    let store = Store::memory();
    let cfg = SampleConfig {
        fanouts: vec![1 << 40, 1 << 40],
        memory_limit: Some(512 << 20),
        ..config(&ds_path, "memory://")
    };
    let outcome = run_in(&cfg, &ds, &store).unwrap();
    assert!(outcome.edges > 0 && outcome.memory.total_bytes < 512 << 20);
}

#[test]
fn a_dataset_another_run_commits_meanwhile_is_kept_without_overwrite() {
    // Two runs on one --out, neither given --overwrite: the later commit
    // is refused and the earlier dataset stays, as a run started after the
    // first committed would be refused.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("g");
    let cfg = GeneratorConfig {
        num_nodes: 200_000,
        feature_dim: 16,
        ..Default::default()
    };
    let writing = {
        let out = out.clone();
        std::thread::spawn(move || generate(&out, &cfg, false, false))
    };
    let partial = || {
        std::fs::read_dir(dir.path()).unwrap().any(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(".g.partial-")
        })
    };
    let since = std::time::Instant::now();
    while !partial() && since.elapsed().as_secs() < 60 {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(partial(), "the generator never started its partial dataset");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("metadata.yaml"), "the other run's").unwrap();
    let err = writing.join().unwrap().unwrap_err().to_string();
    assert!(err.contains("another run put a dataset there"), "{err}");
    let kept = std::fs::read_to_string(out.join("metadata.yaml")).unwrap();
    assert_eq!(kept, "the other run's");
    assert!(!partial(), "the refused run left its partial dataset");
}

#[test]
fn shards_add_up_to_the_single_run() {
    let dir = tempfile::tempdir().unwrap();
    let ds_path = dataset(dir.path());
    let ds = Dataset::open(&ds_path).unwrap();
    let single = Store::memory();
    run_in(&config(&ds_path, "memory://"), &ds, &single).unwrap();

    let sharded = Store::memory();
    for shard in [2, 0, 1] {
        let cfg = SampleConfig {
            shard,
            num_shards: 3,
            ..config(&ds_path, "memory://")
        };
        let outcome = run_in(&cfg, &ds, &sharded).unwrap();
        // Only the last shard to finish finds all three and commits.
        assert_eq!(outcome.run.is_some(), shard == 1, "shard {shard}");
        assert_eq!(sharded.exists(RUN_SUMMARY).unwrap(), shard == 1);
    }
    assert_eq!(files(&sharded), files(&single));
    let run = RunSummary::read(&sharded).unwrap();
    assert_eq!(run.num_shards, 3);
    assert_eq!(run.shards.len(), 3);
    let listed: usize = run.shards.iter().map(|s| s.files.len()).sum();
    assert_eq!(listed, run.files.len());
    assert_eq!(run.counts, RunSummary::read(&single).unwrap().counts);
}

/// Shards launched with another seed or shard count than the rest of their
/// run: the shard that finds the gap says which setting differs, and the
/// run commits once the shard is run again as the others were.
#[test]
fn shards_that_disagree_say_why_the_run_cannot_complete() {
    let dir = tempfile::tempdir().unwrap();
    let ds_path = dataset(dir.path());
    let ds = Dataset::open(&ds_path).unwrap();
    let store = Store::memory();
    let shard = |shard: u32, num_shards: u32, seed: u64| SampleConfig {
        shard,
        num_shards,
        seed,
        ..config(&ds_path, "memory://")
    };
    for i in 0..3 {
        assert!(run_in(&shard(i, 4, 5), &ds, &store).unwrap().run.is_none());
    }
    let err = run_in(&shard(3, 4, 6), &ds, &store)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("cannot complete") && err.contains("seed 5 (this shard: 6)"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    let err = run_in(&shard(2, 3, 5), &ds, &store)
        .unwrap_err()
        .to_string();
    assert!(err.contains("--num-shards 4 (this shard: 3)"), "{err}");
    assert!(!store.exists(RUN_SUMMARY).unwrap());
    let outcome = run_in(&shard(3, 4, 5), &ds, &store).unwrap();
    assert!(outcome.run.is_some(), "the run's own last shard commits");
}

#[test]
fn round_trip_through_the_memory_store_checks_every_batch() {
    let dir = tempfile::tempdir().unwrap();
    let ds_path = dataset(dir.path());
    let ds = Dataset::open(&ds_path).unwrap();
    let csr = Csr::from_edge_list(&ds.edges, CsrOptions::default(), |_| {}).unwrap();
    let dedup = CsrOptions {
        dedup: true,
        ..Default::default()
    };
    let distinct = Csr::from_edge_list(&ds.edges, dedup, |_| {}).unwrap();
    assert!(
        distinct.num_edges() < csr.num_edges(),
        "the test graph repeats some edges"
    );
    let store = Store::memory().child("runs/one");
    let cfg = config(&ds_path, "memory://");
    let outcome = run_in(&cfg, &ds, &store).unwrap();
    let run = RunSummary::read(&store).unwrap();
    assert_eq!(outcome.run.as_ref(), Some(&run));
    assert_eq!(run.dataset.fingerprint, ds.fingerprint().unwrap());

    let train: HashSet<u32> = ds.train.seeds.iter().copied().collect();
    let labels: std::collections::HashMap<u32, u32> = [&ds.train, &ds.valid, &ds.test]
        .iter()
        .flat_map(|s| s.seeds.iter().copied().zip(s.labels.iter().copied()))
        .collect();
    let mut epoch_orders = Vec::new();
    for (split, epochs) in [(Split::Train, 2), (Split::Valid, 1), (Split::Test, 1)] {
        for epoch in 0..epochs {
            let mut seen = Vec::new();
            let mut next_index = 0;
            for file in run.files_of(split, epoch) {
                for b in read_file(&store, file).unwrap() {
                    assert_eq!((b.split, b.epoch, b.index), (split, epoch, next_index));
                    next_index += 1;
                    assert!(b.seeds.len() <= cfg.batch_size);
                    for (s, l) in b.seeds.iter().zip(&b.labels) {
                        assert_eq!(labels[s], *l, "label of seed {s}");
                    }
                    // Blocks chain and every edge is an edge of the graph.
                    assert_eq!(b.blocks.last().unwrap().num_dst as usize, b.seeds.len());
                    assert_eq!(b.blocks[0].num_src as usize, b.input_nodes.len());
                    // The generator repeats some edges: no neighbor is
                    // still taken twice, and each node takes min(fan-out,
                    // distinct neighbors).
                    for (block, &fanout) in b.blocks.iter().zip(&cfg.fanouts) {
                        let mut taken = vec![HashSet::new(); block.num_dst as usize];
                        for (&s, &d) in block.src.iter().zip(&block.dst) {
                            let (gs, gd) = (b.input_nodes[s as usize], b.input_nodes[d as usize]);
                            assert!(csr.neighbors(gd).binary_search(&gs).is_ok());
                            assert!(taken[d as usize].insert(gs), "{gs} taken twice for {gd}");
                        }
                        for (d, set) in taken.iter().enumerate() {
                            let distinct: HashSet<u32> =
                                csr.neighbors(b.input_nodes[d]).iter().copied().collect();
                            assert_eq!(set.len(), fanout.min(distinct.len()));
                        }
                    }
                    seen.extend_from_slice(&b.seeds);
                }
            }
            let set = ds.split(split);
            assert_eq!(next_index as u64, (set.seeds.len() as u64).div_ceil(64));
            // Each epoch visits the split exactly once.
            let mut sorted = seen.clone();
            sorted.sort_unstable();
            let mut want = set.seeds.clone();
            want.sort_unstable();
            assert_eq!(
                sorted, want,
                "{split} epoch {epoch} is not a permutation of the set"
            );
            if split == Split::Train {
                assert!(seen.iter().all(|s| train.contains(s)));
                epoch_orders.push(seen);
            }
        }
    }
    // Training seeds are reshuffled per epoch.
    assert_ne!(epoch_orders[0], epoch_orders[1]);
}

#[test]
fn refuses_bad_input_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ds_path = dataset(dir.path());
    let out = dir.path().join("out");
    let out_str = out.to_str().unwrap();

    for (text, want) in [
        ("", "empty"),
        ("10,0,5", "0 samples nothing"),
        ("10,x", "'x'"),
        ("10,,5", "missing between commas"),
        ("10,", "missing between commas"),
    ] {
        let err = parse_fanouts(text).unwrap_err().to_string();
        assert!(err.contains(want), "{text}: {err}");
    }
    let cases: Vec<(SampleConfig, &str)> = vec![
        (
            SampleConfig {
                batch_size: 0,
                ..config(&ds_path, out_str)
            },
            "--batch-size",
        ),
        (
            SampleConfig {
                eval_batch_size: Some(0),
                ..config(&ds_path, out_str)
            },
            "--eval-batch-size",
        ),
        (
            SampleConfig {
                fanouts: vec![],
                ..config(&ds_path, out_str)
            },
            "fan-outs",
        ),
        (
            SampleConfig {
                shard: 3,
                num_shards: 3,
                ..config(&ds_path, out_str)
            },
            "--shard 3 is out of range",
        ),
        (
            SampleConfig {
                epochs: 0,
                ..config(&ds_path, out_str)
            },
            "--epochs",
        ),
        (
            config(&dir.path().join("missing"), out_str),
            "metadata.yaml",
        ),
    ];
    for (cfg, want) in cases {
        let err = run(&cfg).unwrap_err().to_string();
        assert!(err.contains(want), "{err} should mention {want}");
        assert!(!out.join(RUN_SUMMARY).exists());
    }

    // A committed run is refused, then replaced with --overwrite.
    run(&config(&ds_path, out_str)).unwrap();
    let before = std::fs::read(out.join(RUN_SUMMARY)).unwrap();
    let err = run(&config(&ds_path, out_str)).unwrap_err();
    assert!(matches!(err, Error::Committed(_)), "{err}");
    assert_eq!(std::fs::read(out.join(RUN_SUMMARY)).unwrap(), before);
    run(&SampleConfig {
        overwrite: true,
        seed: 9,
        ..config(&ds_path, out_str)
    })
    .unwrap();
    assert_ne!(std::fs::read(out.join(RUN_SUMMARY)).unwrap(), before);
}
