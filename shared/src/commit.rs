//! Runs and their commits. Every output of offgnn (samples, layouts,
//! checkpoints, exports, inference results) is written under names of its
//! own run and becomes visible through one small commit object, created
//! conditionally (object_store's `PutMode::Create`). Readers read only what a
//! commit names, so two runs on one location never mix: one commits, the
//! other finds the commit taken, removes what it wrote and says which run won.
//!
//! A commit object is JSON with a `run_id` key naming the run it commits.
//!
//! Crashes at the phase boundaries of a commit are injected for the
//! end-to-end tests by [`fault_point`] (`OFFGNN_FAULT_AT`).

use crate::error::{Error, Result};
use crate::store::Store;

/// A run's identity, unique per process: seconds since the epoch and 32
/// random bits (`r1764043500-3f9a1c2e`). Object names carry it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunId(String);

impl RunId {
    pub fn new() -> RunId {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        RunId(format!("r{secs}-{:08x}", rand::random::<u32>()))
    }

    /// The id the cooperating processes of one sharded run share: derived
    /// from what defines the run (so every shard names the same objects and
    /// a shard rerun rewrites its own files), `s` and 16 hex digits.
    pub fn derived(parts: &[&[u8]]) -> RunId {
        use sha2::Digest;
        let mut h = sha2::Sha256::new();
        for p in parts {
            h.update((p.len() as u64).to_le_bytes());
            h.update(p);
        }
        RunId(format!("s{}", &crate::store::hex(&h.finalize())[..16]))
    }

