//! What a `.pte` file holds, as read: every table index resolved and checked, every payload a sub-slice of
//! the input.
//!
//! The types mirror ExecuTorch's schema (`schema/program.fbs`) under Rust names; enums keep values this
//! build does not know as `Unknown` (a newer schema may add them) instead of refusing the file.

use std::fmt;

/// The extended header ExecuTorch inserts at byte 8 when a program has segments: magic `eh00`, then
/// little-endian `u32` length, `u64` program size, `u64` segment base offset, `u64` segment data size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExtendedHeader {
    /// The header's length in bytes as recorded (32 in ExecuTorch 1.x; at least 24).
    pub length: u32,
    /// Bytes of program data (the flatbuffer with this header inserted) from the start of the file.
    pub program_size: u64,
    /// File offset of the first segment; segment offsets are relative to it. Zero when there are none.
    pub segment_base_offset: u64,
    /// Bytes of segment data from the base offset; zero when there are none or the field is absent (a
    /// header shorter than 32 bytes).
    pub segment_data_size: u64,
}

/// One `Program.segments` entry: a region after the program data (delegate payloads, constants, named
/// data), borrowed from the input.
#[derive(Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Segment<'a> {
    /// File offset of the segment (the segment base offset plus the recorded, relative offset).
    pub offset: u64,
    /// The segment's size in bytes, as recorded (checked to lie inside the file).
    pub size: u64,
    /// The segment's bytes: a sub-slice of the input, never a copy. All [`Segment::size`] of them, except
    /// from [`Program::parse_prefix`](crate::Program::parse_prefix), which gives those inside the prefix.
    pub data: &'a [u8],
}

impl fmt::Debug for Segment<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Segment").field("offset", &self.offset).field("size", &self.size).finish()
    }
}

/// `Program.constant_segment` or one `Program.mutable_data_segments` entry: offsets into one segment.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SubsegmentOffsets {
    /// Index into [`Program::segments`](crate::Program::segments) (checked).
    pub segment_index: usize,
    /// Byte offsets into that segment; for constants, `offsets[0]` is reserved.
    pub offsets: Vec<u64>,
}

/// One `Program.named_data` entry: a name for a segment, used by delegates that share data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct NamedData<'a> {
    /// The unique key.
    pub key: &'a str,
    /// Index into [`Program::segments`](crate::Program::segments) (checked).
    pub segment_index: usize,
}

/// One `ExecutionPlan`: a method of the program (`forward`, `prefill`, `decode`, ...).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Method<'a> {
    /// The method's name.
    pub name: &'a str,
    /// Every value the method uses; instructions, inputs and outputs refer to them by index.
    pub values: Vec<Value<'a>>,
    /// Indices into [`Method::values`] of the method's inputs, in call order (checked).
    pub inputs: Vec<usize>,
    /// Indices into [`Method::values`] of the method's outputs (checked).
    pub outputs: Vec<usize>,
    /// The chains of instructions; every ExecuTorch 1.x program has exactly one.
    pub chains: Vec<Chain<'a>>,
    /// The operators that [`Instruction::Kernel`] refers to.
    pub operators: Vec<Operator<'a>>,
    /// The delegates that [`Instruction::Delegate`] refers to, each with its processed payload.
    pub delegates: Vec<Delegate<'a>>,
    /// Sizes of the memory-planned arenas, indexed by `mem_id` (entry 0 is unused by ExecuTorch).
    pub non_const_buffer_sizes: Vec<i64>,
}

