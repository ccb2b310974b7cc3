//! `inspect` of an ExecuTorch program (`.pte`): methods with inputs and outputs, each `DelegateCall` with its
//! backend and its payload read as a delegate blob, mutable buffers, and the operators ExecuTorch runs itself.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::path::Path;

use blob_format::HeaderOnly;
use et_error::{ErrorCode, HasErrorCode};
use pte_format::model::{Delegate, DelegateCall, DelegateData, InstructionRef, Method, Tensor, Value};
use pte_format::Program;
use serde_json::{json, Value as Json};

use crate::blob::{Head, Unread};
use crate::{emit, printable, Failure};

/// Reads the program at `path` (opened as `head`) and prints it. Only the program data and each delegate
/// blob's header are read: a payload in a segment is located and sized from the program, its engine never
/// read, so a multi-gigabyte program costs its metadata in memory.
pub fn inspect(path: &Path, head: &Head, json: bool) -> Result<(), Failure> {
    let bytes = program_data(path, head)?;
    let program = parse(path, head, &bytes)?;
    if json {
        emit(&format!("{}\n", program_json(head, &program)))
    } else {
        emit(&program_text(head, &program))
    }
}

fn format_error(path: &Path, err: pte_format::Error) -> Failure {
    Failure::coded(err.error_code(), format!("{}: {err}", path.display()))
}

/// The program data of the program at `path` (opened as `head`): its first `program_extent` bytes, its
/// payloads in segments not among them.
pub(crate) fn program_data(path: &Path, head: &Head) -> Result<Vec<u8>, Failure> {
    let extent = pte_format::program_extent(&head.first, head.len).map_err(|err| format_error(path, err))?;
    head.read_at(0, extent).map_err(|err| {
        Failure::coded(ErrorCode::AccessFailed, format!("cannot read {}: {err}", path.display()))
    })
}

/// The program in `bytes`, its [`program_data`] ([`Program::parse_prefix`]).
pub(crate) fn parse<'a>(path: &Path, head: &Head, bytes: &'a [u8]) -> Result<Program<'a>, Failure> {
    Program::parse_prefix(bytes, head.len).map_err(|err| format_error(path, err))
}

/// A delegate's payload, whole: the bytes read with the program when it is among them (inline data),
/// otherwise its `size` bytes read from the file at its offset (and no more).
pub(crate) fn payload<'a>(head: &Head, p: &DelegateData<'a>) -> std::io::Result<Cow<'a, [u8]>> {
    if p.data.len() as u64 == p.size {
        return Ok(Cow::Borrowed(p.data));
    }
    let bytes = head.read_at(p.offset, p.size)?;
    if bytes.len() as u64 != p.size {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("the file ends {} bytes into a {}-byte payload", bytes.len(), p.size),
        ));
    }
    Ok(Cow::Owned(bytes))
}

/// The header of a delegate's blob: from the bytes read when the payload is whole among them (inline data),
/// otherwise from the file at the payload's offset.
fn blob_header(head: &Head, p: &DelegateData<'_>) -> Result<HeaderOnly, Unread> {
    if p.data.len() as u64 == p.size {
        Ok(blob_format::parse_header(p.data, p.size)?)
    } else {
        head.blob_header(p.offset, p.size)
    }
}

/// `v7`: a value by index.
fn v(value: usize) -> String {
    format!("v{value}")
}

/// `k_cache  Float [1, 2, 16, 8]  mem 2 @ 0` (the name when the file has one), or the value's kind when it
/// is not a tensor.
fn describe(method: &Method<'_>, value: usize) -> String {
    let Some(tensor) = method.tensor(value) else {
        return method.values.get(value).map_or("?", |v| v.kind()).to_owned();
    };
    let mut out = String::new();
    if let Some(name) = tensor.fully_qualified_name() {
        let _ = write!(out, "{}  ", printable(name));
    }
    let _ = write!(out, "{} {:?}", tensor.scalar_type, tensor.sizes);
    if let Some(a) = tensor.allocation {
        let _ = write!(out, "  mem {} @ {}", a.mem_id, a.offset);
    }
    out
}

fn program_text(head: &Head, program: &Program<'_>) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "format:   pte ET12 (schema version {})", program.version);
    match program.extended_header {
        Some(h) => {
            let _ = writeln!(
                out,
                "program:  {} bytes; extended header eh00 ({} bytes); {} segments from offset {} ({} bytes)",
                program.program_size,
                h.length,
                program.segments.len(),
                h.segment_base_offset,
                h.segment_data_size
            );
        }
        None => {
            let _ = writeln!(
                out,
                "program:  {} bytes; no extended header; {} segments",
                program.program_size,
                program.segments.len()
            );
        }
    }
    for method in &program.methods {
        method_text(head, &mut out, method);
    }
    out
}

