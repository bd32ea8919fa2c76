//! The trainer's claims, measured side by side in one run on one packed
//! layout (DiskGNN §5.3, §7), O_DIRECT throughout so that the page cache
//! hides nothing:
//!
//! 1. feature loading (stage 1 alone) over an epoch's training batches from
//!    the packed layout and from the raw feature file (`--features naive`:
//!    one aligned read per needed row, no caches): disk bytes, time, and the
//!    packed loader's throughput against this disk's sequential read
//!    bandwidth (measured here on the layout's segment objects);
//! 2. the input path (stages 1-3, pipelined, the model step a no-op):
//!    packed against naive;
//! 3. whole training epochs (the model step included, on this machine's
//!    device), after an untimed warm-up epoch of a few batches: packed
//!    pipelined and packed sequential (`--pipeline off`), twice each in
//!    turn, and naive pipelined — epoch time and disk bytes.
//!
//! Run through `scripts/bench-trainer`, which packs the 10M-node graph with
//! `scripts/bench-packer`'s settings first. Environment:
//! - `OFFGNN_BENCH_MANIFEST`: the layout's manifest.json (required);
//! - `OFFGNN_BENCH_BATCHES`: training batches per epoch (default: all);
//! - `OFFGNN_BENCH_DEVICE`: cpu (default) or cuda;
//! - `OFFGNN_BENCH_MODEL`: sage (default) or gat; `OFFGNN_BENCH_HIDDEN`.
//!
//! Prints a table per part, then one JSON line with every figure.

use std::time::Instant;

use anyhow::Context;
use offgnn_shared::disk_probe;
use offgnn_shared::io_engine::{AlignedBuf, IoEngine, IoOptions};
use serde_json::json;
use trainer::layout::Layout;
use trainer::model::{ModelConfig, ModelKind};
use trainer::pipeline::{self, FeatureMode};
use trainer::staging;
use trainer::train::{TrainConfig, sources, train};

/// The epochs' names, as the table and the JSON give them.
const PIPELINED: &str = "packed, pipelined";
const SEQUENTIAL: &str = "packed, sequential";
const NAIVE: &str = "naive, pipelined";
/// Batches of the untimed first epoch.
const WARM_UP_BATCHES: usize = 2;

/// What stage 1 did over a run of batches.
struct LoadFigure {
    seconds: f64,
    disk_bytes: u64,
    disk_rows: u64,
}

