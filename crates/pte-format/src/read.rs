//! The verified flatbuffer turned into the [`crate::model`] types, every index checked against its table.

use flatbuffers::{ForwardsUOffset, Vector, VerifierOptions};

use crate::container::{checked_end, SegmentArea};
use crate::generated::et;
use crate::model::{
    Allocation, Chain, CompileSpec, DataLocation, Delegate, DelegateCall, DelegateData, ExtraTensorInfo,
    Instruction, KernelCall, Method, NamedData, Operator, Segment, ShapeDynamism, SubsegmentOffsets, Tensor,
    TensorDataLocation, Value,
};
use crate::Error;

/// Verifier limits: far above any real program (a large LLM export has O(10^5) values), low enough that
/// hostile input cannot make verification slow or deep.
pub(crate) fn verifier_options() -> VerifierOptions {
    VerifierOptions {
        max_depth: 64,
        max_tables: 1 << 24,
        // Flatbuffers address at most 2 GiB; this only bounds the verifier's total work.
        max_apparent_size: 1 << 32,
        ignore_missing_null_terminator: false,
    }
}

/// The verifier's message on one line.
pub(crate) fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Checks a raw index against a table of `len` entries.
fn index(raw: i64, table: &'static str, len: usize, what: impl FnOnce() -> String) -> Result<usize, Error> {
    match usize::try_from(raw) {
        Ok(i) if i < len => Ok(i),
        _ => Err(Error::Index { what: what(), index: raw, table, len }),
    }
}

/// Reads an optional vector of value indices, each checked against `values` entries.
fn value_indices(
    raw: Option<Vector<'_, i32>>,
    values: usize,
    what: impl Fn(usize) -> String,
) -> Result<Vec<usize>, Error> {
    let Some(raw) = raw else { return Ok(Vec::new()) };
    raw.iter().enumerate().map(|(j, v)| index(i64::from(v), "values", values, || what(j))).collect()
}

/// The file offset of `part`, a sub-slice of `file`.
fn offset_in(file: &[u8], part: &[u8]) -> u64 {
    (part.as_ptr() as usize).wrapping_sub(file.as_ptr() as usize) as u64
}

pub(crate) fn segments<'a>(
    bytes: &'a [u8],
    root: &et::Program<'a>,
    area: Option<SegmentArea>,
) -> Result<Vec<Segment<'a>>, Error> {
    let Some(raw) = root.segments() else { return Ok(Vec::new()) };
    let mut out = Vec::with_capacity(raw.len());
    for (i, segment) in raw.iter().enumerate() {
        let size = segment.size();
        let Some(area) = area else {
            if size != 0 {
                return Err(Error::SegmentsWithoutHeader { index: i, size });
            }
            // ExecuTorch lists an empty constant segment even when it writes no segment data (and so no
            // extended header): nothing to locate, it reads as empty at offset 0.
            out.push(Segment { offset: 0, size: 0, data: &bytes[..0] });
            continue;
        };
        let what = || format!("segments[{i}]");
        let start = area.base.checked_add(segment.offset()).ok_or_else(|| Error::ExtentOverflow {
            what: what(),
            offset: area.base,
            size: segment.offset(),
        })?;
        let end = checked_end(&what(), start, size, area.limit, area.limit_what)?;
        // `end <= area.limit <= file_len`; the bytes given may stop short of it (`Program::parse_prefix`).
        let have = bytes.len() as u64;
        let data = &bytes[to_usize(start.min(have))?..to_usize(end.min(have))?];
        out.push(Segment { offset: start, size, data });
    }
    Ok(out)
}

fn to_usize(value: u64) -> Result<usize, Error> {
    usize::try_from(value).map_err(|_| Error::InvalidField {
        what: "file offset".to_owned(),
        problem: format!("{value} does not fit in this platform's address space"),
    })
}

pub(crate) fn subsegment(
    raw: et::SubsegmentOffsets<'_>,
    segments: usize,
    what: impl FnOnce() -> String,
) -> Result<SubsegmentOffsets, Error> {
    let segment_index =
        index(i64::from(raw.segment_index()), "segments", segments, || format!("{}.segment_index", what()))?;
    Ok(SubsegmentOffsets {
        segment_index,
        offsets: raw.offsets().map(|o| o.iter().collect()).unwrap_or_default(),
    })
}

