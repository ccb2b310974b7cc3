//! The sampling contract: draws follow softmax, the cuts cut what they must, greedy is the argmax, a seed
//! reproduces.

use sampling::{Params, Sampler};

fn sampler(params: Params) -> Sampler {
    Sampler::new(params).expect("valid parameters")
}

fn softmax(logits: &[f32], temperature: f32) -> Vec<f64> {
    let scaled: Vec<f64> = logits.iter().map(|&l| f64::from(l) / f64::from(temperature)).collect();
    let top = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = scaled.iter().map(|l| (l - top).exp()).collect();
    let total: f64 = weights.iter().sum();
    weights.iter().map(|w| w / total).collect()
}

fn counts(sampler: &Sampler, logits: &[f32], draws: u64) -> Vec<u64> {
    let mut counts = vec![0u64; logits.len()];
    for step in 0..draws {
        counts[sampler.pick(logits, &[], step)] += 1;
    }
    counts
}

/// Pearson's chi-square of `counts` against `expected` probabilities.
fn chi_square(counts: &[u64], expected: &[f64]) -> f64 {
    let n = counts.iter().sum::<u64>() as f64;
    counts.iter().zip(expected).map(|(&c, &p)| (c as f64 - n * p).powi(2) / (n * p)).sum()
}

/// Draws with a fixed seed follow the tempered softmax: chi-square below the 0.1% critical value for 5
/// degrees of freedom (20.52). The seed is fixed, so the statistic is the same on every run: it cannot flake.
#[test]
fn draws_follow_the_tempered_softmax() {
    let logits = [1.0f32, 0.5, 0.0, -0.5, -1.0, 2.0];
    for (seed, temperature) in [(42u64, 0.7f32), (7, 1.0), (1234, 1.5)] {
        let s = sampler(Params { temperature, seed, ..Params::default() });
        let observed = counts(&s, &logits, 20_000);
        let chi2 = chi_square(&observed, &softmax(&logits, temperature));
        assert!(chi2 < 20.52, "seed {seed}, T {temperature}: chi-square {chi2} for {observed:?}");
    }
}

/// The same test with a cut: the draws follow the softmax renormalised over the ids that stay.
#[test]
fn draws_after_top_k_follow_the_renormalised_softmax() {
    let logits = [1.0f32, 0.5, 0.0, -0.5, -1.0, 2.0];
    let s = sampler(Params { temperature: 1.0, top_k: 3, seed: 9, ..Params::default() });
    let observed = counts(&s, &logits, 20_000);
    assert_eq!((observed[2], observed[3], observed[4]), (0, 0, 0), "{observed:?}");
    let kept = softmax(&[logits[5], logits[0], logits[1]], 1.0);
    let chi2 = chi_square(&[observed[5], observed[0], observed[1]], &kept);
    // 0.1% critical value for 2 degrees of freedom.
    assert!(chi2 < 13.82, "chi-square {chi2} for {observed:?}");
}

#[test]
fn top_k_top_p_and_min_p_cut_what_they_must() {
    // Probabilities 0.5, 0.3, 0.2 (ids 2, 0, 1).
    let logits = [0.3f32.ln(), 0.2f32.ln(), 0.5f32.ln()];
    let ids = |params: Params| -> Vec<usize> {
        sampler(Params { temperature: 1.0, ..params }).candidates(&logits).iter().map(|c| c.0).collect()
    };
    assert_eq!(ids(Params::default()), [2, 0, 1], "sorted, nothing cut");
    assert_eq!(ids(Params { top_k: 1, ..Params::default() }), [2]);
    assert_eq!(ids(Params { top_k: 2, ..Params::default() }), [2, 0]);
    assert_eq!(ids(Params { top_p: 0.4, ..Params::default() }), [2], "0.5 reaches 0.4");
    assert_eq!(ids(Params { top_p: 0.75, ..Params::default() }), [2, 0]);
    assert_eq!(ids(Params { top_p: 0.9, ..Params::default() }), [2, 0, 1]);
    assert_eq!(ids(Params { min_p: 0.5, ..Params::default() }), [2, 0], "0.2 < 0.5 * 0.5");
    assert_eq!(ids(Params { min_p: 0.7, ..Params::default() }), [2], "0.3 < 0.7 * 0.5");
    // Every draw stays inside the cut.
    let s = sampler(Params { temperature: 1.0, top_p: 0.75, seed: 3, ..Params::default() });
    assert_eq!(counts(&s, &logits, 5_000)[1], 0);
}

#[test]
fn ties_sort_by_the_smaller_id_and_nan_never_stays_first() {
    let s = sampler(Params { temperature: 1.0, ..Params::default() });
    let ids: Vec<usize> = s.candidates(&[1.0, f32::NAN, 1.0, 0.0]).iter().map(|c| c.0).collect();
    assert_eq!(ids, [0, 2, 3, 1]);
}

