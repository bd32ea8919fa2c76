//! Packing end to end through the library: the verify oracle across
//! settings, batched and individual packing agreeing byte for byte, and the
//! inputs the packer must refuse.

mod typed;

use std::path::{Path, PathBuf};

use offgnn_manifests::MANIFEST;
use offgnn_shared::npy::DType;
use packer::error::Error;
use packer::pack::{DiskCacheMode, Dtype, PackConfig, PackSummary, PackingMode, pack};
use packer::plan_error::PlanError;
use packer::sizes::Budget;
use packer::verify::{open_layout, verify};
use sampler::config::SampleConfig;
use sampler::sample_run::run;
use sampler::synthetic::{GeneratorConfig, generate};
use sampler::topology::CsrOptions;

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    samples: String,
    features: String,
}

/// A small graph sampled for two epochs (8 training batches an epoch).
fn fixture(dtype: DType, seed: u64) -> Fixture {
    fixture_with(GeneratorConfig {
        num_nodes: 4000,
        avg_degree: 6.0,
        feature_dim: 24,
        dtype,
        num_classes: 4,
        train_fraction: 0.1,
        valid_fraction: 0.05,
        seed,
        ..Default::default()
    })
}

fn fixture_with(cfg: GeneratorConfig) -> Fixture {
    fixture_edited(cfg, |_| {})
}

/// A fixture whose feature file `edit` changes before it is sampled.
fn fixture_edited(cfg: GeneratorConfig, edit: impl FnOnce(&Path)) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let ds = root.join("g");
    generate(&ds, &cfg, false, false).unwrap();
    edit(&ds.join("data/feat.npy"));
    let samples = root.join("samples");
    run(&SampleConfig {
        dataset: ds.clone(),
        out: samples.to_str().unwrap().into(),
        fanouts: vec![3, 4],
        relation_fanouts: Vec::new(),
        batch_size: 50,
        eval_batch_size: None,
        epochs: 2,
        seed: 1,
        threads: 2,
        shard: 0,
        num_shards: 1,
        overwrite: false,
        batches_per_file: 5,
        // As the sampler command builds it: each repeated edge once.
        csr: CsrOptions {
            dedup: true,
            ..CsrOptions::default()
        },
        show_progress: false,
        memory_limit: None,
        link: None,
    })
    .unwrap();
    Fixture {
        _dir: dir,
        samples: samples.to_str().unwrap().into(),
        features: ds.join("data/feat.npy").to_str().unwrap().into(),
        root,
    }
}

fn config(f: &Fixture, out: &str) -> PackConfig {
    PackConfig {
        samples: f.samples.clone(),
        features: f.features.clone(),
        out: f.root.join(out).to_str().unwrap().into(),
        gpu_cache: 40 * 96,
        cpu_cache: 100 * 96,
        disk_budget: Budget::Multiple(100.0),
        memory: 256 << 20,
        segment_size: None,
        packing: PackingMode::Batched,
        disk_cache: DiskCacheMode::Segmented,
        store_dtype: None,
        row_order: packer::pack::RowOrder::DEFAULT,
        cpu_cache_policy: packer::pack::CpuCachePolicy::Static,
        rank_by: packer::pack::RankBy::Samples,
        overwrite: false,
        show_progress: false,
    }
}

fn pack_and_verify(cfg: &PackConfig) -> PackSummary {
    let s = pack(cfg).unwrap();
    let v = verify(&cfg.out, false).unwrap();
    assert!(v.batches > 0 && v.rows > 0);
    s
}

