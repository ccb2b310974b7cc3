//! The payload encoding of a [`Graph`] (layout in the crate docs): what a native blob of kind
//! `reference-graph` carries as its engine.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ops::OP_NAMES;
use crate::{ConstantStorage, Data, ElemType, Error, Extent, Graph, Op, TensorDecl, TensorId};

/// First four bytes of a reference-graph payload.
pub const PAYLOAD_MAGIC: [u8; 4] = *b"RGRF";
/// Major version this build writes and reads.
pub const PAYLOAD_VERSION_MAJOR: u16 = 1;
/// Newest minor version this build writes: 4 (1.1 added the `f16` element type and the `argmax` op, 1.2
/// delegate-owned `state`, 1.3 the ops of real decoders, `bf16` and relaxed forms of the older ops, 1.4
/// `causal_attention`'s `softcap`; see the crate docs). A graph is written with the oldest minor that
/// expresses it: 1.4 only for a soft-capped attention, 1.3 when it uses something 1.3 added, 1.2 when it has
/// state, so older readers keep reading every graph they can express.
pub const PAYLOAD_VERSION_MINOR: u16 = 4;
/// The minor version written for a graph that uses something 1.3 added (the ops of real decoders, `bf16`,
/// relaxed forms) and nothing from 1.4.
pub const PAYLOAD_MINOR_DECODER_OPS: u16 = 3;
/// The minor version written for a graph with delegate-owned state and nothing from 1.3.
pub const PAYLOAD_MINOR_WITH_STATE: u16 = 2;
/// The minor version written for a graph without delegate-owned state.
pub const PAYLOAD_MINOR_WITHOUT_STATE: u16 = 1;
/// Alignment of the constant section and of every constant in it.
pub const CONSTANT_ALIGN: u64 = 16;
pub(crate) const PREFIX_LEN: usize = 16;

#[derive(Serialize, Deserialize)]
struct Description {
    tensors: Vec<TensorDecl>,
    inputs: Vec<String>,
    outputs: Vec<String>,
    constants: Vec<ConstantRef>,
    /// Delegate-owned state (1.2); absent in older payloads.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    state: Vec<String>,
    ops: Vec<serde_json::Value>,
}

#[derive(Serialize, Deserialize)]
struct ConstantRef {
    tensor: String,
    offset: u64,
    nbytes: u64,
}

fn align_up(n: usize) -> usize {
    let a = CONSTANT_ALIGN as usize;
    n.div_ceil(a) * a
}

/// One constant's place in an encoded payload's constant section.
pub(crate) struct Placed<'g, C> {
    /// The constant's tensor.
    pub(crate) id: TensorId,
    /// Its values, or where its bytes lie.
    pub(crate) values: &'g C,
    /// Its offset from the start of the constant section, a multiple of [`CONSTANT_ALIGN`].
    pub(crate) offset: u64,
    /// Its length in bytes.
    pub(crate) nbytes: u64,
}

impl<C> Graph<C> {
    /// The `(major, minor)` payload version [`Graph::encode`] writes for this graph: the oldest that
    /// expresses it.
    pub fn payload_version(&self) -> (u16, u16) {
        let minor = if self.uses_1_4() {
            PAYLOAD_VERSION_MINOR
        } else if self.uses_1_3() {
            PAYLOAD_MINOR_DECODER_OPS
        } else if self.state.is_empty() {
            PAYLOAD_MINOR_WITHOUT_STATE
        } else {
            PAYLOAD_MINOR_WITH_STATE
        };
        (PAYLOAD_VERSION_MAJOR, minor)
    }

    /// Whether the graph uses anything payload 1.4 added: a `causal_attention` with a `softcap`.
    fn uses_1_4(&self) -> bool {
        self.ops.iter().any(|op| matches!(op, Op::CausalAttention { softcap: Some(_), .. }))
    }

    /// Whether the graph uses anything payload 1.3 added: `bf16`, a new op, a new attribute, or a form of an
    /// older op that 1.2 refused.
    fn uses_1_3(&self) -> bool {
        self.tensors.iter().any(|t| t.dtype == ElemType::Bf16)
            || self.ops.iter().any(|op| self.op_uses_1_3(op))
    }

