//! Node-wise uniform neighbor sampling without replacement (GraphSAGE;
//! DiskGNN §3 samples offline exactly what online training would). One
//! mini-batch becomes a stack of message-flow-graph blocks, as DGL builds
//! them: each block's destination nodes are a prefix of its source nodes,
//! and the input nodes (the last hop's sources) start with the seeds.
//!
//! Every batch draws from its own generator seeded by (run seed, split,
//! epoch, batch index), so the output does not depend on which thread
//! sampled which batch.

use crate::topology::Csr;
use offgnn_shared::dataset::Split;
use offgnn_shared::prefetch;
use offgnn_shared::samples::Block;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

/// Per-thread scratch space: a global-to-local id map kept all-`u32::MAX`
/// between batches (only touched entries are reset), so a batch costs time
/// in its own size, not the graph's.
pub struct Scratch {
    pub(crate) local: Vec<u32>,
    /// One destination's drawn positions in its list.
    pub(crate) picks: Vec<u64>,
    /// A relation's picks in a layer, as positions in its neighbour lists.
    pub(crate) at: Vec<u64>,
    /// One destination's excluded positions in its list.
    pub(crate) banned: Vec<u64>,
}

impl Scratch {
    pub fn new(num_nodes: u64) -> Self {
        Scratch {
            local: vec![u32::MAX; num_nodes as usize],
            picks: Vec::new(),
            at: Vec::new(),
            banned: Vec::new(),
        }
    }

    /// Returns the map to all-`u32::MAX` after a batch whose nodes were
    /// `nodes`. Each reset entry is a store to a random line, which a
    /// sequential fill of the whole map beats once the batch touches more
    /// than one entry in sixteen (a line holds sixteen), as typed batches,
    /// which touch a large share of their graph's nodes, do.
    pub(crate) fn clear(&mut self, nodes: &[u32]) {
        if nodes.len() * 16 > self.local.len() {
            self.local.fill(u32::MAX);
        } else {
            for &v in nodes {
                self.local[v as usize] = u32::MAX;
            }
        }
    }
}

/// splitmix64: decorrelates nearby seeds before they seed a generator.
pub fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The generator of one (split, epoch, batch) of a run.
pub fn batch_rng(seed: u64, split: Split, epoch: u32, index: u32) -> Pcg64Mcg {
    let tag = match split {
        Split::Train => 1u64,
        Split::Valid => 2,
        Split::Test => 3,
    };
    let key = mix(mix(mix(seed) ^ tag) ^ epoch as u64) ^ index as u64;
    Pcg64Mcg::seed_from_u64(mix(key))
}

/// How many items ahead the passes below ask for the cache lines they will
/// load: far enough for a miss to the memory to land, near enough for the
/// lines to stay in L1 (64 beat 32 on typed and homogeneous jobs, and 96
/// did no better).
pub(crate) const AHEAD: usize = 64;

/// As [`AHEAD`], for [`gather`]: its loop does less per item, so the
/// lines it asks for must be asked for more items ahead to land in time.
const GATHER_AHEAD: usize = 96;

/// Samples the blocks of one batch. `fanouts` are per layer, input layer
/// first (as DGL's `NeighborSampler`): the seeds' layer uses the last.
///
/// Each layer runs in four tight passes — row bounds of every destination,
/// then the positions of the picks in the neighbour lists, then the picks,
/// then global-to-local ids — rather than one fused loop: the graph is far
/// larger than the caches, and passes whose loads do not depend on each
/// other let the processor keep many cache misses in flight. The random
/// draws happen in the same order either way. The passes that load also
/// prefetch the lines they will need [`AHEAD`] items on: the row bounds of a
/// later destination, a later pick's neighbour, a later source's map entry.
pub fn sample_blocks(
    csr: &Csr,
    fanouts: &[usize],
    seeds: &[u32],
    rng: &mut impl Rng,
    scratch: &mut Scratch,
) -> (Vec<u32>, Vec<Block>) {
    sample_blocks_excluding(csr, fanouts, seeds, None, rng, scratch)
}

