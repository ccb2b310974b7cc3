//! The contract's exponential: `e^x` for the softmax's `x = l_i - l_0 <= 0`, spelled as a fixed sequence of
//! IEEE-754 single-precision operations (Cephes' `expf`: a Cody-Waite reduction by `ln 2` and a degree-5
//! polynomial, every product-and-sum a fused multiply-add), so that a GPU kernel doing the same operations in
//! the same order (`rintf`, `__fmaf_rn`, `__fmul_rn`, `__fadd_rn`, no contraction) gets the same bits as
//! this function, whatever the host's or the device's own `exp` would round to. Within 2 ulp of `e^x`.

// The constants by their bits, as the GPU kernel spells them (`__int_as_float`): the same values whatever
// parses decimal literals.
/// `log2(e)`, rounded to f32 (1.442695).
const LOG2_E: f32 = f32::from_bits(0x3fb8_aa3b);
/// `ln 2` in two parts (Cody-Waite): the high part (0.693359375) has few bits, so `n * LN2_HI` is exact for
/// `|n| <= 127`; the low part is -2.1219444e-4.
const LN2_HI: f32 = f32::from_bits(0x3f31_8000);
const LN2_LO: f32 = f32::from_bits(0xb95e_8083);
/// Cephes' minimax coefficients of `(e^r - 1 - r) / r^2` on `[-ln2/2, ln2/2]`, highest degree first
/// (1.9875691e-4, 1.3981999e-3, 8.333452e-3, 4.1665796e-2, 1.6666666e-1, 0.5).
const POLY: [f32; 6] = [
    f32::from_bits(0x3950_6967),
    f32::from_bits(0x3ab7_43ce),
    f32::from_bits(0x3c08_8908),
    f32::from_bits(0x3d2a_a9c1),
    f32::from_bits(0x3e2a_aaaa),
    f32::from_bits(0x3f00_0000),
];
/// Below this the contract's exponential is 0 (`e^-87` is 1.6e-38, near the smallest normal f32).
pub const EXP_FLOOR: f32 = -87.0;

/// `e^x` as the contract computes it, for `x <= 0` (the softmax's arguments; a positive `x` up to 88 is
/// computed the same way): 0 below [`EXP_FLOOR`] (and for NaN, which the contract never passes); otherwise
/// `n = rint(x * log2 e)`, `r = fma(-n, ln2_lo, fma(-n, ln2_hi, x))`, the polynomial `P` by Horner's rule in
/// fused multiply-adds, `y = fma(P, r * r, r) + 1`, and `y * 2^n` (2^n built from its exponent bits).
pub fn exp(x: f32) -> f32 {
    if x.is_nan() || x < EXP_FLOOR {
        return 0.0;
    }
    let n = (x * LOG2_E).round_ties_even();
    let r = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    let p = POLY[1..].iter().fold(POLY[0], |p, &c| p.mul_add(r, c));
    let y = p.mul_add(r * r, r) + 1.0;
    // -126 <= n <= 127 for EXP_FLOOR <= x <= 88: a normal power of two.
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Units in the last place between `a` and `b` (both finite, same sign).
    fn ulps(a: f32, b: f32) -> u32 {
        a.to_bits().abs_diff(b.to_bits())
    }

    #[test]
    fn the_contracts_exp_is_within_two_ulp_of_e_to_the_x_and_exact_at_zero() {
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-0.0), 1.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-87.5), 0.0);
        assert_eq!(exp(f32::NAN), 0.0);
        let mut worst = 0;
        for i in 0..=870_000 {
            let x = -(i as f32) * 1e-4;
            let exact = (f64::from(x)).exp() as f32;
            worst = worst.max(ulps(exp(x), exact));
        }
        assert!(worst <= 2, "{worst} ulp");
    }

    #[test]
    fn the_contracts_exp_does_not_increase_along_a_sorted_row() {
        // The softmax of a sorted row is non-increasing wherever this holds (min-p filters anyway).
        let mut previous = exp(0.0);
        for i in 1..=200_000 {
            let value = exp(-(i as f32) * 4e-4);
            assert!(value <= previous, "at {}", -(i as f32) * 4e-4);
            previous = value;
        }
    }
}
