//! Neighbor sampling on typed graphs, as GraphBolt, DGL and PyG sample
//! them: at each layer, every destination node draws up to the layer's
//! fan-out of its in-neighbours over each relation that reaches its type,
//! independently per relation.
//!
//! The graph is one CSR per relation, its rows the destination type's
//! (type-local) ids and its indices the source type's; batches work in the
//! homogenized id space, each type a contiguous range from its offset (see
//! [`offgnn_shared::dataset::TypedDataset`]). A block's edges come
//! relation by relation, in the dataset's relation order, each relation's
//! grouped by destination ([`Block::relations`] gives the runs).

use rand::Rng;

use offgnn_shared::dataset::TypedDataset;
use offgnn_shared::samples::Block;

use crate::error::{Error, Result};
use crate::neighbor_sampling::{AHEAD, Excluded, Scratch, gather, pick, relabel};
use crate::topology::{Csr, CsrOptions, stream_ahead};
use offgnn_shared::prefetch;

/// One relation's sampling graph.
pub struct RelationGraph {
    /// `src:relation:dst`.
    pub name: String,
    pub src: usize,
    pub dst: usize,
    /// Row `v` (a destination of type `dst`, type-local) lists the sources
    /// (type `src`, type-local) of its edges over this relation.
    pub csr: Csr,
}

pub struct TypedGraph {
    /// The first homogenized id of each node type, then the node count.
    pub offsets: Vec<u64>,
    pub relations: Vec<RelationGraph>,
}

impl TypedGraph {
    /// Builds every relation's CSR from the dataset's edge files; `dedup`
    /// keeps each (source, destination) pair of a relation once; each
    /// relation's build may hold `hold_bytes` ([`CsrOptions::hold_bytes`]).
    /// `progress` gets the edges consumed.
    pub fn from_dataset(
        ds: &TypedDataset,
        dedup: bool,
        hold_bytes: u64,
        progress: impl Fn(u64),
    ) -> Result<Self> {
        let mut offsets: Vec<u64> = ds.node_types.iter().map(|t| t.offset).collect();
        offsets.push(ds.num_nodes());
        let mut relations = Vec::with_capacity(ds.relations.len());
        for r in &ds.relations {
            let (src, dst) = (&ds.node_types[r.src], &ds.node_types[r.dst]);
            // Self-loops mean something only within one type's ids.
            let opts = CsrOptions {
                add_reverse: false,
                dedup,
                keep_self_loops: true,
                hold_bytes,
            };
            let csr = Csr::build_rows(dst.num, src.num, opts, |sink| {
                stream_ahead(&r.edges, |s, d| {
                    progress(s.len() as u64);
                    sink(s, d)
                })
            })?;
            relations.push(RelationGraph {
                name: r.name.clone(),
                src: r.src,
                dst: r.dst,
                csr,
            });
        }
        Ok(TypedGraph { offsets, relations })
    }

    pub fn num_nodes(&self) -> u64 {
        *self.offsets.last().expect("the node count")
    }

    /// The type of homogenized node `id`.
    pub fn type_of(&self, id: u32) -> usize {
        self.offsets.partition_point(|&o| o <= id as u64) - 1
    }

    /// Edges in every relation's CSR.
    pub fn num_edges(&self) -> u64 {
        self.relations.iter().map(|r| r.csr.num_edges()).sum()
    }

    pub fn duplicates_dropped(&self) -> u64 {
        self.relations
            .iter()
            .map(|r| r.csr.duplicates_dropped())
            .sum()
    }

    pub fn memory_bytes(&self) -> u64 {
        self.relations.iter().map(|r| r.csr.memory_bytes()).sum()
    }
}

/// Fan-outs per layer (input layer first) and relation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelationFanouts {
    pub layers: Vec<Vec<usize>>,
}