/// As [`sample_blocks`], no seed drawing the neighbours `excluded` names
/// for it.
pub fn sample_blocks_excluding(
    csr: &Csr,
    fanouts: &[usize],
    seeds: &[u32],
    excluded: Option<&Excluded>,
    rng: &mut impl Rng,
    scratch: &mut Scratch,
) -> (Vec<u32>, Vec<Block>) {
    let offsets = csr.offsets();
    let indices = csr.indices();
    let mut nodes: Vec<u32> = Vec::with_capacity(seeds.len() * 8);
    for &s in seeds {
        debug_assert_eq!(scratch.local[s as usize], u32::MAX, "seeds are unique");
        scratch.local[s as usize] = nodes.len() as u32;
        nodes.push(s);
    }
    let mut blocks = Vec::with_capacity(fanouts.len());
    let mut num_dst = nodes.len();
    let mut bounds: Vec<(u64, u64)> = Vec::new();
    for &fanout in fanouts.iter().rev() {
        bounds.clear();
        bounds.extend(nodes[..num_dst].iter().enumerate().map(|(i, &v)| {
            if let Some(&ahead) = nodes[..num_dst].get(i + AHEAD) {
                prefetch::line(offsets, ahead as usize);
            }
            (offsets[v as usize], offsets[v as usize + 1])
        }));
        // A layer picks each edge at most once, whatever the fan-out.
        let mut dst = Vec::with_capacity(num_dst.saturating_mul(fanout).min(indices.len()));
        let rows = bounds
            .iter()
            .enumerate()
            .map(|(d, &(s, e))| (d as u32, s, e));
        let excluded = excluded.map(|e| (e, indices, 0));
        pick(rows, fanout, excluded, rng, scratch, &mut dst);
        let mut src = Vec::new();
        gather(indices, &scratch.at, 0, &mut src);
        relabel(&mut scratch.local, &mut src, &mut nodes, None);
        blocks.push(Block {
            num_src: nodes.len() as u32,
            num_dst: num_dst as u32,
            src,
            dst,
            relations: Vec::new(),
        });
        num_dst = nodes.len();
    }
    scratch.clear(&nodes);
    blocks.reverse();
    (nodes, blocks)
}

/// Replaces each global id in `ids` by its local id, giving the next one
/// (appending the node to `nodes`, and `tag` to the tags vector with it)
/// to a node that has none yet in `local`. Whether a node is new is a coin
/// toss a branch would mispredict, so the loop has none: the node is
/// written past the end unconditionally and kept by advancing the length
/// by one or zero. Prefetches `local` [`AHEAD`] ids on.
pub(crate) fn relabel(
    local: &mut [u32],
    ids: &mut [u32],
    nodes: &mut Vec<u32>,
    mut tags: Option<(&mut Vec<u32>, u32)>,
) {
    let mut len = nodes.len();
    // Room for every id to be new: the write for id i lands at most i
    // past the first length.
    nodes.resize(len + ids.len(), 0);
    if let Some((t, _)) = tags.as_mut() {
        t.resize(len + ids.len(), 0);
    }
    for i in 0..ids.len() {
        if let Some(&ahead) = ids.get(i + AHEAD) {
            prefetch::line(local, ahead as usize);
        }
        let u = ids[i];
        let slot = &mut local[u as usize];
        let fresh = *slot == u32::MAX;
        let id = if fresh { len as u32 } else { *slot };
        *slot = id;
        nodes[len] = u;
        if let Some((t, tag)) = tags.as_mut() {
            t[len] = *tag;
        }
        len += usize::from(fresh);
        ids[i] = id;
    }
    nodes.truncate(len);
    if let Some((t, _)) = tags {
        t.truncate(len);
    }
}

/// Each seed's partners in a link batch's positive pairs (global ids),
/// which its neighbour lists may not give it: the pair's edge, either way,
/// is no candidate, and the seed draws its whole fan-out among its other
/// neighbours (DGL's `exclude="reverse_id"`).
#[derive(Debug, Default)]
pub struct Excluded {
    /// By the seed's local id (seeds come first among a batch's nodes).
    partners: Vec<Vec<u32>>,
}