impl<'a> Method<'a> {
    /// The tensor at value index `value`, if that value is a tensor.
    pub fn tensor(&self, value: usize) -> Option<&Tensor<'a>> {
        match self.values.get(value) {
            Some(Value::Tensor(tensor)) => Some(tensor),
            _ => None,
        }
    }

    /// Every instruction of every chain with its position, in execution order.
    pub fn instructions(&self) -> impl Iterator<Item = (InstructionRef, &Instruction<'a>)> + '_ {
        self.chains.iter().enumerate().flat_map(|(chain, c)| {
            c.instructions
                .iter()
                .enumerate()
                .map(move |(instruction, i)| (InstructionRef { chain, instruction }, i))
        })
    }

    /// Every `DelegateCall`, with its position, in execution order.
    pub fn delegate_calls(&self) -> impl Iterator<Item = (InstructionRef, &DelegateCall)> + '_ {
        self.instructions().filter_map(|(at, i)| match i {
            Instruction::Delegate(call) => Some((at, call)),
            _ => None,
        })
    }

    /// Every `KernelCall` (an operator ExecuTorch runs itself, not delegated), with its position.
    pub fn kernel_calls(&self) -> impl Iterator<Item = (InstructionRef, &KernelCall<'a>)> + '_ {
        self.instructions().filter_map(|(at, i)| match i {
            Instruction::Kernel(call) => Some((at, call)),
            _ => None,
        })
    }

    /// The method's mutable buffers (KV caches and other state that persists across calls); see
    /// [`crate::buffers`] for the exact rule.
    pub fn mutable_buffers(&self) -> Vec<MutableBuffer<'a>> {
        crate::buffers::mutable_buffers(self)
    }
}

/// The position of an instruction: `chains[chain].instructions[instruction]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstructionRef {
    /// Index into [`Method::chains`].
    pub chain: usize,
    /// Index into that chain's instructions.
    pub instruction: usize,
}

impl fmt::Display for InstructionRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "chains[{}].instructions[{}]", self.chain, self.instruction)
    }
}

/// A `Chain`: instructions executed in order.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Chain<'a> {
    /// Indices into [`Method::values`] of the chain's inputs (checked).
    pub inputs: Vec<usize>,
    /// Indices into [`Method::values`] of the chain's outputs (checked).
    pub outputs: Vec<usize>,
    /// The instructions.
    pub instructions: Vec<Instruction<'a>>,
}

/// One instruction. Every index it holds was checked against its table when the program was read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Instruction<'a> {
    /// Runs an operator ExecuTorch links itself (not delegated).
    Kernel(KernelCall<'a>),
    /// Runs a delegate.
    Delegate(DelegateCall),
    /// Moves value `from` into value `to`.
    Move {
        /// Source value index.
        from: usize,
        /// Destination value index.
        to: usize,
    },
    /// Jumps to `destination` when the bool value `condition` is false.
    JumpFalse {
        /// Value index of the condition.
        condition: usize,
        /// Instruction index in the same chain.
        destination: usize,
    },
    /// Frees the data of a tensor value.
    Free {
        /// The value index.
        value: usize,
    },
    /// An instruction kind a newer schema added; ExecuTorch 1.5.1 cannot run it.
    Unknown {
        /// The union type tag.
        kind: u8,
    },
}

impl Instruction<'_> {
    /// The schema's name of the instruction kind: `KernelCall`, `DelegateCall`, `MoveCall`, ...
    pub fn kind(&self) -> &'static str {
        match self {
            Instruction::Kernel(_) => "KernelCall",
            Instruction::Delegate(_) => "DelegateCall",
            Instruction::Move { .. } => "MoveCall",
            Instruction::JumpFalse { .. } => "JumpFalseCall",
            Instruction::Free { .. } => "FreeCall",
            Instruction::Unknown { .. } => "unknown",
        }
    }
}

/// A `KernelCall` with its operator resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KernelCall<'a> {
    /// Index into [`Method::operators`].
    pub operator: usize,
    /// The operator's name, e.g. `aten::copy_`.
    pub name: &'a str,
    /// The operator's overload, e.g. `out` (may be empty).
    pub overload: &'a str,
    /// Value indices of the arguments, inputs and outputs (checked).
    pub args: Vec<usize>,
}

/// A `DelegateCall`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DelegateCall {
    /// Index into [`Method::delegates`].
    pub delegate: usize,
    /// Value indices of the delegate's arguments, inputs then outputs as the delegate defines them (checked).
    pub args: Vec<usize>,
}

/// An `Operator` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Operator<'a> {
    /// The name, e.g. `aten::copy_`.
    pub name: &'a str,
    /// The overload name, e.g. `out`; may be empty.
    pub overload: &'a str,
}

