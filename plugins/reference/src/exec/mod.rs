//! The CPU executor: runs a validated [`Graph`] over the arguments of one `execute`, with all scratch memory
//! allocated up front.
//!
//! ## What runs in which type
//!
//! Every tensor is held in its declared element type (`f32`, `f16`, `bf16` or `i64`), and every float op
//! computes in `f32`: its operands are read to `f32` (exactly), the op computes (sums, softmax and norms
//! accumulate in `f32`), and each result is rounded to the output's type when it is stored (to nearest, ties
//! to even). So an `f16` or `bf16` graph's intermediates are `f16` or `bf16` values, as on the GPU, and an
//! `f32` graph computes exactly as before. [`elem`] is the one place a float type is read and rounded;
//! [`ref_graph::UnaryFn::apply`] is the one definition of each unary function; `i64` `add`, `sub` and `mul`
//! wrap. `cast` follows [`ref_graph::Op::Cast`]: float to float rounds once, `i64` to float rounds to nearest
//! once (never through `f32` first), float to `i64` truncates toward zero, saturating, NaN to 0.
//!
//! ## Where each tensor lives
//!
//! - constants stay in the [`Graph`] and are read in place, in their own type (nothing is converted at init);
//! - graph inputs that are not caches are copied from their argument into scratch when a call starts (they
//!   are small: token ids and positions);
//! - a cache input, and the `KvCacheUpdate` output that aliases it, live **in the caller's argument**, in the
//!   cache's type: the update writes into it and attention reads from it, so the caller's buffer is the cache;
//! - an `Assign` target and its output live in the caller's argument too: the assign writes its value there;
//! - delegate-owned caches (`Graph::state`) live in the executor, zero-filled at init, kept across calls;
//! - a `reshape`'s output is its input's storage (an alias decided at init): nothing is copied;
//! - every other tensor lives in scratch allocated by [`Executor::new`]; graph outputs that alias nothing are
//!   copied into their argument when the ops are done.
//!
//! [`Executor::run`] allocates nothing: the scratch, the per-op geometry of broadcasting and `permute`
//! ([`walk::Walk`]) and the `f32` work rows of attention, `mat_mul` and `argmax` are decided at init.
//!
//! One file per concern: [`store`] where tensors live, [`elem`] the element types, [`walk`] broadcast and
//! permute geometry, [`elementwise`] the elementwise ops, `mean` and `cast`, [`layout`] `permute`, `slice`,
//! `concat` and `gather`, [`kernels`] `mat_mul`, `rms_norm`, `positions` and `argmax`, [`attention`] the
//! cache update and causal attention.

/// Runs `$body` with `$T` the float type `$dtype` names (`f32`, `f16` or `bf16`); `i64` is a typing bug.
macro_rules! with_float {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            ref_graph::ElemType::F32 => {
                type $T = f32;
                $body
            }
            ref_graph::ElemType::F16 => {
                type $T = ref_graph::half::f16;
                $body
            }
            ref_graph::ElemType::Bf16 => {
                type $T = ref_graph::half::bf16;
                $body
            }
            ref_graph::ElemType::I64 => {
                Err($crate::exec::Error::Internal("a float op has an i64 output (a typing bug)".to_owned()))
            }
        }
    };
}

/// Runs `$body` with `$T` the element type `$dtype` names.
macro_rules! with_elem {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            ref_graph::ElemType::I64 => {
                type $T = i64;
                $body
            }
            float => with_float!(float, $T => $body),
        }
    };
}

pub mod attention;
pub mod elem;
pub mod elementwise;
pub mod kernels;
pub mod layout;
pub mod store;
pub mod walk;

use std::mem;

use delegate_abi::{DelegateError, ExecuteArgs};
use et_error::{ErrorCode, HasErrorCode};
use ref_graph::{Graph, Op, TensorDecl, TensorId};

use store::{Buf, Out, Store, Tensors};
use walk::Walk;

/// Most scratch memory one executor allocates (4 GiB): a blob whose intermediates need more is refused at
/// init instead of exhausting the host.
pub const MAX_SCRATCH_BYTES: u64 = 4 << 30;

