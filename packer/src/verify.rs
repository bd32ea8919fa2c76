//! `packer verify`: rebuilds every batch's feature matrix from the packed
//! layout alone, exactly as the trainer will, and compares it byte for byte
//! with the original feature file's rows (the packing oracle). Every
//! object's size and CRC32C is checked first. Local files are mapped, so
//! that a gather touches only the rows it needs.

use std::collections::HashMap;

use offgnn_manifests::{MANIFEST, Manifest};
use offgnn_shared::address_table::{self, BatchTable, FOOTER};
use offgnn_shared::dataset::Split;
use offgnn_shared::io_engine::MappedFile;
use offgnn_shared::samples::RunSummary;
use offgnn_shared::store::Store;
use rayon::prelude::*;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::feature_source::FeatureSource;
use crate::store_dtype;
use offgnn_manifests::Dtype;

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
    let (store, name, origin) = layout_location(location)?;
    let bytes = store.get(&name)?;
    let manifest = Manifest::parse(&origin, &bytes)?;
    Ok((store, manifest, origin))
}

/// A manifest location's layout store, the manifest's name in it, and
/// its URL.
pub fn layout_location(location: &str) -> Result<(Store, String, String)> {
    let (dir, name) = match location.rsplit_once('/') {
        Some((dir, name)) if name.ends_with(".json") => (dir.to_string(), name.to_string()),
        _ => (location.to_string(), MANIFEST.to_string()),
    };
    let store = Store::open_read(if dir.is_empty() { "." } else { &dir })?;
    let origin = format!("{}/{name}", store.url().trim_end_matches('/'));
    Ok((store, name, origin))
}

/// Reads `[offset, offset + len)` of an object.
fn range(store: &Store, name: &str, offset: u64, len: u64) -> Result<bytes::Bytes> {
    Ok(store.get_range(name, offset..offset + len)?)
}

/// Reads over a gap this small rather than ask again: over an object store
/// a request costs more than reading this much.
const COALESCE_GAP: u64 = 256 << 10;
/// A span grows to this many bytes at most (then a new one starts): one
/// reused buffer holds any span.
const MAX_SPAN: u64 = 64 << 20;

/// Groups sorted row numbers into spans read as one request each: `(first
/// row, rows, index of the first in `rows`, count)`.
fn spans(rows: &[u64], row_bytes: u64) -> Vec<(u64, u64, usize, usize)> {
    let rb = row_bytes.max(1);
    let gap_rows = (COALESCE_GAP / rb).max(1);
    let max_rows = (MAX_SPAN / rb).max(1);
    let mut out: Vec<(u64, u64, usize, usize)> = Vec::new();
    for (i, &r) in rows.iter().enumerate() {
        match out.last_mut() {
            Some((first, len, _, count))
                if r < *first + *len + gap_rows && r - *first < max_rows =>
            {
                *len = (*len).max(r - *first + 1);
                *count += 1;
            }
            _ => out.push((r, 1, i, 1)),
        }
    }
    out
}

/// Buffers reused from batch to batch: fresh memory costs page faults, and
/// a batch's matrices and spans run to gigabytes.
#[derive(Default)]
pub struct Scratch {
    span: Vec<u8>,
    pages: Vec<u8>,
    got: Vec<u8>,
}

/// Fills `buf` with `len` bytes of `object` from `offset`.
fn read_span(store: &Store, object: &str, offset: u64, len: u64, buf: &mut Vec<u8>) -> Result<()> {
    buf.resize(len as usize, 0);
    Ok(store.read_into(object, offset, buf)?)
}

/// Where a gather's rows come from: a local file, mapped (each row copied
/// from where it lies in the page cache), or ranged reads of nearby rows in
/// spans (a remote store). Copying whole spans would move a feature file
/// through memory once per batch, where a mapped file copies only the rows
/// a batch needs.
enum RowSource<'a> {
    Mapped {
        name: &'a str,
        bytes: &'a [u8],
        /// Where row 0 starts.
        base: u64,
    },
    /// Fills the buffer with rows from the given row on.
    Read(&'a dyn Fn(u64, &mut [u8]) -> Result<()>),
}

/// Row `r` of a mapped file whose row 0 starts at `base`; `None` past its end.
fn mapped_row(bytes: &[u8], base: u64, r: u64, rb: usize) -> Option<&[u8]> {
    let at = usize::try_from(r.checked_mul(rb as u64)?.checked_add(base)?).ok()?;
    bytes.get(at..at.checked_add(rb)?)
}

