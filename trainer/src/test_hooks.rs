//! Hooks for the trainer's own tests, kept out of its configs: a stand-in
//! for a kill after so many units of work (the tests of resume) and a trace
//! of the parameters after every step (the data-parallel test). Tests in
//! this process set them for one call with [`with`]; the binary reads them
//! from `OFFGNN_TEST_*` environment variables, here and nowhere else.

use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::OnceLock;

/// What the hooks do; none by default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TestHooks {
    /// Fail as if killed after this many training batches of this process,
    /// just after any checkpoint due there (`OFFGNN_TEST_INTERRUPT_AFTER`).
    pub interrupt_after: Option<u64>,
    /// Fail as if killed after this many inference groups of this process
    /// (`OFFGNN_TEST_INTERRUPT_AFTER_GROUPS`).
    pub interrupt_after_groups: Option<u64>,
    /// Write the parameters after every training step under
    /// `DIR/rank<R>/` (`OFFGNN_TEST_TRACE_PARAMS`).
    pub trace_params: Option<PathBuf>,
}

thread_local! {
    static SET: RefCell<Option<TestHooks>> = const { RefCell::new(None) };
}

/// Runs `f` with `hooks` in force on this thread (a run reads them as it
/// starts, on the thread that calls it), then the hooks before.
pub fn with<R>(hooks: TestHooks, f: impl FnOnce() -> R) -> R {
    /// Puts the hooks before back, also when `f` panics.
    struct Restore(Option<TestHooks>);
    impl Drop for Restore {
        fn drop(&mut self) {
            SET.set(self.0.take());
        }
    }
    let _restore = Restore(SET.replace(Some(hooks)));
    f()
}

/// The hooks in force on this thread: those [`with`] set, else the
/// environment's.
pub(crate) fn current() -> TestHooks {
    SET.with_borrow(Clone::clone)
        .unwrap_or_else(|| from_env().clone())
}

/// The hooks the environment sets, read once. A value that is not a number
/// sets nothing: these are for tests, not for users to get wrong.
fn from_env() -> &'static TestHooks {
    static ENV: OnceLock<TestHooks> = OnceLock::new();
    ENV.get_or_init(|| {
        let number = |name: &str| std::env::var(name).ok()?.trim().parse().ok();
        TestHooks {
            interrupt_after: number("OFFGNN_TEST_INTERRUPT_AFTER"),
            interrupt_after_groups: number("OFFGNN_TEST_INTERRUPT_AFTER_GROUPS"),
            trace_params: std::env::var_os("OFFGNN_TEST_TRACE_PARAMS").map(PathBuf::from),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_hold_for_the_call_on_its_thread_only() {
        let set = TestHooks {
            interrupt_after_groups: Some(3),
            ..Default::default()
        };
        let (inside, other_thread) = with(set.clone(), || {
            (current(), std::thread::spawn(current).join().unwrap())
        });
        assert_eq!(inside, set);
        assert_eq!(other_thread, *from_env());
        assert_eq!(current(), *from_env(), "restored after the call");
    }
}