/// Why a call failed while the graph ran, or why scratch could not be allocated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A gathered index (e.g. a token id) is outside its table. `InvalidArgument`.
    #[error("index {index} at row {row} of the indices is outside table '{table}' with {rows} rows")]
    IndexOutOfRange {
        /// The table's tensor name.
        table: String,
        /// Which index (its row-major position among the indices).
        row: usize,
        /// Its value.
        index: i64,
        /// Rows in the table.
        rows: usize,
    },
    /// A position with `position < 0` or `position + rows > len`. `InvalidArgument`.
    #[error(
        "position {position} from '{tensor}' does not fit: op {op_index} ({op}) handles {rows} rows of a cache \
         with {len} rows"
    )]
    PositionOutOfRange {
        /// The position tensor's name.
        tensor: String,
        /// The value.
        position: i64,
        /// Position of the op in the graph.
        op_index: usize,
        /// The op's name.
        op: &'static str,
        /// Rows the op writes or reads from the position on.
        rows: usize,
        /// Rows in the cache.
        len: usize,
    },
    /// An argument's bytes could not be reached (not host-visible, read-only, overlapping, misaligned).
    #[error("{0}")]
    Access(DelegateError),
    /// A broken invariant of this crate (a bug). `Internal`.
    #[error("internal error in the reference executor: {0}")]
    Internal(String),
    /// Scratch memory could not be allocated, or would exceed [`MAX_SCRATCH_BYTES`].
    /// `DelegateMemoryAllocationFailed`.
    #[error("cannot allocate {bytes} bytes of scratch for tensor '{tensor}' (limit {MAX_SCRATCH_BYTES} bytes in all)")]
    OutOfMemory {
        /// The tensor.
        tensor: String,
        /// Bytes requested.
        bytes: usize,
    },
}

impl HasErrorCode for Error {
    fn error_code(&self) -> ErrorCode {
        match self {
            Error::IndexOutOfRange { .. } | Error::PositionOutOfRange { .. } => ErrorCode::InvalidArgument,
            Error::Access(err) => err.code,
            Error::OutOfMemory { .. } => ErrorCode::DelegateMemoryAllocationFailed,
            Error::Internal(_) => ErrorCode::Internal,
        }
    }
}

impl From<DelegateError> for Error {
    fn from(err: DelegateError) -> Error {
        Error::Access(err)
    }
}

/// Which argument positions carry which graph tensors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArgMap {
    /// Every graph input, with its argument position.
    pub inputs: Vec<(TensorId, usize)>,
    /// Graph outputs to copy into an argument after the ops ran. Outputs of a `KvCacheUpdate` or an `Assign`
    /// are not listed: they are the input's storage already (reflecting them into a separate slot is the
    /// delegate's business).
    pub outputs: Vec<(TensorId, usize)>,
}

/// What an op needs that is decided at init from its shapes.
#[derive(Debug)]
enum Plan {
    /// Nothing.
    None,
    /// The broadcast of a binary elementwise op's operands.
    Binary(Walk<2>),
    /// The axes of a `permute`.
    Permute(Walk<1>),
}

impl Plan {
    fn of(graph: &Graph, op: &Op<TensorId>) -> Plan {
        let shape = |id: TensorId| graph.tensor(id).shape.as_slice();
        match *op {
            Op::Add { a, b, out } | Op::Sub { a, b, out } | Op::Mul { a, b, out } | Op::Div { a, b, out } => {
                Plan::Binary(Walk::broadcast(shape(out), [shape(a), shape(b)]))
            }
            Op::Permute { input, ref dims, .. } => Plan::Permute(Walk::permute(shape(input), dims)),
            _ => Plan::None,
        }
    }
}

/// `f32` work space of the ops that accumulate: attention scores, and one row (a `mat_mul` output row, an
/// attention head, the last row of an `argmax`).
#[derive(Debug)]
struct Work {
    scores: Vec<f32>,
    row: Vec<f32>,
}

impl Work {
    fn new(graph: &Graph) -> Result<Work, Error> {
        let extent = |id: TensorId, from_end: usize| {
            let shape = &graph.tensor(id).shape;
            shape[shape.len() - from_end] as usize
        };
        let (mut scores, mut row) = (0, 0);
        for op in graph.ops() {
            match *op {
                Op::CausalAttention { k, .. } => {
                    scores = scores.max(extent(k, 2));
                    row = row.max(extent(k, 1));
                }
                Op::MatMul { out, .. } | Op::Argmax { input: out, .. } => row = row.max(extent(out, 1)),
                _ => {}
            }
        }
        Ok(Work {
            scores: store::alloc(scores, "attention scores")?,
            row: store::alloc(row, "an f32 work row")?,
        })
    }
}

/// Runs one [`Graph`] with its scratch memory; one per delegate handle.
#[derive(Debug)]
pub struct Executor {
    tensors: Tensors,
    staged: Vec<(TensorId, usize)>,
    outputs: Vec<(TensorId, usize)>,
    plans: Vec<Plan>,
    work: Work,
}