/// Calls `each(r, d, row)` for every `(r, d)` of `order` (sorted by `r`),
/// with `row` read by `read` in spans of nearby rows through `buf`.
fn for_each_spanned_row(
    order: &[(u64, usize)],
    rb: usize,
    buf: &mut Vec<u8>,
    read: &dyn Fn(u64, &mut [u8]) -> Result<()>,
    mut each: impl FnMut(u64, usize, &[u8]) -> Result<()>,
) -> Result<()> {
    let rows: Vec<u64> = order.iter().map(|o| o.0).collect();
    for (first, len, at, count) in spans(&rows, rb as u64) {
        buf.resize(len as usize * rb, 0);
        read(first, buf)?;
        for &(r, d) in &order[at..at + count] {
            let src = (r - first) as usize * rb;
            each(r, d, &buf[src..src + rb])?;
        }
    }
    Ok(())
}

/// Copies row `r` of `src` to row `d` of `out` for every `(r, d)` of
/// `order`, sorted by `r` (a mapped file is touched front to back; a read
/// covers nearby rows at once).
fn gather(
    src: &RowSource,
    order: &[(u64, usize)],
    rb: usize,
    out: &mut [u8],
    buf: &mut Vec<u8>,
) -> Result<()> {
    let mut put = |d: usize, row: &[u8]| out[d * rb..(d + 1) * rb].copy_from_slice(row);
    match src {
        RowSource::Mapped { name, bytes, base } => {
            for &(r, d) in order {
                let row = mapped_row(bytes, *base, r, rb).ok_or_else(|| {
                    Error::Verify(format!(
                        "{name}: row {r} lies past its end ({} bytes)",
                        bytes.len()
                    ))
                })?;
                put(d, row);
            }
            Ok(())
        }
        RowSource::Read(read) => for_each_spanned_row(order, rb, buf, *read, |_, d, row| {
            put(d, row);
            Ok(())
        }),
    }
}

/// `(row, position)` pairs sorted by row.
fn by_row(
    rows: impl Iterator<Item = u64>,
    positions: impl Iterator<Item = usize>,
) -> Vec<(u64, usize)> {
    let mut order: Vec<(u64, usize)> = rows.zip(positions).collect();
    order.sort_unstable();
    order
}

/// The local files a verify run maps: the cache tiers' objects and the
/// feature file, where they are local.
struct Maps {
    objects: HashMap<String, MappedFile>,
    features: Option<MappedFile>,
}

impl Maps {
    fn open(store: &Store, m: &Manifest, features: &FeatureSource) -> Result<Maps> {
        let mut objects = HashMap::new();
        for name in [&m.gpu_cache.object, &m.cpu_cache.object]
            .into_iter()
            .flatten()
        {
            if let Some(path) = store.local_file(name) {
                objects.insert(name.clone(), MappedFile::open(&path)?);
            }
        }
        let features = features.local_path().map(MappedFile::open).transpose()?;
        Ok(Maps { objects, features })
    }
}

/// Rows of a cache tier's object into their input positions: `order`
/// holds `(slot, position)` pairs sorted by slot.
fn gather_slots(
    store: &Store,
    maps: &Maps,
    object: &str,
    order: &[(u64, usize)],
    rb: u64,
    out: &mut [u8],
    span: &mut Vec<u8>,
) -> Result<()> {
    let read = |first: u64, buf: &mut [u8]| -> Result<()> {
        Ok(store.read_into(object, first * rb, buf)?)
    };
    let src = match maps.objects.get(object) {
        Some(map) => RowSource::Mapped {
            name: object,
            bytes: map.bytes(),
            base: 0,
        },
        None => RowSource::Read(&read),
    };
    gather(&src, order, rb as usize, out, span)
}

/// How a layout's rows relate to the feature file's: the stride of each,
/// and the conversion between their types.
#[derive(Clone, Copy)]
struct Rows {
    /// Bytes of a layout row (values of `to`).
    stored: usize,
    /// Bytes of a feature-file row (values of `from`).
    source: usize,
    from: Dtype,
    to: Dtype,
}

