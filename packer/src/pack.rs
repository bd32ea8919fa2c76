//! One packing job, step by step: load the sampler's run and the feature
//! file (`load`), plan the tiers and segments under the disk and memory
//! budgets (`plan`, `segment_search`, `memory`), pack the features
//! (batched, DiskGNN §5.2, or the individual baseline: `batched_pack`)
//! beside the address tables (§6, `address_tables`), and commit with the
//! manifest (`commit`).

use std::time::Instant;

use offgnn_manifests::{Manifest, Object};
use offgnn_shared::address_table;
use offgnn_shared::dataset::Split;
use offgnn_shared::io_engine::{IoEngine, IoOptions};

use crate::access_rank::Tiers;
use crate::address_tables::{TableTotals, write_tables};
use crate::batched_pack::{OutFile, PackCtx, PassFigures, ReadAhead, WritePool};
use crate::commit::{self, PackedLayout, Target};
use crate::error::{Error, Result};
use crate::load::{Inputs, RowFormat, View, load_batches};
use crate::memory::{Loading, Pieces, PlanMemory, READ_AHEAD};
use crate::plan::{self, BatchInfo, Scratch, SegmentPlan, align};
use crate::segment_search::{FixedBytes, SegmentChoice, SegmentSize, choose_segment_size};

pub use crate::address_tables::{AmplificationParts, batch_table};
pub use crate::job::{CpuCachePolicy, PackConfig, PackSummary, RankBy};
pub use crate::memory::{BASELINE_BYTES, MemoryStatement};
pub use offgnn_manifests::{DiskCacheMode, Dtype, PackingMode, RowOrder};

/// Fixed seed of the MinHash permutations: layouts are reproducible.
const MINHASH_SEED: u64 = 0x5EED_D15C;

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
    // ---- load ----
    let inputs = Inputs::open(&cfg.samples, &cfg.features)?;
    let target = Target::prepare(&cfg.out, cfg.overwrite)?;
    let written = target.run_objects();
    let loading = Loading::plan(cfg.memory, &inputs.run);
    let num_nodes = inputs.features.num_rows();
    let batches = load_batches(
        &inputs.samples,
        &inputs.run,
        (num_nodes, &[View::Whole]),
        loading.loaders,
        cfg.show_progress,
    )?
    .pop()
    .expect("one list per view");
    let load_seconds = started.elapsed().as_secs_f64();
    // The decoded samples files are gone: their pages go back before the
    // plan, whose statement does not count them (`heap`).
    crate::heap::release_freed();
    let (manifest, mut summary) = pack_part(cfg, &inputs, &target, batches, &loading)?;
    let t = Instant::now();
    target.commit(written, &manifest)?;
    summary.load_seconds = load_seconds;
    summary.commit_seconds += t.elapsed().as_secs_f64();
    summary.total_seconds = started.elapsed().as_secs_f64();
    summary.manifest = target.manifest_url();
    Ok(summary)
}

