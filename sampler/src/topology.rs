//! The graph in compressed sparse rows, oriented for neighbor sampling: row
//! `v` lists the sources `u` of the edges `u -> v` (the nodes whose messages
//! `v` aggregates). Edge offsets are u64, so graphs past 2^31 (or 2^32) edges
//! do not overflow; node ids are u32, so graphs of 2^32 nodes or more are
//! refused. Built in two streaming passes over the edge list (count, then
//! fill), so memory is the CSR itself plus one counter per node.

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
}

impl Default for CsrOptions {
    fn default() -> Self {
        CsrOptions {
            add_reverse: false,
            dedup: false,
            keep_self_loops: true,
        }
    }
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
            edges.for_each_chunk(CHUNK, |src, dst| {
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
        let n = num_rows as usize;
        let in_range = |src: &[u64], dst: &[u64]| -> Result<()> {
            if src.len() != dst.len() {
                return Err(Error::Topology("edge chunk with unequal sides".into()));
            }
            for (ids, bound) in [(src, num_cols), (dst, num_rows)] {
                if let Some(&bad) = ids.iter().find(|&&id| id >= bound) {
                    return Err(Error::Topology(format!(
                        "node id {bad} is out of range for {bound} nodes"
                    )));
                }
            }
            Ok(())
        };

        // Pass 1: in-degrees (and out-degrees when reversing) into `offsets[v + 1]`.
        let mut offsets = vec![0u64; n + 1];
        stream(&mut |src, dst| {
            in_range(src, dst)?;
            for (&u, &v) in src.iter().zip(dst) {
                if u == v {
                    if opts.keep_self_loops {
                        offsets[v as usize + 1] += 1;
                    }
                    continue;
                }
                offsets[v as usize + 1] += 1;
                if opts.add_reverse {
                    offsets[u as usize + 1] += 1;
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
        let mut seen = 0u64;
        stream(&mut |src, dst| {
            in_range(src, dst)?;
            for (&u, &v) in src.iter().zip(dst) {
                let mut put = |row: u64, id: u64| -> Result<()> {
                    let slot = cursor[row as usize];
                    if slot >= offsets[row as usize + 1] {
                        return Err(Error::Topology(
                            "the edge stream changed between passes".into(),
                        ));
                    }
                    indices[slot as usize] = id as u32;
                    cursor[row as usize] += 1;
                    seen += 1;
                    Ok(())
                };
                if u == v {
                    if opts.keep_self_loops {
                        put(v, u)?;
                    }
                    continue;
                }
                put(v, u)?;
                if opts.add_reverse {
                    put(u, v)?;
                }
            }
            Ok(())
        })?;
        if seen != total {
            return Err(Error::Topology(
                "the edge stream changed between passes".into(),
            ));
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
        // Each block returns the deduplicated length of each of its rows.
        let new_degrees: Vec<Vec<u64>> = blocks
            .into_par_iter()
            .map(|(first, end, block)| {
                let base = offsets[first];
                let mut degrees = Vec::with_capacity(end - first);
                for v in first..end {
                    let row =
                        &mut block[(offsets[v] - base) as usize..(offsets[v + 1] - base) as usize];
                    row.sort_unstable();
                    let keep = if dedup { dedup_sorted(row) } else { row.len() };
                    degrees.push(keep as u64);
                }
                degrees
            })
            .collect();
        if !dedup {
            return;
        }
        // Compact rows leftwards and rewrite the offsets.
        let mut write = 0usize;
        let mut v = 0usize;
        for degrees in new_degrees {
            for keep in degrees {
                let start = self.offsets[v] as usize;
                self.indices
                    .copy_within(start..start + keep as usize, write);
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
        ) {
            let opts = CsrOptions { add_reverse, dedup, keep_self_loops };
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
