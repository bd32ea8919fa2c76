//! Ginex's optimal CPU cache (ginex.txt §3.3–3.4), in a packed layout.
//!
//! The packer knows every training batch of every sampled epoch and the
//! order the trainer reads them in, so the CPU tier can follow Belady's
//! policy instead of holding the same rows throughout: each epoch starts
//! from the static tier's rows (the most read ones), and after each batch
//! the rows it read from disk replace cached rows that are read again
//! later than they are, never one read sooner. Within an epoch this keeps
//! the fewest rows to read from disk that any cache of the tier's size
//! can (Belady's MIN, with bypass).
//!
//! The trainer applies what this computes: a training batch's hits are
//! CPU-cache slots in its address table, its admissions (Ginex's
//! changeset: `in_ids` and `in_positions`; the evicted row is the slot's
//! previous one) follow the addresses, and at an epoch's end the trainer
//! restores the slots whose rows changed from the tier's object, so that
//! evaluation and the next epoch find the static rows again. The rows a
//! batch misses go to its disk cache or packed chunk like any other, so
//! the layout shrinks with the reads.

use std::collections::BinaryHeap;

use offgnn_shared::dataset::Split;
use rayon::prelude::*;

use crate::access_rank::{Location, Tiers};
use crate::plan::BatchInfo;

/// Read again never (within the epoch).
const NEVER: u32 = u32::MAX;
/// Not cached.
const NONE: u32 = u32::MAX;

/// One training batch's use of a CPU cache that follows the batch order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchCpu {
    /// `(node, slot)` of the batch's inputs the cache holds when the batch
    /// is assembled, sorted by node.
    pub hits: Vec<(u32, u32)>,
    /// `(node, slot)`: rows the batch reads from disk that go into the
    /// cache after it is assembled, each replacing the slot's row.
    pub admits: Vec<(u32, u32)>,
}

/// What each policy reads from disk over the sampled epochs' training
/// batches: the rows neither cache holds when a batch needs them (and
/// their bytes), and for Belady also what restoring the changed slots at
/// each epoch's end reads: the 4 KiB pages of the tier's object that hold
/// them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Forecast {
    pub static_rows: u64,
    pub belady_rows: u64,
    pub restore_rows: u64,
    pub static_bytes: u64,
    pub belady_bytes: u64,
    pub restore_bytes: u64,
}

impl Forecast {
    /// Bytes Belady reads in all, restores included.
    pub fn belady_total(&self) -> u64 {
        self.belady_bytes + self.restore_bytes
    }
}

/// Simulates Belady's policy over every sampled epoch's training batches
/// (in the plan's order, which is the trainer's), each epoch from the
/// static CPU tier of `tiers`. `batches` still hold their inputs. Returns
/// each batch's use of the cache (`None` for evaluation batches, which
/// read the static tier) and the forecast of both policies.
pub fn simulate(
    batches: &[BatchInfo],
    tiers: &Tiers,
    row_bytes: u64,
) -> (Vec<Option<BatchCpu>>, Forecast) {
    let mut out: Vec<Option<BatchCpu>> = vec![None; batches.len()];
    let mut fc = Forecast::default();
    let mut epochs: Vec<u32> = batches
        .iter()
        .filter(|b| b.split == Split::Train)
        .map(|b| b.epoch)
        .collect();
    epochs.sort_unstable();
    epochs.dedup();
    let num_nodes = tiers.num_nodes();
    let mut sim = Simulator::new(num_nodes, tiers.cpu_nodes());
    for e in epochs {
        let ids: Vec<usize> = (0..batches.len())
            .filter(|&i| batches[i].split == Split::Train && batches[i].epoch == e)
            .collect();
        // Each batch's inputs that the GPU cache does not hold, sorted.
        let access: Vec<Vec<u32>> = ids
            .par_iter()
            .map(|&i| {
                let mut a: Vec<u32> = batches[i]
                    .inputs
                    .iter()
                    .copied()
                    .filter(|&v| !matches!(tiers.locate(v), Location::Gpu(_)))
                    .collect();
                a.sort_unstable();
                a
            })
            .collect();
        fc.static_rows += access
            .iter()
            .flatten()
            .filter(|&&v| tiers.locate(v) == Location::Disk)
            .count() as u64;
        let (used, misses, restores) = sim.epoch(&access);
        fc.belady_rows += misses;
        fc.restore_rows += restores;
        fc.restore_bytes += sim.restore_pages(row_bytes) * PAGE;
        for (i, u) in ids.into_iter().zip(used) {
            out[i] = Some(u);
        }
    }
    fc.static_bytes = fc.static_rows * row_bytes;
    fc.belady_bytes = fc.belady_rows * row_bytes;
    (out, fc)
}

