//! Address tables (DiskGNN §6): for every batch, where each input row comes
//! from — GPU-cache slot, CPU-cache slot, a byte in the batch's disk-cache
//! pages, or a row of its packed chunk — precomputed by the packer so the
//! trainer does no lookups, plus the batch's topology so the trainer reads
//! one place. Arrays are struct-of-arrays so that each becomes one index
//! tensor.
//!
//! A table object holds the records of one segment's batches, streamed in
//! order, then an index and a fixed-size footer (so it can be written in one
//! pass and read by two ranged reads per record):
//!
//! ```text
//! records... | count x (offset: u64, len: u64) | index_offset: u64 | count: u64 | "OGATBL01"
//! ```
//!
//! Every number is little-endian; every array is a u64 length then its
//! elements. Offsets are from the start of the object.

use crate::dataset::Split;
use crate::error::{Error, Result};
use crate::samples::Block;

const MAGIC: &[u8; 8] = b"OGATBL01";

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
    /// The batch's blocks, input layer first.
    pub blocks: Vec<Block>,
}

impl BatchTable {
    /// Bytes the batch reads from disk (pages plus its chunk).
    pub fn disk_bytes(&self) -> u64 {
        self.page_runs.iter().map(|r| r.1).sum::<u64>() * 4096 + self.chunk_len
    }

    /// Rows the batch needs from disk.
    pub fn disk_rows(&self) -> u64 {
        (self.disk_pos.len() + self.packed_pos.len()) as u64
    }
}

struct Writer<'a>(&'a mut Vec<u8>);

impl Writer<'_> {
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32s(&mut self, v: &[u32]) {
        self.u64(v.len() as u64);
        for &x in v {
            self.u32(x);
        }
    }
    fn u64s(&mut self, v: &[u64]) {
        self.u64(v.len() as u64);
        for &x in v {
            self.u64(x);
        }
    }
}

/// Encodes one record.
pub fn encode(t: &BatchTable) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(t, &mut out);
    out
}

/// Encodes one record into `out`, replacing what it held. A writer of many
/// records reuses one buffer: its pages are touched once, not per record.
pub fn encode_into(t: &BatchTable, out: &mut Vec<u8>) {
    out.clear();
    // The exact size: 132 bytes of fixed fields and list lengths, then the
    // lists (a block adds two counts and two list lengths).
    out.reserve(
        132 + 4 * (t.labels.len() + t.input_nodes.len())
            + 8 * (t.gpu_pos.len() + t.cpu_pos.len() + t.packed_pos.len())
            + 16 * t.page_runs.len()
            + 12 * t.disk_pos.len()
            + t.blocks.iter().map(|b| 24 + 8 * b.src.len()).sum::<usize>(),
    );
    let mut w = Writer(out);
    w.u32(match t.split {
        None => 0,
        Some(Split::Train) => 1,
        Some(Split::Valid) => 2,
        Some(Split::Test) => 3,
    });
    w.u32(t.epoch);
    w.u32(t.index);
    w.u32(t.num_inputs);
    w.u32s(&t.labels);
    w.u32s(&t.input_nodes);
    w.u32s(&t.gpu_pos);
    w.u32s(&t.gpu_slot);
    w.u32s(&t.cpu_pos);
    w.u32s(&t.cpu_slot);
    let (first, count): (Vec<u64>, Vec<u64>) = t.page_runs.iter().copied().unzip();
    w.u64s(&first);
    w.u64s(&count);
    w.u32s(&t.disk_pos);
    w.u64s(&t.disk_offset);
    w.u64(t.chunk_offset);
    w.u64(t.chunk_len);
    w.u32s(&t.packed_pos);
    w.u32s(&t.packed_row);
    w.u32(t.blocks.len() as u32);
    for b in &t.blocks {
        w.u32(b.num_src);
        w.u32(b.num_dst);
        w.u32s(&b.src);
        w.u32s(&b.dst);
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    origin: &'a str,
}

impl Reader<'_> {
    fn fail(&self, what: &str) -> Error {
        Error::Store {
            url: self.origin.to_string(),
            fault: format!("corrupt address table: {what} at byte {}", self.at),
        }
    }
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| self.fail("truncated record"))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    fn len(&mut self, elem: usize) -> Result<usize> {
        let n = self.u64()?;
        if n.saturating_mul(elem as u64) > (self.bytes.len() - self.at) as u64 {
            return Err(self.fail("array longer than the record"));
        }
        Ok(n as usize)
    }
    fn u32s(&mut self) -> Result<Vec<u32>> {
        let n = self.len(4)?;
        Ok(self
            .take(n * 4)?
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect())
    }
    fn u64s(&mut self) -> Result<Vec<u64>> {
        let n = self.len(8)?;
        Ok(self
            .take(n * 8)?
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect())
    }
}

