//! Sizes as users write them on the command line: byte counts with binary
//! units (`512K`, `1.5G`, `4GiB`) and disk budgets that may be a multiple of
//! the feature file (`3x`).

use crate::error::Error;

const FORMAT_HINT: &str =
    "expected a number of bytes with an optional binary unit, such as 4096, 512K, 1.5G or 4GiB";

/// Parses a byte count: digits with an optional fraction and an optional
/// unit among K, M, G, T, each alone or followed by `B` or `iB`, in any
/// case. Every unit is binary (`K` = `KB` = `KiB` = 1024 bytes), as memory
/// and disk budgets usually mean. A fraction needs a unit (`1.5G`); the
/// result is rounded down to whole bytes.
pub fn parse_bytes(text: &str) -> Result<u64, Error> {
    let invalid = |why: &str| Error::InvalidArgument(format!("invalid size {text:?}: {why}"));
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(invalid(FORMAT_HINT));
    }
    if trimmed.starts_with('-') {
        return Err(invalid("a size cannot be negative"));
    }
    let number_end = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(number_end);
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(invalid(FORMAT_HINT)),
    };
    let (whole, fraction) = match number.split_once('.') {
        Some((whole, fraction)) => (whole, Some(fraction)),
        None => (number, None),
    };
    if whole.is_empty() || fraction.is_some_and(|f| f.is_empty() || f.contains('.')) {
        return Err(invalid(FORMAT_HINT));
    }
    if fraction.is_some() && shift == 0 {
        return Err(invalid("a byte count must be whole (write 1.5K, not 1.5)"));
    }
    let too_large = || invalid(&format!("larger than the {} bytes a size can be", u64::MAX));
    // Exact integer arithmetic: 1.5G is 3 * 2^30 / 2, not a float product.
    let mut bytes: u128 = 0;
    for digit in whole.bytes() {
        bytes = bytes
            .checked_mul(10)
            .and_then(|b| b.checked_add(u128::from(digit - b'0')))
            .filter(|&b| b <= u128::from(u64::MAX))
            .ok_or_else(too_large)?;
    }
    bytes <<= shift;
    if let Some(fraction) = fraction {
        // 10^19 * 2^40 < 2^128, so 19 decimals are exact; more would only
        // matter below a millionth of a byte.
        if fraction.len() > 19 {
            return Err(invalid("more than 19 decimal places"));
        }
        let numerator: u128 = fraction
            .parse()
            .map_err(|_| invalid(FORMAT_HINT))
            .map(|f: u128| f << shift)?;
        let denominator = 10u128.pow(fraction.len() as u32);
        bytes += numerator / denominator;
    }
    u64::try_from(bytes).map_err(|_| too_large())
}

/// A disk budget: a byte count, or a multiple of the feature file's size.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Budget {
    Bytes(u64),
    Multiple(f64),
}

impl Budget {
    /// The budget in bytes for a feature file of `feature_file_bytes`; a
    /// multiple is rounded down and saturates at `u64::MAX`.
    pub fn resolve(&self, feature_file_bytes: u64) -> u64 {
        match *self {
            Budget::Bytes(bytes) => bytes,
            // Whole multiples stay exact beyond 2^53 bytes.
            Budget::Multiple(m) if m.fract() == 0.0 && m <= u64::MAX as f64 => {
                feature_file_bytes.saturating_mul(m as u64)
            }
            // `as` saturates a float that is out of range.
            Budget::Multiple(m) => (m * feature_file_bytes as f64) as u64,
        }
    }
}

