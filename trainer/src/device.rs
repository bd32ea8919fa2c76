//! Device choice: parses `cpu`, `cuda` and `cuda:N`, refuses CUDA where
//! libtorch sees no GPU, and finds what the linked libtorch offers: which
//! torch it came from, the CUDA version that torch was built for, and the
//! NVIDIA driver's version (`trainer info` prints them).

use std::path::{Path, PathBuf};

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

/// The torch whose libtorch this process runs with.
pub struct LoadedTorch {
    /// The folder above the `lib/` that libtorch was loaded from.
    pub dir: PathBuf,
    /// `__version__` of its version.py (a Python wheel), else its
    /// build-version file (a libtorch archive).
    pub version: Option<String>,
    /// The CUDA version it was built for; None for a CPU build.
    pub cuda: Option<String>,
    /// Whether libtorch_cuda.so is loaded: libtorch has a CUDA backend only
    /// then (build.rs links it, the wheel's launcher preloads it).
    pub cuda_backend: bool,
}

/// Where this process's libtorch came from, as the loader mapped it (not
/// where the build found it: the wheel's launcher picks torch at run time).
pub fn loaded_torch() -> LoadedTorch {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let dir = libtorch_in_maps(&maps)
        .and_then(|lib| Some(lib.parent()?.parent()?.to_path_buf()))
        .unwrap_or_default();
    let (version, cuda) = match std::fs::read_to_string(dir.join("version.py")) {
        Ok(text) => (
            version_field(&text, "__version__"),
            version_field(&text, "cuda"),
        ),
        Err(_) => (
            std::fs::read_to_string(dir.join("build-version"))
                .ok()
                .map(|v| v.trim().to_string()),
            None,
        ),
    };
    let cuda_backend = maps.contains("/libtorch_cuda.so");
    LoadedTorch {
        dir,
        version,
        cuda,
        cuda_backend,
    }
}

/// The path of libtorch_cpu.so in /proc/self/maps.
fn libtorch_in_maps(maps: &str) -> Option<PathBuf> {
    maps.lines()
        .filter_map(|line| line.split_once(" /").map(|(_, path)| path.trim_end()))
        .find(|path| path.ends_with("/libtorch_cpu.so"))
        .map(|path| Path::new("/").join(path))
}

/// The quoted value of `name = '...'` or `name: Optional[str] = '...'` in
/// torch's version.py; None where it is absent or `None`.
fn version_field(text: &str, name: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let (lhs, rhs) = line.split_once('=')?;
        if lhs.split(':').next()?.trim() != name {
            return None;
        }
        let rhs = rhs.trim();
        let quoted = rhs
            .strip_prefix('\'')
            .and_then(|r| r.strip_suffix('\''))
            .or_else(|| rhs.strip_prefix('"').and_then(|r| r.strip_suffix('"')))?;
        Some(quoted.to_string())
    })
}

/// The NVIDIA kernel driver's version, from /proc/driver/nvidia/version;
/// None where no driver is loaded.
pub fn nvidia_driver_version() -> Option<String> {
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    driver_in_proc(&text)
}

/// `580.95.05` of `NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue ...`
/// (or `... Open Kernel Module for x86_64  580.95.05 ...`).
fn driver_in_proc(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let module = words.iter().position(|w| *w == "Module")?;
    words[module + 1..]
        .iter()
        .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'))
        .map(|w| w.to_string())
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
    fn finds_the_loaded_libtorch_and_its_version() {
        let maps = "7f00-7f01 r-xp 00000000 fe:00 12  /opt/my env/torch/lib/libtorch_cpu.so\n\
                    7f02-7f03 r--p 00000000 00:00 0 \n";
        assert_eq!(
            libtorch_in_maps(maps),
            Some(PathBuf::from("/opt/my env/torch/lib/libtorch_cpu.so"))
        );
        let version = "__all__ = ['__version__', 'cuda']\n__version__ = '2.11.0+cu130'\n\
                       cuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n";
        assert_eq!(
            version_field(version, "__version__").as_deref(),
            Some("2.11.0+cu130")
        );
        assert_eq!(version_field(version, "cuda").as_deref(), Some("13.0"));
        assert_eq!(version_field(version, "hip"), None);
        // This test binary links libtorch: it is mapped, with a version.
        let torch = loaded_torch();
        assert!(
            torch.dir.join("lib/libtorch_cpu.so").is_file(),
            "{:?}",
            torch.dir
        );
        let version = torch.version.expect("the loaded torch names its version");
        assert!(version.starts_with("2.11."), "{version}");
        // build.rs links libtorch_cuda.so wherever the torch has one.
        assert_eq!(
            torch.cuda_backend,
            torch.dir.join("lib/libtorch_cuda.so").is_file()
        );
    }

    #[test]
    fn reads_the_driver_version() {
        let proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  \
                           Tue Sep 23 09:55:41 UTC 2025\nGCC version:  gcc version 12.2.0\n";
        assert_eq!(driver_in_proc(proprietary).as_deref(), Some("580.95.05"));
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  \
                    Release Build  (dvs-builder@U16-I3-B03-4-3)  Fri Mar 14 2025\n";
        assert_eq!(driver_in_proc(open).as_deref(), Some("570.133.20"));
        assert_eq!(driver_in_proc("GCC version: 12\n"), None);
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