    fn op_uses_1_3(&self, op: &Op<TensorId>) -> bool {
        let shape = |id: TensorId| self.tensor(id).shape.as_slice();
        match *op {
            Op::Positions { .. } => false,
            Op::Gather { indices, .. } => shape(indices).len() != 1,
            Op::MatMul { a, transpose_b, bias, .. } => transpose_b || bias.is_some() || shape(a).len() != 2,
            Op::Add { a, b, .. } => shape(a) != shape(b) || self.tensor(a).dtype == ElemType::I64,
            Op::RmsNorm { input, .. } | Op::Argmax { input, .. } => shape(input).len() != 2,
            Op::KvCacheUpdate { cache, update, .. } => shape(cache).len() != 3 || shape(update).len() != 2,
            Op::CausalAttention { q, k, scale, .. } => {
                let (sq, sk) = (shape(q), shape(k));
                scale.is_some() || sk.len() != 3 || sq.len() != 2 || sq[1] != sk[0] * sk[2]
            }
            Op::Sub { .. }
            | Op::Mul { .. }
            | Op::Div { .. }
            | Op::Unary { .. }
            | Op::Mean { .. }
            | Op::Cast { .. }
            | Op::Reshape { .. }
            | Op::Permute { .. }
            | Op::Slice { .. }
            | Op::Concat { .. }
            | Op::Assign { .. } => true,
        }
    }
}

impl<C: ConstantStorage> Graph<C> {
    /// Every constant in the order the constant section holds them ([`TensorId`] order), each at the next
    /// multiple of [`CONSTANT_ALIGN`] after the one before.
    pub(crate) fn constant_layout(&self) -> Vec<Placed<'_, C>> {
        let mut end = 0;
        let mut placed = Vec::with_capacity(self.constants.len());
        for (&id, values) in &self.constants {
            let offset = align_up(end) as u64;
            let nbytes = (values.numel() * values.elem_type().size_bytes()) as u64;
            end = (offset + nbytes) as usize;
            placed.push(Placed { id, values, offset, nbytes });
        }
        placed
    }

    /// The payload up to its constant section (prefix, JSON description, zero padding to
    /// [`CONSTANT_ALIGN`]), whose constant table records `layout`.
    pub(crate) fn payload_head(&self, layout: &[Placed<'_, C>]) -> Vec<u8> {
        let name = |id: TensorId| self.tensor(id).name.clone();
        let constants = layout
            .iter()
            .map(|c| ConstantRef { tensor: name(c.id), offset: c.offset, nbytes: c.nbytes })
            .collect();
        let ops = self
            .ops
            .iter()
            .map(|op| {
                let named = op.try_map(|_, id| Ok::<_, std::convert::Infallible>(name(*id)));
                let named = match named {
                    Ok(named) => named,
                    Err(never) => match never {},
                };
                let value =
                    serde_json::to_value(named).expect("an op of strings and numbers always serializes");
                wire_op_name(value)
            })
            .collect();
        let description = Description {
            tensors: self.tensors.clone(),
            inputs: self.inputs.iter().map(|&id| name(id)).collect(),
            outputs: self.outputs.iter().map(|&id| name(id)).collect(),
            constants,
            state: self.state.iter().map(|&id| name(id)).collect(),
            ops,
        };
        let json =
            serde_json::to_vec(&description).expect("the description is plain data and always serializes");
        let json_len = u32::try_from(json.len()).expect("a graph description over 4 GiB cannot be built");
        let mut out = Vec::with_capacity(align_up(PREFIX_LEN + json.len()));
        out.extend_from_slice(&PAYLOAD_MAGIC);
        out.extend_from_slice(&PAYLOAD_VERSION_MAJOR.to_le_bytes());
        out.extend_from_slice(&self.payload_version().1.to_le_bytes());
        out.extend_from_slice(&json_len.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&json);
        out.resize(align_up(out.len()), 0);
        out
    }
}

impl Graph {
    /// Encodes the graph as a payload (see the crate docs for the layout).
    pub fn encode(&self) -> Vec<u8> {
        let layout = self.constant_layout();
        let mut out = self.payload_head(&layout);
        let section = out.len();
        let section_len = layout.last().map_or(0, |c| c.offset + c.nbytes) as usize;
        out.reserve_exact(section_len);
        for constant in &layout {
            out.resize(section + constant.offset as usize, 0);
            out.extend_from_slice(&constant.values.to_le_bytes());
        }
        out
    }

    /// Builds and validates a graph from its two payload sections given apart: the JSON `description` (as
    /// the payload holds it: tensors, inputs, outputs, constants, ops, state) and the `constants` section its
    /// offsets point into, whose values the graph copies. What an exporter in another language writes, for
    /// [`Graph::encode`] to lay out. The same checks as [`Graph::decode`]. A packer that should not hold the
    /// constants reads the description with [`Graph::from_description_extents`] instead.
    pub fn from_description(description: &[u8], constants: &[u8]) -> Result<Graph, Error> {
        let description: Description =
            serde_json::from_slice(description).map_err(|source| Error::Json { source })?;
        description.into_graph(|constant, decl| read_constant(constant, decl, constants))
    }

