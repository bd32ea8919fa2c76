//! The `.npy` format (NumPy's array file): a header parser that accepts what
//! NumPy writes and rejects everything else with a precise fault, size checks
//! against the header, streaming typed reads of id arrays, raw row reads of
//! feature matrices, and a writer. Arrays are never loaded whole unless asked.
//!
//! Format reference: `numpy/lib/format.py` — magic `\x93NUMPY`, a version
//! byte pair (1.0: u16 header length, 2.0 and 3.0: u32), then a Python dict
//! literal with `descr`, `fortran_order` and `shape`.

use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

mod literal;
use literal::{Literal, parse_dict};

const MAGIC: &[u8; 6] = b"\x93NUMPY";
/// Headers larger than this are refused: NumPy itself caps reads at 10 000
/// bytes by default, and an attacker-sized length must not allocate.
const MAX_HEADER_LEN: usize = 1 << 20;

/// Element types we understand. Only little-endian (or byte-sized) layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    Bool,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    F16,
    F32,
    F64,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::Bool | DType::I8 | DType::U8 => 1,
            DType::I16 | DType::U16 | DType::F16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 => 8,
        }
    }

    pub fn is_integer(self) -> bool {
        matches!(
            self,
            DType::I8
                | DType::I16
                | DType::I32
                | DType::I64
                | DType::U8
                | DType::U16
                | DType::U32
                | DType::U64
        )
    }

    /// The `descr` string NumPy writes for this type.
    pub fn descr(self) -> &'static str {
        match self {
            DType::Bool => "|b1",
            DType::I8 => "|i1",
            DType::I16 => "<i2",
            DType::I32 => "<i4",
            DType::I64 => "<i8",
            DType::U8 => "|u1",
            DType::U16 => "<u2",
            DType::U32 => "<u4",
            DType::U64 => "<u8",
            DType::F16 => "<f2",
            DType::F32 => "<f4",
            DType::F64 => "<f8",
        }
    }

    /// The name NumPy users know (`float32`, `int64`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::I64 => "int64",
            DType::U8 => "uint8",
            DType::U16 => "uint16",
            DType::U32 => "uint32",
            DType::U64 => "uint64",
            DType::F16 => "float16",
            DType::F32 => "float32",
            DType::F64 => "float64",
        }
    }

    fn from_descr(descr: &str) -> std::result::Result<Self, String> {
        let (order, code) = match descr.as_bytes().first() {
            Some(b'<' | b'|' | b'=') => (descr.as_bytes()[0], &descr[1..]),
            Some(b'>') => {
                return Err(format!(
                    "unsupported dtype '{descr}': big-endian arrays are not supported"
                ));
            }
            _ => (b'|', descr),
        };
        let dtype = match code {
            "b1" | "?" => DType::Bool,
            "i1" => DType::I8,
            "i2" => DType::I16,
            "i4" => DType::I32,
            "i8" => DType::I64,
            "u1" => DType::U8,
            "u2" => DType::U16,
            "u4" => DType::U32,
            "u8" => DType::U64,
            "f2" => DType::F16,
            "f4" => DType::F32,
            "f8" => DType::F64,
            _ => return Err(format!("unsupported dtype '{descr}'")),
        };
        if order == b'|' && dtype.size() > 1 && descr.starts_with('|') {
            return Err(format!("unsupported dtype '{descr}': no byte order given"));
        }
        Ok(dtype)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A parsed `.npy` header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    pub dtype: DType,
    pub fortran_order: bool,
    pub shape: Vec<u64>,
    /// Byte offset of the first element in the file.
    pub data_offset: u64,
}

impl Header {
    /// Number of elements, or `None` when the product overflows.
    pub fn len(&self) -> Option<u64> {
        self.shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
    }

    pub fn is_empty(&self) -> bool {
        self.len() == Some(0)
    }

    /// Bytes of element data the header promises, or `None` on overflow.
    pub fn data_bytes(&self) -> Option<u64> {
        self.len()?.checked_mul(self.dtype.size() as u64)
    }
}

