//! The example decoder (`kv-example`) run by this delegate: the acceptance check in-process. Prefill and
//! decode as separate reference-delegate instances sharing caller-owned caches, driven through the `Delegate`
//! trait (and, in `drive`, through the plugin ABI) with argmax feedback, matched against the f64 oracle at
//! every step (logits and full caches), in both output-slot layouts. These tests live here, not in
//! `kv-example`, so that the example depends on the graph format alone.

mod drive;

use delegate_abi::host::{ArgList, Plugin};
use delegate_abi::{DTypeCode, Delegate, ExecStats, ExecuteArgs, InitContext, MemoryKind};
use kv_example::check::{max_abs_diff, F16_TOLERANCE, TOLERANCE};
use kv_example::{argmax, export, Config, Report, Verifier, Weights};
use ref_graph::half::f16;
use reference_delegate::{ReferenceDelegate, ReferenceHandle, BACKEND_ID};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// Each aliased output slot is the cache's own storage: nothing is copied.
    ZeroCopy,
    /// Separate output slots (upstream's layout): the delegate reflects, the host writes back.
    CopyBack,
}

/// What the host owns: per layer a k and a v cache (`caches[2 l]`, `caches[2 l + 1]`), separate output slots
/// for copy-back mode, and bytes copied so far.
struct Host {
    cfg: Config,
    caches: Vec<Vec<f32>>,
    slots: Vec<Vec<f32>>,
    reflect_bytes: u64,
    write_back_bytes: u64,
    /// Every call's `next_token` output.
    next_tokens: Vec<i64>,
}

impl Host {
    fn new(cfg: &Config) -> Host {
        Host {
            cfg: cfg.clone(),
            caches: vec![vec![0.0; cfg.cache_len()]; 2 * cfg.layers],
            slots: vec![vec![0.0; cfg.cache_len()]; 2 * cfg.layers],
            reflect_bytes: 0,
            write_back_bytes: 0,
            next_tokens: Vec::new(),
        }
    }

    fn layer_caches(&self) -> Vec<(&[f32], &[f32])> {
        self.caches.chunks_exact(2).map(|kv| (kv[0].as_slice(), kv[1].as_slice())).collect()
    }

    /// One delegate call with the argument order of the exported manifest; checks that the call's
    /// `next_token` output is the argmax of its last logits row and records it.
    fn call(
        &mut self,
        delegate: &ReferenceDelegate,
        handle: &mut ReferenceHandle,
        tokens: &[i64],
        position: i64,
        mode: Mode,
    ) -> Vec<f32> {
        let cfg = self.cfg.clone();
        let rows = tokens.len() as i64;
        let position = [position];
        let mut logits = vec![0.0f32; tokens.len() * cfg.vocab];
        let mut next_token = [-1i64];
        let cache_shape: Vec<i64> = cfg.cache_shape().iter().map(|&d| d as i64).collect();
        let (f32, host) = (DTypeCode::F32, MemoryKind::Host);
        let mut stats = ExecStats::default();
        {
            let mut list = ArgList::new();
            list.push_input(bytemuck::cast_slice(tokens), DTypeCode::I64, &[rows], host).expect("sized");
            list.push_input(bytemuck::cast_slice(&position), DTypeCode::I64, &[1], host).expect("sized");
            let mut inouts = Vec::new();
            for cache in &mut self.caches {
                inouts.push(
                    list.push_inout(bytemuck::cast_slice_mut(cache), f32, &cache_shape, host).expect("sized"),
                );
            }
            match mode {
                Mode::ZeroCopy => {
                    for slot in inouts {
                        list.push_output_in_place(slot, f32, &cache_shape).expect("same storage");
                    }
                }
                Mode::CopyBack => {
                    for slot in &mut self.slots {
                        list.push_output(bytemuck::cast_slice_mut(slot), f32, &cache_shape, host)
                            .expect("sized");
                    }
                }
            }
            let logits_shape = [rows, cfg.vocab as i64];
            list.push_output(bytemuck::cast_slice_mut(&mut logits), f32, &logits_shape, host).expect("sized");
            list.push_output(bytemuck::cast_slice_mut(&mut next_token), DTypeCode::I64, &[1], host)
                .expect("sized");
            // SAFETY: `ArgList` built every argument from live borrows (shared for inputs, exclusive for
            // caches, slots and logits) that outlive this block, and shares storage only between a cache and
            // its in-place output at the same address and size: `ExecuteArgs::new`'s contract.
            let mut args = unsafe { ExecuteArgs::new(list.as_slice(), None, &mut stats) };
            delegate.execute(handle, &mut args).expect("execute");
        }
        self.reflect_bytes += stats.reflect_bytes;
        if mode == Mode::CopyBack {
            // ExecuTorch's buffer-mutation write-back: copy_(buffer, aliased output).
            for (cache, slot) in self.caches.iter_mut().zip(&self.slots) {
                cache.copy_from_slice(slot);
                self.write_back_bytes += 4 * slot.len() as u64;
            }
        }
        let last_row = &logits[(tokens.len() - 1) * cfg.vocab..];
        assert_eq!(next_token[0], argmax(last_row) as i64, "next_token is the argmax of the last logits row");
        self.next_tokens.push(next_token[0]);
        logits
    }
}