/// Parses a disk budget: a byte count as [`parse_bytes`] reads it, or a
/// positive, finite multiple of the feature file such as `3x` or `2.5X`.
pub fn parse_budget(text: &str) -> Result<Budget, Error> {
    let trimmed = text.trim();
    let Some(multiple) = trimmed.strip_suffix(['x', 'X']) else {
        return parse_bytes(text).map(Budget::Bytes);
    };
    let invalid = || {
        Error::InvalidArgument(format!(
            "invalid disk budget {text:?}: a multiple of the feature file must be a positive number followed by x, such as 3x or 2.5x"
        ))
    };
    let multiple = multiple.trim();
    // Rust's float parser also takes "inf", "nan" and "1e3"; only plain
    // decimals are meant here.
    if multiple.is_empty() || !multiple.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(invalid());
    }
    let m: f64 = multiple.parse().map_err(|_| invalid())?;
    if !m.is_finite() || m <= 0.0 {
        return Err(invalid());
    }
    Ok(Budget::Multiple(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    const K: u64 = 1 << 10;
    const M: u64 = 1 << 20;
    const G: u64 = 1 << 30;
    const T: u64 = 1 << 40;

    #[test]
    fn plain_and_suffixed_sizes() {
        for (text, bytes) in [
            ("0", 0),
            ("4096", 4096),
            ("512K", 512 * K),
            ("512k", 512 * K),
            ("512M", 512 * M),
            ("4G", 4 * G),
            ("1.5G", 3 * G / 2),
            ("2T", 2 * T),
            ("512MiB", 512 * M),
            ("4GiB", 4 * G),
            ("4GB", 4 * G),
            ("4gb", 4 * G),
            ("4 GiB", 4 * G),
            (" 7 ", 7),
            ("100B", 100),
            ("0.5K", 512),
            ("0.3K", 307), // 307.2 rounds down
            ("18446744073709551615", u64::MAX),
        ] {
            assert_eq!(parse_bytes(text).expect(text), bytes, "{text}");
        }
    }

    #[test]
    fn bad_sizes_are_rejected_with_the_text_named() {
        for text in [
            "",
            " ",
            "-1",
            "-5G",
            "abc",
            "G",
            "4Q",
            "4GiBs",
            "1.5",
            "1.",
            ".5G",
            "1.2.3G",
            "1,5G",
            "4 G B",
            "18446744073709551616",
            "16777216T",
            "0x10",
            "+5",
        ] {
            let err = parse_bytes(text).expect_err(text);
            let message = err.to_string();
            assert!(message.contains(&format!("{text:?}")), "{message}");
        }
    }

    #[test]
    fn the_largest_unit_value_that_fits_is_accepted() {
        // 2^64 - 1 bytes is 16 EiB - 1: 16777215T fits, 16777216T does not.
        assert_eq!(parse_bytes("16777215T").expect("fits"), 16_777_215 * T);
    }

    #[test]
    fn budgets_are_bytes_or_multiples() {
        assert_eq!(parse_budget("4G").expect("bytes"), Budget::Bytes(4 * G));
        assert_eq!(parse_budget("3x").expect("3x"), Budget::Multiple(3.0));
        assert_eq!(parse_budget("2.5X").expect("2.5X"), Budget::Multiple(2.5));
        for text in [
            "0x", "-1x", "x", "infx", "NaNx", "1e3x", "abcx", "3xx", "1..5x",
        ] {
            let message = parse_budget(text).expect_err(text).to_string();
            assert!(message.contains(&format!("{text:?}")), "{message}");
        }
    }

    #[test]
    fn budgets_resolve_against_the_feature_file() {
        assert_eq!(Budget::Bytes(100).resolve(1 << 40), 100);
        assert_eq!(Budget::Multiple(3.0).resolve(1000), 3000);
        assert_eq!(Budget::Multiple(2.5).resolve(1001), 2502);
        assert_eq!(Budget::Multiple(0.5).resolve(7), 3);
        // Whole multiples are exact even where f64 is not.
        let odd = (1u64 << 60) + 1;
        assert_eq!(Budget::Multiple(3.0).resolve(odd), 3 * odd);
        assert_eq!(Budget::Multiple(4.0).resolve(u64::MAX), u64::MAX);
        assert_eq!(Budget::Multiple(1e30).resolve(2), u64::MAX);
    }
}
