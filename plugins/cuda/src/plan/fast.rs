//! The lowering state and the fast path: the fused launches of a decode step (see the parent module), and
//! the dispatch of every other op to [`super::general`].

mod bias;
mod partial;
mod spelled;
mod split;

use ref_graph::{Graph, Op, TensorId, UnaryFn};

use super::canon::Canon;
use super::{
    attention_splits, gelu, general, layer_norm, rope, u32_of, AttnScratch, AttnShape, BinOp, CacheRows,
    Float, GemvMat, Home, KvLayout, Norm, Plan, PositionRows, RopeTables, Step, Unsupported, WeightRows,
};
use crate::kernels::ATTN_MAX_HEAD;

/// A plan being built: the graph in its canonical form, where each tensor lives, the steps so far and the
/// scratch they need.
pub(super) struct Lowering<'g> {
    pub(super) graph: &'g Graph,
    canon: Canon,
    /// Per value: reads that a fused step merged into one (the value counts as read that many times fewer).
    merged_reads: Vec<usize>,
    pub(super) homes: Vec<Home>,
    pub(super) steps: Vec<Step>,
    attn_scratch: AttnScratch,
    /// The graph's RoPEs, and which ops they absorb (lowered as nothing).
    ropes: Vec<rope::Rope>,
    /// The graph's GELUs spelled in their tanh form (the ops before the last absorbed like a RoPE's).
    gelus: Vec<gelu::Gelu>,
    /// The graph's LayerNorms spelled in f32 between casts (the ops before the last cast absorbed).
    layer_norms: Vec<layer_norm::SpelledNorm>,
    absorbed: Vec<bool>,
    /// Norms that only products read, of several GEMVs (a parallel block's attention and MLP): the norm's
    /// output, its input and the norm, done inside each of those GEMVs.
    shared_norms: Vec<(TensorId, TensorId, Norm)>,
}

impl<'g> Lowering<'g> {
    pub(super) fn new(graph: &'g Graph) -> Lowering<'g> {
        let mut homes = vec![Home::Scratch; graph.tensors().len()];
        for (index, (id, _)) in graph.constants().enumerate() {
            homes[id.0] = Home::Constant(index);
        }
        for &id in graph.inputs().iter().chain(graph.outputs()) {
            homes[id.0] = Home::Io;
        }
        let canon = Canon::new(graph);
        for (id, &value) in canon.value.iter().enumerate() {
            if value.0 != id {
                homes[id] = Home::SameAs(value);
            }
        }
        let mut l = Lowering {
            graph,
            canon,
            merged_reads: vec![0; graph.tensors().len()],
            homes,
            steps: Vec::new(),
            attn_scratch: AttnScratch::default(),
            ropes: Vec::new(),
            gelus: Vec::new(),
            layer_norms: Vec::new(),
            shared_norms: Vec::new(),
            absorbed: vec![false; graph.ops().len()],
        };
        l.ropes = rope::find(&l);
        for r in l.ropes.clone() {
            for &i in &r.absorbed {
                l.absorbed[i] = true;
                // Never written or read: no allocation (the storage named is the RoPE's output's).
                l.rehome(graph.ops()[i].output(), r.out);
            }
        }
        l.gelus = gelu::find(&l);
        for g in l.gelus.clone() {
            for &i in &g.absorbed {
                l.absorbed[i] = true;
                l.rehome(graph.ops()[i].output(), g.out);
            }
            // Four reads of `x` (the half, the square, the cube, the sum) are now the GELU's one.
            l.merged_reads[l.canon.value[g.x.0].0] += 3;
        }
        l.layer_norms = layer_norm::find(&l);
        for n in l.layer_norms.clone() {
            for &i in &n.absorbed {
                l.absorbed[i] = true;
                l.rehome(graph.ops()[i].output(), n.out);
            }
        }
        l
    }

    pub(super) fn finish(self) -> Plan {
        let dtypes: Vec<_> = self.graph.tensors().iter().map(|t| t.dtype).collect();
        let mut floats: Vec<Float> =
            self.steps.iter().filter_map(|s| s.typed_by()).filter_map(|id| Float::of(dtypes[id.0])).collect();
        floats.sort();
        floats.dedup();
        let transposed = self.transposed();
        Plan {
            floats,
            dtypes,
            homes: self.homes,
            steps: self.steps,
            transposed,
            attn_scratch: self.attn_scratch,
        }
    }

    /// The constants GEMVs read transposed, each once, with whether anything else reads them as they are
    /// (another op, or the graph's outputs).
    fn transposed(&self) -> Vec<(TensorId, bool)> {
        let mut weights: Vec<TensorId> = self
            .steps
            .iter()
            .filter_map(|s| if let Step::Gemv { mats, .. } = s { Some(mats) } else { None })
            .flatten()
            .filter(|mat| mat.transposed)
            .map(|mat| mat.w)
            .collect();
        weights.sort_by_key(|id| id.0);
        weights.dedup();
        let as_stored = |w: TensorId| {
            self.is_output(w)
                || self.graph.ops().iter().any(|op| match *op {
                    Op::MatMul { a, transpose_b: false, bias, .. } => a == w || bias == Some(w),
                    ref other => other.operands().contains(&w),
                })
        };
        weights.into_iter().map(|w| (w, as_stored(w))).collect()
    }

    /// The op producing each tensor of the graph (indexed by tensor id; `None` for inputs and constants).
    pub(super) fn producers(&self) -> Vec<Option<usize>> {
        let mut producer = vec![None; self.graph.tensors().len()];
        for (i, op) in self.graph.ops().iter().enumerate() {
            producer[op.output().0] = Some(i);
        }
        producer
    }

    pub(super) fn shape(&self, id: TensorId) -> &'g [u64] {
        &self.graph.tensor(id).shape
    }

