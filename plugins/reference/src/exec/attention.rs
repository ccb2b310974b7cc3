//! The cache ops: `kv_cache_update` writes rows into a cache **in place** (the caller's argument or
//! delegate-owned state, in the cache's own type), and `causal_attention` reads the caches where they are.
//! Grouped-query attention reads KV head `h / (Hq / Hkv)` for query head `h`; nothing is repeated.

use std::mem;

use delegate_abi::{DelegateError, ExecuteArgs};
use ref_graph::{ElemType, Graph, TensorId};

use super::elem::Float;
use super::store::{Buf, Out, Store, Tensors, Typed, Values, ValuesMut};
use super::{invariant, wrong_type, Error, Executor, OpAt};

/// A KV cache `[H, L, Dh]` (or `[1, H, L, Dh]`: the same memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheShape {
    /// Number of (KV) heads.
    pub heads: usize,
    /// Number of rows (maximum sequence length).
    pub len: usize,
    /// Size of one head.
    pub head_dim: usize,
}

impl CacheShape {
    /// The geometry of a cache of `shape` (rank 3 or 4, as validated).
    pub fn of(shape: &[u64]) -> CacheShape {
        let [heads, len, head_dim] = [3, 2, 1].map(|from_end| shape[shape.len() - from_end] as usize);
        CacheShape { heads, len, head_dim }
    }
}

/// `rows` rows of `heads` heads of `head_dim` values: token-major `[T, H * Dh]`, or head-major `[H, T, Dh]`
/// (`[1, H, T, Dh]`: the same memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rows {
    /// `T`.
    pub rows: usize,
    /// `H`.
    pub heads: usize,
    /// `Dh`.
    pub head_dim: usize,
    /// Whether the layout is `[H, T, Dh]`.
    pub head_major: bool,
}

impl Rows {
    /// The rows of an activation of `shape` with heads of `head_dim`: rank 2 is token-major, rank 3 or 4
    /// head-major (as validated).
    pub fn of(shape: &[u64], head_dim: usize) -> Rows {
        match *shape {
            [rows, width] => {
                Rows { rows: rows as usize, heads: width as usize / head_dim, head_dim, head_major: false }
            }
            _ => {
                let n = shape.len();
                Rows { rows: shape[n - 2] as usize, heads: shape[n - 3] as usize, head_dim, head_major: true }
            }
        }
    }

    /// Where row `t` of head `h` starts.
    pub fn offset(&self, t: usize, h: usize) -> usize {
        let row = if self.head_major { h * self.rows + t } else { t * self.heads + h };
        row * self.head_dim
    }
}

/// Writes `update` into cache rows `position .. position + rows` of every head:
/// `cache[h, position + t, :] = update[t, h]`. The caller has checked `position + rows <= shape.len`.
pub fn kv_cache_update<T: Copy>(
    cache: &mut [T],
    shape: CacheShape,
    update: &[T],
    rows: Rows,
    position: usize,
) {
    let dh = shape.head_dim;
    for h in 0..shape.heads {
        for t in 0..rows.rows {
            let (src, dst) = (rows.offset(t, h), (h * shape.len + position + t) * dh);
            cache[dst..dst + dh].copy_from_slice(&update[src..src + dh]);
        }
    }
}

/// The geometry of one `causal_attention`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Attention {
    /// The caches'.
    pub cache: CacheShape,
    /// The queries' (and the output's).
    pub queries: Rows,
    /// Position of the first query; the caller has checked `position + queries.rows <= cache.len`.
    pub position: usize,
    /// The score scale.
    pub scale: f32,
    /// Logit soft-capping `c`: each scaled score `s` becomes `c * tanh(s / c)`; `None` means no cap.
    pub softcap: Option<f32>,
}

impl Attention {
    /// The score of a query-key dot product: scaled, then capped when the op has a `softcap`.
    fn score(&self, dot: f32) -> f32 {
        let s = dot * self.scale;
        match self.softcap {
            Some(c) => (s / c).tanh() * c,
            None => s,
        }
    }
}

