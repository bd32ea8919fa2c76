//! Address tables (DiskGNN §6): for every batch, where each input row comes
//! from — GPU-cache slot, CPU-cache slot, a byte in the batch's disk-cache
//! pages, or a row of its packed chunk — precomputed by the packer so the
//! trainer does no lookups, plus the batch's topology so the trainer reads
//! one place. [`BatchTable`] holds the arrays struct-of-arrays so that each
//! becomes one index tensor.
//!
//! A table object holds the records of one segment's batches, streamed in
//! order, then an index and a fixed-size footer (so it can be written in one
//! pass and read by two ranged reads per record):
//!
//! ```text
//! records... | count x (offset: u64, len: u64) | index_offset: u64 | count: u64 | "OGATBL02"
//! ```
//!
//! A record is compact, since the tables count against the packer's disk
//! budget (raw u32/u64 arrays would outweigh the feature file itself):
//!
//! ```text
//! topology_len: u32 | topology: zstd frame | chunk_offset: u64 | chunk_len: u64
//!   | row_bytes: u32 | index_bits: u8 | one address per input row, bit-packed
//!   [ | admissions: u32 | one (input position, CPU slot) per admission, bit-packed ]
//! ```
//!
//! The topology (split, epoch, index, labels, input nodes, blocks, and in a
//! link-prediction batch its node pairs after the blocks) is LEB128
//! varints, sorted arrays delta-coded, local source ids coded against the
//! next new id (the sampler numbers them in order of first appearance),
//! then zstd: it does not depend on the layout's plan, so the packer measures
//! it before planning. An address is a 2-bit tier tag and an index of
//! `index_bits` bits (below the graph's node count): GPU or CPU slot,
//! disk-cache position or packed row. Its size is fixed by the input count,
//! so a table's bytes are known before the plan is; the disk-cache pages and
//! offsets follow from the positions and the row size on decoding. Fixed
//! numbers are little-endian; offsets are from the start of the object.
//!
//! Only a layout whose CPU cache follows the batch order (Ginex's Belady
//! policy, manifest format 4) has admissions: after the batch is
//! assembled, rows it read from disk go into CPU-cache slots, each an
//! input position of [`index_bits`]`(inputs)` bits and a slot of the
//! addresses' width. A record without admissions ends at its addresses,
//! as every record of a format-3 layout does.

use crate::dataset::Split;
use crate::error::{Error, Result};
use crate::samples::{Block, Pairs};

mod bits;
mod object;
mod reader;
mod topology;
use bits::{get_bits, put_bits};
pub use object::{FOOTER, TableWriter, decode_footer, decode_index, object_overhead};
use reader::Reader;
use topology::read_topology;
pub use topology::{decode_typed_topology, topology_frame, typed_topology_frame};

/// Disk pages (4 KiB), as the layout counts them.
const PAGE: u64 = 4096;

/// Where one batch's rows come from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BatchTable {
    pub split: Option<Split>,
    pub epoch: u32,
    pub index: u32,
    /// Rows of the assembled input matrix (= input nodes of the batch).
    pub num_inputs: u32,
    /// Labels of the seeds, which are input rows `0..labels.len()`.
    pub labels: Vec<u32>,
    /// Global id of each input row (for the in-memory and naive baselines,
    /// which read rows by node id rather than through the layout).
    pub input_nodes: Vec<u32>,
    /// `out[gpu_pos[i]] = gpu_cache[gpu_slot[i]]`.
    pub gpu_pos: Vec<u32>,
    pub gpu_slot: Vec<u32>,
    /// `out[cpu_pos[i]] = cpu_cache[cpu_slot[i]]`.
    pub cpu_pos: Vec<u32>,
    pub cpu_slot: Vec<u32>,
    /// Disk-cache pages to read from the segment object, as sorted,
    /// merged runs `(first page, page count)` of 4 KiB pages.
    pub page_runs: Vec<(u64, u64)>,
    /// `out[disk_pos[i]]` is the row at byte `disk_offset[i]` of the pages
    /// read, concatenated in run order.
    pub disk_pos: Vec<u32>,
    pub disk_offset: Vec<u64>,
    /// The packed chunk: byte offset in the segment object and length
    /// (4 KiB multiples; 0 when the batch has no packed rows).
    pub chunk_offset: u64,
    pub chunk_len: u64,
    /// `out[packed_pos[i]]` is row `packed_row[i]` of the chunk.
    pub packed_pos: Vec<u32>,
    pub packed_row: Vec<u32>,
    /// After assembly, `cpu_cache[admit_slot[i]] = out[admit_pos[i]]`:
    /// rows read from disk that the CPU cache keeps for later batches
    /// (only where it follows the batch order; ascending positions).
    pub admit_pos: Vec<u32>,
    pub admit_slot: Vec<u32>,
    /// The batch's blocks, input layer first.
    pub blocks: Vec<Block>,
    /// A link-prediction batch's node pairs, among its seeds (empty in a
    /// node batch).
    pub pairs: Pairs,
}

