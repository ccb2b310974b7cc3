//! The reference graph: a typed op graph with static shapes and its `RGRF` payload encoding, the engine that
//! a native blob of payload kind `reference-graph` carries.
//!
//! This crate is a format: it builds, validates, encodes and decodes graphs and says which outputs alias which
//! inputs; it runs nothing. The reference delegate (`plugins/reference`) executes a graph on the CPU; the
//! example decoder (`kv-example`) builds one; any other delegate that wants to run the same payload reads it
//! here.
//!
//! A [`Graph`] is in static single-assignment form: every tensor is a graph input, a constant, or the output
//! of exactly one op, and ops are listed in an order where every operand is defined before it is used. All
//! shapes are static. A graph is only ever observed valid: [`GraphBuilder::finish`] and [`Graph::decode`]
//! both run the same checks ([`Graph::validate`]), so an executor never meets a malformed graph.
//!
//! ## Aliasing
//!
//! [`Op::KvCacheUpdate`] writes rows of its `cache` operand *in place* and its output is that same storage,
//! exactly like TensorRT's `IKVCacheUpdateLayer`. The graph therefore reports the alias through
//! [`alias_validate::EngineIntrospect`] (implemented here, next to the graph, because which outputs alias which
//! inputs is a fact of the format), and the validation rules below keep in-place tensors out of every op
//! that could observe the difference between "updated in place" and "a fresh value":
//! - the `cache` operand of a `KvCacheUpdate` is a graph input or delegate-owned state, and no other op reads
//!   it;
//! - the output of a `KvCacheUpdate` is read only as the `k`/`v` operand of [`Op::CausalAttention`] (or is a
//!   graph output);
//! - the `k`/`v` operands of `CausalAttention` are `KvCacheUpdate` outputs.
//!
//! [`Op::Assign`] (payload 1.3) overwrites its `target` in place (a program's mutable buffer such as Hugging
//! Face StaticCache's `cumulative_length`) and is reported the same way, so the blob declares its output as an
//! alias of kind `kv_cache_update` (the engine's own in-place write, verified against the graph). Its rules:
//! - the `target` is a graph input that no other op reads and that no other op writes in place;
//! - no op reads the output of an `Assign` (it may be a graph output).
//!
//! ## Element types
//!
//! [`ElemType`] is the closed set of element types a graph computes in (`f32`, `f16` or `bf16` for float
//! data, and `i64` for token ids, positions and index arithmetic), a subset of `blob_format::model::DType`
//! with the same names; [`ElemType::dtype`] converts. Keeping the subset as its own type lets validation and
//! executors match it exhaustively instead of refusing five other dtypes at every use.
//!
//! Every float op (see [`Op`]) accepts `f32`, `f16` or `bf16`: all float operands of one op share one float
//! dtype and the op's output takes it. A graph changes element type only through [`Op::Cast`] (payload 1.3;
//! e.g. a bf16 model casting its logits to `f32`, or `i64` positions to the model's float type). `f16`
//! values are IEEE 754 binary16 ([`half::f16`]) and `bf16` values bfloat16 ([`half::bf16`], f32's exponent
//! with 8 bits of mantissa), both re-exported through [`half`]; constants hold them little-endian. How an
//! executor computes the half types (e.g. in `f32`, rounding each op's result to the storage type) is its
//! own business. `add`, `sub` and `mul` also take two `i64` operands (index arithmetic such as
//! `cache_position + 1`).
//!
//! ## Payload encoding
//!
//! [`Graph::encode`] writes, and [`Graph::decode`] reads:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | magic [`PAYLOAD_MAGIC`] |
//! | 4 | 2 | u16 LE major version ([`PAYLOAD_VERSION_MAJOR`]; a newer major is refused) |
//! | 6 | 2 | u16 LE minor version (a newer minor reads; unknown JSON fields are ignored) |
//! | 8 | 4 | u32 LE length of the JSON description |
//! | 12 | 4 | reserved, zero |
//! | 16 | n | JSON description: tensors, inputs, outputs, constants (offset + length), ops |
//! | 16 + n | | zero padding to a multiple of [`CONSTANT_ALIGN`]: the constant section starts here |
//!
//! Constants are little-endian, each at an offset (relative to the constant section) that is a multiple of
//! [`CONSTANT_ALIGN`]. Decoding checks every extent with checked arithmetic and never panics. A packer that
//! should not hold a model's weights reads the description alone with [`Graph::from_description_extents`] (a
//! `Graph<`[`Extent`]`>`: each constant's place in a constant section held elsewhere, checked as decoding
//! checks it) and writes the same payload with [`Graph::write_payload`], copying the constants from the
//! section a chunk at a time.
//!
//! Versions, each a superset of the one before:
//!
//! | version | adds |
//! |---|---|
//! | 1.0 | `f32`/`i64` tensors; `gather`, `positions`, `mat_mul`, `add`, `rms_norm`, `kv_cache_update`, `causal_attention` |
//! | 1.1 | the `f16` element type; `argmax` |
//! | 1.2 | delegate-owned `state` (below) |
//! | 1.3 | the `bf16` element type; `sub`, `mul`, `div`, `unary`, `mean`, `cast`, `reshape`, `permute`, `slice`, `concat`; `mat_mul`'s `transpose_b` and `bias`, `causal_attention`'s `scale`; relaxed forms of the older ops: broadcasting and `i64` `add`, indices of any rank for `gather`, leading axes for `mat_mul`'s `a`, `rms_norm` and `argmax`, `[1, H, L, Dh]` caches, head-major updates and queries, grouped-query attention; `assign` |
//! | 1.4 | `causal_attention`'s `softcap` (logit soft-capping, Gemma 2), written as the op `causal_attention_softcapped` |
//!
//! [`Graph::encode`] writes the oldest version that expresses the graph ([`Graph::payload_version`]): 1.4
//! when it has a soft-capped attention, else 1.3 when it uses anything 1.3 added, else 1.2 when it has state,
//! else 1.1. An older reader refuses a graph that uses an addition with a typed error naming it (`bf16` as an
//! unknown dtype, a new op as an unknown op, a state cache as a tensor read before anything defines it, a
//! relaxed form as an operand of the wrong rank or shape). A new attribute is an unknown JSON field, which an
//! older reader ignores; one that changes what an op computes therefore also changes the op's name on the
//! wire, so an older reader refuses it as an unknown op instead of computing something else: a soft-capped
//! attention is written as `causal_attention_softcapped` (read back as `causal_attention` with its
//! `softcap`; a 1.3 reader refuses it), never as a `causal_attention` a 1.3 reader would run uncapped.
//!
//! ## Delegate-owned state
//!
//! A graph may keep its caches inside the delegate instead of in caller-owned storage (ExecuTorch's
//! `tag_mutated_buffer` design): [`GraphBuilder::state`] declares such a tensor. It is defined by the
//! executor, zero-filled when the executor is created and kept across calls; no blob binding names it and it
//! is not a delegate argument. Each state tensor is the `cache` of exactly one `kv_cache_update`, and that
//! update's output is read only by `causal_attention` (never a graph output, since no caller storage backs
//! it).
//!
//! ## Examples
//!
//! Build a small graph, encode it, read it back, and ask it about its alias:
//!
//! ```
//! use alias_validate::EngineIntrospect;
//! use ref_graph::{ElemType, Graph, GraphBuilder};
//!
//! let mut b = GraphBuilder::new();
//! let pos = b.input("input_pos", ElemType::I64, &[1])?;
//! let cache = b.input("k_cache", ElemType::F32, &[1, 4, 2])?;
//! let row = b.input("k", ElemType::F32, &[1, 2])?;
//! let updated = b.kv_cache_update("k_cache_out", cache, row, pos)?;
//! b.output(updated)?;
//! let graph = b.finish()?;
//!
//! let payload = graph.encode();
//! assert_eq!(&payload[..4], &ref_graph::PAYLOAD_MAGIC);
//! let decoded = Graph::decode(&payload)?;
//! assert_eq!(decoded, graph);
//! assert_eq!(decoded.aliased_input("k_cache_out").as_deref(), Some("k_cache"));
//! # Ok::<(), ref_graph::Error>(())
//! ```
//!
//! ## Feature Flags
//!
//! None.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod builder;
mod constant;
mod error;
mod ops;
mod payload;
mod stream;
mod typing;

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use alias_validate::{EngineIntrospect, EngineTensor};
use blob_format::model::{DType, Dim, Role};
use serde::{Deserialize, Serialize};

