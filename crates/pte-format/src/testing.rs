//! Test support (feature `testing`): writes small `.pte` files laid out the way ExecuTorch 1.5.1's
//! `serialize_pte_binary` lays them out, so tests can read programs without a torch export.
//!
//! The layout: the flatbuffer (identifier `ET12`) is built first; when there is segment data, a 32-byte
//! extended header (`eh00`, program size, segment base offset, segment data size) is inserted at byte 8 and
//! the root offset moved by 32; segments follow the program data from a segment base offset aligned to
//! [`SEGMENT_ALIGNMENT`], each segment starting at a multiple of it. Indices in the specs are written as
//! given, unchecked, so tests can write broken programs too.
//!
//! This is not an exporter: it writes what tests describe, nothing more.

use flatbuffers::{FlatBufferBuilder, WIPOffset};

use crate::container::{EXTENDED_HEADER_LEN, EXTENDED_HEADER_MAGIC};
use crate::generated::et;
use crate::model::{DataLocation, ScalarType};

/// ExecuTorch's default segment alignment.
pub const SEGMENT_ALIGNMENT: usize = 128;

/// A program to write: methods, segments and inline delegate data.
#[derive(Debug, Clone, Default)]
pub struct ProgramSpec {
    /// `Program.version` (ExecuTorch 1.x writes 0).
    pub version: u32,
    /// The methods (`execution_plan`).
    pub methods: Vec<MethodSpec>,
    /// Each segment's bytes, in order; written after the program data.
    pub segments: Vec<Vec<u8>>,
    /// `Program.backend_delegate_data`: inline delegate payloads.
    pub inline_data: Vec<Vec<u8>>,
    /// `Program.constant_segment` as (segment index, offsets).
    pub constant_segment: Option<(u32, Vec<u64>)>,
    /// `Program.named_data` as (key, segment index).
    pub named_data: Vec<(String, u32)>,
}

/// One method (`ExecutionPlan`) with a single chain.
#[derive(Debug, Clone, Default)]
pub struct MethodSpec {
    /// The name.
    pub name: String,
    /// The values.
    pub values: Vec<ValueSpec>,
    /// Value indices of the inputs.
    pub inputs: Vec<i32>,
    /// Value indices of the outputs.
    pub outputs: Vec<i32>,
    /// Operators as (name, overload).
    pub operators: Vec<(String, String)>,
    /// The delegates.
    pub delegates: Vec<DelegateSpec>,
    /// The instructions of chain 0.
    pub instructions: Vec<InstructionSpec>,
    /// `non_const_buffer_sizes`.
    pub non_const_buffer_sizes: Vec<i64>,
}

/// A value (`EValue`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ValueSpec {
    /// `Null`.
    Null,
    /// `Int`.
    Int(i64),
    /// `Bool`.
    Bool(bool),
    /// `Double`.
    Double(f64),
    /// `String`.
    String(String),
    /// `Tensor`.
    Tensor(TensorSpec),
    /// `IntList` (value indices).
    IntList(Vec<i64>),
    /// `TensorList` (value indices).
    TensorList(Vec<i32>),
    /// `OptionalTensorList` (value indices, -1 for none).
    OptionalTensorList(Vec<i32>),
    /// A raw union type tag with no value, e.g. an unknown kind.
    RawKind(u8),
}

/// A tensor value.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    /// The element type.
    pub scalar_type: ScalarType,
    /// The sizes.
    pub sizes: Vec<i32>,
    /// `allocation_info` as (mem_id, byte offset); the offset is split into low and high words.
    pub allocation: Option<(u32, u64)>,
    /// `data_buffer_idx`.
    pub data_buffer_idx: u32,
    /// `extra_tensor_info.fully_qualified_name`.
    pub fully_qualified_name: Option<String>,
}

impl TensorSpec {
    /// A memory-planned tensor (`allocation_info` = `(mem_id, offset)`), contiguous, no name.
    pub fn planned(scalar_type: ScalarType, sizes: &[i32], mem_id: u32, offset: u64) -> TensorSpec {
        TensorSpec {
            scalar_type,
            sizes: sizes.to_vec(),
            allocation: Some((mem_id, offset)),
            data_buffer_idx: 0,
            fully_qualified_name: None,
        }
    }

    /// The same tensor with `extra_tensor_info.fully_qualified_name` set.
    pub fn named(mut self, name: &str) -> TensorSpec {
        self.fully_qualified_name = Some(name.to_owned());
        self
    }
}

