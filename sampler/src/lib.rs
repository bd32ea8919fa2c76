//! The `sampler` program: offline neighbor sampling of GNN mini-batches, and
//! the dataset tools that feed it (`generate`, `import-parquet`, `inspect`,
//! `split-edges`, `derive-features`).
//! `main.rs` only parses flags and calls [`run`].
//!
//! Output layout and Parquet schema: [`offgnn_shared::samples`] (one row per
//! mini-batch; `run.json` written last as the commit point). Sampling itself:
//! [`neighbor_sampling`] over the graph in CSR ([`topology`]); planning,
//! threads, shards and commit: [`sample_run`], as [`config`] asks, its files
//! written by `sample_files`; which
//! shard an array job's task samples: [`array_job`]. The datasets it reads
//! come from the [`synthetic`] generator or the [`parquet_import`] importer;
//! [`edge_split`] holds out edges for link prediction and
//! [`derived_features`] gives typed graphs' featureless types their rows.

#![forbid(unsafe_code)]

pub mod array_job;
mod batches;
pub mod cli;
pub mod config;
pub mod derived_features;
pub mod edge_split;
pub mod error;
pub mod input;
pub mod link_sampling;
pub mod memory;
pub mod neighbor_sampling;
pub mod parquet_import;
mod parquet_out;
mod sample_files;
pub mod sample_run;
mod shards;
pub mod synthetic;
pub mod topology;
pub mod typed_sampling;

pub use cli::{Cli, run};
