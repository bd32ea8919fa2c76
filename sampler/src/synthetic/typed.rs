//! Typed synthetic graphs with IGBH's schema (the graph MLPerf's R-GAT
//! trains on): papers, authors, institutes and fields of study (`fos`);
//! `paper:cites:paper` (written both ways), `paper:written_by:author`,
//! `author:affiliated_to:institute`, `paper:topic:fos`, and the reverse of
//! each bipartite relation (`rev_written_by`, `rev_affiliated_to`,
//! `rev_topic`), as the IGBH loaders of MLPerf's reference add them. The
//! task classifies papers.
//!
//! The model is the homogeneous generator's (see the parent module) over
//! every type: each node of each type belongs to one of `C` communities
//! (a paper's is its label) and has a power-law propensity; each relation's
//! source `u` starts about `mean_out * theta_u / mean(theta)` edges, each
//! to a destination of `u`'s community with probability `homophily`, else
//! of another, drawn by propensity. Each type's features carry its
//! community's mean (`signal * mu`) plus unit noise, so a paper's class
//! shows in its own features, its citations, its authors and its topics.
//! Type counts are the paper count times fixed ratios (below).

use std::path::Path;
use std::time::Instant;

use offgnn_shared::dataset::{DatasetWriter, Split, TypedSpec, layout, seeded_split};
use offgnn_shared::error::{Error, Result};

use super::{
    ClassSamplers, EdgeFiles, EdgeJob, FeatureJob, GeneratorConfig, Population, draw_nodes,
    draw_out_counts, progress_bar, stream_seed, write_labels,
};

/// The node types and their counts per paper.
pub const NODE_TYPES: [(&str, f64); 4] = [
    ("paper", 1.0),
    ("author", 2.0),
    ("institute", 1.0 / 64.0),
    ("fos", 1.0 / 16.0),
];

/// One relation of the schema: source and destination types (indices into
/// [`NODE_TYPES`]), its name, the mean edges each source node starts, and
/// the name of its reverse (`None`: written both ways in one file).
struct RelationSpec {
    src: usize,
    name: &'static str,
    dst: usize,
    mean_out: f64,
    reverse: Option<&'static str>,
}

const RELATIONS: [RelationSpec; 4] = [
    RelationSpec {
        src: 0,
        name: "cites",
        dst: 0,
        mean_out: 5.0,
        reverse: None,
    },
    RelationSpec {
        src: 0,
        name: "written_by",
        dst: 1,
        mean_out: 3.0,
        reverse: Some("rev_written_by"),
    },
    RelationSpec {
        src: 1,
        name: "affiliated_to",
        dst: 2,
        mean_out: 1.0,
        reverse: Some("rev_affiliated_to"),
    },
    RelationSpec {
        src: 0,
        name: "topic",
        dst: 3,
        mean_out: 3.0,
        reverse: Some("rev_topic"),
    },
];

// Stream tags of the typed generator's own draws (the parent's tags sit
// below 8; a type's are offset by its part, see `Population::part`).
const STREAM_RELATION_DEGREES: u64 = 16;
const STREAM_RELATION_EDGES: u64 = 17;
const STREAM_TYPED_SPLIT: u64 = 18;

/// A node type's drawn communities and propensities.
type Drawn = (Vec<u32>, Vec<f32>);

