//! FreshGNN's historical cache (`--historical`, [`crate::historical`]) on
//! typed batches. The cache is the homogeneous one: one per level, keyed
//! by homogenized node id, every type's embeddings `hidden` wide. A batch
//! is pruned against it on its homogenized blocks; the typed batch keeps
//! its shape (every type's rows at every level) and loses what the cached
//! nodes stand in for:
//!
//! - each type reads only the input rows the pruned batch needs (the rest
//!   are zeros, never reached);
//! - each block keeps only the edges into the nodes it must compute, so
//!   the rows left out are neither aggregated nor read;
//! - at each level between layers the cached nodes' rows are laid in over
//!   what was computed for them.
//!
//! The computed nodes' values are those of the full batch; after the
//! backward pass each level's gradients decide what the cache admits and
//! evicts, as for homogeneous batches.

use offgnn_shared::address_table::BatchTable;
use offgnn_shared::samples::Block;
use tch::{Device, Kind, TchError, Tensor};

use super::Schema;
use crate::error::{Error, Result};
use crate::historical::{Historical, LevelUpdate, Plan, decide};

/// How many steps behind the step a batch is pruned: see [`cache`].
pub(crate) const LAG: u64 = 4;

/// FreshGNN's cache as `--historical` asks (none without it), refused as
/// for homogeneous training where it does not apply: a model without
/// levels between layers, and ranks of a data-parallel launch
/// ([`crate::historical::for_run`]). Batches
/// are pruned on the loader thread up to four steps ahead of the step
/// (two queued, one fetched, one stepping): against the cache as the step
/// four back left it, also where each batch is fetched in its turn, so
/// that the pipeline on or off trains the same steps.
pub(super) fn cache(
    cfg: &super::train::TypedTrainConfig,
    model: &super::RgnnConfig,
    ranks: crate::train::Ranks<'_>,
) -> Result<Option<Historical>> {
    let Some(h) = &cfg.historical else {
        return Ok(None);
    };
    if model.layers < 2 {
        return Err(Error::InvalidArgument(
            "--historical caches embeddings between layers: it needs a layout sampled with at least 2 layers (--fanout)".into(),
        ));
    }
    let shape = (model.layers - 1, model.hidden as usize, LAG);
    crate::historical::for_run(h, ranks.world(), shape).map(Some)
}

/// Step `step`'s update to the cache once its backward pass is through:
/// a pruned batch's admissions and evictions, nothing for a batch of the
/// stabilization period (later batches wait for every step's).
pub(super) fn publish(
    h: &Historical,
    step: u64,
    plan: Option<&TypedPlan>,
    kept: &[LevelRows],
) -> Result<()> {
    match plan {
        Some(p) => p.publish(h, step, kept),
        None => {
            h.publish(step, Vec::new());
            Ok(())
        }
    }
}

/// A typed batch's part of the cache.
pub(crate) struct TypedPlan {
    plan: Plan,
    /// Each input position's type and row among that type's inputs.
    at: Vec<(usize, i64)>,
}

/// What pruning a typed batch gives its fetch.
pub(super) struct Pruned {
    pub(super) plan: TypedPlan,
    /// The blocks with only the edges into nodes that are computed.
    pub(super) blocks: Vec<Block>,
    /// Each type's input rows still read.
    pub(super) inputs: Vec<Vec<u32>>,
}

/// Training step `step`'s batch `top` pruned against `h` (none in the
/// stabilization period, or once the run was released).
pub(super) fn prune(
    h: &Historical,
    step: u64,
    top: &BatchTable,
    schema: &Schema,
) -> Result<Option<Pruned>> {
    match h.lookup(step, &top.blocks, &top.input_nodes) {
        Some(plan) => Ok(Some(typed(plan, top, schema)?)),
        None => Ok(None),
    }
}

/// The typed batch `top` as `plan` prunes its homogenized blocks.
fn typed(plan: Plan, top: &BatchTable, schema: &Schema) -> Result<Pruned> {
    let mut rows = vec![0i64; schema.types.len()];
    let at = top
        .input_nodes
        .iter()
        .map(|&v| {
            let t = schema.type_of(u64::from(v)).ok_or_else(|| {
                Error::InvalidArgument(format!("input node {v} is of no node type"))
            })?;
            rows[t] += 1;
            Ok((t, rows[t] - 1))
        })
        .collect::<Result<Vec<_>>>()?;
    let mut inputs = vec![Vec::new(); schema.types.len()];
    for &p in &plan.pruned.inputs {
        let (t, row) = at[p as usize];
        inputs[t].push(row as u32);
    }
    let layers = top.blocks.len();
    let blocks = top
        .blocks
        .iter()
        .enumerate()
        .map(|(l, b)| match plan.pruned.levels.get(l) {
            // Block l computes level l + 1's computed nodes; the last
            // block, every seed.
            Some(above) if l + 1 < layers => edges_into(b, &above.computed),
            _ => b.clone(),
        })
        .collect();
    Ok(Pruned {
        plan: TypedPlan { plan, at },
        blocks,
        inputs,
    })
}

