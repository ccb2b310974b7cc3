//! The lowering state and the fast path: the fused launches of a decode step (see the parent module), and
//! the dispatch of every other op to [`super::general`].

mod bias;
mod cache;
mod heads;
mod partial;
mod products;
mod softcap;
mod spelled;
mod split;

use ref_graph::{Graph, Op, TensorId, UnaryFn};

use super::canon::Canon;
use super::{
    attention_splits, gelu, general, layer_norm, rms_norm, rope, u32_of, AttnScratch, AttnShape, BinOp,
    CacheRows, Float, GemvMat, Home, KvLayout, Norm, Plan, PositionRows, RopeTables, Step, Unsupported,
    WeightRows,
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
    /// The graph's RMS norms spelled in f32 (the ops before the last absorbed).
    rms_norms: Vec<rms_norm::SpelledRms>,
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
            rms_norms: Vec::new(),
            shared_norms: Vec::new(),
            absorbed: vec![false; graph.ops().len()],
        };
        l.ropes = rope::find(&l);
        for r in l.ropes.clone() {
            l.absorb(&r.absorbed, r.out);
        }
        l.gelus = gelu::find(&l);
        for g in l.gelus.clone() {
            l.absorb(&g.absorbed, g.out);
            // Four reads of `x` (the half, the square, the cube, the sum) are now the GELU's one.
            l.merged_reads[l.canon.value[g.x.0].0] += 3;
        }
        l.layer_norms = layer_norm::find(&l);
        for n in l.layer_norms.clone() {
            l.absorb(&n.absorbed, n.out);
        }
        l.rms_norms = rms_norm::find(&l);
        for n in l.rms_norms.clone() {
            l.absorb(&n.absorbed, n.out);
            if n.reads_twice {
                // The square's and the product's reads of the row are now the norm's one.
                l.merged_reads[l.canon.value[n.x.0].0] += 1;
            }
        }
        l
    }

    /// `ops`, which a spelled form (a RoPE, a GELU, a norm) reads as the one op writing `out`, are lowered as
    /// nothing: their outputs are never written or read (no allocation; the storage named is `out`'s).
    fn absorb(&mut self, ops: &[usize], out: TensorId) {
        for &i in ops {
            self.absorbed[i] = true;
            self.rehome(self.graph.ops()[i].output(), out);
        }
    }

    /// For every op of the graph whose operands `pair` picks (a commutative op's two operands and its output),
    /// what `matched` reads there with the operands in either order: the spelled forms ending in such an op.
    pub(super) fn either_order<T>(
        &self,
        pair: impl Fn(&Op<TensorId>) -> Option<(TensorId, TensorId, TensorId)>,
        matched: impl Fn(usize, TensorId, TensorId, TensorId) -> Option<T>,
    ) -> Vec<T> {
        let each = |(i, op)| {
            let (a, b, out) = pair(op)?;
            matched(i, a, b, out).or_else(|| matched(i, b, a, out))
        };
        self.graph.ops().iter().enumerate().filter_map(each).collect()
    }

    pub(super) fn finish(mut self) -> Plan {
        self.token_major_heads();
        let mut dtypes: Vec<_> = self.graph.tensors().iter().map(|t| t.dtype).collect();
        // A half model's f32 norm gains, read by the kernels in the model's type (see `rms_norm`).
        for n in &self.rms_norms {
            if let Some(dtype) = n.retyped {
                dtypes[n.gain.0] = dtype;
            }
        }
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
        if let Some(n) = self.rms_norms.iter().find(|n| n.last == i).cloned() {
            self.norm(n.x, n.out, Norm { gain: n.gain, eps: n.eps, centred: false, bias: None })?;
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
                if !self.norm_residual(a, b, out) {
                    self.steps.push(Step::Add { a, b, out, n: self.graph.tensor(out).numel() as u64 });
                }
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
        self.fuse_softcap();
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
        let Step::Gemv {
            ref mats,
            m,
            cache_rows: None,
            glu: None,
            rope: None,
            activation: None,
            softcap: None,
            ..
        } = self.steps[at]
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
    /// reads `gate`, `up` or `s`: the GEMV writes `out` itself (two launches fewer a layer). So does a gated
    /// GELU (`s = gelu(gate)`, either form: Gemma's MLP), the GELU the GEMV's `activation`.
    fn fuse_glu(&mut self) {
        let [.., ref gemv, ref unary, ref binary] = self.steps[..] else { return };
        let Step::Gemv { ref mats, m, cache_rows: None, glu: None, activation: None, softcap: None, .. } =
            *gemv
        else {
            return;
        };
        let Step::Unary {
            func: func @ (UnaryFn::Silu | UnaryFn::Gelu | UnaryFn::GeluTanh),
            input: gate,
            out: s,
            n,
            dtype,
        } = *unary
        else {
            return;
        };
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
        let Some(Step::Gemv { mats, glu, activation, .. }) = self.steps.last_mut() else {
            unreachable!("matched above")
        };
        if !gate_first {
            mats.swap(0, 1);
        }
        *glu = Some(out);
        *activation = (func != UnaryFn::Silu).then_some(func);
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
        let Some(Step::Gemv { mats, m: 1, glu: None, rope, softcap: None, .. }) = self.steps.get_mut(at)
        else {
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
    /// embedding launch (token rows plus the positions' rows); else with a product by a scalar constant next
    /// (Gemma's `embed_scale`), one launch of the scaled rows.
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
        let mut scale = None;
        if let (None, Some((factor, scaled))) = (plus, self.embedding_scale(p, out)) {
            // Never written or read: the launch stores the scaled rows.
            self.rehome(out, scaled);
            (out, scale, taken) = (scaled, Some(factor), 2);
        }
        self.steps.push(Step::Gather {
            table,
            indices,
            out,
            rows: u32_of(rows, "row count")?,
            n: u32_of(t[0], "table rows")?,
            dim: u32_of(dim, "table width")?,
            plus,
            scale,
        });
        Ok(taken)
    }
}
