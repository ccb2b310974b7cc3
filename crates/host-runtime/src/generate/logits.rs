//! Logits as a generation reads them: the last row of `[T, vocab]` in f32, f16 or bf16, widened to f32 (`half`
//! does the widening).

use blob_format::model::DType;

/// The little-endian elements of `N` bytes in the last `vocab` of `bytes` (a trailing partial element ignored).
fn last_elements<const N: usize>(bytes: &[u8], vocab: usize) -> impl Iterator<Item = [u8; N]> + '_ {
    let values = bytes.len() / N;
    let row = &bytes[values.saturating_sub(vocab) * N..values * N];
    row.chunks_exact(N).map(|c| c.try_into().expect("chunks of N bytes"))
}

/// Reads f32 logits; the last row of `[T, vocab]`.
pub fn last_row(bytes: &[u8], vocab: usize) -> Vec<f32> {
    last_elements::<4>(bytes, vocab).map(f32::from_le_bytes).collect()
}

/// An IEEE 754 half-precision value, widened (exactly: every f16 is an f32).
pub fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// Reads f16 logits; the last row of `[T, vocab]`, widened to f32.
pub fn last_row_f16(bytes: &[u8], vocab: usize) -> Vec<f32> {
    last_elements::<2>(bytes, vocab).map(|b| f16_to_f32(u16::from_le_bytes(b))).collect()
}

/// Reads bf16 logits; the last row of `[T, vocab]`, widened to f32 (a bf16 is the top half of an f32).
pub fn last_row_bf16(bytes: &[u8], vocab: usize) -> Vec<f32> {
    last_elements::<2>(bytes, vocab).map(|b| half::bf16::from_bits(u16::from_le_bytes(b)).to_f32()).collect()
}

/// The last row of `[T, vocab]` logits of `dtype`, widened to f32.
pub(super) fn widen_last_row(bytes: &[u8], dtype: DType, vocab: usize) -> Vec<f32> {
    match dtype {
        DType::F16 => last_row_f16(bytes, vocab),
        DType::BF16 => last_row_bf16(bytes, vocab),
        _ => last_row(bytes, vocab),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The greedy token of `[T, vocab]` logits: [`ref_graph::argmax`] of the last row (first of equals, NaN
    /// never wins), the rule every delegate's `next_token` follows.
    fn logits_token(bytes: &[u8], dtype: DType, vocab: usize) -> i64 {
        ref_graph::argmax(&widen_last_row(bytes, dtype, vocab)) as i64
    }

    #[test]
    fn the_logits_token_is_the_first_largest_of_the_last_row_and_never_a_nan() {
        let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        // [2, 3]: the first row is larger everywhere, only the last row counts; its NaN first value never wins.
        let bytes = f32s(&[9.0, 9.0, 9.0, f32::NAN, 1.0, 1.0]);
        assert_eq!(logits_token(&bytes, DType::F32, 3), 1);
        assert_eq!(logits_token(&f32s(&[f32::NAN, f32::NAN]), DType::F32, 2), 1, "all NaN: the last index");
        // f16: NaN (0x7e00), 0.5 (0x3800), 1.0 (0x3c00).
        let f16s: Vec<u8> = [0x7e00u16, 0x3800, 0x3c00].iter().flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(logits_token(&f16s, DType::F16, 3), 2);
    }

    #[test]
    fn last_row_of_logits() {
        let bytes: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(last_row(&bytes, 2), vec![3.0, 4.0]);
        assert_eq!(last_row(&bytes[..15], 2), vec![2.0, 3.0], "a trailing partial value is not read");
        let bf16s: Vec<u8> = [0x3f80u16, 0xc000].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(last_row_bf16(&bf16s, 2), vec![1.0, -2.0]);
    }

    #[test]
    fn half_precision_widens_exactly() {
        for (bits, value) in [
            (0x0000u16, 0.0f32),
            (0x3c00, 1.0),
            (0xc000, -2.0),
            (0x3555, 0.333_251_95),
            (0x7bff, 65504.0),
            (0x0001, 2f32.powi(-24)),
            (0x8001, -(2f32.powi(-24))),
            (0x03ff, 1023.0 * 2f32.powi(-24)),
        ] {
            assert_eq!(f16_to_f32(bits), value, "{bits:#06x}");
        }
        assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
        assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
        assert!(f16_to_f32(0x8000).is_sign_negative() && f16_to_f32(0x8000) == 0.0);
        let bytes: Vec<u8> = [0x3c00u16, 0x4000, 0x4200].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(last_row_f16(&bytes, 2), vec![2.0, 3.0]);
    }
}
