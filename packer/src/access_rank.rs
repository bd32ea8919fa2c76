//! How often each node's feature row is read over the sampled batches, and
//! the tiers of DiskGNN's four-level feature store (§4) that this popularity
//! ranks it into: the most popular rows in the GPU cache, the next in the CPU
//! cache, the rest on disk (whose split into disk cache and packed chunks is
//! §5.1's, in `segment_search`).

use crate::plan_error::PlanError;
use rayon::prelude::*;

/// Per-node access counts: how many batches read each node's feature row.
#[derive(Clone)]
pub struct AccessCounts {
    counts: Vec<u32>,
    accessed: u64,
    total: u64,
}

impl AccessCounts {
    /// Counts for nodes `0..num_nodes`, all zero.
    ///
    /// # Panics
    /// If `num_nodes` exceeds `u32::MAX`: node ids are `u32`, and
    /// [`Tiers`] keeps `u32::MAX` to mean "on disk".
    pub fn new(num_nodes: u64) -> Self {
        assert!(
            num_nodes <= u64::from(u32::MAX),
            "{num_nodes} nodes do not fit u32 node ids"
        );
        AccessCounts {
            counts: vec![0; num_nodes as usize],
            accessed: 0,
            total: 0,
        }
    }

    /// Counts given per node (a ranking other than the samples').
    pub fn from_counts(counts: Vec<u32>) -> Self {
        let accessed = counts.iter().filter(|&&c| c > 0).count() as u64;
        let total = counts.iter().map(|&c| u64::from(c)).sum();
        AccessCounts {
            counts,
            accessed,
            total,
        }
    }

    pub fn num_nodes(&self) -> u64 {
        self.counts.len() as u64
    }

    /// Counts many batches at once: the node range is cut into one run per
    /// thread, and each thread counts the ids of every batch that fall in its
    /// run, so no two threads write one counter and each writes a smaller
    /// table. Checks every id first; on one out of range nothing is counted.
    pub fn from_batches(num_nodes: u64, batches: &[&[u32]]) -> Result<Self, PlanError> {
        let mut counts = AccessCounts::new(num_nodes);
        let n = counts.counts.len();
        let out_of_range = batches
            .par_iter()
            .find_map_first(|b| b.iter().copied().find(|&v| v as usize >= n));
        if let Some(v) = out_of_range {
            return Err(PlanError::InvalidArgument(format!(
                "input node {v} is out of range: the graph has {n} nodes"
            )));
        }
        if n > 0 {
            let run = n.div_ceil(rayon::current_num_threads());
            counts
                .counts
                .par_chunks_mut(run)
                .enumerate()
                .for_each(|(i, chunk)| {
                    let first = (i * run) as u32;
                    for &v in batches.iter().flat_map(|b| b.iter()) {
                        // Ids below `first` wrap to large offsets.
                        let offset = v.wrapping_sub(first) as usize;
                        if let Some(c) = chunk.get_mut(offset) {
                            *c = c.saturating_add(1);
                        }
                    }
                });
        }
        counts.accessed = counts.counts.par_iter().filter(|&&c| c > 0).count() as u64;
        counts.total = batches.iter().map(|b| b.len() as u64).sum();
        Ok(counts)
    }

    /// Counts one batch: each of its input nodes once. A batch's input nodes
    /// are unique, so a count is the number of batches that read the row.
    /// Counts saturate at `u32::MAX`. On an id out of range nothing of the
    /// batch is counted.
    pub fn add_batch(&mut self, input_nodes: &[u32]) -> Result<(), PlanError> {
        if let Some(&v) = input_nodes
            .iter()
            .find(|&&v| v as usize >= self.counts.len())
        {
            return Err(PlanError::InvalidArgument(format!(
                "input node {v} is out of range: the graph has {} nodes",
                self.counts.len()
            )));
        }
        for &v in input_nodes {
            let count = &mut self.counts[v as usize];
            if *count == 0 {
                self.accessed += 1;
            }
            *count = count.saturating_add(1);
        }
        self.total += input_nodes.len() as u64;
        Ok(())
    }

    /// How many batches read node `v`'s row (saturated at `u32::MAX`).
    ///
    /// # Panics
    /// If `v` is not below [`num_nodes`](Self::num_nodes).
    pub fn count(&self, v: u32) -> u32 {
        self.counts[v as usize]
    }

    /// Nodes read by at least one batch.
    pub fn accessed(&self) -> u64 {
        self.accessed
    }

    /// Row reads over all batches counted (the sum of the batch sizes).
    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn as_slice(&self) -> &[u32] {
        &self.counts
    }
}

/// Where a node's feature row lives; a cache location carries the row's slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    Gpu(u32),
    Cpu(u32),
    Disk,
}

