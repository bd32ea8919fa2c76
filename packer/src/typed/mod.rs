//! Packing a typed graph: each node type with features gets a layout of
//! its own over its rows, at their own width and dtype (no row padded to
//! another type's), planned by the homogeneous planner (ranking, caches,
//! segment search, MinHash ordering, batched packing) under its share of
//! one disk budget and of the caches; the batches' typed topology is
//! written once beside them; one manifest commits it all.

mod budget;
mod topology;
mod verify;
mod view;

use std::time::Instant;

use offgnn_manifests::{self as manifests, NodeTypePart, TypedDatasetRef, TypedManifest};
use offgnn_shared::dataset::TypedDataset;
use offgnn_shared::samples::RunSummary;
use offgnn_shared::sizes::Budget;
use offgnn_shared::store::Store;
use serde::Serialize;

use crate::commit::Target;
use crate::error::{Error, Result};
use crate::job::{PackConfig, PackSummary, RankBy};
use crate::load::{Inputs, RowFormat, View, load_batches};
use crate::memory::Loading;

pub use verify::verify_typed;
pub(crate) use view::TypeView;

/// What a typed packing job did, as a whole and per node type.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TypedPackSummary {
    pub manifest: String,
    pub disk_budget: u64,
    pub disk_bytes: u64,
    /// The feature files' bytes as the layout stores their rows.
    pub feature_file_bytes: u64,
    pub blow_up: f64,
    pub topology_bytes: u64,
    pub node_types: Vec<TypePackSummary>,
    /// The statement of the type whose packing states the most (types are
    /// packed one after another); absent where no type has features.
    pub memory: Option<crate::memory::MemoryStatement>,
    pub load_seconds: f64,
    pub topology_seconds: f64,
    pub total_seconds: f64,
    pub leftovers_removed: offgnn_shared::lease::Swept,
}

/// One node type: its rows and, if it has features, the budgets it was
/// given and its layout's summary.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TypePackSummary {
    pub name: String,
    pub rows: u64,
    pub feature_dim: Option<u64>,
    pub store_dtype: Option<String>,
    pub gpu_cache_budget: u64,
    pub cpu_cache_budget: u64,
    pub disk_budget: u64,
    pub layout: Option<PackSummary>,
}

/// Whether the samples at `location` are of a typed graph.
pub fn is_typed_run(location: &str) -> Result<bool> {
    let store = Store::open_read(location)?;
    Ok(!RunSummary::read(&store)?.dataset.node_types.is_empty())
}

/// Packs a typed run. `cfg.features` is empty (every type's feature file
/// as the dataset names it) or `TYPE=PATH` entries, comma-separated, for
/// the types whose files are elsewhere. Stopped by SIGINT or SIGTERM, it
/// removes what it wrote and says so.
pub fn pack_typed(cfg: &PackConfig) -> Result<TypedPackSummary> {
    let result = pack_typed_run(cfg);
    match offgnn_shared::signals::received() {
        Some(signal) if result.is_err() => Err(Error::Stopped(format!(
            "stopped by {signal}: removed the objects this run wrote; nothing was committed (a layout committed at {} before is untouched)",
            offgnn_shared::store::redact(&cfg.out)
        ))),
        _ => result,
    }
}

