//! The acceptance checks of the example, comparing a delegate's `f32` results with the [`Oracle`].
//!
//! [`Verifier`] is fed what a run produced (caches before the first call, every step's logits and caches, the
//! A/B scenario) and keeps one [`Report`]; `cargo xtask demo` prints it and ends with `kv-decode: PASS`
//! only when [`Report::passed`].

use std::fmt;

use crate::{Config, Oracle, OracleError};

/// Largest absolute difference from the oracle that counts as a match for an `f32` executor.
pub const TOLERANCE: f64 = 1e-4;
/// A suggested largest absolute difference from the oracle for an `f16` executor (f16 caches, activations
/// and logits), on logits and caches alike. `f16` keeps 11 significant bits (relative rounding 4.9e-4). A
/// simulated executor that rounds every op's output to f16 and accumulates in f32
/// (`cargo run --release -p kv-example --example f16_error -- a|b|c STEPS`) lands within 2.7e-3 (a, 16
/// positions), 4.4e-3 (b, 28 positions) and 6.7e-3 (c, 20 positions) of the oracle; 5e-2 leaves room for
/// other summation orders and longer runs without hiding a wrong row or a missed update (those are off by
/// order 1). A caller tightens or loosens it with [`Verifier::with_tolerance`]; [`Verifier::new`] uses it
/// for `f16` configs. Compare an f16 executor's values widened to `f32`.
pub const F16_TOLERANCE: f64 = 5e-2;

/// The default tolerance for a config's float type: [`TOLERANCE`] for `f32`, [`F16_TOLERANCE`] for `f16`.
pub fn tolerance_for(dtype: ref_graph::ElemType) -> f64 {
    if dtype == ref_graph::ElemType::F16 {
        F16_TOLERANCE
    } else {
        TOLERANCE
    }
}
/// Smallest max difference between upstream's scenarios A and B that counts as "the cache matters".
pub const AB_MIN_DIFF: f64 = 1e-3;

/// How an `f32` result compares with the oracle's `f64`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Comparison {
    /// Largest absolute difference over finite pairs.
    pub max_abs_error: f64,
    /// Values of `actual` that are NaN or infinite.
    pub non_finite: usize,
    /// `Some((actual, expected))` lengths when they differ.
    pub len_mismatch: Option<(usize, usize)>,
}

impl Comparison {
    /// Whether every value is finite, the lengths agree, and the error is at most `tolerance`.
    pub fn within(&self, tolerance: f64) -> bool {
        self.non_finite == 0 && self.len_mismatch.is_none() && self.max_abs_error <= tolerance
    }

    /// The worse of two comparisons (for a running maximum).
    pub fn max(self, other: Comparison) -> Comparison {
        Comparison {
            max_abs_error: self.max_abs_error.max(other.max_abs_error),
            non_finite: self.non_finite + other.non_finite,
            len_mismatch: self.len_mismatch.or(other.len_mismatch),
        }
    }
}

/// Compares `actual` with `expected` element by element.
pub fn compare(actual: &[f32], expected: &[f64]) -> Comparison {
    let non_finite = actual.iter().filter(|x| !x.is_finite()).count();
    let max_abs_error = actual
        .iter()
        .zip(expected)
        .filter(|(a, _)| a.is_finite())
        .map(|(&a, &e)| (f64::from(a) - e).abs())
        .fold(0.0, f64::max);
    let len_mismatch = (actual.len() != expected.len()).then_some((actual.len(), expected.len()));
    Comparison { max_abs_error, non_finite, len_mismatch }
}

/// The largest absolute difference of two `f32` results, or `None` when either has a non-finite value (a NaN
/// would compare as "no difference" and pass upstream's A/B check vacuously).
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> Option<f64> {
    if a.len() != b.len() || a.iter().chain(b).any(|x| !x.is_finite()) {
        return None;
    }
    Some(a.iter().zip(b).map(|(&x, &y)| (f64::from(x) - f64::from(y)).abs()).fold(0.0, f64::max))
}

