//! What the stages read, built once per job: where input rows come from,
//! the raw feature file (naive mode), and the cache tiers' rows and tensor.

use std::sync::Arc;

use offgnn_shared::io_engine::IoFile;

use super::cpu_cache::CpuCache;
use tch::{Device, Kind, Tensor};

/// Where input rows come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FeatureMode {
    /// The packed layout: caches, disk-cache pages and packed chunks.
    Packed,
    /// The DGL-OnDisk baseline: one aligned O_DIRECT read per row from the raw feature file.
    Naive,
    /// Every feature in RAM: the upper bound.
    Memory,
}

/// What feature loading needs (shared by reference with the loader thread).
pub struct LoadSources {
    pub mode: FeatureMode,
    pub row_bytes: usize,
    /// The raw feature file (naive mode) and its data offset.
    pub raw: Option<(IoFile, u64)>,
    /// The same file opened buffered, for rows in its last partial page
    /// (an O_DIRECT read cannot stop short of a page boundary).
    pub raw_tail: Option<std::fs::File>,
}

/// What feature assembly needs: the GPU cache on the device (CUDA), and
/// host rows for the rest (the CPU cache; every node in memory mode),
/// gathered by this crate's own copies: on the CPU straight into the batch
/// matrix (no torch threads racing the model step's for the same cores), on
/// CUDA into a small page-locked staging buffer that one non-blocking copy
/// takes to the device (DiskGNN §4, feature assembling).
pub struct AssembleSources {
    pub mode: FeatureMode,
    pub device: Device,
    /// Element kind of the stored features (Float or Half).
    pub kind: Kind,
    pub dim: i64,
    pub row_bytes: usize,
    /// The GPU cache tier on the device (CUDA).
    pub gpu_cache: Option<Tensor>,
    /// Host rows of the GPU cache (on the CPU device), the CPU cache and
    /// (memory mode) every node.
    pub gpu_rows: Option<Arc<Vec<u8>>>,
    pub cpu_rows: Option<Arc<CpuCache>>,
    pub all_rows: Option<Arc<Vec<u8>>>,
}

impl AssembleSources {
    /// Another handle on the same tensor and rows (no copy).
    pub fn share(&self) -> AssembleSources {
        AssembleSources {
            mode: self.mode,
            device: self.device,
            kind: self.kind,
            dim: self.dim,
            row_bytes: self.row_bytes,
            gpu_cache: self.gpu_cache.as_ref().map(Tensor::shallow_clone),
            gpu_rows: self.gpu_rows.clone(),
            cpu_rows: self.cpu_rows.clone(),
            all_rows: self.all_rows.clone(),
        }
    }
}

/// Everything the stages read, built once per job.
pub struct Sources {
    pub load: LoadSources,
    pub assemble: AssembleSources,
}
