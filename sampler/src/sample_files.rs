//! A sampling run's files: every batch of the plan sampled on the pool,
//! in windows that run on from one file into the next, and streamed into
//! Parquet objects by a writer thread, each file finished on a thread of
//! its own ([`write_units`]); a file that failed is made again, and a run
//! that fails for good leaves what [`abandon`] says.

use std::sync::Mutex;
use std::sync::mpsc::{Receiver, sync_channel};
use std::time::Instant;

use offgnn_shared::commit::RunId;
use offgnn_shared::report::human_bytes;
use offgnn_shared::samples::{self, SampleFile};
use offgnn_shared::store::{ObjectWriter, Store};
use rayon::prelude::*;

use crate::batches::{Batch, Task, Unit};
use crate::config::SampleConfig;
use crate::error::{Error, Result};
use crate::input::Graph;
use crate::neighbor_sampling::Scratch;
use crate::parquet_out::{Encoded, Encoder};
use crate::sample_run::remove_run;

/// Samples and writes this shard's files in plan order; returns them with
/// the seconds sampling took. After a store failure the first unfinished
/// file is made again from its start, with the files after it: a multipart
/// upload cannot resend one failed part, and sampling is deterministic
/// (the store's own requests were retried already). On a failure for
/// good, see [`abandon`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_units(
    store: &Store,
    task: &Task,
    graph: &Graph,
    cfg: &SampleConfig,
    run_id: &RunId,
    units: &[Unit],
    pool: &rayon::ThreadPool,
    previous_committed: bool,
) -> Result<(Vec<SampleFile>, f64)> {
    let total: u64 = units.iter().map(|u| u.batches.len() as u64).sum();
    let bar = offgnn_shared::progress::bar_if(cfg.show_progress, total, "sampling", "batches");
    let scratch = Mutex::new(Vec::<Scratch>::new());
    let sample_started = Instant::now();
    let mut files: Vec<SampleFile> = Vec::with_capacity(units.len());
    let mut wait = std::time::Duration::from_millis(500);
    let mut attempt = 1;
    while files.len() < units.len() {
        let rest = &units[files.len()..];
        let (done, written) = write_stream(
            store,
            (task, graph),
            cfg,
            run_id,
            rest,
            pool,
            &scratch,
            &bar,
        );
        if !done.is_empty() {
            // A file's tries count from its own first.
            (attempt, wait) = (1, std::time::Duration::from_millis(500));
        }
        files.extend(done);
        match written {
            // Every unit has a batch (the plan makes none without), so a
            // stream that ends well has finished every file.
            Ok(()) => assert_eq!(files.len(), units.len(), "every file finished"),
            Err(e @ (Error::Write { .. } | Error::Shared(_)))
                if attempt < WRITE_ATTEMPTS
                    && offgnn_shared::signals::received().is_none()
                    && e.io_kind() != Some(std::io::ErrorKind::StorageFull) =>
            {
                tracing::warn!("{e}; writing the file again in {wait:?}");
                bar.set_position(files.iter().map(|f| u64::from(f.batches)).sum());
                std::thread::sleep(wait);
                wait *= 2;
                attempt += 1;
            }
            Err(e) => return Err(abandon(store, cfg, run_id, previous_committed, e)),
        }
    }
    bar.finish_and_clear();
    Ok((files, sample_started.elapsed().as_secs_f64()))
}

