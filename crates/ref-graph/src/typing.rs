//! The typing rule of every op ([`Op`]'s docs are the specification): the element type and shape of its
//! output given its operands' declarations, or a message naming the operand that does not fit.

use std::fmt;

use crate::{ElemType, Error, Op, TensorDecl, TensorId};

/// The shape NumPy's broadcasting rule gives two operand shapes, or `None` when they do not broadcast: the
/// shapes are aligned at their last axis, a missing leading axis counts as 1, and at each axis the extents
/// are equal or one of them is 1 (which stretches to the other). The rule of [`Op::Add`], [`Op::Sub`],
/// [`Op::Mul`] and [`Op::Div`], for executors to share.
///
/// ```
/// use ref_graph::broadcast_shape;
///
/// assert_eq!(broadcast_shape(&[1, 4], &[]), Some(vec![1, 4]));
/// assert_eq!(broadcast_shape(&[2, 1, 4], &[3, 1]), Some(vec![2, 3, 4]));
/// assert_eq!(broadcast_shape(&[2, 4], &[3, 4]), None);
/// ```
pub fn broadcast_shape(a: &[u64], b: &[u64]) -> Option<Vec<u64>> {
    let rank = a.len().max(b.len());
    let extent = |s: &[u64], i: usize| if i < rank - s.len() { 1 } else { s[i - (rank - s.len())] };
    (0..rank)
        .map(|i| match (extent(a, i), extent(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// The rank an operand must have.
#[derive(Clone, Copy)]
enum Rank {
    /// Exactly this rank.
    Is(usize),
    /// At least this rank (0: any).
    AtLeast(usize),
}

impl Rank {
    fn admits(self, rank: usize) -> bool {
        match self {
            Rank::Is(r) => rank == r,
            Rank::AtLeast(r) => rank >= r,
        }
    }
}

impl fmt::Display for Rank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Rank::Is(r) => write!(f, " of rank {r}"),
            Rank::AtLeast(0) => Ok(()),
            Rank::AtLeast(r) => write!(f, " of rank at least {r}"),
        }
    }
}

/// An inferred output: element type and shape.
type Typed = Result<(ElemType, Vec<u64>), String>;

impl Op<TensorId> {
    /// The element type and shape the op's output must have, given its operands' declarations; the
    /// message says which operand does not fit.
    pub(crate) fn infer(&self, tensors: &[TensorDecl]) -> Typed {
        let mut t = Typer { tensors, floats: FloatOperands { tensors, first: None } };
        match self {
            Op::Gather { table, indices, .. } => t.gather(*table, *indices),
            Op::Positions { position, count, .. } => {
                t.position(*position)?;
                if *count == 0 {
                    return Err("attribute 'count' must be at least 1".to_owned());
                }
                Ok((ElemType::I64, vec![*count]))
            }
            Op::MatMul { a, b, transpose_b, bias, .. } => t.mat_mul(*a, *b, *transpose_b, *bias),
            Op::Add { a, b, .. } | Op::Sub { a, b, .. } | Op::Mul { a, b, .. } => t.elementwise(*a, *b, true),
            Op::Div { a, b, .. } => t.elementwise(*a, *b, false),
            Op::Unary { input, .. } => {
                let shape = t.floats.operand("input", *input, Rank::AtLeast(0))?;
                Ok((t.floats.dtype(), shape.to_vec()))
            }
            Op::Mean { input, .. } => {
                let mut shape = t.floats.operand("input", *input, Rank::AtLeast(1))?.to_vec();
                shape.pop();
                shape.push(1);
                Ok((t.floats.dtype(), shape))
            }
            Op::Cast { input, dtype, .. } => Ok((*dtype, tensors[input.0].shape.clone())),
            Op::Reshape { input, shape, .. } => t.reshape(*input, shape),
            Op::Permute { input, dims, .. } => t.permute(*input, dims),
            Op::Slice { input, axis, start, end, .. } => t.slice(*input, *axis, *start, *end),
            Op::Concat { a, b, axis, .. } => t.concat(*a, *b, *axis),
            Op::RmsNorm { input, weight, eps, .. } => t.rms_norm(*input, *weight, *eps),
            Op::KvCacheUpdate { cache, update, position, .. } => {
                t.kv_cache_update(*cache, *update, *position)
            }
            Op::CausalAttention { q, k, v, position, scale, softcap, .. } => {
                t.causal_attention(*q, *k, *v, *position, [("scale", *scale), ("softcap", *softcap)])
            }
            Op::Argmax { input, .. } => {
                t.floats.operand("input", *input, Rank::AtLeast(2))?;
                Ok((ElemType::I64, vec![1]))
            }
            Op::Assign { target, value, .. } => t.assign(*target, *value),
        }
    }

    /// Checks the operands' types and that the declared output matches [`Op::infer`].
    pub(crate) fn check_types(&self, index: usize, tensors: &[TensorDecl]) -> Result<(), Error> {
        let mismatch = |detail: String| Error::OpMismatch { index, op: self.name(), detail };
        let (dtype, shape) = self.infer(tensors).map_err(mismatch)?;
        let out = &tensors[self.output().0];
        if out.dtype != dtype || out.shape != shape {
            return Err(mismatch(format!(
                "output '{}' is declared {} {:?}, but the op computes {dtype} {shape:?}",
                out.name, out.dtype, out.shape
            )));
        }
        Ok(())
    }
}

/// The operand declarations of one op being typed.
struct Typer<'a> {
    tensors: &'a [TensorDecl],
    floats: FloatOperands<'a>,
}

