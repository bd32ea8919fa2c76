//! A typed layout's topology tables: every batch's typed topology (its
//! labels, its input nodes in homogenized ids, its blocks with their
//! relation offsets), one table object per split and sampled epoch, in the
//! order the packer loaded the batches, which is the order every type's
//! layout schedules them and the trainer consumes them.

use std::collections::BTreeMap;
use std::path::Path;

use offgnn_manifests::{
    BatchRef, Object, Topology, TopologyTable, TypedBatchShape, TypedBlockShape,
};
use offgnn_shared::address_table::{self, BatchTable, FOOTER};
use offgnn_shared::dataset::Split;
use offgnn_shared::samples::RunSummary;
use offgnn_shared::store::Store;

use crate::address_tables::{finish_table, open_table};
use crate::error::{Error, Result};
use crate::plan::BatchInfo;

/// The tables written: the manifest's part, and the objects.
pub(crate) struct Written {
    pub topology: Topology,
    pub objects: Vec<Object>,
}

/// Consecutive runs of one split and epoch among the loaded batches.
fn groups(batches: &[BatchInfo]) -> Vec<(Split, u32, usize)> {
    let mut out: Vec<(Split, u32, usize)> = Vec::new();
    for b in batches {
        match out.last_mut() {
            Some((s, e, n)) if *s == b.split && *e == b.epoch => *n += 1,
            _ => out.push((b.split, b.epoch, 1)),
        }
    }
    out
}

/// The tables' bytes, known from the loaded batches (measured with
/// [`crate::load::View::Topology`]) before any is written: every record
/// with its index entry, and a footer per table.
pub(crate) fn planned_bytes(batches: &[BatchInfo]) -> u64 {
    batches.iter().map(|b| b.table_bytes).sum::<u64>() + FOOTER * groups(batches).len() as u64
}

/// Streams the samples once more and writes the tables under `prefix`;
/// `batches` are the loaded batches, whose order the tables keep.
pub(crate) fn write(
    (samples, run): (&Store, &RunSummary),
    (staging, prefix): (&Path, &str),
    batches: &[BatchInfo],
    show: bool,
) -> Result<Written> {
    let pb = offgnn_shared::progress::bar_if(show, batches.len() as u64, "topology", "batches");
    let mut tables = Vec::new();
    let mut objects = Vec::new();
    let mut schedule: BTreeMap<Split, Vec<Vec<BatchRef>>> = BTreeMap::new();
    let (mut scratch, mut frame) = (Vec::new(), Vec::new());
    let types: Vec<(u64, u64)> = run
        .dataset
        .node_types
        .iter()
        .map(|t| (t.offset, t.num))
        .collect();
    let relations = run.dataset.relations.len();
    let mut largest = TypedBatchShape::zeros(types.len(), relations, run.params.fanouts.len());
    let mut at = 0usize;
    for (gi, &(split, epoch, count)) in groups(batches).iter().enumerate() {
        let name = format!("{prefix}/topology-{gi:05}.bin");
        let mut table = open_table(staging, &name)?;
        for file in run.files_of(split, epoch) {
            offgnn_shared::signals::check()?;
            for b in offgnn_shared::samples::read_file(samples, file)? {
                let loaded = batches.get(at);
                if loaded.is_none_or(|l| (l.split, l.epoch, l.index) != (split, epoch, b.index)) {
                    return Err(Error::InvalidArgument(format!(
                        "{}: batch {} of {split} epoch {epoch} is not where it was when the samples were loaded: were they replaced while packing?",
                        file.object.name, b.index
                    )));
                }
                let t = BatchTable::topology(b, split, epoch);
                largest.widen(&shape(&t, &types, relations).map_err(|e| {
                    Error::InvalidArgument(format!("{}: batch {}: {e}", file.object.name, t.index))
                })?);
                address_table::typed_topology_frame(&t, &mut scratch, &mut frame)
                    .map_err(|e| Error::io(&name, e))?;
                table.push(&frame).map_err(|e| Error::io(&name, e))?;
                at += 1;
                pb.inc(1);
            }
        }
        if table.len() != count {
            return Err(Error::InvalidArgument(format!(
                "the samples hold {} batches of {split} epoch {epoch}, {count} when they were loaded",
                table.len()
            )));
        }
        objects.push(finish_table(name.clone(), table)?);
        tables.push(TopologyTable {
            object: name,
            split,
            epoch,
            batches: count as u32,
        });
        let epochs = schedule.entry(split).or_default();
        while epochs.len() <= epoch as usize {
            epochs.push(Vec::new());
        }
        epochs[epoch as usize] = (0..count as u32)
            .map(|record| BatchRef {
                segment: gi as u32,
                record,
            })
            .collect();
    }
    pb.finish_and_clear();
    let bytes: u64 = objects.iter().map(|o| o.size).sum();
    if bytes != planned_bytes(batches) {
        return Err(Error::InvalidArgument(format!(
            "internal: the topology tables take {bytes} bytes, the plan counted {}",
            planned_bytes(batches)
        )));
    }
    Ok(Written {
        topology: Topology {
            tables,
            schedule,
            bytes,
            largest_batch: Some(largest),
        },
        objects,
    })
}

/// Batch `t`'s shape over node types of homogenized id ranges `types`
/// (`(offset, rows)`) and `relations` relations.
pub(crate) fn shape(
    t: &BatchTable,
    types: &[(u64, u64)],
    relations: usize,
) -> std::result::Result<TypedBatchShape, String> {
    let kinds = t
        .input_nodes
        .iter()
        .map(|&v| {
            let v = u64::from(v);
            types
                .iter()
                .position(|&(offset, rows)| v >= offset && v - offset < rows)
                .ok_or_else(|| format!("input node {v} is of no node type"))
        })
        .collect::<std::result::Result<Vec<usize>, String>>()?;
    let mut inputs = vec![0; types.len()];
    for &k in &kinds {
        inputs[k] += 1;
    }
    let blocks = t
        .blocks
        .iter()
        .map(|b| {
            let mut dst = vec![0; types.len()];
            for &k in &kinds[..(b.num_dst as usize).min(kinds.len())] {
                dst[k] += 1;
            }
            let edges = (0..relations)
                .map(|r| match (b.relations.get(r), b.relations.get(r + 1)) {
                    (Some(&from), Some(&to)) => u64::from(to.saturating_sub(from)),
                    _ => 0,
                })
                .collect();
            TypedBlockShape { dst, edges }
        })
        .collect();
    Ok(TypedBatchShape { inputs, blocks })
}
