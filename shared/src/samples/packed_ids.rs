//! The samples format's packed id lists (format version 2): a list of u32
//! ids as one binary value, bit-packed in blocks of 128 with each block's
//! own width, so that a list's bytes follow the ids' magnitude rather than
//! 32 bits, and a reader or writer touches each id once (Parquet lists pay
//! a repetition and a definition level per value besides).
//!
//! Layout, little-endian: the count `n` (u32), then `ceil(n / 128)`
//! blocks, each one byte `b` (0 to 32) and `16 * b` bytes of the block's
//! values in `bitpacking`'s `BitPacker4x` layout; the last block is padded
//! with zeros. A delta list stores each value's difference from the one
//! before (wrapping, the first against 0): ids grouped in increasing order
//! take a bit or two each.

use bitpacking::{BitPacker, BitPacker4x};

const BLOCK: usize = BitPacker4x::BLOCK_LEN;

/// Packs `values`, as differences when `delta`.
pub fn pack(values: &[u32], delta: bool) -> Vec<u8> {
    pack_parts(&[values], delta)
}

/// Packs `parts` end to end as one list (a batch's blocks without
/// concatenating them first): the bytes [`pack`] writes for their
/// concatenation.
pub fn pack_parts(parts: &[&[u32]], delta: bool) -> Vec<u8> {
    let n: usize = parts.iter().map(|p| p.len()).sum();
    let packer = BitPacker4x::new();
    let mut out = Vec::with_capacity(4 + n / 2);
    out.extend_from_slice(&(n as u32).to_le_bytes());
    let mut block = [0u32; BLOCK];
    let mut bits = [0u8; 4 * BLOCK];
    let mut flush = |block: &mut [u32; BLOCK], filled: usize| {
        block[filled..].fill(0);
        let width = packer.num_bits(block);
        let len = packer.compress(block, &mut bits, width);
        out.push(width);
        out.extend_from_slice(&bits[..len]);
    };
    let (mut filled, mut previous) = (0, 0u32);
    for mut rest in parts.iter().copied() {
        while !rest.is_empty() {
            let take = (BLOCK - filled).min(rest.len());
            let (head, tail) = rest.split_at(take);
            let slots = &mut block[filled..filled + take];
            if delta {
                for (slot, &v) in slots.iter_mut().zip(head) {
                    *slot = v.wrapping_sub(previous);
                    previous = v;
                }
            } else {
                slots.copy_from_slice(head);
            }
            filled += take;
            rest = tail;
            if filled == BLOCK {
                flush(&mut block, BLOCK);
                filled = 0;
            }
        }
    }
    if filled > 0 {
        flush(&mut block, filled);
    }
    out
}

/// Unpacks what [`pack`] wrote with the same `delta`; says what is wrong
/// with bytes that are not such a list.
pub fn unpack(bytes: &[u8], delta: bool) -> Result<Vec<u32>, String> {
    let (head, mut rest) = bytes
        .split_first_chunk::<4>()
        .ok_or("a packed id list shorter than its count")?;
    let n = u32::from_le_bytes(*head) as usize;
    // Each block takes one byte at the least: a count the bytes cannot
    // hold is refused before anything is allocated for it.
    if n.div_ceil(BLOCK) > rest.len() {
        return Err(format!(
            "a packed id list of {n} ids in {} bytes",
            bytes.len()
        ));
    }
    let packer = BitPacker4x::new();
    let mut out = Vec::with_capacity(n.div_ceil(BLOCK) * BLOCK);
    let mut block = [0u32; BLOCK];
    let mut previous = 0u32;
    while out.len() < n {
        let (&width, tail) = rest.split_first().ok_or("a packed id list ends early")?;
        let len = BLOCK * width as usize / 8;
        if width > 32 || tail.len() < len {
            return Err(format!(
                "a packed id list's block of width {width} is cut short or wider than 32 bits"
            ));
        }
        packer.decompress(&tail[..len], &mut block, width);
        if delta {
            for v in &mut block {
                previous = previous.wrapping_add(*v);
                *v = previous;
            }
        }
        out.extend_from_slice(&block);
        rest = &tail[len..];
    }
    if !rest.is_empty() {
        return Err(format!("{} bytes after a packed id list", rest.len()));
    }
    out.truncate(n);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn lists_come_back_as_they_went(values in proptest::collection::vec(any::<u32>(), 0..700), delta: bool) {
            prop_assert_eq!(unpack(&pack(&values, delta), delta).unwrap(), values);
        }

        #[test]
        fn parts_pack_as_their_concatenation(values in proptest::collection::vec(any::<u32>(), 0..700), cuts in proptest::collection::vec(0usize..700, 0..4), delta: bool) {
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(values.len())).collect();
            cuts.sort_unstable();
            let mut parts = Vec::new();
            let mut at = 0;
            for c in cuts.into_iter().chain([values.len()]) {
                parts.push(&values[at..c]);
                at = c;
            }
            prop_assert_eq!(pack_parts(&parts, delta), pack(&values, delta));
        }
    }

    #[test]
    fn small_ids_take_few_bits_and_sorted_runs_fewer_as_deltas() {
        let local: Vec<u32> = (0..12_800u32).map(|i| (i * 7919) % 1000).collect();
        // 10 bits each, and a byte of width per 128.
        assert_eq!(pack(&local, false).len(), 4 + 100 * (1 + 160));
        let grouped: Vec<u32> = (0..12_800u32).map(|i| i / 10).collect();
        // Differences of 0 and 1: one bit each.
        assert_eq!(pack(&grouped, true).len(), 4 + 100 * (1 + 16));
    }

    /// The layout as docs/format.md states it, for readers in other
    /// languages: id `i` in lane `i % 4` at position `i / 4`, each lane's
    /// ids packed low bits first into the words `4w + lane`.
    #[test]
    fn blocks_follow_the_documented_layout() {
        let values: Vec<u32> = (0..300u32)
            .map(|i| i.wrapping_mul(2_654_435_761) >> 13)
            .collect();
        let packed = pack(&values, false);
        let mut rest = &packed[4..];
        let mut decoded = Vec::new();
        while !rest.is_empty() {
            let b = rest[0] as usize;
            let words: Vec<u32> = rest[1..1 + 16 * b]
                .chunks_exact(4)
                .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
                .collect();
            for i in 0..BLOCK {
                let (lane, pos) = (i % 4, i / 4);
                let mut v = 0u64;
                for bit in 0..b {
                    let at = pos * b + bit;
                    let word = words[4 * (at / 32) + lane];
                    v |= u64::from((word >> (at % 32)) & 1) << bit;
                }
                decoded.push(v as u32);
            }
            rest = &rest[1 + 16 * b..];
        }
        decoded.truncate(values.len());
        assert_eq!(decoded, values);
    }

    #[test]
    fn damaged_lists_are_refused_not_trusted() {
        let packed = pack(&(0..300).collect::<Vec<u32>>(), false);
        assert!(unpack(&packed[..3], false).is_err());
        assert!(unpack(&packed[..packed.len() - 1], false).is_err());
        let mut longer = packed.clone();
        longer.push(0);
        assert!(unpack(&longer, false).is_err());
        let mut huge = packed.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(unpack(&huge, false).unwrap_err().contains("ids in"));
        let mut wide = packed;
        wide[4] = 40;
        assert!(unpack(&wide, false).is_err());
    }
}