impl<'a> Typer<'a> {
    fn name(&self, id: TensorId) -> &'a str {
        &self.tensors[id.0].name
    }

    /// An operand of element type `dtype` and rank `rank`.
    fn decl(&self, role: &str, id: TensorId, dtype: ElemType, rank: Rank) -> Result<&'a [u64], String> {
        let t = &self.tensors[id.0];
        if t.dtype != dtype || !rank.admits(t.shape.len()) {
            return Err(format!(
                "operand '{role}' ('{}') is {} {:?}, expected {dtype}{rank}",
                t.name, t.dtype, t.shape
            ));
        }
        Ok(&t.shape)
    }

    /// A position operand: `i64 [1]`.
    fn position(&self, id: TensorId) -> Result<(), String> {
        let s = self.decl("position", id, ElemType::I64, Rank::Is(1))?;
        if s != [1] {
            return Err(format!("operand 'position' ('{}') has shape {s:?}, expected [1]", self.name(id)));
        }
        Ok(())
    }

    fn gather(&mut self, table: TensorId, indices: TensorId) -> Typed {
        let table = self.floats.operand("table", table, Rank::Is(2))?;
        let mut shape = self.decl("indices", indices, ElemType::I64, Rank::AtLeast(1))?.to_vec();
        shape.push(table[1]);
        Ok((self.floats.dtype(), shape))
    }

    fn mat_mul(&mut self, a: TensorId, b: TensorId, transpose_b: bool, bias: Option<TensorId>) -> Typed {
        let sa = self.floats.operand("a", a, Rank::AtLeast(2))?;
        let sb = self.floats.operand("b", b, Rank::Is(2))?;
        let (k, n) = if transpose_b { (sb[1], sb[0]) } else { (sb[0], sb[1]) };
        let (rows, inner) = sa.split_at(sa.len() - 1);
        if inner[0] != k {
            let layout = if transpose_b { " (transposed: [N, K])" } else { "" };
            return Err(format!(
                "inner extents differ: '{}' is {sa:?} and '{}' is {sb:?}{layout}",
                self.name(a),
                self.name(b)
            ));
        }
        if let Some(bias) = bias {
            let s = self.floats.operand("bias", bias, Rank::Is(1))?;
            if s[0] != n {
                return Err(format!(
                    "operand 'bias' ('{}') is {} {s:?}, expected [{n}] (the output columns of '{}' {sb:?})",
                    self.name(bias),
                    self.tensors[bias.0].dtype,
                    self.name(b)
                ));
            }
        }
        let mut shape = rows.to_vec();
        shape.push(n);
        Ok((self.floats.dtype(), shape))
    }

    /// `add`, `sub`, `mul` (`allow_i64`) and `div`: one element type, broadcast shapes.
    fn elementwise(&mut self, a: TensorId, b: TensorId, allow_i64: bool) -> Typed {
        let (ta, tb) = (&self.tensors[a.0], &self.tensors[b.0]);
        let (sa, sb) = if allow_i64 && ta.dtype == ElemType::I64 {
            if tb.dtype != ElemType::I64 {
                return Err(format!(
                    "operand 'b' ('{}') is {} {:?}, but operand 'a' ('{}') is i64: both operands have one \
                     element type",
                    tb.name, tb.dtype, tb.shape, ta.name
                ));
            }
            (ta.shape.as_slice(), tb.shape.as_slice())
        } else {
            let sa = self.floats.operand("a", a, Rank::AtLeast(0))?;
            (sa, self.floats.operand("b", b, Rank::AtLeast(0))?)
        };
        let shape = broadcast_shape(sa, sb).ok_or_else(|| {
            format!("shapes do not broadcast: '{}' is {sa:?} and '{}' is {sb:?}", ta.name, tb.name)
        })?;
        Ok((ta.dtype, shape))
    }

    /// `value` must have `target`'s element type and shape; the output is `target` again.
    fn assign(&self, target: TensorId, value: TensorId) -> Typed {
        let (t, v) = (&self.tensors[target.0], &self.tensors[value.0]);
        if t.dtype != v.dtype || t.shape != v.shape {
            return Err(format!(
                "operand 'value' ('{}') is {} {:?}, but target '{}' is {} {:?} (an assign writes the same type \
                 and shape)",
                v.name, v.dtype, v.shape, t.name, t.dtype, t.shape
            ));
        }
        Ok((t.dtype, t.shape.clone()))
    }

    fn reshape(&self, input: TensorId, shape: &[u64]) -> Typed {
        let t = &self.tensors[input.0];
        let numel = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d));
        if shape.contains(&0) || numel != Some(t.shape.iter().product()) {
            return Err(format!(
                "attribute 'shape' {shape:?} does not hold the {} elements of '{}' {:?} (every extent at least 1)",
                t.shape.iter().product::<u64>(),
                t.name,
                t.shape
            ));
        }
        Ok((t.dtype, shape.to_vec()))
    }

    fn permute(&self, input: TensorId, dims: &[u64]) -> Typed {
        let t = &self.tensors[input.0];
        let rank = t.shape.len();
        let mut seen = vec![false; rank];
        let is_permutation = dims.len() == rank
            && dims.iter().all(|&d| {
                let fresh = usize::try_from(d).ok().filter(|&d| d < rank).is_some_and(|d| !seen[d]);
                if fresh {
                    seen[d as usize] = true;
                }
                fresh
            });
        if !is_permutation {
            return Err(format!(
                "attribute 'dims' {dims:?} is not a permutation of 0..{rank} (the axes of '{}' {:?})",
                t.name, t.shape
            ));
        }
        Ok((t.dtype, dims.iter().map(|&d| t.shape[d as usize]).collect()))
    }

    fn slice(&self, input: TensorId, axis: u64, start: u64, end: u64) -> Typed {
        let t = &self.tensors[input.0];
        let Some(extent) = self.axis_extent(t, axis) else {
            return Err(format!(
                "attribute 'axis' is {axis}, but '{}' {:?} has rank {}",
                t.name,
                t.shape,
                t.shape.len()
            ));
        };
        if !(start < end && end <= extent) {
            return Err(format!(
                "slice {start}..{end} of axis {axis} of '{}' {:?} is not within 0..{extent} and non-empty",
                t.name, t.shape
            ));
        }
        let mut shape = t.shape.clone();
        shape[axis as usize] = end - start;
        Ok((t.dtype, shape))
    }

    fn axis_extent(&self, t: &TensorDecl, axis: u64) -> Option<u64> {
        usize::try_from(axis).ok().and_then(|axis| t.shape.get(axis)).copied()
    }

    fn concat(&self, a: TensorId, b: TensorId, axis: u64) -> Typed {
        let (ta, tb) = (&self.tensors[a.0], &self.tensors[b.0]);
        if ta.dtype != tb.dtype {
            return Err(format!(
                "operand 'b' ('{}') is {}, but operand 'a' ('{}') is {}: concat joins one element type",
                tb.name, tb.dtype, ta.name, ta.dtype
            ));
        }
        let Some(extent) = self.axis_extent(ta, axis) else {
            return Err(format!(
                "attribute 'axis' is {axis}, but '{}' {:?} has rank {}",
                ta.name,
                ta.shape,
                ta.shape.len()
            ));
        };
        let axis = axis as usize;
        let fits = tb.shape.len() == ta.shape.len()
            && ta.shape.iter().zip(&tb.shape).enumerate().all(|(i, (x, y))| i == axis || x == y);
        if !fits {
            return Err(format!(
                "'{}' {:?} and '{}' {:?} differ in rank or in an extent other than axis {axis}",
                ta.name, ta.shape, tb.name, tb.shape
            ));
        }
        let mut shape = ta.shape.clone();
        shape[axis] = extent + tb.shape[axis];
        Ok((ta.dtype, shape))
    }

    fn rms_norm(&mut self, input: TensorId, weight: TensorId, eps: f32) -> Typed {
        let si = self.floats.operand("input", input, Rank::AtLeast(1))?;
        let sw = self.floats.operand("weight", weight, Rank::Is(1))?;
        let d = si[si.len() - 1];
        if sw[0] != d {
            return Err(format!(
                "weight '{}' has {} columns, input '{}' has {d}",
                self.name(weight),
                sw[0],
                self.name(input)
            ));
        }
        if !(eps.is_finite() && eps > 0.0) {
            return Err(format!("attribute 'eps' is {eps}, expected a finite positive number"));
        }
        Ok((self.floats.dtype(), si.to_vec()))
    }

    /// A cache operand, `[H, L, Dh]` or `[1, H, L, Dh]`: its `(H, L, Dh)`.
    fn cache(&mut self, role: &'static str, id: TensorId) -> Result<[u64; 3], String> {
        let s = self.floats.operand(role, id, Rank::AtLeast(3))?;
        match *s {
            [h, l, dh] | [1, h, l, dh] => Ok([h, l, dh]),
            _ => Err(format!(
                "operand '{role}' ('{}') is {} {s:?}, expected a cache [H, L, Dh] or [1, H, L, Dh]",
                self.name(id),
                self.tensors[id.0].dtype
            )),
        }
    }

    fn kv_cache_update(&mut self, cache: TensorId, update: TensorId, position: TensorId) -> Typed {
        let [h, l, dh] = self.cache("cache", cache)?;
        let sc = &self.tensors[cache.0].shape;
        let su = self.floats.operand("update", update, Rank::AtLeast(2))?;
        self.position(position)?;
        let rows = match *su {
            [t, cols] if cols == h * dh => Some(t),
            [hu, t, du] if sc.len() == 3 && hu == h && du == dh => Some(t),
            [1, hu, t, du] if sc.len() == 4 && hu == h && du == dh => Some(t),
            _ => None,
        };
        match rows {
            Some(t) if t <= l => Ok((self.floats.dtype(), sc.clone())),
            _ => Err(format!(
                "update '{}' is {su:?}, but cache '{}' {sc:?} takes token-major [T, {}] or head-major {} rows \
                 with T <= {l}",
                self.name(update),
                self.name(cache),
                h * dh,
                head_major(sc.len(), h, dh)
            )),
        }
    }

    fn causal_attention(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        position: TensorId,
        attributes: [(&str, Option<f32>); 2],
    ) -> Typed {
        let sq = self.floats.operand("q", q, Rank::AtLeast(2))?;
        let [hkv, l, dh] = self.cache("k", k)?;
        self.cache("v", v)?;
        let (sk, sv) = (&self.tensors[k.0].shape, &self.tensors[v.0].shape);
        self.position(position)?;
        if sk != sv {
            return Err(format!(
                "caches differ: '{}' is {sk:?} and '{}' is {sv:?}",
                self.name(k),
                self.name(v)
            ));
        }
        let heads_and_rows = match *sq {
            [t, cols] if cols % dh == 0 => Some((cols / dh, t)),
            [hq, t, d] if sk.len() == 3 && d == dh => Some((hq, t)),
            [1, hq, t, d] if sk.len() == 4 && d == dh => Some((hq, t)),
            _ => None,
        };
        let Some((hq, _)) = heads_and_rows.filter(|&(_, t)| t <= l) else {
            return Err(format!(
                "queries '{}' are {sq:?}, but caches {sk:?} take token-major [T, Hq * {dh}] or head-major {} \
                 queries with T <= {l}",
                self.name(q),
                head_major(sk.len(), "Hq", dh)
            ));
        };
        if hq % hkv != 0 {
            return Err(format!(
                "grouped-query attention needs the query heads (Hq) to be a multiple of the KV heads (Hkv): \
                 queries '{}' {sq:?} have Hq = {hq}, caches {sk:?} have Hkv = {hkv}",
                self.name(q)
            ));
        }
        for (attribute, value) in attributes {
            if let Some(value) = value.filter(|s| !(s.is_finite() && *s > 0.0)) {
                return Err(format!("attribute '{attribute}' is {value}, expected a finite positive number"));
            }
        }
        Ok((self.floats.dtype(), sq.to_vec()))
    }
}

