//! The order of rows inside a segment's disk cache: MinHash reordering
//! (DiskGNN §5.1, Algorithm 1), which stores rows read by similar sets of the
//! segment's batches next to each other, so that each batch's rows share
//! fewer pages.

use offgnn_manifests::RowOrder;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_pcg::Pcg64Mcg;
use rayon::prelude::*;

/// Rows per parallel task: each task walks every batch's slice of its id
/// range, so a task should hold far more rows than there are batches.
const ROWS_PER_TASK: usize = 1 << 14;

/// Reorders a disk cache's rows (DiskGNN §5.1, Algorithm 1, or the bottom-k
/// variant of [`RowOrder`]).
///
/// `rows` are the disk cache's node ids, ascending and unique; `batches[i]`
/// are the ascending node ids batch `i` of the segment reads, which may
/// include nodes outside `rows` (ignored). Algorithm 1 draws k random
/// permutations H_j of the batch indices (from `seed`; the paper finds 2
/// enough) and gives each row v the signature S_j(v) = min H_j(i) over the
/// batches i that read v; bottom-k draws one permutation H and takes S_j(v)
/// as the j-th least H(i) over those batches (u32::MAX where v has fewer
/// than j). Rows are sorted by (S_1, ..., S_k, a 128-bit hash
/// of v's whole batch set, v): rows with the same signature, which likely
/// share batches, sit together, and rows with identical batch sets are
/// contiguous (barring a collision of the 128-bit hash). With at least one hash function, rows no batch reads
/// have the largest signature and come last. The same inputs and seed give
/// the same order.
///
/// Cost: about O(entries + rows log rows): each range of rows walks every
/// batch's slice of that range with a galloping search, in parallel over
/// ranges, then one parallel sort. Input that is not sorted still yields a permutation of
/// `rows`, only a worse order.
pub fn minhash_order(rows: &[u32], batches: &[&[u32]], order: RowOrder, seed: u64) -> Vec<u32> {
    // k signature values a row; `perms` permutations of the batches.
    let (k, perms, bottom) = match order {
        RowOrder::MinHash { functions } => (functions, functions, false),
        RowOrder::BottomK { k } => (k, usize::from(k > 0), true),
    };
    // Signatures are stored `stride` to a row; at least 1 so that the
    // parallel chunks below line up with the rows even when k is 0.
    let stride = k.max(1);
    // H_j(i) is stored at [i * perms + j]: a batch's values side by side.
    let mut rng = Pcg64Mcg::seed_from_u64(seed);
    let mut hashes = vec![0u32; batches.len() * perms];
    for j in 0..perms {
        let mut permutation: Vec<u32> = (0..batches.len())
            .map(|i| u32::try_from(i).expect("a segment holds fewer than 2^32 batches"))
            .collect();
        permutation.shuffle(&mut rng);
        for (i, h) in permutation.into_iter().enumerate() {
            hashes[i * perms + j] = h;
        }
    }
    // Two independent 64-bit hashes of each batch index; a row's set hash
    // is their wrapping sum over its batches, which ignores order.
    let batch_hash: Vec<(u64, u64)> = (0..batches.len() as u64)
        .map(|i| {
            (
                splitmix64(i ^ 0x5EED_0001),
                splitmix64(i ^ 0xA5A5_0002_0000_0000),
            )
        })
        .collect();

    let mut signature = vec![u32::MAX; rows.len() * stride];
    let mut set_hash = vec![(0u64, 0u64); rows.len()];
    rows.par_chunks(ROWS_PER_TASK)
        .zip(signature.par_chunks_mut(ROWS_PER_TASK * stride))
        .zip(set_hash.par_chunks_mut(ROWS_PER_TASK))
        .for_each(|((rows, signature), set_hash)| {
            let (first, last) = (rows[0], rows[rows.len() - 1]);
            for (i, batch) in batches.iter().enumerate() {
                // Algorithm 1, lines 7-11, for the batch's nodes in this range.
                let lo = batch.partition_point(|&v| v < first);
                let hi = batch.partition_point(|&v| v <= last).max(lo);
                let mut at = 0;
                for &v in &batch[lo..hi] {
                    at = gallop(rows, at, v);
                    if rows.get(at) != Some(&v) {
                        continue;
                    }
                    let signature = &mut signature[at * stride..at * stride + k];
                    if bottom && k > 0 {
                        // Keep the k least values, ascending: the new one
                        // bubbles in, the largest falls off the end.
                        let mut h = hashes[i];
                        for s in signature.iter_mut() {
                            if h < *s {
                                std::mem::swap(&mut h, s);
                            }
                        }
                    } else {
                        for (s, &h) in signature.iter_mut().zip(&hashes[i * perms..]) {
                            *s = (*s).min(h);
                        }
                    }
                    let (a, b) = batch_hash[i];
                    set_hash[at] = (
                        set_hash[at].0.wrapping_add(a),
                        set_hash[at].1.wrapping_add(b),
                    );
                }
            }
        });

    // Algorithm 1, line 12: argsort by signature (and the tie-breaks). The
    // first two signatures, packed in one u64, and the tie-breaks sit in
    // the sort records themselves; further signatures (k > 2) are looked up
    // only when the first two tie.
    let mut order: Vec<SortRecord> = (0..rows.len())
        .into_par_iter()
        .map(|p| {
            let signature = &signature[p * stride..p * stride + k];
            let s = |j: usize| signature.get(j).map_or(0, |&s| u64::from(s));
            SortRecord {
                first_two: (s(0) << 32) | s(1),
                set_hash: set_hash[p],
                row: rows[p],
                position: p,
            }
        })
        .collect();
    order.par_sort_unstable_by(|a, b| {
        a.first_two
            .cmp(&b.first_two)
            .then_with(|| {
                let (pa, pb) = (a.position * stride, b.position * stride);
                signature[pa + 2.min(k)..pa + k].cmp(&signature[pb + 2.min(k)..pb + k])
            })
            .then(a.set_hash.cmp(&b.set_hash))
            .then(a.row.cmp(&b.row))
    });
    order.into_iter().map(|r| r.row).collect()
}