pub(crate) fn named_data<'a>(root: &et::Program<'a>, segments: usize) -> Result<Vec<NamedData<'a>>, Error> {
    let Some(raw) = root.named_data() else { return Ok(Vec::new()) };
    raw.iter()
        .enumerate()
        .map(|(i, n)| {
            let key = n.key().ok_or_else(|| Error::Missing { what: format!("named_data[{i}].key") })?;
            let segment_index = index(i64::from(n.segment_index()), "segments", segments, || {
                format!("named_data[{i}] {key:?} segment_index")
            })?;
            Ok(NamedData { key, segment_index })
        })
        .collect()
}

/// Everything a method needs from the program: the file, the segments, the inline delegate data.
pub(crate) struct ProgramParts<'a, 's> {
    pub bytes: &'a [u8],
    pub segments: &'s [Segment<'a>],
    pub inline: Option<Vector<'a, ForwardsUOffset<et::BackendDelegateInlineData<'a>>>>,
}

pub(crate) fn method<'a>(
    parts: &ProgramParts<'a, '_>,
    plan_index: usize,
    plan: et::ExecutionPlan<'a>,
) -> Result<Method<'a>, Error> {
    let name =
        plan.name().ok_or_else(|| Error::Missing { what: format!("execution_plan[{plan_index}].name") })?;
    let at = format!("method {name:?}");

    let raw_values = plan.values();
    let n_values = raw_values.map_or(0, |v| v.len());
    let values = match raw_values {
        None => Vec::new(),
        Some(raw) => raw
            .iter()
            .enumerate()
            .map(|(i, v)| value(v, n_values, || format!("{at} values[{i}]")))
            .collect::<Result<Vec<_>, _>>()?,
    };
    let inputs = value_indices(plan.inputs(), n_values, |j| format!("{at} inputs[{j}]"))?;
    let outputs = value_indices(plan.outputs(), n_values, |j| format!("{at} outputs[{j}]"))?;

    let operators = match plan.operators() {
        None => Vec::new(),
        Some(raw) => raw
            .iter()
            .enumerate()
            .map(|(i, op)| {
                let name =
                    op.name().ok_or_else(|| Error::Missing { what: format!("{at} operators[{i}].name") })?;
                Ok(Operator { name, overload: op.overload().unwrap_or("") })
            })
            .collect::<Result<Vec<_>, Error>>()?,
    };

    let delegates = match plan.delegates() {
        None => Vec::new(),
        Some(raw) => raw
            .iter()
            .enumerate()
            .map(|(i, d)| delegate(parts, d, || format!("{at} delegates[{i}]")))
            .collect::<Result<Vec<_>, _>>()?,
    };

    let chains = match plan.chains() {
        None => Vec::new(),
        Some(raw) => raw
            .iter()
            .enumerate()
            .map(|(c, chain)| {
                read_chain(chain, n_values, &operators, delegates.len(), &|| format!("{at} chains[{c}]"))
            })
            .collect::<Result<Vec<_>, _>>()?,
    };

    Ok(Method {
        name,
        values,
        inputs,
        outputs,
        chains,
        operators,
        delegates,
        non_const_buffer_sizes: plan.non_const_buffer_sizes().map(|v| v.iter().collect()).unwrap_or_default(),
    })
}