    /// A run id read back (a resumed run's own); `None` when `s` is not one.
    pub fn parse(s: &str) -> Option<RunId> {
        RunId::is_run_id(s).then(|| RunId(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `s` has the shape of a run id (either kind): names under a
    /// run's prefix are recognised by it.
    pub fn is_run_id(s: &str) -> bool {
        let hex = |t: &str, n: usize| t.len() == n && t.bytes().all(|b| b.is_ascii_hexdigit());
        if let Some(rest) = s.strip_prefix('r') {
            rest.split_once('-').is_some_and(|(secs, rand)| {
                !secs.is_empty() && secs.bytes().all(|b| b.is_ascii_digit()) && hex(rand, 8)
            })
        } else {
            s.strip_prefix('s').is_some_and(|h| hex(h, 16))
        }
    }
}

impl Default for RunId {
    fn default() -> Self {
        RunId::new()
    }
}

impl std::fmt::Display for RunId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The commit a location held when a run started: what `--overwrite`
/// replaces, and what names the objects to remove once it is replaced.
#[derive(Clone, Debug)]
pub struct Previous {
    /// `None` for a commit written before run ids existed.
    pub run_id: Option<String>,
    pub body: bytes::Bytes,
}

/// The run id a commit object names, if it names one.
fn run_id_of(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()?
        .get("run_id")?
        .as_str()
        .map(str::to_string)
}

/// Reads the commit object `name`, if there is one.
pub fn read(store: &Store, name: &str) -> Result<Option<Previous>> {
    if !store.exists(name)? {
        return Ok(None);
    }
    match store.get(name) {
        Ok(body) => Ok(Some(Previous {
            run_id: run_id_of(&body),
            body,
        })),
        // Removed between the two calls: replaced by a run that is
        // committing right now; there is none to read.
        Err(_) if !store.exists(name)? => Ok(None),
        Err(e) => Err(e),
    }
}

/// What [`commit`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// This run's commit object is in place.
    Committed,
    /// Another run committed first: its id, or a description.
    Lost { winner: String },
}

/// Commits `body` (JSON with this run's `run_id`) as the object `name`.
///
/// Without `replacing` the commit is created only where none exists. With
/// `replacing` (the commit this run read when it started; `--overwrite`),
/// the commit there is replaced only while it is still that one; a run that
/// committed in between wins and this one loses. The old run's objects are
/// the caller's to remove, after this returns `Committed`.
///
/// How the condition holds: in a local directory, the steps run under an
/// exclusive lock (`flock` on `.NAME.lock` beside the commit); on object
/// stores, a create is `PutMode::Create` and a replace `PutMode::Update` on
/// the version read (S3, GCS, Azure). A store without conditional replace
/// falls back to a removal then a create.
///
/// Fault points: [`OBJECTS_WRITTEN`] on entry, [`COMMITTED`] once this
/// run's commit is in place.
pub fn commit(
    store: &Store,
    name: &str,
    body: Vec<u8>,
    run: &RunId,
    replacing: Option<&Previous>,
) -> Result<Outcome> {
    fault_point(OBJECTS_WRITTEN);
    let outcome = commit_now(store, name, body, run, replacing)?;
    if outcome == Outcome::Committed {
        fault_point(COMMITTED);
    }
    Ok(outcome)
}

fn commit_now(
    store: &Store,
    name: &str,
    body: Vec<u8>,
    run: &RunId,
    replacing: Option<&Previous>,
) -> Result<Outcome> {
    debug_assert_eq!(run_id_of(&body).as_deref(), Some(run.as_str()));
    let ours = |b: &[u8]| run_id_of(b).as_deref() == Some(run.as_str());
    if let Some(_lock) = local_lock(store, name)? {
        // Under the lock nothing else commits here: read, decide, write.
        return match read(store, name)? {
            None => {
                store.put(name, body)?;
                Ok(Outcome::Committed)
            }
            Some(now) if ours(&now.body) => Ok(Outcome::Committed),
            Some(now) if replacing.is_some_and(|old| old.body == now.body) => {
                store.put(name, body)?;
                Ok(Outcome::Committed)
            }
            Some(now) => Ok(Outcome::Lost {
                winner: describe(&now),
            }),
        };
    }
    if let Some(old) = replacing {
        match store.get_versioned(name)? {
            Some((now, version)) if now == old.body => {
                match store.put_if_version(name, body.clone(), version)? {
                    Some(_) => return settled(store, name, run),
                    // No conditional replace here: remove, then create.
                    None => store.delete(name)?,
                }
            }
            // Another process of this same run (a shard) got there first.
            Some((now, _)) if ours(&now) => return Ok(Outcome::Committed),
            Some((now, _)) => {
                return Ok(Outcome::Lost {
                    winner: describe(&Previous {
                        run_id: run_id_of(&now),
                        body: now,
                    }),
                });
            }
            // Already gone: a replacing run without conditional replace is
            // between its removal and its create; the create below decides.
            None => {}
        }
    }
    store.put_if_absent(name, body)?;
    settled(store, name, run)
}

/// Who holds the commit now: this run, or the winner. Read back whether
/// or not the write took: a retried create whose first answer was lost
/// finds this run's own, and on a store whose conditional writes check and
/// then write in two steps (the s3s-fs test server) a second write can
/// land over this one: the run whose commit is there is the one that won.
fn settled(store: &Store, name: &str, run: &RunId) -> Result<Outcome> {
    // A write that passed such a check beside this one lands within
    // milliseconds; reading after it has landed, both runs see one winner.
    std::thread::sleep(SETTLE);
    match read(store, name)? {
        Some(now) if now.run_id.as_deref() == Some(run.as_str()) => Ok(Outcome::Committed),
        Some(now) => Ok(Outcome::Lost {
            winner: describe(&now),
        }),
        None => Ok(Outcome::Lost {
            winner: "a run that committed and was replaced at once".into(),
        }),
    }
}

/// Phase boundary: every object of a run is written, its commit is not
/// (a crash here leaves the previous output, or nothing).
pub const OBJECTS_WRITTEN: &str = "objects-written";
/// Phase boundary: the run's commit is in place, the objects of the output
/// it replaced are not yet removed (a crash here leaves the new output).
pub const COMMITTED: &str = "committed";
/// Phase boundary: the replaced output's objects are removed; the caller
/// that removes them marks it.
pub const REPLACED_REMOVED: &str = "replaced-removed";

/// The environment variable that names the phase boundary at which
/// [`fault_point`] ends the process.
pub const FAULT_AT: &str = "OFFGNN_FAULT_AT";

/// Ends the process as a crash would (abort: no destructor, no cleanup, no
/// commit) when `OFFGNN_FAULT_AT` names `phase`; else does nothing. For the
/// end-to-end tests, which check that a crash at every phase boundary of a
/// commit leaves the previous output or the new one, whole, and that a
/// rerun succeeds. The variable is read once.
pub fn fault_point(phase: &str) {
    static AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let at = AT.get_or_init(|| std::env::var(FAULT_AT).ok());
    if at.as_deref() == Some(phase) {
        eprintln!("{FAULT_AT}={phase}: aborting here (an injected crash)");
        // Not dumpable: the injected crash leaves no core file behind; were
        // that refused, a core file is the only harm.
        let _ =
            rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
        std::process::abort();
    }
}

/// Takes an exclusive `flock` on `file` for as long as it is open (one
/// file one run writes in place, such as a metrics file); false where
/// another open of it holds one.
pub fn try_lock_file(file: &std::fs::File) -> bool {
    rustix::fs::flock(file, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_ok()
}

/// A local directory held by one process: an exclusive `flock` on
/// `DIR/.lock`, released when dropped (or when the process dies).
pub struct HeldDir {
    _lock: std::fs::File,
    dir: std::path::PathBuf,
    /// Whether taking it created the directory.
    created: bool,
}

impl Drop for HeldDir {
    /// Lets the directory go: removes the lock file and, where taking it
    /// created the directory and nothing else is left in it (a run done,
    /// or refused before it wrote), the directory. A process that opens
    /// the lock meanwhile finds it held and is refused, as while the work
    /// ran; a process killed leaves the lock file, which the next holder
    /// takes over.
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.dir.join(".lock"));
        if self.created {
            let _ = std::fs::remove_dir(&self.dir);
        }
    }
}

/// Takes the local directory `dir` for this process, creating it; where
/// another process holds it, refuses in one line: `why`, and that
/// process's id. For directories one run writes in place (a trainer's
/// checkpoints, an inference run's work), which two runs would corrupt.
pub fn hold_dir(dir: &std::path::Path, why: &str) -> Result<HeldDir> {
    use std::io::Write;
    let created = !dir.exists();
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let path = dir.join(".lock");
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| Error::io(&path, e))?;
    if rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
        let holder = std::fs::read_to_string(&path).unwrap_or_default();
        let holder = match holder.trim() {
            "" => "a process".to_string(),
            h => h.to_string(),
        };
        return Err(Error::InvalidArgument(format!(
            "{}: {why} ({holder} holds it)",
            dir.display()
        )));
    }
    // A holder that let the directory go removed the lock file it held:
    // a lock taken on that file, opened just before, holds nothing.
    use std::os::unix::fs::MetadataExt;
    let inode = |m: std::io::Result<std::fs::Metadata>| m.map(|m| (m.dev(), m.ino())).ok();
    if inode(file.metadata()) != inode(std::fs::metadata(&path)) {
        return Err(Error::InvalidArgument(format!(
            "{}: {why} (a process let it go just now; run again)",
            dir.display()
        )));
    }
    file.set_len(0)
        .and_then(|()| write!(file, "process {}", std::process::id()))
        .map_err(|e| Error::io(&path, e))?;
    Ok(HeldDir {
        _lock: file,
        dir: dir.to_path_buf(),
        created,
    })
}

