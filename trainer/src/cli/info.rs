//! `trainer info`: the libtorch this binary runs with (which torch, built
//! for which CUDA), the NVIDIA driver, the devices libtorch sees, and a
//! small computation on each that proves the backend works; and `trainer
//! probe-disk`: the random-read curve of a disk.

use offgnn_shared::report::print_summary;
use tch::Device;

use crate::device::{loaded_torch, nvidia_driver_version};

/// `trainer info`: what libtorch this binary runs with and which devices it sees.
pub(super) fn print_info() -> anyhow::Result<()> {
    let cuda_devices = tch::Cuda::device_count();
    let cuda = tch::Cuda::is_available();
    // A small real computation on each device proves the backend works.
    let mut checks = vec![];
    let devices: Vec<Device> = std::iter::once(Device::Cpu)
        .chain((0..cuda_devices as usize).map(Device::Cuda))
        .collect();
    for device in devices {
        let a = tch::Tensor::ones([64, 64], (tch::Kind::Float, device));
        let sum = a.matmul(&a).sum(tch::Kind::Float).double_value(&[]);
        let mut check = serde_json::json!({ "device": format!("{device:?}"), "matmul_sum": sum });
        if device.is_cuda() {
            check["staged_copy"] = match crate::cuda::staged_copy_check(device) {
                Ok(()) => "ok".into(),
                Err(e) => e.to_string().into(),
            };
        }
        checks.push(check);
    }
    let torch = loaded_torch();
    // The wheel's launcher says which interpreter found torch; a binary
    // built here finds it through its rpath or LD_LIBRARY_PATH.
    let found_by = std::env::var("OFFGNN_TORCH_FOUND_BY")
        .unwrap_or_else(|_| "the loader (rpath or LD_LIBRARY_PATH)".to_string());
    let driver = nvidia_driver_version();
    let shown = |v: &Option<String>, none: &str| v.clone().unwrap_or_else(|| none.to_string());
    print_summary(
        "trainer info",
        &[
            ("torch", shown(&torch.version, "unknown")),
            ("torch at", torch.dir.display().to_string()),
            ("found by", found_by.clone()),
            (
                "torch built for CUDA",
                shown(&torch.cuda, "none (CPU build)"),
            ),
            (
                "libtorch_cuda",
                if torch.cuda_backend {
                    "loaded"
                } else {
                    "not loaded"
                }
                .to_string(),
            ),
            ("NVIDIA driver", shown(&driver, "no driver")),
            ("cuda available", cuda.to_string()),
            ("cuda devices", cuda_devices.to_string()),
            (
                "cudnn available",
                tch::Cuda::cudnn_is_available().to_string(),
            ),
            ("threads", tch::get_num_threads().to_string()),
            (
                "data-parallel (c10d)",
                match crate::distributed::support() {
                    (false, _) => "not built (no Gloo headers at build time)".to_string(),
                    (true, false) => "Gloo".to_string(),
                    (true, true) => "Gloo, NCCL".to_string(),
                },
            ),
        ],
        &serde_json::json!({
            "command": "info",
            "torch": {
                "version": torch.version,
                "path": torch.dir,
                "found_by": found_by,
                "cuda": torch.cuda,
                "cuda_backend_loaded": torch.cuda_backend,
            },
            "nvidia_driver": driver,
            "cuda_available": cuda,
            "cuda_devices": cuda_devices,
            "cudnn_available": tch::Cuda::cudnn_is_available(),
            "c10d": { "gloo": crate::distributed::support().0, "nccl": crate::distributed::support().1 },
            "checks": checks,
        }),
    );
    Ok(())
}

/// `trainer probe-disk`: the curve of the disk holding `file` (kept, or
/// measured now), the depth `--io-depth auto` takes from it and the gap
/// `--read-through auto` reads through.
pub(super) fn probe_disk(file: &std::path::Path, fresh: bool) -> anyhow::Result<()> {
    const LEAST: u64 = crate::io_depth::STANDS_FOR_DISK;
    let size = std::fs::metadata(file)
        .map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?
        .len();
    if size < LEAST {
        anyhow::bail!(
            "{}: {} is too small to measure the disk by (random reads over it would hit the disk's cache); give a file of at least {}, such as a layout's largest segment (training on a layout this small measures its largest object, a curve that only layouts as small use)",
            file.display(),
            offgnn_shared::report::human_bytes(size),
            offgnn_shared::report::human_bytes(LEAST)
        );
    }
    let found = crate::io_depth::resolve(file, fresh)?;
    let p = &found.probe;
    let best = p.points.iter().map(|x| x.iops).fold(0.0, f64::max);
    let mut rows: Vec<(&str, String)> = vec![
        ("disk", p.disk.clone()),
        (
            "curve",
            if found.cached {
                "kept from an earlier probe (--fresh measures again)".into()
            } else {
                format!("measured now on {}", p.file)
            },
        ),
    ];
    let lines: Vec<String> = p
        .points
        .iter()
        .map(|x| {
            format!(
                "{:>4} in flight: {:>9.0} IOPS ({:>5.1}% of the best), {:>8.1} us a read",
                x.depth,
                x.iops,
                100.0 * x.iops / best.max(1e-9),
                x.latency_us
            )
        })
        .collect();
    rows.extend(lines.iter().map(|l| ("", l.clone())));
    rows.push((
        "chosen",
        format!(
            "{} in flight (the fewest from which every depth up to the best is within {:.0}% of it)",
            p.chosen,
            100.0 * crate::io_depth::KNEE_SHARE
        ),
    ));
    if let Some(span) = p.span {
        rows.push((
            "read-through",
            format!(
                "{:.0} reads a second of 1 page, {:.0} of {}, at {} in flight: gaps of up to {} are read through",
                span.page_iops,
                span.span_iops,
                offgnn_shared::report::count(span.pages, "page", "pages"),
                p.chosen,
                offgnn_shared::report::count(span.read_through_pages(), "page", "pages")
            ),
        ));
    }
    print_summary(
        "disk probe",
        &rows,
        &serde_json::json!({ "command": "probe-disk", "cached": found.cached, "probe": p }),
    );
    Ok(())
}
