//! The layout plan: which tier holds each row, how training batches group
//! into segments, each segment's disk cache (MinHash-ordered) and packed
//! chunks, and every region's offset — everything batched packing and the
//! address tables need, decided before a byte of features is read.
//!
//! Regions are 4 KiB aligned (`O_DIRECT`). Cache tiers and packed chunks
//! hold their rows in ascending node order, so they fill front to back as
//! the feature file streams by. Each disk cache is in Algorithm 1's MinHash
//! order, which visits the file in no order at all: batched packing gathers
//! a disk cache's rows in memory until they can go out as one run. When the
//! disk caches together hold more than the memory budget, the node range is
//! cut into partitions whose disk-cache rows fit ([`partition_bounds`]) and
//! each disk cache is MinHash-ordered within each partition (partition-major;
//! [`SegmentPlan::partition`]). With one partition — whenever the disk
//! caches fit in memory — this is exactly Algorithm 1's order.

use offgnn_shared::dataset::Split;
use rayon::prelude::*;

use crate::access_rank::{AccessCounts, Location, Tiers};
use crate::belady::{BatchCpu, Forecast, Policy};
use crate::job::CpuCachePolicy;
use crate::minhash::{fill_pages, minhash_order};
use offgnn_manifests::CachePolicy;
use offgnn_manifests::RowOrder;

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
    /// Bytes of the batch's address-table record: its compressed topology,
    /// measured while loading, and its addresses, which the input count
    /// fixes (`address_table::record_bytes`).
    pub table_bytes: u64,
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
    /// `dc_bounds[p]..dc_bounds[p + 1]` are the positions of partition `p`'s
    /// rows (one partition until [`SegmentPlan::partition`]).
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

    /// For `nodes` in ascending order (repeats allowed), each one's
    /// position in the disk cache, as [`SegmentPlan::dc_position`] gives
    /// it: one forward walk of the index, galloping from the last hit,
    /// where a binary search each would probe all over a large index (a
    /// cache miss a probe).
    pub fn dc_positions_sorted(
        &self,
        nodes: impl IntoIterator<Item = u32>,
    ) -> impl Iterator<Item = Option<u32>> {
        let index = self.dc_index.as_slice();
        let mut at = 0usize;
        nodes.into_iter().map(move |v| {
            // The first entry at or after `at` whose node is not below `v`:
            // double the step while still below, then search the last one.
            let rest = &index[at..];
            let mut hi = 1;
            while hi < rest.len() && rest[hi].0 < v {
                hi *= 2;
            }
            let (lo, end) = (hi / 2, hi.min(rest.len()));
            at += lo + rest[lo..end].partition_point(|&(n, _)| n < v);
            index.get(at).filter(|e| e.0 == v).map(|e| e.1)
        })
    }

    /// The disk-cache entries whose node lies in `[first, end)`, as
    /// `(node, position)` sorted by node.
    pub fn dc_entries_in(&self, first: u64, end: u64) -> &[(u32, u32)] {
        let a = self.dc_index.partition_point(|&(v, _)| (v as u64) < first);
        let b = self.dc_index.partition_point(|&(v, _)| (v as u64) < end);
        &self.dc_index[a..b]
    }

    /// Orders the disk cache partition-major: stable-sorted by the partition
    /// of each row (`bounds[p]..bounds[p + 1]` are partition p's nodes), so
    /// MinHash order holds within each partition; then fills each
    /// partition's pages ([`fill_pages`]). With one partition, the fill
    /// alone. `batches` are the plan's batches, `row_bytes` its rows'.
    pub fn partition(&mut self, bounds: &[u64], batches: &[BatchInfo], row_bytes: u64) {
        let part = |v: u32| bounds.partition_point(|&b| b <= v as u64) - 1;
        self.dc_rows.sort_by_key(|&v| part(v));
        self.dc_bounds = (0..bounds.len())
            .map(|p| self.dc_rows.partition_point(|&v| part(v) < p))
            .collect();
        let lists: Vec<&[u32]> = self
            .batches
            .iter()
            .map(|&b| batches[b].cold.as_slice())
            .collect();
        let per_page = (PAGE / row_bytes.max(1)).max(1) as usize;
        for w in self.dc_bounds.windows(2) {
            let run = &mut self.dc_rows[w[0]..w[1]];
            let filled = fill_pages(run.to_vec(), &lists, row_bytes, w[0] % per_page);
            run.copy_from_slice(&filled);
        }
        for (pos, &v) in self.dc_rows.iter().enumerate() {
            let i = self
                .dc_index
                .binary_search_by_key(&v, |&(n, _)| n)
                .expect("every disk-cache row is in the index");
            self.dc_index[i].1 = pos as u32;
        }
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
    num_nodes: usize,
    /// Empty until a segment of two or more batches needs it: a per-node
    /// table is fresh memory, and one-batch segments share nothing.
    count: Vec<u32>,
    touched: Vec<u32>,
}