impl BatchTable {
    /// The table of sampled batch `b` of `split` and `epoch` before any
    /// plan: its topology, no addresses.
    pub fn topology(b: crate::samples::SampledBatch, split: Split, epoch: u32) -> BatchTable {
        BatchTable {
            split: Some(split),
            epoch,
            index: b.index,
            num_inputs: b.input_nodes.len() as u32,
            labels: b.labels,
            input_nodes: b.input_nodes,
            blocks: b.blocks,
            pairs: b.pairs,
            ..Default::default()
        }
    }

    /// Bytes the batch reads from disk (pages plus its chunk).
    pub fn disk_bytes(&self) -> u64 {
        self.page_runs.iter().map(|r| r.1).sum::<u64>() * 4096 + self.chunk_len
    }

    /// Rows the batch needs from disk.
    pub fn disk_rows(&self) -> u64 {
        (self.disk_pos.len() + self.packed_pos.len()) as u64
    }
}

/// Bit width of an address's tier tag.
const TAG_BITS: u32 = 2;
const TAG_GPU: u64 = 0;
const TAG_CPU: u64 = 1;
const TAG_DISK: u64 = 2;
const TAG_PACKED: u64 = 3;
/// Bytes of a record besides its topology frame and its addresses: the
/// frame's length (u32), chunk offset and length (u64 each), row bytes
/// (u32) and the index width (u8).
pub const RECORD_FIXED_BYTES: u64 = 4 + 8 + 8 + 4 + 1;
/// The zstd level of the topology: level 1 compresses the sampled blocks
/// (delta-coded local ids) about as well as level 3 at twice the speed.
const ZSTD_LEVEL: i32 = 1;

/// Bits of an address's index (slot, disk-cache position or packed row)
/// in a layout of `num_nodes` nodes: every index is below `num_nodes`.
pub fn index_bits(num_nodes: u64) -> u32 {
    (u64::BITS - num_nodes.saturating_sub(1).leading_zeros()).max(1)
}

/// Bytes of a batch's addresses: `num_inputs` entries of a tag and an
/// index of [`index_bits`], packed. Known before the layout is planned.
pub fn address_bytes(num_inputs: u64, num_nodes: u64) -> u64 {
    (num_inputs * u64::from(index_bits(num_nodes) + TAG_BITS)).div_ceil(8)
}

/// Bytes of a whole record whose compressed topology takes `topology`
/// bytes ([`topology_frame`]), without admissions: exact, whatever the
/// plan.
pub fn record_bytes(topology: u64, num_inputs: u64, num_nodes: u64) -> u64 {
    RECORD_FIXED_BYTES + topology + address_bytes(num_inputs, num_nodes)
}

/// Bytes that `admissions` CPU-cache admissions add to a record of
/// `num_inputs` inputs in a layout of `num_nodes` nodes (none: 0).
pub fn admission_bytes(admissions: u64, num_inputs: u64, num_nodes: u64) -> u64 {
    if admissions == 0 {
        return 0;
    }
    let width = index_bits(num_inputs) + index_bits(num_nodes);
    4 + (admissions * u64::from(width)).div_ceil(8)
}

/// Why a batch table cannot be encoded (a plan inconsistent with itself).
fn unencodable(what: String) -> Error {
    Error::InvalidArgument(format!("internal: address table cannot be encoded: {what}"))
}

