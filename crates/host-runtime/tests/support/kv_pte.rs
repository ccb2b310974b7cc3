//! `.pte` programs around kv-example `tiny`'s real reference-graph blobs, laid out as ExecuTorch's
//! `to_executorch` lays out a decoder whose caches are program mutable buffers: one `DelegateCall`
//! (arguments in the blob's order: tokens, input_pos, k_cache_0, v_cache_0, the new caches, logits,
//! next_token), then one `aten::copy_(cache, new)` write-back per cache buffer, then `aten::clone.out` of the
//! logits into the method output. Shared by host-runtime's and delegate-host's tests (`#[path]`).
#![allow(dead_code)]

use pte_format::model::{DataLocation, ScalarType};
use pte_format::testing::{DelegateSpec, InstructionSpec, MethodSpec, ProgramSpec, TensorSpec, ValueSpec};

/// Value indices of every method.
pub const TOKENS: i32 = 0;
/// The position input.
pub const INPUT_POS: i32 = 1;
/// The method output (the clone of the delegate's logits).
pub const LOGITS: i32 = 8;

/// The kv-example tiny config.
pub fn config() -> kv_example::Config {
    kv_example::Config::tiny()
}

fn method(name: &str, rows: usize, segment: u32) -> MethodSpec {
    use ScalarType::{Float, Long};
    let cfg = config();
    let cache: Vec<i32> = cfg.cache_shape().iter().map(|&d| d as i32).collect();
    let cache_bytes = cfg.cache_shape().iter().product::<usize>() as u64 * 4;
    let logits = [rows as i32, cfg.vocab as i32];
    let logits_bytes = (rows * cfg.vocab * 4) as u64;
    let values = vec![
        ValueSpec::Tensor(TensorSpec::planned(Long, &[rows as i32], 1, 0)),
        ValueSpec::Tensor(TensorSpec::planned(Long, &[1], 1, 64)),
        ValueSpec::Tensor(TensorSpec::planned(Float, &cache, 2, 0).named("k_cache_0")),
        ValueSpec::Tensor(TensorSpec::planned(Float, &cache, 2, cache_bytes).named("v_cache_0")),
        ValueSpec::Tensor(TensorSpec::planned(Float, &cache, 1, 128)),
        ValueSpec::Tensor(TensorSpec::planned(Float, &cache, 1, 128 + cache_bytes)),
        ValueSpec::Tensor(TensorSpec::planned(Float, &logits, 1, 128 + 2 * cache_bytes)),
        ValueSpec::Tensor(TensorSpec::planned(Long, &[1], 1, 128 + 2 * cache_bytes + logits_bytes)),
        ValueSpec::Tensor(TensorSpec::planned(Float, &logits, 1, 256 + 2 * cache_bytes + logits_bytes)),
        ValueSpec::Null,
        ValueSpec::Bool(false),
    ];
    MethodSpec {
        name: name.to_owned(),
        values,
        inputs: vec![TOKENS, INPUT_POS],
        outputs: vec![LOGITS],
        operators: vec![
            ("aten::copy_".to_owned(), String::new()),
            ("aten::clone".to_owned(), "out".to_owned()),
        ],
        delegates: vec![DelegateSpec {
            id: "ReferenceBackend".to_owned(),
            location: DataLocation::Segment,
            index: segment,
            compile_specs: vec![("max_seq_len".to_owned(), cfg.max_len.to_string().into_bytes())],
        }],
        instructions: vec![
            InstructionSpec::Delegate { delegate: 0, args: vec![0, 1, 2, 3, 4, 5, 6, 7] },
            InstructionSpec::Kernel { op: 0, args: vec![2, 4, 10, 2] },
            InstructionSpec::Kernel { op: 0, args: vec![3, 5, 10, 3] },
            InstructionSpec::Kernel { op: 1, args: vec![6, 9, 8] },
        ],
        non_const_buffer_sizes: vec![
            0,
            (512 + 2 * cache_bytes + 2 * logits_bytes) as i64,
            2 * cache_bytes as i64,
        ],
    }
}

/// The program spec: `forward` (one token per call) alone, or `prefill` (the prompt) and `decode`.
pub fn spec(two_methods: bool) -> ProgramSpec {
    let cfg = config();
    let weights = kv_example::Weights::generate(&cfg);
    let blob = |rows| kv_example::export::reference_blob(&cfg, &weights, rows).expect("blob");
    let (methods, segments) = if two_methods {
        (
            vec![method("prefill", cfg.prompt.len(), 1), method("decode", 1, 2)],
            vec![Vec::new(), blob(cfg.prompt.len()), blob(1)],
        )
    } else {
        (vec![method("forward", 1, 1)], vec![Vec::new(), blob(1)])
    };
    ProgramSpec {
        version: 0,
        methods,
        segments,
        inline_data: Vec::new(),
        constant_segment: Some((0, vec![0])),
        named_data: Vec::new(),
    }
}

/// The `.pte` bytes of [`spec`].
pub fn bytes(two_methods: bool) -> Vec<u8> {
    spec(two_methods).to_bytes()
}

/// The oracle's greedy tokens for the prompt and `steps` decode steps (kv-example's f64 oracle).
pub fn oracle_tokens(steps: usize) -> Vec<i64> {
    let cfg = config();
    let mut oracle = kv_example::oracle::Oracle::new(&cfg);
    let argmax = |row: &[f64]| {
        let mut best = 0;
        for (i, &v) in row.iter().enumerate() {
            if v > row[best] {
                best = i;
            }
        }
        best as i64
    };
    let rows = oracle.prefill(&cfg.prompt).expect("prefill");
    let mut token = argmax(rows.last().expect("rows"));
    let mut tokens = vec![token];
    for step in 0..steps {
        token = argmax(&oracle.decode(token, cfg.prompt.len() + step).expect("decode"));
        tokens.push(token);
    }
    tokens
}

/// [`spec`]`(false)` with a mutable buffer `last_token` (i64 `[1]`, planned after the two caches) that an
/// `aten::copy_(last_token, tokens)` after the delegate call fills: a copy that is no aliased write-back (the
/// same operands as ExecuTorch's write-backs: self, src, non_blocking, out = self).
pub fn spec_with_token_copy() -> ProgramSpec {
    let mut spec = spec(false);
    let cache_bytes = config().cache_shape().iter().product::<usize>() as u64 * 4;
    let forward = &mut spec.methods[0];
    let last = forward.values.len() as i32;
    forward.values.push(ValueSpec::Tensor(
        TensorSpec::planned(ScalarType::Long, &[1], 2, 2 * cache_bytes).named("last_token"),
    ));
    forward.non_const_buffer_sizes[2] += 8;
    forward.instructions.insert(1, InstructionSpec::Kernel { op: 0, args: vec![last, TOKENS, 10, last] });
    spec
}
