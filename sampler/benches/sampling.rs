//! Sampling throughput against DGL's CPU neighbor sampler, side by side in
//! one run on the same graph and the same seed batches.
//!
//! Run through `scripts/bench-sampler`, which prepares the graph and DGL's
//! throwaway virtualenv. Environment:
//! - `OFFGNN_BENCH_DATASETS`: `name=dir` pairs, comma-separated (or
//!   `OFFGNN_BENCH_DATASET`: one directory);
//! - `OFFGNN_BENCH_BATCHES`: batches per measurement (default 100);
//! - `OFFGNN_BENCH_PAIRS`: alternating offgnn/DGL pairs per figure, whose
//!   median is reported (default 3);
//! - `OFFGNN_DGL_PYTHON`: a Python with dgl==2.1.0 (DGL is skipped without it);
//! - `OFFGNN_SAMPLER_BIN`: the `sampler` binary, for the job end to end;
//! - `OFFGNN_BENCH_JOB_DATASETS`: the names of the datasets whose job is
//!   run (default all).
//!
//! The kernel table times sampling alone (blocks built, ids compacted), the
//! same work `dgl.dataloading.NeighborSampler.sample_blocks` does. The job
//! table runs the `sampler` binary over the dataset's splits at all cores
//! (topology built, every batch sampled, Parquet written, committed) and
//! sets its sampled edges per second, for the sampling stage and for the
//! whole job, beside DGL's kernel at as many threads.

use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};
use offgnn_shared::dataset::{Dataset, Split};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rayon::prelude::*;
use sampler::neighbor_sampling::{Scratch, batch_rng, sample_blocks};
use sampler::topology::{Csr, CsrOptions};

const FANOUTS: [usize; 3] = [10, 15, 20];
const BATCH: usize = 1024;

struct Measure {
    threads: usize,
    batches: usize,
    edges: u64,
    seconds: f64,
}

/// Per-thread scratch (a node-sized map), made once and kept across runs:
/// the sampler makes one per thread per job and keeps it for thousands of
/// batches, so its first touch (40 MB on the 10M-node graph, about 0.1 s
/// on this VM) is set-up, as DGL's graph loading and warm-up batch are.
type ScratchPool = std::sync::Mutex<Vec<Scratch>>;

fn ours(
    csr: &Csr,
    batches: &[Vec<u32>],
    threads: usize,
    scratch: &ScratchPool,
) -> anyhow::Result<Measure> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
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

/// One run of the `sampler` job.
struct Job {
    edges: u64,
    bytes: u64,
    stage_seconds: f64,
    job_seconds: f64,
}