fn value<'a>(raw: et::EValue<'a>, n_values: usize, what: impl Fn() -> String) -> Result<Value<'a>, Error> {
    let missing = || Error::Missing { what: format!("{}.val", what()) };
    let kind = raw.val_type();
    Ok(match kind {
        et::KernelTypes::NONE => return Err(missing()),
        et::KernelTypes::Null => Value::Null,
        et::KernelTypes::Int => Value::Int(raw.val_as_int().ok_or_else(missing)?.int_val()),
        et::KernelTypes::Bool => Value::Bool(raw.val_as_bool().ok_or_else(missing)?.bool_val()),
        et::KernelTypes::Double => Value::Double(raw.val_as_double().ok_or_else(missing)?.double_val()),
        et::KernelTypes::String => {
            Value::String(raw.val_as_string().ok_or_else(missing)?.string_val().unwrap_or(""))
        }
        et::KernelTypes::Tensor => Value::Tensor(tensor(raw.val_as_tensor().ok_or_else(missing)?)),
        et::KernelTypes::IntList => {
            let items = raw.val_as_int_list().ok_or_else(missing)?.items();
            let mut out = Vec::with_capacity(items.map_or(0, |i| i.len()));
            for (j, item) in items.iter().flatten().enumerate() {
                out.push(index(item, "values", n_values, || format!("{} (IntList) items[{j}]", what()))?);
            }
            Value::IntList(out)
        }
        et::KernelTypes::DoubleList => Value::DoubleList(
            raw.val_as_double_list()
                .ok_or_else(missing)?
                .items()
                .map(|i| i.iter().collect())
                .unwrap_or_default(),
        ),
        et::KernelTypes::BoolList => Value::BoolList(
            raw.val_as_bool_list()
                .ok_or_else(missing)?
                .items()
                .map(|i| i.iter().collect())
                .unwrap_or_default(),
        ),
        et::KernelTypes::TensorList => Value::TensorList(value_indices(
            raw.val_as_tensor_list().ok_or_else(missing)?.items(),
            n_values,
            |j| format!("{} (TensorList) items[{j}]", what()),
        )?),
        et::KernelTypes::OptionalTensorList => {
            let items = raw.val_as_optional_tensor_list().ok_or_else(missing)?.items();
            let mut out = Vec::with_capacity(items.map_or(0, |i| i.len()));
            for (j, item) in items.iter().flatten().enumerate() {
                out.push(if item == -1 {
                    None
                } else {
                    Some(index(i64::from(item), "values", n_values, || {
                        format!("{} (OptionalTensorList) items[{j}]", what())
                    })?)
                });
            }
            Value::OptionalTensorList(out)
        }
        other => Value::Unknown { kind: other.0 },
    })
}

fn tensor(raw: et::Tensor<'_>) -> Tensor<'_> {
    Tensor {
        scalar_type: crate::model::ScalarType::from_i8(raw.scalar_type().0),
        sizes: raw.sizes().map(|s| s.iter().collect()).unwrap_or_default(),
        dim_order: raw.dim_order().map(|d| d.bytes().to_vec()).unwrap_or_default(),
        storage_offset: raw.storage_offset(),
        requires_grad: raw.requires_grad(),
        data_buffer_idx: raw.data_buffer_idx(),
        allocation: raw.allocation_info().map(|a| Allocation {
            mem_id: a.memory_id(),
            offset: (u64::from(a.memory_offset_high()) << 32) | u64::from(a.memory_offset_low()),
        }),
        shape_dynamism: match raw.shape_dynamism() {
            et::TensorShapeDynamism::STATIC => ShapeDynamism::Static,
            et::TensorShapeDynamism::DYNAMIC_BOUND => ShapeDynamism::DynamicBound,
            et::TensorShapeDynamism::DYNAMIC_UNBOUND => ShapeDynamism::DynamicUnbound,
            other => ShapeDynamism::Unknown(other.0),
        },
        extra: raw.extra_tensor_info().map(|e| ExtraTensorInfo {
            fully_qualified_name: e.fully_qualified_name(),
            location: match e.location() {
                et::TensorDataLocation::SEGMENT => TensorDataLocation::Segment,
                et::TensorDataLocation::EXTERNAL => TensorDataLocation::External,
                other => TensorDataLocation::Unknown(other.0),
            },
            mutable_data_segments_idx: e.mutable_data_segments_idx(),
        }),
    }
}

fn delegate<'a>(
    parts: &ProgramParts<'a, '_>,
    raw: et::BackendDelegate<'a>,
    what: impl Fn() -> String,
) -> Result<Delegate<'a>, Error> {
    let id = raw.id().ok_or_else(|| Error::Missing { what: format!("{}.id", what()) })?;
    let reference =
        raw.processed().ok_or_else(|| Error::Missing { what: format!("{}.processed", what()) })?;
    let at = || format!("{} ({id:?}) processed.index", what());
    let processed = match reference.location() {
        et::DataLocation::INLINE => {
            let len = parts.inline.map_or(0, |v| v.len());
            let i = index(i64::from(reference.index()), "backend_delegate_data", len, at)?;
            // `index` checked `i < len`, so `parts.inline` is present and `get(i)` is in range.
            let data = parts.inline.and_then(|v| v.get(i).data()).map(|d| d.bytes()).ok_or_else(|| {
                Error::Missing { what: format!("backend_delegate_data[{i}].data (of {})", what()) }
            })?;
            DelegateData {
                location: DataLocation::Inline,
                index: i,
                offset: offset_in(parts.bytes, data),
                size: data.len() as u64,
                data,
            }
        }
        et::DataLocation::SEGMENT => {
            let i = index(i64::from(reference.index()), "segments", parts.segments.len(), at)?;
            let segment = parts.segments[i];
            DelegateData {
                location: DataLocation::Segment,
                index: i,
                offset: segment.offset,
                size: segment.size,
                data: segment.data,
            }
        }
        other => {
            return Err(Error::InvalidField {
                what: format!("{} ({id:?}) processed.location", what()),
                problem: format!("{} is neither INLINE (0) nor SEGMENT (1)", other.0),
            })
        }
    };
    let compile_specs = match raw.compile_specs() {
        None => Vec::new(),
        Some(specs) => specs
            .iter()
            .enumerate()
            .map(|(j, s)| {
                let key = s.key().ok_or_else(|| Error::Missing {
                    what: format!("{} ({id:?}) compile_specs[{j}].key", what()),
                })?;
                Ok(CompileSpec { key, value: s.value().map(|v| v.bytes()).unwrap_or_default() })
            })
            .collect::<Result<Vec<_>, Error>>()?,
    };
    Ok(Delegate { id, compile_specs, processed })
}

