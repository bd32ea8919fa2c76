//! How the packer's heap gives memory back, so that its resident memory
//! follows what it holds and `--memory` bounds it (glibc's allocator only;
//! elsewhere nothing changes).
//!
//! The memory statement counts what the packer holds at once. By default
//! glibc gives threads that allocate at the same time arenas of their own
//! (up to eight per core), and memory freed into one arena serves only the
//! threads that allocate from it: the packer's phases run on different
//! threads (loaders and rayon's workers decoding samples files, the plan's
//! workers, the pass's reader and writers, the table writer beside it), so
//! each arena kept its own high mark, and resident memory was about their
//! sum rather than the most held at once: over the budget by however much
//! the threads' timing scattered over the arenas. One arena, trimmed
//! between phases, keeps resident memory near what the packer holds.

/// One arena for every thread: what one thread frees, the next that
/// allocates reuses. The packer allocates in large pieces (decoded samples,
/// plan lists, buffers), not in hot loops, so its threads seldom wait on
/// the arena's lock. glibc's `mallopt` must not run beside threads that
/// allocate, so this takes effect only while the calling thread is the
/// process's only one (`main` calls it first); returns whether it did.
pub fn share_one_arena() -> bool {
    #[cfg(target_env = "gnu")]
    if only_thread() {
        // SAFETY: mallopt only sets an allocator parameter, and no other
        // thread allocates meanwhile: this is the process's only thread
        // (just counted), and only it could start another.
        return unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) } == 1;
    }
    false
}

/// Whether the calling thread is the process's only one, as Linux lists
/// them; no where the list cannot be read.
#[cfg(target_env = "gnu")]
fn only_thread() -> bool {
    std::fs::read_dir("/proc/self/task").is_ok_and(|tasks| tasks.count() == 1)
}

/// Returns the heap's free pages to the system (glibc trims only the
/// heap's top by itself): what one phase freed then no longer counts in
/// the next phase's resident memory, which the statement bounds by that
/// phase's own needs.
pub fn release_freed() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only hands free pages of the allocator's own
    // arenas back to the system; any thread may call it.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arena_is_left_alone_beside_other_threads() {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || {
            let _ = stopped.recv();
        });
        assert!(!share_one_arena(), "mallopt ran beside another thread");
        drop(stop);
        other.join().expect("the other thread ends");
    }
}
