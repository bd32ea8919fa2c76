//! How many reads to keep in flight on the disk that holds a layout, from
//! the disk's own measured curve (GIDS §3.2, the dynamic storage access
//! accumulator): random page reads at 1, 2, 4, … 256 in flight give each
//! depth's IOPS, and Little's law its latency (in flight / IOPS). The depth
//! chosen is the knee, the fewest reads in flight from which every point
//! up to the best reaches 95% of the best IOPS measured: past it more
//! reads in flight only queue. At the chosen depth, reads of one page and
//! of [`SPAN_PAGES`] pages side by side give a read's fixed cost and each
//! page's: the gap between two reads worth reading through rather than
//! asking for twice. A disk is probed once per machine and the curve kept
//! in the user's cache directory (`~/.cache/offgnn/io-depth.json`).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use offgnn_shared::io_engine::{AlignedBuf, Backend, IoEngine, IoFile, IoOptions, PAGE, ReadReq};
use offgnn_shared::report::human_bytes;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::user_cache;

/// The depths probed: powers of two.
const DEPTHS: [u32; 9] = [1, 2, 4, 8, 16, 32, 64, 128, 256];

/// Seconds each depth is measured for in one round.
const SECONDS_PER_DEPTH: f64 = 0.2;

/// Rounds over all the depths; a depth's IOPS is its median over them. A
/// shared disk's rate drifts within seconds: rounds spread each depth's
/// measurement over the whole probe, as alternating runs do.
const ROUNDS: usize = 3;

/// The share of the best IOPS the chosen depth reaches.
pub const KNEE_SHARE: f64 = 0.95;

/// One depth's figures.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct DepthPoint {
    pub depth: u32,
    pub iops: f64,
    /// Mean time a read spent in flight, by Little's law (depth / IOPS).
    pub latency_us: f64,
}

/// Pages of the longer read measured beside single pages.
pub const SPAN_PAGES: u32 = 16;

/// Read through at most this many pages (256 KiB) between two reads.
pub const MAX_READ_THROUGH: u32 = 64;

/// The least file whose curve stands for its whole disk: random reads over
/// fewer pages measure the disk's cache rather than the disk.
pub const STANDS_FOR_DISK: u64 = 4 << 20;

/// Reads of one page and of `pages` pages at the chosen depth, measured
/// side by side.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct SpanPoint {
    pub pages: u32,
    /// Reads a second of one page.
    pub page_iops: f64,
    /// Reads a second of `pages` pages ([`SPAN_PAGES`], or the whole probed
    /// file where it is shorter).
    pub span_iops: f64,
}

impl SpanPoint {
    /// The most pages between two reads that cost less to read through
    /// than a read of their own: a read's disk time is a fixed cost plus
    /// one per page (both from the two rates), and two reads merged over
    /// `g` pages save the fixed cost for `g` pages' worth.
    /// A span of one page (a file too short to measure) tells nothing: 0.
    pub fn read_through_pages(&self) -> u32 {
        if self.pages < 2 {
            return 0;
        }
        let one = 1.0 / self.page_iops.max(1e-9);
        let span = 1.0 / self.span_iops.max(1e-9);
        let per_page = (span - one) / (self.pages - 1) as f64;
        if per_page <= 0.0 {
            return MAX_READ_THROUGH;
        }
        let fixed = (one - per_page).max(0.0);
        ((fixed / per_page).floor() as u32).min(MAX_READ_THROUGH)
    }
}

/// A disk's measured curve and the depth chosen from it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DepthProbe {
    /// The machine and block device it was measured on.
    pub disk: String,
    /// The file read (random 4 KiB pages, O_DIRECT).
    pub file: String,
    pub points: Vec<DepthPoint>,
    /// Reads in flight: IOPS × latency at the knee.
    pub chosen: u32,
    /// Short and long reads at the chosen depth (absent from curves kept
    /// by earlier versions, which are measured again).
    #[serde(default)]
    pub span: Option<SpanPoint>,
    /// The file's size (0 in curves kept by earlier versions): a curve
    /// measured on less than [`STANDS_FOR_DISK`] stands for files as small
    /// only, and a larger one measures the disk again.
    #[serde(default)]
    pub file_bytes: u64,
}

