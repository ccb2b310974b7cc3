//! A small decoder in the forms Hugging Face's Llama and Qwen exports use, built with `GraphBuilder` and run
//! by the delegate in f32, f16 and bf16, against the same model computed by plain f32 loops here.
//!
//! The forms: `input_ids` `[1, T]`, rank-3 activations `[1, T, D]`; RMSNorm decomposed as transformers writes
//! it (cast to f32, square, mean, add an eps constant `[]`, rsqrt, mul, cast back, times the weight);
//! `nn.Linear` as `mat_mul` with `transpose_b` (with a bias for q, k, v as Qwen2 has); q and k reshaped and
//! permuted head-major `[1, H, T, Dh]`; Qwen3's per-head q and k norms (`rms_norm` of rank 4); rotary
//! embeddings from `inv_freq` x positions with `rotate_half` (slice, neg, concat, mul, add); rank-4 caches
//! `[1, Hkv, L, Dh]` updated head-major; grouped-query attention with `Hq = 2 Hkv`; a SwiGLU MLP; final norm,
//! lm_head and argmax. A prefill of 3 tokens and decode steps of 1 share the caller's caches, as
//! transformers' two methods do.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use blob_format::model::{Alias, AliasKind, Role};
use delegate_abi::host::ArgList;
use delegate_abi::{Compatibility, DTypeCode, Delegate, ExecStats, ExecuteArgs, InitContext, MemoryKind};
use ref_graph::half::{bf16, f16};
use ref_graph::{ElemType, Graph, GraphBuilder, MatMulOptions, TensorId, UnaryFn};
use reference_delegate::{ReferenceDelegate, ReferenceHandle};

#[path = "support/calls.rs"]
mod calls;
use calls::{graph_binding, graph_blob};

const D: usize = 8;
const HQ: usize = 4;
const HKV: usize = 2;
const DH: usize = 4;
const L: usize = 8;
const V: usize = 11;
const FF: usize = 12;
const EPS: f32 = 1e-5;
const PROMPT: [i64; 3] = [3, 7, 1];
const DECODE_STEPS: usize = 4;

/// An element type of the model: how a value is stored in it.
trait Elt: bytemuck::Pod {
    const ELEM: ElemType;
    const CODE: DTypeCode;
    fn from_f32(x: f32) -> Self;
    fn to_f32(self) -> f32;
}

impl Elt for f32 {
    const ELEM: ElemType = ElemType::F32;
    const CODE: DTypeCode = DTypeCode::F32;
    fn from_f32(x: f32) -> f32 {
        x
    }
    fn to_f32(self) -> f32 {
        self
    }
}

