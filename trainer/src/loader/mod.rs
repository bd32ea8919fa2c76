//! The trainer's pipeline for a caller's own model (the Python
//! `offgnn.Loader`): a split's batches of one epoch, in the trainer's
//! order, read, assembled and graph-loaded on background threads, and
//! handed over finished in PyTorch Geometric's `NeighborLoader` convention
//! (typed layouts in `typed`, as `HeteroData`; [`open`] takes either), a
//! link-prediction batch with its pairs as `LinkNeighborLoader` labels
//! them.
//!
//! One pass runs at a time. Its threads are the pipeline's (loaders, the
//! assembler, the graph loader) and one that takes the place of the model
//! step: it shapes each batch and queues it, at most `prefetch` ahead of
//! the caller. [`Loader::stop`] (also on drop) ends a pass early: the
//! queue's end closes, every thread sees it at its next batch, and all are
//! joined before it returns.

mod pass;
mod typed;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use offgnn_manifests::{BatchRef, Split};
use offgnn_shared::io_engine::{IoEngine, IoOptions};
use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::memory::{self, MemoryEstimate};
use crate::pipeline::{self, FeatureMode, PipelineOptions, Ready, Sources};
use crate::{staging, train};
use pass::Pass;
pub use typed::{TypedEdges, TypedLoader, TypedLoaderBatch, TypedNodes};

/// What a loader opens and how it runs.
#[derive(Clone, Debug)]
pub struct LoaderOptions {
    /// The layout's manifest: a path, or a URL of an object store.
    pub manifest: String,
    /// Where a remote layout is staged.
    pub local_dir: Option<PathBuf>,
    pub device: Device,
    /// Refuse to open a layout whose statement exceeds this many bytes.
    pub memory: Option<u64>,
    /// Finished batches kept ready ahead of the caller.
    pub prefetch: usize,
    /// The trainer's `--seed`: the order of epochs past the sampled ones.
    pub seed: u64,
    /// `(world, rank)`: the share of each epoch this process reads, as the
    /// trainer deals it.
    pub ranks: (u32, u32),
}

/// One finished batch in `NeighborLoader`'s convention. Local id `i` is
/// row `i` of `x` and global node `n_id[i]`; the seeds come first.
pub struct LoaderBatch {
    /// Input rows, float32 on the device.
    pub x: Tensor,
    /// `[2, E]` int64 (source, destination) on the device: each node's
    /// in-edges as sampled at the hop that reached it, hop by hop.
    pub edge_index: Tensor,
    /// The seeds' labels, int64 on the device.
    pub y: Tensor,
    /// Global node ids, int64 on the host.
    pub n_id: Tensor,
    pub batch_size: i64,
    /// Nodes first reached at each hop (the seeds at hop 0).
    pub num_sampled_nodes: Vec<i64>,
    /// `edge_index`'s edges of each hop from 1 on.
    pub num_sampled_edges: Vec<i64>,
    /// Each layer's message-flow graph, input layer first: `[2, E]` int64
    /// (source, destination) edges, sources and destinations.
    pub blocks: Vec<(Tensor, i64, i64)>,
    /// A link-prediction batch's pairs (`y` is then empty).
    pub link: Option<EdgeLabels>,
}

/// A link-prediction batch's pairs in `LinkNeighborLoader`'s convention
/// (binary labels), with each pair's query for ranking. The pairs'
/// endpoints are the batch's seeds.
pub struct EdgeLabels {
    /// `[2, P]` int64 (source, destination): each pair's endpoints as rows
    /// of `x` (of a typed batch: of its relation's source and destination
    /// types' rows).
    pub edge_label_index: Tensor,
    /// `[P]` float32: 1 an edge, 0 a negative.
    pub edge_label: Tensor,
    /// `[P]` int64: the query each pair is ranked in, numbered within the
    /// batch: a positive and its negatives share one.
    pub edge_label_query: Tensor,
}

impl EdgeLabels {
    /// The pairs of `p`, their endpoints `src` and `dst` as rows already.
    fn of(src: &Tensor, dst: &Tensor, p: &crate::link::PairTensors) -> Result<EdgeLabels> {
        Ok(EdgeLabels {
            edge_label_index: Tensor::f_stack(&[src, dst], 0)?,
            edge_label: p.label.f_to_kind(Kind::Float)?,
            edge_label_query: p.query.shallow_clone(),
        })
    }
}

/// What a loader's `next` found.
pub enum Next<B> {
    Batch(Box<B>),
    /// Nothing within the wait: the next batch is still on its way.
    Waiting,
    /// The pass is over.
    Done,
}

/// A packed layout opened for reading batches in passes.
pub struct Loader {
    layout: Arc<Layout>,
    engine: Arc<IoEngine>,
    /// With the loader between passes, with the pass's thread during one.
    src: Option<Sources>,
    pass: Option<Pass<LoaderBatch, Sources>>,
    opts: LoaderOptions,
    pub memory: MemoryEstimate,
}

