//! Synthetic graphs with a learnable node-classification task, streamed to a
//! GraphBolt `OnDiskDataset` directory: a degree-corrected stochastic block
//! model with power-law degrees (labels are the blocks) and Gaussian node
//! features whose class means carry the label.
//!
//! The model, after Karrer & Newman, "Stochastic blockmodels and community
//! structure in networks" (Phys. Rev. E 83, 2011), §II (degree correction):
//!
//! - label `y_i` uniform over the `C` classes (every class gets a node);
//! - degree propensity `theta_i = min(U^(-1/(gamma-1)), cap)`, a Pareto law, so
//!   `P(deg >= k) ~ k^-(gamma-1)` below the cap; the cap holds the largest
//!   expected degree near `sqrt(N * avg_degree)` (the structural cut-off);
//! - node `u` starts `k_u` edges, `k_u` the stochastic rounding of
//!   `avg_degree / 2 * theta_u / mean(theta)`; each goes, with probability
//!   `homophily`, into `u`'s own class, else into a uniformly drawn other
//!   class, and inside the class to a node drawn with probability
//!   proportional to `theta` (alias tables). Each edge is written in both
//!   directions, so the file is symmetric; there are no self-loops, repeated
//!   pairs may occur;
//! - features `x_i = signal * mu_{y_i} + z_i`, `mu_c` and `z_i` standard
//!   normal `d`-vectors.
//!
//! Memory is a few per-node arrays (about 30 bytes a node); edges and features
//! are generated in chunks on the rayon pool and written in order while the
//! next chunks are generated. Every chunk (and every feature row) draws from
//! its own generator seeded from `(seed, stream, index)`, so the bytes depend
//! only on the configuration, never on the thread count.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::ops::Range;
use std::path::Path;
use std::time::Instant;

use indicatif::ProgressBar;
use rand::{Rng, SeedableRng};
use rand_distr::StandardNormal;
use rand_pcg::Pcg64Mcg;
use rayon::prelude::*;

use offgnn_shared::dataset::{DatasetSpec, DatasetWriter, Split, layout, seeded_split};
use offgnn_shared::error::{Error, Result};
use offgnn_shared::npy::{DType, NpyWriter};

mod edges;
mod typed;
use edges::{ClassSamplers, EdgeFiles, EdgeJob};
pub use typed::{TypedFeatures, TypedGenerateSummary, generate_typed, type_counts};

/// What to generate.
#[derive(Clone, Debug)]
pub struct GeneratorConfig {
    /// `dataset_name` in metadata.yaml.
    pub name: String,
    /// `N`: at least `num_classes`, below 2^32.
    pub num_nodes: u64,
    /// Mean undirected degree; the edge file holds both directions, so it has
    /// about `N * avg_degree` edges.
    pub avg_degree: f64,
    /// `d`, the feature width.
    pub feature_dim: u64,
    /// `F32` or `F16`.
    pub dtype: DType,
    /// `C >= 2`: the blocks of the block model, and the labels.
    pub num_classes: u32,
    pub train_fraction: f64,
    pub valid_fraction: f64,
    /// The test set's fraction; `None`: what train and validation leave.
    /// Large graphs want a small one, as every test node is sampled once.
    pub test_fraction: Option<f64>,
    /// Probability that an edge stays inside its source's class.
    pub homophily: f64,
    /// `gamma > 2`: the degree tail is `P(deg >= k) ~ k^-(gamma-1)`.
    pub power_law_exponent: f64,
    /// Scale of the class means (standard-normal entries) against the unit
    /// per-entry noise. Two class means lie about `signal * sqrt(2d)` noise
    /// units apart, so the task gets easier as `d` grows; the default suits
    /// `d` near 128.
    pub signal: f32,
    pub seed: u64,
}

impl Default for GeneratorConfig {
    /// 10 000 nodes, degree 10, 128-d f32, 16 classes. At this signal a
    /// nearest-class-mean classifier reaches about 0.55 test accuracy on a
    /// node's own features and about 0.95 on the mean over the node and its
    /// neighbors (chance is 1/16).
    fn default() -> Self {
        GeneratorConfig {
            name: "synthetic".into(),
            num_nodes: 10_000,
            avg_degree: 10.0,
            feature_dim: 128,
            dtype: DType::F32,
            num_classes: 16,
            train_fraction: 0.1,
            valid_fraction: 0.05,
            test_fraction: None,
            homophily: 0.8,
            power_law_exponent: 2.5,
            signal: 0.2,
            seed: 0,
        }
    }
}

/// What [`generate`] wrote and how fast.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GenerateSummary {
    pub num_nodes: u64,
    /// Directed edges in the file (each undirected edge twice).
    pub num_edges: u64,
    pub feature_dim: u64,
    pub dtype: String,
    /// Size of the feature file, header included.
    pub feature_bytes: u64,
    /// Size of the edge file, header included.
    pub edge_bytes: u64,
    /// Wall time of the whole run, validation of the written dataset included.
    pub seconds: f64,
    /// Nodes per second of the whole run.
    pub rows_per_sec: f64,
    /// Feature file megabytes (10^6 bytes) per second of the whole run.
    pub feature_mb_per_sec: f64,
}