    /// Decodes and validates a payload. Every defect is a typed [`Error`]; nothing panics.
    pub fn decode(payload: &[u8]) -> Result<Graph, Error> {
        let prefix: &[u8; PREFIX_LEN] = payload
            .get(..PREFIX_LEN)
            .and_then(|p| p.try_into().ok())
            .ok_or(Error::TooShort { len: payload.len(), needed: PREFIX_LEN })?;
        let magic = [prefix[0], prefix[1], prefix[2], prefix[3]];
        if magic != PAYLOAD_MAGIC {
            return Err(Error::BadMagic { found: magic });
        }
        let major = u16::from_le_bytes([prefix[4], prefix[5]]);
        let minor = u16::from_le_bytes([prefix[6], prefix[7]]);
        if major != PAYLOAD_VERSION_MAJOR {
            return Err(Error::UnsupportedVersion { major, minor });
        }
        let json_len = u32::from_le_bytes([prefix[8], prefix[9], prefix[10], prefix[11]]);
        let json_end = PREFIX_LEN.checked_add(json_len as usize).filter(|&end| end <= payload.len()).ok_or(
            Error::SectionOutOfBounds {
                section: "json",
                offset: PREFIX_LEN as u64,
                len: u64::from(json_len),
                total: payload.len(),
            },
        )?;
        let data_start = align_up(json_end).min(payload.len());
        let data = &payload[data_start..];
        let description: Description = serde_json::from_slice(&payload[PREFIX_LEN..json_end])
            .map_err(|source| Error::Json { source })?;
        description.into_graph(|constant, decl| read_constant(constant, decl, data))
    }
}

impl Graph<Extent> {
    /// [`Graph::from_description`] without the constants' bytes: the graph records where each constant lies
    /// in a constant section of `section_len` bytes held elsewhere (a file), every extent checked as
    /// [`Graph::from_description`] checks it (aligned, of its tensor's size, inside the section). What a
    /// packer reads so that the weights are never in its memory: [`Graph::write_payload`] then copies them
    /// from the section into the payload. The same checks as [`Graph::decode`]; the section's bytes are not
    /// read.
    pub fn from_description_extents(description: &[u8], section_len: u64) -> Result<Graph<Extent>, Error> {
        let description: Description =
            serde_json::from_slice(description).map_err(|source| Error::Json { source })?;
        description.into_graph(|constant, decl| extent(constant, decl, section_len))
    }
}

impl Description {
    /// The graph described, each constant held as `constant` reads it (after its tensor's shape is checked).
    fn into_graph<C: ConstantStorage>(
        self,
        mut constant: impl FnMut(&ConstantRef, &TensorDecl) -> Result<C, Error>,
    ) -> Result<Graph<C>, Error> {
        let mut ids = BTreeMap::new();
        for (i, tensor) in self.tensors.iter().enumerate() {
            if ids.insert(tensor.name.clone(), TensorId(i)).is_some() {
                return Err(Error::BadTensorName { name: tensor.name.clone(), problem: "declared twice" });
            }
            crate::check_shape(tensor)?;
        }
        let resolve = |context: &dyn Fn() -> String, name: &str| {
            ids.get(name)
                .copied()
                .ok_or_else(|| Error::DanglingTensor { context: context(), name: name.to_owned() })
        };
        let inputs = self
            .inputs
            .iter()
            .map(|n| resolve(&|| "graph inputs".to_owned(), n))
            .collect::<Result<Vec<_>, _>>()?;
        let outputs = self
            .outputs
            .iter()
            .map(|n| resolve(&|| "graph outputs".to_owned(), n))
            .collect::<Result<Vec<_>, _>>()?;
        let state = self
            .state
            .iter()
            .map(|n| resolve(&|| "the state list".to_owned(), n))
            .collect::<Result<Vec<_>, _>>()?;

        let mut constants = BTreeMap::new();
        for entry in &self.constants {
            let id = resolve(&|| "the constant table".to_owned(), &entry.tensor)?;
            let decl = &self.tensors[id.0];
            let values = constant(entry, decl)?;
            if constants.insert(id, values).is_some() {
                return Err(Error::Duplicate { name: decl.name.clone(), context: "the constant table" });
            }
        }

        let mut ops = Vec::with_capacity(self.ops.len());
        for (index, value) in self.ops.into_iter().enumerate() {
            let value = read_op_name(index, value)?;
            let op_name = value.get("op").and_then(|v| v.as_str()).ok_or(Error::MissingOpName { index })?;
            if !OP_NAMES.contains(&op_name) {
                return Err(Error::UnknownOp { index, op: op_name.to_owned(), known: OP_NAMES.join(", ") });
            }
            let op_name = op_name.to_owned();
            let named: Op<String> = serde_json::from_value(value).map_err(|source| Error::MalformedOp {
                index,
                op: op_name.clone(),
                source,
            })?;
            let context = || format!("op {index} ({op_name})");
            let op = named.try_map(|_, name| resolve(&context, name))?;
            ops.push(op);
        }
        let graph = Graph { tensors: self.tensors, inputs, outputs, constants, state, ops };
        graph.validate()?;
        Ok(graph)
    }
}

