//! What a packing job is asked ([`PackConfig`]) and what it reports
//! ([`PackSummary`]): the types every step of `pack` reads or fills.

use offgnn_manifests as manifests;
use offgnn_manifests::{DiskCacheMode, Dtype, PackingMode, RowOrder};
use serde::Serialize;

use crate::address_tables::AmplificationParts;
use crate::memory::MemoryStatement;
use crate::sizes::Budget;

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
    pub store_dtype: Option<Dtype>,
    /// How each disk cache's rows are ordered.
    pub row_order: RowOrder,
    /// How the CPU cache's rows change from batch to batch.
    pub cpu_cache_policy: CpuCachePolicy,
    /// What ranks rows for the cache tiers.
    pub rank_by: RankBy,
    pub overwrite: bool,
    pub show_progress: bool,
}

/// How the CPU cache's rows change as training goes: the same most-read
/// rows throughout (DiskGNN), Belady's policy over the known batch order
/// (Ginex), GIDS's window buffering over random eviction (for
/// comparison), or whichever of static and Belady reads fewer bytes from
/// disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuCachePolicy {
    Static,
    Belady,
    Window { batches: u32 },
    Auto,
}

/// What ranks the rows for the cache tiers: how many sampled batches read
/// each (DiskGNN), or each row's expected reads from the graph and the
/// fan-outs alone (GIDS's reverse-PageRank hot set).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RankBy {
    Samples,
    Graph,
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
    /// The CPU cache's policy, `static` or `belady`, and the rows and
    /// bytes each policy would read from disk over the sampled training
    /// batches (where the CPU cache holds rows and a choice was weighed).
    pub cpu_cache_policy: manifests::CachePolicy,
    /// What ranked the rows for the cache tiers (`samples` or `graph`).
    pub rank_by: Option<RankBy>,
    pub cpu_cache_forecast: Option<crate::belady::Forecast>,
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
    /// The objects of runs killed before committing, removed at start.
    pub leftovers_removed: offgnn_shared::lease::Swept,
}
