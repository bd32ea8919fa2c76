//! The output location and the manifest commit (DiskGNN §4's layout,
//! published as `DESIGN.md`'s step 7 says): this run's objects under
//! `pack/RUN/`, removed unless it commits; the staged objects uploaded to a
//! remote store; the manifest that names every object, committed last by a
//! conditional create; and the replaced layout's objects removed after.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use offgnn_manifests::{self as manifests, BatchRef, MANIFEST, Manifest, Object, RowOrder, Split};
use offgnn_shared::commit::{self, Previous, RunId};
use offgnn_shared::lease::{self, LEASE, Lease, Swept};
use offgnn_shared::report::human_bytes;
use offgnn_shared::samples::RunSummary;
use offgnn_shared::store::Store;

use crate::error::{Error, Result};
use crate::job::{PackConfig, PackSummary};
use crate::load::{Inputs, RowFormat};
use crate::plan::{BatchInfo, SegmentPlan};

/// Where this run writes: the output store, the layout committed there
/// before (if any), and this run's id, prefix and local staging.
pub(crate) struct Target {
    pub out: Store,
    pub previous: Option<Previous>,
    pub run_id: RunId,
    /// `pack/RUN`: this run's objects go under it; a committed layout's
    /// stay as they are until this run has committed.
    pub prefix: String,
    /// This run's claim on `prefix` while it lives, taken before anything
    /// is written under it.
    lease: Lease,
    /// What this run removed of runs that ended before committing.
    pub swept: Swept,
    /// The output directory, for a local output.
    pub local_root: Option<PathBuf>,
    /// Where objects are written: the output directory itself, or a
    /// temporary directory they are uploaded from.
    pub staging: PathBuf,
}

impl Target {
    /// Opens the output location `location`: refused when it holds a
    /// committed layout (unless `overwrite`) or files no packer wrote.
    pub(crate) fn prepare(location: &str, overwrite: bool) -> Result<Target> {
        let out = Store::open(location)?;
        let previous = commit::read(&out, MANIFEST)?;
        if previous.is_some() && !overwrite {
            return Err(Error::Committed(out.url().to_string()));
        }
        check_pack_prefix(&out)?;
        let run_id = RunId::new();
        let prefix = format!("pack/{run_id}");
        tracing::info!("run {run_id}");
        let lease = Lease::take(&out, &format!("{prefix}/{LEASE}"), &run_id)?;
        let swept = lease::sweep(&out, &PACKER_RUNS, &lease);
        let local_root = local_dir(location);
        let staging = match &local_root {
            Some(dir) => dir.clone(),
            None => std::env::temp_dir().join(format!("offgnn-pack-{run_id}")),
        };
        Ok(Target {
            out,
            previous,
            run_id,
            prefix,
            lease,
            swept,
            local_root,
            staging,
        })
    }