/// Where `constant` lies in a constant section of `section_len` bytes: aligned, of `decl`'s size, inside.
fn extent(constant: &ConstantRef, decl: &TensorDecl, section_len: u64) -> Result<Extent, Error> {
    let bad = |problem: String| Error::BadConstant {
        name: decl.name.clone(),
        offset: constant.offset,
        nbytes: constant.nbytes,
        problem,
    };
    if constant.offset % CONSTANT_ALIGN != 0 {
        return Err(bad(format!("the offset is not a multiple of {CONSTANT_ALIGN}")));
    }
    let expected = decl.nbytes() as u64;
    if constant.nbytes != expected {
        return Err(bad(format!("tensor {} {:?} needs {expected} bytes", decl.dtype, decl.shape)));
    }
    if constant.offset.checked_add(constant.nbytes).is_none_or(|end| end > section_len) {
        return Err(bad(format!("the constant section holds only {section_len} bytes")));
    }
    Ok(Extent { offset: constant.offset, nbytes: constant.nbytes, dtype: decl.dtype })
}

/// The values of `constant`, read from the constant section `data`.
fn read_constant(constant: &ConstantRef, decl: &TensorDecl, data: &[u8]) -> Result<Data, Error> {
    let at = extent(constant, decl, data.len() as u64)?;
    let start =
        usize::try_from(at.offset).expect("an extent lies inside the section, whose length is a usize");
    let bytes = &data[start..start + decl.nbytes()];
    Ok(match decl.dtype {
        ElemType::F32 => Data::F32(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().expect("chunks_exact yields 4 bytes")))
                .collect(),
        ),
        ElemType::F16 => Data::F16(
            bytes
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes(c.try_into().expect("chunks_exact yields 2 bytes")))
                .collect(),
        ),
        ElemType::Bf16 => Data::Bf16(
            bytes
                .chunks_exact(2)
                .map(|c| half::bf16::from_le_bytes(c.try_into().expect("chunks_exact yields 2 bytes")))
                .collect(),
        ),
        ElemType::I64 => Data::I64(
            bytes
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().expect("chunks_exact yields 8 bytes")))
                .collect(),
        ),
    })
}

/// The op name a soft-capped attention has on the wire (see the crate docs on versions): a reader older than
/// payload 1.4 ignores the unknown `softcap` field, so the op is renamed, and such a reader refuses it as an
/// unknown op instead of computing it uncapped.
pub(crate) const SOFTCAPPED_ATTENTION: &str = "causal_attention_softcapped";

/// `op` as written: a `causal_attention` with a `softcap` becomes [`SOFTCAPPED_ATTENTION`].
fn wire_op_name(mut op: serde_json::Value) -> serde_json::Value {
    let capped = op.get("op").and_then(|v| v.as_str()) == Some("causal_attention")
        && op.get("softcap").is_some_and(|c| !c.is_null());
    if capped {
        op["op"] = serde_json::Value::from(SOFTCAPPED_ATTENTION);
    }
    op
}

/// `op` as read: [`SOFTCAPPED_ATTENTION`] is `causal_attention` with its `softcap`, which it must have.
fn read_op_name(index: usize, mut op: serde_json::Value) -> Result<serde_json::Value, Error> {
    if op.get("op").and_then(|v| v.as_str()) != Some(SOFTCAPPED_ATTENTION) {
        return Ok(op);
    }
    if op.get("softcap").is_none_or(serde_json::Value::is_null) {
        return Err(Error::OpMismatch {
            index,
            op: SOFTCAPPED_ATTENTION,
            detail: "it has no attribute 'softcap' (the cap is what this op adds to causal_attention)"
                .to_owned(),
        });
    }
    op["op"] = serde_json::Value::from("causal_attention");
    Ok(op)
}
