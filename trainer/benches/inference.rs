//! Inference benchmark (`scripts/bench-infer`): `trainer infer` on a
//! generated graph whose feature file is larger than this machine's memory,
//! against the ideal of reading what the method must read (each layer's
//! input as stored, once per pass, and each group's bucketed edges once)
//! and writing its output once, at this disk's sequential bandwidth (probed
//! before and after the run, the faster kept), its peak RSS against
//! --memory, and the naive method (one read per in-edge's source row) timed
//! on a sample of destination blocks and extrapolated. The model is a
//! randomly initialised export: timing does not depend on the weights.
//! Figures are printed, not asserted. `OFFGNN_BENCH_INFER_DEVICE` (cpu,
//! cuda, cuda:N) runs the dense part there (and times its matmul floor
//! there), and `OFFGNN_BENCH_INFER_AGGREGATE` (auto, host, device) says
//! where the neighbor aggregation runs; `OFFGNN_BENCH_TRAINER` and `OFFGNN_BENCH_INFER_DATA` name the
//! trainer binary and the data folder where they are not in this
//! workspace (scripts/gpu-check-device on the GPU machine).

use std::path::{Path, PathBuf};
use std::process::Command;

use offgnn_shared::dataset::Dataset;
use offgnn_shared::disk_probe;
use offgnn_shared::io_engine::{IoEngine, IoOptions};
use sampler::synthetic::{GeneratorConfig, generate};
use tch::{Device, nn};
use trainer::export;
use trainer::model::{self, ModelConfig, ModelKind};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("trainer/ is in the workspace")
        .to_path_buf()
}

/// Runs `trainer` with `args`; returns its JSON summary and the peak
/// resident memory of this process's children so far, in bytes (the
/// streamed run is the first child, so its own peak).
fn trainer(args: &[&str]) -> (serde_json::Value, u64) {
    let bin = std::env::var_os("OFFGNN_BENCH_TRAINER")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/release/trainer"));
    let out = Command::new(&bin)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("trainer starts (scripts/bench-infer builds it)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "trainer {args:?} failed:\n{stderr}");
    // SAFETY: getrusage fills the struct it is given.
    let peak_kb = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage), 0);
        usage.ru_maxrss as u64
    };
    let json = serde_json::from_str(stdout.trim().lines().last().unwrap()).unwrap();
    (json, peak_kb * 1024)
}

/// Seconds this machine's libtorch takes to multiply `rows` rows of width
/// `width` by a `width x out` matrix on `device`, in chunks of 8192 rows
/// as the method does: timed here on random data until a second has passed.
fn matmul_seconds(device: Device, rows: u64, width: i64, out: i64) -> f64 {
    let chunk = rows.min(8192) as i64;
    let x = tch::Tensor::randn([chunk, width], (tch::Kind::Float, device));
    let w = tch::Tensor::randn([out, width], (tch::Kind::Float, device));
    let sync = || {
        if let Device::Cuda(i) = device {
            tch::Cuda::synchronize(i as i64);
        }
    };
    let _ = x.matmul(&w.tr());
    sync();
    let started = std::time::Instant::now();
    let mut done = 0u64;
    while started.elapsed().as_secs_f64() < 1.0 {
        let _ = x.matmul(&w.tr());
        done += chunk as u64;
        if done.is_multiple_of(64 * chunk as u64) {
            sync();
        }
    }
    sync();
    started.elapsed().as_secs_f64() / done as f64 * rows as f64
}

fn gb(bytes: f64) -> String {
    format!("{:.2} GB", bytes / 1e9)
}

