//! What identifies a dataset's topology and task, and a cheap fingerprint of
//! any file by its size and sampled contents.

use std::fs;
use std::path::Path;

use super::metadata::METADATA_FILE;
use super::open::Dataset;
use super::tasks::{SeedSet, Split};
use super::typed::TypedDataset;
use crate::error::{Error, Result};

impl Dataset {
    /// A SHA-256 fingerprint of everything but the features: metadata.yaml,
    /// the edge file (by size and sampled contents), and every seed and label.
    /// Two datasets with the same fingerprint have the same topology and task.
    pub fn fingerprint(&self) -> Result<String> {
        fingerprint(&self.root, |s| self.split(s), &[self.edges.path()])
    }
}

impl TypedDataset {
    /// As [`Dataset::fingerprint`]: metadata.yaml, the seeds and labels
    /// (homogenized ids), and every relation's edge file.
    pub fn fingerprint(&self) -> Result<String> {
        let edges: Vec<&Path> = self.relations.iter().map(|r| r.edges.path()).collect();
        fingerprint(&self.root, |s| self.split(s), &edges)
    }
}

fn fingerprint<'a>(
    root: &Path,
    split: impl Fn(Split) -> &'a SeedSet,
    edge_files: &[&Path],
) -> Result<String> {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    let meta = root.join(METADATA_FILE);
    h.update(fs::read(&meta).map_err(|e| Error::io(&meta, e))?);
    for s in Split::ALL {
        let set = split(s);
        h.update(s.name());
        h.update((set.seeds.len() as u64).to_le_bytes());
        for (&seed, &l) in set.seeds.iter().zip(&set.labels) {
            h.update(seed.to_le_bytes());
            h.update(l.to_le_bytes());
        }
    }
    for path in edge_files {
        h.update(file_fingerprint(path)?);
    }
    Ok(crate::store::hex(&h.finalize()))
}

/// A SHA-256 over a file's size and 64 KiB read at 17 evenly spaced offsets
/// (start and end included): cheap for files of any size, and it changes
/// when a file is swapped for another, truncated or regenerated.
pub fn file_fingerprint(path: &Path) -> Result<String> {
    use sha2::Digest;
    use std::os::unix::fs::FileExt;
    const SAMPLE: u64 = 64 << 10;
    const POINTS: u64 = 16;
    let file = fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    let mut h = sha2::Sha256::new();
    h.update(len.to_le_bytes());
    let mut buf = vec![0u8; SAMPLE as usize];
    for i in 0..=POINTS {
        let at = (len.saturating_sub(SAMPLE)) * i / POINTS;
        let n = SAMPLE.min(len - at) as usize;
        file.read_exact_at(&mut buf[..n], at)
            .map_err(|e| Error::io(path, e))?;
        h.update(&buf[..n]);
    }
    Ok(crate::store::hex(&h.finalize()))
}
