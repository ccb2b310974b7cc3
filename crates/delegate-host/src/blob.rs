//! `inspect`, `validate` and `convert`: what a blob says, whether it keeps the format's rules, and the same
//! blob in another wire format.

use std::io::Write;
use std::path::Path;

use blob_format::model::{Dim, DisplayShape, Header, Role};
use blob_format::Blob;
use clap::ValueEnum;
use et_error::{ErrorCode, HasErrorCode};
use host_runtime::blob_file::BlobFile;
use serde_json::json;

use crate::Failure;

/// A wire format `convert` writes.
#[derive(Clone, Copy, ValueEnum)]
pub enum Target {
    /// Our native format, current version.
    Native,
    /// Torch-TensorRT 2.14's layout (magic TR02, or TR01 when there are no aliases, as upstream writes it).
    Tr02,
}

fn open(path: &Path) -> Result<BlobFile, Failure> {
    BlobFile::open(path).map_err(|err| {
        Failure::coded(ErrorCode::AccessFailed, format!("cannot read {}: {err}", path.display()))
    })
}

fn parse<'a>(path: &Path, file: &'a BlobFile) -> Result<Blob<'a>, Failure> {
    Blob::parse(file.bytes())
        .map_err(|err| Failure::coded(err.error_code(), format!("{}: {err}", path.display())))
}

fn names(header: &Header, role: Role) -> Vec<&str> {
    header.threaded(role).map(|b| b.name.as_str()).collect()
}

pub fn inspect(path: &Path, json: bool) -> Result<(), Failure> {
    let file = open(path)?;
    let blob = parse(path, &file)?;
    let h = &blob.header;
    if json {
        let bindings: Vec<_> = h
            .bindings
            .iter()
            .map(|b| {
                json!({
                    "name": b.name,
                    "role": b.role.as_str(),
                    "dtype": b.dtype.map(|d| d.name()),
                    "shape": b.shape.as_ref().map(|s| s.iter().map(|d| match d {
                        Dim::Static(n) => json!(n),
                        Dim::Dynamic => json!(null),
                    }).collect::<Vec<_>>()),
                    "threaded": b.threaded,
                })
            })
            .collect();
        let aliases: Vec<_> = h
            .aliases
            .iter()
            .map(|a| json!({"output": a.output, "input": a.input, "kind": a.kind.as_str()}))
            .collect();
        let value = json!({
            "format": blob.format.name(),
            "version": blob.format.version(),
            "backend": h.backend_id,
            "payload_kind": h.payload_kind.as_str(),
            "producer": h.producer.as_ref().map(|p| json!({"name": p.name, "version": p.version})),
            "inputs": names(h, Role::Input),
            "outputs": names(h, Role::Output),
            "bindings": bindings,
            "aliases": aliases,
            "device_id": h.device_id,
            "hardware_compatible": h.hardware_compatible,
            "hardware_target": h.hardware_target,
            "engine_library_version": h.engine_library_version,
            "engine_offset": blob.engine_offset(),
            "engine_size": blob.engine.len(),
        });
        println!("{value}");
        return Ok(());
    }
    let mut out = String::new();
    use std::fmt::Write as _;
    let _ = writeln!(out, "format:   {}", blob.format);
    let _ = writeln!(out, "backend:  {}", h.backend_id);
    let _ = writeln!(
        out,
        "payload:  {} ({} bytes at offset {})",
        h.payload_kind,
        blob.engine.len(),
        blob.engine_offset()
    );
    if let Some(p) = &h.producer {
        let _ = writeln!(out, "producer: {} {}", p.name, p.version);
    }
    let _ = writeln!(out, "device:   {}", h.device_id);
    if let Some(v) = &h.engine_library_version {
        let _ = writeln!(out, "library:  {v}");
    }
    if let Some(t) = &h.hardware_target {
        let _ = writeln!(out, "target:   {t}");
    }
    let _ = writeln!(out, "bindings (delegate-argument order):");
    let mut position = 0;
    for b in &h.bindings {
        let arg = if b.threaded {
            position += 1;
            format!("arg {:>2}", position - 1)
        } else {
            "  (not threaded)".to_owned()
        };
        let dtype = b.dtype.map_or("?".to_owned(), |d| d.to_string());
        let shape = b.shape.as_ref().map_or("?".to_owned(), |s| DisplayShape(s).to_string());
        let _ = writeln!(out, "  {arg}  {:<6} {:<24} {dtype:<5} {shape}", b.role.as_str(), b.name);
    }
    if h.aliases.is_empty() {
        let _ = writeln!(out, "aliases:  none");
    } else {
        let _ = writeln!(out, "aliases:");
        for a in &h.aliases {
            let _ = writeln!(out, "  {} <- {} ({})", a.output, a.input, a.kind);
        }
    }
    print!("{out}");
    Ok(())
}

pub fn validate(path: &Path) -> Result<(), Failure> {
    let file = open(path)?;
    let blob = parse(path, &file)?;
    blob.verify_payload()
        .map_err(|err| Failure::coded(err.error_code(), format!("{}: {err}", path.display())))?;
    let plan = alias_validate::validate_format(&blob.header)
        .map_err(|err| Failure::coded(err.error_code(), format!("{}: {err}", path.display())))?;
    for warning in plan.warnings() {
        eprintln!("warning: {warning}");
    }
    println!(
        "ok: {} blob for {}, {} bindings, {} aliases, {} engine bytes",
        blob.format,
        blob.header.backend_id,
        blob.header.bindings.len(),
        plan.aliases().len(),
        blob.engine.len()
    );
    Ok(())
}

pub fn convert(input: &Path, output: &Path, to: Target) -> Result<(), Failure> {
    let file = open(input)?;
    let blob = parse(input, &file)?;
    let write_err = |err: std::io::Error| {
        Failure::coded(ErrorCode::AccessFailed, format!("cannot write {}: {err}", output.display()))
    };
    let mut out = std::io::BufWriter::new(std::fs::File::create(output).map_err(write_err)?);
    match to {
        Target::Native => {
            blob_format::native::write(&blob.header, blob.engine, &mut out).map_err(write_err)?
        }
        Target::Tr02 => {
            let bytes = blob_format::upstream::write_tr02(&blob.header, blob.engine).map_err(|err| {
                let _ = std::fs::remove_file(output);
                Failure::coded(
                    err.error_code(),
                    format!("{}: cannot convert to tr02: {err}", input.display()),
                )
            })?;
            out.write_all(&bytes).map_err(write_err)?;
        }
    }
    out.flush().map_err(write_err)?;
    Ok(())
}
