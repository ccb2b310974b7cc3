//! [`GraphBuilder`]: builds a [`Graph`] op by op, inferring every output's type and shape.

use std::collections::BTreeMap;

use crate::{Data, ElemType, Error, Graph, Op, TensorDecl, TensorId, UnaryFn};

/// The payload 1.3 attributes of a [`GraphBuilder::mat_mul_with`]; the default is the plain 1.0 `mat_mul`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MatMulOptions {
    /// Whether `b` is stored `[N, K]` (a `torch.nn.Linear` weight).
    pub transpose_b: bool,
    /// A `[N]` vector added to every output row.
    pub bias: Option<TensorId>,
}

/// The optional attributes of a [`GraphBuilder::causal_attention_with`]; the default is the plain 1.0
/// `causal_attention` (scale `1 / sqrt(Dh)`, no cap).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AttentionOptions {
    /// The score scale (payload 1.3); `None` means `1 / sqrt(Dh)`.
    pub scale: Option<f32>,
    /// Logit soft-capping `c`: scores become `c * tanh(s / c)` (payload 1.4); `None` means no cap.
    pub softcap: Option<f32>,
}

/// Builds a [`Graph`]: declare inputs and constants, add ops (each returns its output tensor, with type and
/// shape inferred and checked), mark outputs, then [`GraphBuilder::finish`] validates the whole graph.
///
/// ```
/// use ref_graph::{ElemType, GraphBuilder};
///
/// let mut b = GraphBuilder::new();
/// let x = b.input("x", ElemType::F32, &[1, 2])?;
/// let w = b.constant_f32("w", &[2, 3], vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0])?;
/// let y = b.mat_mul("y", x, w)?;
/// b.output(y)?;
/// let graph = b.finish()?;
/// assert_eq!(graph.tensor(y).shape, [1, 3]);
/// # Ok::<(), ref_graph::Error>(())
/// ```
#[derive(Debug)]
pub struct GraphBuilder {
    /// The graph so far, never observed outside this builder until [`GraphBuilder::finish`] validates it.
    graph: Graph,
}

impl Default for GraphBuilder {
    fn default() -> GraphBuilder {
        let graph = Graph {
            tensors: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            constants: BTreeMap::new(),
            state: Vec::new(),
            ops: Vec::new(),
        };
        GraphBuilder { graph }
    }
}

impl GraphBuilder {
    /// An empty graph.
    pub fn new() -> GraphBuilder {
        GraphBuilder::default()
    }

    fn declare(&mut self, name: &str, dtype: ElemType, shape: &[u64]) -> Result<TensorId, Error> {
        if name.is_empty() {
            return Err(Error::BadTensorName { name: String::new(), problem: "empty" });
        }
        if self.graph.tensors.iter().any(|t| t.name == name) {
            return Err(Error::BadTensorName { name: name.to_owned(), problem: "declared twice" });
        }
        let decl = TensorDecl { name: name.to_owned(), dtype, shape: shape.to_vec() };
        crate::check_shape(&decl)?;
        self.graph.tensors.push(decl);
        Ok(TensorId(self.graph.tensors.len() - 1))
    }

    /// Declares a graph input. Callers bind it by `name`.
    pub fn input(&mut self, name: &str, dtype: ElemType, shape: &[u64]) -> Result<TensorId, Error> {
        let id = self.declare(name, dtype, shape)?;
        self.graph.inputs.push(id);
        Ok(id)
    }

    /// Declares delegate-owned state (payload 1.2): a cache the executor allocates zero-filled when it is
    /// created and keeps across calls, for a program whose caches live inside the delegate (ExecuTorch's
    /// `tag_mutated_buffer`). It is not a graph input: no blob binding names it. It must be the `cache` of one
    /// [`GraphBuilder::kv_cache_update`], whose output may not be a graph output.
    pub fn state(&mut self, name: &str, dtype: ElemType, shape: &[u64]) -> Result<TensorId, Error> {
        let id = self.declare(name, dtype, shape)?;
        self.graph.state.push(id);
        Ok(id)
    }

    /// Declares an `f32` constant (a weight) with its values in row-major order.
    pub fn constant_f32(&mut self, name: &str, shape: &[u64], values: Vec<f32>) -> Result<TensorId, Error> {
        self.constant(name, shape, Data::F32(values))
    }

    /// Declares an `f16` constant (a weight) with its values in row-major order.
    pub fn constant_f16(
        &mut self,
        name: &str,
        shape: &[u64],
        values: Vec<half::f16>,
    ) -> Result<TensorId, Error> {
        self.constant(name, shape, Data::F16(values))
    }

