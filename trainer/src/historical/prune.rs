//! A batch's blocks pruned below the nodes whose embeddings come from the
//! historical cache (FreshGNN §5): a cached node's embedding stands in for
//! its subtree, so neither its neighbours' rows nor their computation are
//! needed. What is left is a smaller stack of blocks in the usual shape
//! (each block's destinations first among its sources), the input rows
//! still read, and per level how to lay out the computed and cached
//! embeddings as the next block's sources.

use offgnn_shared::samples::Block;

/// The pruned batch.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    /// The pruned blocks, input layer first.
    pub blocks: Vec<Block>,
    /// Input positions (rows of the batch's assembled matrix) that the
    /// pruned block 0 takes as its sources, in its order.
    pub inputs: Vec<u32>,
    /// Per level `1..L` (the sources of block `l`): the level's nodes in
    /// the pruned order as positions of the batch's input rows, each
    /// either computed (the `k`-th destination of the block below) or
    /// cached.
    pub levels: Vec<Level>,
}

/// One level of the pruned batch.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Level {
    /// The level's nodes as input positions, in the order of the sources of
    /// the block above.
    pub positions: Vec<u32>,
    /// For each of them: its row in `[computed; cached]`, the block below's
    /// outputs followed by the cached embeddings in `cached` order.
    pub gather: Vec<i64>,
    /// The cached nodes the level uses, as input positions.
    pub cached: Vec<u32>,
    /// The computed ones: the destinations of the block below, in order.
    pub computed: Vec<u32>,
}

/// Prunes `blocks` (input layer first, destinations a prefix of sources at
/// every level) below the nodes `is_cached(level, position)` says are in the
/// cache, for levels `1..blocks.len()` (the embeddings between layers; the
/// seeds' own output is never cached).
pub fn prune(blocks: &[Block], is_cached: impl Fn(usize, u32) -> bool) -> Pruned {
    let layers = blocks.len();
    if layers == 0 {
        return Pruned::default();
    }
    // Top down: the destinations each block must compute, and the sources
    // that reach them. `computed[l]` holds the level-l nodes block l-1
    // computes, ascending.
    let seeds = blocks[layers - 1].num_dst;
    let mut computed: Vec<Vec<u32>> = vec![Vec::new(); layers + 1];
    computed[layers] = (0..seeds).collect();
    let mut needed: Vec<Vec<u32>> = vec![Vec::new(); layers];
    for l in (0..layers).rev() {
        let b = &blocks[l];
        // A computed destination needs itself (its own row) and its sources.
        let mut mark = vec![false; b.num_src as usize];
        let mut want = vec![false; b.num_dst as usize];
        for &v in &computed[l + 1] {
            mark[v as usize] = true;
            want[v as usize] = true;
        }
        for (&s, &d) in b.src.iter().zip(&b.dst) {
            if want[d as usize] {
                mark[s as usize] = true;
            }
        }
        needed[l] = (0..b.num_src).filter(|&p| mark[p as usize]).collect();
        if l > 0 {
            computed[l] = needed[l]
                .iter()
                .copied()
                .filter(|&p| !is_cached(l, p))
                .collect();
        }
    }
    // Each level's order: the block above's destinations first (its
    // computed nodes, ascending), then the other needed nodes, ascending.
    let order: Vec<Vec<u32>> = (0..layers)
        .map(|l| {
            let dst = &computed[l + 1];
            let mut is_dst = vec![false; blocks[l].num_src as usize];
            for &v in dst {
                is_dst[v as usize] = true;
            }
            let rest = needed[l].iter().copied().filter(|&p| !is_dst[p as usize]);
            dst.iter().copied().chain(rest).collect()
        })
        .collect();
    let blocks_out = (0..layers)
        .map(|l| relabel(&blocks[l], &order[l], &computed[l + 1]))
        .collect();
    let levels = (1..layers)
        .map(|l| level(&order[l], &computed[l]))
        .collect();
    Pruned {
        blocks: blocks_out,
        inputs: order[0].clone(),
        levels,
    }
}