/// An instruction.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum InstructionSpec {
    /// `KernelCall`.
    Kernel {
        /// Index into the method's operators.
        op: i32,
        /// Value indices.
        args: Vec<i32>,
    },
    /// `DelegateCall`.
    Delegate {
        /// Index into the method's delegates.
        delegate: i32,
        /// Value indices.
        args: Vec<i32>,
    },
    /// `MoveCall`.
    Move {
        /// Source value index.
        from: i32,
        /// Destination value index.
        to: i32,
    },
    /// `JumpFalseCall`.
    JumpFalse {
        /// Condition value index.
        cond: i32,
        /// Destination instruction.
        destination: i32,
    },
    /// `FreeCall`.
    Free {
        /// Value index.
        value: i32,
    },
}

/// A delegate (`BackendDelegate`).
#[derive(Debug, Clone)]
pub struct DelegateSpec {
    /// The backend id.
    pub id: String,
    /// Where the processed payload is.
    pub location: DataLocation,
    /// Index into the inline data or the segments.
    pub index: u32,
    /// Compile specs as (key, value).
    pub compile_specs: Vec<(String, Vec<u8>)>,
}

fn align(value: usize, to: usize) -> usize {
    value.div_ceil(to) * to
}

impl ProgramSpec {
    /// The `.pte` bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        // Segment offsets relative to the segment base, each aligned as ExecuTorch aligns them.
        let mut relative = Vec::with_capacity(self.segments.len());
        let mut segment_data: Vec<u8> = Vec::new();
        for segment in &self.segments {
            segment_data.resize(align(segment_data.len(), SEGMENT_ALIGNMENT), 0);
            relative.push(segment_data.len() as u64);
            segment_data.extend_from_slice(segment);
        }
        let flatbuffer = self.flatbuffer(&relative);
        if segment_data.is_empty() {
            return flatbuffer;
        }
        let header_len = EXTENDED_HEADER_LEN as usize; // already a multiple of the schema's largest alignment (16)
        let program_size = header_len + flatbuffer.len();
        let base = align(program_size, SEGMENT_ALIGNMENT);
        let mut out = Vec::with_capacity(base + segment_data.len());
        let root = u32::from_le_bytes([flatbuffer[0], flatbuffer[1], flatbuffer[2], flatbuffer[3]]);
        out.extend_from_slice(&(root + EXTENDED_HEADER_LEN).to_le_bytes());
        out.extend_from_slice(&flatbuffer[4..8]);
        out.extend_from_slice(EXTENDED_HEADER_MAGIC);
        out.extend_from_slice(&EXTENDED_HEADER_LEN.to_le_bytes());
        out.extend_from_slice(&(program_size as u64).to_le_bytes());
        out.extend_from_slice(&(base as u64).to_le_bytes());
        out.extend_from_slice(&(segment_data.len() as u64).to_le_bytes());
        out.extend_from_slice(&flatbuffer[8..]);
        debug_assert_eq!(out.len(), program_size);
        out.resize(base, 0);
        out.extend_from_slice(&segment_data);
        out
    }

    fn flatbuffer(&self, relative: &[u64]) -> Vec<u8> {
        let mut fbb = FlatBufferBuilder::new();
        let plans: Vec<_> = self.methods.iter().map(|m| method(&mut fbb, m)).collect();
        let execution_plan = fbb.create_vector(&plans);
        let segments: Vec<_> = relative
            .iter()
            .zip(&self.segments)
            .map(|(&offset, data)| {
                et::DataSegment::create(&mut fbb, &et::DataSegmentArgs { offset, size: data.len() as u64 })
            })
            .collect();
        let segments = fbb.create_vector(&segments);
        let inline: Vec<_> = self
            .inline_data
            .iter()
            .map(|d| {
                let data = fbb.create_vector(d);
                et::BackendDelegateInlineData::create(
                    &mut fbb,
                    &et::BackendDelegateInlineDataArgs { data: Some(data) },
                )
            })
            .collect();
        let backend_delegate_data = (!inline.is_empty()).then(|| fbb.create_vector(&inline));
        let constant_segment = self.constant_segment.as_ref().map(|(segment_index, offsets)| {
            let offsets = fbb.create_vector(offsets);
            et::SubsegmentOffsets::create(
                &mut fbb,
                &et::SubsegmentOffsetsArgs { segment_index: *segment_index, offsets: Some(offsets) },
            )
        });
        let named: Vec<_> = self
            .named_data
            .iter()
            .map(|(key, segment_index)| {
                let key = fbb.create_string(key);
                et::NamedData::create(
                    &mut fbb,
                    &et::NamedDataArgs { key: Some(key), segment_index: *segment_index },
                )
            })
            .collect();
        let named_data = (!named.is_empty()).then(|| fbb.create_vector(&named));
        let root = et::Program::create(
            &mut fbb,
            &et::ProgramArgs {
                version: self.version,
                execution_plan: Some(execution_plan),
                constant_buffer: None,
                backend_delegate_data,
                segments: Some(segments),
                constant_segment,
                mutable_data_segments: None,
                named_data,
            },
        );
        et::finish_program_buffer(&mut fbb, root);
        fbb.finished_data().to_vec()
    }
}