    /// Declares a `bf16` constant (a weight) with its values in row-major order (payload 1.3).
    pub fn constant_bf16(
        &mut self,
        name: &str,
        shape: &[u64],
        values: Vec<half::bf16>,
    ) -> Result<TensorId, Error> {
        self.constant(name, shape, Data::Bf16(values))
    }

    /// Declares an `i64` constant with its values in row-major order.
    pub fn constant_i64(&mut self, name: &str, shape: &[u64], values: Vec<i64>) -> Result<TensorId, Error> {
        self.constant(name, shape, Data::I64(values))
    }

    fn constant(&mut self, name: &str, shape: &[u64], data: Data) -> Result<TensorId, Error> {
        let id = self.declare(name, data.dtype(), shape)?;
        let decl = &self.graph.tensors[id.0];
        if decl.numel() != data.len() {
            let nbytes = (data.len() * data.dtype().size_bytes()) as u64;
            let problem = format!("has {} values but shape {shape:?} needs {}", data.len(), decl.numel());
            self.graph.tensors.pop();
            return Err(Error::BadConstant { name: name.to_owned(), offset: 0, nbytes, problem });
        }
        self.graph.constants.insert(id, data);
        Ok(id)
    }

    /// Marks `id` as a graph output. Callers bind it by its name.
    pub fn output(&mut self, id: TensorId) -> Result<(), Error> {
        if id.0 >= self.graph.tensors.len() {
            return Err(Error::DanglingTensor {
                context: "graph outputs".to_owned(),
                name: format!("#{}", id.0),
            });
        }
        self.graph.outputs.push(id);
        Ok(())
    }

    /// Adds an op whose output is a new tensor `name`; `make` receives the output's id.
    fn op(&mut self, name: &str, make: impl FnOnce(TensorId) -> Op<TensorId>) -> Result<TensorId, Error> {
        let out = TensorId(self.graph.tensors.len());
        let op = make(out);
        let index = self.graph.ops.len();
        for operand in op.operands() {
            if operand.0 >= self.graph.tensors.len() {
                return Err(Error::DanglingTensor {
                    context: format!("op {index} ({})", op.name()),
                    name: format!("#{}", operand.0),
                });
            }
        }
        let (dtype, shape) = op.infer(&self.graph.tensors).map_err(|detail| Error::OpMismatch {
            index,
            op: op.name(),
            detail,
        })?;
        let id = self.declare(name, dtype, &shape)?;
        debug_assert_eq!(id, out);
        self.graph.ops.push(op);
        Ok(id)
    }

    /// `out[t, :] = table[indices[t], :]`, see [`Op::Gather`].
    pub fn gather(&mut self, name: &str, table: TensorId, indices: TensorId) -> Result<TensorId, Error> {
        self.op(name, |out| Op::Gather { table, indices, out })
    }

    /// `out[t] = position + t` for `t` in `0..count`, see [`Op::Positions`].
    pub fn positions(&mut self, name: &str, position: TensorId, count: u64) -> Result<TensorId, Error> {
        self.op(name, |out| Op::Positions { position, count, out })
    }

    /// `a b`, see [`Op::MatMul`].
    pub fn mat_mul(&mut self, name: &str, a: TensorId, b: TensorId) -> Result<TensorId, Error> {
        self.op(name, |out| Op::MatMul { a, b, transpose_b: false, bias: None, out })
    }

    /// `a b`, with `b` stored `[N, K]` and a bias as `options` say (payload 1.3), see [`Op::MatMul`].
    pub fn mat_mul_with(
        &mut self,
        name: &str,
        a: TensorId,
        b: TensorId,
        options: MatMulOptions,
    ) -> Result<TensorId, Error> {
        let MatMulOptions { transpose_b, bias } = options;
        self.op(name, |out| Op::MatMul { a, b, transpose_b, bias, out })
    }

    /// `a + b`, broadcasting, see [`Op::Add`].
    pub fn add(&mut self, name: &str, a: TensorId, b: TensorId) -> Result<TensorId, Error> {
        self.op(name, |out| Op::Add { a, b, out })
    }

    /// `a - b`, broadcasting, see [`Op::Sub`].
    pub fn sub(&mut self, name: &str, a: TensorId, b: TensorId) -> Result<TensorId, Error> {
        self.op(name, |out| Op::Sub { a, b, out })
    }

    /// `a * b`, broadcasting, see [`Op::Mul`].
    pub fn mul(&mut self, name: &str, a: TensorId, b: TensorId) -> Result<TensorId, Error> {
        self.op(name, |out| Op::Mul { a, b, out })
    }

    /// `a / b`, broadcasting, see [`Op::Div`].
    pub fn div(&mut self, name: &str, a: TensorId, b: TensorId) -> Result<TensorId, Error> {
        self.op(name, |out| Op::Div { a, b, out })
    }

