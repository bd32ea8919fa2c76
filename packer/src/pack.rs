//! One packing job: read the sampler's run, plan the tiers and segments,
//! pack the features (batched, §5.2, or the individual baseline), write the
//! address tables (§6) and commit with the manifest.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use offgnn_manifests::{self as manifests, BatchRef, MANIFEST, Manifest, Object};
use offgnn_shared::address_table::{self, BatchTable, TableWriter};
use offgnn_shared::commit::{self, Previous, RunId};
use offgnn_shared::dataset::Split;
use offgnn_shared::io_engine::{IoEngine, IoOptions};
use offgnn_shared::report::human_bytes;
use offgnn_shared::samples::{RunSummary, SampleFile, SampledBatch};
use offgnn_shared::store::Store;
use offgnn_shared::store_dtype::StoreDType;
use serde::Serialize;

use crate::access_rank::{Location, Tiers};
use crate::batched_pack::{OutFile, PackCtx, ReadAhead};
use crate::error::{Error, Result};
use crate::feature_source::FeatureSource;
use crate::minhash::RowOrder;
use crate::plan::{self, BatchInfo, Scratch, SegmentPlan, align};
use crate::sizes::Budget;

/// Fixed seed of the MinHash permutations: layouts are reproducible.
const MINHASH_SEED: u64 = 0x5EED_D15C;
/// The largest piece of the feature file read at once.
const MAX_PIECE_BYTES: u64 = 64 << 20;
/// Pieces below this read slowly enough to say so (8 KB pieces read a
/// 128 MB file in 67 s, where 26 MB pieces took 0.2 s).
const SLOW_PIECE_BYTES: u64 = 1 << 20;
const PAGE: u64 = 4096;
/// What the process needs besides the plan and the partition buffer:
/// binary, allocator, Parquet decoding of samples files, and the stage
/// buffers of the writes (`batched_pack::STAGE_POOL_BYTES`, just over 64 MiB).
pub const BASELINE_BYTES: u64 = 128 << 20;
// The stage buffers leave at least 48 MiB of it to the rest.
const _: () = assert!(crate::batched_pack::STAGE_POOL_BYTES + (48 << 20) <= BASELINE_BYTES);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PackingMode {
    Batched,
    Individual,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskCacheMode {
    Segmented,
    Global,
}

#[derive(Clone, Debug)]
pub struct PackConfig {
    pub samples: String,
    pub features: String,
    pub out: String,
    pub gpu_cache: u64,
    pub cpu_cache: u64,
    pub disk_budget: Budget,
    pub memory: u64,
    pub segment_size: Option<usize>,
    pub packing: PackingMode,
    pub disk_cache: DiskCacheMode,
    /// How the layout stores values; `None`: as the feature file.
    pub store_dtype: Option<StoreDType>,
    /// How each disk cache's rows are ordered.
    pub row_order: RowOrder,
    pub overwrite: bool,
    pub show_progress: bool,
}

/// Phase timings and volumes of a packing job.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PackSummary {
    pub manifest: String,
    pub load_seconds: f64,
    pub plan_seconds: f64,
    pub pack_seconds: f64,
    /// Of the packing phase: busy seconds reading the feature file, and
    /// gathering and writing rows (batched packing overlaps the two).
    pub pack_read_seconds: f64,
    pub pack_write_seconds: f64,
    /// Seconds building the address tables (beside the packing, on a
    /// thread of their own).
    pub table_seconds: f64,
    pub commit_seconds: f64,
    pub total_seconds: f64,
    pub feature_bytes_read: u64,
    pub bytes_written: u64,
    pub segment_size: usize,
    pub searched: bool,
    /// Algorithm 2's segment size and its estimate of the training
    /// segments' bytes (searched runs), beside the exact outcome below.
    pub algorithm2_segment_size: Option<usize>,
    pub estimated_bytes: Option<u64>,
    /// Exact bytes of the training segments at the chosen size.
    pub train_segment_bytes: u64,
    pub disk_bytes: u64,
    /// Caches and segments (feature rows), and the address tables (each
    /// batch's compressed topology and addresses): the disk budget bounds
    /// their sum, `disk_bytes`.
    pub feature_disk_bytes: u64,
    pub table_bytes: u64,
    pub disk_budget: u64,
    pub blow_up: f64,
    pub predicted_read_amplification: f64,
    /// Where it comes from, and the least this plan could read.
    pub amplification: AmplificationParts,
    /// Partitions of the node range (more than one only when the disk
    /// caches outgrow the memory budget), the largest partition's staged
    /// disk-cache bytes, and the size of each of the two read buffers.
    pub partitions: u64,
    pub staging_bytes: u64,
    pub piece_bytes: u64,
    pub plan_bytes: u64,
    /// The memory this run stated (plan, read pieces, staging and the
    /// baseline of buffers and runtime) against `--memory`.
    pub memory: MemoryStatement,
    pub gpu_rows: u64,
    pub cpu_rows: u64,
    /// How the layout stores values, and the feature file's type.
    pub store_dtype: String,
    pub feature_dtype: String,
    pub segments: usize,
    pub access_shares: manifests::AccessShares,
}

/// Reads every batch of the run, in the order the trainer consumes them:
/// training epochs in turn, then validation, then test, and measures each
/// batch's address-table record (its topology compressed as the table
/// writer will, and its addresses), which no plan changes: the disk budget
/// holds the tables before it holds feature rows. `loaders` threads each
/// fetch and decode one file at a time (what [`loading_memory`] counts),
/// its batches compressed in parallel on rayon's threads; the order is kept.
fn load_batches(
    store: &Store,
    run: &RunSummary,
    num_nodes: u64,
    loaders: usize,
    show: bool,
) -> Result<Vec<BatchInfo>> {
    use rayon::prelude::*;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let total: u64 = run.files.iter().map(|f| f.batches as u64).sum();
    let pb = offgnn_shared::progress::bar_if(show, total, "loading", "batches");
    let mut files = Vec::new();
    for split in Split::ALL {
        let epochs = run.counts.get(&split).map_or(0, |c| c.epochs);
        for epoch in 0..epochs {
            files.extend(
                run.files_of(split, epoch)
                    .into_iter()
                    .map(|f| (split, epoch, f)),
            );
        }
    }
    let load = |(split, epoch, file): (Split, u32, &SampleFile)| -> Result<Vec<BatchInfo>> {
        offgnn_shared::signals::check()?;
        let batches = offgnn_shared::samples::read_file(store, file)?;
        let infos: Vec<BatchInfo> = batches
            .into_par_iter()
            .map_init(
                || (Vec::new(), Vec::new()),
                |(scratch, frame), b| -> Result<BatchInfo> {
                    let t = BatchTable {
                        split: Some(split),
                        epoch,
                        index: b.index,
                        num_inputs: b.input_nodes.len() as u32,
                        labels: b.labels,
                        input_nodes: b.input_nodes,
                        blocks: b.blocks,
                        ..Default::default()
                    };
                    address_table::topology_frame(&t, scratch, frame)
                        .map_err(|e| Error::io(file.object.name.as_str(), e))?;
                    let table_bytes = address_table::record_bytes(
                        frame.len() as u64,
                        t.input_nodes.len() as u64,
                        num_nodes,
                    ) + address_table::object_overhead(1)
                        - address_table::FOOTER;
                    Ok(BatchInfo {
                        split,
                        epoch,
                        index: t.index,
                        cold: Vec::new(),
                        inputs: t.input_nodes,
                        table_bytes,
                    })
                },
            )
            .collect::<Result<_>>()?;
        pb.inc(infos.len() as u64);
        Ok(infos)
    };
    // Each loader takes the next file; a failure stops the others at their
    // next file.
    let next = AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<Result<Vec<BatchInfo>>>>> =
        files.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..loaders.clamp(1, files.len().max(1)) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&file) = files.get(i) else { break };
                    let loaded = load(file);
                    let failed = loaded.is_err();
                    *slots[i].lock().expect("a loader does not panic") = Some(loaded);
                    if failed {
                        next.store(files.len(), Ordering::Relaxed);
                    }
                }
            });
        }
    });
    pb.finish_and_clear();
    let mut out = Vec::with_capacity(total as usize);
    let mut skipped = false;
    for slot in slots {
        match slot.into_inner().expect("a loader does not panic") {
            Some(loaded) => out.extend(loaded?),
            // Skipped after another file failed, whose error comes below.
            None => skipped = true,
        }
    }
    if skipped {
        return Err(Error::InvalidArgument(
            "internal: a samples file was skipped, yet none failed".into(),
        ));
    }
    Ok(out)
}