fn method<'a>(fbb: &mut FlatBufferBuilder<'a>, m: &MethodSpec) -> WIPOffset<et::ExecutionPlan<'a>> {
    let name = fbb.create_string(&m.name);
    let values: Vec<_> = m.values.iter().map(|v| value(fbb, v)).collect();
    let values = fbb.create_vector(&values);
    let inputs = fbb.create_vector(&m.inputs);
    let outputs = fbb.create_vector(&m.outputs);
    let instructions: Vec<_> = m.instructions.iter().map(|i| instruction(fbb, i)).collect();
    let instructions = fbb.create_vector(&instructions);
    let chain_inputs = fbb.create_vector(&m.inputs);
    let chain_outputs = fbb.create_vector(&m.outputs);
    let chain = et::Chain::create(
        fbb,
        &et::ChainArgs {
            inputs: Some(chain_inputs),
            outputs: Some(chain_outputs),
            instructions: Some(instructions),
            stacktrace: None,
        },
    );
    let chains = fbb.create_vector(&[chain]);
    let operators: Vec<_> = m
        .operators
        .iter()
        .map(|(name, overload)| {
            let name = fbb.create_string(name);
            let overload = fbb.create_string(overload);
            et::Operator::create(fbb, &et::OperatorArgs { name: Some(name), overload: Some(overload) })
        })
        .collect();
    let operators = fbb.create_vector(&operators);
    let delegates: Vec<_> = m.delegates.iter().map(|d| delegate(fbb, d)).collect();
    let delegates = fbb.create_vector(&delegates);
    let sizes = fbb.create_vector(&m.non_const_buffer_sizes);
    et::ExecutionPlan::create(
        fbb,
        &et::ExecutionPlanArgs {
            name: Some(name),
            container_meta_type: None,
            values: Some(values),
            inputs: Some(inputs),
            outputs: Some(outputs),
            chains: Some(chains),
            operators: Some(operators),
            delegates: Some(delegates),
            non_const_buffer_sizes: Some(sizes),
            non_const_buffer_device: None,
        },
    )
}

fn value<'a>(fbb: &mut FlatBufferBuilder<'a>, v: &ValueSpec) -> WIPOffset<et::EValue<'a>> {
    let (val_type, val) = match v {
        ValueSpec::Null => (et::KernelTypes::Null, et::Null::create(fbb, &et::NullArgs {}).as_union_value()),
        ValueSpec::Int(int_val) => {
            (et::KernelTypes::Int, et::Int::create(fbb, &et::IntArgs { int_val: *int_val }).as_union_value())
        }
        ValueSpec::Bool(bool_val) => (
            et::KernelTypes::Bool,
            et::Bool::create(fbb, &et::BoolArgs { bool_val: *bool_val }).as_union_value(),
        ),
        ValueSpec::Double(double_val) => (
            et::KernelTypes::Double,
            et::Double::create(fbb, &et::DoubleArgs { double_val: *double_val }).as_union_value(),
        ),
        ValueSpec::String(s) => {
            let string_val = fbb.create_string(s);
            (
                et::KernelTypes::String,
                et::String::create(fbb, &et::StringArgs { string_val: Some(string_val) }).as_union_value(),
            )
        }
        ValueSpec::Tensor(t) => (et::KernelTypes::Tensor, tensor(fbb, t).as_union_value()),
        ValueSpec::IntList(items) => {
            let items = fbb.create_vector(items);
            (
                et::KernelTypes::IntList,
                et::IntList::create(fbb, &et::IntListArgs { items: Some(items) }).as_union_value(),
            )
        }
        ValueSpec::TensorList(items) => {
            let items = fbb.create_vector(items);
            (
                et::KernelTypes::TensorList,
                et::TensorList::create(fbb, &et::TensorListArgs { items: Some(items) }).as_union_value(),
            )
        }
        ValueSpec::OptionalTensorList(items) => {
            let items = fbb.create_vector(items);
            (
                et::KernelTypes::OptionalTensorList,
                et::OptionalTensorList::create(fbb, &et::OptionalTensorListArgs { items: Some(items) })
                    .as_union_value(),
            )
        }
        ValueSpec::RawKind(kind) => {
            (et::KernelTypes(*kind), et::Null::create(fbb, &et::NullArgs {}).as_union_value())
        }
    };
    et::EValue::create(fbb, &et::EValueArgs { val_type, val: Some(val) })
}

