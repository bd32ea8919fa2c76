//! The graph in compressed sparse rows, oriented for neighbor sampling: row
//! `v` lists the sources `u` of the edges `u -> v` (the nodes whose messages
//! `v` aggregates). Edge offsets are u64, so graphs past 2^31 (or 2^32) edges
//! do not overflow; node ids are u32, so graphs of 2^32 nodes or more are
//! refused. Built in two streaming passes over the edge list (count, then
//! fill), so memory is the CSR itself plus one counter per node and a
//! chunk of edges; each chunk is sorted into buckets of rows first, so that
//! the threads count and fill disjoint rows, each bucket's in cache. Where
//! memory allows ([`CsrOptions::hold_bytes`]), the first pass keeps its
//! sorted chunks and the second places them without reading the edges again.

use rayon::prelude::*;

use offgnn_shared::dataset::EdgeList;

use crate::error::{Error, Result};

/// How to turn an edge list into the sampling graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CsrOptions {
    /// Add `v -> u` for every `u -> v` (make the graph undirected).
    pub add_reverse: bool,
    /// Keep each (source, destination) pair once.
    pub dedup: bool,
    /// Keep `v -> v` edges.
    pub keep_self_loops: bool,
    /// Bytes the build may spend keeping the first pass's sorted chunks (see
    /// [`held_bytes`]), so that the second pass places them from memory
    /// instead of reading, converting and sorting the edges again; an edge
    /// stream larger than this is read twice.
    pub hold_bytes: u64,
}

impl Default for CsrOptions {
    fn default() -> Self {
        CsrOptions {
            add_reverse: false,
            dedup: false,
            keep_self_loops: true,
            hold_bytes: 0,
        }
    }
}