    /// This run's objects, removed when dropped before [`Target::commit`].
    pub(crate) fn run_objects(&self) -> RunObjects<'_> {
        RunObjects {
            out: &self.out,
            prefix: self.prefix.clone(),
            local_dir: self.local_root.as_ref().map(|d| d.join(&self.prefix)),
            temp: self.local_root.is_none().then(|| self.staging.clone()),
            committed: false,
        }
    }

    /// Refuses a disk that cannot hold the layout's `bytes` (feature rows
    /// and address tables) before any is written.
    pub(crate) fn check_room(&self, bytes: u64) -> Result<()> {
        let staging = &self.staging;
        std::fs::create_dir_all(staging).map_err(|e| Error::io(staging.display(), e))?;
        let free = offgnn_shared::io_engine::free_bytes(staging)?;
        if bytes > free {
            return Err(Error::InvalidArgument(format!(
                "{}: {} free, the layout (feature rows and address tables) needs {}; free some space, lower --disk-budget, or choose another --out",
                staging.display(),
                human_bytes(free),
                human_bytes(bytes)
            )));
        }
        Ok(())
    }

    /// Copies the staged objects to a remote store (a local output holds
    /// them where they were written).
    pub(crate) fn upload_if_remote(&self, objects: &[Object], show: bool) -> Result<()> {
        if self.local_root.is_none() {
            upload(&self.out, &self.staging, objects, show)?;
        }
        Ok(())
    }

    /// Commits `manifest`: this run's objects stay, and the layout it
    /// replaced goes. Another run that committed first wins, and this
    /// run's objects are removed.
    pub(crate) fn commit(&self, written: RunObjects<'_>, manifest: &Manifest) -> Result<()> {
        manifest.validate().map_err(|e| {
            Error::InvalidArgument(format!("internal: the manifest is invalid: {e}"))
        })?;
        let body = serde_json::to_vec_pretty(manifest).expect("manifests serialize");
        self.commit_body(written, body, manifest.objects.len())
    }

    /// Commits a validated manifest's `body`, which names `objects`
    /// objects (see [`Target::commit`]).
    pub(crate) fn commit_body(
        &self,
        mut written: RunObjects<'_>,
        body: Vec<u8>,
        objects: usize,
    ) -> Result<()> {
        let out = &self.out;
        match commit::commit(out, MANIFEST, body, &self.run_id, self.previous.as_ref())? {
            commit::Outcome::Committed => {
                written.keep();
                self.lease.release();
            }
            commit::Outcome::Lost { winner } => {
                drop(written);
                return Err(commit::lost(&out.join(MANIFEST), &winner, objects).into());
            }
        }
        if let Some(old) = &self.previous {
            remove_replaced(out, self.local_root.as_deref(), old);
            commit::fault_point(commit::REPLACED_REMOVED);
        }
        Ok(())
    }

    /// The committed manifest's URL.
    pub(crate) fn manifest_url(&self) -> String {
        format!("{}/{MANIFEST}", self.out.url().trim_end_matches('/'))
    }
}

/// A packed layout, for its manifest: the plan's segments and batches, and
/// the objects written.
pub(crate) struct PackedLayout<'a> {
    pub segments: &'a [SegmentPlan],
    pub batches: &'a [BatchInfo],
    pub gpu_object: Option<Object>,
    pub cpu_object: Option<Object>,
    /// Every object: the caches, the segments, the address tables.
    pub objects: Vec<Object>,
    /// CRC32C of every row of the feature file, when the pass read them all.
    pub rows_crc32c: Option<u32>,
    pub largest_batch: manifests::BatchShape,
}

/// The manifest of a packed layout: the dataset, the samples, the tiers,
/// the packing, every segment and object, and the summary's figures.
pub(crate) fn manifest(
    cfg: &PackConfig,
    inputs: &Inputs,
    rows: RowFormat,
    target: &Target,
    packed: PackedLayout<'_>,
    summary: &PackSummary,
) -> Manifest {
    Manifest {
        // The oldest format the layout fits, which more builds read.
        format_version: if inputs.run.params.link.is_some() {
            manifests::LINK_FORMAT_VERSION
        } else if summary.cpu_cache_policy.is_static() {
            manifests::STATIC_FORMAT_VERSION
        } else {
            manifests::BELADY_FORMAT_VERSION
        },
        run_id: target.run_id.to_string(),
        created_by: format!("offgnn packer {}", env!("CARGO_PKG_VERSION")),
        dataset: dataset_ref(inputs, rows, packed.rows_crc32c),
        samples: samples_ref(inputs),
        gpu_cache: manifests::Tier {
            object: packed.gpu_object.map(|o| o.name),
            rows: summary.gpu_rows,
            budget_bytes: cfg.gpu_cache,
            policy: manifests::CachePolicy::Static,
        },
        cpu_cache: manifests::Tier {
            object: packed.cpu_object.map(|o| o.name),
            rows: summary.cpu_rows,
            budget_bytes: cfg.cpu_cache,
            policy: summary.cpu_cache_policy,
        },
        packing: packing_ref(cfg, summary),
        segments: segment_refs(packed.segments, &part_prefix(inputs, target)),
        schedule: schedule(packed.segments, packed.batches),
        objects: packed.objects,
        disk_bytes: summary.disk_bytes,
        feature_disk_bytes: summary.feature_disk_bytes,
        blow_up: summary.blow_up,
        predicted_read_amplification: summary.predicted_read_amplification,
        access_shares: summary.access_shares.clone(),
        // A node type's batches have no blocks: the typed topology bounds
        // the batches.
        largest_batch: inputs.view.is_none().then_some(packed.largest_batch),
    }
}

