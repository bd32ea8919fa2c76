//! Device choice: parses `cpu`, `cuda` and `cuda:N`, refuses CUDA where
//! libtorch sees no GPU, and reports what the linked libtorch offers.

use offgnn_shared::report::print_summary;
use tch::Device;

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("unknown device '{0}': expected cpu, cuda or cuda:N")]
    Unknown(String),
    #[error("--device {asked}: libtorch sees no CUDA device on this machine")]
    NoCuda { asked: String },
    #[error("--device {asked}: only {count} CUDA device(s) are visible")]
    OutOfRange { asked: String, count: i64 },
}

/// Parses a device flag and checks that the device exists.
pub fn parse_device(spec: &str) -> Result<Device, DeviceError> {
    let index = match spec {
        "cpu" => return Ok(Device::Cpu),
        "cuda" => 0,
        _ => spec
            .strip_prefix("cuda:")
            .and_then(|n| n.parse::<usize>().ok())
            .ok_or_else(|| DeviceError::Unknown(spec.to_string()))?,
    };
    let count = tch::Cuda::device_count();
    if count == 0 {
        return Err(DeviceError::NoCuda {
            asked: spec.to_string(),
        });
    }
    if index as i64 >= count {
        return Err(DeviceError::OutOfRange {
            asked: spec.to_string(),
            count,
        });
    }
    Ok(Device::Cuda(index))
}

/// `trainer info`: what libtorch this binary runs with and which devices it sees.
pub fn print_info() -> anyhow::Result<()> {
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
        checks.push(serde_json::json!({ "device": format!("{device:?}"), "matmul_sum": sum }));
    }
    print_summary(
        "trainer info",
        &[
            ("cuda available", cuda.to_string()),
            ("cuda devices", cuda_devices.to_string()),
            (
                "cudnn available",
                tch::Cuda::cudnn_is_available().to_string(),
            ),
            ("threads", tch::get_num_threads().to_string()),
        ],
        &serde_json::json!({
            "command": "info",
            "cuda_available": cuda,
            "cuda_devices": cuda_devices,
            "cudnn_available": tch::Cuda::cudnn_is_available(),
            "checks": checks,
        }),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_device_flags() {
        assert_eq!(parse_device("cpu").unwrap(), Device::Cpu);
        assert!(matches!(parse_device("tpu"), Err(DeviceError::Unknown(_))));
        assert!(matches!(
            parse_device("cuda:x"),
            Err(DeviceError::Unknown(_))
        ));
    }

    #[test]
    fn cuda_without_a_gpu_is_a_clear_error() {
        if tch::Cuda::device_count() > 0 {
            return; // this test is about machines without a GPU
        }
        let err = parse_device("cuda").unwrap_err();
        assert!(err.to_string().contains("no CUDA device"), "{err}");
    }
}
