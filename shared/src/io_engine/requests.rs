//! The byte ranges a call reads or writes, and the checks every call's
//! requests pass before anything is queued.

use super::PAGE;
use super::files::IoFile;
use crate::{Error, Result};

/// One byte range of a file and where it lands in the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadReq {
    /// Byte offset in the file.
    pub offset: u64,
    /// Bytes to read.
    pub len: usize,
    /// Byte offset in the destination buffer.
    pub buf_offset: usize,
}

impl ReadReq {
    /// Requests of at most `piece` bytes, front to back, for the file's
    /// bytes `[from, to)`, landing in the buffer from `buf_offset` on.
    pub fn span((from, to): (u64, u64), piece: usize, buf_offset: usize) -> Vec<ReadReq> {
        (from..to)
            .step_by(piece)
            .map(|at| ReadReq {
                offset: at,
                len: (to - at).min(piece as u64) as usize,
                buf_offset: buf_offset + (at - from) as usize,
            })
            .collect()
    }
}

pub(super) fn invalid(file: &IoFile, what: String) -> Error {
    Error::InvalidArgument(format!("{}: {what}", file.path.display()))
}

/// Refuses requests that do not fit the `buf_len` bytes at `base`, overlap
/// there, reach past what `pread` can address, or break O_DIRECT's alignment.
/// Takes the buffer's address, not a slice: a buffer whose other part the
/// workers are writing must not be borrowed as a whole.
pub(super) fn check_requests(
    file: &IoFile,
    reqs: &[ReadReq],
    base: *const u8,
    buf_len: usize,
) -> Result<()> {
    let base = base as usize;
    let mut dests = Vec::with_capacity(reqs.len());
    let mut sorted = true;
    for (i, req) in reqs.iter().enumerate() {
        let end = req
            .buf_offset
            .checked_add(req.len)
            .filter(|&end| end <= buf_len)
            .ok_or_else(|| {
                invalid(
                    file,
                    format!(
                        "read request {i} (buffer offset {}, length {}) does not fit the {}-byte buffer",
                        req.buf_offset,
                        req.len,
                        buf_len
                    ),
                )
            })?;
        let fits_off_t = req
            .offset
            .checked_add(req.len as u64)
            .is_some_and(|end| end <= i64::MAX as u64);
        if !fits_off_t {
            return Err(invalid(
                file,
                format!(
                    "read request {i} (offset {}, length {}) reaches past the largest file offset",
                    req.offset, req.len
                ),
            ));
        }
        if file.direct
            && !(req.offset.is_multiple_of(PAGE as u64)
                && req.len.is_multiple_of(PAGE)
                && (base + req.buf_offset).is_multiple_of(PAGE))
        {
            return Err(invalid(
                file,
                format!(
                    "read request {i} (offset {}, length {}, buffer offset {}{}) is not aligned to {PAGE} bytes, which O_DIRECT requires",
                    req.offset,
                    req.len,
                    req.buf_offset,
                    match base % PAGE {
                        0 => String::new(),
                        off => format!(" in memory that starts {off} bytes into a page"),
                    }
                ),
            ));
        }
        if req.len > 0 {
            if let Some(&(prev_start, _, _)) = dests.last() {
                sorted &= prev_start <= req.buf_offset;
            }
            dests.push((req.buf_offset, end, i));
        }
    }
    // The trainer lays requests out in buffer order; sort only when it did not.
    if !sorted {
        dests.sort_unstable();
    }
    for pair in dests.windows(2) {
        let ((_, a_end, a), (b_start, _, b)) = (pair[0], pair[1]);
        if b_start < a_end {
            return Err(invalid(
                file,
                format!("read requests {a} and {b} overlap in the buffer"),
            ));
        }
    }
    Ok(())
}
