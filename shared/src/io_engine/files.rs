//! The files the engine reads and writes (opened by [`IoEngine::open`] and
//! [`IoEngine::open_write`]), files mapped read-only for scattered gathers,
//! and the free space on a filesystem.
//!
//! [`IoEngine::open`]: super::IoEngine::open
//! [`IoEngine::open_write`]: super::IoEngine::open_write

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// A file opened for the engine: O_DIRECT unless the engine was told not to
/// or the filesystem refused it.
#[derive(Debug)]
pub struct IoFile {
    pub(super) file: File,
    pub(super) path: PathBuf,
    pub(super) direct: bool,
    pub(super) len: u64,
    /// Opened by [`IoEngine::open_write`](super::IoEngine::open_write).
    pub(super) writable: bool,
}

impl IoFile {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether reads bypass the page cache (and so must be page-aligned).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// The file's size when it was opened.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Bytes an unprivileged writer may still put on the filesystem that holds
/// `path` (`statvfs`: available blocks times the fragment size).
pub fn free_bytes(path: &Path) -> Result<u64> {
    let st = rustix::fs::statvfs(path).map_err(|e| Error::io(path, e.into()))?;
    Ok(st.f_bavail * st.f_frsize)
}

/// A local file mapped read-only: its bytes are read where they lie, in the
/// page cache, and only the pages touched are read from the disk. For
/// gathers that touch scattered rows of a file many times over (`packer
/// verify`), where copying whole spans into a buffer would move the file
/// through memory once per gather.
pub struct MappedFile {
    /// `None` for an empty file (nothing to map).
    map: Option<memmap2::Mmap>,
}

impl MappedFile {
    pub fn open(path: &Path) -> Result<MappedFile> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        if len == 0 {
            return Ok(MappedFile { map: None });
        }
        // SAFETY: a private read-only mapping; the bytes are only read as
        // `&[u8]`. offgnn never changes a feature file or a committed
        // layout object in place (a new layout is written beside the old
        // one and renamed); another process that truncated the file while
        // it is mapped would end this one with SIGBUS, as with any mapping.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        Ok(MappedFile { map: Some(map) })
    }

    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_bytes_reads_the_filesystem_or_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        assert!(free_bytes(dir.path()).unwrap() > 0);
        let absent = dir.path().join("absent");
        let err = free_bytes(&absent).unwrap_err();
        assert!(err.to_string().contains("absent"), "{err}");
    }
}
