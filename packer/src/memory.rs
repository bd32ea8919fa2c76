//! The packer's memory model (DiskGNN §5.2: batched packing reads the
//! feature file in pieces and stages disk-cache rows in partitions that fit
//! a memory budget): what loading, the plan, the table writer, the pieces
//! read ahead and the staging hold, stated and checked against `--memory`
//! before a byte is packed.

use offgnn_shared::dataset::Split;
use offgnn_shared::report::human_bytes;
use offgnn_shared::samples::{RunSummary, SampleFile};
use serde::Serialize;

use crate::address_tables::{TABLE_BUFFER, table_window};
use crate::error::{Error, Result};
use crate::load::RowFormat;
use crate::plan::BatchInfo;

/// The largest piece of the feature file read at once.
const MAX_PIECE_BYTES: u64 = 64 << 20;
/// Pieces below this read slowly enough to say so: every piece is a round
/// trip to the disk, and small ones leave it idle between them.
const SLOW_PIECE_BYTES: u64 = 1 << 20;
const PAGE: u64 = 4096;
/// What the process needs besides the plan and the partition buffer:
/// binary, allocator, Parquet decoding of samples files, and the stage
/// buffers of the writes (`batched_pack::STAGE_POOL_BYTES`, just over 64 MiB).
pub const BASELINE_BYTES: u64 = 128 << 20;
// The stage buffers leave at least 48 MiB of it to the rest.
const _: () = assert!(crate::batched_pack::STAGE_POOL_BYTES + (48 << 20) <= BASELINE_BYTES);

/// Pieces of the feature file read ahead of the packing: one filled while
/// one is dispatched. Deeper read-ahead lets the disk read more while the
/// plan is made, but costs fresh memory, whose first touch (in the page
/// faults of the reads) can cost more CPU than the deeper reads save.
pub(crate) const READ_AHEAD: u64 = 2;

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

/// Loading's share of the statement: how many samples files are decoded at
/// once, and the peak that holds.
pub(crate) struct Loading {
    pub loaders: usize,
    pub bytes: u64,
}

impl Loading {
    /// Loading comes before anything else the statement counts: it states
    /// its own peak, within `memory` whenever one file at a time fits.
    pub(crate) fn plan(memory: u64, run: &RunSummary) -> Loading {
        let loaders = loaders(memory, run);
        let bytes = BASELINE_BYTES + loading_memory(run, loaders);
        tracing::info!(
            "loading {} samples files, {loaders} at a time: at most {}",
            run.files.len(),
            human_bytes(bytes)
        );
        Loading { loaders, bytes }
    }
}

/// The feature file's pieces. The pass starts beside the plan, so their
/// size comes from the memory a bound on the plan leaves (the plan's exact
/// bytes are checked once it is made, [`PlanMemory::check`]).
pub(crate) struct Pieces {
    /// The bound on the plan's bytes (with the table writer's).
    pub plan_bound: u64,
    pub bytes: u64,
    pub rows: u64,
    /// The buffer a converted piece waits in while it is dispatched (none
    /// when rows are stored as read).
    pub convert_bytes: u64,
}

impl Pieces {
    /// Sizes the pieces under `memory`, for `batches` as loaded (their
    /// input nodes bound their cold rows).
    pub(crate) fn size(
        memory: u64,
        run: &RunSummary,
        batches: &[BatchInfo],
        num_nodes: u64,
        rows: RowFormat,
    ) -> Pieces {
        let inputs: u64 = batches.iter().map(|b| b.inputs.len() as u64).sum();
        let plan_bound = plan_memory(num_nodes, inputs) + tables_memory(run, batches);
        let bytes = piece_size(memory, plan_bound, rows.source_row_bytes);
        let piece_rows = ((bytes - 2 * PAGE) / rows.source_row_bytes).max(1);
        let convert_bytes = if rows.converted() {
            piece_rows * rows.row_bytes
        } else {
            0
        };
        Pieces {
            plan_bound,
            bytes,
            rows: piece_rows,
            convert_bytes,
        }
    }

    /// Accepted, but slow: said once every check has passed.
    pub(crate) fn warn_if_slow(&self, memory: u64) {
        if self.bytes < SLOW_PIECE_BYTES {
            tracing::warn!(
                "--memory {} leaves the feature file's pass pieces of {} beside what the plan may need ({}): the pass will be slow; give more memory",
                human_bytes(memory),
                human_bytes(self.bytes),
                human_bytes(self.plan_bound)
            );
        }
    }
}

/// The packing phase's memory: the plan (the table writer, a thread beside
/// the pass, counted with it), the pieces read ahead, and what is left of
/// `--memory` to stage disk-cache runs.
pub(crate) struct PlanMemory {
    pub plan_bytes: u64,
    pub tables_bytes: u64,
    pub read_ahead: u64,
    pub staging_budget: u64,
}

