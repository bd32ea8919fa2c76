//! Objects written in pieces from a plain thread and seen whole or not at
//! all: [`StagedWriter`], which writes a local store's objects past the page
//! cache through a staging file, and any other store's as a multipart upload.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use super::Store;
use super::object_writer::{MULTIPART_CONCURRENCY, MULTIPART_THRESHOLD, ObjectWriter};
use crate::error::Result;
use crate::io_engine::{AlignedBuf, PAGE};

/// Objects from this size on go to a local store past the page cache
/// (see [`Store::put_local`]).
pub const DIRECT_PUT_MIN: usize = 8 << 20;
/// Bytes per O_DIRECT write of such an object, through one aligned buffer.
pub const DIRECT_PUT_PIECE: usize = 4 << 20;

/// A new file written in order, piece by piece, past the page cache:
/// whole pages from an aligned buffer go out as they are; other bytes
/// gather in an aligned buffer of up to [`DIRECT_PUT_PIECE`] bytes (grown
/// as needed), which goes out with O_DIRECT each time it fills. The last
/// bytes are padded to a page and the file cut to its length. Through the
/// page cache where the filesystem refuses O_DIRECT (EINVAL).
struct DirectFile {
    file: std::fs::File,
    buf: AlignedBuf,
    filled: usize,
    offset: u64,
}

impl DirectFile {
    fn create(path: &std::path::Path) -> std::io::Result<DirectFile> {
        use std::os::unix::fs::OpenOptionsExt;
        let open = |direct: bool| {
            let mut o = std::fs::OpenOptions::new();
            o.write(true).create(true).truncate(true);
            if direct {
                o.custom_flags(libc::O_DIRECT);
            }
            o.open(path)
        };
        let file = match open(true) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => open(false)?,
            file => file?,
        };
        Ok(DirectFile {
            file,
            buf: AlignedBuf::new(0),
            filled: 0,
            offset: 0,
        })
    }

    fn append(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        // Whole pages from an aligned buffer, with none waiting before
        // them: written as they are, with no copy.
        let pages = bytes.len() / PAGE * PAGE;
        if self.filled == 0 && pages > 0 && bytes.as_ptr().align_offset(PAGE) == 0 {
            self.file.write_all_at(&bytes[..pages], self.offset)?;
            self.offset += pages as u64;
            bytes = &bytes[pages..];
        }
        while !bytes.is_empty() {
            let n = bytes.len().min(DIRECT_PUT_PIECE - self.filled);
            if self.filled + n > self.buf.len() {
                let len = (self.filled + n).max(2 * self.buf.len());
                self.buf
                    .resize(len.next_multiple_of(PAGE).min(DIRECT_PUT_PIECE));
            }
            self.buf.as_mut_slice()[self.filled..][..n].copy_from_slice(&bytes[..n]);
            self.filled += n;
            bytes = &bytes[n..];
            if self.filled == DIRECT_PUT_PIECE {
                self.file.write_all_at(self.buf.as_slice(), self.offset)?;
                self.offset += DIRECT_PUT_PIECE as u64;
                self.filled = 0;
            }
        }
        Ok(())
    }

    /// Writes what is left and returns the file's length.
    fn finish(mut self) -> std::io::Result<u64> {
        use std::os::unix::fs::FileExt;
        let len = self.offset + self.filled as u64;
        if self.filled > 0 {
            let padded = self.filled.next_multiple_of(PAGE);
            let out = &mut self.buf.as_mut_slice()[..padded];
            out[self.filled..].fill(0);
            self.file.write_all_at(out, self.offset)?;
        }
        self.file.set_len(len)?;
        Ok(len)
    }
}

/// One object written in pieces from a plain thread (see
/// [`Store::staged_writer`]). Nothing is visible under its name until
/// [`StagedWriter::finish`]; dropped unfinished, it leaves nothing.
pub struct StagedWriter {
    /// `None` once finished.
    to: Option<Staging>,
    name: String,
    store: Store,
}

enum Staging {
    /// A staging file beside the object's file, renamed over it when done.
    Local {
        file: DirectFile,
        staging: std::path::PathBuf,
        target: std::path::PathBuf,
    },
    Remote(Box<ObjectWriter>),
}