/// Parses a `.npy` header from the first bytes of a file. `bytes` may hold
/// more than the header; it must hold all of it. Errors are plain text
/// faults; callers attach the path.
pub fn parse_header(bytes: &[u8]) -> std::result::Result<Header, String> {
    if bytes.len() < 8 || &bytes[..6] != MAGIC {
        return Err("not a .npy file (bad magic bytes)".into());
    }
    let (major, minor) = (bytes[6], bytes[7]);
    let (len_size, utf8) = match (major, minor) {
        (1, 0) => (2usize, false),
        (2, 0) => (4, false),
        (3, 0) => (4, true),
        _ => return Err(format!("unsupported .npy format version {major}.{minor}")),
    };
    if bytes.len() < 8 + len_size {
        return Err("truncated header".into());
    }
    let header_len = if len_size == 2 {
        u16::from_le_bytes([bytes[8], bytes[9]]) as usize
    } else {
        u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize
    };
    if header_len > MAX_HEADER_LEN {
        return Err(format!("header length {header_len} is implausibly large"));
    }
    let start = 8 + len_size;
    let end = start + header_len;
    if bytes.len() < end {
        return Err("truncated header".into());
    }
    let text = &bytes[start..end];
    let text = if utf8 {
        std::str::from_utf8(text).map_err(|_| "header is not valid UTF-8".to_string())?
    } else {
        if !text.is_ascii() {
            return Err("header is not ASCII".into());
        }
        std::str::from_utf8(text).expect("ASCII is valid UTF-8")
    };
    let dict = parse_dict(text)?;
    let mut descr = None;
    let mut fortran_order = None;
    let mut shape = None;
    for (key, value) in dict {
        match (key.as_str(), value) {
            ("descr", Literal::Str(s)) => descr = Some(s),
            ("fortran_order", Literal::Bool(b)) => fortran_order = Some(b),
            ("shape", Literal::Tuple(t)) => shape = Some(t),
            ("descr" | "fortran_order" | "shape", _) => {
                return Err(format!("header key '{key}' has the wrong type"));
            }
            _ => return Err(format!("unexpected header key '{key}'")),
        }
    }
    let descr = descr.ok_or("header has no 'descr'")?;
    let fortran_order = fortran_order.ok_or("header has no 'fortran_order'")?;
    let shape = shape.ok_or("header has no 'shape'")?;
    let dtype = DType::from_descr(&descr)?;
    Ok(Header {
        dtype,
        fortran_order,
        shape,
        data_offset: end as u64,
    })
}

/// An opened `.npy` file whose header has been parsed and whose size matches
/// the header. C-order only.
#[derive(Debug)]
pub struct NpyFile {
    path: PathBuf,
    file: File,
    header: Header,
}

impl NpyFile {
    /// Opens and checks a `.npy` file: a parseable header, C order (or one
    /// dimension), and exactly as many data bytes as the shape promises.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let mut file = File::open(&path).map_err(|e| Error::io(&path, e))?;
        let file_len = file.metadata().map_err(|e| Error::io(&path, e))?.len();
        let mut head = vec![0u8; 4096.min(file_len as usize)];
        file.read_exact(&mut head)
            .map_err(|e| Error::io(&path, e))?;
        let header = match parse_header(&head) {
            Err(fault) if fault == "truncated header" && file_len > head.len() as u64 => {
                // A header longer than our first read: read exactly what it says.
                let need = header_end_hint(&head).unwrap_or(file_len).min(file_len);
                let mut head = vec![0u8; need as usize];
                file.seek(SeekFrom::Start(0))
                    .and_then(|_| file.read_exact(&mut head))
                    .map_err(|e| Error::io(&path, e))?;
                parse_header(&head)
            }
            other => other,
        }
        .map_err(|fault| Error::npy(&path, fault))?;
        if header.fortran_order && header.shape.iter().filter(|&&d| d > 1).count() > 1 {
            return Err(Error::npy(
                &path,
                "Fortran-order (column-major) arrays are not supported; save with np.ascontiguousarray",
            ));
        }
        let data_bytes = header
            .data_bytes()
            .ok_or_else(|| Error::npy(&path, "shape overflows 64 bits"))?;
        let have = file_len.saturating_sub(header.data_offset);
        if have < data_bytes {
            return Err(Error::npy(
                &path,
                format!(
                    "truncated: shape {:?} of {} needs {data_bytes} data bytes, the file has {have}",
                    header.shape, header.dtype
                ),
            ));
        }
        if have > data_bytes {
            return Err(Error::npy(
                &path,
                format!(
                    "{} bytes after the data that shape {:?} of {} describes",
                    have - data_bytes,
                    header.shape,
                    header.dtype
                ),
            ));
        }
        Ok(NpyFile { path, file, header })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn dtype(&self) -> DType {
        self.header.dtype
    }

