//! Values of a fixed bit width packed back to back, least significant bit
//! first: the addresses and admissions of a record.

/// Appends `values` of `width` bits each, LSB first, to `out`.
pub(super) fn put_bits(out: &mut Vec<u8>, values: impl Iterator<Item = u64>, width: u32) {
    let (mut acc, mut held) = (0u128, 0u32);
    for e in values {
        acc |= u128::from(e) << held;
        held += width;
        while held >= 8 {
            out.push(acc as u8);
            acc >>= 8;
            held -= 8;
        }
    }
    if held > 0 {
        out.push(acc as u8);
    }
}

/// `count` values of `width` bits each from `bytes`, as [`put_bits`] wrote them.
pub(super) fn get_bits(bytes: &[u8], count: usize, width: u32) -> impl Iterator<Item = u64> + '_ {
    let mask = (1u64 << width) - 1;
    let (mut acc, mut held, mut next) = (0u128, 0u32, 0usize);
    (0..count).map(move |_| {
        while held < width {
            acc |= u128::from(bytes[next]) << held;
            next += 1;
            held += 8;
        }
        let e = acc as u64 & mask;
        acc >>= width;
        held -= width;
        e
    })
}
