//! The element type of feature rows in a packed layout (float32, float16 or
//! bfloat16) and the conversion from the feature file's type into it, done
//! once while packing: half-precision rows halve the disk bytes and the I/O
//! of every epoch. Narrowing rounds to nearest, ties to even (IEEE 754, as
//! torch's `to(torch.float16)` and `to(torch.bfloat16)` do).

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use offgnn_shared::npy::DType;
use rayon::prelude::*;

/// How a layout stores each feature value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StoreDType {
    F32,
    F16,
    BF16,
}

/// Elements converted at a time through a stack buffer of `f32`.
const BLOCK: usize = 1024;
/// Elements per parallel task: large enough that a task outweighs its
/// scheduling, small enough that two cores share a 64 MiB piece evenly.
const TASK: usize = 256 * BLOCK;

impl StoreDType {
    pub const ALL: [StoreDType; 3] = [StoreDType::F32, StoreDType::F16, StoreDType::BF16];

    /// Bytes of one value.
    pub fn size(self) -> usize {
        match self {
            StoreDType::F32 => 4,
            StoreDType::F16 | StoreDType::BF16 => 2,
        }
    }

    /// The name a manifest records (torch's and NumPy's spelling).
    pub fn name(self) -> &'static str {
        match self {
            StoreDType::F32 => "float32",
            StoreDType::F16 => "float16",
            StoreDType::BF16 => "bfloat16",
        }
    }

    /// The type a manifest names, if it is one.
    pub fn from_name(name: &str) -> Option<StoreDType> {
        StoreDType::ALL.into_iter().find(|d| d.name() == name)
    }

    /// The type of a feature file's values, where a layout can hold them
    /// unconverted (`float32` and `float16`).
    pub fn of_feature(dtype: DType) -> Option<StoreDType> {
        match dtype {
            DType::F32 => Some(StoreDType::F32),
            DType::F16 => Some(StoreDType::F16),
            _ => None,
        }
    }

    /// The largest finite value this type holds.
    pub fn max_finite(self) -> f64 {
        match self {
            StoreDType::F32 => f32::MAX as f64,
            StoreDType::F16 => f16::MAX.to_f64(),
            StoreDType::BF16 => bf16::MAX.to_f64(),
        }
    }

    /// Whether the value whose little-endian bytes are `b` is an infinity
    /// or a NaN.
    fn non_finite(self, b: &[u8]) -> bool {
        match self {
            StoreDType::F32 => {
                u32::from_le_bytes([b[0], b[1], b[2], b[3]]) & 0x7f80_0000 == 0x7f80_0000
            }
            StoreDType::F16 => u16::from_le_bytes([b[0], b[1]]) & 0x7c00 == 0x7c00,
            StoreDType::BF16 => u16::from_le_bytes([b[0], b[1]]) & 0x7f80 == 0x7f80,
        }
    }

    /// Value `i` of `bytes`, little-endian, widened to `f64`.
    pub fn value(self, bytes: &[u8], i: usize) -> f64 {
        let b = &bytes[i * self.size()..(i + 1) * self.size()];
        match self {
            StoreDType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
            StoreDType::F16 => f16::from_le_bytes([b[0], b[1]]).to_f64(),
            StoreDType::BF16 => bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        }
    }

    /// Widens `src` (values of this type) into `out`.
    fn decode(self, src: &[u8], out: &mut [f32]) {
        match self {
            StoreDType::F32 => {
                for (o, b) in out.iter_mut().zip(src.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            StoreDType::F16 => {
                let mut bits = [f16::ZERO; BLOCK];
                let bits = &mut bits[..out.len()];
                for (h, b) in bits.iter_mut().zip(src.chunks_exact(2)) {
                    *h = f16::from_le_bytes([b[0], b[1]]);
                }
                bits.convert_to_f32_slice(out);
            }
            StoreDType::BF16 => {
                for (o, b) in out.iter_mut().zip(src.chunks_exact(2)) {
                    *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
        }
    }

    /// Narrows (or copies) `values` into `dst` as this type.
    fn encode(self, values: &[f32], dst: &mut [u8]) {
        match self {
            StoreDType::F32 => {
                for (v, b) in values.iter().zip(dst.chunks_exact_mut(4)) {
                    b.copy_from_slice(&v.to_le_bytes());
                }
            }
            StoreDType::F16 => {
                let mut half = [f16::ZERO; BLOCK];
                let half = &mut half[..values.len()];
                half.convert_from_f32_slice(values);
                for (h, b) in half.iter().zip(dst.chunks_exact_mut(2)) {
                    b.copy_from_slice(&h.to_le_bytes());
                }
            }
            StoreDType::BF16 => {
                let mut half = [bf16::ZERO; BLOCK];
                let half = &mut half[..values.len()];
                half.convert_from_f32_slice(values);
                for (h, b) in half.iter().zip(dst.chunks_exact_mut(2)) {
                    b.copy_from_slice(&h.to_le_bytes());
                }
            }
        }
    }
}

impl std::fmt::Display for StoreDType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A finite value that converting made infinite: beyond the range of the
/// layout's type.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OutOfRange {
    /// Index of the value in the converted slice.
    pub index: usize,
    pub value: f64,
}

/// Converts `src`, values of `from`, into `dst` as `to` (`dst` holds the
/// same number of values). A finite value that comes out infinite (a
/// float32 beyond float16's 65504) is refused: the first one is returned,
/// and `dst` is then only partly written. Runs on the rayon pool.
pub fn convert(
    src: &[u8],
    from: StoreDType,
    dst: &mut [u8],
    to: StoreDType,
) -> Result<(), OutOfRange> {
    let n = src.len() / from.size();
    assert_eq!(src.len(), n * from.size(), "whole values");
    assert_eq!(dst.len(), n * to.size(), "the same number of values");
    if from == to {
        dst.copy_from_slice(src);
        return Ok(());
    }
    let bad = src
        .par_chunks(TASK * from.size())
        .zip(dst.par_chunks_mut(TASK * to.size()))
        .enumerate()
        .filter_map(|(k, (src, dst))| {
            convert_block(src, from, dst, to).err().map(|i| OutOfRange {
                index: k * TASK + i,
                value: from.value(src, i),
            })
        })
        .min_by_key(|o| o.index);
    bad.map_or(Ok(()), Err)
}

/// One thread's part of [`convert`]; the error is the first value made
/// infinite, by index in `src`.
fn convert_block(
    src: &[u8],
    from: StoreDType,
    dst: &mut [u8],
    to: StoreDType,
) -> Result<(), usize> {
    let mut values = [0f32; BLOCK];
    let widening = to.size() >= from.size();
    for (k, (s, d)) in src
        .chunks(BLOCK * from.size())
        .zip(dst.chunks_mut(BLOCK * to.size()))
        .enumerate()
    {
        let values = &mut values[..s.len() / from.size()];
        from.decode(s, values);
        to.encode(values, d);
        if widening {
            continue;
        }
        // Narrowing: only values past the type's range turn infinite (a
        // NaN or infinity that came in stays one, and is found the same).
        let hit = d
            .chunks_exact(to.size())
            .zip(s.chunks_exact(from.size()))
            .position(|(d, s)| to.non_finite(d) && !from.non_finite(s));
        if let Some(i) = hit {
            return Err(k * BLOCK + i);
        }
    }
    Ok(())
}

/// Whether `stored` (values of `to`) is exactly `src` (values of `from`)
/// converted: what `packer verify` checks of every row.
pub fn equals_converted(src: &[u8], from: StoreDType, stored: &[u8], to: StoreDType) -> bool {
    if from == to {
        return src == stored;
    }
    let n = src.len() / from.size();
    if stored.len() != n * to.size() {
        return false;
    }
    let mut values = [0f32; BLOCK];
    let mut expect = [0u8; BLOCK * 4];
    src.chunks(BLOCK * from.size())
        .zip(stored.chunks(BLOCK * to.size()))
        .all(|(s, d)| {
            let values = &mut values[..s.len() / from.size()];
            from.decode(s, values);
            let expect = &mut expect[..d.len()];
            to.encode(values, expect);
            expect == d
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bytes_of(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn narrowing_rounds_to_nearest_even() {
        // 1 + 2^-11 lies halfway between float16's 1 and 1 + 2^-10: ties go
        // to the even mantissa (1); 1 + 3 * 2^-11 goes up to 1 + 2^-9.
        let src = bytes_of(&[1.0 + 2f32.powi(-11), 1.0 + 3.0 * 2f32.powi(-11), -0.0]);
        let mut dst = vec![0u8; 6];
        convert(&src, StoreDType::F32, &mut dst, StoreDType::F16).unwrap();
        let got: Vec<f64> = (0..3).map(|i| StoreDType::F16.value(&dst, i)).collect();
        assert_eq!(got, [1.0, 1.0 + 2f64.powi(-9), -0.0]);
        assert!(StoreDType::F16.value(&dst, 2).is_sign_negative());
        // bfloat16 keeps 8 bits of mantissa: 1 + 2^-8 is a tie, rounded to 1.
        let src = bytes_of(&[1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8)]);
        let mut dst = vec![0u8; 4];
        convert(&src, StoreDType::F32, &mut dst, StoreDType::BF16).unwrap();
        assert_eq!(StoreDType::BF16.value(&dst, 0), 1.0);
        assert_eq!(StoreDType::BF16.value(&dst, 1), 1.0 + 2f64.powi(-6));
    }

    #[test]
    fn a_value_beyond_float16_is_refused_where_bfloat16_holds_it() {
        let mut values = vec![0.5f32; 3 * TASK];
        values[TASK + 7] = 70000.0;
        values[2 * TASK + 1] = -1e6;
        let src = bytes_of(&values);
        let mut dst = vec![0u8; values.len() * 2];
        let err = convert(&src, StoreDType::F32, &mut dst, StoreDType::F16).unwrap_err();
        assert_eq!(
            err,
            OutOfRange {
                index: TASK + 7,
                value: 70000.0
            }
        );
        convert(&src, StoreDType::F32, &mut dst, StoreDType::BF16).unwrap();
        assert_eq!(StoreDType::BF16.value(&dst, TASK + 7), 70144.0);
        // 65504 is float16's largest: kept.
        let src = bytes_of(&[65504.0]);
        let mut dst = vec![0u8; 2];
        convert(&src, StoreDType::F32, &mut dst, StoreDType::F16).unwrap();
        assert_eq!(StoreDType::F16.value(&dst, 0), 65504.0);
    }

    #[test]
    fn names_round_trip() {
        for d in StoreDType::ALL {
            assert_eq!(StoreDType::from_name(d.name()), Some(d));
        }
        assert_eq!(StoreDType::from_name("float64"), None);
        assert_eq!(StoreDType::of_feature(DType::F16), Some(StoreDType::F16));
        assert_eq!(StoreDType::of_feature(DType::F64), None);
    }

    proptest! {
        /// Every conversion equals the half crate's own scalar rounding,
        /// value by value, and `equals_converted` accepts exactly it.
        #[test]
        fn conversion_matches_scalar_rounding(
            values in proptest::collection::vec(-60000f32..60000f32, 0..3000),
            flip in any::<prop::sample::Index>(),
        ) {
            let src = bytes_of(&values);
            for to in StoreDType::ALL {
                let mut dst = vec![0u8; values.len() * to.size()];
                convert(&src, StoreDType::F32, &mut dst, to).unwrap();
                for (i, &v) in values.iter().enumerate() {
                    let want = match to {
                        StoreDType::F32 => v as f64,
                        StoreDType::F16 => f16::from_f32(v).to_f64(),
                        StoreDType::BF16 => bf16::from_f32(v).to_f64(),
                    };
                    prop_assert_eq!(to.value(&dst, i), want);
                }
                prop_assert!(equals_converted(&src, StoreDType::F32, &dst, to));
                if !dst.is_empty() {
                    let i = flip.index(dst.len());
                    dst[i] ^= 1;
                    prop_assert!(!equals_converted(&src, StoreDType::F32, &dst, to));
                }
                // Widening back from half precision is exact.
                if to != StoreDType::F32 {
                    let mut dst = vec![0u8; values.len() * to.size()];
                    convert(&src, StoreDType::F32, &mut dst, to).unwrap();
                    let mut wide = vec![0u8; values.len() * 4];
                    convert(&dst, to, &mut wide, StoreDType::F32).unwrap();
                    for i in 0..values.len() {
                        prop_assert_eq!(StoreDType::F32.value(&wide, i), to.value(&dst, i));
                    }
                }
            }
        }
    }
}
