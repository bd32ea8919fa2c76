//! The canonical dataset input: DGL GraphBolt's `OnDiskDataset` directory,
//! homogeneous ([`Dataset`]) or typed ([`TypedDataset`]). A `metadata.yaml`
//! names the nodes, the edges (`.npy` of shape `[2, E]` or a CSV of
//! `src,dst` lines), node features (`.npy`, f32 or f16, `N x d`), labels,
//! `num_classes` and the train, validation and test sets. Opening a dataset
//! validates everything that can be checked without reading the edges or
//! features; edge ids are checked as the edges stream past (see
//! [`EdgeList::for_each_chunk`]).
//!
//! The writer side ([`DatasetWriter`]) is used by the Parquet importer and the
//! synthetic generator; it builds in a temporary directory and renames it into
//! place last, so a dataset directory is either whole or absent.
//!
//! `metadata` holds the file's schema, `open` the validated [`Dataset`] and
//! the steps that open it, `typed` the typed dataset and its steps, `edges`,
//! `features` and `tasks` what each step checks, `checks` the checks they
//! share, `fingerprint` what identifies a dataset, and `writer` the writer
//! side.

mod checks;
mod edges;
mod features;
mod fingerprint;
mod link_task;
mod metadata;
mod open;
mod tasks;
mod typed;
mod writer;

pub use edges::{EdgeList, EdgeSource};
pub use fingerprint::file_fingerprint;
pub use link_task::{LinkTask, PairSet, RankedSet};
pub use metadata::{
    EdgeMeta, FeatureMeta, GraphMeta, METADATA_FILE, Metadata, NodeMeta, SetDataMeta, SetMeta,
    TaskMeta,
};
pub use open::Dataset;
pub use tasks::{SeedSet, Split, seeded_split};
pub use typed::{NodeType, Relation, TypedDataset, is_typed};
pub use writer::{Abandoned, DatasetSpec, DatasetWriter, TypedSpec, abandon_partial, layout};
