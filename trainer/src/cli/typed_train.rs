//! `trainer --manifest` on a typed graph's layout: R-SAGE (`--model sage`)
//! or R-GAT (`--model gat`), alone or as ranks of a torchrun or srun
//! launch, its rows from the packed layout or (`--features naive|memory`)
//! from each type's feature file.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use offgnn_manifests::{MANIFEST, TypedManifest};
use offgnn_shared::io_engine::IoEngine;
use offgnn_shared::report::{human_bytes, print_summary};

use super::train::{OnOff, TrainArgs};
use crate::distributed::Launch;
use crate::hetero::RelationalKind;
use crate::hetero::Schema;
use crate::hetero::train::{
    TypedEpoch, TypedLayout, TypedTrainConfig, TypedTrainSummary, model_config, train_typed,
};
use crate::memory::MemoryEstimate;
use crate::model::ModelKind;
use crate::pipeline::FeatureMode;
use crate::train::Ranks;

/// A typed layout at the location `--manifest` gave.
pub(super) struct TypedSource {
    /// Where its objects are read (a remote layout's staged copy).
    pub(super) dir: PathBuf,
    /// Its manifest.
    pub(super) bytes: Vec<u8>,
    /// Where its manifest is, as checkpoints record it: a local file's
    /// absolute path, or the URL without its credentials.
    pub(super) location: String,
}

/// The layout at `location` when it is a typed one: a local one read in
/// place, a remote one staged into `--local-dir` first.
pub(super) fn typed_layout(location: &str, a: &TrainArgs) -> anyhow::Result<Option<TypedSource>> {
    let location = location.trim_start_matches("file://");
    if location.contains("://") {
        let engine = IoEngine::new(super::train::io_options(a));
        let staged = crate::staging::stage_typed(location, a.local_dir.as_deref(), &engine, true)?;
        return Ok(staged.map(|(dir, bytes)| TypedSource {
            dir,
            bytes,
            location: offgnn_shared::store::redact(location),
        }));
    }
    let path = Path::new(location);
    let (dir, file) = if location.ends_with(".json") {
        (
            path.parent().unwrap_or(Path::new(".")).to_path_buf(),
            path.to_path_buf(),
        )
    } else {
        (path.to_path_buf(), path.join(MANIFEST))
    };
    let Ok(bytes) = std::fs::read(&file) else {
        // Not readable here: the homogeneous path says why.
        return Ok(None);
    };
    if !offgnn_manifests::is_typed(&bytes) {
        return Ok(None);
    }
    if let Some(local) = &a.local_dir {
        tracing::warn!(
            "--local-dir {} is not used: the layout in {} is local and is read in place",
            local.display(),
            dir.display()
        );
    }
    let location = std::path::absolute(&file)
        .map_or(file, |f| f)
        .display()
        .to_string();
    Ok(Some(TypedSource {
        dir,
        bytes,
        location,
    }))
}