pub use builder::{AttentionOptions, GraphBuilder, MatMulOptions};
pub use constant::{ConstantStorage, Extent};
pub use error::Error;
/// The `half` crate, whose [`half::f16`] and [`half::bf16`] are the elements of [`Data::F16`] and
/// [`Data::Bf16`].
pub use half;
pub use ops::{argmax, Op, UnaryFn};
pub use payload::{
    CONSTANT_ALIGN, PAYLOAD_MAGIC, PAYLOAD_MINOR_DECODER_OPS, PAYLOAD_MINOR_WITHOUT_STATE,
    PAYLOAD_MINOR_WITH_STATE, PAYLOAD_VERSION_MAJOR, PAYLOAD_VERSION_MINOR,
};
pub use stream::StreamError;
pub use typing::broadcast_shape;

/// Largest number of elements one tensor may have (2^31), so that a hostile payload cannot make `init`
/// allocate without bound.
pub const MAX_ELEMENTS: u64 = 1 << 31;

/// Element type of a graph tensor: graphs compute in `f32`, `f16` or `bf16`; `i64` carries token ids,
/// positions and index arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ElemType {
    /// 32-bit float.
    F32,
    /// 16-bit float (IEEE 754 binary16, [`half::f16`]). Payload version 1.1 and later.
    F16,
    /// 16-bit brain float ([`half::bf16`]: f32's exponent, 8 bits of mantissa). Payload version 1.3 and later.
    Bf16,
    /// Signed 64-bit integer.
    I64,
}