fn read_chain<'a>(
    raw: et::Chain<'a>,
    n_values: usize,
    operators: &[Operator<'a>],
    n_delegates: usize,
    at: &dyn Fn() -> String,
) -> Result<Chain<'a>, Error> {
    let inputs = value_indices(raw.inputs(), n_values, |j| format!("{} inputs[{j}]", at()))?;
    let outputs = value_indices(raw.outputs(), n_values, |j| format!("{} outputs[{j}]", at()))?;
    let n_instructions = raw.instructions().map_or(0, |v| v.len());
    let mut instructions = Vec::with_capacity(n_instructions);
    for (k, instruction) in raw.instructions().iter().flatten().enumerate() {
        let kind = instruction.instr_args_type();
        let here = |field: &str| format!("{} instructions[{k}] ({}) {field}", at(), kind_name(kind));
        let missing = || Error::Missing { what: format!("{} instructions[{k}].instr_args", at()) };
        let value_at = |raw: i32, field: &str| index(i64::from(raw), "values", n_values, || here(field));
        instructions.push(match kind {
            et::InstructionArguments::NONE => return Err(missing()),
            et::InstructionArguments::KernelCall => {
                let call = instruction.instr_args_as_kernel_call().ok_or_else(missing)?;
                let operator =
                    index(i64::from(call.op_index()), "operators", operators.len(), || here("op_index"))?;
                let args = value_indices(call.args(), n_values, |j| here(&format!("args[{j}]")))?;
                let op = operators[operator];
                Instruction::Kernel(KernelCall { operator, name: op.name, overload: op.overload, args })
            }
            et::InstructionArguments::DelegateCall => {
                let call = instruction.instr_args_as_delegate_call().ok_or_else(missing)?;
                let delegate = index(i64::from(call.delegate_index()), "delegates", n_delegates, || {
                    here("delegate_index")
                })?;
                let args = value_indices(call.args(), n_values, |j| here(&format!("args[{j}]")))?;
                Instruction::Delegate(DelegateCall { delegate, args })
            }
            et::InstructionArguments::MoveCall => {
                let call = instruction.instr_args_as_move_call().ok_or_else(missing)?;
                Instruction::Move {
                    from: value_at(call.move_from(), "move_from")?,
                    to: value_at(call.move_to(), "move_to")?,
                }
            }
            et::InstructionArguments::JumpFalseCall => {
                let call = instruction.instr_args_as_jump_false_call().ok_or_else(missing)?;
                Instruction::JumpFalse {
                    condition: value_at(call.cond_value_index(), "cond_value_index")?,
                    destination: index(
                        i64::from(call.destination_instruction()),
                        "instructions",
                        n_instructions,
                        || here("destination_instruction"),
                    )?,
                }
            }
            et::InstructionArguments::FreeCall => {
                let call = instruction.instr_args_as_free_call().ok_or_else(missing)?;
                Instruction::Free { value: value_at(call.value_index(), "value_index")? }
            }
            other => Instruction::Unknown { kind: other.0 },
        });
    }
    Ok(Chain { inputs, outputs, instructions })
}

fn kind_name(kind: et::InstructionArguments) -> &'static str {
    kind.variant_name().unwrap_or("unknown")
}