/// The greedy token rule, [`ref_graph::argmax`] (first of equals, NaN never wins): re-exported so the example's
/// checks and its users pick tokens as every delegate and host does.
pub use ref_graph::argmax;

/// One named check and its outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// Short name, e.g. `"matches-oracle"`.
    pub name: String,
    /// Whether it holds.
    pub passed: bool,
    /// Measured figures, for a person.
    pub detail: String,
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] {}: {}", if self.passed { "ok" } else { "FAIL" }, self.name, self.detail)
    }
}

/// Every check of a run.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Report {
    /// The checks, in the order they were made.
    pub checks: Vec<Check>,
}

impl Report {
    /// Adds a check.
    pub fn push(&mut self, name: impl Into<String>, passed: bool, detail: impl Into<String>) {
        self.checks.push(Check { name: name.into(), passed, detail: detail.into() });
    }

    /// Whether there is at least one check and all hold.
    pub fn passed(&self) -> bool {
        !self.checks.is_empty() && self.checks.iter().all(|c| c.passed)
    }

    /// The failed checks.
    pub fn failures(&self) -> impl Iterator<Item = &Check> + '_ {
        self.checks.iter().filter(|c| !c.passed)
    }
}

impl fmt::Display for Report {
    /// One line per check, then `kv-decode: PASS` or `kv-decode: FAIL`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for check in &self.checks {
            writeln!(f, "{check}")?;
        }
        write!(f, "kv-decode: {}", if self.passed() { "PASS" } else { "FAIL" })
    }
}

/// Follows a run step by step against an [`Oracle`] and collects the [`Report`].
///
/// Caches are given per layer as `(k, v)` in the oracle's layout `[heads, max_len, head_dim]`.
#[derive(Debug)]
pub struct Verifier {
    cfg: Config,
    oracle: Oracle,
    report: Report,
    logits: Comparison,
    caches: Comparison,
    steps: usize,
    worst_step: Option<String>,
    tolerance: f64,
}

impl Verifier {
    /// A verifier for `cfg`'s model with its generated weights, with [`tolerance_for`] `cfg.dtype`.
    pub fn new(cfg: &Config) -> Verifier {
        Verifier {
            cfg: cfg.clone(),
            oracle: Oracle::new(cfg),
            report: Report::default(),
            logits: Comparison::default(),
            caches: Comparison::default(),
            steps: 0,
            worst_step: None,
            tolerance: tolerance_for(cfg.dtype),
        }
    }

    /// The same verifier with another tolerance for `matches-oracle` (largest absolute difference of logits
    /// and caches from the oracle).
    pub fn with_tolerance(mut self, tolerance: f64) -> Verifier {
        self.tolerance = tolerance;
        self
    }

    /// The tolerance `matches-oracle` uses.
    pub fn tolerance(&self) -> f64 {
        self.tolerance
    }

    /// Records check `caches-zeroed`: every cache is all zeros before the first call (ExecuTorch drops a
    /// mutated buffer's initial value, so the runtime must zero them).
    pub fn caches_zeroed(&mut self, caches: &[(&[f32], &[f32])]) {
        let nonzero =
            caches.iter().flat_map(|(k, v)| k.iter().chain(v.iter())).filter(|&&x| x != 0.0).count();
        let total: usize = caches.iter().map(|(k, v)| k.len() + v.len()).sum();
        self.report.push(
            "caches-zeroed",
            nonzero == 0 && caches.len() == self.cfg.layers,
            format!("{} caches, {total} values, {nonzero} non-zero", 2 * caches.len()),
        );
    }