impl Executor {
    /// Allocates scratch for every tensor that needs it. `args` must bind every graph input (the delegate's
    /// binding plan guarantees it).
    pub fn new(graph: &Graph, args: &ArgMap) -> Result<Executor, Error> {
        let (mut stores, state) = place(graph, args)?;
        let scratch: u64 = stores.iter().zip(graph.tensors()).map(|(s, d)| store::scratch_bytes(s, d)).sum();
        if scratch > MAX_SCRATCH_BYTES {
            return Err(Error::OutOfMemory {
                tensor: "(all intermediates)".to_owned(),
                bytes: scratch as usize,
            });
        }
        for (store, decl) in stores.iter_mut().zip(graph.tensors()) {
            if let Store::Scratch(buf) = store {
                *buf = Buf::zeros(decl.dtype, decl.numel(), &decl.name)?;
            }
        }
        // Arguments bound to a cache in place are neither staged nor copied out.
        let not_in_place = |bound: &[(TensorId, usize)]| -> Vec<(TensorId, usize)> {
            bound.iter().copied().filter(|(id, _)| !matches!(stores[id.0], Store::InPlace { .. })).collect()
        };
        let staged = not_in_place(&args.inputs);
        let outputs = not_in_place(&args.outputs);
        let plans = graph.ops().iter().map(|op| Plan::of(graph, op)).collect();
        let tensors = Tensors { stores, state };
        Ok(Executor { tensors, staged, outputs, plans, work: Work::new(graph)? })
    }

    /// Runs every op: stages inputs, computes, updates caches in their arguments, and copies outputs out.
    /// The caller has checked every argument's dtype, shape and size against the graph.
    pub fn run(&mut self, graph: &Graph, args: &mut ExecuteArgs<'_>) -> Result<(), Error> {
        for &(id, arg) in &self.staged {
            let ([bytes], []) = args.borrow([arg], [])?;
            match &mut self.tensors.stores[id.0] {
                Store::Scratch(buf) => copy_bytes(buf.bytes_mut(), bytes, graph.tensor(id))?,
                _ => {
                    return Err(invariant(format!(
                        "input '{}' is staged but has no scratch",
                        graph.tensor(id).name
                    )))
                }
            }
        }
        for (index, op) in graph.ops().iter().enumerate() {
            self.run_op(graph, index, op, args)?;
        }
        for &(id, arg) in &self.outputs {
            let values = self.tensors.values(graph, id)?;
            let ([], [bytes]) = args.borrow([], [arg])?;
            copy_bytes(bytes, values.bytes(), graph.tensor(id))?;
        }
        Ok(())
    }

    fn run_op(
        &mut self,
        graph: &Graph,
        index: usize,
        op: &Op<TensorId>,
        args: &mut ExecuteArgs<'_>,
    ) -> Result<(), Error> {
        let out_id = op.output();
        // SSA: no op reads its own output, so the output's storage can be taken out while operands are read.
        // It goes back whatever the op's outcome, so a failed call leaves the executor usable.
        let mut out = mem::replace(&mut self.tensors.stores[out_id.0], Store::Constant);
        let at = OpAt { index, op };
        let result = self.compute(graph, at, Out { store: &mut out, decl: graph.tensor(out_id) }, args);
        self.tensors.stores[out_id.0] = out;
        result
    }

    fn compute(
        &mut self,
        graph: &Graph,
        at: OpAt<'_>,
        out: Out<'_>,
        args: &mut ExecuteArgs<'_>,
    ) -> Result<(), Error> {
        use elementwise::Arith;
        let plan = &self.plans[at.index];
        match *at.op {
            Op::Gather { table, indices, .. } => self.gather(graph, table, indices, out),
            Op::Positions { position, .. } => self.positions(graph, at, position, out),
            Op::MatMul { a, b, transpose_b, bias, .. } => self.mat_mul(graph, [a, b], transpose_b, bias, out),
            Op::Add { a, b, .. } => self.binary(graph, Arith::Add, [a, b], plan, out),
            Op::Sub { a, b, .. } => self.binary(graph, Arith::Sub, [a, b], plan, out),
            Op::Mul { a, b, .. } => self.binary(graph, Arith::Mul, [a, b], plan, out),
            Op::Div { a, b, .. } => self.binary(graph, Arith::Div, [a, b], plan, out),
            Op::Unary { func, input, .. } => self.unary(graph, func, input, out),
            Op::Mean { input, .. } => self.mean(graph, input, out),
            Op::Cast { input, .. } => self.cast(graph, input, out),
            Op::Reshape { .. } => Ok(()), // the output is the input's storage (see `place`)
            Op::Permute { input, .. } => self.permute(graph, input, plan, out),
            Op::Slice { input, axis, start, end, .. } => self.slice(graph, input, axis, start..end, out),
            Op::Concat { a, b, axis, .. } => self.concat(graph, [a, b], axis, out),
            Op::RmsNorm { input, weight, eps, .. } => self.rms_norm(graph, input, weight, eps, out),
            Op::KvCacheUpdate { cache, update, position, .. } => {
                self.kv_cache_update(graph, at, [cache, update, position], out, args)
            }
            Op::CausalAttention { q, k, v, position, scale, softcap, .. } => {
                self.causal_attention(graph, at, [q, k, v, position], (scale, softcap), out, args)
            }
            Op::Argmax { input, .. } => self.argmax(graph, input, out),
            Op::Assign { target, value, .. } => self.assign(graph, [target, value], out, args),
        }
    }

