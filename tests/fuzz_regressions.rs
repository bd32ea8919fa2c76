//! Replays the fuzz targets' committed inputs (tests/fuzz/seeds and
//! tests/fuzz/regressions) through the same parsers, without the fuzzer:
//! every input a fuzz run once crashed on stays fixed. Each must parse or
//! fail with an error; none may panic.

use std::path::{Path, PathBuf};

fn inputs(target: &str) -> Vec<PathBuf> {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut files = Vec::new();
    for kind in ["seeds", "regressions"] {
        let Ok(dir) = std::fs::read_dir(fuzz.join(kind).join(target)) else {
            continue;
        };
        for entry in dir {
            let path = entry.unwrap().path();
            if path.is_file() {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// Runs `f` on each committed input of `target`, naming the inputs that
/// panicked. Returns how many inputs parsed.
fn replay(target: &str, f: impl Fn(&[u8]) -> bool + std::panic::RefUnwindSafe) -> usize {
    let files = inputs(target);
    assert!(!files.is_empty(), "no committed inputs for {target}");
    let mut panicked = Vec::new();
    let mut parsed = 0;
    for path in &files {
        let bytes = std::fs::read(path).unwrap();
        match std::panic::catch_unwind(|| f(&bytes)) {
            Ok(true) => parsed += 1,
            Ok(false) => {}
            Err(_) => panicked.push(path.display().to_string()),
        }
    }
    assert!(panicked.is_empty(), "{target} panicked on {panicked:?}");
    parsed
}

#[test]
fn manifest_inputs_parse_or_fail_cleanly() {
    let parsed = replay("manifest_parse", |b| {
        offgnn_manifests::Manifest::parse("fuzz", b).is_ok()
    });
    assert!(parsed >= 1, "the seed manifest no longer parses");
}

#[test]
fn samples_inputs_decode_or_fail_cleanly() {
    let parsed = replay("samples_decode", |b| {
        offgnn_shared::samples::decode_file("fuzz", bytes::Bytes::copy_from_slice(b)).is_ok()
    });
    assert!(parsed >= 1, "the seed samples file no longer decodes");
}

#[test]
fn npy_inputs_parse_or_fail_cleanly() {
    let parsed = replay("npy_header", |b| {
        offgnn_shared::npy::parse_header(b)
            .map(|h| h.data_bytes())
            .is_ok()
    });
    assert!(parsed >= 1, "the seed .npy header no longer parses");
}

#[test]
fn batch_table_inputs_decode_or_fail_cleanly() {
    let parsed = replay("batch_table_decode", |b| {
        offgnn_shared::address_table::decode("fuzz", b).is_ok()
    });
    assert!(parsed >= 1, "the seed batch table no longer decodes");
}