// Stream tags: each random quantity draws from its own streams.
const STREAM_NODES: u64 = 1;
const STREAM_DEGREES: u64 = 2;
const STREAM_FIXUP: u64 = 3;
const STREAM_EDGES: u64 = 4;
const STREAM_MEANS: u64 = 5;
const STREAM_FEATURES: u64 = 6;
const STREAM_SPLIT: u64 = 7;

/// Nodes per chunk for labels, propensities and out-counts. Part of the
/// output's definition: changing it changes the bytes.
const NODE_CHUNK: usize = 1 << 16;
/// Source nodes per edge chunk. Part of the output's definition too.
const EDGE_CHUNK_NODES: usize = 1 << 14;
/// Target size of one feature buffer (rows are seeded one by one, so this
/// only sets memory and parallel grain, not the output).
const FEATURE_BUFFER_BYTES: u64 = 4 << 20;
/// Redraws of a within-class target that hit the source itself before the
/// edge goes to another class instead.
const MAX_SELF_REDRAWS: u32 = 64;
/// Label rows per write of the label file.
const LABEL_WRITE_ROWS: usize = 1 << 20;

/// Generates the dataset described by `cfg` into the directory `out`
/// (replacing it only when `overwrite`). The directory appears whole or not at
/// all.
pub fn generate(
    out: &Path,
    cfg: &GeneratorConfig,
    overwrite: bool,
    show_progress: bool,
) -> Result<GenerateSummary> {
    validate(cfg)?;
    let start = Instant::now();
    let writer = DatasetWriter::create(out, overwrite)?;
    tracing::info!(
        nodes = cfg.num_nodes,
        avg_degree = cfg.avg_degree,
        dim = cfg.feature_dim,
        dtype = %cfg.dtype,
        classes = cfg.num_classes,
        seed = cfg.seed,
        "generating synthetic graph into {}",
        out.display()
    );

    let population = Population {
        num: cfg.num_nodes,
        classes: cfg.num_classes,
        exponent: cfg.power_law_exponent,
        avg_degree: cfg.avg_degree,
        seed: cfg.seed,
        part: 0,
    };
    let (labels, theta) = draw_nodes(&population);
    let out_counts = draw_out_counts(cfg.avg_degree / 2.0, &theta, cfg.seed, STREAM_DEGREES);
    let classes = ClassSamplers::build(cfg.num_classes as usize, &labels, &theta);
    drop(theta);

    let edges_path = writer.path(layout::EDGES);
    let edges = EdgeJob {
        seed: cfg.seed,
        stream: STREAM_EDGES,
        homophily: cfg.homophily,
        src_labels: &labels,
        out_counts: &out_counts,
        dst: &classes,
        same_type: true,
    };
    let num_edges = edges.write(EdgeFiles::Symmetric(&edges_path), &|total| {
        progress_bar(show_progress, || {
            offgnn_shared::progress::bar(total, "edges", "edges")
        })
    })?;
    drop(classes);
    drop(out_counts);

    let feat_path = writer.path(layout::FEATURES);
    let feature_data_bytes = cfg.num_nodes * cfg.feature_dim * cfg.dtype.size() as u64;
    FeatureJob::of(cfg, 0).write(
        &feat_path,
        &labels,
        progress_bar(show_progress, || {
            offgnn_shared::progress::bytes_bar(feature_data_bytes, "features")
        }),
    )?;

    write_labels(&writer.path(layout::LABELS), &labels)?;
    let splits = seeded_split(
        cfg.num_nodes,
        cfg.train_fraction,
        cfg.valid_fraction,
        cfg.test_fraction,
        stream_seed(cfg.seed, STREAM_SPLIT, 0),
    )?;
    for (split, seeds) in Split::ALL.into_iter().zip(&splits) {
        let split_labels: Vec<u64> = seeds.iter().map(|&s| labels[s as usize] as u64).collect();
        writer.write_split(split, seeds, &split_labels)?;
    }

    let file_len = |path: &Path| -> Result<u64> {
        Ok(std::fs::metadata(path)
            .map_err(|e| Error::io(path, e))?
            .len())
    };
    let feature_bytes = file_len(&feat_path)?;
    let edge_bytes = file_len(&edges_path)?;
    writer.commit(&DatasetSpec {
        name: cfg.name.clone(),
        num_nodes: cfg.num_nodes,
        num_classes: cfg.num_classes,
        node_labels: true,
        extra_tasks: Vec::new(),
    })?;

    let seconds = start.elapsed().as_secs_f64();
    let summary = GenerateSummary {
        num_nodes: cfg.num_nodes,
        num_edges,
        feature_dim: cfg.feature_dim,
        dtype: cfg.dtype.name().to_string(),
        feature_bytes,
        edge_bytes,
        seconds,
        rows_per_sec: cfg.num_nodes as f64 / seconds.max(1e-9),
        feature_mb_per_sec: feature_bytes as f64 / 1e6 / seconds.max(1e-9),
    };
    tracing::info!(
        edges = num_edges,
        seconds,
        rows_per_sec = summary.rows_per_sec,
        "wrote {}",
        out.display()
    );
    Ok(summary)
}