impl Scratch {
    pub fn new(num_nodes: u64) -> Self {
        Scratch {
            num_nodes: num_nodes as usize,
            count: Vec::new(),
            touched: Vec::new(),
        }
    }
}

/// Sizes that shape every segment.
#[derive(Clone, Copy, Debug)]
pub struct Geometry {
    pub row_bytes: u64,
    /// Seed of the MinHash permutations.
    pub seed: u64,
    /// How each disk cache's rows are ordered.
    pub row_order: RowOrder,
}

/// Cuts the node range `[0, num_nodes)` into partitions whose disk-cache
/// entries (over all segments) take at most `budget` bytes each. Returns the
/// first node of each partition with `num_nodes` last, and the largest
/// partition's disk-cache bytes. One partition when everything fits. A node
/// with more entries than the budget holds is a partition of its own, so the
/// largest can exceed the budget: the caller checks.
pub fn partition_bounds(
    segments: &[SegmentPlan],
    num_nodes: u64,
    row_bytes: u64,
    budget: u64,
) -> (Vec<u64>, u64) {
    let total: u64 = segments
        .iter()
        .map(|s| s.dc_rows.len() as u64 * row_bytes)
        .sum();
    if total <= budget {
        return (vec![0, num_nodes], total);
    }
    let mut entries = vec![0u32; num_nodes as usize];
    for s in segments {
        for &v in &s.dc_rows {
            entries[v as usize] += 1;
        }
    }
    let mut bounds = vec![0u64];
    let (mut filled, mut largest) = (0u64, 0u64);
    for (v, &n) in entries.iter().enumerate() {
        let bytes = n as u64 * row_bytes;
        if filled > 0 && filled + bytes > budget {
            bounds.push(v as u64);
            filled = 0;
        }
        filled += bytes;
        largest = largest.max(filled);
    }
    bounds.push(num_nodes);
    (bounds, largest)
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
        seed,
        row_order,
    } = *geometry;
    // With one batch nothing is shared: every cold row is packed, and
    // nothing needs counting.
    let one = batch_ids.len() == 1;
    if !one {
        if scratch.count.is_empty() {
            scratch.count = vec![0; scratch.num_nodes];
        }
        for &b in &batch_ids {
            for &v in &batches[b].cold {
                let c = &mut scratch.count[v as usize];
                if *c == 0 {
                    scratch.touched.push(v);
                }
                *c = c.saturating_add(1);
            }
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
                .filter(|&v| one || scratch.count[v as usize] == 1)
                .collect()
        })
        .collect();
    for &v in &scratch.touched {
        scratch.count[v as usize] = 0;
    }
    scratch.touched.clear();

    // DiskGNN §5.1, Algorithm 1 or its bottom-k variant; partitioned later
    // only if the disk caches outgrow the packing memory.
    let lists: Vec<&[u32]> = batch_ids
        .iter()
        .map(|&b| batches[b].cold.as_slice())
        .collect();
    // Its pages are filled once the partitions are known ([`SegmentPlan::partition`]).
    let dc_rows = minhash_order(&shared, &lists, row_order, seed);
    let dc_bounds = vec![0, dc_rows.len()];
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

