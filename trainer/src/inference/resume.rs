//! Where a run stands, in its work directory: the progress a killed run
//! left (layers and groups finished, figures, parts written), which the
//! same command resumes, the run's lease on its parts in `--out`, and the
//! work directory's clearing once the result is committed. A typed run
//! keeps progress of its own shape ([`RunProgress`]) through the same
//! steps.

use std::fs::File;
use std::path::Path;

use offgnn_shared::commit::{Previous, RunId};
use offgnn_shared::lease::{self, LEASE, Lease, Swept};
use offgnn_shared::store::Store;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::Digest;

use super::edges::edge_file;
use super::hidden_rows::hidden_file;
use super::output::is_part;
use super::plan::Plan;
use super::{COMMIT, InferConfig, LayerFigures};
use crate::error::{Error, Result};

/// What any run's progress says of the run itself.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct RunRecord {
    /// Which run it belongs to: a run resumes only progress of its key.
    pub(crate) key: String,
    /// The run whose parts these are: a resumed run keeps its id.
    #[serde(default)]
    pub(crate) run_id: String,
    /// The output parts written so far.
    pub(crate) output_files: Vec<String>,
}

/// Where an interrupted run stands.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct Progress {
    #[serde(flatten)]
    pub(super) run: RunRecord,
    pub(super) edges_ready: bool,
    /// Layers finished.
    pub(super) layer: usize,
    /// Groups of layer `layer` finished.
    pub(super) groups_done: usize,
    pub(super) figures: Vec<LayerFigures>,
    pub(super) edge_bucketing_seconds: f64,
    pub(super) nodes_written: u64,
}

/// What a run's progress file holds: where a run stands (a fresh run's is
/// the default), and which run it is.
pub(crate) trait RunProgress: Serialize + DeserializeOwned + Default {
    fn run(&self) -> &RunRecord;
    fn run_mut(&mut self) -> &mut RunRecord;
    /// Whether an object under `--out` is an output part of such a run.
    fn owns(name: &str) -> bool;
    /// Counts what an earlier run did as resumed; says where it stands,
    /// where it had begun.
    fn resumed(&mut self) -> Option<String>;
}

impl RunProgress for Progress {
    fn run(&self) -> &RunRecord {
        &self.run
    }

    fn run_mut(&mut self) -> &mut RunRecord {
        &mut self.run
    }

    fn owns(name: &str) -> bool {
        is_part(name)
    }

    fn resumed(&mut self) -> Option<String> {
        for f in self.figures.iter_mut() {
            f.groups_resumed = f.passes;
        }
        (self.layer > 0 || self.groups_done > 0).then(|| {
            format!(
                "layer {}, {} groups of it done",
                self.layer + 1,
                self.groups_done
            )
        })
    }
}

const PROGRESS: &str = "progress.json";

/// Holds the work directory `work` for this run alone (creating it): two
/// runs in it would overwrite each other's layers and progress.
pub(crate) fn hold_work_dir(work: &Path) -> Result<offgnn_shared::commit::HeldDir> {
    Ok(offgnn_shared::commit::hold_dir(
        work,
        "another trainer infer is working here; wait for it to end or pass another --work-dir",
    )?)
}

/// Saves `p` in the work directory, replacing the last progress whole.
pub(crate) fn save_progress(work: &Path, p: &impl Serialize) -> Result<()> {
    let tmp = work.join(format!("{PROGRESS}.partial"));
    let bytes = serde_json::to_vec_pretty(p).expect("progress serializes");
    std::fs::write(&tmp, bytes)
        .and_then(|()| File::open(&tmp)?.sync_all())
        .map_err(|e| Error::io(tmp.display(), e))?;
    std::fs::rename(&tmp, work.join(PROGRESS)).map_err(|e| Error::io(work.display(), e))
}

