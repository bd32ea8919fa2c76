//! Link-time settings for libtorch from a Python wheel: an rpath to torch's
//! `lib/` (RUNPATH, so `LD_LIBRARY_PATH` still wins on a GPU host with its own
//! torch), and a forced link of `torch_cuda` when the wheel has it. Without the
//! forced link the linker drops `libtorch_cuda.so` (nothing references it
//! directly) and libtorch never registers its CUDA backend.
//!
//! Then the trainer's two C++ shims. csrc/torch_shim.cpp (streams, events,
//! pinned memory) needs only the wheel's headers and is always built. The
//! c10d shim (csrc/c10d_shim.cpp) is compiled against the wheel's
//! headers as torch-sys compiles its own. The wheel ships c10d's headers
//! but not Gloo's, which `ProcessGroupGloo.hpp` includes, nor CUDA's
//! compiler headers, which `ProcessGroupNCCL.hpp` includes: scripts/setup
//! fetches them (Debian's libgloo-dev, PyPI's nvidia-cuda-crt and
//! nvidia-cuda-cccl) into `.cache/c10d-headers`, or `OFFGNN_C10D_HEADERS`
//! names another such folder. Only declarations are used from them; the code
//! is libtorch's own. Without Gloo's headers the trainer builds without
//! distributed training and says so when launched by torchrun or srun;
//! without CUDA's it builds with Gloo only.

use std::path::{Path, PathBuf};

fn main() {
    println!("cargo::rustc-check-cfg=cfg(offgnn_c10d)");
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    println!("cargo:rerun-if-env-changed=OFFGNN_C10D_HEADERS");
    println!("cargo:rerun-if-changed=csrc/c10d_shim.cpp");
    println!("cargo:rerun-if-changed=csrc/torch_shim.cpp");
    println!("cargo:rerun-if-changed=csrc/shim_common.h");
    let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") else {
        return;
    };
    let lib = PathBuf::from(lib);
    println!(
        "cargo:rustc-link-arg=-Wl,--enable-new-dtags,-rpath,{}",
        lib.display()
    );
    let cuda = lib.join("libtorch_cuda.so").exists();
    if cuda {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
    }
    build_torch_shim(&lib);
    build_shim(&lib, cuda);
}

/// The wheel's include directories, from its `torch/lib`.
fn torch_includes(lib: &Path) -> [PathBuf; 2] {
    let torch = lib.parent().expect("torch/lib has a parent");
    [
        torch.join("include"),
        torch.join("include/torch/csrc/api/include"),
    ]
}

fn build_torch_shim(lib: &Path) {
    cc::Build::new()
        .cpp(true)
        .file("csrc/torch_shim.cpp")
        .includes(torch_includes(lib))
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .warnings(false)
        .compile("offgnn_torch_shim");
}

fn build_shim(lib: &Path, cuda: bool) {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let headers = std::env::var_os("OFFGNN_C10D_HEADERS")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("../.cache/c10d-headers"));
    println!("cargo:rerun-if-changed={}", headers.display());
    let gloo = [headers.join("gloo/include"), PathBuf::from("/usr/include")]
        .into_iter()
        .find(|d| d.join("gloo/context.h").exists());
    let Some(gloo) = gloo else {
        println!(
            "cargo:warning=Gloo's headers are not in {} (scripts/setup fetches them): the trainer is built without distributed training",
            headers.display()
        );
        return;
    };
    // torch/lib -> torch -> site-packages.
    let torch = lib.parent().expect("torch/lib has a parent");
    let site = torch.parent().expect("torch has a parent");
    let mut build = cc::Build::new();
    build
        .cpp(true)
        .file("csrc/c10d_shim.cpp")
        .includes(torch_includes(lib))
        .include(&gloo)
        .flag("-std=c++17")
        .flag("-D_GLIBCXX_USE_CXX11_ABI=1")
        .flag("-DGLOG_USE_GLOG_EXPORT")
        .define("USE_C10D_GLOO", None)
        .warnings(false);
    let cuda_includes = [
        headers.join("cuda/nvidia/cu13/include"),
        site.join("nvidia/cu13/include"),
        site.join("nvidia/nccl/include"),
    ];
    let nccl = cuda
        && cuda_includes[0].join("crt/host_config.h").exists()
        && cuda_includes[0].join("nv/target").exists()
        && cuda_includes[1].join("cuda_runtime_api.h").exists()
        && cuda_includes[2].join("nccl.h").exists();
    if nccl {
        build
            .includes(&cuda_includes)
            .define("USE_C10D_NCCL", None)
            .define("USE_CUDA", None)
            .define("OFFGNN_NCCL", None);
    } else if cuda {
        println!(
            "cargo:warning=CUDA's and NCCL's headers are not all in {} and {}: the trainer is built with Gloo only",
            headers.join("cuda").display(),
            site.join("nvidia").display()
        );
    }
    build.compile("offgnn_c10d_shim");
    println!("cargo:rustc-cfg=offgnn_c10d");
}