#[test]
fn verify_passes_across_settings() {
    let f = fixture(DType::F32, 3);
    // Segments of one batch: no row is shared inside a segment, all packed.
    let s = pack_and_verify(&PackConfig {
        segment_size: Some(1),
        gpu_cache: 0,
        cpu_cache: 0,
        ..config(&f, "one")
    });
    assert_eq!(s.access_shares.disk_cache, 0.0);
    assert!(s.access_shares.packed > 0.99);
    // Every row packed: the reads are the chunks, which is the least there is.
    assert_eq!(s.amplification.disk_cache_read_share, 0.0);
    assert_eq!(s.predicted_read_amplification, s.amplification.lower_bound);
    assert_eq!(s.amplification.packed, s.predicted_read_amplification);
    // One global disk cache.
    let s = pack_and_verify(&PackConfig {
        disk_cache: DiskCacheMode::Global,
        ..config(&f, "global")
    });
    assert!(s.access_shares.disk_cache > 0.0);
    assert_eq!(s.segment_size, 16);
    // Shared rows cost pages the batch does not need: above the bound.
    let a = &s.amplification;
    assert!(
        1.0 <= a.lower_bound && a.lower_bound < s.predicted_read_amplification,
        "{a:?} against {}",
        s.predicted_read_amplification
    );
    assert!(
        a.disk_cache > a.packed && a.disk_cache_read_share > 0.0,
        "{a:?}"
    );
    // Searched segment size under a tight budget.
    let s = pack_and_verify(&PackConfig {
        disk_budget: Budget::Multiple(3.5),
        ..config(&f, "searched")
    });
    assert!(s.searched);
    assert!(
        s.feature_disk_bytes <= s.disk_budget,
        "{} > {}",
        s.feature_disk_bytes,
        s.disk_budget
    );
    assert!(
        s.disk_bytes > s.feature_disk_bytes,
        "tables are on disk too"
    );
    // Caches of zero size, and caches that hold every accessed row.
    let s = pack_and_verify(&PackConfig {
        gpu_cache: 0,
        cpu_cache: 0,
        ..config(&f, "nocache")
    });
    assert_eq!((s.gpu_rows, s.cpu_rows), (0, 0));
    let s = pack_and_verify(&PackConfig {
        gpu_cache: 1 << 30,
        ..config(&f, "allcache")
    });
    assert_eq!(s.access_shares.gpu, 1.0);
    // Disk caches larger than the staging memory: many partitions,
    // partition-major disk caches. The packer's fixed allowance is
    // `BASELINE_BYTES`; the plan's share is what the same plan reports; two
    // read buffers of a row and two pages each, then about 2 KB of staging.
    let global = PackConfig {
        disk_cache: DiskCacheMode::Global,
        ..config(&f, "probe")
    };
    let plan_bytes = pack(&global).unwrap().plan_bytes;
    let s = pack_and_verify(&PackConfig {
        memory: packer::pack::BASELINE_BYTES + plan_bytes + 2 * (96 + 2 * 4096) + 2_000,
        out: f.root.join("smallmem").to_str().unwrap().into(),
        ..global.clone()
    });
    assert!(s.staging_bytes <= 2_000, "{} bytes staged", s.staging_bytes);
    assert!(s.partitions > 10, "{} partitions", s.partitions);
    // Pieces of several rows over several partitions: the piece size is
    // fixed before the plan and ignores the partitions, so pieces straddle
    // their bounds.
    let mut straddled = false;
    for extra in [20_000, 60_000, 200_000] {
        let s = pack_and_verify(&PackConfig {
            memory: packer::pack::BASELINE_BYTES + plan_bytes + 2 * (96 + 2 * 4096) + extra,
            out: f
                .root
                .join(format!("pieces-{extra}"))
                .to_str()
                .unwrap()
                .into(),
            ..global.clone()
        });
        straddled |= s.partitions > 1 && s.piece_bytes >= 2 * 4096 + 3 * 96;
    }
    assert!(
        straddled,
        "no run had pieces of several rows and several partitions"
    );
}

/// Rows whose size does not divide the packer's read piece (100 bytes), in
/// a partition larger than one piece: every piece must start on a row.
#[test]
fn verify_passes_with_rows_that_straddle_read_pieces() {
    let f = fixture_with(GeneratorConfig {
        num_nodes: 200_000,
        avg_degree: 4.0,
        feature_dim: 25,
        num_classes: 4,
        train_fraction: 0.002,
        valid_fraction: 0.001,
        seed: 11,
        ..Default::default()
    });
    let s = pack_and_verify(&PackConfig {
        gpu_cache: 0,
        cpu_cache: 0,
        ..config(&f, "odd")
    });
    assert_eq!(s.partitions, 1, "one partition of 20 MB, read in pieces");
}

#[test]
fn verify_passes_on_f16_features() {
    let f = fixture(DType::F16, 4);
    let s = pack_and_verify(&config(&f, "f16"));
    assert!(s.predicted_read_amplification >= 1.0);
}

