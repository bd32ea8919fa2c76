//! Link prediction's mini-batches, sampled offline like node batches: a
//! batch of positive node pairs, `k` negatives per positive (the positive's
//! source with a drawn destination), and the L-hop neighbourhoods of every
//! endpoint, as one stack of blocks whose seeds are the distinct endpoints.
//!
//! Leakage: a model must never pass messages along the edge it is asked to
//! predict. With exclusion on, no edge between the two nodes of one of the
//! batch's positive pairs, in either direction, is a candidate when their
//! neighbours are drawn, so each still draws its whole fan-out among its
//! other neighbours (DGL's `exclude="reverse_id"` on a graph that stores
//! each edge both ways). GraphBolt's `exclude_seed_edges` instead drops
//! those edges from the sampled blocks, leaving an endpoint one neighbour
//! short where one was drawn; on a generated power-law graph that cost
//! about 0.6 points of test MRR (scripts/bench-link).
//!
//! Negatives are drawn uniformly, or in proportion to degree^0.75
//! (word2vec's unigram^0.75, as DGL's and PyG's link-prediction examples
//! offer for graphs where popular nodes are the hard negatives).
//!
//! On a typed graph the pairs are of one relation `src:relation:dst`
//! (homogenized ids), negatives are nodes of `dst` (by their in-degree
//! over that relation), the blocks are typed
//! ([`crate::typed_sampling::sample_typed_blocks`]), and exclusion keeps a
//! positive pair's edges out of the draws over every relation that joins
//! its two nodes, the reverse relation's among them.

use std::collections::HashMap;
use std::ops::Range;

use offgnn_shared::samples::{Block, Pairs};
use rand::Rng;

use crate::neighbor_sampling::{Excluded, Scratch, sample_blocks_excluding};
use crate::topology::Csr;
use crate::typed_sampling::{RelationFanouts, TypedGraph, sample_typed_blocks_excluding};

/// How a negative's destination is drawn, among the nodes `first..` (the
/// destination type's homogenized ids on a typed graph).
#[derive(Debug)]
pub enum NegativeSampler {
    Uniform {
        nodes: Range<u32>,
    },
    /// Node `first + i` with probability `degree(i)^0.75 / Σ`, by the
    /// running sums of those weights.
    Degree {
        first: u32,
        cumulative: Vec<f64>,
    },
}

impl NegativeSampler {
    pub fn uniform(nodes: Range<u32>) -> Self {
        NegativeSampler::Uniform { nodes }
    }

    /// Weights `degree^0.75` of `csr`'s rows (their in-degree: the
    /// neighbours a node aggregates, the graph's degree where it stores
    /// each edge both ways), row `i` being node `first + i`.
    pub fn by_degree(csr: &Csr, first: u32) -> Self {
        let mut total = 0.0;
        let cumulative = (0..csr.num_nodes() as u32)
            .map(|v| {
                total += (csr.degree(v) as f64).powf(0.75);
                total
            })
            .collect();
        NegativeSampler::Degree { first, cumulative }
    }

    /// One node. A graph without edges draws uniformly.
    pub fn draw(&self, rng: &mut impl Rng) -> u32 {
        match self {
            NegativeSampler::Uniform { nodes } => rng.random_range(nodes.clone()),
            NegativeSampler::Degree { first, cumulative } => {
                let total = cumulative.last().copied().unwrap_or(0.0);
                if total <= 0.0 {
                    return first + rng.random_range(0..cumulative.len().max(1) as u32);
                }
                let x = rng.random::<f64>() * total;
                let i = cumulative.partition_point(|&c| c <= x);
                first + i.min(cumulative.len() - 1) as u32
            }
        }
    }
}

/// The graph a link batch's blocks are sampled from, with its fan-outs.
#[derive(Clone, Copy)]
pub enum BlockSource<'a> {
    /// One edge type: neighbours per layer, input layer first.
    Plain(&'a Csr, &'a [usize]),
    Typed(&'a TypedGraph, &'a RelationFanouts),
}

