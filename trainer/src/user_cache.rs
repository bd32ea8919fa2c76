//! Small JSON files in the user's cache directory (`~/.cache/offgnn/`,
//! `$XDG_CACHE_HOME/offgnn/` if set) that a machine's processes share: the
//! disks' measured curves, the objects already verified. Each is read and
//! written whole while its lock (a file beside it) is held, so the ranks
//! of one launch take turns; a file that cannot be read counts as empty.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// `name` in the user's cache directory; none without a home.
pub fn file(name: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(dir.join("offgnn").join(name))
}

/// An exclusive lock on `file`'s lock file, held until dropped; none where
/// the lock file cannot be opened (the caller then goes on alone).
pub fn take_turn(file: &Path) -> Option<std::fs::File> {
    use std::os::fd::AsRawFd;
    let lock = file.with_extension("lock");
    if let Some(dir) = lock.parent() {
        std::fs::create_dir_all(dir).ok()?;
    }
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock)
        .ok()?;
    // SAFETY: flock on a descriptor this function owns; it blocks until
    // the lock is free, and the lock goes with the descriptor.
    let locked = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } == 0;
    locked.then_some(lock)
}

/// What `file` holds; the default where it is missing or unreadable.
pub fn load<T: DeserializeOwned + Default>(file: &Path) -> T {
    std::fs::read(file)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Writes `value` to `file` whole (a temporary file renamed over it).
pub fn save<T: Serialize>(file: &Path, value: &T) -> std::io::Result<()> {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut tmp = file.as_os_str().to_owned();
    tmp.push(format!(".{}", std::process::id()));
    let bytes = serde_json::to_vec_pretty(value).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, file)
}