/// The memory tiers of the four-level feature store (DiskGNN §4): which
/// nodes the GPU and CPU caches hold and where every node is. Each cache
/// numbers its rows in ascending node order, the order the feature file
/// streams them in, so the packer fills the cache blocks front to back.
pub struct Tiers {
    /// Per node: its GPU slot, [`CPU_FLAG`] with its CPU slot, or
    /// [`ON_DISK`]. One `u32` per node keeps `locate` O(1) and the table
    /// 4 bytes a node.
    loc: Vec<u32>,
    gpu: Vec<u32>,
    cpu: Vec<u32>,
}

const ON_DISK: u32 = u32::MAX;
const CPU_FLAG: u32 = 1 << 31;

impl Tiers {
    /// Nodes of the graph the tiers were built for.
    pub fn num_nodes(&self) -> u64 {
        self.loc.len() as u64
    }

    /// Where node `v`'s row lives.
    ///
    /// # Panics
    /// If `v` is not below the node count the tiers were built for.
    pub fn locate(&self, v: u32) -> Location {
        match self.loc[v as usize] {
            ON_DISK => Location::Disk,
            x if x & CPU_FLAG != 0 => Location::Cpu(x & !CPU_FLAG),
            x => Location::Gpu(x),
        }
    }

    /// The GPU cache's nodes, ascending; node `gpu_nodes()[s]` is in slot `s`.
    pub fn gpu_nodes(&self) -> &[u32] {
        &self.gpu
    }

    /// The CPU cache's nodes, ascending; node `cpu_nodes()[s]` is in slot `s`.
    pub fn cpu_nodes(&self) -> &[u32] {
        &self.cpu
    }

    /// The row reads that `counts` makes of each tier: (GPU, CPU, disk).
    pub fn hits(&self, counts: &AccessCounts) -> (u64, u64, u64) {
        let (mut gpu, mut cpu, mut disk) = (0u64, 0u64, 0u64);
        for (v, &c) in counts.counts.iter().enumerate() {
            let c = u64::from(c);
            match self.locate(v as u32) {
                Location::Gpu(_) => gpu += c,
                Location::Cpu(_) => cpu += c,
                Location::Disk => disk += c,
            }
        }
        (gpu, cpu, disk)
    }
}

/// Where the top `k` of a ranking by count (most first, ties by ascending
/// id) ends: every node counted above the returned count is in, and so are
/// the first `take` nodes (by id) counted exactly at it. `histogram[c]` is
/// how many nodes have count `c`.
fn cut(histogram: &[u64], k: u64) -> (u32, u64) {
    let mut above = 0u64;
    for (c, &n) in histogram.iter().enumerate().skip(1).rev() {
        if above + n >= k {
            return (c as u32, k - above);
        }
        above += n;
    }
    // `k` is at most the accessed nodes, so only `k == 0` gets here when
    // nothing is accessed: nothing is taken.
    (u32::MAX, 0)
}

