//! The pipelined run (DiskGNN §5.3): feature loading on `loaders` threads,
//! feature assembly and graph loading on a thread each (on CUDA each on a
//! side stream of its own), the model step on the caller's thread, joined
//! by bounded queues whose bound gives the back-pressure. Where the options
//! say so (the CPU's training), assembly runs on every core between the
//! model's steps instead.

use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

use offgnn_manifests::BatchRef;
use offgnn_shared::address_table::BatchTable;
use offgnn_shared::io_engine::{AlignedBuf, IoEngine};
use tch::{Device, Tensor};

use super::PipelineOptions;
use super::feature_assembly::{assemble, assemble_parallel};
use super::feature_loading::{Loaded, load};
use super::graph_loading::{Graph, graph};
use super::ready::Ready;
use super::sources::{AssembleSources, LoadSources, Sources};
use super::stage_times::{DeviceSpans, Span, StageTimes, side_stream, timed};
use crate::error::Result;
use crate::historical::{Historical, Plan};
use crate::layout::Layout;

/// An assembled batch for the model step: its input matrix, the rows from
/// each tier, its disk bytes and rows, and its device span.
type Assembled = (Tensor, [u64; 3], u64, u64, Span);
/// A batch's blocks and labels for the model step, its historical plan,
/// and their device span.
type Graphed = (Graph, Option<Plan>, Span);
/// A batch's topology for the graph loader, and its historical plan.
type Topology = (BatchTable, Option<Plan>);

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// The loaders' ends: each loader's queue of loaded batches (to the
/// assembler) and of their topology (to the graph loader), the queue that
/// takes buffers back to it, and its thread.
struct Loaders<'scope> {
    to_assemble: Vec<Receiver<Loaded>>,
    to_graph: Vec<Receiver<Topology>>,
    recycle: Vec<SyncSender<AlignedBuf>>,
    handles: Vec<ScopedJoinHandle<'scope, Result<f64>>>,
}

/// Runs `step` on every batch of `order` with each stage on its own
/// threads, queues of `queue_depth` batches between them; `historical` as
/// for [`super::run_batches`].
pub(super) fn run_pipelined(
    layout: &Layout,
    engine: &IoEngine,
    src: &Sources,
    order: &[BatchRef],
    opts: PipelineOptions,
    historical: Option<(&Historical, u64)>,
    mut step: impl FnMut(Ready) -> Result<()>,
) -> Result<StageTimes> {
    let device = src.assemble.device;
    let depth = opts.queue_depth.max(1);
    let loaders = opts.loaders.clamp(1, order.len().max(1));
    let (load_src, asm_src) = (&src.load, src.assemble.share());
    std::thread::scope(|s| -> Result<StageTimes> {
        let Loaders {
            to_assemble,
            to_graph,
            recycle,
            handles,
        } = spawn_loaders(
            s,
            (layout, engine, load_src),
            order,
            loaders,
            depth,
            historical,
        );
        let (to_model_g, model_g) = sync_channel::<Graphed>(depth);
        let n = order.len();
        let (mut inputs, assembler) = if opts.assemble_between_steps {
            let inline = Inline {
                src: asm_src,
                loaded: to_assemble,
                recycle,
                busy: 0.0,
            };
            (Inputs::Inline(inline), None)
        } else {
            let (to_model_x, model_x) = sync_channel::<Assembled>(depth);
            let assembler = s.spawn(move || {
                assemble_all(device, &asm_src, &to_assemble, &recycle, &to_model_x, n)
            });
            (Inputs::Queue(model_x), Some(assembler))
        };
        let grapher = s.spawn(move || graph_all(device, &to_graph, &to_model_g, n));
        let mut spans = DeviceSpans::default();
        let (model_busy, result) =
            model_steps(&mut inputs, &model_g, n, device, &mut spans, &mut step);
        drop(model_g);
        let inline_busy = inputs.close();
        // A loader may wait on a step that will not come now.
        if let Some((h, _)) = historical {
            h.release();
        }
        let assemble = match assembler {
            Some(a) => a.join().expect("the assembler does not panic"),
            None => Ok(inline_busy),
        };
        let graph = grapher.join().expect("the graph loader does not panic");
        let mut load = 0.0;
        let mut loader_error = Ok(());
        for h in handles {
            match h.join().expect("a loader does not panic") {
                Ok(busy) => load += busy,
                Err(e) => loader_error = loader_error.and(Err(e)),
            }
        }
        loader_error?;
        let assemble = assemble?;
        let graph = graph?;
        result?;
        Ok(StageTimes {
            load,
            assemble,
            graph,
            model: model_busy,
            device: spans.times()?,
        })
    })
}