/// Trains the typed layout `src`.
pub(super) fn train_typed_command(
    a: &TrainArgs,
    (device, kind, hidden): (tch::Device, ModelKind, i64),
    launch: Option<&Launch>,
    src: &TypedSource,
) -> anyhow::Result<()> {
    let (dir, bytes) = (src.dir.as_path(), src.bytes.as_slice());
    let group = super::train::join_group(launch, device, a.dist_timeout)?;
    let writer = group.as_ref().is_none_or(|g| g.rank == 0);
    let kind = match kind {
        ModelKind::Sage => RelationalKind::Rsage,
        ModelKind::Gat => RelationalKind::Rgat,
        ModelKind::Mlp => anyhow::bail!(
            "--model mlp reads one feature matrix; a typed layout trains R-SAGE (--model sage) or R-GAT (--model gat)"
        ),
    };
    let origin = dir.join(MANIFEST).display().to_string();
    let manifest = TypedManifest::parse(&origin, bytes)?;
    super::train::warn_without_validation(&manifest.topology.schedule);
    let scorer = typed_scorer(a, &manifest, &origin)?;
    let cfg = TypedTrainConfig {
        scorer,
        kind,
        hidden,
        heads: a.heads,
        dropout: a.dropout,
        root_weight: a.root_weight,
        init: linear_init(a.init.as_deref(), kind, scorer.is_some())?,
        lr: a.lr,
        epochs: a.epochs,
        seed: a.seed,
        device,
        max_batches: a.max_batches,
        pipelined: a.pipeline == OnOff::On,
        checkpoint_dir: a.checkpoint_dir.clone(),
        historical: a.historical.clone(),
        layout_location: Some(src.location.clone()),
        checkpoint_every: a.checkpoint_every,
        resume: a.resume,
        overwrite: a.overwrite,
        export: a
            .export
            .as_ref()
            .map(|location| crate::train::ExportTarget {
                location: location.clone(),
                overwrite: a.overwrite,
                last: a.export_last,
            }),
        show_progress: writer,
        dump: a.dump_batches.clone().map(|path| crate::train::DumpTarget {
            path,
            batches: a.dump_count,
        }),
    };
    let world = group
        .as_ref()
        .map_or(a.emulate_ranks.unwrap_or(1), |g| g.world);
    check_flags(a, (&cfg, &manifest), world)?;
    let engine = IoEngine::new(super::train::io_options(a));
    let (engine, _) = super::train::engine_for_disk((dir, &manifest.objects), engine, a);
    let memory = state_memory(&manifest, &cfg, a)?;
    let layout = TypedLayout::open(dir, manifest, &engine, (a.features.mode(), device), writer)
        .with_context(|| format!("opening {origin}"))?;
    let mut metrics = if writer { open_metrics(a)? } else { None };
    let mut failed = None;
    let mut on_epoch = |e: &TypedEpoch| {
        if !writer {
            return;
        }
        let acc = |a: Option<f64>| a.map_or("-".to_string(), |a| format!("{a:.4}"));
        println!(
            "epoch {:>3}  {:>7.2}s (train {:.2}s: fetch {:.2}s, waited {:.2}s, assembly {:.2}s, steps {:.2}s)  loss {:.4}  train {:.4}  valid {}  test {}  disk {}",
            e.epoch,
            e.seconds,
            e.train_seconds,
            e.stages.fetch,
            e.stages.wait,
            e.stages.assemble,
            e.stages.step,
            e.loss,
            e.train_accuracy,
            acc(e.valid_accuracy),
            acc(e.test_accuracy),
            human_bytes(e.disk_bytes)
        );
        if let (Some(v), Some(t)) = (&e.valid_rank, &e.test_rank) {
            println!("{}", super::report::ranking_row(v, t));
        }
        if let Some((path, f)) = &mut metrics
            && let Err(err) = writeln!(f, "{}", serde_json::to_string(e).expect("epochs serialize"))
        {
            failed.get_or_insert(format!("{}: {err}", path.display()));
        }
    };
    let ranks = match (&group, a.emulate_ranks) {
        (Some(g), _) => Ranks::Group(g),
        (None, Some(n)) => Ranks::Emulated(n),
        (None, None) => Ranks::One,
    };
    let s = train_typed(&layout, &engine, &cfg, ranks, &mut on_epoch)?;
    if let Some(err) = failed {
        anyhow::bail!("writing the metrics: {err}");
    }
    match &group {
        Some(g) if g.rank != 0 => tracing::info!(
            "rank {} of {} done; rank 0 reports the run",
            g.rank,
            g.world
        ),
        _ => report(&s, memory.as_ref()),
    }
    Ok(())
}

/// The run's summary, for a person and (last line) for a program.
fn report(s: &TypedTrainSummary, memory: Option<&MemoryEstimate>) {
    let acc = |a: Option<f64>| a.map_or("-".to_string(), |a| format!("{a:.4}"));
    let mut rows = vec![
        (
            "model",
            format!(
                "{} over {} relations of {} node types, {} parameters",
                match (s.model, s.root_weight) {
                    (RelationalKind::Rsage, false) => "R-SAGE",
                    (RelationalKind::Rsage, true) => "R-SAGE with root weights",
                    (RelationalKind::Rgat, _) => "R-GAT",
                },
                s.relations,
                s.node_types.len(),
                s.parameters
            ),
        ),
        ("features", format!("{:?}", s.features).to_lowercase()),
        ("ranks", s.world_size.to_string()),
        (
            "best epoch",
            match (&s.best_valid_rank, &s.test_rank_at_best_valid) {
                (Some(v), Some(t)) => format!(
                    "{} by validation MRR {:.4} (test MRR then {:.4}, Hits@10 {:.4}, Hits@50 {:.4}, Hits@100 {:.4})",
                    s.best_epoch.map_or("-".to_string(), |e| e.to_string()),
                    v.mrr,
                    t.mrr,
                    t.hits_at_10,
                    t.hits_at_50,
                    t.hits_at_100
                ),
                _ => format!(
                    "{} (test accuracy then {})",
                    s.best_epoch.map_or("-".to_string(), |e| e.to_string()),
                    acc(s.test_accuracy_at_best)
                ),
            },
        ),
        (
            "export",
            if s.exports.is_empty() {
                "none (--export DIR writes the best epoch's model)".to_string()
            } else {
                s.exports.join(", ")
            },
        ),
        (
            "memory",
            memory.map_or("not stated".to_string(), |m| {
                format!(
                    "at most {} (stated before training)",
                    human_bytes(m.total_bytes)
                )
            }),
        ),
    ];
    if let Some(h) = &s.historical {
        rows.push(("historical cache", super::report::historical_row(h)));
    }
    rows.push(("wall time", format!("{:.1} s", s.seconds)));
    print_summary(
        "trained typed layout",
        &rows,
        &serde_json::json!({ "command": "train", "typed": true, "summary": s, "memory": memory }),
    );
}