/// Checks every parameter; the message names the one at fault.
fn validate(cfg: &GeneratorConfig) -> Result<()> {
    let bad = |msg: String| Err(Error::InvalidArgument(msg));
    let n = cfg.num_nodes;
    if n >= 1 << 32 {
        return bad(format!(
            "num_nodes {n} is too large: node ids are 32-bit, so at most {} nodes",
            u32::MAX
        ));
    }
    if cfg.num_classes < 2 {
        return bad(format!(
            "num_classes {} must be at least 2",
            cfg.num_classes
        ));
    }
    if n < cfg.num_classes as u64 {
        return bad(format!(
            "num_nodes {n} must be at least num_classes {}",
            cfg.num_classes
        ));
    }
    if cfg.feature_dim == 0 {
        return bad("feature_dim must be positive".into());
    }
    if !matches!(cfg.dtype, DType::F32 | DType::F16) {
        return bad(format!(
            "dtype {} is not supported for features: use float32 or float16",
            cfg.dtype
        ));
    }
    if cfg
        .num_nodes
        .checked_mul(cfg.feature_dim)
        .and_then(|x| x.checked_mul(cfg.dtype.size() as u64))
        .is_none()
    {
        return bad(format!(
            "num_nodes {n} x feature_dim {} overflows 64 bits",
            cfg.feature_dim
        ));
    }
    if !(cfg.avg_degree > 0.0 && cfg.avg_degree < n as f64) {
        return bad(format!(
            "avg_degree {} must be positive and below num_nodes {n}",
            cfg.avg_degree
        ));
    }
    if !(0.0..=1.0).contains(&cfg.homophily) {
        return bad(format!("homophily {} must lie in [0, 1]", cfg.homophily));
    }
    if !(cfg.power_law_exponent > 2.0 && cfg.power_law_exponent.is_finite()) {
        return bad(format!(
            "power_law_exponent {} must be a finite number above 2 (the degree mean must exist)",
            cfg.power_law_exponent
        ));
    }
    let (train, valid) = (cfg.train_fraction, cfg.valid_fraction);
    if !(train > 0.0 && valid >= 0.0 && train + valid <= 1.0) {
        return bad(format!(
            "train_fraction {train} and valid_fraction {valid} must satisfy \
             0 < train_fraction, 0 <= valid_fraction, train_fraction + valid_fraction <= 1"
        ));
    }
    if let Some(test) = cfg.test_fraction
        && !(test >= 0.0 && train + valid + test <= 1.0 + 1e-12)
    {
        return bad(format!(
            "test_fraction {test} must be non-negative and leave train_fraction + \
             valid_fraction + test_fraction <= 1"
        ));
    }
    if !cfg.signal.is_finite() || cfg.signal < 0.0 {
        return bad(format!(
            "signal {} must be a finite non-negative number",
            cfg.signal
        ));
    }
    Ok(())
}

/// splitmix64's finaliser (Steele, Lea & Flood, "Fast splittable
/// pseudorandom number generators", OOPSLA 2014): a bijection whose output
/// bits each depend on every input bit.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed of chunk (or row) `index` of random stream `stream`.
pub(super) fn stream_seed(seed: u64, stream: u64, index: u64) -> u64 {
    splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ index)
}

fn stream_rng(seed: u64, stream: u64, index: u64) -> Pcg64Mcg {
    Pcg64Mcg::seed_from_u64(stream_seed(seed, stream, index))
}

pub(super) fn progress_bar(show: bool, make: impl FnOnce() -> ProgressBar) -> ProgressBar {
    if show { make() } else { ProgressBar::hidden() }
}

/// The propensity cap `c`: the largest propensity, relative to the mean
/// propensity, gives an expected degree of `sqrt(N * avg_degree)`. With
/// Pareto(1, alpha) propensities capped at `c` the mean is
/// `E[min(X, c)] = 1 + (1 - c^(1-alpha)) / (alpha - 1)`, so `c` solves
/// `c = sqrt(N / avg_degree) * E[min(X, c)]`; the iteration climbs
/// monotonically to the fixed point (its slope there is below 1).
fn propensity_cap(num_nodes: u64, avg_degree: f64, alpha: f64) -> f64 {
    let ratio = (num_nodes as f64 / avg_degree).sqrt().max(1.0);
    let capped_mean = |c: f64| 1.0 + (1.0 - c.powf(1.0 - alpha)) / (alpha - 1.0);
    let mut c = ratio;
    for _ in 0..10_000 {
        let next = ratio * capped_mean(c);
        if (next - c).abs() <= 1e-9 * c {
            return next;
        }
        c = next;
    }
    c
}