/// What [`generate_typed`] wrote.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TypedGenerateSummary {
    pub node_types: Vec<TypeSummary>,
    pub relations: Vec<RelationSummary>,
    pub feature_dim: u64,
    pub dtype: String,
    /// The feature files' bytes, headers included.
    pub feature_bytes: u64,
    pub edge_bytes: u64,
    pub seconds: f64,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct TypeSummary {
    pub name: String,
    pub nodes: u64,
    pub features: bool,
    pub feature_dim: Option<u64>,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct RelationSummary {
    pub name: String,
    pub edges: u64,
}

/// The node count of each type for `papers` papers: at least one node per
/// class, so that every community has members.
pub fn type_counts(papers: u64, classes: u32) -> Vec<u64> {
    NODE_TYPES
        .iter()
        .map(|&(_, per_paper)| ((papers as f64 * per_paper).round() as u64).max(classes as u64))
        .collect()
}

fn relation_name(src: usize, name: &str, dst: usize) -> String {
    format!("{}:{name}:{}", NODE_TYPES[src].0, NODE_TYPES[dst].0)
}

/// Which types of the typed schema have feature files, and how wide.
#[derive(Clone, Debug, Default)]
pub struct TypedFeatures {
    /// Types written without a feature file.
    pub without: Vec<String>,
    /// Types whose rows are not `cfg.feature_dim` wide.
    pub widths: Vec<(String, u64)>,
}

impl TypedFeatures {
    /// Every type `cfg.feature_dim` wide but `types`, which have none.
    pub fn without(types: &[&str]) -> Self {
        TypedFeatures {
            without: types.iter().map(|t| t.to_string()).collect(),
            widths: Vec::new(),
        }
    }

    fn check(&self) -> Result<()> {
        let named = self
            .without
            .iter()
            .map(|t| ("--no-features", t))
            .chain(self.widths.iter().map(|(t, _)| ("--type-dims", t)));
        for (flag, t) in named {
            if !NODE_TYPES.iter().any(|(n, _)| n == t) {
                return Err(Error::InvalidArgument(format!(
                    "{flag} names '{t}', which is not a node type of this schema ({})",
                    NODE_TYPES.map(|(n, _)| n).join(", ")
                )));
            }
        }
        if let Some((t, _)) = self.widths.iter().find(|(_, d)| *d == 0) {
            return Err(Error::InvalidArgument(format!(
                "--type-dims {t}=0: a type's width is positive (or name it in --no-features)"
            )));
        }
        if let Some(t) = self.without.iter().find(|t| self.width(t).is_some()) {
            return Err(Error::InvalidArgument(format!(
                "'{t}' is in both --no-features and --type-dims"
            )));
        }
        Ok(())
    }

    fn width(&self, name: &str) -> Option<u64> {
        self.widths.iter().find(|(t, _)| t == name).map(|&(_, d)| d)
    }
}

/// Generates a typed dataset into `out`: `cfg.num_nodes` papers, the other
/// types in proportion ([`NODE_TYPES`]), every type `cfg.feature_dim` wide
/// but those `features` names (another width, or no feature file).
pub fn generate_typed(
    out: &Path,
    cfg: &GeneratorConfig,
    features: &TypedFeatures,
    overwrite: bool,
    show_progress: bool,
) -> Result<TypedGenerateSummary> {
    super::validate(cfg)?;
    features.check()?;
    if features.without.iter().any(|t| t == "paper") {
        return Err(Error::InvalidArgument(
            "--no-features paper: the papers carry the task and keep their features".into(),
        ));
    }
    let counts = type_counts(cfg.num_nodes, cfg.num_classes);
    let total: u64 = counts.iter().sum();
    if total >= 1 << 32 {
        return Err(Error::InvalidArgument(format!(
            "{} papers make {total} nodes of all types: node ids are 32-bit, so at most {}",
            cfg.num_nodes,
            u32::MAX
        )));
    }
    let start = Instant::now();
    let writer = DatasetWriter::create(out, overwrite)?;
    tracing::info!(
        papers = cfg.num_nodes,
        nodes = total,
        dim = cfg.feature_dim,
        classes = cfg.num_classes,
        seed = cfg.seed,
        "generating a typed graph (IGBH's schema) into {}",
        out.display()
    );
    let populations: Vec<Drawn> = counts
        .iter()
        .enumerate()
        .map(|(t, &num)| {
            draw_nodes(&Population {
                num,
                classes: cfg.num_classes,
                exponent: cfg.power_law_exponent,
                avg_degree: cfg.avg_degree,
                seed: cfg.seed,
                part: t as u64 + 1,
            })
        })
        .collect();

    let (relations, edge_bytes) = write_relations(&writer, cfg, &populations, show_progress)?;
    let (node_types, feature_bytes) = write_features(
        &writer,
        cfg,
        (&counts, &populations),
        features,
        show_progress,
    )?;
    let paper_labels = &populations[0].0;
    write_labels(&writer.path(&layout::typed_labels("paper")), paper_labels)?;
    let splits = seeded_split(
        counts[0],
        cfg.train_fraction,
        cfg.valid_fraction,
        cfg.test_fraction,
        stream_seed(cfg.seed, STREAM_TYPED_SPLIT, 0),
    )?;
    for (split, seeds) in Split::ALL.into_iter().zip(&splits) {
        let labels: Vec<u64> = seeds
            .iter()
            .map(|&s| paper_labels[s as usize] as u64)
            .collect();
        writer.write_typed_split("paper", split, seeds, &labels)?;
    }
    writer.commit_typed(&TypedSpec {
        name: cfg.name.clone(),
        node_types: node_types
            .iter()
            .map(|t| (t.name.clone(), t.nodes, t.features))
            .collect(),
        relations: relations.iter().map(|r| r.name.clone()).collect(),
        target: "paper".into(),
        num_classes: cfg.num_classes,
        node_labels: true,
    })?;
    let summary = TypedGenerateSummary {
        node_types,
        relations,
        feature_dim: cfg.feature_dim,
        dtype: cfg.dtype.name().to_string(),
        feature_bytes,
        edge_bytes,
        seconds: start.elapsed().as_secs_f64(),
    };
    tracing::info!(seconds = summary.seconds, "wrote {}", out.display());
    Ok(summary)
}

/// Writes every relation's edges (and reverses); returns each relation's
/// edge count and the edge files' bytes.
fn write_relations(
    writer: &DatasetWriter,
    cfg: &GeneratorConfig,
    populations: &[Drawn],
    show_progress: bool,
) -> Result<(Vec<RelationSummary>, u64)> {
    let mut edge_bytes = 0u64;
    let mut relations = Vec::new();
    for (r, rel) in RELATIONS.iter().enumerate() {
        let (src_labels, src_theta) = &populations[rel.src];
        let (dst_labels, dst_theta) = &populations[rel.dst];
        let part = (r as u64 + 1) << 8;
        let out_counts = draw_out_counts(
            rel.mean_out,
            src_theta,
            cfg.seed,
            STREAM_RELATION_DEGREES + part,
        );
        let dst = ClassSamplers::build(cfg.num_classes as usize, dst_labels, dst_theta);
        let job = EdgeJob {
            seed: cfg.seed,
            stream: STREAM_RELATION_EDGES + part,
            homophily: cfg.homophily,
            src_labels,
            out_counts: &out_counts,
            dst: &dst,
            same_type: rel.src == rel.dst,
        };
        let name = relation_name(rel.src, rel.name, rel.dst);
        let reverse = rel.reverse.map(|r| relation_name(rel.dst, r, rel.src));
        let fwd_path = writer.path(&layout::typed_edges(&name));
        let rev_path = reverse
            .as_ref()
            .map(|r| writer.path(&layout::typed_edges(r)));
        let files = match &rev_path {
            None => EdgeFiles::Symmetric(&fwd_path),
            Some(rev) => EdgeFiles::Paired(&fwd_path, rev),
        };
        let edges = job.write(files, &|total| {
            progress_bar(show_progress, || {
                offgnn_shared::progress::bar(total, "edges", &name)
            })
        })?;
        for name in std::iter::once(name).chain(reverse) {
            edge_bytes += file_len(&writer.path(&layout::typed_edges(&name)))?;
            relations.push(RelationSummary { name, edges });
        }
    }
    Ok((relations, edge_bytes))
}

/// Writes every type's feature file but the featureless types'; returns
/// each type's summary and the feature files' bytes.
fn write_features(
    writer: &DatasetWriter,
    cfg: &GeneratorConfig,
    (counts, populations): (&[u64], &[Drawn]),
    typed: &TypedFeatures,
    show_progress: bool,
) -> Result<(Vec<TypeSummary>, u64)> {
    let mut feature_bytes = 0u64;
    let mut node_types = Vec::new();
    for (t, (&(name, _), (labels, _))) in NODE_TYPES.iter().zip(populations).enumerate() {
        let features = !typed.without.iter().any(|f| f == name);
        let dim = typed.width(name).unwrap_or(cfg.feature_dim);
        if features {
            let path = writer.path(&layout::typed_features(name));
            let bytes = counts[t] * dim * cfg.dtype.size() as u64;
            let cfg = GeneratorConfig {
                feature_dim: dim,
                ..cfg.clone()
            };
            FeatureJob::of(&cfg, t as u64 + 1).write(
                &path,
                labels,
                progress_bar(show_progress, || {
                    offgnn_shared::progress::bytes_bar(bytes, &format!("{name} features"))
                }),
            )?;
            feature_bytes += file_len(&path)?;
        }
        node_types.push(TypeSummary {
            name: name.to_string(),
            nodes: counts[t],
            features,
            feature_dim: features.then_some(dim),
        });
    }
    Ok((node_types, feature_bytes))
}

fn file_len(path: &Path) -> Result<u64> {
    Ok(std::fs::metadata(path)
        .map_err(|e| Error::io(path, e))?
        .len())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use offgnn_shared::dataset::TypedDataset;

    fn cfg(papers: u64) -> GeneratorConfig {
        GeneratorConfig {
            num_nodes: papers,
            feature_dim: 32,
            ..GeneratorConfig::default()
        }
    }

    /// Every file of the dataset at `root`, by relative path.
    fn files(root: &Path) -> BTreeMap<String, Vec<u8>> {
        let mut out = BTreeMap::new();
        for sub in ["edges", "data", "set"] {
            for entry in std::fs::read_dir(root.join(sub)).unwrap() {
                let path = entry.unwrap().path();
                let rel = format!("{sub}/{}", path.file_name().unwrap().to_string_lossy());
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
        out
    }

    fn edges(ds: &TypedDataset, name: &str) -> Vec<(u64, u64)> {
        let r = ds.relations.iter().find(|r| r.name == name).unwrap();
        let mut out = Vec::new();
        r.edges
            .for_each_chunk(1 << 16, |s, d| {
                out.extend(s.iter().copied().zip(d.iter().copied()));
                Ok::<_, Error>(())
            })
            .unwrap();
        out
    }

    fn rows(ds: &TypedDataset, t: usize) -> Vec<f32> {
        let f = ds.node_types[t].features.as_ref().unwrap();
        let mut raw = vec![0u8; f.header().data_bytes().unwrap() as usize];
        f.read_data_at(0, &mut raw).unwrap();
        raw.chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn the_igbh_schema_opens_typed_and_the_bytes_depend_on_the_seed_alone() {
        let cfg = cfg(4_000);
        let run = |threads: usize, cfg: &GeneratorConfig| {
            let dir = tempfile::tempdir().unwrap();
            let out = dir.path().join("igbh");
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let summary = pool
                .install(|| {
                    generate_typed(
                        &out,
                        cfg,
                        &TypedFeatures::without(&["institute"]),
                        false,
                        false,
                    )
                })
                .unwrap();
            (dir, out, summary)
        };
        let (_dir, out, summary) = run(1, &cfg);
        let ds = TypedDataset::open(&out).unwrap();
        let counts = type_counts(4_000, cfg.num_classes);
        let types: Vec<(&str, u64)> = ds
            .node_types
            .iter()
            .map(|t| (t.name.as_str(), t.num))
            .collect();
        assert_eq!(
            types,
            [
                ("paper", counts[0]),
                ("author", counts[1]),
                ("institute", counts[2]),
                ("fos", counts[3])
            ]
        );
        assert!(ds.node_types[2].features.is_none());
        assert!(
            ds.node_types
                .iter()
                .all(|t| t.name == "institute"
                    || t.features.as_ref().unwrap().shape() == [t.num, 32])
        );
        let names: Vec<&str> = ds.relations.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "paper:cites:paper",
                "paper:written_by:author",
                "author:rev_written_by:paper",
                "author:affiliated_to:institute",
                "institute:rev_affiliated_to:author",
                "paper:topic:fos",
                "fos:rev_topic:paper"
            ]
        );
        // Every bipartite relation's reverse is its edges turned round;
        // citations are written both ways, never to the paper itself.
        for (fwd, rev) in [
            ("paper:written_by:author", "author:rev_written_by:paper"),
            (
                "author:affiliated_to:institute",
                "institute:rev_affiliated_to:author",
            ),
            ("paper:topic:fos", "fos:rev_topic:paper"),
        ] {
            let turned: Vec<(u64, u64)> = edges(&ds, rev).iter().map(|&(a, b)| (b, a)).collect();
            assert_eq!(edges(&ds, fwd), turned, "{rev}");
        }
        let cites = edges(&ds, "paper:cites:paper");
        assert!(cites.iter().all(|(u, v)| u != v));
        assert!(cites.chunks(2).all(|p| p[0] == (p[1].1, p[1].0)));
        assert_eq!(summary.relations[0].edges as usize, cites.len());
        // The task is on papers, labelled.
        assert_eq!(ds.node_types[ds.target].name, "paper");
        assert_eq!(ds.train.seeds.len(), 400);

        let one = files(&out);
        let (_d2, out2, _) = run(2, &cfg);
        assert!(one == files(&out2), "1 and 2 threads differ");
        let (_d3, out3, _) = run(2, &GeneratorConfig { seed: 1, ..cfg });
        let other = files(&out3);
        for name in [
            "edges/paper__written_by__author.npy",
            "data/author-feat.npy",
        ] {
            assert!(one[name] != other[name], "{name} ignores the seed");
        }
    }

    /// The class of a paper shows through its authors: the mean of a
    /// paper's authors' features, matched to the nearest class centroid of
    /// the training papers' author means, names the paper's class far above
    /// chance (1/16). Authors drawn without regard to the class would
    /// leave it at chance.
    #[test]
    fn a_papers_class_shows_in_its_authors_features() {
        // The signal suits 128-d rows, as the homogeneous generator's does.
        let cfg = GeneratorConfig {
            feature_dim: 128,
            ..cfg(6_000)
        };
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("igbh");
        generate_typed(&out, &cfg, &TypedFeatures::default(), false, false).unwrap();
        let ds = TypedDataset::open(&out).unwrap();
        let d = 128;
        let authors = rows(&ds, 1);
        let papers = ds.node_types[0].num as usize;
        let mut sums = vec![0f32; papers * d];
        let mut counts = vec![0u32; papers];
        for (p, a) in edges(&ds, "paper:written_by:author") {
            let (p, a) = (p as usize, a as usize);
            for k in 0..d {
                sums[p * d + k] += authors[a * d + k];
            }
            counts[p] += 1;
        }
        let labels = &ds.node_types[0].labels.as_ref().unwrap().1;
        let classes = cfg.num_classes as usize;
        let mut centroids = vec![0f32; classes * d];
        let mut members = vec![0u32; classes];
        for &s in &ds.train.seeds {
            let (p, c) = (s as usize, labels[s as usize] as usize);
            if counts[p] > 0 {
                for k in 0..d {
                    centroids[c * d + k] += sums[p * d + k] / counts[p] as f32;
                }
                members[c] += 1;
            }
        }
        for c in 0..classes {
            for k in 0..d {
                centroids[c * d + k] /= members[c].max(1) as f32;
            }
        }
        let (mut right, mut total) = (0, 0);
        for &s in &ds.test.seeds {
            let p = s as usize;
            if counts[p] == 0 {
                continue;
            }
            let dist = |c: usize| -> f32 {
                (0..d)
                    .map(|k| (sums[p * d + k] / counts[p] as f32 - centroids[c * d + k]).powi(2))
                    .sum()
            };
            let best = (0..classes)
                .min_by(|&a, &b| dist(a).total_cmp(&dist(b)))
                .unwrap();
            right += (best as u64 == labels[p]) as u32;
            total += 1;
        }
        let accuracy = right as f64 / total as f64;
        assert!(
            accuracy > 0.4,
            "the authors' features name the paper's class {accuracy:.3} of the time"
        );
    }

    #[test]
    fn no_features_names_a_type_of_the_schema_other_than_paper() {
        let dir = tempfile::tempdir().unwrap();
        let err = generate_typed(
            &dir.path().join("a"),
            &cfg(100),
            &TypedFeatures::without(&["venue"]),
            false,
            false,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("'venue', which is not a node type"), "{err}");
        let err = generate_typed(
            &dir.path().join("b"),
            &cfg(100),
            &TypedFeatures::without(&["paper"]),
            false,
            false,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("the papers carry the task"), "{err}");
        let widths = TypedFeatures {
            widths: vec![("author".into(), 0)],
            ..Default::default()
        };
        let err = generate_typed(&dir.path().join("c"), &cfg(100), &widths, false, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--type-dims author=0"), "{err}");
        for d in ["a", "b", "c"] {
            assert!(!dir.path().join(d).exists());
        }
    }
}
