//! Link prediction's mini-batches, sampled offline like node batches: a
//! batch of positive node pairs, `k` negatives per positive (the positive's
//! source with a drawn destination), and the L-hop neighbourhoods of every
//! endpoint, as one stack of blocks whose seeds are the distinct endpoints.
//!
//! Leakage: a model must never pass messages along the edge it is asked to
//! predict. With exclusion on, every sampled edge between the two nodes of
//! one of the batch's positive pairs, in either direction, is removed from
//! the blocks after sampling (DGL's `exclude="reverse_id"` on a graph that
//! stores each edge both ways; GraphBolt's `exclude_seed_edges` with
//! `include_reverse_edges`).
//!
//! Negatives are drawn uniformly, or in proportion to degree^0.75
//! (word2vec's unigram^0.75, as DGL's and PyG's link-prediction examples
//! offer for graphs where popular nodes are the hard negatives).

use std::collections::{HashMap, HashSet};

use offgnn_shared::samples::{Block, Pairs};
use rand::Rng;

use crate::neighbor_sampling::{Scratch, sample_blocks};
use crate::topology::Csr;

/// How a negative's destination is drawn.
#[derive(Debug)]
pub enum NegativeSampler {
    Uniform {
        num_nodes: u32,
    },
    /// Node `v` with probability `degree(v)^0.75 / Σ`, by the running sums
    /// of those weights.
    Degree {
        cumulative: Vec<f64>,
    },
}

impl NegativeSampler {
    pub fn uniform(num_nodes: u32) -> Self {
        NegativeSampler::Uniform { num_nodes }
    }

    /// Weights `degree^0.75` of `csr`'s nodes (their in-degree: the
    /// neighbours a node aggregates, the graph's degree where it stores
    /// each edge both ways).
    pub fn by_degree(csr: &Csr) -> Self {
        let mut total = 0.0;
        let cumulative = (0..csr.num_nodes() as u32)
            .map(|v| {
                total += (csr.degree(v) as f64).powf(0.75);
                total
            })
            .collect();
        NegativeSampler::Degree { cumulative }
    }

    /// One node. A graph without edges draws uniformly.
    pub fn draw(&self, rng: &mut impl Rng) -> u32 {
        match self {
            NegativeSampler::Uniform { num_nodes } => rng.random_range(0..*num_nodes),
            NegativeSampler::Degree { cumulative } => {
                let total = cumulative.last().copied().unwrap_or(0.0);
                if total <= 0.0 {
                    return rng.random_range(0..cumulative.len().max(1) as u32);
                }
                let x = rng.random::<f64>() * total;
                let i = cumulative.partition_point(|&c| c <= x);
                i.min(cumulative.len() - 1) as u32
            }
        }
    }
}

/// One link-prediction batch.
#[derive(Debug, PartialEq, Eq)]
pub struct LinkBatch {
    /// The distinct endpoints of its pairs, in order of first use.
    pub seeds: Vec<u32>,
    /// Input nodes, the seeds first.
    pub nodes: Vec<u32>,
    /// Blocks, input layer first.
    pub blocks: Vec<Block>,
    /// Its pairs as local ids (positions in `seeds`), labels and queries.
    pub pairs: Pairs,
    /// Sampled edges removed because they join a positive pair.
    pub excluded: u64,
}

/// The undirected key of a node pair: the same whichever way it is stored.
pub(crate) fn pair_key(u: u32, v: u32) -> u64 {
    let (a, b) = if u <= v { (u, v) } else { (v, u) };
    (u64::from(a) << 32) | u64::from(b)
}

/// How link-prediction training batches are sampled from a graph.
pub struct LinkSampler<'a> {
    pub csr: &'a Csr,
    /// Neighbours per layer, input layer first.
    pub fanouts: &'a [usize],
    /// Negatives per positive pair.
    pub k: usize,
    pub negatives: NegativeSampler,
    /// Remove the positive pairs' edges from the blocks.
    pub exclude: bool,
}