/// A population of nodes to draw: a homogeneous graph's nodes, or one node
/// type's.
pub(super) struct Population {
    pub num: u64,
    pub classes: u32,
    /// The power-law exponent `gamma` of the propensities.
    pub exponent: f64,
    /// The degree the propensity cap is set for.
    pub avg_degree: f64,
    pub seed: u64,
    /// Which population: its random streams are offset by `part << 8`, so
    /// two node types never share one (0: a homogeneous graph's).
    pub part: u64,
}

/// Labels and degree propensities of all nodes. Every class ends up with at
/// least one node.
pub(super) fn draw_nodes(p: &Population) -> (Vec<u32>, Vec<f32>) {
    let n = p.num as usize;
    let classes = p.classes;
    let alpha = p.exponent - 1.0;
    let cap = propensity_cap(p.num, p.avg_degree, alpha);
    let mut labels = vec![0u32; n];
    let mut theta = vec![0f32; n];
    labels
        .par_chunks_mut(NODE_CHUNK)
        .zip(theta.par_chunks_mut(NODE_CHUNK))
        .enumerate()
        .for_each(|(chunk, (labels, theta))| {
            let mut rng = stream_rng(p.seed, STREAM_NODES + (p.part << 8), chunk as u64);
            for (y, t) in labels.iter_mut().zip(theta.iter_mut()) {
                *y = rng.random_range(0..classes);
                // Inverse-CDF Pareto draw: 1 - U lies in (0, 1], so t >= 1.
                let u: f64 = rng.random();
                *t = (1.0 - u).powf(-1.0 / alpha).min(cap) as f32;
            }
        });
    fill_empty_classes(&mut labels, classes as usize, p.seed, p.part);
    (labels, theta)
}

/// Gives each empty class a node taken from the currently largest class
/// (only small graphs with many classes ever need this).
fn fill_empty_classes(labels: &mut [u32], classes: usize, seed: u64, part: u64) {
    let mut counts = vec![0usize; classes];
    for &y in labels.iter() {
        counts[y as usize] += 1;
    }
    if counts.iter().all(|&c| c > 0) {
        return;
    }
    // Members of each class, to take from; the heap orders classes by size
    // (ties to the lower index, through the reversed key).
    let (offsets, mut members) = group_by_class(labels, classes);
    let mut heap: BinaryHeap<(usize, Reverse<usize>)> = counts
        .iter()
        .enumerate()
        .filter(|&(_, &count)| count > 1)
        .map(|(c, &count)| (count, Reverse(c)))
        .collect();
    let mut rng = stream_rng(seed, STREAM_FIXUP + (part << 8), 0);
    for empty in (0..classes).filter(|&c| counts[c] == 0) {
        let (count, Reverse(from)) = heap
            .pop()
            .expect("num_nodes >= num_classes leaves a class of two or more nodes");
        // The class's members still in it are the first `count` of its slice;
        // move a random one and swap the last remaining into its place.
        let first = offsets[from];
        let pick = first + rng.random_range(0..count);
        labels[members[pick] as usize] = empty as u32;
        members.swap(pick, first + count - 1);
        if count - 1 > 1 {
            heap.push((count - 1, Reverse(from)));
        }
    }
}

/// Counting sort of node ids by class: `members[offsets[c]..offsets[c + 1]]`
/// are the nodes of class `c`, ascending.
fn group_by_class(labels: &[u32], classes: usize) -> (Vec<usize>, Vec<u32>) {
    let mut offsets = vec![0usize; classes + 1];
    for &y in labels {
        offsets[y as usize + 1] += 1;
    }
    for c in 0..classes {
        offsets[c + 1] += offsets[c];
    }
    let mut cursor = offsets[..classes].to_vec();
    let mut members = vec![0u32; labels.len()];
    for (node, &y) in labels.iter().enumerate() {
        members[cursor[y as usize]] = node as u32;
        cursor[y as usize] += 1;
    }
    (offsets, members)
}

/// Out-counts `k_u`: the stochastic rounding of
/// `mean_out * theta_u / mean(theta)`, so `E[sum k] = N * mean_out`.
pub(super) fn draw_out_counts(mean_out: f64, theta: &[f32], seed: u64, stream: u64) -> Vec<u32> {
    // Chunk sums in chunk order: the same total on any number of threads.
    let partial: Vec<f64> = theta
        .par_chunks(NODE_CHUNK)
        .map(|c| c.iter().map(|&t| t as f64).sum::<f64>())
        .collect();
    let mean = partial.iter().sum::<f64>() / theta.len() as f64;
    let scale = mean_out / mean;
    let mut counts = vec![0u32; theta.len()];
    counts
        .par_chunks_mut(NODE_CHUNK)
        .zip(theta.par_chunks(NODE_CHUNK))
        .enumerate()
        .for_each(|(chunk, (counts, theta))| {
            let mut rng = stream_rng(seed, stream, chunk as u64);
            for (k, &t) in counts.iter_mut().zip(theta) {
                let x = scale * t as f64;
                let whole = x.floor();
                let up = rng.random::<f64>() < x - whole;
                *k = whole as u32 + up as u32;
            }
        });
    counts
}