/// Ranks the accessed nodes by count, most first, ties by node id ascending
/// (so the plan is the same on every run), and fills the GPU cache with the
/// first `gpu_bytes / row_bytes` of them and the CPU cache with the next
/// `cpu_bytes / row_bytes` (DiskGNN §4: the most popular rows in the fastest
/// store). Rows no batch reads are never cached: they cost space and save no
/// read. A cache smaller than one row holds none; with `row_bytes == 0`
/// every accessed node fits.
///
/// Counts are small (at most the number of batches), so the ranking is a
/// histogram of counts and one pass over the nodes in id order, not a sort.
/// A cache of 2^31 rows or more is refused (`CPU_FLAG` marks CPU slots).
pub fn assign_tiers(
    counts: AccessCounts,
    row_bytes: u64,
    gpu_bytes: u64,
    cpu_bytes: u64,
) -> Result<Tiers, PlanError> {
    let capacity = |bytes: u64| bytes.checked_div(row_bytes).unwrap_or(u64::MAX);
    let accessed = counts.accessed();
    let num_gpu = capacity(gpu_bytes).min(accessed);
    let num_cpu = capacity(cpu_bytes).min(accessed - num_gpu);
    if num_gpu.max(num_cpu) >= u64::from(CPU_FLAG) {
        return Err(PlanError::InvalidArgument(format!(
            "a cache of {} rows is not supported: a cache holds fewer than 2^31 rows",
            num_gpu.max(num_cpu)
        )));
    }
    // The table of locations takes the counts' place, entry by entry: a
    // count is read once, then overwritten by its node's location, so the
    // plan does not pay for first touching a second per-node table.
    let mut loc = counts.counts;
    let (mut gpu, mut cpu) = (Vec::new(), Vec::new());
    let max = loc.par_iter().copied().max().unwrap_or(0);
    let mut histogram = vec![0u64; max as usize + 1];
    for &c in &loc {
        histogram[c as usize] += 1;
    }
    let (gpu_count, mut gpu_ties) = cut(&histogram, num_gpu);
    let (cached_count, mut cached_ties) = cut(&histogram, num_gpu + num_cpu);
    gpu.reserve_exact(num_gpu as usize);
    cpu.reserve_exact(num_cpu as usize);
    // A node at a cut's count is in while that cut has ties left; a GPU
    // node is cached too, so it takes a tie of both cuts. With both caches
    // empty, each cut is at the top count with no ties: nothing is taken.
    let take = |c: u32, cut_count: u32, ties: &mut u64| {
        c > cut_count
            || (c == cut_count && *ties > 0 && {
                *ties -= 1;
                true
            })
    };
    for (v, l) in loc.iter_mut().enumerate() {
        let c = std::mem::replace(l, ON_DISK);
        if c == 0 {
            continue;
        }
        let in_gpu = take(c, gpu_count, &mut gpu_ties);
        let cached = take(c, cached_count, &mut cached_ties);
        if in_gpu {
            *l = gpu.len() as u32;
            gpu.push(v as u32);
        } else if cached {
            *l = CPU_FLAG | cpu.len() as u32;
            cpu.push(v as u32);
        }
    }
    Ok(Tiers { loc, gpu, cpu })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn counts_of(num_nodes: u64, batches: &[Vec<u32>]) -> AccessCounts {
        let mut counts = AccessCounts::new(num_nodes);
        for batch in batches {
            counts.add_batch(batch).expect("ids in range");
        }
        counts
    }

    #[test]
    fn counts_accessed_and_total() {
        let counts = counts_of(6, &[vec![0, 1, 2], vec![1, 2], vec![1]]);
        let got: Vec<u32> = (0..6).map(|v| counts.count(v)).collect();
        assert_eq!(got, [1, 3, 2, 0, 0, 0]);
        assert_eq!(counts.accessed(), 3);
        assert_eq!(counts.total(), 6);
    }

    #[test]
    fn an_id_out_of_range_is_an_error_and_counts_nothing() {
        let mut counts = AccessCounts::new(4);
        let message = counts
            .add_batch(&[1, 4])
            .expect_err("4 is out of range")
            .to_string();
        assert!(message.contains("input node 4"), "{message}");
        assert_eq!(
            (counts.count(1), counts.accessed(), counts.total()),
            (0, 0, 0)
        );
    }

    #[test]
    fn counting_in_parallel_refuses_an_id_out_of_range() {
        let message = AccessCounts::from_batches(4, &[&[0, 1], &[2, 9, 4]])
            .err()
            .expect("9 is out of range")
            .to_string();
        assert!(message.contains("input node 9"), "{message}");
    }

    #[test]
    fn counts_saturate() {
        let mut counts = AccessCounts::new(2);
        counts.counts[0] = u32::MAX - 1;
        counts.accessed = 1;
        counts.add_batch(&[0]).expect("in range");
        counts.add_batch(&[0]).expect("in range");
        assert_eq!(counts.count(0), u32::MAX);
    }

    #[test]
    fn popular_rows_go_to_the_fastest_cache_ties_by_id() {
        // Counts: node 1 read 5 times, nodes 0 and 2 three times, node 4 once.
        let mut batches = vec![vec![0, 1, 2, 4], vec![0, 1, 2], vec![0, 1, 2]];
        batches.extend([vec![1], vec![1]]);
        let counts = counts_of(5, &batches);
        // 10-byte rows: the GPU holds 2 (25 bytes), the CPU 1 (19 bytes).
        let tiers = assign_tiers(counts.clone(), 10, 25, 19).expect("caches under 2^31 rows");
        assert_eq!(tiers.gpu_nodes(), [0, 1]);
        assert_eq!(tiers.cpu_nodes(), [2]);
        assert_eq!(tiers.locate(0), Location::Gpu(0));
        assert_eq!(tiers.locate(1), Location::Gpu(1));
        assert_eq!(tiers.locate(2), Location::Cpu(0));
        assert_eq!(tiers.locate(3), Location::Disk);
        assert_eq!(tiers.locate(4), Location::Disk);
        assert_eq!(tiers.hits(&counts), (8, 3, 1));
    }

    #[test]
    fn unread_rows_are_never_cached() {
        let counts = counts_of(10, &[vec![3, 7]]);
        let tiers =
            assign_tiers(counts.clone(), 4, 1 << 20, 1 << 20).expect("caches under 2^31 rows");
        assert_eq!(tiers.gpu_nodes(), [3, 7]);
        assert!(tiers.cpu_nodes().is_empty());
        assert_eq!(tiers.locate(0), Location::Disk);
    }

    fn batches() -> impl Strategy<Value = (u64, Vec<Vec<u32>>)> {
        (1u64..120).prop_flat_map(|n| {
            let batch = prop::collection::btree_set(0..n as u32, 0..40)
                .prop_map(|set| set.into_iter().collect::<Vec<u32>>());
            (Just(n), prop::collection::vec(batch, 0..25))
        })
    }

    proptest! {
        #[test]
        fn tiers_rank_by_popularity_within_budget(
            (n, batches) in batches(),
            row_bytes in 1u64..64,
            gpu_bytes in 0u64..2000,
            cpu_bytes in 0u64..2000,
        ) {
            let counts = counts_of(n, &batches);
            let tiers = assign_tiers(counts.clone(), row_bytes, gpu_bytes, cpu_bytes).expect("caches under 2^31 rows");
            let (gpu, cpu) = (tiers.gpu_nodes(), tiers.cpu_nodes());

            // Budgets are respected, and a cache is only short of its
            // capacity when no accessed node is left over.
            prop_assert!(gpu.len() as u64 * row_bytes <= gpu_bytes);
            prop_assert!(cpu.len() as u64 * row_bytes <= cpu_bytes);
            let accessed = counts.accessed();
            prop_assert_eq!(gpu.len() as u64, (gpu_bytes / row_bytes).min(accessed));
            prop_assert_eq!(
                cpu.len() as u64,
                (cpu_bytes / row_bytes).min(accessed - gpu.len() as u64)
            );

            // Slots and nodes are a bijection: every listed node is located
            // at its slot, and nothing else is cached.
            for (s, &v) in gpu.iter().enumerate() {
                prop_assert_eq!(tiers.locate(v), Location::Gpu(s as u32));
            }
            for (s, &v) in cpu.iter().enumerate() {
                prop_assert_eq!(tiers.locate(v), Location::Cpu(s as u32));
            }
            let located = (0..n as u32).filter(|&v| tiers.locate(v) != Location::Disk).count();
            prop_assert_eq!(located, gpu.len() + cpu.len());

            // Popularity order: GPU >= CPU >= disk, cached rows are read.
            let min_gpu = gpu.iter().map(|&v| counts.count(v)).min().unwrap_or(u32::MAX);
            let max_cpu = cpu.iter().map(|&v| counts.count(v)).max().unwrap_or(0);
            let min_cached = min_gpu.min(cpu.iter().map(|&v| counts.count(v)).min().unwrap_or(u32::MAX));
            let max_disk = (0..n as u32)
                .filter(|&v| tiers.locate(v) == Location::Disk)
                .map(|v| counts.count(v))
                .max()
                .unwrap_or(0);
            prop_assert!(min_gpu >= max_cpu);
            prop_assert!(min_cached >= max_disk);
            prop_assert!(min_cached >= 1);

            // The exact tiers: the prefixes of a full sort by (count
            // descending, id), each cache numbered in node order.
            let mut oracle: Vec<u32> = (0..n as u32).filter(|&v| counts.count(v) > 0).collect();
            oracle.sort_by_key(|&v| (std::cmp::Reverse(counts.count(v)), v));
            let mut want_gpu = oracle[..gpu.len()].to_vec();
            let mut want_cpu = oracle[gpu.len()..gpu.len() + cpu.len()].to_vec();
            want_gpu.sort_unstable();
            want_cpu.sort_unstable();
            prop_assert_eq!(gpu, &want_gpu[..]);
            prop_assert_eq!(cpu, &want_cpu[..]);

            // Every read is served by exactly one tier.
            let (g, c, d) = tiers.hits(&counts);
            prop_assert_eq!(g + c + d, counts.total());
            let gpu_reads: u64 = gpu.iter().map(|&v| u64::from(counts.count(v))).sum();
            prop_assert_eq!(g, gpu_reads);
        }

        #[test]
        fn counting_in_parallel_counts_what_one_batch_at_a_time_does((n, batches) in batches()) {
            let one_by_one = counts_of(n, &batches);
            let slices: Vec<&[u32]> = batches.iter().map(Vec::as_slice).collect();
            let at_once = AccessCounts::from_batches(n, &slices).expect("ids in range");
            prop_assert_eq!(at_once.as_slice(), one_by_one.as_slice());
            prop_assert_eq!(at_once.accessed(), one_by_one.accessed());
            prop_assert_eq!(at_once.total(), one_by_one.total());
        }

        #[test]
        fn zero_budgets_cache_nothing((n, batches) in batches(), row_bytes in 1u64..64) {
            let counts = counts_of(n, &batches);
            let tiers = assign_tiers(counts.clone(), row_bytes, 0, row_bytes - 1).expect("caches under 2^31 rows");
            prop_assert!(tiers.gpu_nodes().is_empty() && tiers.cpu_nodes().is_empty());
            prop_assert!((0..n as u32).all(|v| tiers.locate(v) == Location::Disk));
            prop_assert_eq!(tiers.hits(&counts), (0, 0, counts.total()));
        }
    }
}