/// Block `b` with only the edges into `computed` (destination positions,
/// ascending), its relation offsets renumbered.
fn edges_into(b: &Block, computed: &[u32]) -> Block {
    let mut keep = vec![false; b.num_dst as usize];
    for &d in computed {
        keep[d as usize] = true;
    }
    let (mut src, mut dst) = (Vec::new(), Vec::new());
    let mut relations = Vec::with_capacity(b.relations.len());
    relations.push(0u32);
    for r in b.relations.windows(2) {
        for e in r[0] as usize..r[1] as usize {
            if keep.get(b.dst[e] as usize).copied().unwrap_or(false) {
                src.push(b.src[e]);
                dst.push(b.dst[e]);
            }
        }
        relations.push(src.len() as u32);
    }
    Block {
        num_src: b.num_src,
        num_dst: b.num_dst,
        src,
        dst,
        relations,
    }
}

/// One level's rows as the forward pass left them, for the update: each
/// type's rows (detached), and the zero leaf added to them whose gradient
/// is theirs.
pub(crate) type LevelRows = Vec<(Tensor, Tensor)>;

impl TypedPlan {
    /// The level hook of [`super::Rgnn::output_levels`]: at each level,
    /// each type's cached nodes' rows laid in, and a zero leaf added to
    /// every type's rows; `kept` gets each level's rows and leaves.
    pub(crate) fn lay_in<'a>(
        &'a self,
        kept: &'a mut Vec<LevelRows>,
    ) -> impl FnMut(usize, Vec<Tensor>) -> Result<Vec<Tensor>, TchError> + 'a {
        move |l, h| {
            let lv = &self.plan.pruned.levels[l - 1];
            let rows = &self.plan.cached_rows[l - 1];
            let dim = (rows.len() / lv.cached.len().max(1)) as i64;
            let (mut to, mut from) = (vec![Vec::new(); h.len()], vec![Vec::new(); h.len()]);
            for (i, &p) in lv.cached.iter().enumerate() {
                let (t, row) = self.at[p as usize];
                to[t].push(row);
                from[t].push(i as i64);
            }
            let device = h.first().map_or(Device::Cpu, Tensor::device);
            let cached = Tensor::from_slice(rows)
                .f_view([lv.cached.len() as i64, dim])?
                .f_to_device(device)?;
            let mut level = Vec::with_capacity(h.len());
            let mut out = Vec::with_capacity(h.len());
            for (t, x) in h.into_iter().enumerate() {
                let full = if to[t].is_empty() {
                    x
                } else {
                    let idx = Tensor::from_slice(&to[t]).f_to_device(device)?;
                    let sel = Tensor::from_slice(&from[t]).f_to_device(device)?;
                    let values = cached.f_index_select(0, &sel)?.f_to_kind(x.kind())?;
                    x.f_index_put(&[Some(idx)], &values, false)?
                };
                let leaf = full.f_zeros_like()?.set_requires_grad(true);
                out.push(full.f_add(&leaf)?);
                level.push((full.f_detach()?, leaf));
            }
            kept.push(level);
            Ok(out)
        }
    }

    /// After the backward pass: each level's admissions (the `p_grad`
    /// fraction of its nodes with the smallest embedding gradient, newly
    /// computed ones with their rows) and evictions, published for `step`.
    pub(crate) fn publish(&self, h: &Historical, step: u64, kept: &[LevelRows]) -> Result<()> {
        let mut updates = Vec::with_capacity(kept.len());
        for (l, level) in kept.iter().enumerate() {
            let lv = &self.plan.pruned.levels[l];
            // Each type's rows among the level's nodes, in their order.
            let mut rows = vec![Vec::new(); level.len()];
            for &p in &lv.positions {
                let (t, row) = self.at[p as usize];
                rows[t].push(row);
            }
            let mut norms = Vec::with_capacity(level.len());
            let mut embeddings = Vec::with_capacity(level.len());
            for ((full, leaf), rows) in level.iter().zip(&rows) {
                let idx = Tensor::from_slice(rows).f_to_device(full.device())?;
                let host = |x: Tensor| -> Result<Vec<f32>> {
                    let x = x.f_to_kind(Kind::Float)?.f_to_device(Device::Cpu)?;
                    Ok(Vec::<f32>::try_from(&x.f_contiguous()?.f_flatten(0, -1)?)?)
                };
                let grad = leaf.grad();
                norms.push(if grad.defined() {
                    host(grad.f_index_select(0, &idx)?.f_norm_scalaropt_dim(
                        2,
                        [1i64].as_slice(),
                        false,
                    )?)?
                } else {
                    vec![0.0; rows.len()]
                });
                embeddings.push(host(full.f_index_select(0, &idx)?)?);
            }
            let dim = level.first().map_or(0, |(f, _)| f.size()[1] as usize);
            // The level's nodes in order: each one's type and its place
            // among that type's.
            let mut next = vec![0usize; level.len()];
            let place: Vec<(usize, usize)> = lv
                .positions
                .iter()
                .map(|&p| {
                    let t = self.at[p as usize].0;
                    next[t] += 1;
                    (t, next[t] - 1)
                })
                .collect();
            let level_norms: Vec<f32> = place.iter().map(|&(t, k)| norms[t][k]).collect();
            let from_cache: Vec<bool> = lv
                .gather
                .iter()
                .map(|&g| g as usize >= lv.computed.len())
                .collect();
            let (admit, evict) = decide(&level_norms, &from_cache, h.config().p_grad);
            let nodes = &self.plan.nodes[l];
            let mut admitted = Vec::with_capacity(admit.len() * dim);
            for &i in &admit {
                let (t, k) = place[i];
                admitted.extend_from_slice(&embeddings[t][k * dim..(k + 1) * dim]);
            }
            updates.push(LevelUpdate {
                admit: admit.iter().map(|&i| nodes[i]).collect(),
                rows: admitted,
                evict: evict.iter().map(|&i| nodes[i]).collect(),
            });
        }
        h.publish(step, updates);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hetero::{Inputs, RelationalKind, Rgnn, RgnnConfig, TypedBlocks};
    use crate::historical::HistoricalConfig;
    use tch::nn;

    /// Types a (ids 0..100) and b (100..200), three relations; 40 inputs
    /// of either type and three random blocks over levels of 40, 20, 8 and
    /// 3 nodes, each relation's edges by destination.
    fn random_batch(seed: u64) -> (Schema, BatchTable) {
        let schema = Schema::new(
            vec![("a".into(), 0, 100), ("b".into(), 100, 100)],
            &["a:r:b".into(), "b:s:a".into(), "a:t:a".into()],
            "a",
        )
        .unwrap();
        let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        let mut next = |n: u32| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % u64::from(n)) as u32
        };
        let input_nodes: Vec<u32> = (0..40)
            .map(|i| if next(2) == 0 { i } else { 100 + i })
            .collect();
        let type_of = |p: u32| usize::from(input_nodes[p as usize] >= 100);
        let sizes = [40u32, 20, 8, 3];
        let blocks = (0..3)
            .map(|k| {
                let (num_src, num_dst) = (sizes[k], sizes[k + 1]);
                let (mut src, mut dst, mut relations) = (Vec::new(), Vec::new(), vec![0u32]);
                for &(st, _, dt) in &schema.relations {
                    for d in (0..num_dst).filter(|&d| type_of(d) == dt) {
                        let from: Vec<u32> = (0..num_src).filter(|&s| type_of(s) == st).collect();
                        for _ in 0..next(4) {
                            src.push(from[next(from.len() as u32) as usize]);
                            dst.push(d);
                        }
                    }
                    relations.push(src.len() as u32);
                }
                Block {
                    num_src,
                    num_dst,
                    src,
                    dst,
                    relations,
                }
            })
            .collect();
        let top = BatchTable {
            num_inputs: 40,
            input_nodes,
            blocks,
            ..Default::default()
        };
        (schema, top)
    }

    /// With the cache holding exactly the rows the full batch computes,
    /// the pruned batch (its unread inputs zero, only the edges into
    /// computed nodes kept, the cached rows laid in) gives the full
    /// batch's logits; its update admits the nodes with the smallest
    /// gradients, with the rows the batch computed for them.
    #[test]
    fn pruned_typed_batches_with_exact_cached_rows_give_the_full_logits() {
        let kinds = [
            (RelationalKind::Rsage, false),
            (RelationalKind::Rsage, true),
            (RelationalKind::Rgat, false),
        ];
        for (kind, root_weight) in kinds {
            for seed in 0..4u64 {
                tch::manual_seed(seed as i64);
                let (schema, top) = random_batch(seed);
                let vs = nn::VarStore::new(Device::Cpu);
                let cfg = RgnnConfig {
                    kind,
                    in_dims: vec![Some(5), Some(3)],
                    hidden: 8,
                    classes: 3,
                    layers: 3,
                    heads: 2,
                    dropout: 0.0,
                    root_weight,
                    init: Default::default(),
                    scorer: None,
                };
                let model = Rgnn::new(&vs.root(), &schema, &cfg).unwrap();
                let full_blocks =
                    TypedBlocks::new(&schema, &top.input_nodes, &top.blocks, Device::Cpu).unwrap();
                let x: Vec<Tensor> = [5, 3]
                    .iter()
                    .zip(&full_blocks.num_inputs)
                    .map(|(&d, &n)| Tensor::randn([n, d], (Kind::Float, Device::Cpu)))
                    .collect();
                let mut levels: Vec<Vec<Tensor>> = Vec::new();
                let full = model
                    .output_levels(Inputs::Rows(&x), &full_blocks, true, &mut |_, h| {
                        levels.push(h.iter().map(Tensor::detach).collect());
                        Ok(h)
                    })
                    .unwrap();
                // Every third node of each level is cached (by position).
                let pruned =
                    crate::historical::prune(&top.blocks, |l, p| (p + l as u32).is_multiple_of(3));
                assert!(pruned.inputs.len() < 40, "something pruned");
                let at: Vec<(usize, i64)> = {
                    let mut rows = [0i64; 2];
                    top.input_nodes
                        .iter()
                        .map(|&v| {
                            let t = usize::from(v >= 100);
                            rows[t] += 1;
                            (t, rows[t] - 1)
                        })
                        .collect()
                };
                let cached_rows = pruned
                    .levels
                    .iter()
                    .enumerate()
                    .map(|(l, lv)| {
                        let mut rows = Vec::new();
                        for &p in &lv.cached {
                            let (t, row) = at[p as usize];
                            rows.extend(Vec::<f32>::try_from(&levels[l][t].get(row)).unwrap());
                        }
                        rows
                    })
                    .collect();
                let nodes = pruned
                    .levels
                    .iter()
                    .map(|lv| {
                        lv.positions
                            .iter()
                            .map(|&p| top.input_nodes[p as usize])
                            .collect()
                    })
                    .collect();
                let plan = Plan {
                    step: 0,
                    pruned,
                    nodes,
                    cached_rows,
                };
                let p = typed(plan, &top, &schema).unwrap();
                // The rows the pruned batch does not read are zeros.
                let kept_x: Vec<Tensor> = x
                    .iter()
                    .zip(&p.inputs)
                    .map(|(x, rows)| {
                        let mut keep = vec![0f32; x.size()[0] as usize];
                        for &r in rows {
                            keep[r as usize] = 1.0;
                        }
                        x * Tensor::from_slice(&keep).unsqueeze(1)
                    })
                    .collect();
                let blocks =
                    TypedBlocks::new(&schema, &top.input_nodes, &p.blocks, Device::Cpu).unwrap();
                let mut kept = Vec::new();
                let logits = model
                    .output_levels(
                        Inputs::Rows(&kept_x),
                        &blocks,
                        true,
                        &mut p.plan.lay_in(&mut kept),
                    )
                    .unwrap();
                let diff = (&logits - &full).abs().max().double_value(&[]);
                assert!(
                    diff < 1e-5,
                    "{kind:?} {root_weight} seed {seed}: differs by {diff}"
                );
                logits.sum(Kind::Float).backward();
                let h = Historical::new(
                    HistoricalConfig {
                        p_grad: 0.5,
                        ..Default::default()
                    },
                    2,
                    8,
                    1,
                );
                h.begin(0);
                // Lookups go in step order: step 0's first.
                assert!(h.lookup(0, &top.blocks, &top.input_nodes).is_some());
                publish(&h, 0, Some(&p.plan), &kept).unwrap();
                // Step 1 (one behind) sees step 0's admissions: each with
                // the row the full batch computed for that node.
                let next = h.lookup(1, &top.blocks, &top.input_nodes).unwrap();
                let mut admitted = 0;
                for (l, lv) in next.pruned.levels.iter().enumerate() {
                    let dim = 8;
                    for (i, &q) in lv.cached.iter().enumerate() {
                        let (t, row) = at[q as usize];
                        let want = Vec::<f32>::try_from(&levels[l][t].get(row)).unwrap();
                        let got = &next.cached_rows[l][i * dim..(i + 1) * dim];
                        let close = want.iter().zip(got).all(|(a, b)| (a - b).abs() < 1e-5);
                        assert!(close, "level {}: {want:?} {got:?}", l + 1);
                        admitted += 1;
                    }
                }
                assert!(admitted > 0, "{kind:?} seed {seed}: nothing admitted");
            }
        }
    }
}