fn dataset_ref(
    inputs: &Inputs,
    rows: RowFormat,
    rows_crc32c: Option<u32>,
) -> manifests::DatasetRef {
    let (run, features) = (&inputs.run, &inputs.features);
    manifests::DatasetRef {
        name: match &inputs.view {
            None => run.dataset.name.clone(),
            Some(v) => format!("{}/{}", run.dataset.name, v.name),
        },
        num_nodes: features.num_rows(),
        feature_dim: inputs.feature_dim(),
        feature_dtype: rows.from,
        row_bytes: rows.source_row_bytes,
        feature_file_bytes: features.file_bytes(),
        // Absolute, so that `packer verify` and the trainer's
        // baselines find it from any working directory.
        feature_location: offgnn_shared::store::absolute_location(&features.describe()),
        dataset_fingerprint: run.dataset.fingerprint.clone(),
        feature_fingerprint: inputs.feature_fingerprint(),
        num_classes: run.dataset.num_classes,
        feature_rows_crc32c: rows_crc32c,
        store_dtype: rows.converted().then_some(rows.to),
    }
}

fn samples_ref(inputs: &Inputs) -> manifests::SamplesRef {
    samples_ref_of(&inputs.run, &inputs.run_bytes, &inputs.samples)
}

/// The samples a layout was packed from: where, the digest of their run
/// summary as stored, and how they were sampled.
pub(crate) fn samples_ref_of(
    run: &RunSummary,
    run_bytes: &[u8],
    samples: &Store,
) -> manifests::SamplesRef {
    manifests::SamplesRef {
        location: offgnn_shared::store::absolute_location(samples.url()),
        run_sha256: {
            use sha2::Digest;
            offgnn_shared::store::hex(&sha2::Sha256::digest(run_bytes))
        },
        fanouts: run.params.fanouts.clone(),
        batch_size: run.params.batch_size,
        eval_batch_size: run.params.eval_batch_size,
        epochs: run.params.epochs,
        seed: run.params.seed,
        graph: Some(manifests::GraphOptions {
            add_reverse_edges: run.params.add_reverse_edges,
            dedup_edges: run.params.dedup_edges,
            keep_self_loops: run.params.keep_self_loops,
        }),
        link: run.params.link.as_ref().map(|l| manifests::LinkSamples {
            negatives: l.negatives,
            negative_sampler: l.negative_sampler.clone(),
        }),
    }
}

fn packing_ref(cfg: &PackConfig, summary: &PackSummary) -> manifests::Packing {
    manifests::Packing {
        mode: cfg.packing,
        disk_cache: cfg.disk_cache,
        segment_size: summary.segment_size,
        searched: summary.searched,
        estimated_bytes: summary.estimated_bytes,
        partitions: summary.partitions,
        minhash_functions: match cfg.row_order {
            RowOrder::MinHash { functions } => functions,
            RowOrder::BottomK { .. } => 1,
        },
        row_order: Some(cfg.row_order),
    }
}

/// Where a layout's objects go: under the run's prefix, and in a typed
/// run under its node type's.
pub(crate) fn part_prefix(inputs: &Inputs, target: &Target) -> String {
    match &inputs.view {
        None => target.prefix.clone(),
        Some(v) => v.prefix(&target.prefix),
    }
}

fn segment_refs(segments: &[SegmentPlan], prefix: &str) -> Vec<manifests::Segment> {
    segments
        .iter()
        .enumerate()
        .map(|(i, s)| manifests::Segment {
            object: format!("{prefix}/segment-{i:05}.bin"),
            table: format!("{prefix}/table-{i:05}.bin"),
            split: s.split,
            batches: s.batches.len() as u32,
            disk_cache_rows: s.dc_rows.len() as u64,
            disk_cache_bytes: s.dc_bytes,
            packed_rows: s.packed_rows(),
            chunk_bytes: s.chunk_bytes(),
        })
        .collect()
}

