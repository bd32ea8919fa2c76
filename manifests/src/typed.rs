//! The manifest of a typed graph's layout (format 6). Each node type with
//! features is a layout of its own, in the format a homogeneous layout has
//! (its tiers, segments and address tables over rows of that type's width
//! and dtype, its objects under the run's prefix); every batch's typed
//! topology (input nodes in homogenized ids, blocks with their relation
//! offsets, labels) is stored once beside them, one table object per split
//! and epoch. All parts share the sampled batch order.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{
    BatchRef, Dtype, Error, Manifest, Object, SamplesRef, Split, decode_valid, named_in,
    object_names,
};

/// The format of a typed graph's layout.
pub const TYPED_FORMAT_VERSION: u32 = 6;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TypedManifest {
    pub format_version: u32,
    pub run_id: String,
    pub created_by: String,
    pub dataset: TypedDatasetRef,
    pub samples: SamplesRef,
    /// In the dataset's order, which is the order of their homogenized id
    /// ranges.
    pub node_types: Vec<NodeTypePart>,
    /// `src:relation:dst`, in the order the blocks' relation offsets count.
    pub relations: Vec<String>,
    pub topology: Topology,
    /// Every object: each type's layout's, then the topology's.
    pub objects: Vec<Object>,
    /// What `--disk-budget` allowed, and what the layout takes.
    pub disk_budget: u64,
    pub disk_bytes: u64,
    /// The feature files' bytes with rows as the layout stores them: what
    /// a budget's multiple counts.
    pub feature_file_bytes: u64,
    pub blow_up: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TypedDatasetRef {
    pub name: String,
    /// Nodes of every type.
    pub num_nodes: u64,
    pub dataset_fingerprint: String,
    pub num_classes: u32,
    /// The type whose nodes carry the task (the seeds and their labels).
    pub target_type: String,
    /// Link prediction: the relation whose pairs the batches score (with
    /// `samples.link`); empty for node classification.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub link_relation: String,
}

/// One node type: its homogenized id range and, if it has features, its
/// rows' width and dtype and their layout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeTypePart {
    pub name: String,
    pub offset: u64,
    pub rows: u64,
    /// Values per row and how the layout stores them; absent with the
    /// layout for a type without features.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feature_dim: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<Dtype>,
    /// The type's layout: its batches' input rows of this type, in the
    /// order they appear among the batch's inputs, by type-local id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<Manifest>,
}

/// The batches' typed topology: one table object per split and sampled
/// epoch, a record per batch in the order the trainer consumes them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Topology {
    pub tables: Vec<TopologyTable>,
    /// `BatchRef::segment` is an index into `tables`.
    #[serde(with = "super::schedule_by_name")]
    pub schedule: BTreeMap<Split, Vec<Vec<BatchRef>>>,
    /// Bytes of the table objects.
    pub bytes: u64,
    /// The largest batch's shape, each figure the most of any batch (what
    /// the trainer's memory statement is built from); absent in layouts
    /// packed before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub largest_batch: Option<TypedBatchShape>,
}

/// A typed batch's shape: each figure, in a layout's `largest_batch`, the
/// most any of its batches has (so a statement built from it holds for
/// every batch).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TypedBatchShape {
    /// Input rows of each node type, in `node_types` order.
    pub inputs: Vec<u64>,
    /// Per block, input layer first.
    pub blocks: Vec<TypedBlockShape>,
}

/// One block of a typed batch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TypedBlockShape {
    /// Destination nodes of each node type.
    pub dst: Vec<u64>,
    /// Edges of each relation, in `relations` order.
    pub edges: Vec<u64>,
}

impl TypedBatchShape {
    /// The shape of no batch: every figure 0.
    pub fn zeros(types: usize, relations: usize, blocks: usize) -> TypedBatchShape {
        TypedBatchShape {
            inputs: vec![0; types],
            blocks: vec![
                TypedBlockShape {
                    dst: vec![0; types],
                    edges: vec![0; relations],
                };
                blocks
            ],
        }
    }

