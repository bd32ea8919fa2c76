//! Shared building blocks of offgnn: dataset formats (GraphBolt `OnDiskDataset`,
//! `.npy`), the samples' schema, and progress reporting. See `docs/design.md` for
//! how the three programs use them.

pub mod address_table;
pub mod commit;
pub mod dataset;
pub mod disk_probe;
pub mod error;
pub mod io_engine;
pub mod lease;
pub mod npy;
pub mod prefetch;
pub mod progress;
pub mod report;
pub mod samples;
pub mod signals;
pub mod sizes;
pub mod store;

pub use error::{Error, Result};
