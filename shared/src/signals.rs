//! SIGINT and SIGTERM. The first asks the program to stop at its next safe
//! point: long loops poll [`check`], the run unwinds through its usual
//! failure path (which removes what an uncommitted run wrote, or keeps a
//! checkpoint), and `main` prints one line saying what was kept and exits
//! with 128 + the signal's number. A second signal exits at once, saying so.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use signal_hook::consts::{SIGINT, SIGTERM};

use crate::error::{Error, Result};

struct Received {
    any: Arc<AtomicBool>,
    which: Arc<AtomicUsize>,
}

static RECEIVED: OnceLock<Received> = OnceLock::new();

/// Installs the handlers (once; later calls do nothing). Programs call it
/// at start; library code only polls.
pub fn install() {
    RECEIVED.get_or_init(|| {
        let any = Arc::new(AtomicBool::new(false));
        let which = Arc::new(AtomicUsize::new(0));
        for sig in [SIGINT, SIGTERM] {
            // Registered first, so it sees the flag as the previous signal
            // left it: the second signal exits, the first only sets it.
            let registered = exit_on_second(sig, Arc::clone(&any))
                .and_then(|_| {
                    signal_hook::flag::register_usize(sig, Arc::clone(&which), sig as usize)
                })
                .and_then(|_| signal_hook::flag::register(sig, Arc::clone(&any)));
            if let Err(e) = registered {
                tracing::warn!("cannot handle signal {sig}: {e}");
            }
        }
        Received { any, which }
    });
}

/// Registers the action that ends the process with 128 + `sig` when `sig`
/// arrives after a first signal set `any`, saying so on stderr.
fn exit_on_second(sig: i32, any: Arc<AtomicBool>) -> std::io::Result<signal_hook::SigId> {
    // What it leaves on stderr: the cleanup the first signal started does
    // not finish.
    let line: &'static [u8] = if sig == SIGTERM {
        b"\nsecond SIGTERM: exiting at once; files of work not yet committed may be left behind (committed outputs are whole)\n"
    } else {
        b"\nsecond SIGINT: exiting at once; files of work not yet committed may be left behind (committed outputs are whole)\n"
    };
    let action = move || {
        if any.load(Ordering::SeqCst) {
            // SAFETY: write(2) on a valid buffer of its length; the result
            // is ignored because there is nothing to do if stderr is gone.
            let _ = unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
            signal_hook::low_level::exit(128 + sig);
        }
    };
    // SAFETY: the action is async-signal-safe: an atomic load, write(2) and
    // _exit(2), no allocation and no lock.
    unsafe { signal_hook::low_level::register(sig, action) }
}

/// Installs the handlers and runs `stop` on a thread of its own when the
/// first SIGINT or SIGTERM arrives, with the signal's name: for a command
/// whose work has no safe point that polls [`check`] (`sampler generate`,
/// `import-parquet`), which cleans up and ends the process from there. A
/// second signal still exits at once.
pub fn on_first(stop: impl FnOnce(&'static str) + Send + 'static) {
    install();
    let mut signals = match signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot watch for signals: {e}");
            return;
        }
    };
    let spawned = std::thread::Builder::new()
        .name("signal-stop".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                stop(if sig == SIGTERM { "SIGTERM" } else { "SIGINT" });
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot watch for signals: {e}");
    }
}

/// The signal received, if any: `SIGINT` or `SIGTERM`.
pub fn received() -> Option<&'static str> {
    let r = RECEIVED.get()?;
    if !r.any.load(Ordering::SeqCst) {
        return None;
    }
    Some(match r.which.load(Ordering::SeqCst) as i32 {
        SIGTERM => "SIGTERM",
        _ => "SIGINT",
    })
}

/// `Err(Interrupted)` once a signal has arrived: the poll of long loops.
pub fn check() -> Result<()> {
    match received() {
        Some(signal) => Err(Error::Interrupted(signal)),
        None => Ok(()),
    }
}

/// The exit status after a signal: 128 + its number (130 for SIGINT, 143
/// for SIGTERM), as shells report a process a signal ended.
pub fn exit_status() -> Option<u8> {
    received().map(|s| if s == "SIGTERM" { 143 } else { 130 })
}

/// The exit code of a run that failed: the signal's status when one
/// stopped it, else 1.
pub fn failure_code() -> std::process::ExitCode {
    exit_status()
        .map(std::process::ExitCode::from)
        .unwrap_or(std::process::ExitCode::FAILURE)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set in the child process [`a_second_signal_exits_at_once_saying_so`] starts.
    const CHILD: &str = "OFFGNN_SIGNALS_TEST_CHILD";

    /// The first SIGINT is only recorded; the second ends the process with
    /// 130 and one line saying so. Run in a child process of this test
    /// binary, since the second signal ends it; `raise` runs the handlers
    /// before it returns, so the two signals cannot merge into one.
    #[test]
    fn a_second_signal_exits_at_once_saying_so() {
        if std::env::var_os(CHILD).is_some() {
            install();
            // SAFETY: raise(3) on this process; the handlers are installed.
            assert_eq!(unsafe { libc::raise(SIGINT) }, 0);
            assert_eq!(received(), Some("SIGINT"));
            assert!(check().is_err() && exit_status() == Some(130));
            // SAFETY: as above; this one ends the process.
            unsafe { libc::raise(SIGINT) };
            unreachable!("the second SIGINT ends the process");
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "signals::tests::a_second_signal_exits_at_once_saying_so",
                "--exact",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(130), "{stderr}");
        assert!(
            stderr.contains("second SIGINT: exiting at once"),
            "{stderr}"
        );
    }
}