/// Runs a packing job. Stopped by SIGINT or SIGTERM, it removes what it
/// wrote and says so.
pub fn pack(cfg: &PackConfig) -> Result<PackSummary> {
    let result = pack_run(cfg);
    match offgnn_shared::signals::received() {
        Some(signal) if result.is_err() => Err(Error::Stopped(format!(
            "stopped by {signal}: removed the objects this run wrote; nothing was committed (a layout committed at {} before is untouched)",
            offgnn_shared::store::redact(&cfg.out)
        ))),
        _ => result,
    }
}

fn pack_run(cfg: &PackConfig) -> Result<PackSummary> {
    let started = Instant::now();
    let samples = Store::open(&cfg.samples)?;
    let run = RunSummary::read(&samples)?;
    let run_bytes = samples.get(offgnn_shared::samples::RUN_SUMMARY)?;
    let features = FeatureSource::open(&cfg.features)?;
    check_match(&run, &features)?;

    let out = Store::open(&cfg.out)?;
    let previous = commit::read(&out, MANIFEST)?;
    if previous.is_some() && !cfg.overwrite {
        return Err(Error::Committed(out.url().to_string()));
    }
    check_pack_prefix(&out, previous.as_ref())?;
    // This run's objects go under pack/RUN/; a committed layout's stay as
    // they are until this run has committed.
    let run_id = RunId::new();
    let prefix = format!("pack/{run_id}");
    tracing::info!("run {run_id}");
    let local_root = local_dir(&cfg.out);
    let staging = match &local_root {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("offgnn-pack-{run_id}")),
    };
    let mut written = RunObjects {
        out: &out,
        prefix: prefix.clone(),
        local_dir: local_root.as_ref().map(|d| d.join(&prefix)),
        temp: local_root.is_none().then(|| staging.clone()),
        committed: false,
    };

    // Rows are read as the feature file holds them and laid out as
    // `--store-dtype` says: every size in the plan is the layout's.
    let source_row_bytes = features.row_bytes();
    let from = features.store_dtype()?;
    let to = cfg.store_dtype.unwrap_or(from);
    let row_bytes = source_row_bytes / from.size() as u64 * to.size() as u64;
    if to != from {
        tracing::info!("rows are stored as {to}, converted from the feature file's {from}");
    }
    let num_nodes = features.num_rows();
    let feature_file_bytes = features.file_bytes();
    // A multiple is of the features as the layout stores them: with
    // --store-dtype f16, `3x` gives the plan of a float32 layout at `3x`,
    // in half the bytes (the same segments, with narrower rows).
    let stored_file_bytes =
        feature_file_bytes - num_nodes * source_row_bytes + num_nodes * row_bytes;
    let budget = cfg.disk_budget.resolve(stored_file_bytes);

    let mut summary = PackSummary {
        disk_budget: budget,
        store_dtype: to.name().to_string(),
        feature_dtype: from.name().to_string(),
        ..Default::default()
    };
    // Loading comes before anything else the statement counts: it states
    // its own peak, within --memory whenever one file at a time fits.
    let loaders = loaders(cfg.memory, &run);
    let loading_bytes = BASELINE_BYTES + loading_memory(&run, loaders);
    tracing::info!(
        "loading {} samples files, {loaders} at a time: at most {}",
        run.files.len(),
        human_bytes(loading_bytes)
    );
    let mut batches = load_batches(&samples, &run, num_nodes, loaders, cfg.show_progress)?;
    summary.load_seconds = started.elapsed().as_secs_f64();
    // The decoded samples files are gone: their pages go back before the
    // plan, whose statement does not count them (`heap`).
    crate::heap::release_freed();

    // The feature file's pass starts now, beside the plan: its piece size
    // comes from the memory a bound on the plan leaves (the plan's exact
    // bytes are checked once it is made).
    let inputs: u64 = batches.iter().map(|b| b.inputs.len() as u64).sum();
    let plan_bound = plan_memory(num_nodes, inputs) + tables_memory(&run, &batches);
    let piece_bytes = piece_size(cfg.memory, plan_bound, source_row_bytes);
    let piece_rows = ((piece_bytes - 2 * PAGE) / source_row_bytes).max(1);
    // A converted piece waits in a buffer of its own while it is dispatched.
    let convert_bytes = if to == from {
        0
    } else {
        piece_rows * row_bytes
    };
    // Reads and writes get rings of their own: a region's write never waits
    // behind a 64 MiB piece's reads in one queue.
    let engine = IoEngine::new(IoOptions::default());
    std::thread::scope(|s| -> Result<PackSummary> {
        let ahead = match cfg.packing {
            PackingMode::Batched => Some(ReadAhead::start(
                s,
                &features,
                &engine,
                piece_rows,
                READ_AHEAD as usize,
            )?),
            PackingMode::Individual => None,
        };

        // ---- plan ----
        let t = Instant::now();
        let cache = plan::rank_and_split(
            &mut batches,
            num_nodes,
            row_bytes,
            cfg.gpu_cache,
            cfg.cpu_cache,
        )?;
        // Memory: the plan, the pieces read ahead, and the staging of
        // disk-cache runs.
        // The table writer (a thread beside the pass) holds one samples
        // file decoded, a buffer per segment and an index of the batches:
        // counted with the plan.
        let tables_bytes = tables_memory(&run, &batches);
        let plan_bytes = plan_memory(num_nodes, batches.iter().map(|b| b.cold.len() as u64).sum())
            + tables_bytes;
        let read_ahead = READ_AHEAD * piece_bytes + convert_bytes;
        let least = BASELINE_BYTES + read_ahead;
        let available = cfg
            .memory
            .checked_sub(plan_bytes + BASELINE_BYTES)
            .filter(|&b| b >= read_ahead)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "--memory {} is too small: the plan needs {} bytes and packing at least {} more; give at least {}",
                    cfg.memory,
                    plan_bytes,
                    least,
                    plan_bytes + least
                ))
            })?;
        let staging_budget = available - read_ahead;
        summary.plan_bytes = plan_bytes;
        summary.piece_bytes = piece_bytes;

        let by_split = |split: Split| -> Vec<usize> {
            (0..batches.len())
                .filter(|&i| batches[i].split == split)
                .collect()
        };
        let (train, valid, test) = (
            by_split(Split::Train),
            by_split(Split::Valid),
            by_split(Split::Test),
        );
        let mut scratch = Scratch::new(num_nodes);
        let geometry = plan::Geometry {
            row_bytes,
            seed: MINHASH_SEED,
            row_order: cfg.row_order,
        };
        let seg_plan = |split: Split, ids: Vec<usize>, scratch: &mut Scratch| {
            plan::plan_segment(split, ids, &batches, &geometry, scratch)
        };
        // Validation and test are read every epoch: one segment each.
        let mut eval_segments = Vec::new();
        for (split, ids) in [(Split::Valid, valid), (Split::Test, test)] {
            if !ids.is_empty() {
                eval_segments.push(seg_plan(split, ids, &mut scratch));
            }
        }
        let eval_bytes: u64 = eval_segments.iter().map(|s| s.size).sum();
        let cache_bytes = align(cache.gpu_nodes().len() as u64 * row_bytes)
            + align(cache.cpu_nodes().len() as u64 * row_bytes);
        // The budget holds everything the layout writes. The address tables'
        // records are measured already (no plan changes them); each table
        // object adds its footer, one per segment: the evaluation segments'
        // here, the training segments' with their feature bytes below.
        let records_bytes: u64 = batches.iter().map(|b| b.table_bytes).sum();
        let tables_fixed = records_bytes + address_table::FOOTER * eval_segments.len() as u64;
        let train_budget = budget.saturating_sub(eval_bytes + cache_bytes + tables_fixed);
        // The exact bytes the training segments take at a segment size (their
        // feature rows and their tables' footers): one pass over the cold
        // lists, cheap beside the packing itself.
        let exact = |s: usize| {
            crate::segment_search::exact_layout_bytes(
                train.iter().map(|&i| batches[i].cold.as_slice()),
                s,
                num_nodes,
                row_bytes,
            )
            .map(|b| b + address_table::FOOTER * train.len().div_ceil(s) as u64)
        };
        let too_small = |train: u64| crate::plan_error::PlanError::LayoutTooSmall {
            budget,
            minimum: train + eval_bytes + cache_bytes + tables_fixed,
            train,
            eval: eval_bytes,
            caches: cache_bytes,
            tables: tables_fixed,
        };
        let (segment_size, searched, estimated, algorithm2) =
            match (cfg.disk_cache, cfg.segment_size) {
                (DiskCacheMode::Global, _) => (train.len().max(1), false, None, None),
                (DiskCacheMode::Segmented, Some(0)) => {
                    return Err(Error::InvalidArgument(
                        "--segment-size must be at least 1".into(),
                    ));
                }
                (DiskCacheMode::Segmented, Some(s)) => (s, false, None, None),
                (DiskCacheMode::Segmented, None) => {
                    let lists = train.iter().map(|&i| batches[i].cold.as_slice());
                    let found = crate::segment_search::search_segment_size(
                        lists,
                        train.len(),
                        num_nodes,
                        row_bytes,
                        train_budget,
                    )
                    .map_err(|e| match e {
                        // Algorithm 2's minimum counts rows, not the pages
                        // each chunk rounds up to: state the least layout,
                        // one segment of every batch, which fits.
                        crate::plan_error::PlanError::BudgetTooSmall { .. } => {
                            match exact(train.len().max(1)) {
                                Ok(least) => too_small(least),
                                Err(e) => e,
                            }
                        }
                        other => other,
                    })?;
                    // Algorithm 2 extrapolates from the first segment, so the
                    // real layout can come out larger or smaller than its
                    // estimate. Grow the segment until the exact bytes fit (the
                    // budget is a promise, not a hope), then shrink it to the
                    // smallest size that still fits: smaller segments share
                    // fewer rows per disk cache and read less they do not need.
                    let mut s = found.segment_size;
                    while s < train.len() && exact(s)? > train_budget {
                        s = (s + s.div_ceil(4)).min(train.len());
                    }
                    if exact(s)? > train_budget {
                        return Err(too_small(exact(train.len())?).into());
                    }
                    // The bytes fall as segments grow, nearly monotonically; the
                    // bisection keeps `exact(hi) <= budget` whatever they do.
                    let (mut lo, mut hi) = (1, s);
                    while lo < hi {
                        let mid = lo + (hi - lo) / 2;
                        if exact(mid)? <= train_budget {
                            hi = mid;
                        } else {
                            lo = mid + 1;
                        }
                    }
                    (
                        hi,
                        true,
                        Some(found.estimated_bytes),
                        Some(found.segment_size),
                    )
                }
            };
        // Whichever way the size was chosen, the layout must fit the budget.
        let train_bytes = exact(segment_size)?;
        if train_bytes > train_budget {
            return Err(match (cfg.disk_cache, cfg.segment_size) {
                (DiskCacheMode::Segmented, Some(s)) => Error::InvalidArgument(format!(
                    "--segment-size {s} lays out {} bytes of training segments, beyond the {} left of --disk-budget after caches, evaluation segments and address tables; raise the budget or drop --segment-size to search one",
                    train_bytes, train_budget
                )),
                _ => too_small(train_bytes).into(),
            });
        }
        let mut segments: Vec<SegmentPlan> = train
            .chunks(segment_size.max(1))
            .map(|ids| seg_plan(Split::Train, ids.to_vec(), &mut scratch))
            .collect();
        segments.extend(eval_segments);
        drop(scratch);
        // The disk caches' rows are staged in memory until their run goes out:
        // beyond the budget, the node range is cut into partitions.
        let (bounds, staging_bytes) =
            plan::partition_bounds(&segments, num_nodes, row_bytes, staging_budget);
        if staging_bytes > staging_budget {
            return Err(Error::InvalidArgument(format!(
                "--memory {} is too small: one node's disk-cache rows need {staging_bytes} bytes of staging beside the {} of the plan and buffers; give at least {}",
                cfg.memory,
                plan_bytes + BASELINE_BYTES + read_ahead,
                plan_bytes + BASELINE_BYTES + read_ahead + staging_bytes
            )));
        }
        let num_partitions = bounds.len() - 1;
        {
            use rayon::prelude::*;
            // Partition-major, then each partition's pages filled: one
            // segment a task.
            segments
                .par_iter_mut()
                .for_each(|seg| seg.partition(&bounds, &batches, row_bytes));
        }
        summary.partitions = num_partitions as u64;
        summary.staging_bytes = staging_bytes;
        summary.memory = MemoryStatement {
            total_bytes: (plan_bytes + BASELINE_BYTES + read_ahead + staging_bytes)
                .max(loading_bytes),
            loading_bytes,
            loaders,
            plan_bytes,
            tables_bytes,
            read_ahead_bytes: read_ahead,
            staging_bytes,
            baseline_bytes: BASELINE_BYTES,
            limit_bytes: cfg.memory,
        };
        tracing::info!(
            "memory: at most {} (loading {}; then plan {} with the table writer's {}, read-ahead {}, disk-cache staging {}, buffers and runtime {}) under --memory {}",
            human_bytes(summary.memory.total_bytes),
            human_bytes(loading_bytes),
            human_bytes(plan_bytes),
            human_bytes(tables_bytes),
            human_bytes(read_ahead),
            human_bytes(staging_bytes),
            human_bytes(BASELINE_BYTES),
            human_bytes(cfg.memory)
        );
        summary.segment_size = segment_size;
        summary.searched = searched;
        summary.estimated_bytes = estimated;
        summary.algorithm2_segment_size = algorithm2;
        summary.train_segment_bytes = train_bytes;
        summary.segments = segments.len();
        summary.gpu_rows = cache.gpu_nodes().len() as u64;
        summary.cpu_rows = cache.cpu_nodes().len() as u64;
        summary.plan_seconds = t.elapsed().as_secs_f64();

        // The layout's bytes are known now: refuse a disk that cannot hold
        // them before writing any.
        let tables_bytes_planned = records_bytes + address_table::FOOTER * segments.len() as u64;
        let rows_bytes: u64 =
            cache_bytes + segments.iter().map(|s| s.size).sum::<u64>() + tables_bytes_planned;
        std::fs::create_dir_all(&staging).map_err(|e| Error::io(staging.display(), e))?;
        let free = offgnn_shared::io_engine::free_bytes(&staging)?;
        if rows_bytes > free {
            return Err(Error::InvalidArgument(format!(
                "{}: {} free, the layout (feature rows and address tables) needs {}; free some space, lower --disk-budget, or choose another --out",
                staging.display(),
                human_bytes(free),
                human_bytes(rows_bytes)
            )));
        }

        // The plan's scratch and the loading's leftovers go back before
        // the packing, which the statement counts on its own (`heap`).
        crate::heap::release_freed();

        // Accepted, but slow: said once every check has passed.
        if piece_bytes < SLOW_PIECE_BYTES {
            tracing::warn!(
                "--memory {} leaves the feature file's pass pieces of {} beside what the plan may need ({}): the pass will be slow; give more memory",
                human_bytes(cfg.memory),
                human_bytes(piece_bytes),
                human_bytes(plan_bound)
            );
        }

        // ---- pack ----
        let t = Instant::now();
        // Batched packing writes whole pages through the engine with O_DIRECT;
        // the individual baseline writes row by row through the page cache.
        let write_engine = IoEngine::new(IoOptions::default());
        let direct = (cfg.packing == PackingMode::Batched).then_some(&write_engine);
        let create = |name: &str, size: u64| OutFile::create(&staging, name, size, direct);
        // A cache tier's block, when it holds any rows.
        let tier = |name: &str, rows: &[u32]| {
            (!rows.is_empty())
                .then(|| create(name, align(rows.len() as u64 * row_bytes)))
                .transpose()
        };
        let gpu = tier(&format!("{prefix}/gpu_cache.bin"), cache.gpu_nodes())?;
        let cpu = tier(&format!("{prefix}/cpu_cache.bin"), cache.cpu_nodes())?;
        let seg_files: Vec<OutFile> = segments
            .iter()
            .enumerate()
            .map(|(i, s)| create(&format!("{prefix}/segment-{i:05}.bin"), s.size))
            .collect::<Result<_>>()?;
        let writes = crate::batched_pack::WritePool::new(&write_engine);
        let ctx = PackCtx {
            engine: &engine,
            writes: &writes,
            features: &features,
            cache: &cache,
            segments: &segments,
            batches: &batches,
            gpu: gpu.as_ref(),
            cpu: cpu.as_ref(),
            seg_files: &seg_files,
            row_bytes,
            from,
            to,
            bounds: &bounds,
            num_nodes,
        };
        // The address tables need the plan, not the features: they are built
        // on a second thread while the features stream (its bar stays hidden
        // beside the packing bar).
        let (pass, tables) = std::thread::scope(|s| {
            let tables = s.spawn(|| {
                let t = Instant::now();
                let tables = write_tables(
                    &samples, &run, &staging, &prefix, &segments, &batches, &cache, row_bytes,
                    num_nodes, false,
                );
                (tables, t.elapsed().as_secs_f64())
            });
            let pass = match cfg.packing {
                PackingMode::Batched => ctx.batched(
                    ahead.expect("batched packing reads ahead"),
                    cfg.show_progress,
                ),
                PackingMode::Individual => ctx.individual(cfg.show_progress),
            };
            (
                pass,
                tables.join().expect("the table writer does not panic"),
            )
        });
        let pass = pass?;
        let (tables, table_seconds) = tables;
        let tables = tables?;
        summary.feature_bytes_read = pass.bytes_read;
        summary.pack_read_seconds = pass.read_seconds;
        summary.pack_write_seconds = pass.write_seconds;
        summary.table_seconds = table_seconds;
        let mut objects = Vec::new();
        summary.feature_disk_bytes = gpu
            .iter()
            .chain(cpu.iter())
            .chain(seg_files.iter())
            .map(|f| f.size)
            .sum();
        let gpu_object = gpu.map(OutFile::finish).transpose()?;
        let cpu_object = cpu.map(OutFile::finish).transpose()?;
        objects.extend(gpu_object.iter().cloned());
        objects.extend(cpu_object.iter().cloned());
        for f in seg_files {
            objects.push(f.finish()?);
        }
        objects.extend(tables.objects.iter().cloned());
        summary.table_bytes = tables.objects.iter().map(|o| o.size).sum();
        summary.pack_seconds = t.elapsed().as_secs_f64();
        // The plan counted the tables before a byte was written; a mismatch
        // is a bug, and the budget must hold whatever it says.
        if summary.table_bytes != tables_bytes_planned {
            return Err(Error::InvalidArgument(format!(
                "internal: the address tables take {} bytes, the plan counted {tables_bytes_planned}",
                summary.table_bytes
            )));
        }

        // ---- commit ----
        let t = Instant::now();
        let disk_bytes: u64 = objects.iter().map(|o| o.size).sum();
        if disk_bytes > budget {
            return Err(Error::InvalidArgument(format!(
                "internal: the layout takes {disk_bytes} bytes, beyond the disk budget of {budget}"
            )));
        }
        summary.bytes_written = disk_bytes;
        summary.disk_bytes = disk_bytes;
        summary.blow_up = disk_bytes as f64 / feature_file_bytes as f64;
        summary.predicted_read_amplification = tables.amplification();
        summary.amplification = tables.parts();
        summary.access_shares = tables.shares();
        if local_root.is_none() {
            upload(&out, &staging, &objects, cfg.show_progress)?;
        }
        let manifest = Manifest {
            format_version: manifests::FORMAT_VERSION,
            run_id: run_id.to_string(),
            created_by: format!("offgnn packer {}", env!("CARGO_PKG_VERSION")),
            dataset: manifests::DatasetRef {
                name: run.dataset.name.clone(),
                num_nodes,
                feature_dim: run.dataset.feature_dim,
                feature_dtype: features.dtype().name().to_string(),
                row_bytes: source_row_bytes,
                feature_file_bytes,
                // Absolute, so that `packer verify` and the trainer's
                // baselines find it from any working directory.
                feature_location: offgnn_shared::store::absolute_location(&features.describe()),
                dataset_fingerprint: run.dataset.fingerprint.clone(),
                feature_fingerprint: run.dataset.feature_fingerprint.clone(),
                num_classes: run.dataset.num_classes,
                feature_rows_crc32c: pass.rows_crc32c,
                store_dtype: (to != from).then(|| to.name().to_string()),
            },
            samples: manifests::SamplesRef {
                location: offgnn_shared::store::absolute_location(samples.url()),
                run_sha256: {
                    use sha2::Digest;
                    offgnn_shared::store::hex(&sha2::Sha256::digest(&run_bytes))
                },
                fanouts: run.params.fanouts.clone(),
                batch_size: run.params.batch_size,
                epochs: run.params.epochs,
                seed: run.params.seed,
            },
            gpu_cache: manifests::Tier {
                object: gpu_object.map(|o| o.name),
                rows: cache.gpu_nodes().len() as u64,
                budget_bytes: cfg.gpu_cache,
            },
            cpu_cache: manifests::Tier {
                object: cpu_object.map(|o| o.name),
                rows: cache.cpu_nodes().len() as u64,
                budget_bytes: cfg.cpu_cache,
            },
            packing: manifests::Packing {
                mode: match cfg.packing {
                    PackingMode::Batched => "batched",
                    PackingMode::Individual => "individual",
                }
                .into(),
                disk_cache: match cfg.disk_cache {
                    DiskCacheMode::Segmented => "segmented",
                    DiskCacheMode::Global => "global",
                }
                .into(),
                segment_size,
                searched,
                estimated_bytes: estimated,
                partitions: num_partitions as u64,
                minhash_functions: match cfg.row_order {
                    RowOrder::MinHash { functions } => functions,
                    RowOrder::BottomK { .. } => 1,
                },
                row_order: Some(cfg.row_order.name()),
            },
            segments: segments
                .iter()
                .enumerate()
                .map(|(i, s)| manifests::Segment {
                    object: format!("{prefix}/segment-{i:05}.bin"),
                    table: format!("{prefix}/table-{i:05}.bin"),
                    split: s.split.name().into(),
                    batches: s.batches.len() as u32,
                    disk_cache_rows: s.dc_rows.len() as u64,
                    disk_cache_bytes: s.dc_bytes,
                    packed_rows: s.packed_rows(),
                    chunk_bytes: s.chunk_bytes(),
                })
                .collect(),
            schedule: schedule(&segments, &batches),
            objects,
            disk_bytes,
            feature_disk_bytes: summary.feature_disk_bytes,
            blow_up: summary.blow_up,
            predicted_read_amplification: summary.predicted_read_amplification,
            access_shares: summary.access_shares.clone(),
            largest_batch: Some(tables.largest.clone()),
        };
        manifest.validate().map_err(|e| {
            Error::InvalidArgument(format!("internal: the manifest is invalid: {e}"))
        })?;
        let body = serde_json::to_vec_pretty(&manifest).expect("manifests serialize");
        match commit::commit(&out, MANIFEST, body, &run_id, previous.as_ref())? {
            commit::Outcome::Committed => written.keep(),
            commit::Outcome::Lost { winner } => {
                drop(written);
                let removed = manifest.objects.len();
                return Err(commit::lost(&out.join(MANIFEST), &winner, removed).into());
            }
        }
        if let Some(old) = &previous {
            remove_replaced(&out, local_root.as_deref(), old);
            commit::fault_point(commit::REPLACED_REMOVED);
        }
        summary.commit_seconds = t.elapsed().as_secs_f64();
        summary.total_seconds = started.elapsed().as_secs_f64();
        summary.manifest = format!("{}/{MANIFEST}", out.url().trim_end_matches('/'));
        Ok(summary)
    })
}