fn schedule(
    segments: &[SegmentPlan],
    batches: &[BatchInfo],
) -> BTreeMap<Split, Vec<Vec<BatchRef>>> {
    let mut out: BTreeMap<Split, Vec<Vec<BatchRef>>> = BTreeMap::new();
    for (si, s) in segments.iter().enumerate() {
        for (ri, &b) in s.batches.iter().enumerate() {
            let info = &batches[b];
            let epochs = out.entry(info.split).or_default();
            while epochs.len() <= info.epoch as usize {
                epochs.push(Vec::new());
            }
            epochs[info.epoch as usize].push(BatchRef {
                segment: si as u32,
                record: ri as u32,
            });
        }
    }
    out
}

/// The packer's runs, for the removal of those killed before committing.
const PACKER_RUNS: lease::Kind = lease::Kind {
    what: "packer runs",
    roots: &["pack"],
    owns: &packer_object,
    commit: MANIFEST,
};

/// Whether `name` (relative to --out) is one of the objects a packer writes
/// under `pack/`: the caches, segments and address tables, under a run's id
/// (`pack/RUN/segment-00000.bin`) or as layouts from before run ids named
/// them (`pack/segment-00000.bin`), and a run's lease (`pack/RUN/_live`);
/// in a typed layout, each node type's objects (`pack/RUN/type-00/...`)
/// and the topology's tables (`pack/RUN/topology-00000.bin`).
fn packer_object(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("pack/") else {
        return false;
    };
    let (in_run, file) = match rest.split_once('/') {
        Some((run, file)) if RunId::is_run_id(run) => (true, file),
        Some(_) => return false,
        None => (false, rest),
    };
    if in_run && lease::is_lease(file) {
        return true;
    }
    let digits = |n: &str| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit());
    let numbered = |file: &str, prefix: &str| {
        file.strip_prefix(prefix)
            .and_then(|rest| rest.strip_suffix(".bin"))
            .is_some_and(digits)
    };
    let layout_object = |file: &str| {
        file == "gpu_cache.bin"
            || file == "cpu_cache.bin"
            || numbered(file, "segment-")
            || numbered(file, "table-")
    };
    let typed_object = || match file.split_once('/') {
        Some((part, file)) => part.strip_prefix("type-").is_some_and(digits) && layout_object(file),
        None => numbered(file, "topology-"),
    };
    layout_object(file) || (in_run && typed_object())
}

/// Refuses, naming it, an output location whose `pack/` holds a file no
/// packer writes (a user's file, not a layout's): the packer removes what
/// is there when it replaces a layout, and must never remove that.
fn check_pack_prefix(out: &Store) -> Result<()> {
    let listed = out.list("pack")?;
    let foreign: Vec<&str> = listed
        .iter()
        .map(|(name, _)| name.as_str())
        .filter(|name| !packer_object(name))
        .collect();
    if let Some(first) = foreign.first() {
        return Err(Error::InvalidArgument(format!(
            "{}: holds {} that no packer wrote ({}{}); the packer replaces what is under pack/, so remove them or choose another --out",
            out.url(),
            if foreign.len() == 1 {
                "a file".to_string()
            } else {
                format!("{} files", foreign.len())
            },
            first,
            if foreign.len() > 1 { ", ..." } else { "" }
        )));
    }
    Ok(())
}

/// This run's objects until it commits: removed when the run fails (or
/// loses the commit); a remote store's local staging always goes.
pub(crate) struct RunObjects<'a> {
    out: &'a Store,
    prefix: String,
    /// `pack/RUN` in a local output directory.
    local_dir: Option<PathBuf>,
    /// The staging directory of a remote output.
    temp: Option<PathBuf>,
    committed: bool,
}

