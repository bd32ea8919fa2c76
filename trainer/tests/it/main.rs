//! Training end to end on a generated graph through the library: learning,
//! identical inputs across feature modes, identical losses with and without
//! the pipeline, and resume from a checkpoint.

mod hetero;
mod inference;

use std::path::PathBuf;

use offgnn_shared::io_engine::{AlignedBuf, IoEngine, IoOptions};
use packer::pack::{DiskCacheMode, Dtype, PackConfig, PackingMode, pack};
use packer::sizes::Budget;
use sampler::config::SampleConfig;
use sampler::sample_run::run;
use sampler::synthetic::{GeneratorConfig, generate};
use sampler::topology::CsrOptions;
use trainer::layout::Layout;
use trainer::model::{ModelConfig, ModelKind};
use trainer::pipeline::{self, FeatureMode};
use trainer::staging;
use trainer::test_hooks::{self, TestHooks};
use trainer::train::{TrainConfig, train};

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    pack: PathBuf,
}

/// libtorch's random generator and thread pool are process-wide: trainings
/// in parallel test threads would draw each other's dropout masks. Each
/// test holds this lock while it trains.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn fixture() -> Fixture {
    tch::set_num_threads(1);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let ds = root.join("g");
    generate(
        &ds,
        &GeneratorConfig {
            num_nodes: 3000,
            avg_degree: 8.0,
            feature_dim: 32,
            num_classes: 4,
            train_fraction: 0.3,
            valid_fraction: 0.2,
            signal: 0.25,
            seed: 2,
            ..Default::default()
        },
        false,
        false,
    )
    .unwrap();
    let samples = root.join("s");
    run(&SampleConfig {
        dataset: ds.clone(),
        out: samples.to_str().unwrap().into(),
        fanouts: vec![5, 5],
        relation_fanouts: Vec::new(),
        batch_size: 128,
        eval_batch_size: None,
        epochs: 2,
        seed: 3,
        threads: 2,
        shard: 0,
        num_shards: 1,
        overwrite: false,
        batches_per_file: 4,
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
    let pack_dir = root.join("p");
    pack_fixture(&root, &pack_dir, None);
    Fixture {
        _dir: dir,
        root,
        pack: pack_dir,
    }
}

/// Packs the fixture's samples (`root/s`) into `out`, its rows stored as
/// `store_dtype` says.
fn pack_fixture(root: &std::path::Path, out: &std::path::Path, store_dtype: Option<Dtype>) {
    pack(&PackConfig {
        samples: root.join("s").to_str().unwrap().into(),
        features: root.join("g/data/feat.npy").to_str().unwrap().into(),
        out: out.to_str().unwrap().into(),
        gpu_cache: 200 * 128,
        cpu_cache: 300 * 128,
        disk_budget: Budget::Multiple(20.0),
        memory: 256 << 20,
        segment_size: Some(3),
        packing: PackingMode::Batched,
        disk_cache: DiskCacheMode::Segmented,
        store_dtype,
        row_order: packer::pack::RowOrder::DEFAULT,
        cpu_cache_policy: packer::pack::CpuCachePolicy::Static,
        rank_by: packer::pack::RankBy::Samples,
        overwrite: false,
        show_progress: false,
    })
    .unwrap();
}

/// The sources of `features` mode over `layout`.
fn sources_for(layout: &Layout, e: &IoEngine, features: FeatureMode) -> pipeline::Sources {
    trainer::train::sources(layout, e, (features, config(ModelKind::Sage).device)).unwrap()
}

fn engine() -> IoEngine {
    IoEngine::new(IoOptions::default())
}

fn open(f: &Fixture, engine: &IoEngine) -> Layout {
    open_at(&f.pack, engine)
}

/// The layout packed into `dir`.
fn open_at(dir: &std::path::Path, engine: &IoEngine) -> Layout {
    let (dir, m) = staging::resolve(
        dir.join("manifest.json").to_str().unwrap(),
        None,
        engine,
        false,
    )
    .unwrap();
    Layout::open(&dir, m, engine, false).unwrap()
}

fn config(kind: ModelKind) -> TrainConfig {
    TrainConfig {
        model: ModelConfig {
            kind,
            in_dim: 32,
            hidden: 32,
            classes: 4,
            layers: 2,
            heads: 4,
            dropout: 0.2,
            scorer: None,
        },
        device: tch::Device::Cpu,
        epochs: 4,
        lr: 0.01,
        seed: 7,
        features: FeatureMode::Packed,
        pipelined: true,
        queue_depth: 2,
        loaders: 2,
        metrics: None,
        checkpoint_dir: None,
        resume: false,
        overwrite: false,
        show_progress: false,
        max_batches: None,
        checkpoint_every: None,
        export: None,
        dump: None,
        historical: None,
    }
}

#[test]
fn graphsage_and_gat_learn() {
    let _serial = serial();
    let f = fixture();
    let e = engine();
    let layout = open(&f, &e);
    // The features-only baseline: an MLP on each seed's own row.
    let mlp = train(
        &layout,
        &e,
        &TrainConfig {
            epochs: 6,
            ..config(ModelKind::Mlp)
        },
    )
    .unwrap()
    .test_acc_at_best_valid;
    for kind in [ModelKind::Sage, ModelKind::Gat] {
        let s = train(
            &layout,
            &e,
            &TrainConfig {
                epochs: 6,
                ..config(kind)
            },
        )
        .unwrap();
        let first = &s.epochs[0];
        let last = s.epochs.last().unwrap();
        eprintln!(
            "{kind:?}: loss {:.3} -> {:.3}, test {:.3} (features-only {mlp:.3})",
            first.loss, last.loss, s.test_acc_at_best_valid
        );
        assert!(
            last.loss < first.loss * 0.8,
            "{kind:?}: loss {} -> {}",
            first.loss,
            last.loss
        );
        // Four classes: chance is 0.25; neighbor aggregation should do far
        // better, and better than the node's own features alone.
        assert!(
            s.test_acc_at_best_valid > 0.6,
            "{kind:?}: test accuracy {}",
            s.test_acc_at_best_valid
        );
        assert!(
            s.test_acc_at_best_valid > mlp + 0.1,
            "{kind:?}: test accuracy {} against the features-only {mlp}",
            s.test_acc_at_best_valid
        );
        assert!(last.hit_gpu > 0.0 && last.hit_disk > 0.0);
        assert!(last.read_amplification >= 1.0);
    }
}

#[test]
fn the_three_feature_modes_feed_identical_inputs() {
    feature_modes_agree(engine());
}

/// The same check through the pread fallback of the I/O engine.
#[test]
fn the_feature_modes_agree_on_the_pread_engine_too() {
    let e = IoEngine::new(IoOptions {
        force_pread: true,
        ..IoOptions::default()
    });
    assert_eq!(e.backend(), offgnn_shared::io_engine::Backend::Pread);
    feature_modes_agree(e);
}

/// The same check with the packed reads merged through gaps of up to 16
/// pages: every row still lands where assembly looks for it, and the
/// merged reads take more bytes (gaps) in fewer requests.
#[test]
fn the_feature_modes_agree_reading_through_gaps() {
    let apart = feature_modes_agree(engine());
    let through = feature_modes_agree(IoEngine::new(IoOptions {
        read_through: 16 * offgnn_shared::io_engine::PAGE,
        ..IoOptions::default()
    }));
    assert!(through > apart, "read through {through} B, apart {apart} B");
}

/// `src`'s assembly sources with the GPU cache tier as a tensor, as on
/// CUDA (here on the CPU).
fn gpu_tier_as_tensor(src: &pipeline::Sources) -> pipeline::AssembleSources {
    let mut a = src.assemble.share();
    let rows = a.gpu_rows.take().expect("the fixture has a GPU tier");
    let n = (rows.len() / a.row_bytes) as i64;
    a.gpu_cache = Some(tch::Tensor::from_data_size(&rows, &[n, a.dim], a.kind));
    a
}

/// Checks that every batch's inputs agree across the feature modes and
/// with the feature file; returns the bytes the packed mode read.
fn feature_modes_agree(e: IoEngine) -> u64 {
    let _serial = serial();
    let f = fixture();
    let layout = open(&f, &e);
    let m = &layout.manifest;
    let refs: Vec<_> = m.schedule.values().flatten().flatten().copied().collect();
    let make = |features| sources_for(&layout, &e, features);
    let modes = [
        make(FeatureMode::Packed),
        make(FeatureMode::Naive),
        make(FeatureMode::Memory),
    ];
    let mut packed_bytes = 0;
    for r in refs {
        let xs: Vec<tch::Tensor> = modes
            .iter()
            .map(|src| {
                let loaded =
                    pipeline::load(&layout, &e, &src.load, r, AlignedBuf::new(0), None).unwrap();
                pipeline::assemble(&src.assemble, &loaded).unwrap().0
            })
            .collect();
        assert!(xs[0].equal(&xs[1]), "packed and naive differ for {r:?}");
        assert!(xs[0].equal(&xs[2]), "packed and memory differ for {r:?}");
        // CUDA's path (rows and indices staged for one upload, the GPU
        // tier gathered on the device), run on the CPU: the same batch.
        for (src, mode) in modes.iter().zip(["packed", "naive", "memory"]) {
            let loaded =
                pipeline::load(&layout, &e, &src.load, r, AlignedBuf::new(0), None).unwrap();
            let staged = pipeline::assemble_staged(&src.assemble, &loaded).unwrap();
            assert!(staged.equal(&xs[0]), "{mode} staged differs for {r:?}");
        }
        let table = layout.record(r.segment, r.record).unwrap();
        assert!(!table.gpu_pos.is_empty() && !table.cpu_pos.is_empty());
        let loaded =
            pipeline::load(&layout, &e, &modes[0].load, r, AlignedBuf::new(0), None).unwrap();
        packed_bytes += loaded.disk_bytes;
        let staged = pipeline::assemble_staged(&gpu_tier_as_tensor(&modes[0]), &loaded).unwrap();
        assert!(
            staged.equal(&xs[0]),
            "GPU tier gathered as a tensor differs for {r:?}"
        );
        // And against the feature file itself, row by row.
        let npy = offgnn_shared::npy::NpyFile::open(&m.dataset.feature_location).unwrap();
        let mut row = vec![0u8; m.dataset.row_bytes as usize];
        let want: Vec<f32> = table
            .input_nodes
            .iter()
            .flat_map(|&v| {
                npy.read_data_at(v as u64 * m.dataset.row_bytes, &mut row)
                    .unwrap();
                row.chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect::<Vec<_>>()
            })
            .collect();
        let got: Vec<f32> = Vec::try_from(xs[0].flatten(0, 1)).unwrap();
        assert_eq!(got, want, "packed rows of {r:?} against the feature file");
    }
    packed_bytes
}

/// Layouts stored in float16 and bfloat16: the assembled batch is the
/// feature file's float32 rows rounded as torch rounds them (the oracle is
/// torch's own `to(kind)`), widened back to float32; the baselines still
/// read the file unrounded; and a model trains on them as on float32.
#[test]
fn half_precision_layouts_feed_the_rounded_features_and_train() {
    let _serial = serial();
    let f = fixture();
    let e = engine();
    let full = open(&f, &e);
    let full_src = sources_for(&full, &e, FeatureMode::Packed);
    for (store, kind) in [
        (Dtype::F16, tch::Kind::Half),
        (Dtype::BF16, tch::Kind::BFloat16),
    ] {
        let out = f.root.join(store.name());
        pack_fixture(&f.root, &out, Some(store));
        let layout = open_at(&out, &e);
        let make = |features| sources_for(&layout, &e, features);
        let (packed, naive) = (make(FeatureMode::Packed), make(FeatureMode::Naive));
        let refs: Vec<_> = layout
            .manifest
            .schedule
            .values()
            .flatten()
            .flatten()
            .copied()
            .collect();
        for r in refs {
            let x = |src: &pipeline::Sources| {
                let loaded =
                    pipeline::load(&layout, &e, &src.load, r, AlignedBuf::new(0), None).unwrap();
                pipeline::assemble(&src.assemble, &loaded).unwrap().0
            };
            let got = x(&packed);
            assert_eq!(got.kind(), tch::Kind::Float, "widened for the model");
            let loaded =
                pipeline::load(&layout, &e, &packed.load, r, AlignedBuf::new(0), None).unwrap();
            let staged = pipeline::assemble_staged(&gpu_tier_as_tensor(&packed), &loaded).unwrap();
            assert!(staged.equal(&got), "{store}: CUDA's path differs for {r:?}");
            // The same batch from the float32 layout (same samples, same
            // schedule): rows in the same input order.
            let t = layout.record(r.segment, r.record).unwrap();
            let full_ref = full
                .manifest
                .schedule
                .values()
                .flatten()
                .flatten()
                .copied()
                .find(|q| full.record(q.segment, q.record).unwrap().input_nodes == t.input_nodes)
                .expect("the same batch in the float32 layout");
            let loaded = pipeline::load(
                &full,
                &e,
                &full_src.load,
                full_ref,
                AlignedBuf::new(0),
                None,
            )
            .unwrap();
            let exact = pipeline::assemble(&full_src.assemble, &loaded).unwrap().0;
            let want = exact.to_kind(kind).to_kind(tch::Kind::Float);
            assert!(got.equal(&want), "{store}: {r:?} is not the rounded rows");
            assert!(!got.equal(&exact), "{store}: nothing was rounded");
            assert!(x(&naive).equal(&exact), "naive reads the file");
        }
        let s = train(&layout, &e, &config(ModelKind::Sage)).unwrap();
        let last = s.epochs.last().unwrap();
        assert!(
            last.loss < s.epochs[0].loss && s.test_acc_at_best_valid > 0.6,
            "{store}: loss {} -> {}, test {}",
            s.epochs[0].loss,
            last.loss,
            s.test_acc_at_best_valid
        );
    }
}

#[test]
fn pipelined_and_sequential_runs_give_the_same_losses() {
    let _serial = serial();
    let f = fixture();
    let e = engine();
    let layout = open(&f, &e);
    let a = train(
        &layout,
        &e,
        &TrainConfig {
            epochs: 3,
            ..config(ModelKind::Sage)
        },
    )
    .unwrap();
    let b = train(
        &layout,
        &e,
        &TrainConfig {
            epochs: 3,
            pipelined: false,
            ..config(ModelKind::Sage)
        },
    )
    .unwrap();
    // Three loaders interleave the batches; the model still sees them in order.
    let c = train(
        &layout,
        &e,
        &TrainConfig {
            epochs: 3,
            loaders: 3,
            queue_depth: 1,
            ..config(ModelKind::Sage)
        },
    )
    .unwrap();
    let losses = |s: &trainer::train::TrainSummary| -> Vec<f64> {
        s.epochs.iter().map(|e| e.loss).collect()
    };
    assert_eq!(losses(&a), losses(&b));
    assert_eq!(losses(&a), losses(&c));
}

#[test]
fn an_interrupted_run_resumes_where_it_stopped() {
    let _serial = serial();
    let f = fixture();
    let e = engine();
    let layout = open(&f, &e);
    let ckpt = f.root.join("ckpt");
    let export_to = |name: &str| {
        Some(trainer::train::ExportTarget {
            location: f.root.join(name).to_str().unwrap().to_string(),
            overwrite: false,
            last: true,
        })
    };
    let straight = train(
        &layout,
        &e,
        &TrainConfig {
            epochs: 3,
            export: export_to("export-straight"),
            ..config(ModelKind::Gat)
        },
    )
    .unwrap();
    // Stopped after two epochs, then resumed for the third.
    let with_ckpt = |epochs, resume| TrainConfig {
        epochs,
        resume,
        checkpoint_dir: Some(ckpt.clone()),
        ..config(ModelKind::Gat)
    };
    train(&layout, &e, &with_ckpt(2, false)).unwrap();
    let resumed = train(&layout, &e, &with_ckpt(3, true)).unwrap();
    for k in 0..2 {
        assert_eq!(
            resumed.epochs[k].loss, straight.epochs[k].loss,
            "history of epoch {k}"
        );
    }
    assert_eq!(resumed.resumed_from, Some((2, 0)));
    assert_eq!(resumed.epochs.len(), 3);
    assert_eq!(resumed.epochs[2].loss, straight.epochs[2].loss);
    assert_eq!(resumed.epochs[2].valid_acc, straight.epochs[2].valid_acc);

    // Killed inside epoch 1 (8 batches an epoch) after batch 11, with a
    // checkpoint every 3 batches: the resumed run picks up at epoch 1,
    // batch 3, re-trains batches 3..8 from that state, and every epoch's
    // figures come out as in the run that never stopped.
    let mid = f.root.join("ckpt-mid");
    let mid_cfg = |resume| TrainConfig {
        epochs: 3,
        resume,
        checkpoint_every: Some(3),
        checkpoint_dir: Some(mid.clone()),
        export: if resume {
            export_to("export-resumed")
        } else {
            None
        },
        ..config(ModelKind::Gat)
    };
    let killed = TestHooks {
        interrupt_after: Some(11),
        ..Default::default()
    };
    let err = test_hooks::with(killed, || train(&layout, &e, &mid_cfg(false)))
        .err()
        .map(|e| e.to_string());
    assert_eq!(
        err.as_deref(),
        Some("interrupted after 11 training batches")
    );
    let resumed = train(&layout, &e, &mid_cfg(true)).unwrap();
    assert_eq!(resumed.resumed_from, Some((1, 3)));
    let losses = |s: &trainer::train::TrainSummary| -> Vec<(u64, f64, f64)> {
        s.epochs
            .iter()
            .map(|e| (e.batches, e.loss, e.valid_acc))
            .collect()
    };
    assert_eq!(losses(&resumed), losses(&straight));
    assert_eq!(resumed.epochs[1].batches, 8);
    // The best epoch's parameters came through the checkpoints: both runs
    // export the same weights, for the best and the last epoch.
    for sub in ["", "last/"] {
        let weights = |run: &str| weights_of(&f.root.join(format!("export-{run}/{sub}")));
        assert!(
            weights("straight") == weights("resumed"),
            "{sub}model.safetensors differs"
        );
    }
    assert_eq!(resumed.exports[0].card.epoch, straight.best_epoch);
    assert_eq!(resumed.exports[1].card.which, "last");
    // `trainer export` from the checkpoint writes the same best weights.
    let from_ckpt = f.root.join("export-ckpt");
    trainer::train::export_checkpoint(&mid, from_ckpt.to_str().unwrap(), false, false, None)
        .unwrap();
    assert!(weights_of(&from_ckpt) == weights_of(&f.root.join("export-straight")));

    // A checkpoint of another model is refused.
    let err = train(
        &layout,
        &e,
        &TrainConfig {
            epochs: 4,
            resume: true,
            checkpoint_dir: Some(ckpt.clone()),
            ..config(ModelKind::Sage)
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("another model"), "{err}");
}

/// A checkpoint whose tensor file changed after it was written (bytes
/// flipped, or cut short) is refused by `trainer export` and by a resume,
/// in one line naming the file, before libtorch reads it; a checkpoint of
/// an older trainer (no digest) is read unchecked, and libtorch's failure
/// on a truncated one is one line too.
#[test]
fn a_corrupted_checkpoint_is_refused_naming_its_file() {
    let _serial = serial();
    let f = fixture();
    let e = engine();
    let layout = open(&f, &e);
    let ckpt = f.root.join("ckpt-corrupt");
    let cfg = |epochs, resume| TrainConfig {
        epochs,
        resume,
        checkpoint_dir: Some(ckpt.clone()),
        ..config(ModelKind::Sage)
    };
    train(&layout, &e, &cfg(1, false)).unwrap();
    let meta_path = ckpt.join("checkpoint.json");
    let meta: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&meta_path).unwrap()).unwrap();
    let name = meta["tensors"].as_str().unwrap().to_string();
    let tensors = ckpt.join(&name);
    let whole = std::fs::read(&tensors).unwrap();
    let export = |to: &str| {
        let out = f.root.join(to);
        trainer::train::export_checkpoint(&ckpt, out.to_str().unwrap(), true, false, None)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    let one_line = |err: String, want: &str| {
        assert!(err.contains(&name) && err.contains(want), "{err}");
        assert!(!err.contains('\n') && !err.contains("frame #"), "{err}");
    };

    // A byte flipped every 100 KB (and at least once).
    let mut flipped = whole.clone();
    for at in (whole.len() / 2..whole.len()).step_by(100 << 10) {
        flipped[at] ^= 0x40;
    }
    std::fs::write(&tensors, &flipped).unwrap();
    one_line(export("x-flipped").unwrap_err(), "CRC32C");
    assert!(!f.root.join("x-flipped/model.json").exists());
    let resumed = train(&layout, &e, &cfg(2, true)).unwrap_err().to_string();
    one_line(resumed, "CRC32C");

    // Cut short.
    std::fs::write(&tensors, &whole[..whole.len() / 2]).unwrap();
    one_line(export("x-short").unwrap_err(), "cut short");

    // An older trainer's checkpoint, without a digest: libtorch reads the
    // truncated file and fails, on one line; the whole file is exported.
    let mut old = meta.clone();
    old.as_object_mut().unwrap().remove("tensors_digest");
    std::fs::write(&meta_path, serde_json::to_vec(&old).unwrap()).unwrap();
    one_line(export("x-old-short").unwrap_err(), "libtorch");
    std::fs::write(&tensors, &whole).unwrap();
    export("x-old").unwrap();

    // An epoch count its history contradicts: edited, refused.
    let mut edited = meta.clone();
    edited["epoch"] = 0.into();
    std::fs::write(&meta_path, serde_json::to_vec(&edited).unwrap()).unwrap();
    let resumed = train(&layout, &e, &cfg(2, true)).unwrap_err().to_string();
    assert!(
        resumed.contains("says 0 epochs done but holds the figures of 1"),
        "{resumed}"
    );
}

#[test]
fn corrupt_objects_and_unknown_versions_are_refused() {
    let _serial = serial();
    let f = fixture();
    let e = engine();
    let manifest = f.pack.join("manifest.json");
    // A bit flip in a segment object is caught before training, also
    // after the object was verified (and kept as verified) once.
    std::thread::sleep(trainer::verified::SETTLE + std::time::Duration::from_millis(100));
    let (dir, m) = staging::resolve(manifest.to_str().unwrap(), None, &e, false).unwrap();
    Layout::open(&dir, m, &e, false).unwrap();
    let first: offgnn_manifests::Manifest =
        serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    let seg = f.pack.join(&first.segments[0].object);
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[100] ^= 0x10;
    std::fs::write(&seg, &bytes).unwrap();
    let (dir, m) = staging::resolve(manifest.to_str().unwrap(), None, &e, false).unwrap();
    let err = Layout::open(&dir, m, &e, false).err().expect("refused");
    assert!(err.to_string().contains("checksum"), "{err}");
    bytes[100] ^= 0x10;
    std::fs::write(&seg, &bytes).unwrap();
    // A manifest from the future.
    let text = std::fs::read_to_string(&manifest).unwrap().replacen(
        "\"format_version\": 3",
        "\"format_version\": 9",
        1,
    );
    std::fs::write(&manifest, text).unwrap();
    let err = staging::resolve(manifest.to_str().unwrap(), None, &e, false)
        .expect_err("a manifest of a future version is refused");
    assert!(err.to_string().contains("newer than this build"), "{err}");
}

/// The bytes of the weights that the export in `dir` commits.
fn weights_of(dir: &std::path::Path) -> Vec<u8> {
    let card: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("model.json")).unwrap()).unwrap();
    std::fs::read(dir.join(card["weights"].as_str().unwrap())).unwrap()
}