/// Plans and packs one layout (a homogeneous graph's, or one node type's
/// of a typed graph) from its loaded batches, under the objects' prefix
/// that `inputs.view` gives; returns its manifest, uncommitted.
pub(crate) fn pack_part(
    cfg: &PackConfig,
    inputs: &Inputs,
    target: &Target,
    mut batches: Vec<BatchInfo>,
    loading: &Loading,
) -> Result<(Manifest, PackSummary)> {
    let rows = RowFormat::of(&inputs.features, cfg.store_dtype)?;
    let num_nodes = inputs.features.num_rows();
    let budget = cfg
        .disk_budget
        .resolve(rows.stored_file_bytes(&inputs.features));
    let mut summary = PackSummary {
        disk_budget: budget,
        store_dtype: rows.to.name().to_string(),
        feature_dtype: rows.from.name().to_string(),
        leftovers_removed: target.swept.clone(),
        rank_by: Some(cfg.rank_by),
        ..Default::default()
    };
    // The feature file's pass starts now, beside the plan. Reads and writes
    // get rings of their own: a region's write never waits behind a 64 MiB
    // piece's reads in one queue.
    let pieces = Pieces::size(cfg.memory, &inputs.run, &batches, num_nodes, rows);
    let engine = IoEngine::new(IoOptions::default());
    std::thread::scope(|s| -> Result<(Manifest, PackSummary)> {
        let ahead = match cfg.packing {
            PackingMode::Batched => Some(ReadAhead::start(
                s,
                &inputs.features,
                &engine,
                pieces.rows,
                READ_AHEAD as usize,
            )?),
            PackingMode::Individual => None,
        };

        // ---- plan ----
        let t = Instant::now();
        let layout = plan_layout(cfg, inputs, &mut batches, rows, budget, &pieces, loading)?;
        layout.report(&mut summary);
        summary.piece_bytes = pieces.bytes;
        summary.plan_seconds = t.elapsed().as_secs_f64();
        // The layout's bytes are known now: refuse a disk that cannot hold
        // them before writing any.
        target.check_room(layout.disk_bytes())?;
        // The plan's scratch and the loading's leftovers go back before
        // the packing, which the statement counts on its own (`heap`).
        crate::heap::release_freed();
        pieces.warn_if_slow(cfg.memory);

        // ---- pack ----
        let t = Instant::now();
        let packed = pack_layout(cfg, inputs, target, &engine, ahead, &batches, &layout, rows)?;
        packed.report(&mut summary);
        summary.pack_seconds = t.elapsed().as_secs_f64();
        // The plan counted the tables before a byte was written; a mismatch
        // is a bug, and the budget must hold whatever it says.
        if summary.table_bytes != layout.tables_bytes() {
            return Err(Error::InvalidArgument(format!(
                "internal: the address tables take {} bytes, the plan counted {}",
                summary.table_bytes,
                layout.tables_bytes()
            )));
        }

        // ---- the manifest ----
        let t = Instant::now();
        account_disk(&mut summary, &packed, budget, inputs.features.file_bytes())?;
        target.upload_if_remote(&packed.objects, cfg.show_progress)?;
        let layout_objects = packed.into_layout(&layout.segments, &batches);
        let manifest = commit::manifest(cfg, inputs, rows, target, layout_objects, &summary);
        summary.commit_seconds = t.elapsed().as_secs_f64();
        Ok((manifest, summary))
    })
}

/// The plan of a layout: the tiers, every segment (training, then
/// validation and test) with its partitions, and what the plan holds.
struct Layout {
    cache: Tiers,
    /// The CPU cache's policy and, under Belady, each batch's use of it.
    cpu: plan::CpuPlan,
    segments: Vec<SegmentPlan>,
    /// First node of each partition, `num_nodes` last.
    bounds: Vec<u64>,
    choice: SegmentChoice,
    /// The GPU and CPU caches' bytes, and the address tables' records'.
    cache_bytes: u64,
    records_bytes: u64,
    /// The largest partition's staged disk-cache bytes.
    staging_bytes: u64,
    plan_bytes: u64,
    memory: MemoryStatement,
}

impl Layout {
    /// The address tables' bytes: every batch's record, and a footer per
    /// segment's table object.
    fn tables_bytes(&self) -> u64 {
        self.records_bytes + address_table::FOOTER * self.segments.len() as u64
    }

    /// Everything the layout writes: caches, segments, address tables.
    fn disk_bytes(&self) -> u64 {
        self.cache_bytes + self.segments.iter().map(|s| s.size).sum::<u64>() + self.tables_bytes()
    }

    fn report(&self, summary: &mut PackSummary) {
        summary.plan_bytes = self.plan_bytes;
        summary.partitions = (self.bounds.len() - 1) as u64;
        summary.staging_bytes = self.staging_bytes;
        summary.memory = self.memory.clone();
        summary.segment_size = self.choice.segment_size;
        summary.searched = self.choice.searched;
        summary.estimated_bytes = self.choice.estimated_bytes;
        summary.algorithm2_segment_size = self.choice.algorithm2_segment_size;
        summary.train_segment_bytes = self.choice.train_bytes;
        summary.segments = self.segments.len();
        summary.gpu_rows = self.cache.gpu_nodes().len() as u64;
        summary.cpu_rows = self.cache.cpu_nodes().len() as u64;
        summary.cpu_cache_policy = self.cpu.policy;
        summary.cpu_cache_forecast = self.cpu.forecast.clone();
    }
}