/// Runs `sampler` over `dataset` at `threads` into a scratch directory
/// (removed after), with the kernel table's fan-out and batch size.
fn job(bin: &str, dataset: &str, threads: usize) -> anyhow::Result<Job> {
    let out = std::env::temp_dir().join(format!("offgnn-bench-job-{}", std::process::id()));
    let run = Command::new(bin)
        .args(["--dataset", dataset, "--out"])
        .arg(&out)
        .args(["--fanout", "10,15,20", "--batch-size", &BATCH.to_string()])
        .args([
            "--epochs",
            "1",
            "--threads",
            &threads.to_string(),
            "--overwrite",
        ])
        .output()
        .with_context(|| format!("running {bin}"));
    let _ = std::fs::remove_dir_all(&out);
    let run = run?;
    if !run.status.success() {
        bail!("sampler failed: {}", String::from_utf8_lossy(&run.stderr));
    }
    let stdout = String::from_utf8_lossy(&run.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    let j: serde_json::Value =
        serde_json::from_str(line).with_context(|| format!("sampler printed {line}"))?;
    Ok(Job {
        edges: j["edges"].as_u64().unwrap_or(0),
        bytes: j["bytes"].as_u64().unwrap_or(0),
        stage_seconds: j["sample_seconds"].as_f64().unwrap_or(f64::NAN),
        job_seconds: j["run"]["seconds"].as_f64().unwrap_or(f64::NAN),
    })
}

/// The job table: each named dataset's `sampler` job at `threads`, the
/// median of `pairs` runs, beside DGL's kernel rate at as many threads
/// (`dgl`: name to edges/s, from the kernel table).
fn job_table(
    sets: &[(String, String)],
    threads: usize,
    pairs: usize,
    dgl: &[(String, f64)],
) -> anyhow::Result<Vec<serde_json::Value>> {
    let Ok(bin) = std::env::var("OFFGNN_SAMPLER_BIN") else {
        eprintln!("OFFGNN_SAMPLER_BIN is not set: the job end to end is not measured");
        return Ok(Vec::new());
    };
    let wanted = std::env::var("OFFGNN_BENCH_JOB_DATASETS").ok();
    println!(
        "sampler job end to end (topology, every split sampled, Parquet written, commit), fan-out 10,15,20, batch {BATCH}, {threads} threads, median of {pairs}"
    );
    println!(
        "  {:<10} {:>14} {:>10} {:>16} {:>16} {:>16} {:>11} {:>11}",
        "graph",
        "sampled edges",
        "B/edge",
        "stage edges/s",
        "job edges/s",
        "dgl kernel",
        "stage/dgl",
        "job/dgl"
    );
    let mut json = Vec::new();
    for (name, path) in sets {
        if wanted
            .as_ref()
            .is_some_and(|w| !w.split(',').any(|n| n == name))
        {
            continue;
        }
        let runs = (0..pairs)
            .map(|_| job(&bin, path, threads))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let rate = |f: fn(&Job) -> f64| {
            median(
                &runs
                    .iter()
                    .map(|r| r.edges as f64 / f(r))
                    .collect::<Vec<_>>(),
            )
        };
        let (stage, whole) = (rate(|r| r.stage_seconds), rate(|r| r.job_seconds));
        let dgl = dgl
            .iter()
            .find(|(n, _)| n == name)
            .map_or(f64::NAN, |d| d.1);
        let (edges, bytes) = (runs[0].edges, runs[0].bytes);
        println!(
            "  {name:<10} {edges:>14} {:>10.2} {stage:>16.0} {whole:>16.0} {dgl:>16.0} {:>10.2}x {:>10.2}x",
            bytes as f64 / edges.max(1) as f64,
            stage / dgl,
            whole / dgl
        );
        json.push(serde_json::json!({
            "graph": name, "threads": threads, "runs": pairs, "edges": edges, "bytes": bytes,
            "stage_edges_per_s": stage, "job_edges_per_s": whole, "dgl_kernel_edges_per_s": dgl,
            "stage_seconds": runs.iter().map(|r| r.stage_seconds).collect::<Vec<_>>(),
            "job_seconds": runs.iter().map(|r| r.job_seconds).collect::<Vec<_>>(),
        }));
    }
    Ok(json)
}

/// Seed batches of `BATCH` nodes drawn from every node (a benchmark of
/// sampling, not of a training split's size), the same for both systems:
/// shuffles of all nodes back to back, so that a small graph (Cora) still
/// gives `n` batches.
fn seed_batches(num_nodes: u32, n: usize) -> Vec<Vec<u32>> {
    let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(0);
    let mut seeds: Vec<u32> = Vec::with_capacity(n * BATCH);
    while seeds.len() < n * BATCH && num_nodes > 0 {
        let mut all: Vec<u32> = (0..num_nodes).collect();
        all.shuffle(&mut rng);
        seeds.extend(all);
    }
    seeds.chunks(BATCH).take(n).map(<[u32]>::to_vec).collect()
}

/// The median of `v` (NaN when empty).
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Per core, one measure: (batches/s, edges/s).
fn per_core(m: &Measure) -> (f64, f64) {
    let t = m.threads as f64;
    (
        m.batches as f64 / m.seconds / t,
        m.edges as f64 / m.seconds / t,
    )
}

fn main() -> anyhow::Result<()> {
    // `name=dir` pairs, comma-separated; or one directory.
    let sets: Vec<(String, String)> = match (
        std::env::var("OFFGNN_BENCH_DATASETS"),
        std::env::var("OFFGNN_BENCH_DATASET"),
    ) {
        (Ok(list), _) => list
            .split(',')
            .map(|e| {
                e.split_once('=')
                    .map(|(n, d)| (n.to_string(), d.to_string()))
                    .with_context(|| format!("OFFGNN_BENCH_DATASETS entry {e}: want name=dir"))
            })
            .collect::<anyhow::Result<_>>()?,
        (_, Ok(dir)) => vec![("graph".to_string(), dir)],
        _ => {
            eprintln!(
                "OFFGNN_BENCH_DATASETS is not set: nothing to measure (see scripts/bench-sampler)"
            );
            return Ok(());
        }
    };
    let env_usize = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let n_batches = env_usize("OFFGNN_BENCH_BATCHES", 100);
    // DGL's rate swings by half between runs here: each figure is the
    // median of this many ours-then-DGL pairs.
    let pairs = env_usize("OFFGNN_BENCH_PAIRS", 3).max(1);
    let python = std::env::var("OFFGNN_DGL_PYTHON").ok();
    if python.is_none() {
        eprintln!("OFFGNN_DGL_PYTHON is not set: DGL is not measured");
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut threads = vec![1];
    if cores > 1 {
        threads.push(cores);
    }

    println!(
        "sampling, fan-out 10,15,20, batch {BATCH}, {n_batches} batches a run, median of {pairs} alternating pairs"
    );
    println!(
        "  {:<10} {:>10} {:>7} {:>16} {:>16} {:>18} {:>18} {:>22}",
        "graph",
        "edges/node",
        "threads",
        "offgnn batches/s",
        "dgl batches/s",
        "offgnn edges/s",
        "dgl edges/s",
        "offgnn/dgl (min-max)"
    );
    println!(
        "  {:<10} {:>10} {:>7} {:>16} {:>16} {:>18} {:>18}",
        "", "", "", "per core", "per core", "per core", "per core"
    );
    let mut json = Vec::new();
    // DGL's kernel at all cores, edges/s, for the job table.
    let mut dgl_at_cores = Vec::new();
    for (name, path) in &sets {
        let ds = Dataset::open(path)?;
        let started = Instant::now();
        // The graph the sampler samples: repeated edges kept once (DGL's
        // side deduplicates too, with dgl.to_simple).
        let opts = CsrOptions {
            dedup: true,
            ..CsrOptions::default()
        };
        let csr = Csr::from_edge_list(&ds.edges, opts, |_| {})?;
        let degree = csr.num_edges() as f64 / csr.num_nodes().max(1) as f64;
        eprintln!(
            "{name}: {} nodes, {} edges, CSR built in {:.1} s",
            csr.num_nodes(),
            csr.num_edges(),
            started.elapsed().as_secs_f64()
        );
        let batches = seed_batches(csr.num_nodes() as u32, n_batches);
        let flat: Vec<u64> = batches.iter().flatten().map(|&s| s as u64).collect();
        let seeds_file =
            std::env::temp_dir().join(format!("offgnn-bench-seeds-{}.npy", std::process::id()));
        offgnn_shared::npy::write_i64(&seeds_file, &flat)?;
        // Warm the page cache and make each thread's scratch before timing.
        let scratch: ScratchPool =
            std::sync::Mutex::new((0..cores).map(|_| Scratch::new(csr.num_nodes())).collect());
        ours(&csr, &batches[..batches.len().min(4)], 1, &scratch)?;
        for &t in &threads {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for _ in 0..pairs {
                a.push(per_core(&ours(&csr, &batches, t, &scratch)?));
                if let Some(py) = &python {
                    b.push(per_core(&dgl(
                        py,
                        path,
                        seeds_file.to_str().unwrap_or_default(),
                        t,
                    )?));
                }
            }
            let ratios: Vec<f64> = a.iter().zip(&b).map(|(x, y)| x.0 / y.0).collect();
            let col = |v: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| {
                median(&v.iter().map(f).collect::<Vec<_>>())
            };
            let (ob, oe) = (col(&a, |x| x.0), col(&a, |x| x.1));
            let (db, de) = (col(&b, |x| x.0), col(&b, |x| x.1));
            let (lo, hi) = ratios
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &r| {
                    (l.min(r), h.max(r))
                });
            if t == cores {
                dgl_at_cores.push((name.clone(), de * t as f64));
            }
            println!(
                "  {name:<10} {degree:>10.1} {t:>7} {ob:>16.1} {db:>16.1} {oe:>18.0} {de:>18.0} {:>10.2}x ({lo:.2}-{hi:.2})",
                median(&ratios)
            );
            json.push(serde_json::json!({
                "graph": name, "dataset": path, "nodes": csr.num_nodes(), "edges": csr.num_edges(),
                "threads": t, "pairs": pairs, "batches": n_batches,
                "offgnn_batches_per_s_per_core": ob, "offgnn_edges_per_s_per_core": oe,
                "dgl_batches_per_s_per_core": db, "dgl_edges_per_s_per_core": de,
                "ratio_median": median(&ratios), "ratios": ratios,
            }));
        }
        let _ = std::fs::remove_file(&seeds_file);
    }
    let jobs = job_table(&sets, cores, pairs, &dgl_at_cores)?;
    println!(
        "{}",
        serde_json::json!({ "bench": "sampling", "runs": json, "jobs": jobs })
    );
    Ok(())
}
