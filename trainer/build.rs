//! Link-time settings for libtorch from a Python wheel: an rpath to torch's
//! `lib/` (RUNPATH, so `LD_LIBRARY_PATH` still wins on a GPU host with its own
//! torch), and a forced link of `torch_cuda` when the wheel has it. Without the
//! forced link the linker drops `libtorch_cuda.so` (nothing references it
//! directly) and libtorch never registers its CUDA backend.

fn main() {
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    let Ok(lib) = std::env::var("DEP_TCH_LIBTORCH_LIB") else {
        return;
    };
    println!("cargo:rustc-link-arg=-Wl,--enable-new-dtags,-rpath,{lib}");
    if std::path::Path::new(&lib).join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
    }
}
