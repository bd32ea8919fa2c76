//! FreshGNN's historical cache (`--historical`, [`crate::historical`]) on
//! typed batches. The cache is the homogeneous one: one per level, keyed
//! by homogenized node id, every type's embeddings `hidden` wide. A batch
//! is pruned against it on its homogenized blocks, as a homogeneous one
//! is, and then typed level by level: each type reads and computes only
//! its nodes the pruned batch still needs, and between two layers each
//! type's rows are its computed nodes' and its cached nodes', laid out in
//! the next block's order. After the backward pass each level's gradients
//! decide what the cache admits and evicts, as for homogeneous batches.

use offgnn_shared::address_table::BatchTable;
use tch::{Device, Kind, TchError, Tensor};

use super::{Schema, TypedBlocks};
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
    check(cfg, model, ranks.world())?;
    let shape = (model.layers - 1, model.hidden as usize, LAG);
    crate::historical::for_run(h, ranks.world(), shape).map(Some)
}

/// Refuses `--historical` where it does not apply: a model without levels
/// between layers, and a run of several ranks.
pub(crate) fn check(
    cfg: &super::train::TypedTrainConfig,
    model: &super::RgnnConfig,
    world: u32,
) -> Result<()> {
    if cfg.historical.is_none() {
        return Ok(());
    }
    if model.layers < 2 {
        return Err(Error::InvalidArgument(
            "--historical caches embeddings between layers: it needs a layout sampled with at least 2 layers (--fanout)".into(),
        ));
    }
    if world > 1 {
        return Err(Error::InvalidArgument(
            crate::historical::ONE_PROCESS.into(),
        ));
    }
    Ok(())
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
    /// Each type's input rows the pruned batch reads, as rows of its
    /// assembled matrix, in the pruned order.
    inputs: Vec<Vec<u32>>,
    /// Per level, per type: the level's rows as rows of `[computed;
    /// cached]` (the block below's outputs, then the cached rows), and
    /// which of the level's cached rows are the type's.
    gather: Vec<Vec<(Vec<i64>, Vec<i64>)>>,
    /// Per level: each of its nodes' type, in the level's order.
    types: Vec<Vec<usize>>,
}

/// What pruning a typed batch gives its fetch.
pub(super) struct Pruned {
    pub(super) plan: TypedPlan,
    /// The pruned blocks, typed.
    pub(super) blocks: TypedBlocks,
    /// Each type's inputs in the whole batch (its table's rows).
    pub(super) rows: Vec<i64>,
}

/// Training step `step`'s batch `top` pruned against `h` (none in the
/// stabilization period, or once the run was released).
pub(super) fn prune(
    h: &Historical,
    step: u64,
    top: &BatchTable,
    schema: &Schema,
    device: Device,
) -> Result<Option<Pruned>> {
    match h.lookup(step, &top.blocks, &top.input_nodes) {
        Some(plan) => Ok(Some(typed(plan, top, schema, device)?)),
        None => Ok(None),
    }
}

/// The typed batch `top` as `plan` prunes its homogenized blocks.
fn typed(mut plan: Plan, top: &BatchTable, schema: &Schema, device: Device) -> Result<Pruned> {
    let types = schema.types.len();
    let mut rows = vec![0i64; types];
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
    let mut inputs = vec![Vec::new(); types];
    for &p in &plan.pruned.inputs {
        let (t, row) = at[p as usize];
        inputs[t].push(row as u32);
    }
    let mut gather = Vec::with_capacity(plan.pruned.levels.len());
    let mut level_types = Vec::with_capacity(plan.pruned.levels.len());
    // Each computed and cached node's place among its type's, by input
    // position (a level's nodes are a prefix of the inputs).
    let mut place = vec![0i64; at.len()];
    for lv in &plan.pruned.levels {
        let (mut computed, mut cached) = (vec![0i64; types], vec![Vec::new(); types]);
        for &p in &lv.computed {
            let t = at[p as usize].0;
            place[p as usize] = computed[t];
            computed[t] += 1;
        }
        for (i, &p) in lv.cached.iter().enumerate() {
            let t = at[p as usize].0;
            place[p as usize] = computed[t] + cached[t].len() as i64;
            cached[t].push(i as i64);
        }
        let mut per_type: Vec<(Vec<i64>, Vec<i64>)> =
            cached.into_iter().map(|c| (Vec::new(), c)).collect();
        let mut of = Vec::with_capacity(lv.positions.len());
        for &p in &lv.positions {
            let t = at[p as usize].0;
            per_type[t].0.push(place[p as usize]);
            of.push(t);
        }
        gather.push(per_type);
        level_types.push(of);
    }
    let pruned = std::mem::take(&mut plan.pruned.blocks);
    let mut orders: Vec<&[u32]> = vec![&plan.pruned.inputs];
    orders.extend(plan.pruned.levels.iter().map(|lv| lv.positions.as_slice()));
    let blocks = TypedBlocks::pruned(schema, &top.input_nodes, &orders, &pruned, device)?;
    Ok(Pruned {
        plan: TypedPlan {
            plan,
            inputs,
            gather,
            types: level_types,
        },
        blocks,
        rows,
    })
}

