//! The segment size of the segmented disk cache: the approximate search
//! under the disk budget (DiskGNN §5.1, Algorithm 2), the exact bytes a
//! given segment size lays out, to check the estimate against, and the
//! choice of the layout's size from the two ([`choose_segment_size`]).
//!
//! All three take the training batches in training order, each as the sorted,
//! unique list of its cold input nodes: those the GPU and CPU caches do not
//! hold (`access_rank::Location::Disk`).

use offgnn_shared::address_table;

use crate::disk_pages::round_up_to_page;
use crate::error::Error;
use crate::plan_error::PlanError;

/// What the search chose, and the counts the choice came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SearchResult {
    /// Batches per segment: the first prefix length whose estimate fits.
    pub segment_size: usize,
    /// The estimate for `segment_size`: the distinct cold rows of the first
    /// `segment_size` batches, times the number of segments, times the row
    /// size.
    pub estimated_bytes: u64,
    /// Distinct cold nodes of the first `segment_size` batches
    /// (Algorithm 2's |V_d| + |V_p|).
    pub distinct_in_prefix: u64,
    /// Cold nodes read by at least two of the first `segment_size` batches
    /// (Algorithm 2's |V_d|, the disk-cache entries m it returns).
    pub shared_in_prefix: u64,
    /// The least any layout can take: every distinct cold row of all the
    /// batches once.
    pub minimum_bytes: u64,
}

/// DiskGNN §5.1, Algorithm 2: grows a prefix of the batches, i = 1, 2, ...,
/// and estimates the disk bytes of segments of i batches as the prefix's
/// distinct cold rows times ceil(n / i) segments times `row_bytes` (the
/// first segment stands for every segment, so each batch is read once);
/// returns the first i whose estimate is within `budget`.
///
/// The estimate is not monotone in i, and can fit for a small i while the
/// later batches alone need more than the budget. The pass therefore goes on
/// over all `num_batches` batches (only `num_batches` are read) to count the
/// distinct cold rows of all of them: if even storing each once exceeds the
/// budget, no segment size can fit and the answer is
/// [`PlanError::BudgetTooSmall`]. So the result is `Ok` exactly when that
/// minimum is within the budget (at i = n the estimate is the minimum).
pub fn search_segment_size<'a>(
    batches: impl IntoIterator<Item = &'a [u32]>,
    num_batches: usize,
    num_nodes: u64,
    row_bytes: u64,
    budget: u64,
) -> Result<SearchResult, PlanError> {
    if num_batches == 0 {
        return Err(PlanError::InvalidArgument(
            "there are no batches to plan a disk layout for".to_string(),
        ));
    }
    // Algorithm 2's count[v], kept as two bits: read once, read twice or more.
    let mut read_once = NodeSet::new(num_nodes);
    let mut read_twice = NodeSet::new(num_nodes);
    let (mut distinct, mut shared) = (0u64, 0u64);
    let mut found = None;
    let mut read = 0usize;
    for batch in batches.into_iter().take(num_batches) {
        check_batch(read, batch, num_nodes)?;
        for &v in batch {
            if read_once.insert(v) {
                distinct += 1;
            } else if found.is_none() && read_twice.insert(v) {
                shared += 1;
            }
        }
        read += 1;
        if found.is_none() {
            let segments = num_batches.div_ceil(read) as u64;
            let estimated_bytes = bytes_of(distinct, segments, row_bytes);
            if estimated_bytes <= budget {
                found = Some((read, estimated_bytes, distinct, shared));
            }
        }
    }
    if read < num_batches {
        return Err(PlanError::InvalidArgument(format!(
            "the batch list ended after {read} of {num_batches} batches"
        )));
    }
    let minimum_bytes = bytes_of(distinct, 1, row_bytes);
    if minimum_bytes > budget {
        return Err(PlanError::BudgetTooSmall {
            budget,
            minimum: minimum_bytes,
        });
    }
    let (segment_size, estimated_bytes, distinct_in_prefix, shared_in_prefix) =
        found.expect("at i = n the estimate is the minimum, which is within the budget");
    Ok(SearchResult {
        segment_size,
        estimated_bytes,
        distinct_in_prefix,
        shared_in_prefix,
        minimum_bytes,
    })
}

