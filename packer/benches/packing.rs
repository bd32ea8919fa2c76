//! The packer's claims, measured side by side in one run (DiskGNN §5.1,
//! §5.2, Table 4):
//!
//! 1. batched packing against individual packing (one aligned O_DIRECT read
//!    per needed row per batch, many in flight through the I/O engine) on the
//!    same samples, features and plan — the page cache emptied of the feature
//!    file before each. Batched packing runs once before the individual run
//!    and `OFFGNN_BENCH_REPEATS` times (default 5) after it: on a VM whose
//!    host backs guest memory lazily, the first touch of the partition
//!    buffers costs far more than a later one, so the first run is shown
//!    apart, and the later runs give the median;
//! 2. the batched packer's wall time against the ideal of reading the feature
//!    file once and writing its output once (every object of the layout:
//!    feature blocks, address tables, topology) at this disk's sequential
//!    bandwidth (both measured here, O_DIRECT, right before and right after
//!    each batched run, the faster of the two kept: this virtual disk's
//!    bandwidth drifts by tens of percent within minutes, and the faster
//!    probe gives the smaller ideal, so the ratio errs against the packer),
//!    for every run; the median ratio is the figure, with the lowest and
//!    highest beside it;
//! 3. the predicted read amplification at disk budgets 3x, 5x and 7x on each
//!    of the graphs in `OFFGNN_BENCH_AMP` (caches of size zero, so that every
//!    access is a disk access).
//!
//! Run through `scripts/bench-packer`, which generates and samples the graphs.
//! Environment:
//! - `OFFGNN_BENCH_SAMPLES`, `OFFGNN_BENCH_FEATURES`: the large run (1, 2);
//! - `OFFGNN_BENCH_OUT`: scratch directory (default `data/bench-pack`); the
//!   batched layout is left in `<out>/batched` for the trainer's bench;
//! - `OFFGNN_BENCH_GPU_CACHE`, `_CPU_CACHE`, `_BUDGET`, `_MEMORY`: the large
//!   run's flags (default 512M, 1G, 3x, 4G);
//! - `OFFGNN_BENCH_REPEATS`: batched runs after the individual one (default 5);
//! - `OFFGNN_BENCH_AMP`: `name=samples|features` pairs, comma-separated (3).
//!
//! Prints a table per part, then one JSON line with every figure.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use offgnn_shared::disk_probe::{self, Bandwidth};
use offgnn_shared::io_engine::{IoEngine, IoOptions};
use packer::pack::{DiskCacheMode, PackConfig, PackSummary, PackingMode, pack};
use packer::sizes::{Budget, parse_budget, parse_bytes};
use serde_json::json;

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn bytes_flag(name: &str, default: &str) -> anyhow::Result<u64> {
    let text = env_or(name, default);
    parse_bytes(&text).with_context(|| format!("{name}={text}"))
}

fn config(samples: &str, features: &str, out: &Path) -> anyhow::Result<PackConfig> {
    let budget = env_or("OFFGNN_BENCH_BUDGET", "3x");
    Ok(PackConfig {
        samples: samples.to_string(),
        features: features.to_string(),
        out: out.to_str().context("a UTF-8 output path")?.to_string(),
        gpu_cache: bytes_flag("OFFGNN_BENCH_GPU_CACHE", "512M")?,
        cpu_cache: bytes_flag("OFFGNN_BENCH_CPU_CACHE", "1G")?,
        disk_budget: parse_budget(&budget).with_context(|| format!("budget {budget}"))?,
        memory: bytes_flag("OFFGNN_BENCH_MEMORY", "4G")?,
        segment_size: None,
        packing: PackingMode::Batched,
        disk_cache: DiskCacheMode::Segmented,
        store_dtype: None,
        row_order: packer::pack::RowOrder::DEFAULT,
        cpu_cache_policy: packer::pack::CpuCachePolicy::Static,
        rank_by: packer::pack::RankBy::Samples,
        overwrite: true,
        show_progress: true,
    })
}

/// Packs with the feature file out of the page cache.
fn timed_pack(cfg: &PackConfig) -> anyhow::Result<PackSummary> {
    disk_probe::evict_from_page_cache(Path::new(&cfg.features))?;
    eprintln!("== bench: packing {:?} into {}", cfg.packing, cfg.out);
    pack(cfg).with_context(|| format!("packing into {}", cfg.out))
}

fn remove(dir: &Path) -> anyhow::Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    Ok(())
}

/// One batched run with the disk probed right before and right after it.
struct Trial {
    summary: PackSummary,
    /// (read, write) before and after the run.
    probes: [(Bandwidth, Bandwidth); 2],
    /// The faster probe of each kind, the ideal's.
    read: Bandwidth,
    write: Bandwidth,
    ideal: f64,
    ratio: f64,
}