/// Generates chunks `0..num_chunks` on the rayon pool, `window` at a time, and
/// hands them to `consume` in order; consuming one window overlaps generating
/// the next.
fn pipeline<T, M, C>(num_chunks: usize, window: usize, make: M, mut consume: C) -> Result<()>
where
    T: Send,
    M: Fn(usize) -> T + Sync,
    C: FnMut(usize, T) -> Result<()> + Send,
{
    let generate = |range: Range<usize>| -> Vec<T> { range.into_par_iter().map(&make).collect() };
    let mut pending: Option<(usize, Vec<T>)> = None;
    let mut next = 0usize;
    loop {
        let range = next..(next + window).min(num_chunks);
        let (written, generated) = rayon::join(
            || -> Result<()> {
                if let Some((first, items)) = pending.take() {
                    for (i, item) in items.into_iter().enumerate() {
                        consume(first + i, item)?;
                    }
                }
                Ok(())
            },
            || (!range.is_empty()).then(|| generate(range.clone())),
        );
        written?;
        match generated {
            Some(items) => {
                pending = Some((range.start, items));
                next = range.end;
            }
            None => return Ok(()),
        }
    }
}

fn window() -> usize {
    2 * rayon::current_num_threads().max(1)
}

/// The features of one population: `x_i = signal * mu_{y_i} + z_i`.
pub(super) struct FeatureJob {
    pub dim: u64,
    pub classes: u32,
    pub signal: f32,
    pub dtype: DType,
    pub seed: u64,
    /// As [`Population::part`].
    pub part: u64,
}

impl FeatureJob {
    /// The features `cfg` asks for, of population `part`.
    pub(super) fn of(cfg: &GeneratorConfig, part: u64) -> Self {
        FeatureJob {
            dim: cfg.feature_dim,
            classes: cfg.num_classes,
            signal: cfg.signal,
            dtype: cfg.dtype,
            seed: cfg.seed,
            part,
        }
    }

    /// Streams the `[N, d]` feature matrix; row `i` draws from its own generator.
    pub(super) fn write(&self, path: &Path, labels: &[u32], bar: ProgressBar) -> Result<()> {
        let d = self.dim as usize;
        let n = labels.len();
        let mut means_rng = stream_rng(self.seed, STREAM_MEANS + (self.part << 8), 0);
        let means: Vec<f32> = (0..self.classes as usize * d)
            .map(|_| self.signal * means_rng.sample::<f32, _>(StandardNormal))
            .collect();
        // Buffer size depends on d only through f32 width, never on the dtype.
        let rows_per_buffer = (FEATURE_BUFFER_BYTES / (self.dim * 4)).max(1) as usize;
        let num_buffers = n.div_ceil(rows_per_buffer);
        let dtype = self.dtype;
        let make = |buffer: usize| -> Vec<u8> {
            let rows = buffer * rows_per_buffer..((buffer + 1) * rows_per_buffer).min(n);
            let mut bytes = Vec::with_capacity(rows.len() * d * dtype.size());
            for row in rows {
                let mut rng = stream_rng(self.seed, STREAM_FEATURES + (self.part << 8), row as u64);
                let mean = &means[labels[row] as usize * d..][..d];
                for &m in mean {
                    let x = m + rng.sample::<f32, _>(StandardNormal);
                    match dtype {
                        DType::F16 => {
                            bytes.extend_from_slice(&half::f16::from_f32(x).to_le_bytes())
                        }
                        _ => bytes.extend_from_slice(&x.to_le_bytes()),
                    }
                }
            }
            bytes
        };
        let mut out = NpyWriter::create(path, dtype, &[n as u64, self.dim])?;
        pipeline(num_buffers, window(), make, |_, bytes| {
            out.write_bytes(&bytes)?;
            bar.inc(bytes.len() as u64);
            Ok(())
        })?;
        out.finish()?;
        bar.finish();
        Ok(())
    }
}

