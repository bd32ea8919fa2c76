//! The feature sources a run's pipeline reads from, opened once: the
//! layout's two cache tiers (on CUDA the GPU tier on the device, DiskGNN
//! §4), or for the baselines the raw feature file.

use std::path::PathBuf;
use std::sync::Arc;

use offgnn_manifests::Dtype;
use offgnn_shared::io_engine::IoEngine;
use tch::{Device, Kind, Tensor};

use crate::error::{Error, Result};
use crate::layout::Layout;
use crate::pipeline::{AssembleSources, CpuCache, FeatureMode, LoadSources, Sources};

/// Sources shared by the stages: caches loaded once (the GPU cache on the device on CUDA).
pub fn sources(
    layout: &Layout,
    engine: &IoEngine,
    (features, device): (FeatureMode, Device),
) -> Result<Sources> {
    let m = &layout.manifest;
    // The layout's rows may be stored narrower than the feature file's (the
    // packer's --store-dtype); the baselines read the feature file itself.
    // Either way the assembly stage widens the batch to float32 on the device.
    let (dtype, row_bytes) = match features {
        FeatureMode::Packed => (m.dataset.store_dtype(), m.dataset.store_row_bytes()),
        FeatureMode::Naive | FeatureMode::Memory => (m.dataset.feature_dtype, m.dataset.row_bytes),
    };
    let kind = match dtype {
        Dtype::F32 => Kind::Float,
        Dtype::F16 => Kind::Half,
        Dtype::BF16 => Kind::BFloat16,
    };
    let dim = m.dataset.feature_dim as i64;
    let on_cpu = device == Device::Cpu;
    // The caches stay plain host rows, but on CUDA the GPU cache goes to
    // the device (DiskGNN §4). The CPU cache is not page-locked: assembly
    // gathers its rows into small page-locked staging buffers instead.
    let cache = |t: &offgnn_manifests::Tier| -> Result<Option<Vec<u8>>> {
        t.object
            .as_ref()
            .map(|object| layout.read_cache(object, t.rows))
            .transpose()
    };
    let tensor = |bytes: &[u8], rows: u64| -> Result<Tensor> {
        Ok(Tensor::f_from_data_size(bytes, &[rows as i64, dim], kind)?)
    };
    let mut load = LoadSources {
        mode: features,
        row_bytes: row_bytes as usize,
        raw: None,
        raw_tail: None,
    };
    let mut asm = AssembleSources {
        mode: features,
        device,
        kind,
        dim,
        row_bytes: row_bytes as usize,
        gpu_cache: None,
        gpu_rows: None,
        cpu_rows: None,
        all_rows: None,
    };
    match features {
        FeatureMode::Packed => {
            let (gpu, cpu) = (cache(&m.gpu_cache)?, cache(&m.cpu_cache)?);
            let follows = !m.cpu_cache.policy.is_static();
            asm.cpu_rows = cpu
                .zip(m.cpu_cache.object.as_deref())
                .map(|(rows, object)| {
                    let path = layout.object_path(object);
                    Arc::new(CpuCache::new(path, rows, row_bytes as usize, follows))
                });
            if on_cpu {
                asm.gpu_rows = gpu.map(Arc::new);
            } else {
                // Fallible: a GPU cache beyond the device's free memory is
                // an error that names the tier, not a panic.
                let rows = m.gpu_cache.rows;
                asm.gpu_cache = gpu
                    .map(|b| {
                        tensor(&b, rows)?.f_to_device(device).map_err(|e| {
                            Error::Layout(format!(
                                "the GPU cache ({rows} rows, {}) does not fit on {:?}: {e}; pack with a smaller --gpu-cache budget",
                                offgnn_shared::report::human_bytes(rows * row_bytes),
                                device,
                            ))
                        })
                    })
                    .transpose()?;
            }
        }
        FeatureMode::Naive | FeatureMode::Memory => {
            let path = PathBuf::from(&m.dataset.feature_location);
            let npy = offgnn_shared::npy::NpyFile::open(&path)?;
            if offgnn_shared::dataset::file_fingerprint(&path)? != m.dataset.feature_fingerprint {
                return Err(Error::Layout(format!(
                    "{}: not the feature file this layout was packed from",
                    path.display()
                )));
            }
            if features == FeatureMode::Naive {
                load.raw = Some((engine.open(&path)?, npy.header().data_offset));
                load.raw_tail =
                    Some(std::fs::File::open(&path).map_err(|e| Error::io(path.display(), e))?);
            } else {
                let n = m.dataset.num_nodes;
                let mut bytes = vec![0u8; (n * m.dataset.row_bytes) as usize];
                npy.read_data_at(0, &mut bytes)?;
                asm.all_rows = Some(Arc::new(bytes));
            }
        }
    }
    let src = Sources {
        load,
        assemble: asm,
    };
    Ok(src)
}
