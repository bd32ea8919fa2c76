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

use offgnn_shared::samples::Block;
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
    /// Input nodes, the distinct endpoints first (the blocks' seeds).
    pub nodes: Vec<u32>,
    /// Blocks, input layer first.
    pub blocks: Vec<Block>,
    /// The positive pairs as local ids (positions in `nodes`).
    pub positives: Vec<(u32, u32)>,
    /// `k` negatives per positive, positive by positive, as local ids.
    pub negatives: Vec<(u32, u32)>,
    /// Sampled edges removed because they join a positive pair.
    pub excluded: u64,
}

/// The undirected key of a pair.
fn key(u: u32, v: u32) -> u64 {
    let (a, b) = if u <= v { (u, v) } else { (v, u) };
    (u64::from(a) << 32) | u64::from(b)
}

/// How link-prediction batches are sampled from a graph.
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
    /// Samples the batch of positive `pairs` (global ids): `k` negatives
    /// each, then the blocks around every distinct endpoint, without the
    /// edges of the positive pairs where `exclude`.
    pub fn sample(
        &self,
        pairs: &[(u32, u32)],
        rng: &mut impl Rng,
        scratch: &mut Scratch,
    ) -> LinkBatch {
        sample_link_batch(self, pairs, rng, scratch)
    }
}

fn sample_link_batch(
    cfg: &LinkSampler,
    pairs: &[(u32, u32)],
    rng: &mut impl Rng,
    scratch: &mut Scratch,
) -> LinkBatch {
    let k = cfg.k;
    let mut seeds: Vec<u32> = Vec::with_capacity(pairs.len() * (k + 2));
    let mut local: HashMap<u32, u32> = HashMap::with_capacity(seeds.capacity());
    let mut id = |v: u32, seeds: &mut Vec<u32>| {
        *local.entry(v).or_insert_with(|| {
            seeds.push(v);
            seeds.len() as u32 - 1
        })
    };
    let mut positives = Vec::with_capacity(pairs.len());
    let mut negative_pairs = Vec::with_capacity(pairs.len() * k);
    for &(u, v) in pairs {
        let (lu, lv) = (id(u, &mut seeds), id(v, &mut seeds));
        positives.push((lu, lv));
        for _ in 0..k {
            let w = cfg.negatives.draw(rng);
            negative_pairs.push((lu, id(w, &mut seeds)));
        }
    }
    let (nodes, mut blocks) = sample_blocks(cfg.csr, cfg.fanouts, &seeds, rng, scratch);
    let mut excluded = 0u64;
    if cfg.exclude {
        let banned: HashSet<u64> = pairs
            .iter()
            .filter(|(u, v)| u != v)
            .map(|&(u, v)| key(u, v))
            .collect();
        for b in &mut blocks {
            let before = b.src.len();
            let (src, dst): (Vec<u32>, Vec<u32>) = b
                .src
                .iter()
                .zip(&b.dst)
                .filter(|&(&s, &d)| !banned.contains(&key(nodes[s as usize], nodes[d as usize])))
                .map(|(&s, &d)| (s, d))
                .unzip();
            excluded += (before - src.len()) as u64;
            (b.src, b.dst) = (src, dst);
        }
    }
    LinkBatch {
        nodes,
        blocks,
        positives,
        negatives: negative_pairs,
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
        let banned: HashSet<u64> = pairs.iter().map(|&(u, v)| key(u, v)).collect();
        b.blocks
            .iter()
            .flat_map(|bl| bl.src.iter().zip(&bl.dst))
            .filter(|&(&s, &d)| banned.contains(&key(b.nodes[s as usize], b.nodes[d as usize])))
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
            // Seeds first, each positive's negatives keep its source, and
            // the blocks stay sorted by destination.
            assert_eq!(with.positives.len(), 16);
            assert_eq!(with.negatives.len(), 16 * 4);
            for (i, &(lu, lv)) in with.positives.iter().enumerate() {
                assert_eq!((with.nodes[lu as usize], with.nodes[lv as usize]), batch[i]);
                for &(ns, _) in &with.negatives[4 * i..4 * i + 4] {
                    assert_eq!(ns, lu);
                }
            }
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
