//! The CPU executor: runs a validated [`Graph`] over the arguments of one `execute`, with all scratch memory
//! allocated up front.
//!
//! Where each tensor lives:
//! - constants stay in the [`Graph`];
//! - graph inputs that are not caches are copied from their argument into scratch when a call starts (they
//!   are small: token ids and positions);
//! - a cache input, and the `KvCacheUpdate` output that aliases it, live **in the caller's argument**: the
//!   update writes into it and attention reads from it, so the caller's buffer is the cache;
//! - every other tensor lives in scratch allocated by [`Executor::new`]; graph outputs that alias nothing are
//!   copied into their argument when the ops are done.
//!
//! [`Executor::run`] allocates nothing.
//!
//! The executor computes in `f32` only: a graph with any `f16` tensor (input, constant or intermediate) is
//! refused by [`Executor::new`] with [`Error::F16`] (`NotSupported`); f16 blobs run on a delegate that
//! computes f16, such as the CUDA delegate.

pub mod kernels;

use std::mem;

use delegate_abi::{DelegateError, ExecuteArgs};
use et_error::{ErrorCode, HasErrorCode};

use kernels::CacheShape;
use ref_graph::{Data, ElemType, Graph, Op, TensorId};

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
        /// Which index.
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
    /// The graph has an `f16` tensor; this executor computes `f32` only. `NotSupported`.
    #[error(
        "tensor '{tensor}' is f16: the CPU reference delegate computes f32; run f16 blobs on the CUDA delegate"
    )]
    F16 {
        /// The first `f16` tensor of the graph.
        tensor: String,
    },
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
            Error::F16 { .. } => ErrorCode::NotSupported,
            Error::Internal(_) => ErrorCode::Internal,
        }
    }
}

impl From<DelegateError> for Error {
    fn from(err: DelegateError) -> Error {
        Error::Access(err)
    }
}

/// Where one tensor's values are during a call.
#[derive(Debug)]
enum Store {
    /// In the graph's constant table.
    Constant,
    /// In the caller's argument at this position (a cache, updated in place).
    InPlace { arg: usize },
    /// In the executor's delegate-owned state at this slot (a cache the delegate keeps across calls).
    State { slot: usize },
    /// Delegate-owned `f32` scratch.
    F32(Vec<f32>),
    /// Delegate-owned `i64` scratch.
    I64(Vec<i64>),
}

/// Which argument positions carry which graph tensors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArgMap {
    /// Every graph input, with its argument position.
    pub inputs: Vec<(TensorId, usize)>,
    /// Graph outputs to copy into an argument after the ops ran. Outputs of a `KvCacheUpdate` are not
    /// listed: they are the cache input's storage already (reflecting them into a separate slot is the
    /// delegate's business).
    pub outputs: Vec<(TensorId, usize)>,
}

/// Runs one [`Graph`] with its scratch memory; one per delegate handle.
#[derive(Debug)]
pub struct Executor {
    stores: Vec<Store>,
    /// Delegate-owned state (`Graph::state`), zero-filled at creation and kept across calls.
    state: Vec<Vec<f32>>,
    staged: Vec<(TensorId, usize)>,
    outputs: Vec<(TensorId, usize)>,
    scores: Vec<f32>,
}

fn alloc<T: Clone + Default>(len: usize, tensor: &str) -> Result<Vec<T>, Error> {
    let mut v = Vec::new();
    v.try_reserve_exact(len)
        .map_err(|_| Error::OutOfMemory { tensor: tensor.to_owned(), bytes: len * mem::size_of::<T>() })?;
    v.resize(len, T::default());
    Ok(v)
}

/// The first `f16` tensor of `graph` (in declaration order), which this executor cannot compute, if any.
pub fn first_f16_tensor(graph: &Graph) -> Option<&str> {
    graph.tensors().iter().find(|t| t.dtype == ElemType::F16).map(|t| t.name.as_str())
}

