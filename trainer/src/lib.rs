//! The `trainer` program: trains GraphSAGE or GAT from a packed feature
//! layout through a pipelined loop, with libtorch via `tch`. `main.rs` only
//! parses flags and calls [`run`]; the command line lives in [`cli`].

pub mod cli;
pub mod cuda;
pub mod device;
pub mod distributed;
pub mod error;
pub mod export;
pub mod hetero;
pub mod historical;
pub mod inference;
pub mod io_depth;
pub mod layout;
pub mod link;
pub mod loader;
pub mod memory;
pub mod model;
pub mod pipeline;
pub mod runtime;
pub mod staging;
#[doc(hidden)]
pub mod test_hooks;
pub mod train;
pub mod user_cache;
pub mod verified;

pub use cli::{Cli, Command, ExportArgs, Features, InferArgs, Model, OnOff, TrainArgs, run};
pub use runtime::{OMP_WAIT_POLICY, passive_openmp_where_it_helps, retain_freed_memory};