/// `[H, T, Dh]` or `[1, H, T, Dh]` as text, for a cache of rank `cache_rank`.
fn head_major(cache_rank: usize, heads: impl fmt::Display, dh: u64) -> String {
    let lead = if cache_rank == 4 { "1, " } else { "" };
    format!("[{lead}{heads}, T, {dh}]")
}

/// The float operands of one op: each must be `f32`, `f16` or `bf16` of its rank, and all of the same float
/// type (the first one's), which the op's float output takes.
struct FloatOperands<'a> {
    tensors: &'a [TensorDecl],
    first: Option<(&'static str, TensorId)>,
}

impl<'a> FloatOperands<'a> {
    fn operand(&mut self, role: &'static str, id: TensorId, rank: Rank) -> Result<&'a [u64], String> {
        let t = &self.tensors[id.0];
        if !t.dtype.is_float() || !rank.admits(t.shape.len()) {
            return Err(format!(
                "operand '{role}' ('{}') is {} {:?}, expected f32, f16 or bf16{rank}",
                t.name, t.dtype, t.shape
            ));
        }
        match self.first {
            None => self.first = Some((role, id)),
            Some((first_role, first)) => {
                let f = &self.tensors[first.0];
                if f.dtype != t.dtype {
                    return Err(format!(
                        "operand '{role}' ('{}') is {}, but operand '{first_role}' ('{}') is {}: the float \
                         operands of one op share one float type",
                        t.name, t.dtype, f.name, f.dtype
                    ));
                }
            }
        }
        Ok(&t.shape)
    }

    /// The float type of the operands seen (`f32` if none).
    fn dtype(&self) -> ElemType {
        self.first.map_or(ElemType::F32, |(_, id)| self.tensors[id.0].dtype)
    }
}
