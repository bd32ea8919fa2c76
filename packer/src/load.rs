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
use crate::typed::TypeView;
use offgnn_manifests::Dtype;

/// The sampler's run and the feature file of one packing job.
pub(crate) struct Inputs {
    pub samples: Store,
    pub run: RunSummary,
    /// The run summary as stored, whose digest the manifest keeps.
    pub run_bytes: bytes::Bytes,
    pub features: FeatureSource,
    /// In a typed run, the node type whose rows `features` holds.
    pub view: Option<TypeView>,
}

impl Inputs {
    /// Opens the samples and the feature file and checks that they come
    /// from the same dataset.
    pub(crate) fn open(samples: &str, features: &str) -> Result<Inputs> {
        let samples = Store::open_read(samples)?;
        let run = RunSummary::read(&samples)?;
        if !run.dataset.node_types.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "{}: samples of a typed graph ({} node types): pack them as one (crate::typed::pack_typed)",
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
            view: None,
        })
    }

    /// One node type of a typed run: its feature file, checked against
    /// what the run recorded of the type.
    pub(crate) fn typed_part(
        samples: Store,
        run: RunSummary,
        run_bytes: bytes::Bytes,
        features: &str,
        view: TypeView,
    ) -> Result<Inputs> {
        let features = FeatureSource::open(features)?;
        check_type_match(&run, &view, &features)?;
        Ok(Inputs {
            samples,
            run,
            run_bytes,
            features,
            view: Some(view),
        })
    }

    /// The width of the feature file's rows, in values.
    pub(crate) fn feature_dim(&self) -> u64 {
        self.features.header().shape.get(1).copied().unwrap_or(0)
    }

    /// The fingerprint the run recorded of the feature file.
    pub(crate) fn feature_fingerprint(&self) -> String {
        match &self.view {
            None => self.run.dataset.feature_fingerprint.clone(),
            Some(v) => self.run.dataset.node_types[v.index]
                .feature_fingerprint
                .clone()
                .unwrap_or_default(),
        }
    }
}