/// The node label array, `int64 [N]`, written in slices.
pub(super) fn write_labels(path: &Path, labels: &[u32]) -> Result<()> {
    let mut out = NpyWriter::create(path, DType::I64, &[labels.len() as u64])?;
    let mut buf = Vec::with_capacity(LABEL_WRITE_ROWS.min(labels.len()) * 8);
    for chunk in labels.chunks(LABEL_WRITE_ROWS) {
        buf.clear();
        for &y in chunk {
            buf.extend_from_slice(&(y as i64).to_le_bytes());
        }
        out.write_bytes(&buf)?;
    }
    out.finish()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use super::*;
    use crate::topology::{Csr, CsrOptions};
    use offgnn_shared::dataset::Dataset;

    fn small(num_nodes: u64, feature_dim: u64) -> GeneratorConfig {
        GeneratorConfig {
            num_nodes,
            feature_dim,
            ..GeneratorConfig::default()
        }
    }

    /// Generates into a fresh temporary directory.
    fn generated(cfg: &GeneratorConfig) -> (tempfile::TempDir, PathBuf, GenerateSummary) {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("graph");
        let summary = generate(&out, cfg, false, false).unwrap();
        (dir, out, summary)
    }

    /// Every file of a dataset directory by relative path.
    fn files(root: &Path) -> BTreeMap<String, Vec<u8>> {
        let mut out = BTreeMap::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else {
                    let rel = path
                        .strip_prefix(root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned();
                    out.insert(rel, std::fs::read(&path).unwrap());
                }
            }
        }
        out
    }

    fn features_f32(ds: &Dataset) -> Vec<f32> {
        let f = &ds.features;
        let mut raw = vec![0u8; f.header().data_bytes().unwrap() as usize];
        f.read_data_at(0, &mut raw).unwrap();
        match f.dtype() {
            DType::F32 => raw
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect(),
            DType::F16 => raw
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes(b.try_into().unwrap()).to_f32())
                .collect(),
            other => panic!("unexpected feature dtype {other}"),
        }
    }

    fn node_labels(root: &Path) -> Vec<u64> {
        offgnn_shared::npy::NpyFile::open(root.join(layout::LABELS))
            .unwrap()
            .read_all_u64()
            .unwrap()
    }

    fn csr(ds: &Dataset) -> Csr {
        Csr::from_edge_list(&ds.edges, CsrOptions::default(), |_| {}).unwrap()
    }

    #[test]
    fn same_config_same_bytes_on_any_thread_count() {
        let cfg = small(5_000, 8);
        let run = |threads: usize, cfg: &GeneratorConfig| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let (_dir, out, _) = pool.install(|| generated(cfg));
            files(&out)
        };
        let one = run(1, &cfg);
        let three = run(3, &cfg);
        assert_eq!(
            one.keys().collect::<Vec<_>>(),
            three.keys().collect::<Vec<_>>()
        );
        for (name, bytes) in &one {
            assert!(
                three[name] == *bytes,
                "{name} differs between 1 and 3 threads"
            );
        }
        let again = run(2, &cfg);
        assert!(one == again, "a second run differs");

        let other = run(2, &GeneratorConfig { seed: 1, ..cfg });
        for name in [layout::EDGES, layout::FEATURES, layout::LABELS] {
            assert!(one[name] != other[name], "{name} ignores the seed");
        }
        assert!(one["set/train_seeds.npy"] != other["set/train_seeds.npy"]);
    }

    #[test]
    fn dataset_opens_symmetric_without_self_loops() {
        let cfg = GeneratorConfig {
            num_classes: 7,
            ..small(4_000, 12)
        };
        let (_dir, out, summary) = generated(&cfg);
        let ds = Dataset::open(&out).unwrap();
        assert_eq!(ds.name, "synthetic");
        assert_eq!(ds.num_nodes, 4_000);
        assert_eq!(ds.feature_dim(), 12);
        assert_eq!(ds.features.dtype(), DType::F32);
        assert_eq!(ds.num_classes, 7);
        assert_eq!(ds.edges.len_hint(), Some(summary.num_edges));
        assert_eq!(
            (
                summary.num_nodes,
                summary.feature_dim,
                summary.dtype.as_str()
            ),
            (4_000, 12, "float32")
        );
        let feat_len = std::fs::metadata(out.join(layout::FEATURES)).unwrap().len();
        assert_eq!(summary.feature_bytes, feat_len);
        assert_eq!(
            summary.edge_bytes,
            std::fs::metadata(out.join(layout::EDGES)).unwrap().len()
        );
        assert!(summary.rows_per_sec > 0.0 && summary.feature_mb_per_sec > 0.0);
        let splits = ds.train.seeds.len() + ds.valid.seeds.len() + ds.test.seeds.len();
        assert_eq!(splits, 4_000);
        assert_eq!(ds.train.seeds.len(), 400);
        assert_eq!(ds.valid.seeds.len(), 200);

        let g = csr(&ds);
        assert_eq!(g.num_edges(), summary.num_edges);
        // Row v lists the sources of edges into v; symmetry means the
        // multiset of (row, neighbor) pairs equals that of (neighbor, row).
        let mut forward = Vec::new();
        for v in 0..g.num_nodes() as u32 {
            for &u in g.neighbors(v) {
                assert_ne!(u, v, "self-loop at {v}");
                forward.push((v, u));
            }
        }
        let mut backward: Vec<(u32, u32)> = forward.iter().map(|&(v, u)| (u, v)).collect();
        forward.sort_unstable();
        backward.sort_unstable();
        assert!(forward == backward, "the edge list is not symmetric");
    }

    /// Least-squares slope of log CCDF against log degree over `[lo, hi]`.
    fn ccdf_slope(sorted: &[u64], lo: f64, hi: f64) -> f64 {
        let n = sorted.len() as f64;
        let points: Vec<(f64, f64)> = (0..=20)
            .map(|i| (lo * (hi / lo).powf(i as f64 / 20.0)).round() as u64)
            .map(|k| {
                let at_least = sorted.len() - sorted.partition_point(|&x| x < k);
                ((k as f64).ln(), (at_least as f64 / n).ln())
            })
            .collect();
        let mx = points.iter().map(|p| p.0).sum::<f64>() / points.len() as f64;
        let my = points.iter().map(|p| p.1).sum::<f64>() / points.len() as f64;
        let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
        sxy / sxx
    }

    #[test]
    fn degrees_have_the_mean_and_a_power_law_tail() {
        for gamma in [2.5, 3.0] {
            let cfg = GeneratorConfig {
                power_law_exponent: gamma,
                ..small(20_000, 2)
            };
            let (_dir, out, _) = generated(&cfg);
            let g = csr(&Dataset::open(&out).unwrap());
            let mut degrees: Vec<u64> = (0..g.num_nodes() as u32).map(|v| g.degree(v)).collect();
            degrees.sort_unstable();
            let mean = degrees.iter().sum::<u64>() as f64 / degrees.len() as f64;
            assert!(
                (mean - 10.0).abs() < 1.5,
                "gamma {gamma}: mean degree {mean}"
            );
            let max = *degrees.last().unwrap() as f64;
            assert!(
                max > 8.0 * mean,
                "gamma {gamma}: max degree {max}, mean {mean}"
            );
            let p999 = degrees[degrees.len() * 999 / 1000] as f64;
            let slope = ccdf_slope(&degrees, 2.0 * mean, p999);
            let want = -(gamma - 1.0);
            eprintln!("gamma {gamma}: mean {mean:.2} max {max} p99.9 {p999} slope {slope:.3}");
            assert!(
                (slope - want).abs() < 0.45,
                "gamma {gamma}: CCDF slope {slope}, want about {want}"
            );
        }
    }

    #[test]
    fn labels_are_balanced_and_edges_keep_the_homophily() {
        for homophily in [0.8, 0.3] {
            let cfg = GeneratorConfig {
                homophily,
                num_classes: 10,
                seed: 7,
                ..small(20_000, 2)
            };
            let (_dir, out, _) = generated(&cfg);
            let labels = node_labels(&out);
            let mut counts = [0u64; 10];
            for &y in &labels {
                counts[y as usize] += 1;
            }
            for (c, &count) in counts.iter().enumerate() {
                assert!(
                    (count as f64 - 2_000.0).abs() < 500.0,
                    "class {c} has {count} of 20000 nodes"
                );
            }
            let g = csr(&Dataset::open(&out).unwrap());
            let mut same = 0u64;
            for v in 0..g.num_nodes() as u32 {
                same += g
                    .neighbors(v)
                    .iter()
                    .filter(|&&u| labels[u as usize] == labels[v as usize])
                    .count() as u64;
            }
            // Inter-class edges never land in their own class, so the
            // fraction of same-label edges is the homophily itself.
            let fraction = same as f64 / g.num_edges() as f64;
            assert!(
                (fraction - homophily).abs() < 0.05,
                "homophily {homophily}: same-label fraction {fraction}"
            );
        }
    }

    /// Accuracy on the test set of the nearest class mean, the means taken
    /// over the train set.
    fn nearest_mean_accuracy(ds: &Dataset, x: &[f32], d: usize) -> f64 {
        let c = ds.num_classes as usize;
        let mut sums = vec![0f64; c * d];
        let mut counts = vec![0f64; c];
        for (&s, &y) in ds.train.seeds.iter().zip(&ds.train.labels) {
            counts[y as usize] += 1.0;
            for j in 0..d {
                sums[y as usize * d + j] += x[s as usize * d + j] as f64;
            }
        }
        for (k, sum) in sums.iter_mut().enumerate() {
            *sum /= counts[k / d].max(1.0);
        }
        let mut correct = 0usize;
        for (&s, &y) in ds.test.seeds.iter().zip(&ds.test.labels) {
            let row = &x[s as usize * d..][..d];
            let best = (0..c)
                .map(|k| {
                    let dist: f64 = row
                        .iter()
                        .zip(&sums[k * d..][..d])
                        .map(|(&a, &m)| (a as f64 - m).powi(2))
                        .sum();
                    (dist, k)
                })
                .min_by(|a, b| a.0.total_cmp(&b.0))
                .unwrap()
                .1;
            correct += (best == y as usize) as usize;
        }
        correct as f64 / ds.test.seeds.len() as f64
    }

    #[test]
    fn neighbor_mean_beats_own_features() {
        let cfg = GeneratorConfig::default();
        let (_dir, out, _) = generated(&cfg);
        let ds = Dataset::open(&out).unwrap();
        let d = ds.feature_dim() as usize;
        let x = features_f32(&ds);
        let g = csr(&ds);
        let mut pooled = x.clone();
        for v in 0..g.num_nodes() as u32 {
            let row = &mut pooled[v as usize * d..][..d];
            for &u in g.neighbors(v) {
                for (p, &xu) in row.iter_mut().zip(&x[u as usize * d..][..d]) {
                    *p += xu;
                }
            }
            let scale = 1.0 / (g.degree(v) + 1) as f32;
            row.iter_mut().for_each(|p| *p *= scale);
        }
        let own = nearest_mean_accuracy(&ds, &x, d);
        let aggregated = nearest_mean_accuracy(&ds, &pooled, d);
        eprintln!("own features {own:.3}, with neighbors {aggregated:.3}");
        let chance = 1.0 / cfg.num_classes as f64;
        assert!(
            own > 3.0 * chance,
            "own-feature accuracy {own} is near chance"
        );
        assert!(
            aggregated > own + 0.2,
            "neighbor mean {aggregated} is not clearly better than own features {own}"
        );
    }

    #[test]
    fn f16_features_are_the_f32_features_rounded() {
        let cfg = small(3_000, 24);
        let (_d32, out32, s32) = generated(&cfg);
        let (_d16, out16, s16) = generated(&GeneratorConfig {
            dtype: DType::F16,
            ..cfg
        });
        assert_eq!(s16.dtype, "float16");
        let (ds32, ds16) = (
            Dataset::open(&out32).unwrap(),
            Dataset::open(&out16).unwrap(),
        );
        assert_eq!(ds16.features.dtype(), DType::F16);
        assert_eq!(
            s16.feature_bytes - 3_000 * 24 * 2,
            s32.feature_bytes - 3_000 * 24 * 4
        );
        let (x32, x16) = (features_f32(&ds32), features_f32(&ds16));
        assert_eq!(x32.len(), x16.len());
        for (i, (&a, &b)) in x32.iter().zip(&x16).enumerate() {
            assert_eq!(
                half::f16::from_f32(a).to_bits(),
                half::f16::from_f32(b).to_bits(),
                "element {i}: f32 {a}, f16 {b}"
            );
        }
        let (f32_files, f16_files) = (files(&out32), files(&out16));
        assert!(f32_files[layout::EDGES] == f16_files[layout::EDGES]);
        assert!(f32_files[layout::LABELS] == f16_files[layout::LABELS]);
    }

    #[test]
    fn every_class_gets_a_node_when_nodes_are_scarce() {
        // As many nodes as classes: random labels leave classes empty, which
        // the fix-up must fill, so the labels become a permutation.
        let cfg = GeneratorConfig {
            num_classes: 64,
            avg_degree: 4.0,
            homophily: 1.0,
            ..small(64, 3)
        };
        let (_dir, out, _) = generated(&cfg);
        let mut labels = node_labels(&out);
        labels.sort_unstable();
        assert_eq!(labels, (0..64).collect::<Vec<u64>>());
        let g = csr(&Dataset::open(&out).unwrap());
        assert!(g.num_edges() > 0);
        assert!((0..64).all(|v| !g.neighbors(v).contains(&v)));
    }

    #[test]
    fn propensity_cap_is_the_fixed_point() {
        let (n, avg, alpha) = (1_000_000u64, 10.0, 1.5);
        let c = propensity_cap(n, avg, alpha);
        let mean = 1.0 + (1.0 - c.powf(1.0 - alpha)) / (alpha - 1.0);
        // The capped node's expected degree is the structural cut-off.
        let top = avg * c / mean;
        assert!((top - (n as f64 * avg).sqrt()).abs() < 1e-3, "{top}");
    }

    #[test]
    fn bad_configs_name_the_parameter() {
        type Edit = fn(&mut GeneratorConfig);
        let cases: &[(Edit, &str)] = &[
            (|c| c.num_nodes = 1 << 32, "num_nodes"),
            (
                |c| c.num_nodes = 5,
                "num_nodes 5 must be at least num_classes",
            ),
            (|c| c.num_classes = 1, "num_classes"),
            (|c| c.feature_dim = 0, "feature_dim"),
            (|c| c.dtype = DType::F64, "dtype"),
            (|c| c.dtype = DType::I64, "dtype"),
            (|c| c.avg_degree = 0.0, "avg_degree"),
            (|c| c.avg_degree = f64::NAN, "avg_degree"),
            (|c| c.avg_degree = 1e9, "avg_degree"),
            (|c| c.homophily = 1.5, "homophily"),
            (|c| c.homophily = -0.1, "homophily"),
            (|c| c.power_law_exponent = 2.0, "power_law_exponent"),
            (|c| c.train_fraction = 0.0, "train_fraction"),
            (|c| c.valid_fraction = 0.95, "valid_fraction"),
            (|c| c.valid_fraction = -0.1, "valid_fraction"),
            (|c| c.signal = f32::INFINITY, "signal"),
        ];
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("graph");
        for (edit, want) in cases {
            let mut cfg = GeneratorConfig::default();
            edit(&mut cfg);
            match generate(&out, &cfg, false, false) {
                Err(Error::InvalidArgument(msg)) => {
                    assert!(msg.contains(want), "'{msg}' should mention '{want}'")
                }
                other => panic!("{cfg:?}: expected InvalidArgument, got {other:?}"),
            }
            assert!(!out.exists(), "a refused config left {}", out.display());
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