/// Block `b` restricted to the destinations `dst` (ascending, a prefix of
/// `order`) and renumbered in `order`; a typed block's relation offsets
/// count its kept edges.
fn relabel(b: &Block, order: &[u32], dst: &[u32]) -> Block {
    let mut new_id = vec![u32::MAX; b.num_src as usize];
    for (i, &p) in order.iter().enumerate() {
        new_id[p as usize] = i as u32;
    }
    let (mut src, mut dst_out) = (Vec::new(), Vec::new());
    let segments: Vec<(usize, usize)> = if b.relations.is_empty() {
        vec![(0, b.src.len())]
    } else {
        b.relations
            .windows(2)
            .map(|w| (w[0] as usize, w[1] as usize))
            .collect()
    };
    let mut relations = Vec::with_capacity(b.relations.len());
    if !b.relations.is_empty() {
        relations.push(0);
    }
    // Edges are grouped by destination, ascending (a typed block's within
    // each relation); `dst` ascends and is renumbered 0.. in order, so the
    // kept edges stay grouped and sorted.
    for (from, to) in segments {
        for e in from..to {
            let nd = new_id[b.dst[e] as usize];
            if (nd as usize) < dst.len() {
                src.push(new_id[b.src[e] as usize]);
                dst_out.push(nd);
            }
        }
        if !b.relations.is_empty() {
            relations.push(src.len() as u32);
        }
    }
    Block {
        num_src: order.len() as u32,
        num_dst: dst.len() as u32,
        src,
        dst: dst_out,
        relations,
    }
}

/// How a level's nodes in `order` come from `[computed; cached]`.
fn level(order: &[u32], computed: &[u32]) -> Level {
    let mut gather = Vec::with_capacity(order.len());
    let mut cached = Vec::new();
    for &p in order {
        // Computed nodes come first where the block above takes them as
        // destinations, later where they are only neighbours.
        match computed.binary_search(&p) {
            Ok(k) => gather.push(k as i64),
            Err(_) => {
                gather.push((computed.len() + cached.len()) as i64);
                cached.push(p);
            }
        }
    }
    Level {
        positions: order.to_vec(),
        gather,
        cached,
        computed: computed.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two layers over six inputs: seeds 0 and 1; level 1 holds 0..4.
    fn two_layers() -> Vec<Block> {
        vec![
            Block {
                num_src: 6,
                num_dst: 4,
                src: vec![4, 0, 4, 5, 1],
                dst: vec![0, 1, 2, 2, 3],
                relations: Vec::new(),
            },
            Block {
                num_src: 4,
                num_dst: 2,
                src: vec![2, 3, 2],
                dst: vec![0, 0, 1],
                relations: Vec::new(),
            },
        ]
    }

    #[test]
    fn nothing_cached_keeps_every_needed_node() {
        let p = prune(&two_layers(), |_, _| false);
        // Level 1 needs 0, 1 (destinations above) and 2, 3 (neighbours).
        assert_eq!(p.levels[0].positions, vec![0, 1, 2, 3]);
        assert_eq!(p.levels[0].gather, vec![0, 1, 2, 3]);
        assert!(p.levels[0].cached.is_empty());
        // Every input is reached, the level-1 nodes first.
        assert_eq!(p.inputs, vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(p.blocks, two_layers());
    }

    #[test]
    fn a_cached_node_cuts_its_subtree() {
        // Node 2 at level 1 is cached: its in-edges from 4 and 5 go, and
        // input 5 is no longer read; 4 still is, for node 0. Node 2 itself
        // is read for nobody.
        let p = prune(&two_layers(), |l, v| l == 1 && v == 2);
        let lv = &p.levels[0];
        assert_eq!(lv.computed, vec![0, 1, 3]);
        assert_eq!(lv.cached, vec![2]);
        assert_eq!(lv.positions, vec![0, 1, 2, 3]);
        // Rows of [computed(0, 1, 3); cached(2)].
        assert_eq!(lv.gather, vec![0, 1, 3, 2]);
        // Block 0 computes 0, 1, 3 (its destinations first), from 4 and 1.
        assert_eq!(p.inputs, vec![0, 1, 3, 4]);
        let b0 = &p.blocks[0];
        assert_eq!((b0.num_src, b0.num_dst), (4, 3));
        assert_eq!(b0.src, vec![3, 0, 1]);
        assert_eq!(b0.dst, vec![0, 1, 2]);
        // The block above keeps its edges, renumbered in the level's order.
        assert_eq!(p.blocks[1].src, vec![2, 3, 2]);
    }

    #[test]
    fn a_cached_seed_still_gets_its_own_output() {
        // Seed 0 cached at level 1: its own level-1 embedding comes from the
        // cache; its output (level 2) is computed from it and from 2 and 3.
        let p = prune(&two_layers(), |l, v| l == 1 && v == 0);
        let lv = &p.levels[0];
        assert_eq!(lv.cached, vec![0]);
        assert_eq!(lv.computed, vec![1, 2, 3]);
        // Order: the block above's destinations 0, 1 first (0 cached).
        assert_eq!(lv.positions, vec![0, 1, 2, 3]);
        assert_eq!(lv.gather, vec![3, 0, 1, 2]);
        // Block 0 computes 1, 2, 3: inputs 1, 2, 3, then 0 (a neighbour
        // of 1), 4 and 5.
        assert_eq!(p.inputs, vec![1, 2, 3, 0, 4, 5]);
        assert_eq!(p.blocks[0].num_dst, 3);
    }
}