impl RelationFanouts {
    /// From `--fanout` arguments: one plain list (`15,10,5`) for every
    /// relation, and `REL=15,10,5` for one relation, overriding it; every
    /// list of one length (the layers).
    pub fn parse(specs: &[String], relations: &[String]) -> Result<Self> {
        let bad = |msg: String| Err(Error::InvalidArgument(msg));
        let list = |text: &str| -> Result<Vec<usize>> {
            text.split(',')
                .map(|f| {
                    f.trim()
                        .parse::<usize>()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| {
                            Error::InvalidArgument(format!(
                                "--fanout {text}: each layer's fan-out is a positive integer"
                            ))
                        })
                })
                .collect()
        };
        let mut default: Option<Vec<usize>> = None;
        let mut per: Vec<Option<Vec<usize>>> = vec![None; relations.len()];
        for spec in specs {
            match spec.split_once('=') {
                None => {
                    if default.is_some() {
                        return bad(format!(
                            "--fanout {spec}: a second list for every relation (give one, and REL=... for others)"
                        ));
                    }
                    default = Some(list(spec)?);
                }
                Some((rel, text)) => {
                    let Some(r) = relations.iter().position(|x| x == rel) else {
                        return bad(format!(
                            "--fanout {spec}: no relation '{rel}' (the graph's are {})",
                            relations.join(", ")
                        ));
                    };
                    if per[r].is_some() {
                        return bad(format!("--fanout {spec}: '{rel}' is given twice"));
                    }
                    per[r] = Some(list(text)?);
                }
            }
        }
        let mut columns = Vec::with_capacity(relations.len());
        for (r, own) in per.into_iter().enumerate() {
            let Some(f) = own.or_else(|| default.clone()) else {
                return bad(format!(
                    "--fanout: relation '{}' has none (give a list for every relation, or one REL=... each)",
                    relations[r]
                ));
            };
            columns.push(f);
        }
        let layers = default.as_ref().or(columns.first()).map_or(0, Vec::len);
        if let Some((r, f)) = columns.iter().enumerate().find(|(_, f)| f.len() != layers) {
            return bad(format!(
                "--fanout: '{}' has {} layers, others {layers}",
                relations[r],
                f.len()
            ));
        }
        Ok(RelationFanouts {
            layers: (0..layers)
                .map(|l| columns.iter().map(|c| c[l]).collect())
                .collect(),
        })
    }
}

/// Samples the blocks of one batch of a typed graph: `seeds` in homogenized
/// ids (unique); returns the input nodes (seeds first) and the blocks,
/// input layer first, as [`crate::neighbor_sampling::sample_blocks`] does
/// for one edge type. `scratch` spans the homogenized ids.
pub fn sample_typed_blocks(
    g: &TypedGraph,
    fanouts: &RelationFanouts,
    seeds: &[u32],
    rng: &mut impl Rng,
    scratch: &mut Scratch,
) -> (Vec<u32>, Vec<Block>) {
    sample_typed_blocks_excluding(g, fanouts, seeds, None, rng, scratch)
}