/// The pipeline's shape under a loader: the trainer's defaults.
fn pipeline_options() -> PipelineOptions {
    PipelineOptions {
        pipelined: true,
        queue_depth: 2,
        loaders: 2,
        // The caller's model runs beside the pipeline: assembly keeps a
        // thread of its own and one core.
        assemble_between_steps: false,
    }
}

/// A loader's statement against the `memory` it was given.
fn check_memory(limit: u64, memory: &MemoryEstimate) -> Result<()> {
    if memory.total_bytes <= limit {
        return Ok(());
    }
    let h = offgnn_shared::report::human_bytes;
    Err(Error::OverMemory(format!(
        "memory {}: this loader needs up to {} (caches {}, batches in flight {}, runtime {}); give more memory, or a smaller prefetch",
        h(limit),
        h(memory.total_bytes),
        h(memory.cache_bytes),
        h(memory.batches_in_flight_bytes),
        h(memory.runtime_bytes),
    )))
}

impl Loader {
    /// Stages (a remote layout into `local_dir`) and opens the layout,
    /// checks its statement against `memory`, and loads its caches.
    pub fn open(opts: LoaderOptions) -> Result<Loader> {
        let (world, rank) = opts.ranks;
        if world == 0 || rank >= world {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} of a world of {world}: the rank must be below the world size"
            )));
        }
        if opts.prefetch == 0 {
            return Err(Error::InvalidArgument("prefetch must be at least 1".into()));
        }
        let engine = IoEngine::new(IoOptions::default());
        let (dir, manifest) =
            staging::resolve(&opts.manifest, opts.local_dir.as_deref(), &engine, false)?;
        let memory = memory::loader_estimate(
            &manifest,
            opts.device,
            pipeline_options(),
            opts.prefetch as u64 + 1,
        );
        if let Some(limit) = opts.memory {
            check_memory(limit, &memory)?;
        }
        let layout = Layout::open(&dir, manifest, &engine, false)?;
        let engine = crate::io_depth::default_engine_for((&layout.dir, &layout.manifest.objects));
        let src = train::sources(&layout, &engine, (FeatureMode::Packed, opts.device))?;
        if world > 1 && src.assemble.cpu_rows.as_ref().is_some_and(|c| c.follows) {
            return Err(Error::Layout(
                "this layout's CPU cache follows the sampled batch order (packer --cpu-cache-policy belady, window or auto), which one process reads; for several ranks pack it with --cpu-cache-policy static".into(),
            ));
        }
        Ok(Loader {
            layout: Arc::new(layout),
            engine: Arc::new(engine),
            src: Some(src),
            pass: None,
            opts,
            memory,
        })
    }

    pub fn manifest(&self) -> &offgnn_manifests::Manifest {
        &self.layout.manifest
    }

    /// The batches `split` reads in `epoch`, in order.
    pub fn batches(&self, split: Split, epoch: u32) -> Vec<BatchRef> {
        let kept = self
            .src
            .as_ref()
            .and_then(|s| s.assemble.cpu_rows.as_ref())
            .is_some_and(|c| c.follows);
        train::split_order(
            &self.layout.manifest,
            split,
            epoch,
            self.opts.seed,
            kept,
            self.opts.ranks,
        )
    }

    /// Sampled epochs of training batches.
    pub fn sampled_epochs(&self) -> usize {
        self.layout
            .manifest
            .schedule
            .get(&Split::Train)
            .map_or(0, Vec::len)
    }

    /// Starts a pass over `split`'s batches of `epoch` (ending one in
    /// progress); returns how many it reads.
    pub fn start(&mut self, split: Split, epoch: u32) -> Result<usize> {
        self.stop()?;
        let order = self.batches(split, epoch);
        if order.is_empty() && !self.layout.manifest.schedule.contains_key(&split) {
            return Err(Error::Layout(format!("the layout has no {split} batches")));
        }
        let n = order.len();
        let src = self.src.take().expect("sources are back between passes");
        let (layout, engine) = (Arc::clone(&self.layout), Arc::clone(&self.engine));
        let produced = Pass::start(self.opts.prefetch, src, move |src, send| {
            pipeline::run_batches(
                &layout,
                &engine,
                src,
                &order,
                pipeline_options(),
                None,
                |r: Ready| send(finish(r)?),
            )
            .map(drop)
        });
        self.pass = Some(produced?);
        Ok(n)
    }

    /// The pipeline alone over `split`'s batches of `epoch`, each batch
    /// dropped where the model step would take it: what the trainer's
    /// pipeline delivers without a model, for a benchmark to set the
    /// loader's batches beside. Returns the batches and seconds.
    pub fn drain(&mut self, split: Split, epoch: u32) -> Result<(usize, f64)> {
        self.stop()?;
        let order = self.batches(split, epoch);
        let src = self.src.as_ref().expect("sources are back between passes");
        let started = std::time::Instant::now();
        pipeline::run_batches(
            &self.layout,
            &self.engine,
            src,
            &order,
            pipeline_options(),
            None,
            |_: Ready| Ok(()),
        )?;
        let seconds = started.elapsed().as_secs_f64();
        if let Some(cache) = src.assemble.cpu_rows.as_ref() {
            cache.restore()?;
        }
        Ok((order.len(), seconds))
    }

    /// The pass's next batch, waiting at most `wait` for it.
    pub fn next(&mut self, wait: Duration) -> Result<Next<LoaderBatch>> {
        let Some(pass) = &self.pass else {
            return Ok(Next::Done);
        };
        let got = pass.next(wait);
        if pass::over(&got) {
            self.stop()?;
        }
        got
    }

    /// Ends the pass in progress, if any: closes its queue, joins its
    /// threads, takes the sources back and restores the CPU cache tier
    /// (a cache that follows the batch order starts each pass as packed).
    pub fn stop(&mut self) -> Result<()> {
        let Some(pass) = self.pass.take() else {
            return Ok(());
        };
        let src = pass.end();
        let restored = src.assemble.cpu_rows.as_ref().map(|c| c.restore());
        self.src = Some(src);
        restored.transpose().map(drop)
    }
}