/// States the run's peak memory (logged) and refuses it over `--memory`,
/// before the layout's caches are read.
fn state_memory(
    m: &TypedManifest,
    cfg: &TypedTrainConfig,
    a: &TrainArgs,
) -> anyhow::Result<Option<MemoryEstimate>> {
    let limit = a
        .memory
        .as_deref()
        .map(offgnn_shared::sizes::parse_bytes)
        .transpose()?;
    let schema = Schema::of(m)?;
    let model = model_config(m, cfg);
    let run = (a.features.mode(), cfg.device, cfg.pipelined);
    let Some(mut memory) = crate::hetero::memory::estimate(m, &schema, &model, run)? else {
        if let Some(limit) = limit {
            return Err(crate::hetero::memory::unstated("--memory", limit).into());
        }
        tracing::info!("memory: not stated (the layout records no largest batch; pack it again)");
        return Ok(None);
    };
    if let Some(h) = &cfg.historical {
        memory.historical_bytes = crate::hetero::memory::historical_bytes(m, &model, h);
        memory.total_bytes = memory.total_bytes.saturating_add(memory.historical_bytes);
    }
    let gpu_cache = match a.features.mode() {
        FeatureMode::Packed => m
            .node_types
            .iter()
            .filter_map(|t| t.layout.as_ref())
            .map(|l| l.gpu_cache.rows * l.dataset.store_row_bytes())
            .sum(),
        FeatureMode::Naive | FeatureMode::Memory => 0,
    };
    super::train::check_statement(
        &memory,
        (cfg.device, limit),
        (
            gpu_cache,
            "pack with smaller --gpu-cache and --cpu-cache budgets",
        ),
    )?;
    Ok(Some(memory))
}

/// Refuses what the run of `world` ranks cannot take before the disk is
/// probed or the memory stated, and warns of flags a typed run ignores.
fn check_flags(
    a: &TrainArgs,
    (cfg, m): (&TypedTrainConfig, &TypedManifest),
    world: u32,
) -> anyhow::Result<()> {
    crate::hetero::historical::check(cfg, &model_config(m, cfg), world)?;
    if (a.loaders, a.queue_depth) != (2, 2) {
        tracing::warn!(
            "--loaders and --queue-depth are not used on a typed layout: one loader thread reads up to two batches ahead"
        );
    }
    Ok(())
}

/// `--metrics`, held by this run: appended to by a resumed run, else
/// started afresh (over a file with lines only with --overwrite).
fn open_metrics(a: &TrainArgs) -> anyhow::Result<Option<(PathBuf, std::fs::File)>> {
    let Some(path) = &a.metrics else {
        return Ok(None);
    };
    let f = crate::train::metrics::open_metrics(path, a.resume, a.overwrite)?;
    Ok(Some((path.clone(), f)))
}

/// The scorer of a typed link-prediction layout (`--scorer`, else the
/// MLP); none for a node layout, which refuses `--scorer`.
/// R-SAGE's start: `--init`, or by default PyG's for node classification
/// and DGL's (Glorot) for link prediction, where PyG's narrower start left
/// the dot products of wide, sparse rows' embeddings near zero (IMDB's
/// links, docs/guide.md). R-GAT's maps always start as PyG's GATConv's.
fn linear_init(
    flag: Option<&str>,
    kind: RelationalKind,
    link: bool,
) -> anyhow::Result<crate::hetero::LinearInit> {
    use crate::hetero::LinearInit;
    Ok(match flag {
        None if link && kind == RelationalKind::Rsage => LinearInit::Glorot,
        None | Some("pyg") => LinearInit::Pyg,
        Some("glorot") => LinearInit::Glorot,
        Some(other) => anyhow::bail!("--init {other}: expected pyg or glorot"),
    })
}

fn typed_scorer(
    a: &TrainArgs,
    m: &TypedManifest,
    location: &str,
) -> anyhow::Result<Option<crate::link::ScorerKind>> {
    let at = offgnn_shared::store::redact(location);
    match (&m.samples.link, a.scorer) {
        (Some(_), s) => Ok(Some(s.unwrap_or(crate::link::ScorerKind::Mlp))),
        (None, None) => Ok(None),
        (None, Some(_)) => anyhow::bail!(
            "--scorer is for link-prediction layouts (sampler --task link); {at} is a node-classification layout"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hetero::LinearInit;

    #[test]
    fn rsage_starts_as_glorot_for_links_and_as_pyg_for_nodes_unless_told() {
        let (sage, gat) = (RelationalKind::Rsage, RelationalKind::Rgat);
        assert_eq!(linear_init(None, sage, true).unwrap(), LinearInit::Glorot);
        assert_eq!(linear_init(None, sage, false).unwrap(), LinearInit::Pyg);
        assert_eq!(linear_init(None, gat, true).unwrap(), LinearInit::Pyg);
        assert_eq!(
            linear_init(Some("pyg"), sage, true).unwrap(),
            LinearInit::Pyg
        );
        assert_eq!(
            linear_init(Some("glorot"), sage, false).unwrap(),
            LinearInit::Glorot
        );
        let err = linear_init(Some("xavier"), sage, false).unwrap_err();
        assert_eq!(err.to_string(), "--init xavier: expected pyg or glorot");
    }
}
