//! `trainer` as the offgnn-trainer wheel installs it: finds the `torch`
//! package of the Python environment it is installed in, refuses a missing
//! torch or another version in one line, and runs the real trainer (which
//! links libtorch) with that torch's `lib/` on the loader's path. It links
//! nothing but libc, so no loader error can come before its own message.

use std::ffi::{OsStr, OsString};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

/// The torch series that tch 0.24 is built against. scripts/wheel checks
/// that the build's torch and the wheel's `torch==` pin agree with it.
const TORCH_SERIES: &str = "2.11";

/// Where the wheel puts the real trainer (its `.data/data/` part), relative
/// to the installation prefix; this launcher sits in `<prefix>/bin/`.
const REAL_TRAINER: &str = "libexec/offgnn-trainer/trainer";

/// Asks an interpreter where `torch` is without importing it (an import
/// takes seconds and may fail for reasons the trainer does not share). The
/// working directory is taken off `sys.path` first: a `torch/` folder where
/// the user happens to stand is not the environment's torch.
const FIND_TORCH: &str = "import sys, importlib.util as u
if sys.path and sys.path[0] == '':
    del sys.path[0]
s = u.find_spec('torch')
print(s.submodule_search_locations[0] if s and s.submodule_search_locations else '')";

fn main() -> ExitCode {
    let err = launch();
    eprintln!("error: {err}");
    ExitCode::FAILURE
}

/// Runs the real trainer in place of this process; returns only on failure.
fn launch() -> String {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return format!("cannot locate the trainer launcher itself: {e}"),
    };
    let Some(prefix) = exe.parent().and_then(Path::parent) else {
        return format!("{} is not inside a <prefix>/bin folder", exe.display());
    };
    let real = prefix.join(REAL_TRAINER);
    if !real.is_file() {
        return format!(
            "{} is missing: the offgnn-trainer installation is incomplete (reinstall it)",
            real.display()
        );
    }
    let torch = match find_torch(prefix).and_then(|found| check(found.dir, found.by)) {
        Ok(torch) => torch,
        Err(e) => return e,
    };
    let lib = torch.dir.join("lib");
    let mut command = Command::new(&real);
    command
        .arg0("trainer")
        .args(std::env::args_os().skip(1))
        .env("LD_LIBRARY_PATH", prepend(&lib, "LD_LIBRARY_PATH"))
        .env("OFFGNN_TORCH_FOUND_BY", &torch.found_by);
    // libtorch registers its CUDA backend only if libtorch_cuda.so is loaded,
    // and nothing in the trainer references it. The real trainer does not
    // name it (a CPU build of torch has none), so it is preloaded where this
    // torch has it.
    let cuda = lib.join("libtorch_cuda.so");
    if cuda.is_file() {
        command.env("LD_PRELOAD", prepend(&cuda, "LD_PRELOAD"));
    }
    let err = command.exec();
    format!("cannot run {}: {err}", real.display())
}

/// Where a torch package was found, and by what.
struct Found {
    dir: PathBuf,
    by: String,
}

/// A torch package of the series this trainer needs.
#[derive(Debug)]
struct Torch {
    dir: PathBuf,
    found_by: String,
}

/// The environment's torch: its own interpreter's answer (a virtualenv, a
/// conda environment, /usr); else, where no interpreter sits beside the
/// launcher (`pip install --user` puts it in ~/.local/bin), the
/// site-packages under the same prefix; else the `python3` on PATH.
fn find_torch(prefix: &Path) -> Result<Found, String> {
    let bin = prefix.join("bin");
    for name in ["python3", "python"] {
        let python = bin.join(name);
        if python.is_file() {
            return ask_python(python.as_os_str());
        }
    }
    if let Some(dir) = site_packages_torch(prefix) {
        return Ok(Found {
            dir,
            by: format!("the site-packages under {}", prefix.display()),
        });
    }
    ask_python(OsStr::new("python3")).map_err(|e| {
        format!(
            "no torch found: no Python in {}, no torch under {}/lib/python3*/site-packages, and {e}",
            bin.display(),
            prefix.display()
        )
    })
}