impl fmt::Display for Operator<'_> {
    /// `name.overload`, or `name` when the overload is empty.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.overload.is_empty() {
            f.write_str(self.name)
        } else {
            write!(f, "{}.{}", self.name, self.overload)
        }
    }
}

/// A `BackendDelegate`: the backend id, compile specs and processed payload of one lowered subgraph.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Delegate<'a> {
    /// The backend id the runtime resolves, e.g. `ReferenceBackend` or `TensorRTBackend`.
    pub id: &'a str,
    /// The compile specs, in order.
    pub compile_specs: Vec<CompileSpec<'a>>,
    /// The processed payload the backend's `init` receives.
    pub processed: DelegateData<'a>,
}

/// Where a delegate's processed payload is and its bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DelegateData<'a> {
    /// Which table [`DelegateData::index`] indexes.
    pub location: DataLocation,
    /// Index into `Program.backend_delegate_data` (inline) or [`Program::segments`](crate::Program::segments).
    pub index: usize,
    /// File offset of the payload's first byte.
    pub offset: u64,
    /// The payload's size in bytes.
    pub size: u64,
    /// The payload: a sub-slice of the input, never a copy. All [`DelegateData::size`] bytes, except from
    /// [`Program::parse_prefix`](crate::Program::parse_prefix), which gives those inside the prefix (a
    /// payload in a segment may be cut short or empty; inline data lies in the program data and is whole).
    pub data: &'a [u8],
}

impl DelegateData<'_> {
    /// The payload's byte range in the file: [`DelegateData::offset`] to its end, [`DelegateData::size`]
    /// bytes (checked to lie inside the file when the program was read).
    pub fn range(&self) -> std::ops::Range<u64> {
        self.offset..self.offset.saturating_add(self.size)
    }

    /// Where the payload is stored, as messages name it: `segment 1` or `inline 0` (the
    /// [`DelegateData::location`] and its [`DelegateData::index`]).
    pub fn label(&self) -> String {
        format!("{} {}", self.location.as_str(), self.index)
    }
}

impl fmt::Debug for DelegateData<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DelegateData")
            .field("location", &self.location)
            .field("index", &self.index)
            .field("offset", &self.offset)
            .field("size", &self.data.len())
            .finish()
    }
}

/// Where delegate data is stored (`DataLocation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataLocation {
    /// Inside the flatbuffer, in `Program.backend_delegate_data`.
    Inline,
    /// In a segment after the program data (ExecuTorch's default).
    Segment,
}

impl DataLocation {
    /// `inline` or `segment`.
    pub fn as_str(self) -> &'static str {
        match self {
            DataLocation::Inline => "inline",
            DataLocation::Segment => "segment",
        }
    }
}

/// A `CompileSpec`: a key and opaque bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompileSpec<'a> {
    /// The key.
    pub key: &'a str,
    /// The value, borrowed from the input.
    pub value: &'a [u8],
}

/// An `EValue`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Value<'a> {
    /// `None`.
    Null,
    /// An integer.
    Int(i64),
    /// A bool.
    Bool(bool),
    /// A double.
    Double(f64),
    /// A tensor.
    Tensor(Tensor<'a>),
    /// A string.
    String(&'a str),
    /// A list of ints, boxed as ExecuTorch stores it: value indices of `Int` values (checked).
    IntList(Vec<usize>),
    /// A list of doubles, inline.
    DoubleList(Vec<f64>),
    /// A list of bools, inline.
    BoolList(Vec<bool>),
    /// A list of tensors: value indices (checked).
    TensorList(Vec<usize>),
    /// A list of optional tensors: value indices, `None` where the file has -1 (checked).
    OptionalTensorList(Vec<Option<usize>>),
    /// A value kind a newer schema added.
    Unknown {
        /// The union type tag.
        kind: u8,
    },
}

impl Value<'_> {
    /// The schema's name of the value kind: `Tensor`, `Int`, `IntList`, ...
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "Null",
            Value::Int(_) => "Int",
            Value::Bool(_) => "Bool",
            Value::Double(_) => "Double",
            Value::Tensor(_) => "Tensor",
            Value::String(_) => "String",
            Value::IntList(_) => "IntList",
            Value::DoubleList(_) => "DoubleList",
            Value::BoolList(_) => "BoolList",
            Value::TensorList(_) => "TensorList",
            Value::OptionalTensorList(_) => "OptionalTensorList",
            Value::Unknown { .. } => "unknown",
        }
    }
}

