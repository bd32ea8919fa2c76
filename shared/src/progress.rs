//! Progress bars with one look across the three programs. Bars draw on
//! stderr and only when it is a terminal, so logs and pipes stay clean.

use indicatif::{ProgressBar, ProgressStyle};

/// A bar over `len` items of `unit` (rows, edges, batches) with rate and ETA.
pub fn bar(len: u64, label: &str, unit: &str) -> ProgressBar {
    let style = ProgressStyle::with_template(&format!(
        "{{prefix:>12}} [{{bar:30}}] {{human_pos}}/{{human_len}} {unit} ({{per_sec}}, ETA {{eta}})"
    ))
    .expect("valid progress template")
    .progress_chars("=> ");
    ProgressBar::new(len)
        .with_style(style)
        .with_prefix(label.to_string())
}

/// [`bar`] when `show`, else a hidden bar (quiet library calls and tests).
pub fn bar_if(show: bool, len: u64, label: &str, unit: &str) -> ProgressBar {
    if show {
        bar(len, label, unit)
    } else {
        ProgressBar::hidden()
    }
}

/// [`bytes_bar`] when `show`, else a hidden bar.
pub fn bytes_bar_if(show: bool, len: u64, label: &str) -> ProgressBar {
    if show {
        bytes_bar(len, label)
    } else {
        ProgressBar::hidden()
    }
}

/// A bar over bytes.
pub fn bytes_bar(len: u64, label: &str) -> ProgressBar {
    let style = ProgressStyle::with_template(
        "{prefix:>12} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, ETA {eta})",
    )
    .expect("valid progress template")
    .progress_chars("=> ");
    ProgressBar::new(len)
        .with_style(style)
        .with_prefix(label.to_string())
}
