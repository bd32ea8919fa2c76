//! The graph's edges for inference: streamed as the sampler saw them,
//! bucketed once per run by (destination group, source chunk) on disk, and
//! a group's buckets served to its passes, by chunk or by destination.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Instant;

use offgnn_shared::dataset::Dataset;
use rayon::prelude::*;

use super::InferConfig;
use super::plan::Plan;
use crate::error::{Error, Result};

/// Groups whose edge files are open at once while the edges are bucketed.
const OPEN_GROUPS: usize = 256;

/// The in-edges of each destination, as `(source, destination)` pairs, in
/// the graph the sampler sampled from.
pub(super) fn for_each_edge(
    ds: &Dataset,
    cfg: &InferConfig,
    mut f: impl FnMut(u32, u32) -> Result<()>,
) -> Result<()> {
    let mut failure = None;
    let streamed = ds.edges.for_each_chunk(1 << 20, |src, dst| {
        for (&s, &d) in src.iter().zip(dst) {
            let (s, d) = (s as u32, d as u32);
            if s == d && !cfg.keep_self_loops {
                continue;
            }
            let reverse = cfg.add_reverse_edges && s != d;
            if let Err(e) = f(s, d).and_then(|()| if reverse { f(d, s) } else { Ok(()) }) {
                failure = Some(e);
                // Stops the stream; the error that counts is kept above.
                return Err(offgnn_shared::Error::io(
                    ds.edges.path(),
                    std::io::Error::other("stopped"),
                ));
            }
        }
        Ok(())
    });
    match failure {
        Some(e) => Err(e),
        None => Ok(streamed?),
    }
}

pub(super) fn edge_file(work: &Path, g: usize) -> PathBuf {
    work.join(format!("edges-{g:06}.bin"))
}

/// Buckets the edges by (group, source chunk), once per run: a pass that
/// appends each edge to its group's file (at most `OPEN_GROUPS` files open;
/// more groups take more passes), then each group's file sorted by
/// (destination, source), duplicates dropped (the sampler samples distinct
/// neighbors), and stably regrouped by source chunk, with the chunk offsets
/// after the pairs. Returns the distinct edges.
pub(super) fn bucket_edges(ds: &Dataset, cfg: &InferConfig, plan: &Plan) -> Result<u64> {
    let n = ds.num_nodes;
    let chunks = plan.chunks(n);
    let group_of = |d: u32| -> usize { plan.groups.partition_point(|&(_, end)| end <= d as u64) };
    let pb = offgnn_shared::progress::bar_if(
        cfg.show_progress,
        plan.groups.len() as u64,
        "bucketing edges",
        "groups",
    );
    let mut total = 0u64;
    for first in (0..plan.groups.len()).step_by(OPEN_GROUPS) {
        let last = (first + OPEN_GROUPS).min(plan.groups.len());
        let mut writers = (first..last)
            .map(|g| {
                let path = edge_file(&cfg.work_dir, g);
                File::create(&path)
                    .map(|f| BufWriter::with_capacity(1 << 16, f))
                    .map_err(|e| Error::io(path.display(), e))
            })
            .collect::<Result<Vec<_>>>()?;
        for_each_edge(ds, cfg, |s, d| {
            let g = group_of(d);
            if (first..last).contains(&g) {
                let w = &mut writers[g - first];
                w.write_all(&s.to_le_bytes())
                    .and_then(|()| w.write_all(&d.to_le_bytes()))
                    .map_err(|e| Error::io(edge_file(&cfg.work_dir, g).display(), e))?;
            }
            Ok(())
        })?;
        for (i, w) in writers.into_iter().enumerate() {
            let path = edge_file(&cfg.work_dir, first + i);
            w.into_inner()
                .map_err(|e| Error::io(path.display(), e.into_error()))?;
        }
        for g in first..last {
            let path = edge_file(&cfg.work_dir, g);
            let mut pairs = read_pairs(&path)?;
            pairs.par_sort_unstable_by_key(|&(s, d)| ((d as u64) << 32) | s as u64);
            if !cfg.keep_duplicate_edges {
                pairs.dedup();
            }
            // Stable regrouping by source chunk keeps each bucket sorted by
            // destination.
            let mut offsets = vec![0u64; chunks + 1];
            for &(s, _) in &pairs {
                offsets[(s as u64 / plan.chunk_rows) as usize + 1] += 1;
            }
            for c in 0..chunks {
                offsets[c + 1] += offsets[c];
            }
            let mut at = offsets.clone();
            let mut bucketed = vec![(0u32, 0u32); pairs.len()];
            for &(s, d) in &pairs {
                let c = (s as u64 / plan.chunk_rows) as usize;
                bucketed[at[c] as usize] = (s, d);
                at[c] += 1;
            }
            let mut bytes = Vec::with_capacity(pairs.len() * 8 + offsets.len() * 8);
            for (s, d) in bucketed {
                bytes.extend_from_slice(&s.to_le_bytes());
                bytes.extend_from_slice(&d.to_le_bytes());
            }
            for o in &offsets {
                bytes.extend_from_slice(&o.to_le_bytes());
            }
            // On disk before the progress says the edges are ready: a crash
            // must not leave a run resuming over a file the page cache lost.
            File::create(&path)
                .and_then(|mut f| f.write_all(&bytes).and_then(|()| f.sync_all()))
                .map_err(|e| Error::io(path.display(), e))?;
            total += pairs.len() as u64;
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    // The files' names too.
    File::open(&cfg.work_dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(cfg.work_dir.display(), e))?;
    Ok(total)
}

fn read_pairs(path: &Path) -> Result<Vec<(u32, u32)>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path.display(), e))?;
    Ok(bytes
        .chunks_exact(8)
        .map(|b| {
            (
                u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            )
        })
        .collect())
}

