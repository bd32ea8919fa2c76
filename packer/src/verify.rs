//! `packer verify`: rebuilds every batch's feature matrix from the packed
//! layout alone, exactly as the trainer will, and compares it byte for byte
//! with a direct gather from the original feature file (the packing oracle).
//! Every object's size and CRC32C is checked first.

use std::collections::HashMap;

use offgnn_manifests::{MANIFEST, Manifest};
use offgnn_shared::address_table::{self, BatchTable, FOOTER};
use offgnn_shared::dataset::Split;
use offgnn_shared::samples::RunSummary;
use offgnn_shared::store::Store;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::feature_source::FeatureSource;

#[derive(Clone, Debug, Default, Serialize)]
pub struct VerifySummary {
    pub manifest: String,
    pub objects: usize,
    pub object_bytes: u64,
    pub batches: u64,
    pub rows: u64,
    pub seconds: f64,
}

/// Splits a manifest location into its layout store and the manifest's name.
pub fn open_layout(location: &str) -> Result<(Store, Manifest, String)> {
    let (dir, name) = match location.rsplit_once('/') {
        Some((dir, name)) if name.ends_with(".json") => (dir.to_string(), name.to_string()),
        _ => (location.to_string(), MANIFEST.to_string()),
    };
    let store = Store::open(if dir.is_empty() { "." } else { &dir })?;
    let origin = format!("{}/{name}", store.url().trim_end_matches('/'));
    let bytes = store.get(&name)?;
    let manifest = Manifest::parse(&origin, &bytes)?;
    Ok((store, manifest, origin))
}

/// Reads `[offset, offset + len)` of an object.
fn range(store: &Store, name: &str, offset: u64, len: u64) -> Result<bytes::Bytes> {
    Ok(store.get_range(name, offset..offset + len)?)
}

/// Rows of a cache tier, read in runs of consecutive slots.
fn gather_slots(
    store: &Store,
    object: &str,
    pos: &[u32],
    slots: &[u32],
    rb: u64,
    out: &mut [u8],
) -> Result<()> {
    let mut order: Vec<(u32, u32)> = slots.iter().copied().zip(pos.iter().copied()).collect();
    order.sort_unstable();
    let mut i = 0;
    while i < order.len() {
        let mut j = i + 1;
        while j < order.len() && order[j].0 == order[j - 1].0 + 1 {
            j += 1;
        }
        let first = order[i].0 as u64;
        let data = range(store, object, first * rb, (j - i) as u64 * rb)?;
        for (k, &(_, p)) in order[i..j].iter().enumerate() {
            let dst = p as usize * rb as usize;
            out[dst..dst + rb as usize]
                .copy_from_slice(&data[k * rb as usize..(k + 1) * rb as usize]);
        }
        i = j;
    }
    Ok(())
}

/// Assembles a batch's input matrix from the layout (what the trainer does).
pub fn assemble(store: &Store, m: &Manifest, segment: usize, t: &BatchTable) -> Result<Vec<u8>> {
    let rb = m.dataset.row_bytes;
    let mut out = vec![0u8; t.num_inputs as usize * rb as usize];
    if !t.gpu_pos.is_empty() {
        let object = m
            .gpu_cache
            .object
            .as_deref()
            .ok_or_else(|| Error::Verify("GPU rows but no GPU cache".into()))?;
        gather_slots(store, object, &t.gpu_pos, &t.gpu_slot, rb, &mut out)?;
    }
    if !t.cpu_pos.is_empty() {
        let object = m
            .cpu_cache
            .object
            .as_deref()
            .ok_or_else(|| Error::Verify("CPU rows but no CPU cache".into()))?;
        gather_slots(store, object, &t.cpu_pos, &t.cpu_slot, rb, &mut out)?;
    }
    let seg = &m.segments[segment].object;
    let mut pages = Vec::new();
    for &(first, count) in &t.page_runs {
        pages.extend_from_slice(&range(store, seg, first * 4096, count * 4096)?);
    }
    for (&p, &off) in t.disk_pos.iter().zip(&t.disk_offset) {
        let (dst, src) = (p as usize * rb as usize, off as usize);
        out[dst..dst + rb as usize].copy_from_slice(&pages[src..src + rb as usize]);
    }
    if !t.packed_pos.is_empty() {
        let chunk = range(store, seg, t.chunk_offset, t.chunk_len)?;
        for (&p, &r) in t.packed_pos.iter().zip(&t.packed_row) {
            let (dst, src) = (p as usize * rb as usize, r as usize * rb as usize);
            out[dst..dst + rb as usize].copy_from_slice(&chunk[src..src + rb as usize]);
        }
    }
    Ok(out)
}

