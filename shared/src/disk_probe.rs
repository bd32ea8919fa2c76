//! What this disk can do, measured: sequential read and write bandwidth with
//! O_DIRECT (the page cache out of the way), and a way to push a file's pages
//! out of the page cache so that a later buffered read really reads the disk.
//! The benchmarks set their figures against these (the packer's "read the
//! feature file once, write the output once", the trainer's feature loading).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::time::Instant;

use crate::io_engine::{AlignedBuf, IoEngine};
use crate::{Error, Result};

/// Bytes per request of the sequential probes: large enough for any NVMe's
/// maximum transfer, small enough to keep many in flight.
const REQUEST: usize = 4 << 20;
/// Requests per engine call while reading.
const PER_CALL: usize = 16;

/// A measured bandwidth.
#[derive(Clone, Copy, Debug, serde::Serialize)]
pub struct Bandwidth {
    pub bytes: u64,
    pub seconds: f64,
}

impl Bandwidth {
    pub fn bytes_per_second(&self) -> f64 {
        self.bytes as f64 / self.seconds.max(1e-9)
    }
}

/// Reads up to `limit` bytes of `path` from its start, in 4 MiB requests
/// through `engine` (O_DIRECT unless the filesystem refuses it), 16 at a
/// time. The file's page-aligned prefix is read; its short last page is not.
pub fn sequential_read(engine: &IoEngine, path: &Path, limit: u64) -> Result<Bandwidth> {
    let file = engine.open(path)?;
    let end = file.len().min(limit) / REQUEST as u64 * REQUEST as u64;
    let started = Instant::now();
    let bytes = engine.read_sequential(&file, end, REQUEST, PER_CALL, |_| {})?;
    Ok(Bandwidth {
        bytes,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Writes `bytes` (rounded up to 4 MiB) of pseudo-random data to a new file
/// `path` with O_DIRECT, fsyncs it, and removes it. The time includes the
/// fsync: what a durable sequential write costs.
pub fn sequential_write(path: &Path, bytes: u64) -> Result<Bandwidth> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .or_else(|_| OpenOptions::new().write(true).create_new(true).open(path))
        .map_err(|e| Error::io(path, e))?;
    let mut buf = AlignedBuf::new(REQUEST);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for chunk in buf.as_mut_slice().chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    let requests = bytes.div_ceil(REQUEST as u64).max(1);
    let started = Instant::now();
    let result = (|| -> io::Result<()> {
        for i in 0..requests {
            file.write_all_at(buf.as_slice(), i * REQUEST as u64)?;
        }
        file.sync_all()
    })();
    let seconds = started.elapsed().as_secs_f64();
    drop(file);
    let _ = std::fs::remove_file(path);
    result.map_err(|e| Error::io(path, e))?;
    Ok(Bandwidth {
        bytes: requests * REQUEST as u64,
        seconds,
    })
}

/// Asks the kernel to drop `path`'s clean pages from the page cache
/// (`posix_fadvise(POSIX_FADV_DONTNEED)`), so that the next buffered read of
/// it comes from the disk. Needs no privilege, unlike `drop_caches`.
pub fn evict_from_page_cache(path: &Path) -> Result<()> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    file.sync_all().map_err(|e| Error::io(path, e))?;
    rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::DontNeed)
        .map_err(|e| Error::io(path, e.into()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io_engine::IoOptions;

    #[test]
    fn probes_measure_real_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("probe.bin");
        std::fs::write(&path, vec![7u8; 9 << 20]).unwrap();
        evict_from_page_cache(&path).unwrap();
        let engine = IoEngine::new(IoOptions::default());
        let read = sequential_read(&engine, &path, u64::MAX).unwrap();
        // Two whole 4 MiB requests; the last MiB is short of a request.
        assert_eq!(read.bytes, 8 << 20);
        assert!(read.bytes_per_second() > 0.0);
        let written = sequential_write(&dir.path().join("w.bin"), 5 << 20).unwrap();
        assert_eq!(written.bytes, 8 << 20);
        assert!(
            !dir.path().join("w.bin").exists(),
            "the probe file is removed"
        );
        let err = evict_from_page_cache(&dir.path().join("absent")).unwrap_err();
        assert!(err.to_string().contains("absent"), "{err}");
    }
}