fn init(delegate: &ReferenceDelegate, blob: &[u8]) -> ReferenceHandle {
    delegate.init(InitContext { blob, compile_specs: &[], runtime_specs: &[] }).expect("init")
}

struct Run {
    report: Report,
    tokens: Vec<i64>,
    logits: Vec<Vec<f32>>,
    host: Host,
}

/// Prefill once, then `steps` decode steps feeding back the argmax, checking every step.
fn generate(cfg: &Config, steps: usize, mode: Mode) -> Run {
    let weights = Weights::generate(cfg);
    let delegate = ReferenceDelegate::new();
    let mut prefill =
        init(&delegate, &export::reference_blob(cfg, &weights, cfg.prompt_len()).expect("blob"));
    let mut decode = init(&delegate, &export::reference_blob(cfg, &weights, 1).expect("blob"));

    let mut verifier = Verifier::new(cfg);
    let mut host = Host::new(cfg);
    verifier.caches_zeroed(&host.layer_caches());

    let prompt_logits = host.call(&delegate, &mut prefill, &cfg.prompt, 0, mode);
    verifier.prefill(&cfg.prompt, &prompt_logits, &host.layer_caches()).expect("oracle prefill");
    // The delegate's own argmax (checked against the logits' in `call`) is what is fed back.
    let mut token = host.next_tokens[0];
    let mut tokens = Vec::new();
    let mut logits = vec![prompt_logits];
    for step in 0..steps {
        let position = cfg.prompt_len() + step;
        let step_logits = host.call(&delegate, &mut decode, &[token], position as i64, mode);
        verifier.decode(token, position, &step_logits, &host.layer_caches()).expect("oracle decode");
        tokens.push(token);
        token = host.next_tokens[step + 1];
        logits.push(step_logits);
    }

    // Upstream's A/B check, through the decode blob on fresh caches: A decodes at 1 on a zeroed cache, B at
    // 0 then 1.
    let mut ab_handle = init(&delegate, &export::reference_blob(cfg, &weights, 1).expect("blob"));
    let mut a = Host::new(cfg);
    let logits_a = a.call(&delegate, &mut ab_handle, &[5], 1, mode);
    let mut b = Host::new(cfg);
    b.call(&delegate, &mut ab_handle, &[9], 0, mode);
    let logits_b = b.call(&delegate, &mut ab_handle, &[5], 1, mode);
    verifier.ab(&logits_a, &logits_b);

    Run { report: verifier.finish(), tokens, logits, host }
}

/// The tiny model's generated tokens (the decode steps' inputs after the 4-token prompt), as generated
/// before `next_token` existed.
const TINY_TOKENS: [i64; 12] = [52, 19, 9, 6, 53, 30, 29, 53, 26, 44, 20, 63];

/// Greedy decoding by the f64 oracle alone.
fn oracle_tokens(cfg: &Config, steps: usize) -> Vec<i64> {
    let mut oracle = kv_example::Oracle::new(cfg);
    let widen = |row: &[f64]| row.iter().map(|&x| x as f32).collect::<Vec<_>>();
    let prompt = oracle.prefill(&cfg.prompt).expect("in range");
    let mut token = argmax(&widen(prompt.last().expect("a prompt"))) as i64;
    let mut tokens = Vec::new();
    for step in 0..steps {
        tokens.push(token);
        token = argmax(&widen(&oracle.decode(token, cfg.prompt_len() + step).expect("in range"))) as i64;
    }
    tokens
}