    pub fn shape(&self) -> &[u64] {
        &self.header.shape
    }

    /// The underlying file, for callers that read rows themselves (the packer).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Bytes of one row of a 2-D array (`shape[1] * itemsize`), or of one
    /// element of a 1-D array.
    pub fn row_bytes(&self) -> u64 {
        let cols: u64 = self.header.shape.iter().skip(1).product();
        cols * self.header.dtype.size() as u64
    }

    /// Reads `buf.len()` bytes of element data starting at byte `offset` of
    /// the data (not of the file).
    pub fn read_data_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.file
            .read_exact_at(buf, self.header.data_offset + offset)
            .map_err(|e| Error::io(&self.path, e))
    }

    /// The first NaN or infinite value of a float32 or float16 matrix, as
    /// (row, column, value), reading the file front to back in 64 MiB
    /// pieces; `progress` gets the bytes of each piece. `None` for other
    /// dtypes and for all-finite data.
    pub fn first_non_finite(
        &self,
        mut progress: impl FnMut(u64),
    ) -> Result<Option<(u64, u64, f64)>> {
        let size = match self.header.dtype {
            d @ (DType::F32 | DType::F16) => d.size() as u64,
            _ => return Ok(None),
        };
        let total = self.header.data_bytes().unwrap_or(0);
        let cols = self.header.shape.get(1).copied().unwrap_or(1).max(1);
        let piece = (64u64 << 20) / size * size;
        let mut buf = vec![0u8; piece as usize];
        let mut at = 0u64;
        while at < total {
            let n = piece.min(total - at) as usize;
            self.read_data_at(at, &mut buf[..n])?;
            let found = first_non_finite_in(&buf[..n], self.header.dtype);
            if let Some((i, value)) = found {
                let index = at / size + i as u64;
                return Ok(Some((index / cols, index % cols, value)));
            }
            progress(n as u64);
            at += n as u64;
        }
        Ok(None)
    }

    /// Reads elements `[start, start + count)` of an integer array as u64.
    /// Negative values are an error naming the element's index.
    pub fn read_u64(&self, start: u64, count: usize) -> Result<Vec<u64>> {
        let mut out = Vec::new();
        self.read_u64_into(start, count, &mut Vec::new(), &mut out)?;
        Ok(out)
    }

    /// As [`NpyFile::read_u64`], into `out`, with `raw` for the file's
    /// bytes: a caller reading chunk after chunk keeps both, so that no
    /// chunk pays for fresh pages.
    /// `count` elements of an i64 or u64 array from element `start`, read
    /// straight into `out` (no staging copy): a negative i64 comes out as
    /// 2^63 or more, for the caller's bound to catch.
    pub fn read_u64_direct(&self, start: u64, count: usize, out: &mut Vec<u64>) -> Result<()> {
        let dtype = self.header.dtype;
        if !matches!(dtype, DType::I64 | DType::U64) {
            return Err(Error::npy(
                &self.path,
                format!("expected a 64-bit integer array, found {dtype}"),
            ));
        }
        out.resize(count, 0);
        self.read_data_at(start * 8, bytemuck::cast_slice_mut(out.as_mut_slice()))?;
        // The file is little-endian: a no-op on this kind of host.
        for v in out.iter_mut() {
            *v = u64::from_le(*v);
        }
        Ok(())
    }

    /// Whether [`NpyFile::map_u64`] maps this file: an i64 or u64 array
    /// whose data starts 8-byte aligned (mappings start on a page).
    pub fn maps_u64(&self) -> bool {
        matches!(self.header.dtype, DType::I64 | DType::U64)
            && self.header.data_offset.is_multiple_of(8)
    }

    /// Elements `[start, start + count)` of an i64 or u64 array mapped
    /// from the file rather than read: no copy, and only a mapping's worth
    /// of the page cache in the process's memory (it leaves with the
    /// mapping). A negative i64 shows as 2^63 or more, as in
    /// [`NpyFile::read_u64_direct`]. `None` for other dtypes, or where the
    /// elements would not lie 8-byte aligned.
    pub fn map_u64(&self, start: u64, count: usize) -> Result<Option<MappedU64>> {
        if !self.maps_u64() || count == 0 {
            return Ok(None);
        }
        let at = self.header.data_offset + start * 8;
        // SAFETY: a private read-only mapping, only read as `&[u64]`;
        // offgnn never changes a dataset's files in place. Another process
        // that truncated the file while it is mapped would end this one
        // with SIGBUS, as with any mapping.
        let map = unsafe {
            memmap2::MmapOptions::new()
                .offset(at)
                .len(count * 8)
                .map(&self.file)
        }
        .map_err(|e| Error::io(&self.path, e))?;
        if bytemuck::try_cast_slice::<u8, u64>(&map).is_err() {
            return Ok(None);
        }
        Ok(Some(MappedU64 { map }))
    }

    pub fn read_u64_into(
        &self,
        start: u64,
        count: usize,
        raw: &mut Vec<u8>,
        out: &mut Vec<u64>,
    ) -> Result<()> {
        let dtype = self.header.dtype;
        if !dtype.is_integer() {
            return Err(Error::npy(
                &self.path,
                format!("expected an integer array, found {dtype}"),
            ));
        }
        let negative = |k: usize, value: i128| {
            Error::npy(
                &self.path,
                format!("negative value {value} at element {}", start + k as u64),
            )
        };
        if matches!(dtype, DType::I64 | DType::U64) {
            // Id files' usual dtypes: straight into `out`, without the
            // per-element conversion below.
            self.read_u64_direct(start, count, out)?;
            if dtype == DType::I64
                && let Some(k) = out.iter().position(|&v| (v as i64) < 0)
            {
                return Err(negative(k, i128::from(out[k] as i64)));
            }
            return Ok(());
        }
        let size = dtype.size();
        raw.resize(count * size, 0);
        self.read_data_at(start * size as u64, raw)?;
        out.clear();
        for (k, chunk) in raw.chunks_exact(size).enumerate() {
            let value: i128 = match dtype {
                DType::I8 => chunk[0] as i8 as i128,
                DType::U8 => chunk[0] as i128,
                DType::I16 => i16::from_le_bytes([chunk[0], chunk[1]]) as i128,
                DType::U16 => u16::from_le_bytes([chunk[0], chunk[1]]) as i128,
                DType::I32 => i32::from_le_bytes(chunk.try_into().expect("4 bytes")) as i128,
                DType::U32 => u32::from_le_bytes(chunk.try_into().expect("4 bytes")) as i128,
                DType::I64 => i64::from_le_bytes(chunk.try_into().expect("8 bytes")) as i128,
                DType::U64 => u64::from_le_bytes(chunk.try_into().expect("8 bytes")) as i128,
                _ => unreachable!("checked integer dtype above"),
            };
            if value < 0 {
                return Err(negative(k, value));
            }
            out.push(value as u64);
        }
        Ok(())
    }

    /// Reads a whole 1-D integer array as u64 (for id and label arrays, which
    /// are small next to the features).
    pub fn read_all_u64(&self) -> Result<Vec<u64>> {
        let len = self.header.len().expect("size checked on open");
        self.read_u64(0, len as usize)
    }
}

