//! The element type of feature rows in a packed layout (float32, float16 or
//! bfloat16) and the conversion from the feature file's type into it, done
//! once while packing: half-precision rows halve the disk bytes and the I/O
//! of every epoch. Narrowing rounds to nearest, ties to even (IEEE 754, as
//! torch's `to(torch.float16)` and `to(torch.bfloat16)` do).

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use offgnn_manifests::Dtype;
use offgnn_shared::npy::DType;
use rayon::prelude::*;

/// Elements converted at a time through a stack buffer of `f32`.
const BLOCK: usize = 1024;
/// Elements per parallel task: large enough that a task outweighs its
/// scheduling, small enough that two cores share a 64 MiB piece evenly.
const TASK: usize = 256 * BLOCK;

/// The type of a feature file's values, where a layout can hold them
/// unconverted (`float32` and `float16`).
pub fn of_feature(dtype: DType) -> Option<Dtype> {
    match dtype {
        DType::F32 => Some(Dtype::F32),
        DType::F16 => Some(Dtype::F16),
        _ => None,
    }
}

/// Reading and writing the values of a layout's type.
pub trait Values: Copy {
    /// Bytes of one value, as an in-memory length.
    fn value_bytes(self) -> usize;
    /// The largest finite value this type holds.
    fn max_finite(self) -> f64;
    /// Value `i` of `bytes`, little-endian, widened to `f64`.
    fn value(self, bytes: &[u8], i: usize) -> f64;
}

impl Values for Dtype {
    fn value_bytes(self) -> usize {
        self.size() as usize
    }

    fn max_finite(self) -> f64 {
        match self {
            Dtype::F32 => f32::MAX as f64,
            Dtype::F16 => f16::MAX.to_f64(),
            Dtype::BF16 => bf16::MAX.to_f64(),
        }
    }

    fn value(self, bytes: &[u8], i: usize) -> f64 {
        let b = &bytes[i * self.value_bytes()..(i + 1) * self.value_bytes()];
        match self {
            Dtype::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64,
            Dtype::F16 => f16::from_le_bytes([b[0], b[1]]).to_f64(),
            Dtype::BF16 => bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        }
    }
}

/// What conversion does to blocks of values.
trait Blocks {
    /// Whether the value whose little-endian bytes are `b` is an infinity
    /// or a NaN.
    fn non_finite(self, b: &[u8]) -> bool;
    /// Widens `src` (values of this type) into `out`.
    fn decode(self, src: &[u8], out: &mut [f32]);
    /// Narrows (or copies) `values` into `dst` as this type.
    fn encode(self, values: &[f32], dst: &mut [u8]);
}