#[test]
fn tiny_model_matches_the_oracle_every_step_in_both_modes() {
    let cfg = Config::tiny();
    // Prefill fills positions 0..4; decode fills the rest of the 16-row cache.
    let steps = cfg.max_decode_steps();
    assert_eq!(steps, 12);
    let zero_copy = generate(&cfg, steps, Mode::ZeroCopy);
    println!("{}", zero_copy.report);
    assert!(zero_copy.report.passed(), "{}", zero_copy.report);
    assert_eq!(zero_copy.report.checks.len(), 4, "caches-zeroed, ab-differs, no-nan, matches-oracle");
    assert_eq!(zero_copy.tokens.len(), steps);
    assert_eq!(zero_copy.host.reflect_bytes, 0, "zero-copy copies nothing");
    assert_eq!(zero_copy.host.write_back_bytes, 0);

    // The tokens the tiny model generates are fixed (argmax of the f64 oracle's logits, well separated): the
    // next_token output changed nothing about them.
    assert_eq!(zero_copy.tokens, oracle_tokens(&cfg, steps));
    assert_eq!(zero_copy.tokens, TINY_TOKENS);

    let copy_back = generate(&cfg, steps, Mode::CopyBack);
    assert!(copy_back.report.passed(), "{}", copy_back.report);
    assert_eq!(copy_back.logits, zero_copy.logits, "copy-back gives identical logits");
    assert_eq!(copy_back.tokens, zero_copy.tokens);
    assert_eq!(copy_back.host.caches, zero_copy.host.caches);
    let cache_bytes = 4 * cfg.cache_len() as u64 * 2 * cfg.layers as u64;
    // One prefill plus `steps` decodes (the A/B scenario has hosts of its own), each reflecting every cache.
    assert_eq!(copy_back.host.reflect_bytes, cache_bytes * (1 + steps as u64));
    assert_eq!(copy_back.host.write_back_bytes, cache_bytes * (1 + steps as u64));
}

#[test]
fn a_wrong_cache_row_is_caught_by_the_checks() {
    let cfg = Config::tiny();
    let weights = Weights::generate(&cfg);
    let delegate = ReferenceDelegate::new();
    let mut decode = init(&delegate, &export::reference_blob(&cfg, &weights, 1).expect("blob"));
    let mut verifier = Verifier::new(&cfg);
    let mut host = Host::new(&cfg);
    let logits = host.call(&delegate, &mut decode, &[3], 0, Mode::ZeroCopy);
    // Corrupt one cache value after the step: the cache comparison must notice it.
    host.caches[1][0] += 1e-3;
    verifier.decode(3, 0, &logits, &host.layer_caches()).expect("oracle");
    let report = verifier.finish();
    assert!(!report.passed());
    assert_eq!(report.failures().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["matches-oracle"]);
    assert!(report.to_string().ends_with("kv-decode: FAIL"));
}

#[test]
fn multi_layer_model_matches_the_oracle() {
    // Two layers exercise per-layer cache bindings by name; small sizes keep the test fast.
    let cfg = Config { layers: 2, max_len: 12, ..Config::tiny() };
    let run = generate(&cfg, 8, Mode::ZeroCopy);
    assert!(run.report.passed(), "{}", run.report);
    let diff = max_abs_diff(&run.logits[1], &run.logits[2]).expect("finite");
    assert!(diff > TOLERANCE, "successive steps differ");
}

#[test]
fn big_model_matches_the_oracle_for_prefill_and_two_decode_steps() {
    let cfg = Config::big();
    let run = generate(&cfg, 2, Mode::ZeroCopy);
    assert!(run.report.passed(), "{}", run.report);
    println!("{}", run.report);
}

#[test]
fn acceptance_through_the_plugin_abi_passes_in_both_modes() {
    use drive::{acceptance, SlotMode};
    let cfg = Config::tiny();
    let weights = Weights::generate(&cfg);
    let prefill = export::reference_blob(&cfg, &weights, cfg.prompt_len()).expect("blob");
    let decode = export::reference_blob(&cfg, &weights, 1).expect("blob");
    let plugin = Plugin::embedded(reference_delegate::delegate_root()).expect("plugin");
    let steps = cfg.max_decode_steps();
    let zero = acceptance(&plugin, &cfg, &prefill, &decode, steps, SlotMode::ZeroCopy).expect("run");
    let copy = acceptance(&plugin, &cfg, &prefill, &decode, steps, SlotMode::CopyBack).expect("run");
    assert!(zero.report.passed() && copy.report.passed(), "{}\n{}", zero.report, copy.report);
    assert_eq!(zero.logits, copy.logits);
    assert_eq!(zero.tokens, copy.tokens);
    assert_eq!(zero.counters.reflect_bytes + zero.counters.write_back_bytes, 0);
    let per_call = 2 * 4 * cfg.cache_len() as u64;
    assert_eq!(copy.counters.calls, 1 + steps as u64);
    assert_eq!(copy.counters.reflect_bytes, per_call * copy.counters.calls);
    assert_eq!(copy.counters.write_back_bytes, per_call * copy.counters.calls);
    // The trait-level run above and the ABI run agree exactly.
    let direct = generate(&cfg, steps, Mode::ZeroCopy);
    assert_eq!(direct.logits, zero.logits);
}

