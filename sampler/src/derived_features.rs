//! Derived features for node types that have none (MAG240M's authors and
//! institutions): each node's row is the mean of its in-neighbours' rows
//! over one named relation, as the OGB-LSC MAG240M baseline makes author
//! features from their papers and institution features from their authors.
//! The result is an ordinary feature file of the destination type, in a new
//! dataset whose other files are the input's, hard-linked.
//!
//! Out of core: the destination rows are accumulated in passes over ranges
//! of them, each pass as large as `--memory` allows (its accumulators and
//! its edges); within a pass each thread takes a sub-range, sorts its edges
//! by source and reads each source row once, in increasing order.

use std::path::Path;
use std::time::Instant;

use rayon::prelude::*;

use offgnn_shared::dataset::{DatasetWriter, FeatureMeta, Metadata, TypedDataset};
use offgnn_shared::error::{Error, Result};
use offgnn_shared::npy::{DType, NpyFile, NpyWriter};
use offgnn_shared::report::human_bytes;

use crate::topology::CHUNK;

/// What to derive: relations `src:relation:dst`, in order (a later one may
/// average rows an earlier one derived), within `memory` bytes.
#[derive(Clone, Debug)]
pub struct DeriveConfig {
    pub relations: Vec<String>,
    pub memory: u64,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct DerivedType {
    pub node_type: String,
    pub relation: String,
    pub rows: u64,
    pub dim: u64,
    pub dtype: String,
    pub edges: u64,
    /// Rows with no in-neighbour over the relation: written as zeros.
    pub rows_without_neighbours: u64,
    pub passes: u32,
    pub path: String,
    pub seconds: f64,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct DeriveSummary {
    pub dataset: std::path::PathBuf,
    pub derived: Vec<DerivedType>,
    pub seconds: f64,
}

/// Writes to `out` the dataset at `dataset` with a feature file derived for
/// the destination type of each relation of `cfg`.
pub fn derive_features(
    dataset: &Path,
    out: &Path,
    cfg: &DeriveConfig,
    overwrite: bool,
    show_progress: bool,
) -> Result<DeriveSummary> {
    let start = Instant::now();
    if !offgnn_shared::dataset::is_typed(dataset)? {
        return Err(Error::InvalidArgument(format!(
            "{}: a homogeneous dataset (one node type); derive-features gives a typed dataset's featureless node types rows averaged from another type over a relation",
            dataset.display()
        )));
    }
    let ds = TypedDataset::open(dataset)?;
    let mut meta = Metadata::read(dataset)?;
    let plan = plan(&ds, &cfg.relations)?;
    let writer = DatasetWriter::create(out, overwrite)?;
    for rel in meta.named_paths() {
        link_or_copy(&dataset.join(&rel), &writer.path(&rel))?;
    }
    let mut derived: Vec<DerivedType> = Vec::new();
    for &r in &plan {
        let relation = &ds.relations[r];
        let dst = &ds.node_types[relation.dst];
        let src_type = &ds.node_types[relation.src];
        let path = format!("data/{}-derived.npy", dst.name);
        if meta.named_paths().any(|p| p == path) {
            return Err(Error::InvalidArgument(format!(
                "{}: the dataset already names {path}",
                dataset.display()
            )));
        }
        // The source rows: the input's file, or one derived before.
        let src = match &src_type.features {
            Some(f) => NpyFile::open(f.path())?,
            None => {
                let earlier = derived
                    .iter()
                    .find(|d| d.node_type == src_type.name)
                    .expect("the plan orders derivations");
                NpyFile::open(writer.path(&earlier.path))?
            }
        };
        let started = Instant::now();
        let bar = offgnn_shared::progress::bar(
            relation.edges.len_hint().unwrap_or(0),
            "edges",
            &format!("{} rows from {}", dst.name, relation.name),
        );
        let bar = if show_progress {
            bar
        } else {
            indicatif::ProgressBar::hidden()
        };
        let stats = mean_rows(
            &src,
            &relation.edges,
            dst.num,
            cfg.memory,
            &writer.path(&path),
            &bar,
        )?;
        bar.finish_and_clear();
        tracing::info!(
            "derived {} x {} rows of '{}' from {} ({} passes)",
            dst.num,
            src.shape()[1],
            dst.name,
            relation.name,
            stats.passes
        );
        meta.feature_data.push(FeatureMeta {
            domain: "node".into(),
            node_type: Some(dst.name.clone()),
            name: "feat".into(),
            format: "numpy".into(),
            in_memory: Some(false),
            path: path.clone(),
        });
        derived.push(DerivedType {
            node_type: dst.name.clone(),
            relation: relation.name.clone(),
            rows: dst.num,
            dim: src.shape()[1],
            dtype: src.dtype().name().to_string(),
            edges: stats.edges,
            rows_without_neighbours: stats.empty_rows,
            passes: stats.passes,
            path,
            seconds: started.elapsed().as_secs_f64(),
        });
    }
    writer.commit_metadata(&meta)?;
    Ok(DeriveSummary {
        dataset: out.to_path_buf(),
        derived,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The relations' indices, checked: each exists, its destination type has
/// no features (nor one derived earlier), its source type has (or gets
/// them from an earlier relation of the list).
fn plan(ds: &TypedDataset, relations: &[String]) -> Result<Vec<usize>> {
    let bad = |msg: String| Err(Error::InvalidArgument(msg));
    if relations.is_empty() {
        return bad("--derive names no relation".into());
    }
    let mut has_rows: Vec<bool> = ds.node_types.iter().map(|t| t.features.is_some()).collect();
    let mut plan = Vec::new();
    for name in relations {
        let Some(r) = ds.relations.iter().position(|r| &r.name == name) else {
            let names: Vec<&str> = ds.relations.iter().map(|r| r.name.as_str()).collect();
            return bad(format!(
                "--derive {name}: no such relation (the dataset's are {})",
                names.join(", ")
            ));
        };
        let rel = &ds.relations[r];
        let (src, dst) = (&ds.node_types[rel.src], &ds.node_types[rel.dst]);
        if has_rows[rel.dst] {
            return bad(format!(
                "--derive {name}: node type '{}' already has features",
                dst.name
            ));
        }
        if !has_rows[rel.src] {
            return bad(format!(
                "--derive {name}: node type '{}' has no features to average; derive them first, with a --derive before this one",
                src.name
            ));
        }
        has_rows[rel.dst] = true;
        plan.push(r);
    }
    Ok(plan)
}

/// Hard-links `from` to `to` (copies it where the two are on different
/// filesystems: a dataset's files may not resolve outside its directory, so
/// a symbolic link would not do), making the directories `to` needs.
pub(crate) fn link_or_copy(from: &Path, to: &Path) -> Result<()> {
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
    }
    if std::fs::hard_link(from, to).is_ok() {
        return Ok(());
    }
    let bytes = std::fs::metadata(from)
        .map_err(|e| Error::io(from, e))?
        .len();
    tracing::info!(
        "copying {} ({}): the output is on another filesystem, so it cannot be hard-linked",
        from.display(),
        offgnn_shared::report::human_bytes(bytes)
    );
    std::fs::copy(from, to).map_err(|e| Error::io(to, e))?;
    Ok(())
}

/// Beside the passes: the edge stream's buffers (a chunk of sources and
/// destinations, as read and as ids) and the process itself (code, thread
/// stacks, allocator arenas), as the sampler's memory statement counts it.
const FIXED_BYTES: u64 = 4 * 8 * CHUNK as u64 + (64 << 20);

struct MeanStats {
    edges: u64,
    empty_rows: u64,
    passes: u32,
}

/// Streams the mean over `edges` of the source rows of `src` into a new
/// `[num_dst, d]` file at `path`, of `src`'s dtype.
fn mean_rows(
    src: &NpyFile,
    edges: &offgnn_shared::dataset::EdgeList,
    num_dst: u64,
    memory: u64,
    path: &Path,
    bar: &indicatif::ProgressBar,
) -> Result<MeanStats> {
    let d = src.shape()[1] as usize;
    let dtype = src.dtype();
    // Pass 0: in-degrees, which size the passes.
    let mut degree = vec![0u32; num_dst as usize];
    let mut total = 0u64;
    edges.for_each_chunk::<Error>(CHUNK, |_, dst| {
        for &v in dst {
            degree[v as usize] += 1;
        }
        total += dst.len() as u64;
        Ok(())
    })?;
    let passes = pass_ranges(&degree, d, memory)?;
    let mut out = NpyWriter::create(path, dtype, &[num_dst, d as u64])?;
    let threads = rayon::current_num_threads().max(1);
    let mut empty_rows = 0u64;
    for range in &passes {
        let (lo, hi) = (range.start as u64, range.end as u64);
        // This pass's edges, by thread sub-range of destinations, each
        // sorted by source.
        let width = (range.len()).div_ceil(threads).max(1);
        // Sized from the degrees: exactly this pass's edges, no growth.
        let mut parts: Vec<Vec<(u32, u32)>> = degree[range.clone()]
            .chunks(width)
            .map(|c| Vec::with_capacity(c.iter().map(|&n| n as usize).sum()))
            .collect();
        edges.for_each_chunk::<Error>(CHUNK, |s, t| {
            for (&u, &v) in s.iter().zip(t) {
                if (lo..hi).contains(&v) {
                    let local = (v - lo) as usize;
                    parts[local / width].push((u as u32, local as u32));
                }
            }
            bar.inc(s.len() as u64);
            Ok(())
        })?;
        let mut acc = vec![0f32; range.len() * d];
        acc.par_chunks_mut(width * d)
            .zip(parts.par_iter_mut())
            .enumerate()
            .try_for_each(|(i, (acc, pairs))| -> Result<()> {
                pairs.sort_unstable();
                let base = i * width;
                let mut raw = vec![0u8; d * dtype.size()];
                let mut row = vec![0f32; d];
                let mut last = u32::MAX;
                for &(u, v) in pairs.iter() {
                    if u != last {
                        src.read_data_at(u as u64 * src.row_bytes(), &mut raw)?;
                        decode(&raw, dtype, &mut row);
                        last = u;
                    }
                    let slot = &mut acc[(v as usize - base) * d..][..d];
                    for (a, x) in slot.iter_mut().zip(&row) {
                        *a += x;
                    }
                }
                Ok(())
            })?;
        drop(parts);
        let mut bytes = Vec::with_capacity(range.len() * d * dtype.size());
        for (i, row) in acc.chunks_exact(d).enumerate() {
            let n = degree[range.start + i];
            empty_rows += (n == 0) as u64;
            let scale = if n == 0 { 0.0 } else { 1.0 / n as f32 };
            for &x in row {
                encode(x * scale, dtype, &mut bytes);
            }
        }
        out.write_bytes(&bytes)?;
    }
    out.finish()?;
    Ok(MeanStats {
        edges: total,
        empty_rows,
        passes: passes.len() as u32,
    })
}

/// Consecutive destination ranges whose accumulators and encoded rows (`8d`
/// bytes a row at most) and edges (8 bytes each) fit `memory` less the
/// degrees (4 bytes a row) and [`FIXED_BYTES`].
fn pass_ranges(degree: &[u32], d: usize, memory: u64) -> Result<Vec<std::ops::Range<usize>>> {
    let fixed = degree.len() as u64 * 4 + FIXED_BYTES;
    let budget = memory.saturating_sub(fixed);
    let row_bytes = 8 * d as u64;
    let mut ranges = Vec::new();
    let (mut start, mut used) = (0usize, 0u64);
    for (v, &n) in degree.iter().enumerate() {
        let cost = row_bytes + 8 * n as u64;
        if cost > budget {
            return Err(Error::InvalidArgument(format!(
                "--memory {}: a destination row with its {n} edges needs {} beside {} of degrees, edge buffers and runtime; raise --memory",
                human_bytes(memory),
                human_bytes(cost),
                human_bytes(fixed)
            )));
        }
        if used + cost > budget {
            ranges.push(start..v);
            (start, used) = (v, 0);
        }
        used += cost;
    }
    if start < degree.len() || ranges.is_empty() {
        ranges.push(start..degree.len());
    }
    Ok(ranges)
}

fn decode(raw: &[u8], dtype: DType, row: &mut [f32]) {
    match dtype {
        DType::F16 => {
            for (x, b) in row.iter_mut().zip(raw.chunks_exact(2)) {
                *x = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        _ => {
            for (x, b) in row.iter_mut().zip(raw.chunks_exact(4)) {
                *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
    }
}

fn encode(x: f32, dtype: DType, out: &mut Vec<u8>) {
    match dtype {
        DType::F16 => out.extend_from_slice(&half::f16::from_f32(x).to_le_bytes()),
        _ => out.extend_from_slice(&x.to_le_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synthetic::{GeneratorConfig, TypedFeatures, generate_typed};

    /// A typed graph of 600 papers whose authors and institutes have no
    /// features.
    fn featureless(dir: &Path) -> std::path::PathBuf {
        let out = dir.join("igbh");
        let cfg = GeneratorConfig {
            num_nodes: 600,
            feature_dim: 8,
            ..GeneratorConfig::default()
        };
        generate_typed(
            &out,
            &cfg,
            &TypedFeatures::without(&["author", "institute"]),
            false,
            false,
        )
        .unwrap();
        out
    }

    fn f32_rows(f: &NpyFile) -> Vec<f32> {
        let mut raw = vec![0u8; f.header().data_bytes().unwrap() as usize];
        f.read_data_at(0, &mut raw).unwrap();
        raw.chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    fn derive(from: &Path, out: &Path, relations: &[&str], memory: u64) -> Result<DeriveSummary> {
        let cfg = DeriveConfig {
            relations: relations.iter().map(|r| r.to_string()).collect(),
            memory,
        };
        derive_features(from, out, &cfg, false, false)
    }

    #[test]
    fn each_row_is_the_mean_of_its_sources_in_any_number_of_passes() {
        let dir = tempfile::tempdir().unwrap();
        let input = featureless(dir.path());
        let chain = ["paper:written_by:author", "author:affiliated_to:institute"];
        let one = dir.path().join("one");
        let summary = derive(&input, &one, &chain, 1 << 30).unwrap();
        assert_eq!(summary.derived[0].passes, 1);
        // The edge buffers and 16 KiB: the degrees and a few hundred rows a
        // pass.
        let many = dir.path().join("many");
        let summary = derive(&input, &many, &chain, FIXED_BYTES + (16 << 10)).unwrap();
        assert!(summary.derived[0].passes > 3, "{summary:?}");

        let ds = TypedDataset::open(&one).unwrap();
        let d = 8;
        for (rel, (src_t, dst_t)) in chain.iter().zip([(0, 1), (1, 2)]) {
            let src = f32_rows(ds.node_types[src_t].features.as_ref().unwrap());
            let got = f32_rows(ds.node_types[dst_t].features.as_ref().unwrap());
            // The mean of each destination's sources, summed in increasing
            // source order as the passes sum them.
            let relation = ds.relations.iter().find(|r| r.name == *rel).unwrap();
            let mut pairs = Vec::new();
            relation
                .edges
                .for_each_chunk::<Error>(CHUNK, |s, t| {
                    pairs.extend(t.iter().copied().zip(s.iter().copied()));
                    Ok(())
                })
                .unwrap();
            pairs.sort_unstable();
            let rows = ds.node_types[dst_t].num as usize;
            let mut want = vec![0f32; rows * d];
            let mut count = vec![0u32; rows];
            for &(v, u) in &pairs {
                for k in 0..d {
                    want[v as usize * d + k] += src[u as usize * d + k];
                }
                count[v as usize] += 1;
            }
            for (v, &n) in count.iter().enumerate() {
                let scale = if n == 0 { 0.0 } else { 1.0 / n as f32 };
                for x in &mut want[v * d..][..d] {
                    *x *= scale;
                }
            }
            assert!(got == want, "{rel}: the derived rows are not the means");
            assert!(count.iter().any(|&n| n > 1), "{rel}: no mean over several");
        }
        // Passes change nothing, and the input's files are the same files.
        for file in ["data/author-derived.npy", "data/institute-derived.npy"] {
            assert_eq!(
                std::fs::read(one.join(file)).unwrap(),
                std::fs::read(many.join(file)).unwrap(),
                "{file}"
            );
        }
        assert_eq!(
            std::fs::read(one.join("data/paper-feat.npy")).unwrap(),
            std::fs::read(input.join("data/paper-feat.npy")).unwrap()
        );
    }

    #[test]
    fn a_relation_that_cannot_be_derived_is_refused_in_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let input = featureless(dir.path());
        let out = dir.path().join("out");
        let err = |relations: &[&str], memory: u64| {
            derive(&input, &out, relations, memory)
                .unwrap_err()
                .to_string()
        };
        let e = err(&["paper:wrote:author"], 1 << 30);
        assert!(
            e.contains("no such relation (the dataset's are paper:cites:paper"),
            "{e}"
        );
        let e = err(&["author:rev_written_by:paper"], 1 << 30);
        assert!(e.contains("node type 'paper' already has features"), "{e}");
        let e = err(&["author:affiliated_to:institute"], 1 << 30);
        assert!(
            e.contains("node type 'author' has no features to average; derive them first"),
            "{e}"
        );
        let e = err(&["paper:written_by:author"], 1 << 10);
        assert!(e.contains("raise --memory"), "{e}");
        assert!(!out.exists(), "a refused run leaves nothing");
        let flat = dir.path().join("flat");
        let cfg = GeneratorConfig {
            num_nodes: 100,
            feature_dim: 4,
            ..GeneratorConfig::default()
        };
        crate::synthetic::generate(&flat, &cfg, false, false).unwrap();
        let e = derive(&flat, &out, &["a:b:c"], 1 << 30)
            .unwrap_err()
            .to_string();
        assert!(e.contains("a homogeneous dataset (one node type)"), "{e}");
        assert!(!out.exists(), "a refused run leaves nothing");
    }
}
