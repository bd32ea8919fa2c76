//! Reading a record's bytes: fixed-width numbers, varints and coded arrays,
//! each fault an error naming the table.

use super::topology::Coding;
use crate::error::{Error, Result};

pub(super) struct Reader<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) at: usize,
    pub(super) origin: &'a str,
}

impl Reader<'_> {
    pub(super) fn fail(&self, what: &str) -> Error {
        Error::Store {
            kind: None,
            url: self.origin.to_string(),
            fault: format!("corrupt address table: {what} at byte {}", self.at),
        }
    }
    pub(super) fn take(&mut self, n: usize) -> Result<&[u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| self.fail("truncated record"))?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }
    pub(super) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    pub(super) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    pub(super) fn varint(&mut self) -> Result<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.take(1)?[0];
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.fail("varint too long"))
    }
    pub(super) fn u32v(&mut self) -> Result<u32> {
        u32::try_from(self.varint()?).map_err(|_| self.fail("number beyond 32 bits"))
    }
    pub(super) fn u32s(&mut self, coding: Coding) -> Result<Vec<u32>> {
        let n = self.varint()?;
        // Every value takes at least a byte.
        if n > (self.bytes.len() - self.at) as u64 {
            return Err(self.fail("array longer than the record"));
        }
        let mut out = Vec::with_capacity(n as usize);
        let mut prev = 0u32;
        let mut next = match coding {
            Coding::NewIds { num_dst } => u64::from(num_dst),
            _ => 0,
        };
        for _ in 0..n {
            let v = self.varint()?;
            let x = match coding {
                Coding::Plain => u32::try_from(v).ok(),
                Coding::Delta => u32::try_from(v).ok().and_then(|d| prev.checked_add(d)),
                Coding::NewIds { .. } if v % 2 == 0 => {
                    let x = next.checked_add(v / 2);
                    next = x.map_or(u64::MAX, |x| x.saturating_add(1));
                    x.and_then(|x| u32::try_from(x).ok())
                }
                Coding::NewIds { .. } => u32::try_from(v / 2).ok(),
            };
            prev = x.ok_or_else(|| self.fail("value beyond 32 bits"))?;
            out.push(prev);
        }
        Ok(out)
    }
}
