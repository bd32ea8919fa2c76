//! How every job ends: a table a person reads, then one line of JSON a
//! program reads, both on stdout; and how logging is set up (stderr).

use serde::Serialize;

/// Prints `title`, then aligned `label  value` rows, then the JSON summary
/// on a line of its own. Every summary ends with the process's measured
/// peak resident memory (`peak_rss_bytes` in the JSON, where the summary
/// is an object), so that a job's memory statement can be checked against
/// what it used.
pub fn print_summary(title: &str, rows: &[(&str, String)], json: &impl Serialize) {
    let peak = peak_rss_bytes();
    let peak_row = peak.map(|b| ("memory (measured peak)", human_bytes(b)));
    let rows: Vec<&(&str, String)> = rows.iter().chain(&peak_row).collect();
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    println!("{title}");
    for (k, v) in rows {
        println!("  {k:<width$}  {v}");
    }
    match serde_json::to_string(json) {
        Ok(line) => println!("{}", with_peak(line, peak)),
        Err(e) => tracing::error!("cannot encode the JSON summary: {e}"),
    }
}

/// A JSON object with `peak_rss_bytes` added as its last field (its other
/// fields keep their order); anything else as it is.
fn with_peak(mut line: String, peak: Option<u64>) -> String {
    if let Some(b) = peak
        && line.starts_with('{')
        && line.ends_with('}')
    {
        line.pop();
        if line.len() > 1 {
            line.push(',');
        }
        line.push_str(&format!("\"peak_rss_bytes\":{b}}}"));
    }
    line
}

/// The most resident memory this process has held so far (the kernel's
/// high-water mark, `getrusage`'s `ru_maxrss`), `None` where it cannot say.
pub fn peak_rss_bytes() -> Option<u64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given, which lives here.
    let ok = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) } == 0;
    // SAFETY: zeroed is a valid rusage, and getrusage wrote it on success.
    let kib = unsafe { usage.assume_init() }.ru_maxrss;
    (ok && kib > 0).then(|| kib as u64 * 1024)
}

/// Prints a program's failure as its one line, `error: MESSAGE`, in one
/// write: ranks of a data-parallel job share one stderr under their
/// launcher, and lines written piece by piece would interleave.
pub fn print_error(message: &dyn std::fmt::Display) {
    use std::io::Write;
    let line = format!("error: {message}\n");
    // Nothing to do where stderr is gone.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Logs to stderr at `info` unless `RUST_LOG` says otherwise, the
/// object-store library's at `warn` (it logs each retry of a request at
/// `info`: dozens of lines while a store is unreachable).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,object_store=warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

/// `n` and the noun for it: `one` where `n` is 1, else `many`.
pub fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Human-readable bytes (binary units).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn human_bytes_picks_the_unit() {
        assert_eq!(super::human_bytes(512), "512 B");
        assert_eq!(super::human_bytes(5 << 30), "5.00 GiB");
        assert_eq!(super::human_bytes(1536), "1.50 KiB");
    }

    #[test]
    fn the_peak_ends_an_object_and_nothing_else() {
        use super::with_peak;
        let line = with_peak(r#"{"b":1,"a":[2]}"#.into(), Some(7));
        assert_eq!(line, r#"{"b":1,"a":[2],"peak_rss_bytes":7}"#);
        serde_json::from_str::<serde_json::Value>(&line).unwrap();
        assert_eq!(with_peak("{}".into(), Some(7)), r#"{"peak_rss_bytes":7}"#);
        assert_eq!(with_peak("[1]".into(), Some(7)), "[1]");
        assert_eq!(with_peak(r#"{"b":1}"#.into(), None), r#"{"b":1}"#);
    }

    #[test]
    fn the_peak_counts_memory_this_process_touched() {
        let before = super::peak_rss_bytes().expect("Linux reports ru_maxrss");
        // Made and written before the second reading, not sunk past it.
        let touched = std::hint::black_box(vec![1u8; 64 << 20]);
        let after = super::peak_rss_bytes().unwrap();
        assert!(after >= before);
        assert!(
            after >= 64 << 20,
            "peak {after} below the 64 MiB just written"
        );
        drop(touched);
    }
}