/// Counts accesses over the training batches of every epoch (or takes the
/// `ranking` given) and fixes the tiers (DiskGNN §4: the most popular rows
/// to the GPU cache, the next to the CPU cache), then reduces every batch
/// to its cold rows.
pub fn rank_and_split(
    batches: &mut [BatchInfo],
    (num_nodes, row_bytes): (u64, u64),
    (gpu_bytes, cpu_bytes): (u64, u64),
    ranking: Option<AccessCounts>,
    (policy, memory): (CpuCachePolicy, u64),
) -> Result<(Tiers, CpuPlan), crate::error::Error> {
    let counts = match ranking {
        Some(counts) => counts,
        None => {
            let train: Vec<&[u32]> = batches
                .iter()
                .filter(|b| b.split == Split::Train)
                .map(|b| b.inputs.as_slice())
                .collect();
            AccessCounts::from_batches(num_nodes, &train)?
        }
    };
    let tiers = crate::access_rank::assign_tiers(counts, row_bytes, gpu_bytes, cpu_bytes)?;
    let cpu = CpuPlan::choose(batches, &tiers, row_bytes, (policy, memory))?;
    batches.par_iter_mut().enumerate().for_each(|(i, b)| {
        let mut cold: Vec<u32> = match cpu.of(i) {
            // Under Belady: what the GPU cache and the cache's state then
            // do not hold.
            Some(u) => b
                .inputs
                .iter()
                .copied()
                .filter(|&v| {
                    !matches!(tiers.locate(v), Location::Gpu(_))
                        && u.hits.binary_search_by_key(&v, |h| h.0).is_err()
                })
                .collect(),
            None => b
                .inputs
                .iter()
                .copied()
                .filter(|&v| tiers.locate(v) == Location::Disk)
                .collect(),
        };
        cold.sort_unstable();
        if let Some(u) = cpu.of(i) {
            b.table_bytes += offgnn_shared::address_table::admission_bytes(
                u.admits.len() as u64,
                b.inputs.len() as u64,
                num_nodes,
            );
        }
        b.cold = cold;
        b.inputs = Vec::new();
    });
    Ok((tiers, cpu))
}

/// The CPU cache's policy and, under Belady, each batch's use of it.
#[derive(Debug, Default)]
pub struct CpuPlan {
    pub policy: CachePolicy,
    /// Per batch of the plan (under Belady; evaluation batches `None`).
    batches: Vec<Option<BatchCpu>>,
    /// Both policies' rows read from disk, where a choice was weighed.
    pub forecast: Option<Forecast>,
}

impl CpuPlan {
    /// Weighs the policies as `policy` asks over `batches` (which still
    /// hold their inputs): Belady or the window where asked, or under
    /// `auto` Belady where it reads fewer bytes from disk than the static
    /// tier, the restores' pages included, and where the simulation's
    /// tables fit in half of `memory` (the packer's budget; a policy asked
    /// for is held to the whole budget by the plan's check). Without
    /// CPU-cache rows or training batches the cache has nothing to follow:
    /// static.
    fn choose(
        batches: &[BatchInfo],
        tiers: &Tiers,
        row_bytes: u64,
        (policy, memory): (CpuCachePolicy, u64),
    ) -> Result<CpuPlan, offgnn_shared::Error> {
        let trains = batches.iter().any(|b| b.split == Split::Train);
        let bound = crate::belady::memory_bound(batches, tiers.num_nodes());
        if policy == CpuCachePolicy::Auto && bound > memory / 2 {
            tracing::info!(
                "CPU cache policy: static; Belady's simulation could take {}, more than half of --memory {}",
                offgnn_shared::report::human_bytes(bound),
                offgnn_shared::report::human_bytes(memory)
            );
            return Ok(CpuPlan::default());
        }
        let (simulated, manifest) = match policy {
            CpuCachePolicy::Static => return Ok(CpuPlan::default()),
            CpuCachePolicy::Belady | CpuCachePolicy::Auto => (Policy::Belady, CachePolicy::Belady),
            CpuCachePolicy::Window { batches } => (Policy::Window { batches }, CachePolicy::Window),
        };
        if tiers.cpu_nodes().is_empty() || !trains {
            // Said once a run (a typed layout plans each type).
            static SAID: std::sync::Once = std::sync::Once::new();
            if policy != CpuCachePolicy::Auto {
                SAID.call_once(|| tracing::warn!(
                    "CPU cache policy: static, not the one asked for: {}",
                    if trains {
                        "the CPU cache holds no rows (--cpu-cache 0, or a budget the GPU cache takes whole), so there is nothing for a policy to follow"
                    } else {
                        "the samples hold no training batches for a policy to follow"
                    }
                ));
            }
            return Ok(CpuPlan::default());
        }
        let (used, forecast) = crate::belady::simulate(batches, tiers, row_bytes, simulated)?;
        let follows =
            policy != CpuCachePolicy::Auto || forecast.total_bytes() < forecast.static_bytes;
        Ok(CpuPlan {
            policy: if follows {
                manifest
            } else {
                CachePolicy::Static
            },
            batches: if follows { used } else { Vec::new() },
            forecast: Some(forecast),
        })
    }

