//! A packing job's inputs (DiskGNN §4, pre-processing): the sampler's run
//! and the feature file, checked against each other, how the layout stores
//! the file's rows, and every batch loaded in training order with its
//! address-table record measured.

use offgnn_shared::address_table::{self, BatchTable};
use offgnn_shared::dataset::Split;
use offgnn_shared::samples::{RunSummary, SampleFile};
use offgnn_shared::store::Store;

use crate::error::{Error, Result};
use crate::feature_source::FeatureSource;
use crate::plan::BatchInfo;
use offgnn_manifests::Dtype;

/// The sampler's run and the feature file of one packing job.
pub(crate) struct Inputs {
    pub samples: Store,
    pub run: RunSummary,
    /// The run summary as stored, whose digest the manifest keeps.
    pub run_bytes: bytes::Bytes,
    pub features: FeatureSource,
}

impl Inputs {
    /// Opens the samples and the feature file and checks that they come
    /// from the same dataset.
    pub(crate) fn open(samples: &str, features: &str) -> Result<Inputs> {
        let samples = Store::open(samples)?;
        let run = RunSummary::read(&samples)?;
        if !run.dataset.node_types.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "{}: samples of a typed graph ({} node types): the packer does not pack typed graphs yet",
                samples.url(),
                run.dataset.node_types.len()
            )));
        }
        let run_bytes = samples.get(offgnn_shared::samples::RUN_SUMMARY)?;
        let features = FeatureSource::open(features)?;
        check_match(&run, &features)?;
        Ok(Inputs {
            samples,
            run,
            run_bytes,
            features,
        })
    }
}

/// How rows are read (as the feature file holds them) and laid out (as
/// `--store-dtype` says): every size in the plan is the layout's.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowFormat {
    pub from: Dtype,
    pub to: Dtype,
    /// Bytes of a row of the feature file, and of the layout.
    pub source_row_bytes: u64,
    pub row_bytes: u64,
}

impl RowFormat {
    /// The feature file's rows stored as `store_dtype` (`None`: as they are).
    pub(crate) fn of(features: &FeatureSource, store_dtype: Option<Dtype>) -> Result<Self> {
        let source_row_bytes = features.row_bytes();
        let from = features.store_dtype()?;
        let to = store_dtype.unwrap_or(from);
        let row_bytes = source_row_bytes / from.size() * to.size();
        if to != from {
            tracing::info!("rows are stored as {to}, converted from the feature file's {from}");
        }
        Ok(RowFormat {
            from,
            to,
            source_row_bytes,
            row_bytes,
        })
    }

    /// Whether rows are converted as they are read.
    pub(crate) fn converted(&self) -> bool {
        self.to != self.from
    }

    /// The feature file's bytes with its rows as the layout stores them. A
    /// disk budget's multiple is of these: with --store-dtype f16, `3x`
    /// gives the plan of a float32 layout at `3x`, in half the bytes (the
    /// same segments, with narrower rows).
    pub(crate) fn stored_file_bytes(&self, features: &FeatureSource) -> u64 {
        let num_nodes = features.num_rows();
        features.file_bytes() - num_nodes * self.source_row_bytes + num_nodes * self.row_bytes
    }
}