/// kv-example names the reference backend without depending on this crate: the two ids must agree, or the
/// exported programs would ask for a backend nobody serves.
#[test]
fn the_example_exports_for_this_backend() {
    assert_eq!(export::REFERENCE_BACKEND, BACKEND_ID);
    let header = export::header(&Config::tiny(), 1);
    assert_eq!(header.backend_id, BACKEND_ID);
    let manifest = export::manifest(&Config::tiny());
    assert!(manifest.methods.values().flat_map(|m| &m.calls).all(|c| c.backend == BACKEND_ID));
}

/// One call of an f16 export: `tokens` at `position` with f16 caches updated in place; its logits widened
/// to f32 and its `next_token`.
fn f16_call(
    delegate: &ReferenceDelegate,
    handle: &mut ReferenceHandle,
    caches: &mut [Vec<f16>],
    (cfg, tokens, position): (&Config, &[i64], i64),
) -> (Vec<f32>, i64) {
    let rows = tokens.len() as i64;
    let position = [position];
    let mut logits = vec![f16::ZERO; tokens.len() * cfg.vocab];
    let mut next_token = [-1i64];
    let cache_shape: Vec<i64> = cfg.cache_shape().iter().map(|&d| d as i64).collect();
    let (half, host) = (DTypeCode::F16, MemoryKind::Host);
    let mut stats = ExecStats::default();
    {
        let mut list = ArgList::new();
        list.push_input(bytemuck::cast_slice(tokens), DTypeCode::I64, &[rows], host).expect("sized");
        list.push_input(bytemuck::cast_slice(&position), DTypeCode::I64, &[1], host).expect("sized");
        let mut inouts = Vec::new();
        for cache in caches.iter_mut() {
            inouts.push(
                list.push_inout(bytemuck::cast_slice_mut(cache), half, &cache_shape, host).expect("sized"),
            );
        }
        for slot in inouts {
            list.push_output_in_place(slot, half, &cache_shape).expect("same storage");
        }
        let logits_shape = [rows, cfg.vocab as i64];
        list.push_output(bytemuck::cast_slice_mut(&mut logits), half, &logits_shape, host).expect("sized");
        list.push_output(bytemuck::cast_slice_mut(&mut next_token), DTypeCode::I64, &[1], host)
            .expect("sized");
        // SAFETY: `ArgList` built every argument from live borrows (shared for inputs, exclusive for caches
        // and outputs) that outlive this block, and shares storage only between a cache and its in-place
        // output at the same address and size: `ExecuteArgs::new`'s contract.
        let mut args = unsafe { ExecuteArgs::new(list.as_slice(), None, &mut stats) };
        delegate.execute(handle, &mut args).expect("execute");
    }
    assert_eq!(stats.reflect_bytes, 0, "the f16 caches are updated in place");
    (logits.iter().map(|x| x.to_f32()).collect(), next_token[0])
}

/// f16 caches widened to f32, for the verifier.
fn widen(caches: &[Vec<f16>]) -> Vec<Vec<f32>> {
    caches.iter().map(|c| c.iter().map(|x| x.to_f32()).collect()).collect()
}

/// Caches `[k0, v0, k1, v1, ..]` as per-layer `(k, v)` pairs.
fn layers(caches: &[Vec<f32>]) -> Vec<(&[f32], &[f32])> {
    caches.chunks_exact(2).map(|kv| (kv[0].as_slice(), kv[1].as_slice())).collect()
}