/// Asks `python` where its `torch` package is.
fn ask_python(python: &OsStr) -> Result<Found, String> {
    let shown = python.to_string_lossy().into_owned();
    let out = Command::new(python)
        .args(["-c", FIND_TORCH])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {shown}: {e}"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr.trim().lines().last().unwrap_or("no message");
        return Err(format!("{shown} failed to look for torch: {last}"));
    }
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if dir.is_empty() {
        return Err(format!(
            "no torch in the Python environment of {shown}: install it there with \
             `{shown} -m pip install torch=={TORCH_SERIES}.*` (any CUDA variant: see docs/deploying.md in offgnn's repository)"
        ));
    }
    Ok(Found {
        dir: PathBuf::from(dir),
        by: shown,
    })
}

/// `<prefix>/lib*/python3.*/{site,dist}-packages/torch`, newest Python
/// first; of several, one of the needed series if there is one.
fn site_packages_torch(prefix: &Path) -> Option<PathBuf> {
    let mut found = vec![];
    for lib in ["lib", "lib64"] {
        let Ok(entries) = std::fs::read_dir(prefix.join(lib)) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(minor) = name.strip_prefix("python3") else {
                continue;
            };
            let minor: u32 = minor.trim_start_matches('.').parse().unwrap_or(0);
            for packages in ["site-packages", "dist-packages"] {
                let torch = entry.path().join(packages).join("torch");
                if torch.join("version.py").is_file() {
                    found.push((minor, torch));
                }
            }
        }
    }
    found.sort_by_key(|(minor, _)| std::cmp::Reverse(*minor));
    let series = |dir: &PathBuf| {
        read_version(dir).is_ok_and(|(version, _)| series_of(&version) == TORCH_SERIES)
    };
    let pick = found.iter().position(|(_, dir)| series(dir)).unwrap_or(0);
    found.into_iter().nth(pick).map(|(_, dir)| dir)
}

/// Refuses a torch of another series, or one without libtorch.
fn check(dir: PathBuf, found_by: String) -> Result<Torch, String> {
    let (version, _cuda) = read_version(&dir)?;
    if series_of(&version) != TORCH_SERIES {
        return Err(format!(
            "this trainer needs torch {TORCH_SERIES}.x, but the environment's torch is {version} \
             (at {}, found by {found_by}); install torch=={TORCH_SERIES}.* there",
            dir.display()
        ));
    }
    let libtorch = dir.join("lib/libtorch_cpu.so");
    if !libtorch.is_file() {
        return Err(format!(
            "torch {version} at {} has no lib/libtorch_cpu.so: it is not a complete torch installation",
            dir.display()
        ));
    }
    Ok(Torch { dir, found_by })
}

/// `__version__` and `cuda` of `torch/version.py` (`cuda` is None for a CPU build).
fn read_version(dir: &Path) -> Result<(String, Option<String>), String> {
    let path = dir.join("version.py");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| format!("torch at {} has no readable version.py: {e}", dir.display()))?;
    match version_field(&text, "__version__") {
        Some(Some(version)) => Ok((version, version_field(&text, "cuda").flatten())),
        _ => Err(format!("{} names no __version__", path.display())),
    }
}

/// The value of `name = '...'` (or `name: Optional[str] = ...`) in
/// version.py: `Some(None)` for `None`, `None` where the name is absent.
fn version_field(text: &str, name: &str) -> Option<Option<String>> {
    text.lines().find_map(|line| {
        let (lhs, rhs) = line.split_once('=')?;
        let lhs = lhs.split(':').next().unwrap_or_default().trim();
        if lhs != name {
            return None;
        }
        let rhs = rhs.trim();
        if rhs == "None" {
            return Some(None);
        }
        let quoted = rhs
            .strip_prefix('\'')
            .and_then(|r| r.strip_suffix('\''))
            .or_else(|| rhs.strip_prefix('"').and_then(|r| r.strip_suffix('"')))?;
        Some(Some(quoted.to_string()))
    })
}