    /// How many ops read `id`'s value (under any of its names; views are names, not readers).
    pub(super) fn uses(&self, id: TensorId) -> usize {
        let value = self.canon.value[id.0];
        let reads = |op: &Op<TensorId>| op.operands().iter().any(|&x| self.canon.value[x.0] == value);
        let raw = self.canon.order.iter().filter(|&&i| reads(&self.graph.ops()[i])).count();
        raw - self.merged_reads[value.0].min(raw)
    }

    /// Whether `id`'s value is a graph output (under any of its names).
    pub(super) fn is_output(&self, id: TensorId) -> bool {
        let value = self.canon.value[id.0];
        self.graph.outputs().iter().any(|&o| self.canon.value[o.0] == value)
    }

    /// Whether `a` and `b` name one value.
    pub(super) fn same(&self, a: TensorId, b: TensorId) -> bool {
        self.canon.value[a.0] == self.canon.value[b.0]
    }

    /// The first offset from `k` on of an op after position `p` of the schedule that no fusion took.
    fn live_after(&self, p: usize, k: usize) -> usize {
        let mut k = k;
        while self.canon.order.get(p + k).is_some_and(|&i| self.absorbed[i]) {
            k += 1;
        }
        k
    }

    /// The ops that read `id`'s value (under any of its names) and that no fusion took, in schedule order.
    pub(super) fn live_readers(&self, id: TensorId) -> Vec<usize> {
        let value = self.canon.value[id.0];
        let reads = |op: &Op<TensorId>| op.operands().iter().any(|&x| self.canon.value[x.0] == value);
        self.canon
            .order
            .iter()
            .copied()
            .filter(|&i| !self.absorbed[i] && reads(&self.graph.ops()[i]))
            .collect()
    }