/// A group's bucketed edges: pairs, and where each chunk's bucket starts.
pub(super) struct GroupEdges {
    pub(super) src: Vec<u32>,
    pub(super) dst: Vec<u32>,
    pub(super) offsets: Vec<u64>,
    /// The same edges by destination, made once where a layer pulls (see
    /// [`GroupEdges::by_destination`]) and kept with them.
    pub(super) by_dst: OnceLock<(Vec<u64>, Vec<u32>)>,
    /// Each destination's in-degree, made once where a layer averages (see
    /// [`GroupEdges::in_degrees`]) and kept with them.
    pub(super) in_degree: OnceLock<Vec<f32>>,
}

impl GroupEdges {
    /// Where the edges of `bucket` into destinations `[lo, hi)` lie: a
    /// range of indices, the bucket being sorted by destination.
    pub(super) fn reaching(&self, bucket: usize, (lo, hi): (u64, u64)) -> std::ops::Range<usize> {
        let (f0, f1) = (
            self.offsets[bucket] as usize,
            self.offsets[bucket + 1] as usize,
        );
        let dst = &self.dst[f0..f1];
        f0 + dst.partition_point(|&t| (t as u64) < lo)
            ..f0 + dst.partition_point(|&t| (t as u64) < hi)
    }

    /// A group's in-edges by destination (compressed rows): the sources of
    /// destination `a + i` are `src[starts[i]..starts[i + 1]]`, in the
    /// buckets' order: a counting sort of the pairs, made on the first
    /// call (the group's range `[a, b)`) and kept.
    pub(super) fn by_destination(&self, (a, b): (u64, u64)) -> &(Vec<u64>, Vec<u32>) {
        let made = self.by_dst.get_or_init(|| {
            let started = Instant::now();
            let g = (b - a) as usize;
            let buckets = self.offsets.len() - 1;
            // Ranges of destinations, a few a thread: each takes its edges
            // out of every bucket (sorted by destination) and writes only
            // its own counts and sources, so that no thread writes at random
            // over all of them and every core shares the work.
            let step = g.div_ceil(rayon::current_num_threads() * 4).max(1);
            let range = |r: usize| (a + (r * step) as u64, a + ((r + 1) * step).min(g) as u64);
            let mut starts = vec![0u64; g + 1];
            starts[1..]
                .par_chunks_mut(step)
                .enumerate()
                .for_each(|(r, counts)| {
                    let (lo, hi) = range(r);
                    for c in 0..buckets {
                        for &t in &self.dst[self.reaching(c, (lo, hi))] {
                            counts[(t as u64 - lo) as usize] += 1;
                        }
                    }
                });
            for i in 0..g {
                starts[i + 1] += starts[i];
            }
            let mut src = vec![0u32; self.src.len()];
            let mut parts = Vec::with_capacity(g.div_ceil(step));
            let mut rest = src.as_mut_slice();
            for r in 0..g.div_ceil(step) {
                let (lo, hi) = range(r);
                let (i0, i1) = ((lo - a) as usize, (hi - a) as usize);
                let (mine, tail) = rest.split_at_mut((starts[i1] - starts[i0]) as usize);
                parts.push((r, mine));
                rest = tail;
            }
            parts.into_par_iter().for_each(|(r, mine)| {
                let (lo, hi) = range(r);
                let i0 = (lo - a) as usize;
                let mut next: Vec<u64> = starts[i0..(hi - a) as usize]
                    .iter()
                    .map(|s| s - starts[i0])
                    .collect();
                for c in 0..buckets {
                    let k = self.reaching(c, (lo, hi));
                    for (&u, &t) in self.src[k.clone()].iter().zip(&self.dst[k]) {
                        let at = &mut next[(t as u64 - lo) as usize];
                        mine[*at as usize] = u;
                        *at += 1;
                    }
                }
            });
            tracing::debug!(
                "edges by destination in {:.2} s",
                started.elapsed().as_secs_f64()
            );
            (starts, src)
        });
        assert_eq!(made.0.len() as u64, b - a + 1, "the group's range, as made");
        made
    }