impl Elt for f16 {
    const ELEM: ElemType = ElemType::F16;
    const CODE: DTypeCode = DTypeCode::F16;
    fn from_f32(x: f32) -> f16 {
        f16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

impl Elt for bf16 {
    const ELEM: ElemType = ElemType::Bf16;
    const CODE: DTypeCode = DTypeCode::BF16;
    fn from_f32(x: f32) -> bf16 {
        bf16::from_f32(x)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
}

/// The weights, as `f32` values already rounded to the model's type (so the loops below compute with exactly
/// the weights the graph stores, and the comparison measures arithmetic, not weight rounding).
struct Weights {
    emb: Vec<f32>,
    norms: [Vec<f32>; 3],
    /// Qwen3's per-head q and k norms, `[Dh]`.
    head_norms: [Vec<f32>; 2],
    wq: Vec<f32>,
    bq: Vec<f32>,
    wk: Vec<f32>,
    bk: Vec<f32>,
    wv: Vec<f32>,
    bv: Vec<f32>,
    wo: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
    lm_head: Vec<f32>,
    inv_freq: Vec<f32>,
}

impl Weights {
    fn new<E: Elt>() -> Weights {
        let w = |n: usize, seed: f32, scale: f32| -> Vec<f32> {
            (0..n).map(|i| E::from_f32(((i as f32 + 1.0) * seed).sin() * scale).to_f32()).collect()
        };
        let norm = |seed: f32| -> Vec<f32> {
            w(D, seed, 0.2).iter().map(|x| E::from_f32(1.0 + x).to_f32()).collect()
        };
        Weights {
            emb: w(V * D, 0.71, 1.0),
            norms: [norm(1.1), norm(1.7), norm(2.3)],
            head_norms: [w(DH, 0.57, 0.2), w(DH, 0.77, 0.2)]
                .map(|n| n.iter().map(|x| E::from_f32(1.0 + x).to_f32()).collect()),
            wq: w(HQ * DH * D, 1.31, 0.5),
            bq: w(HQ * DH, 0.37, 0.1),
            wk: w(HKV * DH * D, 2.11, 0.5),
            bk: w(HKV * DH, 0.53, 0.1),
            wv: w(HKV * DH * D, 0.93, 0.5),
            bv: w(HKV * DH, 0.61, 0.1),
            wo: w(D * HQ * DH, 1.73, 0.4),
            gate: w(FF * D, 0.29, 0.5),
            up: w(FF * D, 0.83, 0.5),
            down: w(D * FF, 1.19, 0.4),
            lm_head: w(V * D, 0.47, 1.0),
            // transformers keeps inv_freq in f32 whatever the model's type.
            inv_freq: (0..DH / 2).map(|i| 1.0 / 10_000f32.powf(2.0 * i as f32 / DH as f32)).collect(),
        }
    }
}

/// The graph's builder, with the model's element type.
struct Build<E> {
    b: GraphBuilder,
    _elem: std::marker::PhantomData<E>,
}

impl<E: Elt> Build<E> {
    fn weight(&mut self, name: &str, shape: &[u64], values: &[f32]) -> TensorId {
        let b = &mut self.b;
        match E::ELEM {
            ElemType::F32 => b.constant_f32(name, shape, values.to_vec()),
            ElemType::F16 => b.constant_f16(name, shape, values.iter().map(|&x| f16::from_f32(x)).collect()),
            _ => b.constant_bf16(name, shape, values.iter().map(|&x| bf16::from_f32(x)).collect()),
        }
        .expect("sized")
    }

    fn linear(&mut self, name: &str, x: TensorId, w: TensorId, bias: Option<TensorId>) -> TensorId {
        self.b.mat_mul_with(name, x, w, MatMulOptions { transpose_b: true, bias }).expect("typed")
    }

    /// transformers' `LlamaRMSNorm`: in f32, then back to the model's type, times the weight.
    fn norm(&mut self, name: &str, x: TensorId, weight: TensorId) -> TensorId {
        let b = &mut self.b;
        let at = |what: &str| format!("{name}.{what}");
        let xf = b.cast(&at("x32"), x, ElemType::F32).expect("typed");
        let square = b.unary(&at("square"), UnaryFn::Square, xf).expect("typed");
        let mean = b.mean(&at("mean"), square).expect("typed");
        let eps = b.constant_f32(&at("eps"), &[], vec![EPS]).expect("a scalar");
        let shifted = b.add(&at("plus_eps"), mean, eps).expect("typed");
        let scale = b.unary(&at("rsqrt"), UnaryFn::Rsqrt, shifted).expect("typed");
        let normed = b.mul(&at("normed"), xf, scale).expect("typed");
        let back = b.cast(&at("back"), normed, E::ELEM).expect("typed");
        b.mul(name, weight, back).expect("typed")
    }

    /// `[1, T, H * Dh]` as head-major `[1, H, T, Dh]`.
    fn heads(&mut self, name: &str, x: TensorId, heads: usize, rows: usize) -> TensorId {
        let split = [1, rows as u64, heads as u64, DH as u64];
        let x = self.b.reshape(&format!("{name}.split"), x, &split).expect("typed");
        self.b.permute(name, x, &[0, 2, 1, 3]).expect("typed")
    }

    /// `x * cos + rotate_half(x) * sin`, `rotate_half(x) = cat(-x[..., Dh/2:], x[..., :Dh/2])`.
    fn rope(&mut self, name: &str, x: TensorId, cos: TensorId, sin: TensorId) -> TensorId {
        let b = &mut self.b;
        let at = |what: &str| format!("{name}.{what}");
        let half = (DH / 2) as u64;
        let x1 = b.slice(&at("x1"), x, 3, 0, half).expect("typed");
        let x2 = b.slice(&at("x2"), x, 3, half, DH as u64).expect("typed");
        let neg = b.unary(&at("neg"), UnaryFn::Neg, x2).expect("typed");
        let rotated = b.concat(&at("rotated"), neg, x1, 3).expect("typed");
        let x_cos = b.mul(&at("cos"), x, cos).expect("typed");
        let r_sin = b.mul(&at("sin"), rotated, sin).expect("typed");
        b.add(name, x_cos, r_sin).expect("typed")
    }

    /// cos and sin `[T, Dh]` of `inv_freq` x positions, in f32, then in the model's type.
    fn rotary(&mut self, pos: TensorId, inv_freq: TensorId, rows: usize) -> (TensorId, TensorId) {
        let b = &mut self.b;
        let p = b.positions("positions", pos, rows as u64).expect("typed");
        let pf = b.cast("positions_f32", p, ElemType::F32).expect("typed");
        let column = b.reshape("positions_column", pf, &[rows as u64, 1]).expect("typed");
        let freqs = b.mul("freqs", column, inv_freq).expect("typed");
        let angles = b.concat("angles", freqs, freqs, 1).expect("typed");
        let mut table = |func, name: &str| {
            let f = b.unary(&format!("{name}_f32"), func, angles).expect("typed");
            b.cast(name, f, E::ELEM).expect("typed")
        };
        (table(UnaryFn::Cos, "cos"), table(UnaryFn::Sin, "sin"))
    }
}

/// The decoder over `rows` tokens: outputs `logits` `[1, T, V]`, the two updated caches and `next`.
fn graph<E: Elt>(w: &Weights, rows: usize) -> Graph {
    let mut g = Build::<E> { b: GraphBuilder::new(), _elem: std::marker::PhantomData };
    let cache = [1, HKV as u64, L as u64, DH as u64];
    let ids = g.b.input("input_ids", ElemType::I64, &[1, rows as u64]).expect("fresh");
    let pos = g.b.input("input_pos", ElemType::I64, &[1]).expect("fresh");
    let k_cache = g.b.input("k_cache", E::ELEM, &cache).expect("fresh");
    let v_cache = g.b.input("v_cache", E::ELEM, &cache).expect("fresh");
    let emb = g.weight("emb", &[V as u64, D as u64], &w.emb);
    let norms = [0, 1, 2].map(|i| g.weight(&format!("norm{i}.weight"), &[D as u64], &w.norms[i]));
    let (q_out, kv_out, d) = ((HQ * DH) as u64, (HKV * DH) as u64, D as u64);
    let wq = g.weight("wq", &[q_out, d], &w.wq);
    let bq = g.weight("bq", &[q_out], &w.bq);
    let wk = g.weight("wk", &[kv_out, d], &w.wk);
    let bk = g.weight("bk", &[kv_out], &w.bk);
    let wv = g.weight("wv", &[kv_out, d], &w.wv);
    let bv = g.weight("bv", &[kv_out], &w.bv);
    let wo = g.weight("wo", &[d, q_out], &w.wo);
    let gate = g.weight("gate", &[FF as u64, d], &w.gate);
    let up = g.weight("up", &[FF as u64, d], &w.up);
    let down = g.weight("down", &[d, FF as u64], &w.down);
    let lm_head = g.weight("lm_head", &[V as u64, d], &w.lm_head);
    let inv_freq = g.b.constant_f32("inv_freq", &[(DH / 2) as u64], w.inv_freq.clone()).expect("sized");

    let x = g.b.gather("embed", emb, ids).expect("typed");
    let h = g.norm("attn_norm", x, norms[0]);
    let q = g.linear("q_proj", h, wq, Some(bq));
    let k = g.linear("k_proj", h, wk, Some(bk));
    let v = g.linear("v_proj", h, wv, Some(bv));
    let (q, k, v) = (g.heads("q", q, HQ, rows), g.heads("k", k, HKV, rows), g.heads("v", v, HKV, rows));
    // Qwen3's q and k norms: `rms_norm` over the last axis of `[1, H, T, Dh]`.
    let head_norms = [0, 1].map(|i| g.weight(&format!("head_norm{i}"), &[DH as u64], &w.head_norms[i]));
    let q = g.b.rms_norm("q_norm", q, head_norms[0], EPS).expect("typed");
    let k = g.b.rms_norm("k_norm", k, head_norms[1], EPS).expect("typed");
    let (cos, sin) = g.rotary(pos, inv_freq, rows);
    let (q, k) = (g.rope("q_rot", q, cos, sin), g.rope("k_rot", k, cos, sin));
    let k_out = g.b.kv_cache_update("k_cache_out", k_cache, k, pos).expect("typed");
    let v_out = g.b.kv_cache_update("v_cache_out", v_cache, v, pos).expect("typed");
    let attn = g.b.causal_attention("attn", q, k_out, v_out, pos).expect("typed");
    let attn = g.b.permute("attn_tokens", attn, &[0, 2, 1, 3]).expect("typed");
    let attn = g.b.reshape("attn_merged", attn, &[1, rows as u64, q_out]).expect("typed");
    let o = g.linear("o_proj", attn, wo, None);
    let x = g.b.add("residual1", x, o).expect("typed");
    let h = g.norm("mlp_norm", x, norms[1]);
    let (gated, upped) = (g.linear("gate_proj", h, gate, None), g.linear("up_proj", h, up, None));
    let act = g.b.unary("silu", UnaryFn::Silu, gated).expect("typed");
    let act = g.b.mul("swiglu", act, upped).expect("typed");
    let mlp = g.linear("down_proj", act, down, None);
    let x = g.b.add("residual2", x, mlp).expect("typed");
    let h = g.norm("final_norm", x, norms[2]);
    let logits = g.linear("logits", h, lm_head, None);
    let next = g.b.argmax("next", logits).expect("typed");
    for out in [logits, k_out, v_out, next] {
        g.b.output(out).expect("declared");
    }
    g.b.finish().expect("a valid graph")
}

fn blob(graph: &Graph) -> Vec<u8> {
    let binding = |name, role| graph_binding(graph, name, role);
    let inputs = ["input_ids", "input_pos", "k_cache", "v_cache"].map(|n| binding(n, Role::Input));
    let outputs = ["k_cache_out", "v_cache_out", "logits", "next"].map(|n| binding(n, Role::Output));
    let alias = |kv: &str| Alias {
        output: format!("{kv}_cache_out"),
        input: format!("{kv}_cache"),
        kind: AliasKind::KvCacheUpdate,
    };
    graph_blob(graph, inputs.into_iter().chain(outputs).collect(), vec![alias("k"), alias("v")])
}

/// Counts the calling thread's allocations while its `COUNTING` flag is set: a call must make none.
struct CountingAlloc;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every method forwards its arguments unchanged to the system allocator, so `System`'s guarantees
// are this allocator's; the counting touches only const-initialised thread-locals, which never allocate.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.try_with(Cell::get).unwrap_or(false) {
            COUNT.with(|count| count.set(count.get() + 1));
        }
        // SAFETY: the caller's contract for `alloc` is `System.alloc`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` with `layout` (above), as the caller guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAlloc = CountingAlloc;

/// One call: `ids` at `position`, the caches updated in place; the logits widened to f32 and `next`. The call
/// itself (`execute`) must allocate nothing: all scratch is the executor's, allocated at `init`.
fn call<E: Elt>(
    handle: &mut ReferenceHandle,
    caches: &mut [Vec<E>; 2],
    ids: &[i64],
    position: i64,
) -> (Vec<f32>, i64) {
    let (rows, position) = (ids.len() as i64, [position]);
    let mut logits = vec![E::from_f32(0.0); ids.len() * V];
    let mut next = [-1i64];
    let cache = [1, HKV as i64, L as i64, DH as i64];
    let host = MemoryKind::Host;
    let mut stats = ExecStats::default();
    {
        let mut list = ArgList::new();
        list.push_input(bytemuck::cast_slice(ids), DTypeCode::I64, &[1, rows], host).expect("sized");
        list.push_input(bytemuck::cast_slice(&position), DTypeCode::I64, &[1], host).expect("sized");
        let [k, v] = caches;
        let k = list.push_inout(bytemuck::cast_slice_mut(k), E::CODE, &cache, host).expect("sized");
        let v = list.push_inout(bytemuck::cast_slice_mut(v), E::CODE, &cache, host).expect("sized");
        list.push_output_in_place(k, E::CODE, &cache).expect("same storage");
        list.push_output_in_place(v, E::CODE, &cache).expect("same storage");
        list.push_output(bytemuck::cast_slice_mut(&mut logits), E::CODE, &[1, rows, V as i64], host)
            .expect("sized");
        list.push_output(bytemuck::cast_slice_mut(&mut next), DTypeCode::I64, &[1], host).expect("sized");
        // SAFETY: `ArgList` built every argument from live borrows (shared for inputs, exclusive for caches
        // and outputs) that outlive this block, and shares storage only between a cache and its in-place
        // output at the same address and size: `ExecuteArgs::new`'s contract.
        let mut args = unsafe { ExecuteArgs::new(list.as_slice(), None, &mut stats) };
        let delegate = ReferenceDelegate::new();
        COUNT.with(|count| count.set(0));
        COUNTING.with(|counting| counting.set(true));
        let result = delegate.execute(handle, &mut args);
        COUNTING.with(|counting| counting.set(false));
        result.expect("execute");
        assert_eq!(COUNT.with(Cell::get), 0, "allocations during execute");
    }
    assert_eq!(stats.reflect_bytes, 0, "the caches are updated in place");
    (logits.into_iter().map(E::to_f32).collect(), next[0])
}

/// The same decoder in plain f32 loops, with its own caches `[Hkv, L, Dh]`.
struct Loops<'w> {
    w: &'w Weights,
    k: Vec<f32>,
    v: Vec<f32>,
}

fn rms_norm(x: &[f32], weight: &[f32]) -> Vec<f32> {
    let scale = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32 + EPS).sqrt();
    x.iter().zip(weight).map(|(v, w)| v * scale * w).collect()
}

