//! `packer verify` of a typed layout: every object's size and checksum;
//! the topology tables against the samples (input nodes, labels, blocks
//! and their relation offsets); every node type's layout rebuilt batch by
//! batch and compared with its feature file, as a homogeneous layout is;
//! and each type's batches are the topology's inputs of that type, in
//! their order.

use std::collections::HashMap;

use offgnn_manifests::{TypedBatchShape, TypedManifest};
use offgnn_shared::address_table::{self, BatchTable};
use offgnn_shared::dataset::Split;
use offgnn_shared::samples::RunSummary;
use offgnn_shared::store::Store;

use super::TypeView;
use crate::error::{Error, Result};
use crate::verify::{VerifySummary, check_objects, read_records, read_table, verify_layout};

/// Verifies the typed layout whose manifest `bytes` were read from
/// `origin` in `store`.
pub fn verify_typed(
    store: &Store,
    origin: String,
    bytes: &[u8],
    show: bool,
) -> Result<VerifySummary> {
    let started = std::time::Instant::now();
    let m = TypedManifest::parse(&origin, bytes)?;
    let object_bytes = check_objects(store, &m.objects)?;
    let samples = Store::open_read(&m.samples.location)?;
    let run = RunSummary::read(&samples)?;
    if run.dataset.fingerprint != m.dataset.dataset_fingerprint {
        return Err(Error::Mismatch(format!(
            "{}: the samples are of another dataset than the layout was packed from",
            samples.url()
        )));
    }
    let relations = m.relations.len();
    let topology: Vec<Vec<BatchTable>> = m
        .topology
        .tables
        .iter()
        .map(|t| {
            read_records(store, &t.object, |origin, frame| {
                address_table::decode_typed_topology(origin, frame, relations)
            })
        })
        .collect::<Result<_>>()?;
    let by_batch = check_against_samples(&m, &topology, (&samples, &run))?;
    check_largest_batch(&m, &topology)?;
    // Each split's epochs, as the topology orders their batches.
    let order: Order = m
        .topology
        .schedule
        .iter()
        .map(|(split, epochs)| {
            let epochs = epochs
                .iter()
                .map(|refs| {
                    refs.iter()
                        .map(|r| topology[r.segment as usize][r.record as usize].index)
                        .collect()
                })
                .collect();
            (*split, epochs)
        })
        .collect();
    let mut summary = VerifySummary {
        manifest: origin,
        objects: m.objects.len(),
        object_bytes,
        ..Default::default()
    };
    for (i, part) in m.node_types.iter().enumerate() {
        let Some(layout) = &part.layout else { continue };
        let info = run.dataset.node_types.get(i).ok_or_else(|| {
            Error::Mismatch(format!(
                "the layout's node type '{}' is not in the samples' run",
                part.name
            ))
        })?;
        let view = TypeView::of(i, info, &m.dataset.target_type)?;
        check_type_inputs(store, layout, &view, (&by_batch, &order))?;
        let s =
            verify_layout(store, layout, Some(&view), show).map_err(|e| in_type(e, &part.name))?;
        summary.batches += s.batches;
        summary.rows += s.rows;
    }
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

/// The largest batch's shape the manifest records is the topology's.
fn check_largest_batch(m: &TypedManifest, topology: &[Vec<BatchTable>]) -> Result<()> {
    let Some(recorded) = &m.topology.largest_batch else {
        return Ok(());
    };
    let types: Vec<(u64, u64)> = m.node_types.iter().map(|t| (t.offset, t.rows)).collect();
    let relations = m.relations.len();
    let mut largest = TypedBatchShape::zeros(types.len(), relations, m.samples.fanouts.len());
    for t in topology.iter().flatten() {
        largest.widen(&super::topology::shape(t, &types, relations).map_err(Error::Verify)?);
    }
    if &largest != recorded {
        return Err(Error::Verify(
            "the manifest's largest batch is not the topology's largest".into(),
        ));
    }
    Ok(())
}

/// Names the node type in a verification's fault.
fn in_type(e: Error, name: &str) -> Error {
    match e {
        Error::Verify(fault) => Error::Verify(format!("node type '{name}': {fault}")),
        other => other,
    }
}

type Batches<'a> = HashMap<(Split, u32, u32), &'a BatchTable>;
/// Per split and epoch, the batches' indices in the topology's order.
type Order = std::collections::BTreeMap<Split, Vec<Vec<u32>>>;

/// Every topology record against its batch in the samples, and no batch
/// on one side only; returns the records by batch.
fn check_against_samples<'a>(
    m: &TypedManifest,
    topology: &'a [Vec<BatchTable>],
    (samples, run): (&Store, &RunSummary),
) -> Result<Batches<'a>> {
    let mut place: Batches<'a> = HashMap::new();
    for (table, records) in m.topology.tables.iter().zip(topology) {
        for t in records {
            if t.split != Some(table.split) || t.epoch != table.epoch {
                return Err(Error::Verify(format!(
                    "{}: a record of {:?} epoch {} in the table of {} epoch {}",
                    table.object, t.split, t.epoch, table.split, table.epoch
                )));
            }
            place.insert((table.split, t.epoch, t.index), t);
        }
    }
    let mut unseen = place.clone();
    for file in &run.files {
        for b in offgnn_shared::samples::read_file(samples, file)? {
            let name = format!("{} epoch {} batch {}", b.split, b.epoch, b.index);
            let t = unseen
                .remove(&(b.split, b.epoch, b.index))
                .ok_or_else(|| Error::Verify(format!("{name}: not in the topology tables")))?;
            if t.input_nodes != b.input_nodes
                || t.labels != b.labels
                || t.blocks != b.blocks
                || t.pairs != b.pairs
            {
                return Err(Error::Verify(format!(
                    "{name}: the topology table's inputs, labels, blocks or pairs differ from the samples"
                )));
            }
        }
    }
    if let Some(((split, epoch, index), _)) = unseen.iter().next() {
        return Err(Error::Verify(format!(
            "{split} epoch {epoch} batch {index} is in the topology tables but not in the samples"
        )));
    }
    Ok(place)
}

/// The type's layout holds, for every batch, the topology's inputs of
/// that type in their order, and is scheduled in the topology's order.
fn check_type_inputs(
    store: &Store,
    layout: &offgnn_manifests::Manifest,
    view: &TypeView,
    (by_batch, order): (&Batches<'_>, &Order),
) -> Result<()> {
    let tables: Vec<Vec<BatchTable>> = layout
        .segments
        .iter()
        .map(|s| read_table(store, &s.table))
        .collect::<Result<_>>()?;
    for (split, epochs) in &layout.schedule {
        for (epoch, refs) in epochs.iter().enumerate() {
            let want = order.get(split).and_then(|e| e.get(epoch));
            for (at, r) in refs.iter().enumerate() {
                let t = &tables[r.segment as usize][r.record as usize];
                let name = format!("{split} epoch {} batch {}", t.epoch, t.index);
                if want.and_then(|w| w.get(at)) != Some(&t.index) || t.epoch as usize != epoch {
                    return Err(Error::Verify(format!(
                        "node type '{}': {name} is scheduled out of the topology's order",
                        view.name
                    )));
                }
                let whole = by_batch
                    .get(&(*split, t.epoch, t.index))
                    .ok_or_else(|| Error::Verify(format!("{name}: not in the topology tables")))?;
                if t.input_nodes != view.project(&whole.input_nodes) {
                    return Err(Error::Verify(format!(
                        "node type '{}': {name}: its inputs are not the batch's inputs of the type",
                        view.name
                    )));
                }
            }
        }
    }
    Ok(())
}