fn method_text(head: &Head, out: &mut String, method: &Method<'_>) {
    let _ = writeln!(out, "method {}", printable(method.name));
    for (title, values) in [("inputs", &method.inputs), ("outputs", &method.outputs)] {
        let _ = writeln!(out, "  {title}:");
        for (i, &value) in values.iter().enumerate() {
            let _ = writeln!(out, "    [{i}] {:<4} {}", v(value), describe(method, value));
        }
    }
    let buffers = method.mutable_buffers();
    if buffers.is_empty() {
        let _ = writeln!(out, "  mutable buffers: none");
    } else {
        let _ = writeln!(out, "  mutable buffers:");
        for b in &buffers {
            let bytes =
                method.tensor(b.value).and_then(Tensor::nbytes).map_or("?".to_owned(), |n| n.to_string());
            let mut line = format!("    {:<4} {}  {bytes} bytes", v(b.value), describe(method, b.value));
            for w in &b.write_backs {
                let from = w.src.map_or("?".to_owned(), v);
                let _ = write!(line, "; written back from {from} by aten::copy_ at {}", w.at);
            }
            let _ = writeln!(out, "{line}");
        }
    }
    let calls: Vec<_> = method.delegate_calls().collect();
    if calls.is_empty() {
        let _ = writeln!(out, "  delegate calls: none");
    } else {
        let _ = writeln!(out, "  delegate calls:");
        for (at, call) in calls {
            delegate_call_text(head, out, method, at, call);
        }
    }
    let kernels: Vec<_> = method.kernel_calls().collect();
    if kernels.is_empty() {
        let _ = writeln!(out, "  operators (not delegated): none");
    } else {
        let _ = writeln!(out, "  operators (not delegated):");
        for (at, k) in kernels {
            let args: Vec<_> = k.args.iter().map(|&a| v(a)).collect();
            let op = method.operators[k.operator].to_string();
            let _ = writeln!(out, "    {at}  {}  ({})", printable(&op), args.join(" "));
        }
    }
    let others: Vec<_> = method
        .instructions()
        .filter(|(_, i)| {
            !matches!(
                i,
                pte_format::model::Instruction::Kernel(_) | pte_format::model::Instruction::Delegate(_)
            )
        })
        .map(|(at, i)| format!("{at} {}", i.kind()))
        .collect();
    if !others.is_empty() {
        let _ = writeln!(out, "  other instructions: {}", others.join(", "));
    }
}

fn delegate_call_text(
    head: &Head,
    out: &mut String,
    method: &Method<'_>,
    at: InstructionRef,
    call: &DelegateCall,
) {
    let delegate = &method.delegates[call.delegate];
    let _ = writeln!(out, "    {at}  delegate {}  {}", call.delegate, printable(delegate.id));
    let args: Vec<_> = call.args.iter().map(|&a| v(a)).collect();
    let _ = writeln!(out, "      args:     {}", args.join(" "));
    let p = &delegate.processed;
    let _ = writeln!(out, "      payload:  {}, {} bytes at offset {}", p.label(), p.size, p.offset);
    for spec in &delegate.compile_specs {
        let _ = writeln!(out, "      compile spec: {} ({} bytes)", printable(spec.key), spec.value.len());
    }
    match blob_header(head, p) {
        Err(err) => {
            let (message, code) = err.message_and_code();
            let message = format!("{message} [{code}]");
            let _ = writeln!(out, "      blob:     not read: {}", printable(&message));
        }
        Ok(blob) => {
            let h = &blob.header;
            let _ = writeln!(
                out,
                "      blob:     {}, backend {}, payload {} ({} bytes)",
                blob.format,
                printable(&h.backend_id),
                printable(h.payload_kind.as_str()),
                blob.engine_size
            );
            let threaded = h.bindings.iter().filter(|b| b.threaded).count();
            if threaded != call.args.len() {
                let _ = writeln!(
                    out,
                    "      warning:  the blob binds {threaded} arguments, the DelegateCall passes {}",
                    call.args.len()
                );
            }
            let _ = writeln!(out, "      bindings (delegate-argument order):");
            let mut position = 0;
            for b in &h.bindings {
                let (arg, value) = if b.threaded {
                    position += 1;
                    let value = call
                        .args
                        .get(position - 1)
                        .map_or("(no arg)".to_owned(), |&a| format!("{}  {}", v(a), describe(method, a)));
                    (format!("arg {:>2}", position - 1), value)
                } else {
                    ("  (not threaded)".to_owned(), String::new())
                };
                let (dtype, shape) = crate::blob::dtype_and_shape(b);
                let _ = writeln!(
                    out,
                    "        {arg}  {:<6} {:<16} {dtype:<5} {shape:<14} {value}",
                    b.role.as_str(),
                    printable(&b.name)
                );
            }
            crate::blob::write_aliases(out, "      ", &h.aliases);
        }
    }
}