impl Executor {
    /// Allocates scratch for every tensor that needs it. `args` must bind every graph input (the delegate's
    /// binding plan guarantees it). A graph with an `f16` tensor is refused ([`Error::F16`]).
    pub fn new(graph: &Graph, args: &ArgMap) -> Result<Executor, Error> {
        if let Some(tensor) = first_f16_tensor(graph) {
            return Err(Error::F16 { tensor: tensor.to_owned() });
        }
        let mut stores = Vec::with_capacity(graph.tensors().len());
        for (i, decl) in graph.tensors().iter().enumerate() {
            let id = TensorId(i);
            let store = if graph.constant(id).is_some() {
                Store::Constant
            } else {
                match decl.dtype {
                    ElemType::F32 => Store::F32(Vec::new()),
                    ElemType::I64 => Store::I64(Vec::new()),
                    ElemType::F16 | ElemType::Bf16 => return Err(Error::F16 { tensor: decl.name.clone() }),
                }
            };
            stores.push(store);
        }
        // Caches and the outputs that alias them live in the caller's argument, or in delegate-owned state.
        let mut state = Vec::with_capacity(graph.state().len());
        for (out, cache) in graph.in_place_pairs() {
            if graph.is_state(cache) {
                let decl = graph.tensor(cache);
                state.push(alloc(decl.numel(), &decl.name)?);
                stores[cache.0] = Store::State { slot: state.len() - 1 };
                stores[out.0] = Store::State { slot: state.len() - 1 };
                continue;
            }
            let arg = args.inputs.iter().find(|(id, _)| *id == cache).map(|&(_, arg)| arg);
            let arg = arg.ok_or_else(|| {
                Error::Internal(format!(
                    "cache input '{}' has no argument position",
                    graph.tensor(cache).name
                ))
            })?;
            stores[cache.0] = Store::InPlace { arg };
            stores[out.0] = Store::InPlace { arg };
        }
        let scratch: u64 = stores
            .iter()
            .zip(graph.tensors())
            .filter(|(store, _)| matches!(store, Store::F32(_) | Store::I64(_)))
            .map(|(_, decl)| decl.nbytes() as u64)
            .sum();
        if scratch > MAX_SCRATCH_BYTES {
            return Err(Error::OutOfMemory {
                tensor: "(all intermediates)".to_owned(),
                bytes: scratch as usize,
            });
        }
        for (i, store) in stores.iter_mut().enumerate() {
            let decl = &graph.tensors()[i];
            match store {
                Store::F32(v) => *v = alloc(decl.numel(), &decl.name)?,
                Store::I64(v) => *v = alloc(decl.numel(), &decl.name)?,
                Store::Constant | Store::InPlace { .. } | Store::State { .. } => {}
            }
        }
        // Arguments bound to a cache in place are neither staged nor copied out.
        let not_in_place = |bound: &[(TensorId, usize)]| -> Vec<(TensorId, usize)> {
            bound.iter().copied().filter(|(id, _)| !matches!(stores[id.0], Store::InPlace { .. })).collect()
        };
        let staged = not_in_place(&args.inputs);
        let outputs = not_in_place(&args.outputs);
        let longest_cache = graph
            .ops()
            .iter()
            .filter_map(|op| match op {
                Op::CausalAttention { k, .. } => graph.tensor(*k).shape.get(1).copied(),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        let scores = alloc(usize::try_from(longest_cache).unwrap_or(usize::MAX), "attention scores")?;
        Ok(Executor { stores, state, staged, outputs, scores })
    }

    /// Runs every op: stages inputs, computes, updates caches in their arguments, and copies outputs out.
    /// The caller has checked every argument's dtype, shape and size against the graph.
    pub fn run(&mut self, graph: &Graph, args: &mut ExecuteArgs<'_>) -> Result<(), Error> {
        for &(id, arg) in &self.staged {
            let ([bytes], []) = args.borrow([arg], [])?;
            match &mut self.stores[id.0] {
                Store::F32(v) => decode_into(bytes, v, f32::from_ne_bytes),
                Store::I64(v) => decode_into(bytes, v, i64::from_ne_bytes),
                Store::Constant | Store::InPlace { .. } | Store::State { .. } => {}
            }
        }
        for (index, op) in graph.ops().iter().enumerate() {
            self.run_op(graph, index, op, args)?;
        }
        for &(id, arg) in &self.outputs {
            let ([], [bytes]) = args.borrow([], [arg])?;
            match &self.stores[id.0] {
                Store::F32(v) => encode_into(v, bytes, f32::to_ne_bytes),
                Store::I64(v) => encode_into(v, bytes, i64::to_ne_bytes),
                Store::Constant | Store::InPlace { .. } | Store::State { .. } => {}
            }
        }
        Ok(())
    }

    fn f32s<'a>(&'a self, graph: &'a Graph, id: TensorId) -> &'a [f32] {
        match (&self.stores[id.0], graph.constant(id)) {
            (Store::F32(v), _) => v,
            (Store::Constant, Some(Data::F32(v))) => v,
            _ => &[],
        }
    }

    fn i64s<'a>(&'a self, graph: &'a Graph, id: TensorId) -> &'a [i64] {
        match (&self.stores[id.0], graph.constant(id)) {
            (Store::I64(v), _) => v,
            (Store::Constant, Some(Data::I64(v))) => v,
            _ => &[],
        }
    }

    fn state_slot(&self, id: TensorId) -> Option<usize> {
        match self.stores[id.0] {
            Store::State { slot } => Some(slot),
            _ => None,
        }
    }

    fn in_place_arg(&self, graph: &Graph, id: TensorId) -> Result<usize, Error> {
        match self.stores[id.0] {
            Store::InPlace { arg } => Ok(arg),
            _ => Err(Error::Internal(format!(
                "tensor '{}' should live in a caller argument (graph validation guarantees it)",
                graph.tensor(id).name
            ))),
        }
    }

    /// The op's position operand, checked against the rows it handles and the cache length.
    fn position(
        &self,
        graph: &Graph,
        index: usize,
        op: &Op<TensorId>,
        id: TensorId,
        rows: usize,
        len: usize,
    ) -> Result<usize, Error> {
        let position = self.i64s(graph, id).first().copied().unwrap_or(-1);
        usize::try_from(position)
            .ok()
            .filter(|&p| p.checked_add(rows).is_some_and(|end| end <= len))
            .ok_or_else(|| Error::PositionOutOfRange {
                tensor: graph.tensor(id).name.clone(),
                position,
                op_index: index,
                op: op.name(),
                rows,
                len,
            })
    }

    fn run_op(
        &mut self,
        graph: &Graph,
        index: usize,
        op: &Op<TensorId>,
        args: &mut ExecuteArgs<'_>,
    ) -> Result<(), Error> {
        let out_id = op.output();
        // SSA: no op reads its own output, so the output's scratch can be taken out while operands are read.
        // It goes back whatever the op's outcome, so a failed call leaves the executor usable.
        let mut out = mem::replace(&mut self.stores[out_id.0], Store::Constant);
        let result = self.compute(graph, index, op, &mut out, args);
        self.stores[out_id.0] = out;
        result
    }

    fn compute(
        &mut self,
        graph: &Graph,
        index: usize,
        op: &Op<TensorId>,
        out: &mut Store,
        args: &mut ExecuteArgs<'_>,
    ) -> Result<(), Error> {
        match (op, out) {
            (&Op::Gather { table, indices, .. }, Store::F32(out)) => {
                let cols = graph.tensor(table).shape[1] as usize;
                let name = &graph.tensor(table).name;
                kernels::gather(self.f32s(graph, table), cols, self.i64s(graph, indices), out, name)
            }
            (&Op::Positions { position, .. }, Store::I64(out)) => {
                let start = self.i64s(graph, position).first().copied().unwrap_or(0);
                let mut result = Ok(());
                for (t, o) in out.iter_mut().enumerate() {
                    match i64::try_from(t).ok().and_then(|t| start.checked_add(t)) {
                        Some(p) => *o = p,
                        None => {
                            result = Err(Error::PositionOutOfRange {
                                tensor: graph.tensor(position).name.clone(),
                                position: start,
                                op_index: index,
                                op: op.name(),
                                rows: out.len(),
                                len: usize::MAX,
                            });
                            break;
                        }
                    }
                }
                result
            }
            (&Op::MatMul { a, b, .. }, Store::F32(out)) => {
                let shape = &graph.tensor(b).shape;
                kernels::mat_mul(self.f32s(graph, a), self.f32s(graph, b), shape[0] as usize, shape[1] as usize, out);
                Ok(())
            }
            (&Op::Add { a, b, .. }, Store::F32(out)) => {
                kernels::add(self.f32s(graph, a), self.f32s(graph, b), out);
                Ok(())
            }
            (&Op::RmsNorm { input, weight, eps, .. }, Store::F32(out)) => {
                kernels::rms_norm(self.f32s(graph, input), self.f32s(graph, weight), eps, out);
                Ok(())
            }
            (&Op::KvCacheUpdate { cache, update, position, .. }, Store::InPlace { .. } | Store::State { .. }) => {
                let shape = cache_shape(graph, cache);
                let rows = graph.tensor(update).shape[0] as usize;
                let position = self.position(graph, index, op, position, rows, shape.len)?;
                let update_values = match (&self.stores[update.0], graph.constant(update)) {
                    (Store::F32(values), _) => values.as_slice(),
                    (Store::Constant, Some(Data::F32(values))) => values.as_slice(),
                    _ => &[],
                };
                match self.stores[cache.0] {
                    Store::State { slot } => {
                        kernels::kv_cache_update(&mut self.state[slot], shape, update_values, position)
                    }
                    _ => {
                        let arg = self.in_place_arg(graph, cache)?;
                        let ([], [bytes]) = args.borrow([], [arg])?;
                        kernels::kv_cache_update(as_f32_mut(bytes, arg)?, shape, update_values, position);
                    }
                }
                Ok(())
            }
            (&Op::CausalAttention { q, k, v, position, .. }, Store::F32(out)) => {
                let shape = cache_shape(graph, k);
                let rows = graph.tensor(q).shape[0] as usize;
                let position = self.position(graph, index, op, position, rows, shape.len)?;
                // Each cache is in the caller's argument or in delegate-owned state.
                let (k_state, v_state) = (self.state_slot(k), self.state_slot(v));
                let (k_arg, v_arg) = (self.in_place_arg(graph, k), self.in_place_arg(graph, v));
                let borrowed;
                let (k_values, v_values): (&[f32], &[f32]) = match (k_state, v_state) {
                    (Some(k), Some(v)) => (&self.state[k], &self.state[v]),
                    (Some(k), None) => {
                        let v_arg = v_arg?;
                        borrowed = args.borrow([v_arg], [])?;
                        (&self.state[k], as_f32(borrowed.0[0], v_arg)?)
                    }
                    (None, Some(v)) => {
                        let k_arg = k_arg?;
                        borrowed = args.borrow([k_arg], [])?;
                        (as_f32(borrowed.0[0], k_arg)?, &self.state[v])
                    }
                    (None, None) => {
                        let (k_arg, v_arg) = (k_arg?, v_arg?);
                        let ([k_bytes, v_bytes], []) = args.borrow([k_arg, v_arg], [])?;
                        (as_f32(k_bytes, k_arg)?, as_f32(v_bytes, v_arg)?)
                    }
                };
                let q_values = match (&self.stores[q.0], graph.constant(q)) {
                    (Store::F32(values), _) => values.as_slice(),
                    (Store::Constant, Some(Data::F32(values))) => values.as_slice(),
                    _ => &[],
                };
                kernels::causal_attention(q_values, k_values, v_values, shape, position, &mut self.scores, out);
                Ok(())
            }
            (&Op::Argmax { input, .. }, Store::I64(out)) => {
                let cols = graph.tensor(input).shape[1] as usize;
                let values = self.f32s(graph, input);
                let last_row = &values[values.len().saturating_sub(cols)..];
                out.fill(ref_graph::argmax(last_row) as i64);
                Ok(())
            }
            _ => Err(Error::Internal(format!(
                "op {index} ({}) has an output store its kernel cannot write (graph validation guarantees it)",
                op.name()
            ))),
        }
    }
}

fn cache_shape(graph: &Graph, cache: TensorId) -> CacheShape {
    let shape = &graph.tensor(cache).shape;
    CacheShape { heads: shape[0] as usize, len: shape[1] as usize, head_dim: shape[2] as usize }
}

fn as_f32(bytes: &[u8], arg: usize) -> Result<&[f32], Error> {
    bytemuck::try_cast_slice(bytes).map_err(|_| misaligned(arg))
}

fn as_f32_mut(bytes: &mut [u8], arg: usize) -> Result<&mut [f32], Error> {
    bytemuck::try_cast_slice_mut(bytes).map_err(|_| misaligned(arg))
}

fn misaligned(arg: usize) -> Error {
    Error::Access(DelegateError::invalid_argument(format!(
        "argument {arg} is not aligned to 4 bytes, which an f32 cache updated in place needs"
    )))
}

/// Reads native-endian values from caller bytes of any alignment.
fn decode_into<T, const N: usize>(bytes: &[u8], out: &mut [T], read: fn([u8; N]) -> T) {
    for (o, chunk) in out.iter_mut().zip(bytes.chunks_exact(N)) {
        if let Ok(array) = chunk.try_into() {
            *o = read(array);
        }
    }
}

/// Writes native-endian values into caller bytes of any alignment.
fn encode_into<T: Copy, const N: usize>(values: &[T], out: &mut [u8], write: fn(T) -> [u8; N]) {
    for (&v, chunk) in values.iter().zip(out.chunks_exact_mut(N)) {
        chunk.copy_from_slice(&write(v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ref_graph::GraphBuilder;

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