/// How the loaded batches are seen: whole, as one node type's rows, or
/// only for their typed topology (whose table record is its frame).
#[derive(Clone, Debug)]
pub(crate) enum View {
    Whole,
    Type(TypeView),
    Topology,
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

/// Checks that every seed's label is a class of the run's dataset: the
/// trainer indexes its output by them, and a label past the classes would
/// fail deep in libtorch without naming the file.
fn check_labels(
    batches: &[offgnn_shared::samples::SampledBatch],
    num_classes: u32,
) -> std::result::Result<(), String> {
    for b in batches {
        if let Some(l) = b.labels.iter().find(|&&l| l >= num_classes) {
            return Err(format!(
                "batch {} of {} epoch {} labels a seed {l}, out of range for the run's {num_classes} classes",
                b.index,
                b.split.name(),
                b.epoch
            ));
        }
    }
    Ok(())
}

/// Reads every batch of the run, in the order the trainer consumes them:
/// training epochs in turn, then validation, then test, and measures each
/// batch's address-table record (its topology compressed as the table
/// writer will, and its addresses), which no plan changes: the disk budget
/// holds the tables before it holds feature rows. `loaders` threads each
/// fetch and decode one file at a time (what [`crate::memory::loading_memory`] counts),
/// its batches compressed in parallel on rayon's threads; the order is kept.
/// Each of `views` gets its own list (one decoding serves them all).
pub(crate) fn load_batches(
    store: &Store,
    run: &RunSummary,
    (num_nodes, views): (u64, &[View]),
    loaders: usize,
    show: bool,
) -> Result<Vec<Vec<BatchInfo>>> {
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
    let load = |(split, epoch, file): (Split, u32, &SampleFile)| -> Result<Vec<Vec<BatchInfo>>> {
        offgnn_shared::signals::check()?;
        let batches = offgnn_shared::samples::read_file(store, file)?;
        check_labels(&batches, run.dataset.num_classes).map_err(|fault| {
            let url = store.url();
            Error::InvalidArgument(format!(
                "{}/{}: {fault}",
                url.trim_end_matches('/'),
                file.object.name
            ))
        })?;
        let infos: Vec<Vec<BatchInfo>> = batches
            .into_par_iter()
            .map_init(
                || (Vec::new(), Vec::new()),
                |(scratch, frame), b| -> Result<Vec<BatchInfo>> {
                    // The type views copy their rows; the one whole view
                    // (or the topology's) takes the batch itself.
                    let mut infos: Vec<Option<BatchInfo>> = views.iter().map(|_| None).collect();
                    let mut measure = |v: &View, b| {
                        measure(v, b, (split, epoch), num_nodes, (scratch, frame))
                            .map_err(|e| Error::io(file.object.name.as_str(), e))
                    };
                    for (i, v) in views.iter().enumerate() {
                        if let View::Type(t) = v {
                            infos[i] = Some(measure(v, t.batch(&b))?);
                        }
                    }
                    let mut whole = Some(b);
                    for (i, v) in views.iter().enumerate() {
                        if !matches!(v, View::Type(_)) {
                            let b = whole.take().expect("at most one view sees whole batches");
                            infos[i] = Some(measure(v, b)?);
                        }
                    }
                    Ok(infos
                        .into_iter()
                        .map(|i| i.expect("every view measured"))
                        .collect())
                },
            )
            .collect::<Result<_>>()?;
        pb.inc(infos.len() as u64);
        Ok(infos)
    };
    // Each loader takes the next file; a failure stops the others at their
    // next file.
    let next = AtomicUsize::new(0);
    // Each file's batches, as each view sees them.
    type Loaded = Result<Vec<Vec<BatchInfo>>>;
    let slots: Vec<Mutex<Option<Loaded>>> = files.iter().map(|_| Mutex::new(None)).collect();
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
    let mut out: Vec<Vec<BatchInfo>> = views
        .iter()
        .map(|_| Vec::with_capacity(total as usize))
        .collect();
    let mut skipped = false;
    for slot in slots {
        match slot.into_inner().expect("a loader does not panic") {
            Some(loaded) => {
                for per_view in loaded? {
                    for (list, info) in out.iter_mut().zip(per_view) {
                        list.push(info);
                    }
                }
            }
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

/// One batch as `view` sees it, with its table record's bytes: its
/// topology compressed as the table writer will, and its addresses.
fn measure(
    view: &View,
    b: offgnn_shared::samples::SampledBatch,
    (split, epoch): (Split, u32),
    num_nodes: u64,
    (scratch, frame): (&mut Vec<u8>, &mut Vec<u8>),
) -> std::io::Result<BatchInfo> {
    let rows = match view {
        View::Whole | View::Topology => num_nodes,
        View::Type(v) => u64::from(v.rows),
    };
    let t = BatchTable::topology(b, split, epoch);
    match view {
        View::Topology => address_table::typed_topology_frame(&t, scratch, frame)?,
        _ => address_table::topology_frame(&t, scratch, frame)?,
    }
    let (table_bytes, inputs) = match view {
        View::Topology => (
            frame.len() as u64 + address_table::object_overhead(1) - address_table::FOOTER,
            Vec::new(),
        ),
        _ => (
            address_table::record_bytes(frame.len() as u64, t.input_nodes.len() as u64, rows)
                + address_table::object_overhead(1)
                - address_table::FOOTER,
            t.input_nodes,
        ),
    };
    Ok(BatchInfo {
        split,
        epoch,
        index: t.index,
        cold: Vec::new(),
        inputs,
        table_bytes,
    })
}

/// A typed run's node type and its feature file must agree with what the
/// run recorded.
fn check_type_match(run: &RunSummary, view: &TypeView, features: &FeatureSource) -> Result<()> {
    let t = &run.dataset.node_types[view.index];
    let shape = &features.header().shape;
    let (Some(dim), Some(dtype), Some(fingerprint)) = (
        t.feature_dim,
        t.feature_dtype,
        t.feature_fingerprint.as_ref(),
    ) else {
        return Err(Error::Mismatch(format!(
            "node type '{}' had no features when it was sampled, yet {} is given for it",
            t.name,
            features.describe()
        )));
    };
    if shape.len() != 2 || shape[0] != t.num || shape[1] != dim {
        return Err(Error::Mismatch(format!(
            "{} has shape {shape:?}, the sampled graph's '{}' nodes are {} with {dim}-d features",
            features.describe(),
            t.name,
            t.num
        )));
    }
    if features.dtype() != dtype {
        return Err(Error::Mismatch(format!(
            "{} holds {}, the sampled '{}' features are {dtype}",
            features.describe(),
            features.dtype(),
            t.name
        )));
    }
    if &features.fingerprint()? != fingerprint {
        return Err(Error::Mismatch(format!(
            "{} is not the '{}' feature file of dataset '{}' that was sampled (fingerprints differ)",
            features.describe(),
            t.name,
            run.dataset.name
        )));
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use offgnn_shared::samples::{Pairs, SampledBatch};

    #[test]
    fn a_label_past_the_classes_is_refused_with_its_batch() {
        let batch = |labels: Vec<u32>| SampledBatch {
            split: Split::Train,
            epoch: 2,
            index: 5,
            seeds: vec![0, 1],
            labels,
            input_nodes: vec![0, 1],
            blocks: Vec::new(),
            pairs: Pairs::default(),
        };
        assert_eq!(check_labels(&[batch(vec![0, 6])], 7), Ok(()));
        let e = check_labels(&[batch(vec![0, 7])], 7).unwrap_err();
        assert!(
            e.contains("batch 5 of train epoch 2") && e.contains("7 classes"),
            "{e}"
        );
    }
}
