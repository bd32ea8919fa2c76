//! Sampling throughput against DGL's CPU neighbor sampler, side by side in
//! one run on the same graph and the same seed batches.
//!
//! Run through `scripts/bench-sampler`, which prepares the graph and DGL's
//! throwaway virtualenv. Environment:
//! - `OFFGNN_BENCH_DATASET`: the dataset directory (required);
//! - `OFFGNN_BENCH_BATCHES`: batches per measurement (default 100);
//! - `OFFGNN_DGL_PYTHON`: a Python with dgl==2.1.0 (DGL is skipped without it).
//!
//! What is timed is sampling alone (blocks built, ids compacted), the same
//! work `dgl.dataloading.NeighborSampler.sample_blocks` does; writing
//! Parquet is measured by the sampler binary's own summary.

use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};
use offgnn_shared::dataset::{Dataset, Split};
use offgnn_shared::topology::{Csr, CsrOptions};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rayon::prelude::*;
use sampler::neighbor_sampling::{Scratch, batch_rng, sample_blocks};

const FANOUTS: [usize; 3] = [10, 15, 20];
const BATCH: usize = 1024;

struct Measure {
    threads: usize,
    batches: usize,
    edges: u64,
    seconds: f64,
}

fn ours(csr: &Csr, batches: &[Vec<u32>], threads: usize) -> anyhow::Result<Measure> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let scratch = std::sync::Mutex::new(Vec::<Scratch>::new());
    let started = Instant::now();
    let edges: u64 = pool.install(|| {
        batches
            .par_iter()
            .enumerate()
            .map(|(i, seeds)| {
                let mut mine = scratch
                    .lock()
                    .expect("scratch pool")
                    .pop()
                    .unwrap_or_else(|| Scratch::new(csr.num_nodes()));
                let mut rng = batch_rng(0, Split::Train, 0, i as u32);
                let (_, blocks) = sample_blocks(csr, &FANOUTS, seeds, &mut rng, &mut mine);
                scratch.lock().expect("scratch pool").push(mine);
                blocks.iter().map(|b| b.src.len() as u64).sum::<u64>()
            })
            .sum()
    });
    Ok(Measure {
        threads,
        batches: batches.len(),
        edges,
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn dgl(python: &str, dataset: &str, seeds_file: &str, threads: usize) -> anyhow::Result<Measure> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../scripts/bench/dgl_sampling.py"
    );
    let out = Command::new(python)
        .args([script, "--dataset", dataset, "--seeds", seeds_file])
        .args(["--batch-size", &BATCH.to_string(), "--fanouts", "10,15,20"])
        .args(["--threads", &threads.to_string()])
        .output()
        .with_context(|| format!("running {python} {script}"))?;
    if !out.status.success() {
        bail!(
            "DGL benchmark failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    let j: serde_json::Value =
        serde_json::from_str(line).with_context(|| format!("DGL printed {line}"))?;
    Ok(Measure {
        threads,
        batches: j["batches"].as_u64().unwrap_or(0) as usize,
        edges: j["edges"].as_u64().unwrap_or(0),
        seconds: j["seconds"].as_f64().unwrap_or(f64::NAN),
    })
}

fn main() -> anyhow::Result<()> {
    let Ok(path) = std::env::var("OFFGNN_BENCH_DATASET") else {
        eprintln!(
            "OFFGNN_BENCH_DATASET is not set: nothing to measure (see scripts/bench-sampler)"
        );
        return Ok(());
    };
    let n_batches: usize = std::env::var("OFFGNN_BENCH_BATCHES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let ds = Dataset::open(&path)?;
    let started = Instant::now();
    // The graph the sampler samples: repeated edges kept once (DGL's side
    // deduplicates too, with dgl.to_simple).
    let opts = CsrOptions {
        dedup: true,
        ..CsrOptions::default()
    };
    let csr = Csr::from_edge_list(&ds.edges, opts, |_| {})?;
    eprintln!(
        "graph: {} nodes, {} edges, CSR built in {:.1} s",
        csr.num_nodes(),
        csr.num_edges(),
        started.elapsed().as_secs_f64()
    );
    // Seed batches drawn from every node (a benchmark of sampling, not of
    // the training split's size), the same for both systems.
    let mut seeds: Vec<u32> = (0..csr.num_nodes() as u32).collect();
    seeds.shuffle(&mut rand_pcg::Pcg64Mcg::seed_from_u64(0));
    let batches: Vec<Vec<u32>> = seeds
        .chunks(BATCH)
        .take(n_batches)
        .map(<[u32]>::to_vec)
        .collect();
    let flat: Vec<u64> = batches.iter().flatten().map(|&s| s as u64).collect();
    let seeds_file =
        std::env::temp_dir().join(format!("offgnn-bench-seeds-{}.npy", std::process::id()));
    offgnn_shared::npy::write_i64(&seeds_file, &flat)?;

    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut rows = Vec::new();
    // Warm the page cache and the allocator once before timing.
    ours(&csr, &batches[..batches.len().min(4)], 1)?;
    rows.push(("offgnn", ours(&csr, &batches, 1)?));
    if cores > 1 {
        rows.push(("offgnn", ours(&csr, &batches, cores)?));
    }
    drop(csr);
    if let Ok(python) = std::env::var("OFFGNN_DGL_PYTHON") {
        rows.push((
            "dgl",
            dgl(&python, &path, seeds_file.to_str().unwrap_or_default(), 1)?,
        ));
        if cores > 1 {
            rows.push((
                "dgl",
                dgl(
                    &python,
                    &path,
                    seeds_file.to_str().unwrap_or_default(),
                    cores,
                )?,
            ));
        }
    } else {
        eprintln!("OFFGNN_DGL_PYTHON is not set: DGL is not measured");
    }
    let _ = std::fs::remove_file(&seeds_file);

    println!("sampling throughput, fan-out 10,15,20, batch {BATCH}, {n_batches} batches, {path}");
    println!(
        "  {:<8} {:>7} {:>12} {:>16} {:>18} {:>20}",
        "system", "threads", "batches/s", "edges/s", "batches/s/core", "edges/s/core"
    );
    let mut json = Vec::new();
    for (system, m) in &rows {
        let bps = m.batches as f64 / m.seconds;
        let eps = m.edges as f64 / m.seconds;
        println!(
            "  {system:<8} {:>7} {bps:>12.2} {eps:>16.0} {:>18.2} {:>20.0}",
            m.threads,
            bps / m.threads as f64,
            eps / m.threads as f64
        );
        json.push(serde_json::json!({
            "system": system, "threads": m.threads, "batches": m.batches, "edges": m.edges,
            "seconds": m.seconds, "batches_per_s": bps, "edges_per_s": eps,
            "batches_per_s_per_core": bps / m.threads as f64, "edges_per_s_per_core": eps / m.threads as f64,
        }));
    }
    let per_core = |system: &str, threads: usize| {
        rows.iter()
            .find(|(s, m)| *s == system && m.threads == threads)
            .map(|(_, m)| m.batches as f64 / m.seconds / threads as f64)
    };
    let mut ratios = serde_json::Map::new();
    for threads in [1, cores] {
        if let (Some(a), Some(b)) = (per_core("offgnn", threads), per_core("dgl", threads)) {
            println!(
                "  offgnn / dgl, batches/s per core at {threads} thread(s): {:.2}x",
                a / b
            );
            ratios.insert(format!("threads_{threads}"), serde_json::json!(a / b));
        }
    }
    println!(
        "{}",
        serde_json::json!({ "bench": "sampling", "dataset": path, "rows": json, "ratio_offgnn_over_dgl_per_core": ratios })
    );
    Ok(())
}