impl DepthProbe {
    /// Whether this curve stands for reads of a file of `bytes`: it was
    /// measured on a file large enough to stand for the disk, or that file
    /// is as small.
    fn stands_for(&self, bytes: u64) -> bool {
        self.file_bytes >= STANDS_FOR_DISK || bytes < STANDS_FOR_DISK
    }

    /// Pages between two reads worth reading through (0 without a span).
    pub fn read_through_pages(&self) -> u32 {
        self.span.map_or(0, |s| s.read_through_pages())
    }
}

/// What [`resolve`] found.
#[derive(Clone, Debug, Serialize)]
pub struct Resolved {
    pub probe: DepthProbe,
    /// Whether it came from the cache (else it was measured now).
    pub cached: bool,
    /// Whether the reads in flight came from it (`--io-depth auto`), not
    /// only the read-through.
    pub depth_auto: bool,
}

/// The knee of `points` (in depth order): the fewest reads in flight from
/// which every point up to the best reaches `share` of it. A shallow point
/// that reaches the share while deeper ones fall short is a drift of the
/// disk, not a knee, and a depth chosen there starves a random-read
/// workload; points past the best are queueing, and do not count.
pub fn knee(points: &[DepthPoint], share: f64) -> u32 {
    let Some(best) = points
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.iops.total_cmp(&b.1.iops))
        .map(|(i, _)| i)
    else {
        return 1;
    };
    let floor = share * points[best].iops;
    let rising = &points[..=best];
    let from = rising
        .iter()
        .rposition(|p| p.iops < floor)
        .map_or(0, |short| short + 1);
    rising[from].depth
}

/// Measures the curve of the disk that holds `path` (a file of at least a
/// few MiB), reading random pages for `seconds` per depth and round.
pub fn probe(path: &Path, seconds: f64) -> Result<DepthProbe> {
    let mut engines = Vec::with_capacity(DEPTHS.len());
    for depth in DEPTHS {
        let engine = IoEngine::new(IoOptions {
            rings: 1,
            queue_depth: depth,
            ..Default::default()
        });
        let file = engine.open(path)?;
        if engine.backend() != Backend::IoUring || !file.is_direct() {
            return Err(Error::InvalidArgument(format!(
                "{}: the read depth is probed with io_uring and O_DIRECT, which this {} does not give",
                path.display(),
                if engine.backend() != Backend::IoUring {
                    "kernel"
                } else {
                    "filesystem"
                }
            )));
        }
        engines.push((depth, engine, file));
    }
    let mut rates = vec![Vec::with_capacity(ROUNDS); DEPTHS.len()];
    for _ in 0..ROUNDS {
        for ((depth, engine, file), rates) in engines.iter().zip(&mut rates) {
            rates.push(random_reads(engine, file, *depth, 1, seconds)?);
        }
    }
    let points: Vec<DepthPoint> = DEPTHS
        .iter()
        .zip(rates)
        .map(|(&depth, rates)| {
            let iops = median(rates);
            DepthPoint {
                depth,
                iops,
                latency_us: depth as f64 / iops.max(1e-9) * 1e6,
            }
        })
        .collect();
    let chosen = knee(&points, KNEE_SHARE);
    let (_, engine, file) = engines
        .iter()
        .find(|(depth, _, _)| *depth == chosen)
        .expect("the knee is a probed depth");
    // A file shorter than the long read is read whole.
    let pages = SPAN_PAGES.min((file.len() / PAGE as u64) as u32).max(1);
    let (mut page, mut span) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        page.push(random_reads(engine, file, chosen, 1, seconds)?);
        span.push(random_reads(engine, file, chosen, pages, seconds)?);
    }
    Ok(DepthProbe {
        disk: disk_of(path),
        file: std::path::absolute(path)
            .unwrap_or_else(|_| path.to_path_buf())
            .display()
            .to_string(),
        points,
        chosen,
        span: Some(SpanPoint {
            pages,
            page_iops: median(page),
            span_iops: median(span),
        }),
        file_bytes: file.len(),
    })
}