fn pack_typed_run(cfg: &PackConfig) -> Result<TypedPackSummary> {
    let started = Instant::now();
    let samples = Store::open_read(&cfg.samples)?;
    let run = RunSummary::read(&samples)?;
    let run_bytes = samples.get(offgnn_shared::samples::RUN_SUMMARY)?;
    refuse_unsupported(cfg, &run)?;
    let views: Vec<TypeView> = run
        .dataset
        .node_types
        .iter()
        .enumerate()
        .filter(|(_, t)| t.feature_dim.is_some())
        .map(|(i, t)| TypeView::of(i, t, &run.dataset.target_type))
        .collect::<Result<_>>()?;
    warn_featureless(&run);
    let locations = feature_locations(&cfg.features, &run, &views)?;
    let parts: Vec<Inputs> = views
        .iter()
        .zip(&locations)
        .map(|(v, loc)| {
            Inputs::typed_part(
                samples.clone(),
                run.clone(),
                run_bytes.clone(),
                loc,
                v.clone(),
            )
        })
        .collect::<Result<_>>()?;
    let rows: Vec<RowFormat> = parts
        .iter()
        .map(|p| RowFormat::of(&p.features, cfg.store_dtype))
        .collect::<Result<_>>()?;
    let stored: Vec<u64> = parts
        .iter()
        .zip(&rows)
        .map(|(p, r)| r.stored_file_bytes(&p.features))
        .collect();
    let feature_file_bytes: u64 = stored.iter().sum();
    let disk_budget = cfg.disk_budget.resolve(feature_file_bytes);

    let target = Target::prepare(&cfg.out, cfg.overwrite)?;
    let written = target.run_objects();
    let loading = Loading::plan(cfg.memory, &run);
    let row_bytes: Vec<u64> = rows.iter().map(|r| r.row_bytes).collect();
    let (topology_batches, shares) = measure_and_split(
        cfg,
        (&samples, &run, &loading),
        (&views, &row_bytes, &stored),
        disk_budget,
    )?;
    crate::heap::release_freed();
    let load_seconds = started.elapsed().as_secs_f64();

    let mut type_summaries = Vec::new();
    let mut layouts = Vec::new();
    for (i, (view, inputs)) in views.iter().zip(&parts).enumerate() {
        let (layout, summary) = pack_type(cfg, inputs, &target, &shares.of(i), &loading)?;
        type_summaries.push(TypePackSummary {
            name: view.name.clone(),
            rows: u64::from(view.rows),
            feature_dim: Some(inputs.feature_dim()),
            store_dtype: Some(rows[i].to.name().to_string()),
            gpu_cache_budget: shares.gpu[i],
            cpu_cache_budget: shares.cpu[i],
            disk_budget: shares.disk[i],
            layout: Some(summary),
        });
        layouts.push(layout);
    }

    let t = Instant::now();
    let topology = topology::write(
        (&samples, &run),
        (&target.staging, &target.prefix),
        &topology_batches,
        cfg.show_progress,
    )?;
    target.upload_if_remote(&topology.objects, cfg.show_progress)?;
    let topology_seconds = t.elapsed().as_secs_f64();

    let manifest = typed_manifest(
        (&samples, &run, &run_bytes),
        &target,
        (layouts, topology),
        (disk_budget, feature_file_bytes),
    );
    manifest
        .validate()
        .map_err(|e| Error::InvalidArgument(format!("internal: the manifest is invalid: {e}")))?;
    if manifest.disk_bytes > disk_budget {
        return Err(Error::InvalidArgument(format!(
            "internal: the layout takes {} bytes, beyond the disk budget of {disk_budget}",
            manifest.disk_bytes
        )));
    }
    let body = serde_json::to_vec_pretty(&manifest).expect("manifests serialize");
    target.commit_body(written, body, manifest.objects.len())?;
    let memory = type_summaries
        .iter()
        .filter_map(|t| t.layout.as_ref().map(|l| l.memory.clone()))
        .max_by_key(|m| m.total_bytes);
    Ok(TypedPackSummary {
        memory,
        manifest: target.manifest_url(),
        disk_budget,
        disk_bytes: manifest.disk_bytes,
        feature_file_bytes,
        blow_up: manifest.blow_up,
        topology_bytes: manifest.topology.bytes,
        node_types: all_types(&run, type_summaries),
        load_seconds,
        topology_seconds,
        total_seconds: started.elapsed().as_secs_f64(),
        leftovers_removed: target.swept.clone(),
    })
}

/// Warns of each type without features: the layout holds none of its
/// rows, which the trainer's models need.
fn warn_featureless(run: &RunSummary) {
    for t in run
        .dataset
        .node_types
        .iter()
        .filter(|t| t.feature_dim.is_none())
    {
        tracing::warn!(
            "node type '{}' has no features, so the layout holds none of its rows: `trainer` (R-SAGE and R-GAT read every type's rows) refuses it; derive them first (sampler derive-features) unless your own model gives the type its rows (offgnn.Loader yields its node ids)",
            t.name
        );
    }
}