    /// `func(input)` elementwise, see [`Op::Unary`].
    pub fn unary(&mut self, name: &str, func: UnaryFn, input: TensorId) -> Result<TensorId, Error> {
        self.op(name, |out| Op::Unary { func, input, out })
    }

    /// The mean over the last axis, kept as an axis of 1; see [`Op::Mean`].
    pub fn mean(&mut self, name: &str, input: TensorId) -> Result<TensorId, Error> {
        self.op(name, |out| Op::Mean { input, out })
    }

    /// `input` converted to `dtype`, see [`Op::Cast`].
    pub fn cast(&mut self, name: &str, input: TensorId, dtype: ElemType) -> Result<TensorId, Error> {
        self.op(name, |out| Op::Cast { input, dtype, out })
    }

    /// `input` seen as `shape`, see [`Op::Reshape`].
    pub fn reshape(&mut self, name: &str, input: TensorId, shape: &[u64]) -> Result<TensorId, Error> {
        self.op(name, |out| Op::Reshape { input, shape: shape.to_vec(), out })
    }

    /// `input`'s axes reordered by `dims`, see [`Op::Permute`].
    pub fn permute(&mut self, name: &str, input: TensorId, dims: &[u64]) -> Result<TensorId, Error> {
        self.op(name, |out| Op::Permute { input, dims: dims.to_vec(), out })
    }

    /// `input[.., start..end, ..]` along `axis`, see [`Op::Slice`].
    pub fn slice(
        &mut self,
        name: &str,
        input: TensorId,
        axis: u64,
        start: u64,
        end: u64,
    ) -> Result<TensorId, Error> {
        self.op(name, |out| Op::Slice { input, axis, start, end, out })
    }

    /// `a` and `b` joined along `axis`, see [`Op::Concat`].
    pub fn concat(&mut self, name: &str, a: TensorId, b: TensorId, axis: u64) -> Result<TensorId, Error> {
        self.op(name, |out| Op::Concat { a, b, axis, out })
    }

    /// RMS norm of each row, see [`Op::RmsNorm`].
    pub fn rms_norm(
        &mut self,
        name: &str,
        input: TensorId,
        weight: TensorId,
        eps: f32,
    ) -> Result<TensorId, Error> {
        self.op(name, |out| Op::RmsNorm { input, weight, eps, out })
    }

    /// In-place cache update; the returned tensor aliases `cache`. See [`Op::KvCacheUpdate`].
    pub fn kv_cache_update(
        &mut self,
        name: &str,
        cache: TensorId,
        update: TensorId,
        position: TensorId,
    ) -> Result<TensorId, Error> {
        self.op(name, |out| Op::KvCacheUpdate { cache, update, position, out })
    }

    /// Causal attention over caches, see [`Op::CausalAttention`].
    pub fn causal_attention(
        &mut self,
        name: &str,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        position: TensorId,
    ) -> Result<TensorId, Error> {
        self.causal_attention_with(name, [q, k, v, position], AttentionOptions::default())
    }

    /// Causal attention with an explicit score `scale` (payload 1.3), see [`Op::CausalAttention`].
    pub fn causal_attention_scaled(
        &mut self,
        name: &str,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        position: TensorId,
        scale: f32,
    ) -> Result<TensorId, Error> {
        self.causal_attention_with(
            name,
            [q, k, v, position],
            AttentionOptions { scale: Some(scale), softcap: None },
        )
    }

    /// Causal attention with explicit `options` (a score scale, logit soft-capping: payload 1.3 and 1.4),
    /// see [`Op::CausalAttention`].
    pub fn causal_attention_with(
        &mut self,
        name: &str,
        [q, k, v, position]: [TensorId; 4],
        options: AttentionOptions,
    ) -> Result<TensorId, Error> {
        let AttentionOptions { scale, softcap } = options;
        self.op(name, |out| Op::CausalAttention { q, k, v, position, scale, softcap, out })
    }

    /// The index of the largest value of `input`'s last row, as `i64 [1]`; see [`Op::Argmax`].
    pub fn argmax(&mut self, name: &str, input: TensorId) -> Result<TensorId, Error> {
        self.op(name, |out| Op::Argmax { input, out })
    }

    /// Writes `value` into `target` in place (payload 1.3); the returned tensor aliases `target`. See
    /// [`Op::Assign`].
    pub fn assign(&mut self, name: &str, target: TensorId, value: TensorId) -> Result<TensorId, Error> {
        self.op(name, |out| Op::Assign { target, value, out })
    }

    /// The tensors declared so far (tests read inferred types here).
    #[cfg(test)]
    pub(crate) fn declared(&self) -> &[TensorDecl] {
        &self.graph.tensors
    }

    /// Validates and returns the graph.
    pub fn finish(self) -> Result<Graph, Error> {
        self.graph.validate()?;
        Ok(self.graph)
    }
}