/// On CUDA the statement moves the GPU cache, the model's training state,
/// the inputs in flight and the activations to the device's share (with
/// the context), and stages batches in page-locked buffers on the host; on
/// the CPU the device's share is nothing.
#[test]
fn the_memory_statement_states_what_cuda_holds() {
    let f = fixture();
    let e = engine();
    let layout = open(&f, &e);
    let m = &layout.manifest;
    let cpu = trainer::memory::estimate(m, &config(ModelKind::Sage));
    let cuda = trainer::memory::estimate(
        m,
        &TrainConfig {
            device: tch::Device::Cuda(0),
            ..config(ModelKind::Sage)
        },
    );
    let row = m.dataset.store_row_bytes();
    assert_eq!(cpu.gpu_bytes, 0);
    assert!(cpu.activation_bytes > 0);
    assert_eq!(cuda.activation_bytes, 0);
    assert!(
        cuda.gpu_bytes
            >= m.gpu_cache.rows * row + cpu.model_bytes + cpu.activation_bytes + (1 << 30),
        "{cuda:?}"
    );
    // Both tiers' rows once on the host: the CPU tier is not pinned whole
    // on CUDA (its rows go through small page-locked staging buffers).
    assert_eq!(cpu.cache_bytes, (m.gpu_cache.rows + m.cpu_cache.rows) * row);
    assert_eq!(cuda.cache_bytes, cpu.cache_bytes);
    // Those staging buffers, a batch's stored rows and indices rounded up
    // to a power of two, stand where the CPU holds float32 input matrices
    // (4-byte rows here, so the two differ).
    assert_ne!(cuda.batches_in_flight_bytes, cpu.batches_in_flight_bytes);
    // No CUDA runtime here: nothing to read.
    if !tch::Cuda::is_available() {
        assert_eq!(trainer::memory::cuda_free_memory(0), None);
    }
}