/// The same plan stored as float32, float16 and bfloat16: verify checks the
/// converted rows exactly, half-precision rows take half the bytes, and
/// batched and individual packing convert alike.
#[test]
fn half_precision_layouts_verify_and_halve_the_rows() {
    let f = fixture(DType::F32, 14);
    // No caches and a fixed segment size: one plan whatever the row size.
    let cfg = |name: &str, store_dtype: Option<Dtype>| PackConfig {
        gpu_cache: 0,
        cpu_cache: 0,
        segment_size: Some(3),
        store_dtype,
        ..config(&f, name)
    };
    let full = pack_and_verify(&cfg("f32", Some(Dtype::F32)));
    let (_, m32, _) = open_layout(&f.root.join("f32").to_string_lossy()).unwrap();
    assert_eq!(m32.format_version, 3);
    assert_eq!(m32.dataset.store_dtype, None);
    for d in [Dtype::F16, Dtype::BF16] {
        let name = d.name();
        let s = pack_and_verify(&cfg(name, Some(d)));
        let (_, m, _) = open_layout(&f.root.join(name).to_string_lossy()).unwrap();
        assert_eq!(m.format_version, 3);
        assert_eq!(m.dataset.store_dtype(), d);
        assert_eq!(m.dataset.feature_dtype, Dtype::F32);
        assert_eq!(m.dataset.store_row_bytes(), m32.dataset.row_bytes / 2);
        assert_eq!(
            (s.store_dtype.as_str(), s.feature_dtype.as_str()),
            (name, "float32")
        );
        // Same rows in every region, each region rounded up to a page.
        for (a, b) in m.segments.iter().zip(&m32.segments) {
            assert_eq!(
                (a.disk_cache_rows, a.packed_rows),
                (b.disk_cache_rows, b.packed_rows)
            );
        }
        let pages = 4096
            * (m.segments.len() as u64 + m.schedule.values().flatten().flatten().count() as u64);
        assert!(
            s.feature_disk_bytes <= full.feature_disk_bytes / 2 + pages,
            "{name}: {} bytes against {} for float32",
            s.feature_disk_bytes,
            full.feature_disk_bytes
        );
        // Individual packing converts row by row: the same bytes.
        let one = format!("{name}-individual");
        pack(&PackConfig {
            packing: PackingMode::Individual,
            ..cfg(&one, Some(d))
        })
        .unwrap();
        let (_, mi, _) = open_layout(&f.root.join(&one).to_string_lossy()).unwrap();
        let crcs = |m: &offgnn_manifests::Manifest| -> Vec<u32> {
            m.objects.iter().map(|o| o.crc32c).collect()
        };
        assert_eq!(crcs(&mi), crcs(&m), "{name}: batched and individual");
    }
    // A corrupted half-precision row is caught by the exact comparison.
    let s = pack(&PackConfig {
        store_dtype: Some(Dtype::BF16),
        ..config(&f, "bf16-cached")
    })
    .unwrap();
    assert!(s.gpu_rows > 0);
    let out = f.root.join("bf16-cached");
    let gpu = open_layout(&out.to_string_lossy())
        .unwrap()
        .1
        .gpu_cache
        .object
        .unwrap();
    corrupt_consistently(&out, &gpu);
    let err = verify(&out.to_string_lossy(), false)
        .unwrap_err()
        .to_string();
    assert!(err.contains("differs from the feature file"), "{err}");
}

#[test]
fn float16_features_pass_through_or_widen() {
    let f = fixture(DType::F16, 15);
    let same = pack_and_verify(&PackConfig {
        store_dtype: Some(Dtype::F16),
        ..config(&f, "f16")
    });
    let (_, m, _) = open_layout(&f.root.join("f16").to_string_lossy()).unwrap();
    assert_eq!((m.format_version, m.dataset.store_dtype), (3, None));
    assert_eq!(same.store_dtype, "float16");
    pack_and_verify(&PackConfig {
        store_dtype: Some(Dtype::F32),
        ..config(&f, "widened")
    });
    let (_, m, _) = open_layout(&f.root.join("widened").to_string_lossy()).unwrap();
    assert_eq!(m.dataset.store_row_bytes(), 2 * m.dataset.row_bytes);
}

#[test]
fn a_value_beyond_float16_is_refused_by_name_and_bfloat16_packs_it() {
    let f = fixture_edited(
        GeneratorConfig {
            num_nodes: 4000,
            avg_degree: 6.0,
            feature_dim: 24,
            num_classes: 4,
            train_fraction: 0.1,
            valid_fraction: 0.05,
            seed: 16,
            ..Default::default()
        },
        |path| {
            // Row 1234, column 5.
            let npy = offgnn_shared::npy::NpyFile::open(path).unwrap();
            let at = npy.header().data_offset + (1234 * 24 + 5) * 4;
            drop(npy);
            let mut bytes = std::fs::read(path).unwrap();
            bytes[at as usize..at as usize + 4].copy_from_slice(&70000f32.to_le_bytes());
            std::fs::write(path, bytes).unwrap();
        },
    );
    let err = pack(&PackConfig {
        store_dtype: Some(Dtype::F16),
        ..config(&f, "f16")
    })
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("row 1234, column 5 is 70000") && err.contains("--store-dtype bf16"),
        "{err}"
    );
    assert!(!f.root.join("f16").join(MANIFEST).exists());
    pack_and_verify(&PackConfig {
        store_dtype: Some(Dtype::BF16),
        ..config(&f, "bf16")
    });
}

