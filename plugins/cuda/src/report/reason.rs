//! Why an op runs as a launch of its own: what form it is, which fused forms exist for it, and where the
//! graph shows it plainly, what about this op kept it out of them (a view between a product and its
//! residual, a norm read by a reshape). Facts read off the graph and the plan, never the planner's
//! decisions re-made.

use ref_graph::{ElemType, Graph, Op, TensorId, UnaryFn};

use crate::plan::{BinOp, Plan, Step};

/// The graph as the reasons read it: who produces each tensor, who reads it, which are constants.
pub(super) struct Ops<'g> {
    graph: &'g Graph,
    producer: Vec<Option<usize>>,
    /// By tensor: a constant, or computed from constants alone (the same value every call).
    fixed: Vec<bool>,
}

impl<'g> Ops<'g> {
    pub(super) fn new(graph: &'g Graph) -> Ops<'g> {
        let mut producer = vec![None; graph.tensors().len()];
        let mut fixed = vec![false; graph.tensors().len()];
        for (id, _) in graph.constants() {
            fixed[id.0] = true;
        }
        for (i, op) in graph.ops().iter().enumerate() {
            producer[op.output().0] = Some(i);
            // Ops come in SSA order: every operand is decided before the op that reads it.
            fixed[op.output().0] = op.operands().iter().all(|id| fixed[id.0]);
        }
        Ops { graph, producer, fixed }
    }

    /// Whether everything `step` reads is a constant or computed from constants alone.
    pub(super) fn reads_constants_only(&self, step: &Step) -> bool {
        step.reads().iter().all(|id| self.fixed[id.0])
    }

    /// `'name'`.
    fn t(&self, id: TensorId) -> String {
        format!("'{}'", self.graph.tensor(id).name)
    }

    /// `'name' [1, 1, 64]`.
    fn shaped(&self, id: TensorId) -> String {
        format!("{} {:?}", self.t(id), self.graph.tensor(id).shape)
    }

    fn producer(&self, id: TensorId) -> Option<&'g Op<TensorId>> {
        self.producer[id.0].map(|i| &self.graph.ops()[i])
    }

    /// The ops that read `id`.
    fn readers(&self, id: TensorId) -> Vec<&'g Op<TensorId>> {
        self.graph.ops().iter().filter(|op| op.operands().contains(&id)).collect()
    }

    /// The product `id` is a reshape (or an order-keeping permute) of, through any number of them.
    fn viewed_product(&self, id: TensorId) -> Option<TensorId> {
        match *self.producer(id)? {
            Op::Reshape { input, .. } | Op::Permute { input, .. } => match self.producer(input)? {
                Op::MatMul { .. } => Some(input),
                _ => self.viewed_product(input),
            },
            _ => None,
        }
    }
}

/// Why launch `index` of `plan` is one op on its own; `None` for a launch of the fast path.
pub(super) fn why(ops: &Ops<'_>, plan: &Plan, index: usize) -> Option<String> {
    let step = &plan.steps[index];
    let mut reason = form(ops, plan, index)?;
    if ops.reads_constants_only(step) {
        reason += "; it reads constants alone, so it computes the same values every call";
    }
    Some(reason)
}