/// What a packing run states it will hold in memory.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MemoryStatement {
    /// The larger of loading's peak and the packing's sum (plan, read
    /// pieces, staging and baseline), which come one after the other.
    pub total_bytes: u64,
    /// Loading: the baseline, every batch's input nodes and `loaders`
    /// samples files decoded at once.
    pub loading_bytes: u64,
    pub loaders: usize,
    /// With the table writer's `tables_bytes`.
    pub plan_bytes: u64,
    pub tables_bytes: u64,
    pub read_ahead_bytes: u64,
    pub staging_bytes: u64,
    pub baseline_bytes: u64,
    pub limit_bytes: u64,
}

/// Whether `name` (relative to --out) is one of the objects a packer writes
/// under `pack/`: the caches, segments and address tables, under a run's id
/// (`pack/RUN/segment-00000.bin`) or as layouts from before run ids named
/// them (`pack/segment-00000.bin`).
fn packer_object(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("pack/") else {
        return false;
    };
    let file = match rest.split_once('/') {
        Some((run, file)) if RunId::is_run_id(run) => file,
        Some(_) => return false,
        None => rest,
    };
    let numbered = |prefix: &str| {
        file.strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix(".bin"))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    file == "gpu_cache.bin" || file == "cpu_cache.bin" || numbered("segment-") || numbered("table-")
}