/// Plans the layout (DiskGNN §4, §5.1): the tiers by popularity, one
/// segment each for validation and test (read every epoch), the training
/// segments' size under the disk budget, and the partitions of the node
/// range that the memory budget allows.
fn plan_layout(
    cfg: &PackConfig,
    inputs: &Inputs,
    batches: &mut [BatchInfo],
    rows: RowFormat,
    budget: u64,
    pieces: &Pieces,
    loading: &Loading,
) -> Result<Layout> {
    let num_nodes = inputs.features.num_rows();
    let row_bytes = rows.row_bytes;
    let ranking = match cfg.rank_by {
        RankBy::Samples => None,
        RankBy::Graph => Some(crate::graph_rank::expected_reads(&inputs.run, cfg.memory)?),
    };
    let (cache, cpu) = plan::rank_and_split(
        batches,
        (num_nodes, row_bytes),
        (cfg.gpu_cache, cfg.cpu_cache),
        ranking,
        (cfg.cpu_cache_policy, cfg.memory),
    )?;
    // Memory: the plan (a CPU cache's hits and admissions with it), the
    // pieces read ahead, and the staging of disk-cache runs.
    let held = PlanMemory::check(
        cfg.memory,
        &inputs.run,
        (batches, cpu.held_bytes()),
        num_nodes,
        pieces,
    )?;
    let batches: &[BatchInfo] = batches;
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
        plan::plan_segment(split, ids, batches, &geometry, scratch)
    };
    let mut eval_segments = Vec::new();
    for (split, ids) in [(Split::Valid, valid), (Split::Test, test)] {
        if !ids.is_empty() {
            eval_segments.push(seg_plan(split, ids, &mut scratch));
        }
    }
    let cache_bytes = align(cache.gpu_nodes().len() as u64 * row_bytes)
        + align(cache.cpu_nodes().len() as u64 * row_bytes);
    // The budget holds everything the layout writes. The address tables'
    // records are measured already (no plan changes them); each table
    // object adds its footer, one per segment: the evaluation segments'
    // here, the training segments' with their feature bytes.
    let records_bytes: u64 = batches.iter().map(|b| b.table_bytes).sum();
    let fixed = FixedBytes {
        eval: eval_segments.iter().map(|s| s.size).sum(),
        caches: cache_bytes,
        tables: records_bytes + address_table::FOOTER * eval_segments.len() as u64,
    };
    let how = match (cfg.disk_cache, cfg.segment_size) {
        (DiskCacheMode::Global, _) => SegmentSize::OneSegment,
        (DiskCacheMode::Segmented, Some(s)) => SegmentSize::Given(s),
        (DiskCacheMode::Segmented, None) => SegmentSize::Search,
    };
    let lists = train.iter().map(|&i| batches[i].cold.as_slice());
    let choice = choose_segment_size(how, lists, train.len(), num_nodes, row_bytes, budget, fixed)?;
    let mut segments: Vec<SegmentPlan> = train
        .chunks(choice.segment_size.max(1))
        .map(|ids| seg_plan(Split::Train, ids.to_vec(), &mut scratch))
        .collect();
    segments.extend(eval_segments);
    drop(scratch);
    // The disk caches' rows are staged in memory until their run goes out:
    // beyond the budget, the node range is cut into partitions.
    let (bounds, staging_bytes) =
        plan::partition_bounds(&segments, num_nodes, row_bytes, held.staging_budget);
    held.check_staging(cfg.memory, staging_bytes)?;
    {
        use rayon::prelude::*;
        // Partition-major, then each partition's pages filled: one
        // segment a task.
        segments
            .par_iter_mut()
            .for_each(|seg| seg.partition(&bounds, batches, row_bytes));
    }
    Ok(Layout {
        memory: held.statement(loading, staging_bytes, cfg.memory),
        plan_bytes: held.plan_bytes,
        cache,
        cpu,
        segments,
        bounds,
        choice,
        cache_bytes,
        records_bytes,
        staging_bytes,
    })
}

/// What the pack step wrote, and how it went.
struct Packed {
    pass: PassFigures,
    tables: TableTotals,
    table_seconds: f64,
    gpu_object: Option<Object>,
    cpu_object: Option<Object>,
    /// Every object: the caches, the segments, the address tables.
    objects: Vec<Object>,
    feature_disk_bytes: u64,
}

impl Packed {
    fn report(&self, summary: &mut PackSummary) {
        summary.feature_bytes_read = self.pass.bytes_read;
        summary.pack_read_seconds = self.pass.read_seconds;
        summary.pack_write_seconds = self.pass.write_seconds;
        summary.table_seconds = self.table_seconds;
        summary.feature_disk_bytes = self.feature_disk_bytes;
        summary.table_bytes = self.tables.objects.iter().map(|o| o.size).sum();
    }