/// `x w^T + bias` for `w` `[N, K]`.
fn linear(x: &[f32], w: &[f32], bias: Option<&[f32]>) -> Vec<f32> {
    let rows = w.chunks_exact(x.len());
    rows.enumerate()
        .map(|(n, row)| row.iter().zip(x).map(|(a, b)| a * b).sum::<f32>() + bias.map_or(0.0, |b| b[n]))
        .collect()
}

impl Loops<'_> {
    /// Rotary embedding of one head at position `p`, rotate-half form.
    fn rope(&self, x: &[f32], p: usize) -> Vec<f32> {
        let half = DH / 2;
        (0..DH)
            .map(|i| {
                let angle = p as f32 * self.w.inv_freq[i % half];
                let rotated = if i < half { -x[i + half] } else { x[i - half] };
                x[i] * angle.cos() + rotated * angle.sin()
            })
            .collect()
    }

    /// One token at position `p`: its logits.
    fn token(&mut self, id: i64, p: usize) -> Vec<f32> {
        let w = self.w;
        let x: Vec<f32> = w.emb[id as usize * D..][..D].to_vec();
        let h = rms_norm(&x, &w.norms[0]);
        let (q, k, v) =
            (linear(&h, &w.wq, Some(&w.bq)), linear(&h, &w.wk, Some(&w.bk)), linear(&h, &w.wv, Some(&w.bv)));
        for kv in 0..HKV {
            let row = (kv * L + p) * DH;
            let rotated = self.rope(&rms_norm(&k[kv * DH..][..DH], &w.head_norms[1]), p);
            self.k[row..row + DH].copy_from_slice(&rotated);
            self.v[row..row + DH].copy_from_slice(&v[kv * DH..][..DH]);
        }
        let mut attn = vec![0.0f32; HQ * DH];
        for h in 0..HQ {
            let q_h = self.rope(&rms_norm(&q[h * DH..][..DH], &w.head_norms[0]), p);
            let kv = h / (HQ / HKV);
            let key = |j: usize| &self.k[(kv * L + j) * DH..][..DH];
            let scores: Vec<f32> = (0..=p)
                .map(|j| q_h.iter().zip(key(j)).map(|(a, b)| a * b).sum::<f32>() / (DH as f32).sqrt())
                .collect();
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let total: f32 = scores.iter().map(|s| (s - max).exp()).sum();
            for (j, s) in scores.iter().enumerate() {
                let weight = (s - max).exp() / total;
                for d in 0..DH {
                    attn[h * DH + d] += weight * self.v[(kv * L + j) * DH + d];
                }
            }
        }
        let x: Vec<f32> = x.iter().zip(linear(&attn, &w.wo, None)).map(|(a, b)| a + b).collect();
        let h = rms_norm(&x, &w.norms[1]);
        let (gate, up) = (linear(&h, &w.gate, None), linear(&h, &w.up, None));
        let act: Vec<f32> = gate.iter().zip(&up).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
        let x: Vec<f32> = x.iter().zip(linear(&act, &w.down, None)).map(|(a, b)| a + b).collect();
        linear(&rms_norm(&x, &w.norms[2]), &w.lm_head, None)
    }
}