/// How long a commit on an object store waits before it reads back who won.
const SETTLE: std::time::Duration = std::time::Duration::from_millis(250);

/// For a local store, an exclusive lock on `.NAME.lock` beside the commit
/// object, held until the returned file is dropped; `None` elsewhere.
fn local_lock(store: &Store, name: &str) -> Result<Option<std::fs::File>> {
    let Some(path) = store.local_file(name) else {
        return Ok(None);
    };
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let lock_path = path.with_file_name(format!(".{file_name}.lock"));
    if let Some(dir) = lock_path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| Error::io(&lock_path, e))?;
    // Blocks only while another run is between reading and writing the commit.
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| Error::io(&lock_path, e.into()))?;
    Ok(Some(file))
}

fn describe(commit: &Previous) -> String {
    match &commit.run_id {
        Some(id) => format!("run {id}"),
        None => "an earlier run".into(),
    }
}

/// The error of a run that lost the commit at `location` to `winner`, after
/// removing the `removed` objects it had written.
pub fn lost(location: &str, winner: &str, removed: usize) -> Error {
    Error::Store {
        kind: None,
        url: location.to_string(),
        fault: format!(
            "another run ({winner}) committed here first; this run removed the {removed} objects it wrote"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(run: &RunId) -> Vec<u8> {
        format!("{{\"run_id\":\"{run}\"}}").into_bytes()
    }

    #[test]
    fn run_ids_are_recognised_and_distinct() {
        let a = RunId::new();
        let b = RunId::new();
        assert_ne!(a, b);
        assert!(RunId::is_run_id(a.as_str()), "{a}");
        let d = RunId::derived(&[b"x", b"y"]);
        assert!(RunId::is_run_id(d.as_str()), "{d}");
        assert_eq!(d, RunId::derived(&[b"x", b"y"]));
        assert_ne!(d, RunId::derived(&[b"xy"]));
        for bad in ["", "r", "r12-xyz", "pack", "s123", "gpu_cache.bin"] {
            assert!(!RunId::is_run_id(bad), "{bad}");
        }
    }

    /// An in-memory store (object-store conditions) and a local directory
    /// (a lock beside the commit).
    fn stores() -> Vec<(Store, Option<tempfile::TempDir>)> {
        let dir = tempfile::tempdir().unwrap();
        let local = Store::open(dir.path().to_str().unwrap()).unwrap();
        vec![(Store::memory(), None), (local, Some(dir))]
    }

    #[test]
    fn the_first_create_wins_and_the_second_learns_who_won() {
        for (store, _dir) in stores() {
            first_create_wins(&store);
        }
    }

    fn first_create_wins(store: &Store) {
        let (a, b) = (RunId::new(), RunId::new());
        assert_eq!(
            commit(store, "c.json", body(&a), &a, None).unwrap(),
            Outcome::Committed
        );
        assert_eq!(
            commit(store, "c.json", body(&b), &b, None).unwrap(),
            Outcome::Lost {
                winner: format!("run {a}")
            }
        );
        // Committing again (a retry whose answer was lost) is no loss.
        assert_eq!(
            commit(store, "c.json", body(&a), &a, None).unwrap(),
            Outcome::Committed
        );
    }

    #[test]
    fn a_replacement_holds_only_while_the_old_commit_is_there() {
        for (store, _dir) in stores() {
            replacement_holds(&store);
        }
    }

    fn replacement_holds(store: &Store) {
        let (a, b, c) = (RunId::new(), RunId::new(), RunId::new());
        commit(store, "c.json", body(&a), &a, None).unwrap();
        let old = read(store, "c.json").unwrap().unwrap();
        assert_eq!(old.run_id.as_deref(), Some(a.as_str()));
        // b replaces a; c, which also read a's commit, then loses to b.
        assert_eq!(
            commit(store, "c.json", body(&b), &b, Some(&old)).unwrap(),
            Outcome::Committed
        );
        assert_eq!(
            commit(store, "c.json", body(&c), &c, Some(&old)).unwrap(),
            Outcome::Lost {
                winner: format!("run {b}")
            }
        );
        let now = read(store, "c.json").unwrap().unwrap();
        assert_eq!(now.run_id.as_deref(), Some(b.as_str()));
    }

    #[test]
    fn a_held_directory_is_refused_to_a_second_holder_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        let held = hold_dir(&work, "another run works there").unwrap();
        // flock locks belong to the open file, so a second open conflicts
        // even within this process.
        let err = hold_dir(&work, "another run works there")
            .err()
            .expect("a held directory is refused");
        let message = err.to_string();
        assert!(
            message.contains("another run works there")
                && message.contains(&format!("process {}", std::process::id())),
            "{message}"
        );
        drop(held);
        hold_dir(&work, "another run works there").expect("released with its holder");
    }

    #[test]
    fn a_directory_done_with_goes_where_its_holder_made_it_and_left_it_empty() {
        let dir = tempfile::tempdir().unwrap();
        let made = dir.path().join("made");
        drop(hold_dir(&made, "busy").unwrap());
        assert!(!made.exists());
        // One with files left keeps them; one the caller made stays.
        let kept = dir.path().join("kept");
        let held = hold_dir(&kept, "busy").unwrap();
        std::fs::write(kept.join("f"), b"x").unwrap();
        drop(held);
        assert!(kept.join("f").exists() && !kept.join(".lock").exists());
        let given = dir.path().join("given");
        std::fs::create_dir(&given).unwrap();
        drop(hold_dir(&given, "busy").unwrap());
        assert!(given.exists() && !given.join(".lock").exists());
    }
}