/// Reads the records of one segment's table object.
pub fn read_table(store: &Store, name: &str) -> Result<Vec<BatchTable>> {
    let size = store
        .size(name)?
        .ok_or_else(|| Error::Verify(format!("{name}: missing")))?;
    if size < FOOTER {
        return Err(Error::Verify(format!("{name}: too short for a table")));
    }
    let origin = format!("{}/{name}", store.url().trim_end_matches('/'));
    let footer = range(store, name, size - FOOTER, FOOTER)?;
    let (index_offset, _) = address_table::decode_footer(&origin, &footer, size)?;
    let index = range(store, name, index_offset, size - FOOTER - index_offset)?;
    let entries = address_table::decode_index(&origin, &index, index_offset)?;
    entries
        .into_iter()
        .map(|(off, len)| {
            Ok(address_table::decode(
                &origin,
                &range(store, name, off, len)?,
            )?)
        })
        .collect()
}

/// Checks every object's size and CRC32C.
pub fn check_objects(store: &Store, m: &Manifest) -> Result<u64> {
    let mut bytes = 0;
    for o in &m.objects {
        let size = store
            .size(&o.name)?
            .ok_or_else(|| Error::Verify(format!("object {} is missing", o.name)))?;
        if size != o.size {
            return Err(Error::Verify(format!(
                "object {} has {size} bytes, the manifest says {}",
                o.name, o.size
            )));
        }
        let mut crc = 0u32;
        let mut at = 0;
        while at < size {
            let n = (64u64 << 20).min(size - at);
            crc = crc32c::crc32c_append(crc, &range(store, &o.name, at, n)?);
            at += n;
        }
        if crc != o.crc32c {
            return Err(Error::Verify(format!(
                "object {}: checksum mismatch (corrupt or replaced)",
                o.name
            )));
        }
        bytes += size;
    }
    Ok(bytes)
}

pub fn verify(location: &str, show: bool) -> Result<VerifySummary> {
    let started = std::time::Instant::now();
    let (store, m, origin) = open_layout(location)?;
    let object_bytes = check_objects(&store, &m)?;
    let features = FeatureSource::open(&m.dataset.feature_location)?;
    if features.fingerprint()? != m.dataset.feature_fingerprint {
        return Err(Error::Mismatch(format!(
            "{} is no longer the feature file that was packed",
            features.describe()
        )));
    }
    let samples = Store::open(&m.samples.location)?;
    let run = RunSummary::read(&samples)?;
    let rb = m.dataset.row_bytes as usize;

    let mut tables: HashMap<(Split, u32, u32), (usize, BatchTable)> = HashMap::new();
    for (si, seg) in m.segments.iter().enumerate() {
        for t in read_table(&store, &seg.table)? {
            let split = t
                .split
                .ok_or_else(|| Error::Verify(format!("{}: a record without a split", seg.table)))?;
            tables.insert((split, t.epoch, t.index), (si, t));
        }
    }
    let scheduled: usize = m.schedule.values().flatten().map(Vec::len).sum();
    if tables.len() != scheduled {
        return Err(Error::Verify(format!(
            "{} table records for {scheduled} scheduled batches",
            tables.len()
        )));
    }
    let pb = if show {
        offgnn_shared::progress::bar(scheduled as u64, "verifying", "batches")
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut summary = VerifySummary {
        manifest: origin,
        objects: m.objects.len(),
        object_bytes,
        ..Default::default()
    };
    let mut row = vec![0u8; rb];
    for file in &run.files {
        for b in offgnn_shared::samples::read_file(&samples, file)? {
            let name = format!("{} epoch {} batch {}", b.split, b.epoch, b.index);
            let (si, t) = tables
                .remove(&(b.split, b.epoch, b.index))
                .ok_or_else(|| Error::Verify(format!("{name}: not in the layout")))?;
            if t.num_inputs as usize != b.input_nodes.len()
                || t.labels != b.labels
                || t.blocks != b.blocks
            {
                return Err(Error::Verify(format!(
                    "{name}: topology or labels differ from the samples"
                )));
            }
            let got = assemble(&store, &m, si, &t)?;
            for (i, &v) in b.input_nodes.iter().enumerate() {
                features.read_rows(v as u64, &mut row)?;
                if got[i * rb..(i + 1) * rb] != row[..] {
                    return Err(Error::Verify(format!(
                        "{name}: row {i} (node {v}) differs from the feature file"
                    )));
                }
            }
            summary.batches += 1;
            summary.rows += b.input_nodes.len() as u64;
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    if let Some(((split, epoch, index), _)) = tables.iter().next() {
        return Err(Error::Verify(format!(
            "{split} epoch {epoch} batch {index} is in the layout but not in the samples"
        )));
    }
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}