impl ElemType {
    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            ElemType::F32 => 4,
            ElemType::F16 | ElemType::Bf16 => 2,
            ElemType::I64 => 8,
        }
    }

    /// The blob-format dtype with the same meaning.
    pub const fn dtype(self) -> DType {
        match self {
            ElemType::F32 => DType::F32,
            ElemType::F16 => DType::F16,
            ElemType::Bf16 => DType::BF16,
            ElemType::I64 => DType::I64,
        }
    }

    /// Whether this is a float type (`f32`, `f16` or `bf16`), the types float ops compute in.
    pub const fn is_float(self) -> bool {
        matches!(self, ElemType::F32 | ElemType::F16 | ElemType::Bf16)
    }

    /// `"f32"`, `"f16"`, `"bf16"` or `"i64"`.
    pub const fn name(self) -> &'static str {
        self.dtype().name()
    }
}

impl fmt::Display for ElemType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Index of a tensor in [`Graph::tensors`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TensorId(pub usize);

/// A declared tensor: name, element type and static shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorDecl {
    /// Unique name; graph inputs and outputs bind to blob bindings by this name.
    pub name: String,
    /// Element type.
    pub dtype: ElemType,
    /// Static extents, each at least 1.
    pub shape: Vec<u64>,
}

impl TensorDecl {
    /// Number of elements. Validation guarantees it is at most [`MAX_ELEMENTS`], so it fits in `usize`.
    pub fn numel(&self) -> usize {
        let n: u64 = self.shape.iter().product();
        usize::try_from(n).expect("validation bounds every tensor by MAX_ELEMENTS, which fits in usize")
    }

    /// Size of the tensor's data in bytes.
    pub fn nbytes(&self) -> usize {
        self.numel() * self.dtype.size_bytes()
    }
}

/// A constant's values.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    /// `f32` values.
    F32(Vec<f32>),
    /// `f16` values.
    F16(Vec<half::f16>),
    /// `bf16` values.
    Bf16(Vec<half::bf16>),
    /// `i64` values.
    I64(Vec<i64>),
}

impl Data {
    /// The element type.
    pub fn dtype(&self) -> ElemType {
        match self {
            Data::F32(_) => ElemType::F32,
            Data::F16(_) => ElemType::F16,
            Data::Bf16(_) => ElemType::Bf16,
            Data::I64(_) => ElemType::I64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::F16(v) => v.len(),
            Data::Bf16(v) => v.len(),
            Data::I64(v) => v.len(),
        }
    }

