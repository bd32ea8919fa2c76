//! A packed layout on local disk, ready to train from: the manifest, every
//! object checked against its size and CRC32C before use (read once: an
//! object unchanged since it was verified is not read again,
//! [`crate::verified`]), the segment
//! objects opened for the I/O engine, and each table object's index.
//! Remote layouts are first staged here by [`crate::staging`].

use std::collections::{BTreeSet, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use offgnn_manifests::{Manifest, Object};
use offgnn_shared::address_table::{self, BatchTable, FOOTER};
use offgnn_shared::io_engine::{AlignedBuf, IoEngine, IoFile, PAGE};
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::verified::Verified;

pub struct Layout {
    pub dir: PathBuf,
    pub manifest: Manifest,
    /// Each segment's object and table, opened; `None` for a segment this
    /// process does not read (a data-parallel rank's machine stages only
    /// its ranks' segments).
    segments: Vec<Option<IoFile>>,
    tables: Vec<Option<TableFile>>,
}

/// A table object (a segment's address tables, or a typed layout's
/// topology), opened, with the (offset, length) of each batch record.
pub(crate) struct TableFile {
    file: File,
    pub(crate) path: PathBuf,
    pub(crate) records: Vec<(u64, u64)>,
}

impl TableFile {
    /// Opens the table object at `path` and reads its index.
    pub(crate) fn open(path: PathBuf) -> Result<TableFile> {
        let f = File::open(&path).map_err(|e| Error::io(path.display(), e))?;
        let size = f
            .metadata()
            .map_err(|e| Error::io(path.display(), e))?
            .len();
        let origin = path.display().to_string();
        let mut footer = vec![0u8; FOOTER as usize];
        f.read_exact_at(&mut footer, size.saturating_sub(FOOTER))
            .map_err(|e| Error::io(&origin, e))?;
        let (index_offset, _) = address_table::decode_footer(&origin, &footer, size)?;
        let mut index = vec![0u8; (size - FOOTER - index_offset) as usize];
        f.read_exact_at(&mut index, index_offset)
            .map_err(|e| Error::io(&origin, e))?;
        let records = address_table::decode_index(&origin, &index, index_offset)?;
        Ok(TableFile {
            file: f,
            path,
            records,
        })
    }

    /// The bytes of record `record`; `None` where the index has none.
    pub(crate) fn record_bytes(&self, record: u32) -> Option<Result<Vec<u8>>> {
        let &(off, len) = self.records.get(record as usize)?;
        let mut buf = vec![0u8; len as usize];
        Some(
            self.file
                .read_exact_at(&mut buf, off)
                .map(|()| buf)
                .map_err(|e| Error::io(self.path.display(), e)),
        )
    }
}

/// Bytes per read request of [`file_crc`], and requests per engine call.
const CRC_REQUEST: usize = 4 << 20;
const CRC_PER_CALL: usize = 8;

/// A buffer for [`file_crc`]'s reads, two engine calls' worth (the next
/// call's reads queued while this one's bytes are summed), to be used for
/// file after file: a fresh one a file would have the kernel map and zero
/// its pages again for every object of a layout.
pub fn crc_buffer() -> AlignedBuf {
    AlignedBuf::new(2 * CRC_REQUEST * (CRC_PER_CALL / 2))
}

/// CRC32C of a local file, read through `engine` into `buf`
/// ([`crc_buffer`]) in large requests, several in flight (O_DIRECT where
/// the filesystem allows: a layout of gigabytes is checked at the disk's
/// speed and leaves the page cache alone, where buffered reads one at a
/// time are several times slower). An O_DIRECT read cannot take a short
/// last page: those bytes are read buffered.
pub fn file_crc(engine: &IoEngine, path: &Path, buf: &mut AlignedBuf) -> Result<(u64, u32)> {
    let file = engine.open(path)?;
    let size = file.len();
    let direct_end = if file.is_direct() {
        size / PAGE as u64 * PAGE as u64
    } else {
        size
    };
    let mut crc = 0u32;
    let per_call = CRC_PER_CALL / 2;
    let at = engine.read_span(
        &file,
        (0, direct_end),
        CRC_REQUEST,
        per_call,
        buf,
        |bytes| {
            crc = crc32c::crc32c_append(crc, bytes);
            true
        },
    )?;
    if at < size {
        let mut tail = vec![0u8; (size - at) as usize];
        let f = File::open(path).map_err(|e| Error::io(path.display(), e))?;
        f.read_exact_at(&mut tail, at)
            .map_err(|e| Error::io(path.display(), e))?;
        crc = crc32c::crc32c_append(crc, &tail);
    }
    Ok((size, crc))
}

/// Checks one object: present, its size, its CRC32C (read into `buf`,
/// [`crc_buffer`]), unless `verified` holds it unchanged since it last
/// matched. Returns whether it was read.
pub fn check_object(
    engine: &IoEngine,
    (dir, o): (&Path, &Object),
    buf: &mut AlignedBuf,
    verified: &Verified,
) -> Result<bool> {
    let path = dir.join(&o.name);
    let Ok(meta) = std::fs::metadata(&path) else {
        return Err(Error::Layout(format!(
            "{}: missing object {}",
            dir.display(),
            o.name
        )));
    };
    if verified.holds(&path, &meta, o) {
        return Ok(false);
    }
    let (size, crc) = file_crc(engine, &path, buf)?;
    if size != o.size {
        return Err(Error::Layout(format!(
            "{}: {size} bytes, the manifest says {} (cut short or replaced): copy the layout again from where it was packed, or pack it again",
            path.display(),
            o.size
        )));
    }
    if crc != o.crc32c {
        return Err(Error::Layout(format!(
            "{}: checksum mismatch (corrupt or replaced): copy the layout again from where it was packed, or pack it again",
            path.display()
        )));
    }
    verified.record(&path, &meta, o, std::time::SystemTime::now());
    Ok(true)
}

/// The names of the objects of the segments not in `only`: what a machine
/// whose ranks read only `only` neither stages nor checks.
pub fn unread_objects(m: &Manifest, only: Option<&BTreeSet<u32>>) -> HashSet<String> {
    let Some(only) = only else {
        return HashSet::new();
    };
    m.segments
        .iter()
        .enumerate()
        .filter(|(i, _)| !only.contains(&(*i as u32)))
        .flat_map(|(_, s)| [s.object.clone(), s.table.clone()])
        .collect()
}

/// The objects a machine whose ranks read segments `only` (all for `None`)
/// stages and checks: all but the other segments'.
pub fn objects_read<'a>(m: &'a Manifest, only: Option<&BTreeSet<u32>>) -> Vec<&'a Object> {
    let skip = unread_objects(m, only);
    m.objects
        .iter()
        .filter(|o| !skip.contains(&o.name))
        .collect()
}