/// The unit the trainer reads a restore in.
const PAGE: u64 = 4096;

/// The cache's state and the per-node tables the simulation reuses from
/// epoch to epoch.
struct Simulator<'a> {
    /// The static tier's node of each slot: every epoch's first state.
    initial: &'a [u32],
    /// Per node: its slot, or [`NONE`].
    slot_of: Vec<u32>,
    /// Per slot: its node, and the batch that reads it next ([`NEVER`]).
    node: Vec<u32>,
    next: Vec<u32>,
    /// Per node: the next batch (of those walked so far, backwards) that
    /// reads it; [`NEVER`] elsewhere.
    seen: Vec<u32>,
}

impl<'a> Simulator<'a> {
    fn new(num_nodes: u64, initial: &'a [u32]) -> Simulator<'a> {
        Simulator {
            initial,
            slot_of: vec![NONE; num_nodes as usize],
            node: Vec::new(),
            next: Vec::new(),
            seen: vec![NEVER; num_nodes as usize],
        }
    }

    /// One epoch of batches reading `access` (sorted node lists), from the
    /// static state: each batch's hits and admissions, the rows missed,
    /// and the slots whose rows differ from the static ones at the end.
    fn epoch(&mut self, access: &[Vec<u32>]) -> (Vec<BatchCpu>, u64, u64) {
        // Each access's next reading batch, by one backward walk.
        let mut next_use: Vec<Vec<u32>> = vec![Vec::new(); access.len()];
        for (k, a) in access.iter().enumerate().rev() {
            next_use[k] = a.iter().map(|&v| self.seen[v as usize]).collect();
            for &v in a {
                self.seen[v as usize] = k as u32;
            }
        }
        // The epoch's first state: the static rows, keyed by first use.
        self.node = self.initial.to_vec();
        self.next = self.node.iter().map(|&v| self.seen[v as usize]).collect();
        for (s, &v) in self.node.iter().enumerate() {
            self.slot_of[v as usize] = s as u32;
        }
        for a in access {
            for &v in a {
                self.seen[v as usize] = NEVER;
            }
        }
        // A max-heap of (next use, changed, slot): the row read again
        // furthest ahead goes first and, of rows read again equally far
        // (above all never), one in a slot changed already, which costs
        // no restore. Stale entries are skipped when they surface, and the
        // heap rebuilt when they outnumber the slots.
        let mut heap: BinaryHeap<(u32, bool, u32)> = self.keys().collect();
        let (mut used, mut misses) = (Vec::with_capacity(access.len()), 0u64);
        let mut missed: Vec<(u32, u32)> = Vec::new();
        for (a, nexts) in access.iter().zip(&next_use) {
            let mut u = BatchCpu::default();
            missed.clear();
            for (&v, &n) in a.iter().zip(nexts) {
                match self.slot_of[v as usize] {
                    NONE => missed.push((n, v)),
                    s => {
                        u.hits.push((v, s));
                        self.next[s as usize] = n;
                        heap.push((n, self.changed(s), s));
                    }
                }
            }
            misses += missed.len() as u64;
            // The sooner a missed row is read again, the more it is worth:
            // each admitted one replaces the cached row read furthest ahead.
            missed.sort_unstable();
            for &(n, v) in &missed {
                if n == NEVER || self.node.is_empty() {
                    break;
                }
                let (far, changed, s) = loop {
                    let top = heap.pop().expect("one entry per slot at least");
                    if self.next[top.2 as usize] == top.0 && self.changed(top.2) == top.1 {
                        break top;
                    }
                };
                if n >= far {
                    heap.push((far, changed, s));
                    break;
                }
                self.slot_of[self.node[s as usize] as usize] = NONE;
                self.node[s as usize] = v;
                self.slot_of[v as usize] = s;
                self.next[s as usize] = n;
                heap.push((n, self.changed(s), s));
                u.admits.push((v, s));
            }
            if heap.len() > 4 * self.node.len() + 1024 {
                heap = self.keys().collect();
            }
            used.push(u);
        }
        let dirty = self
            .node
            .iter()
            .zip(self.initial)
            .filter(|(a, b)| a != b)
            .count() as u64;
        for &v in &self.node {
            self.slot_of[v as usize] = NONE;
        }
        (used, misses, dirty)
    }

    /// Every slot's (next use, changed, slot).
    fn keys(&self) -> impl Iterator<Item = (u32, bool, u32)> + '_ {
        (0..self.next.len() as u32).map(|s| (self.next[s as usize], self.changed(s), s))
    }