impl RunObjects<'_> {
    /// The run committed: its objects stay.
    fn keep(&mut self) {
        self.committed = true;
    }
}

impl Drop for RunObjects<'_> {
    fn drop(&mut self) {
        if let Some(dir) = self.temp.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
        if self.committed {
            return;
        }
        let removed = match &self.local_dir {
            Some(dir) => match std::fs::remove_dir_all(dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.to_string()),
                _ => Ok(()),
            },
            None => self
                .out
                .delete_prefix(&self.prefix)
                .map(|_| ())
                .map_err(|e| e.to_string()),
        };
        match removed {
            Ok(()) => tracing::debug!("removed this run's objects ({})", self.prefix),
            Err(e) => tracing::warn!(
                "could not remove this run's objects under {}: {e}",
                self.out.join(&self.prefix)
            ),
        }
    }
}

/// After this run's commit replaced `old`, removes the objects the old
/// manifest names (a local run's directory in one call).
fn remove_replaced(out: &Store, local_root: Option<&Path>, old: &Previous) {
    let removed = (|| -> Result<usize> {
        if let (Some(root), Some(id)) = (local_root, &old.run_id) {
            let dir = root.join("pack").join(id);
            return match std::fs::remove_dir_all(&dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(Error::io(dir.display(), e))
                }
                _ => Ok(1),
            };
        }
        // Only the objects: a typed layout's manifest lists them as a
        // homogeneous one's does.
        #[derive(serde::Deserialize)]
        struct Listed {
            objects: Vec<Object>,
        }
        let manifest: Listed = serde_json::from_slice(&old.body).map_err(|e| {
            Error::InvalidArgument(format!("the replaced manifest is unreadable: {e}"))
        })?;
        for o in &manifest.objects {
            out.delete(&o.name)?;
        }
        // A lease its run had no time to remove after committing.
        if let Some(id) = &old.run_id {
            out.delete(&format!("pack/{id}/{LEASE}"))?;
        }
        Ok(manifest.objects.len())
    })();
    if let Err(e) = removed {
        tracing::warn!("could not remove all of the replaced layout's objects: {e}");
    }
}

/// The local directory of an output location, or `None` for a remote store.
fn local_dir(location: &str) -> Option<PathBuf> {
    if let Some(path) = location.strip_prefix("file://") {
        return Some(PathBuf::from(path));
    }
    (!location.contains("://")).then(|| PathBuf::from(location))
}

/// Copies the staged objects to a remote store.
fn upload(out: &Store, staging: &Path, objects: &[Object], show: bool) -> Result<()> {
    let total = objects.iter().map(|o| o.size).sum();
    let pb = offgnn_shared::progress::bytes_bar_if(show, total, "uploading");
    for o in objects {
        let path = staging.join(&o.name);
        // A multipart upload cannot resend one failed part: the whole object
        // goes again, after a growing pause (the store's own requests were
        // retried already).
        let mut wait = UPLOAD_BACKOFF;
        for attempt in 1..=UPLOAD_ATTEMPTS {
            let sent = (|| -> Result<u64> {
                let mut f = File::open(&path).map_err(|e| Error::io(path.display(), e))?;
                let mut w = out.writer(&o.name)?;
                let n =
                    std::io::copy(&mut f, &mut w).map_err(|e| Error::io(out.join(&o.name), e))?;
                w.finish()?;
                Ok(n)
            })();
            match sent {
                Ok(n) => {
                    pb.inc(n);
                    break;
                }
                Err(e) if attempt < UPLOAD_ATTEMPTS => {
                    tracing::warn!("{e}; uploading {} again in {wait:?}", o.name);
                    std::thread::sleep(wait);
                    wait *= 2;
                }
                Err(e) => return Err(e),
            }
        }
    }
    pb.finish_and_clear();
    Ok(())
}

/// Tries of one object's upload.
const UPLOAD_ATTEMPTS: u32 = 4;
/// The pause before the first retry of an upload; each further one doubles.
const UPLOAD_BACKOFF: std::time::Duration = std::time::Duration::from_millis(500);