/// Candidates a page's next row is chosen from: the next rows of the
/// sorted order not placed yet. A wider window finds rows that share more
/// batches with the page, at a planning cost that grows with it.
const FILL_WINDOW: usize = 64;

/// Fills a disk cache's pages greedily from its sorted order (`order`, from
/// [`minhash_order`]): each page starts with the first row not placed yet,
/// then takes, one at a time, the row among the next [`FILL_WINDOW`]
/// unplaced ones that adds the fewest batches to the set of batches that
/// must read the page (the earliest on a tie). The sort puts rows of like
/// batch sets near each other; the fill then packs a page with the rows
/// that share the most, which the sort alone cannot see past its keys. The
/// filled order is kept only where its pages are read fewer times in all
/// than the sorted order's.
///
/// `phase` rows of the first page are taken already (the rows start
/// `phase` slots into a page). Applied where whole rows fill a page exactly
/// (`row_bytes` divides 4096); elsewhere rows straddle pages and the order
/// is returned as is. `batches[i]` are the ascending node ids batch `i`
/// reads. Deterministic. On SIGINT or SIGTERM it stops filling and returns
/// the sorted order, for the packer to stop at its next check.
pub fn fill_pages(order: Vec<u32>, batches: &[&[u32]], row_bytes: u64, phase: usize) -> Vec<u32> {
    let page = crate::disk_pages::PAGE_BYTES;
    if order.len() < 2 || row_bytes == 0 || row_bytes >= page || !page.is_multiple_of(row_bytes) {
        return order;
    }
    let pages = Pages {
        per_page: (page / row_bytes) as usize,
        phase,
    };
    let sets = BatchSets::of(&order, batches);
    let Some(filled) = greedy_fill(&sets, pages, batches.len()) else {
        return order;
    };
    let sorted: Vec<usize> = (0..order.len()).collect();
    if pages.reads(&filled, &sets) < pages.reads(&sorted, &sets) {
        filled.into_iter().map(|p| order[p]).collect()
    } else {
        order
    }
}

