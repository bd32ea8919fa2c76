//! The edges of the generators: per-class alias tables that draw a
//! destination by propensity, and the job that streams one relation's edges
//! (both ways in one file, or into a file and its reverse's).

use std::path::Path;

use indicatif::ProgressBar;
use rand::Rng;
use rand_pcg::Pcg64Mcg;
use rayon::prelude::*;

use offgnn_shared::error::Result;
use offgnn_shared::npy::{DType, NpyWriter};

use super::{EDGE_CHUNK_NODES, MAX_SELF_REDRAWS, group_by_class, pipeline, stream_rng, window};

/// One alias table per class (Vose, "A linear algorithm for generating random
/// numbers with a given distribution", IEEE TSE 17(9), 1991): draws a member
/// of a class with probability proportional to its propensity in O(1).
pub(super) struct ClassSamplers {
    /// `members[offsets[c]..offsets[c + 1]]`: the nodes of class `c`.
    offsets: Vec<usize>,
    members: Vec<u32>,
    /// Per member slot: probability of keeping the slot, else its alias
    /// (an index within the class).
    keep: Vec<f64>,
    alias: Vec<u32>,
}

impl ClassSamplers {
    pub(super) fn build(classes: usize, labels: &[u32], theta: &[f32]) -> Self {
        let (offsets, members) = group_by_class(labels, classes);
        let mut keep = vec![0f64; members.len()];
        let mut alias = vec![0u32; members.len()];
        // Disjoint per-class slices, built in parallel.
        let mut parts = Vec::with_capacity(classes);
        let (mut keep_rest, mut alias_rest) = (keep.as_mut_slice(), alias.as_mut_slice());
        for c in 0..classes {
            let len = offsets[c + 1] - offsets[c];
            let (k, kr) = keep_rest.split_at_mut(len);
            let (a, ar) = alias_rest.split_at_mut(len);
            parts.push((&members[offsets[c]..offsets[c + 1]], k, a));
            keep_rest = kr;
            alias_rest = ar;
        }
        parts.into_par_iter().for_each(|(members, keep, alias)| {
            let total: f64 = members.iter().map(|&v| theta[v as usize] as f64).sum();
            let len = members.len() as f64;
            let mut scaled: Vec<f64> = members
                .iter()
                .map(|&v| theta[v as usize] as f64 * len / total)
                .collect();
            let mut small: Vec<u32> = Vec::new();
            let mut large: Vec<u32> = Vec::new();
            for (i, &p) in scaled.iter().enumerate() {
                if p < 1.0 {
                    small.push(i as u32);
                } else {
                    large.push(i as u32);
                }
            }
            while let (Some(&s), Some(&l)) = (small.last(), large.last()) {
                small.pop();
                keep[s as usize] = scaled[s as usize];
                alias[s as usize] = l;
                scaled[l as usize] = (scaled[l as usize] + scaled[s as usize]) - 1.0;
                if scaled[l as usize] < 1.0 {
                    large.pop();
                    small.push(l);
                }
            }
            // What remains is 1 up to rounding.
            for i in small.into_iter().chain(large) {
                keep[i as usize] = 1.0;
                alias[i as usize] = i;
            }
        });
        ClassSamplers {
            offsets,
            members,
            keep,
            alias,
        }
    }

    fn class_len(&self, class: usize) -> usize {
        self.offsets[class + 1] - self.offsets[class]
    }

    fn sample(&self, class: usize, rng: &mut Pcg64Mcg) -> u32 {
        let base = self.offsets[class];
        let slot = base + rng.random_range(0..self.class_len(class) as u32) as usize;
        let pick = if rng.random::<f64>() < self.keep[slot] {
            slot
        } else {
            base + self.alias[slot] as usize
        };
        self.members[pick]
    }

    /// The target of one edge from a node of class `cu`: in-class with
    /// probability `homophily`, else in a uniformly drawn other class; never
    /// `exclude` (the source, where both ends are of one type).
    fn target(&self, exclude: Option<u32>, cu: usize, homophily: f64, rng: &mut Pcg64Mcg) -> u32 {
        let classes = self.offsets.len() - 1;
        let min_len = if exclude.is_some() { 2 } else { 1 };
        if rng.random::<f64>() < homophily && self.class_len(cu) >= min_len {
            for _ in 0..MAX_SELF_REDRAWS {
                let v = self.sample(cu, rng);
                if Some(v) != exclude {
                    return v;
                }
            }
        }
        let mut c = rng.random_range(0..classes as u32 - 1) as usize;
        if c >= cu {
            c += 1;
        }
        self.sample(c, rng)
    }
}