/// The end of the header as its length field states, when the prefix holds it.
fn header_end_hint(bytes: &[u8]) -> Option<u64> {
    match bytes.get(6..8)? {
        [1, 0] => Some(10 + u16::from_le_bytes([*bytes.get(8)?, *bytes.get(9)?]) as u64),
        [2 | 3, 0] => Some(12 + u32::from_le_bytes(bytes.get(8..12)?.try_into().ok()?) as u64),
        _ => None,
    }
}

/// Builds the header bytes for an array, padded so that data starts on a
/// 64-byte boundary as NumPy does.
pub fn encode_header(dtype: DType, shape: &[u64]) -> Vec<u8> {
    let shape_text = match shape {
        [n] => format!("({n},)"),
        dims => format!(
            "({})",
            dims.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape_text}, }}",
        dtype.descr()
    );
    let (version, len_size) = if dict.len() + 11 < 65535 {
        (1u8, 2)
    } else {
        (2u8, 4)
    };
    let unpadded = 8 + len_size + dict.len() + 1;
    let padded = unpadded.div_ceil(64) * 64;
    let header_len = padded - 8 - len_size;
    let mut out = Vec::with_capacity(padded);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[version, 0]);
    if len_size == 2 {
        out.extend_from_slice(&(header_len as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(header_len as u32).to_le_bytes());
    }
    out.extend_from_slice(dict.as_bytes());
    out.resize(padded - 1, b' ');
    out.push(b'\n');
    out
}