    /// The in-degree of each destination of the group's range `[a, b)`,
    /// counted on the first call and kept: with one group its edges stay
    /// from layer to layer, and are counted once, not once a layer.
    pub(super) fn in_degrees(&self, (a, b): (u64, u64)) -> &[f32] {
        let made = self.in_degree.get_or_init(|| match self.by_dst.get() {
            // A hidden layer pulled by destination: the counts are there.
            Some((starts, _)) => starts
                .par_windows(2)
                .map(|s| (s[1] - s[0]) as f32)
                .collect(),
            None => {
                let mut count = vec![0f32; (b - a) as usize];
                for &t in &self.dst {
                    count[(t as u64 - a) as usize] += 1.0;
                }
                count
            }
        });
        assert_eq!(made.len() as u64, b - a, "the group's range, as made");
        made
    }
}

/// The edges from a span's earlier chunks into a chunk's destinations,
/// gathered from their buckets into one list sorted by destination (each
/// bucket is; together they are not) by a counting sort over the chunk's
/// destinations, for the host's scatter, whose threads take disjoint
/// destination ranges. Buffers reused from chunk to chunk.
#[derive(Default)]
pub(super) struct Waiting {
    pub(super) counts: Vec<usize>,
    pub(super) src: Vec<u32>,
    pub(super) dst: Vec<u32>,
}

impl Waiting {
    /// The edges of the buckets `chunks` whose destinations lie in
    /// `[lo, hi)`, as sources and destinations sorted by destination.
    pub(super) fn gather(
        &mut self,
        edges: &GroupEdges,
        chunks: std::ops::Range<usize>,
        (lo, hi): (u64, u64),
    ) -> (&[u32], &[u32]) {
        let ranges: Vec<_> = chunks.map(|c| edges.reaching(c, (lo, hi))).collect();
        // Edges per destination, then where each destination's edges start.
        self.counts.clear();
        self.counts.resize((hi - lo) as usize + 1, 0);
        for r in &ranges {
            for &t in &edges.dst[r.clone()] {
                self.counts[(t as u64 - lo) as usize + 1] += 1;
            }
        }
        for i in 1..self.counts.len() {
            self.counts[i] += self.counts[i - 1];
        }
        let total = *self.counts.last().expect("one count at least");
        self.src.clear();
        self.src.resize(total, 0);
        self.dst.clear();
        self.dst.resize(total, 0);
        for r in ranges {
            for (&t, &s) in edges.dst[r.clone()].iter().zip(&edges.src[r]) {
                let at = &mut self.counts[(t as u64 - lo) as usize];
                self.src[*at] = s;
                self.dst[*at] = t;
                *at += 1;
            }
        }
        (&self.src, &self.dst)
    }
}