/// A `Tensor` value's metadata. Its data is never read by this crate.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Tensor<'a> {
    /// The element type.
    pub scalar_type: ScalarType,
    /// The sizes (the upper bound when [`Tensor::shape_dynamism`] is `DynamicBound`).
    pub sizes: Vec<i32>,
    /// The dimension order, outermost first.
    pub dim_order: Vec<u8>,
    /// Offset of the first element in elements; ExecuTorch supports only zero.
    pub storage_offset: i32,
    /// Whether the tensor requires grad.
    pub requires_grad: bool,
    /// Index of the initial data: into the constant table when there is no allocation (a constant), into
    /// `mutable_data_segments` when there is one; 0 = no data.
    pub data_buffer_idx: u32,
    /// Where the memory planner placed the tensor, when it did (a planned activation, input, output or
    /// mutable buffer); `None` for constants and for tensors the caller provides at run time.
    pub allocation: Option<Allocation>,
    /// Static or dynamic shape.
    pub shape_dynamism: ShapeDynamism,
    /// The optional `ExtraTensorInfo`.
    pub extra: Option<ExtraTensorInfo<'a>>,
}

impl<'a> Tensor<'a> {
    /// `extra_tensor_info.fully_qualified_name`, e.g. `k_cache` (ExecuTorch writes it for mutable buffers
    /// with `emit_mutable_buffer_names=True`, and for external constants).
    pub fn fully_qualified_name(&self) -> Option<&'a str> {
        self.extra.and_then(|e| e.fully_qualified_name)
    }

    /// The number of elements, if every size is non-negative and the product fits in 64 bits.
    pub fn numel(&self) -> Option<u64> {
        self.sizes.iter().try_fold(1u64, |acc, &s| acc.checked_mul(u64::try_from(s).ok()?))
    }

    /// The size of the data in bytes, when the element size is known and nothing overflows.
    pub fn nbytes(&self) -> Option<u64> {
        self.numel()?.checked_mul(self.scalar_type.element_size()? as u64)
    }
}

/// `AllocationDetails`: where the memory planner placed a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Allocation {
    /// The arena (`memory_id`); indexes [`Method::non_const_buffer_sizes`].
    pub mem_id: u32,
    /// Byte offset in the arena (`memory_offset_high << 32 | memory_offset_low`).
    pub offset: u64,
}

/// `ExtraTensorInfo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExtraTensorInfo<'a> {
    /// The tensor's unique name, e.g. `k_cache` or `layers.0.attn.k_cache`.
    pub fully_qualified_name: Option<&'a str>,
    /// Where the tensor's data is stored.
    pub location: TensorDataLocation,
    /// Index into `Program.mutable_data_segments` of the initial data.
    pub mutable_data_segments_idx: u64,
}

/// `TensorDataLocation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TensorDataLocation {
    /// In a segment of the file (the default).
    Segment,
    /// Outside the file, looked up by the fully qualified name.
    External,
    /// A value a newer schema added.
    Unknown(i8),
}

/// `TensorShapeDynamism`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ShapeDynamism {
    /// Static shape.
    Static,
    /// Dynamic with an upper bound (the sizes).
    DynamicBound,
    /// Dynamic without bound.
    DynamicUnbound,
    /// A value a newer schema added.
    Unknown(i8),
}

impl ShapeDynamism {
    /// `static`, `dynamic_bound`, `dynamic_unbound` or `unknown`.
    pub fn as_str(self) -> &'static str {
        match self {
            ShapeDynamism::Static => "static",
            ShapeDynamism::DynamicBound => "dynamic_bound",
            ShapeDynamism::DynamicUnbound => "dynamic_unbound",
            ShapeDynamism::Unknown(_) => "unknown",
        }
    }
}