    /// Raises each figure to `other`'s where that is larger.
    pub fn widen(&mut self, other: &TypedBatchShape) {
        fn max_into(into: &mut Vec<u64>, from: &[u64]) {
            if into.len() < from.len() {
                into.resize(from.len(), 0);
            }
            for (a, &b) in into.iter_mut().zip(from) {
                *a = (*a).max(b);
            }
        }
        max_into(&mut self.inputs, &other.inputs);
        if self.blocks.len() < other.blocks.len() {
            self.blocks
                .resize(other.blocks.len(), TypedBlockShape::default());
        }
        for (a, b) in self.blocks.iter_mut().zip(&other.blocks) {
            max_into(&mut a.dst, &b.dst);
            max_into(&mut a.edges, &b.edges);
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TopologyTable {
    pub object: String,
    pub split: Split,
    pub epoch: u32,
    pub batches: u32,
}

#[derive(Deserialize)]
struct VersionProbe {
    format_version: u32,
}

/// Whether `bytes` hold a typed graph's manifest (judged by the format
/// version alone; parsing says the rest).
pub fn is_typed(bytes: &[u8]) -> bool {
    serde_json::from_slice::<VersionProbe>(bytes)
        .is_ok_and(|p| p.format_version == TYPED_FORMAT_VERSION)
}

impl TypedManifest {
    /// Parses and validates a typed layout's manifest.
    pub fn parse(origin: &str, bytes: &[u8]) -> Result<TypedManifest, Error> {
        let probe: VersionProbe = serde_json::from_slice(bytes).map_err(|e| Error::Malformed {
            origin: origin.to_string(),
            reason: e.to_string(),
        })?;
        match probe.format_version {
            TYPED_FORMAT_VERSION => {}
            v if v > TYPED_FORMAT_VERSION => {
                return Err(Error::FutureVersion {
                    origin: origin.to_string(),
                    found: v,
                });
            }
            v => {
                return Err(Error::Invalid {
                    origin: origin.to_string(),
                    reason: format!("format {v} is a homogeneous graph's layout, not a typed one"),
                });
            }
        }
        decode_valid(origin, bytes, TypedManifest::validate)
    }

    /// Checks every part and that the parts agree: contiguous id ranges,
    /// every object named once and safely, each type's layout valid and
    /// scheduled as the topology is.
    pub fn validate(&self) -> Result<(), String> {
        let names = object_names(&self.objects)?;
        let named = |n: &str| named_in(&names, n);
        self.validate_types(&named)?;
        for t in &self.topology.tables {
            named(&t.object)?;
        }
        for epochs in self.topology.schedule.values() {
            for refs in epochs {
                for r in refs {
                    let table = self
                        .topology
                        .tables
                        .get(r.segment as usize)
                        .ok_or_else(|| {
                            format!("the topology's schedule names table {}", r.segment)
                        })?;
                    if r.record >= table.batches {
                        return Err(format!(
                            "the topology's schedule names record {} of a table of {}",
                            r.record, table.batches
                        ));
                    }
                }
            }
        }
        if let Some(shape) = &self.topology.largest_batch {
            let (types, relations) = (self.node_types.len(), self.relations.len());
            let blocks = self.samples.fanouts.len();
            if shape.inputs.len() != types
                || shape.blocks.len() != blocks
                || shape
                    .blocks
                    .iter()
                    .any(|b| b.dst.len() != types || b.edges.len() != relations)
            {
                return Err(format!(
                    "the largest batch's shape is not of {types} node types, {relations} relations and {blocks} blocks"
                ));
            }
        }
        if !self
            .node_types
            .iter()
            .any(|t| t.name == self.dataset.target_type)
        {
            return Err(format!(
                "target type '{}' is not among the node types",
                self.dataset.target_type
            ));
        }
        let link = &self.dataset.link_relation;
        if self.samples.link.is_some() == link.is_empty() {
            return Err(
                "samples.link and dataset.link_relation come together (a link-prediction layout)"
                    .into(),
            );
        }
        if !link.is_empty() && !self.relations.contains(link) {
            return Err(format!("link relation '{link}' is not among the relations"));
        }
        Ok(())
    }

    fn validate_types(&self, named: &dyn Fn(&str) -> Result<(), String>) -> Result<(), String> {
        let shape = schedule_shape(&self.topology.schedule);
        let mut next = 0u64;
        for t in &self.node_types {
            if t.offset != next {
                return Err(format!(
                    "node type '{}' starts at {}, after {next} nodes of the types before",
                    t.name, t.offset
                ));
            }
            next = t.offset.saturating_add(t.rows);
            let Some(layout) = &t.layout else {
                if t.feature_dim.is_some() || t.dtype.is_some() {
                    return Err(format!("node type '{}' has a width but no layout", t.name));
                }
                continue;
            };
            layout
                .validate()
                .map_err(|e| format!("node type '{}': {e}", t.name))?;
            let d = &layout.dataset;
            if d.num_nodes != t.rows
                || t.feature_dim != Some(d.feature_dim)
                || t.dtype != Some(d.store_dtype())
            {
                return Err(format!(
                    "node type '{}': {} rows of {:?} x {:?}, its layout's are {} of {} x {}",
                    t.name,
                    t.rows,
                    t.feature_dim,
                    t.dtype,
                    d.num_nodes,
                    d.feature_dim,
                    d.store_dtype()
                ));
            }
            for o in &layout.objects {
                named(&o.name)?;
            }
            if schedule_shape(&layout.schedule) != shape {
                return Err(format!(
                    "node type '{}': its layout's schedule is not the topology's",
                    t.name
                ));
            }
        }
        if next != self.dataset.num_nodes {
            return Err(format!(
                "the node types hold {next} nodes, the dataset {}",
                self.dataset.num_nodes
            ));
        }
        Ok(())
    }

    /// The type's part, by name.
    pub fn node_type(&self, name: &str) -> Option<&NodeTypePart> {
        self.node_types.iter().find(|t| t.name == name)
    }
}

/// Batches per epoch of each split.
fn schedule_shape(schedule: &BTreeMap<Split, Vec<Vec<BatchRef>>>) -> Vec<(Split, Vec<usize>)> {
    schedule
        .iter()
        .map(|(s, epochs)| (*s, epochs.iter().map(Vec::len).collect()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn typed() -> TypedManifest {
        let paper = crate::tests::sample();
        let layers = paper.samples.fanouts.len();
        let topology = Object {
            name: "pack/topology-00000.bin".into(),
            size: 100,
            crc32c: 1,
        };
        let mut objects = paper.objects.clone();
        objects.push(topology.clone());
        TypedManifest {
            format_version: TYPED_FORMAT_VERSION,
            run_id: "r".into(),
            created_by: "test".into(),
            dataset: TypedDatasetRef {
                name: "d".into(),
                num_nodes: 15,
                dataset_fingerprint: "a".into(),
                num_classes: 2,
                target_type: "paper".into(),
                link_relation: String::new(),
            },
            samples: paper.samples.clone(),
            node_types: vec![
                NodeTypePart {
                    name: "paper".into(),
                    offset: 0,
                    rows: 10,
                    feature_dim: Some(4),
                    dtype: Some(Dtype::F32),
                    layout: Some(paper),
                },
                NodeTypePart {
                    name: "author".into(),
                    offset: 10,
                    rows: 5,
                    feature_dim: None,
                    dtype: None,
                    layout: None,
                },
            ],
            relations: vec!["author:writes:paper".into()],
            topology: Topology {
                tables: vec![TopologyTable {
                    object: topology.name,
                    split: Split::Train,
                    epoch: 0,
                    batches: 1,
                }],
                schedule: BTreeMap::from([(
                    Split::Train,
                    vec![vec![BatchRef {
                        segment: 0,
                        record: 0,
                    }]],
                )]),
                bytes: 100,
                largest_batch: Some(TypedBatchShape {
                    inputs: vec![6, 3],
                    blocks: vec![
                        TypedBlockShape {
                            dst: vec![4, 2],
                            edges: vec![5],
                        };
                        layers
                    ],
                }),
            },
            objects,
            disk_budget: 1 << 20,
            disk_bytes: 100,
            feature_file_bytes: 200,
            blow_up: 0.5,
        }
    }

    fn fails(m: &TypedManifest) -> String {
        TypedManifest::parse("m.json", &serde_json::to_vec(m).unwrap())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_typed_manifest_round_trips_and_is_told_apart() {
        let m = typed();
        let bytes = serde_json::to_vec(&m).unwrap();
        assert!(is_typed(&bytes));
        assert_eq!(TypedManifest::parse("m.json", &bytes).unwrap(), m);
        let plain = serde_json::to_vec(&crate::tests::sample()).unwrap();
        assert!(!is_typed(&plain));
        let err = TypedManifest::parse("m.json", &plain)
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a typed one"), "{err}");
    }

    #[test]
    fn parts_that_disagree_are_refused_by_name() {
        let mut m = typed();
        m.node_types[1].offset = 11;
        assert!(fails(&m).contains("'author' starts at 11"));

        let mut m = typed();
        m.node_types[0].feature_dim = Some(8);
        assert!(fails(&m).contains("node type 'paper'"));

        let mut m = typed();
        m.topology.tables[0].batches = 2;
        m.topology.schedule.get_mut(&Split::Train).unwrap()[0].push(BatchRef {
            segment: 0,
            record: 1,
        });
        assert!(fails(&m).contains("its layout's schedule is not the topology's"));

        let mut m = typed();
        m.objects.retain(|o| !o.name.contains("segment"));
        assert!(fails(&m).contains("is not among the manifest's objects"));

        let mut m = typed();
        m.dataset.target_type = "venue".into();
        assert!(fails(&m).contains("target type 'venue'"));

        let mut m = typed();
        m.dataset.num_nodes = 16;
        assert!(fails(&m).contains("the node types hold 15 nodes"));

        let mut m = typed();
        m.topology.schedule.get_mut(&Split::Train).unwrap()[0][0].record = 3;
        assert!(fails(&m).contains("names record 3"));

        let mut m = typed();
        m.topology.largest_batch.as_mut().unwrap().blocks[0]
            .edges
            .push(1);
        assert!(fails(&m).contains("the largest batch's shape"));
    }

    #[test]
    fn shapes_widen_figure_by_figure() {
        let mut a = TypedBatchShape {
            inputs: vec![3, 1],
            blocks: vec![TypedBlockShape {
                dst: vec![2, 0],
                edges: vec![4],
            }],
        };
        a.widen(&TypedBatchShape {
            inputs: vec![1, 5],
            blocks: vec![TypedBlockShape {
                dst: vec![1, 1],
                edges: vec![7],
            }],
        });
        assert_eq!(a.inputs, [3, 5]);
        assert_eq!(a.blocks[0].dst, [2, 1]);
        assert_eq!(a.blocks[0].edges, [7]);
        // A layout without the shape still parses (packed before it was
        // recorded).
        let mut m = typed();
        m.topology.largest_batch = None;
        let topology = serde_json::to_string(&m.topology).unwrap();
        assert!(!topology.contains("largest_batch"), "{topology}");
        let bytes = serde_json::to_vec(&m).unwrap();
        assert_eq!(TypedManifest::parse("m.json", &bytes).unwrap(), m);
    }
}
