//! The cache tiers' hot set from the graph alone (GIDS §3.3, after Data
//! Tiering's weighted reverse PageRank), as an alternative to counting the
//! samples: each node's expected reads under node-wise sampling with the
//! run's fan-outs, from the training seeds outward (a link-prediction
//! run's: its training pairs' endpoints, each as often as it is one; the
//! negatives, drawn at random, are left out). A seed is read by its own
//! batch; a node read `p` times, with `k` in-neighbours, passes each
//! of them `p · min(fanout, k) / k` reads at the next hop (the chance that
//! the sampler picks it), hop after hop for as many layers as the model
//! has. Where samples exist they count exactly what training reads, so
//! this serves where they do not (the first epoch of a loader that samples
//! online, inference); here it is measured against them.

use std::path::Path;

use offgnn_shared::dataset::{Dataset, LinkTask};
use offgnn_shared::report::human_bytes;
use offgnn_shared::samples::RunSummary;

use crate::access_rank::AccessCounts;
use crate::error::{Error, Result};

/// Edges read from the edge file at a time.
const CHUNK: usize = 1 << 20;
/// The expected reads are scaled to counts up to this before ranking.
const SCALE: f64 = (1u64 << 30) as f64;

/// What [`expected_reads`] holds at most for a graph of `num_nodes`: four
/// 8-byte values per node (its reads, this hop's, what it passes on, the
/// next hop's) and a 4-byte in-degree, an edge chunk of both endpoints,
/// and the seeds (for a link-prediction run, each training pair's two
/// endpoints, at most `seeds` of them).
pub fn memory_bytes(num_nodes: u64, seeds: u64) -> u64 {
    num_nodes * (4 * 8 + 4) + CHUNK as u64 * 16 + seeds * 8
}

/// [`memory_bytes`], or an error where it exceeds `memory`.
fn check_memory(num_nodes: u64, seeds: u64, memory: u64) -> Result<u64> {
    let needs = memory_bytes(num_nodes, seeds);
    if needs > memory {
        return Err(Error::InvalidArgument(format!(
            "--rank-by graph holds {} for the graph's {num_nodes} nodes (36 bytes a node, an edge chunk of {}, the seeds), over --memory {}: raise --memory or rank by the samples",
            human_bytes(needs),
            human_bytes(CHUNK as u64 * 16),
            human_bytes(memory)
        )));
    }
    Ok(needs)
}

/// Each node's expected reads over one epoch of `run`'s sampling of the
/// dataset at `run.dataset.location`, as counts the tiers rank by (the
/// same order; a node never reached counts 0, as an unread one does).
/// Refused before any work where [`memory_bytes`] exceeds `memory`.
pub fn expected_reads(run: &RunSummary, memory: u64) -> Result<AccessCounts> {
    let location = &run.dataset.location;
    // The training seeds, or twice the pairs: as many as the samples' seeds.
    let seeds = run
        .counts
        .get(&offgnn_shared::dataset::Split::Train)
        .map_or(0, |c| c.seeds)
        * 2;
    let needs = check_memory(run.dataset.num_nodes, seeds, memory)?;
    tracing::info!(
        "ranking by the graph: at most {} ({} nodes at 36 bytes, an edge chunk, the seeds)",
        human_bytes(needs),
        run.dataset.num_nodes
    );
    let ds = Dataset::open(Path::new(location)).map_err(|e| {
        Error::InvalidArgument(format!(
            "--rank-by graph reads the graph the samples came from, at {location}: {e}"
        ))
    })?;
    if ds.num_nodes != run.dataset.num_nodes {
        return Err(Error::InvalidArgument(format!(
            "--rank-by graph: the dataset at {location} has {} nodes, the samples {}",
            ds.num_nodes, run.dataset.num_nodes
        )));
    }
    let stream =
        |f: &mut EdgeSink| -> Result<()> { ds.edges.for_each_chunk(CHUNK, |src, dst| f(src, dst)) };
    let graph = Graph {
        num_nodes: ds.num_nodes as usize,
        add_reverse: run.params.add_reverse_edges,
        keep_self_loops: run.params.keep_self_loops,
    };
    let link_seeds;
    let seeds = match run.params.link {
        None => &ds.train.seeds,
        Some(_) => {
            let task = LinkTask::open(Path::new(location), ds.num_nodes)
                .map_err(|e| Error::InvalidArgument(format!("--rank-by graph: {e}")))?
                .ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "--rank-by graph: the samples are a link-prediction run's, and the dataset at {location} has no link-prediction task"
                    ))
                })?;
            link_seeds = (task.train.pairs.iter())
                .flat_map(|&(u, v)| [u, v])
                .collect::<Vec<u32>>();
            &link_seeds
        }
    };
    let reads = graph.expected_reads(&stream, seeds, &run.params.fanouts)?;
    let most = reads.iter().copied().fold(0.0, f64::max);
    let counts: Vec<u32> = reads
        .iter()
        .map(|&r| {
            if r <= 0.0 || most <= 0.0 {
                0
            } else {
                ((r / most) * SCALE).ceil().max(1.0) as u32
            }
        })
        .collect();
    Ok(AccessCounts::from_counts(counts))
}

