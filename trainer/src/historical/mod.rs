//! FreshGNN's historical embedding cache (FreshGNN §4–5), an option of
//! training (`--historical`): per level between layers, embeddings of
//! nodes whose gradient was small are kept and used in place of computing
//! them, so their subtrees are neither computed nor read from disk.
//!
//! - **Admission and eviction** (§4.1): after each step, of a level's nodes
//!   the `p_grad` fraction with the smallest gradient norms is admitted
//!   (their new embedding; a node served from the cache keeps its entry),
//!   and the others are evicted. An entry is used for at most `t_stale`
//!   steps after the one that computed it; none is used before step
//!   `start` (the stabilization period, §4.1.4).
//! - **Pruning ahead of the reads** (§5): a batch is pruned when its reads
//!   are planned, on a loader thread, against the cache as the step `lag`
//!   steps earlier left it. Lookups go in batch order and wait for that
//!   step's update, so a run's result depends on its flags, not on how its
//!   threads were scheduled: pipelined or not, the same batches read the
//!   same rows and compute the same values.
//! - **Bounded memory**: each level holds at most `memory / levels` bytes
//!   of rows; when full, the oldest entry makes room.
//!
//! Evaluation and inference compute every node exactly, as FreshGNN does.

pub mod level_cache;
pub mod prune;

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, MutexGuard};

use offgnn_shared::samples::Block;
use serde::Serialize;

use level_cache::LevelCache;
pub use prune::{Pruned, prune};

/// `--historical p_grad=0.9,t_stale=200,start=0,memory=1GiB`.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct HistoricalConfig {
    /// The fraction of a level's nodes, smallest gradient norms first,
    /// admitted after each step.
    pub p_grad: f64,
    /// Steps an entry is used for after the step that computed it.
    pub t_stale: u64,
    /// The first step that uses the cache (the stabilization period).
    pub start: u64,
    /// Bytes of embeddings held, all levels together.
    pub memory: u64,
}

impl Default for HistoricalConfig {
    fn default() -> Self {
        HistoricalConfig {
            p_grad: 0.9,
            t_stale: 200,
            start: 0,
            memory: 1 << 30,
        }
    }
}

impl HistoricalConfig {
    /// Parses `key=value` pairs separated by commas; keys not given keep
    /// their defaults.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut c = HistoricalConfig::default();
        let mut seen: Vec<&str> = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part.split_once('=').ok_or_else(|| {
                format!(
                    "--historical: {part:?} is not key=value (keys: p_grad, t_stale, start, memory)"
                )
            })?;
            if seen.contains(&key.trim()) {
                return Err(format!("--historical: {} is given twice", key.trim()));
            }
            seen.push(key.trim());
            let bad = |what: &str| format!("--historical: {key}={value:?} is not {what}");
            match key.trim() {
                "p_grad" => {
                    c.p_grad = value
                        .parse::<f64>()
                        .ok()
                        .filter(|p| (0.0..=1.0).contains(p))
                        .ok_or_else(|| bad("a fraction in [0, 1]"))?;
                }
                "t_stale" => c.t_stale = value.parse().map_err(|_| bad("a number of steps"))?,
                "start" => c.start = value.parse().map_err(|_| bad("a step number"))?,
                "memory" => {
                    c.memory = offgnn_shared::sizes::parse_bytes(value)
                        .map_err(|_| bad("a size such as 512MiB"))?;
                }
                other => {
                    return Err(format!(
                        "--historical: unknown key {other:?} (keys: p_grad, t_stale, start, memory)"
                    ));
                }
            }
        }
        Ok(c)
    }

    /// Why the cache would stay unused with these settings, if it would
    /// (the run then computes exactly as without it).
    pub fn unused(&self) -> Option<&'static str> {
        match (self.p_grad, self.t_stale, self.memory) {
            (0.0, _, _) => Some("p_grad=0 admits no embedding"),
            (_, 0, _) => Some("t_stale=0 lets no embedding be used"),
            (_, _, 0) => Some("memory=0 holds no embedding"),
            _ => None,
        }
    }
}

