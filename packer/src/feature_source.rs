//! The raw feature file the packer reads: a local `.npy` (read with pread)
//! or an object-store URL (read with ranged GETs). Either way it is read in
//! large sequential partitions (DiskGNN §5.2), except by the individual
//! packing baseline, which reads one aligned block per row on purpose.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;

use offgnn_shared::npy::{self, DType, Header};
use offgnn_shared::store::Store;

use crate::error::{Error, Result};

pub enum FeatureSource {
    Local {
        path: PathBuf,
        file: File,
        header: Header,
    },
    Remote {
        store: Store,
        name: String,
        header: Header,
        len: u64,
    },
}

impl FeatureSource {
    /// Opens a local path or a URL (`s3://bucket/feat.npy`, `file:///...`).
    pub fn open(location: &str) -> Result<FeatureSource> {
        if location.contains("://") && !location.starts_with("file://") {
            let (dir, name) = location
                .rsplit_once('/')
                .ok_or_else(|| Error::InvalidArgument(format!("{location}: not an object URL")))?;
            let store = Store::open(dir)?;
            let len = store
                .size(name)?
                .ok_or_else(|| Error::InvalidArgument(format!("{location}: no such object")))?;
            let head = store.get_range(name, 0..len.min(1 << 16))?;
            let header = npy::parse_header(&head)
                .map_err(|fault| Error::InvalidArgument(format!("{location}: {fault}")))?;
            check_size(location, &header, len)?;
            return Ok(FeatureSource::Remote {
                store,
                name: name.to_string(),
                header,
                len,
            });
        }
        let path = PathBuf::from(location.trim_start_matches("file://"));
        let npy = npy::NpyFile::open(&path)?;
        let header = npy.header().clone();
        let file = File::open(&path).map_err(|e| offgnn_shared::Error::io(&path, e))?;
        Ok(FeatureSource::Local { path, file, header })
    }

    pub fn header(&self) -> &Header {
        match self {
            FeatureSource::Local { header, .. } | FeatureSource::Remote { header, .. } => header,
        }
    }

    pub fn describe(&self) -> String {
        match self {
            FeatureSource::Local { path, .. } => path.display().to_string(),
            FeatureSource::Remote { store, name, .. } => format!("{}/{name}", store.url()),
        }
    }

    pub fn dtype(&self) -> DType {
        self.header().dtype
    }

    pub fn num_rows(&self) -> u64 {
        self.header().shape.first().copied().unwrap_or(0)
    }

    pub fn row_bytes(&self) -> u64 {
        self.header().shape.iter().skip(1).product::<u64>() * self.dtype().size() as u64
    }

    /// Size of the whole file (header included).
    pub fn file_bytes(&self) -> u64 {
        self.header().data_offset + self.num_rows() * self.row_bytes()
    }

    /// Reads rows `[first, first + buf.len() / row_bytes)` into `buf`.
    pub fn read_rows(&self, first: u64, buf: &mut [u8]) -> Result<()> {
        let at = self.header().data_offset + first * self.row_bytes();
        match self {
            FeatureSource::Local { path, file, .. } => file
                .read_exact_at(buf, at)
                .map_err(|e| offgnn_shared::Error::io(path, e).into()),
            FeatureSource::Remote { store, name, .. } => {
                let bytes = store.get_range(name, at..at + buf.len() as u64)?;
                buf.copy_from_slice(&bytes);
                Ok(())
            }
        }
    }

    /// The fingerprint the sampler recorded for the feature file (size and
    /// 17 sampled 64 KiB blocks, see `offgnn_shared::dataset::file_fingerprint`).
    pub fn fingerprint(&self) -> Result<String> {
        match self {
            FeatureSource::Local { path, .. } => {
                Ok(offgnn_shared::dataset::file_fingerprint(path)?)
            }
            FeatureSource::Remote {
                store, name, len, ..
            } => {
                use sha2::Digest;
                const SAMPLE: u64 = 64 << 10;
                let mut h = sha2::Sha256::new();
                h.update(len.to_le_bytes());
                for i in 0..=16u64 {
                    let at = len.saturating_sub(SAMPLE) * i / 16;
                    h.update(store.get_range(name, at..at + SAMPLE.min(len - at))?);
                }
                Ok(offgnn_shared::store::hex(&h.finalize()))
            }
        }
    }

    /// A reader for one row at a time with O_DIRECT, 4 KiB-aligned (the
    /// individual-packing baseline: what per-row random reads really cost).
    pub fn direct_reader(&self) -> Result<DirectRows> {
        let FeatureSource::Local { path, header, .. } = self else {
            return Err(Error::InvalidArgument(
                "--packing individual reads rows from a local feature file; give a path".into(),
            ));
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc_o_direct())
            .open(path)
            .or_else(|_| File::open(path))
            .map_err(|e| offgnn_shared::Error::io(path, e))?;
        Ok(DirectRows {
            file,
            path: path.clone(),
            data_offset: header.data_offset,
            row_bytes: self.row_bytes(),
            buf: AlignedBuf::new(0),
        })
    }
}

fn check_size(location: &str, header: &Header, len: u64) -> Result<()> {
    let want = header
        .data_bytes()
        .and_then(|b| b.checked_add(header.data_offset))
        .ok_or_else(|| Error::InvalidArgument(format!("{location}: shape overflows")))?;
    if want != len {
        return Err(Error::InvalidArgument(format!(
            "{location}: the header promises {want} bytes, the object has {len}"
        )));
    }
    Ok(())
}

/// O_DIRECT's value on Linux (x86-64 and aarch64 differ; both supported).
fn libc_o_direct() -> i32 {
    if cfg!(target_arch = "aarch64") {
        0o200000
    } else {
        0o40000
    }
}

/// A heap buffer aligned to 4 KiB for O_DIRECT.
pub struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    pub fn new(len: usize) -> Self {
        let raw = vec![0u8; len + 4096];
        let start = raw.as_ptr().align_offset(4096);
        AlignedBuf { raw, start, len }
    }

    pub fn resize(&mut self, len: usize) {
        if len > self.len {
            *self = AlignedBuf::new(len);
        }
        self.len = len;
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
}

/// Reads single rows through O_DIRECT (falls back to buffered reads where
/// the filesystem refuses O_DIRECT, e.g. tmpfs).
pub struct DirectRows {
    file: File,
    path: PathBuf,
    data_offset: u64,
    row_bytes: u64,
    buf: AlignedBuf,
}

impl DirectRows {
    /// Reads row `v` with one aligned read of the pages that hold it.
    pub fn read_row(&mut self, v: u64) -> Result<&[u8]> {
        let start = self.data_offset + v * self.row_bytes;
        let end = start + self.row_bytes;
        let a = start / 4096 * 4096;
        let b = end.div_ceil(4096) * 4096;
        self.buf.resize((b - a) as usize);
        let buf = self.buf.as_mut_slice();
        let mut got = 0usize;
        while got < buf.len() {
            let n = self
                .file
                .read_at(&mut buf[got..], a + got as u64)
                .map_err(|e| offgnn_shared::Error::io(&self.path, e))?;
            if n == 0 {
                break; // the last page of the file is short
            }
            got += n;
        }
        if (got as u64) < end - a {
            return Err(Error::InvalidArgument(format!(
                "{}: short read at row {v}",
                self.path.display()
            )));
        }
        let off = (start - a) as usize;
        Ok(&self.buf.as_slice()[off..off + self.row_bytes as usize])
    }
}
