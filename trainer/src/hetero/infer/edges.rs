//! A typed graph's edges for inference: each relation's streamed once to
//! count in-degrees (which cut each type's destinations into groups), once
//! more to bucket them on disk by destination group, and a group's bucket
//! loaded as that relation's edges into the group, sorted by destination.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use offgnn_shared::dataset::TypedDataset;

use crate::error::{Error, Result};

/// Groups whose bucket files are open at once while a relation's edges are
/// bucketed; more groups take more passes over the relation's edge file.
const OPEN_GROUPS: usize = 256;

/// Edges streamed at once from an edge file.
const STREAM_CHUNK: usize = 1 << 20;

/// Each type's in-degree over every relation that reaches it (saturating),
/// by type-local id; what a group of destinations costs follows from it.
pub(super) fn in_degrees(ds: &TypedDataset, progress: &dyn Fn(u64)) -> Result<Vec<Vec<u32>>> {
    let mut degrees: Vec<Vec<u32>> = ds
        .node_types
        .iter()
        .map(|t| vec![0u32; t.num as usize])
        .collect();
    for r in &ds.relations {
        let deg = &mut degrees[r.dst];
        r.edges.for_each_chunk::<Error>(STREAM_CHUNK, |_, dst| {
            for &d in dst {
                deg[d as usize] = deg[d as usize].saturating_add(1);
            }
            progress(dst.len() as u64);
            Ok(())
        })?;
    }
    Ok(degrees)
}

/// Cuts `0..costs.len()` into contiguous groups whose costs sum to at most
/// `budget`; a node that alone costs more is refused, naming `what`.
pub(super) fn cut_groups(
    costs: impl Iterator<Item = u64>,
    budget: u64,
    what: &dyn Fn(u64, u64) -> String,
) -> Result<(Vec<(u64, u64)>, u64)> {
    let mut groups = Vec::new();
    let (mut start, mut sum, mut largest) = (0u64, 0u64, 0u64);
    let mut n = 0u64;
    for (v, c) in costs.enumerate() {
        let v = v as u64;
        if c > budget {
            return Err(Error::InvalidArgument(what(v, c)));
        }
        if sum + c > budget && v > start {
            groups.push((start, v));
            largest = largest.max(sum);
            (start, sum) = (v, 0);
        }
        sum += c;
        n = v + 1;
    }
    if n > start {
        groups.push((start, n));
        largest = largest.max(sum);
    }
    Ok((groups, largest))
}

pub(super) fn bucket_file(work: &Path, r: usize, g: usize) -> PathBuf {
    work.join(format!("edges-r{r:03}-g{g:06}.bin"))
}

/// Writes relation `r`'s edges into one file per destination group of
/// `groups` (pairs of little-endian u32, type-local source then
/// destination); returns the edges written.
pub(super) fn bucket_relation(
    ds: &TypedDataset,
    r: usize,
    groups: &[(u64, u64)],
    work: &Path,
    progress: &dyn Fn(u64),
) -> Result<u64> {
    let rel = &ds.relations[r];
    let group_of = |d: u64| groups.partition_point(|&(_, end)| end <= d);
    let mut total = 0u64;
    for first in (0..groups.len()).step_by(OPEN_GROUPS) {
        let last = (first + OPEN_GROUPS).min(groups.len());
        let mut writers = (first..last)
            .map(|g| {
                let path = bucket_file(work, r, g);
                File::create(&path)
                    .map(|f| BufWriter::with_capacity(1 << 16, f))
                    .map_err(|e| Error::io(path.display(), e))
            })
            .collect::<Result<Vec<_>>>()?;
        rel.edges
            .for_each_chunk::<Error>(STREAM_CHUNK, |src, dst| {
                for (&s, &d) in src.iter().zip(dst) {
                    let g = group_of(d);
                    if (first..last).contains(&g) {
                        let mut pair = [0u8; 8];
                        pair[..4].copy_from_slice(&(s as u32).to_le_bytes());
                        pair[4..].copy_from_slice(&(d as u32).to_le_bytes());
                        writers[g - first]
                            .write_all(&pair)
                            .map_err(|e| Error::io(bucket_file(work, r, g).display(), e))?;
                        total += 1;
                    }
                }
                progress(src.len() as u64);
                Ok(())
            })?;
        for (i, w) in writers.into_iter().enumerate() {
            let path = bucket_file(work, r, first + i);
            w.into_inner()
                .map_err(|e| Error::io(path.display(), e.into_error()))?
                .sync_all()
                .map_err(|e| Error::io(path.display(), e))?;
        }
    }
    Ok(total)
}

/// Relation `r`'s edges into group `g` (destinations `lo..hi`), from its
/// bucket file, as (source, destination within the group) sorted by source
/// then destination; with `dedup`, each pair once, as the sampler built the
/// graph.
pub(super) fn load_group(
    work: &Path,
    (r, g): (usize, usize),
    (lo, hi): (u64, u64),
    dedup: bool,
) -> Result<Vec<(u32, u32)>> {
    let path = bucket_file(work, r, g);
    let mut bytes = Vec::new();
    File::open(&path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|e| Error::io(path.display(), e))?;
    let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let mut pairs = Vec::with_capacity(bytes.len() / 8);
    for p in bytes.chunks_exact(8) {
        let (s, d) = (word(&p[..4]), u64::from(word(&p[4..])));
        if !(lo..hi).contains(&d) {
            return Err(Error::InvalidArgument(format!(
                "{}: destination {d} outside its group {lo}..{hi}; the work directory is not this run's",
                path.display()
            )));
        }
        pairs.push((s, (d - lo) as u32));
    }
    drop(bytes);
    pairs.sort_unstable();
    if dedup {
        pairs.dedup();
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_hold_their_budget_and_cover_every_node() {
        let costs = [3u64, 3, 3, 1, 9, 2, 2];
        let (groups, largest) = cut_groups(costs.into_iter(), 9, &|_, _| unreachable!()).unwrap();
        assert_eq!(groups, vec![(0, 3), (3, 4), (4, 5), (5, 7)]);
        assert_eq!(largest, 9);
        let err = cut_groups([1u64, 10].into_iter(), 9, &|v, c| {
            format!("node {v} costs {c}")
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains("node 1 costs 10"), "{err}");
    }

    #[test]
    fn a_group_loads_sorted_by_source_each_pair_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = Vec::new();
        for (s, d) in [(7u32, 11u32), (2, 10), (7, 10), (2, 10), (5, 11)] {
            bytes.extend_from_slice(&s.to_le_bytes());
            bytes.extend_from_slice(&d.to_le_bytes());
        }
        std::fs::write(bucket_file(dir.path(), 1, 2), &bytes).unwrap();
        let e = load_group(dir.path(), (1, 2), (10, 13), true).unwrap();
        assert_eq!(e, vec![(2, 0), (5, 1), (7, 0), (7, 1)]);
        let kept = load_group(dir.path(), (1, 2), (10, 13), false).unwrap();
        assert_eq!(kept.len(), 5);
        let err = load_group(dir.path(), (1, 2), (10, 11), true).unwrap_err();
        assert!(err.to_string().contains("outside its group"), "{err}");
    }
}
