//! `offgnn.Loader`, the Python module over the trainer's pipeline, checked
//! from Python by python/loader_check.py: the trainer's batches bit for
//! bit (typed layouts' HeteroData too), PyG's conventions, models offgnn
//! does not ship trained through it, and no thread left behind however a
//! pass ends; and by python/loader_link_check.py on link-prediction
//! layouts, untyped and typed.

use std::path::Path;

use offgnn_e2e::{binary, cora_dir, workspace};

/// The module as `pip install` lays it out: python/offgnn/ with the
/// extension built by `cargo build --workspace` as `offgnn/_offgnn.so`.
fn module_dir(into: &Path) {
    let package = into.join("offgnn");
    std::fs::create_dir_all(&package).unwrap();
    let source = workspace().join("python/offgnn");
    for entry in std::fs::read_dir(&source).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "py") {
            std::fs::copy(&path, package.join(path.file_name().unwrap())).unwrap();
        }
    }
    std::fs::copy(binary("lib_offgnn.so"), package.join("_offgnn.so")).unwrap();
}

/// Runs python/`script` with the module importable, the built binaries
/// and a work directory; returns the JSON line it prints last.
fn check(script: &str, extra: &[&std::ffi::OsStr]) -> serde_json::Value {
    let python = workspace().join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup",
        python.display()
    );
    let work = tempfile::tempdir().unwrap();
    let modules = work.path().join("modules");
    module_dir(&modules);
    let bin_dir = binary("trainer").parent().unwrap().to_path_buf();
    // -P: the script's own folder (python/, which holds the package's
    // sources without the extension) is not put first on the path.
    let out = std::process::Command::new(&python)
        .arg("-P")
        .arg(workspace().join("python").join(script))
        .arg("--bin-dir")
        .arg(&bin_dir)
        .arg("--work")
        .arg(work.path())
        .args(extra)
        .env("PYTHONPATH", &modules)
        .output()
        .expect("python starts");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(out.status.success(), "{script} failed:\n{stdout}\n{stderr}");
    serde_json::from_str(stdout.trim().lines().last().unwrap()).unwrap()
}

#[test]
fn the_loader_yields_the_trainers_batches_to_pyg_models() {
    let cora = cora_dir();
    let summary = check(
        "loader_check.py",
        &["--cora-dir".as_ref(), cora.as_os_str()],
    );
    let same = summary["same_batches"].as_array().unwrap();
    assert_eq!(same.len(), 3, "{summary}");
    for case in same {
        assert_eq!(case["batches"], 3, "{case}");
    }
    let accuracy = summary["accuracy"].as_array().unwrap();
    assert_eq!(accuracy.len(), 4, "{summary}");
    let ctrl_c = &summary["ctrl_c"];
    assert_eq!(ctrl_c["threads_after"], ctrl_c["base"], "{ctrl_c}");
    assert_eq!(
        summary["refusals"].as_array().unwrap().len(),
        10,
        "{summary}"
    );
    assert_eq!(summary["one_pass"]["batches"], 3, "{summary}");
    assert_eq!(summary["typed"]["batches"], 3, "{summary}");
    let ranks = &summary["ranks"];
    for split in ["train0", "train3", "test0"] {
        assert_eq!(ranks[split].as_array().unwrap().len(), 2, "{ranks}");
    }
}

#[test]
fn the_loader_yields_link_batches_as_link_neighbor_loader_does() {
    let summary = check("loader_link_check.py", &[]);
    let same = summary["same_batches"].as_array().unwrap();
    assert_eq!(same.len(), 2, "{summary}");
    for case in same {
        assert_eq!(case["batches"], 3, "{case}");
    }
    let mrr = summary["mrr"].as_array().unwrap();
    assert_eq!(mrr.len(), 2, "{summary}");
    for case in mrr {
        assert!(
            case["test_mrr"].as_f64().unwrap() >= case["min_mrr"].as_f64().unwrap(),
            "{case}"
        );
    }
}