/// The key of a run's progress: the model's weights, the dataset
/// (`fingerprint`), the plan, the nodes selected (`selection`'s bits: the
/// contents of a `--nodes` file, not its path) and the options that shape
/// the work directory's files or the values in them (device and where the
/// aggregation runs). A run resumes only progress with its key.
pub(super) fn run_key(
    cfg: &InferConfig,
    weights_sha256: &str,
    fingerprint: &str,
    plan: &Plan,
    selection: &[u64],
) -> String {
    let mut h = sha2::Sha256::new();
    h.update(weights_sha256);
    h.update(fingerprint);
    h.update(serde_json::to_vec(plan).expect("plan serializes"));
    h.update([
        cfg.add_reverse_edges as u8,
        cfg.keep_self_loops as u8,
        cfg.keep_duplicate_edges as u8,
    ]);
    for word in selection {
        h.update(word.to_le_bytes());
    }
    h.update(format!(
        "{:?}{}{:?}{:?}",
        cfg.outputs, cfg.hidden_f16, cfg.device, cfg.aggregate
    ));
    offgnn_shared::store::hex(&h.finalize())
}

/// Where a run with `key` starts: where a run of the same key stopped, as
/// the work directory `work` says, unless that run committed (`previous`),
/// else from the start; and the run's id, which a resumed run keeps.
/// Figures of an earlier run are reported as resumed. Also the output
/// parts of an unfinished run of another key or of the other kind (a typed
/// run's progress in a homogeneous run's work directory, or the other way
/// round), which no commit will ever name: the caller removes them.
fn resume<P: RunProgress>(
    work: &Path,
    key: &str,
    previous: Option<&Previous>,
) -> (P, RunId, Vec<String>) {
    // Every run's progress holds its record, a homogeneous run's and a
    // typed one's alike; only a run of the same kind's parses as `P`.
    let bytes = std::fs::read(work.join(PROGRESS)).ok();
    let record = bytes.as_deref().and_then(|b| {
        let record = serde_json::from_slice::<RunRecord>(b).ok()?;
        Some((record, serde_json::from_slice::<P>(b).ok()))
    });
    let (left, stale_parts) = match record {
        // A run killed after its commit (before it cleared its work
        // directory) is done: the next run is a new one, not that one again.
        Some((r, _)) if previous.is_some_and(|c| c.run_id.as_deref() == Some(&r.run_id)) => {
            (None, Vec::new())
        }
        Some((r, Some(p))) if r.key == key => (Some(p), Vec::new()),
        // Another key's run, or the other kind's: its parts are no
        // commit's.
        Some((r, _)) => (None, r.output_files),
        None => (None, Vec::new()),
    };
    let mut progress = left.unwrap_or_else(|| {
        let mut p = P::default();
        p.run_mut().key = key.to_string();
        p
    });
    let run_id = match RunId::parse(&progress.run().run_id) {
        Some(id) => id,
        None => {
            let id = RunId::new();
            progress.run_mut().run_id = id.to_string();
            id
        }
    };
    if let Some(at) = progress.resumed() {
        tracing::info!("resuming in {}: {at}", work.display());
    }
    (progress, run_id, stale_parts)
}

/// A run's start: where it stands, its id, its lease on its parts in
/// `--out`, and what it removed of runs killed before committing.
pub(crate) struct Claim<P> {
    pub(crate) progress: P,
    pub(crate) run_id: RunId,
    pub(crate) lease: Lease,
    pub(crate) swept: Swept,
}

/// Where the run with `key` starts ([`resume`]) in the work directory
/// `work`, holding the lease on its parts; then removes the parts of runs
/// that ended without committing. Progress whose parts are not all in
/// `out` (another `--out`, or removed as a dead run's) is dropped: the run
/// starts over.
pub(crate) fn claim<P: RunProgress>(
    work: &Path,
    out: &Store,
    key: &str,
    previous: Option<&Previous>,
) -> Result<Claim<P>> {
    let (mut progress, mut run_id, stale_parts) = resume::<P>(work, key, previous);
    remove_parts(out, &stale_parts, "an unfinished run of other settings");
    let mut lease = take_lease(out, &run_id)?;
    let missing = missing_parts(out, &run_id, &progress.run().output_files)?.len();
    if missing > 0 {
        tracing::warn!(
            "{missing} of the {} output parts this run wrote before it stopped are not in {}; starting over",
            progress.run().output_files.len(),
            out.url()
        );
        remove_parts(out, &progress.run().output_files, "the run stopped before");
        drop(lease);
        forget_progress(work);
        (progress, run_id, _) = resume::<P>(work, key, previous);
        lease = take_lease(out, &run_id)?;
    }
    // Inference runs, for the removal of those killed before committing.
    let runs = lease::Kind {
        what: "inference runs",
        roots: &[""],
        owns: &P::owns,
        commit: COMMIT,
    };
    let swept = lease::sweep(out, &runs, &lease);
    Ok(Claim {
        progress,
        run_id,
        lease,
        swept,
    })
}