/// Reads group `g`'s bucketed edges, the destinations `dsts`, whose
/// sources lie in chunks of `chunk_rows`; returns them and the file's size.
/// A file that is not what [`bucket_edges`] wrote (short, zeroed, or
/// garbled) is refused, naming it.
pub(super) fn load_group_edges(
    work: &Path,
    g: usize,
    (chunks, chunk_rows): (usize, u64),
    dsts: (u64, u64),
) -> Result<(GroupEdges, u64)> {
    let path = edge_file(work, g);
    let bytes = std::fs::read(&path).map_err(|e| Error::io(path.display(), e))?;
    let corrupt = |what: String| Error::Corrupt {
        path: path.display().to_string(),
        fault: format!(
            "{what}: not the edge buckets this run wrote; remove the work directory and run again"
        ),
    };
    let index_bytes = (chunks + 1) * 8;
    if bytes.len() < index_bytes || !(bytes.len() - index_bytes).is_multiple_of(8) {
        return Err(corrupt(format!("{} bytes", bytes.len())));
    }
    let (pairs, index) = bytes.split_at(bytes.len() - index_bytes);
    let offsets: Vec<u64> = index
        .chunks_exact(8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .collect();
    let edges = (pairs.len() / 8) as u64;
    if offsets[0] != 0 || offsets[chunks] != edges || offsets.windows(2).any(|w| w[0] > w[1]) {
        return Err(corrupt(format!(
            "its bucket offsets do not run from 0 to its {edges} edges"
        )));
    }
    let (mut src, mut dst) = (
        Vec::with_capacity(edges as usize),
        Vec::with_capacity(edges as usize),
    );
    for b in pairs.chunks_exact(8) {
        src.push(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        dst.push(u32::from_le_bytes([b[4], b[5], b[6], b[7]]));
    }
    check_buckets(&src, &dst, &offsets, chunk_rows, dsts).map_err(corrupt)?;
    Ok((
        GroupEdges {
            src,
            dst,
            offsets,
            by_dst: Default::default(),
            in_degree: Default::default(),
        },
        bytes.len() as u64,
    ))
}

/// Checks what [`bucket_edges`] guarantees of a group's edges: bucket `c`
/// holds sources of chunk `c` only, sorted by destination, and every
/// destination lies in the group's `[a, b)`.
fn check_buckets(
    src: &[u32],
    dst: &[u32],
    offsets: &[u64],
    chunk_rows: u64,
    (a, b): (u64, u64),
) -> std::result::Result<(), String> {
    for (c, w) in offsets.windows(2).enumerate() {
        let (lo, hi) = (w[0] as usize, w[1] as usize);
        let mut last = a;
        for e in lo..hi {
            let (s, d) = (src[e] as u64, dst[e] as u64);
            if s / chunk_rows != c as u64 {
                return Err(format!("edge {e} has source {s} in bucket {c}"));
            }
            if d < last || d >= b {
                return Err(format!(
                    "edge {e} has destination {d}, out of order or outside the group's [{a}, {b})"
                ));
            }
            last = d;
        }
    }
    Ok(())
}

/// Splits the destinations `[a, b)` into `parts` ranges and, for a bucket
/// sorted by destination, the edge range of each: the ranges are disjoint,
/// so threads may fill their accumulators without locks.
pub(super) fn dst_parts(
    dst: &[u32],
    a: u64,
    b: u64,
    parts: usize,
) -> Vec<((u64, u64), (usize, usize))> {
    let span = (b - a).div_ceil(parts as u64).max(1);
    (0..parts as u64)
        .map(|i| (a + i * span, (a + (i + 1) * span).min(b)))
        .filter(|(lo, hi)| lo < hi)
        .map(|(lo, hi)| {
            let e0 = dst.partition_point(|&d| (d as u64) < lo);
            let e1 = dst.partition_point(|&d| (d as u64) < hi);
            ((lo, hi), (e0, e1))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn edges_by_destination_list_its_sources_in_bucket_order() {
        // Two buckets, each sorted by destination, for the group [10, 14).
        let edges = GroupEdges {
            src: vec![5, 9, 3, 1, 2],
            dst: vec![10, 10, 12, 11, 12],
            offsets: vec![0, 3, 5],
            by_dst: Default::default(),
            in_degree: Default::default(),
        };
        let (starts, src) = edges.by_destination((10, 14));
        assert_eq!(starts, &[0, 2, 3, 5, 5]);
        assert_eq!(src, &[5, 9, 1, 3, 2]);

        // Many buckets and destinations (more than the ranges a thread
        // takes), against each destination's sources listed bucket by
        // bucket.
        let (a, g, buckets) = (1000u64, 3001usize, 17usize);
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(7);
        let (mut src, mut dst, mut offsets) = (Vec::new(), Vec::new(), vec![0u64]);
        let mut want = vec![Vec::new(); g];
        for _ in 0..buckets {
            let mut bucket: Vec<(u32, u32)> = (0..rng.random_range(0..4 * g))
                .map(|_| {
                    (
                        rng.random::<u32>(),
                        (a + rng.random_range(0..g as u64)) as u32,
                    )
                })
                .collect();
            bucket.sort_by_key(|&(_, t)| t);
            for &(u, t) in &bucket {
                want[(t as u64 - a) as usize].push(u);
                src.push(u);
                dst.push(t);
            }
            offsets.push(src.len() as u64);
        }
        let edges = GroupEdges {
            src,
            dst,
            offsets,
            by_dst: Default::default(),
            in_degree: Default::default(),
        };
        let (starts, src) = edges.by_destination((a, a + g as u64));
        for (i, want) in want.iter().enumerate() {
            assert_eq!(
                &src[starts[i] as usize..starts[i + 1] as usize],
                want,
                "node {i}"
            );
        }
        assert_eq!(starts[g] as usize, src.len());
    }
}
