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

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use offgnn_shared::Error;
use offgnn_shared::dataset::Split;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;

use crate::access_rank::{Location, Tiers};
use crate::plan::BatchInfo;

/// Read again never (within the epoch).
const NEVER: u32 = u32::MAX;
/// Random slots a window admission draws before it gives up on a row.
const WINDOW_DRAWS: usize = 16;
/// The window policy's random evictions are the same in every run.
const WINDOW_SEED: u64 = 0x6_1D5;
/// Not cached.
const NONE: u32 = u32::MAX;

/// A slot's place in Belady's eviction order: (next use, pages its change
/// would add to the restore, slot), the greatest evicted first.
type Key = (u32, Reverse<u32>, u32);

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

/// What the static tier and a cache that follows the batch order
/// (`policy`) read from disk over the sampled epochs' training batches:
/// the rows neither cache holds when a batch needs them, and their bytes;
/// for the second also the slots changed at each epoch's end and what
/// restoring them reads: the 4 KiB pages of the tier's object that hold
/// them.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Forecast {
    pub static_rows: u64,
    pub static_bytes: u64,
    pub policy: String,
    pub rows: u64,
    pub bytes: u64,
    pub restore_rows: u64,
    pub restore_bytes: u64,
}

impl Forecast {
    /// Bytes the cache that follows the order reads, restores included.
    pub fn total_bytes(&self) -> u64 {
        self.bytes + self.restore_bytes
    }
}

/// Simulates `policy` over every sampled epoch's training batches (in the
/// plan's order, which is the trainer's), each epoch from the static CPU
/// tier of `tiers`. `batches` still hold their inputs. Returns each
/// batch's use of the cache (`None` for evaluation batches, which read
/// the static tier) and the forecast beside the static tier's.
pub fn simulate(
    batches: &[BatchInfo],
    tiers: &Tiers,
    row_bytes: u64,
    policy: Policy,
) -> Result<(Vec<Option<BatchCpu>>, Forecast), Error> {
    let mut out: Vec<Option<BatchCpu>> = vec![None; batches.len()];
    let mut fc = Forecast {
        policy: policy.name(),
        ..Default::default()
    };
    let mut epochs: Vec<u32> = batches
        .iter()
        .filter(|b| b.split == Split::Train)
        .map(|b| b.epoch)
        .collect();
    epochs.sort_unstable();
    epochs.dedup();
    let num_nodes = tiers.num_nodes();
    let mut sim = Simulator::new(num_nodes, tiers.cpu_nodes(), row_bytes, policy);
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
        let (used, misses, restores) = sim.epoch(&access)?;
        fc.rows += misses;
        fc.restore_rows += restores;
        fc.restore_bytes += sim.restore_pages() * PAGE;
        for (i, u) in ids.into_iter().zip(used) {
            out[i] = Some(u);
        }
    }
    fc.static_bytes = fc.static_rows * row_bytes;
    fc.bytes = fc.rows * row_bytes;
    Ok((out, fc))
}

/// At most the bytes [`simulate`] holds over `batches` of a graph of
/// `num_nodes`: per node its slot and next reader (4 bytes each); per
/// access of the largest epoch its next reader (4); per training access a
/// hit or an admission (8 each, kept for the tables), and a heap entry of
/// 12 per slot, about four times over.
pub fn memory_bound(batches: &[BatchInfo], num_nodes: u64) -> u64 {
    let mut per_epoch: std::collections::BTreeMap<u32, u64> = Default::default();
    for b in batches.iter().filter(|b| b.split == Split::Train) {
        *per_epoch.entry(b.epoch).or_default() += b.inputs.len() as u64;
    }
    let all: u64 = per_epoch.values().sum();
    let largest = per_epoch.values().copied().max().unwrap_or(0);
    num_nodes * 8 + largest * 4 + all * 8 + num_nodes.min(all) * 12 * 4
}