/// The disk bytes the layout takes with `segment_size` batches per segment
/// (the last segment may be shorter), as the packer lays it out (DiskGNN
/// §4 and §5.1):
///
/// - within a segment, a cold row read by two or more of the segment's
///   batches goes to the segment's disk cache, once;
/// - a cold row read by exactly one batch of the segment goes to that
///   batch's packed chunk;
/// - a disk cache takes its rows times `row_bytes`, rounded up to a 4 KiB
///   page, and so does each packed chunk; an empty one takes nothing.
///
/// The total is the sum over segments of the disk cache's bytes and the
/// bytes of the packed chunks of the segment's batches (saturating at
/// `u64::MAX`). With `segment_size` 1 there is no disk cache and each batch
/// packs all its cold rows; with a segment of all batches the rows number
/// the distinct cold rows exactly, so the bytes exceed the minimum only by
/// the rounding of each chunk and of the cache.
pub fn exact_layout_bytes<'a>(
    batches: impl IntoIterator<Item = &'a [u32]>,
    segment_size: usize,
    num_nodes: u64,
    row_bytes: u64,
) -> Result<u64, PlanError> {
    if segment_size == 0 {
        return Err(PlanError::InvalidArgument(
            "the segment size must be at least 1 batch".to_string(),
        ));
    }
    let mut reads = vec![0u8; node_count(num_nodes)];
    // Not `with_capacity(segment_size)`: a segment size above the batch
    // count is valid (one segment of all batches) and may be huge.
    let mut segment: Vec<&[u32]> = Vec::new();
    let mut total = 0u64;
    for (index, batch) in batches.into_iter().enumerate() {
        check_batch(index, batch, num_nodes)?;
        segment.push(batch);
        if segment.len() == segment_size {
            total = total.saturating_add(segment_bytes(&segment, &mut reads, row_bytes));
            segment.clear();
        }
    }
    if !segment.is_empty() {
        total = total.saturating_add(segment_bytes(&segment, &mut reads, row_bytes));
    }
    Ok(total)
}

/// How the segment size is chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentSize {
    /// One segment of every training batch (the global disk cache).
    OneSegment,
    /// The user's `--segment-size`.
    Given(usize),
    /// Algorithm 2's search, then the exact bytes fitted to the budget.
    Search,
}

/// What the disk budget holds besides the training segments: the
/// evaluation segments, the GPU and CPU caches, and the address tables'
/// records with the evaluation segments' table footers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedBytes {
    pub eval: u64,
    pub caches: u64,
    pub tables: u64,
}

/// The segment size chosen, and how it was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentChoice {
    pub segment_size: usize,
    /// Searched under the budget (no size was given).
    pub searched: bool,
    /// Algorithm 2's segment size and its estimate of the training
    /// segments' bytes (searched runs), beside the exact outcome.
    pub algorithm2_segment_size: Option<usize>,
    pub estimated_bytes: Option<u64>,
    /// Exact bytes of the training segments at `segment_size`, their
    /// tables' footers included.
    pub train_bytes: u64,
}

/// Chooses the training segments' size (DiskGNN §5.1) so that the whole
/// layout fits `budget`, which holds the `fixed` bytes first. `train` are
/// the `num_batches` training batches' cold lists, in training order.
/// Whichever way the size was chosen, the layout must fit the budget.
pub fn choose_segment_size<'a, I>(
    how: SegmentSize,
    train: I,
    num_batches: usize,
    num_nodes: u64,
    row_bytes: u64,
    budget: u64,
    fixed: FixedBytes,
) -> Result<SegmentChoice, Error>
where
    I: Iterator<Item = &'a [u32]> + Clone,
{
    let segments = TrainSegments {
        train,
        num_batches,
        num_nodes,
        row_bytes,
        budget,
        fixed,
    };
    let (segment_size, searched, estimated_bytes, algorithm2_segment_size) = match how {
        SegmentSize::OneSegment => (num_batches.max(1), false, None, None),
        SegmentSize::Given(0) => {
            return Err(Error::InvalidArgument(
                "--segment-size must be at least 1".into(),
            ));
        }
        SegmentSize::Given(s) => (s, false, None, None),
        SegmentSize::Search => {
            let (size, found) = segments.search()?;
            (
                size,
                true,
                Some(found.estimated_bytes),
                Some(found.segment_size),
            )
        }
    };
    let train_budget = segments.train_budget();
    let train_bytes = segments.exact(segment_size)?;
    if train_bytes > train_budget {
        return Err(match how {
            SegmentSize::Given(s) => Error::InvalidArgument(format!(
                "--segment-size {s} lays out {} bytes of training segments, beyond the {} left of --disk-budget after caches, evaluation segments and address tables; raise the budget or drop --segment-size to search one",
                train_bytes, train_budget
            )),
            _ => segments.too_small(train_bytes).into(),
        });
    }
    Ok(SegmentChoice {
        segment_size,
        searched,
        algorithm2_segment_size,
        estimated_bytes,
        train_bytes,
    })
}

