//! A training batch's forward and backward pass with the historical cache
//! (FreshGNN §4): the pruned batch computes only the nodes its cached
//! embeddings do not stand in for; after the backward pass, each level's
//! embedding gradients decide what the cache admits and evicts, and the
//! update goes to the cache for the batches `lag` steps on.

use tch::{Device, Kind, TchError, Tensor};

use crate::historical::{Historical, LevelUpdate, Plan, decide};
use crate::model::Gnn;

/// A plan's indices and cached rows on the training device.
struct PlanTensors {
    /// Input rows of the pruned block 0, in its order.
    inputs: Tensor,
    /// Per level: `[computed; cached]` rows in the next block's order, and
    /// the cached rows.
    gather: Vec<Tensor>,
    cached: Vec<Tensor>,
}

impl PlanTensors {
    fn new(plan: &Plan, dim: i64, device: Device) -> Result<Self, TchError> {
        let idx = |v: &[i64]| Tensor::from_slice(v).f_to_device(device);
        let inputs: Vec<i64> = plan.pruned.inputs.iter().map(|&p| i64::from(p)).collect();
        let mut gather = Vec::new();
        let mut cached = Vec::new();
        for (lv, rows) in plan.pruned.levels.iter().zip(&plan.cached_rows) {
            gather.push(idx(&lv.gather)?);
            cached.push(
                Tensor::from_slice(rows)
                    .f_view([lv.cached.len() as i64, dim])?
                    .f_to_device(device)?,
            );
        }
        Ok(PlanTensors {
            inputs: idx(&inputs)?,
            gather,
            cached,
        })
    }
}

/// The batch's logits through the pruned blocks, the cached rows laid in
/// at each level; returns them with each level's embeddings (detached)
/// and the zero leaf added to them, whose gradient after the backward pass
/// is the embeddings' gradient.
pub(super) fn forward(
    net: &dyn Gnn,
    x: &Tensor,
    blocks: &[crate::model::BlockTensors],
    plan: &Plan,
    dim: i64,
) -> Result<(Tensor, Vec<(Tensor, Tensor)>), TchError> {
    let t = PlanTensors::new(plan, dim, x.device())?;
    let x = x.f_index_select(0, &t.inputs)?;
    let mut levels = Vec::with_capacity(t.gather.len());
    let logits = net.forward_levels(&x, blocks, true, &mut |l, computed| {
        let cached = t.cached[l - 1].f_to_kind(computed.kind())?;
        let full = Tensor::f_cat(&[computed, cached], 0)?.f_index_select(0, &t.gather[l - 1])?;
        let leaf = full.f_zeros_like()?.set_requires_grad(true);
        let out = full.f_add(&leaf)?;
        levels.push((full.f_detach()?, leaf));
        Ok(out)
    })?;
    Ok((logits, levels))
}