impl Drop for Loader {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// A loader of either kind of layout.
pub enum Opened {
    Nodes(Box<Loader>),
    Typed(Box<TypedLoader>),
}

/// Opens the layout `opts` names with the loader of its kind: a typed
/// layout (staged first where it is remote) or a homogeneous one.
pub fn open(opts: LoaderOptions) -> Result<Opened> {
    let location = opts.manifest.trim_start_matches("file://");
    let typed = if location.contains("://") {
        let engine = IoEngine::new(IoOptions::default());
        staging::stage_typed(location, opts.local_dir.as_deref(), &engine, false)?
    } else {
        let path = std::path::Path::new(location);
        let (dir, file) = if location.ends_with(".json") {
            let dir = path.parent().unwrap_or(std::path::Path::new("."));
            (dir.to_path_buf(), path.to_path_buf())
        } else {
            (path.to_path_buf(), path.join(offgnn_manifests::MANIFEST))
        };
        // Unreadable here: the homogeneous path says why.
        std::fs::read(&file)
            .ok()
            .filter(|b| offgnn_manifests::is_typed(b))
            .map(|b| (dir, b))
    };
    match typed {
        Some((dir, bytes)) => {
            TypedLoader::open(opts, &dir, &bytes).map(|l| Opened::Typed(Box::new(l)))
        }
        None => Loader::open(opts).map(|l| Opened::Nodes(Box::new(l))),
    }
}

/// A pipeline batch in `NeighborLoader`'s convention. Block `l`'s
/// destinations are the first `num_dst` of its sources, and the last
/// block's are the seeds, so the nodes of hop `k` are those past the
/// destinations of block `L - k` up to its sources. A node's in-edges are
/// taken from the block whose destinations first hold it: edges are
/// sorted by destination, so they are one range of that block.
fn finish(r: Ready) -> Result<LoaderBatch> {
    let layers = r.blocks.len();
    let batch_size = r.blocks.last().map_or(r.labels.size()[0], |b| b.num_dst);
    let mut num_sampled_nodes = vec![batch_size];
    let mut num_sampled_edges = Vec::with_capacity(layers);
    let mut hops = Vec::with_capacity(layers);
    let mut reached = 0;
    for b in r.blocks.iter().rev() {
        let (from, to) = (
            b.offsets.f_int64_value(&[reached])?,
            b.offsets.f_int64_value(&[b.num_dst])?,
        );
        let (src, dst) = (
            b.src.f_narrow(0, from, to - from)?,
            b.dst.f_narrow(0, from, to - from)?,
        );
        hops.push(Tensor::f_stack(&[src, dst], 0)?);
        num_sampled_edges.push(to - from);
        num_sampled_nodes.push(b.num_src - b.num_dst);
        reached = b.num_dst;
    }
    let device = r.x.device();
    let edge_index = if hops.is_empty() {
        Tensor::f_zeros([2, 0], (Kind::Int64, device))?
    } else {
        Tensor::f_cat(&hops, 1)?
    };
    let blocks = r
        .blocks
        .iter()
        .map(|b| Ok((Tensor::f_stack(&[&b.src, &b.dst], 0)?, b.num_src, b.num_dst)))
        .collect::<Result<Vec<_>>>()?;
    let n_id: Vec<i64> = r.n_id.iter().map(|&v| i64::from(v)).collect();
    let link = r
        .pairs
        .as_ref()
        .map(|p| EdgeLabels::of(&p.src, &p.dst, p))
        .transpose()?;
    typed::sync(device)?;
    Ok(LoaderBatch {
        x: r.x,
        edge_index,
        y: r.labels,
        n_id: Tensor::from_slice(&n_id),
        batch_size,
        num_sampled_nodes,
        num_sampled_edges,
        blocks,
        link,
    })
}