/// Warns where a resumed run's cache settings (`now`) are not those its
/// checkpoint's run trained with (`saved`): from there it trains another
/// way than the run it continues.
pub fn warn_if_changed(saved: Option<&HistoricalConfig>, now: Option<&HistoricalConfig>) {
    if saved == now {
        return;
    }
    let with = |h: Option<&HistoricalConfig>| match h {
        Some(h) => format!(
            "with --historical p_grad={},t_stale={},start={},memory={}",
            h.p_grad,
            h.t_stale,
            h.start,
            offgnn_shared::report::human_bytes(h.memory)
        ),
        None => "without --historical".into(),
    };
    tracing::warn!(
        "the checkpoint's run trained {}, and this run trains {}: from here it trains another way than the run it continues",
        with(saved),
        with(now)
    );
}

/// Why a run of several ranks is refused the cache.
pub const ONE_PROCESS: &str = "--historical trains one process: it is not built for data-parallel training (--emulate-ranks, torchrun, srun)";

/// The cache `h` asks for a run of `world` ranks, of `levels` levels of
/// `dim`-wide embeddings with lookups `lag` steps behind: refused in
/// data-parallel training (its cache would be one rank's alone, which
/// FreshGNN's multi-GPU design does not keep either, and is not built),
/// and settings that leave it unused are warned about.
pub fn for_run(
    h: &HistoricalConfig,
    world: u32,
    (levels, dim, lag): (usize, usize, u64),
) -> crate::error::Result<Historical> {
    if world > 1 {
        return Err(crate::error::Error::InvalidArgument(ONE_PROCESS.into()));
    }
    if let Some(why) = h.unused() {
        tracing::warn!(
            "--historical: {why}, so the cache stays unused and the run computes as without it"
        );
    }
    Ok(Historical::new(h.clone(), levels, dim, lag))
}

/// A batch's part of the cache, found when its reads are planned.
pub struct Plan {
    /// The training step the batch is.
    pub step: u64,
    pub pruned: Pruned,
    /// Per level: the global node id of each of the level's nodes, in the
    /// pruned order.
    pub nodes: Vec<Vec<u32>>,
    /// Per level: the cached embeddings, `[cached, dim]` row-major, in the
    /// order of the level's `cached`.
    pub cached_rows: Vec<Vec<f32>>,
}

/// What a step changes in one level: embeddings admitted, nodes evicted.
#[derive(Debug, Default)]
pub struct LevelUpdate {
    pub admit: Vec<u32>,
    /// `[admit, dim]` row-major.
    pub rows: Vec<f32>,
    pub evict: Vec<u32>,
}

/// What the cache did over a run, for the summary.
#[derive(Clone, Debug, Default, Serialize)]
pub struct HistoricalStats {
    /// Batches pruned against the cache (after the stabilization period).
    pub batches: u64,
    /// Per level: nodes the batches used, and of them from the cache.
    pub level_nodes: Vec<u64>,
    pub level_cached: Vec<u64>,
    /// Input rows of those batches, and of them still read.
    pub inputs: u64,
    pub inputs_kept: u64,
    /// The most entries held at once, all levels together.
    pub peak_entries: u64,
}

/// The cache in a run's summary: its settings, its bound, what it did.
#[derive(Clone, Debug, Serialize)]
pub struct HistoricalSummary {
    #[serde(flatten)]
    pub config: HistoricalConfig,
    /// Batches are pruned against the cache as the step this many steps
    /// back left it.
    pub lag: u64,
    #[serde(flatten)]
    pub stats: HistoricalStats,
}

impl HistoricalSummary {
    /// The fraction of the pruned batches' input rows still needed.
    pub fn inputs_kept(&self) -> f64 {
        self.stats.inputs_kept as f64 / self.stats.inputs.max(1) as f64
    }
}

