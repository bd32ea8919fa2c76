//! The files the engine reads and writes: opened with O_DIRECT where the
//! filesystem allows it, mapped read-only for scattered gathers, and the
//! free space on their filesystem.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::IoEngine;
use crate::{Error, Result};

/// A file opened for the engine: O_DIRECT unless the engine was told not to
/// or the filesystem refused it.
#[derive(Debug)]
pub struct IoFile {
    pub(super) file: File,
    pub(super) path: PathBuf,
    pub(super) direct: bool,
    pub(super) len: u64,
    /// Opened by [`IoEngine::open_write`].
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
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Error::io(path, io::Error::other("a path with a NUL byte")))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path that outlives the call, and `st`
    // points to writable memory of the struct's size; statvfs fills it
    // whole when it returns 0, and only then is it read.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(Error::io(path, io::Error::last_os_error()));
    }
    // SAFETY: statvfs returned 0, so it initialised the struct.
    let st = unsafe { st.assume_init() };
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

impl IoEngine {
    /// Opens `path` for reading: with O_DIRECT when the options ask for it,
    /// buffered (see [`IoFile::is_direct`], logged once per process) when the
    /// filesystem refuses O_DIRECT with EINVAL, as tmpfs did before Linux 6.6.
    pub fn open(&self, path: &Path) -> Result<IoFile> {
        let mut direct = None;
        if self.opts.direct {
            match OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
            {
                Ok(file) => direct = Some(file),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    static WARNED: AtomicBool = AtomicBool::new(false);
                    if !WARNED.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            "{}: the filesystem refuses O_DIRECT (EINVAL); reading through the page cache (not repeated for other files)",
                            path.display()
                        );
                    }
                }
                Err(e) => return Err(Error::io(path, e)),
            }
        }
        let is_direct = direct.is_some();
        let file = match direct {
            Some(file) => file,
            None => File::open(path).map_err(|e| Error::io(path, e))?,
        };
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        Ok(IoFile {
            file,
            path: path.to_path_buf(),
            direct: is_direct,
            len,
            writable: false,
        })
    }

    /// Opens an existing file for [`IoEngine::write`]: with O_DIRECT when the
    /// options ask for it and the filesystem allows it (as [`IoEngine::open`]).
    pub fn open_write(&self, path: &Path) -> Result<IoFile> {
        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.write(true);
            if direct {
                o.custom_flags(libc::O_DIRECT);
            }
            o.open(path)
        };
        let (file, direct) = match self.opts.direct.then(|| open(true)) {
            Some(Ok(file)) => (file, true),
            Some(Err(e)) if e.raw_os_error() != Some(libc::EINVAL) => {
                return Err(Error::io(path, e));
            }
            _ => (open(false).map_err(|e| Error::io(path, e))?, false),
        };
        let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        Ok(IoFile {
            file,
            path: path.to_path_buf(),
            direct,
            len,
            writable: true,
        })
    }
}