    /// The layout as its manifest names it.
    fn into_layout<'a>(
        self,
        segments: &'a [SegmentPlan],
        batches: &'a [BatchInfo],
    ) -> PackedLayout<'a> {
        PackedLayout {
            segments,
            batches,
            gpu_object: self.gpu_object,
            cpu_object: self.cpu_object,
            objects: self.objects,
            rows_crc32c: self.pass.rows_crc32c,
            largest_batch: self.tables.largest,
        }
    }
}

/// Packs the features (DiskGNN §5.2: batched, or the individual baseline)
/// into the layout's objects and, on a second thread beside them, writes
/// the address tables (§6): they need the plan, not the features.
#[allow(clippy::too_many_arguments)]
fn pack_layout(
    cfg: &PackConfig,
    inputs: &Inputs,
    target: &Target,
    engine: &IoEngine,
    ahead: Option<ReadAhead<'_>>,
    batches: &[BatchInfo],
    layout: &Layout,
    rows: RowFormat,
) -> Result<Packed> {
    let staging = &target.staging;
    let prefix = &commit::part_prefix(inputs, target);
    let (cache, segments) = (&layout.cache, &layout.segments);
    let row_bytes = rows.row_bytes;
    let num_nodes = inputs.features.num_rows();
    // Batched packing writes whole pages through the engine with O_DIRECT;
    // the individual baseline writes row by row through the page cache.
    let write_engine = IoEngine::new(IoOptions::default());
    let direct = (cfg.packing == PackingMode::Batched).then_some(&write_engine);
    let create = |name: &str, size: u64| OutFile::create(staging, name, size, direct);
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
    let writes = WritePool::new(&write_engine);
    let ctx = PackCtx {
        engine,
        writes: &writes,
        features: &inputs.features,
        cache,
        segments,
        batches,
        gpu: gpu.as_ref(),
        cpu: cpu.as_ref(),
        seg_files: &seg_files,
        row_bytes,
        from: rows.from,
        to: rows.to,
        bounds: &layout.bounds,
        num_nodes,
    };
    // The table writer's bar stays hidden beside the packing bar.
    let (pass, tables) = std::thread::scope(|s| {
        let tables = s.spawn(|| {
            let t = Instant::now();
            let tables = write_tables(
                (&inputs.samples, &inputs.run, inputs.view.as_ref()),
                staging,
                prefix,
                segments,
                batches,
                (cache, &layout.cpu),
                row_bytes,
                num_nodes,
                false,
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
    let feature_disk_bytes = gpu
        .iter()
        .chain(cpu.iter())
        .chain(seg_files.iter())
        .map(|f| f.size)
        .sum();
    let gpu_object = gpu.map(OutFile::finish).transpose()?;
    let cpu_object = cpu.map(OutFile::finish).transpose()?;
    let mut objects = Vec::new();
    objects.extend(gpu_object.iter().cloned());
    objects.extend(cpu_object.iter().cloned());
    for f in seg_files {
        objects.push(f.finish()?);
    }
    objects.extend(tables.objects.iter().cloned());
    Ok(Packed {
        pass,
        tables,
        table_seconds,
        gpu_object,
        cpu_object,
        objects,
        feature_disk_bytes,
    })
}

/// The layout's bytes on disk, held to the disk budget, and the figures of
/// its reads.
fn account_disk(
    summary: &mut PackSummary,
    packed: &Packed,
    budget: u64,
    feature_file_bytes: u64,
) -> Result<()> {
    let disk_bytes: u64 = packed.objects.iter().map(|o| o.size).sum();
    if disk_bytes > budget {
        return Err(Error::InvalidArgument(format!(
            "internal: the layout takes {disk_bytes} bytes, beyond the disk budget of {budget}"
        )));
    }
    summary.bytes_written = disk_bytes;
    summary.disk_bytes = disk_bytes;
    summary.blow_up = disk_bytes as f64 / feature_file_bytes as f64;
    summary.predicted_read_amplification = packed.tables.amplification();
    summary.amplification = packed.tables.parts();
    summary.access_shares = packed.tables.shares();
    Ok(())
}
