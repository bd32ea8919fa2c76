//! End-to-end: the three binaries as a user runs them. One file per
//! program (`sampler`, `packer`, `trainer`), whole runs (`pipeline`), and
//! one per topic that crosses them; the shared fixtures are in `tests/lib.rs`.

mod bad_input;
mod concurrency;
mod cpu_cache;
mod distributed;
mod export;
mod faults;
mod full_disk;
mod help;
mod historical;
mod link;
mod link_only;
mod loader;
mod packer;
mod pipeline;
mod s3;
mod sampler;
mod signals;
mod slurm;
mod trainer;
mod typed;
mod typed_link;