/// Starts the loaders. Loader j takes batches j, j + L, j + 2L, ...; the
/// assembler and the graph loader read the loaders' queues in turn, so
/// batches keep their order. Buffers go back to their loader once
/// assembled.
fn spawn_loaders<'scope, 'env>(
    s: &'scope Scope<'scope, 'env>,
    (layout, engine, load_src): (&'env Layout, &'env IoEngine, &'env LoadSources),
    order: &'env [BatchRef],
    loaders: usize,
    depth: usize,
    historical: Option<(&'env Historical, u64)>,
) -> Loaders<'scope> {
    let mut to_assemble: Vec<Receiver<Loaded>> = Vec::new();
    let mut to_graph: Vec<Receiver<Topology>> = Vec::new();
    let mut recycle: Vec<SyncSender<AlignedBuf>> = Vec::new();
    let mut handles = Vec::new();
    for j in 0..loaders {
        let (loaded_tx, loaded_rx) = sync_channel::<Loaded>(depth);
        let (graph_tx, graph_rx) = sync_channel::<Topology>(depth);
        let (spare_tx, spare_rx) = sync_channel::<AlignedBuf>(depth + 2);
        to_assemble.push(loaded_rx);
        to_graph.push(graph_rx);
        recycle.push(spare_tx);
        handles.push(s.spawn(move || -> Result<f64> {
            let mut busy = 0.0;
            for (k, &r) in order.iter().enumerate().skip(j).step_by(loaders) {
                let buf = spare_rx.try_recv().unwrap_or_else(|_| AlignedBuf::new(0));
                let t = Instant::now();
                let at = historical.map(|(h, first)| (h, first + k as u64));
                let mut loaded = load(layout, engine, load_src, r, buf, at)?;
                busy += secs(t.elapsed());
                let topology = (
                    BatchTable {
                        labels: std::mem::take(&mut loaded.table.labels),
                        blocks: std::mem::take(&mut loaded.table.blocks),
                        pairs: std::mem::take(&mut loaded.table.pairs),
                        // Assembly still reads them (the baselines read rows by id).
                        input_nodes: loaded.table.input_nodes.clone(),
                        ..Default::default()
                    },
                    loaded.plan.take(),
                );
                if graph_tx.send(topology).is_err() || loaded_tx.send(loaded).is_err() {
                    break;
                }
            }
            Ok(busy)
        }));
    }
    Loaders {
        to_assemble,
        to_graph,
        recycle,
        handles,
    }
}

/// The assembler's thread: the `n` loaded batches, from the loaders in
/// turn, assembled and sent on to the model step; returns its busy
/// seconds.
fn assemble_all(
    device: Device,
    asm_src: &AssembleSources,
    to_assemble: &[Receiver<Loaded>],
    recycle: &[SyncSender<AlignedBuf>],
    to_model_x: &SyncSender<Assembled>,
    n: usize,
) -> Result<f64> {
    let _stream = side_stream(device)?;
    let mut busy = 0.0;
    for k in 0..n {
        // None: a loader stopped; its error is collected below.
        let Some(assembled) = assemble_next(k, device, (to_assemble, recycle), &mut busy, |l| {
            assemble(asm_src, l)
        }) else {
            break;
        };
        if to_model_x.send(assembled?).is_err() {
            break;
        }
    }
    Ok(busy)
}

/// Batch `k`, from its loader's queue (`None` where that loader stopped),
/// assembled by `assemble` with its time added to `busy`; its buffer goes
/// back to the loader.
fn assemble_next(
    k: usize,
    device: Device,
    (loaded, recycle): (&[Receiver<Loaded>], &[SyncSender<AlignedBuf>]),
    busy: &mut f64,
    assemble: impl FnOnce(&Loaded) -> Result<(Tensor, [u64; 3])>,
) -> Option<Result<Assembled>> {
    let j = k % loaded.len();
    let l = loaded[j].recv().ok()?;
    let t = Instant::now();
    let assembled = timed(device, || assemble(&l));
    *busy += secs(t.elapsed());
    let _ = recycle[j].try_send(l.buf);
    Some(assembled.map(|((x, tiers), span)| (x, tiers, l.disk_bytes, l.disk_rows, span)))
}

/// The graph loader's thread: the `n` batches' topology, from the loaders
/// in turn, as tensors sent on to the model step; returns its busy
/// seconds.
fn graph_all(
    device: Device,
    to_graph: &[Receiver<Topology>],
    to_model_g: &SyncSender<Graphed>,
    n: usize,
) -> Result<f64> {
    let loaders = to_graph.len();
    let _stream = side_stream(device)?;
    let mut busy = 0.0;
    for k in 0..n {
        let Ok((t, plan)) = to_graph[k % loaders].recv() else {
            break;
        };
        let start = Instant::now();
        let (g, span) = timed(device, || graph(&t, device))?;
        busy += secs(start.elapsed());
        if to_model_g.send((g, plan, span)).is_err() {
            break;
        }
    }
    Ok(busy)
}

/// Where the model step's assembled inputs come from.
enum Inputs {
    /// The assembler thread's queue.
    Queue(Receiver<Assembled>),
    /// The loaders' queues, each batch assembled on the step's thread.
    Inline(Inline),
}

/// Assembly on the model step's thread: the loaders' queues, read in
/// turn, and the queues that take their buffers back.
struct Inline {
    src: AssembleSources,
    loaded: Vec<Receiver<Loaded>>,
    recycle: Vec<SyncSender<AlignedBuf>>,
    busy: f64,
}

impl Inputs {
    /// Batch `k`'s assembled input; `None` where a stage stopped (its
    /// error is collected from its thread).
    fn next(&mut self, k: usize, device: Device) -> Option<Result<Assembled>> {
        match self {
            Inputs::Queue(rx) => rx.recv().ok().map(Ok),
            Inputs::Inline(inline) => {
                let src = &inline.src;
                let queues = (inline.loaded.as_slice(), inline.recycle.as_slice());
                assemble_next(k, device, queues, &mut inline.busy, |l| {
                    assemble_parallel(src, l)
                })
            }
        }
    }

    /// Drops the queues, so that the stages feeding them stop; returns the
    /// seconds assembly took on this thread.
    fn close(self) -> f64 {
        match self {
            Inputs::Queue(_) => 0.0,
            Inputs::Inline(inline) => inline.busy,
        }
    }
}

/// The model step on this thread: each batch's assembled input and graph,
/// which arrive in the same order, through `step`. Returns its busy
/// seconds and how it ended (at the first error).
fn model_steps(
    inputs: &mut Inputs,
    model_g: &Receiver<Graphed>,
    n: usize,
    device: Device,
    spans: &mut DeviceSpans,
    step: &mut impl FnMut(Ready) -> Result<()>,
) -> (f64, Result<()>) {
    let mut model_busy = 0.0;
    let mut result = Ok(());
    for k in 0..n {
        let assembled = match inputs.next(k, device) {
            Some(Ok(a)) => a,
            Some(Err(e)) => {
                result = Err(e);
                break;
            }
            None => break, // a stage stopped; its error is collected below
        };
        let Ok((g, plan, graphed)) = model_g.recv() else {
            break;
        };
        let (x, tiers, disk_bytes, disk_rows, assembled) = assembled;
        let ready = Ready {
            x,
            blocks: g.blocks,
            labels: g.labels,
            pairs: g.pairs,
            n_id: g.n_id,
            disk_bytes,
            disk_rows,
            tiers,
            plan,
        };
        let t = Instant::now();
        result = spans
            .receive(&ready, assembled, graphed)
            .and_then(|()| timed(device, || step(ready)))
            .map(|((), stepped)| spans.model.extend(stepped));
        model_busy += secs(t.elapsed());
        if result.is_err() {
            break;
        }
    }
    (model_busy, result)
}