fn tensor_json(tensor: &Tensor<'_>) -> Json {
    json!({
        "scalar_type": tensor.scalar_type.name(),
        "sizes": tensor.sizes,
        "mem_id": tensor.allocation.map(|a| a.mem_id),
        "offset": tensor.allocation.map(|a| a.offset),
        "nbytes": tensor.nbytes(),
        "name": tensor.fully_qualified_name(),
    })
}

fn value_json(method: &Method<'_>, value: usize) -> Json {
    let kind = method.values.get(value).map_or("?", Value::kind);
    json!({"value": value, "kind": kind, "tensor": method.tensor(value).map(tensor_json)})
}

fn blob_json(head: &Head, delegate: &Delegate<'_>, call: &DelegateCall) -> (&'static str, Json) {
    let blob = match blob_header(head, &delegate.processed) {
        Ok(blob) => blob,
        Err(err) => {
            let (message, code) = err.message_and_code();
            return ("blob_error", json!({"message": message, "code": code}));
        }
    };
    let h = &blob.header;
    let mut position = 0;
    let bindings: Vec<_> = h
        .bindings
        .iter()
        .map(|b| {
            let arg = b.threaded.then(|| {
                position += 1;
                position - 1
            });
            let mut value = crate::blob::binding_json(b);
            value["arg"] = json!(arg);
            value["value"] = json!(arg.and_then(|a| call.args.get(a)));
            value
        })
        .collect();
    let aliases: Vec<_> = h
        .aliases
        .iter()
        .map(|a| json!({"output": a.output, "input": a.input, "kind": a.kind.as_str()}))
        .collect();
    (
        "blob",
        json!({
            "format": blob.format.name(),
            "version": blob.format.version(),
            "backend": h.backend_id,
            "payload_kind": h.payload_kind.as_str(),
            "bindings": bindings,
            "aliases": aliases,
            "engine_offset": blob.engine_offset,
            "engine_size": blob.engine_size,
        }),
    )
}

fn method_json(head: &Head, method: &Method<'_>) -> Json {
    let buffers: Vec<_> = method
        .mutable_buffers()
        .iter()
        .map(|b| {
            let write_backs: Vec<_> = b
                .write_backs
                .iter()
                .map(|w| json!({"instruction": w.at.to_string(), "src": w.src}))
                .collect();
            json!({
                "value": b.value,
                "name": b.name,
                "mem_id": b.allocation.mem_id,
                "offset": b.allocation.offset,
                "data_buffer_idx": b.data_buffer_idx,
                "tensor": method.tensor(b.value).map(tensor_json),
                "write_backs": write_backs,
            })
        })
        .collect();
    let calls: Vec<_> = method
        .delegate_calls()
        .map(|(at, call)| {
            let delegate = &method.delegates[call.delegate];
            let p = &delegate.processed;
            let specs: Vec<_> =
                delegate.compile_specs.iter().map(|s| json!({"key": s.key, "size": s.value.len()})).collect();
            let (key, blob) = blob_json(head, delegate, call);
            let mut entry = json!({
                "instruction": at.to_string(),
                "delegate": call.delegate,
                "backend": delegate.id,
                "args": call.args,
                "compile_specs": specs,
                "payload": {
                    "location": p.location.as_str(),
                    "index": p.index,
                    "offset": p.offset,
                    "size": p.size,
                },
            });
            entry[key] = blob;
            entry
        })
        .collect();
    let operators: Vec<_> = method
        .kernel_calls()
        .map(|(at, k)| {
            json!({
                "instruction": at.to_string(),
                "operator": k.operator,
                "name": k.name,
                "overload": k.overload,
                "args": k.args,
            })
        })
        .collect();
    json!({
        "name": method.name,
        "inputs": method.inputs.iter().map(|&i| value_json(method, i)).collect::<Vec<_>>(),
        "outputs": method.outputs.iter().map(|&i| value_json(method, i)).collect::<Vec<_>>(),
        "mutable_buffers": buffers,
        "delegate_calls": calls,
        "operators": operators,
        "instructions": method.instructions().map(|(at, i)| json!({"instruction": at.to_string(), "kind": i.kind()})).collect::<Vec<_>>(),
    })
}

fn program_json(head: &Head, program: &Program<'_>) -> Json {
    json!({
        "format": "pte",
        "identifier": "ET12",
        "schema_version": program.version,
        "program_size": program.program_size,
        "extended_header": program.extended_header.map(|h| json!({
            "length": h.length,
            "program_size": h.program_size,
            "segment_base_offset": h.segment_base_offset,
            "segment_data_size": h.segment_data_size,
        })),
        "segments": program.segments.iter().map(|s| json!({"offset": s.offset, "size": s.size})).collect::<Vec<_>>(),
        "methods": program.methods.iter().map(|m| method_json(head, m)).collect::<Vec<_>>(),
    })
}