/// What form launch `index` is in and which fused forms exist for it; `None` for the fast path.
fn form(ops: &Ops<'_>, plan: &Plan, index: usize) -> Option<String> {
    let before = index.checked_sub(1).map(|i| &plan.steps[i]);
    match plan.steps[index] {
        Step::Gather { .. }
        | Step::Gemv { .. }
        | Step::Attention { .. }
        | Step::Argmax { .. }
        | Step::Counters { .. }
        | Step::RopeTables { .. }
        | Step::Glu { .. } => None,
        Step::Positions { position, out, .. } => Some(format!(
            "positions {} from {}: fused into the embedding only when a gather of a position table by them and \
             the add of both gathers follow it",
            ops.t(out),
            ops.t(position)
        )),
        Step::Add { a, b, out, .. } => Some(residual(ops, a, b, out)),
        Step::Norm { input, out, norm: n, .. } => Some(norm(ops, input, out, n.centred)),
        Step::KvUpdate { ref caches, layout, .. } => {
            let names: Vec<String> = caches.iter().map(|&(cache, _)| ops.t(cache)).collect();
            let mut reason = format!(
                "update of cache {} in a launch of its own: a GEMV writes the cache rows itself only when the \
                 updates are its products (or views of them), token-major or one head-major row, and it is \
                 the launch right before",
                names.join(" and ")
            );
            if layout.head_major && layout.rows > 1 {
                reason += &format!("; here the updates are head-major, {} rows", layout.rows);
            } else if !matches!(before, Some(Step::Gemv { .. })) {
                reason += &format!("; here the launch before it is {}", label_of(before));
            }
            Some(reason)
        }
        Step::Binary { op, a, b, dtype, .. } => Some(binary(ops, op, a, b, dtype)),
        Step::Unary { func, input, .. } => Some(unary(ops, func, input)),
        Step::Mean { input, .. } => Some(format!(
            "mean over the last axis of {}: a mean has no fused form but inside LayerNorm (rms_norm(x - \
             mean(x)), optionally plus a constant bias, the mean and x - mean read only there); a norm fuses \
             into the next GEMV only as one RMS norm or LayerNorm",
            ops.shaped(input)
        )),
        Step::Cast { input, from, to, .. } => Some(format!(
            "cast of {} from {from} to {to}: a cast has no fused form (each fused kernel reads and writes the \
             one float type it is compiled for)",
            ops.t(input)
        )),
        Step::Rope { x, out, .. } => Some(rope(ops, x, out, before)),
        Step::Copy { src, dst, ref walk, .. } => Some(copy(ops, src, dst, walk.a != walk.b)),
    }
}

/// `'the label'` of a launch, or what to say when there is none before.
fn label_of(step: Option<&Step>) -> String {
    step.map_or_else(|| "none (it is the first)".to_owned(), |s| format!("'{}'", s.label()))
}

fn residual(ops: &Ops<'_>, a: TensorId, b: TensorId, out: TensorId) -> String {
    let mut reason = format!(
        "add of {} and {} into {} in a launch of its own: a residual add fuses into the GEMV right before it \
         when that GEMV computes one product (no sibling projections), the product is an operand of the add \
         itself and nothing else reads it",
        ops.t(a),
        ops.t(b),
        ops.t(out)
    );
    let products: Vec<TensorId> =
        [a, b].into_iter().filter(|&id| matches!(ops.producer(id), Some(Op::MatMul { .. }))).collect();
    if let Some(&p) = products.first() {
        let readers = ops.readers(p).len();
        if readers > 1 {
            reason += &format!("; here {} has {readers} readers", ops.t(p));
        }
    } else if let Some((view, p)) = [a, b].into_iter().find_map(|id| Some((id, ops.viewed_product(id)?))) {
        reason += &format!("; here {} is a view of the product {}, not the product", ops.t(view), ops.t(p));
    } else {
        reason += "; here neither operand is a product";
    }
    reason
}

fn norm(ops: &Ops<'_>, input: TensorId, out: TensorId, centred: bool) -> String {
    let mut reason = format!(
        "{} of {} into {} in a launch of its own: a norm fuses into the GEMV right after it when that \
         GEMV's products are all that read it",
        if centred { "LayerNorm" } else { "RMS norm" },
        ops.t(input),
        ops.t(out)
    );
    let readers: Vec<&str> = ops.readers(out).into_iter().map(|op| op.name()).collect();
    let products = readers.iter().filter(|&&name| name == "mat_mul").count();
    if products < readers.len() {
        reason += &format!("; here {} is read by {}", ops.t(out), readers.join(", "));
    } else if ops.graph.outputs().contains(&out) {
        reason += &format!("; here {} is a graph output", ops.t(out));
    }
    reason
}

fn binary(ops: &Ops<'_>, op: BinOp, a: TensorId, b: TensorId, dtype: ElemType) -> String {
    let name = format!("{op:?}").to_lowercase();
    let what = format!("{name} of {} and {}", ops.shaped(a), ops.shaped(b));
    match op {
        _ if dtype == ElemType::I64 => {
            format!("{what}: index arithmetic (i64) has no fused form")
        }
        BinOp::Add => format!(
            "{what}: an add of operands of different shapes (broadcast) has no fused form but a constant bias \
             along the row, after a bias-less product only it reads, or after LayerNorm; a residual add of \
             one shape fuses into the GEMV before it, and a RoPE's add into the RoPE"
        ),
        BinOp::Mul => format!(
            "{what}: a product fuses only inside SwiGLU (silu(gate) * up, right after the one GEMV of gate and \
             up), inside a rotate-half RoPE (x * cos + rotate_half(x) * sin) or inside GELU's tanh form"
        ),
        BinOp::Sub => format!(
            "{what}: a subtraction has no fused form but inside LayerNorm (x - mean(x), read only by an \
             rms_norm, or in f32 between casts)"
        ),
        BinOp::Div => format!("{what}: a division has no fused form"),
    }
}