/// The parts among `files` that are not in `out` under `run_id`'s directory.
pub(crate) fn missing_parts<'a>(
    out: &Store,
    run_id: &RunId,
    files: &'a [String],
) -> Result<Vec<&'a String>> {
    let there: std::collections::HashSet<String> = out
        .list(run_id.as_str())?
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    Ok(files.iter().filter(|f| !there.contains(*f)).collect())
}

fn take_lease(out: &Store, run_id: &RunId) -> Result<Lease> {
    Ok(Lease::take(out, &format!("{run_id}/{LEASE}"), run_id)?)
}

/// Removes the output parts `parts`, left by `whom`: no commit names them.
fn remove_parts(out: &Store, parts: &[String], whom: &str) {
    if parts.is_empty() {
        return;
    }
    tracing::info!(
        "removing {} output parts of {whom} in {}",
        parts.len(),
        out.url()
    );
    for name in parts {
        if let Err(e) = out.delete(name) {
            tracing::warn!("could not remove {name}, left by {whom}: {e}");
        }
    }
}

/// Forgets the run's progress: the next run starts anew.
pub(crate) fn forget_progress(work: &Path) {
    let _ = std::fs::remove_file(work.join(PROGRESS));
}

/// Clears the work directory of the run's files (`layers` hidden layers'
/// outputs, `groups` groups' edges, the progress) once its result is
/// committed.
pub(super) fn clear_work_dir(work: &Path, layers: usize, groups: usize) {
    for l in 0..layers {
        let _ = std::fs::remove_file(hidden_file(work, l));
    }
    for g in 0..groups {
        let _ = std::fs::remove_file(edge_file(work, g));
    }
    forget_progress(work);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Progress of another shape than [`Progress`], as a typed run's is.
    #[derive(Default, Serialize, Deserialize)]
    struct Other {
        #[serde(flatten)]
        run: RunRecord,
        node_type: usize,
    }

    impl RunProgress for Other {
        fn run(&self) -> &RunRecord {
            &self.run
        }
        fn run_mut(&mut self) -> &mut RunRecord {
            &mut self.run
        }
        fn owns(_: &str) -> bool {
            false
        }
        fn resumed(&mut self) -> Option<String> {
            None
        }
    }

    fn left_by(work: &Path, key: &str, run_id: &RunId) {
        let p = Progress {
            run: RunRecord {
                key: key.into(),
                run_id: run_id.to_string(),
                output_files: vec![format!("{run_id}/part-00000.parquet")],
            },
            layer: 1,
            ..Default::default()
        };
        save_progress(work, &p).unwrap();
    }

    #[test]
    fn progress_of_another_key_or_kind_names_parts_to_remove_unless_committed() {
        let work = tempfile::tempdir().unwrap();
        let id = RunId::new();
        let part = vec![format!("{id}/part-00000.parquet")];
        // The same kind and key resumes, keeping the run's id.
        left_by(work.path(), "k", &id);
        let (p, run_id, stale) = resume::<Progress>(work.path(), "k", None);
        assert_eq!((p.layer, run_id.as_str(), stale.len()), (1, id.as_str(), 0));
        // Another key's run starts over, its parts stale.
        let (p, run_id, stale) = resume::<Progress>(work.path(), "other", None);
        assert_eq!((p.layer, stale), (0, part.clone()));
        assert_ne!(run_id.as_str(), id.as_str());
        // Progress of the other kind does not parse as this kind's, and
        // its parts are stale all the same, whatever the key.
        assert!(
            serde_json::from_slice::<Other>(&std::fs::read(work.path().join(PROGRESS)).unwrap())
                .is_err()
        );
        let (_, _, stale) = resume::<Other>(work.path(), "k", None);
        assert_eq!(stale, part);
        // A run that committed left nothing to remove.
        let committed = Previous {
            run_id: Some(id.to_string()),
            body: Default::default(),
        };
        let (_, _, stale) = resume::<Other>(work.path(), "k", Some(&committed));
        assert!(stale.is_empty());
    }
}