/// Streams an array of known shape into a `.npy` file. `finish` checks that
/// exactly the promised number of bytes arrived.
pub struct NpyWriter {
    path: PathBuf,
    out: BufWriter<File>,
    data_offset: u64,
    expected: u64,
    written: u64,
}

impl NpyWriter {
    pub fn create(path: impl AsRef<Path>, dtype: DType, shape: &[u64]) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let header = encode_header(dtype, shape);
        let expected = shape
            .iter()
            .try_fold(dtype.size() as u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| Error::InvalidArgument(format!("shape {shape:?} overflows")))?;
        let file = File::create(&path).map_err(|e| Error::io(&path, e))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&header).map_err(|e| Error::io(&path, e))?;
        Ok(NpyWriter {
            path,
            out,
            data_offset: header.len() as u64,
            expected,
            written: 0,
        })
    }

    /// Byte offset of element data in the file.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Appends raw little-endian element bytes.
    pub fn write_bytes(&mut self, bytes: &[u8]) -> Result<()> {
        self.written += bytes.len() as u64;
        if self.written > self.expected {
            return Err(Error::npy(
                &self.path,
                format!(
                    "writer got more than the {} bytes the shape holds",
                    self.expected
                ),
            ));
        }
        self.out
            .write_all(bytes)
            .map_err(|e| Error::io(&self.path, e))
    }

    /// Writes raw element bytes at a data offset, outside the sequential
    /// stream (for arrays filled in two regions, such as `[2, E]` edges).
    /// Bytes written this way count towards the total.
    pub fn write_at(&mut self, data_offset: u64, bytes: &[u8]) -> Result<()> {
        if data_offset + bytes.len() as u64 > self.expected {
            return Err(Error::npy(
                &self.path,
                "positional write past the array's end",
            ));
        }
        self.out.flush().map_err(|e| Error::io(&self.path, e))?;
        self.out
            .get_ref()
            .write_all_at(bytes, self.data_offset + data_offset)
            .map_err(|e| Error::io(&self.path, e))?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Flushes and syncs; errors when fewer bytes than the shape promises were written.
    pub fn finish(self) -> Result<()> {
        if self.written != self.expected {
            return Err(Error::npy(
                &self.path,
                format!(
                    "writer finished with {} of {} data bytes",
                    self.written, self.expected
                ),
            ));
        }
        let file = self
            .out
            .into_inner()
            .map_err(|e| Error::io(&self.path, e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(&self.path, e))
    }
}

/// Writes a small 1-D array of u64-convertible values as `int64`.
pub fn write_i64(path: impl AsRef<Path>, values: &[u64]) -> Result<()> {
    let mut w = NpyWriter::create(path, DType::I64, &[values.len() as u64])?;
    let mut buf = Vec::with_capacity(values.len() * 8);
    for &v in values {
        buf.extend_from_slice(&(v as i64).to_le_bytes());
    }
    w.write_bytes(&buf)?;
    w.finish()
}

/// The first NaN or infinite element of little-endian float32 or float16
/// `bytes`, as (element index, value); `None` for other dtypes and for
/// all-finite data. An all-ones exponent is NaN or infinity: blocks of 256
/// elements are tested with no early exit and no call per element (so the
/// test vectorizes, at several GB/s), and only a block that holds one is
/// searched.
pub fn first_non_finite_in(bytes: &[u8], dtype: DType) -> Option<(usize, f64)> {
    fn scan<const W: usize>(bytes: &[u8], bad: impl Fn([u8; W]) -> bool + Copy) -> Option<usize> {
        let block = 256 * W;
        bytes.chunks(block).enumerate().find_map(|(k, chunk)| {
            let words = chunk.chunks_exact(W);
            let hit = words
                .clone()
                .fold(false, |acc, b| acc | bad(b.try_into().expect("W bytes")));
            hit.then(|| {
                k * 256
                    + words
                        .clone()
                        .position(|b| bad(b.try_into().expect("W bytes")))
                        .expect("the block holds one")
            })
        })
    }
    match dtype {
        DType::F32 => scan::<4>(bytes, |b| {
            u32::from_le_bytes(b) & 0x7f80_0000 == 0x7f80_0000
        })
        .map(|i| {
            let b = &bytes[i * 4..i * 4 + 4];
            (i, f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
        }),
        DType::F16 => scan::<2>(bytes, |b| u16::from_le_bytes(b) & 0x7c00 == 0x7c00).map(|i| {
            (
                i,
                half::f16::from_le_bytes([bytes[i * 2], bytes[i * 2 + 1]]).to_f64(),
            )
        }),
        _ => None,
    }
}

/// Elements of a 64-bit integer array mapped from its file
/// ([`NpyFile::map_u64`]), little-endian as the dtypes read here are.
pub struct MappedU64 {
    map: memmap2::Mmap,
}

impl MappedU64 {
    pub fn as_slice(&self) -> &[u64] {
        bytemuck::cast_slice(&self.map)
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_first_non_finite_value_is_found_across_blocks() {
        for at in [0usize, 255, 256, 257, 1000, 1023] {
            for (value, shown) in [(f32::NAN, "NaN"), (f32::INFINITY, "inf")] {
                let mut v = vec![1.5f32; 1024];
                v[at] = value;
                v[1023] = f32::NEG_INFINITY;
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                let (i, got) = first_non_finite_in(&bytes, DType::F32).unwrap();
                assert_eq!(i, at, "{shown} at {at}");
                assert_eq!(format!("{got}"), if at == 1023 { "-inf" } else { shown });
                let halves: Vec<u8> = v
                    .iter()
                    .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                    .collect();
                assert_eq!(first_non_finite_in(&halves, DType::F16).unwrap().0, at);
            }
        }
        let finite: Vec<u8> = (0..1000).flat_map(|i| (i as f32).to_le_bytes()).collect();
        assert_eq!(first_non_finite_in(&finite, DType::F32), None);
        assert_eq!(first_non_finite_in(&finite, DType::I64), None);
    }

    use super::*;

    #[test]
    fn parses_what_numpy_writes() {
        let h = encode_header(DType::F32, &[2708, 1433]);
        assert_eq!(h.len() % 64, 0);
        let parsed = parse_header(&h).unwrap();
        assert_eq!(parsed.dtype, DType::F32);
        assert_eq!(parsed.shape, vec![2708, 1433]);
        assert!(!parsed.fortran_order);
        assert_eq!(parsed.data_offset, h.len() as u64);
    }

    #[test]
    fn one_dimensional_shape_round_trips() {
        let h = encode_header(DType::I64, &[7]);
        assert_eq!(parse_header(&h).unwrap().shape, vec![7]);
        let h = encode_header(DType::I64, &[]);
        assert_eq!(parse_header(&h).unwrap().shape, Vec::<u64>::new());
    }

    #[test]
    fn numpy_literal_variants() {
        let text = "{\"descr\": \"<f2\", \"fortran_order\": True, \"shape\": (3L, 4)}";
        let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
        bytes.extend_from_slice(&(text.len() as u16).to_le_bytes());
        bytes.extend_from_slice(text.as_bytes());
        let h = parse_header(&bytes).unwrap();
        assert_eq!(h.dtype, DType::F16);
        assert!(h.fortran_order);
        assert_eq!(h.shape, vec![3, 4]);
    }

    #[test]
    fn rejects_bad_headers() {
        let cases: &[(&[u8], &str)] = &[
            (b"NOTNUMPY", "bad magic"),
            (b"\x93NUMPY\x09\x00\x00\x00", "version 9.0"),
            (b"\x93NUMPY\x01\x00\x40\x00{}", "truncated header"),
        ];
        for (bytes, want) in cases {
            let err = parse_header(bytes).unwrap_err();
            assert!(err.contains(want), "{err} should mention {want}");
        }
        for (dict, want) in [
            (
                "{'descr': '>f4', 'fortran_order': False, 'shape': (2,)}",
                "big-endian",
            ),
            (
                "{'descr': '<c8', 'fortran_order': False, 'shape': (2,)}",
                "unsupported dtype",
            ),
            ("{'descr': '<f4', 'shape': (2,)}", "no 'fortran_order'"),
            (
                "{'descr': '<f4', 'fortran_order': 'no', 'shape': (2,)}",
                "wrong type",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (2, x)}",
                "non-integer",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 'y'}",
                "unexpected header key",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (2,)} junk",
                "trailing",
            ),
        ] {
            let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
            bytes.extend_from_slice(&(dict.len() as u16).to_le_bytes());
            bytes.extend_from_slice(dict.as_bytes());
            let err = parse_header(&bytes).unwrap_err();
            assert!(err.contains(want), "{dict}: {err} should mention {want}");
        }
    }

    #[test]
    fn write_then_read_ids() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ids.npy");
        write_i64(&path, &[5, 0, 9, 1 << 40]).unwrap();
        let f = NpyFile::open(&path).unwrap();
        assert_eq!(f.shape(), &[4]);
        assert_eq!(f.read_all_u64().unwrap(), vec![5, 0, 9, 1 << 40]);
        assert_eq!(f.read_u64(1, 2).unwrap(), vec![0, 9]);
    }

    #[test]
    fn mapped_ids_are_the_ids_read_and_other_dtypes_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ids.npy");
        // Past a page, so that a chunk's mapping starts inside one.
        let values: Vec<u64> = (0..3000).map(|i| i * 7 + 1).collect();
        write_i64(&path, &values).unwrap();
        let f = NpyFile::open(&path).unwrap();
        for (start, count) in [(0, 3000), (511, 3), (1000, 2000), (2999, 1)] {
            let mapped = f.map_u64(start, count).unwrap().expect("int64 maps");
            assert_eq!(mapped.as_slice(), f.read_u64(start, count).unwrap());
        }
        let floats = dir.path().join("x.npy");
        let mut w = NpyWriter::create(&floats, DType::F32, &[2]).unwrap();
        w.write_bytes(&[0u8; 8]).unwrap();
        w.finish().unwrap();
        assert!(
            NpyFile::open(&floats)
                .unwrap()
                .map_u64(0, 2)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn writer_refuses_short_output() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = NpyWriter::create(dir.path().join("x.npy"), DType::F32, &[2, 2]).unwrap();
        w.write_bytes(&[0u8; 12]).unwrap();
        assert!(w.finish().unwrap_err().to_string().contains("12 of 16"));
    }
}
