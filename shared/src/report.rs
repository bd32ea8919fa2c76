//! How every job ends: a table a person reads, then one line of JSON a
//! program reads, both on stdout; and how logging is set up (stderr).

use serde::Serialize;

/// Prints `title`, then aligned `label  value` rows, then the JSON summary
/// on a line of its own.
pub fn print_summary(title: &str, rows: &[(&str, String)], json: &impl Serialize) {
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    println!("{title}");
    for (k, v) in rows {
        println!("  {k:<width$}  {v}");
    }
    match serde_json::to_string(json) {
        Ok(line) => println!("{line}"),
        Err(e) => tracing::error!("cannot encode the JSON summary: {e}"),
    }
}

/// Logs to stderr at `info` unless `RUST_LOG` says otherwise.
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
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
}
