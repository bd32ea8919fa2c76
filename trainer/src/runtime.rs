//! Process-wide settings the binaries take before anything else runs:
//! glibc's allocator keeps what libtorch frees, and `trainer infer` and
//! training with the historical cache run OpenMP's idle threads passive.

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

/// Undoes [`retain_freed_memory`] for a run whose large allocations are
/// few and long-lived (a typed inference group's accumulators, a source
/// chunk): kept on the heap, freed blocks of one group's sizes fragment it
/// for the next group's, and its RSS grew past `--memory` (10.1 GiB under
/// 8G on the typed bench graph). Allocations over 32 MiB (glibc's largest
/// threshold: a group's accumulators) are mapped on their own and unmapped
/// when freed, while smaller ones (a chunk's buffers, kept under it) reuse
/// the heap; the heap's free top over 64 MiB is trimmed.
pub fn return_freed_memory() {
    // SAFETY: mallopt only sets allocator parameters, under glibc's own
    // arena lock, so it may run while other threads allocate.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_MMAP_MAX, 1 << 16);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
    }
}

/// The OpenMP wait policy variable, which `trainer infer` records.
pub const OMP_WAIT_POLICY: &str = "OMP_WAIT_POLICY";

/// Re-executes `trainer infer`, training with `--historical`, and
/// pipelined training on the CPU with `OMP_WAIT_POLICY=PASSIVE` unless the
/// caller chose a policy. Each runs libtorch's parallel ops (OpenMP) in
/// turn with work of its own threads (inference: the reader, the scatter;
/// the historical cache: loaders that prune each batch once the model step
/// `lag` steps back has published its update; the pipeline: loaders and
/// the assembler beside the step), and by default libgomp's idle threads
/// spin on the cores that work needs, which on two cores slowed a
/// link-prediction epoch with the cache many times over (and other epochs
/// a little, or not at all). libgomp reads the policy once, as it loads, before
/// `main`; hence the exec. Returns (and the run goes on as it is) where
/// the exec fails.
pub fn passive_openmp_where_it_helps() {
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os();
    let arg0 = args.next();
    let rest: Vec<_> = args.collect();
    if !wants_passive_openmp(&rest) || std::env::var_os(OMP_WAIT_POLICY).is_some() {
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

/// Whether the command line (without the program) is `infer`, training
/// with `--historical`, or pipelined training on the CPU (no `--device`
/// other than `cpu`, no `--pipeline off`).
fn wants_passive_openmp(args: &[std::ffi::OsString]) -> bool {
    let first = args.first().and_then(|a| a.to_str());
    if first == Some("infer") {
        return true;
    }
    if !first.is_none_or(|a| a.starts_with('-')) {
        return false;
    }
    let args: Vec<&str> = args.iter().filter_map(|a| a.to_str()).collect();
    // A flag's value, as `--flag value` or `--flag=value`.
    let value = |flag: &str| {
        args.iter()
            .enumerate()
            .find_map(|(i, a)| match a.strip_prefix(flag) {
                Some("") => args.get(i + 1).copied(),
                Some(rest) => rest.strip_prefix('='),
                None => None,
            })
    };
    let historical = args
        .iter()
        .any(|a| *a == "--historical" || a.starts_with("--historical="));
    let on_cpu = value("--device").is_none_or(|d| d == "cpu");
    let pipelined = value("--pipeline") != Some("off");
    historical || (on_cpu && pipelined)
}

#[cfg(test)]
mod tests {
    use super::wants_passive_openmp;

    #[test]
    fn inference_the_historical_cache_and_the_cpu_pipeline_run_openmp_passive() {
        let yes =
            |line: &str| wants_passive_openmp(&line.split(' ').map(Into::into).collect::<Vec<_>>());
        assert!(yes("infer --model m"));
        assert!(yes("--manifest m --historical"));
        assert!(yes("--manifest m --historical=p_grad=0.8"));
        assert!(yes("--manifest m --epochs 3"));
        assert!(yes("--manifest m --device cpu"));
        assert!(yes("--manifest m --device=cpu --pipeline on"));
        assert!(!yes("--manifest m --device cuda"));
        assert!(!yes("--manifest m --device=cuda:1"));
        assert!(!yes("--manifest m --pipeline off"));
        assert!(!yes("--manifest m --pipeline=off"));
        assert!(yes("--manifest m --device cuda --historical"));
        assert!(!yes("export --historical"));
        assert!(!yes("export --model m"));
    }
}