/// Refuses, naming it, an output location whose `pack/` holds a file no
/// packer writes (a user's file, not a layout's): the packer removes what
/// is there when it replaces a layout, and must never remove that.
fn check_pack_prefix(out: &Store, previous: Option<&Previous>) -> Result<()> {
    let listed = out.list("pack")?;
    let foreign: Vec<&str> = listed
        .iter()
        .map(|(name, _)| name.as_str())
        .filter(|name| !packer_object(name))
        .collect();
    if let Some(first) = foreign.first() {
        return Err(Error::InvalidArgument(format!(
            "{}: holds {} that no packer wrote ({}{}); the packer replaces what is under pack/, so remove them or choose another --out",
            out.url(),
            if foreign.len() == 1 {
                "a file".to_string()
            } else {
                format!("{} files", foreign.len())
            },
            first,
            if foreign.len() > 1 { ", ..." } else { "" }
        )));
    }
    let named: std::collections::HashSet<String> = previous
        .and_then(|p| serde_json::from_slice::<Manifest>(&p.body).ok())
        .map(|m| m.objects.into_iter().map(|o| o.name).collect())
        .unwrap_or_default();
    let loose = listed.iter().filter(|(n, _)| !named.contains(n)).count();
    if loose > 0 {
        tracing::info!(
            "{}: pack/ holds {loose} objects that no manifest names: runs that were killed, or that are running now; they are left alone",
            out.url()
        );
    }
    Ok(())
}

