//! The element types a tensor holds, and the one place each float type is read to `f32` and rounded back.
//!
//! Every op computes in `f32`: [`Float::to_f32`] reads a value (exact for `f16` and `bf16`), the op computes,
//! and [`Float::from_f32`] rounds the result to the output's type when it is stored (to nearest, ties to even,
//! as `half` does). So an `f16` graph's intermediates are `f16` values, as on the GPU.

use ref_graph::half::{bf16, f16};

/// An element type a tensor can hold: plain old data (so its storage can be seen as bytes, and caller bytes
/// as it).
pub trait Elem: bytemuck::Pod + Default {}

impl Elem for f32 {}
impl Elem for f16 {}
impl Elem for bf16 {}
impl Elem for i64 {}

/// A float element type: `f32`, `f16` or `bf16`, computed through `f32`.
pub trait Float: Elem {
    /// Bits of significand, the implicit bit included (24, 11, 8).
    const SIGNIFICAND_BITS: u32;
    /// The value as `f32` (exact).
    fn to_f32(self) -> f32;
    /// `x` rounded to this type (to nearest, ties to even).
    fn from_f32(x: f32) -> Self;
    /// `x`, exactly representable in this type, as it (no rounding happens).
    fn from_exact_f64(x: f64) -> Self;

    /// `x` rounded to this type, once (to nearest, ties to even): [`ref_graph::Op::Cast`]'s `i64` rule.
    /// Converting through `f32` would round twice (`bf16` keeps 8 bits of a 24-bit `f32`).
    fn from_i64(x: i64) -> Self {
        Self::from_exact_f64(round_to_bits(x, Self::SIGNIFICAND_BITS))
    }
}

impl Float for f32 {
    const SIGNIFICAND_BITS: u32 = f32::MANTISSA_DIGITS;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> f32 {
        x
    }
    fn from_exact_f64(x: f64) -> f32 {
        x as f32
    }
}

impl Float for f16 {
    const SIGNIFICAND_BITS: u32 = f16::MANTISSA_DIGITS;
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(x: f32) -> f16 {
        f16::from_f32(x)
    }
    fn from_exact_f64(x: f64) -> f16 {
        // A value past f16's range (at least 65520 after rounding to 11 bits) becomes infinite here.
        f16::from_f64(x)
    }
}

impl Float for bf16 {
    const SIGNIFICAND_BITS: u32 = bf16::MANTISSA_DIGITS;
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(x: f32) -> bf16 {
        bf16::from_f32(x)
    }
    fn from_exact_f64(x: f64) -> bf16 {
        bf16::from_f64(x)
    }
}

/// `x` rounded to `bits` significant bits (to nearest, ties to even), as an `f64` that holds it exactly (at
/// most 24 significant bits, at most 2^64 in magnitude).
fn round_to_bits(x: i64, bits: u32) -> f64 {
    let magnitude = x.unsigned_abs();
    let width = u64::BITS - magnitude.leading_zeros();
    let rounded = if width <= bits {
        u128::from(magnitude)
    } else {
        let shift = width - bits;
        let (kept, dropped) = (magnitude >> shift, magnitude & ((1 << shift) - 1));
        let half = 1u64 << (shift - 1);
        let up = dropped > half || (dropped == half && kept & 1 == 1);
        u128::from(kept + u64::from(up)) << shift
    };
    let value = rounded as f64; // at most `bits + 1` significant bits: exact
    if x < 0 {
        -value
    } else {
        value
    }
}

/// `x` converted to `i64` by [`ref_graph::Op::Cast`]'s rule: truncated toward zero, saturating at the `i64`
/// range, NaN to 0 (Rust's `as` does exactly this).
pub fn float_to_i64<T: Float>(x: T) -> i64 {
    x.to_f32() as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn i64_rounds_to_nearest_once_ties_to_even() {
        // 2^30 + 2^22 + 1 is just above the halfway point between two bf16 neighbours (ulp 2^23 there):
        // rounding through f32 first gives the tie 2^30 + 2^22, which then rounds to even (down).
        let x = (1i64 << 30) + (1 << 22) + 1;
        assert_eq!(bf16::from_i64(x).to_f32(), ((1i64 << 30) + (1 << 23)) as f32);
        assert_eq!(bf16::from_f32(x as f32).to_f32(), (1i64 << 30) as f32, "the double rounding avoided");
        // Exact ties go to the even neighbour: 2^30 + 2^22 -> 2^30, 2^30 + 3 * 2^22 -> 2^30 + 2^24.
        assert_eq!(bf16::from_i64((1 << 30) + (1 << 22)).to_f32(), (1i64 << 30) as f32);
        assert_eq!(bf16::from_i64((1 << 30) + 3 * (1 << 22)).to_f32(), ((1i64 << 30) + (1 << 24)) as f32);
        assert_eq!(f16::from_i64(-2049).to_f32(), -2048.0);
        assert_eq!(f16::from_i64(2051).to_f32(), 2052.0);
        assert_eq!(f16::from_i64(65519).to_f32(), 65504.0);
        assert_eq!(f16::from_i64(65520).to_f32(), f32::INFINITY);
        assert_eq!(f32::from_i64(i64::MIN), -(2f32.powi(63)));
        assert_eq!(f32::from_i64(i64::MAX), 2f32.powi(63));
        assert_eq!(f32::from_i64(16_777_217), 16_777_216.0);
        assert_eq!(f32::from_i64(0), 0.0);
    }

    #[test]
    fn floats_truncate_toward_zero_and_saturate_to_i64() {
        assert_eq!(float_to_i64(2.9f32), 2);
        assert_eq!(float_to_i64(-2.9f32), -2);
        assert_eq!(float_to_i64(f16::from_f32(-0.5)), 0);
        assert_eq!(float_to_i64(f32::NAN), 0);
        assert_eq!(float_to_i64(f32::INFINITY), i64::MAX);
        assert_eq!(float_to_i64(bf16::NEG_INFINITY), i64::MIN);
        assert_eq!(float_to_i64(1e30f32), i64::MAX);
    }

    #[test]
    fn halves_round_at_store() {
        // 1 + 2^-11 is halfway between f16's 1 and 1 + 2^-10: ties to even gives 1.
        assert_eq!(f16::from_f32(1.0 + 2f32.powi(-11)).to_f32(), 1.0);
        assert_eq!(f16::from_f32(1.0 + 3.0 * 2f32.powi(-11)).to_f32(), 1.0 + 2.0 * 2f32.powi(-10));
        // bf16 keeps 8 bits: 1 + 2^-8 is a tie (to 1), 1 + 2^-8 + 2^-10 rounds up to 1 + 2^-7.
        assert_eq!(bf16::from_f32(1.0 + 2f32.powi(-8)).to_f32(), 1.0);
        assert_eq!(bf16::from_f32(1.0 + 2f32.powi(-8) + 2f32.powi(-10)).to_f32(), 1.0 + 2f32.powi(-7));
    }
}
