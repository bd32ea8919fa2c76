//! Packing a typed graph through the library: every node type's layout at
//! its own width and dtype under one budget, the topology stored once,
//! and `verify` checking every type.

use std::path::{Path, PathBuf};

use offgnn_manifests::{Dtype, MANIFEST, TypedManifest};
use packer::pack::PackConfig;
use packer::sizes::Budget;
use packer::typed::pack_typed;
use packer::verify::verify;
use sampler::config::{SampleConfig, resolve_fanouts};
use sampler::sample_run::run;
use sampler::synthetic::{GeneratorConfig, TypedFeatures, generate_typed};

struct Typed {
    _dir: tempfile::TempDir,
    root: PathBuf,
    samples: String,
}

/// IGBH's schema: papers 12 wide, authors 6, fos 3, institutes without
/// features; sampled for two epochs.
fn typed_fixture() -> Typed {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let ds = root.join("igbh");
    let cfg = GeneratorConfig {
        num_nodes: 2000,
        feature_dim: 12,
        num_classes: 4,
        train_fraction: 0.2,
        valid_fraction: 0.05,
        test_fraction: Some(0.05),
        seed: 5,
        ..Default::default()
    };
    let features = TypedFeatures {
        without: vec!["institute".into()],
        widths: vec![("author".into(), 6), ("fos".into(), 3)],
    };
    generate_typed(&ds, &cfg, &features, false, false).unwrap();
    let samples = root.join("samples");
    let (fanouts, relation_fanouts) = resolve_fanouts(&["4,3".to_string()], &ds).unwrap();
    run(&SampleConfig {
        dataset: ds.clone(),
        out: samples.to_str().unwrap().into(),
        fanouts,
        relation_fanouts,
        batch_size: 100,
        eval_batch_size: None,
        epochs: 2,
        seed: 1,
        threads: 2,
        shard: 0,
        num_shards: 1,
        overwrite: false,
        batches_per_file: 3,
        csr: Default::default(),
        show_progress: false,
        memory_limit: None,
        link: None,
    })
    .unwrap();
    Typed {
        _dir: dir,
        samples: samples.to_str().unwrap().into(),
        root,
    }
}

fn typed_config(f: &Typed, out: &str) -> PackConfig {
    PackConfig {
        samples: f.samples.clone(),
        features: String::new(),
        out: f.root.join(out).to_str().unwrap().into(),
        gpu_cache: 2 << 10,
        cpu_cache: 4 << 10,
        disk_budget: Budget::Multiple(12.0),
        memory: 256 << 20,
        segment_size: None,
        packing: packer::pack::PackingMode::Batched,
        disk_cache: packer::pack::DiskCacheMode::Segmented,
        store_dtype: None,
        row_order: packer::pack::RowOrder::DEFAULT,
        cpu_cache_policy: packer::pack::CpuCachePolicy::Static,
        rank_by: packer::pack::RankBy::Samples,
        overwrite: false,
        show_progress: false,
    }
}