/// Compares row `i` of `got` with the feature file's row of `nodes[i]`
/// (converted exactly as packing converts it), for every `i`, in place: a
/// mapped file's rows in parallel, a remote one's in spans of nearby rows.
/// A mismatch names the first differing row (in node order).
fn compare_with_features(
    features: &FeatureSource,
    maps: &Maps,
    nodes: &[u32],
    got: &[u8],
    rows: Rows,
    buf: &mut Vec<u8>,
) -> Result<()> {
    let order = by_row(nodes.iter().map(|&v| u64::from(v)), 0..nodes.len());
    let (rb, srb) = (rows.stored, rows.source);
    let differs = |i: usize, row: &[u8]| {
        !store_dtype::equals_converted(row, rows.from, &got[i * rb..(i + 1) * rb], rows.to)
    };
    let mismatch = |v: u64, i: usize| format!("row {i} (node {v}) differs from the feature file");
    match &maps.features {
        Some(map) => {
            let base = features.header().data_offset;
            let first_bad = order.par_iter().find_first(|&&(v, i)| {
                mapped_row(map.bytes(), base, v, srb).is_none_or(|row| differs(i, row))
            });
            if let Some(&(v, i)) = first_bad {
                return Err(Error::Verify(mismatch(v, i)));
            }
        }
        None => {
            let read = |first: u64, buf: &mut [u8]| features.read_rows(first, buf);
            for_each_spanned_row(&order, srb, buf, &read, |v, i, row| {
                if differs(i, row) {
                    return Err(Error::Verify(mismatch(v, i)));
                }
                Ok(())
            })?;
        }
    }
    Ok(())
}

/// Assembles a batch's input matrix from the layout (what the trainer does)
/// into `scratch.got`; a CPU cache that follows the batch order gives its
/// rows as they are now (`cpu`).
fn assemble(
    store: &Store,
    maps: &Maps,
    m: &Manifest,
    (segment, t): (usize, &BatchTable),
    cpu: Option<&[u8]>,
    scratch: &mut Scratch,
) -> Result<()> {
    let rb = m.dataset.store_row_bytes();
    let Scratch {
        span, pages, got, ..
    } = scratch;
    got.resize(t.num_inputs as usize * rb as usize, 0);
    let out = got.as_mut_slice();
    if let Some(rows) = cpu {
        let rb = rb as usize;
        for (&p, &s) in t.cpu_pos.iter().zip(&t.cpu_slot) {
            let row = rows
                .get(s as usize * rb..(s as usize + 1) * rb)
                .ok_or_else(|| {
                    Error::Verify(format!("CPU slot {s} beyond the CPU cache's rows"))
                })?;
            out[p as usize * rb..(p as usize + 1) * rb].copy_from_slice(row);
        }
    }
    for (tier, object, pos, slots) in [
        ("GPU", &m.gpu_cache.object, &t.gpu_pos, &t.gpu_slot),
        ("CPU", &m.cpu_cache.object, &t.cpu_pos, &t.cpu_slot),
    ] {
        if pos.is_empty() || (tier == "CPU" && cpu.is_some()) {
            continue;
        }
        let object = object
            .as_deref()
            .ok_or_else(|| Error::Verify(format!("{tier} rows but no {tier} cache")))?;
        let order = by_row(
            slots.iter().map(|&s| u64::from(s)),
            pos.iter().map(|&p| p as usize),
        );
        gather_slots(store, maps, object, &order, rb, out, span)?;
    }
    let seg = &m.segments[segment].object;
    let total: u64 = t.page_runs.iter().map(|&(_, count)| count * 4096).sum();
    pages.resize(total as usize, 0);
    let mut at = 0usize;
    for &(first, count) in &t.page_runs {
        let len = (count * 4096) as usize;
        store.read_into(seg, first * 4096, &mut pages[at..at + len])?;
        at += len;
    }
    for (&p, &off) in t.disk_pos.iter().zip(&t.disk_offset) {
        let (dst, src) = (p as usize * rb as usize, off as usize);
        out[dst..dst + rb as usize].copy_from_slice(&pages[src..src + rb as usize]);
    }
    if !t.packed_pos.is_empty() {
        read_span(store, seg, t.chunk_offset, t.chunk_len, span)?;
        for (&p, &r) in t.packed_pos.iter().zip(&t.packed_row) {
            let (dst, src) = (p as usize * rb as usize, r as usize * rb as usize);
            out[dst..dst + rb as usize].copy_from_slice(&span[src..src + rb as usize]);
        }
    }
    Ok(())
}

/// Reads the records of one segment's table object.
pub fn read_table(store: &Store, name: &str) -> Result<Vec<BatchTable>> {
    read_records(store, name, address_table::decode)
}