/// Stage 1 as the pipeline runs it: `loaders` threads, each loading every
/// `loaders`-th batch and recycling its buffer. A first, untimed pass sizes
/// the buffers, as the first batches of a long epoch do; the second pass is
/// timed (steady state: no fresh memory).
fn load_parallel(
    layout: &Layout,
    engine: &IoEngine,
    cfg: &TrainConfig,
    order: &[offgnn_manifests::BatchRef],
) -> anyhow::Result<LoadFigure> {
    let src = sources(layout, engine, (cfg.features, cfg.device))?;
    let loaders = cfg.loaders.max(1);
    // The loaders and this thread meet once the warm pass is done.
    let barrier = std::sync::Barrier::new(loaders + 1);
    let mut started = Instant::now();
    let per_thread = std::thread::scope(|s| {
        let handles: Vec<_> = (0..loaders)
            .map(|j| {
                let (load_src, barrier) = (&src.load, &barrier);
                s.spawn(move || -> anyhow::Result<(u64, u64)> {
                    let warm = order.iter().skip(j).step_by(loaders).try_fold(
                        AlignedBuf::new(0),
                        |buf, &r| {
                            pipeline::load(layout, engine, load_src, r, buf, None).map(|l| l.buf)
                        },
                    );
                    // Meet the others even after a failure, so none waits forever.
                    barrier.wait();
                    let mut buf = warm?;
                    let (mut bytes, mut rows) = (0, 0);
                    for &r in order.iter().skip(j).step_by(loaders) {
                        let loaded = pipeline::load(layout, engine, load_src, r, buf, None)?;
                        bytes += loaded.disk_bytes;
                        rows += loaded.disk_rows;
                        buf = loaded.buf;
                    }
                    Ok((bytes, rows))
                })
            })
            .collect();
        barrier.wait();
        started = Instant::now();
        handles
            .into_iter()
            .map(|h| h.join().expect("a loader does not panic"))
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    Ok(LoadFigure {
        seconds: started.elapsed().as_secs_f64(),
        disk_bytes: per_thread.iter().map(|p| p.0).sum(),
        disk_rows: per_thread.iter().map(|p| p.1).sum(),
    })
}

/// Stages 1-3 through the pipeline with a model step that does nothing.
fn input_path(
    layout: &Layout,
    engine: &IoEngine,
    cfg: &TrainConfig,
    order: &[offgnn_manifests::BatchRef],
) -> anyhow::Result<f64> {
    let src = sources(layout, engine, (cfg.features, cfg.device))?;
    let started = Instant::now();
    pipeline::run_batches(
        layout,
        engine,
        &src,
        order,
        cfg.pipeline_options(),
        None,
        |_| Ok(()),
    )?;
    Ok(started.elapsed().as_secs_f64())
}

fn main() -> anyhow::Result<()> {
    // As the trainer binary does.
    trainer::retain_freed_memory();
    let Ok(manifest) = std::env::var("OFFGNN_BENCH_MANIFEST") else {
        eprintln!(
            "OFFGNN_BENCH_MANIFEST is not set: nothing to measure (see scripts/bench-trainer)"
        );
        return Ok(());
    };
    let batches: Option<usize> = match std::env::var("OFFGNN_BENCH_BATCHES") {
        Ok(v) => Some(v.parse().context("OFFGNN_BENCH_BATCHES")?),
        Err(_) => None,
    };
    let device = trainer::device::parse_device(
        &std::env::var("OFFGNN_BENCH_DEVICE").unwrap_or_else(|_| "cpu".into()),
    )?;
    let kind = match std::env::var("OFFGNN_BENCH_MODEL").as_deref() {
        Ok("gat") => ModelKind::Gat,
        _ => ModelKind::Sage,
    };
    let hidden: i64 = std::env::var("OFFGNN_BENCH_HIDDEN")
        .ok()
        .map(|v| v.parse())
        .transpose()
        .context("OFFGNN_BENCH_HIDDEN")?
        .unwrap_or(if kind == ModelKind::Gat { 128 } else { 256 });

    let engine = IoEngine::new(IoOptions::default());
    let (dir, m) = staging::resolve(&manifest, None, &engine, false)?;
    let layout = Layout::open(&dir, m, &engine, true)?;
    let engine = trainer::io_depth::default_engine_for((&layout.dir, &layout.manifest.objects));
    let m = &layout.manifest;
    let mut order = m
        .schedule
        .get(&offgnn_manifests::Split::Train)
        .and_then(|e| e.first())
        .cloned()
        .context("the layout has no training batches")?;
    if let Some(k) = batches {
        order.truncate(k);
    }
    let cfg = |features: FeatureMode, pipelined: bool| TrainConfig {
        model: ModelConfig {
            kind,
            in_dim: m.dataset.feature_dim as i64,
            hidden,
            classes: m.dataset.num_classes as i64,
            layers: m.samples.fanouts.len(),
            heads: 4,
            dropout: 0.5,
            scorer: None,
        },
        device,
        epochs: 1,
        lr: 0.003,
        seed: 0,
        features,
        pipelined,
        queue_depth: 2,
        loaders: 2,
        metrics: None,
        checkpoint_dir: None,
        resume: false,
        overwrite: false,
        show_progress: false,
        max_batches: Some(order.len()),
        checkpoint_every: None,
        export: None,
        dump: None,
        historical: None,
    };

    // The disk's sequential figure, on the objects the packed loader reads.
    let mut seq = disk_probe::Bandwidth {
        bytes: 0,
        seconds: 0.0,
    };
    for s in &m.segments {
        let b = disk_probe::sequential_read(&engine, &dir.join(&s.object), u64::MAX)?;
        seq.bytes += b.bytes;
        seq.seconds += b.seconds;
    }
    eprintln!("== bench: feature loading, packed then naive");
    // One loader against two, both timed on a warm second pass.
    let one_loader = TrainConfig {
        loaders: 1,
        ..cfg(FeatureMode::Packed, true)
    };
    let packed_one = load_parallel(&layout, &engine, &one_loader, &order)?;
    let packed = load_parallel(&layout, &engine, &cfg(FeatureMode::Packed, true), &order)?;
    let naive = load_parallel(&layout, &engine, &cfg(FeatureMode::Naive, true), &order)?;
    eprintln!("== bench: input path (stages 1-3), packed then naive");
    let path_packed = input_path(&layout, &engine, &cfg(FeatureMode::Packed, true), &order)?;
    let path_naive = input_path(&layout, &engine, &cfg(FeatureMode::Naive, true), &order)?;
    // The first steps of a process pay for its model's set-up (the
    // allocator's pools, OpenMP's threads; on a GPU its context, cuBLAS and
    // the kernels' first loads): an untimed epoch of a few batches takes
    // them, as DiskGNN leaves its first epoch out. The packed modes then run
    // twice each, sequential-pipelined-pipelined-sequential, so that a
    // machine speeding up or slowing down over the run favours neither.
    eprintln!("== bench: warm-up epoch ({WARM_UP_BATCHES} batches, untimed)");
    train(
        &layout,
        &engine,
        &TrainConfig {
            max_batches: Some(WARM_UP_BATCHES.min(order.len())),
            ..cfg(FeatureMode::Packed, false)
        },
    )?;
    eprintln!(
        "== bench: training epochs: packed sequential, pipelined, pipelined, sequential; naive pipelined"
    );
    let mut epochs = Vec::new();
    for (name, features, pipelined) in [
        (SEQUENTIAL, FeatureMode::Packed, false),
        (PIPELINED, FeatureMode::Packed, true),
        (PIPELINED, FeatureMode::Packed, true),
        (SEQUENTIAL, FeatureMode::Packed, false),
        (NAIVE, FeatureMode::Naive, true),
    ] {
        let s = train(&layout, &engine, &cfg(features, pipelined))?;
        epochs.push((name, s.epochs[0].clone()));
    }

    let mbps = |bytes: u64, secs: f64| bytes as f64 / secs / 1e6;
    let row_bytes = m.dataset.row_bytes;
    println!(
        "training bench: {} ({} nodes x {} B rows), {} training batches, {:?} on {device:?}, I/O {}",
        manifest,
        m.dataset.num_nodes,
        row_bytes,
        order.len(),
        kind,
        engine.backend()
    );
    println!(
        "  disk: sequential read of the segment objects {:.0} MB/s (O_DIRECT)",
        seq.bytes_per_second() / 1e6
    );
    println!(
        "  {:<17} {:>10} {:>12} {:>12} {:>10} {:>12}",
        "loading (2 loaders)", "seconds", "disk MB", "needed MB", "MB/s", "read amp"
    );
    for (name, f) in [
        ("packed, 1 loader", &packed_one),
        ("packed", &packed),
        ("naive", &naive),
    ] {
        println!(
            "  {name:<17} {:>10.2} {:>12.0} {:>12.0} {:>10.0} {:>12.2}",
            f.seconds,
            f.disk_bytes as f64 / 1e6,
            (f.disk_rows * row_bytes) as f64 / 1e6,
            mbps(f.disk_bytes, f.seconds),
            f.disk_bytes as f64 / (f.disk_rows * row_bytes).max(1) as f64
        );
    }
    let load_vs_seq = mbps(packed.disk_bytes, packed.seconds) / (seq.bytes_per_second() / 1e6);
    println!(
        "  packed loading throughput / sequential bandwidth: {:.0}%",
        100.0 * load_vs_seq
    );
    println!(
        "  naive / packed: {:.1}x the disk bytes, {:.1}x the loading time; input path (stages 1-3) {:.2} s vs {:.2} s: {:.1}x",
        naive.disk_bytes as f64 / packed.disk_bytes as f64,
        naive.seconds / packed.seconds,
        path_naive,
        path_packed,
        path_naive / path_packed
    );
    println!(
        "  {:<20} {:>10} {:>10} {:>10} {:>10} {:>10} {:>12}",
        "epoch", "train s", "load s", "asm s", "graph s", "model s", "disk MB"
    );
    for (name, e) in &epochs {
        println!(
            "  {name:<20} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>12.0}",
            e.train_seconds,
            e.stage_busy.load,
            e.stage_busy.assemble,
            e.stage_busy.graph,
            e.stage_busy.model,
            e.disk_bytes as f64 / 1e6
        );
    }
    // Each mode's mean epoch time over its runs, and its disk bytes (the
    // same in every run: the layout and the batches are).
    let of_mode = |mode: &str| {
        let runs: Vec<_> = epochs.iter().filter(|(n, _)| *n == mode).collect();
        let seconds = runs.iter().map(|(_, e)| e.train_seconds).sum::<f64>() / runs.len() as f64;
        (seconds, runs[0].1.disk_bytes)
    };
    let (pipelined, packed_bytes) = of_mode(PIPELINED);
    let (sequential, _) = of_mode(SEQUENTIAL);
    let (naive_epoch, naive_bytes) = of_mode(NAIVE);
    println!(
        "  pipelined / sequential: {:.2}x faster (means of 2 runs: {pipelined:.2} s, {sequential:.2} s); naive / packed pipelined epoch: {:.2}x the time, {:.1}x the disk bytes",
        sequential / pipelined,
        naive_epoch / pipelined,
        naive_bytes as f64 / packed_bytes.max(1) as f64
    );
    let load_json = |f: &LoadFigure| {
        json!({"seconds": f.seconds, "disk_bytes": f.disk_bytes, "needed_bytes": f.disk_rows * row_bytes,
               "mb_per_s": mbps(f.disk_bytes, f.seconds)})
    };
    println!(
        "{}",
        json!({
            "bench": "training",
            "manifest": manifest,
            "batches": order.len(),
            "device": format!("{device:?}"),
            "model": format!("{kind:?}"),
            "io_backend": engine.backend().to_string(),
            "sequential_read": seq,
            "loading": {"packed": load_json(&packed), "packed_one_loader": load_json(&packed_one), "naive": load_json(&naive),
                        "packed_over_sequential": load_vs_seq,
                        "naive_over_packed_bytes": naive.disk_bytes as f64 / packed.disk_bytes as f64,
                        "naive_over_packed_time": naive.seconds / packed.seconds},
            "input_path_seconds": {"packed": path_packed, "naive": path_naive},
            "epochs": epochs.iter().map(|(n, e)| json!({"mode": n, "metrics": e})).collect::<Vec<_>>(),
            "epoch_seconds": {"packed_pipelined": pipelined, "packed_sequential": sequential, "naive_pipelined": naive_epoch},
            "pipelined_speedup": sequential / pipelined,
            "naive_over_packed_epoch_time": naive_epoch / pipelined,
            "naive_over_packed_epoch_bytes": naive_bytes as f64 / packed_bytes.max(1) as f64,
        })
    );
    Ok(())
}