#[test]
fn greedy_is_the_reference_argmax_exactly() {
    let rows: [&[f32]; 6] = [
        &[0.1, 2.0, -1.0, 1.5],
        &[1.0, 1.0, 1.0],
        &[f32::NAN, 0.5, 0.5],
        &[f32::NAN, f32::NAN],
        &[f32::NEG_INFINITY, -3.0],
        &[-0.0, 0.0],
    ];
    let greedy = sampler(Params::default());
    for row in rows {
        for step in 0..4 {
            assert_eq!(greedy.pick(row, &[0, 1], step), ref_graph::argmax(row), "{row:?}");
        }
    }
}

#[test]
fn the_same_seed_gives_the_same_tokens_and_another_seed_others() {
    let flat = vec![0.0f32; 100];
    let draws = |seed| {
        let s = sampler(Params { temperature: 1.0, seed, ..Params::default() });
        (0..32).map(|step| s.pick(&flat, &[], step)).collect::<Vec<_>>()
    };
    assert_eq!(draws(5), draws(5));
    assert_ne!(draws(5), draws(6));
    // A flat distribution: the draws are not one id.
    assert!(draws(5).iter().any(|&t| t != draws(5)[0]));
}

#[test]
fn the_repetition_penalty_divides_positive_and_multiplies_negative_logits() {
    let s = sampler(Params { repetition_penalty: 2.0, ..Params::default() });
    assert_eq!(s.pick(&[2.0, 1.9], &[], 0), 0);
    assert_eq!(s.pick(&[2.0, 1.9], &[0, 0], 0), 1, "2.0 / 2 < 1.9, once however often id 0 occurs");
    assert_eq!(s.pick(&[-1.0, -1.5], &[0], 0), 1, "-1.0 * 2 < -1.5");
    assert_eq!(s.pick(&[2.0, 1.9], &[-1, 99], 0), 0, "ids outside the row are ignored");
}

#[test]
fn parameters_out_of_range_are_named() {
    let bad = |params: Params| Sampler::new(params).expect_err("refused").to_string();
    assert_eq!(
        bad(Params { temperature: -1.0, ..Params::default() }),
        "--temperature -1: must be finite and >= 0"
    );
    assert_eq!(bad(Params { top_p: 0.0, ..Params::default() }), "--top-p 0: must be in (0, 1]");
    assert_eq!(bad(Params { min_p: 1.5, ..Params::default() }), "--min-p 1.5: must be in [0, 1]");
    assert!(
        bad(Params { repetition_penalty: 0.0, ..Params::default() }).starts_with("--repetition-penalty 0")
    );
}

/// Step 5: without top-k the candidates are the 1024 most likely, in the contract's order; the rest are
/// never drawn.
#[test]
fn without_top_k_the_candidates_are_the_1024_most_likely() {
    // 3000 ids; id i has logit -(i / 300) rounded down: ties of 300 ids, broken by the smaller id.
    let logits: Vec<f32> = (0..3000).map(|i| -((i / 300) as f32) * 0.01).collect();
    let s = sampler(Params { temperature: 1.0, seed: 11, ..Params::default() });
    assert_eq!(s.candidate_count(logits.len()), sampling::MAX_CANDIDATES);
    let ids: Vec<usize> = s.candidates(&logits).iter().map(|c| c.0).collect();
    assert_eq!(ids, (0..1024).collect::<Vec<_>>());
    assert!((0..2000).all(|step| s.pick(&logits, &[], step) < 1024));
    // top-k narrower than the bound, and a vocabulary smaller than it.
    let s = sampler(Params { temperature: 1.0, top_k: 5, ..Params::default() });
    assert_eq!(s.candidate_count(3000), 5);
    assert_eq!(s.candidate_count(3), 3);
}

#[test]
fn top_k_above_the_candidate_bound_is_refused() {
    let err = Sampler::new(Params { top_k: 1025, ..Params::default() }).expect_err("refused");
    assert_eq!(err.to_string(), "--top-k 1025: must be at most 1024 (0: the 1024 most likely)");
    assert!(Sampler::new(Params { top_k: 1024, ..Params::default() }).is_ok());
}

/// Step 6: the weights are the contract's exponential (fixed operations a GPU repeats), not the platform's
/// `exp`, which may round differently: checked where the two differ.
#[test]
fn the_softmax_uses_the_contracts_exponential() {
    let x = (1..100_000)
        .map(|i| -(i as f32) * 1e-4)
        .find(|&x| sampling::exp(x) != x.exp())
        .expect("the platform's exp and the contract's differ somewhere");
    let s = sampler(Params { temperature: 1.0, ..Params::default() });
    let candidates = s.candidates(&[0.0, x]);
    let w = sampling::exp(x);
    let total = 1.0 + w;
    assert_eq!(candidates, [(0, 1.0 / total), (1, w / total)], "x = {x}");
}