impl StagedWriter {
    /// Appends `bytes` to the object.
    pub fn append(&mut self, bytes: &[u8]) -> Result<()> {
        self.append_io(bytes)
            .map_err(|e| self.store.err(&self.name, e))
    }

    /// [`StagedWriter::append`], its error the I/O error as it came (an
    /// [`ObjectWriter`]'s `Write` passes it on).
    pub(super) fn append_io(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        match self.to.as_mut().expect("appended before finish") {
            Staging::Local { file, .. } => file.append(bytes),
            Staging::Remote(w) => w.write_all(bytes),
        }
    }

    /// Makes the object visible under its name, whole; returns its size.
    pub fn finish(mut self) -> Result<u64> {
        match self.to.take().expect("finished once") {
            Staging::Local {
                file,
                staging,
                target,
            } => {
                let done = file
                    .finish()
                    .and_then(|len| std::fs::rename(&staging, &target).map(|()| len));
                if done.is_err() {
                    let _ = std::fs::remove_file(&staging);
                }
                done.map_err(|e| self.store.err(&self.name, e))
            }
            Staging::Remote(w) => w.finish().map(|w| w.size),
        }
    }
}

impl Drop for StagedWriter {
    /// An unfinished local object's staging file is removed; a remote
    /// upload is abandoned by its writer's own drop.
    fn drop(&mut self) {
        if let Some(Staging::Local { staging, .. }) = &self.to {
            let _ = std::fs::remove_file(staging);
        }
    }
}

impl Store {
    /// The file a put of `len` bytes writes past the page cache: a large
    /// object's, in a local store.
    pub(super) fn direct_file(&self, rel: &str, len: usize) -> Option<std::path::PathBuf> {
        self.local_file(rel).filter(|_| len >= DIRECT_PUT_MIN)
    }

    /// [`Store::put`] of a large object to a local store, through a
    /// [`StagedWriter`]: past the page cache, since each fresh page of the
    /// cache costs a first touch, and a run's outputs of GBs would be held to
    /// the rate at which the cache takes them rather than the disk's.
    pub(super) fn put_local(&self, rel: &str, file: &std::path::Path, bytes: &[u8]) -> Result<()> {
        let mut w = self.local_writer(rel, file)?;
        w.append(bytes)?;
        w.finish().map(|_| ())
    }

    /// A writer of one object in pieces, from a plain thread, that readers
    /// see whole or not at all. To a local store: a staging file beside the
    /// object's file (`NAME#DIGITS`, as object_store stages its own local
    /// puts, and which its listings skip), written with O_DIRECT through an
    /// aligned buffer of [`DIRECT_PUT_PIECE`] bytes and renamed over the
    /// name when finished. To any other: an [`ObjectWriter`]'s multipart
    /// upload. [`Store::staged_writer_bytes`] is what one holds.
    pub fn staged_writer(&self, rel: &str) -> Result<StagedWriter> {
        match self.local_file(rel) {
            Some(file) => self.local_writer(rel, &file),
            None => Ok(StagedWriter {
                to: Some(Staging::Remote(Box::new(self.writer(rel)?))),
                name: rel.to_string(),
                store: self.clone(),
            }),
        }
    }

    /// The memory a [`StagedWriter`] of this store holds: its aligned
    /// buffer, or the multipart parts buffered and in flight.
    pub fn staged_writer_bytes(&self) -> u64 {
        if self.local {
            DIRECT_PUT_PIECE as u64
        } else {
            (MULTIPART_THRESHOLD * (1 + MULTIPART_CONCURRENCY)) as u64
        }
    }

    pub(super) fn local_writer(&self, rel: &str, file: &std::path::Path) -> Result<StagedWriter> {
        static STAGED: AtomicU64 = AtomicU64::new(0);
        let dir = file
            .parent()
            .expect("a local object's file has a directory");
        std::fs::create_dir_all(dir).map_err(|e| self.err(rel, e))?;
        let staging = std::path::PathBuf::from(format!(
            "{}#{}{:06}",
            file.display(),
            std::process::id(),
            STAGED.fetch_add(1, Ordering::Relaxed)
        ));
        let direct = DirectFile::create(&staging).map_err(|e| self.err(rel, e))?;
        Ok(StagedWriter {
            to: Some(Staging::Local {
                file: direct,
                staging,
                target: file.to_path_buf(),
            }),
            name: rel.to_string(),
            store: self.clone(),
        })
    }
}