fn tensor<'a>(fbb: &mut FlatBufferBuilder<'a>, t: &TensorSpec) -> WIPOffset<et::Tensor<'a>> {
    let sizes = fbb.create_vector(&t.sizes);
    let dim_order: Vec<u8> = (0..t.sizes.len()).map(|d| d as u8).collect();
    let dim_order = fbb.create_vector(&dim_order);
    let allocation_info = t.allocation.map(|(memory_id, offset)| {
        et::AllocationDetails::create(
            fbb,
            &et::AllocationDetailsArgs {
                memory_id,
                memory_offset_low: offset as u32,
                memory_offset_high: (offset >> 32) as u32,
            },
        )
    });
    let extra_tensor_info = t.fully_qualified_name.as_ref().map(|name| {
        let name = fbb.create_string(name);
        et::ExtraTensorInfo::create(
            fbb,
            &et::ExtraTensorInfoArgs { fully_qualified_name: Some(name), ..Default::default() },
        )
    });
    et::Tensor::create(
        fbb,
        &et::TensorArgs {
            scalar_type: et::ScalarType(t.scalar_type.as_i8()),
            sizes: Some(sizes),
            dim_order: Some(dim_order),
            data_buffer_idx: t.data_buffer_idx,
            allocation_info,
            extra_tensor_info,
            ..Default::default()
        },
    )
}

fn instruction<'a>(fbb: &mut FlatBufferBuilder<'a>, i: &InstructionSpec) -> WIPOffset<et::Instruction<'a>> {
    let (instr_args_type, args) = match i {
        InstructionSpec::Kernel { op, args } => {
            let args = fbb.create_vector(args);
            (
                et::InstructionArguments::KernelCall,
                et::KernelCall::create(fbb, &et::KernelCallArgs { op_index: *op, args: Some(args) })
                    .as_union_value(),
            )
        }
        InstructionSpec::Delegate { delegate, args } => {
            let args = fbb.create_vector(args);
            (
                et::InstructionArguments::DelegateCall,
                et::DelegateCall::create(
                    fbb,
                    &et::DelegateCallArgs { delegate_index: *delegate, args: Some(args) },
                )
                .as_union_value(),
            )
        }
        InstructionSpec::Move { from, to } => (
            et::InstructionArguments::MoveCall,
            et::MoveCall::create(fbb, &et::MoveCallArgs { move_from: *from, move_to: *to }).as_union_value(),
        ),
        InstructionSpec::JumpFalse { cond, destination } => (
            et::InstructionArguments::JumpFalseCall,
            et::JumpFalseCall::create(
                fbb,
                &et::JumpFalseCallArgs { cond_value_index: *cond, destination_instruction: *destination },
            )
            .as_union_value(),
        ),
        InstructionSpec::Free { value } => (
            et::InstructionArguments::FreeCall,
            et::FreeCall::create(fbb, &et::FreeCallArgs { value_index: *value }).as_union_value(),
        ),
    };
    et::Instruction::create(fbb, &et::InstructionArgs { instr_args_type, instr_args: Some(args) })
}

fn delegate<'a>(fbb: &mut FlatBufferBuilder<'a>, d: &DelegateSpec) -> WIPOffset<et::BackendDelegate<'a>> {
    let id = fbb.create_string(&d.id);
    let processed = et::BackendDelegateDataReference::create(
        fbb,
        &et::BackendDelegateDataReferenceArgs {
            location: match d.location {
                DataLocation::Inline => et::DataLocation::INLINE,
                DataLocation::Segment => et::DataLocation::SEGMENT,
            },
            index: d.index,
        },
    );
    let specs: Vec<_> = d
        .compile_specs
        .iter()
        .map(|(key, value)| {
            let key = fbb.create_string(key);
            let value = fbb.create_vector(value);
            et::CompileSpec::create(fbb, &et::CompileSpecArgs { key: Some(key), value: Some(value) })
        })
        .collect();
    let compile_specs = fbb.create_vector(&specs);
    et::BackendDelegate::create(
        fbb,
        &et::BackendDelegateArgs {
            id: Some(id),
            processed: Some(processed),
            compile_specs: Some(compile_specs),
        },
    )
}