impl LinkSampler<'_> {
    /// The training batch of positive `pairs` (global ids): each with `k`
    /// negatives (its source, a drawn destination) under its query, then
    /// the blocks around every distinct endpoint, without the positive
    /// pairs' edges where `exclude`.
    pub fn sample(
        &self,
        pairs: &[(u32, u32)],
        rng: &mut impl Rng,
        scratch: &mut Scratch,
    ) -> LinkBatch {
        let mut rows = Vec::with_capacity(pairs.len() * (self.k + 1));
        for (q, &(u, v)) in pairs.iter().enumerate() {
            rows.push(((u, v), 1, q as u32));
            for _ in 0..self.k {
                rows.push(((u, self.negatives.draw(rng)), 0, q as u32));
            }
        }
        let exclude = self.exclude.then_some(pairs);
        sample_rows(self.csr, self.fanouts, &rows, exclude, rng, scratch)
    }
}

/// The batch of `rows` (`(pair, label, query)`, global ids): the blocks of
/// `fanouts` around every distinct endpoint, without any sampled edge
/// between the two nodes of a pair of `exclude`.
pub fn sample_rows(
    csr: &Csr,
    fanouts: &[usize],
    rows: &[((u32, u32), u32, u32)],
    exclude: Option<&[(u32, u32)]>,
    rng: &mut impl Rng,
    scratch: &mut Scratch,
) -> LinkBatch {
    let mut seeds: Vec<u32> = Vec::with_capacity(rows.len() + 1);
    let mut local: HashMap<u32, u32> = HashMap::with_capacity(rows.len() + 1);
    let mut id = |v: u32, seeds: &mut Vec<u32>| {
        *local.entry(v).or_insert_with(|| {
            seeds.push(v);
            seeds.len() as u32 - 1
        })
    };
    let mut pairs = Pairs::default();
    for &((u, v), label, query) in rows {
        let lu = id(u, &mut seeds);
        let lv = id(v, &mut seeds);
        pairs.push((lu, lv), label, query);
    }
    let (nodes, mut blocks) = sample_blocks(csr, fanouts, &seeds, rng, scratch);
    let mut excluded = 0u64;
    if let Some(exclude) = exclude {
        let banned: HashSet<u64> = exclude
            .iter()
            .filter(|(u, v)| u != v)
            .map(|&(u, v)| pair_key(u, v))
            .collect();
        for b in &mut blocks {
            let before = b.src.len();
            let (src, dst): (Vec<u32>, Vec<u32>) = b
                .src
                .iter()
                .zip(&b.dst)
                .filter(|&(&s, &d)| {
                    !banned.contains(&pair_key(nodes[s as usize], nodes[d as usize]))
                })
                .map(|(&s, &d)| (s, d))
                .unzip();
            excluded += (before - src.len()) as u64;
            (b.src, b.dst) = (src, dst);
        }
    }
    LinkBatch {
        seeds,
        nodes,
        blocks,
        pairs,
        excluded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::neighbor_sampling::batch_rng;
    use crate::topology::CsrOptions;
    use offgnn_shared::dataset::Split;

    /// `n` nodes, each edge stored both ways: a ring, and chords from every
    /// fifth node to the hubs 0..4 (whose degree then dwarfs the rest).
    fn graph(n: u32) -> (Csr, Vec<(u32, u32)>) {
        let mut pairs = Vec::new();
        for u in 0..n {
            pairs.push((u, (u + 1) % n));
            if u % 5 == 0 && u >= 5 {
                pairs.push((u, u % 4));
            }
        }
        let (mut src, mut dst) = (Vec::new(), Vec::new());
        for &(u, v) in &pairs {
            src.extend([u64::from(u), u64::from(v)]);
            dst.extend([u64::from(v), u64::from(u)]);
        }
        let csr = Csr::build(
            u64::from(n),
            CsrOptions {
                dedup: true,
                ..Default::default()
            },
            |sink| sink(&src, &dst),
        )
        .unwrap();
        (csr, pairs)
    }

    /// Every block edge between the two nodes of a positive pair.
    fn leaks(b: &LinkBatch, pairs: &[(u32, u32)]) -> usize {
        let banned: HashSet<u64> = pairs.iter().map(|&(u, v)| pair_key(u, v)).collect();
        b.blocks
            .iter()
            .flat_map(|bl| bl.src.iter().zip(&bl.dst))
            .filter(|&(&s, &d)| {
                banned.contains(&pair_key(b.nodes[s as usize], b.nodes[d as usize]))
            })
            .count()
    }

    #[test]
    fn a_batch_never_sees_its_own_positive_edges_and_would_without_exclusion() {
        let (csr, pairs) = graph(400);
        let mut scratch = Scratch::new(400);
        let mut total_without = 0;
        for index in 0..20u32 {
            let batch: Vec<(u32, u32)> = pairs
                .iter()
                .copied()
                .skip(index as usize * 16)
                .take(16)
                .collect();
            let sample = |exclude: bool, scratch: &mut Scratch| {
                let mut rng = batch_rng(7, Split::Train, 0, index);
                let sampler = LinkSampler {
                    csr: &csr,
                    fanouts: &[3, 3],
                    k: 4,
                    negatives: NegativeSampler::uniform(400),
                    exclude,
                };
                sampler.sample(&batch, &mut rng, scratch)
            };
            let with = sample(true, &mut scratch);
            let without = sample(false, &mut scratch);
            assert_eq!(leaks(&with, &batch), 0, "batch {index}");
            // The same draws: exclusion removes exactly the leaking edges.
            assert_eq!(with.excluded as usize, leaks(&without, &batch));
            assert_eq!(with.nodes, without.nodes);
            total_without += leaks(&without, &batch);
            // Each positive then its 4 negatives, under its query, the
            // negatives keeping its source.
            let p = &with.pairs;
            assert_eq!(p.len(), 16 * 5);
            for (i, &(u, v)) in batch.iter().enumerate() {
                let row = 5 * i;
                let at = |r: usize| (with.seeds[p.src[r] as usize], with.seeds[p.dst[r] as usize]);
                assert_eq!((at(row), p.label[row], p.query[row]), ((u, v), 1, i as u32));
                for r in row + 1..row + 5 {
                    assert_eq!((at(r).0, p.label[r], p.query[r]), (u, 0, i as u32));
                }
            }
            assert_eq!(with.nodes[..with.seeds.len()], with.seeds[..]);
            for b in &with.blocks {
                assert!(b.dst.is_sorted());
                assert!(b.src.iter().all(|&s| s < b.num_src));
            }
        }
        // Without exclusion the batches do see their own edges: the test
        // above would fail.
        assert!(total_without > 100, "{total_without}");
    }

    #[test]
    fn degree_negatives_follow_degree_to_the_three_quarters() {
        let (csr, _) = graph(400);
        let sampler = NegativeSampler::by_degree(&csr);
        let weights: Vec<f64> = (0..400)
            .map(|v| (csr.degree(v) as f64).powf(0.75))
            .collect();
        let total: f64 = weights.iter().sum();
        let mut rng = batch_rng(3, Split::Train, 0, 0);
        let draws = 400_000;
        let mut counts = vec![0u64; 400];
        for _ in 0..draws {
            counts[sampler.draw(&mut rng) as usize] += 1;
        }
        // Hubs 0..4 (degree about 22) and ring nodes (degree 2): each count
        // within five standard deviations of its expectation.
        for v in [0u32, 1, 2, 3, 7, 8, 9] {
            let p = weights[v as usize] / total;
            let expected = draws as f64 * p;
            let sd = (expected * (1.0 - p)).sqrt();
            let got = counts[v as usize] as f64;
            assert!(
                (got - expected).abs() < 5.0 * sd,
                "node {v} (degree {}): {got} draws, {expected:.0} expected",
                csr.degree(v)
            );
        }
        // Pearson's chi-square over every node, 399 degrees of freedom:
        // under 500 unless the draws follow another distribution.
        let chi2: f64 = (0..400)
            .map(|v| {
                let e = draws as f64 * weights[v] / total;
                (counts[v] as f64 - e).powi(2) / e
            })
            .sum();
        assert!(chi2 < 500.0, "chi-square {chi2}");
        // Uniform draws would put a hub at a ring node's rate: far off.
        let uniform = NegativeSampler::uniform(400);
        let hub = (0..draws).filter(|_| uniform.draw(&mut rng) == 0).count() as f64;
        assert!(hub < 0.5 * draws as f64 * weights[0] / total);
    }
}