    /// The op `k` places after position `p` of the schedule.
    fn ahead(&self, p: usize, k: usize) -> Option<&'g Op<TensorId>> {
        let graph: &'g Graph = self.graph;
        self.canon.order.get(p + k).map(|&i| &graph.ops()[i])
    }

    /// Ops to lower, in order (see [`Canon`]).
    pub(super) fn scheduled(&self) -> usize {
        self.canon.order.len()
    }

    /// `from` (never written: a fusion computes its value elsewhere) and every name sharing its storage now
    /// share `to`'s.
    pub(super) fn rehome(&mut self, from: TensorId, to: TensorId) {
        let from = Home::root(&self.homes, from);
        let to = Home::root(&self.homes, to);
        if from == to {
            return;
        }
        for home in &mut self.homes {
            if *home == Home::SameAs(from) {
                *home = Home::SameAs(to);
            }
        }
        self.homes[from.0] = Home::SameAs(to);
    }

    /// Read by exactly one op and not a graph output: a tensor a fusion may leave unwritten.
    pub(super) fn private(&self, id: TensorId) -> bool {
        self.uses(id) == 1 && !self.is_output(id)
    }

    /// The float type of a float tensor.
    pub(super) fn float(&self, id: TensorId) -> Result<Float, Unsupported> {
        let t = self.graph.tensor(id);
        Float::of(t.dtype)
            .ok_or_else(|| Unsupported(format!("tensor '{}' is {}, not a float", t.name, t.dtype)))
    }

    /// Lowers the op at position `p` of the schedule (and any it fuses with): how many ops it took.
    pub(super) fn op(&mut self, p: usize) -> Result<usize, Unsupported> {
        let i = self.canon.order[p];
        if self.absorbed[i] {
            return Ok(1);
        }
        if let Some(r) = self.ropes.iter().find(|r| r.add == i).cloned() {
            if !self.fuse_rope(&r) {
                let step = general::rope(self, &r)?;
                self.steps.push(step);
            }
            return Ok(1);
        }
        if let Some(n) = self.layer_norms.iter().find(|n| n.last == i).cloned() {
            let norm = Norm { gain: n.gain, eps: n.eps, centred: true, bias: Some(n.bias) };
            self.norm(n.x, n.out, norm)?;
            return Ok(1);
        }
        if let Some(g) = self.gelus.iter().find(|g| g.last == i).cloned() {
            let t = self.graph.tensor(g.out);
            let (n, dtype) = (t.numel() as u64, t.dtype);
            self.steps.push(Step::Unary { func: UnaryFn::GeluTanh, input: g.x, out: g.out, n, dtype });
            self.fuse_activation();
            return Ok(1);
        }
        let op = &self.graph.ops()[i];
        match *op {
            Op::Gather { .. } => self.gather(p),
            Op::Positions { position, count, out } => {
                if let Some(taken) = self.rope_tables(p, position, count, out)? {
                    return Ok(taken);
                }
                self.steps.push(Step::Positions { position, out, count: u32_of(count, "position count")? });
                Ok(1)
            }
            Op::Add { a, b, out }
                if self.shape(a) == self.shape(b) && Float::of(self.graph.tensor(out).dtype).is_some() =>
            {
                self.steps.push(Step::Add { a, b, out, n: self.graph.tensor(out).numel() as u64 });
                Ok(1)
            }
            Op::RmsNorm { input, weight, eps, out } => {
                self.norm(input, out, Norm { gain: weight, eps, centred: false, bias: None })?;
                Ok(1)
            }
            Op::Mean { input, out } => match self.layer_norm(p, input, out)? {
                Some(taken) => Ok(taken),
                None => self.general(op),
            },
            Op::MatMul { .. } => self.gemv(p),
            Op::KvCacheUpdate { .. } => self.kv_update(p),
            Op::CausalAttention { q, k, v, position, scale, softcap, out } => {
                self.attention(q, k, v, position, (scale, softcap), out)?;
                Ok(1)
            }
            Op::Argmax { input, out } => {
                let n = *self.shape(input).last().unwrap_or(&1);
                let m = self.graph.tensor(input).numel() as u64 / n.max(1);
                let (m, n) = (u32_of(m, "rows")?, u32_of(n, "columns")?);
                self.steps.push(Step::Argmax { input, out, m, n });
                Ok(1)
            }
            Op::Add { a, b, out } if self.counter(a, b, out) => Ok(1),
            Op::Unary { func: UnaryFn::Sigmoid, input, out } => self.silu_of_product(p, input, out),
            Op::Cast { input, out, .. } => self.silu_in_f32(p, input, out),
            Op::Assign { target, value, out } if self.assign_in_place(target, value) => {
                self.homes[out.0] = Home::SameAs(target);
                Ok(1)
            }
            ref other => self.general(other),
        }
    }

    /// `op` on the general path, then SwiGLU or GELU fused into the GEMV before it if that completed one.
    fn general(&mut self, op: &Op<TensorId>) -> Result<usize, Unsupported> {
        general::lower(self, op)?;
        self.fuse_glu();
        self.fuse_activation();
        Ok(1)
    }

    /// When the last two steps are a GEMV of one product, without residual, cache, RoPE or SwiGLU, and
    /// `out = gelu(product)` (either form, of the product's type and size) and nothing else reads the
    /// product: the GEMV stores the GELU into `out` itself (an MLP's up projection and its activation, one
    /// launch).
    fn fuse_activation(&mut self) {
        let Some(&Step::Unary { func: func @ (UnaryFn::Gelu | UnaryFn::GeluTanh), input, out, n, dtype }) =
            self.steps.last()
        else {
            return;
        };
        // The GEMV that computes `input` may be an earlier one (a parallel block's MLP projection, next to
        // the attention's): nothing between reads its product, which only the GELU reads.
        let computes = |s: &Step| match s {
            Step::Gemv { mats, .. } => mats.iter().any(|mat| self.same(mat.y, input)),
            _ => false,
        };
        let Some(at) = self.steps.iter().rposition(computes) else { return };
        let Step::Gemv { ref mats, m, cache_rows: None, glu: None, rope: None, activation: None, .. } =
            self.steps[at]
        else {
            return;
        };
        let [ref mat] = mats[..] else { return };
        let plain = mat.residual.is_none() && mat.cache.is_none() && !mat.roped;
        let alike = self.graph.tensor(mat.y).dtype == dtype && n == u64::from(m) * u64::from(mat.n);
        if !plain || !alike || !self.same(mat.y, input) || !self.private(input) {
            return;
        }
        let product = mat.y;
        self.steps.pop();
        let Some(Step::Gemv { mats, activation, .. }) = self.steps.get_mut(at) else {
            unreachable!("matched above")
        };
        mats[0].y = out;
        *activation = Some(func);
        // Never written or read: no allocation (the storage named is the activation's).
        self.rehome(product, out);
    }

    /// When the last three steps are a GEMV of two matrices writing `gate` and `up` of one width,
    /// `s = silu(gate)` and `out = s * up` (Hugging Face's SwiGLU: contiguous, one float type) and nothing else
    /// reads `gate`, `up` or `s`: the GEMV writes `out` itself (two launches fewer a layer).
    fn fuse_glu(&mut self) {
        let [.., ref gemv, ref unary, ref binary] = self.steps[..] else { return };
        let Step::Gemv { ref mats, m, cache_rows: None, glu: None, .. } = *gemv else { return };
        let Step::Unary { func: UnaryFn::Silu, input: gate, out: s, n, dtype } = *unary else { return };
        let Step::Binary { op: BinOp::Mul, a: x, b: y, out, dtype: dtype2, ref walk } = *binary else {
            return;
        };
        let up = if x == s {
            y
        } else if y == s {
            x
        } else {
            return;
        };
        let computes = |mat: &GemvMat, id: TensorId| self.same(mat.y, id);
        let gate_first = match mats[..] {
            [ref g, ref u] if computes(g, gate) && computes(u, up) => true,
            [ref u, ref g] if computes(g, gate) && computes(u, up) => false,
            _ => return,
        };
        let width = mats[0].n;
        let plain = mats.iter().all(|mat| mat.n == width && mat.residual.is_none() && mat.cache.is_none());
        let elems = u64::from(m) * u64::from(width);
        let contiguous = walk.a == walk.b && walk.b == general::strides(&walk.dims);
        let same_type =
            [gate, up, out].iter().all(|&id| self.graph.tensor(id).dtype == dtype) && dtype2 == dtype;
        let private = [gate, up, s].iter().all(|&id| self.private(id));
        if !plain
            || n != elems
            || walk.dims.iter().product::<u64>() != elems
            || !contiguous
            || self.same(up, s)
        {
            return;
        }
        if !same_type || !private {
            return;
        }
        self.steps.truncate(self.steps.len() - 2);
        let Some(Step::Gemv { mats, glu, .. }) = self.steps.last_mut() else { unreachable!("matched above") };
        if !gate_first {
            mats.swap(0, 1);
        }
        *glu = Some(out);
        // Never written or read: no allocation (the storage named is the product's).
        for id in [gate, up, s] {
            self.rehome(id, out);
        }
    }

    /// A decode step's RoPE of a product of the last GEMV computing it, applied by that GEMV before it stores: when
    /// `x` is the product (or a view sharing its storage) and nothing but views and the RoPE's own ops reads
    /// it, the GEMV computes one row, the product has no residual, cache or SwiGLU and whole heads of the
    /// rotation's width, and the tables are one row of its type (the same as any other rotated product's).
    /// The product is then stored rotated, as the RoPE's output (its own storage never written): whether it
    /// was.
    fn fuse_rope(&mut self, r: &rope::Rope) -> bool {
        let x = Home::root(&self.homes, r.x);
        let width = 2 * r.half;
        let dtype = self.graph.tensor(r.out).dtype;
        let one_row = |id: TensorId| {
            let t = self.graph.tensor(id);
            t.dtype == dtype && t.numel() as u64 == width && t.shape.last() == Some(&width)
        };
        let Ok(half) = u32::try_from(r.half) else { return false };
        // The tables by value: every layer's view of them is one table.
        let value = |id: TensorId| self.canon.value[id.0];
        let tables = RopeTables { cos: value(r.cos), sin: value(r.sin), half, head: 2 * half };
        if !one_row(r.cos) || !one_row(r.sin) || self.graph.tensor(x).dtype != dtype || !self.rope_owns(x, r)
        {
            return false;
        }
        // The GEMV computing `x` may be an earlier one (a parallel block's MLP projection after it): nothing
        // between reads `x`, which the RoPE owns.
        let computes = |s: &Step| matches!(s, Step::Gemv { mats, .. } if mats.iter().any(|mat| mat.y == x));
        let Some(at) = self.steps.iter().rposition(computes) else { return false };
        // Its cache writes may be fused already (Falcon's keys rotate first): the product itself has none.
        let Some(Step::Gemv { mats, m: 1, glu: None, rope, .. }) = self.steps.get_mut(at) else {
            return false;
        };
        let Some(at) = mats.iter().position(|mat| mat.y == x) else { return false };
        // The kernel pairs warps 2j and 2j + 1: the product's first column is an even one of the launch.
        let even_start = mats[..at].iter().map(|mat| mat.n).sum::<u32>() % 2 == 0;
        let mat = &mut mats[at];
        let plain = !mat.roped && mat.residual.is_none() && mat.cache.is_none();
        if !plain || !even_start || u64::from(mat.n) % width != 0 || rope.is_some_and(|t| t != tables) {
            return false;
        }
        mat.roped = true;
        mat.y = r.out;
        *rope = Some(tables);
        // The product and its views are never written: their storage is the rotated output's.
        for home in &mut self.homes {
            if *home == Home::SameAs(x) {
                *home = Home::SameAs(r.out);
            }
        }
        self.homes[x.0] = Home::SameAs(r.out);
        true
    }

    /// Whether the only ops reading `x`'s storage are views of it (whose outputs share it) and `r`'s own,
    /// and no tensor sharing it is a graph output: the RoPE's output may replace it.
    fn rope_owns(&self, x: TensorId, r: &rope::Rope) -> bool {
        let shares = |id: TensorId| Home::root(&self.homes, id) == x;
        let readers_ok = self.graph.ops().iter().enumerate().all(|(i, op)| {
            // An op another fusion took (a slice a GEMV computes itself) reads nothing when the call runs.
            !op.operands().into_iter().any(shares)
                || shares(op.output())
                || r.absorbed.contains(&i)
                || self.absorbed[i]
        });
        readers_ok && !self.graph.outputs().iter().any(|&id| shares(id))
    }

    /// A gather; with the next three ops `positions`, a second gather of them and the sum of both, one
    /// embedding launch (token rows plus the positions' rows).
    fn gather(&mut self, p: usize) -> Result<usize, Unsupported> {
        let Some(&Op::Gather { table, indices, out }) = self.ahead(p, 0) else { unreachable!("a gather") };
        let t = self.shape(table);
        let rows = self.graph.tensor(indices).numel() as u64;
        let dim = t[1];
        let (mut out, mut plus, mut taken) = (out, None, 1);
        if let (
            Some(&Op::Positions { position, count, out: positions }),
            Some(&Op::Gather { table: t2, indices: i2, out: g2 }),
            Some(&Op::Add { a, b, out: sum }),
        ) = (self.ahead(p, 1), self.ahead(p, 2), self.ahead(p, 3))
        {
            let pair = |x: TensorId, y: TensorId| self.same(x, out) && self.same(y, g2);
            if self.same(i2, positions)
                && count == rows
                && self.shape(t2)[1] == dim
                && self.shape(out) == self.shape(g2)
                && (pair(a, b) || pair(b, a))
                && [out, positions, g2].into_iter().all(|id| self.private(id))
            {
                plus =
                    Some(PositionRows { table: t2, position, n: u32_of(self.shape(t2)[0], "table rows")? });
                out = sum;
                taken = 4;
            }
        }
        self.steps.push(Step::Gather {
            table,
            indices,
            out,
            rows: u32_of(rows, "row count")?,
            n: u32_of(t[0], "table rows")?,
            dim: u32_of(dim, "table width")?,
            plus,
        });
        Ok(taken)
    }
}