/// As [`sample_typed_blocks`], no seed drawing the neighbours `excluded`
/// names for it, over any relation.
pub fn sample_typed_blocks_excluding(
    g: &TypedGraph,
    fanouts: &RelationFanouts,
    seeds: &[u32],
    excluded: Option<&Excluded>,
    rng: &mut impl Rng,
    scratch: &mut Scratch,
) -> (Vec<u32>, Vec<Block>) {
    let mut nodes: Vec<u32> = Vec::with_capacity(seeds.len() * 8);
    let mut types: Vec<u32> = Vec::with_capacity(seeds.len() * 8);
    for &s in seeds {
        debug_assert_eq!(scratch.local[s as usize], u32::MAX, "seeds are unique");
        add(
            &mut scratch.local,
            (&mut nodes, &mut types),
            s,
            g.type_of(s),
        );
    }
    let mut blocks = Vec::with_capacity(fanouts.layers.len());
    let mut num_dst = nodes.len();
    let mut bounds: Vec<(u32, u64, u64)> = Vec::new();
    for layer in fanouts.layers.iter().rev() {
        // The layer's destinations by type, as (local id, row in the type).
        let mut by_type: Vec<Vec<(u32, usize)>> = vec![Vec::new(); g.offsets.len() - 1];
        for (d, (&v, &t)) in nodes[..num_dst].iter().zip(&types).enumerate() {
            let t = t as usize;
            by_type[t].push((d as u32, (v as u64 - g.offsets[t]) as usize));
        }
        // At most each destination's fan-out over each relation reaching
        // it, and each of the relation's edges once.
        let most: usize = (g.relations.iter().zip(layer))
            .map(|(rel, &fanout)| {
                (by_type[rel.dst].len().saturating_mul(fanout)).min(rel.csr.indices().len())
            })
            .sum();
        let (mut src, mut dst) = (Vec::with_capacity(most), Vec::with_capacity(most));
        let mut relations = vec![0u32];
        for (r, rel) in g.relations.iter().enumerate() {
            let fanout = layer[r];
            let src_base = g.offsets[rel.src];
            let offsets = rel.csr.offsets();
            let indices = rel.csr.indices();
            // In passes, as `sample_blocks` does, each prefetching what it
            // loads AHEAD items on: this relation's destinations' row
            // bounds, then the picks' positions, the picks (as global ids),
            // their local ids. The draws come in the same order as in one
            // fused loop.
            let rows = &by_type[rel.dst];
            bounds.clear();
            bounds.extend(rows.iter().enumerate().map(|(i, &(d, row))| {
                if let Some(&(_, ahead)) = rows.get(i + AHEAD) {
                    prefetch::line(offsets, ahead);
                }
                (d, offsets[row], offsets[row + 1])
            }));
            let first = src.len();
            let excluded = excluded.map(|e| (e, indices, src_base as u32));
            pick(
                bounds.iter().copied(),
                fanout,
                excluded,
                rng,
                scratch,
                &mut dst,
            );
            gather(indices, &scratch.at, src_base as u32, &mut src);
            relabel(
                &mut scratch.local,
                &mut src[first..],
                &mut nodes,
                Some((&mut types, rel.src as u32)),
            );
            relations.push(src.len() as u32);
        }
        blocks.push(Block {
            num_src: nodes.len() as u32,
            num_dst: num_dst as u32,
            src,
            dst,
            relations,
        });
        num_dst = nodes.len();
    }
    scratch.clear(&nodes);
    blocks.reverse();
    (nodes, blocks)
}

/// Node `u`'s local id, giving it the next one (and recording its type `t`)
/// if it has none yet.
fn add(local: &mut [u32], (nodes, types): (&mut Vec<u32>, &mut Vec<u32>), u: u32, t: usize) -> u32 {
    let slot = &mut local[u as usize];
    if *slot == u32::MAX {
        *slot = nodes.len() as u32;
        nodes.push(u);
        types.push(t as u32);
    }
    *slot
}

#[cfg(test)]
pub(crate) mod tests {
    use rand::SeedableRng;
    use rand_pcg::Pcg64Mcg;

    use super::*;
    use crate::synthetic::{GeneratorConfig, TypedFeatures, generate_typed};

    /// A generated graph of IGBH's schema, 2,000 papers, its relations'
    /// CSRs built.
    pub(crate) fn graph() -> (tempfile::TempDir, TypedDataset, TypedGraph) {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("igbh");
        let cfg = GeneratorConfig {
            num_nodes: 2_000,
            feature_dim: 4,
            ..GeneratorConfig::default()
        };
        generate_typed(&out, &cfg, &TypedFeatures::default(), false, false).unwrap();
        let ds = TypedDataset::open(&out).unwrap();
        let g = TypedGraph::from_dataset(&ds, true, 0, |_| {}).unwrap();
        (dir, ds, g)
    }

    fn names(ds: &TypedDataset) -> Vec<String> {
        ds.relations.iter().map(|r| r.name.clone()).collect()
    }