/// The largest absolute difference.
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Prefill then decode steps with the delegate and with the loops; the largest logit and cache differences.
fn run<E: Elt>() -> (f32, f32, Vec<i64>, Vec<i64>) {
    let weights = Weights::new::<E>();
    let delegate = ReferenceDelegate::new();
    let init = |rows| {
        let blob = blob(&graph::<E>(&weights, rows));
        assert_eq!(delegate.compatibility(&blob), Compatibility::Supported);
        delegate.init(InitContext { blob: &blob, compile_specs: &[], runtime_specs: &[] }).expect("init")
    };
    let (mut prefill, mut decode) = (init(PROMPT.len()), init(1));
    let mut caches = [vec![E::from_f32(0.0); HKV * L * DH], vec![E::from_f32(0.0); HKV * L * DH]];
    let mut loops = Loops { w: &weights, k: vec![0.0; HKV * L * DH], v: vec![0.0; HKV * L * DH] };
    let (logits, mut token) = call(&mut prefill, &mut caches, &PROMPT, 0);
    let expected: Vec<f32> = PROMPT.iter().enumerate().flat_map(|(p, &id)| loops.token(id, p)).collect();
    let mut logit_diff = max_diff(&logits, &expected);
    let argmax_last = |row: &[f32]| ref_graph::argmax(&row[row.len() - V..]) as i64;
    let (mut tokens, mut expected_tokens) = (vec![token], vec![argmax_last(&expected)]);
    for step in 0..DECODE_STEPS {
        let position = PROMPT.len() + step;
        let (logits, next) = call(&mut decode, &mut caches, &[token], position as i64);
        let expected = loops.token(token, position);
        logit_diff = logit_diff.max(max_diff(&logits, &expected));
        expected_tokens.push(argmax_last(&expected));
        tokens.push(next);
        token = next;
    }
    let widen = |c: &[E]| c.iter().map(|x| x.to_f32()).collect::<Vec<_>>();
    let cache_diff = max_diff(&widen(&caches[0]), &loops.k).max(max_diff(&widen(&caches[1]), &loops.v));
    (logit_diff, cache_diff, tokens, expected_tokens)
}

