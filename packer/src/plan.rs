//! The layout plan: which tier holds each row, how training batches group
//! into segments, each segment's disk cache (MinHash-ordered) and packed
//! chunks, and every region's offset — everything batched packing and the
//! address tables need, decided before a byte of features is read.
//!
//! Regions are 4 KiB aligned (`O_DIRECT`). Cache tiers hold their rows in
//! ascending node order, and each disk cache is MinHash-ordered within each
//! feature-file partition (partition-major): every partition then fills one
//! contiguous run of every region, so batched packing writes large runs
//! (DiskGNN §5.2) instead of one row at a time. With the whole feature file
//! in one partition this is exactly Algorithm 1's order.

use offgnn_shared::dataset::Split;

use crate::access_rank::{AccessCounts, Tiers};
use crate::minhash::minhash_order;

pub const PAGE: u64 = 4096;

/// Rounds up to a whole number of pages.
pub fn align(bytes: u64) -> u64 {
    bytes.div_ceil(PAGE) * PAGE
}

/// A batch as the packer sees it.
#[derive(Clone, Debug)]
pub struct BatchInfo {
    pub split: Split,
    pub epoch: u32,
    pub index: u32,
    /// Input nodes needing a disk read (neither cache holds them), sorted.
    pub cold: Vec<u32>,
    /// All input nodes, for counting; emptied once the tiers are fixed.
    pub inputs: Vec<u32>,
}

/// Where each node's row lives among the caches, with slots in ascending
/// node order.
pub struct CacheMap {
    loc: Vec<u32>,
    pub gpu: Vec<u32>,
    pub cpu: Vec<u32>,
}

const DISK: u32 = u32::MAX;
const CPU_FLAG: u32 = 1 << 31;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loc {
    Gpu(u32),
    Cpu(u32),
    Disk,
}

impl CacheMap {
    /// Takes the tier membership from the frequency ranking and numbers each
    /// tier's rows by node id.
    pub fn new(tiers: &Tiers, num_nodes: u64) -> Result<CacheMap, crate::error::Error> {
        let mut gpu = tiers.gpu_nodes().to_vec();
        let mut cpu = tiers.cpu_nodes().to_vec();
        if gpu.len() as u64 >= CPU_FLAG as u64 || cpu.len() as u64 >= CPU_FLAG as u64 {
            return Err(crate::error::Error::InvalidArgument(
                "a cache tier of 2^31 rows or more is not supported".into(),
            ));
        }
        gpu.sort_unstable();
        cpu.sort_unstable();
        let mut loc = vec![DISK; num_nodes as usize];
        for (slot, &v) in gpu.iter().enumerate() {
            loc[v as usize] = slot as u32;
        }
        for (slot, &v) in cpu.iter().enumerate() {
            loc[v as usize] = CPU_FLAG | slot as u32;
        }
        Ok(CacheMap { loc, gpu, cpu })
    }

    pub fn locate(&self, v: u32) -> Loc {
        match self.loc[v as usize] {
            DISK => Loc::Disk,
            x if x & CPU_FLAG != 0 => Loc::Cpu(x & !CPU_FLAG),
            x => Loc::Gpu(x),
        }
    }
}

/// One segment: a run of consecutive batches of one split sharing a disk cache.
#[derive(Debug)]
pub struct SegmentPlan {
    pub split: Split,
    /// Indices into the plan's batch list, in consumption order.
    pub batches: Vec<usize>,
    /// Disk-cache rows in layout order.
    pub dc_rows: Vec<u32>,
    /// `(node, position)` sorted by node, for lookups.
    dc_index: Vec<(u32, u32)>,
    /// `dc_bounds[p]..dc_bounds[p + 1]` are the positions of partition `p`'s rows.
    pub dc_bounds: Vec<usize>,
    /// Per batch: the rows only it needs in this segment, ascending.
    pub packed: Vec<Vec<u32>>,
    pub chunk_offset: Vec<u64>,
    pub chunk_len: Vec<u64>,
    pub dc_bytes: u64,
    pub size: u64,
}

impl SegmentPlan {
    /// Position of `v` in the disk cache.
    pub fn dc_position(&self, v: u32) -> Option<u32> {
        self.dc_index
            .binary_search_by_key(&v, |&(n, _)| n)
            .ok()
            .map(|i| self.dc_index[i].1)
    }

    pub fn packed_rows(&self) -> u64 {
        self.packed.iter().map(|p| p.len() as u64).sum()
    }

    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_len.iter().sum()
    }
}