/// Causal attention of `q` over caches `k`, `v`: query `t` of head `h` attends to rows `0 ..= position + t` of
/// KV head `h / (Hq / Hkv)` with `softmax(cap(q k^T * scale)) v` (`cap` the op's soft-capping, if any), in
/// `f32`. `scores` is scratch of at least `L`
/// values, `acc` of at least `Dh`.
pub fn causal_attention<T: Float>(
    q: &[T],
    k: &[T],
    v: &[T],
    at: Attention,
    (scores, acc): (&mut [f32], &mut [f32]),
    out: &mut [T],
) {
    let CacheShape { heads: kv_heads, len, head_dim: dh } = at.cache;
    let group = at.queries.heads / kv_heads;
    for h in 0..at.queries.heads {
        let kv = h / group;
        let (k_h, v_h) = (&k[kv * len * dh..(kv + 1) * len * dh], &v[kv * len * dh..(kv + 1) * len * dh]);
        for t in 0..at.queries.rows {
            let start = at.queries.offset(t, h);
            let acc = &mut acc[..dh];
            attend(&q[start..start + dh], k_h, v_h, &at, &mut scores[..at.position + t + 1], acc);
            for (o, a) in out[start..start + dh].iter_mut().zip(acc.iter()) {
                *o = T::from_f32(*a);
            }
        }
    }
}

/// One query over the first `scores.len()` rows of one head's keys and values, into `acc`.
fn attend<T: Float>(q: &[T], k: &[T], v: &[T], at: &Attention, scores: &mut [f32], acc: &mut [f32]) {
    let dh = q.len();
    for (s, k_row) in scores.iter_mut().zip(k.chunks_exact(dh)) {
        *s = at.score(q.iter().zip(k_row).map(|(x, y)| x.to_f32() * y.to_f32()).sum::<f32>());
    }
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut total = 0.0f32;
    for s in scores.iter_mut() {
        *s = (*s - max).exp();
        total += *s;
    }
    acc.fill(0.0);
    for (&s, v_row) in scores.iter().zip(v.chunks_exact(dh)) {
        let weight = s / total;
        for (a, x) in acc.iter_mut().zip(v_row) {
            *a += weight * x.to_f32();
        }
    }
}

/// Where a cache is: delegate-owned state, or a caller's argument.
#[derive(Debug, Clone, Copy)]
enum Home {
    State(usize),
    Arg(usize),
}

fn misaligned(arg: usize, dtype: ElemType) -> Error {
    Error::Access(DelegateError::invalid_argument(format!(
        "argument {arg} is not aligned to {} bytes, which {dtype} caches updated in place need",
        dtype.size_bytes()
    )))
}

impl Executor {
    fn home(&self, graph: &Graph, id: TensorId) -> Result<Home, Error> {
        match self.tensors.stores[id.0] {
            Store::State { slot } => Ok(Home::State(slot)),
            Store::InPlace { arg } => Ok(Home::Arg(arg)),
            _ => {
                Err(invariant(format!("cache '{}' is neither state nor an argument", graph.tensor(id).name)))
            }
        }
    }