/// Each row's batches, by the row's position in the sorted order (CSR,
/// batches ascending).
struct BatchSets {
    start: Vec<usize>,
    sets: Vec<u32>,
}

impl BatchSets {
    fn of(order: &[u32], batches: &[&[u32]]) -> Self {
        let n = order.len();
        let mut by_node: Vec<(u32, u32)> = order
            .iter()
            .enumerate()
            .map(|(p, &v)| (v, p as u32))
            .collect();
        by_node.sort_unstable();
        let nodes: Vec<u32> = by_node.iter().map(|&(v, _)| v).collect();
        let hits: Vec<Vec<u32>> = batches
            .par_iter()
            .map(|batch| {
                let mut at = 0;
                let mut out = Vec::new();
                for &v in batch.iter() {
                    at = gallop(&nodes, at, v);
                    if nodes.get(at) == Some(&v) {
                        out.push(by_node[at].1);
                    }
                }
                out
            })
            .collect();
        let mut start = vec![0usize; n + 1];
        for &p in hits.iter().flatten() {
            start[p as usize + 1] += 1;
        }
        for i in 0..n {
            start[i + 1] += start[i];
        }
        let mut fill = start.clone();
        let mut sets = vec![0u32; start[n]];
        for (i, batch) in hits.iter().enumerate() {
            for &p in batch {
                sets[fill[p as usize]] = i as u32;
                fill[p as usize] += 1;
            }
        }
        BatchSets { start, sets }
    }

    /// Rows in all.
    fn len(&self) -> usize {
        self.start.len() - 1
    }

    /// The batches reading the row at position `p`.
    fn set(&self, p: usize) -> &[u32] {
        &self.sets[self.start[p]..self.start[p + 1]]
    }
}

/// How rows fill pages: `per_page` rows a page, the first page with
/// `phase` slots taken already.
#[derive(Clone, Copy)]
struct Pages {
    per_page: usize,
    phase: usize,
}

impl Pages {
    /// Slots free on the first page.
    fn first_slots(self) -> usize {
        self.per_page - self.phase % self.per_page
    }

    /// The ranges of `len` rows laid out in order that fill each page.
    fn ranges(self, len: usize) -> Vec<std::ops::Range<usize>> {
        let first = self.first_slots().min(len);
        std::iter::once(0..first)
            .chain(
                (first..len)
                    .step_by(self.per_page)
                    .map(|a| a..(a + self.per_page).min(len)),
            )
            .filter(|r| !r.is_empty())
            .collect()
    }

    /// The batches reading each page, summed: the pages the batches read,
    /// with the rows at `positions` laid out in that order.
    fn reads(self, positions: &[usize], sets: &BatchSets) -> usize {
        let mut union: Vec<u32> = Vec::new();
        self.ranges(positions.len())
            .into_iter()
            .map(|r| {
                union.clear();
                for &p in &positions[r] {
                    union.extend_from_slice(sets.set(p));
                }
                union.sort_unstable();
                union.dedup();
                union.len()
            })
            .sum()
    }
}

/// The page's batches as a bitset over the segment's batches.
struct PageBatches(Vec<u64>);

impl PageBatches {
    /// A row's cost: its batches not in the page's set.
    fn added(&self, s: &[u32]) -> usize {
        s.iter()
            .filter(|&&b| self.0[b as usize / 64] & (1 << (b % 64)) == 0)
            .count()
    }

    fn insert(&mut self, s: &[u32]) {
        for &b in s {
            self.0[b as usize / 64] |= 1 << (b % 64);
        }
    }
}