/// This run's objects until it commits: removed when the run fails (or
/// loses the commit); a remote store's local staging always goes.
struct RunObjects<'a> {
    out: &'a Store,
    prefix: String,
    /// `pack/RUN` in a local output directory.
    local_dir: Option<PathBuf>,
    /// The staging directory of a remote output.
    temp: Option<PathBuf>,
    committed: bool,
}

impl RunObjects<'_> {
    /// The run committed: its objects stay.
    fn keep(&mut self) {
        self.committed = true;
    }
}

impl Drop for RunObjects<'_> {
    fn drop(&mut self) {
        if let Some(dir) = self.temp.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
        if self.committed {
            return;
        }
        let removed = match &self.local_dir {
            Some(dir) => match std::fs::remove_dir_all(dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.to_string()),
                _ => Ok(()),
            },
            None => self
                .out
                .delete_prefix(&self.prefix)
                .map(|_| ())
                .map_err(|e| e.to_string()),
        };
        match removed {
            Ok(()) => tracing::debug!("removed this run's objects ({})", self.prefix),
            Err(e) => tracing::warn!(
                "could not remove this run's objects under {}: {e}",
                self.out.join(&self.prefix)
            ),
        }
    }
}

/// After this run's commit replaced `old`, removes the objects the old
/// manifest names (a local run's directory in one call).
fn remove_replaced(out: &Store, local_root: Option<&Path>, old: &Previous) {
    let removed = (|| -> Result<usize> {
        if let (Some(root), Some(id)) = (local_root, &old.run_id) {
            let dir = root.join("pack").join(id);
            return match std::fs::remove_dir_all(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(Error::io(dir.display(), e))
                }
                _ => Ok(1),
            };
        }
        let manifest: Manifest = serde_json::from_slice(&old.body).map_err(|e| {
            Error::InvalidArgument(format!("the replaced manifest is unreadable: {e}"))
        })?;
        for o in &manifest.objects {
            out.delete(&o.name)?;
        }
        Ok(manifest.objects.len())
    })();
    if let Err(e) = removed {
        tracing::warn!("could not remove all of the replaced layout's objects: {e}");
    }
}

