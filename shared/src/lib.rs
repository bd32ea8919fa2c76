//! Shared building blocks of offgnn: dataset formats (GraphBolt `OnDiskDataset`,
//! `.npy`, Parquet import), the graph in CSR, synthetic graphs, and progress
//! reporting. See `DESIGN.md` for how the three programs use them.

pub mod address_table;
pub mod commit;
pub mod dataset;
pub mod disk_probe;
pub mod error;
pub mod io_engine;
pub mod npy;
pub mod parquet_import;
pub mod prefetch;
pub mod progress;
pub mod report;
pub mod samples;
pub mod signals;
pub mod sizes;
pub mod store;
pub mod store_faults;
pub mod synthetic;
pub mod topology;

pub use error::{Error, Result};