    #[test]
    fn each_destination_draws_its_fanout_over_each_relation_that_reaches_it() {
        let (_dir, ds, g) = graph();
        // Three layers: institutes are three hops from papers.
        let specs = ["3,2,2".to_string(), "paper:cites:paper=5,4,3".to_string()];
        let fanouts = RelationFanouts::parse(&specs, &names(&ds)).unwrap();
        let mut scratch = Scratch::new(g.num_nodes());
        let seeds: Vec<u32> = ds.train.seeds[..64].to_vec();
        let mut rng = Pcg64Mcg::seed_from_u64(7);
        let (nodes, blocks) = sample_typed_blocks(&g, &fanouts, &seeds, &mut rng, &mut scratch);
        assert_eq!(&nodes[..seeds.len()], &seeds[..]);
        assert!(scratch.local.iter().all(|&x| x == u32::MAX));
        assert_eq!(blocks.len(), 3);
        assert_eq!(blocks[2].num_dst as usize, seeds.len());
        assert_eq!(blocks[0].num_dst, blocks[1].num_src);
        assert_eq!(blocks[1].num_dst, blocks[2].num_src);
        let mut reached = vec![false; g.relations.len()];
        for (l, block) in blocks.iter().enumerate() {
            assert_eq!(block.relations.len(), g.relations.len() + 1);
            for (r, rel) in g.relations.iter().enumerate() {
                let run = block.relations[r] as usize..block.relations[r + 1] as usize;
                let (src, dst) = (&block.src[run.clone()], &block.dst[run]);
                assert!(dst.is_sorted());
                reached[r] |= !dst.is_empty();
                // Per destination of the relation's type: min(fanout,
                // degree) distinct true in-neighbours.
                for d in 0..block.num_dst {
                    let v = nodes[d as usize];
                    let mine: Vec<u32> = src
                        .iter()
                        .zip(dst)
                        .filter(|&(_, &x)| x == d)
                        .map(|(&s, _)| (nodes[s as usize] as u64 - g.offsets[rel.src]) as u32)
                        .collect();
                    if g.type_of(v) != rel.dst {
                        assert!(
                            mine.is_empty(),
                            "{}: a {}-typed destination",
                            rel.name,
                            g.type_of(v)
                        );
                        continue;
                    }
                    let row = rel.csr.neighbors((v as u64 - g.offsets[rel.dst]) as u32);
                    assert_eq!(
                        mine.len(),
                        row.len().min(fanouts.layers[l][r]),
                        "{}",
                        rel.name
                    );
                    let mut distinct = mine.clone();
                    distinct.sort_unstable();
                    distinct.dedup();
                    assert_eq!(distinct.len(), mine.len());
                    assert!(mine.iter().all(|u| row.binary_search(u).is_ok()));
                }
            }
        }
        assert!(
            reached.iter().all(|&r| r),
            "every relation is sampled: {reached:?}"
        );
        // The batch's generator fixes it.
        let mut again = Pcg64Mcg::seed_from_u64(7);
        let second = sample_typed_blocks(&g, &fanouts, &seeds, &mut again, &mut scratch);
        assert_eq!(second, (nodes, blocks));
    }

    #[test]
    fn fanouts_apply_to_every_relation_and_overrides_to_one() {
        let rels: Vec<String> = ["a:r:b", "b:s:a"].map(String::from).to_vec();
        let parse = |specs: &[&str]| {
            let specs: Vec<String> = specs.iter().map(|s| s.to_string()).collect();
            RelationFanouts::parse(&specs, &rels)
        };
        assert_eq!(
            parse(&["15,10", "b:s:a=4,3"]).unwrap().layers,
            [[15, 4], [10, 3]]
        );
        assert_eq!(parse(&["a:r:b=1", "b:s:a=2"]).unwrap().layers, [[1, 2]]);
        for (specs, says) in [
            (&["5", "x:y:z=3"][..], "no relation 'x:y:z'"),
            (&["5,5", "a:r:b=3"][..], "'a:r:b' has 1 layers, others 2"),
            (
                &["a:r:b=3", "b:s:a=1,2"][..],
                "'b:s:a' has 2 layers, others 1",
            ),
            (&["a:r:b=3"][..], "relation 'b:s:a' has none"),
            (&["5,0"][..], "positive integer"),
            (&["5", "6"][..], "a second list"),
        ] {
            let e = parse(specs).unwrap_err().to_string();
            assert!(e.contains(says), "{specs:?}: {e}");
        }
    }
}