/// Reads and decodes every record of a table object (an address table's
/// or a typed layout's topology table's).
pub(crate) fn read_records(
    store: &Store,
    name: &str,
    decode: impl Fn(&str, &[u8]) -> offgnn_shared::Result<BatchTable>,
) -> Result<Vec<BatchTable>> {
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
        .map(|(off, len)| Ok(decode(&origin, &range(store, name, off, len)?)?))
        .collect()
}

/// Checks every object's size and CRC32C.
pub fn check_objects(store: &Store, objects: &[offgnn_manifests::Object]) -> Result<u64> {
    let mut bytes = 0;
    let mut buf = Vec::new();
    for o in objects {
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
            let n = MAX_SPAN.min(size - at);
            read_span(store, &o.name, at, n, &mut buf)?;
            crc = crc32c::crc32c_append(crc, &buf);
            at += n;
        }
        if crc != o.crc32c {
            return Err(Error::Verify(format!(
                "object {}: checksum mismatch (corrupt or replaced): copy the layout again from where it was packed, or pack it again",
                o.name
            )));
        }
        bytes += size;
    }
    Ok(bytes)
}

pub fn verify(location: &str, show: bool) -> Result<VerifySummary> {
    let (store, name, origin) = layout_location(location)?;
    let bytes = store.get(&name)?;
    if offgnn_manifests::is_typed(&bytes) {
        return crate::typed::verify_typed(&store, origin, &bytes, show);
    }
    let m = Manifest::parse(&origin, &bytes)?;
    let object_bytes = check_objects(&store, &m.objects)?;
    let mut summary = verify_layout(&store, &m, None, show)?;
    summary.manifest = origin;
    summary.object_bytes = object_bytes;
    Ok(summary)
}