/// Admission by gradient (FreshGNN §4.1.1): of a level's `norms`, the
/// `p_grad` fraction with the smallest (ties by position) is kept or
/// admitted, the rest evicted. Returns `(admitted positions that were
/// computed, evicted positions)`; admitted positions served from the cache
/// (`from_cache`) keep their entry.
pub fn decide(norms: &[f32], from_cache: &[bool], p_grad: f64) -> (Vec<usize>, Vec<usize>) {
    let mut by_norm: Vec<usize> = (0..norms.len()).collect();
    by_norm.sort_by(|&a, &b| norms[a].total_cmp(&norms[b]).then(a.cmp(&b)));
    let take = ((norms.len() as f64 * p_grad).ceil() as usize).min(norms.len());
    let mut admit: Vec<usize> = by_norm[..take]
        .iter()
        .copied()
        .filter(|&i| !from_cache[i])
        .collect();
    let mut evict = by_norm[take..].to_vec();
    admit.sort_unstable();
    evict.sort_unstable();
    (admit, evict)
}

/// The cache, shared by the loaders (lookups) and the model step (updates).
pub struct Historical {
    cfg: HistoricalConfig,
    dim: usize,
    /// A batch is pruned against the cache as step `step - lag` left it.
    lag: u64,
    state: Mutex<State>,
    turn: Condvar,
}

struct State {
    levels: Vec<LevelCache>,
    /// Updates published and not yet applied, by step.
    pending: BTreeMap<u64, Vec<LevelUpdate>>,
    /// The next step whose update applies (`None` before the first run).
    next_apply: Option<u64>,
    next_lookup: u64,
    /// The run ended early: lookups stop waiting.
    released: bool,
    stats: HistoricalStats,
}

impl Historical {
    /// A cache of `levels` levels of `dim`-wide embeddings, lookups `lag`
    /// steps behind the updates.
    pub fn new(cfg: HistoricalConfig, levels: usize, dim: usize, lag: u64) -> Self {
        let per_level = cfg.memory / levels.max(1) as u64;
        let capacity = (per_level / (dim.max(1) as u64 * 4)) as usize;
        Historical {
            dim,
            lag: lag.max(1),
            state: Mutex::new(State {
                levels: (0..levels)
                    .map(|_| LevelCache::new(capacity, dim))
                    .collect(),
                pending: BTreeMap::new(),
                next_apply: None,
                next_lookup: 0,
                released: false,
                stats: HistoricalStats {
                    level_nodes: vec![0; levels],
                    level_cached: vec![0; levels],
                    ..Default::default()
                },
            }),
            turn: Condvar::new(),
            cfg,
        }
    }

    pub fn config(&self) -> &HistoricalConfig {
        &self.cfg
    }