/// Encodes one record into `out`, replacing what it held. A writer of many
/// records reuses its buffers. `row_bytes` is the layout's row stride,
/// `num_nodes` the graph's nodes (every slot, disk-cache position and
/// packed row is below it). The record takes exactly [`record_bytes`].
pub fn encode_into(
    t: &BatchTable,
    row_bytes: u64,
    num_nodes: u64,
    scratch: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> Result<()> {
    let bits = index_bits(num_nodes);
    let n = t.num_inputs as usize;
    let limit = 1u64 << bits;
    // Each input row's address, tag in the low bits.
    let mut entries = vec![u64::MAX; n];
    let mut place = |pos: u32, tag: u64, index: u64| -> Result<()> {
        let slot = entries
            .get_mut(pos as usize)
            .ok_or_else(|| unencodable(format!("position {pos} of {n} inputs")))?;
        if index >= limit {
            return Err(unencodable(format!(
                "index {index} beyond {num_nodes} nodes"
            )));
        }
        *slot = tag | index << TAG_BITS;
        Ok(())
    };
    for (&p, &s) in t.gpu_pos.iter().zip(&t.gpu_slot) {
        place(p, TAG_GPU, u64::from(s))?;
    }
    for (&p, &s) in t.cpu_pos.iter().zip(&t.cpu_slot) {
        place(p, TAG_CPU, u64::from(s))?;
    }
    for (&p, &r) in t.packed_pos.iter().zip(&t.packed_row) {
        place(p, TAG_PACKED, u64::from(r))?;
    }
    // A disk row is stored as its disk-cache position: its pages and its
    // offset in them follow from the positions (as the packer made them).
    let pages: Vec<u64> = t
        .page_runs
        .iter()
        .flat_map(|&(first, count)| first..first + count)
        .collect();
    for (&p, &off) in t.disk_pos.iter().zip(&t.disk_offset) {
        let page = pages
            .get((off / PAGE) as usize)
            .ok_or_else(|| unencodable(format!("offset {off} beyond the pages read")))?;
        let byte = page * PAGE + off % PAGE;
        if row_bytes == 0 || !byte.is_multiple_of(row_bytes) {
            return Err(unencodable(format!("offset {off} is not a row's start")));
        }
        place(p, TAG_DISK, byte / row_bytes)?;
    }
    if entries.contains(&u64::MAX) {
        return Err(unencodable("an input row has no address".into()));
    }
    let entries_tags: Vec<u8> = if t.admit_pos.is_empty() {
        Vec::new()
    } else {
        entries
            .iter()
            .map(|&e| (e & ((1 << TAG_BITS) - 1)) as u8)
            .collect()
    };
    topology_frame(t, &mut Vec::new(), scratch)
        .map_err(|e| unencodable(format!("compressing the topology: {e}")))?;
    out.clear();
    out.reserve(record_bytes(scratch.len() as u64, n as u64, num_nodes) as usize);
    out.extend_from_slice(&(scratch.len() as u32).to_le_bytes());
    out.extend_from_slice(scratch);
    out.extend_from_slice(&t.chunk_offset.to_le_bytes());
    out.extend_from_slice(&t.chunk_len.to_le_bytes());
    out.extend_from_slice(
        &u32::try_from(row_bytes)
            .map_err(|_| unencodable(format!("rows of {row_bytes} bytes")))?
            .to_le_bytes(),
    );
    out.push(bits as u8);
    put_bits(out, entries.into_iter(), bits + TAG_BITS);
    put_admissions(t, bits, &entries_tags, out)?;
    debug_assert_eq!(
        out.len() as u64,
        record_bytes(scratch.len() as u64, n as u64, num_nodes)
            + admission_bytes(t.admit_pos.len() as u64, n as u64, num_nodes)
    );
    Ok(())
}

/// Appends the record's admissions, if any: each admitted position must
/// be a row the batch reads from disk (`tags` of its addresses), each
/// slot an index of `bits` bits.
fn put_admissions(t: &BatchTable, bits: u32, tags: &[u8], out: &mut Vec<u8>) -> Result<()> {
    if t.admit_pos.is_empty() {
        return Ok(());
    }
    if t.admit_pos.len() != t.admit_slot.len() {
        return Err(unencodable("admissions without their slots".into()));
    }
    if t.admit_pos.windows(2).any(|w| w[0] >= w[1]) {
        return Err(unencodable("admitted positions out of order".into()));
    }
    for (&p, &s) in t.admit_pos.iter().zip(&t.admit_slot) {
        let tag = tags.get(p as usize).map(|&g| u64::from(g));
        if !matches!(tag, Some(TAG_DISK | TAG_PACKED)) || u64::from(s) >= 1u64 << bits {
            return Err(unencodable(format!(
                "admission of input {p} into CPU slot {s}, not a row read from disk"
            )));
        }
    }
    let pos_bits = index_bits(u64::from(t.num_inputs));
    out.extend_from_slice(&(t.admit_pos.len() as u32).to_le_bytes());
    let pairs = t.admit_pos.iter().zip(&t.admit_slot);
    put_bits(
        out,
        pairs.map(|(&p, &s)| u64::from(p) | u64::from(s) << pos_bits),
        pos_bits + bits,
    );
    Ok(())
}

/// Encodes one record (see [`encode_into`]).
pub fn encode(t: &BatchTable, row_bytes: u64, num_nodes: u64) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    encode_into(t, row_bytes, num_nodes, &mut Vec::new(), &mut out)?;
    Ok(out)
}

