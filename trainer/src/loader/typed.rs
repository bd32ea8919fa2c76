//! The loader over a typed layout: a split's batches read, assembled and
//! shaped on a background thread by the typed training's stages, handed
//! over in PyTorch Geometric's heterogeneous `NeighborLoader` convention
//! (a `HeteroData`: per node type its rows, node ids and nodes per hop;
//! per relation its edges, hop by hop, and edges per hop; a link batch's
//! pairs on their relation).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use offgnn_manifests::{Split, TypedManifest};
use offgnn_shared::io_engine::IoEngine;
use tch::{Device, Kind, Tensor};

use super::pass::{self, Pass};
use super::{EdgeLabels, LoaderOptions, Next};
use crate::error::{Error, Result};
use crate::hetero::train::{Batch, Run, TypedLayout};
use crate::hetero::{Schema, TypedBlocks};
use crate::memory::MemoryEstimate;
use crate::pipeline::FeatureMode;

/// One node type of a typed batch.
pub struct TypedNodes {
    pub name: String,
    /// Its input rows, float32 on the device (`[n, 0]` for a type without
    /// features).
    pub x: Tensor,
    /// Type-local node ids, int64 on the host.
    pub n_id: Tensor,
    /// Its nodes first reached at each hop (the seeds at hop 0).
    pub num_sampled_nodes: Vec<i64>,
}

/// One relation of a typed batch.
pub struct TypedEdges {
    /// `(source type, relation, destination type)`.
    pub key: (String, String, String),
    /// `[2, E]` int64 positions among the source and destination types'
    /// rows: each destination's in-edges as sampled at the hop that
    /// reached it, hop by hop.
    pub edge_index: Tensor,
    pub num_sampled_edges: Vec<i64>,
}

/// A typed batch in `NeighborLoader`'s heterogeneous convention.
pub struct TypedLoaderBatch {
    /// The seeds' type.
    pub target: String,
    pub batch_size: i64,
    /// The seeds' labels, int64 on the device.
    pub y: Tensor,
    pub types: Vec<TypedNodes>,
    pub relations: Vec<TypedEdges>,
    /// Each layer's message-flow graph, input layer first: each relation's
    /// `[2, E]` edges, and each type's sources and destinations.
    pub blocks: Vec<(Vec<Tensor>, Vec<i64>, Vec<i64>)>,
    /// A link-prediction batch's pairs, on the relation they are of
    /// (`relations[i]`'s key).
    pub link: Option<(usize, EdgeLabels)>,
}

/// A typed layout opened for reading batches in passes.
pub struct TypedLoader {
    engine: Arc<IoEngine>,
    /// With the loader between passes, with the pass's thread during one.
    layout: Option<TypedLayout>,
    pass: Option<Pass<TypedLoaderBatch, TypedLayout>>,
    opts: LoaderOptions,
    manifest: TypedManifest,
    /// The stated peak host memory; `None` where the layout records no
    /// largest batch to state it from (packed before it did).
    pub memory: Option<MemoryEstimate>,
}

impl TypedLoader {
    /// Opens the typed layout in `dir` (staged already where it was
    /// remote) whose manifest is `bytes`, and loads each type's caches.
    pub fn open(opts: LoaderOptions, dir: &Path, bytes: &[u8]) -> Result<TypedLoader> {
        let manifest = TypedManifest::parse(&dir.display().to_string(), bytes)?;
        let schema = Schema::of(&manifest)?;
        let memory = crate::hetero::memory::loader_estimate(
            &manifest,
            &schema,
            opts.device,
            opts.prefetch as u64 + 1,
        );
        if let Some(limit) = opts.memory {
            let Some(m) = &memory else {
                return Err(crate::hetero::memory::unstated("memory", limit));
            };
            super::check_memory(limit, m)?;
        }
        let engine = crate::io_depth::default_engine_for((dir, &manifest.objects));
        let layout = TypedLayout::open(
            dir,
            manifest.clone(),
            &engine,
            (FeatureMode::Packed, opts.device),
            false,
        )?;
        Ok(TypedLoader {
            engine: Arc::new(engine),
            layout: Some(layout),
            pass: None,
            opts,
            manifest,
            memory,
        })
    }

    pub fn manifest(&self) -> &TypedManifest {
        &self.manifest
    }