/// One level's rows as the forward pass left them, for the update: each
/// type's rows (detached), and the zero leaf added to them whose gradient
/// is theirs.
pub(crate) type LevelRows = Vec<(Tensor, Tensor)>;

impl TypedPlan {
    /// Type `t`'s input rows the pruned batch reads, as rows of its
    /// assembled matrix (and of its table).
    pub(crate) fn inputs(&self, t: usize) -> &[u32] {
        &self.inputs[t]
    }

    /// Type `t`'s assembled rows `x`, those the pruned batch reads.
    pub(crate) fn select(&self, t: usize, x: &Tensor) -> Result<Tensor, TchError> {
        let rows: Vec<i64> = self.inputs[t].iter().map(|&r| i64::from(r)).collect();
        x.f_index_select(0, &Tensor::from_slice(&rows).f_to_device(x.device())?)
    }

    /// The level hook of [`super::Rgnn::output_levels`]: at each level,
    /// each type's rows laid out from the block below's outputs and the
    /// cached rows, and a zero leaf added to them; `kept` gets each
    /// level's rows and leaves.
    pub(crate) fn lay_in<'a>(
        &'a self,
        kept: &'a mut Vec<LevelRows>,
    ) -> impl FnMut(usize, Vec<Tensor>) -> Result<Vec<Tensor>, TchError> + 'a {
        move |l, h| {
            let lv = &self.plan.pruned.levels[l - 1];
            let rows = &self.plan.cached_rows[l - 1];
            let dim = h.first().map_or(0, |x| x.size()[1]);
            let device = h.first().map_or(Device::Cpu, Tensor::device);
            let cached = Tensor::from_slice(rows)
                .f_view([lv.cached.len() as i64, dim])?
                .f_to_device(device)?;
            let mut level = Vec::with_capacity(h.len());
            let mut out = Vec::with_capacity(h.len());
            for (x, (order, mine)) in h.into_iter().zip(&self.gather[l - 1]) {
                let on = |v: &[i64]| Tensor::from_slice(v).f_to_device(device);
                let from_cache = cached.f_index_select(0, &on(mine)?)?.f_to_kind(x.kind())?;
                let full = Tensor::f_cat(&[x, from_cache], 0)?.f_index_select(0, &on(order)?)?;
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
        let host = |x: &Tensor| -> Result<Vec<f32>> {
            let x = x.f_to_kind(Kind::Float)?.f_to_device(Device::Cpu)?;
            Ok(Vec::<f32>::try_from(&x.f_contiguous()?.f_flatten(0, -1)?)?)
        };
        let mut updates = Vec::with_capacity(kept.len());
        for (l, level) in kept.iter().enumerate() {
            let lv = &self.plan.pruned.levels[l];
            let (mut norms, mut embeddings) = (Vec::new(), Vec::new());
            for (full, leaf) in level {
                let grad = leaf.grad();
                norms.push(if grad.defined() {
                    host(&grad.f_norm_scalaropt_dim(2, [1i64].as_slice(), false)?)?
                } else {
                    vec![0.0; full.size()[0] as usize]
                });
                embeddings.push(host(full)?);
            }
            let dim = level.first().map_or(0, |(f, _)| f.size()[1] as usize);
            // The level's nodes in order: each one's type and its row
            // among that type's.
            let mut next = vec![0usize; level.len()];
            let place: Vec<(usize, usize)> = self.types[l]
                .iter()
                .map(|&t| {
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
    use offgnn_shared::samples::Block;
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
    /// the pruned batch (its kept input rows only, its blocks relabelled
    /// level by level, the cached rows laid in) gives the full batch's
    /// logits; its update admits the nodes with the smallest gradients,
    /// with the rows the batch computed for them.
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
                let p = typed(plan, &top, &schema, Device::Cpu).unwrap();
                // The pruned batch reads its kept rows only.
                let kept_x: Vec<Tensor> = x
                    .iter()
                    .enumerate()
                    .map(|(t, x)| p.plan.select(t, x).unwrap())
                    .collect();
                assert!(kept_x[0].size()[0] + kept_x[1].size()[0] < 40);
                let mut kept = Vec::new();
                let logits = model
                    .output_levels(
                        Inputs::Rows(&kept_x),
                        &p.blocks,
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