/// Where a relation's edges go: one file holding each edge both ways (a
/// relation of a type to itself, made undirected), or the relation's file
/// and its reverse's (the same edges, the rows swapped).
pub(super) enum EdgeFiles<'a> {
    Symmetric(&'a Path),
    Paired(&'a Path, &'a Path),
}

/// The edges of one relation: each source node `u` (of class
/// `src_labels[u]`) starts `out_counts[u]` edges, each to a destination
/// drawn from `dst` as [`ClassSamplers::target`] draws.
pub(super) struct EdgeJob<'a> {
    pub seed: u64,
    pub stream: u64,
    pub homophily: f64,
    pub src_labels: &'a [u32],
    pub out_counts: &'a [u32],
    pub dst: &'a ClassSamplers,
    /// Sources and destinations are of one type: no edge from a node to
    /// itself.
    pub same_type: bool,
}

impl EdgeJob<'_> {
    /// Streams the `[2, E]` edge arrays (row 0 sources, row 1
    /// destinations), chunk `i` of the sources to its own range of each
    /// file; returns the edges of one file. `bar` makes the progress bar
    /// from the edge count.
    pub(super) fn write(&self, files: EdgeFiles, bar: &dyn Fn(u64) -> ProgressBar) -> Result<u64> {
        let per_edge = match files {
            EdgeFiles::Symmetric(_) => 2,
            EdgeFiles::Paired(..) => 1,
        };
        let mut edge_starts = Vec::with_capacity(self.out_counts.len() / EDGE_CHUNK_NODES + 2);
        edge_starts.push(0u64);
        for chunk in self.out_counts.chunks(EDGE_CHUNK_NODES) {
            let directed: u64 = chunk.iter().map(|&k| per_edge * k as u64).sum();
            edge_starts.push(edge_starts.last().expect("non-empty") + directed);
        }
        let num_edges = *edge_starts.last().expect("non-empty");
        let bar = bar(num_edges * (3 - per_edge));
        let (forward, reverse) = match files {
            EdgeFiles::Symmetric(path) => (path, None),
            EdgeFiles::Paired(path, rev) => (path, Some(rev)),
        };
        let mut out = NpyWriter::create(forward, DType::I64, &[2, num_edges])?;
        let mut out_rev = reverse
            .map(|rev| NpyWriter::create(rev, DType::I64, &[2, num_edges]))
            .transpose()?;
        let num_chunks = edge_starts.len() - 1;
        let make = |chunk: usize| -> (Vec<u8>, Vec<u8>) {
            let mut rng = stream_rng(self.seed, self.stream, chunk as u64);
            let len = (edge_starts[chunk + 1] - edge_starts[chunk]) as usize;
            let mut src = Vec::with_capacity(len * 8);
            let mut dst = Vec::with_capacity(len * 8);
            let first = chunk * EDGE_CHUNK_NODES;
            let last = (first + EDGE_CHUNK_NODES).min(self.src_labels.len());
            for u in first..last {
                let cu = self.src_labels[u] as usize;
                let exclude = self.same_type.then_some(u as u32);
                for _ in 0..self.out_counts[u] {
                    let v = self.dst.target(exclude, cu, self.homophily, &mut rng) as i64;
                    let u = u as i64;
                    src.extend_from_slice(&u.to_le_bytes());
                    dst.extend_from_slice(&v.to_le_bytes());
                    if per_edge == 2 {
                        src.extend_from_slice(&v.to_le_bytes());
                        dst.extend_from_slice(&u.to_le_bytes());
                    }
                }
            }
            (src, dst)
        };
        pipeline(num_chunks, window(), make, |chunk, (src, dst)| {
            let start = edge_starts[chunk] * 8;
            out.write_at(start, &src)?;
            out.write_at(num_edges * 8 + start, &dst)?;
            if let Some(rev) = out_rev.as_mut() {
                rev.write_at(start, &dst)?;
                rev.write_at(num_edges * 8 + start, &src)?;
            }
            bar.inc((src.len() / 8) as u64 * (3 - per_edge));
            Ok(())
        })?;
        out.finish()?;
        if let Some(rev) = out_rev {
            rev.finish()?;
        }
        bar.finish();
        Ok(num_edges)
    }
}