/// Decodes one record and checks that every position and row it names is
/// in range, so a corrupt table cannot index out of bounds later. The
/// trainer calls it in its graph-loading stage.
pub fn decode(origin: &str, bytes: &[u8]) -> Result<BatchTable> {
    let mut r = Reader {
        bytes,
        at: 0,
        origin,
    };
    let head = read_head(&mut r)?;
    let topology = read_topology(origin, head.frame, None)?;
    let num_inputs = topology.num_inputs;
    if topology.labels.len() > num_inputs as usize
        || topology.input_nodes.len() != num_inputs as usize
    {
        return Err(r.fail("labels or input nodes do not match the input count"));
    }
    let width = head.bits + TAG_BITS;
    let need = (u64::from(num_inputs) * u64::from(width)).div_ceil(8);
    if (head.addresses.len() as u64) < need {
        return Err(r.fail(&format!(
            "{} bytes of addresses, {num_inputs} inputs need {need}",
            head.addresses.len()
        )));
    }
    let (addresses, admissions) = head.addresses.split_at(need as usize);
    let mut out = BatchTable {
        split: topology.split,
        epoch: topology.epoch,
        index: topology.index,
        num_inputs,
        labels: topology.labels,
        input_nodes: topology.input_nodes,
        chunk_offset: head.chunk_offset,
        chunk_len: head.chunk_len,
        blocks: topology.blocks,
        pairs: topology.pairs,
        ..Default::default()
    };
    let disk_rows = sort_addresses(&mut out, addresses, width);
    check_packed_rows(&r, &out, head.row_bytes, head.chunk_len)?;
    read_admissions(&r, &mut out, admissions, head.bits, &disk_rows)?;
    place_disk_rows(&r, &mut out, disk_rows, head.row_bytes)?;
    Ok(out)
}

/// Reads the admissions after a record's addresses (none where nothing
/// follows them), checking that each admits a row the batch reads from
/// disk (`dc`: its disk-cache rows; the packed rows are in `out`) into a
/// slot of `bits` bits, at most once per slot.
fn read_admissions(
    r: &Reader,
    out: &mut BatchTable,
    bytes: &[u8],
    bits: u32,
    dc: &[(u64, u32)],
) -> Result<()> {
    if bytes.is_empty() {
        return Ok(());
    }
    let (count, packed) = bytes
        .split_first_chunk::<4>()
        .ok_or_else(|| r.fail("admissions cut short"))?;
    let count = u32::from_le_bytes(*count) as usize;
    let pos_bits = index_bits(u64::from(out.num_inputs));
    let width = pos_bits + bits;
    if count == 0 || packed.len() as u64 != (count as u64 * u64::from(width)).div_ceil(8) {
        return Err(r.fail(&format!(
            "{} bytes of admissions for {count} of them",
            packed.len()
        )));
    }
    let mut from_disk = vec![false; out.num_inputs as usize];
    for &p in out.packed_pos.iter().chain(dc.iter().map(|d| &d.1)) {
        from_disk[p as usize] = true;
    }
    let pos_mask = (1u64 << pos_bits) - 1;
    for e in get_bits(packed, count, width) {
        let (p, slot) = ((e & pos_mask) as u32, (e >> pos_bits) as u32);
        if out.admit_pos.last().is_some_and(|&last| last >= p) {
            return Err(r.fail("admitted positions out of order"));
        }
        if !from_disk.get(p as usize).copied().unwrap_or(false) {
            return Err(r.fail(&format!(
                "admission of input {p}, which the batch does not read from disk"
            )));
        }
        out.admit_pos.push(p);
        out.admit_slot.push(slot);
    }
    let mut slots = out.admit_slot.clone();
    slots.sort_unstable();
    if slots.windows(2).any(|w| w[0] == w[1]) {
        return Err(r.fail("two admissions into one CPU slot"));
    }
    Ok(())
}