/// The sampler's graph as an edge stream describes it.
struct Graph {
    num_nodes: usize,
    /// Each edge's reverse added, `v -> v` edges kept (the run's options).
    add_reverse: bool,
    keep_self_loops: bool,
}

/// Takes a chunk of edges `(sources, destinations)`.
type EdgeSink<'a> = dyn FnMut(&[u64], &[u64]) -> Result<()> + 'a;

/// Streams every edge chunk by chunk to a sink.
type EdgeStream<'a> = dyn Fn(&mut EdgeSink) -> Result<()> + 'a;

impl Graph {
    /// Calls `f(u, v)` for every edge `u -> v` of the sampler's graph.
    fn each_edge(&self, stream: &EdgeStream, mut f: impl FnMut(usize, usize)) -> Result<()> {
        stream(&mut |src, dst| {
            for (&u, &v) in src.iter().zip(dst) {
                if u == v {
                    if self.keep_self_loops {
                        f(u as usize, v as usize);
                    }
                    continue;
                }
                f(u as usize, v as usize);
                if self.add_reverse {
                    f(v as usize, u as usize);
                }
            }
            Ok(())
        })
    }

    /// Each node's expected reads per epoch: each seed as often as it is
    /// listed, then hop by hop (`fanouts`' last applies first) what each
    /// node's reads pass to its in-neighbours.
    fn expected_reads(
        &self,
        stream: &EdgeStream,
        seeds: &[u32],
        fanouts: &[usize],
    ) -> Result<Vec<f64>> {
        let n = self.num_nodes;
        let mut indeg = vec![0u32; n];
        self.each_edge(stream, |_, v| indeg[v] += 1)?;
        let mut reads = vec![0f64; n];
        let mut hop = vec![0f64; n];
        for &s in seeds {
            hop[s as usize] += 1.0;
        }
        for &fanout in fanouts.iter().rev() {
            for (r, h) in reads.iter_mut().zip(&hop) {
                *r += h;
            }
            // What each destination passes to each of its in-neighbours.
            let pass: Vec<f64> = hop
                .iter()
                .zip(&indeg)
                .map(|(&p, &k)| match k {
                    0 => 0.0,
                    k => p * (fanout as f64).min(f64::from(k)) / f64::from(k),
                })
                .collect();
            let mut next = vec![0f64; n];
            self.each_edge(stream, |u, v| next[u] += pass[v])?;
            hop = next;
        }
        for (r, h) in reads.iter_mut().zip(&hop) {
            *r += h;
        }
        Ok(reads)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 100M nodes need 3.6 GB besides the chunk: refused under 2 GiB, in
    /// one line with the figures.
    #[test]
    fn a_graph_whose_ranking_exceeds_the_memory_is_refused_first() {
        let needs = memory_bytes(100_000_000, 1000);
        assert_eq!(needs, 3_600_000_000 + (16 << 20) + 8000);
        assert_eq!(check_memory(100_000_000, 1000, needs).unwrap(), needs);
        let e = check_memory(100_000_000, 1000, 2 << 30)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--rank-by graph holds 3.37 GiB for the graph's 100000000 nodes")
                && e.contains("over --memory 2.00 GiB"),
            "{e}"
        );
    }

    /// A star into node 0 from 1..=4, and 5 -> 1 and 6 -> 1: seed 0,
    /// fan-outs 2 then 1 (the seeds' layer is the last). Hop 1: each of
    /// 1..=4 is read 2/4 times. Hop 2: node 1 passes its 1/2 to 5 and 6
    /// at 1/2 each (one of its two in-neighbours): 1/4 each.
    #[test]
    fn expected_reads_follow_the_fanouts_from_the_seeds() {
        let edges: (Vec<u64>, Vec<u64>) = (vec![1, 2, 3, 4, 5, 6], vec![0, 0, 0, 0, 1, 1]);
        let stream = |f: &mut EdgeSink| f(&edges.0, &edges.1);
        let g = Graph {
            num_nodes: 8,
            add_reverse: false,
            keep_self_loops: true,
        };
        let reads = g.expected_reads(&stream, &[0], &[1, 2]).unwrap();
        assert_eq!(reads, [1.0, 0.5, 0.5, 0.5, 0.5, 0.25, 0.25, 0.0]);
        // With reverse edges, node 0 is also an in-neighbour of 1..=4 (one
        // of two for 2..=4, of four for 1), and 1 of 5 and 6.
        let g = Graph {
            add_reverse: true,
            ..g
        };
        let reads = g.expected_reads(&stream, &[0], &[1, 1]).unwrap();
        // Hop 1 (fan-out 1 of four in-neighbours of 0): 1/4 each of 1..=4.
        // Hop 2 (fan-out 1): 1 passes 1/4 over its 3 in-neighbours (0, 5,
        // 6) as 1/12 each; 2..=4 pass 1/4 to 0 each.
        let third = 0.25 / 3.0;
        let want = [
            1.0 + 0.75 + third,
            0.25,
            0.25,
            0.25,
            0.25,
            third,
            third,
            0.0,
        ];
        for (got, want) in reads.iter().zip(want) {
            assert!((got - want).abs() < 1e-12, "{reads:?}");
        }
    }
}
