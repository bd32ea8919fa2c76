//! The I/O engine against fio, side by side on one file read with O_DIRECT:
//! sequential reads in 1 MiB pieces and random 4 KiB reads, through the
//! engine's io_uring and pread backends and through fio's io_uring and psync
//! engines with the same parallelism (fio jobs = rings, iodepth = queue depth).
//!
//! Run through `scripts/bench-io`, which installs fio when it is missing.
//! Environment:
//! - `OFFGNN_IO_BENCH_FILE`: the file read (default `data/io-bench.bin` in the
//!   workspace; written with pseudo-random bytes when missing or of another size);
//! - `OFFGNN_IO_BENCH_MB`: its size in MiB (default 2048);
//! - `OFFGNN_IO_BENCH_SECS`: seconds per measurement (default 10);
//! - `OFFGNN_FIO`: the fio binary (default `fio`; its columns are left out
//!   when it cannot be run).
//!
//! Prints a table, then one JSON line with every figure and the ratios ours / fio.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};
use offgnn_shared::io_engine::{AlignedBuf, Backend, IoEngine, IoFile, IoOptions, PAGE, ReadReq};
use rand::{Rng, RngCore, SeedableRng};
use rand_pcg::Pcg64;
use serde_json::json;

const MIB: usize = 1 << 20;
const RINGS: usize = 4;
const DEPTH: u32 = 64;
/// Random 4 KiB reads per `read` call: 16 rounds of the engine's 4 x 64 slots.
const RANDOM_BATCH: usize = 4096;

#[derive(Clone, Copy)]
struct Figure {
    bytes: f64,
    ios: f64,
    seconds: f64,
}

impl Figure {
    fn mbps(&self) -> f64 {
        self.bytes / self.seconds / 1e6
    }