macro_rules! scalar_types {
    ($($variant:ident = $value:literal, $name:literal, $size:expr;)*) => {
        /// ExecuTorch's `ScalarType` (`scalar_type.fbs`), named as ExecuTorch's runtime names them.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum ScalarType {
            $(
                #[doc = concat!("`", $name, "` (", stringify!($value), ").")]
                $variant,
            )*
            /// A value this build does not know.
            Unknown(i8),
        }

        impl ScalarType {
            /// The type for a schema value.
            pub fn from_i8(value: i8) -> ScalarType {
                match value {
                    $($value => ScalarType::$variant,)*
                    other => ScalarType::Unknown(other),
                }
            }

            /// The schema value.
            pub fn as_i8(self) -> i8 {
                match self {
                    $(ScalarType::$variant => $value,)*
                    ScalarType::Unknown(value) => value,
                }
            }

            /// ExecuTorch's name, e.g. `Float`, `BFloat16`, `Long`; `unknown` for an unknown value.
            pub fn name(self) -> &'static str {
                match self {
                    $(ScalarType::$variant => $name,)*
                    ScalarType::Unknown(_) => "unknown",
                }
            }

            /// Bytes per element (sub-byte types pack into one byte); `None` when unknown.
            pub fn element_size(self) -> Option<usize> {
                match self {
                    $(ScalarType::$variant => Some($size),)*
                    ScalarType::Unknown(_) => None,
                }
            }
        }
    };
}

scalar_types! {
    Byte = 0, "Byte", 1;
    Char = 1, "Char", 1;
    Short = 2, "Short", 2;
    Int = 3, "Int", 4;
    Long = 4, "Long", 8;
    Half = 5, "Half", 2;
    Float = 6, "Float", 4;
    Double = 7, "Double", 8;
    Bool = 11, "Bool", 1;
    QInt8 = 12, "QInt8", 1;
    QUInt8 = 13, "QUInt8", 1;
    QInt32 = 14, "QInt32", 4;
    BFloat16 = 15, "BFloat16", 2;
    QUInt4x2 = 16, "QUInt4x2", 1;
    QUInt2x4 = 17, "QUInt2x4", 1;
    Bits16 = 22, "Bits16", 2;
    Float8E5M2 = 23, "Float8_e5m2", 1;
    Float8E4M3Fn = 24, "Float8_e4m3fn", 1;
    Float8E5M2Fnuz = 25, "Float8_e5m2fnuz", 1;
    Float8E4M3Fnuz = 26, "Float8_e4m3fnuz", 1;
    UInt16 = 27, "UInt16", 2;
    UInt32 = 28, "UInt32", 4;
    UInt64 = 29, "UInt64", 8;
}

impl fmt::Display for ScalarType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScalarType::Unknown(value) => write!(f, "unknown({value})"),
            other => f.write_str(other.name()),
        }
    }
}

/// A mutable buffer of a method: state (a KV cache) that the memory planner placed and that persists
/// across calls. Which values count is written in [`crate::buffers`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct MutableBuffer<'a> {
    /// Index into [`Method::values`] of the tensor.
    pub value: usize,
    /// `extra_tensor_info.fully_qualified_name`, when the exporter wrote it.
    pub name: Option<&'a str>,
    /// Where the planner placed it (`mem_id` and offset).
    pub allocation: Allocation,
    /// The tensor's `data_buffer_idx`: 0 = no initial data (zero-filled by ExecuTorch's `Module`), else its
    /// initial value is in `Program.mutable_data_segments`.
    pub data_buffer_idx: u32,
    /// The `aten::copy_` instructions writing the buffer back, in execution order.
    pub write_backs: Vec<WriteBack>,
}

/// One `aten::copy_(buffer, src)` write-back of a mutable buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteBack {
    /// The `KernelCall`'s position.
    pub at: InstructionRef,
    /// The value index copied from (the call's second argument), when it has one.
    pub src: Option<usize>,
}
