//! The `packer` program: ranks feature popularity over the sampled batches,
//! plans the four-level feature store and the segmented disk cache, and packs
//! the features into an object-store layout described by a manifest.
//! `main.rs` only parses flags and calls [`run`].

mod address_tables;
pub mod batched_pack;
pub mod belady;
pub mod cli;
mod commit;
pub mod crc;
pub mod error;
pub mod feature_source;
mod graph_rank;
pub mod heap;
mod job;
mod load;
mod memory;
pub mod pack;
pub mod plan;
mod region_writer;
pub mod verify;

pub mod access_rank;
pub mod disk_pages;
pub mod minhash;
pub mod plan_error;
pub mod segment_search;
pub mod store_dtype;
pub mod typed;

pub use cli::{Cli, run};
pub use offgnn_shared::sizes;
