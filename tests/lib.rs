//! Helpers of the end-to-end suite: find the workspace's built binaries and
//! run them, capturing what a user would see.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The workspace root.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives in the workspace")
        .to_path_buf()
}

/// Path of a workspace binary built by `cargo build --workspace --bins`
/// (scripts/test builds them first), from the profile this test runs under.
pub fn binary(name: &str) -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"));
    // Tests run from target/<profile>/deps/; the binaries sit one level up.
    let exe = std::env::current_exe().expect("test executable path");
    let from_exe = exe
        .parent()
        .and_then(Path::parent)
        .map(|dir| dir.join(name));
    let candidates = from_exe.into_iter().chain([
        target.join("debug").join(name),
        target.join("release").join(name),
    ]);
    for path in candidates {
        if path.exists() {
            return path;
        }
    }
    panic!(
        "binary '{name}' is not built: run `cargo build --workspace --bins` (scripts/test does)"
    );
}

/// The outcome of one run of a binary.
pub struct Run {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// The JSON summary: the last line of stdout.
    pub fn json(&self) -> serde_json::Value {
        let line = self.stdout.lines().last().unwrap_or_default();
        serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("last stdout line is not JSON ({e}): {line}"))
    }
}

/// Runs a workspace binary with `args`.
pub fn run(name: &str, args: &[&str]) -> Run {
    run_with_env(name, args, &[])
}

/// Runs a workspace binary with `args` and extra environment variables.
pub fn run_with_env(name: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(binary(name))
        .args(args)
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
    Run {
        status,
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

/// The Cora tables fetched by scripts/setup.
pub fn cora_dir() -> PathBuf {
    let dir = std::env::var_os("OFFGNN_CORA_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(".cache/cora"));
    assert!(
        dir.join("cora_nodes.parquet.gzip").exists(),
        "the Cora tables are missing from {}: run scripts/setup",
        dir.display()
    );
    dir
}
