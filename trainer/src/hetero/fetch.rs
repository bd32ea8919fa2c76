//! Fetching a typed batch: its topology record and blocks, and each node
//! type's table and disk reads through the homogeneous loading stage (on
//! the loader thread); the batch the model takes once assembled.

use std::collections::BTreeMap;

use offgnn_manifests::{BatchRef, Split, TypedManifest};
use offgnn_shared::address_table::{self, BatchTable};
use offgnn_shared::io_engine::{AlignedBuf, IoEngine};
use tch::{Device, Tensor};

use super::historical::{self, TypedPlan};
use super::{Schema, TypedBlocks};
use crate::error::{Error, Result};
use crate::historical::Historical;
use crate::layout::{Layout, TableFile};
use crate::link::PairTensors;
use crate::pipeline::{self, LoadSources};

/// What fetching a batch reads: each type's layout and loading sources,
/// the topology tables. Shared with the loader thread.
#[derive(Clone, Copy)]
pub(super) struct Reader<'a> {
    pub(super) manifest: &'a TypedManifest,
    pub(super) schema: &'a Schema,
    pub(super) reads: &'a [Option<(Layout, LoadSources)>],
    pub(super) topology: &'a [TableFile],
    /// Whether a signal stops the fetch (else the step's all-reduce).
    pub(super) stops_on_signal: bool,
    /// The historical cache training batches are pruned against.
    pub(super) historical: Option<&'a Historical>,
}

/// A batch as the loader thread leaves it: each type's rows read, its
/// blocks and labels on the device.
pub(super) struct Fetched {
    pub(super) loaded: Vec<Option<pipeline::Loaded>>,
    pub(super) blocks: TypedBlocks,
    pub(super) labels: Tensor,
    pub(super) pairs: Option<PairTensors>,
    pub(super) disk_bytes: u64,
    /// Bytes of the rows read from disk (without the rest of their pages).
    pub(super) disk_rows_bytes: u64,
    pub(super) device: Device,
    /// The batch's part of the historical cache (a training step's).
    pub(super) plan: Option<TypedPlan>,
}

impl Reader<'_> {
    /// Batch `k` of `split` in sampled epoch `epoch`: its topology record
    /// and blocks, and each type's table and disk reads, into `bufs` (a
    /// buffer per node type, as [`Fetched::spare_buffers`] hands back;
    /// empty: fresh ones). As training step `step`, with the historical
    /// cache, it is pruned against the cache first.
    pub(super) fn fetch(
        &self,
        (split, epoch, k): (Split, u32, usize),
        step: Option<u64>,
        engine: &IoEngine,
        device: Device,
        mut bufs: Vec<AlignedBuf>,
    ) -> Result<Fetched> {
        if self.stops_on_signal {
            offgnn_shared::signals::check()?;
        }
        let at = |refs: &BTreeMap<Split, Vec<Vec<BatchRef>>>| -> Result<BatchRef> {
            refs.get(&split)
                .and_then(|e| e.get(epoch as usize))
                .and_then(|b| b.get(k))
                .copied()
                .ok_or_else(|| {
                    Error::InvalidArgument(format!("{split} epoch {epoch} has no batch {k}"))
                })
        };
        let r = at(&self.manifest.topology.schedule)?;
        let top = topology_record(
            &self.topology[r.segment as usize],
            r.record,
            self.schema.relations.len(),
        )?;
        let pruned = match (self.historical, step) {
            (Some(h), Some(step)) => historical::prune(h, step, &top, self.schema, device)?,
            _ => None,
        };
        // Each type's rows in the whole batch, and the blocks it trains on.
        let (blocks, plan, rows) = match pruned {
            Some(p) => (p.blocks, Some(p.plan), p.rows),
            None => {
                let blocks = TypedBlocks::new(self.schema, &top.input_nodes, &top.blocks, device)?;
                let rows = blocks.num_inputs.clone();
                (blocks, None, rows)
            }
        };
        let mut loaded = Vec::with_capacity(self.reads.len());
        let (mut disk_bytes, mut disk_rows_bytes) = (0, 0);
        for (t, part) in self.reads.iter().enumerate() {
            let Some((layout, src)) = part else {
                loaded.push(None);
                continue;
            };
            let r = at(&layout.manifest.schedule)?;
            let buf = bufs.get_mut(t).map_or_else(
                || AlignedBuf::new(0),
                |b| std::mem::replace(b, AlignedBuf::new(0)),
            );
            let inputs = plan.as_ref().map(|p| p.inputs(t));
            let l = pipeline::load_inputs(layout, engine, src, r, buf, inputs)?;
            if (l.table.index, i64::from(l.table.num_inputs)) != (top.index, rows[t]) {
                return Err(Error::InvalidArgument(format!(
                    "node type '{}': {split} epoch {epoch} batch {k} is not the topology's (its rows do not match)",
                    self.schema.types[t].0
                )));
            }
            disk_bytes += l.disk_bytes;
            disk_rows_bytes += l.disk_rows * src.row_bytes as u64;
            loaded.push(Some(l));
        }
        let labels =
            Tensor::from_slice(&top.labels.iter().map(|&l| i64::from(l)).collect::<Vec<_>>())
                .to_device(device);
        let pairs = pair_tensors(&top, &blocks, device)?;
        Ok(Fetched {
            loaded,
            blocks,
            labels,
            pairs,
            disk_bytes,
            disk_rows_bytes,
            device,
            plan,
        })
    }
}