    /// Bytes the hits and admissions hold until the tables are written.
    pub fn held_bytes(&self) -> u64 {
        let entries: usize = self
            .batches
            .iter()
            .flatten()
            .map(|u| u.hits.capacity() + u.admits.capacity())
            .sum();
        (entries * 8 + self.batches.capacity() * std::mem::size_of::<Option<BatchCpu>>()) as u64
    }

    /// Batch `i`'s hits and admissions, where the cache follows the order.
    pub fn of(&self, i: usize) -> Option<&BatchCpu> {
        self.batches.get(i).and_then(Option::as_ref)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Auto takes Belady where it reads less and its simulation fits half
    /// the memory budget; with too little memory it keeps the static tier
    /// without simulating, while a policy asked for is simulated anyway.
    #[test]
    fn auto_weighs_belady_only_within_half_the_memory_budget() {
        // A cache of one row, and batches that read row 0 three times,
        // then row 1 three times, twice over: the static tier holds one of
        // them (6 misses), Belady switches (3 misses, 1 row restored).
        let inputs: Vec<Vec<u32>> = (0..12).map(|i| vec![(i / 3) % 2]).collect();
        let batches: Vec<BatchInfo> = inputs
            .iter()
            .enumerate()
            .map(|(i, inputs)| BatchInfo {
                split: Split::Train,
                epoch: 0,
                index: i as u32,
                cold: Vec::new(),
                inputs: inputs.clone(),
                table_bytes: 0,
            })
            .collect();
        let counts = AccessCounts::from_counts(vec![6, 6]);
        let tiers = crate::access_rank::assign_tiers(counts, 4096, 0, 4096).unwrap();
        let plan =
            |policy, memory| CpuPlan::choose(&batches, &tiers, 4096, (policy, memory)).unwrap();
        let roomy = plan(CpuCachePolicy::Auto, 1 << 30);
        assert_eq!(roomy.policy, CachePolicy::Belady, "{:?}", roomy.forecast);
        assert!(roomy.held_bytes() > 0);
        let tight = plan(CpuCachePolicy::Auto, 64);
        assert_eq!(tight.policy, CachePolicy::Static);
        assert!(tight.forecast.is_none() && tight.held_bytes() == 0);
        assert_eq!(plan(CpuCachePolicy::Belady, 64).policy, CachePolicy::Belady);
    }

    fn batch(cold: &[u32]) -> BatchInfo {
        BatchInfo {
            split: Split::Train,
            epoch: 0,
            index: 0,
            cold: cold.to_vec(),
            inputs: Vec::new(),
            table_bytes: 0,
        }
    }

    #[test]
    fn partitions_hold_their_disk_cache_rows_within_the_budget() {
        // Two segments over 20 nodes; rows shared inside a segment go to its
        // disk cache.
        let batches = vec![
            batch(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]),
            batch(&[0, 2, 4, 6, 8, 10, 12, 14]),
            batch(&[1, 3, 5, 7, 9, 11, 13, 15, 17, 19]),
            batch(&[1, 5, 9, 13, 17, 18]),
        ];
        let geometry = Geometry {
            row_bytes: 10,
            seed: 3,
            row_order: RowOrder::DEFAULT,
        };
        let mut scratch = Scratch::new(20);
        let mut segments = vec![
            plan_segment(Split::Train, vec![0, 1], &batches, &geometry, &mut scratch),
            plan_segment(Split::Train, vec![2, 3], &batches, &geometry, &mut scratch),
        ];
        assert_eq!(segments[0].dc_rows.len(), 5); // 0 2 4 6 8
        assert_eq!(segments[1].dc_rows.len(), 5); // 1 5 9 13 17
        // Everything fits: one partition, Algorithm 1's order untouched.
        let (bounds, largest) = partition_bounds(&segments, 20, 10, 1000);
        assert_eq!((bounds, largest), (vec![0, 20], 100));
        // 30 bytes a partition: three rows at most.
        let (bounds, largest) = partition_bounds(&segments, 20, 10, 30);
        assert!(largest <= 30);
        assert_eq!(bounds.first(), Some(&0));
        assert_eq!(bounds.last(), Some(&20));
        let before: Vec<Vec<u32>> = segments.iter().map(|s| s.dc_rows.clone()).collect();
        for s in &mut segments {
            s.partition(&bounds, &batches, 10);
        }
        for (s, old) in segments.iter().zip(&before) {
            let mut a = s.dc_rows.clone();
            let mut b = old.clone();
            a.sort_unstable();
            b.sort_unstable();
            assert_eq!(a, b, "the same rows, reordered");
            for p in 0..bounds.len() - 1 {
                for &v in &s.dc_rows[s.dc_bounds[p]..s.dc_bounds[p + 1]] {
                    assert!((bounds[p]..bounds[p + 1]).contains(&(v as u64)));
                }
                // Within a partition, the MinHash order of the whole (rows
                // of 10 bytes straddle pages: no page is filled).
                let run = &s.dc_rows[s.dc_bounds[p]..s.dc_bounds[p + 1]];
                let kept: Vec<u32> = old.iter().copied().filter(|v| run.contains(v)).collect();
                assert_eq!(run, kept.as_slice());
            }
            for (pos, &v) in s.dc_rows.iter().enumerate() {
                assert_eq!(s.dc_position(v), Some(pos as u32));
            }
            assert_eq!(s.dc_entries_in(0, 20).len(), s.dc_rows.len());
            // The walk over sorted nodes, repeats and absent nodes among
            // them, finds what a binary search each finds.
            let sweep: Vec<u32> = (0..22).flat_map(|v| [v, v]).collect();
            let walked: Vec<Option<u32>> = s.dc_positions_sorted(sweep.iter().copied()).collect();
            let searched: Vec<Option<u32>> = sweep.iter().map(|&v| s.dc_position(v)).collect();
            assert_eq!(walked, searched);
            let sparse = [3u32, 9, 17, 21];
            let walked: Vec<Option<u32>> = s.dc_positions_sorted(sparse).collect();
            let searched: Vec<Option<u32>> = sparse.iter().map(|&v| s.dc_position(v)).collect();
            assert_eq!(walked, searched);
        }
    }