impl BlockSource<'_> {
    /// The input nodes (`seeds` first) and blocks around `seeds`, no seed
    /// drawing the neighbours `excluded` names for it.
    fn sample(
        self,
        seeds: &[u32],
        excluded: Option<&Excluded>,
        rng: &mut impl Rng,
        scratch: &mut Scratch,
    ) -> (Vec<u32>, Vec<Block>) {
        match self {
            BlockSource::Plain(csr, fanouts) => {
                sample_blocks_excluding(csr, fanouts, seeds, excluded, rng, scratch)
            }
            BlockSource::Typed(g, fanouts) => {
                sample_typed_blocks_excluding(g, fanouts, seeds, excluded, rng, scratch)
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
}

/// How link-prediction training batches are sampled from a graph.
pub struct LinkSampler<'a> {
    pub graph: BlockSource<'a>,
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
        sample_rows(self.graph, &rows, exclude, rng, scratch)
    }
}

/// The batch of `rows` (`(pair, label, query)`, global ids): the blocks of
/// `graph` around every distinct endpoint, no edge between the two nodes of
/// a pair of `exclude` drawn.
pub fn sample_rows(
    graph: BlockSource,
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
    let excluded = exclude.map(|pairs| {
        Excluded::of_pairs(&seeds, pairs.iter().map(|&(u, v)| (local[&u], local[&v])))
    });
    let (nodes, blocks) = graph.sample(&seeds, excluded.as_ref(), rng, scratch);
    LinkBatch {
        seeds,
        nodes,
        blocks,
        pairs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::edge_split::pair_key;
    use crate::neighbor_sampling::batch_rng;
    use crate::topology::CsrOptions;
    use offgnn_shared::dataset::Split;
    use std::collections::HashSet;

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

    /// `v`'s partners in `pairs` (a node's own pair with itself aside).
    fn partners(pairs: &[(u32, u32)], v: u32) -> HashSet<u32> {
        (pairs.iter())
            .filter_map(|&(a, b)| match (a == v, b == v) {
                (true, false) => Some(b),
                (false, true) => Some(a),
                _ => None,
            })
            .collect()
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
                    graph: BlockSource::Plain(&csr, &[3, 3]),
                    k: 4,
                    negatives: NegativeSampler::uniform(0..400),
                    exclude,
                };
                sampler.sample(&batch, &mut rng, scratch)
            };
            let with = sample(true, &mut scratch);
            let without = sample(false, &mut scratch);
            assert_eq!(leaks(&with, &batch), 0, "batch {index}");
            total_without += leaks(&without, &batch);
            // The pairs' edges are kept out of the draws, not dropped after
            // them: every destination draws min(fan-out, its neighbours
            // less its partners) in each layer.
            for b in &with.blocks {
                let mut drawn = vec![0usize; b.num_dst as usize];
                b.dst.iter().for_each(|&d| drawn[d as usize] += 1);
                for (d, &got) in drawn.iter().enumerate() {
                    let v = with.nodes[d];
                    let ps = partners(&batch, v);
                    let allowed = csr.neighbors(v).iter().filter(|u| !ps.contains(u)).count();
                    assert_eq!(got, allowed.min(3), "batch {index}: node {v}");
                }
            }
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
        let sampler = NegativeSampler::by_degree(&csr, 0);
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
        // Rows of another type's range: the same draws, moved by its first id.
        let moved = NegativeSampler::by_degree(&csr, 1_000);
        let (mut a, mut b) = (
            batch_rng(4, Split::Train, 0, 0),
            batch_rng(4, Split::Train, 0, 0),
        );
        assert!((0..1000).all(|_| moved.draw(&mut a) == 1_000 + sampler.draw(&mut b)));
        // Uniform draws would put a hub at a ring node's rate: far off.
        let uniform = NegativeSampler::uniform(0..400);
        let hub = (0..draws).filter(|_| uniform.draw(&mut rng) == 0).count() as f64;
        assert!(hub < 0.5 * draws as f64 * weights[0] / total);
    }

    #[test]
    fn a_typed_batch_loses_its_pairs_edges_over_every_relation_and_keeps_its_relation_runs() {
        use crate::typed_sampling::RelationFanouts;
        let (_dir, ds, g) = crate::typed_sampling::tests::graph();
        let names: Vec<String> = ds.relations.iter().map(|r| r.name.clone()).collect();
        let fanouts = RelationFanouts::parse(&["4,4".to_string()], &names).unwrap();
        let r = names
            .iter()
            .position(|n| n == "paper:written_by:author")
            .unwrap();
        let rel = &g.relations[r];
        let (src_base, dst_base) = (g.offsets[rel.src] as u32, g.offsets[rel.dst] as u32);
        // Pairs (paper, author) of the relation: each author row's papers.
        let pairs: Vec<(u32, u32)> = (0..rel.csr.num_nodes() as u32)
            .flat_map(|a| {
                rel.csr
                    .neighbors(a)
                    .iter()
                    .map(move |&p| (p + src_base, a + dst_base))
            })
            .step_by(7)
            .take(24)
            .collect();
        assert_eq!(pairs.len(), 24);
        let mut scratch = Scratch::new(g.num_nodes());
        let authors = dst_base..g.offsets[rel.dst + 1] as u32;
        let sample = |exclude: bool, scratch: &mut Scratch| {
            let sampler = LinkSampler {
                graph: BlockSource::Typed(&g, &fanouts),
                k: 2,
                negatives: NegativeSampler::uniform(authors.clone()),
                exclude,
            };
            sampler.sample(&pairs, &mut batch_rng(5, Split::Train, 0, 0), scratch)
        };
        let with = sample(true, &mut scratch);
        let without = sample(false, &mut scratch);
        assert_eq!(leaks(&with, &pairs), 0);
        // Each positive is one edge of the relation and one of its reverse
        // at least, in the first layer's blocks around the endpoints.
        assert!(leaks(&without, &pairs) >= 24, "{}", leaks(&without, &pairs));
        // Kept out of the draws: every run draws as many as a destination
        // has neighbours over it less its partners, up to the fan-out.
        for b in &with.blocks {
            for (r, rel) in g.relations.iter().enumerate() {
                let run = b.relations[r] as usize..b.relations[r + 1] as usize;
                let mut drawn = vec![0usize; b.num_dst as usize];
                b.dst[run].iter().for_each(|&d| drawn[d as usize] += 1);
                let (src_base, dst_base) = (g.offsets[rel.src] as u32, g.offsets[rel.dst]);
                for (d, &got) in drawn.iter().enumerate() {
                    let v = with.nodes[d];
                    if g.type_of(v) != rel.dst {
                        continue;
                    }
                    let ps = partners(&pairs, v);
                    let allowed = (rel.csr.neighbors(v - dst_base as u32).iter())
                        .filter(|&&u| !ps.contains(&(u + src_base)))
                        .count();
                    assert_eq!(got, allowed.min(4), "relation {r}: node {v}");
                }
            }
        }
        // Negatives are authors; every run still holds only its relation's
        // edges, its destinations in order.
        let p = &with.pairs;
        for row in 0..p.len() {
            assert!(authors.contains(&with.seeds[p.dst[row] as usize]));
        }
        for b in &with.blocks {
            assert_eq!(b.relations.len(), g.relations.len() + 1);
            assert_eq!(*b.relations.last().unwrap() as usize, b.src.len());
            for (r, rel) in g.relations.iter().enumerate() {
                let run = b.relations[r] as usize..b.relations[r + 1] as usize;
                assert!(b.dst[run.clone()].is_sorted());
                for i in run {
                    let (s, d) = (with.nodes[b.src[i] as usize], with.nodes[b.dst[i] as usize]);
                    assert_eq!((g.type_of(s), g.type_of(d)), (rel.src, rel.dst));
                }
            }
        }
    }
}
