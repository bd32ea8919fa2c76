//! Staging a remote layout onto local disk: every object copied with
//! parallel ranged GETs, its CRC32C checked, and skipped on a rerun when the
//! local copy is already whole. The manifest is copied last. A typed
//! layout is staged whole the same way; a remote dataset (for `trainer
//! infer`), object by object.

use std::collections::BTreeSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use offgnn_manifests::{MANIFEST, Manifest, Object, TypedManifest};
use offgnn_shared::io_engine::IoEngine;
use offgnn_shared::store::Store;
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::layout::{check_object, objects_read};

const RANGE: u64 = 8 << 20;

/// Resolves a manifest location to a local directory and its manifest,
/// staging remote layouts into `local_dir`.
pub fn resolve(
    location: &str,
    local_dir: Option<&Path>,
    engine: &IoEngine,
    show: bool,
) -> Result<(PathBuf, Manifest)> {
    resolve_part(location, local_dir, engine, show, |_| None)
}

/// [`resolve`], staging only what the segments `only(manifest)` names need
/// (every segment for `None`): the objects of other segments are left in
/// the store.
pub fn resolve_part(
    location: &str,
    local_dir: Option<&Path>,
    engine: &IoEngine,
    show: bool,
    only: impl Fn(&Manifest) -> Option<BTreeSet<u32>>,
) -> Result<(PathBuf, Manifest)> {
    let (dir, name) = split_location(location);
    let remote = dir.contains("://") && !dir.starts_with("file://");
    if !remote {
        let dir = PathBuf::from(dir.trim_start_matches("file://"));
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        if let Some(local) = local_dir {
            // A local layout is read in place; say so rather than ignore the flag.
            tracing::warn!(
                "--local-dir {} is not used: the layout in {} is local and is read in place",
                local.display(),
                dir.display()
            );
        }
        let path = dir.join(&name);
        let bytes = std::fs::read(&path).map_err(|e| Error::io(path.display(), e))?;
        return Ok((dir, Manifest::parse(&path.display().to_string(), &bytes)?));
    }
    let local = local_dir.ok_or_else(|| {
        Error::InvalidArgument("a remote --manifest needs --local-dir to stage the layout".into())
    })?;
    let store = Store::open(&dir)?;
    let origin = format!("{}/{name}", store.url());
    let bytes = store.get(&name)?;
    let manifest = Manifest::parse(&origin, &bytes)?;
    let objects = objects_read(&manifest, only(&manifest).as_ref());
    let total: u64 = objects.iter().map(|o| o.size).sum();
    if objects.len() < manifest.objects.len() {
        tracing::info!(
            "staging {} of the layout's {} objects: {} of {}; the rest belong to segments this machine's ranks do not read",
            objects.len(),
            manifest.objects.len(),
            offgnn_shared::report::human_bytes(total),
            offgnn_shared::report::human_bytes(manifest.objects.iter().map(|o| o.size).sum())
        );
    }
    stage_objects(&store, &bytes, &objects, (local, engine), show)?;
    Ok((local.to_path_buf(), manifest))
}

/// Stages a remote typed layout (every object, then its manifest) into
/// `local_dir` as [`resolve`] stages a homogeneous one; returns the local
/// directory and the manifest's bytes. `None` where `location` is local,
/// no `local_dir` is given, or the layout is not typed (the homogeneous
/// path then says what it says).
pub fn stage_typed(
    location: &str,
    local_dir: Option<&Path>,
    engine: &IoEngine,
    show: bool,
) -> Result<Option<(PathBuf, Vec<u8>)>> {
    let (dir, name) = split_location(location);
    let remote = dir.contains("://") && !dir.starts_with("file://");
    let Some(local) = local_dir.filter(|_| remote) else {
        return Ok(None);
    };
    let store = Store::open_read(&dir)?;
    let bytes = store.get(&name)?;
    if !offgnn_manifests::is_typed(&bytes) {
        return Ok(None);
    }
    let manifest = TypedManifest::parse(&format!("{}/{name}", store.url()), &bytes)?;
    let objects: Vec<&Object> = manifest.objects.iter().collect();
    stage_objects(&store, &bytes, &objects, (local, engine), show)?;
    Ok(Some((local.to_path_buf(), bytes.to_vec())))
}

/// The directory and manifest file name of a manifest location.
pub(crate) fn split_location(location: &str) -> (String, String) {
    match location.rsplit_once('/') {
        Some((dir, name)) if name.ends_with(".json") => (dir.to_string(), name.to_string()),
        None if location.ends_with(".json") => (".".to_string(), location.to_string()),
        _ => (
            location.trim_end_matches('/').to_string(),
            MANIFEST.to_string(),
        ),
    }
}