/// An f16 export of the example runs on this delegate too (issue 18; it used to be refused): prefill and
/// every decode step, f16 caches in the caller's memory updated in place, logits and caches within
/// `F16_TOLERANCE` of the f64 oracle of the f16-rounded weights (kv-example's suggested bound for an executor
/// that rounds every op's output to f16 and accumulates in f32, which this one is), and the greedy tokens
/// the oracle's.
#[test]
fn an_f16_export_matches_the_oracle_within_the_f16_tolerance() {
    use delegate_abi::Compatibility;
    let cfg = Config { dtype: ref_graph::ElemType::F16, ..Config::tiny() };
    let weights = Weights::generate(&cfg);
    let delegate = ReferenceDelegate::new();
    let prefill_blob = export::reference_blob(&cfg, &weights, cfg.prompt_len()).expect("blob");
    assert_eq!(delegate.compatibility(&prefill_blob), Compatibility::Supported);
    let mut prefill = init(&delegate, &prefill_blob);
    let mut decode = init(&delegate, &export::reference_blob(&cfg, &weights, 1).expect("blob"));
    let mut verifier = Verifier::new(&cfg);
    assert_eq!(verifier.tolerance(), F16_TOLERANCE);
    let mut caches = vec![vec![f16::ZERO; cfg.cache_len()]; 2 * cfg.layers];
    verifier.caches_zeroed(&layers(&widen(&caches)));

    let (logits, mut token) = f16_call(&delegate, &mut prefill, &mut caches, (&cfg, &cfg.prompt, 0));
    verifier.prefill(&cfg.prompt, &logits, &layers(&widen(&caches))).expect("oracle prefill");
    let mut tokens = Vec::new();
    for step in 0..cfg.max_decode_steps() {
        let position = cfg.prompt_len() + step;
        let (logits, next) = f16_call(&delegate, &mut decode, &mut caches, (&cfg, &[token], position as i64));
        assert_eq!(next, argmax(&logits) as i64, "next_token is the argmax of the f16 logits");
        verifier.decode(token, position, &logits, &layers(&widen(&caches))).expect("oracle decode");
        tokens.push(token);
        token = next;
    }
    // Upstream's A/B check on fresh caches: A decodes at 1 on a zeroed cache, B at 0 then 1.
    let fresh = || vec![vec![f16::ZERO; cfg.cache_len()]; 2 * cfg.layers];
    let (mut a, mut b) = (fresh(), fresh());
    let (logits_a, _) = f16_call(&delegate, &mut decode, &mut a, (&cfg, &[5], 1));
    f16_call(&delegate, &mut decode, &mut b, (&cfg, &[9], 0));
    let (logits_b, _) = f16_call(&delegate, &mut decode, &mut b, (&cfg, &[5], 1));
    verifier.ab(&logits_a, &logits_b);
    let report = verifier.finish();
    println!("{report}");
    assert!(report.passed(), "{report}");
    assert_eq!(tokens, oracle_tokens(&cfg, cfg.max_decode_steps()));
}

/// The soak (issue 10) on the CPU: 10 000 decode steps, prefill and decode as two delegate instances sharing
/// the caller's caches in place, every step's logits against the f64 oracle and the final caches too (no lost
/// or misplaced update in 10 000 in-place writes per cache). Checking the full caches at every step would be
/// quadratic, so they are checked once, at the end, where every row written is still there.
#[test]
fn soak_ten_thousand_decode_steps_two_instances_share_caches() {
    const STEPS: usize = 10_000;
    let cfg = Config { layers: 2, max_len: STEPS + Config::tiny().prompt_len(), ..Config::tiny() };
    let weights = Weights::generate(&cfg);
    let delegate = ReferenceDelegate::new();
    let mut prefill =
        init(&delegate, &export::reference_blob(&cfg, &weights, cfg.prompt_len()).expect("blob"));
    let mut decode = init(&delegate, &export::reference_blob(&cfg, &weights, 1).expect("blob"));
    let mut oracle = kv_example::Oracle::with_weights(&cfg, &weights);
    let mut host = Host::new(&cfg);

    let worst = |ours: &[f32], theirs: &[f64]| {
        let theirs: Vec<f32> = theirs.iter().map(|&x| x as f32).collect();
        max_abs_diff(ours, &theirs).expect("finite")
    };
    host.call(&delegate, &mut prefill, &cfg.prompt, 0, Mode::ZeroCopy);
    oracle.prefill(&cfg.prompt).expect("in range");
    let mut token = host.next_tokens[0];
    let mut largest = 0.0f64;
    for step in 0..STEPS {
        let position = cfg.prompt_len() + step;
        let logits = host.call(&delegate, &mut decode, &[token], position as i64, Mode::ZeroCopy);
        let diff = worst(&logits, &oracle.decode(token, position).expect("in range"));
        assert!(diff < TOLERANCE, "step {step} (position {position}): logits differ by {diff}");
        largest = largest.max(diff);
        token = host.next_tokens[step + 1];
    }
    for layer in 0..cfg.layers {
        let (k, v) = oracle.cache(layer);
        let (ours_k, ours_v) = host.layer_caches()[layer];
        let diff = worst(ours_k, k).max(worst(ours_v, v));
        assert!(diff < TOLERANCE, "layer {layer}: the caches after {STEPS} steps differ by {diff}");
    }
    assert_eq!(host.next_tokens.len(), STEPS + 1, "prefill's token and one per decode step");
    assert_eq!(
        (host.reflect_bytes, host.write_back_bytes),
        (0, 0),
        "in place: nothing copied in 10 000 steps"
    );
    println!("soak: {STEPS} decode steps, largest logit difference {largest:.2e}");
}