impl Excluded {
    /// The partners of `pairs` (local ids among `seeds`) but a node's own.
    pub fn of_pairs(seeds: &[u32], pairs: impl IntoIterator<Item = (u32, u32)>) -> Self {
        let mut partners = vec![Vec::new(); seeds.len()];
        for (a, b) in pairs {
            let (u, v) = (seeds[a as usize], seeds[b as usize]);
            if u != v {
                partners[a as usize].push(v);
                partners[b as usize].push(u);
            }
        }
        Excluded { partners }
    }

    /// The positions in `indices[start..end]` (a sorted list of ids less
    /// `base`) of row `d`'s partners, into `out`, ascending.
    fn positions(
        &self,
        d: u32,
        (indices, base): (&[u32], u32),
        start: u64,
        end: u64,
        out: &mut Vec<u64>,
    ) {
        out.clear();
        let Some(partners) = self.partners.get(d as usize) else {
            return;
        };
        let row = &indices[start as usize..end as usize];
        for &p in partners {
            let Some(id) = p.checked_sub(base) else {
                continue;
            };
            let lo = row.partition_point(|&x| x < id);
            let hi = lo + row[lo..].partition_point(|&x| x == id);
            out.extend((lo..hi).map(|i| start + i as u64));
        }
        out.sort_unstable();
        out.dedup();
    }
}

/// The positions in the neighbour lists of each row's picks, into
/// `scratch.at` (cleared first), and each pick's destination `d` into
/// `dst`: a row `(d, start, end)` of at most `fanout` neighbours gives them
/// all, a longer one `fanout` drawn by [`choose`]. A row's `excluded`
/// neighbours (looked up in its list, `(indices, base)`) are not among
/// them. This pass loads nothing of the graph but the excluded rows;
/// [`gather`] then does, with prefetching: drawn from a hub's long list,
/// each pick misses the cache, and loading it right after the draw held
/// the loop on it, most of the kernel's time in that one load.
pub(crate) fn pick(
    rows: impl Iterator<Item = (u32, u64, u64)>,
    fanout: usize,
    excluded: Option<(&Excluded, &[u32], u32)>,
    rng: &mut impl Rng,
    scratch: &mut Scratch,
    dst: &mut Vec<u32>,
) {
    let (at, picks, banned) = (&mut scratch.at, &mut scratch.picks, &mut scratch.banned);
    at.clear();
    for (d, start, end) in rows {
        if let Some((e, indices, base)) = excluded {
            e.positions(d, (indices, base), start, end, banned);
        }
        let degree = end - start;
        if excluded.is_some() && !banned.is_empty() {
            let allowed = degree - banned.len() as u64;
            if allowed <= fanout as u64 {
                at.extend((start..end).filter(|a| !banned.contains(a)));
            } else {
                // Draws among the allowed positions, each moved past the
                // excluded ones at or before it.
                choose(allowed, fanout, rng, picks);
                at.extend(picks.iter().map(|&p| {
                    banned
                        .iter()
                        .fold(start + p, |a, &b| if a >= b { a + 1 } else { a })
                }));
            }
            dst.extend(std::iter::repeat_n(d, (allowed as usize).min(fanout)));
            continue;
        }
        if degree <= fanout as u64 {
            at.extend(start..end);
        } else {
            choose(degree, fanout, rng, picks);
            at.extend(picks.iter().map(|&p| start + p));
        }
        dst.extend(std::iter::repeat_n(d, (degree as usize).min(fanout)));
    }
}

/// Appends `indices[a] + base` for each position `a` of `at` to `out`,
/// prefetching the neighbour [`GATHER_AHEAD`] picks on.
pub(crate) fn gather(indices: &[u32], at: &[u64], base: u32, out: &mut Vec<u32>) {
    out.extend(at.iter().enumerate().map(|(i, &a)| {
        if let Some(&ahead) = at.get(i + GATHER_AHEAD) {
            prefetch::line(indices, ahead as usize);
        }
        indices[a as usize] + base
    }));
}

