//! A table object: its records back to back, then an index of each
//! record's offset and length, then a fixed-size footer that ends in the
//! format's magic (see the module above for the layout).

use crate::error::{Error, Result};

/// The format's magic, the footer's last 8 bytes.
const MAGIC: &[u8; 8] = b"OGATBL02";

/// Bytes of a table object's index and footer beside its `records`.
pub fn object_overhead(records: u64) -> u64 {
    records * 16 + FOOTER
}

/// Magic of the tables before this format (raw arrays): refused, as the
/// layout must be packed again.
pub(super) const OLD_MAGIC: &[u8; 8] = b"OGATBL01";

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
        kind: None,
        url: origin.to_string(),
        fault: format!("corrupt address table object: {what}"),
    };
    if footer.len() == FOOTER as usize && &footer[16..] == OLD_MAGIC {
        return Err(Error::Store {
 kind: None,
            url: origin.to_string(),
            fault: "address table of an older offgnn (format OGATBL01), which this build does not read; pack the layout again with this packer".to_string(),
        });
    }
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
        kind: None,
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