/// After a file failed for good: removes an unsharded run's objects, and
/// turns a stop by a signal or a full disk into one line that says what
/// became of what the run wrote; any other failure is returned as it is.
pub(crate) fn abandon(
    store: &Store,
    cfg: &SampleConfig,
    run_id: &RunId,
    previous_committed: bool,
    e: Error,
) -> Error {
    // A full disk: how full, before this run's objects go.
    let full = e.io_kind() == Some(std::io::ErrorKind::StorageFull);
    let free = store
        .local_file("")
        .filter(|_| full)
        .and_then(|d| offgnn_shared::io_engine::free_bytes(&d).ok())
        .map(|b| format!("; {} free there", human_bytes(b)))
        .unwrap_or_default();
    // A shard's files are rewritten by its rerun; an unsharded
    // run's would never be read again.
    let removed = (cfg.num_shards == 1).then(|| remove_run(store, run_id));
    if let Some(signal) = offgnn_shared::signals::received() {
        let untouched = if previous_committed {
            " (the run committed here before is untouched)"
        } else {
            ""
        };
        return Error::Ended(match removed {
            Some(n) => format!(
                "stopped by {signal}: removed the {n} objects this run wrote; nothing was committed{untouched}"
            ),
            None => format!(
                "stopped by {signal}: shard {}'s files stay under {} until a rerun of the shard rewrites them; nothing was committed{untouched}",
                cfg.shard,
                store.join(&format!("samples/{run_id}"))
            ),
        });
    }
    if full {
        let removed = removed
            .map(|n| format!("; removed the {n} objects this run wrote"))
            .unwrap_or_default();
        return Error::Ended(format!("{e}{free}{removed}"));
    }
    e
}

/// Tries of one output file.
const WRITE_ATTEMPTS: u32 = 4;

/// Samples `units`' batches in parallel windows of 2 x threads, which run
/// on from one file's batches into the next's, and streams them to
/// [`write_files`] on a thread of its own: the pool does not wait while a
/// file is finished, nor sample a small file's one batch on one thread.
/// Returns the files finished, in order, and what stopped the others.
#[allow(clippy::too_many_arguments)]
fn write_stream(
    store: &Store,
    (task, graph): (&Task, &Graph),
    cfg: &SampleConfig,
    run_id: &RunId,
    units: &[Unit],
    pool: &rayon::ThreadPool,
    scratch: &Mutex<Vec<Scratch>>,
    bar: &indicatif::ProgressBar,
) -> (Vec<SampleFile>, Result<()>) {
    let window = (cfg.threads * 2).max(2);
    // Every batch as (its unit, its index in the unit's split and epoch).
    let batches: Vec<(usize, u32, &Batch)> = (units.iter().enumerate())
        .flat_map(|(u, unit)| {
            (unit.batches.iter().enumerate()).map(move |(k, b)| (u, unit.first_batch + k as u32, b))
        })
        .collect();
    let (tx, rx) = sync_channel::<Vec<(usize, Encoded)>>(1);
    std::thread::scope(|s| {
        let writer = s.spawn(move || write_files(store, run_id, units, pool, rx));
        let mut sampled = Ok(());
        for chunk in batches.chunks(window) {
            let encoded: Result<Vec<(usize, Encoded)>> = pool.install(|| {
                (chunk.par_iter())
                    .map(|&(u, index, batch)| {
                        let unit = &units[u];
                        let mut mine = scratch
                            .lock()
                            .expect("scratch pool")
                            .pop()
                            .unwrap_or_else(|| Scratch::new(graph.num_nodes()));
                        let batch = task.sample(cfg, graph, (unit, index, batch), &mut mine);
                        scratch.lock().expect("scratch pool").push(mine);
                        let encoded = Encoded::new(batch)
                            .map_err(|e| write_error(store.url(), &file_name(run_id, unit), e))?;
                        Ok((u, encoded))
                    })
                    .collect()
            });
            match encoded {
                Ok(encoded) => {
                    bar.inc(encoded.len() as u64);
                    if tx.send(encoded).is_err() {
                        break; // the writer failed; its error is returned below
                    }
                }
                Err(e) => {
                    sampled = Err(e);
                    break;
                }
            }
            if offgnn_shared::signals::received().is_some() {
                break; // stopped: the open file is abandoned, and removed
            }
        }
        drop(tx);
        let (files, written) = writer.join().expect("the writer thread does not panic");
        let stopped = sampled
            .and(written)
            .and_then(|()| Ok(offgnn_shared::signals::check()?));
        (files, stopped)
    })
}