impl Layout {
    /// Opens a local layout, checking every object first.
    pub fn open(dir: &Path, manifest: Manifest, engine: &IoEngine, show: bool) -> Result<Layout> {
        Layout::open_part(dir, manifest, engine, show, None)
    }

    /// Opens the part of a local layout that segments `only` need (all of
    /// it for `None`): every object but the other segments' is checked.
    pub fn open_part(
        dir: &Path,
        manifest: Manifest,
        engine: &IoEngine,
        show: bool,
        only: Option<&BTreeSet<u32>>,
    ) -> Result<Layout> {
        let objects = objects_read(&manifest, only);
        let total: u64 = objects.iter().map(|o| o.size).sum();
        let pb = offgnn_shared::progress::bytes_bar_if(show, total, "checking");
        let verified = Verified::load();
        let read: u64 = objects
            .par_iter()
            .map_init(crc_buffer, |buf, o| {
                let read = check_object(engine, (dir, o), buf, &verified)?;
                pb.inc(o.size);
                Ok::<_, Error>(if read { o.size } else { 0 })
            })
            .sum::<Result<u64>>()?;
        pb.finish_and_clear();
        verified.save();
        tracing::info!(
            "{}: {} objects checked, {} read, {} unchanged since verified",
            dir.display(),
            objects.len(),
            offgnn_shared::report::human_bytes(read),
            offgnn_shared::report::human_bytes(total - read)
        );
        let mut segments = Vec::with_capacity(manifest.segments.len());
        let mut tables = Vec::with_capacity(manifest.segments.len());
        for (i, s) in manifest.segments.iter().enumerate() {
            if only.is_some_and(|only| !only.contains(&(i as u32))) {
                segments.push(None);
                tables.push(None);
                continue;
            }
            segments.push(Some(engine.open(&dir.join(&s.object))?));
            let table = TableFile::open(dir.join(&s.table))?;
            if table.records.len() != s.batches as usize {
                return Err(Error::Layout(format!(
                    "{}: {} records, the manifest says {}",
                    table.path.display(),
                    table.records.len(),
                    s.batches
                )));
            }
            tables.push(Some(table));
        }
        Ok(Layout {
            dir: dir.to_path_buf(),
            manifest,
            segments,
            tables,
        })
    }

    fn not_here(&self, segment: u32) -> Error {
        Error::Layout(format!(
            "{}: segment {segment} is not staged here: this machine's ranks do not read it",
            self.dir.display()
        ))
    }

    /// A segment's object, opened for the I/O engine.
    pub fn segment(&self, segment: u32) -> Result<&IoFile> {
        self.segments
            .get(segment as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| self.not_here(segment))
    }

    /// Reads one batch's address table and topology.
    pub fn record(&self, segment: u32, record: u32) -> Result<BatchTable> {
        let table = self
            .tables
            .get(segment as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| self.not_here(segment))?;
        // The manifest's schedule names the record; its table's index may
        // not have it.
        let buf = table.record_bytes(record).ok_or_else(|| {
            Error::Layout(format!(
                "{}: the schedule names record {record} of segment {segment}, but its table holds {}",
                table.path.display(),
                table.records.len()
            ))
        })??;
        let t = address_table::decode(&table.path.display().to_string(), &buf)?;
        // The model's output has `num_classes` columns; a label past them
        // would fail in libtorch without naming a file.
        let classes = self.manifest.dataset.num_classes;
        if let Some(l) = t.labels.iter().find(|&&l| l >= classes) {
            return Err(Error::Layout(format!(
                "{}: record {record} labels a seed {l}, past the manifest's {classes} classes: the manifest or the table was edited or damaged; copy the layout again from where it was packed, or pack it again",
                table.path.display()
            )));
        }
        Ok(t)
    }

    /// Where an object of the layout is on this machine.
    pub fn object_path(&self, object: &str) -> PathBuf {
        self.dir.join(object)
    }

    /// Bytes of a cache object's rows (row-major, `rows x store_row_bytes`).
    pub fn read_cache(&self, object: &str, rows: u64) -> Result<Vec<u8>> {
        let path = self.dir.join(object);
        let f = File::open(&path).map_err(|e| Error::io(path.display(), e))?;
        let mut buf = vec![0u8; (rows * self.manifest.dataset.store_row_bytes()) as usize];
        f.read_exact_at(&mut buf, 0)
            .map_err(|e| Error::io(path.display(), e))?;
        Ok(buf)
    }
}
