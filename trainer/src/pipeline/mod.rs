//! The four stages of a training step (DiskGNN §5.3) and the pipeline that
//! runs them on their own threads joined by bounded queues:
//!
//! ```text
//! feature loading ──▶ feature assembly ──▶ ┐
//! (table + disk I/O)   (tensor on device)   ├─▶ model step
//!         └──────────▶ graph loading ─────▶ ┘
//! ```
//!
//! Both paths carry batches in the same order, so the heads of the two
//! queues always belong to the same batch. With the pipeline off, one thread
//! runs the same stage functions in sequence — same inputs, same results.

mod cpu_cache;
mod feature_assembly;
mod feature_loading;
mod graph_loading;
mod ready;
mod sources;
mod stage_times;
mod staging_buffer;
mod threads;

use std::time::Instant;

use offgnn_manifests::BatchRef;
use offgnn_shared::io_engine::{AlignedBuf, IoEngine};

pub use cpu_cache::CpuCache;
pub use feature_assembly::{assemble, assemble_parallel, assemble_staged, with_host_rows};
pub use feature_loading::{Loaded, load, load_inputs};
pub use graph_loading::{Graph, graph};
pub use ready::Ready;
pub use sources::{AssembleSources, FeatureMode, LoadSources, Sources};
pub use stage_times::{DeviceTimes, StageTimes};

use crate::error::Result;
use crate::historical::Historical;
use crate::layout::Layout;
use stage_times::{DeviceSpans, timed};

/// How batches flow through the stages.
#[derive(Clone, Copy, Debug)]
pub struct PipelineOptions {
    /// Stages on their own threads (else in sequence on the caller's).
    pub pipelined: bool,
    /// Batches a queue between two stages holds.
    pub queue_depth: usize,
    /// Loader threads: each reads every `loaders`-th batch, so this many
    /// batches' reads are in flight while tables decode and rows unpack.
    pub loaders: usize,
    /// Pipelined on the CPU: each batch assembled on every core between
    /// model steps, on the step's thread, instead of on a thread beside
    /// them. The CPU's model step takes every core, so an assembler beside
    /// it only contends with it; the step's thread also reuses its own
    /// heap's pages for each batch's matrix, where an assembler thread's
    /// matrices are mapped afresh. Not for a caller whose model runs
    /// beside the pipeline (the loader).
    pub assemble_between_steps: bool,
}

impl PipelineOptions {
    /// How many batches feature loading can run ahead of the model step:
    /// each loader's queue and the one it is reading, then the queue to the
    /// model and the batch in assembly. The historical cache prunes a
    /// batch against the step this far back, pipelined or not, so that the
    /// loaders never wait for it and a run's result does not depend on
    /// `pipelined`.
    pub fn lookahead(&self) -> u64 {
        (self.loaders * (self.queue_depth + 1) + self.queue_depth + 2) as u64
    }
}

/// Runs `step` on every batch of `order`, with the stages pipelined over
/// threads or in sequence on this thread. With `historical`, `order` is
/// training steps from the given one on, each pruned against the cache.
pub fn run_batches(
    layout: &Layout,
    engine: &IoEngine,
    src: &Sources,
    order: &[BatchRef],
    opts: PipelineOptions,
    historical: Option<(&Historical, u64)>,
    step: impl FnMut(Ready) -> Result<()>,
) -> Result<StageTimes> {
    if let Some((h, first)) = historical {
        h.begin(first);
    }
    let result = if opts.pipelined {
        threads::run_pipelined(layout, engine, src, order, opts, historical, step)
    } else {
        run_in_sequence(layout, engine, src, order, historical, step)
    };
    if let Some((h, _)) = historical {
        h.release();
    }
    result
}

/// The stages in sequence on this thread and the default stream: each
/// stage's work is queued after the last one's.
fn run_in_sequence(
    layout: &Layout,
    engine: &IoEngine,
    src: &Sources,
    order: &[BatchRef],
    historical: Option<(&Historical, u64)>,
    mut step: impl FnMut(Ready) -> Result<()>,
) -> Result<StageTimes> {
    let mut times = StageTimes::default();
    let mut spans = DeviceSpans::default();
    let secs = |d: std::time::Duration| d.as_secs_f64();
    let device = src.assemble.device;
    let mut spare = AlignedBuf::new(0);
    for (k, &r) in order.iter().enumerate() {
        let t = Instant::now();
        let at = historical.map(|(h, first)| (h, first + k as u64));
        let mut loaded = load(layout, engine, &src.load, r, spare, at)?;
        times.load += secs(t.elapsed());
        let t = Instant::now();
        let ((x, tiers), assembled) = timed(device, || assemble(&src.assemble, &loaded))?;
        times.assemble += secs(t.elapsed());
        let t = Instant::now();
        let (g, graphed) = timed(device, || graph(&loaded.table, device))?;
        times.graph += secs(t.elapsed());
        let ready = Ready {
            x,
            blocks: g.blocks,
            labels: g.labels,
            pairs: g.pairs,
            n_id: g.n_id,
            disk_bytes: loaded.disk_bytes,
            disk_rows: loaded.disk_rows,
            tiers,
            plan: loaded.plan.take(),
        };
        spans.receive(&ready, assembled, graphed)?;
        let t = Instant::now();
        let ((), stepped) = timed(device, || step(ready))?;
        times.model += secs(t.elapsed());
        spans.model.extend(stepped);
        spare = loaded.buf;
    }
    times.device = spans.times()?;
    Ok(times)
}
