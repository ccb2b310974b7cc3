//! The oracle on its own: causal, sensitive to the cache, deterministic.

use kv_example::check::{compare, max_abs_diff, TOLERANCE};
use kv_example::{Config, Oracle, OracleError, Weights};

#[test]
fn weights_are_deterministic_and_seeded() {
    let cfg = Config::tiny();
    assert_eq!(Weights::generate(&cfg), Weights::generate(&cfg));
    let other = Config { seed: cfg.seed + 1, ..cfg.clone() };
    assert_ne!(Weights::generate(&cfg).tok_emb, Weights::generate(&other).tok_emb);
    let w = Weights::generate(&cfg);
    assert_eq!(w.tok_emb.len(), 64 * 32);
    assert_eq!(w.layers.len(), 1);
    assert!(w.tok_emb.iter().all(|x| x.abs() <= 0.5));
}

#[test]
fn a_later_token_never_changes_earlier_logits() {
    let cfg = Config::tiny();
    let a = Oracle::new(&cfg).prefill(&[1, 7, 3, 12]).expect("in range");
    let b = Oracle::new(&cfg).prefill(&[1, 7, 3, 40]).expect("in range");
    assert_eq!(a[..3], b[..3], "positions 0..3 cannot see position 3");
    let diff = a[3].iter().zip(&b[3]).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
    assert!(diff > 1e-3, "position 3 sees its own token (diff {diff})");
}

#[test]
fn upstreams_ab_scenarios_differ() {
    let cfg = Config::tiny();
    let mut a = Oracle::new(&cfg);
    let logits_a = a.decode(5, 1).expect("in range");
    let mut b = Oracle::new(&cfg);
    b.decode(9, 0).expect("in range");
    let logits_b = b.decode(5, 1).expect("in range");
    let a32: Vec<f32> = logits_a.iter().map(|&x| x as f32).collect();
    let b32: Vec<f32> = logits_b.iter().map(|&x| x as f32).collect();
    let diff = max_abs_diff(&a32, &b32).expect("finite");
    assert!(diff > 1e-3, "the cache row written at position 0 must matter (diff {diff})");
}

#[test]
fn decode_writes_its_row_only_and_reset_zeroes() {
    let cfg = Config::tiny();
    let mut o = Oracle::new(&cfg);
    o.decode(3, 2).expect("in range");
    let (k, v) = o.cache(0);
    let (hd, len) = (cfg.head_dim, cfg.max_len);
    for head in 0..cfg.heads {
        for r in 0..len {
            let row = &k[(head * len + r) * hd..(head * len + r + 1) * hd];
            assert_eq!(row.iter().any(|&x| x != 0.0), r == 2, "head {head} row {r}");
        }
    }
    assert!(v.iter().any(|&x| x != 0.0));
    o.reset();
    assert!(o.cache(0).0.iter().chain(o.cache(0).1).all(|&x| x == 0.0));
    assert_eq!(o.cache(7), (&[][..], &[][..]));
}

#[test]
fn out_of_range_steps_are_errors() {
    let cfg = Config::tiny();
    let mut o = Oracle::new(&cfg);
    assert_eq!(o.decode(64, 0), Err(OracleError::Token { token: 64, vocab: 64 }));
    assert_eq!(o.decode(-1, 0), Err(OracleError::Token { token: -1, vocab: 64 }));
    assert_eq!(o.decode(0, 16), Err(OracleError::Position { position: 16, max_len: 16 }));
}

#[test]
fn logits_are_well_conditioned() {
    let cfg = Config::tiny();
    let logits = Oracle::new(&cfg).prefill(&cfg.prompt).expect("in range");
    for row in &logits {
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let min = row.iter().cloned().fold(f64::INFINITY, f64::min);
        assert!(max.is_finite() && max < 10.0 && max - min > 0.1, "range {min}..{max}");
    }
    // The comparison helper flags NaN and length mismatches.
    let c = compare(&[f32::NAN, 1.0], &[0.0, 1.0]);
    assert!(!c.within(TOLERANCE) && c.non_finite == 1);
    assert!(compare(&[1.0], &[1.0, 2.0]).len_mismatch.is_some());
    assert!(compare(&[1.00001], &[1.0]).within(TOLERANCE));
}

#[test]
fn an_f16_oracle_uses_the_rounded_weights() {
    use kv_example::check::{tolerance_for, F16_TOLERANCE};
    use ref_graph::ElemType;

    let cfg = Config::tiny();
    let f16 = Config { dtype: ElemType::F16, ..cfg.clone() };
    let w = Weights::generate(&f16);
    assert_eq!(w, Weights::generate(&cfg), "generation does not depend on the dtype");
    let rounded = w.stored_as(ElemType::F16);
    assert_eq!(w.stored_as(ElemType::F32), w);
    assert!(rounded.w_out.iter().all(|&x| ref_graph::half::f16::from_f32(x).to_f32() == x));
    assert_ne!(rounded.w_out, w.w_out);
    // The f16 oracle is the f64 model of the rounded weights: equal to an f32 oracle given them.
    let a = Oracle::new(&f16).prefill(&cfg.prompt).expect("in range");
    let b = Oracle::with_weights(&cfg, &rounded).prefill(&cfg.prompt).expect("in range");
    assert_eq!(a, b);
    let exact = Oracle::new(&cfg).prefill(&cfg.prompt).expect("in range");
    let diff = a.concat().iter().zip(exact.concat()).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
    assert!(diff > 0.0 && diff < F16_TOLERANCE, "rounding the weights moves the logits by {diff}");
    assert_eq!((tolerance_for(ElemType::F32), tolerance_for(ElemType::F16)), (TOLERANCE, F16_TOLERANCE));
}