    /// Sampled epochs of training batches.
    pub fn sampled_epochs(&self) -> usize {
        self.manifest
            .topology
            .schedule
            .get(&Split::Train)
            .map_or(0, Vec::len)
    }

    /// The sampled epoch `split` reads in `epoch`, and the positions of its
    /// batches this rank reads, in order: as typed training deals them
    /// (epoch `t` reads sampled epoch `t mod E` in its order).
    pub fn batches(&self, split: Split, epoch: u32) -> (u32, Vec<usize>) {
        let (world, rank) = self.opts.ranks;
        let sampled = match split {
            Split::Train => epoch % self.sampled_epochs().max(1) as u32,
            _ => 0,
        };
        let n = self
            .manifest
            .topology
            .schedule
            .get(&split)
            .and_then(|e| e.get(sampled as usize))
            .map_or(0, Vec::len);
        let order = match split {
            Split::Train => crate::distributed::deal(n, world as usize, rank as usize),
            _ => crate::distributed::eval_share(n, world as usize, rank as usize).collect(),
        };
        (sampled, order)
    }

    /// Starts a pass over `split`'s batches of `epoch` (ending one in
    /// progress); returns how many it reads.
    pub fn start(&mut self, split: Split, epoch: u32) -> Result<usize> {
        self.stop()?;
        if !self.manifest.topology.schedule.contains_key(&split) {
            return Err(Error::Layout(format!("the layout has no {split} batches")));
        }
        let (sampled, order) = self.batches(split, epoch);
        let n = order.len();
        let layout = self
            .layout
            .take()
            .expect("the layout is back between passes");
        let (engine, device) = (Arc::clone(&self.engine), self.opts.device);
        self.pass = Some(Pass::start(
            self.opts.prefetch,
            layout,
            move |layout: &TypedLayout, send| {
                let run = Run::one(&engine, device);
                layout
                    .for_each_batch((split, sampled, &order), run, &mut |_, b| {
                        send(finish(layout, b)?)
                    })
                    .map(drop)
            },
        )?);
        Ok(n)
    }

    /// The pass's next batch, waiting at most `wait` for it.
    pub fn next(&mut self, wait: Duration) -> Result<Next<TypedLoaderBatch>> {
        let Some(pass) = &self.pass else {
            return Ok(Next::Done);
        };
        let got = pass.next(wait);
        if pass::over(&got) {
            self.stop()?;
        }
        got
    }

    /// Ends the pass in progress, if any: joins its threads, takes the
    /// layout back and restores the CPU caches that follow the batch order.
    pub fn stop(&mut self) -> Result<()> {
        let Some(pass) = self.pass.take() else {
            return Ok(());
        };
        let layout = pass.end();
        let restored = layout.restore_cpu_caches();
        self.layout = Some(layout);
        restored.map(drop)
    }
}

