//! Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011), as Random123 and
//! cuRAND define it: a 128-bit counter and a 64-bit key, ten rounds, the key bumped by the Weyl constants
//! between rounds.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let product = u64::from(a) * u64::from(b);
    ((product >> 32) as u32, product as u32)
}

fn round(c: [u32; 4], k: [u32; 2]) -> [u32; 4] {
    let (hi0, lo0) = mulhilo(M0, c[0]);
    let (hi1, lo1) = mulhilo(M1, c[2]);
    [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0]
}

/// Philox4x32-10 of `counter` under `key`: four independent uniformly distributed 32-bit words.
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for i in 0..10 {
        if i > 0 {
            k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        }
        c = round(c, k);
    }
    c
}

/// The uniform draw of step `step` under `seed`, in `[0, 1)`: the first word of Philox4x32-10 with counter
/// `(step low 32 bits, step high 32 bits, 0, 0)` and key `(seed low 32 bits, seed high 32 bits)`, its top 24
/// bits times 2^-24 (exact in f32).
pub fn uniform(seed: u64, step: u64) -> f32 {
    let word = philox4x32_10([step as u32, (step >> 32) as u32, 0, 0], [seed as u32, (seed >> 32) as u32])[0];
    (word >> 8) as f32 * (1.0 / 16_777_216.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random123's known-answer vectors (kat_vectors, philox4x32 with 10 rounds).
    #[test]
    fn philox_matches_random123s_known_answers() {
        assert_eq!(philox4x32_10([0; 4], [0; 2]), [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]);
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32_10([0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344], [0xa409_3822, 0x299f_31d0]),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn a_uniform_is_a_pure_function_of_seed_and_step_in_the_unit_interval() {
        assert_eq!(uniform(7, 3), uniform(7, 3));
        assert_ne!(uniform(7, 3), uniform(8, 3));
        assert_ne!(uniform(7, 3), uniform(7, 4));
        let expected = (0x6627_e8d5u32 >> 8) as f32 / 16_777_216.0;
        assert_eq!(uniform(0, 0), expected);
        assert!((0..10_000).map(|i| uniform(1, i)).all(|u| (0.0..1.0).contains(&u)));
    }
}