/// Per-node counters reset after each use (touched entries only).
pub struct Scratch {
    count: Vec<u32>,
    touched: Vec<u32>,
}

impl Scratch {
    pub fn new(num_nodes: u64) -> Self {
        Scratch {
            count: vec![0; num_nodes as usize],
            touched: Vec::new(),
        }
    }
}

/// Sizes that shape every segment.
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    pub row_bytes: u64,
    /// Rows per feature-file partition of batched packing.
    pub partition_rows: u64,
    pub num_partitions: usize,
    /// Seed of the MinHash permutations.
    pub seed: u64,
}

/// Plans one segment (DiskGNN §5.1): rows two or more of its batches need go
/// to its disk cache once, MinHash-ordered; rows one batch needs go to that
/// batch's packed chunk.
pub fn plan_segment(
    split: Split,
    batch_ids: Vec<usize>,
    batches: &[BatchInfo],
    geometry: &Geometry,
    scratch: &mut Scratch,
) -> SegmentPlan {
    let Geometry {
        row_bytes,
        partition_rows,
        num_partitions,
        seed,
    } = *geometry;
    for &b in &batch_ids {
        for &v in &batches[b].cold {
            let c = &mut scratch.count[v as usize];
            if *c == 0 {
                scratch.touched.push(v);
            }
            *c = c.saturating_add(1);
        }
    }
    let mut shared: Vec<u32> = scratch
        .touched
        .iter()
        .copied()
        .filter(|&v| scratch.count[v as usize] >= 2)
        .collect();
    shared.sort_unstable();
    let packed: Vec<Vec<u32>> = batch_ids
        .iter()
        .map(|&b| {
            batches[b]
                .cold
                .iter()
                .copied()
                .filter(|&v| scratch.count[v as usize] == 1)
                .collect()
        })
        .collect();
    for &v in &scratch.touched {
        scratch.count[v as usize] = 0;
    }
    scratch.touched.clear();

    // DiskGNN §5.1, Algorithm 1 (two hash functions), then partition-major.
    let lists: Vec<&[u32]> = batch_ids
        .iter()
        .map(|&b| batches[b].cold.as_slice())
        .collect();
    let mut dc_rows = minhash_order(&shared, &lists, 2, seed);
    dc_rows.sort_by_key(|&v| v as u64 / partition_rows);
    let mut dc_bounds = Vec::with_capacity(num_partitions + 1);
    for p in 0..=num_partitions as u64 {
        dc_bounds.push(dc_rows.partition_point(|&v| (v as u64 / partition_rows) < p));
    }
    let mut dc_index: Vec<(u32, u32)> = dc_rows
        .iter()
        .enumerate()
        .map(|(pos, &v)| (v, pos as u32))
        .collect();
    dc_index.sort_unstable();

    let dc_bytes = align(dc_rows.len() as u64 * row_bytes);
    let mut at = dc_bytes;
    let mut chunk_offset = Vec::with_capacity(packed.len());
    let mut chunk_len = Vec::with_capacity(packed.len());
    for p in &packed {
        let len = align(p.len() as u64 * row_bytes);
        chunk_offset.push(at);
        chunk_len.push(len);
        at += len;
    }
    SegmentPlan {
        split,
        batches: batch_ids,
        dc_rows,
        dc_index,
        dc_bounds,
        packed,
        chunk_offset,
        chunk_len,
        dc_bytes,
        size: at,
    }
}

/// Counts accesses over the training batches of every epoch and fixes the
/// tiers (DiskGNN §4: the most popular rows to the GPU cache, the next to
/// the CPU cache), then reduces every batch to its cold rows.
pub fn rank_and_split(
    batches: &mut [BatchInfo],
    num_nodes: u64,
    row_bytes: u64,
    gpu_bytes: u64,
    cpu_bytes: u64,
) -> Result<(AccessCounts, CacheMap), crate::error::Error> {
    let mut counts = AccessCounts::new(num_nodes);
    for b in batches.iter().filter(|b| b.split == Split::Train) {
        counts.add_batch(&b.inputs)?;
    }
    let tiers = crate::access_rank::assign_tiers(&counts, row_bytes, gpu_bytes, cpu_bytes);
    let map = CacheMap::new(&tiers, num_nodes)?;
    for b in batches.iter_mut() {
        let mut cold: Vec<u32> = b
            .inputs
            .iter()
            .copied()
            .filter(|&v| map.locate(v) == Loc::Disk)
            .collect();
        cold.sort_unstable();
        b.cold = cold;
        b.inputs = Vec::new();
    }
    Ok((counts, map))
}