/// Decodes one record and checks that every position and row it names is
/// in range, so a corrupt table cannot index out of bounds later.
pub fn decode(origin: &str, bytes: &[u8]) -> Result<BatchTable> {
    let mut r = Reader {
        bytes,
        at: 0,
        origin,
    };
    let split = match r.u32()? {
        0 => None,
        1 => Some(Split::Train),
        2 => Some(Split::Valid),
        3 => Some(Split::Test),
        _ => return Err(r.fail("unknown split")),
    };
    let epoch = r.u32()?;
    let index = r.u32()?;
    let num_inputs = r.u32()?;
    let labels = r.u32s()?;
    let input_nodes = r.u32s()?;
    let gpu_pos = r.u32s()?;
    let gpu_slot = r.u32s()?;
    let cpu_pos = r.u32s()?;
    let cpu_slot = r.u32s()?;
    let first = r.u64s()?;
    let count = r.u64s()?;
    let disk_pos = r.u32s()?;
    let disk_offset = r.u64s()?;
    let chunk_offset = r.u64()?;
    let chunk_len = r.u64()?;
    let packed_pos = r.u32s()?;
    let packed_row = r.u32s()?;
    let layers = r.u32()?;
    let mut blocks = Vec::with_capacity(layers.min(64) as usize);
    for _ in 0..layers {
        let num_src = r.u32()?;
        let num_dst = r.u32()?;
        let src = r.u32s()?;
        let dst = r.u32s()?;
        if src.len() != dst.len()
            || num_dst > num_src
            || num_src > num_inputs
            || src.iter().any(|&s| s >= num_src)
            || dst.iter().any(|&d| d >= num_dst)
        {
            return Err(r.fail("block out of range"));
        }
        // The trainer's segment reductions rely on edges grouped by destination.
        if !dst.is_sorted() {
            return Err(r.fail("block edges not sorted by destination"));
        }
        blocks.push(Block {
            num_src,
            num_dst,
            src,
            dst,
        });
    }
    let pages: u64 = count.iter().sum();
    let positions_ok = gpu_pos.len() == gpu_slot.len()
        && cpu_pos.len() == cpu_slot.len()
        && disk_pos.len() == disk_offset.len()
        && packed_pos.len() == packed_row.len()
        && first.len() == count.len()
        && labels.len() <= num_inputs as usize
        && input_nodes.len() == num_inputs as usize
        && [&gpu_pos, &cpu_pos, &disk_pos, &packed_pos]
            .iter()
            .all(|p| p.iter().all(|&x| x < num_inputs))
        && disk_offset.iter().all(|&o| o < pages * 4096)
        && gpu_pos.len() + cpu_pos.len() + disk_pos.len() + packed_pos.len() == num_inputs as usize;
    if !positions_ok {
        return Err(r.fail("positions out of range or not covering every input"));
    }
    if r.at != bytes.len() {
        return Err(r.fail("trailing bytes"));
    }
    Ok(BatchTable {
        split,
        epoch,
        index,
        num_inputs,
        labels,
        input_nodes,
        gpu_pos,
        gpu_slot,
        cpu_pos,
        cpu_slot,
        page_runs: first.into_iter().zip(count).collect(),
        disk_pos,
        disk_offset,
        chunk_offset,
        chunk_len,
        packed_pos,
        packed_row,
        blocks,
    })
}

/// Bytes of the footer at the end of a table object.
pub const FOOTER: u64 = 24;

/// Streams records into a table object.
pub struct TableWriter<W: std::io::Write> {
    out: W,
    at: u64,
    index: Vec<(u64, u64)>,
}

impl<W: std::io::Write> TableWriter<W> {
    pub fn new(out: W) -> Self {
        TableWriter {
            out,
            at: 0,
            index: Vec::new(),
        }
    }