#[test]
fn a_hugging_face_style_decoder_matches_plain_f32_loops() {
    let (logits, caches, tokens, expected) = run::<f32>();
    println!("f32: max |logits - loops| = {logits:.3e}, max |caches - loops| = {caches:.3e}");
    assert!(logits < 1e-4 && caches < 1e-5, "f32: logits {logits:e}, caches {caches:e}");
    assert_eq!(tokens, expected, "greedy tokens, fed back");
}

/// f16 and bf16: every op rounds its result to the type, so the results drift from the f32 loops by a few
/// roundings of the largest values. f16 keeps 11 significant bits (half an ulp is 2^-11 = 4.9e-4 relative),
/// bf16 8 (2^-8 = 3.9e-3); a value passes through about 30 rounded ops per token, and errors partly cancel. Measured: 3.6e-3 (f16) and 2.9e-2 (bf16) on the logits,
/// less on the caches. The bounds, 1.5e-2 and 1.2e-1, are about four times that (room for another summation
/// order) and far below the order-1 differences a wrong row, head or position makes.
#[test]
fn the_decoder_in_f16_and_bf16_stays_within_a_stated_tolerance_of_f32() {
    for (name, (logits, caches, _, _), tolerance) in
        [("f16", run::<f16>(), 1.5e-2f32), ("bf16", run::<bf16>(), 1.2e-1)]
    {
        println!("{name}: max |logits - loops| = {logits:.3e}, max |caches - loops| = {caches:.3e}");
        assert!(logits < tolerance && caches < tolerance, "{name}: logits {logits:e}, caches {caches:e}");
    }
}