impl Lowering<'_> {
    /// A product as a GEMV: with its siblings (the next products of the same activation, weights of the same
    /// inner extent and layout), or with the next op's residual `Add`, and with the `RmsNorm` before it when
    /// only these products read the norm.
    fn gemv(&mut self, p: usize) -> Result<usize, Unsupported> {
        let Some(first @ &Op::MatMul { a, transpose_b, .. }) = self.ahead(p, 0) else {
            unreachable!("called for a mat_mul")
        };
        self.float(a)?;
        let k = *self.shape(a).last().unwrap_or(&1);
        let m = self.graph.tensor(a).numel() as u64 / k.max(1);
        let (m, k) = (u32_of(m, "rows")?, u32_of(k, "inner extent")?);
        let mut mats = vec![self.gemv_mat(first)?];
        // Siblings: the next MatMuls reading the same value with weights of the same layout.
        while mats.len() < 3 {
            match self.ahead(p, mats.len()) {
                Some(op @ &Op::MatMul { a: a2, transpose_b: t2, .. })
                    if self.same(a2, a) && t2 == transpose_b =>
                {
                    mats.push(self.gemv_mat(op)?);
                }
                _ => break,
            }
        }
        // A product that slices cut into more matrices than a launch takes is computed alone (its siblings
        // next, in a launch of their own).
        if mats.len() > 1 && !self.has_partial_rotary(&mats[0]) {
            let cut = self.slices_of(self.with_bias(mats[0]), m).map_or(1, |(split, _)| split.len());
            if cut + mats.len() - 1 > 3 {
                mats.truncate(1);
            }
        }
        for mat in &mut mats {
            self.absorb_bias(mat);
        }
        let (mut taken, products) = (mats.len(), mats.len());
        if mats.len() == 1 {
            // The residual's sum, then a parallel residual's second one (`x + attn + mlp`), each the next op
            // not already taken by a fusion (a bias add).
            for _ in 0..2 {
                let next = self.live_after(p, taken);
                if self.residual(&mut mats[0], self.ahead(p, next)) == 0 {
                    break;
                }
                taken = next + 1;
            }
        }
        if let [mat] = mats[..] {
            if let Some(split) = self.split(mat, m) {
                mats = split;
            }
        }
        let rope = self.partial_rotary(&mut mats, m);
        let (a, norm) = self.fused_norm(a, products);
        let early = mats.iter().all(|mat| self.fixed(mat.w) && mat.bias.is_none_or(|b| self.fixed(b)))
            && norm.is_none_or(|n| self.fixed(n.gain) && n.bias.is_none_or(|b| self.fixed(b)));
        let step =
            Step::Gemv { a, norm, mats, cache_rows: None, m, k, early, glu: None, rope, activation: None };
        self.steps.push(step);
        Ok(taken)
    }

    /// One product's matrix: its weight read as `[N, K]` (a `[K, N]` weight must be a constant, transposed at
    /// upload).
    fn gemv_mat(&self, op: &Op<TensorId>) -> Result<GemvMat, Unsupported> {
        let Op::MatMul { b, transpose_b, bias, out, .. } = *op else { unreachable!("called for a mat_mul") };
        self.float(out)?;
        if !transpose_b && self.graph.constant(b).is_none() {
            return Err(Unsupported(format!(
                "mat_mul '{}' multiplies by '{}', computed in the graph; the CUDA delegate multiplies by \
                 constant [K, N] weights or by [N, K] ones (transpose_b)",
                self.graph.tensor(out).name,
                self.graph.tensor(b).name
            )));
        }
        let n = self.shape(b)[usize::from(!transpose_b)];
        Ok(GemvMat {
            w: b,
            transposed: !transpose_b,
            n: u32_of(n, "columns")?,
            y: out,
            bias,
            residual: None,
            residual2: None,
            cache: None,
            roped: false,
            rows: WeightRows::all(u32_of(n, "columns")?),
        })
    }

    /// A lone product feeding only `next`, an `Add` of equal shapes with it, becomes that Add's output (the
    /// product's own tensor, never written, takes the sum's storage): how many ops that took (0 or 1).
    fn residual(&mut self, mat: &mut GemvMat, next: Option<&Op<TensorId>>) -> usize {
        let out = mat.y;
        let Some(&Op::Add { a: x, b: y, out: sum }) = next else { return 0 };
        if !self.private(out) {
            return 0;
        }
        let other = if self.same(x, out) {
            y
        } else if self.same(y, out) {
            x
        } else {
            return 0;
        };
        let numel = |id: TensorId| self.graph.tensor(id).numel();
        if self.same(other, out) || self.shape(other) != self.shape(sum) || numel(out) != numel(sum) {
            return 0;
        }
        // The product itself is never stored: no allocation for it.
        self.rehome(out, sum);
        *mat = match mat.residual {
            None => GemvMat { y: sum, residual: Some(other), ..*mat },
            Some(_) => GemvMat { y: sum, residual2: Some(other), ..*mat },
        };
        1
    }

    /// `input` normalised over its last axis into `out`: one step.
    pub(super) fn norm(&mut self, input: TensorId, out: TensorId, norm: Norm) -> Result<(), Unsupported> {
        let dim = *self.shape(input).last().unwrap_or(&1);
        let rows = self.graph.tensor(input).numel() as u64 / dim.max(1);
        let (rows, dim) = (u32_of(rows, "rows")?, u32_of(dim, "width")?);
        self.steps.push(Step::Norm { input, out, rows, dim, norm });
        Ok(())
    }

    /// When the last step is a norm (RMS or LayerNorm) whose output only the `readers` products read, it is
    /// done inside the GEMV: the norm's input and the norm instead of `a`. When products of later GEMVs read
    /// it too (and nothing else does), each of them does it as well.
    fn fused_norm(&mut self, a: TensorId, readers: usize) -> (TensorId, Option<Norm>) {
        if let Some(&(_, input, norm)) = self.shared_norms.iter().find(|&&(h, ..)| self.same(h, a)) {
            return (input, Some(norm));
        }
        let Some(&Step::Norm { input, out: h, norm, .. }) = self.steps.last() else { return (a, None) };
        if !self.same(h, a) || self.is_output(h) {
            return (a, None);
        }
        if self.uses(h) == readers {
            self.steps.pop();
            return (input, Some(norm));
        }
        if self.only_products_read(h) {
            self.steps.pop();
            self.shared_norms.push((h, input, norm));
            return (input, Some(norm));
        }
        (a, None)
    }

    /// Whether every op reading `h`'s value multiplies it (as the activation `a` of a product).
    fn only_products_read(&self, h: TensorId) -> bool {
        let value = self.canon.value[h.0];
        let is_h = |x: TensorId| self.canon.value[x.0] == value;
        self.canon.order.iter().all(|&i| match self.graph.ops()[i] {
            Op::MatMul { b, bias, .. } => !is_h(b) && !bias.is_some_and(is_h),
            ref op => !op.operands().into_iter().any(is_h),
        })
    }

    /// A cache update (with the next one at the same position and of the same shapes: K and V in one
    /// launch); token-major updates the previous GEMV computes are written by that GEMV.
    fn kv_update(&mut self, p: usize) -> Result<usize, Unsupported> {
        let Some(&Op::KvCacheUpdate { cache, update, position, out }) = self.ahead(p, 0) else {
            unreachable!("a kv update")
        };
        self.rehome(out, cache);
        let layout = self.kv_layout(cache, update)?;
        let mut caches = vec![(cache, update)];
        if let Some(&Op::KvCacheUpdate { cache: c2, update: u2, position: p2, out: o2 }) = self.ahead(p, 1) {
            // One row is in token-major order whichever way its update is shaped.
            let one_row = |l: KvLayout| KvLayout { head_major: l.head_major && l.rows > 1, ..l };
            let alike = one_row(self.kv_layout(c2, u2)?) == one_row(layout);
            if p2 == position && self.shape(c2) == self.shape(cache) && alike {
                self.rehome(o2, c2);
                caches.push((c2, u2));
            }
        }
        let taken = caches.len();
        // A head-major update of one row is in token-major order.
        let token_major = !layout.head_major || layout.rows == 1;
        if token_major && self.fuse_into_gemv(&caches, position, layout) {
            return Ok(taken);
        }
        self.steps.push(Step::KvUpdate { caches, position, layout });
        Ok(taken)
    }

    /// `cache` `[H, L, Dh]` or `[1, H, L, Dh]` and `update` token-major `[T, H * Dh]` or head-major `[H, T,
    /// Dh]` / `[1, H, T, Dh]` (the forms validation admits).
    fn kv_layout(&self, cache: TensorId, update: TensorId) -> Result<KvLayout, Unsupported> {
        let c = self.shape(cache);
        let c = &c[c.len().saturating_sub(3)..];
        let u = self.shape(update);
        let head_major = u.len() >= 3;
        let rows = if head_major { u[u.len() - 2] } else { u[0] };
        Ok(KvLayout {
            rows: u32_of(rows, "rows")?,
            heads: u32_of(c[0], "heads")?,
            len: u32_of(c[1], "cache length")?,
            head_dim: u32_of(c[2], "head size")?,
            head_major,
        })
    }

    /// Has the previous GEMV write `caches`' updates (each one of its outputs, or a view sharing its
    /// storage) into the caches: whether it did.
    fn fuse_into_gemv(&mut self, caches: &[(TensorId, TensorId)], position: TensorId, l: KvLayout) -> bool {
        let homes = &self.homes;
        // The last GEMV that computes an update (a parallel block's MLP projection may follow it), when no
        // step after it touches the caches (their rows may then be written earlier).
        let computes =
            |mat: &GemvMat, update: TensorId| Home::root(homes, mat.y) == Home::root(homes, update);
        let computes_one = |s: &Step| match s {
            Step::Gemv { mats, .. } => caches.iter().any(|&(_, u)| mats.iter().any(|mat| computes(mat, u))),
            _ => false,
        };
        let Some(at) = self.steps.iter().rposition(computes_one) else { return false };
        let touches = |s: &Step| {
            s.reads()
                .into_iter()
                .chain(s.writes())
                .any(|id| caches.iter().any(|&(cache, _)| Home::root(homes, id) == Home::root(homes, cache)))
        };
        if self.steps[at + 1..].iter().any(touches) {
            return false;
        }
        let Some(Step::Gemv { mats, cache_rows: cache_rows @ None, m, .. }) = self.steps.get_mut(at) else {
            return false;
        };
        if *m != l.rows || !caches.iter().all(|&(_, update)| mats.iter().any(|mat| computes(mat, update))) {
            return false;
        }
        for &(cache, update) in caches {
            if let Some(mat) = mats.iter_mut().find(|mat| computes(mat, update)) {
                mat.cache = Some(cache);
            }
        }
        *cache_rows = Some(CacheRows { position, heads: l.heads, len: l.len, head_dim: l.head_dim });
        true
    }

    /// Causal attention over the caches where they are: `q` token-major `[T, Hq * Dh]` or head-major
    /// `[Hq, T, Dh]` / `[1, Hq, T, Dh]`, caches `[Hkv, L, Dh]` / `[1, Hkv, L, Dh]`.
    fn attention(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        position: TensorId,
        (scale, softcap): (Option<f32>, Option<f32>),
        out: TensorId,
    ) -> Result<(), Unsupported> {
        let c = self.shape(k);
        let c = &c[c.len().saturating_sub(3)..];
        let (kv_heads, len, head_dim) =
            (u32_of(c[0], "heads")?, u32_of(c[1], "cache length")?, u32_of(c[2], "head size")?);
        if head_dim > ATTN_MAX_HEAD {
            return Err(Unsupported(format!(
                "attention '{}' has head size {head_dim}; the CUDA delegate's attention handles up to {ATTN_MAX_HEAD}",
                self.graph.tensor(out).name
            )));
        }
        let s = self.shape(q);
        let head_major = s.len() >= 3;
        let (rows, heads) =
            if head_major { (s[s.len() - 2], s[s.len() - 3]) } else { (s[0], s[1] / u64::from(head_dim)) };
        let (rows, heads) = (u32_of(rows, "rows")?, u32_of(heads, "heads")?);
        if kv_heads == 0 || heads % kv_heads != 0 {
            return Err(Unsupported(format!(
                "attention '{}' has {heads} query heads over {kv_heads} KV heads, not a whole number per \
                 KV head",
                self.graph.tensor(out).name
            )));
        }
        let scale = scale.unwrap_or(1.0 / (head_dim as f32).sqrt());
        let shape = AttnShape { rows, heads, kv_heads, len, head_dim, head_major, scale, softcap };
        self.float(q)?;
        let splits = attention_splits(heads, rows, len);
        let heads_rows = rows as usize * heads as usize;
        let slots = heads_rows * splits as usize;
        let scratch = &mut self.attn_scratch;
        scratch.partials = scratch.partials.max(slots * head_dim as usize);
        scratch.maxima = scratch.maxima.max(slots * 2);
        scratch.counters = scratch.counters.max(heads_rows);
        let early = self.updated_at(k, position) && self.updated_at(v, position) && self.stable(position);
        self.steps.push(Step::Attention { q, k, v, position, out, shape, splits, early });
        Ok(())
    }

    /// Whether `cache` is a `KvCacheUpdate`'s output at `position` and every op that writes its storage
    /// writes it at that position (what it holds before the position is what the caller passed in).
    fn updated_at(&self, cache: TensorId, position: TensorId) -> bool {
        let ops = self.graph.ops();
        let Some(root) = ops.iter().find_map(|op| match *op {
            Op::KvCacheUpdate { cache: c, out, position: p, .. } if out == cache && p == position => Some(c),
            _ => None,
        }) else {
            return false;
        };
        ops.iter().all(|op| match *op {
            Op::KvCacheUpdate { cache: c, position: p, .. } => c != root || p == position,
            Op::Assign { target, .. } => target != root,
            _ => true,
        })
    }

    /// Whether `id` holds one value all call long: a constant, or an input no op writes.
    fn fixed(&self, id: TensorId) -> bool {
        self.graph.constant(id).is_some() || self.stable(id)
    }

    /// Whether `id` is a graph input no op writes in place (it holds the caller's value all call long).
    fn stable(&self, id: TensorId) -> bool {
        self.graph.inputs().contains(&id)
            && !self.graph.ops().iter().any(|op| matches!(*op, Op::Assign { target, .. } if target == id))
    }
}