/// Reads every batch of the run, in the order the trainer consumes them:
/// training epochs in turn, then validation, then test, and measures each
/// batch's address-table record (its topology compressed as the table
/// writer will, and its addresses), which no plan changes: the disk budget
/// holds the tables before it holds feature rows. `loaders` threads each
/// fetch and decode one file at a time (what [`crate::memory::loading_memory`] counts),
/// its batches compressed in parallel on rayon's threads; the order is kept.
pub(crate) fn load_batches(
    store: &Store,
    run: &RunSummary,
    num_nodes: u64,
    loaders: usize,
    show: bool,
) -> Result<Vec<BatchInfo>> {
    use rayon::prelude::*;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let total: u64 = run.files.iter().map(|f| f.batches as u64).sum();
    let pb = offgnn_shared::progress::bar_if(show, total, "loading", "batches");
    let mut files = Vec::new();
    for split in Split::ALL {
        let epochs = run.counts.get(&split).map_or(0, |c| c.epochs);
        for epoch in 0..epochs {
            files.extend(
                run.files_of(split, epoch)
                    .into_iter()
                    .map(|f| (split, epoch, f)),
            );
        }
    }
    let load = |(split, epoch, file): (Split, u32, &SampleFile)| -> Result<Vec<BatchInfo>> {
        offgnn_shared::signals::check()?;
        let batches = offgnn_shared::samples::read_file(store, file)?;
        let infos: Vec<BatchInfo> = batches
            .into_par_iter()
            .map_init(
                || (Vec::new(), Vec::new()),
                |(scratch, frame), b| -> Result<BatchInfo> {
                    let t = BatchTable {
                        split: Some(split),
                        epoch,
                        index: b.index,
                        num_inputs: b.input_nodes.len() as u32,
                        labels: b.labels,
                        input_nodes: b.input_nodes,
                        blocks: b.blocks,
                        pairs: b.pairs,
                        ..Default::default()
                    };
                    address_table::topology_frame(&t, scratch, frame)
                        .map_err(|e| Error::io(file.object.name.as_str(), e))?;
                    let table_bytes = address_table::record_bytes(
                        frame.len() as u64,
                        t.input_nodes.len() as u64,
                        num_nodes,
                    ) + address_table::object_overhead(1)
                        - address_table::FOOTER;
                    Ok(BatchInfo {
                        split,
                        epoch,
                        index: t.index,
                        cold: Vec::new(),
                        inputs: t.input_nodes,
                        table_bytes,
                    })
                },
            )
            .collect::<Result<_>>()?;
        pb.inc(infos.len() as u64);
        Ok(infos)
    };
    // Each loader takes the next file; a failure stops the others at their
    // next file.
    let next = AtomicUsize::new(0);
    let slots: Vec<Mutex<Option<Result<Vec<BatchInfo>>>>> =
        files.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..loaders.clamp(1, files.len().max(1)) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&file) = files.get(i) else { break };
                    let loaded = load(file);
                    let failed = loaded.is_err();
                    *slots[i].lock().expect("a loader does not panic") = Some(loaded);
                    if failed {
                        next.store(files.len(), Ordering::Relaxed);
                    }
                }
            });
        }
    });
    pb.finish_and_clear();
    let mut out = Vec::with_capacity(total as usize);
    let mut skipped = false;
    for slot in slots {
        match slot.into_inner().expect("a loader does not panic") {
            Some(loaded) => out.extend(loaded?),
            // Skipped after another file failed, whose error comes below.
            None => skipped = true,
        }
    }
    if skipped {
        return Err(Error::InvalidArgument(
            "internal: a samples file was skipped, yet none failed".into(),
        ));
    }
    Ok(out)
}

/// Samples and features must come from the same dataset.
fn check_match(run: &RunSummary, features: &FeatureSource) -> Result<()> {
    let d = &run.dataset;
    let shape = &features.header().shape;
    if shape.len() != 2 || shape[0] != d.num_nodes || shape[1] != d.feature_dim {
        return Err(Error::Mismatch(format!(
            "{} has shape {:?}, the samples were drawn from a graph of {} nodes with {}-d features",
            features.describe(),
            shape,
            d.num_nodes,
            d.feature_dim
        )));
    }
    if features.dtype() != d.feature_dtype {
        return Err(Error::Mismatch(format!(
            "{} holds {}, the sampled dataset's features are {}",
            features.describe(),
            features.dtype(),
            d.feature_dtype
        )));
    }
    if features.fingerprint()? != d.feature_fingerprint {
        return Err(Error::Mismatch(format!(
            "{} is not the feature file of dataset '{}' that was sampled (fingerprints differ)",
            features.describe(),
            d.name
        )));
    }
    Ok(())
}