/// The writer thread of [`write_stream`]: appends each batch to its file,
/// opened at its first batch. A file that has all its batches is finished
/// (its last row group closed, its bytes hashed and stored) on a thread of
/// its own while the next file's batches come in, one file at a time: the
/// memory statement counts two files' buffers. A file that the stream
/// leaves unfinished is dropped, which removes what it wrote.
fn write_files(
    store: &Store,
    run_id: &RunId,
    units: &[Unit],
    pool: &rayon::ThreadPool,
    rx: Receiver<Vec<(usize, Encoded)>>,
) -> (Vec<SampleFile>, Result<()>) {
    std::thread::scope(|s| {
        let mut files = Vec::with_capacity(units.len());
        let mut finishing: Option<std::thread::ScopedJoinHandle<Result<SampleFile>>> = None;
        let mut open: Option<OpenFile> = None;
        let mut written = Ok(());
        let mut join = |finishing: &mut Option<std::thread::ScopedJoinHandle<_>>| {
            let Some(handle) = finishing.take() else {
                return Ok(());
            };
            let file = handle.join().expect("a file's finisher does not panic")?;
            files.push(file);
            Ok(())
        };
        'stream: for encoded in rx {
            for (u, batch) in encoded {
                let file = match open.take() {
                    Some(file) => file,
                    None => match OpenFile::new(store, run_id, (u, &units[u]), pool) {
                        Ok(file) => file,
                        Err(e) => {
                            written = Err(e);
                            break 'stream;
                        }
                    },
                };
                assert_eq!(file.index, u, "a file's batches come in order, together");
                let file = match file.write(batch) {
                    Ok(file) => file,
                    Err(e) => {
                        written = Err(e);
                        break 'stream;
                    }
                };
                if file.written < file.unit.batches.len() {
                    open = Some(file);
                    continue;
                }
                if let Err(e) = join(&mut finishing) {
                    written = Err(e);
                    break 'stream;
                }
                finishing = Some(s.spawn(move || file.finish()));
            }
        }
        drop(open);
        let last = join(&mut finishing);
        (files, written.and(last))
    })
}

/// One samples file being written by [`write_files`].
struct OpenFile<'a> {
    /// The unit's place in the stream's units.
    index: usize,
    unit: &'a Unit,
    name: String,
    url: String,
    encoder: Encoder<'a, ObjectWriter>,
    edges: u64,
    inputs: u64,
    written: usize,
}

impl<'a> OpenFile<'a> {
    fn new(
        store: &Store,
        run_id: &RunId,
        (index, unit): (usize, &'a Unit),
        pool: &'a rayon::ThreadPool,
    ) -> Result<Self> {
        let name = file_name(run_id, unit);
        let encoder = Encoder::new(store.writer(&name)?, pool)
            .map_err(|e| write_error(store.url(), &name, e))?;
        Ok(OpenFile {
            index,
            unit,
            url: store.url().to_string(),
            name,
            encoder,
            edges: 0,
            inputs: 0,
            written: 0,
        })
    }

    fn write(mut self, batch: Encoded) -> Result<Self> {
        self.edges += batch.edges;
        self.inputs += batch.inputs;
        self.written += 1;
        let (url, name) = (&self.url, &self.name);
        (self.encoder.write(batch)).map_err(|e| write_error(url, name, e))?;
        Ok(self)
    }

    fn finish(self) -> Result<SampleFile> {
        let Self {
            unit,
            name,
            url,
            encoder,
            edges,
            inputs,
            ..
        } = self;
        let object = encoder.finish().map_err(|e| write_error(&url, &name, e))?;
        Ok(SampleFile {
            object: object.finish()?,
            split: unit.split,
            epoch: unit.epoch,
            first_batch: unit.first_batch,
            batches: unit.batches.len() as u32,
            edges,
            input_nodes: inputs,
        })
    }
}

/// The name of `unit`'s samples file.
fn file_name(run_id: &RunId, unit: &Unit) -> String {
    samples::file_name(run_id.as_str(), unit.split, unit.epoch, unit.part)
}

/// A samples file's encoding or writing failed.
fn write_error(url: &str, name: &str, e: parquet::errors::ParquetError) -> Error {
    Error::Write {
        file: format!("{}/{name}", url.trim_end_matches('/')),
        fault: e.to_string(),
        kind: offgnn_shared::error::io_kind_in(&e),
    }
}