impl Drop for TypedLoader {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Each type's sources and destinations in each block, input layer first:
/// block `l`'s sources of a type are block `l - 1`'s destinations of it
/// (the inputs for the first), and each type's destinations a prefix of
/// its sources.
fn sizes(b: &TypedBlocks) -> Vec<(Vec<i64>, Vec<i64>)> {
    let mut src = b.num_inputs.clone();
    b.layers
        .iter()
        .map(|layer| {
            let this = (src.clone(), layer.num_dst.clone());
            src.clone_from(&layer.num_dst);
            this
        })
        .collect()
}

/// A typed batch in the heterogeneous convention: as the homogeneous one
/// ([`super::finish`]), per relation, each destination's in-edges taken
/// from the block whose destinations of its type first hold it.
fn finish(layout: &TypedLayout, b: Batch) -> Result<TypedLoaderBatch> {
    let schema = &layout.schema;
    let sizes = sizes(&b.blocks);
    let layers = sizes.len();
    let target = schema.target;
    let batch_size = sizes.last().map_or(0, |(_, dst)| dst[target]);
    let mut types = Vec::with_capacity(schema.types.len());
    for (t, (x, n_id)) in b.x.into_iter().zip(&b.blocks.n_id).enumerate() {
        let mut num_sampled_nodes = vec![sizes.last().map_or(0, |(_, dst)| dst[t])];
        num_sampled_nodes.extend(sizes.iter().rev().map(|(src, dst)| src[t] - dst[t]));
        types.push(TypedNodes {
            name: schema.types[t].0.clone(),
            x,
            n_id: Tensor::from_slice(n_id),
            num_sampled_nodes,
        });
    }
    let device = b.labels.device();
    let mut relations = Vec::with_capacity(schema.relations.len());
    for (r, (s, name, d)) in schema.relations.iter().enumerate() {
        let mut hops = Vec::with_capacity(layers);
        let mut num_sampled_edges = Vec::with_capacity(layers);
        let mut reached = 0;
        for (layer, (_, dst)) in b.blocks.layers.iter().zip(&sizes).rev() {
            let e = &layer.relations[r];
            let (from, to) = (
                e.offsets.f_int64_value(&[reached])?,
                e.offsets.f_int64_value(&[dst[*d]])?,
            );
            let (src_ids, dst_ids) = (
                e.src.f_narrow(0, from, to - from)?,
                e.dst.f_narrow(0, from, to - from)?,
            );
            hops.push(Tensor::f_stack(&[src_ids, dst_ids], 0)?);
            num_sampled_edges.push(to - from);
            reached = dst[*d];
        }
        let edge_index = if hops.is_empty() {
            Tensor::f_zeros([2, 0], (Kind::Int64, device))?
        } else {
            Tensor::f_cat(&hops, 1)?
        };
        relations.push(TypedEdges {
            key: (
                schema.types[*s].0.clone(),
                name.clone(),
                schema.types[*d].0.clone(),
            ),
            edge_index,
            num_sampled_edges,
        });
    }
    let link = match &b.pairs {
        Some(p) => Some(link_labels(layout, &sizes, p)?),
        None => None,
    };
    let blocks = b
        .blocks
        .layers
        .iter()
        .zip(sizes)
        .map(|(layer, (src, dst))| {
            let edges = layer
                .relations
                .iter()
                .map(|e| Tensor::f_stack(&[&e.src, &e.dst], 0))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            Ok((edges, src, dst))
        })
        .collect::<Result<Vec<_>>>()?;
    sync(device)?;
    Ok(TypedLoaderBatch {
        target: schema.types[target].0.clone(),
        batch_size,
        y: b.labels,
        types,
        relations,
        blocks,
        link,
    })
}

/// A typed link batch's pairs on the layout's link relation: their
/// endpoints, rows among every type's seeds one type after another (as the
/// model's embeddings stack them), as rows of the relation's source and
/// destination types.
fn link_labels(
    layout: &TypedLayout,
    sizes: &[(Vec<i64>, Vec<i64>)],
    p: &crate::link::PairTensors,
) -> Result<(usize, EdgeLabels)> {
    // The schema's relations are the manifest's, in its order.
    let name = &layout.manifest.dataset.link_relation;
    let r = layout
        .manifest
        .relations
        .iter()
        .position(|rel| rel == name)
        .ok_or_else(|| Error::Layout(format!("link relation '{name}' is not in the schema")))?;
    let (s, _, d) = layout.schema.relations[r];
    let seeds = sizes.last().map_or(&[][..], |(_, dst)| &dst[..]);
    if seeds.len() <= s.max(d) {
        return Err(Error::Layout(format!(
            "a link batch of {name} without blocks"
        )));
    }
    let first = |t: usize| seeds[..t].iter().sum::<i64>();
    let local = |rows: &Tensor, t: usize| -> Result<Tensor> {
        let local = rows.f_sub_scalar(first(t))?;
        if local.numel() > 0 {
            let (lo, hi) = (
                local.f_min()?.f_int64_value(&[])?,
                local.f_max()?.f_int64_value(&[])?,
            );
            if lo < 0 || hi >= seeds[t] {
                return Err(Error::Layout(format!(
                    "a pair of {name} has an endpoint outside the {} seeds of type '{}'",
                    seeds[t], layout.schema.types[t].0
                )));
            }
        }
        Ok(local)
    };
    Ok((
        r,
        EdgeLabels::of(&local(&p.src, s)?, &local(&p.dst, d)?, p)?,
    ))
}

/// On CUDA, the batch's kernels done before another thread's stream reads
/// its tensors.
pub(super) fn sync(device: Device) -> Result<()> {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
    Ok(())
}