/// One pass over the samples measures the topology's records and each
/// type's, and counts each type's reads for the budgets' split; each
/// type's batches are loaded again when its turn comes, so that one type's
/// plan is in memory at a time. Returns the topology's batches and the
/// split.
fn measure_and_split(
    cfg: &PackConfig,
    (samples, run, loading): (&Store, &RunSummary, &Loading),
    (views, row_bytes, stored): (&[TypeView], &[u64], &[u64]),
    disk_budget: u64,
) -> Result<(Vec<crate::plan::BatchInfo>, budget::Shares)> {
    let mut load_views = vec![View::Topology];
    load_views.extend(views.iter().cloned().map(View::Type));
    let mut lists = load_batches(
        samples,
        run,
        (run.dataset.num_nodes, &load_views),
        loading.loaders,
        cfg.show_progress,
    )?;
    let topology_batches = lists.remove(0);
    let held: usize = lists.iter().flatten().map(|b| b.inputs.len()).sum();
    tracing::info!(
        "measured every type's batches: {} of input ids held while the budgets are split",
        offgnn_shared::report::human_bytes(held as u64 * 4)
    );
    let shares = budget::Shares::split(
        (views, &lists, row_bytes, stored),
        (cfg.gpu_cache, cfg.cpu_cache),
        disk_budget,
        topology::planned_bytes(&topology_batches),
    )?;
    Ok((topology_batches, shares))
}

/// What a typed run cannot be packed with yet, in one line each.
fn refuse_unsupported(cfg: &PackConfig, run: &RunSummary) -> Result<()> {
    if cfg.rank_by == RankBy::Graph {
        return Err(Error::InvalidArgument(
            "--rank-by graph ranks a homogeneous graph's rows; a typed graph's are ranked by its samples (--rank-by samples)"
                .into(),
        ));
    }
    if run.dataset.target_type.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "{}: the run summary does not name its target node type; sample the typed graph again with this sampler",
            cfg.samples
        )));
    }
    Ok(())
}

/// One node type's layout, under its budgets, its objects in a directory
/// of their own.
fn pack_type(
    cfg: &PackConfig,
    inputs: &Inputs,
    target: &Target,
    share: &budget::Share,
    loading: &Loading,
) -> Result<(manifests::Manifest, PackSummary)> {
    let view = inputs.view.as_ref().expect("a typed part has its view");
    tracing::info!(
        "node type '{}': {} rows of {} values, disk budget {}, GPU cache {}, CPU cache {}",
        view.name,
        view.rows,
        inputs.feature_dim(),
        share.disk,
        share.gpu,
        share.cpu
    );
    let started = Instant::now();
    let dir = target.staging.join(view.prefix(&target.prefix));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(dir.display(), e))?;
    let batches = load_batches(
        &inputs.samples,
        &inputs.run,
        (u64::from(view.rows), &[View::Type(view.clone())]),
        loading.loaders,
        cfg.show_progress,
    )?
    .pop()
    .expect("one list per view");
    crate::heap::release_freed();
    let load_seconds = started.elapsed().as_secs_f64();
    let type_cfg = PackConfig {
        features: inputs.features.describe(),
        gpu_cache: share.gpu,
        cpu_cache: share.cpu,
        disk_budget: Budget::Bytes(share.disk),
        ..cfg.clone()
    };
    let packed = crate::pack::pack_part(&type_cfg, inputs, target, batches, loading);
    let (layout, mut summary) = packed.map_err(|e| match e {
        Error::InvalidArgument(_) | Error::Plan(_) => {
            Error::InvalidArgument(format!("node type '{}': {e}", view.name))
        }
        e => e,
    })?;
    // The type's part of the job: its batches loaded, then its layout;
    // the manifest is the typed layout's.
    summary.manifest = target.manifest_url();
    summary.load_seconds = load_seconds;
    summary.total_seconds = started.elapsed().as_secs_f64();
    Ok((layout, summary))
}

