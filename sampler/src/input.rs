//! What a sampling run reads: a dataset of one node type or a typed one
//! ([`Input`]), and the graph it samples from ([`Graph`]), with what the
//! run states of each (memory, summary).

use std::time::Instant;

use offgnn_shared::dataset::{Dataset, SeedSet, Split, TypedDataset, file_fingerprint};
use offgnn_shared::npy::DType;
use offgnn_shared::samples::{DatasetInfo, NodeTypeInfo};

use crate::config::SampleConfig;
use crate::error::Result;
use crate::memory::InputShape;
use crate::topology::{Csr, CsrOptions};
use crate::typed_sampling::{RelationFanouts, TypedGraph};

/// The dataset a run samples.
#[derive(Clone, Copy)]
pub enum Input<'a> {
    Plain(&'a Dataset),
    Typed(&'a TypedDataset),
}

/// The graph a run samples from.
pub enum Graph {
    Plain(Csr),
    /// Every relation's CSR, and the fan-outs per layer and relation.
    Typed(TypedGraph, RelationFanouts),
}

impl Input<'_> {
    pub fn fingerprint(&self) -> Result<String> {
        Ok(match self {
            Input::Plain(ds) => ds.fingerprint()?,
            Input::Typed(ds) => ds.fingerprint()?,
        })
    }

    pub fn split(&self, split: Split) -> &SeedSet {
        match self {
            Input::Plain(ds) => ds.split(split),
            Input::Typed(ds) => ds.split(split),
        }
    }

    pub fn root(&self) -> &std::path::Path {
        match self {
            Input::Plain(ds) => &ds.root,
            Input::Typed(ds) => &ds.root,
        }
    }

    /// What the memory statement needs of it.
    pub fn shape(&self, cfg: &SampleConfig) -> InputShape {
        match self {
            Input::Plain(ds) => InputShape::of(ds, cfg),
            Input::Typed(ds) => InputShape::of_typed(ds, &cfg.relation_fanouts),
        }
    }

    /// Builds the sampling graph on the pool, each relation's build holding
    /// up to `hold_bytes` ([`crate::topology::CsrOptions::hold_bytes`]),
    /// showing progress over `edges` (all relations'); returns it with the
    /// seconds it took.
    pub fn build_graph(
        &self,
        cfg: &SampleConfig,
        hold_bytes: u64,
        pool: &rayon::ThreadPool,
    ) -> Result<(Graph, f64)> {
        let started = Instant::now();
        let edges: u64 = match self {
            Input::Plain(ds) => ds.edges.len_hint().unwrap_or(0),
            Input::Typed(ds) => ds
                .relations
                .iter()
                .map(|r| r.edges.len_hint().unwrap_or(0))
                .sum(),
        };
        // Two passes over the edges (count, then fill); the second counts
        // nothing where the first pass's chunks are held.
        let bar =
            offgnn_shared::progress::bar_if(cfg.show_progress, edges * 2, "topology", "edges");
        let graph = match self {
            Input::Plain(ds) => {
                let opts = CsrOptions {
                    hold_bytes,
                    ..cfg.csr
                };
                let csr = pool.install(|| Csr::from_edge_list(&ds.edges, opts, |n| bar.inc(n)))?;
                Graph::Plain(csr)
            }
            Input::Typed(ds) => {
                let layers = RelationFanouts {
                    layers: cfg.relation_fanouts.clone(),
                };
                let g = pool.install(|| {
                    TypedGraph::from_dataset(ds, cfg.csr.dedup, hold_bytes, |n| bar.inc(n))
                })?;
                Graph::Typed(g, layers)
            }
        };
        bar.finish_and_clear();
        Ok((graph, started.elapsed().as_secs_f64()))
    }

    /// What the run's summaries say of the dataset.
    pub fn info(&self, graph: &Graph) -> Result<DatasetInfo> {
        Ok(match self {
            Input::Plain(ds) => DatasetInfo {
                name: ds.name.clone(),
                location: absolute(&ds.root),
                fingerprint: ds.fingerprint()?,
                feature_fingerprint: file_fingerprint(ds.features.path())?,
                num_nodes: ds.num_nodes,
                num_classes: ds.num_classes,
                feature_dim: ds.feature_dim(),
                feature_dtype: ds.features.dtype(),
                graph_edges: graph.num_edges(),
                node_types: Vec::new(),
                relations: Vec::new(),
                target_type: String::new(),
                link_relation: String::new(),
            },
            Input::Typed(ds) => {
                let mut node_types = Vec::with_capacity(ds.node_types.len());
                for t in &ds.node_types {
                    node_types.push(NodeTypeInfo {
                        name: t.name.clone(),
                        num: t.num,
                        offset: t.offset,
                        feature_dim: t.features.as_ref().map(|f| f.shape()[1]),
                        feature_dtype: t.features.as_ref().map(|f| f.dtype()),
                        feature_fingerprint: t
                            .features
                            .as_ref()
                            .map(|f| file_fingerprint(f.path()))
                            .transpose()?,
                    });
                }
                let target = &node_types[ds.target];
                DatasetInfo {
                    name: ds.name.clone(),
                    location: absolute(&ds.root),
                    fingerprint: ds.fingerprint()?,
                    feature_fingerprint: target.feature_fingerprint.clone().unwrap_or_default(),
                    num_nodes: ds.num_nodes(),
                    num_classes: ds.num_classes,
                    feature_dim: target.feature_dim.unwrap_or(0),
                    feature_dtype: target.feature_dtype.unwrap_or(DType::F32),
                    graph_edges: graph.num_edges(),
                    relations: ds.relations.iter().map(|r| r.name.clone()).collect(),
                    target_type: target.name.clone(),
                    link_relation: String::new(),
                    node_types,
                }
            }
        })
    }
}

impl Graph {
    pub fn num_nodes(&self) -> u64 {
        match self {
            Graph::Plain(csr) => csr.num_nodes(),
            Graph::Typed(g, _) => g.num_nodes(),
        }
    }

    pub fn num_edges(&self) -> u64 {
        match self {
            Graph::Plain(csr) => csr.num_edges(),
            Graph::Typed(g, _) => g.num_edges(),
        }
    }

    pub fn duplicates_dropped(&self) -> u64 {
        match self {
            Graph::Plain(csr) => csr.duplicates_dropped(),
            Graph::Typed(g, _) => g.duplicates_dropped(),
        }
    }

    /// The CSR of a graph of one edge type.
    pub fn plain(&self) -> Option<&Csr> {
        match self {
            Graph::Plain(csr) => Some(csr),
            Graph::Typed(..) => None,
        }
    }
}

/// `root` as an absolute path where it can be made one: the run summary
/// records where the dataset is, for readers in other directories
/// (`packer --rank-by graph`).
fn absolute(root: &std::path::Path) -> String {
    std::fs::canonicalize(root)
        .unwrap_or_else(|_| root.to_path_buf())
        .display()
        .to_string()
}