/// The unit the trainer reads a restore in.
const PAGE: u64 = 4096;

/// A CPU cache that follows the batch order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Belady's MIN with bypass (Ginex): the fewest rows read from disk.
    Belady,
    /// GIDS's window buffering: every row read goes in, in place of a
    /// random row that none of the next `batches` batches reads.
    Window { batches: u32 },
}

impl Policy {
    fn name(self) -> String {
        match self {
            Policy::Belady => "belady".into(),
            Policy::Window { batches } => format!(
                "window of {}",
                offgnn_shared::report::count(batches, "batch", "batches")
            ),
        }
    }
}

/// The cache's state and the per-node tables the simulation reuses from
/// epoch to epoch.
struct Simulator<'a> {
    policy: Policy,
    /// Bytes of a row, and per 4 KiB page of the tier's object the slots
    /// in it whose rows changed this epoch.
    row_bytes: u64,
    pages_changed: Vec<u32>,
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
    fn new(num_nodes: u64, initial: &'a [u32], row_bytes: u64, policy: Policy) -> Simulator<'a> {
        Simulator {
            policy,
            row_bytes: row_bytes.max(1),
            pages_changed: Vec::new(),
            initial,
            slot_of: vec![NONE; num_nodes as usize],
            node: Vec::new(),
            next: Vec::new(),
            seen: vec![NEVER; num_nodes as usize],
        }
    }

    /// One epoch of batches reading `access` (sorted node lists), from the
    /// static state: each batch's hits and admissions, the rows missed,
    /// and the slots whose rows differ from the static ones at the end. A
    /// signal stops it between batches.
    fn epoch(&mut self, access: &[Vec<u32>]) -> Result<(Vec<BatchCpu>, u64, u64), Error> {
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
        // A max-heap of slots by [`Key`]: the row read again furthest ahead
        // goes first and, of rows read again equally far (above all
        // never), the one whose slot adds the fewest pages to restore.
        // Stale entries are skipped when they surface, and the heap
        // rebuilt when they outnumber the slots.
        self.pages_changed.clear();
        self.pages_changed.resize(
            (self.node.len() as u64 * self.row_bytes).div_ceil(PAGE) as usize,
            0,
        );
        let mut heap: BinaryHeap<Key> = match self.policy {
            Policy::Belady => self.keys().collect(),
            Policy::Window { .. } => BinaryHeap::new(),
        };
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(WINDOW_SEED);
        let (mut used, mut misses) = (Vec::with_capacity(access.len()), 0u64);
        let mut missed: Vec<(u32, u32)> = Vec::new();
        for (a, nexts) in access.iter().zip(&next_use) {
            offgnn_shared::signals::check()?;
            let mut u = BatchCpu::default();
            missed.clear();
            for (&v, &n) in a.iter().zip(nexts) {
                match self.slot_of[v as usize] {
                    NONE => missed.push((n, v)),
                    s => {
                        u.hits.push((v, s));
                        self.next[s as usize] = n;
                        if self.policy == Policy::Belady {
                            heap.push(self.key(s));
                        }
                    }
                }
            }
            misses += missed.len() as u64;
            // The sooner a missed row is read again, the more it is worth:
            // each admitted one replaces the cached row read furthest ahead.
            missed.sort_unstable();
            match self.policy {
                Policy::Belady => self.admit_belady(&mut heap, &missed, &mut u),
                Policy::Window { batches } => {
                    let k = used.len() as u32;
                    self.admit_window(k.saturating_add(batches), &mut rng, &missed, &mut u);
                }
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
        Ok((used, misses, dirty))
    }

    /// Belady's choice for a batch's `missed` rows `(next use, node)`,
    /// sooner first: each replaces the cached row read again furthest
    /// ahead (of equals, one in a changed slot), where that is later.
    fn admit_belady(
        &mut self,
        heap: &mut BinaryHeap<Key>,
        missed: &[(u32, u32)],
        u: &mut BatchCpu,
    ) {
        for &(n, v) in missed {
            if n == NEVER || self.node.is_empty() {
                break;
            }
            let top = loop {
                let top = heap.pop().expect("one entry per slot at least");
                if self.key(top.2) == top {
                    break top;
                }
            };
            if n >= top.0 {
                heap.push(top);
                break;
            }
            let s = top.2;
            // The slots that share a page which this admission changes
            // first: their cost fell to nothing.
            for page in self.place(v, s, n) {
                for t in self.slots_of_page(page) {
                    heap.push(self.key(t));
                }
            }
            heap.push(self.key(s));
            u.admits.push((v, s));
        }
    }

    /// GIDS's window buffering (gids.txt §3.4) over BaM's random
    /// eviction: every missed row goes into a slot drawn at random among
    /// those whose row no batch before `horizon` reads (the window's
    /// look-ahead) and that this batch has not written; where a few draws
    /// find none, the row is not kept.
    fn admit_window(
        &mut self,
        horizon: u32,
        rng: &mut rand_pcg::Pcg64Mcg,
        missed: &[(u32, u32)],
        u: &mut BatchCpu,
    ) {
        let slots = self.node.len() as u32;
        if slots == 0 {
            return;
        }
        let first = u.admits.len();
        for &(n, v) in missed {
            let free = (0..WINDOW_DRAWS)
                .map(|_| rng.random_range(0..slots))
                .find(|&s| {
                    let next = self.next[s as usize];
                    next > horizon && !u.admits[first..].iter().any(|a| a.1 == s)
                });
            if let Some(s) = free {
                let _ = self.place(v, s, n);
                u.admits.push((v, s));
            }
        }
    }

    /// Node `v`, read next at batch `n`, into slot `s` in place of its row.
    /// Returns the pages that now hold a changed slot and did not, or no
    /// longer do.
    fn place(&mut self, v: u32, s: u32, n: u32) -> Vec<u64> {
        let was = self.changed(s);
        self.slot_of[self.node[s as usize] as usize] = NONE;
        self.node[s as usize] = v;
        self.slot_of[v as usize] = s;
        self.next[s as usize] = n;
        let now = self.changed(s);
        let mut flipped = Vec::new();
        if was != now {
            for page in self.pages_of_slot(s) {
                let count = &mut self.pages_changed[page as usize];
                if now {
                    *count += 1;
                } else {
                    *count -= 1;
                }
                if *count == u32::from(now) {
                    flipped.push(page);
                }
            }
        }
        flipped
    }

    /// Slot `s`'s key: its row's next use, the pages that changing it
    /// would add to the epoch's restore (fewer first), the slot.
    fn key(&self, s: u32) -> Key {
        let cost = if self.changed(s) {
            0
        } else {
            self.pages_of_slot(s)
                .filter(|&p| self.pages_changed[p as usize] == 0)
                .count() as u32
        };
        (self.next[s as usize], Reverse(cost), s)
    }

    /// Every slot's key.
    fn keys(&self) -> impl Iterator<Item = Key> + '_ {
        (0..self.next.len() as u32).map(|s| self.key(s))
    }

    /// The 4 KiB pages of the tier's object that slot `s`'s row spans.
    fn pages_of_slot(&self, s: u32) -> std::ops::RangeInclusive<u64> {
        let rb = self.row_bytes;
        u64::from(s) * rb / PAGE..=((u64::from(s) + 1) * rb - 1) / PAGE
    }

    /// The slots whose rows lie (partly) in page `p`.
    fn slots_of_page(&self, p: u64) -> std::ops::Range<u32> {
        let rb = self.row_bytes;
        let first = p * PAGE / rb;
        let end = ((p + 1) * PAGE).div_ceil(rb).min(self.node.len() as u64);
        first as u32..end as u32
    }

    /// Whether slot `s` holds another row than the static one.
    fn changed(&self, s: u32) -> bool {
        self.node[s as usize] != self.initial[s as usize]
    }

    /// The 4 KiB pages of the tier's object that hold a slot changed in
    /// the last epoch.
    fn restore_pages(&self) -> u64 {
        self.pages_changed.iter().filter(|&&c| c > 0).count() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Random batches over a few nodes, and a static tier of the first ones.
    fn workload(rng: &mut rand_pcg::Pcg64Mcg) -> (u32, Vec<u32>, Vec<Vec<u32>>) {
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
        (nodes, initial, access)
    }

    /// Replays a simulation's hits and admissions on a cache of nodes:
    /// every hit finds its node in its slot, every admission is a row the
    /// batch missed, no slot is written twice by one batch, and `evicted`
    /// sees each (batch, evicted node). Returns the final cache.
    fn replay(
        initial: &[u32],
        access: &[Vec<u32>],
        used: &[BatchCpu],
        mut evicted: impl FnMut(usize, u32),
    ) -> Vec<u32> {
        let mut cache = initial.to_vec();
        for (k, (a, u)) in access.iter().zip(used).enumerate() {
            for &(v, s) in &u.hits {
                assert_eq!(cache[s as usize], v);
            }
            let hit: Vec<u32> = u.hits.iter().map(|h| h.0).collect();
            let expect_hits = a.iter().filter(|v| cache.contains(v)).count();
            assert_eq!(expect_hits, u.hits.len());
            let mut slots: Vec<u32> = u.admits.iter().map(|a| a.1).collect();
            slots.sort_unstable();
            slots.dedup();
            assert_eq!(slots.len(), u.admits.len(), "a slot written twice");
            for &(v, s) in &u.admits {
                assert!(a.contains(&v) && !hit.contains(&v));
                evicted(k, cache[s as usize]);
                cache[s as usize] = v;
            }
        }
        cache
    }

    #[test]
    fn misses_as_few_as_belady_by_brute_force_and_admits_only_rows_missed() {
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(7);
        for round in 0..200 {
            let (nodes, initial, access) = workload(&mut rng);
            let capacity = initial.len();
            let mut sim = Simulator::new(u64::from(nodes), &initial, 1000, Policy::Belady);
            let (used, misses, dirty) = sim.epoch(&access).unwrap();
            assert_eq!(misses, brute_misses(&initial, &access), "round {round}");
            let cache = replay(&initial, &access, &used, |_, _| ());
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
            assert_eq!(sim.restore_pages(), pages.len() as u64, "round {round}");
            // Reused for a second epoch, it starts from the static rows again.
            assert_eq!(sim.epoch(&access).unwrap().1, misses, "round {round}");
        }
    }

    /// GIDS's window: a row goes in only in place of one that none of the
    /// next `W` batches reads, and it misses no fewer rows than Belady.
    #[test]
    fn the_window_evicts_no_row_its_look_ahead_reads() {
        let mut rng = rand_pcg::Pcg64Mcg::seed_from_u64(11);
        let mut admitted = 0;
        for round in 0..200 {
            let (nodes, initial, access) = workload(&mut rng);
            let w = rng.random_range(0..4u32);
            let mut sim = Simulator::new(
                u64::from(nodes),
                &initial,
                1000,
                Policy::Window { batches: w },
            );
            let (used, misses, _) = sim.epoch(&access).unwrap();
            let mut best = Simulator::new(u64::from(nodes), &initial, 1000, Policy::Belady);
            assert!(misses >= best.epoch(&access).unwrap().1, "round {round}");
            replay(&initial, &access, &used, |k, gone| {
                let ahead = &access[k + 1..(k + 1 + w as usize).min(access.len())];
                assert!(!ahead.iter().any(|a| a.contains(&gone)), "round {round}");
            });
            admitted += used.iter().map(|u| u.admits.len()).sum::<usize>();
        }
        assert!(admitted > 0);
    }
}
