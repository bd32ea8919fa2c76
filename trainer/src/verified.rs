//! Objects verified once are not read again while unchanged. After a
//! layout object's size and CRC32C match its manifest, the identity of its
//! file (device, inode, size, modification and change times) is kept with
//! the checksum in the user's cache (`verified.json`); a later check that
//! finds the same identity and the manifest's checksum does not read the
//! object. Any write to a file moves its change time, which user space
//! cannot set back, so a modified or replaced object is read again. An
//! object changed less than [`SETTLE`] before its check is not kept: file
//! times are coarse (a clock tick), and a write within the tick of the
//! last one would leave them as they were (git's "racy clean" files).
//! `packer verify` reads every object regardless.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use offgnn_manifests::Object;
use serde::{Deserialize, Serialize};

use crate::user_cache;

/// How long before its check a file must have last changed to be kept.
pub const SETTLE: Duration = Duration::from_secs(2);

/// A verified file's identity and checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    crc32c: u32,
}

impl Stamp {
    /// `meta`'s identity with checksum `crc32c`.
    fn of(meta: &std::fs::Metadata, crc32c: u32) -> Stamp {
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
            ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
            crc32c,
        }
    }
}

/// The files verified before (read once), and those verified now.
pub struct Verified {
    file: Option<PathBuf>,
    known: BTreeMap<String, Stamp>,
    fresh: Mutex<BTreeMap<String, Stamp>>,
}

impl Verified {
    /// The files verified before, from the user's cache.
    pub fn load() -> Verified {
        Verified::at(user_cache::file("verified.json"))
    }

    /// The files verified before, kept in `file` (none: nothing kept).
    pub fn at(file: Option<PathBuf>) -> Verified {
        let known = file.as_deref().map(user_cache::load).unwrap_or_default();
        Verified {
            file,
            known,
            fresh: Mutex::default(),
        }
    }

    /// Whether `path`, whose metadata is `meta`, is as it was when
    /// verified to hold `o`.
    pub fn holds(&self, path: &Path, meta: &std::fs::Metadata, o: &Object) -> bool {
        self.known
            .get(&key(path))
            .is_some_and(|s| *s == Stamp::of(meta, o.crc32c) && s.size == o.size)
    }

    /// Keeps that `path`, whose metadata `meta` was taken before it was
    /// read, held `o` at `now`; not where it changed within [`SETTLE`].
    pub fn record(&self, path: &Path, meta: &std::fs::Metadata, o: &Object, now: SystemTime) {
        let stamp = Stamp::of(meta, o.crc32c);
        let now_ns = now
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as i128;
        let settled = now_ns - stamp.mtime_ns.max(stamp.ctime_ns) >= SETTLE.as_nanos() as i128;
        if settled && stamp.size == o.size {
            self.fresh
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(key(path), stamp);
        }
    }

    /// Writes the files verified now beside those kept (under the file's
    /// lock, over what other processes kept meanwhile), dropping files
    /// that are gone. A cache that cannot be written only costs a read.
    pub fn save(self) {
        let fresh = self
            .fresh
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(file) = self.file.filter(|_| !fresh.is_empty()) else {
            return;
        };
        let _turn = user_cache::take_turn(&file);
        let mut all: BTreeMap<String, Stamp> = user_cache::load(&file);
        all.extend(fresh);
        all.retain(|path, _| Path::new(path).exists());
        if let Err(e) = user_cache::save(&file, &all) {
            tracing::warn!(
                "could not keep the verified objects in {}: {e}",
                file.display()
            );
        }
    }
}

/// A file's key: its absolute path.
fn key(path: &Path) -> String {
    std::path::absolute(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(path: &Path, crc32c: u32) -> Object {
        Object {
            name: path.file_name().unwrap().to_string_lossy().into_owned(),
            size: std::fs::metadata(path).unwrap().len(),
            crc32c,
        }
    }

    #[test]
    fn a_verified_file_is_held_until_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let (data, cache) = (dir.path().join("segment.bin"), dir.path().join("v.json"));
        std::fs::write(&data, vec![1u8; 10_000]).unwrap();
        let o = object(&data, 7);
        let meta = |p: &Path| std::fs::metadata(p).unwrap();
        let later = SystemTime::now() + 2 * SETTLE;
        let v = Verified::at(Some(cache.clone()));
        assert!(!v.holds(&data, &meta(&data), &o));
        v.record(&data, &meta(&data), &o, later);
        v.save();
        let v = Verified::at(Some(cache.clone()));
        assert!(v.holds(&data, &meta(&data), &o));
        // Another checksum in the manifest: not held.
        assert!(!v.holds(
            &data,
            &meta(&data),
            &Object {
                crc32c: 8,
                ..o.clone()
            }
        ));
        // Written again, same size and bytes: its change time moves.
        std::thread::sleep(Duration::from_millis(50));
        std::fs::write(&data, vec![1u8; 10_000]).unwrap();
        assert!(!v.holds(&data, &meta(&data), &o));
        // A file changed just now is not kept (its times are coarse).
        let v = Verified::at(Some(cache.clone()));
        v.record(&data, &meta(&data), &o, SystemTime::now());
        v.save();
        assert!(!Verified::at(Some(cache.clone())).holds(&data, &meta(&data), &o));
        // A file gone is dropped from the cache at the next save.
        let other = dir.path().join("table.bin");
        std::fs::write(&other, b"x").unwrap();
        let v = Verified::at(Some(cache.clone()));
        v.record(&data, &meta(&data), &o, later);
        v.save();
        std::fs::remove_file(&data).unwrap();
        let v = Verified::at(Some(cache.clone()));
        let t = object(&other, 1);
        v.record(&other, &meta(&other), &t, later);
        v.save();
        let kept: BTreeMap<String, Stamp> = user_cache::load(&cache);
        assert_eq!(kept.keys().collect::<Vec<_>>(), vec![&key(&other)]);
    }
}
