//! Process-wide settings the binaries take before anything else runs:
//! glibc's allocator keeps what libtorch frees, and `trainer infer` runs
//! OpenMP's idle threads passive.

/// Keeps memory that libtorch frees for its next tensors. By default glibc
/// maps every large allocation (over 128 KiB at first, over 32 MiB at
/// most) on its own and unmaps it when freed, so each batch's activations
/// and gradients arrive as fresh pages that the kernel zeroes on first
/// touch, which costs a large share of a CPU epoch's cycles. Served from
/// the heap and not trimmed, they are reused instead, for a slightly
/// higher peak RSS. glibc only; elsewhere nothing changes.
pub fn retain_freed_memory() {
    // SAFETY: mallopt only sets allocator parameters; the binaries call
    // this first thing, before any other thread runs.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

/// The OpenMP wait policy `trainer infer` runs libtorch with.
pub const OMP_WAIT_POLICY: &str = "OMP_WAIT_POLICY";

/// Re-executes `trainer infer` with `OMP_WAIT_POLICY=PASSIVE` unless the
/// caller chose a policy. Inference runs libtorch's matmuls (OpenMP) in
/// turn with its own threads' work (the reader, the scatter), and by
/// default libgomp's idle threads spin, on the cores that work needs,
/// which slows the narrow layers most. libgomp reads the policy once, as
/// it loads, before `main`; hence the exec. Returns (and the run goes on
/// as it is) where the exec fails.
pub fn passive_openmp_for_infer() {
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os();
    let arg0 = args.next();
    let rest: Vec<_> = args.collect();
    if rest.first().map(|a| a.as_os_str()) != Some(std::ffi::OsStr::new("infer"))
        || std::env::var_os(OMP_WAIT_POLICY).is_some()
    {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let mut command = std::process::Command::new(exe);
    if let Some(arg0) = arg0 {
        command.arg0(arg0);
    }
    let err = command.args(rest).env(OMP_WAIT_POLICY, "PASSIVE").exec();
    eprintln!(
        "warning: could not re-execute with {OMP_WAIT_POLICY}=PASSIVE ({err}); going on without"
    );
}