/// The write buffer of each segment's table object (all are open at once).
const TABLE_BUFFER: usize = 16 << 10;

/// Bytes one samples file takes while it is decoded: its fetched bytes,
/// held until its last row is decoded; its batches decoded (their edges'
/// source and destination ids, input nodes, and seeds with their labels);
/// and the Parquet decoder's buffers for the row in hand (per value: the
/// value, its definition and repetition levels, and Arrow's copy), for a
/// batch of twice the file's average size.
fn decoded_file_memory(run: &RunSummary, f: &SampleFile) -> u64 {
    let batch = run.params.batch_size as u64;
    let per_batch = (2 * f.edges + f.input_nodes).div_ceil(u64::from(f.batches.max(1))) + 2 * batch;
    f.object.size
        + f.edges * 8
        + f.input_nodes * 4
        + f.batches as u64 * batch * 8
        + 2 * per_batch * 16
}

/// Bytes the largest samples file takes while it is decoded.
fn largest_file_memory(run: &RunSummary) -> u64 {
    run.files
        .iter()
        .map(|f| decoded_file_memory(run, f))
        .max()
        .unwrap_or(0)
}

/// Bytes the table writer holds: the largest samples file as it is
/// decoded, a buffer per segment (at most one per training batch, and one
/// each for validation and test), the index of every batch's place, and
/// its window: on each thread a table being built (its tier lists, at most
/// 40 bytes an input node) and encoded (the encoder's varints, at most 5
/// bytes a value, and its compressed output, no larger), and the window's
/// encoded records (at most 5 bytes a value each).
fn tables_memory(run: &RunSummary, batches: &[BatchInfo]) -> u64 {
    let train = batches.iter().filter(|b| b.split == Split::Train).count() as u64;
    let (values, inputs) = largest_batch(run);
    let threads = rayon::current_num_threads() as u64;
    largest_file_memory(run)
        + (train + 2) * TABLE_BUFFER as u64
        + batches.len() as u64 * 64
        + threads * (inputs * 40 + values * 10)
        + table_window() as u64 * values * 5
}

/// Batches whose tables are built at once, in parallel, before they go out
/// in order: two a thread.
fn table_window() -> usize {
    2 * rayon::current_num_threads()
}

/// The values (edge ends, input nodes, labels) and the input nodes of a
/// batch of average size, in the samples files where each is largest.
fn largest_batch(run: &RunSummary) -> (u64, u64) {
    let per_batch =
        |n: u64, f: &offgnn_shared::samples::SampleFile| n.div_ceil(u64::from(f.batches.max(1)));
    let values = run
        .files
        .iter()
        .map(|f| per_batch(2 * f.edges + f.input_nodes, f) + run.params.batch_size as u64)
        .max()
        .unwrap_or(0);
    let inputs = run
        .files
        .iter()
        .map(|f| per_batch(f.input_nodes, f))
        .max()
        .unwrap_or(0);
    (values, inputs)
}

/// Bytes loading holds besides the baseline: every batch's input nodes
/// (kept for the plan), `loaders` samples files decoded at once, and on
/// each thread one batch's topology as varints (at most 5 bytes a value)
/// and compressed (zstd's bound of that), for a batch of its file's
/// average size, counted twice over.
fn loading_memory(run: &RunSummary, loaders: usize) -> u64 {
    let batches: u64 = run.files.iter().map(|f| f.batches as u64).sum();
    let inputs: u64 = run.files.iter().map(|f| f.input_nodes).sum();
    let (batch_values, _) = largest_batch(run);
    inputs * 4
        + batches * std::mem::size_of::<BatchInfo>() as u64
        + loaders as u64 * largest_file_memory(run)
        + rayon::current_num_threads() as u64 * batch_values * 2 * 10
}

/// How many samples files are loaded at once: one per thread of the
/// packer (rayon's), as many as `memory` holds beside the rest of the
/// loading, and at least one.
fn loaders(memory: u64, run: &RunSummary) -> usize {
    let most = rayon::current_num_threads().min(run.files.len()).max(1);
    let one = BASELINE_BYTES + loading_memory(run, 1);
    let more = memory.saturating_sub(one) / largest_file_memory(run).max(1);
    most.min(1 + usize::try_from(more).unwrap_or(usize::MAX))
}

/// Bytes the plan takes: per node, its tier slot and a counter for the
/// partitioning; per cold row of a batch, its id and its place.
fn plan_memory(num_nodes: u64, cold_rows: u64) -> u64 {
    num_nodes * 12 + cold_rows * 12
}

/// Pieces of the feature file read ahead of the packing: one filled while
/// one is dispatched. Deeper read-ahead lets the disk read more while the
/// plan is made, but costs fresh memory; on a VM whose host backs guest
/// memory lazily, first touching it took more CPU (about 3 s per GiB, in
/// the page faults of the reads) than the reads saved: 16 pieces of 64 MiB
/// made the 10M-node bench 0.5 to 1 s slower than 2.
const READ_AHEAD: u64 = 2;

/// The feature file's piece size under `memory`, given (a bound on) the
/// plan's bytes: a quarter of what is left, at most [`MAX_PIECE_BYTES`]; the
/// rest stages disk-cache rows. A piece holds a row and the pages around
/// it, however little is left.
fn piece_size(memory: u64, plan_bytes: u64, row_bytes: u64) -> u64 {
    let left = memory.saturating_sub(plan_bytes + BASELINE_BYTES);
    (left / 4).clamp(row_bytes + 2 * PAGE, MAX_PIECE_BYTES)
}

/// The local directory of an output location, or `None` for a remote store.
fn local_dir(location: &str) -> Option<PathBuf> {
    if let Some(path) = location.strip_prefix("file://") {
        return Some(PathBuf::from(path));
    }
    (!location.contains("://")).then(|| PathBuf::from(location))
}

/// Samples and features must come from the same dataset.
fn check_match(run: &RunSummary, features: &FeatureSource) -> Result<()> {
    let d = &run.dataset;
    let shape = &features.header().shape;
    if shape.len() != 2 || shape[0] != d.num_nodes || shape[1] != d.feature_dim {
        return Err(Error::Mismatch(format!(
            "{} has shape {:?}, the samples were drawn from a graph of {} nodes with {}-d features",
            features.describe(),
            shape,
            d.num_nodes,
            d.feature_dim
        )));
    }
    if features.dtype() != d.feature_dtype {
        return Err(Error::Mismatch(format!(
            "{} holds {}, the sampled dataset's features are {}",
            features.describe(),
            features.dtype(),
            d.feature_dtype
        )));
    }
    if features.fingerprint()? != d.feature_fingerprint {
        return Err(Error::Mismatch(format!(
            "{} is not the feature file of dataset '{}' that was sampled (fingerprints differ)",
            features.describe(),
            d.name
        )));
    }
    Ok(())
}