    /// The op's position operand, checked against the rows it handles and the cache length.
    fn position(
        &self,
        graph: &Graph,
        at: OpAt<'_>,
        id: TensorId,
        rows: usize,
        len: usize,
    ) -> Result<usize, Error> {
        let position = self.tensors.read::<i64>(graph, id)?.first().copied().unwrap_or(-1);
        usize::try_from(position)
            .ok()
            .filter(|&p| p.checked_add(rows).is_some_and(|end| end <= len))
            .ok_or_else(|| Error::PositionOutOfRange {
                tensor: graph.tensor(id).name.clone(),
                position,
                op_index: at.index,
                op: at.op.name(),
                rows,
                len,
            })
    }
}

/// An op and its position in the graph, for errors.
#[derive(Debug, Clone, Copy)]
struct OpAt<'a> {
    index: usize,
    op: &'a Op<TensorId>,
}

/// Where every tensor lives (see the module docs), with delegate-owned state allocated and scratch not yet.
fn place(graph: &Graph, args: &ArgMap) -> Result<(Vec<Store>, Vec<Buf>), Error> {
    let mut stores: Vec<Store> = (0..graph.tensors().len())
        .map(|i| match graph.constant(TensorId(i)) {
            Some(_) => Store::Constant,
            None => Store::Scratch(Buf::empty(graph.tensors()[i].dtype)),
        })
        .collect();
    // Caches, assign targets and the outputs that alias them live in the caller's argument, or (caches only)
    // in delegate-owned state.
    let mut state = Vec::with_capacity(graph.state().len());
    for (out, cache) in graph.in_place_pairs() {
        let (cache_store, out_store) = if graph.is_state(cache) {
            let decl = graph.tensor(cache);
            state.push(Buf::zeros(decl.dtype, decl.numel(), &decl.name)?);
            let slot = state.len() - 1;
            (Store::State { slot }, Store::State { slot })
        } else {
            let arg =
                args.inputs.iter().find(|(id, _)| *id == cache).map(|&(_, arg)| arg).ok_or_else(|| {
                    invariant(format!(
                        "in-place input '{}' has no argument position",
                        graph.tensor(cache).name
                    ))
                })?;
            (Store::InPlace { arg }, Store::InPlace { arg })
        };
        stores[cache.0] = cache_store;
        stores[out.0] = out_store;
    }
    // A reshape's output is its input's storage (ops are in SSA order, so the input is placed already).
    for op in graph.ops() {
        if let Op::Reshape { input, out, .. } = *op {
            let root = match stores[input.0] {
                Store::Alias(root) => root,
                _ => input,
            };
            stores[out.0] = Store::Alias(root);
        }
    }
    Ok((stores, state))
}

/// Copies `src` into `dst`, which the argument checks made the same size.
fn copy_bytes(dst: &mut [u8], src: &[u8], decl: &TensorDecl) -> Result<(), Error> {
    if dst.len() != src.len() {
        return Err(invariant(format!(
            "tensor '{}' has {} bytes, its argument {} (the argument checks guarantee they agree)",
            decl.name,
            src.len(),
            dst.len()
        )));
    }
    dst.copy_from_slice(src);
    Ok(())
}

fn invariant(detail: String) -> Error {
    Error::Internal(detail)
}

fn wrong_type(decl: &TensorDecl) -> Error {
    invariant(format!(
        "tensor '{}' is read as another type than its {} (a typing bug)",
        decl.name, decl.dtype
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ref_graph::{ElemType, GraphBuilder};

    #[test]
    fn a_graph_needing_too_much_scratch_is_refused_at_init() {
        let mut b = GraphBuilder::new();
        let x = b.input("x", ElemType::F32, &[1 << 31]).expect("at the element limit");
        let y = b.add("y", x, x).expect("typed");
        b.output(y).expect("declared");
        let graph = b.finish().expect("valid");
        let err = Executor::new(&graph, &ArgMap { inputs: vec![(x, 0)], outputs: vec![(y, 1)] })
            .expect_err("16 GiB of scratch");
        assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
        assert_eq!(err.error_code(), ErrorCode::DelegateMemoryAllocationFailed);
    }
}