impl PlanMemory {
    /// Checks that `memory` holds the plan of `batches` (their cold rows
    /// known), the baseline and the pieces read ahead. The table writer
    /// holds one samples file decoded, a buffer per segment and an index of
    /// the batches.
    pub(crate) fn check(
        memory: u64,
        run: &RunSummary,
        (batches, cpu_plan_bytes): (&[BatchInfo], u64),
        num_nodes: u64,
        pieces: &Pieces,
    ) -> Result<PlanMemory> {
        let tables_bytes = tables_memory(run, batches);
        let plan_bytes = plan_memory(num_nodes, batches.iter().map(|b| b.cold.len() as u64).sum())
            + tables_bytes
            + cpu_plan_bytes;
        let read_ahead = READ_AHEAD * pieces.bytes + pieces.convert_bytes;
        let least = BASELINE_BYTES + read_ahead;
        let available = memory
            .checked_sub(plan_bytes + BASELINE_BYTES)
            .filter(|&b| b >= read_ahead)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "--memory {} is too small: the plan needs {} and packing at least {} more; give at least {}",
                    human_bytes(memory),
                    human_bytes(plan_bytes),
                    human_bytes(least),
                    human_bytes(plan_bytes + least)
                ))
            })?;
        Ok(PlanMemory {
            plan_bytes,
            tables_bytes,
            read_ahead,
            staging_budget: available - read_ahead,
        })
    }

    /// Refuses a staging of disk-cache rows (the largest partition's,
    /// `plan::partition_bounds`) beyond what is left of `memory`.
    pub(crate) fn check_staging(&self, memory: u64, staging_bytes: u64) -> Result<()> {
        if staging_bytes > self.staging_budget {
            return Err(Error::InvalidArgument(format!(
                "--memory {} is too small: one node's disk-cache rows need {staging_bytes} bytes of staging beside the {} of the plan and buffers; give at least {}",
                memory,
                self.plan_bytes + BASELINE_BYTES + self.read_ahead,
                self.plan_bytes + BASELINE_BYTES + self.read_ahead + staging_bytes
            )));
        }
        Ok(())
    }

    /// The run's statement, said in the log: the larger of loading's peak
    /// and the packing's sum, under `limit` (`--memory`).
    pub(crate) fn statement(
        &self,
        loading: &Loading,
        staging_bytes: u64,
        limit: u64,
    ) -> MemoryStatement {
        let statement = MemoryStatement {
            total_bytes: (self.plan_bytes + BASELINE_BYTES + self.read_ahead + staging_bytes)
                .max(loading.bytes),
            loading_bytes: loading.bytes,
            loaders: loading.loaders,
            plan_bytes: self.plan_bytes,
            tables_bytes: self.tables_bytes,
            read_ahead_bytes: self.read_ahead,
            staging_bytes,
            baseline_bytes: BASELINE_BYTES,
            limit_bytes: limit,
        };
        tracing::info!(
            "memory: at most {} (loading {}; then plan {} with the table writer's {}, read-ahead {}, disk-cache staging {}, buffers and runtime {}) under --memory {}",
            human_bytes(statement.total_bytes),
            human_bytes(loading.bytes),
            human_bytes(self.plan_bytes),
            human_bytes(self.tables_bytes),
            human_bytes(self.read_ahead),
            human_bytes(staging_bytes),
            human_bytes(BASELINE_BYTES),
            human_bytes(limit)
        );
        statement
    }
}

/// Bytes one samples file takes while it is decoded: its fetched bytes,
/// held until its last row is decoded; its batches decoded (their edges'
/// source and destination ids, input nodes, and seeds with their labels);
/// and the Parquet decoder's buffers for the row in hand (per value: the
/// value, its definition and repetition levels, and Arrow's copy), for a
/// batch of twice the file's average size.
fn decoded_file_memory(run: &RunSummary, f: &SampleFile) -> u64 {
    let batch = run.params.largest_batch_size() as u64;
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

/// The values (edge ends, input nodes, labels) and the input nodes of a
/// batch of average size, in the samples files where each is largest.
fn largest_batch(run: &RunSummary) -> (u64, u64) {
    let per_batch =
        |n: u64, f: &offgnn_shared::samples::SampleFile| n.div_ceil(u64::from(f.batches.max(1)));
    let values = run
        .files
        .iter()
        .map(|f| per_batch(2 * f.edges + f.input_nodes, f) + run.params.largest_batch_size() as u64)
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
pub(crate) fn loading_memory(run: &RunSummary, loaders: usize) -> u64 {
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

/// The feature file's piece size under `memory`, given (a bound on) the
/// plan's bytes: a quarter of what is left, at most [`MAX_PIECE_BYTES`]; the
/// rest stages disk-cache rows. A piece holds a row and the pages around
/// it, however little is left.
fn piece_size(memory: u64, plan_bytes: u64, row_bytes: u64) -> u64 {
    let left = memory.saturating_sub(plan_bytes + BASELINE_BYTES);
    (left / 4).clamp(row_bytes + 2 * PAGE, MAX_PIECE_BYTES)
}