    /// The values as little-endian bytes, as the payload's constant section holds them.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len() * self.dtype().size_bytes());
        match self {
            Data::F32(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Data::F16(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Data::Bf16(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Data::I64(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        }
        out
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A validated op graph. Build one with [`GraphBuilder`] or read one with [`Graph::decode`].
///
/// `C` is how the graph holds its constants: their values ([`Data`], the default: every graph built, decoded
/// or read from a description with its constant section), or where their bytes lie in a constant section
/// held elsewhere ([`Extent`]: [`Graph::from_description_extents`], which a packer streams from a file without
/// holding the weights; see [`Graph::write_payload`]). Both are validated by the same rules.
#[derive(Debug, Clone, PartialEq)]
pub struct Graph<C = Data> {
    tensors: Vec<TensorDecl>,
    inputs: Vec<TensorId>,
    outputs: Vec<TensorId>,
    constants: BTreeMap<TensorId, C>,
    state: Vec<TensorId>,
    ops: Vec<Op<TensorId>>,
}

impl<C> Graph<C> {
    /// Every declared tensor; [`TensorId`] indexes this list.
    pub fn tensors(&self) -> &[TensorDecl] {
        &self.tensors
    }

    /// The declaration of `id`.
    ///
    /// `id` must come from this graph (ids from another graph may be out of range and panic).
    pub fn tensor(&self, id: TensorId) -> &TensorDecl {
        &self.tensors[id.0]
    }

    /// The tensor named `name`.
    pub fn find(&self, name: &str) -> Option<TensorId> {
        self.tensors.iter().position(|t| t.name == name).map(TensorId)
    }

    /// Graph inputs, in the graph's order (the caller binds them by name, not by this order).
    pub fn inputs(&self) -> &[TensorId] {
        &self.inputs
    }

    /// Graph outputs, in the graph's order (the caller binds them by name, not by this order).
    pub fn outputs(&self) -> &[TensorId] {
        &self.outputs
    }

    /// The ops, in execution order.
    pub fn ops(&self) -> &[Op<TensorId>] {
        &self.ops
    }

    /// The delegate-owned state tensors (payload 1.2), in declaration order: caches the executor allocates,
    /// zero-filled, when it is created, and keeps across calls. They are not graph inputs and no blob binding
    /// names them; each is the `cache` of exactly one `kv_cache_update` (see the crate docs).
    pub fn state(&self) -> &[TensorId] {
        &self.state
    }

    /// Whether `id` is delegate-owned state.
    pub fn is_state(&self, id: TensorId) -> bool {
        self.state.contains(&id)
    }

    /// The values of constant `id` (its [`Extent`] in a `Graph<Extent>`), if it is one.
    pub fn constant(&self, id: TensorId) -> Option<&C> {
        self.constants.get(&id)
    }

    /// Every constant with its values (its [`Extent`] in a `Graph<Extent>`), in [`TensorId`] order.
    pub fn constants(&self) -> impl Iterator<Item = (TensorId, &C)> + '_ {
        self.constants.iter().map(|(id, data)| (*id, data))
    }

    /// The cache input that the `KvCacheUpdate` producing `output` writes in place, if one does.
    pub fn cache_update_of(&self, output: TensorId) -> Option<TensorId> {
        self.ops.iter().find_map(|op| match *op {
            Op::KvCacheUpdate { cache, out, .. } if out == output => Some(cache),
            _ => None,
        })
    }

    /// The input that the op producing `output` writes in place, if one does: a `KvCacheUpdate`'s cache or
    /// an `Assign`'s target.
    pub fn in_place_of(&self, output: TensorId) -> Option<TensorId> {
        self.in_place_pairs().find_map(|(out, input)| (out == output).then_some(input))
    }

    /// Every in-place pair `(output, input written in place)` of the graph: the `KvCacheUpdate` ops' (output,
    /// cache) and the `Assign` ops' (output, target).
    pub fn in_place_pairs(&self) -> impl Iterator<Item = (TensorId, TensorId)> + '_ {
        self.ops.iter().filter_map(|op| match *op {
            Op::KvCacheUpdate { cache, out, .. } => Some((out, cache)),
            Op::Assign { target, out, .. } => Some((out, target)),
            _ => None,
        })
    }
}

impl<C: ConstantStorage> Graph<C> {
    /// Checks every rule in the crate docs: names, shapes, definitions, op typing, constants, and the
    /// in-place cache rules. Run by [`GraphBuilder::finish`] and [`Graph::decode`].
    pub fn validate(&self) -> Result<(), Error> {
        let mut names = HashMap::with_capacity(self.tensors.len());
        for tensor in &self.tensors {
            if tensor.name.is_empty() {
                return Err(Error::BadTensorName { name: String::new(), problem: "empty" });
            }
            if names.insert(tensor.name.as_str(), ()).is_some() {
                return Err(Error::BadTensorName { name: tensor.name.clone(), problem: "declared twice" });
            }
            check_shape(tensor)?;
        }
        let name = |id: TensorId| self.tensors[id.0].name.clone();

        // Definitions: each tensor is defined exactly once, by an input, a constant or an op.
        let mut defined_by: Vec<Option<String>> = vec![None; self.tensors.len()];
        let mut define = |id: TensorId, by: String| match &defined_by[id.0] {
            Some(first) => Err(Error::DefinedTwice { name: name(id), first: first.clone(), second: by }),
            None => {
                defined_by[id.0] = Some(by);
                Ok(())
            }
        };
        for &id in &self.inputs {
            define(id, "a graph input".to_owned())?;
        }
        for &id in &self.state {
            define(id, "delegate-owned state".to_owned())?;
        }
        for (&id, data) in &self.constants {
            define(id, "a constant".to_owned())?;
            let decl = &self.tensors[id.0];
            if data.elem_type() != decl.dtype || data.numel() != decl.numel() {
                return Err(Error::BadConstant {
                    name: decl.name.clone(),
                    offset: 0,
                    nbytes: (data.numel() * data.elem_type().size_bytes()) as u64,
                    problem: format!(
                        "holds {} {} values but the tensor is {} {:?}",
                        data.numel(),
                        data.elem_type(),
                        decl.dtype,
                        decl.shape
                    ),
                });
            }
        }
        let mut available = vec![false; self.tensors.len()];
        for &id in self.inputs.iter().chain(&self.state).chain(self.constants.keys()) {
            available[id.0] = true;
        }
        for (index, op) in self.ops.iter().enumerate() {
            for operand in op.operands() {
                if !available[operand.0] {
                    return Err(Error::UseBeforeDefinition { index, op: op.name(), name: name(operand) });
                }
            }
            op.check_types(index, &self.tensors)?;
            let out = op.output();
            define(out, format!("the output of op {index} ({})", op.name()))?;
            available[out.0] = true;
        }
        if let Some(id) = (0..self.tensors.len()).find(|&i| defined_by[i].is_none()) {
            return Err(Error::Undefined { name: self.tensors[id].name.clone() });
        }

        check_unique(&self.inputs, "graph inputs", &name)?;
        check_unique(&self.outputs, "graph outputs", &name)?;
        check_unique(&self.state, "the state list", &name)?;
        for &id in &self.outputs {
            if self.inputs.contains(&id) || self.constants.contains_key(&id) {
                return Err(Error::BadInterface {
                    name: name(id),
                    problem: "is a graph output but no op produces it".to_owned(),
                });
            }
        }
        self.check_cache_rules()
    }

    fn check_cache_rules(&self) -> Result<(), Error> {
        let name = |id: TensorId| self.tensors[id.0].name.clone();
        let mut cache_inputs = Vec::new();
        let mut cache_outputs = Vec::new();
        for op in &self.ops {
            if let Op::KvCacheUpdate { cache, out, .. } = *op {
                if !self.inputs.contains(&cache) && !self.state.contains(&cache) {
                    return Err(Error::CacheMisuse {
                        name: name(cache),
                        problem: "is updated in place by a kv_cache_update but is neither a graph input nor \
                                  delegate-owned state (only storage that outlives the call can be updated in \
                                  place)"
                            .to_owned(),
                    });
                }
                if self.state.contains(&cache) && self.outputs.contains(&out) {
                    return Err(Error::CacheMisuse {
                        name: name(out),
                        problem: format!(
                            "updates delegate-owned state '{}' and cannot be a graph output (no caller storage \
                             backs it)",
                            name(cache)
                        ),
                    });
                }
                if cache_inputs.contains(&cache) {
                    return Err(Error::CacheMisuse {
                        name: name(cache),
                        problem: "is updated by two kv_cache_update ops".to_owned(),
                    });
                }
                cache_inputs.push(cache);
                cache_outputs.push(out);
            }
        }
        self.check_assign_rules(&cache_inputs)?;
        if let Some(&unused) = self.state.iter().find(|id| !cache_inputs.contains(id)) {
            return Err(Error::CacheMisuse {
                name: name(unused),
                problem: "is delegate-owned state but no kv_cache_update writes it (state holds caches only)"
                    .to_owned(),
            });
        }
        for (index, op) in self.ops.iter().enumerate() {
            for (role, operand) in op.named_operands() {
                let as_cache_input = matches!(op, Op::KvCacheUpdate { .. }) && role == "cache";
                let as_cache_view = matches!(op, Op::CausalAttention { .. }) && (role == "k" || role == "v");
                let problem = if cache_inputs.contains(&operand) && !as_cache_input {
                    "is a cache input; only its kv_cache_update may read it"
                } else if cache_outputs.contains(&operand) && !as_cache_view {
                    "is a kv_cache_update output; only causal_attention's 'k'/'v' may read it"
                } else if as_cache_view && !cache_outputs.contains(&operand) {
                    "must be a kv_cache_update output: causal_attention reads caches in place"
                } else {
                    continue;
                };
                return Err(Error::CacheMisuse {
                    name: name(operand),
                    problem: format!("{problem} (it is operand '{role}' of op {index}, {})", op.name()),
                });
            }
        }
        Ok(())
    }
}

impl<C> Graph<C> {
    /// The rules of [`Op::Assign`]: its target is a graph input that no other op reads or writes in place
    /// (`cache_inputs`: the `kv_cache_update` caches), and no op reads its output.
    fn check_assign_rules(&self, cache_inputs: &[TensorId]) -> Result<(), Error> {
        let misuse = |id: TensorId, problem: String| Error::AssignMisuse {
            name: self.tensors[id.0].name.clone(),
            problem,
        };
        let mut targets = Vec::new();
        let mut outputs = Vec::new();
        for op in &self.ops {
            let Op::Assign { target, out, .. } = *op else { continue };
            if !self.inputs.contains(&target) {
                return Err(misuse(
                    target,
                    "is written in place by an assign but is not a graph input (only caller storage is \
                     assigned in place)"
                        .to_owned(),
                ));
            }
            if targets.contains(&target) || cache_inputs.contains(&target) {
                return Err(misuse(target, "is written in place by two ops".to_owned()));
            }
            targets.push(target);
            outputs.push(out);
        }
        for (index, op) in self.ops.iter().enumerate() {
            for (role, operand) in op.named_operands() {
                let problem =
                    if targets.contains(&operand) && !(matches!(op, Op::Assign { .. }) && role == "target") {
                        "is an assign target; only its assign may read it"
                    } else if outputs.contains(&operand) {
                        "is an assign output; no op may read it (it may be a graph output)"
                    } else {
                        continue;
                    };
                return Err(misuse(
                    operand,
                    format!("{problem} (it is operand '{role}' of op {index}, {})", op.name()),
                ));
            }
        }
        Ok(())
    }
}

fn check_shape(tensor: &TensorDecl) -> Result<(), Error> {
    let bad =
        |problem: String| Error::BadShape { name: tensor.name.clone(), shape: tensor.shape.clone(), problem };
    if tensor.shape.contains(&0) {
        return Err(bad("every extent must be at least 1".to_owned()));
    }
    let numel = tensor.shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d));
    match numel {
        Some(n) if n <= MAX_ELEMENTS => Ok(()),
        _ => Err(bad(format!("more than {MAX_ELEMENTS} elements"))),
    }
}

fn check_unique(
    ids: &[TensorId],
    context: &'static str,
    name: &dyn Fn(TensorId) -> String,
) -> Result<(), Error> {
    for (i, id) in ids.iter().enumerate() {
        if ids[..i].contains(id) {
            return Err(Error::Duplicate { name: name(*id), context });
        }
    }
    Ok(())
}

/// The graph as an engine: its I/O tensors are the graph inputs and outputs, and it reports the in-place
/// cache updates exactly as TensorRT's `getAliasedInputTensor` would.
impl<C> EngineIntrospect for Graph<C> {
    fn tensors(&self) -> Vec<EngineTensor> {
        let io = |ids: &[TensorId], role: Role| -> Vec<EngineTensor> {
            ids.iter()
                .map(|&id| {
                    let decl = self.tensor(id);
                    EngineTensor {
                        name: decl.name.clone(),
                        role,
                        dtype: Some(decl.dtype.dtype()),
                        shape: decl.shape.iter().map(|&d| Dim::Static(d)).collect(),
                    }
                })
                .collect()
        };
        let mut all = io(&self.inputs, Role::Input);
        all.extend(io(&self.outputs, Role::Output));
        all
    }

    fn reports_aliases(&self) -> bool {
        true
    }

    fn aliased_input(&self, output: &str) -> Option<String> {
        let id = self.find(output)?;
        self.in_place_of(id).map(|input| self.tensor(input).name.clone())
    }
}

#[cfg(test)]
mod tests;