/// Picks `k < n` distinct positions of `0..n` uniformly into `out`
/// (Floyd's algorithm: k draws, no allocation proportional to `n`).
pub(crate) fn choose(n: u64, k: usize, rng: &mut impl Rng, out: &mut Vec<u64>) {
    out.clear();
    // Floyd picks positions; for the small k of GNN fan-outs, a membership
    // test over all picks so far without an early exit (which the compiler
    // vectorizes) is fastest, and u32 positions halve its work. Rows of
    // 2^32 neighbours or more take the general path.
    let mut positions: [u32; 64] = [0; 64];
    if k <= positions.len() && n <= u64::from(u32::MAX) {
        for (len, j) in ((n as u32 - k as u32)..n as u32).enumerate() {
            let t = rng.random_range(0..=j);
            let seen = positions[..len]
                .iter()
                .fold(false, |seen, &p| seen | (p == t));
            positions[len] = if seen { j } else { t };
        }
        out.extend(positions[..k].iter().map(|&p| u64::from(p)));
    } else {
        // usize draws, as before positions were given out.
        let n = n as usize;
        let mut chosen = std::collections::HashSet::with_capacity(k);
        for j in (n - k)..n {
            let t = rng.random_range(0..=j);
            let pick = if chosen.contains(&t) { j } else { t };
            chosen.insert(pick);
            out.push(pick as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::CsrOptions;
    use proptest::prelude::*;
    use std::collections::HashSet;

    proptest! {
        /// `relabel` gives what a map from global to local ids gives:
        /// known nodes keep their id, new ones are numbered in the order
        /// they first appear, each with its tag.
        #[test]
        fn relabel_numbers_new_nodes_in_first_seen_order(
            known in proptest::collection::vec(0u32..64, 0..8),
            ids in proptest::collection::vec(0u32..64, 0..200),
        ) {
            let mut local = vec![u32::MAX; 64];
            let mut nodes: Vec<u32> = Vec::new();
            for &k in &known {
                if local[k as usize] == u32::MAX {
                    local[k as usize] = nodes.len() as u32;
                    nodes.push(k);
                }
            }
            let mut types = vec![9u32; nodes.len()];
            let mut want_map: std::collections::HashMap<u32, u32> =
                nodes.iter().enumerate().map(|(i, &v)| (v, i as u32)).collect();
            let mut want_nodes = nodes.clone();
            let want: Vec<u32> = ids
                .iter()
                .map(|&u| {
                    *want_map.entry(u).or_insert_with(|| {
                        want_nodes.push(u);
                        want_nodes.len() as u32 - 1
                    })
                })
                .collect();
            let mut got = ids.clone();
            relabel(&mut local, &mut got, &mut nodes, Some((&mut types, 3)));
            prop_assert_eq!(got, want);
            prop_assert_eq!(&nodes, &want_nodes);
            prop_assert_eq!(types.len(), nodes.len());
            prop_assert!(types[known.iter().collect::<HashSet<_>>().len()..].iter().all(|&t| t == 3));
            for (i, &v) in nodes.iter().enumerate() {
                prop_assert_eq!(local[v as usize], i as u32);
            }
        }
    }

    fn csr(n: u64, edges: &[(u64, u64)]) -> Csr {
        let (src, dst): (Vec<u64>, Vec<u64>) = edges.iter().copied().unzip();
        Csr::build(
            n,
            CsrOptions {
                dedup: true,
                ..Default::default()
            },
            |sink| sink(&src, &dst),
        )
        .unwrap()
    }

    fn graph() -> impl Strategy<Value = (u64, Vec<(u64, u64)>)> {
        (2u64..80).prop_flat_map(|n| (Just(n), prop::collection::vec((0..n, 0..n), 0..600)))
    }

    proptest! {
        #[test]
        fn blocks_are_valid_message_flow_graphs(
            (n, edges) in graph(),
            fanouts in prop::collection::vec(1usize..8, 1..4),
            seed: u64,
            num_seeds in 1usize..10,
        ) {
            let g = csr(n, &edges);
            let seeds: Vec<u32> = (0..n as u32).step_by(3).take(num_seeds).collect();
            let mut scratch = Scratch::new(n);
            let mut rng = Pcg64Mcg::seed_from_u64(seed);
            let (nodes, blocks) = sample_blocks(&g, &fanouts, &seeds, &mut rng, &mut scratch);

            // Input nodes are unique, start with the seeds.
            prop_assert_eq!(&nodes[..seeds.len()], seeds.as_slice());
            prop_assert_eq!(nodes.iter().collect::<HashSet<_>>().len(), nodes.len());
            prop_assert_eq!(blocks.len(), fanouts.len());
            // Outermost block's destinations are the seeds; each block's
            // destinations are the next block's sources; the input layer's
            // sources are all input nodes.
            prop_assert_eq!(blocks.last().unwrap().num_dst as usize, seeds.len());
            prop_assert_eq!(blocks[0].num_src as usize, nodes.len());
            for w in blocks.windows(2) {
                prop_assert_eq!(w[0].num_dst, w[1].num_src);
            }
            for (block, &fanout) in blocks.iter().zip(&fanouts) {
                prop_assert!(block.num_dst <= block.num_src);
                let mut per_dst: Vec<Vec<u32>> = vec![Vec::new(); block.num_dst as usize];
                for (&s, &d) in block.src.iter().zip(&block.dst) {
                    prop_assert!(s < block.num_src && d < block.num_dst);
                    // Every sampled edge exists in the graph.
                    let (gs, gd) = (nodes[s as usize], nodes[d as usize]);
                    prop_assert!(g.neighbors(gd).binary_search(&gs).is_ok(), "{} -> {} not in graph", gs, gd);
                    per_dst[d as usize].push(gs);
                }
                for (d, picked) in per_dst.iter().enumerate() {
                    let degree = g.degree(nodes[d]) as usize;
                    // Fan-out respected; all neighbors taken when fewer.
                    prop_assert_eq!(picked.len(), degree.min(fanout));
                    // No neighbor twice for one node in one layer.
                    prop_assert_eq!(picked.iter().collect::<HashSet<_>>().len(), picked.len());
                }
            }
            // The scratch map is clean for the next batch.
            prop_assert!(scratch.local.iter().all(|&l| l == u32::MAX));
        }
    }

    #[test]
    fn floyd_is_uniform_enough() {
        let mut counts = [0u32; 10];
        let mut rng = Pcg64Mcg::seed_from_u64(7);
        let mut out = Vec::new();
        for _ in 0..20_000 {
            choose(10, 3, &mut rng, &mut out);
            for &v in &out {
                counts[v as usize] += 1;
            }
        }
        // Each neighbor is picked with probability 3/10: 6000 expected.
        for c in counts {
            assert!((5600..6400).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn floyd_draws_every_subset_alike() {
        // 3 of 6 neighbours: 20 subsets, each 1/20 of 40,000 draws (2,000,
        // standard deviation 44), and never a neighbour twice.
        let mut counts = std::collections::BTreeMap::new();
        let mut rng = Pcg64Mcg::seed_from_u64(11);
        let mut out = Vec::new();
        for _ in 0..40_000 {
            choose(6, 3, &mut rng, &mut out);
            out.sort_unstable();
            assert!(out.windows(2).all(|w| w[0] < w[1]), "{out:?}");
            *counts.entry(out.clone()).or_insert(0u32) += 1;
        }
        assert_eq!(counts.len(), 20);
        for (subset, &c) in &counts {
            assert!((1750..2250).contains(&c), "{subset:?}: {c}");
        }
    }

    #[test]
    fn large_fanouts_take_the_set_path() {
        let mut rng = Pcg64Mcg::seed_from_u64(1);
        let mut out = Vec::new();
        choose(500, 100, &mut rng, &mut out);
        assert_eq!(out.iter().collect::<HashSet<_>>().len(), 100);
        assert!(out.iter().all(|&p| p < 500), "{out:?}");
    }
}