#[test]
fn individual_packing_writes_the_same_bytes() {
    let f = fixture(DType::F32, 5);
    let a = config(&f, "batched");
    let b = PackConfig {
        packing: PackingMode::Individual,
        ..config(&f, "individual")
    };
    pack(&a).unwrap();
    pack(&b).unwrap();
    let (_, ma, _) = open_layout(&a.out).unwrap();
    let (_, mb, _) = open_layout(&b.out).unwrap();
    // Each run names its objects under its own id.
    let unnamed = |m: &offgnn_manifests::Manifest| -> Vec<(String, u64, u32)> {
        let prefix = format!("pack/{}/", m.run_id);
        m.objects
            .iter()
            .map(|o| (o.name.replacen(&prefix, "", 1), o.size, o.crc32c))
            .collect()
    };
    assert_ne!(ma.run_id, mb.run_id);
    assert_eq!(unnamed(&ma), unnamed(&mb), "same plan, same bytes");
    verify(&b.out, false).unwrap();
}

#[test]
fn refuses_mismatched_features() {
    let f = fixture(DType::F32, 6);
    let other = fixture(DType::F32, 7);
    let err = pack(&PackConfig {
        features: other.features.clone(),
        ..config(&f, "x")
    })
    .unwrap_err();
    assert!(matches!(err, Error::Mismatch(_)), "{err}");
    assert!(err.to_string().contains("fingerprints differ"), "{err}");
    let half = fixture(DType::F16, 6);
    let err = pack(&PackConfig {
        features: half.features.clone(),
        ..config(&f, "x")
    })
    .unwrap_err();
    assert!(err.to_string().contains("float16"), "{err}");
    assert!(!f.root.join("x").join(MANIFEST).exists());
}

#[test]
fn refuses_a_budget_below_the_minimum_and_names_it() {
    let f = fixture(DType::F32, 8);
    let err = pack(&PackConfig {
        disk_budget: Budget::Bytes(10_000),
        ..config(&f, "tight")
    })
    .unwrap_err();
    let Error::Plan(PlanError::LayoutTooSmall { minimum, .. }) = err else {
        panic!("expected LayoutTooSmall, got {err}");
    };
    assert!(minimum > 10_000);
    assert!(!f.root.join("tight").join(MANIFEST).exists());
}

/// Bytes of every file the layout wrote under `dir/pack`, listed on disk
/// (the manifest, the commit point, is not part of the layout's budget).
fn layout_bytes_on_disk(dir: &Path) -> (u64, u64) {
    let (mut all, mut tables) = (0, 0);
    let mut stack = vec![dir.join("pack")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let meta = e.metadata().unwrap();
            if meta.is_dir() {
                stack.push(e.path());
            } else {
                all += meta.len();
                if e.file_name().to_string_lossy().starts_with("table-") {
                    tables += meta.len();
                }
            }
        }
    }
    (all, tables)
}