    pub(super) fn kv_cache_update(
        &mut self,
        graph: &Graph,
        at: OpAt<'_>,
        [cache, update, position]: [TensorId; 3],
        out: Out<'_>,
        args: &mut ExecuteArgs<'_>,
    ) -> Result<(), Error> {
        let shape = CacheShape::of(&graph.tensor(cache).shape);
        let rows = Rows::of(&graph.tensor(update).shape, shape.head_dim);
        let position = self.position(graph, at, position, rows.rows, shape.len)?;
        let dtype = out.decl.dtype;
        let write = |tensors: &Tensors, cache: ValuesMut<'_>| {
            with_float!(dtype, T => {
                let cache = cache.typed::<T>().ok_or_else(|| wrong_type(out.decl))?;
                kv_cache_update(cache, shape, tensors.read::<T>(graph, update)?, rows, position);
                Ok(())
            })
        };
        match self.home(graph, cache)? {
            Home::State(slot) => {
                // The cache is taken out while the update (never state itself) is read, then put back.
                let mut buf = mem::replace(&mut self.tensors.state[slot], Buf::empty(dtype));
                let result = write(&self.tensors, buf.values_mut());
                self.tensors.state[slot] = buf;
                result
            }
            Home::Arg(arg) => {
                let ([], [bytes]) = args.borrow([], [arg])?;
                write(&self.tensors, ValuesMut::of_bytes(bytes, dtype).ok_or_else(|| misaligned(arg, dtype))?)
            }
        }
    }

    pub(super) fn causal_attention(
        &mut self,
        graph: &Graph,
        at: OpAt<'_>,
        [q, k, v, position]: [TensorId; 4],
        (scale, softcap): (Option<f32>, Option<f32>),
        mut out: Out<'_>,
        args: &mut ExecuteArgs<'_>,
    ) -> Result<(), Error> {
        let cache = CacheShape::of(&graph.tensor(k).shape);
        let queries = Rows::of(&graph.tensor(q).shape, cache.head_dim);
        let position = self.position(graph, at, position, queries.rows, cache.len)?;
        let scale = scale.unwrap_or(1.0 / (cache.head_dim as f32).sqrt());
        let geometry = Attention { cache, queries, position, scale, softcap };
        let dtype = out.decl.dtype;
        let homes = (self.home(graph, k)?, self.home(graph, v)?);
        let (t, work) = (&self.tensors, &mut self.work);
        let mut run = |k: Values<'_>, v: Values<'_>, out: &mut Out<'_>| {
            with_float!(dtype, T => {
                let (k, v) = (typed::<T>(k, graph, at)?, typed::<T>(v, graph, at)?);
                let scratch = (work.scores.as_mut_slice(), work.row.as_mut_slice());
                causal_attention::<T>(t.read(graph, q)?, k, v, geometry, scratch, out.typed()?);
                Ok(())
            })
        };
        let bytes = |bytes, arg| Values::of_bytes(bytes, dtype).ok_or_else(|| misaligned(arg, dtype));
        match homes {
            (Home::State(ks), Home::State(vs)) => run(t.state[ks].values(), t.state[vs].values(), &mut out),
            (Home::State(ks), Home::Arg(va)) => {
                let ([vb], []) = args.borrow([va], [])?;
                run(t.state[ks].values(), bytes(vb, va)?, &mut out)
            }
            (Home::Arg(ka), Home::State(vs)) => {
                let ([kb], []) = args.borrow([ka], [])?;
                run(bytes(kb, ka)?, t.state[vs].values(), &mut out)
            }
            (Home::Arg(ka), Home::Arg(va)) => {
                let ([kb, vb], []) = args.borrow([ka, va], [])?;
                run(bytes(kb, ka)?, bytes(vb, va)?, &mut out)
            }
        }
    }
}