/// Copies `objects` from `store` into `local` (each skipped where a whole
/// copy is there, all refused before any download where they would not
/// fit), then writes the manifest `bytes` there: the commit.
fn stage_objects(
    store: &Store,
    bytes: &[u8],
    objects: &[&Object],
    (local, engine): (&Path, &IoEngine),
    show: bool,
) -> Result<()> {
    let total: u64 = objects.iter().map(|o| o.size).sum();
    // What is not staged whole yet must fit: refused before any download.
    let mut buf = crate::layout::crc_buffer();
    let verified = crate::verified::Verified::load();
    let missing: Vec<bool> = objects
        .iter()
        .map(|o| check_object(engine, (local, o), &mut buf, &verified).is_err())
        .collect();
    let need: u64 = objects
        .iter()
        .zip(&missing)
        .filter(|(_, m)| **m)
        .map(|(o, _)| o.size)
        .sum();
    std::fs::create_dir_all(local).map_err(|e| Error::io(local.display(), e))?;
    let free = offgnn_shared::io_engine::free_bytes(local)?;
    if need > free {
        return Err(Error::InvalidArgument(format!(
            "--local-dir {}: {} free, staging the layout needs {} more ({} in all); free some space or choose another --local-dir",
            local.display(),
            offgnn_shared::report::human_bytes(free),
            offgnn_shared::report::human_bytes(need),
            offgnn_shared::report::human_bytes(total)
        )));
    }
    let pb = offgnn_shared::progress::bytes_bar_if(show, total, "staging");
    for (o, missing) in objects.iter().zip(missing) {
        if !missing {
            pb.inc(o.size);
            continue;
        }
        download(store, &o.name, o.size, &local.join(&o.name), &pb)?;
        check_object(engine, (local, o), &mut buf, &verified)?;
    }
    pb.finish_and_clear();
    verified.save();
    std::fs::write(local.join(MANIFEST), bytes)
        .map_err(|e| Error::io(local.join(MANIFEST).display(), e))
}

/// Copies object `name` (`size` bytes) to `path` with parallel ranged GETs,
/// through a partial file of this process that is renamed when whole: no
/// partial object stays behind (a full disk, a store fault, a signal), and
/// two processes staging one file do not write into each other's.
fn download(
    store: &Store,
    name: &str,
    size: u64,
    path: &Path,
    pb: &indicatif::ProgressBar,
) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent.display(), e))?;
    }
    let tmp = path.with_extension(format!("partial-{}", std::process::id()));
    let copied = (|| -> Result<()> {
        let f = File::create(&tmp).map_err(|e| Error::io(tmp.display(), e))?;
        f.set_len(size).map_err(|e| Error::io(tmp.display(), e))?;
        let ranges: Vec<u64> = (0..size.div_ceil(RANGE)).map(|i| i * RANGE).collect();
        ranges.par_iter().try_for_each(|&at| -> Result<()> {
            offgnn_shared::signals::check()?;
            let end = (at + RANGE).min(size);
            let data = store.get_range(name, at..end)?;
            f.write_all_at(&data, at)
                .map_err(|e| Error::io(tmp.display(), e))?;
            pb.inc(data.len() as u64);
            Ok(())
        })?;
        f.sync_all().map_err(|e| Error::io(tmp.display(), e))?;
        std::fs::rename(&tmp, path).map_err(|e| Error::io(path.display(), e))
    })();
    if copied.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    copied
}

/// Resolves a dataset location (`trainer infer --dataset`) to a local
/// directory: a local one is used in place; a remote one (every object
/// under the URL) is staged into `local`, each object skipped when a whole
/// copy (renamed from its partial file, so of the right size) is there.
/// The free space is checked before any download.
pub fn resolve_dataset(location: &str, local: &Path, show: bool) -> Result<PathBuf> {
    let remote = location.contains("://") && !location.starts_with("file://");
    if !remote {
        return Ok(PathBuf::from(location.trim_start_matches("file://")));
    }
    let store = Store::open(location)?;
    let objects = store.list("")?;
    if objects.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "--dataset {}: no objects there",
            store.url()
        )));
    }
    let whole = |name: &str, size: u64| {
        std::fs::metadata(local.join(name)).is_ok_and(|m| m.is_file() && m.len() == size)
    };
    let total: u64 = objects.iter().map(|o| o.1).sum();
    let need: u64 = objects
        .iter()
        .filter(|(n, s)| !whole(n, *s))
        .map(|o| o.1)
        .sum();
    std::fs::create_dir_all(local).map_err(|e| Error::io(local.display(), e))?;
    let free = offgnn_shared::io_engine::free_bytes(local)?;
    if need > free {
        return Err(Error::InvalidArgument(format!(
            "{}: {} free, staging the dataset {} needs {} more ({} in all); free some space or choose another --work-dir",
            local.display(),
            offgnn_shared::report::human_bytes(free),
            store.url(),
            offgnn_shared::report::human_bytes(need),
            offgnn_shared::report::human_bytes(total)
        )));
    }
    let pb = offgnn_shared::progress::bytes_bar_if(show, total, "staging the dataset");
    for (name, size) in &objects {
        if whole(name, *size) {
            pb.inc(*size);
            continue;
        }
        download(&store, name, *size, &local.join(name), &pb)?;
    }
    pb.finish_and_clear();
    Ok(local.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::split_location;

    #[test]
    fn a_manifest_location_is_a_directory_or_its_json_file() {
        let split = split_location;
        let pair = |d: &str, n: &str| (d.to_string(), n.to_string());
        assert_eq!(split("pack/manifest.json"), pair("pack", "manifest.json"));
        assert_eq!(split("pack/"), pair("pack", "manifest.json"));
        assert_eq!(split("pack"), pair("pack", "manifest.json"));
        assert_eq!(split("manifest.json"), pair(".", "manifest.json"));
        assert_eq!(split("s3://b/p/m.json"), pair("s3://b/p", "m.json"));
    }
}