/// Every type's feature file: as the dataset names it, or as `given`
/// (`TYPE=PATH`, comma-separated) names it.
fn feature_locations(given: &str, run: &RunSummary, views: &[TypeView]) -> Result<Vec<String>> {
    let mut named: Vec<(String, String)> = Vec::new();
    for entry in given.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((t, path)) = entry.split_once('=') else {
            return Err(Error::InvalidArgument(format!(
                "--features '{entry}': samples of a typed graph take TYPE=PATH for each type whose feature file is not where the dataset names it"
            )));
        };
        if !views.iter().any(|v| v.name == t) {
            return Err(Error::InvalidArgument(format!(
                "--features {t}=...: '{t}' is not a node type with features ({})",
                views
                    .iter()
                    .map(|v| v.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        named.push((t.to_string(), path.to_string()));
    }
    let mut dataset: Option<TypedDataset> = None;
    views
        .iter()
        .map(|v| {
            if let Some((_, path)) = named.iter().find(|(t, _)| *t == v.name) {
                return Ok(path.clone());
            }
            if dataset.is_none() {
                dataset = Some(TypedDataset::open(&run.dataset.location).map_err(|e| {
                    Error::InvalidArgument(format!(
                        "the sampled dataset at {} names the feature files, and it cannot be opened ({e}); give them as --features TYPE=PATH,...",
                        run.dataset.location
                    ))
                })?);
            }
            let ds = dataset.as_ref().expect("opened above");
            let file = ds.node_types[v.index].features.as_ref().ok_or_else(|| {
                Error::Mismatch(format!(
                    "node type '{}' has no feature file in {}, yet it had one when it was sampled",
                    v.name, run.dataset.location
                ))
            })?;
            Ok(file.path().display().to_string())
        })
        .collect()
}

/// The typed manifest: the dataset, the samples, each type's layout, the
/// topology, every object.
fn typed_manifest(
    (samples, run, run_bytes): (&Store, &RunSummary, &bytes::Bytes),
    target: &Target,
    (mut layouts, topology): (Vec<manifests::Manifest>, topology::Written),
    (disk_budget, feature_file_bytes): (u64, u64),
) -> TypedManifest {
    let d = &run.dataset;
    let mut objects = Vec::new();
    let mut node_types = Vec::with_capacity(d.node_types.len());
    layouts.reverse();
    for t in &d.node_types {
        let layout = t
            .feature_dim
            .map(|_| layouts.pop().expect("a layout per featured type"));
        if let Some(l) = &layout {
            objects.extend(l.objects.iter().cloned());
        }
        node_types.push(NodeTypePart {
            name: t.name.clone(),
            offset: t.offset,
            rows: t.num,
            feature_dim: layout.as_ref().map(|l| l.dataset.feature_dim),
            dtype: layout.as_ref().map(|l| l.dataset.store_dtype()),
            layout,
        });
    }
    objects.extend(topology.objects.iter().cloned());
    let disk_bytes: u64 = objects.iter().map(|o| o.size).sum();
    TypedManifest {
        format_version: manifests::TYPED_FORMAT_VERSION,
        run_id: target.run_id.to_string(),
        created_by: format!("offgnn packer {}", env!("CARGO_PKG_VERSION")),
        dataset: TypedDatasetRef {
            name: d.name.clone(),
            num_nodes: d.num_nodes,
            dataset_fingerprint: d.fingerprint.clone(),
            num_classes: d.num_classes,
            target_type: d.target_type.clone(),
            link_relation: d.link_relation.clone(),
        },
        samples: crate::commit::samples_ref_of(run, run_bytes, samples),
        node_types,
        relations: d.relations.clone(),
        topology: topology.topology,
        objects,
        disk_budget,
        disk_bytes,
        feature_file_bytes,
        blow_up: disk_bytes as f64 / feature_file_bytes.max(1) as f64,
    }
}

/// Every node type's summary, those without features among them.
fn all_types(run: &RunSummary, packed: Vec<TypePackSummary>) -> Vec<TypePackSummary> {
    let mut packed = packed.into_iter().peekable();
    run.dataset
        .node_types
        .iter()
        .map(|t| match packed.next_if(|p| p.name == t.name) {
            Some(p) => p,
            None => TypePackSummary {
                name: t.name.clone(),
                rows: t.num,
                ..Default::default()
            },
        })
        .collect()
}