/// After the backward pass: each level's admissions (the `p_grad` fraction
/// of its nodes with the smallest embedding gradient, newly computed ones
/// with their embedding) and evictions (the rest), published for `step`.
pub(super) fn publish(
    h: &Historical,
    step: u64,
    plan: &Plan,
    levels: &[(Tensor, Tensor)],
) -> Result<(), TchError> {
    let mut updates = Vec::with_capacity(levels.len());
    for (l, (full, leaf)) in levels.iter().enumerate() {
        let lv = &plan.pruned.levels[l];
        let nodes = &plan.nodes[l];
        let norms = leaf
            .grad()
            .f_norm_scalaropt_dim(2, [1i64].as_slice(), false)?
            .f_to_kind(Kind::Float)?
            .f_to_device(Device::Cpu)?;
        let norms = Vec::<f32>::try_from(&norms)?;
        let from_cache: Vec<bool> = lv
            .gather
            .iter()
            .map(|&g| g as usize >= lv.computed.len())
            .collect();
        let (admit, evict) = decide(&norms, &from_cache, h.config().p_grad);
        let picked: Vec<i64> = admit.iter().map(|&i| i as i64).collect();
        let rows = full
            .f_index_select(0, &Tensor::from_slice(&picked).f_to_device(full.device())?)?
            .f_to_kind(Kind::Float)?
            .f_to_device(Device::Cpu)?
            .f_contiguous()?;
        updates.push(LevelUpdate {
            admit: admit.iter().map(|&i| nodes[i]).collect(),
            rows: Vec::<f32>::try_from(&rows.f_flatten(0, -1)?)?,
            evict: evict.iter().map(|&i| nodes[i]).collect(),
        });
    }
    h.publish(step, updates);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::historical::{HistoricalConfig, prune};
    use crate::model::{ModelConfig, ModelKind, build};
    use offgnn_shared::address_table::BatchTable;
    use offgnn_shared::samples::Block;
    use tch::nn;

    /// Three random blocks over levels of 40, 20, 8 and 3 nodes.
    fn random_blocks(seed: u64) -> Vec<Block> {
        let sizes = [40u32, 20, 8, 3];
        let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        let mut next = |n: u32| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % u64::from(n)) as u32
        };
        (0..3)
            .map(|k| {
                let (num_src, num_dst) = (sizes[k], sizes[k + 1]);
                let (mut src, mut dst) = (Vec::new(), Vec::new());
                for d in 0..num_dst {
                    for _ in 0..1 + next(4) {
                        src.push(next(num_src));
                        dst.push(d);
                    }
                }
                Block {
                    num_src,
                    num_dst,
                    src,
                    dst,
                    relations: Vec::new(),
                }
            })
            .collect()
    }

    /// With the cache holding exactly the embeddings the full batch
    /// computes, the pruned batch's logits equal the full batch's: the
    /// pruning, the relabelled blocks and the laying in of cached rows
    /// change what is computed, not its value.
    #[test]
    fn pruned_batches_with_exact_cached_rows_give_the_full_batch_logits() {
        for kind in [ModelKind::Sage, ModelKind::Gat] {
            for seed in 0..5u64 {
                tch::manual_seed(seed as i64);
                let vs = nn::VarStore::new(Device::Cpu);
                let cfg = ModelConfig {
                    kind,
                    in_dim: 5,
                    hidden: 8,
                    classes: 3,
                    layers: 3,
                    heads: 2,
                    dropout: 0.0,
                    scorer: None,
                };
                let net = build(&vs.root(), &cfg);
                let blocks = random_blocks(seed);
                let x = Tensor::randn([40, 5], (Kind::Float, Device::Cpu));
                let graph = |blocks: Vec<Block>| {
                    let t = BatchTable {
                        blocks,
                        ..Default::default()
                    };
                    crate::pipeline::graph(&t, Device::Cpu).unwrap().blocks
                };
                let mut levels = Vec::new();
                let full = net
                    .forward_levels(&x, &graph(blocks.clone()), true, &mut |_, h| {
                        levels.push(h.detach());
                        Ok(h)
                    })
                    .unwrap();
                // Every third node of each level is cached (by position).
                let pruned = prune(&blocks, |l, p| (p + l as u32).is_multiple_of(3));
                assert!(pruned.inputs.len() < 40, "something pruned");
                let cached_rows = pruned
                    .levels
                    .iter()
                    .enumerate()
                    .map(|(l, lv)| {
                        let idx: Vec<i64> = lv.cached.iter().map(|&p| i64::from(p)).collect();
                        let rows = levels[l].index_select(0, &Tensor::from_slice(&idx));
                        Vec::<f32>::try_from(&rows.flatten(0, -1)).unwrap()
                    })
                    .collect();
                let nodes = pruned
                    .levels
                    .iter()
                    .map(|lv| lv.positions.clone())
                    .collect();
                let blocks_t = graph(pruned.blocks.clone());
                let plan = Plan {
                    step: 0,
                    pruned,
                    nodes,
                    cached_rows,
                };
                let (logits, kept) = forward(net.as_ref(), &x, &blocks_t, &plan, 8).unwrap();
                let diff = (&logits - &full).abs().max().double_value(&[]);
                assert!(diff < 1e-5, "{kind:?} seed {seed}: differs by {diff}");
                // The backward pass gives each level's nodes a gradient, and
                // the update admits the smallest half.
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
                publish(&h, 0, &plan, &kept).unwrap();
                for (l, (full_l, leaf)) in kept.iter().enumerate() {
                    assert_eq!(leaf.grad().size(), full_l.size());
                    assert_eq!(full_l.size()[0] as usize, plan.nodes[l].len());
                }
            }
        }
    }
}