    fn record(&mut self, what: String, logits: &[f32], expected: &[f64], caches: &[(&[f32], &[f32])]) {
        let step_logits = compare(logits, expected);
        let mut step_caches = Comparison::default();
        for layer in 0..self.cfg.layers {
            let (ek, ev) = self.oracle.cache(layer);
            let (k, v) = caches.get(layer).copied().unwrap_or((&[], &[]));
            step_caches = step_caches.max(compare(k, ek)).max(compare(v, ev));
        }
        if caches.len() != self.cfg.layers {
            step_caches.len_mismatch = Some((caches.len(), self.cfg.layers));
        }
        let worst = step_logits.max_abs_error.max(step_caches.max_abs_error);
        if worst >= self.logits.max_abs_error.max(self.caches.max_abs_error) {
            self.worst_step = Some(what);
        }
        self.logits = self.logits.max(step_logits);
        self.caches = self.caches.max(step_caches);
        self.steps += 1;
    }

    /// Checks prefill's logits (`[prompt_len, vocab]` flattened) and caches against the oracle's prefill.
    pub fn prefill(
        &mut self,
        tokens: &[i64],
        logits: &[f32],
        caches: &[(&[f32], &[f32])],
    ) -> Result<(), OracleError> {
        let expected: Vec<f64> = self.oracle.prefill(tokens)?.concat();
        self.record(format!("prefill of {} tokens", tokens.len()), logits, &expected, caches);
        Ok(())
    }

    /// Checks one decode step's logits (`[1, vocab]`) and caches against the oracle's step.
    pub fn decode(
        &mut self,
        token: i64,
        position: usize,
        logits: &[f32],
        caches: &[(&[f32], &[f32])],
    ) -> Result<(), OracleError> {
        let expected = self.oracle.decode(token, position)?;
        self.record(format!("decode of token {token} at position {position}"), logits, &expected, caches);
        Ok(())
    }

    /// Records check `ab-differs`, upstream's own acceptance check: `a` is decode at position 1 on a zeroed
    /// cache, `b` decode at 0 then 1 on one cache; they must differ by more than [`AB_MIN_DIFF`], with no
    /// non-finite value (which would make the difference vacuous).
    pub fn ab(&mut self, a: &[f32], b: &[f32]) {
        let (passed, detail) = match max_abs_diff(a, b) {
            Some(diff) => {
                (diff > AB_MIN_DIFF, format!("max|A - B| = {diff:.3e} (must exceed {AB_MIN_DIFF:.0e})"))
            }
            None => (false, "A or B has a non-finite value or they differ in length".to_owned()),
        };
        self.report.push("ab-differs", passed, detail);
    }

    /// Adds a check the caller measured itself (e.g. `zero-copy-bytes`, `copy-back-identical`).
    pub fn push(&mut self, name: impl Into<String>, passed: bool, detail: impl Into<String>) {
        self.report.push(name, passed, detail);
    }

    /// The oracle, e.g. to look at its caches.
    pub fn oracle(&self) -> &Oracle {
        &self.oracle
    }

    /// Adds checks `no-nan` and `matches-oracle` over every recorded step and returns the report.
    pub fn finish(mut self) -> Report {
        let non_finite = self.logits.non_finite + self.caches.non_finite;
        self.report.push(
            "no-nan",
            non_finite == 0,
            format!("{non_finite} non-finite values in logits and caches"),
        );
        let tolerance = self.tolerance;
        let passed = self.steps > 0 && self.logits.within(tolerance) && self.caches.within(tolerance);
        let mut detail = format!(
            "{} steps; max |logits - oracle| = {:.3e}, max |caches - oracle| = {:.3e} (tolerance {tolerance:.0e})",
            self.steps, self.logits.max_abs_error, self.caches.max_abs_error
        );
        if let Some(step) = &self.worst_step {
            detail.push_str(&format!("; worst at {step}"));
        }
        if let Some((a, e)) = self.logits.len_mismatch.or(self.caches.len_mismatch) {
            detail.push_str(&format!("; length mismatch {a} vs {e}"));
        }
        self.report.push("matches-oracle", passed, detail);
        self.report
    }
}