/// The middle of `rates` (of three rounds' rates, the second highest).
fn median(mut rates: Vec<f64>) -> f64 {
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

/// Reads a second of `len` random pages each of `file` with `depth` in
/// flight, for `seconds`: calls of 16 × depth requests, so that the drain
/// at the end of a call is a small share of it.
fn random_reads(
    engine: &IoEngine,
    file: &IoFile,
    depth: u32,
    len: u32,
    seconds: f64,
) -> Result<f64> {
    let len = len as usize;
    let pages = (file.len() / PAGE as u64)
        .saturating_sub(len as u64 - 1)
        .max(1);
    let per_call = 16 * depth as usize;
    let mut rng = rand::rngs::StdRng::seed_from_u64(depth as u64);
    let mut buf = AlignedBuf::new(per_call * len * PAGE);
    let mut reqs = Vec::with_capacity(per_call);
    let mut ios = 0u64;
    let started = Instant::now();
    while started.elapsed().as_secs_f64() < seconds {
        reqs.clear();
        reqs.extend((0..per_call).map(|i| ReadReq {
            offset: rng.random_range(0..pages) * PAGE as u64,
            len: len * PAGE,
            buf_offset: i * len * PAGE,
        }));
        engine.read(file, &reqs, &mut buf)?;
        ios += per_call as u64;
    }
    Ok(ios as f64 / started.elapsed().as_secs_f64())
}

/// The machine and the block device that hold `path`: the cache's key.
fn disk_of(path: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let dev = std::fs::metadata(path).map(|m| m.dev()).unwrap_or(0);
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    // The device's name (`nvme0n1p1`), where sysfs has one.
    let name = std::fs::read_link(format!("/sys/dev/block/{major}:{minor}"))
        .ok()
        .and_then(|l| l.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| format!("{major}:{minor}"));
    format!("{host}:{name}")
}

/// The curve of the disk holding `path`: the cached one, unless `fresh`
/// or it was measured on a file too small to stand for the disk and
/// `path` is not; else measured now (and cached).
///
/// Processes on one machine take turns (a lock beside the cache file): the
/// ranks of a data-parallel launch would otherwise probe the same disk at
/// once, each measuring it shared with the others, and the first measures
/// it while the rest wait for its curve.
pub fn resolve(path: &Path, fresh: bool) -> Result<Resolved> {
    let disk = disk_of(path);
    let cache = user_cache::file("io-depth.json");
    let _turn = cache.as_deref().and_then(user_cache::take_turn);
    let mut known: BTreeMap<String, DepthProbe> =
        cache.as_deref().map(user_cache::load).unwrap_or_default();
    let size = std::fs::metadata(path)
        .map_err(|e| Error::io(path.display(), e))?
        .len();
    let kept = known.get(&disk).filter(|p| p.span.is_some());
    if !fresh && let Some(probe) = kept {
        if probe.stands_for(size) {
            return Ok(Resolved {
                probe: probe.clone(),
                cached: true,
                depth_auto: false,
            });
        }
        let on = match probe.file_bytes {
            0 => "a file whose size it does not record".to_string(),
            b => format!("{}, too little to stand for the disk", human_bytes(b)),
        };
        tracing::info!(
            "the curve kept for {disk} was measured on {on}: measuring it again on {}",
            path.display()
        );
    }
    tracing::info!(
        "probing the read depth of {disk} ({} depths, {ROUNDS} rounds of {SECONDS_PER_DEPTH} s each){}",
        DEPTHS.len(),
        if size < STANDS_FOR_DISK {
            format!(
                " on {}: it stands for files under {} only, and a larger one measures the disk again",
                human_bytes(size),
                human_bytes(STANDS_FOR_DISK)
            )
        } else {
            String::new()
        }
    );
    let probe = probe(path, SECONDS_PER_DEPTH)?;
    known.insert(disk, probe.clone());
    if let Some(file) = cache
        && let Err(e) = user_cache::save(&file, &known)
    {
        tracing::warn!(
            "could not keep the measured read depth in {}: {e}",
            file.display()
        );
    }
    Ok(Resolved {
        probe,
        cached: false,
        depth_auto: false,
    })
}

/// `engine` again, with `depth` keeping as many reads in flight as the
/// disk holding the layout (in `dir`, its largest object) needs (GIDS
/// §3.2) and with `through` reading through the gaps a read of their own
/// costs more than, both from that disk's measured curve (`--io-depth
/// auto`, `--read-through auto`). The `pread` pool keeps its depth: it
/// has no queue.
pub fn engine_for_disk(
    (dir, objects): (&Path, &[offgnn_manifests::Object]),
    engine: IoEngine,
    (depth, through): (bool, bool),
) -> (IoEngine, Option<Resolved>) {
    let which = match (depth, through) {
        (false, false) => return (engine, None),
        (true, false) => "--io-depth auto",
        (false, true) => "--read-through auto",
        (true, true) => "--io-depth/--read-through auto",
    };
    let largest = objects
        .iter()
        .map(|o| (o.size, dir.join(&o.name)))
        .filter(|(_, path)| path.is_file())
        .max();
    let Some((_, path)) = largest else {
        return (engine, None);
    };
    if engine.backend() != Backend::IoUring {
        tracing::info!(
            "{which}: the pread pool reads one request per thread, with no queue to size and no curve measured; gaps of up to {} read through",
            offgnn_shared::report::count(
                (engine.options().read_through / PAGE) as u64,
                "page",
                "pages"
            )
        );
        return (engine, None);
    }
    let opts = engine.options();
    let found = match resolve(&path, false) {
        Ok(found) => Resolved {
            depth_auto: depth,
            ..found
        },
        Err(e) => {
            tracing::warn!(
                "{which}: {e}; keeping {} per ring, no read-through",
                opts.queue_depth
            );
            return (engine, None);
        }
    };
    let per_ring = if depth {
        per_ring(found.probe.chosen, opts.rings)
    } else {
        opts.queue_depth
    };
    let read_through = if through {
        found.probe.read_through_pages() as usize * PAGE
    } else {
        opts.read_through
    };
    let from = |auto: bool| if auto { "auto" } else { "given" };
    tracing::info!(
        "--io-depth {}, --read-through {}: {} rings x {per_ring} reads in flight, gaps of up to {} read through, from the curve of {}{}",
        from(depth),
        from(through),
        opts.rings,
        offgnn_shared::report::count((read_through / PAGE) as u64, "page", "pages"),
        found.probe.disk,
        if found.cached {
            " (measured before)"
        } else {
            ""
        }
    );
    let engine = IoEngine::new(IoOptions {
        queue_depth: per_ring,
        read_through,
        ..opts
    });
    (engine, Some(found))
}

/// An engine for the layout in `dir` as the trainer reads it by default
/// (`--io-depth auto --read-through auto`): the loader's, the bench's.
pub fn default_engine_for(layout: (&Path, &[offgnn_manifests::Object])) -> IoEngine {
    engine_for_disk(layout, IoEngine::new(IoOptions::default()), (true, true)).0
}

/// Reads in flight per ring for `rings` rings to keep `total` in flight.
pub fn per_ring(total: u32, rings: usize) -> u32 {
    total.div_ceil(rings.max(1) as u32).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn curve(iops: &[f64]) -> Vec<DepthPoint> {
        DEPTHS
            .iter()
            .zip(iops)
            .map(|(&depth, &iops)| DepthPoint {
                depth,
                iops,
                latency_us: depth as f64 / iops * 1e6,
            })
            .collect()
    }

    #[test]
    fn the_knee_is_the_fewest_in_flight_within_the_share_of_the_best() {
        // A disk that saturates at 32 in flight.
        let nvme = curve(&[10e3, 20e3, 39e3, 75e3, 140e3, 196e3, 200e3, 201e3, 199e3]);
        assert_eq!(knee(&nvme, KNEE_SHARE), 32);
        // A flat one (a page cache, a RAM disk): one read in flight.
        assert_eq!(knee(&curve(&[5e5; 9]), KNEE_SHARE), 1);
        // Noise past the knee does not move it.
        let noisy = curve(&[1e3, 2e3, 4e3, 8e3, 9.6e3, 10e3, 9.7e3, 10e3, 9.9e3]);
        assert_eq!(knee(&noisy, KNEE_SHARE), 16);
        // A shallow point that reaches the share while deeper ones dip
        // below it (the curve measured on this VM) is not the knee.
        let drift = curve(&[
            23.6e3, 33.7e3, 46.2e3, 59.4e3, 51.4e3, 56.0e3, 47.9e3, 61.1e3, 59.0e3,
        ]);
        assert_eq!(knee(&drift, KNEE_SHARE), 128);
        // The deepest point falling short of the best does not count.
        let past = curve(&[
            26.8e3, 41.9e3, 50.8e3, 61.1e3, 66.5e3, 67.5e3, 78.0e3, 90.5e3, 84.4e3,
        ]);
        assert_eq!(knee(&past, KNEE_SHARE), 128);
        assert_eq!(knee(&[], KNEE_SHARE), 1);
        assert_eq!(per_ring(32, 4), 8);
        assert_eq!(per_ring(1, 4), 1);
        assert_eq!(per_ring(33, 4), 9);
    }

    #[test]
    fn a_curve_of_a_small_file_stands_for_small_files_only() {
        let kept = |file_bytes| DepthProbe {
            disk: "host:vda".into(),
            file: "f".into(),
            points: curve(&[1e3; 9]),
            chosen: 1,
            span: None,
            file_bytes,
        };
        let big = STANDS_FOR_DISK;
        assert!(kept(big).stands_for(1) && kept(big).stands_for(100 * big));
        assert!(kept(big - 1).stands_for(big - 1));
        assert!(!kept(big - 1).stands_for(big));
        // Kept by an earlier version, its file's size unknown.
        assert!(!kept(0).stands_for(big) && kept(0).stands_for(PAGE as u64));
    }

    #[test]
    fn a_probe_measures_every_depth_and_chooses_one_of_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("probe.bin");
        std::fs::write(&path, vec![7u8; 8 << 20]).unwrap();
        let probe = match probe(&path, 0.02) {
            Ok(p) => p,
            // Where the target directory refuses O_DIRECT there is no curve.
            Err(e) => {
                eprintln!("SKIPPED: a_probe_measures_every_depth_and_chooses_one_of_them: {e}");
                return;
            }
        };
        let depths: Vec<u32> = probe.points.iter().map(|p| p.depth).collect();
        assert_eq!(depths, DEPTHS);
        assert!(probe.points.iter().all(|p| p.iops > 0.0), "{probe:?}");
        assert!(DEPTHS.contains(&probe.chosen));
        assert_eq!(probe.chosen, knee(&probe.points, KNEE_SHARE));
        assert_eq!(probe.file_bytes, 8 << 20);
        let span = probe.span.expect("the probe measures long reads");
        assert!(span.page_iops > 0.0 && span.span_iops > 0.0, "{span:?}");
        assert_eq!(span.pages, SPAN_PAGES);
        assert!(probe.read_through_pages() <= MAX_READ_THROUGH);
        // A file shorter than the long read: its long reads read it whole.
        std::fs::write(&path, vec![7u8; 3 * PAGE]).unwrap();
        let short = super::probe(&path, 0.01).unwrap().span.unwrap();
        assert_eq!(short.pages, 3, "{short:?}");
        assert!(short.span_iops > 0.0, "{short:?}");
    }

    #[test]
    fn gaps_are_read_through_where_a_read_costs_more_than_their_pages() {
        let span = |page_iops: f64, bytes_per_s: f64| SpanPoint {
            pages: SPAN_PAGES,
            page_iops,
            span_iops: bytes_per_s / (SPAN_PAGES as usize * PAGE) as f64,
        };
        // This VM's disk: 92k page reads a second, 1.6 GB/s in long
        // reads: a read costs about 4.5 pages' time.
        assert_eq!(span(92e3, 1.6e9).read_through_pages(), 4);
        // An NVMe drive, 1M reads and 6.5 GB/s: a read costs less than
        // a page; nothing is read through.
        assert_eq!(span(1e6, 6.5e9).read_through_pages(), 0);
        // Long reads no slower than short ones: any gap, up to the cap.
        let flat = SpanPoint {
            span_iops: 5e5,
            ..span(5e5, 1e9)
        };
        assert_eq!(flat.read_through_pages(), MAX_READ_THROUGH);
        // A one-page file tells nothing.
        let short = SpanPoint {
            pages: 1,
            ..span(92e3, 1.6e9)
        };
        assert_eq!(short.read_through_pages(), 0);
        // An older curve without long reads reads nothing through.
        let old: DepthProbe =
            serde_json::from_str(r#"{"disk": "d", "file": "f", "points": [], "chosen": 32}"#)
                .unwrap();
        assert_eq!((old.span, old.read_through_pages()), (None, 0));
    }
}