fn schedule(
    segments: &[SegmentPlan],
    batches: &[BatchInfo],
) -> BTreeMap<String, Vec<Vec<BatchRef>>> {
    let mut out: BTreeMap<String, Vec<Vec<BatchRef>>> = BTreeMap::new();
    for (si, s) in segments.iter().enumerate() {
        for (ri, &b) in s.batches.iter().enumerate() {
            let info = &batches[b];
            let epochs = out.entry(info.split.name().to_string()).or_default();
            while epochs.len() <= info.epoch as usize {
                epochs.push(Vec::new());
            }
            epochs[info.epoch as usize].push(BatchRef {
                segment: si as u32,
                record: ri as u32,
            });
        }
    }
    out
}

/// Totals gathered while writing the tables.
#[derive(Default)]
struct TableTotals {
    objects: Vec<Object>,
    /// Each figure's maximum over all batches.
    largest: manifests::BatchShape,
    gpu: u64,
    cpu: u64,
    dc: u64,
    packed: u64,
    disk_bytes: u64,
    needed_bytes: u64,
    /// Of the training batches' reads: the disk-cache pages and the bytes
    /// of the disk-cache rows on them; the packed chunks and their rows.
    dc_read_bytes: u64,
    dc_needed_bytes: u64,
    chunk_read_bytes: u64,
    chunk_needed_bytes: u64,
    /// The fewest bytes the same reads could take: each batch's disk-cache
    /// rows, and its packed rows, on whole 4 KiB pages of their own.
    least_bytes: u64,
}

/// `read / needed`, 1 when nothing is needed.
fn ratio(read: u64, needed: u64) -> f64 {
    if needed == 0 {
        1.0
    } else {
        read as f64 / needed as f64
    }
}

/// Where a layout's read amplification comes from (training batches,
/// averaged over the sampled epochs), beside a lower bound for its plan.
#[derive(Clone, Debug, Default, Serialize)]
pub struct AmplificationParts {
    /// Disk-cache pages read over the disk-cache rows' bytes: the rows a
    /// page holds that the batch does not need, and rows straddling pages.
    pub disk_cache: f64,
    /// Packed chunks over their rows: the last page's padding only.
    pub packed: f64,
    /// Share of the bytes read that are disk-cache pages.
    pub disk_cache_read_share: f64,
    /// The least amplification of this plan (tiers and segments as they
    /// are): every batch's disk-cache rows and its packed rows each on
    /// their own whole pages, as no layout of shared rows can do for every
    /// batch at once. The gap to it is what the row order costs.
    pub lower_bound: f64,
}

impl TableTotals {
    fn amplification(&self) -> f64 {
        ratio(self.disk_bytes, self.needed_bytes)
    }

    fn parts(&self) -> AmplificationParts {
        AmplificationParts {
            disk_cache: ratio(self.dc_read_bytes, self.dc_needed_bytes),
            packed: ratio(self.chunk_read_bytes, self.chunk_needed_bytes),
            disk_cache_read_share: self.dc_read_bytes as f64 / self.disk_bytes.max(1) as f64,
            lower_bound: ratio(self.least_bytes, self.needed_bytes),
        }
    }

    fn shares(&self) -> manifests::AccessShares {
        let total = (self.gpu + self.cpu + self.dc + self.packed).max(1) as f64;
        manifests::AccessShares {
            gpu: self.gpu as f64 / total,
            cpu: self.cpu as f64 / total,
            disk_cache: self.dc as f64 / total,
            packed: self.packed as f64 / total,
        }
    }
}

/// A writer that keeps the CRC32C of what passes through.
struct CrcWriter<W> {
    inner: W,
    crc: u32,
}