fn main() {
    let nodes = env_u64("OFFGNN_BENCH_INFER_NODES", 3_200_000);
    let dim = env_u64("OFFGNN_BENCH_INFER_DIM", 2048);
    let hidden = env_u64("OFFGNN_BENCH_INFER_HIDDEN", 128) as i64;
    let memory = std::env::var("OFFGNN_BENCH_INFER_MEMORY").unwrap_or_else(|_| "12G".into());
    let kind = match std::env::var("OFFGNN_BENCH_INFER_MODEL").as_deref() {
        Ok("gat") => ModelKind::Gat,
        _ => ModelKind::Sage,
    };
    // Hidden layers on disk as f32 (4 bytes a value) or f16 (2).
    let hidden_dtype =
        std::env::var("OFFGNN_BENCH_INFER_HIDDEN_DTYPE").unwrap_or_else(|_| "f32".into());
    let hidden_elem = match hidden_dtype.as_str() {
        "f32" => 4.0,
        "f16" => 2.0,
        other => panic!("OFFGNN_BENCH_INFER_HIDDEN_DTYPE={other}: expected f32 or f16"),
    };
    let device_flag = std::env::var("OFFGNN_BENCH_INFER_DEVICE").unwrap_or_else(|_| "cpu".into());
    let device = trainer::device::parse_device(&device_flag).expect("OFFGNN_BENCH_INFER_DEVICE");
    let aggregate = std::env::var("OFFGNN_BENCH_INFER_AGGREGATE").unwrap_or_else(|_| "auto".into());
    let root = std::env::var_os("OFFGNN_BENCH_INFER_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("data/bench-infer"));
    let ds_path = root.join(format!("g{}k-d{dim}", nodes / 1000));
    if !ds_path.join("metadata.yaml").exists() {
        eprintln!("== bench: generating {}", ds_path.display());
        generate(
            &ds_path,
            &GeneratorConfig {
                num_nodes: nodes,
                avg_degree: 10.0,
                feature_dim: dim,
                num_classes: 16,
                train_fraction: 0.01,
                valid_fraction: 0.01,
                test_fraction: Some(0.01),
                seed: 7,
                ..Default::default()
            },
            true,
            true,
        )
        .expect("generating the graph");
    }
    let ds = Dataset::open(&ds_path).unwrap();
    let feat = ds.features.path().to_path_buf();
    let feat_bytes = std::fs::metadata(&feat).unwrap().len();
    // A pass over the features reads their rows from the page the data
    // starts on (not the header's pages before it).
    let feat_pass_bytes = ds.features.header().data_offset % 4096 + nodes * ds.features.row_bytes();

    // A random model of the dataset, exported as training would.
    let cfg = ModelConfig {
        kind,
        in_dim: dim as i64,
        hidden,
        classes: ds.num_classes as i64,
        layers: 3,
        heads: 4,
        dropout: 0.0,
        scorer: None,
    };
    let vs = nn::VarStore::new(Device::Cpu);
    let _net = model::build(&vs.root(), &cfg);
    let model_dir = root.join(format!("model-{kind:?}").to_lowercase());
    let from = export::Provenance {
        feature_dtype: "float32".into(),
        dataset_fingerprint: ds.fingerprint().unwrap(),
        feature_fingerprint: offgnn_shared::dataset::file_fingerprint(ds.features.path()).unwrap(),
        samples_run_sha256: "random".into(),
        graph: None,
        which: "best".into(),
        epoch: 0,
        valid_acc: 0.0,
        test_acc: 0.0,
        mrr: None,
    };
    let model_loc = model_dir.to_str().unwrap().to_string();
    export::write(
        &model_loc,
        &cfg,
        &export::snapshot(&vs).unwrap(),
        &from,
        true,
    )
    .unwrap();

    let engine = IoEngine::new(IoOptions::default());
    let probe = |tag: &str| {
        let r = disk_probe::sequential_read(&engine, &feat, 4 << 30).unwrap();
        let w =
            disk_probe::sequential_write(&root.join(format!("probe-{tag}.bin")), 2 << 30).unwrap();
        (r.bytes_per_second(), w.bytes_per_second())
    };
    let before = probe("before");
    let out = root.join("out");
    let work = root.join("work");
    let ds_s = ds_path.to_str().unwrap();
    let (json, peak) = trainer(&[
        "infer",
        "--model",
        &model_loc,
        "--dataset",
        ds_s,
        "--out",
        out.to_str().unwrap(),
        "--work-dir",
        work.to_str().unwrap(),
        "--memory",
        &memory,
        "--outputs",
        "class,embeddings",
        "--hidden-dtype",
        &hidden_dtype,
        "--device",
        &device_flag,
        "--aggregate",
        &aggregate,
        "--overwrite",
    ]);
    let after = probe("after");
    let (read_bw, write_bw) = (before.0.max(after.0), before.1.max(after.1));
    let s = &json["summary"];
    let memory_limit = s["memory_limit"].as_u64().unwrap();

    let (naive, _) = trainer(&[
        "infer",
        "--model",
        &model_loc,
        "--dataset",
        ds_s,
        "--out",
        out.to_str().unwrap(),
        "--method",
        "naive",
        "--naive-blocks",
        "16",
        "--device",
        &device_flag,
    ]);
    let naive = &naive["summary"];

    println!(
        "inference benchmark: {nodes} nodes, {dim}-d float32 features ({}), {kind:?} hidden {hidden} ({hidden_dtype} on disk), 3 layers, --memory {memory}, --device {device_flag}, aggregating on the {}",
        gb(feat_bytes as f64),
        s["aggregate"].as_str().unwrap_or("host")
    );
    println!(
        "  disk: sequential read {:.0} MB/s, write {:.0} MB/s (probed before: {:.0} / {:.0}, after: {:.0} / {:.0})",
        read_bw / 1e6,
        write_bw / 1e6,
        before.0 / 1e6,
        before.1 / 1e6,
        after.0 / 1e6,
        after.1 / 1e6
    );
    println!(
        "  plan: {} groups, chunks of {} rows, edges bucketed in {:.1} s",
        s["groups"],
        s["chunk_rows"],
        s["edge_bucketing_seconds"].as_f64().unwrap()
    );
    let mut layers = Vec::new();
    for (i, l) in s["layers"].as_array().unwrap().iter().enumerate() {
        let passes = l["passes"].as_u64().unwrap() as f64;
        // What the method must read: the layer's input as stored, once per
        // pass (f32 or f16 hidden rows), and each group's edge buckets once.
        let in_bytes = if i == 0 {
            feat_pass_bytes as f64
        } else {
            nodes as f64 * l["in_width"].as_f64().unwrap() * hidden_elem
        };
        let edge_bytes = l["edge_bytes_read"].as_f64().unwrap();
        let must_read = passes * in_bytes + edge_bytes;
        let read = l["bytes_read"].as_f64().unwrap() + edge_bytes;
        let written = l["bytes_written"].as_f64().unwrap();
        let ideal = must_read / read_bw + written / write_bw;
        // The dense part every node's row goes through, whatever the I/O:
        // GraphSAGE's lin_l and lin_r; GAT's lin (every head) and res.
        let (w_in, w_out) = (
            l["in_width"].as_i64().unwrap(),
            l["out_width"].as_i64().unwrap(),
        );
        let last = i + 1 == s["layers"].as_array().unwrap().len();
        let dense_out = match kind {
            ModelKind::Gat if last => w_out * cfg.heads + w_out,
            _ => 2 * w_out,
        };
        let floor = matmul_seconds(device, nodes, w_in, dense_out);
        let secs = l["seconds"].as_f64().unwrap();
        println!(
            "  layer {}: {} -> {}, {} passes, read {} of input and {} of edges ({:.3}x what it must), wrote {}: {:.1} s (waiting on the disk {:.1} s, projecting and scattering {:.1} s), ideal {:.1} s, {:.2}x; the matmuls alone take {:.1} s here, {:.2}x the larger of the two",
            i + 1,
            l["in_width"],
            l["out_width"],
            passes,
            gb(l["bytes_read"].as_f64().unwrap()),
            gb(edge_bytes),
            read / must_read,
            gb(written),
            secs,
            l["io_wait_seconds"].as_f64().unwrap(),
            l["scatter_seconds"].as_f64().unwrap(),
            ideal,
            secs / ideal,
            floor,
            secs / ideal.max(floor)
        );
        layers.push(serde_json::json!({"layer": i + 1, "seconds": secs, "ideal_seconds": ideal, "ratio": secs / ideal, "must_read_bytes": must_read, "read_bytes": read, "matmul_floor_seconds": floor, "ratio_to_larger": secs / ideal.max(floor)}));
    }
    let layer1 = s["layers"][0]["seconds"].as_f64().unwrap();
    let naive_secs = naive["extrapolated_seconds"].as_f64().unwrap();
    println!(
        "  peak RSS {} against --memory {} ({:.2}x)",
        gb(peak as f64),
        gb(memory_limit as f64),
        peak as f64 / memory_limit as f64
    );
    println!(
        "  naive first layer (one read per in-edge, {} edges sampled in {:.1} s): {:.0} s extrapolated, {:.1}x the streamed layer's {:.1} s",
        naive["sample_edges"],
        naive["seconds"].as_f64().unwrap(),
        naive_secs,
        naive_secs / layer1,
        layer1
    );
    println!(
        "{}",
        serde_json::json!({
            "bench": "infer",
            "device": device_flag,
            "aggregate": s["aggregate"],
            "nodes": nodes,
            "feature_bytes": feat_bytes,
            "hidden_dtype": hidden_dtype,
            "read_bytes_per_second": read_bw,
            "write_bytes_per_second": write_bw,
            "layers": layers,
            "peak_rss_bytes": peak,
            "memory_limit": memory_limit,
            "naive_extrapolated_seconds": naive_secs,
            "naive_over_streamed_layer1": naive_secs / layer1,
            "summary": s,
        })
    );
}