impl Blocks for Dtype {
    fn non_finite(self, b: &[u8]) -> bool {
        match self {
            Dtype::F32 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) & 0x7f80_0000 == 0x7f80_0000,
            Dtype::F16 => u16::from_le_bytes([b[0], b[1]]) & 0x7c00 == 0x7c00,
            Dtype::BF16 => u16::from_le_bytes([b[0], b[1]]) & 0x7f80 == 0x7f80,
        }
    }

    fn decode(self, src: &[u8], out: &mut [f32]) {
        match self {
            Dtype::F32 => {
                for (o, b) in out.iter_mut().zip(src.chunks_exact(4)) {
                    *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            Dtype::F16 => {
                let mut bits = [f16::ZERO; BLOCK];
                let bits = &mut bits[..out.len()];
                for (h, b) in bits.iter_mut().zip(src.chunks_exact(2)) {
                    *h = f16::from_le_bytes([b[0], b[1]]);
                }
                bits.convert_to_f32_slice(out);
            }
            Dtype::BF16 => {
                for (o, b) in out.iter_mut().zip(src.chunks_exact(2)) {
                    *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
                }
            }
        }
    }

    fn encode(self, values: &[f32], dst: &mut [u8]) {
        match self {
            Dtype::F32 => {
                for (v, b) in values.iter().zip(dst.chunks_exact_mut(4)) {
                    b.copy_from_slice(&v.to_le_bytes());
                }
            }
            Dtype::F16 => {
                let mut half = [f16::ZERO; BLOCK];
                let half = &mut half[..values.len()];
                half.convert_from_f32_slice(values);
                for (h, b) in half.iter().zip(dst.chunks_exact_mut(2)) {
                    b.copy_from_slice(&h.to_le_bytes());
                }
            }
            Dtype::BF16 => {
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
pub fn convert(src: &[u8], from: Dtype, dst: &mut [u8], to: Dtype) -> Result<(), OutOfRange> {
    let n = src.len() / from.value_bytes();
    assert_eq!(src.len(), n * from.value_bytes(), "whole values");
    assert_eq!(dst.len(), n * to.value_bytes(), "the same number of values");
    if from == to {
        dst.copy_from_slice(src);
        return Ok(());
    }
    let bad = src
        .par_chunks(TASK * from.value_bytes())
        .zip(dst.par_chunks_mut(TASK * to.value_bytes()))
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
fn convert_block(src: &[u8], from: Dtype, dst: &mut [u8], to: Dtype) -> Result<(), usize> {
    let mut values = [0f32; BLOCK];
    let widening = to.value_bytes() >= from.value_bytes();
    for (k, (s, d)) in src
        .chunks(BLOCK * from.value_bytes())
        .zip(dst.chunks_mut(BLOCK * to.value_bytes()))
        .enumerate()
    {
        let values = &mut values[..s.len() / from.value_bytes()];
        from.decode(s, values);
        to.encode(values, d);
        if widening {
            continue;
        }
        // Narrowing: only values past the type's range turn infinite (a
        // NaN or infinity that came in stays one, and is found the same).
        let hit = d
            .chunks_exact(to.value_bytes())
            .zip(s.chunks_exact(from.value_bytes()))
            .position(|(d, s)| to.non_finite(d) && !from.non_finite(s));
        if let Some(i) = hit {
            return Err(k * BLOCK + i);
        }
    }
    Ok(())
}

/// Whether `stored` (values of `to`) is exactly `src` (values of `from`)
/// converted: what `packer verify` checks of every row.
pub fn equals_converted(src: &[u8], from: Dtype, stored: &[u8], to: Dtype) -> bool {
    if from == to {
        return src == stored;
    }
    let n = src.len() / from.value_bytes();
    if stored.len() != n * to.value_bytes() {
        return false;
    }
    let mut values = [0f32; BLOCK];
    let mut expect = [0u8; BLOCK * 4];
    src.chunks(BLOCK * from.value_bytes())
        .zip(stored.chunks(BLOCK * to.value_bytes()))
        .all(|(s, d)| {
            let values = &mut values[..s.len() / from.value_bytes()];
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
        convert(&src, Dtype::F32, &mut dst, Dtype::F16).unwrap();
        let got: Vec<f64> = (0..3).map(|i| Dtype::F16.value(&dst, i)).collect();
        assert_eq!(got, [1.0, 1.0 + 2f64.powi(-9), -0.0]);
        assert!(Dtype::F16.value(&dst, 2).is_sign_negative());
        // bfloat16 keeps 8 bits of mantissa: 1 + 2^-8 is a tie, rounded to 1.
        let src = bytes_of(&[1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8)]);
        let mut dst = vec![0u8; 4];
        convert(&src, Dtype::F32, &mut dst, Dtype::BF16).unwrap();
        assert_eq!(Dtype::BF16.value(&dst, 0), 1.0);
        assert_eq!(Dtype::BF16.value(&dst, 1), 1.0 + 2f64.powi(-6));
    }

    #[test]
    fn a_value_beyond_float16_is_refused_where_bfloat16_holds_it() {
        let mut values = vec![0.5f32; 3 * TASK];
        values[TASK + 7] = 70000.0;
        values[2 * TASK + 1] = -1e6;
        let src = bytes_of(&values);
        let mut dst = vec![0u8; values.len() * 2];
        let err = convert(&src, Dtype::F32, &mut dst, Dtype::F16).unwrap_err();
        assert_eq!(
            err,
            OutOfRange {
                index: TASK + 7,
                value: 70000.0
            }
        );
        convert(&src, Dtype::F32, &mut dst, Dtype::BF16).unwrap();
        assert_eq!(Dtype::BF16.value(&dst, TASK + 7), 70144.0);
        // 65504 is float16's largest: kept.
        let src = bytes_of(&[65504.0]);
        let mut dst = vec![0u8; 2];
        convert(&src, Dtype::F32, &mut dst, Dtype::F16).unwrap();
        assert_eq!(Dtype::F16.value(&dst, 0), 65504.0);
    }

    #[test]
    fn feature_files_of_float_types_are_held_as_they_are() {
        assert_eq!(of_feature(DType::F16), Some(Dtype::F16));
        assert_eq!(of_feature(DType::F32), Some(Dtype::F32));
        assert_eq!(of_feature(DType::F64), None);
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
            for to in Dtype::ALL {
                let mut dst = vec![0u8; values.len() * to.value_bytes()];
                convert(&src, Dtype::F32, &mut dst, to).unwrap();
                for (i, &v) in values.iter().enumerate() {
                    let want = match to {
                        Dtype::F32 => v as f64,
                        Dtype::F16 => f16::from_f32(v).to_f64(),
                        Dtype::BF16 => bf16::from_f32(v).to_f64(),
                    };
                    prop_assert_eq!(to.value(&dst, i), want);
                }
                prop_assert!(equals_converted(&src, Dtype::F32, &dst, to));
                if !dst.is_empty() {
                    let i = flip.index(dst.len());
                    dst[i] ^= 1;
                    prop_assert!(!equals_converted(&src, Dtype::F32, &dst, to));
                }
                // Widening back from half precision is exact.
                if to != Dtype::F32 {
                    let mut dst = vec![0u8; values.len() * to.value_bytes()];
                    convert(&src, Dtype::F32, &mut dst, to).unwrap();
                    let mut wide = vec![0u8; values.len() * 4];
                    convert(&dst, to, &mut wide, Dtype::F32).unwrap();
                    for i in 0..values.len() {
                        prop_assert_eq!(Dtype::F32.value(&wide, i), to.value(&dst, i));
                    }
                }
            }
        }
    }
}