impl<W: Write> Write for CrcWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc = crc32c::crc32c_append(self.crc, &buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Builds one batch's address table (DiskGNN §6). The batch's labels,
/// input nodes and blocks move into the table: they are its largest part,
/// and copying them cost the table writer fresh memory beside the packing.
pub fn batch_table(
    b: SampledBatch,
    seg: &SegmentPlan,
    record: usize,
    cache: &Tiers,
    row_bytes: u64,
) -> Result<BatchTable> {
    let mut t = BatchTable {
        split: Some(b.split),
        epoch: b.epoch,
        index: b.index,
        num_inputs: b.input_nodes.len() as u32,
        labels: b.labels,
        input_nodes: b.input_nodes,
        chunk_offset: seg.chunk_offset[record],
        chunk_len: seg.chunk_len[record],
        blocks: b.blocks,
        ..Default::default()
    };
    let mut on_disk: Vec<(u32, u32)> = Vec::new(); // (node, input position)
    for (i, &v) in t.input_nodes.iter().enumerate() {
        match cache.locate(v) {
            Location::Gpu(slot) => {
                t.gpu_pos.push(i as u32);
                t.gpu_slot.push(slot);
            }
            Location::Cpu(slot) => {
                t.cpu_pos.push(i as u32);
                t.cpu_slot.push(slot);
            }
            Location::Disk => on_disk.push((v, i as u32)),
        }
    }
    // Sorted by node, the rows on disk find their disk-cache places in one
    // walk of the segment's index (binary searches over it were most of
    // the table writer's time); the rest are in the batch's packed chunk.
    on_disk.sort_unstable();
    let mut dc: Vec<(u64, u32)> = Vec::new(); // (cache position, input position)
    let mut packed: Vec<(u32, u32)> = Vec::new(); // (input position, chunk row)
    let places = seg.dc_positions_sorted(on_disk.iter().map(|&(v, _)| v));
    for (&(v, i), place) in on_disk.iter().zip(places) {
        match place {
            Some(pos) => dc.push((pos as u64, i)),
            None => {
                let row = seg.packed[record].binary_search(&v).map_err(|_| {
                    Error::InvalidArgument(format!(
                        "internal: node {v} of batch {} has no place",
                        t.index
                    ))
                })?;
                packed.push((i, row as u32));
            }
        }
    }
    // The packed rows in input order, as the table has always listed them.
    packed.sort_unstable();
    (t.packed_pos, t.packed_row) = packed.into_iter().unzip();
    dc.sort_unstable();
    let positions: Vec<u64> = dc.iter().map(|d| d.0).collect();
    let pages = crate::disk_pages::pages_of_rows(&positions, row_bytes);
    t.page_runs = crate::disk_pages::page_runs(&pages);
    for (pos, i) in dc {
        let byte = pos * row_bytes;
        let page_index = pages.binary_search(&(byte / plan::PAGE)).map_err(|_| {
            Error::InvalidArgument("internal: a disk-cache row outside its pages".into())
        })? as u64;
        t.disk_pos.push(i);
        t.disk_offset
            .push(page_index * plan::PAGE + byte % plan::PAGE);
    }
    Ok(t)
}

/// A batch's table, encoded, with its place (segment and record) and the
/// figures the summary adds up; the table itself is dropped once encoded,
/// so a window holds only the encoded records.
struct Built {
    si: usize,
    ri: usize,
    split: Split,
    index: u32,
    inputs: u64,
    /// `[sources, destinations, edges]` per block.
    blocks: Vec<[u64; 3]>,
    /// Rows from the GPU cache, the CPU cache, the disk cache, packed.
    tiers: [u64; 4],
    disk_bytes: u64,
    chunk_len: u64,
    record: Vec<u8>,
}

/// Streams every batch from the samples again (for its topology) and writes
/// each segment's table object.
#[allow(clippy::too_many_arguments)]
fn write_tables(
    samples: &Store,
    run: &RunSummary,
    staging: &Path,
    prefix: &str,
    segments: &[SegmentPlan],
    batches: &[BatchInfo],
    cache: &Tiers,
    row_bytes: u64,
    num_nodes: u64,
    show: bool,
) -> Result<TableTotals> {
    let mut place: HashMap<(Split, u32, u32), (usize, usize)> = HashMap::new();
    for (si, s) in segments.iter().enumerate() {
        for (ri, &b) in s.batches.iter().enumerate() {
            let info = &batches[b];
            place.insert((info.split, info.epoch, info.index), (si, ri));
        }
    }
    type Table = TableWriter<CrcWriter<BufWriter<File>>>;
    let mut writers: Vec<Option<Table>> = (0..segments.len()).map(|_| None).collect();
    let mut totals = TableTotals::default();
    let pb = offgnn_shared::progress::bar_if(show, batches.len() as u64, "tables", "batches");
    for file in &run.files {
        offgnn_shared::signals::check()?;
        let mut decoded = offgnn_shared::samples::read_file(samples, file)?.into_iter();
        loop {
            // A window of batches builds and encodes its tables in parallel
            // (one at a time, this was the packer's longest step), then
            // they go out in order; a window's tables are a few MB.
            let window: Vec<SampledBatch> = decoded.by_ref().take(table_window()).collect();
            if window.is_empty() {
                break;
            }
            let built: Vec<Option<Built>> = {
                use rayon::prelude::*;
                window
                    .into_par_iter()
                    .map_init(Vec::new, |scratch, b| -> Result<Option<Built>> {
                        let Some(&(si, ri)) = place.get(&(b.split, b.epoch, b.index)) else {
                            return Ok(None);
                        };
                        let t = batch_table(b, &segments[si], ri, cache, row_bytes)?;
                        let mut record = Vec::new();
                        address_table::encode_into(&t, row_bytes, num_nodes, scratch, &mut record)?;
                        Ok(Some(Built {
                            si,
                            ri,
                            split: t.split.expect("set by batch_table"),
                            index: t.index,
                            inputs: t.input_nodes.len() as u64,
                            blocks: t
                                .blocks
                                .iter()
                                .map(|b| [b.num_src.into(), b.num_dst.into(), b.src.len() as u64])
                                .collect(),
                            tiers: [
                                t.gpu_pos.len() as u64,
                                t.cpu_pos.len() as u64,
                                t.disk_pos.len() as u64,
                                t.packed_pos.len() as u64,
                            ],
                            disk_bytes: t.disk_bytes(),
                            chunk_len: t.chunk_len,
                            record,
                        }))
                    })
                    .collect::<Result<_>>()?
            };
            for built in built.into_iter().flatten() {
                let (si, ri, split) = (built.si, built.ri, built.split);
                let seg = &segments[si];
                let largest = &mut totals.largest;
                largest.inputs = largest.inputs.max(built.inputs);
                largest
                    .blocks
                    .resize(built.blocks.len().max(largest.blocks.len()), [0; 3]);
                for (most, shape) in largest.blocks.iter_mut().zip(&built.blocks) {
                    for (m, x) in most.iter_mut().zip(shape) {
                        *m = (*m).max(*x);
                    }
                }
                if split == Split::Train {
                    let [gpu, cpu, dc, packed] = built.tiers;
                    totals.gpu += gpu;
                    totals.cpu += cpu;
                    totals.dc += dc;
                    totals.packed += packed;
                    totals.disk_bytes += built.disk_bytes;
                    totals.needed_bytes += (dc + packed) * row_bytes;
                    let (dc_needed, chunk_needed) = (dc * row_bytes, packed * row_bytes);
                    totals.dc_read_bytes += built.disk_bytes - built.chunk_len;
                    totals.dc_needed_bytes += dc_needed;
                    totals.chunk_read_bytes += built.chunk_len;
                    totals.chunk_needed_bytes += chunk_needed;
                    totals.least_bytes += dc_needed.next_multiple_of(plan::PAGE)
                        + chunk_needed.next_multiple_of(plan::PAGE);
                }
                let name = format!("{prefix}/table-{si:05}.bin");
                if writers[si].is_none() {
                    let path = staging.join(&name);
                    let f = File::create(&path).map_err(|e| Error::io(path.display(), e))?;
                    writers[si] = Some(TableWriter::new(CrcWriter {
                        inner: BufWriter::with_capacity(TABLE_BUFFER, f),
                        crc: 0,
                    }));
                }
                let w = writers[si].as_mut().expect("created above");
                if w.len() != ri {
                    return Err(Error::InvalidArgument(format!(
                        "internal: batch {} of {split} arrived out of order",
                        built.index
                    )));
                }
                w.push(&built.record).map_err(|e| Error::io(&name, e))?;
                pb.inc(1);
                if w.len() == seg.batches.len() {
                    let w = writers[si].take().expect("present");
                    let (mut crcw, size) = w.finish().map_err(|e| Error::io(&name, e))?;
                    crcw.flush().map_err(|e| Error::io(&name, e))?;
                    let file = crcw
                        .inner
                        .into_inner()
                        .map_err(|e| Error::io(&name, e.into_error()))?;
                    file.sync_all().map_err(|e| Error::io(&name, e))?;
                    totals.objects.push(Object {
                        name,
                        size,
                        crc32c: crcw.crc,
                    });
                }
            }
        }
    }
    pb.finish_and_clear();
    if let Some(si) = writers.iter().position(Option::is_some) {
        return Err(Error::InvalidArgument(format!(
            "the samples lack batches of segment {si}: the run summary and its files disagree"
        )));
    }
    totals.objects.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(totals)
}

/// Copies the staged objects to a remote store.
fn upload(out: &Store, staging: &Path, objects: &[Object], show: bool) -> Result<()> {
    let total = objects.iter().map(|o| o.size).sum();
    let pb = offgnn_shared::progress::bytes_bar_if(show, total, "uploading");
    for o in objects {
        let path = staging.join(&o.name);
        // A multipart upload cannot resend one failed part: the whole object
        // goes again, after a growing pause (the store's own requests were
        // retried already).
        let mut wait = UPLOAD_BACKOFF;
        for attempt in 1..=UPLOAD_ATTEMPTS {
            let sent = (|| -> Result<u64> {
                let mut f = File::open(&path).map_err(|e| Error::io(path.display(), e))?;
                let mut w = out.writer(&o.name);
                let n =
                    std::io::copy(&mut f, &mut w).map_err(|e| Error::io(out.join(&o.name), e))?;
                w.finish()?;
                Ok(n)
            })();
            match sent {
                Ok(n) => {
                    pb.inc(n);
                    break;
                }
                Err(e) if attempt < UPLOAD_ATTEMPTS => {
                    tracing::warn!("{e}; uploading {} again in {wait:?}", o.name);
                    std::thread::sleep(wait);
                    wait *= 2;
                }
                Err(e) => return Err(e),
            }
        }
    }
    pb.finish_and_clear();
    Ok(())
}

/// Tries of one object's upload.
const UPLOAD_ATTEMPTS: u32 = 4;
/// The pause before the first retry of an upload; each further one doubles.
const UPLOAD_BACKOFF: std::time::Duration = std::time::Duration::from_millis(500);