fn manifest(out: &str) -> TypedManifest {
    let path = Path::new(out).join(MANIFEST);
    TypedManifest::parse("m", &std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn every_type_packs_at_its_own_width_under_one_budget_and_verifies() {
    let f = typed_fixture();
    let cfg = typed_config(&f, "pack");
    let s = pack_typed(&cfg).unwrap();
    assert!(s.disk_bytes <= s.disk_budget);
    let m = manifest(&cfg.out);
    let shapes: Vec<(&str, Option<u64>, Option<Dtype>)> = m
        .node_types
        .iter()
        .map(|t| (t.name.as_str(), t.feature_dim, t.dtype))
        .collect();
    assert_eq!(
        shapes,
        [
            ("paper", Some(12), Some(Dtype::F32)),
            ("author", Some(6), Some(Dtype::F32)),
            ("institute", None, None),
            ("fos", Some(3), Some(Dtype::F32)),
        ]
    );
    for t in &m.node_types {
        if let Some(l) = &t.layout {
            // No row is padded to the widest type's width.
            assert_eq!(l.dataset.store_row_bytes(), t.feature_dim.unwrap() * 4);
            assert_eq!(l.dataset.num_nodes, t.rows);
        }
    }
    // The caches were shared across the types, each row at its width.
    let cached: u64 = m
        .node_types
        .iter()
        .filter_map(|t| t.layout.as_ref().map(|l| (l, t.feature_dim.unwrap() * 4)))
        .map(|(l, rb)| (l.gpu_cache.rows + l.cpu_cache.rows) * rb)
        .sum();
    assert!(
        cached > 0 && cached <= cfg.gpu_cache + cfg.cpu_cache,
        "{cached}"
    );
    let disk: u64 = m.objects.iter().map(|o| o.size).sum();
    assert_eq!(disk, m.disk_bytes);
    // 400 training seeds in batches of 100 for 2 epochs, 100 valid, 100 test.
    let batches: u32 = m.topology.tables.iter().map(|t| t.batches).sum();
    assert_eq!(batches, 2 * 4 + 1 + 1);

    // The largest batch: seeds are papers, 100 to a batch; every type is
    // among some batch's inputs.
    let largest = m.topology.largest_batch.as_ref().unwrap();
    assert_eq!(largest.blocks.last().unwrap().dst[0], 100);
    assert!(largest.inputs.iter().all(|&n| n > 0), "{largest:?}");
    assert!(
        largest
            .blocks
            .iter()
            .all(|b| b.edges.iter().any(|&e| e > 0))
    );

    let v = verify(&cfg.out, false).unwrap();
    // Every featured type's layout rebuilds every batch.
    assert_eq!(v.batches, 3 * u64::from(batches));
    assert!(v.rows > 0);
}

#[test]
fn bfloat16_rows_halve_every_type_and_verify() {
    let f = typed_fixture();
    let cfg = PackConfig {
        store_dtype: Some(Dtype::BF16),
        ..typed_config(&f, "bf16")
    };
    pack_typed(&cfg).unwrap();
    let m = manifest(&cfg.out);
    for t in m.node_types.iter().filter(|t| t.layout.is_some()) {
        assert_eq!(t.dtype, Some(Dtype::BF16));
        let l = t.layout.as_ref().unwrap();
        assert_eq!(l.dataset.store_row_bytes(), t.feature_dim.unwrap() * 2);
    }
    verify(&cfg.out, false).unwrap();
}

#[test]
fn verify_names_the_type_whose_rows_differ_and_a_corrupt_topology() {
    let f = typed_fixture();
    let cfg = typed_config(&f, "wrong");
    pack_typed(&cfg).unwrap();
    let out = Path::new(&cfg.out);
    let m = manifest(&cfg.out);
    let author = m.node_type("author").unwrap().layout.as_ref().unwrap();
    let segment = author.segments[0].object.clone();
    // The first disk-cache page holds rows the first batch reads.
    rewrite(out, &segment, |bytes| bytes[0] ^= 0x5a);
    let err = verify(&cfg.out, false).unwrap_err().to_string();
    assert!(
        err.contains("node type 'author'") && err.contains("differs from the feature file"),
        "{err}"
    );
    rewrite(out, &segment, |bytes| bytes[0] ^= 0x5a);
    verify(&cfg.out, false).unwrap();

    // A largest batch that is not the topology's is found.
    let mut wrong = m.clone();
    wrong.topology.largest_batch.as_mut().unwrap().inputs[1] += 1;
    let path = out.join(MANIFEST);
    let kept = std::fs::read(&path).unwrap();
    std::fs::write(&path, serde_json::to_vec(&wrong).unwrap()).unwrap();
    let err = verify(&cfg.out, false).unwrap_err().to_string();
    assert!(err.contains("largest batch"), "{err}");
    std::fs::write(&path, kept).unwrap();

    // A topology table whose bytes change fails its checksum, by name.
    let topology = &m.topology.tables[0].object;
    let path = out.join(topology);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[3] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let err = verify(&cfg.out, false).unwrap_err().to_string();
    assert!(
        err.contains(topology.as_str()) && err.contains("checksum"),
        "{err}"
    );
}

#[test]
fn typed_packing_refuses_what_it_cannot_pack_in_one_line() {
    let f = typed_fixture();
    let graph = PackConfig {
        rank_by: packer::pack::RankBy::Graph,
        ..typed_config(&f, "graph")
    };
    let err = pack_typed(&graph).unwrap_err().to_string();
    assert!(err.contains("--rank-by graph"), "{err}");
    let unknown = PackConfig {
        features: "venue=/x.npy".into(),
        ..typed_config(&f, "venue")
    };
    let err = pack_typed(&unknown).unwrap_err().to_string();
    assert!(
        err.contains("'venue' is not a node type with features"),
        "{err}"
    );
    let tight = PackConfig {
        disk_budget: Budget::Multiple(1.0),
        ..typed_config(&f, "tight")
    };
    let err = pack_typed(&tight).unwrap_err().to_string();
    assert!(err.contains("raise --disk-budget"), "{err}");
    assert!(!Path::new(&tight.out).join(MANIFEST).exists());
    // A typed run is refused by the homogeneous entry, naming the way.
    let plain = PackConfig {
        features: "/x.npy".into(),
        ..typed_config(&f, "plain")
    };
    let err = packer::pack::pack(&plain).unwrap_err().to_string();
    assert!(err.contains("samples of a typed graph"), "{err}");
}

/// Changes an object's bytes and records its new checksum in the manifest
/// (top level and its type's layout): a layout that is whole but holds
/// the wrong bytes.
fn rewrite(out: &Path, object: &str, edit: impl FnOnce(&mut Vec<u8>)) {
    let path = out.join(object);
    let mut bytes = std::fs::read(&path).unwrap();
    edit(&mut bytes);
    std::fs::write(&path, &bytes).unwrap();
    let crc = crc32c::crc32c(&bytes);
    let manifest = out.join(MANIFEST);
    let mut m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    let fix = |objects: &mut serde_json::Value| {
        for o in objects.as_array_mut().unwrap() {
            if o["name"] == object {
                o["crc32c"] = crc.into();
            }
        }
    };
    fix(&mut m["objects"]);
    for t in m["node_types"].as_array_mut().unwrap() {
        if !t["layout"].is_null() {
            fix(&mut t["layout"]["objects"]);
        }
    }
    std::fs::write(&manifest, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
}