    pub fn lag(&self) -> u64 {
        self.lag
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A run of batches begins at `step` (its first batch's step).
    pub fn begin(&self, step: u64) {
        let mut s = self.lock();
        s.next_apply.get_or_insert(step);
        s.next_lookup = step;
        s.released = false;
    }

    /// The run ended (at its end or at an error): lookups still waiting
    /// return without a plan.
    pub fn release(&self) {
        self.lock().released = true;
        self.turn.notify_all();
    }

    /// What the cache did so far.
    pub fn stats(&self) -> HistoricalStats {
        self.lock().stats.clone()
    }

    pub fn summary(&self) -> HistoricalSummary {
        HistoricalSummary {
            config: self.cfg.clone(),
            lag: self.lag,
            stats: self.stats(),
        }
    }

    /// Step `step`'s update, once its backward pass is through.
    pub fn publish(&self, step: u64, update: Vec<LevelUpdate>) {
        self.lock().pending.insert(step, update);
        self.turn.notify_all();
    }

    /// Batch `step`'s plan: its blocks pruned against the cache as step
    /// `step - lag` left it, and the cached rows it uses. Waits for the
    /// batches before it to have been looked up and for that step's
    /// update. `None` in the stabilization period, and when the run was
    /// released.
    pub fn lookup(&self, step: u64, blocks: &[Block], input_nodes: &[u32]) -> Option<Plan> {
        let mut s = self.lock();
        // The last step whose update this batch sees (none in the first
        // `lag` steps).
        let upto = step.checked_sub(self.lag);
        loop {
            if s.released {
                return None;
            }
            let next = s.next_apply.unwrap_or(0);
            // Steps `next..=upto` must have published.
            let ready = s.next_lookup == step
                && upto.is_none_or(|u| (next..=u).all(|k| s.pending.contains_key(&k)));
            if ready {
                break;
            }
            s = self.turn.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        if let Some(upto) = upto {
            self.apply_through(&mut s, upto);
        }
        s.next_lookup = step + 1;
        self.turn.notify_all();
        if step < self.cfg.start {
            return None;
        }
        // An entry computed at step k serves steps up to k + t_stale.
        let oldest = step.saturating_sub(self.cfg.t_stale);
        for level in &mut s.levels {
            level.expire(oldest);
        }
        let plan = self.plan(&s, step, blocks, input_nodes);
        let st = &mut s.stats;
        st.batches += 1;
        st.inputs += u64::from(blocks.first().map_or(0, |b| b.num_src));
        st.inputs_kept += plan.pruned.inputs.len() as u64;
        for (l, lv) in plan.pruned.levels.iter().enumerate() {
            st.level_nodes[l] += lv.positions.len() as u64;
            st.level_cached[l] += lv.cached.len() as u64;
        }
        Some(plan)
    }

    /// Applies the published updates of the steps up to `upto`.
    fn apply_through(&self, s: &mut State, upto: u64) {
        let Some(mut next) = s.next_apply else {
            return;
        };
        while next <= upto {
            if let Some(update) = s.pending.remove(&next) {
                for (level, u) in s.levels.iter_mut().zip(update) {
                    for &node in &u.evict {
                        level.evict(node);
                    }
                    for (i, &node) in u.admit.iter().enumerate() {
                        level.admit(node, &u.rows[i * self.dim..(i + 1) * self.dim], next);
                    }
                }
            }
            next += 1;
        }
        s.next_apply = Some(next);
        let held = s.levels.iter().map(|l| l.len() as u64).sum::<u64>();
        s.stats.peak_entries = s.stats.peak_entries.max(held);
    }

    /// The batch pruned against the cache as it stands, and the rows it
    /// takes from it.
    fn plan(&self, s: &State, step: u64, blocks: &[Block], input_nodes: &[u32]) -> Plan {
        let node = |p: u32| input_nodes.get(p as usize).copied().unwrap_or(u32::MAX);
        let pruned = prune(blocks, |l, p| s.levels[l - 1].get(node(p)).is_some());
        let nodes = pruned
            .levels
            .iter()
            .map(|lv| lv.positions.iter().map(|&p| node(p)).collect())
            .collect();
        let cached_rows = pruned
            .levels
            .iter()
            .enumerate()
            .map(|(l, lv)| {
                let mut rows = Vec::with_capacity(lv.cached.len() * self.dim);
                for &p in &lv.cached {
                    rows.extend_from_slice(s.levels[l].get(node(p)).expect("cached when pruned"));
                }
                rows
            })
            .collect();
        Plan {
            step,
            pruned,
            nodes,
            cached_rows,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_with_defaults_and_bad_values_are_named() {
        let c = HistoricalConfig::parse("p_grad=0.5,start=100").unwrap();
        assert_eq!((c.p_grad, c.t_stale, c.start), (0.5, 200, 100));
        assert_eq!(
            HistoricalConfig::parse("memory=2MiB").unwrap().memory,
            2 << 20
        );
        assert_eq!(
            HistoricalConfig::parse("").unwrap(),
            HistoricalConfig::default()
        );
        assert_eq!(HistoricalConfig::default().unused(), None);
        let unused = |t: &str| HistoricalConfig::parse(t).unwrap().unused();
        assert_eq!(unused("p_grad=0"), Some("p_grad=0 admits no embedding"));
        assert!(unused("t_stale=0").is_some() && unused("memory=0").is_some());
        for (bad, says) in [
            ("p_grad=1.5", "p_grad=\"1.5\" is not a fraction"),
            ("t_stale=-1", "t_stale=\"-1\" is not a number"),
            ("stale=3", "unknown key \"stale\""),
            ("p_grad", "is not key=value"),
            ("p_grad=0.9,p_grad=0.5", "p_grad is given twice"),
        ] {
            let e = HistoricalConfig::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn the_smallest_gradients_are_admitted_and_the_rest_evicted() {
        let norms = [0.5, 0.1, 0.9, 0.3, 0.7];
        let from_cache = [false, false, false, true, false];
        // 60% of 5 = 3 smallest: 1, 3, 0; 3 came from the cache and stays.
        let (admit, evict) = decide(&norms, &from_cache, 0.6);
        assert_eq!(admit, vec![0, 1]);
        assert_eq!(evict, vec![2, 4]);
        assert_eq!(
            decide(&norms, &from_cache, 0.0),
            (vec![], vec![0, 1, 2, 3, 4])
        );
        assert_eq!(decide(&norms, &from_cache, 1.0).1, Vec::<usize>::new());
    }

    /// One layer above the inputs: level 1 is block 1's sources.
    fn blocks() -> Vec<Block> {
        vec![
            Block {
                num_src: 4,
                num_dst: 2,
                src: vec![2, 3],
                dst: vec![0, 1],
                relations: Vec::new(),
            },
            Block {
                num_src: 2,
                num_dst: 1,
                src: vec![1],
                dst: vec![0],
                relations: Vec::new(),
            },
        ]
    }

    #[test]
    fn lookups_see_the_update_lag_steps_back_and_entries_expire() {
        let cfg = HistoricalConfig {
            t_stale: 2,
            ..Default::default()
        };
        let h = Historical::new(cfg, 1, 2, 1);
        h.begin(0);
        let inputs = [10, 11, 12, 13];
        let plan = h.lookup(0, &blocks(), &inputs).unwrap();
        assert!(plan.pruned.levels[0].cached.is_empty());
        // Step 0 admits node 11 (level position 1).
        h.publish(
            0,
            vec![LevelUpdate {
                admit: vec![11],
                rows: vec![1.0, 2.0],
                evict: vec![],
            }],
        );
        let plan = h.lookup(1, &blocks(), &inputs).unwrap();
        assert_eq!(plan.pruned.levels[0].cached, vec![1]);
        assert_eq!(plan.cached_rows[0], vec![1.0, 2.0]);
        // Node 11's subtree (input 3) is not read.
        assert_eq!(plan.pruned.inputs, vec![0, 2]);
        h.publish(1, vec![LevelUpdate::default()]);
        h.publish(2, vec![LevelUpdate::default()]);
        assert!(h.lookup(2, &blocks(), &inputs).is_some());
        // At step 3, the entry of step 0 is past t_stale = 2.
        let plan = h.lookup(3, &blocks(), &inputs).unwrap();
        assert!(plan.pruned.levels[0].cached.is_empty());
        let st = h.stats();
        assert_eq!((st.batches, st.inputs, st.inputs_kept), (4, 16, 12));
    }

    #[test]
    fn a_lookup_waits_for_the_update_it_depends_on_and_a_release_frees_it() {
        let h = std::sync::Arc::new(Historical::new(HistoricalConfig::default(), 1, 2, 1));
        h.begin(0);
        assert!(h.lookup(0, &blocks(), &[0, 1, 2, 3]).is_some());
        let waiting = {
            let h = h.clone();
            std::thread::spawn(move || h.lookup(1, &blocks(), &[0, 1, 2, 3]).is_some())
        };
        // It waits for step 0's update, then plans.
        h.publish(0, vec![LevelUpdate::default()]);
        assert!(waiting.join().unwrap());
        let waiting = {
            let h = h.clone();
            std::thread::spawn(move || h.lookup(2, &blocks(), &[0, 1, 2, 3]).is_some())
        };
        h.release();
        assert!(!waiting.join().unwrap(), "released without a plan");
    }
}