/// What [`CsrOptions::hold_bytes`] must be for the build to keep every
/// sorted chunk of `edges` edges: two u32s an entry (two entries an edge
/// with `add_reverse`) and each chunk's bucket starts, on `threads` threads.
pub fn held_bytes(edges: u64, add_reverse: bool, threads: usize) -> u64 {
    let entries = if add_reverse { 2 * edges } else { edges };
    let chunks = edges.div_ceil(CHUNK as u64);
    let starts = chunks * threads as u64 * (MAX_BUCKETS as u64 + 1) * 8;
    entries.saturating_mul(8).saturating_add(starts)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Csr {
    offsets: Vec<u64>,
    indices: Vec<u32>,
    /// Repeated (source, destination) pairs dropped by `dedup`.
    duplicates_dropped: u64,
}

/// Edge pairs per streamed chunk.
pub const CHUNK: usize = 1 << 20;

impl Csr {
    /// Builds from a dataset's edge list, calling `progress` with the number
    /// of edges consumed in each chunk (both passes).
    pub fn from_edge_list(
        edges: &EdgeList,
        opts: CsrOptions,
        progress: impl Fn(u64),
    ) -> Result<Csr> {
        Csr::build(edges.num_nodes, opts, |sink| {
            stream_ahead(edges, |src, dst| {
                progress(src.len() as u64);
                sink(src, dst)
            })
        })
    }

    /// Builds from any re-playable edge stream: `stream` is called twice and
    /// must hand the same `(sources, destinations)` chunks to its sink each time.
    pub fn build<S>(num_nodes: u64, opts: CsrOptions, stream: S) -> Result<Csr>
    where
        S: FnMut(&mut dyn FnMut(&[u64], &[u64]) -> Result<()>) -> Result<()>,
    {
        Csr::build_rows(num_nodes, num_nodes, opts, stream)
    }

    /// As [`Csr::build`], for edges from `num_cols` sources to `num_rows`
    /// destinations (a relation between two node types: rows are the
    /// destination type's ids, indices the source type's). Reversing needs
    /// one id space, so `opts.add_reverse` needs `num_rows == num_cols`.
    pub fn build_rows<S>(
        num_rows: u64,
        num_cols: u64,
        opts: CsrOptions,
        mut stream: S,
    ) -> Result<Csr>
    where
        S: FnMut(&mut dyn FnMut(&[u64], &[u64]) -> Result<()>) -> Result<()>,
    {
        check_shape(num_rows, num_cols, opts)?;
        let n = num_rows as usize;
        let in_range = |src: &[u64], dst: &[u64]| check_chunk(src, dst, num_cols, num_rows);

        // Both passes sort each chunk's edges by row bucket first, then
        // handle the buckets in parallel: a bucket's rows are a narrow range
        // whose counters and slots stay in cache, and each row still takes
        // its edges in stream order, whatever the thread count.
        let mut buckets = Buckets::new(n, opts);

        // Pass 1: in-degrees (and out-degrees when reversing) into
        // `offsets[v + 1]`; each sorted chunk kept while they fit in
        // `opts.hold_bytes`.
        let mut offsets = vec![0u64; n + 1];
        let mut held: Option<Vec<Vec<Part>>> = (opts.hold_bytes > 0).then(Vec::new);
        let mut held_size = 0u64;
        stream(&mut |src, dst| {
            in_range(src, dst)?;
            buckets.fill(src, dst);
            let entries = &buckets;
            split_at_bounds(&mut offsets[1..], &buckets.rows)
                .into_par_iter()
                .enumerate()
                .for_each(|(b, degrees)| {
                    let first = entries.rows[b] as u32;
                    for &(row, _) in entries.of(b) {
                        degrees[(row - first) as usize] += 1;
                    }
                });
            if let Some(chunks) = held.as_mut() {
                held_size += buckets.bytes();
                if held_size <= opts.hold_bytes {
                    chunks.push(std::mem::take(&mut buckets.parts));
                } else {
                    held = None;
                }
            }
            Ok(())
        })?;
        for i in 0..n {
            offsets[i + 1] += offsets[i];
        }
        let total = offsets[n];
        let total_usize = usize::try_from(total)
            .map_err(|_| Error::Topology(format!("{total} edges do not fit in memory")))?;

        // Pass 2: fill. `cursor[v]` is the next free slot of row v.
        let mut indices = vec![0u32; total_usize];
        let mut cursor: Vec<u64> = offsets[..n].to_vec();
        let slots: Vec<usize> = buckets.rows.iter().map(|&v| offsets[v] as usize).collect();
        let mut seen = 0u64;
        let changed = || Error::Topology("the edge stream changed between passes".into());
        let mut place = |buckets: &Buckets| -> Result<()> {
            let entries = buckets;
            split_at_bounds(&mut indices, &slots)
                .into_par_iter()
                .zip(split_at_bounds(&mut cursor, &buckets.rows))
                .enumerate()
                .try_for_each(|(b, (part, cursor))| -> Result<()> {
                    let first = entries.rows[b];
                    let base = offsets[first];
                    for &(row, id) in entries.of(b) {
                        let (row, r) = (row as usize, row as usize - first);
                        let slot = cursor[r];
                        if slot >= offsets[row + 1] {
                            return Err(changed());
                        }
                        part[(slot - base) as usize] = id;
                        cursor[r] += 1;
                    }
                    Ok(())
                })?;
            seen += buckets.len() as u64;
            Ok(())
        };
        match held {
            Some(chunks) => {
                for parts in chunks {
                    buckets.parts = parts;
                    place(&buckets)?;
                }
            }
            None => stream(&mut |src, dst| {
                in_range(src, dst)?;
                buckets.fill(src, dst);
                place(&buckets)
            })?,
        }
        drop(buckets);
        if seen != total {
            return Err(changed());
        }
        drop(cursor);

        let mut csr = Csr {
            offsets,
            indices,
            duplicates_dropped: 0,
        };
        let before = csr.num_edges();
        csr.sort_rows(opts.dedup);
        csr.duplicates_dropped = before - csr.num_edges();
        Ok(csr)
    }

    /// Sorts every row (a canonical order, so the CSR does not depend on the
    /// edge file's order) and optionally removes repeated neighbors.
    fn sort_rows(&mut self, dedup: bool) {
        let n = self.num_nodes() as usize;
        // Split rows into blocks of roughly equal edge counts for the threads.
        let per_block = (self.indices.len() / (rayon::current_num_threads() * 16)).max(1 << 14);
        let mut bounds = vec![0usize];
        let mut last = 0u64;
        for v in 0..n {
            if self.offsets[v + 1] - last >= per_block as u64 {
                bounds.push(v + 1);
                last = self.offsets[v + 1];
            }
        }
        if *bounds.last().expect("non-empty") != n {
            bounds.push(n);
        }
        let mut blocks = Vec::with_capacity(bounds.len());
        let mut rest: &mut [u32] = &mut self.indices;
        for w in bounds.windows(2) {
            let len = (self.offsets[w[1]] - self.offsets[w[0]]) as usize;
            let (head, tail) = rest.split_at_mut(len);
            blocks.push((w[0], w[1], head));
            rest = tail;
        }
        let offsets = &self.offsets;
        // Each block sorts its rows and, deduplicating, packs their kept
        // neighbours to its front; it returns the rows' kept lengths.
        let new_degrees: Vec<Vec<u64>> = blocks
            .into_par_iter()
            .map(|(first, end, block)| {
                let base = offsets[first];
                let mut degrees = Vec::with_capacity(end - first);
                let mut write = 0usize;
                for v in first..end {
                    let (start, stop) = (
                        (offsets[v] - base) as usize,
                        (offsets[v + 1] - base) as usize,
                    );
                    let row = &mut block[start..stop];
                    // Edge files sorted by source fill each row in order:
                    // checking is cheaper than sorting them again.
                    if !row.is_sorted() {
                        row.sort_unstable();
                    }
                    let keep = if dedup { dedup_sorted(row) } else { row.len() };
                    if dedup && write != start {
                        block.copy_within(start..start + keep, write);
                    }
                    write += keep;
                    degrees.push(keep as u64);
                }
                degrees
            })
            .collect();
        if !dedup {
            return;
        }
        // Move each block's kept neighbours left, to follow the previous
        // block's, and rewrite the offsets.
        let mut write = 0usize;
        let mut v = 0usize;
        for degrees in new_degrees {
            let start = self.offsets[v] as usize;
            let kept: u64 = degrees.iter().sum();
            if write != start {
                self.indices
                    .copy_within(start..start + kept as usize, write);
            }
            for keep in degrees {
                self.offsets[v] = write as u64;
                write += keep as usize;
                v += 1;
            }
        }
        self.offsets[n] = write as u64;
        self.indices.truncate(write);
        self.indices.shrink_to_fit();
    }

    pub fn num_nodes(&self) -> u64 {
        (self.offsets.len() - 1) as u64
    }

    pub fn num_edges(&self) -> u64 {
        self.indices.len() as u64
    }

    /// How many repeated (source, destination) pairs the build dropped
    /// (with `CsrOptions::dedup`; 0 without).
    pub fn duplicates_dropped(&self) -> u64 {
        self.duplicates_dropped
    }

    /// The in-neighbors of `v` (sources of edges into `v`), sorted.
    pub fn neighbors(&self, v: u32) -> &[u32] {
        let v = v as usize;
        &self.indices[self.offsets[v] as usize..self.offsets[v + 1] as usize]
    }

    pub fn degree(&self, v: u32) -> u64 {
        self.offsets[v as usize + 1] - self.offsets[v as usize]
    }

    pub fn offsets(&self) -> &[u64] {
        &self.offsets
    }

    pub fn indices(&self) -> &[u32] {
        &self.indices
    }

    /// Bytes held by the CSR.
    pub fn memory_bytes(&self) -> u64 {
        (self.offsets.len() * 8 + self.indices.len() * 4) as u64
    }
}

/// A graph of `num_rows` destinations and `num_cols` sources that ids of 32
/// bits hold, and that `opts` can build.
fn check_shape(num_rows: u64, num_cols: u64, opts: CsrOptions) -> Result<()> {
    if let Some(&big) = [num_rows, num_cols].iter().find(|&&n| n >= 1 << 32) {
        return Err(Error::Topology(format!(
            "{big} nodes: node ids are 32-bit, so at most {} nodes are supported",
            u32::MAX
        )));
    }
    if opts.add_reverse && num_rows != num_cols {
        return Err(Error::Topology(
            "reverse edges need sources and destinations of one id space".into(),
        ));
    }
    Ok(())
}

/// A chunk's two sides of one length, its sources below `num_cols` and its
/// destinations below `num_rows`.
fn check_chunk(src: &[u64], dst: &[u64], num_cols: u64, num_rows: u64) -> Result<()> {
    if src.len() != dst.len() {
        return Err(Error::Topology("edge chunk with unequal sides".into()));
    }
    for (ids, bound) in [(src, num_cols), (dst, num_rows)] {
        // The largest id first (vectorized, on the pool); the scan for a
        // bad one only past a bound.
        let max = (ids.par_chunks(1 << 16))
            .map(|part| part.iter().max().copied().unwrap_or(0))
            .max();
        if max.is_some_and(|max| max >= bound)
            && let Some(&bad) = ids.iter().find(|&&id| id >= bound)
        {
            return Err(Error::Topology(format!(
                "node id {bad} is out of range for {bound} nodes"
            )));
        }
    }
    Ok(())
}

/// Edge pairs per chunk of `edges`: [`CHUNK`], or fewer where the file
/// holds fewer (a CSV's counted from its smallest lines), so that a small
/// graph's chunk buffers are as small as its edges.
pub fn chunk_edges(edges: &EdgeList) -> usize {
    CHUNK.min(edges.max_edges().max(1).try_into().unwrap_or(usize::MAX))
}

/// Streams `edges` in chunks of [`chunk_edges`] as [`EdgeList::for_each_chunk`]
/// does: each chunk mapped from a 64-bit `.npy` file
/// ([`EdgeList::for_each_chunk_mapped`]); from any other file, the next
/// chunk read on a thread of its own while `f` handles this one (reading a
/// chunk takes about as long as the pool takes to count or place it).
pub fn stream_ahead(
    edges: &EdgeList,
    mut f: impl FnMut(&[u64], &[u64]) -> Result<()>,
) -> Result<()> {
    if let Some(streamed) = edges.for_each_chunk_mapped(CHUNK, &mut f) {
        return streamed;
    }
    type Chunk = (Vec<u64>, Vec<u64>);
    let (ahead, chunks) = std::sync::mpsc::sync_channel::<Chunk>(1);
    let (recycle, spare) = std::sync::mpsc::channel::<Chunk>();
    std::thread::scope(|s| {
        let reader = s.spawn(move || {
            edges.for_each_chunk_vec::<Error>(chunk_edges(edges), |src, dst| {
                // The chunk's own vectors go ahead; a spare pair takes their place.
                let (mut a, mut b) = spare.try_recv().unwrap_or_default();
                std::mem::swap(&mut a, src);
                std::mem::swap(&mut b, dst);
                // Refused only once `f` failed, whose error is the one returned.
                ahead
                    .send((a, b))
                    .map_err(|_| Error::Topology("the edge stream was stopped".into()))
            })
        });
        let mut handled = Ok(());
        for (src, dst) in chunks.iter() {
            handled = f(&src, &dst);
            if handled.is_err() {
                break;
            }
            let _ = recycle.send((src, dst));
        }
        drop(chunks);
        let read = reader.join().expect("the edge reader does not panic");
        handled.and(read)
    })
}

/// Rows per bucket at the least (a power of two).
const MIN_BUCKET_ROWS: usize = 1 << 12;
/// Buckets at the most, so that sorting a chunk into them stays cheap.
const MAX_BUCKETS: usize = 1 << 10;

/// One chunk's edges as `(row, id)` entries (a row's new neighbour id:
/// `v`'s source `u`, and with `add_reverse` also `u`'s `v`), sorted by row
/// bucket, in stream order within each; bucket `b` holds rows
/// `rows[b]..rows[b + 1]`. The chunk is sorted in one part per thread.
struct Buckets {
    opts: CsrOptions,
    shift: u32,
    rows: Vec<usize>,
    parts: Vec<Part>,
}

/// A consecutive piece of a chunk, sorted into the buckets.
#[derive(Default)]
struct Part {
    starts: Vec<usize>,
    entries: Vec<(u32, u32)>,
}

impl Buckets {
    fn new(n: usize, opts: CsrOptions) -> Self {
        let per_bucket = n
            .div_ceil(MAX_BUCKETS)
            .next_power_of_two()
            .max(MIN_BUCKET_ROWS);
        let count = n.div_ceil(per_bucket).max(1);
        Buckets {
            opts,
            shift: per_bucket.trailing_zeros(),
            rows: (0..=count).map(|b| (b * per_bucket).min(n)).collect(),
            parts: Vec::new(),
        }
    }

    /// Sorts a chunk's edges into the buckets.
    fn fill(&mut self, src: &[u64], dst: &[u64]) {
        let threads = rayon::current_num_threads();
        let len = src.len().div_ceil(threads).max(1);
        self.parts
            .resize_with(src.len().div_ceil(len), Part::default);
        let (opts, shift, count) = (self.opts, self.shift, self.rows.len() - 1);
        self.parts
            .par_iter_mut()
            .zip(src.par_chunks(len).zip(dst.par_chunks(len)))
            .for_each(|(part, (src, dst))| part.fill(src, dst, opts, shift, count));
    }

    /// Bucket `b`'s entries, in stream order.
    fn of(&self, b: usize) -> impl Iterator<Item = &(u32, u32)> {
        self.parts
            .iter()
            .flat_map(move |p| &p.entries[p.starts[b]..p.starts[b + 1]])
    }

    fn len(&self) -> usize {
        self.parts.iter().map(|p| p.entries.len()).sum()
    }

    /// Bytes the sorted chunk holds (as [`held_bytes`] counts them).
    fn bytes(&self) -> u64 {
        self.parts
            .iter()
            .map(|p| 8 * (p.entries.len() + p.starts.len()) as u64)
            .sum()
    }
}

impl Part {
    /// A counting sort of `(src, dst)` into `count` buckets of `1 << shift`
    /// rows.
    fn fill(&mut self, src: &[u64], dst: &[u64], opts: CsrOptions, shift: u32, count: usize) {
        let mut sizes = vec![0usize; count];
        for_entries(src, dst, opts, |row, _| sizes[(row >> shift) as usize] += 1);
        self.starts.clear();
        self.starts.reserve_exact(count + 1);
        self.starts.push(0);
        let mut at = 0;
        for size in sizes {
            at += size;
            self.starts.push(at);
        }
        let mut next = self.starts[..count].to_vec();
        self.entries.resize(self.starts[count], (0, 0));
        for_entries(src, dst, opts, |row, id| {
            let b = (row >> shift) as usize;
            self.entries[next[b]] = (row as u32, id as u32);
            next[b] += 1;
        });
    }
}

/// Calls `visit(row, id)` for each entry of the edges `(src[i], dst[i])`.
#[inline(always)]
fn for_entries(src: &[u64], dst: &[u64], opts: CsrOptions, mut visit: impl FnMut(u64, u64)) {
    for (&u, &v) in src.iter().zip(dst) {
        if u != v || opts.keep_self_loops {
            visit(v, u);
        }
        if u != v && opts.add_reverse {
            visit(u, v);
        }
    }
}

/// `items` cut at `bounds` (from 0 to `items.len()`, non-decreasing) into
/// consecutive slices.
fn split_at_bounds<'a, T>(mut items: &'a mut [T], bounds: &[usize]) -> Vec<&'a mut [T]> {
    let mut parts = Vec::with_capacity(bounds.len().saturating_sub(1));
    for w in bounds.windows(2) {
        let (head, tail) = items.split_at_mut(w[1] - w[0]);
        parts.push(head);
        items = tail;
    }
    parts
}

