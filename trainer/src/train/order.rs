//! Which batches an epoch trains, in what order, and which rank trains
//! each: epoch `t` trains sampled epoch `t mod E`, reshuffled past the
//! sampled epochs; a data-parallel world deals each rank a share; and
//! dropout draws are seeded by a batch's place in the epoch's order.

use offgnn_manifests::{BatchRef, Split};
use rand::SeedableRng;
use rand::seq::SliceRandom;

use super::config::TrainConfig;
use crate::distributed;

/// Training order of epoch `t`: past the sampled epochs reshuffled, unless
/// the order is `kept` (a CPU cache that follows the sampled order).
fn epoch_order(schedule: &[Vec<BatchRef>], t: u32, seed: u64, kept: bool) -> (u32, Vec<BatchRef>) {
    let sampled = t % schedule.len() as u32;
    let mut order = schedule[sampled as usize].clone();
    if t as usize >= schedule.len() && !kept {
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(seed ^ (0x0E90_C000 + t as u64));
        order.shuffle(&mut rng);
    }
    (sampled, order)
}

/// The seed of the dropout draws of the batch at `position` of epoch `t`.
pub(crate) fn batch_seed(seed: u64, t: u32, position: u64) -> i64 {
    let mut x = seed ^ 0x5EED_0000_0000_0000 ^ ((t as u64) << 32) ^ position;
    // splitmix64's finaliser: nearby inputs give unrelated seeds.
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (x ^ (x >> 31)) as i64
}

/// The positions into epoch `t`'s order (of `n` batches) that `rank` trains,
/// one per step. One process trains the whole order (shuffled past the
/// sampled epochs by [`epoch_order`]); ranks of a larger world are dealt
/// contiguous shares of the sampled order ([`distributed::deal`]), each
/// shuffled on its own past the sampled epochs.
fn rank_positions(
    n: usize,
    world: u32,
    rank: u32,
    t: u32,
    sampled: usize,
    seed: u64,
) -> Vec<usize> {
    if world == 1 {
        return (0..n).collect();
    }
    let mut share = distributed::deal(n, world as usize, rank as usize);
    if t as usize >= sampled {
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(
            seed ^ (0x0E90_C000 + t as u64) ^ ((rank as u64 + 1) << 40),
        );
        share.shuffle(&mut rng);
    }
    share
}

/// The segments that `ranks` of a world of `world` read in a run: their
/// shares of every sampled epoch's training batches (later epochs reuse
/// them) and of the evaluation batches. A machine stages only these.
pub fn segments_read(
    m: &offgnn_manifests::Manifest,
    ranks: std::ops::Range<u32>,
    world: u32,
    max_batches: Option<usize>,
) -> std::collections::BTreeSet<u32> {
    let mut read = std::collections::BTreeSet::new();
    for rank in ranks {
        for epoch in m.schedule.get(&Split::Train).into_iter().flatten() {
            let n = max_batches.map_or(epoch.len(), |k| k.min(epoch.len()));
            // A share's set of batches, whatever order it trains them in.
            for pos in distributed::deal(n, world as usize, rank as usize) {
                read.insert(epoch[pos].segment);
            }
        }
        for split in [Split::Valid, Split::Test] {
            if let Some(refs) = m.schedule.get(&split).and_then(|e| e.first()) {
                let part = distributed::eval_share(refs.len(), world as usize, rank as usize);
                read.extend(refs[part].iter().map(|b| b.segment));
            }
        }
    }
    read
}

/// The batches of `split` that `rank` of a world of `world` reads in epoch
/// `t`, in the order the trainer reads them: training batches as
/// [`EpochPlan`] orders and deals them (`kept` as there), evaluation
/// batches the rank's share of the first sampled epoch (every epoch
/// evaluates the same ones). Empty where the layout has none.
pub fn split_order(
    m: &offgnn_manifests::Manifest,
    split: Split,
    t: u32,
    seed: u64,
    kept: bool,
    (world, rank): (u32, u32),
) -> Vec<BatchRef> {
    let Some(schedule) = m.schedule.get(&split).filter(|s| !s.is_empty()) else {
        return Vec::new();
    };
    if split != Split::Train {
        let refs = &schedule[0];
        let part = distributed::eval_share(refs.len(), world as usize, rank as usize);
        return refs[part].to_vec();
    }
    let (_, order) = if world == 1 {
        epoch_order(schedule, t, seed, kept)
    } else {
        let sampled = t % schedule.len() as u32;
        (sampled, schedule[sampled as usize].clone())
    };
    rank_positions(order.len(), world, rank, t, schedule.len(), seed)
        .into_iter()
        .map(|pos| order[pos])
        .collect()
}

/// What epoch `t` trains on this process.
pub(super) struct EpochPlan {
    /// The sampled epoch whose batches it trains.
    pub(super) sampled: u32,
    /// Those batches in the epoch's order (at most `--max-batches`).
    pub(super) order: Vec<BatchRef>,
    /// Each local rank's positions into `order`, one per step.
    pub(super) shares: Vec<Vec<usize>>,
    /// Steps in the epoch.
    pub(super) steps: usize,
}

impl EpochPlan {
    /// The plan of epoch `t` for the ranks `local` of a world of `world`;
    /// one process keeps the sampled order past the sampled epochs where
    /// `kept` (a CPU cache that follows it).
    pub(super) fn of(
        schedule: &[Vec<BatchRef>],
        t: u32,
        cfg: &TrainConfig,
        (world, local): (u32, &[u32]),
        kept: bool,
    ) -> EpochPlan {
        let (sampled, mut order) = if world == 1 {
            epoch_order(schedule, t, cfg.seed, kept)
        } else {
            let sampled = t % schedule.len() as u32;
            (sampled, schedule[sampled as usize].clone())
        };
        if let Some(k) = cfg.max_batches {
            order.truncate(k);
        }
        let shares: Vec<Vec<usize>> = local
            .iter()
            .map(|&r| rank_positions(order.len(), world, r, t, schedule.len(), cfg.seed))
            .collect();
        let steps = shares.first().map_or(0, Vec::len);
        EpochPlan {
            sampled,
            order,
            shares,
            steps,
        }
    }

    /// The batches in the order this process trains them from step `skip`
    /// on: step by step, each local rank's batch of the step; each with its
    /// position in the epoch's order.
    pub(super) fn batches_from(&self, skip: usize) -> Vec<(BatchRef, usize)> {
        (skip..self.steps)
            .flat_map(|s| self.shares.iter().map(move |share| share[s]))
            .map(|pos| (self.order[pos], pos))
            .collect()
    }
}