#[test]
fn the_disk_budget_holds_every_object_the_layout_writes() {
    // Small evaluation splits; the least layout of this graph is about 4.3x its feature file.
    let f = fixture_with(GeneratorConfig {
        num_nodes: 4000,
        avg_degree: 6.0,
        feature_dim: 24,
        num_classes: 4,
        train_fraction: 0.1,
        valid_fraction: 0.02,
        test_fraction: Some(0.02),
        seed: 12,
        ..Default::default()
    });
    let feature_file = std::fs::metadata(&f.features).unwrap().len();
    let s = pack_and_verify(&PackConfig {
        disk_budget: Budget::Multiple(5.0),
        ..config(&f, "four")
    });
    let (on_disk, tables) = layout_bytes_on_disk(&f.root.join("four"));
    assert!(tables > 0);
    assert_eq!(
        (s.disk_bytes, s.table_bytes),
        (on_disk, tables),
        "the summary counts what is on disk"
    );
    assert_eq!(s.feature_disk_bytes + s.table_bytes, s.disk_bytes);
    assert!(
        s.disk_bytes <= s.disk_budget,
        "{} > {}",
        s.disk_bytes,
        s.disk_budget
    );
    assert!(s.disk_budget <= 5 * feature_file);
    let (_, m, _) = open_layout(&f.root.join("four").to_string_lossy()).unwrap();
    assert_eq!(m.disk_bytes, on_disk);
    assert_eq!(m.disk_bytes - m.feature_disk_bytes, tables);

    // The minimum a refusal states counts the tables, and is enough.
    let err = pack(&PackConfig {
        disk_budget: Budget::Bytes(s.table_bytes),
        ..config(&f, "tables-only")
    })
    .unwrap_err();
    assert!(err.to_string().contains("address tables"), "{err}");
    let Error::Plan(PlanError::LayoutTooSmall {
        minimum, tables, ..
    }) = err
    else {
        panic!("expected LayoutTooSmall, got {err}");
    };
    // The records and the evaluation tables' footers; the training tables'
    // footers (24 bytes a segment) count with the training segments.
    let train_segments = s.segments as u64 - 2;
    assert_eq!(tables, s.table_bytes - 24 * train_segments);
    let least = pack_and_verify(&PackConfig {
        disk_budget: Budget::Bytes(minimum),
        ..config(&f, "least")
    });
    assert!(least.disk_bytes <= minimum);
    let (on_disk, _) = layout_bytes_on_disk(&f.root.join("least"));
    assert_eq!(on_disk, least.disk_bytes);
    assert!(
        pack(&PackConfig {
            disk_budget: Budget::Bytes(minimum - 1),
            ..config(&f, "below")
        })
        .is_err()
    );
}

#[test]
fn refuses_a_committed_layout_and_recovers_from_an_interrupted_one() {
    let f = fixture(DType::F32, 9);
    let cfg = config(&f, "out");
    pack(&cfg).unwrap();
    let err = pack(&cfg).unwrap_err();
    assert!(matches!(err, Error::Committed(_)), "{err}");
    // --overwrite with a plan that fails keeps the committed layout whole.
    let err = pack(&PackConfig {
        overwrite: true,
        disk_budget: Budget::Bytes(10_000),
        ..cfg.clone()
    })
    .unwrap_err();
    assert!(matches!(err, Error::Plan(_)), "{err}");
    verify(&cfg.out, false).unwrap();
    // An interrupted run: objects without a manifest, one of them garbage.
    let out = Path::new(&cfg.out);
    let first_segment = || open_layout(&cfg.out).unwrap().1.segments[0].object.clone();
    let old = first_segment();
    std::fs::remove_file(out.join(MANIFEST)).unwrap();
    std::fs::write(out.join(&old), b"half-written").unwrap();
    assert!(open_layout(&cfg.out).is_err(), "no manifest, no layout");
    pack(&cfg).unwrap();
    verify(&cfg.out, false).unwrap();
    assert_ne!(first_segment(), old, "a new run writes names of its own");
    // A corrupted object is caught by its checksum.
    let seg = out.join(first_segment());
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[10] ^= 1;
    std::fs::write(&seg, bytes).unwrap();
    let err = verify(&cfg.out, false).unwrap_err();
    assert!(err.to_string().contains("checksum"), "{err}");
    pack(&PackConfig {
        overwrite: true,
        ..cfg.clone()
    })
    .unwrap();
    verify(&cfg.out, false).unwrap();
}

/// Overwrites the first byte of `object` in the layout at `out` and records
/// the object's new checksum in the manifest: a layout that is whole but
/// holds the wrong bytes, which only the comparison with the feature file
/// can catch.
fn corrupt_consistently(out: &Path, object: &str) {
    let path = out.join(object);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[0] ^= 0x5a;
    std::fs::write(&path, &bytes).unwrap();
    let manifest = out.join(MANIFEST);
    let mut m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    let entry = m["objects"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|o| o["name"] == object)
        .unwrap();
    entry["crc32c"] = crc32c::crc32c(&bytes).into();
    std::fs::write(&manifest, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
}

#[test]
fn verify_names_the_batch_and_row_whose_bytes_differ() {
    let f = fixture(DType::F32, 13);
    let cfg = config(&f, "wrong");
    let s = pack(&cfg).unwrap();
    assert!(s.gpu_rows > 0, "the test needs GPU-cache rows");
    // GPU slot 0 holds a row some batch needs: its first byte is now wrong.
    let gpu = open_layout(&cfg.out).unwrap().1.gpu_cache.object.unwrap();
    corrupt_consistently(Path::new(&cfg.out), &gpu);
    let err = verify(&cfg.out, false).unwrap_err().to_string();
    assert!(
        err.contains("differs from the feature file") && err.contains("batch"),
        "{err}"
    );
}