/// `2.11` of `2.11.0+cu130`.
fn series_of(version: &str) -> String {
    let base = version.split('+').next().unwrap_or_default();
    base.split('.').take(2).collect::<Vec<_>>().join(".")
}

/// `path` before the current value of the colon-separated variable `var`.
fn prepend(path: &Path, var: &str) -> OsString {
    let mut value = path.as_os_str().to_os_string();
    if let Some(old) = std::env::var_os(var).filter(|v| !v.is_empty()) {
        value.push(":");
        value.push(old);
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    const CU130: &str = "from typing import Optional\n\n\
        __all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip']\n\
        __version__ = '2.11.0+cu130'\n\
        debug = False\n\
        cuda: Optional[str] = '13.0'\n\
        hip: Optional[str] = None\n";

    #[test]
    fn reads_the_version_and_cuda_of_version_py() {
        assert_eq!(
            version_field(CU130, "__version__"),
            Some(Some("2.11.0+cu130".into()))
        );
        assert_eq!(version_field(CU130, "cuda"), Some(Some("13.0".into())));
        assert_eq!(version_field(CU130, "hip"), Some(None));
        assert_eq!(version_field(CU130, "rocm"), None);
        // `__all__` mentions `cuda` but is not its assignment.
        assert_eq!(
            version_field("cuda = None\n__version__ = \"2.11.1\"\n", "__version__"),
            Some(Some("2.11.1".into()))
        );
    }

    #[test]
    fn the_series_is_major_and_minor() {
        assert_eq!(series_of("2.11.0+cu130"), "2.11");
        assert_eq!(series_of("2.11.1"), "2.11");
        assert_eq!(series_of("2.10.0+cpu"), "2.10");
        assert_ne!(series_of("2.1.1"), "2.11");
    }

    fn fake_torch(root: &Path, version: &str, with_lib: bool) -> PathBuf {
        let dir = root.join("torch");
        std::fs::create_dir_all(dir.join("lib")).unwrap();
        std::fs::write(
            dir.join("version.py"),
            format!("__version__ = '{version}'\ncuda = None\n"),
        )
        .unwrap();
        if with_lib {
            std::fs::write(dir.join("lib/libtorch_cpu.so"), b"").unwrap();
        }
        dir
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("offgnn-launcher-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn another_series_is_refused_naming_both_versions() {
        let root = scratch("series");
        let dir = fake_torch(&root, "2.10.0+cpu", true);
        let err = check(dir, "python3".into()).unwrap_err();
        assert!(err.contains("needs torch 2.11.x"), "{err}");
        assert!(err.contains("2.10.0+cpu"), "{err}");
        let ok = fake_torch(&root.join("ok"), "2.11.0+cpu", true);
        assert!(check(ok, "python3".into()).is_ok());
        let incomplete = fake_torch(&root.join("bare"), "2.11.0", false);
        let err = check(incomplete, "python3".into()).unwrap_err();
        assert!(err.contains("lib/libtorch_cpu.so"), "{err}");
        std::fs::remove_dir_all(root).unwrap();
    }

    #[test]
    fn site_packages_prefer_the_needed_series() {
        let root = scratch("site");
        assert_eq!(site_packages_torch(&root), None);
        fake_torch(&root.join("lib/python3.12/site-packages"), "2.10.0", true);
        fake_torch(&root.join("lib/python3.9/site-packages"), "2.11.0", true);
        assert_eq!(
            site_packages_torch(&root),
            Some(root.join("lib/python3.9/site-packages/torch"))
        );
        std::fs::remove_dir_all(root.join("lib/python3.9")).unwrap();
        assert_eq!(
            site_packages_torch(&root),
            Some(root.join("lib/python3.12/site-packages/torch"))
        );
        std::fs::remove_dir_all(root).unwrap();
    }
}