    pub fn push(&mut self, record: &[u8]) -> std::io::Result<()> {
        self.out.write_all(record)?;
        self.index.push((self.at, record.len() as u64));
        self.at += record.len() as u64;
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Writes the index and footer; returns the writer and the object's size.
    pub fn finish(mut self) -> std::io::Result<(W, u64)> {
        let index_offset = self.at;
        let mut tail = Vec::with_capacity(self.index.len() * 16 + FOOTER as usize);
        for (off, len) in &self.index {
            tail.extend_from_slice(&off.to_le_bytes());
            tail.extend_from_slice(&len.to_le_bytes());
        }
        tail.extend_from_slice(&index_offset.to_le_bytes());
        tail.extend_from_slice(&(self.index.len() as u64).to_le_bytes());
        tail.extend_from_slice(MAGIC);
        self.out.write_all(&tail)?;
        Ok((self.out, index_offset + tail.len() as u64))
    }
}

/// Reads a table object's footer (its last [`FOOTER`] bytes): the index's
/// offset and the record count.
pub fn decode_footer(origin: &str, footer: &[u8], object_len: u64) -> Result<(u64, u64)> {
    let fail = |what: &str| Error::Store {
        url: origin.to_string(),
        fault: format!("corrupt address table object: {what}"),
    };
    if footer.len() != FOOTER as usize || &footer[16..] != MAGIC {
        return Err(fail("bad footer"));
    }
    let index_offset = u64::from_le_bytes(footer[..8].try_into().expect("8 bytes"));
    let count = u64::from_le_bytes(footer[8..16].try_into().expect("8 bytes"));
    let end = count
        .checked_mul(16)
        .and_then(|b| b.checked_add(index_offset))
        .and_then(|b| b.checked_add(FOOTER));
    if end != Some(object_len) {
        return Err(fail("index does not end at the footer"));
    }
    Ok((index_offset, count))
}

/// Decodes the index (`count` pairs of offset and length), checking that
/// every record lies before the index.
pub fn decode_index(origin: &str, index: &[u8], index_offset: u64) -> Result<Vec<(u64, u64)>> {
    let fail = |what: &str| Error::Store {
        url: origin.to_string(),
        fault: format!("corrupt address table object: {what}"),
    };
    if !index.len().is_multiple_of(16) {
        return Err(fail("index of odd length"));
    }
    index
        .chunks_exact(16)
        .map(|c| {
            let off = u64::from_le_bytes(c[..8].try_into().expect("8 bytes"));
            let len = u64::from_le_bytes(c[8..].try_into().expect("8 bytes"));
            match off.checked_add(len) {
                Some(end) if end <= index_offset => Ok((off, len)),
                _ => Err(fail("record outside the object")),
            }
        })
        .collect()
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
            blocks: vec![Block {
                num_src: 5,
                num_dst: 1,
                src: vec![1, 2],
                dst: vec![0, 0],
            }],
        }
    }

    #[test]
    fn round_trips() {
        let t = table();
        let rec = encode(&t);
        assert_eq!(decode("t", &rec).unwrap(), t);
        let mut w = TableWriter::new(Vec::new());
        w.push(&rec).unwrap();
        w.push(&rec).unwrap();
        let (obj, size) = w.finish().unwrap();
        assert_eq!(size, obj.len() as u64);
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

    #[test]
    fn a_reused_buffer_encodes_as_a_fresh_one() {
        let short = table();
        let mut long = table();
        long.input_nodes.extend(0..1000);
        long.num_inputs = long.input_nodes.len() as u32;
        let mut buf = Vec::new();
        encode_into(&long, &mut buf);
        assert_eq!(buf, encode(&long));
        // The longer record's bytes must not linger past the shorter one.
        encode_into(&short, &mut buf);
        assert_eq!(buf, encode(&short));
        assert_eq!(decode("t", &buf).unwrap(), short);
    }

    #[test]
    fn refuses_corruption() {
        let mut t = table();
        t.disk_pos[0] = 5; // past num_inputs
        assert!(decode("t", &encode(&t)).is_err());
        let rec = encode(&table());
        assert!(decode("t", &rec[..rec.len() - 1]).is_err());
        let mut long = rec.clone();
        long.push(0);
        assert!(
            decode("t", &long)
                .unwrap_err()
                .to_string()
                .contains("trailing")
        );
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
}