/// The fixed fields of a record around its topology frame, and its
/// bit-packed addresses.
struct RecordHead<'a> {
    frame: &'a [u8],
    chunk_offset: u64,
    chunk_len: u64,
    row_bytes: u64,
    bits: u32,
    addresses: &'a [u8],
}

/// Reads a record's fixed fields; the reader stops at the addresses.
fn read_head<'a>(r: &mut Reader<'a>) -> Result<RecordHead<'a>> {
    let bytes = r.bytes;
    let frame_len = r.u32()? as usize;
    let frame_at = r.at;
    r.take(frame_len)?;
    let frame = &bytes[frame_at..frame_at + frame_len];
    let chunk_offset = r.u64()?;
    let chunk_len = r.u64()?;
    let row_bytes = u64::from(r.u32()?);
    let bits = u32::from(r.take(1)?[0]);
    if !(1..=32).contains(&bits) || row_bytes == 0 {
        return Err(r.fail("bad address width or row size"));
    }
    let addresses = &bytes[r.at..];
    Ok(RecordHead {
        frame,
        chunk_offset,
        chunk_len,
        row_bytes,
        bits,
        addresses,
    })
}

/// Unpacks the addresses (`width` bits each) and sorts each input row into
/// its tier: GPU and CPU slots and packed rows go straight into `out`; the
/// disk-cache rows are returned as (disk-cache position, input row), since
/// their pages and offsets need them all.
fn sort_addresses(out: &mut BatchTable, addresses: &[u8], width: u32) -> Vec<(u64, u32)> {
    let mut dc: Vec<(u64, u32)> = Vec::new(); // (disk-cache position, input row)
    let n = out.num_inputs as usize;
    for (i, e) in (0..out.num_inputs).zip(get_bits(addresses, n, width)) {
        let index = e >> TAG_BITS;
        match e & ((1 << TAG_BITS) - 1) {
            TAG_GPU => {
                out.gpu_pos.push(i);
                out.gpu_slot.push(index as u32);
            }
            TAG_CPU => {
                out.cpu_pos.push(i);
                out.cpu_slot.push(index as u32);
            }
            TAG_DISK => dc.push((index, i)),
            _ => {
                out.packed_pos.push(i);
                out.packed_row.push(index as u32);
            }
        }
    }
    dc
}

/// Refuses packed rows that reach past the chunk.
fn check_packed_rows(r: &Reader, out: &BatchTable, row_bytes: u64, chunk_len: u64) -> Result<()> {
    if u64::try_from(out.packed_pos.len())
        .ok()
        .and_then(|n| n.checked_mul(row_bytes))
        .is_none_or(|b| b > chunk_len)
        || out
            .packed_row
            .iter()
            .any(|&r| u64::from(r) * row_bytes >= chunk_len)
    {
        return Err(r.fail("packed rows beyond the chunk"));
    }
    Ok(())
}

/// The pages of the disk-cache rows and each row's offset in them, as
/// the packer computes them (rows may straddle pages).
fn place_disk_rows(
    r: &Reader,
    out: &mut BatchTable,
    mut dc: Vec<(u64, u32)>,
    row_bytes: u64,
) -> Result<()> {
    dc.sort_unstable();
    if dc.windows(2).any(|w| w[0].0 == w[1].0) {
        return Err(r.fail("two inputs at one disk-cache position"));
    }
    let mut pages: Vec<u64> = Vec::new();
    for &(pos, _) in &dc {
        let start = pos * row_bytes;
        let last = start + row_bytes - 1;
        for page in start / PAGE..=last / PAGE {
            if pages.last().is_none_or(|&p| p < page) {
                pages.push(page);
            }
        }
    }
    for &(first, count) in &page_runs(&pages) {
        out.page_runs.push((first, count));
    }
    for (pos, i) in dc {
        let byte = pos * row_bytes;
        let page_index = pages.partition_point(|&p| p < byte / PAGE) as u64;
        out.disk_pos.push(i);
        out.disk_offset.push(page_index * PAGE + byte % PAGE);
    }
    Ok(())
}