impl Fetched {
    /// The read buffers, one per node type, once the batch is assembled:
    /// the loader reads the next batches into them, so that after the
    /// first batches no read lands in fresh (zeroed on first touch) pages.
    pub(super) fn spare_buffers(&mut self) -> Vec<AlignedBuf> {
        self.loaded
            .iter_mut()
            .map(|l| {
                l.as_mut().map_or_else(
                    || AlignedBuf::new(0),
                    |l| std::mem::replace(&mut l.buf, AlignedBuf::new(0)),
                )
            })
            .collect()
    }
}

/// A link batch's pairs on the device, their endpoints as rows of the
/// model's embeddings ([`TypedBlocks::seed_rows`]); none in a node batch.
fn pair_tensors(
    top: &BatchTable,
    blocks: &TypedBlocks,
    device: Device,
) -> Result<Option<PairTensors>> {
    let p = &top.pairs;
    if p.is_empty() {
        return Ok(None);
    }
    let row = |s: u32| {
        blocks.seed_rows.get(s as usize).copied().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "batch {}: a pair's endpoint {s} is not among its {} seeds",
                top.index,
                blocks.seed_rows.len()
            ))
        })
    };
    let src = p
        .src
        .iter()
        .map(|&s| row(s))
        .collect::<Result<Vec<i64>>>()?;
    let dst = p
        .dst
        .iter()
        .map(|&s| row(s))
        .collect::<Result<Vec<i64>>>()?;
    let ints = |v: &[u32]| v.iter().map(|&x| i64::from(x)).collect::<Vec<i64>>();
    let on = |v: &[i64]| Tensor::from_slice(v).to_device(device);
    Ok(Some(PairTensors {
        src: on(&src),
        dst: on(&dst),
        label: on(&ints(&p.label)),
        query: on(&ints(&p.query)),
        num_queries: p.query.iter().max().map_or(0, |&q| i64::from(q) + 1),
    }))
}

/// One batch, ready for the model.
pub(crate) struct Batch {
    /// Each type's input rows; empty where `first_means` is given.
    pub(crate) x: Vec<Tensor>,
    /// R-SAGE's first layer aggregated already, where the rows were not
    /// assembled ([`super::first_layer`]): each relation's means.
    pub(crate) first_means: Option<Vec<Tensor>>,
    pub(crate) blocks: TypedBlocks,
    pub(crate) labels: Tensor,
    /// A link batch's pairs.
    pub(crate) pairs: Option<PairTensors>,
    pub(super) disk_bytes: u64,
    pub(super) disk_rows_bytes: u64,
    /// The batch's part of the historical cache (a training step's).
    pub(super) plan: Option<TypedPlan>,
}

impl Batch {
    /// The batch's input to the model.
    pub(crate) fn inputs(&self) -> super::Inputs<'_> {
        match &self.first_means {
            Some(means) => super::Inputs::FirstMeans(means),
            None => super::Inputs::Rows(&self.x),
        }
    }
}

/// Record `record` of a topology table, decoded for `relations` relations.
fn topology_record(table: &TableFile, record: u32, relations: usize) -> Result<BatchTable> {
    let frame = table.record_bytes(record).ok_or_else(|| {
        Error::InvalidArgument(format!("{}: no record {record}", table.path.display()))
    })??;
    Ok(address_table::decode_typed_topology(
        &table.path.display().to_string(),
        &frame,
        relations,
    )?)
}