/// The greedy fill of [`fill_pages`]: positions in the sorted order, page
/// by page. `None` when SIGINT or SIGTERM came while filling.
fn greedy_fill(sets: &BatchSets, pages: Pages, num_batches: usize) -> Option<Vec<usize>> {
    let n = sets.len();
    let mut placed = vec![false; n];
    let mut out: Vec<usize> = Vec::with_capacity(n);
    let mut first = 0;
    let mut union = PageBatches(vec![0u64; num_batches.div_ceil(64)]);
    let mut candidates: Vec<usize> = Vec::with_capacity(FILL_WINDOW);
    let mut slots = pages.first_slots();
    let mut pages_filled = 0u64;
    while out.len() < n {
        pages_filled += 1;
        if pages_filled.is_multiple_of(1024) && offgnn_shared::signals::received().is_some() {
            return None;
        }
        while placed[first] {
            first += 1;
        }
        placed[first] = true;
        out.push(first);
        union.0.fill(0);
        union.insert(sets.set(first));
        for _ in 1..slots {
            candidates.clear();
            candidates.extend((first + 1..n).filter(|&p| !placed[p]).take(FILL_WINDOW));
            let Some(&best) = candidates.iter().min_by_key(|&&p| union.added(sets.set(p))) else {
                break;
            };
            placed[best] = true;
            out.push(best);
            union.insert(sets.set(best));
        }
        slots = pages.per_page;
    }
    Some(out)
}

struct SortRecord {
    first_two: u64,
    set_hash: (u64, u64),
    row: u32,
    position: usize,
}

/// The first index at or after `from` whose row is not below `v`, for
/// ascending `rows` and `rows[..from]` all below `v`: doubling steps, then a
/// binary search, so a walk over a sorted batch costs O(batch log(gap)).
fn gallop(rows: &[u32], from: usize, v: u32) -> usize {
    // rows[..lo] < v; the answer is in lo..=hi.
    let (mut lo, mut hi, mut step) = (from, from, 1);
    while hi < rows.len() && rows[hi] < v {
        lo = hi + 1;
        hi = lo.saturating_add(step);
        step = step.saturating_mul(2);
    }
    let hi = hi.min(rows.len());
    lo + rows[lo..hi].partition_point(|&r| r < v)
}