/// The value indices of [`kv_decoder`]'s `forward`, named.
pub mod kv {
    /// `tokens`: Long `[1, 1]`, method input 0.
    pub const TOKENS: usize = 0;
    /// `input_pos`: Long `[1]`, method input 1.
    pub const INPUT_POS: usize = 1;
    /// The K cache buffer `k_cache`: Float `[1, 2, 16, 8]`, mem_id 2 offset 0.
    pub const K_CACHE: usize = 2;
    /// The V cache buffer `v_cache`: Float `[1, 2, 16, 8]`, mem_id 2 offset 1024.
    pub const V_CACHE: usize = 3;
    /// The delegate's new K (written back into `k_cache` by `aten::copy_`).
    pub const K_NEW: usize = 4;
    /// The delegate's new V.
    pub const V_NEW: usize = 5;
    /// The delegate's logits.
    pub const LOGITS_RAW: usize = 6;
    /// The method output: `aten::clone.out` of the delegate's logits.
    pub const LOGITS: usize = 7;
    /// The backend id of the delegate.
    pub const BACKEND: &str = "ReferenceBackend";
}

/// A KV-cache decoder as ExecuTorch 1.5.1 exports one with the buffers *not* tagged into the delegate
/// (see the workspace's notes on ExecuTorch): method `forward(tokens, input_pos) -> logits` whose chain is
///
/// 0. `DelegateCall` 0 (`ReferenceBackend`, payload `payload` in segment 1) with args
///    `[input_pos, tokens, k_cache, v_cache, k_new, v_new, logits_raw]`: the user inputs in the lowered
///    graph's placeholder order (not the method's), then the buffers, then the outputs;
/// 1. `KernelCall aten::copy_(k_cache, k_new, false, k_cache)`: the write-back;
/// 2. `KernelCall aten::copy_(v_cache, v_new, false, v_cache)`;
/// 3. `KernelCall aten::clone.out(logits_raw, None, logits)`: an operator not delegated.
///
/// Segment 0 is the (empty) constant segment (`constant_segment = {0, [0]}`), as ExecuTorch writes for a
/// program whose weights all went to the delegate. Value indices are named in [`kv`].
pub fn kv_decoder(payload: &[u8]) -> Vec<u8> {
    kv_decoder_spec(payload).to_bytes()
}

/// The [`ProgramSpec`] behind [`kv_decoder`], for tests that change one thing.
pub fn kv_decoder_spec(payload: &[u8]) -> ProgramSpec {
    use ScalarType::{Float, Long};
    let cache = [1, 2, 16, 8];
    let values = vec![
        ValueSpec::Tensor(TensorSpec::planned(Long, &[1, 1], 1, 0)),
        ValueSpec::Tensor(TensorSpec::planned(Long, &[1], 1, 16)),
        ValueSpec::Tensor(TensorSpec::planned(Float, &cache, 2, 0).named("k_cache")),
        ValueSpec::Tensor(TensorSpec::planned(Float, &cache, 2, 1024).named("v_cache")),
        ValueSpec::Tensor(TensorSpec::planned(Float, &cache, 1, 64)),
        ValueSpec::Tensor(TensorSpec::planned(Float, &cache, 1, 1088)),
        ValueSpec::Tensor(TensorSpec::planned(Float, &[1, 1, 32], 1, 2112)),
        ValueSpec::Tensor(TensorSpec::planned(Float, &[1, 1, 32], 1, 2240)),
        ValueSpec::Null,
        ValueSpec::Bool(false),
    ];
    let forward = MethodSpec {
        name: "forward".to_owned(),
        values,
        inputs: vec![0, 1],
        outputs: vec![7],
        operators: vec![
            ("aten::copy_".to_owned(), String::new()),
            ("aten::clone".to_owned(), "out".to_owned()),
        ],
        delegates: vec![DelegateSpec {
            id: kv::BACKEND.to_owned(),
            location: DataLocation::Segment,
            index: 1,
            compile_specs: vec![("max_seq_len".to_owned(), b"16".to_vec())],
        }],
        instructions: vec![
            InstructionSpec::Delegate { delegate: 0, args: vec![1, 0, 2, 3, 4, 5, 6] },
            InstructionSpec::Kernel { op: 0, args: vec![2, 4, 9, 2] },
            InstructionSpec::Kernel { op: 0, args: vec![3, 5, 9, 3] },
            InstructionSpec::Kernel { op: 1, args: vec![6, 8, 7] },
        ],
        non_const_buffer_sizes: vec![0, 2368, 2048],
    };
    ProgramSpec {
        version: 0,
        methods: vec![forward],
        segments: vec![Vec::new(), payload.to_vec()],
        inline_data: Vec::new(),
        constant_segment: Some((0, vec![0])),
        named_data: Vec::new(),
    }
}