impl Trial {
    fn json(&self) -> serde_json::Value {
        let [(r0, w0), (r1, w1)] = self.probes;
        json!({
            "total_seconds": self.summary.total_seconds,
            "load_seconds": self.summary.load_seconds,
            "plan_seconds": self.summary.plan_seconds,
            "pack_seconds": self.summary.pack_seconds,
            "ideal_seconds": self.ideal,
            "batched_over_ideal": self.ratio,
            "probes": {"before": {"read": r0, "write": w0}, "after": {"read": r1, "write": w1}},
        })
    }
}

fn main() -> anyhow::Result<()> {
    let out = PathBuf::from(env_or("OFFGNN_BENCH_OUT", "data/bench-pack"));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let mut report = serde_json::Map::new();

    if let (Ok(samples), Ok(features)) = (
        std::env::var("OFFGNN_BENCH_SAMPLES"),
        std::env::var("OFFGNN_BENCH_FEATURES"),
    ) {
        let feature_bytes = std::fs::metadata(&features)
            .with_context(|| format!("reading {features}"))?
            .len();
        let repeats: usize = env_or("OFFGNN_BENCH_REPEATS", "5")
            .parse()
            .context("OFFGNN_BENCH_REPEATS")?;
        anyhow::ensure!(repeats >= 1, "OFFGNN_BENCH_REPEATS must be at least 1");
        let batched_dir = out.join("batched");
        // One batched run between two probes of this disk's sequential
        // figures (O_DIRECT); the faster probe of each kind gives the ideal.
        let trial = || -> anyhow::Result<Trial> {
            let probe = || -> anyhow::Result<(Bandwidth, Bandwidth)> {
                let engine = IoEngine::new(IoOptions::default());
                let read = disk_probe::sequential_read(&engine, Path::new(&features), u64::MAX)?;
                let write = disk_probe::sequential_write(&out.join("probe.bin"), 4 << 30)?;
                Ok((read, write))
            };
            let before = probe()?;
            let summary = timed_pack(&config(&samples, &features, &batched_dir)?)?;
            let after = probe()?;
            let faster = |a: Bandwidth, b: Bandwidth| {
                if a.bytes_per_second() >= b.bytes_per_second() {
                    a
                } else {
                    b
                }
            };
            let (read, write) = (faster(before.0, after.0), faster(before.1, after.1));
            let ideal = feature_bytes as f64 / read.bytes_per_second()
                + summary.bytes_written as f64 / write.bytes_per_second();
            Ok(Trial {
                ratio: summary.total_seconds / ideal,
                probes: [before, after],
                read,
                write,
                ideal,
                summary,
            })
        };

        let first = trial()?;
        let individual_dir = out.join("individual");
        let individual = timed_pack(&PackConfig {
            packing: PackingMode::Individual,
            ..config(&samples, &features, &individual_dir)?
        })?;
        remove(&individual_dir)?;
        // The ratio to the ideal moves by tens of percent between runs on a
        // virtual disk whose bandwidth drifts: several runs, their median.
        let trials = (0..repeats)
            .map(|_| trial())
            .collect::<anyhow::Result<Vec<_>>>()?;
        if trials
            .iter()
            .any(|t| t.summary.feature_disk_bytes != individual.feature_disk_bytes)
        {
            bail!("the two packings laid out different sizes");
        }
        let mut by_ratio: Vec<&Trial> = trials.iter().collect();
        by_ratio.sort_by(|a, b| a.ratio.total_cmp(&b.ratio));
        let (lowest, highest) = (by_ratio[0].ratio, by_ratio[repeats - 1].ratio);
        let median = by_ratio[repeats / 2];

        println!("packing, {samples} with {features} ({feature_bytes} bytes)");
        println!(
            "  {:<18} {:>8} {:>8} {:>8} {:>8} {:>10} {:>11} {:>10}",
            "packing",
            "total s",
            "pack s",
            "read s",
            "write s",
            "read MB",
            "written MB",
            "read MB/s"
        );
        for (name, s) in [
            ("batched (1st run)", &first.summary),
            ("individual", &individual),
            ("batched (median)", &median.summary),
        ] {
            println!(
                "  {name:<18} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>10.0} {:>11.0} {:>10.0}",
                s.total_seconds,
                s.pack_seconds,
                s.pack_read_seconds,
                s.pack_write_seconds,
                s.feature_bytes_read as f64 / 1e6,
                s.bytes_written as f64 / 1e6,
                s.feature_bytes_read as f64 / s.pack_seconds / 1e6
            );
        }
        let speedup_total = individual.total_seconds / median.summary.total_seconds;
        let speedup_first = individual.total_seconds / first.summary.total_seconds;
        let speedup_pack = individual.pack_seconds / median.summary.pack_seconds;
        println!(
            "  batched / individual: {speedup_total:.1}x faster in wall time ({speedup_pack:.1}x in the packing phase); first run {speedup_first:.1}x"
        );
        println!(
            "  batched against the ideal (read the feature file once + write the output once at the disk's sequential bandwidth, probed right before and after each run, O_DIRECT; the faster probe counts):"
        );
        println!(
            "  {:<18} {:>10} {:>10} {:>8} {:>8} {:>7}",
            "run", "read MB/s", "write MB/s", "ideal s", "total s", "ratio"
        );
        let first_row = std::iter::once(("1st (cold)".to_string(), &first));
        let later = (trials.iter().enumerate()).map(|(i, t)| (format!("later {}", i + 1), t));
        for (name, t) in first_row.chain(later) {
            println!(
                "  {name:<18} {:>10.0} {:>10.0} {:>8.2} {:>8.2} {:>6.2}x",
                t.read.bytes_per_second() / 1e6,
                t.write.bytes_per_second() / 1e6,
                t.ideal,
                t.summary.total_seconds,
                t.ratio
            );
        }
        println!(
            "  batched wall time / ideal: median {:.2}x over {repeats} runs (lowest {lowest:.2}x, highest {highest:.2}x); first run {:.2}x",
            median.ratio, first.ratio
        );
        report.insert(
            "packing".into(),
            json!({
                "samples": samples,
                "features": features,
                "feature_file_bytes": feature_bytes,
                "first_run": first.json(),
                "runs": trials.iter().map(Trial::json).collect::<Vec<_>>(),
                "batched": median.summary,
                "batched_first_run": first.summary,
                "individual": individual,
                "speedup_total": speedup_total,
                "speedup_total_first_run": speedup_first,
                "speedup_pack_phase": speedup_pack,
                "ideal_seconds": median.ideal,
                "batched_over_ideal": median.ratio,
                "batched_over_ideal_lowest": lowest,
                "batched_over_ideal_highest": highest,
                "batched_over_ideal_first_run": first.ratio,
            }),
        );
    } else {
        eprintln!(
            "== bench: OFFGNN_BENCH_SAMPLES / OFFGNN_BENCH_FEATURES unset: batched vs individual skipped"
        );
    }

    let sets = env_or("OFFGNN_BENCH_AMP", "");
    let mut amp = Vec::new();
    for set in sets.split(',').filter(|s| !s.is_empty()) {
        let (name, paths) = set
            .split_once('=')
            .with_context(|| format!("OFFGNN_BENCH_AMP entry {set}: want name=samples|features"))?;
        let (samples, features) = paths
            .split_once('|')
            .with_context(|| format!("OFFGNN_BENCH_AMP entry {set}: want name=samples|features"))?;
        for multiple in [3.0, 5.0, 7.0] {
            let dir = out.join(format!("amp-{name}-{multiple}x"));
            let s = pack(&PackConfig {
                gpu_cache: 0,
                cpu_cache: 0,
                disk_budget: Budget::Multiple(multiple),
                show_progress: false,
                ..config(samples, features, &dir)?
            })
            .with_context(|| format!("packing {name} at {multiple}x"))?;
            remove(&dir)?;
            amp.push(json!({
                "graph": name,
                "budget_multiple": multiple,
                "predicted_read_amplification": s.predicted_read_amplification,
                "lower_bound": s.amplification.lower_bound,
                "table_share": s.table_bytes as f64 / s.disk_budget as f64,
                "segment_size": s.segment_size,
                "segments": s.segments,
                "feature_blow_up": s.feature_disk_bytes as f64 / s.disk_budget as f64 * multiple,
                "disk_cache_share": s.access_shares.disk_cache,
            }));
        }
    }
    if !amp.is_empty() {
        println!(
            "predicted read amplification (no GPU/CPU cache); DiskGNN Table 4, Friendster: 3x 2.58, 5x 1.09"
        );
        println!(
            "  (lower bound: every batch's rows on pages of their own, tiers and segments as planned; tables: the address tables' share of the budget)"
        );
        println!(
            "  {:<10} {:>7} {:>14} {:>12} {:>13} {:>16} {:>7}",
            "graph",
            "budget",
            "amplification",
            "lower bound",
            "segment size",
            "disk-cache share",
            "tables"
        );
        let f = |row: &serde_json::Value, k: &str| row[k].as_f64().unwrap_or(f64::NAN);
        for row in &amp {
            println!(
                "  {:<10} {:>6}x {:>14.2} {:>12.2} {:>13} {:>16.2} {:>7.2}",
                row["graph"].as_str().unwrap_or_default(),
                row["budget_multiple"],
                f(row, "predicted_read_amplification"),
                f(row, "lower_bound"),
                row["segment_size"],
                f(row, "disk_cache_share"),
                f(row, "table_share"),
            );
        }
        report.insert("amplification".into(), json!(amp));
    }
    println!("{}", json!({ "bench": "packing", "figures": report }));
    Ok(())
}