/// Merges sorted, deduplicated page numbers into maximal runs of
/// consecutive pages: `(first page, page count)`, ascending.
pub fn page_runs(pages: &[u64]) -> Vec<(u64, u64)> {
    debug_assert!(
        pages.windows(2).all(|w| w[0] < w[1]),
        "pages must be sorted and unique"
    );
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &p in pages {
        match runs.last_mut() {
            Some((first, count)) if *first + *count == p => *count += 1,
            _ => runs.push((p, 1)),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> BatchTable {
        BatchTable {
            split: Some(Split::Train),
            epoch: 2,
            index: 7,
            num_inputs: 5,
            labels: vec![3],
            input_nodes: vec![10, 11, 12, 13, 14],
            gpu_pos: vec![0],
            gpu_slot: vec![9],
            cpu_pos: vec![4],
            cpu_slot: vec![1],
            page_runs: vec![(3, 2)],
            disk_pos: vec![1, 2],
            disk_offset: vec![0, 4096],
            chunk_offset: 8192,
            chunk_len: 4096,
            packed_pos: vec![3],
            packed_row: vec![0],
            admit_pos: Vec::new(),
            admit_slot: Vec::new(),
            blocks: vec![Block {
                num_src: 5,
                num_dst: 1,
                src: vec![1, 2],
                dst: vec![0, 0],
                relations: Vec::new(),
            }],
            pairs: Pairs::default(),
        }
    }

    /// Rows of one page: the fixture's disk rows are disk-cache positions
    /// 3 and 4, on pages 3 and 4. Slots are below 16 nodes.
    const ROW: u64 = 4096;
    const NODES: u64 = 16;

    #[test]
    fn round_trips() {
        let t = table();
        let rec = encode(&t, ROW, NODES).unwrap();
        let topology = u32::from_le_bytes(rec[..4].try_into().unwrap()) as u64;
        assert_eq!(rec.len() as u64, record_bytes(topology, 5, NODES));
        // 5 inputs of 2 + 4 bits.
        assert_eq!(address_bytes(5, NODES), 4);
        let mut frame = Vec::new();
        topology_frame(&t, &mut Vec::new(), &mut frame).unwrap();
        assert_eq!(
            frame.len() as u64,
            topology,
            "measured before planning as written"
        );
        assert_eq!(decode("t", &rec).unwrap(), t);
        let mut w = TableWriter::new(Vec::new());
        w.push(&rec).unwrap();
        w.push(&rec).unwrap();
        let (obj, size) = w.finish().unwrap();
        assert_eq!(size, obj.len() as u64);
        assert_eq!(size, 2 * rec.len() as u64 + object_overhead(2));
        let (index_offset, count) =
            decode_footer("t", &obj[obj.len() - FOOTER as usize..], size).unwrap();
        assert_eq!(count, 2);
        let index = decode_index(
            "t",
            &obj[index_offset as usize..obj.len() - FOOTER as usize],
            index_offset,
        )
        .unwrap();
        let (off, len) = index[1];
        assert_eq!(
            decode("t", &obj[off as usize..(off + len) as usize]).unwrap(),
            t
        );
        assert_eq!(t.disk_bytes(), 2 * 4096 + 4096);
    }

    /// A CPU cache that follows the batch order: rows read from disk (a
    /// disk-cache row and a packed one) admitted into slots; the record
    /// grows by exactly [`admission_bytes`], and an admission of a row
    /// that is not read from disk is refused both ways.
    #[test]
    fn link_pairs_round_trip_and_are_checked_against_the_seeds() {
        let mut t = table();
        t.labels.clear();
        // The fixture's block has one destination; pairs need two seeds.
        t.blocks[0].num_dst = 2;
        t.blocks[0].dst = vec![0, 1];
        t.pairs.push((0, 1), 1, 0);
        t.pairs.push((0, 0), 0, 0);
        t.pairs.push((1, 0), 1, 1);
        let rec = encode(&t, ROW, NODES).unwrap();
        assert_eq!(decode("t", &rec).unwrap(), t);
        let bad = |f: &dyn Fn(&mut BatchTable)| {
            let mut b = t.clone();
            f(&mut b);
            let e = decode("t", &encode(&b, ROW, NODES).unwrap()).unwrap_err();
            assert!(e.to_string().contains("node pairs out of range"), "{e}");
        };
        bad(&|b| b.pairs.dst[0] = 2);
        bad(&|b| b.pairs.label[1] = 2);
        bad(&|b| b.pairs.query[2] = 2);
        bad(&|b| b.pairs.query[0] = 1);
        bad(&|b| {
            b.pairs.label.pop();
        });
    }

    #[test]
    fn admissions_round_trip_and_name_rows_read_from_disk_only() {
        let mut t = table();
        (t.admit_pos, t.admit_slot) = (vec![2, 3], vec![15, 0]);
        let rec = encode(&t, ROW, NODES).unwrap();
        let topology = u32::from_le_bytes(rec[..4].try_into().unwrap()) as u64;
        assert_eq!(
            rec.len() as u64,
            record_bytes(topology, 5, NODES) + admission_bytes(2, 5, NODES)
        );
        // A count and two entries of 3 + 4 bits.
        assert_eq!(admission_bytes(2, 5, NODES), 4 + 2);
        assert_eq!(admission_bytes(0, 5, NODES), 0);
        assert_eq!(decode("t", &rec).unwrap(), t);

        let mut bad = table();
        (bad.admit_pos, bad.admit_slot) = (vec![4], vec![1]);
        let e = encode(&bad, ROW, NODES).unwrap_err().to_string();
        assert!(e.contains("admission of input 4 into CPU slot 1"), "{e}");
        // The same record with its admission's position rewritten to the
        // CPU-cache row 4: the decoder refuses it.
        let mut forged = rec.clone();
        let entries = forged.len() - 2;
        forged[entries] = (forged[entries] & !0b111) | 4;
        let e = decode("t", &forged).unwrap_err().to_string();
        assert!(
            e.contains("admission of input 4, which the batch does not read from disk"),
            "{e}"
        );
        let e = decode("t", &rec[..rec.len() - 1]).unwrap_err().to_string();
        assert!(e.contains("bytes of admissions"), "{e}");
    }

    #[test]
    fn rows_that_share_and_straddle_pages_round_trip() {
        // 48-byte rows over a million nodes: disk-cache positions 0, 1, 85
        // (bytes 4080..4128, across pages 0 and 1) and 1000 (page 11).
        let positions = [1000u64, 0, 85, 1];
        let row = 48;
        let mut pages: Vec<u64> = positions
            .iter()
            .flat_map(|&p| p * row / 4096..=(p * row + row - 1) / 4096)
            .collect();
        pages.sort_unstable();
        pages.dedup();
        let mut order: Vec<(u64, u32)> =
            positions.iter().zip(0u32..).map(|(&p, i)| (p, i)).collect();
        order.sort_unstable();
        let page_index = |p: u64| pages.iter().position(|&x| x == p).unwrap() as u64;
        let t = BatchTable {
            split: Some(Split::Test),
            num_inputs: 6,
            labels: vec![1, 2],
            input_nodes: vec![999_999, 5, 77, 123_456, 0, 3],
            page_runs: vec![(0, 2), (11, 1)],
            disk_pos: order.iter().map(|o| o.1).collect(),
            disk_offset: order
                .iter()
                .map(|&(p, _)| page_index(p * row / 4096) * 4096 + p * row % 4096)
                .collect(),
            gpu_pos: vec![4],
            gpu_slot: vec![999_999],
            packed_pos: vec![5],
            packed_row: vec![0],
            chunk_offset: 65536,
            chunk_len: 4096,
            // Source ids new (above all before), old, and skipping ahead.
            blocks: vec![
                Block {
                    num_src: 6,
                    num_dst: 2,
                    src: vec![2, 3, 0, 5, 3, 4, 1],
                    dst: vec![0, 0, 0, 1, 1, 1, 1],
                    relations: Vec::new(),
                },
                Block {
                    num_src: 2,
                    num_dst: 2,
                    src: vec![1, 0],
                    dst: vec![0, 1],
                    relations: Vec::new(),
                },
            ],
            ..Default::default()
        };
        assert_eq!(pages, [0, 1, 11]);
        let rec = encode(&t, row, 1_000_000).unwrap();
        assert_eq!(decode("t", &rec).unwrap(), t);
    }

    #[test]
    fn a_reused_buffer_encodes_as_a_fresh_one() {
        let short = table();
        let mut long = table();
        long.input_nodes.extend(0..1000);
        long.num_inputs = long.input_nodes.len() as u32;
        long.gpu_pos.extend(5..long.num_inputs);
        long.gpu_slot.extend((5..long.num_inputs).map(|i| i % 16));
        let (mut scratch, mut buf) = (Vec::new(), Vec::new());
        encode_into(&long, ROW, NODES, &mut scratch, &mut buf).unwrap();
        assert_eq!(buf, encode(&long, ROW, NODES).unwrap());
        // The longer record's bytes must not linger past the shorter one.
        encode_into(&short, ROW, NODES, &mut scratch, &mut buf).unwrap();
        assert_eq!(buf, encode(&short, ROW, NODES).unwrap());
        assert_eq!(decode("t", &buf).unwrap(), short);
    }

    #[test]
    fn refuses_what_it_cannot_encode() {
        let mut t = table();
        t.disk_pos[0] = 5; // past num_inputs
        assert!(encode(&t, ROW, NODES).is_err());
        let mut t = table();
        t.gpu_slot[0] = 16; // beyond the nodes
        assert!(encode(&t, ROW, NODES).is_err());
        let mut t = table();
        t.packed_pos.clear(); // an input without an address
        t.packed_row.clear();
        assert!(encode(&t, ROW, NODES).is_err());
        // An offset that is not a row's start.
        assert!(encode(&table(), 3000, NODES).is_err());
    }

    #[test]
    fn refuses_corruption() {
        let rec = encode(&table(), ROW, NODES).unwrap();
        assert!(decode("t", &rec[..rec.len() - 1]).is_err());
        let mut long = rec.clone();
        long.push(0);
        assert!(
            decode("t", &long)
                .unwrap_err()
                .to_string()
                .contains("admissions cut short")
        );
        // A flipped byte in the compressed topology, and a frame length past
        // the record.
        let mut bad = rec.clone();
        bad[10] ^= 0x55;
        assert!(decode("t", &bad).is_err());
        let mut bad = rec.clone();
        bad[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(
            decode("t", &bad)
                .unwrap_err()
                .to_string()
                .contains("truncated")
        );
        // A topology whose block names a source past its inputs.
        let mut t = table();
        t.blocks[0].src[0] = 7;
        let bad = encode(&t, ROW, NODES).unwrap();
        assert!(decode("t", &bad).unwrap_err().to_string().contains("block"));
        // A packed row past the chunk (the last address, tag 3, index 1).
        let mut t = table();
        t.packed_row[0] = 1;
        let bad = encode(&t, ROW, NODES).unwrap();
        assert!(decode("t", &bad).unwrap_err().to_string().contains("chunk"));
        let mut w = TableWriter::new(Vec::new());
        w.push(&rec).unwrap();
        let (obj, size) = w.finish().unwrap();
        let footer = &obj[obj.len() - FOOTER as usize..];
        assert!(decode_footer("t", footer, size + 1).is_err());
        assert!(decode_footer("t", &footer[1..], size).is_err());
        let mut bad = [0u8; 16];
        bad[8] = 5; // a 5-byte record ending past the index at byte 4
        assert!(decode_index("t", &bad, 4).is_err());
    }

    #[test]
    fn any_damage_fails_cleanly() {
        let rec = encode(&table(), ROW, NODES).unwrap();
        for cut in 0..rec.len() {
            assert!(decode("t", &rec[..cut]).is_err());
        }
        for at in 0..rec.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut bad = rec.clone();
                bad[at] ^= flip;
                // Decodes to something in range, or fails; never panics.
                if let Ok(t) = decode("t", &bad) {
                    assert_eq!(t.input_nodes.len(), t.num_inputs as usize);
                }
            }
        }
    }

    #[test]
    fn refuses_a_table_of_the_old_format_naming_it() {
        let mut footer = vec![0u8; FOOTER as usize];
        footer[16..].copy_from_slice(object::OLD_MAGIC);
        let err = decode_footer("pack/table-00000.bin", &footer, FOOTER).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("pack/table-00000.bin") && msg.contains("pack the layout again"),
            "{msg}"
        );
        assert!(!msg.contains('\n'));
    }
}