/// Removes repeats from a sorted slice in place; returns the unique length.
fn dedup_sorted(row: &mut [u32]) -> usize {
    if row.is_empty() {
        return 0;
    }
    let mut w = 1;
    for r in 1..row.len() {
        if row[r] != row[w - 1] {
            row[w] = row[r];
            w += 1;
        }
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn build(n: u64, edges: &[(u64, u64)], opts: CsrOptions, chunk: usize) -> Result<Csr> {
        let (src, dst): (Vec<u64>, Vec<u64>) = edges.iter().copied().unzip();
        Csr::build(n, opts, |sink| {
            for (s, d) in src.chunks(chunk.max(1)).zip(dst.chunks(chunk.max(1))) {
                sink(s, d)?;
            }
            Ok(())
        })
    }

    /// The obvious adjacency: a sorted neighbor list per node.
    fn naive(n: u64, edges: &[(u64, u64)], opts: CsrOptions) -> BTreeMap<u32, Vec<u32>> {
        let mut adj: BTreeMap<u32, Vec<u32>> = (0..n as u32).map(|v| (v, Vec::new())).collect();
        for &(u, v) in edges {
            if u == v && !opts.keep_self_loops {
                continue;
            }
            adj.get_mut(&(v as u32)).unwrap().push(u as u32);
            if opts.add_reverse && u != v {
                adj.get_mut(&(u as u32)).unwrap().push(v as u32);
            }
        }
        for list in adj.values_mut() {
            list.sort_unstable();
            if opts.dedup {
                list.dedup();
            }
        }
        adj
    }

    fn graph() -> impl Strategy<Value = (u64, Vec<(u64, u64)>)> {
        (1u64..60).prop_flat_map(|n| (Just(n), prop::collection::vec((0..n, 0..n), 0..400)))
    }

    proptest! {
        #[test]
        fn matches_naive_adjacency(
            (n, edges) in graph(),
            add_reverse: bool,
            dedup: bool,
            keep_self_loops: bool,
            chunk in 1usize..64,
            hold_bytes in prop_oneof![Just(0u64), Just(u64::MAX), 1u64..4000],
        ) {
            // Holding nothing, everything, or the first chunks only (then
            // reading the stream again).
            let opts = CsrOptions { add_reverse, dedup, keep_self_loops, hold_bytes };
            let csr = build(n, &edges, opts, chunk).unwrap();
            let want = naive(n, &edges, opts);
            prop_assert_eq!(csr.num_nodes(), n);
            let mut total = 0;
            for (v, list) in &want {
                prop_assert_eq!(csr.neighbors(*v), list.as_slice());
                prop_assert_eq!(csr.degree(*v), list.len() as u64);
                total += list.len() as u64;
            }
            prop_assert_eq!(csr.num_edges(), total);
            prop_assert_eq!(*csr.offsets().last().unwrap(), total);
        }
    }

    #[test]
    fn many_buckets_on_several_threads_match_naive_adjacency() {
        // Past MIN_BUCKET_ROWS rows, chunks are sorted into several buckets,
        // in one part per thread.
        let n = 3 * MIN_BUCKET_ROWS as u64 + 17;
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let mut edges: Vec<(u64, u64)> = (0..40_000).map(|_| (next(), next())).collect();
        edges.extend([(5, 5), (n - 1, 0), (0, n - 1), (n - 1, 0)]);
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for (add_reverse, dedup, keep_self_loops, hold_bytes) in [
                (false, false, true, 0),
                (true, true, false, u64::MAX),
                (true, false, true, 200_000),
            ] {
                let opts = CsrOptions {
                    add_reverse,
                    dedup,
                    keep_self_loops,
                    hold_bytes,
                };
                let csr = pool.install(|| build(n, &edges, opts, 7_000)).unwrap();
                let want = naive(n, &edges, opts);
                for (v, list) in &want {
                    assert_eq!(
                        csr.neighbors(*v),
                        list.as_slice(),
                        "{threads} threads, {opts:?}"
                    );
                }
                let total: usize = want.values().map(Vec::len).sum();
                assert_eq!(csr.num_edges(), total as u64);
            }
        }
    }

    #[test]
    fn held_chunks_spare_the_second_read_and_too_few_bytes_read_twice() {
        let edges: Vec<(u64, u64)> = (0..1000).map(|i| (i % 97, (i * 7) % 101)).collect();
        let (src, dst): (Vec<u64>, Vec<u64>) = edges.iter().copied().unzip();
        let reads = |hold_bytes: u64| {
            let mut reads = 0;
            let opts = CsrOptions {
                dedup: true,
                hold_bytes,
                ..Default::default()
            };
            let csr = Csr::build(101, opts, |sink| {
                reads += 1;
                for (s, d) in src.chunks(100).zip(dst.chunks(100)) {
                    sink(s, d)?;
                }
                Ok(())
            })
            .unwrap();
            assert_eq!(
                csr,
                build(
                    101,
                    &edges,
                    CsrOptions {
                        dedup: true,
                        ..Default::default()
                    },
                    100
                )
                .unwrap()
            );
            reads
        };
        assert_eq!(
            reads(held_bytes(1000, false, rayon::current_num_threads())),
            1
        );
        assert_eq!(reads(4000), 2);
        assert_eq!(reads(0), 2);
    }

    #[test]
    fn refuses_too_many_nodes() {
        let err = build(1 << 32, &[], CsrOptions::default(), 1).unwrap_err();
        assert!(err.to_string().contains("32-bit"), "{err}");
    }

    #[test]
    fn refuses_ids_out_of_range() {
        let err = build(3, &[(0, 3)], CsrOptions::default(), 1).unwrap_err();
        assert!(
            err.to_string().contains("node id 3 is out of range"),
            "{err}"
        );
    }

    #[test]
    fn offsets_are_64_bit() {
        // The type, not a 2^31-edge allocation, is what prevents overflow;
        // check that the offsets carry u64 arithmetic end to end.
        let csr = build(2, &[(0, 1), (1, 0), (1, 1)], CsrOptions::default(), 2).unwrap();
        let offsets: &[u64] = csr.offsets();
        assert_eq!(offsets, &[0, 1, 3]);
    }
}
