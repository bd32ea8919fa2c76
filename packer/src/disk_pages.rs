//! Page arithmetic for read amplification (DiskGNN §5.1, §6): which 4 KiB
//! disk pages a set of densely packed rows covers, and the runs of
//! consecutive pages one read can fetch.

/// The disk page size that reads and the layout's alignment are counted in.
pub const PAGE_BYTES: u64 = 4096;

/// `bytes` rounded up to a whole number of pages (a chunk or disk cache
/// occupies whole pages on disk), saturating at `u64::MAX`.
pub fn round_up_to_page(bytes: u64) -> u64 {
    bytes.div_ceil(PAGE_BYTES).saturating_mul(PAGE_BYTES)
}

/// The sorted, deduplicated page numbers that hold the rows at `positions`
/// (any order, repeats allowed) of a region packing `row_bytes`-byte rows
/// densely from byte 0: row `p` is bytes `[p * row_bytes, (p + 1) *
/// row_bytes)`, which may straddle pages. Zero-byte rows cover no page.
///
/// # Panics
/// If a row's end page number exceeds `u64::MAX`, which needs a region of
/// over 2^76 bytes.
pub fn pages_of_rows(positions: &[u64], row_bytes: u64) -> Vec<u64> {
    if row_bytes == 0 {
        return Vec::new();
    }
    let page = |byte: u128| -> u64 {
        u64::try_from(byte / u128::from(PAGE_BYTES)).expect("a region's pages number below 2^64")
    };
    let mut pages = Vec::with_capacity(positions.len());
    for &p in positions {
        let start = u128::from(p) * u128::from(row_bytes);
        let last = start + u128::from(row_bytes) - 1;
        pages.extend(page(start)..=page(last));
    }
    pages.sort_unstable();
    pages.dedup();
    pages
}

/// The table format's own merge of pages into runs, which the trainer
/// rebuilds on decode: one definition for both sides.
pub use offgnn_shared::address_table::page_runs;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn rows_that_straddle_pages_cover_both() {
        // 3000-byte rows: row 1 is bytes 3000..6000, pages 0 and 1.
        assert_eq!(pages_of_rows(&[1], 3000), [0, 1]);
        assert_eq!(pages_of_rows(&[0], 4096), [0]);
        assert_eq!(pages_of_rows(&[1], 4096), [1]);
        // A 10000-byte row from byte 10000 to 19999: pages 2, 3 and 4.
        assert_eq!(pages_of_rows(&[1], 10_000), [2, 3, 4]);
        assert_eq!(pages_of_rows(&[5, 0, 5, 1], 512), [0]);
        assert!(pages_of_rows(&[3], 0).is_empty());
    }

    #[test]
    fn runs_merge_consecutive_pages() {
        assert_eq!(page_runs(&[]), []);
        assert_eq!(page_runs(&[0, 1, 2, 5, 7, 8]), [(0, 3), (5, 1), (7, 2)]);
        assert_eq!(page_runs(&[u64::MAX]), [(u64::MAX, 1)]);
    }

    #[test]
    fn rounding_to_pages() {
        assert_eq!(round_up_to_page(0), 0);
        assert_eq!(round_up_to_page(1), 4096);
        assert_eq!(round_up_to_page(4096), 4096);
        assert_eq!(round_up_to_page(4097), 8192);
        assert_eq!(round_up_to_page(u64::MAX), u64::MAX);
    }

    proptest! {
        #[test]
        fn pages_match_a_byte_by_byte_count(
            positions in prop::collection::vec(0u64..64, 0..20),
            row_bytes in 0u64..9000,
        ) {
            let naive: BTreeSet<u64> = positions
                .iter()
                .flat_map(|&p| p * row_bytes..(p + 1) * row_bytes)
                .map(|byte| byte / PAGE_BYTES)
                .collect();
            let pages = pages_of_rows(&positions, row_bytes);
            prop_assert_eq!(&pages, &naive.into_iter().collect::<Vec<_>>());

            let runs = page_runs(&pages);
            let expanded: Vec<u64> = runs.iter().flat_map(|&(first, n)| first..first + n).collect();
            prop_assert_eq!(&expanded, &pages);
            // Maximal: a gap separates consecutive runs.
            prop_assert!(runs.windows(2).all(|w| w[0].0 + w[0].1 < w[1].0));
            prop_assert!(runs.iter().all(|&(_, n)| n > 0));
        }
    }
}