/// The training segments of a layout under a disk budget, at any size.
struct TrainSegments<I> {
    train: I,
    num_batches: usize,
    num_nodes: u64,
    row_bytes: u64,
    budget: u64,
    fixed: FixedBytes,
}

impl<'a, I> TrainSegments<I>
where
    I: Iterator<Item = &'a [u32]> + Clone,
{
    /// What the budget leaves the training segments.
    fn train_budget(&self) -> u64 {
        let FixedBytes {
            eval,
            caches,
            tables,
        } = self.fixed;
        self.budget.saturating_sub(eval + caches + tables)
    }

    /// The exact bytes the training segments take at segment size `s`
    /// (their feature rows and their tables' footers): one pass over the
    /// cold lists, cheap beside the packing itself.
    fn exact(&self, s: usize) -> Result<u64, PlanError> {
        exact_layout_bytes(self.train.clone(), s, self.num_nodes, self.row_bytes)
            .map(|b| b + address_table::FOOTER * self.num_batches.div_ceil(s) as u64)
    }

    /// The error for a layout whose training segments take `train` bytes.
    fn too_small(&self, train: u64) -> PlanError {
        let FixedBytes {
            eval,
            caches,
            tables,
        } = self.fixed;
        PlanError::LayoutTooSmall {
            budget: self.budget,
            minimum: train + eval + caches + tables,
            train,
            eval,
            caches,
            tables,
        }
    }

    /// Algorithm 2's size, made exact: the smallest size whose exact bytes
    /// fit, and the search's result it started from.
    fn search(&self) -> Result<(usize, SearchResult), Error> {
        let train_budget = self.train_budget();
        let n = self.num_batches;
        let found = search_segment_size(
            self.train.clone(),
            n,
            self.num_nodes,
            self.row_bytes,
            train_budget,
        )
        .map_err(|e| match e {
            // Algorithm 2's minimum counts rows, not the pages each chunk
            // rounds up to: state the least layout, one segment of every
            // batch, which fits.
            PlanError::BudgetTooSmall { .. } => match self.exact(n.max(1)) {
                Ok(least) => self.too_small(least),
                Err(e) => e,
            },
            other => other,
        })?;
        // Algorithm 2 extrapolates from the first segment, so the real
        // layout can come out larger or smaller than its estimate. Grow the
        // segment until the exact bytes fit (the budget is a promise, not a
        // hope), then shrink it to the smallest size that still fits:
        // smaller segments share fewer rows per disk cache and read less
        // they do not need.
        let mut s = found.segment_size;
        while s < n && self.exact(s)? > train_budget {
            s = (s + s.div_ceil(4)).min(n);
        }
        if self.exact(s)? > train_budget {
            return Err(self.too_small(self.exact(n)?).into());
        }
        // The bytes fall as segments grow, nearly monotonically; the
        // bisection keeps `exact(hi) <= budget` whatever they do.
        let (mut lo, mut hi) = (1, s);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.exact(mid)? <= train_budget {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        Ok((hi, found))
    }
}

/// One segment's disk cache and packed chunks; `reads` is all zero on entry
/// and on return.
fn segment_bytes(segment: &[&[u32]], reads: &mut [u8], row_bytes: u64) -> u64 {
    // 0: unread, 1: read by one batch, 2: by several, 3: several, counted.
    for &v in segment.iter().flat_map(|b| b.iter()) {
        let r = &mut reads[v as usize];
        *r = (*r + 1).min(2);
    }
    let mut bytes = 0u64;
    let mut cache_rows = 0u64;
    for batch in segment {
        let mut chunk_rows = 0u64;
        for &v in *batch {
            match reads[v as usize] {
                1 => chunk_rows += 1,
                2 => {
                    cache_rows += 1;
                    reads[v as usize] = 3;
                }
                _ => {}
            }
        }
        bytes = bytes.saturating_add(round_up_to_page(bytes_of(chunk_rows, 1, row_bytes)));
    }
    for &v in segment.iter().flat_map(|b| b.iter()) {
        reads[v as usize] = 0;
    }
    bytes.saturating_add(round_up_to_page(bytes_of(cache_rows, 1, row_bytes)))
}

/// rows * segments * row_bytes, saturating at the last page boundary
/// below `u64::MAX` (so that rounding it up to a page stays exact).
fn bytes_of(rows: u64, segments: u64, row_bytes: u64) -> u64 {
    let bytes = u128::from(rows) * u128::from(segments) * u128::from(row_bytes);
    const MAX: u64 = u64::MAX - (u64::MAX % crate::disk_pages::PAGE_BYTES);
    u64::try_from(bytes).map_or(MAX, |b| b.min(MAX))
}

/// A batch's cold list must be strictly ascending (sorted, unique) with ids
/// below `num_nodes`: the counting above relies on both. A signal stops
/// the search here, batch by batch.
fn check_batch(index: usize, batch: &[u32], num_nodes: u64) -> Result<(), PlanError> {
    offgnn_shared::signals::check()?;
    if let Some(w) = batch.windows(2).find(|w| w[0] >= w[1]) {
        return Err(PlanError::InvalidArgument(format!(
            "batch {index}: cold nodes must be sorted and unique, but {} comes before {}",
            w[0], w[1]
        )));
    }
    match batch.last() {
        Some(&v) if u64::from(v) >= num_nodes => Err(PlanError::InvalidArgument(format!(
            "batch {index}: cold node {v} is out of range: the graph has {num_nodes} nodes"
        ))),
        _ => Ok(()),
    }
}

fn node_count(num_nodes: u64) -> usize {
    // Ids are u32, so more nodes than 2^32 are never addressed.
    num_nodes.min(1 << 32) as usize
}

/// A bitmap over node ids: an eighth of a byte a node.
struct NodeSet {
    words: Vec<u64>,
}

impl NodeSet {
    fn new(num_nodes: u64) -> Self {
        NodeSet {
            words: vec![0; node_count(num_nodes).div_ceil(64)],
        }
    }

    /// Adds `v`; true when it was not there.
    fn insert(&mut self, v: u32) -> bool {
        let (word, bit) = (v as usize / 64, 1u64 << (v % 64));
        let was = self.words[word] & bit != 0;
        self.words[word] |= bit;
        !was
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk_pages::PAGE_BYTES;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    const PAGE: u64 = PAGE_BYTES;

    fn example() -> Vec<Vec<u32>> {
        vec![vec![0, 1, 2], vec![1, 2, 3], vec![4], vec![4, 5]]
    }

    fn slices(batches: &[Vec<u32>]) -> impl Iterator<Item = &[u32]> {
        batches.iter().map(Vec::as_slice)
    }

    fn search(
        batches: &[Vec<u32>],
        num_nodes: u64,
        row_bytes: u64,
        budget: u64,
    ) -> Result<SearchResult, PlanError> {
        search_segment_size(slices(batches), batches.len(), num_nodes, row_bytes, budget)
    }

    fn exact(batches: &[Vec<u32>], s: usize, num_nodes: u64, row_bytes: u64) -> u64 {
        exact_layout_bytes(slices(batches), s, num_nodes, row_bytes).expect("valid batches")
    }

    #[test]
    fn the_first_prefix_whose_estimate_fits_is_chosen() {
        // Page-sized rows; estimates in pages: i=1: 3 rows * 4 segments = 12,
        // i=2: 4 * 2 = 8, i=3: 5 * 2 = 10, i=4: 6 * 1 = 6.
        let b = example();
        let r = search(&b, 6, PAGE, 8 * PAGE).expect("fits");
        assert_eq!(
            r,
            SearchResult {
                segment_size: 2,
                estimated_bytes: 8 * PAGE,
                distinct_in_prefix: 4,
                shared_in_prefix: 2,
                minimum_bytes: 6 * PAGE,
            }
        );
        assert_eq!(
            search(&b, 6, PAGE, 12 * PAGE).expect("fits").segment_size,
            1
        );
        // 7 pages: neither 8 nor 10 fit, one segment of all batches does.
        assert_eq!(search(&b, 6, PAGE, 7 * PAGE).expect("fits").segment_size, 4);
        match search(&b, 6, PAGE, 6 * PAGE - 1) {
            Err(PlanError::BudgetTooSmall { budget, minimum }) => {
                assert_eq!((budget, minimum), (6 * PAGE - 1, 6 * PAGE));
            }
            other => panic!("expected BudgetTooSmall, got {other:?}"),
        }
    }

    #[test]
    fn a_small_first_batch_does_not_hide_a_budget_no_layout_meets() {
        // The estimate at i = 1 is 1 row * 3 segments, but the batches
        // need 201 distinct rows.
        let b = vec![vec![0], (1..101).collect(), (101..201).collect()];
        match search(&b, 201, 1, 10) {
            Err(PlanError::BudgetTooSmall { minimum, .. }) => assert_eq!(minimum, 201),
            other => panic!("expected BudgetTooSmall, got {other:?}"),
        }
    }

    #[test]
    fn bad_batch_lists_are_errors() {
        let message = |r: Result<SearchResult, PlanError>| r.expect_err("invalid").to_string();
        assert!(
            message(search(&[vec![0, 6]], 6, 8, 1 << 20)).contains("cold node 6 is out of range")
        );
        assert!(message(search(&[vec![], vec![2, 1]], 6, 8, 1 << 20)).contains("batch 1"));
        assert!(message(search(&[vec![1, 1]], 6, 8, 1 << 20)).contains("sorted and unique"));
        assert!(message(search(&[], 6, 8, 1 << 20)).contains("no batches"));
        let short = search_segment_size(slices(&example()), 5, 6, 8, 1 << 20);
        assert!(message(short).contains("after 4 of 5 batches"));
        let zero = exact_layout_bytes(slices(&example()), 0, 6, 8).expect_err("size 0");
        assert!(zero.to_string().contains("at least 1"));
        assert!(exact_layout_bytes(slices(&[vec![7]]), 1, 6, 8).is_err());
    }

    #[test]
    fn exact_bytes_of_a_worked_example() {
        let b = example();
        // Segments {0,1}, {2,3}: caches {1,2} and {4}; chunks {0}, {3}, {}, {5}.
        assert_eq!(exact(&b, 2, 6, PAGE), 6 * PAGE);
        // One batch a segment: every row in its batch's chunk.
        assert_eq!(exact(&b, 1, 6, PAGE), 9 * PAGE);
        assert_eq!(exact(&b, 4, 6, PAGE), 6 * PAGE);
        assert_eq!(exact(&b, 3, 6, PAGE), 7 * PAGE);
        // 100-byte rows: one page for the cache {1,2,4}, one for each of
        // the three non-empty chunks.
        assert_eq!(exact(&b, 4, 6, 100), 4 * PAGE);
    }

    /// Algorithm 2's estimate for every prefix length, computed directly.
    fn naive_estimates(batches: &[Vec<u32>], row_bytes: u64) -> Vec<(u64, u64, u64)> {
        let n = batches.len() as u64;
        let mut reads: BTreeMap<u32, u32> = BTreeMap::new();
        let mut out = Vec::new();
        for (i, batch) in batches.iter().enumerate() {
            for &v in batch {
                *reads.entry(v).or_default() += 1;
            }
            let distinct = reads.len() as u64;
            let shared = reads.values().filter(|&&c| c > 1).count() as u64;
            out.push((
                distinct * n.div_ceil(i as u64 + 1) * row_bytes,
                distinct,
                shared,
            ));
        }
        out
    }

    fn naive_exact(batches: &[Vec<u32>], s: usize, row_bytes: u64) -> u64 {
        let round = |rows: usize| (rows as u64 * row_bytes).div_ceil(PAGE) * PAGE;
        batches
            .chunks(s)
            .map(|segment| {
                let mut reads: BTreeMap<u32, usize> = BTreeMap::new();
                for &v in segment.iter().flatten() {
                    *reads.entry(v).or_default() += 1;
                }
                let cache = reads.values().filter(|&&c| c >= 2).count();
                let chunks: u64 = segment
                    .iter()
                    .map(|b| round(b.iter().filter(|v| reads[v] == 1).count()))
                    .sum();
                round(cache) + chunks
            })
            .sum()
    }

    fn batches() -> impl Strategy<Value = (u64, Vec<Vec<u32>>)> {
        (1u64..80).prop_flat_map(|num_nodes| {
            let batch = prop::collection::btree_set(0..num_nodes as u32, 0..30)
                .prop_map(|set| set.into_iter().collect::<Vec<u32>>());
            (Just(num_nodes), prop::collection::vec(batch, 1..30))
        })
    }

    proptest! {
        #[test]
        fn the_search_is_first_fit_and_ok_exactly_when_the_minimum_fits(
            (num_nodes, b) in batches(),
            row_bytes in 1u64..5000,
            pick in any::<prop::sample::Index>(),
            nudge in -1i64..=1,
        ) {
            let estimates = naive_estimates(&b, row_bytes);
            // Budgets at and beside the estimates hit every boundary.
            let budget = estimates[pick.index(estimates.len())].0.saturating_add_signed(nudge);
            let distinct_all: BTreeSet<u32> = b.iter().flatten().copied().collect();
            let minimum = distinct_all.len() as u64 * row_bytes;
            prop_assert_eq!(estimates.last().map(|e| e.0), Some(minimum));

            match search(&b, num_nodes, row_bytes, budget) {
                Ok(r) => {
                    prop_assert!(minimum <= budget);
                    let s = r.segment_size;
                    prop_assert!((1..=b.len()).contains(&s));
                    prop_assert_eq!(
                        (r.estimated_bytes, r.distinct_in_prefix, r.shared_in_prefix),
                        estimates[s - 1]
                    );
                    prop_assert!(r.estimated_bytes <= budget);
                    prop_assert!(estimates[..s - 1].iter().all(|e| e.0 > budget));
                    prop_assert_eq!(r.minimum_bytes, minimum);
                }
                Err(PlanError::BudgetTooSmall { budget: got, minimum: needed }) => {
                    prop_assert!(minimum > budget);
                    prop_assert_eq!((got, needed), (budget, minimum));
                }
                Err(other) => prop_assert!(false, "unexpected error {}", other),
            }
        }

        #[test]
        fn exact_bytes_follow_the_layout_rules(
            (num_nodes, b) in batches(),
            row_bytes in 1u64..5000,
            s in 1usize..40,
        ) {
            let n = b.len();
            prop_assert_eq!(exact(&b, s, num_nodes, row_bytes), naive_exact(&b, s, row_bytes));

            // Every distinct cold row is stored at least once.
            let distinct = b.iter().flatten().collect::<BTreeSet<_>>().len() as u64;
            let minimum = distinct * row_bytes;
            prop_assert!(exact(&b, s, num_nodes, row_bytes) >= minimum);

            // One segment of all batches: the minimum, plus under a page of
            // rounding for the cache and for each chunk.
            let whole = exact(&b, n, num_nodes, row_bytes);
            prop_assert!(whole <= minimum + (PAGE - 1) * (n as u64 + 1));
            prop_assert_eq!(exact(&b, n + s, num_nodes, row_bytes), whole);
            prop_assert_eq!(exact(&b, usize::MAX, num_nodes, row_bytes), whole);

            // One batch a segment: no cache, each batch packs all its rows.
            let alone: u64 = b.iter().map(|x| (x.len() as u64 * row_bytes).div_ceil(PAGE) * PAGE).sum();
            prop_assert_eq!(exact(&b, 1, num_nodes, row_bytes), alone);
        }

        #[test]
        fn merging_whole_segments_never_stores_more_rows(
            (num_nodes, b) in batches(),
            s in 1usize..10,
            k in 1usize..5,
        ) {
            // With page-sized rows rounding is exact, and segments of k * s
            // batches are unions of k segments of s: their rows can only
            // coincide, never multiply.
            prop_assert!(exact(&b, k * s, num_nodes, PAGE) <= exact(&b, s, num_nodes, PAGE));
        }
    }
}