    fn iops(&self) -> f64 {
        self.ios / self.seconds
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Workload {
    Sequential,
    Random4k,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T> {
    match std::env::var(name) {
        Ok(text) => text
            .parse()
            .map_err(|_| anyhow::anyhow!("{name}={text} is not a valid value")),
        Err(_) => Ok(default),
    }
}

/// Writes `size` pseudo-random bytes to `path` unless a file of that size is there.
fn ensure_file(path: &Path, size: u64) -> anyhow::Result<()> {
    if std::fs::metadata(path).is_ok_and(|m| m.len() == size) {
        return Ok(());
    }
    eprintln!("== bench: writing {} MiB to {}", size >> 20, path.display());
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let partial = path.with_extension("partial");
    let mut out = std::fs::File::create(&partial)
        .with_context(|| format!("creating {}", partial.display()))?;
    let mut rng = Pcg64::seed_from_u64(0x10_e4_61_4e);
    let mut block = vec![0u8; 8 * MIB];
    let mut written = 0u64;
    while written < size {
        let n = (size - written).min(block.len() as u64) as usize;
        rng.fill_bytes(&mut block[..n]);
        out.write_all(&block[..n])
            .with_context(|| format!("writing {}", partial.display()))?;
        written += n as u64;
    }
    out.sync_all()
        .with_context(|| format!("syncing {}", partial.display()))?;
    std::fs::rename(&partial, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

/// Reads the file front to back (wrapping) in calls of `RINGS * DEPTH`
/// requests of 1 MiB, for `secs`.
fn ours_sequential(engine: &IoEngine, file: &IoFile, secs: f64) -> anyhow::Result<Figure> {
    let per_call = RINGS * DEPTH as usize;
    let pieces_in_file = (file.len() / MIB as u64) as usize;
    anyhow::ensure!(
        pieces_in_file >= per_call,
        "the file is smaller than one call's {per_call} MiB"
    );
    let mut buf = AlignedBuf::new(per_call * MIB);
    let mut reqs = Vec::with_capacity(per_call);
    let mut next = 0usize;
    let (mut bytes, mut ios) = (0u64, 0u64);
    let started = Instant::now();
    while started.elapsed().as_secs_f64() < secs {
        reqs.clear();
        for i in 0..per_call {
            if next == pieces_in_file {
                next = 0;
            }
            reqs.push(ReadReq {
                offset: (next * MIB) as u64,
                len: MIB,
                buf_offset: i * MIB,
            });
            next += 1;
        }
        bytes += engine.read(file, &reqs, &mut buf)?;
        ios += per_call as u64;
    }
    Ok(Figure {
        bytes: bytes as f64,
        ios: ios as f64,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Reads uniformly random pages in calls of `RANDOM_BATCH` requests, for `secs`.
fn ours_random(engine: &IoEngine, file: &IoFile, secs: f64) -> anyhow::Result<Figure> {
    let pages = file.len() / PAGE as u64;
    let mut rng = Pcg64::seed_from_u64(7);
    let mut buf = AlignedBuf::new(RANDOM_BATCH * PAGE);
    let mut reqs = Vec::with_capacity(RANDOM_BATCH);
    let (mut bytes, mut ios) = (0u64, 0u64);
    let started = Instant::now();
    while started.elapsed().as_secs_f64() < secs {
        reqs.clear();
        reqs.extend((0..RANDOM_BATCH).map(|i| ReadReq {
            offset: rng.random_range(0..pages) * PAGE as u64,
            len: PAGE,
            buf_offset: i * PAGE,
        }));
        bytes += engine.read(file, &reqs, &mut buf)?;
        ios += RANDOM_BATCH as u64;
    }
    Ok(Figure {
        bytes: bytes as f64,
        ios: ios as f64,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// What `trainer infer`'s reader does to a layer's input: `read_span` over
/// the whole file in calls of `STREAM_PER_CALL` requests of 1 MiB, each
/// call's bytes copied into a chunk buffer, with room in the engine's buffer
/// for one call (each call waits for the last: the disk idles while the
/// bytes are copied) or for two (the next call is read meanwhile).
fn ours_stream(engine: &IoEngine, file: &IoFile, calls_of_room: usize) -> anyhow::Result<Figure> {
    const STREAM_PER_CALL: usize = 8;
    let end = file.len() / PAGE as u64 * PAGE as u64;
    let mut buf = AlignedBuf::new(calls_of_room * STREAM_PER_CALL * MIB);
    let mut chunk = vec![0u8; 256 * MIB];
    let mut filled = 0;
    let started = Instant::now();
    let bytes = engine.read_span(file, (0, end), MIB, STREAM_PER_CALL, &mut buf, |bytes| {
        if filled + bytes.len() > chunk.len() {
            filled = 0;
        }
        chunk[filled..filled + bytes.len()].copy_from_slice(bytes);
        filled += bytes.len();
        true
    })?;
    std::hint::black_box(&chunk);
    Ok(Figure {
        bytes: bytes as f64,
        ios: (bytes as usize).div_ceil(MIB) as f64,
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn fio_args(path: &Path, size: u64, workload: Workload, ioengine: &str, secs: f64) -> Vec<String> {
    let mut args = vec![
        "--name=offgnn-io".to_string(),
        format!("--filename={}", path.display()),
        "--readonly".to_string(),
        "--direct=1".to_string(),
        format!("--ioengine={ioengine}"),
        format!("--iodepth={DEPTH}"),
        format!("--numjobs={RINGS}"),
        "--group_reporting".to_string(),
        "--time_based".to_string(),
        format!("--runtime={}s", secs.ceil() as u64),
        "--output-format=json".to_string(),
    ];
    match workload {
        // Each job streams through its own quarter of the file.
        Workload::Sequential => {
            let share = size / RINGS as u64 / MIB as u64 * MIB as u64;
            args.extend([
                "--rw=read".to_string(),
                "--bs=1m".to_string(),
                format!("--size={share}"),
                format!("--offset_increment={share}"),
            ]);
        }
        Workload::Random4k => args.extend([
            "--rw=randread".to_string(),
            "--bs=4k".to_string(),
            "--norandommap".to_string(),
        ]),
    }
    args
}

fn fio(fio: &str, args: &[String]) -> anyhow::Result<Figure> {
    let output = Command::new(fio)
        .args(args)
        .output()
        .with_context(|| format!("running {fio}"))?;
    if !output.status.success() {
        bail!(
            "{fio} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    // fio may print notes before its JSON.
    let text = String::from_utf8_lossy(&output.stdout);
    let json = &text[text.find('{').context("fio printed no JSON")?..];
    let report: serde_json::Value = serde_json::from_str(json).context("parsing fio's JSON")?;
    // With group_reporting, jobs[0] is the sum over all jobs: bytes/s and IOPS.
    let read = &report["jobs"][0]["read"];
    let bytes = read["bw_bytes"]
        .as_f64()
        .context("fio's JSON lacks read.bw_bytes")?;
    let ios = read["iops"]
        .as_f64()
        .context("fio's JSON lacks read.iops")?;
    Ok(Figure {
        bytes,
        ios,
        seconds: 1.0,
    })
}

fn fio_works(fio: &str) -> bool {
    Command::new(fio)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn cell(figure: Option<Figure>, value: fn(&Figure) -> f64) -> String {
    figure.map_or_else(|| "n/a".to_string(), |f| format!("{:.0}", value(&f)))
}

fn ratio(ours: Option<Figure>, theirs: Option<Figure>, value: fn(&Figure) -> f64) -> Option<f64> {
    Some(value(&ours?) / value(&theirs?))
}

fn show_ratio(r: Option<f64>) -> String {
    r.map_or_else(|| "n/a".to_string(), |r| format!("{r:.2}"))
}

fn main() -> anyhow::Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let path = std::env::var_os("OFFGNN_IO_BENCH_FILE")
        .map_or_else(|| root.join("data/io-bench.bin"), PathBuf::from);
    let size = env_or("OFFGNN_IO_BENCH_MB", 2048u64)? << 20;
    let secs = env_or("OFFGNN_IO_BENCH_SECS", 10.0f64)?;
    let fio_bin = std::env::var("OFFGNN_FIO").unwrap_or_else(|_| "fio".to_string());
    ensure_file(&path, size)?;

    let have_fio = fio_works(&fio_bin);
    if !have_fio {
        eprintln!("== bench: {fio_bin} cannot be run; its columns are left out");
    }
    let mut rows = Vec::new();
    for (backend, fio_engine) in [(Backend::IoUring, "io_uring"), (Backend::Pread, "psync")] {
        let engine = IoEngine::new(IoOptions {
            rings: RINGS,
            queue_depth: DEPTH,
            direct: true,
            force_pread: backend == Backend::Pread,
            read_through: 0,
        });
        let mut figures = [None; 4];
        if engine.backend() == backend {
            let file = engine.open(&path)?;
            if !file.is_direct() {
                bail!(
                    "{}: the filesystem refuses O_DIRECT; this benchmark measures direct reads",
                    path.display()
                );
            }
            for (i, workload) in [Workload::Sequential, Workload::Random4k]
                .into_iter()
                .enumerate()
            {
                eprintln!(
                    "== bench: ours, {backend}, {}",
                    if i == 0 { "sequential" } else { "random 4 KiB" }
                );
                figures[2 * i] = Some(match workload {
                    Workload::Sequential => ours_sequential(&engine, &file, secs)?,
                    Workload::Random4k => ours_random(&engine, &file, secs)?,
                });
                if have_fio {
                    eprintln!("== bench: fio, {fio_engine}");
                    let args = fio_args(&path, size, workload, fio_engine, secs);
                    figures[2 * i + 1] = Some(fio(&fio_bin, &args)?);
                }
            }
        } else {
            eprintln!("== bench: io_uring is refused here; its row is left out");
        }
        rows.push((backend, fio_engine, figures));
    }

    // The stream pattern with the engine's default options, as the
    // trainer runs it: one call at a time against the next queued ahead,
    // alternated, three runs each over the whole file.
    let engine = IoEngine::new(IoOptions::default());
    let file = engine.open(&path)?;
    let (mut waiting, mut ahead) = (Vec::new(), Vec::new());
    for round in 1..=3 {
        eprintln!("== bench: the inference stream, round {round}/3");
        waiting.push(ours_stream(&engine, &file, 1)?.mbps());
        ahead.push(ours_stream(&engine, &file, 2)?.mbps());
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (waiting_mbps, ahead_mbps) = (median(&mut waiting), median(&mut ahead));

    println!();
    println!(
        "inference stream (1 MiB x 8 a call, each call's bytes copied into a chunk), median of 3 alternated runs: {waiting_mbps:.0} MB/s with each call waiting for the last, {ahead_mbps:.0} MB/s with the next call read meanwhile ({:.2}x); runs {waiting:.0?} and {ahead:.0?}",
        ahead_mbps / waiting_mbps
    );
    println!(
        "{} ({} MiB, O_DIRECT), {secs} s per figure; ours: {RINGS} rings x depth {DEPTH}; fio: {RINGS} jobs x iodepth {DEPTH}",
        path.display(),
        size >> 20
    );
    println!(
        "{:<10} {:<9} {:>12} {:>12} {:>6}   {:>12} {:>12} {:>6}   {:>11} {:>11} {:>6}",
        "backend",
        "fio",
        "seq MB/s",
        "fio seq",
        "ratio",
        "4k IOPS",
        "fio 4k IOPS",
        "ratio",
        "4k MB/s",
        "fio 4k MB/s",
        "ratio"
    );
    let mut summary = serde_json::Map::new();
    for (backend, fio_engine, [seq, fio_seq, rand, fio_rand]) in &rows {
        let seq_ratio = ratio(*seq, *fio_seq, Figure::mbps);
        let rand_ratio = ratio(*rand, *fio_rand, Figure::iops);
        println!(
            "{:<10} {:<9} {:>12} {:>12} {:>6}   {:>12} {:>12} {:>6}   {:>11} {:>11} {:>6}",
            backend.to_string(),
            fio_engine,
            cell(*seq, Figure::mbps),
            cell(*fio_seq, Figure::mbps),
            show_ratio(seq_ratio),
            cell(*rand, Figure::iops),
            cell(*fio_rand, Figure::iops),
            show_ratio(rand_ratio),
            cell(*rand, Figure::mbps),
            cell(*fio_rand, Figure::mbps),
            show_ratio(ratio(*rand, *fio_rand, Figure::mbps)),
        );
        let round = |f: Option<Figure>, v: fn(&Figure) -> f64| f.map(|f| v(&f).round());
        summary.insert(
            backend.to_string(),
            json!({
                "fio_engine": fio_engine,
                "seq_mbps": round(*seq, Figure::mbps),
                "fio_seq_mbps": round(*fio_seq, Figure::mbps),
                "seq_ratio": seq_ratio.map(|r| (r * 1000.0).round() / 1000.0),
                "rand4k_iops": round(*rand, Figure::iops),
                "fio_rand4k_iops": round(*fio_rand, Figure::iops),
                "rand4k_mbps": round(*rand, Figure::mbps),
                "fio_rand4k_mbps": round(*fio_rand, Figure::mbps),
                "rand4k_ratio": rand_ratio.map(|r| (r * 1000.0).round() / 1000.0),
            }),
        );
    }
    let line = json!({
        "bench": "io_engine",
        "file": path.display().to_string(),
        "file_mib": size >> 20,
        "seconds": secs,
        "rings": RINGS,
        "queue_depth": DEPTH,
        "results": summary,
        "stream_one_call_mbps": waiting_mbps.round(),
        "stream_call_ahead_mbps": ahead_mbps.round(),
    });
    println!("{line}");
    std::io::stdout().flush()?;
    Ok(())
}
