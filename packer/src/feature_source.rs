//! The raw feature file the packer reads: a local `.npy` (read with pread)
//! or an object-store URL (read with ranged GETs). Either way it is read in
//! large sequential partitions (DiskGNN §5.2), except by the individual
//! packing baseline, which reads one aligned block per row on purpose.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use offgnn_shared::io_engine::{AlignedBuf, IoEngine, IoFile, IoOptions, PAGE, ReadReq};
use offgnn_shared::npy::{self, DType, Header};
use offgnn_shared::store::Store;

use crate::error::{Error, Result};
use offgnn_manifests::Dtype;

/// Bytes asked for at once when a partition comes from an object store
/// (rounded down to whole rows).
const READ_PIECE: usize = 16 << 20;

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
        // The manifest records where the features are (the trainer's naive
        // and in-memory baselines read them): an absolute path.
        let path = path.canonicalize().unwrap_or(path);
        let header = npy.header().clone();
        let file = File::open(&path).map_err(|e| offgnn_shared::Error::io(&path, e))?;
        Ok(FeatureSource::Local { path, file, header })
    }

    /// The file's path when it is local.
    pub fn local_path(&self) -> Option<&Path> {
        match self {
            FeatureSource::Local { path, .. } => Some(path),
            FeatureSource::Remote { .. } => None,
        }
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

    /// The file's values as a layout can store them unconverted: float32
    /// or float16 (the sampler's dataset check admits nothing else).
    pub fn store_dtype(&self) -> Result<Dtype> {
        crate::store_dtype::of_feature(self.dtype()).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{}: features of type {} cannot be packed (float32 or float16)",
                self.describe(),
                self.dtype()
            ))
        })
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
    pub fn row_reader(&self) -> Result<RowReader> {
        let FeatureSource::Local { path, header, .. } = self else {
            return Err(Error::InvalidArgument(
                "--packing individual reads rows from a local feature file; give a path".into(),
            ));
        };
        let engine = IoEngine::new(IoOptions::default());
        let file = engine.open(path)?;
        if !file.is_direct() {
            tracing::warn!(
                "{}: O_DIRECT refused; the individual baseline reads through the page cache",
                path.display()
            );
        }
        let tail = File::open(path).map_err(|e| offgnn_shared::Error::io(path, e))?;
        Ok(RowReader {
            engine,
            file,
            tail,
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

/// Rows asked of the I/O engine per call by [`RowReader::read_each`].
const ROWS_PER_CALL: usize = 8192;

/// The individual-packing baseline's reader (DiskGNN §5.2, Figure 6a): one
/// aligned O_DIRECT read of the pages that hold each row, many in flight at
/// once through the shared I/O engine (its rings and queue depth), so that
/// the baseline is as fast as random row reads get on this disk.
pub struct RowReader {
    engine: IoEngine,
    file: IoFile,
    /// The same file opened buffered, for rows in its last partial page (an
    /// O_DIRECT read cannot stop short of a page boundary).
    tail: File,
    path: PathBuf,
    data_offset: u64,
    row_bytes: u64,
    buf: AlignedBuf,
}

impl RowReader {
    /// Reads the rows `rows` and hands each to `sink` with its index in
    /// `rows`, in order. Returns the bytes read from disk (whole pages).
    pub fn read_each(
        &mut self,
        rows: &[u32],
        mut sink: impl FnMut(usize, &[u8]) -> Result<()>,
    ) -> Result<u64> {
        let page = PAGE as u64;
        let rb = self.row_bytes;
        let mut read = 0u64;
        let mut reqs = Vec::with_capacity(ROWS_PER_CALL);
        let mut starts = Vec::with_capacity(ROWS_PER_CALL);
        let mut row = vec![0u8; rb as usize];
        for (group, chunk) in rows.chunks(ROWS_PER_CALL).enumerate() {
            reqs.clear();
            starts.clear();
            let mut at = 0usize;
            for &v in chunk {
                let start = self.data_offset + v as u64 * rb;
                let (first, end) = (start / page * page, (start + rb).div_ceil(page) * page);
                if self.file.is_direct() && end > self.file.len() {
                    starts.push(None);
                    continue;
                }
                reqs.push(ReadReq {
                    offset: first,
                    len: (end - first) as usize,
                    buf_offset: at,
                });
                starts.push(Some(at + (start - first) as usize));
                at += (end - first) as usize;
            }
            self.buf.resize(at);
            read += self.engine.read(&self.file, &reqs, &mut self.buf)?;
            for (k, (&v, start)) in chunk.iter().zip(&starts).enumerate() {
                let data = match start {
                    Some(s) => &self.buf.as_slice()[*s..*s + rb as usize],
                    None => {
                        let at = self.data_offset + v as u64 * rb;
                        self.tail
                            .read_exact_at(&mut row, at)
                            .map_err(|e| offgnn_shared::Error::io(&self.path, e))?;
                        read += page;
                        &row
                    }
                };
                sink(group * ROWS_PER_CALL + k, data)?;
            }
        }
        Ok(read)
    }
}

/// Bytes per request when reading a partition: the engine cuts each into
/// 1 MiB pieces spread over its rings.
const PARTITION_REQUEST: usize = 4 << 20;

/// A buffer holding rows `[first, end)` of the feature file, page-aligned
/// so that O_DIRECT can fill it: the rows start `skew` bytes in.
pub struct PartitionBuf {
    buf: AlignedBuf,
    skew: usize,
    len: usize,
}

impl PartitionBuf {
    pub fn new() -> Self {
        PartitionBuf {
            buf: AlignedBuf::new(0),
            skew: 0,
            len: 0,
        }
    }

    /// The partition's rows, row-major.
    pub fn rows(&self) -> &[u8] {
        &self.buf.as_slice()[self.skew..self.skew + self.len]
    }
}

impl Default for PartitionBuf {
    fn default() -> Self {
        Self::new()
    }
}

/// Reads whole partitions of the feature file (DiskGNN §5.2): a local file
/// with O_DIRECT through the I/O engine, many large requests in flight, so
/// that the disk streams at its sequential bandwidth and no page-cache copy
/// costs a core; an object with ranged GETs.
pub struct PartitionReader<'a> {
    source: &'a FeatureSource,
    local: Option<(&'a IoEngine, IoFile)>,
}

impl<'a> PartitionReader<'a> {
    /// Reads rows `[first, end)` into `out`; returns the bytes read from
    /// the file (the page-aligned span around them, locally).
    pub fn read(&self, first: u64, end: u64, out: &mut PartitionBuf) -> Result<u64> {
        let rb = self.source.row_bytes();
        let data_offset = self.source.header().data_offset;
        let (start, stop) = (data_offset + first * rb, data_offset + end * rb);
        out.len = ((end - first) * rb) as usize;
        let Some((engine, file)) = &self.local else {
            out.skew = 0;
            out.buf.resize(out.len);
            let piece_rows = (READ_PIECE as u64 / rb).max(1);
            for (k, piece) in out.buf.as_mut_slice()[..out.len]
                .chunks_mut((piece_rows * rb) as usize)
                .enumerate()
            {
                self.source
                    .read_rows(first + k as u64 * piece_rows, piece)?;
            }
            return Ok(out.len as u64);
        };
        let page = PAGE as u64;
        let aligned = start / page * page;
        // O_DIRECT cannot read a short last page: its bytes come buffered.
        let direct_end = stop
            .div_ceil(page)
            .saturating_mul(page)
            .min(file.len() / page * page);
        let direct_end = if file.is_direct() {
            direct_end.max(aligned)
        } else {
            stop
        };
        out.skew = (start - aligned) as usize;
        out.buf
            .resize((stop.div_ceil(page) * page - aligned) as usize);
        let reqs = ReadReq::span((aligned, direct_end), PARTITION_REQUEST, 0);
        let mut read = engine.read(file, &reqs, &mut out.buf)?;
        if direct_end < stop {
            let FeatureSource::Local {
                path, file: plain, ..
            } = self.source
            else {
                unreachable!("a local reader reads a local source");
            };
            let at = (direct_end - aligned) as usize;
            let tail = &mut out.buf.as_mut_slice()[at..at + (stop - direct_end) as usize];
            plain
                .read_exact_at(tail, direct_end)
                .map_err(|e| offgnn_shared::Error::io(path, e))?;
            read += stop - direct_end;
        }
        Ok(read)
    }
}

impl FeatureSource {
    /// CRC32C of every row, in order, read front to back in large pieces:
    /// what the packer recorded while it packed them.
    pub fn rows_crc32c(&self, engine: &IoEngine, show: bool) -> Result<u32> {
        let reader = self.partition_reader(engine)?;
        let rb = self.row_bytes();
        let n = self.num_rows();
        let step = ((64u64 << 20) / rb).max(1);
        let pb = offgnn_shared::progress::bytes_bar_if(show, n * rb, "checksumming");
        let mut buf = PartitionBuf::new();
        let mut crc = 0u32;
        let mut first = 0;
        while first < n {
            let end = (first + step).min(n);
            reader.read(first, end, &mut buf)?;
            crc = crc32c::crc32c_append(crc, buf.rows());
            pb.inc((end - first) * rb);
            first = end;
        }
        pb.finish_and_clear();
        Ok(crc)
    }

    /// A reader of whole partitions (see [`PartitionReader`]).
    pub fn partition_reader<'a>(&'a self, engine: &'a IoEngine) -> Result<PartitionReader<'a>> {
        let local = match self {
            FeatureSource::Local { path, .. } => Some((engine, engine.open(path)?)),
            FeatureSource::Remote { .. } => None,
        };
        Ok(PartitionReader {
            source: self,
            local,
        })
    }
}