    #[test]
    fn a_one_batch_segment_packs_every_cold_row_without_counting() {
        let batches = vec![batch(&[2, 5, 7]), batch(&[5, 7, 9])];
        let geometry = Geometry {
            row_bytes: 10,
            seed: 3,
            row_order: RowOrder::DEFAULT,
        };
        let mut scratch = Scratch::new(20);
        let alone = plan_segment(Split::Train, vec![0], &batches, &geometry, &mut scratch);
        assert!(alone.dc_rows.is_empty());
        assert_eq!(alone.packed, [vec![2, 5, 7]]);
        assert_eq!((alone.dc_bytes, alone.chunk_len[0]), (0, PAGE));
        assert!(scratch.count.is_empty(), "no per-node table for one batch");
        // Two batches count their rows: 5 and 7 are shared.
        let pair = plan_segment(Split::Train, vec![0, 1], &batches, &geometry, &mut scratch);
        let mut shared = pair.dc_rows.clone();
        shared.sort_unstable();
        assert_eq!(shared, [5, 7]);
        assert_eq!(pair.packed, [vec![2], vec![9]]);
        assert_eq!(scratch.count.len(), 20);
        assert!(scratch.count.iter().all(|&c| c == 0), "left clean");
        assert!(scratch.touched.is_empty());
    }
}