/// Rebuilds every batch of one layout (a homogeneous graph's, or in a
/// typed layout one node type's, seen through its `view`) and compares
/// it with the feature file; its objects are checked already.
pub(crate) fn verify_layout(
    store: &Store,
    m: &Manifest,
    view: Option<&crate::typed::TypeView>,
    show: bool,
) -> Result<VerifySummary> {
    let started = std::time::Instant::now();
    let features = FeatureSource::open(&m.dataset.feature_location)?;
    if features.fingerprint()? != m.dataset.feature_fingerprint {
        return Err(Error::Mismatch(format!(
            "{} is no longer the feature file that was packed",
            features.describe()
        )));
    }
    // The fingerprint samples the file; the checksum covers every row.
    if let Some(want) = m.dataset.feature_rows_crc32c {
        let engine = offgnn_shared::io_engine::IoEngine::new(Default::default());
        let got = features.rows_crc32c(&engine, show)?;
        if got != want {
            return Err(Error::Mismatch(format!(
                "{}: its rows' CRC32C is {got:08x}, the layout was packed from rows with {want:08x}: the file changed after packing",
                features.describe()
            )));
        }
    }
    let samples = Store::open_read(&m.samples.location)?;
    let run = RunSummary::read(&samples)?;
    let d = &m.dataset;
    let rows = Rows {
        stored: d.store_row_bytes() as usize,
        source: d.row_bytes as usize,
        from: d.feature_dtype,
        to: d.store_dtype(),
    };
    if features.store_dtype()? != rows.from {
        return Err(Error::Mismatch(format!(
            "{} holds {}, the layout was packed from {}",
            features.describe(),
            features.dtype(),
            rows.from
        )));
    }

    let tables: Vec<Vec<BatchTable>> = m
        .segments
        .iter()
        .map(|seg| read_table(store, &seg.table))
        .collect::<Result<_>>()?;
    check_topology(m, &tables, (&samples, &run), view)?;
    let scheduled: usize = m.schedule.values().flatten().map(Vec::len).sum();
    let pb = offgnn_shared::progress::bar_if(show, scheduled as u64, "verifying", "batches");
    let mut summary = VerifySummary {
        objects: m.objects.len(),
        ..Default::default()
    };
    let maps = Maps::open(store, m, &features)?;
    let mut scratch = Scratch::default();
    // A CPU cache that follows the batch order is replayed as the trainer
    // applies it: from the tier's rows at each epoch's start, each
    // training batch's admissions after it.
    let dynamic = !m.cpu_cache.policy.is_static();
    let mut cpu: Vec<u8> = Vec::new();
    for (split, epochs) in &m.schedule {
        for refs in epochs {
            let follow = dynamic && *split == Split::Train;
            if follow && let Some(object) = &m.cpu_cache.object {
                cpu = store.get(object)?.to_vec();
            }
            for r in refs {
                let t = &tables[r.segment as usize][r.record as usize];
                let name = format!("{split} epoch {} batch {}", t.epoch, t.index);
                let live = follow.then_some(cpu.as_slice());
                assemble(store, &maps, m, (r.segment as usize, t), live, &mut scratch)?;
                compare_with_features(
                    &features,
                    &maps,
                    &t.input_nodes,
                    &scratch.got,
                    rows,
                    &mut scratch.span,
                )
                .map_err(|e| match e {
                    Error::Verify(fault) => Error::Verify(format!("{name}: {fault}")),
                    other => other,
                })?;
                if follow {
                    admit(&mut cpu, t, &scratch.got, rows.stored)
                        .map_err(|fault| Error::Verify(format!("{name}: {fault}")))?;
                }
                summary.batches += 1;
                summary.rows += u64::from(t.num_inputs);
                pb.inc(1);
            }
        }
    }
    pb.finish_and_clear();
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

/// Copies a batch's admitted rows from its assembled matrix `got` into
/// the CPU cache's rows.
fn admit(cpu: &mut [u8], t: &BatchTable, got: &[u8], rb: usize) -> std::result::Result<(), String> {
    for (&p, &s) in t.admit_pos.iter().zip(&t.admit_slot) {
        let (d, f) = (s as usize * rb, p as usize * rb);
        let slot = cpu
            .get_mut(d..d + rb)
            .ok_or_else(|| format!("admission into CPU slot {s}, beyond the CPU cache's rows"))?;
        slot.copy_from_slice(&got[f..f + rb]);
    }
    Ok(())
}

/// Every scheduled batch's table against its batch in the samples: the
/// same input nodes, labels and blocks, and no batch on one side only.
fn check_topology(
    m: &Manifest,
    tables: &[Vec<BatchTable>],
    (samples, run): (&Store, &RunSummary),
    view: Option<&crate::typed::TypeView>,
) -> Result<()> {
    let mut place: HashMap<(Split, u32, u32), &BatchTable> = HashMap::new();
    for (seg, ts) in m.segments.iter().zip(tables) {
        for t in ts {
            let split = t
                .split
                .ok_or_else(|| Error::Verify(format!("{}: a record without a split", seg.table)))?;
            place.insert((split, t.epoch, t.index), t);
        }
    }
    let scheduled: usize = m.schedule.values().flatten().map(Vec::len).sum();
    if place.len() != scheduled {
        return Err(Error::Verify(format!(
            "{} table records for {scheduled} scheduled batches",
            place.len()
        )));
    }
    for file in &run.files {
        for b in offgnn_shared::samples::read_file(samples, file)? {
            let b = match view {
                Some(v) => v.batch(&b),
                None => b,
            };
            let name = format!("{} epoch {} batch {}", b.split, b.epoch, b.index);
            let t = place
                .remove(&(b.split, b.epoch, b.index))
                .ok_or_else(|| Error::Verify(format!("{name}: not in the layout")))?;
            if t.input_nodes != b.input_nodes
                || t.labels != b.labels
                || t.blocks != b.blocks
                || t.pairs != b.pairs
            {
                return Err(Error::Verify(format!(
                    "{name}: topology, labels or pairs differ from the samples"
                )));
            }
        }
    }
    if let Some(((split, epoch, index), _)) = place.iter().next() {
        return Err(Error::Verify(format!(
            "{split} epoch {epoch} batch {index} is in the layout but not in the samples"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::spans;

    #[test]
    fn nearby_rows_share_a_read_and_far_ones_do_not() {
        // 1 KiB rows: a gap of up to 255 rows is read through.
        let rows = [3, 4, 5, 100, 1000, 1001];
        assert_eq!(spans(&rows, 1024), vec![(3, 98, 0, 4), (1000, 2, 4, 2)]);
        // Rows larger than the gap are read one by one unless adjacent.
        assert_eq!(spans(&[0, 1, 3], 1 << 20), vec![(0, 2, 0, 2), (3, 1, 2, 1)]);
        assert!(spans(&[], 8).is_empty());
        // A span stops at 64 MiB, however dense the rows.
        let rows: Vec<u64> = (0..200).collect();
        let lens: Vec<u64> = spans(&rows, 1 << 20).iter().map(|s| s.1).collect();
        assert_eq!(lens, [64, 64, 64, 8]);
    }
}