fn unary(ops: &Ops<'_>, func: UnaryFn, input: TensorId) -> String {
    let x = ops.t(input);
    match func {
        UnaryFn::Silu => format!(
            "silu of {x}: SiLU fuses only as SwiGLU, when silu(gate) * up follows the one GEMV that computes \
             gate and up and nothing else reads gate, up or silu(gate)"
        ),
        UnaryFn::Neg => format!(
            "negation of {x}: fuses only inside a rotate-half RoPE (x * cos + concat(-x2, x1) * sin, each \
             part read by the RoPE alone)"
        ),
        UnaryFn::Sigmoid => format!(
            "sigmoid of {x}: a sigmoid has no fused form but inside SiLU, x * sigmoid(x) of a product x (the \
             gate of SwiGLU)"
        ),
        UnaryFn::Rsqrt | UnaryFn::Sqrt | UnaryFn::Square | UnaryFn::Reciprocal => format!(
            "{} of {x}: no fused form; a norm fuses into the next GEMV only as one RMS norm or LayerNorm",
            format!("{func:?}").to_lowercase()
        ),
        UnaryFn::Cos | UnaryFn::Sin => format!(
            "{} of {x}: no fused form (a RoPE fuses the cos and sin tables it reads, not their computation)",
            format!("{func:?}").to_lowercase()
        ),
        UnaryFn::Exp | UnaryFn::Tanh => {
            format!("{} of {x}: no fused form", format!("{func:?}").to_lowercase())
        }
        UnaryFn::Gelu | UnaryFn::GeluTanh => {
            format!(
                "GELU of {x}: fuses into the GEMV that computes {x} when it is that GEMV's one product, \
                 without residual, cache or RoPE, and nothing else reads it"
            )
        }
    }
}

fn rope(ops: &Ops<'_>, x: TensorId, out: TensorId, before: Option<&Step>) -> String {
    let mut reason = format!(
        "rotate-half RoPE of {} into {} in a launch of its own: the GEMV right before it applies a RoPE when \
         it computes one row, {} is one of its products (or a view of it) with no residual, cache update or \
         SwiGLU, nothing but the RoPE reads it, and cos and sin are one row of its type",
        ops.shaped(x),
        ops.t(out),
        ops.t(x)
    );
    match before {
        Some(Step::Gemv { m, .. }) if *m != 1 => reason += &format!("; here that GEMV computes {m} rows"),
        Some(Step::Gemv { .. }) => {}
        other => reason += &format!("; here the launch before it is {}", label_of(other)),
    }
    reason
}

/// A copy into `dst`, whose elements move (`moves`: the source and destination strides differ) or not.
fn copy(ops: &Ops<'_>, src: TensorId, dst: TensorId, moves: bool) -> String {
    match ops.producer(dst) {
        Some(&Op::Permute { input, ref dims, .. }) if moves => format!(
            "permute of {} by {dims:?}: it moves axes longer than 1, so its elements are copied (a permute of \
             axes of extent 1 only is free, a view)",
            ops.shaped(input)
        ),
        Some(&Op::Slice { input, axis, start, end, .. }) => format!(
            "slice {start}..{end} of axis {axis} of {}: copied (a slice is fused only inside a rotate-half \
             RoPE, when slices alone read a product (at most three matrices a launch), or in a partial rotary)",
            ops.shaped(input)
        ),
        Some(&Op::Concat { a, b, axis, .. }) => format!(
            "concat of {} and {} along axis {axis}, one copy per operand (this one: {}): a concat is fused \
             only inside a rotate-half RoPE or a partial rotary (a RoPE of a product's first columns \
             concatenated with the rest)",
            ops.t(a),
            ops.t(b),
            ops.t(src)
        ),
        Some(&Op::Assign { target, value, .. }) => format!(
            "assign of {} into the caller's buffer {}: one copy; an assign has no fused form",
            ops.t(value),
            ops.t(target)
        ),
        Some(&(Op::Reshape { input, .. } | Op::Permute { input, .. })) => format!(
            "view of {} as the graph output {}: copied into the caller's buffer (a view is free, and one that \
             is a graph output too unless what it views is an input, a constant or another output)",
            ops.t(input),
            ops.t(dst)
        ),
        _ => format!("copy of {} into {}", ops.t(src), ops.t(dst)),
    }
}