/// A cache's values as `T`, the op's float type.
fn typed<'a, T: Typed>(values: Values<'a>, graph: &Graph, at: OpAt<'_>) -> Result<&'a [T], Error> {
    values.typed().ok_or_else(|| wrong_type(graph.tensor(at.op.output())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ref_graph::half::f16;

    /// Scratch of attention over `len` rows of heads of `dh`.
    struct Work(Vec<f32>, Vec<f32>);

    impl Work {
        fn get(&mut self) -> (&mut [f32], &mut [f32]) {
            (&mut self.0, &mut self.1)
        }
    }

    fn work(len: usize, dh: usize) -> Work {
        Work(vec![0.0; len], vec![0.0; dh])
    }

    fn values(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 + 1.0) * seed).sin()).collect()
    }

    #[test]
    fn token_major_and_head_major_updates_write_the_same_rows() {
        let shape = CacheShape::of(&[1, 2, 3, 2]);
        assert_eq!(shape, CacheShape { heads: 2, len: 3, head_dim: 2 });
        let expected = [9.0, 9.0, 1.0, 2.0, 5.0, 6.0, 9.0, 9.0, 3.0, 4.0, 7.0, 8.0];
        // Two rows at position 1. Token-major [T, H * Dh]: row t = [h0 (2 values), h1 (2 values)].
        let mut cache = [9.0; 12];
        let token_major = Rows::of(&[2, 4], 2);
        kv_cache_update(&mut cache, shape, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], token_major, 1);
        assert_eq!(cache, expected);
        // Head-major [1, H, T, Dh]: head h = [t0 (2 values), t1 (2 values)].
        let mut cache = [9.0; 12];
        let head_major = Rows::of(&[1, 2, 2, 2], 2);
        assert!(head_major.head_major && head_major.rows == 2 && head_major.heads == 2);
        kv_cache_update(&mut cache, shape, &[1.0, 2.0, 5.0, 6.0, 3.0, 4.0, 7.0, 8.0], head_major, 1);
        assert_eq!(cache, expected);
    }

    #[test]
    fn causal_attention_sees_only_rows_up_to_its_position() {
        let cache = CacheShape { heads: 1, len: 3, head_dim: 1 };
        let (k, v) = ([0.0f32; 3], [1.0f32, 3.0, 100.0]);
        let mut out = [0.0f32; 2];
        // Equal scores: query 0 at position 0 averages row 0; query 1 averages rows 0 and 1; row 2 is unseen.
        let at = Attention { cache, queries: Rows::of(&[2, 1], 1), position: 0, scale: 1.0, softcap: None };
        causal_attention(&[1.0f32, 1.0], &k, &v, at, work(3, 1).get(), &mut out);
        assert_eq!(out, [1.0, 2.0]);
    }

    #[test]
    fn causal_attention_weights_by_softmax_of_scaled_scores() {
        let cache = CacheShape { heads: 1, len: 2, head_dim: 4 };
        let k = [1.0f32, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let v = [1.0f32, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0];
        let mut out = [0.0f32; 4];
        for (scale, score) in [(0.5, 1.0f32), (1.5, 3.0)] {
            // scores = [2 * scale, 0]; 0.5 is the default 1 / sqrt(4).
            let at = Attention { cache, queries: Rows::of(&[1, 4], 4), position: 1, scale, softcap: None };
            causal_attention(&[2.0f32, 0.0, 0.0, 0.0], &k, &v, at, work(2, 4).get(), &mut out);
            let w0 = score.exp() / (score.exp() + 1.0);
            assert!((out[0] - w0).abs() < 1e-6 && (out[1] - (1.0 - w0)).abs() < 1e-6, "{out:?}");
        }
    }

    #[test]
    fn a_softcap_caps_the_scaled_scores_before_the_softmax() {
        let cache = CacheShape { heads: 1, len: 2, head_dim: 4 };
        let k = [1.0f32, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        let v = [1.0f32, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0];
        let q = [2.0f32, 0.0, 0.0, 0.0];
        // scores = [2 * 1.5, 0] = [3, 0]; capped at 2: [2 tanh(1.5), 0] (Gemma 2's tanh(s / c) * c).
        let mut out = [0.0f32; 4];
        let capped =
            Attention { cache, queries: Rows::of(&[1, 4], 4), position: 1, scale: 1.5, softcap: Some(2.0) };
        causal_attention(&q, &k, &v, capped, work(2, 4).get(), &mut out);
        let score = 2.0 * 1.5f32.tanh();
        let w0 = score.exp() / (score.exp() + 1.0);
        assert!((out[0] - w0).abs() < 1e-6 && (out[1] - (1.0 - w0)).abs() < 1e-6, "{out:?}");
        // Without the cap the weights differ (the attribute is not ignored).
        let mut plain = [0.0f32; 4];
        causal_attention(&q, &k, &v, Attention { softcap: None, ..capped }, work(2, 4).get(), &mut plain);
        assert!((plain[0] - out[0]).abs() > 0.05, "{plain:?} vs {out:?}");
    }

    #[test]
    fn grouped_query_attention_equals_attention_over_repeated_caches() {
        // Hq = 4 query heads over Hkv = 2 KV heads, L = 3, Dh = 2, two queries at position 1.
        let (hq, hkv, len, dh) = (4, 2, 3, 2);
        let (k, v, q) = (values(hkv * len * dh, 0.7), values(hkv * len * dh, 1.3), values(2 * hq * dh, 2.1));
        let mut grouped = vec![0.0f32; q.len()];
        let at = Attention {
            cache: CacheShape { heads: hkv, len, head_dim: dh },
            queries: Rows::of(&[2, (hq * dh) as u64], dh),
            position: 1,
            scale: 0.5,
            softcap: None,
        };
        causal_attention(&q, &k, &v, at, work(len, dh).get(), &mut grouped);
        // The caches with each KV head repeated Hq / Hkv times (what `repeat_kv` materialises).
        let repeat =
            |c: &[f32]| -> Vec<f32> { c.chunks(len * dh).flat_map(|head| [head, head].concat()).collect() };
        let mut repeated = vec![0.0f32; q.len()];
        let at_repeated = Attention { cache: CacheShape { heads: hq, len, head_dim: dh }, ..at };
        causal_attention(&q, &repeat(&k), &repeat(&v), at_repeated, work(len, dh).get(), &mut repeated);
        assert_eq!(grouped, repeated);
        // And a differently grouped reading (head h on KV head h % Hkv) would differ: the test can fail.
        let swapped: Vec<f32> = [&k[len * dh..], &k[..len * dh]].concat();
        let mut other = vec![0.0f32; q.len()];
        causal_attention(&q, &swapped, &v, at, work(len, dh).get(), &mut other);
        assert_ne!(grouped, other);
    }

    #[test]
    fn head_major_queries_give_head_major_outputs_of_the_same_values() {
        let (heads, len, dh, rows) = (2, 4, 2, 3);
        let (k, v) = (values(heads * len * dh, 0.3), values(heads * len * dh, 0.9));
        let token_major = values(rows * heads * dh, 1.7); // [T, H * Dh]
                                                          // The same queries as [1, H, T, Dh].
        let mut head_major = vec![0.0f32; token_major.len()];
        let (tm, hm) = (Rows::of(&[3, 4], dh), Rows::of(&[1, 2, 3, 2], dh));
        for t in 0..rows {
            for h in 0..heads {
                head_major[hm.offset(t, h)..][..dh].copy_from_slice(&token_major[tm.offset(t, h)..][..dh]);
            }
        }
        let cache = CacheShape { heads, len, head_dim: dh };
        let (mut out_tm, mut out_hm) = (vec![0.0f32; 12], vec![0.0f32; 12]);
        let at = Attention { cache, queries: tm, position: 0, scale: 0.7, softcap: None };
        causal_attention(&token_major, &k, &v, at, work(len, dh).get(), &mut out_tm);
        causal_attention(
            &head_major,
            &k,
            &v,
            Attention { queries: hm, ..at },
            work(len, dh).get(),
            &mut out_hm,
        );
        for t in 0..rows {
            for h in 0..heads {
                assert_eq!(out_tm[tm.offset(t, h)..][..dh], out_hm[hm.offset(t, h)..][..dh], "t {t} h {h}");
            }
        }
    }

    #[test]
    fn f16_attention_is_the_f32_result_rounded_once() {
        let (len, dh) = (3, 4);
        let half = |x: Vec<f32>| -> Vec<f16> { x.into_iter().map(f16::from_f32).collect() };
        let (k, v, q) = (half(values(len * dh, 0.4)), half(values(len * dh, 1.1)), half(values(2 * dh, 2.3)));
        let widen = |x: &[f16]| -> Vec<f32> { x.iter().map(|v| v.to_f32()).collect() };
        let at = Attention {
            cache: CacheShape { heads: 1, len, head_dim: dh },
            queries: Rows::of(&[2, 4], dh),
            position: 1,
            scale: 0.5,
            softcap: None,
        };
        let mut wide = vec![0.0f32; q.len()];
        causal_attention(&widen(&q), &widen(&k), &widen(&v), at, work(len, dh).get(), &mut wide);
        let mut narrow = vec![f16::ZERO; q.len()];
        causal_attention(&q, &k, &v, at, work(len, dh).get(), &mut narrow);
        assert_eq!(narrow, half(wide));
    }
}