/// splitmix64's finalizer: spreads nearby integers over all 64 bits.
fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk_pages::pages_of_rows;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet, HashMap};

    fn order(rows: &[u32], batches: &[Vec<u32>], k: usize, seed: u64) -> Vec<u32> {
        ordered(rows, batches, RowOrder::MinHash { functions: k }, seed)
    }

    fn ordered(rows: &[u32], batches: &[Vec<u32>], o: RowOrder, seed: u64) -> Vec<u32> {
        let slices: Vec<&[u32]> = batches.iter().map(Vec::as_slice).collect();
        minhash_order(rows, &slices, o, seed)
    }

    #[test]
    fn bottom_k_reads_fewer_pages_than_algorithm_1_on_random_batches() {
        // 60 batches each reading a random 4% of 20000 nodes (a near-uniform
        // graph's segment); the disk cache holds the rows read twice or more.
        let mut rng = Pcg64Mcg::seed_from_u64(5);
        let batches: Vec<Vec<u32>> = (0..60)
            .map(|_| {
                let mut b: Vec<u32> = (0..20000)
                    .filter(|_| rand::Rng::random_bool(&mut rng, 0.04))
                    .collect();
                b.sort_unstable();
                b
            })
            .collect();
        let mut reads = vec![0u8; 20000];
        for b in &batches {
            for &v in b {
                reads[v as usize] += 1;
            }
        }
        let rows: Vec<u32> = (0..20000).filter(|&v| reads[v as usize] >= 2).collect();
        let only_cached: Vec<Vec<u32>> = batches
            .iter()
            .map(|b| {
                b.iter()
                    .copied()
                    .filter(|&v| reads[v as usize] >= 2)
                    .collect()
            })
            .collect();
        let pages = |o: RowOrder| pages_read(&ordered(&rows, &batches, o, 9), &only_cached, 512);
        let (alg1, bottom) = (
            pages(RowOrder::MinHash { functions: 2 }),
            pages(RowOrder::DEFAULT),
        );
        eprintln!("pages read: Algorithm 1 {alg1}, bottom-4 {bottom}");
        // 18391 against 20278 pages when written.
        assert!(
            bottom * 20 < alg1 * 19,
            "bottom-4 {bottom} pages, Algorithm 1 {alg1}"
        );
    }

    /// The pages of the disk cache, in `layout` order, that each batch reads.
    fn pages_read(layout: &[u32], batches: &[Vec<u32>], row_bytes: u64) -> usize {
        let position: HashMap<u32, u64> = layout
            .iter()
            .enumerate()
            .map(|(p, &v)| (v, p as u64))
            .collect();
        batches
            .iter()
            .map(|b| {
                let positions: Vec<u64> =
                    b.iter().filter_map(|v| position.get(v).copied()).collect();
                pages_of_rows(&positions, row_bytes).len()
            })
            .sum()
    }

    #[test]
    fn reordering_puts_each_batch_on_fewer_pages() {
        // DiskGNN Figure 4 at page scale: two batches read alternate rows,
        // 8 rows to a page. In id order each batch touches all 8 pages; after
        // reordering each touches 4.
        let rows: Vec<u32> = (0..64).collect();
        let batches = vec![
            (0..64).step_by(2).collect::<Vec<u32>>(),
            (1..64).step_by(2).collect::<Vec<u32>>(),
        ];
        let reordered = order(&rows, &batches, 2, 7);
        assert_eq!(pages_read(&rows, &batches, 512), 16);
        assert_eq!(pages_read(&reordered, &batches, 512), 8);
    }

    #[test]
    fn similar_rows_are_grouped_across_many_batches() {
        // 4 groups of 256 rows, group g read by batches {g, g + 4, g + 8},
        // rows interleaved by id. A batch reads one group: 64 pages of 4
        // rows in id order, 64 pages once its group is contiguous.
        let rows: Vec<u32> = (0..1024).collect();
        let batches: Vec<Vec<u32>> = (0..12)
            .map(|i| (i % 4..1024).step_by(4).collect())
            .collect();
        let before = pages_read(&rows, &batches, 1024);
        let after = pages_read(&order(&rows, &batches, 2, 1), &batches, 1024);
        assert_eq!(before, 12 * 256);
        assert_eq!(after, 12 * 64);
    }

    #[test]
    fn nodes_outside_the_cache_are_ignored_and_the_seed_decides() {
        let rows = [2, 5, 9, 11, 40];
        let batches = vec![vec![2, 9, 40], vec![5, 11], vec![9, 11, 40]];
        let with_extra = vec![
            vec![0, 2, 3, 9, 40, 41],
            vec![1, 5, 11, 12],
            vec![9, 11, 40, 99],
        ];
        let a = order(&rows, &batches, 2, 42);
        assert_eq!(a, order(&rows, &with_extra, 2, 42));
        assert_eq!(a, order(&rows, &batches, 2, 42));
        assert!(order(&[], &batches, 2, 1).is_empty());
        // No batches: every row has the same (empty) set, so id order.
        assert_eq!(order(&rows, &[], 2, 1), rows);
        // No hash functions: only the set hash groups rows (a case proptest
        // found: rows read by no batch must still come together).
        let grouped = order(&[26, 27, 207], &[vec![27]], 0, 0);
        assert!(
            grouped == [26, 207, 27] || grouped == [27, 26, 207],
            "{grouped:?}"
        );
    }

    #[test]
    fn filling_pages_groups_rows_the_sort_interleaved() {
        // 16 rows of 512 bytes, two pages. Rows 0..16 alternate between
        // batch sets {0, 1} and {2, 3}: as ordered, each page holds both
        // sets and all four batches read both pages (8 page reads); filled,
        // each page holds one set (4 page reads).
        let rows: Vec<u32> = (0..16).collect();
        let even: Vec<u32> = (0..16).step_by(2).collect();
        let odd: Vec<u32> = (1..16).step_by(2).collect();
        let batches = vec![even.clone(), even, odd.clone(), odd];
        let lists: Vec<&[u32]> = batches.iter().map(Vec::as_slice).collect();
        assert_eq!(pages_read(&rows, &batches, 512), 8);
        let filled = fill_pages(rows.clone(), &lists, 512, 0);
        assert_eq!(pages_read(&filled, &batches, 512), 4);
        // Rows that straddle pages are left in order.
        assert_eq!(fill_pages(rows.clone(), &lists, 500, 0), rows);
        // Three slots of the first page are taken: it holds five rows.
        let shifted = fill_pages(rows, &lists, 512, 3);
        let first: Vec<u32> = shifted[..5].to_vec();
        assert!(first.iter().all(|v| v % 2 == first[0] % 2), "{shifted:?}");
    }

    #[test]
    fn gallop_finds_the_lower_bound() {
        let rows: Vec<u32> = (0..100).map(|x| x * 3).collect();
        for from in [0, 5, 50] {
            for v in 0..320 {
                let want = rows.partition_point(|&r| r < v).max(from);
                if rows[..from].iter().all(|&r| r < v) {
                    assert_eq!(gallop(&rows, from, v), want, "from {from} v {v}");
                }
            }
        }
    }

    fn segment() -> impl Strategy<Value = (Vec<u32>, Vec<Vec<u32>>)> {
        let ids = || {
            prop::collection::btree_set(0u32..300, 0..60)
                .prop_map(|s| s.into_iter().collect::<Vec<u32>>())
        };
        (ids(), prop::collection::vec(ids(), 0..12))
    }

    proptest! {
        #[test]
        fn filling_pages_permutes_rows_and_never_reads_more(
            (rows, batches) in segment(),
            phase in 0usize..8,
        ) {
            let lists: Vec<&[u32]> = batches.iter().map(Vec::as_slice).collect();
            let order = minhash_order(&rows, &lists, RowOrder::DEFAULT, 7);
            let filled = fill_pages(order.clone(), &lists, 512, 0);
            let mut sorted = filled.clone();
            sorted.sort_unstable();
            prop_assert_eq!(&sorted, &rows);
            prop_assert!(pages_read(&filled, &batches, 512) <= pages_read(&order, &batches, 512));
            let shifted = fill_pages(order, &lists, 512, phase);
            let mut sorted = shifted;
            sorted.sort_unstable();
            prop_assert_eq!(sorted, rows);
        }

        #[test]
        fn the_order_permutes_rows_and_keeps_equal_batch_sets_together(
            (rows, batches) in segment(),
            k in 0usize..4,
            seed: u64,
            bottom: bool,
        ) {
            let o = if bottom { RowOrder::BottomK { k } } else { RowOrder::MinHash { functions: k } };
            let out = ordered(&rows, &batches, o, seed);
            let mut sorted = out.clone();
            sorted.sort_unstable();
            prop_assert_eq!(&sorted, &rows);
            prop_assert_eq!(&out, &ordered(&rows, &batches, o, seed));

            // Each batch set's rows occupy one contiguous range of positions.
            let set_of = |v: u32| -> BTreeSet<usize> {
                batches.iter().enumerate().filter(|(_, b)| b.binary_search(&v).is_ok()).map(|(i, _)| i).collect()
            };
            let mut spans: BTreeMap<BTreeSet<usize>, (usize, usize, usize)> = BTreeMap::new();
            for (p, &v) in out.iter().enumerate() {
                let span = spans.entry(set_of(v)).or_insert((p, p, 0));
                span.1 = p;
                span.2 += 1;
            }
            for (set, (first, last, count)) in spans {
                prop_assert_eq!(last - first + 1, count, "rows of batches {:?} are split", set);
            }
        }
    }
}