    /// Whether slot `s` holds another row than the static one.
    fn changed(&self, s: u32) -> bool {
        self.node[s as usize] != self.initial[s as usize]
    }

    /// The 4 KiB pages of the tier's object (rows of `row_bytes` from its
    /// start) that hold a slot changed in the last epoch.
    fn restore_pages(&self, row_bytes: u64) -> u64 {
        let mut pages = 0u64;
        let mut last: Option<u64> = None;
        for s in (0..self.node.len() as u32).filter(|&s| self.changed(s)) {
            let first = u64::from(s) * row_bytes / PAGE;
            let end = (u64::from(s) + 1) * row_bytes - 1;
            let from = last.map_or(first, |l| first.max(l + 1));
            pages += (end / PAGE + 1).saturating_sub(from);
            last = Some(last.map_or(end / PAGE, |l| l.max(end / PAGE)));
        }
        pages
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Belady's MIN by brute force: after each batch, the cache holds the
    /// `capacity` rows of (cache ∪ batch) read again soonest (never-again
    /// rows last), which is what the simulation must reach batch by
    /// batch: its misses count, which no policy beats.
    fn brute_misses(initial: &[u32], access: &[Vec<u32>]) -> u64 {
        let next = |v: u32, after: usize| {
            (after + 1..access.len())
                .find(|&k| access[k].contains(&v))
                .unwrap_or(usize::MAX)
        };
        let mut cache: Vec<u32> = initial.to_vec();
        let mut misses = 0;
        for (k, a) in access.iter().enumerate() {
            misses += a.iter().filter(|v| !cache.contains(v)).count() as u64;
            let mut pool: Vec<u32> = cache.iter().chain(a).copied().collect();
            pool.sort_unstable();
            pool.dedup();
            pool.sort_by_key(|&v| next(v, k));
            // A row never read again is not worth keeping over one that is;
            // ties among the kept rows do not change later misses.
            pool.truncate(initial.len());
            cache = pool;
        }
        misses
    }

    #[test]
    fn misses_as_few_as_belady_by_brute_force_and_admits_only_rows_missed() {
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(7);
        for round in 0..200 {
            let nodes = rng.random_range(4..40u32);
            let capacity = rng.random_range(1..nodes as usize);
            let initial: Vec<u32> = (0..capacity as u32).collect();
            let access: Vec<Vec<u32>> = (0..rng.random_range(1..12))
                .map(|_| {
                    let mut a: Vec<u32> = (0..rng.random_range(1..nodes))
                        .map(|_| rng.random_range(0..nodes))
                        .collect();
                    a.sort_unstable();
                    a.dedup();
                    a
                })
                .collect();
            let mut sim = Simulator::new(u64::from(nodes), &initial);
            let (used, misses, dirty) = sim.epoch(&access);
            assert_eq!(misses, brute_misses(&initial, &access), "round {round}");
            // Replaying the hits and admissions on a real cache: every
            // hit finds its node in its slot, every admission was a miss.
            let mut cache = initial.clone();
            for (a, u) in access.iter().zip(&used) {
                for &(v, s) in &u.hits {
                    assert_eq!(cache[s as usize], v, "round {round}");
                }
                let hit: Vec<u32> = u.hits.iter().map(|h| h.0).collect();
                for &(v, s) in &u.admits {
                    assert!(a.contains(&v) && !hit.contains(&v), "round {round}");
                    cache[s as usize] = v;
                }
                let expect_hits = a.iter().filter(|v| hit.contains(v)).count();
                assert_eq!(expect_hits, u.hits.len());
            }
            let changed: Vec<u64> = (0..capacity as u64)
                .filter(|&s| cache[s as usize] != initial[s as usize])
                .collect();
            assert_eq!(dirty, changed.len() as u64, "round {round}");
            // The pages a restore reads: those holding a changed slot, for
            // rows of 1000 bytes (some across two pages).
            let mut pages: Vec<u64> = changed
                .iter()
                .flat_map(|&s| s * 1000 / PAGE..=((s + 1) * 1000 - 1) / PAGE)
                .collect();
            pages.dedup();
            assert_eq!(sim.restore_pages(1000), pages.len() as u64, "round {round}");
            // Reused for a second epoch, it starts from the static rows again.
            assert_eq!(sim.epoch(&access).1, misses, "round {round}");
        }
    }
}
