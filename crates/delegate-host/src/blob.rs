//! `inspect`, `validate` and `convert`: what a blob says, whether it keeps the format's rules, and the same
//! blob in another wire format.

use std::io::Write;
use std::path::Path;

use blob_format::model::{Alias, Binding, Dim, DisplayShape, Header, Role};
use blob_format::{Blob, HeaderOnly};
use clap::ValueEnum;
use et_error::{ErrorCode, HasErrorCode};
use host_runtime::blob_file::{open_regular, BlobFile};
use serde_json::json;

use crate::{emit, printable, Failure};

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

/// A file `inspect` reads only the parts it shows of: opened once ([`open_regular`]), its length, and its
/// first bytes. A multi-gigabyte blob or program costs its header in memory, not its size.
pub(crate) struct Head {
    file: std::fs::File,
    /// The file's length.
    pub(crate) len: u64,
    /// Its first bytes: enough for a blob's prefix or a program's extended header.
    pub(crate) first: Vec<u8>,
}

impl Head {
    pub(crate) fn open(path: &Path) -> Result<Head, Failure> {
        let access = |err: std::io::Error| {
            Failure::coded(ErrorCode::AccessFailed, format!("cannot read {}: {err}", path.display()))
        };
        let file = open_regular(path).map_err(access)?;
        let len = file.metadata().map_err(access)?.len();
        let first_len = blob_format::HEADER_EXTENT_BYTES.max(pte_format::PROGRAM_EXTENT_BYTES);
        let mut head = Head { file, len, first: Vec::new() };
        head.first = head.read_at(0, first_len as u64).map_err(access)?;
        Ok(head)
    }

    /// Up to `len` bytes from `offset` (fewer where the file ends); memory grows with what is read.
    pub(crate) fn read_at(&self, offset: u64, len: u64) -> std::io::Result<Vec<u8>> {
        use std::io::{Read, Seek};
        let mut file = &self.file;
        file.seek(std::io::SeekFrom::Start(offset))?;
        let mut bytes = Vec::new();
        file.take(len).read_to_end(&mut bytes)?;
        Ok(bytes)
    }

    /// The header of the blob of `size` bytes at `offset` in the file, read from its first bytes only.
    pub(crate) fn blob_header(&self, offset: u64, size: u64) -> Result<HeaderOnly, Unread> {
        let first = self.read_at(offset, size.min(blob_format::HEADER_EXTENT_BYTES as u64))?;
        let extent = blob_format::header_extent(&first)?;
        let head = self.read_at(offset, extent.min(size))?;
        Ok(blob_format::parse_header(&head, size)?)
    }
}

/// Why a blob's header was not read: the file, or the blob.
pub(crate) enum Unread {
    Io(std::io::Error),
    Blob(blob_format::Error),
}

impl Unread {
    /// The message and the code's name, as `inspect` shows them.
    pub(crate) fn message_and_code(&self) -> (String, &'static str) {
        match self {
            Unread::Io(err) => (format!("cannot read it: {err}"), ErrorCode::AccessFailed.name()),
            Unread::Blob(err) => (err.to_string(), err.error_code().name()),
        }
    }
}

impl From<std::io::Error> for Unread {
    fn from(err: std::io::Error) -> Unread {
        Unread::Io(err)
    }
}

impl From<blob_format::Error> for Unread {
    fn from(err: blob_format::Error) -> Unread {
        Unread::Blob(err)
    }
}

/// Shows what a blob (or a `.pte` program, with each delegate's blob) says, reading only its headers: the
/// engine (gigabytes, for a real one) is located and sized, never read.
pub fn inspect(path: &Path, json: bool) -> Result<(), Failure> {
    let head = Head::open(path)?;
    // An ExecuTorch program (`ET??` at bytes 4..8) is read as one, with each delegate's blob inside it.
    if pte_format::is_program(&head.first) {
        return crate::pte::inspect(path, &head, json);
    }
    let blob = head.blob_header(0, head.len).map_err(|err| match err {
        Unread::Io(err) => {
            Failure::coded(ErrorCode::AccessFailed, format!("cannot read {}: {err}", path.display()))
        }
        Unread::Blob(err) => Failure::coded(err.error_code(), format!("{}: {err}", path.display())),
    })?;
    let h = &blob.header;
    if json {
        let bindings: Vec<_> = h.bindings.iter().map(binding_json).collect();
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
            "engine_offset": blob.engine_offset,
            "engine_size": blob.engine_size,
        });
        return emit(&format!("{value}\n"));
    }
    let mut out = String::new();
    use std::fmt::Write as _;
    let _ = writeln!(out, "format:   {}", blob.format);
    let _ = writeln!(out, "backend:  {}", printable(&h.backend_id));
    let _ = writeln!(
        out,
        "payload:  {} ({} bytes at offset {})",
        printable(h.payload_kind.as_str()),
        blob.engine_size,
        blob.engine_offset
    );
    if let Some(p) = &h.producer {
        let _ = writeln!(out, "producer: {} {}", printable(&p.name), printable(&p.version));
    }
    let _ = writeln!(out, "device:   {}", h.device_id);
    if let Some(v) = &h.engine_library_version {
        let _ = writeln!(out, "library:  {}", printable(v));
    }
    if let Some(t) = &h.hardware_target {
        let _ = writeln!(out, "target:   {}", printable(t));
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
        let (dtype, shape) = dtype_and_shape(b);
        let _ =
            writeln!(out, "  {arg}  {:<6} {:<24} {dtype:<5} {shape}", b.role.as_str(), printable(&b.name));
    }
    write_aliases(&mut out, "", &h.aliases);
    emit(&out)
}

/// A binding as `inspect --json` prints it (`null` where the blob does not record a dtype, shape or extent).
pub(crate) fn binding_json(b: &Binding) -> serde_json::Value {
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
}

/// A binding's dtype and shape as `inspect` prints them (`?` where the blob does not record them).
pub(crate) fn dtype_and_shape(binding: &Binding) -> (String, String) {
    let dtype = binding.dtype.map_or("?".to_owned(), |d| d.to_string());
    let shape = binding.shape.as_ref().map_or("?".to_owned(), |s| DisplayShape(s).to_string());
    (dtype, shape)
}

/// The alias table as `inspect` prints it, every line starting with `indent`.
pub(crate) fn write_aliases(out: &mut String, indent: &str, aliases: &[Alias]) {
    use std::fmt::Write as _;
    if aliases.is_empty() {
        let _ = writeln!(out, "{indent}aliases:  none");
        return;
    }
    let _ = writeln!(out, "{indent}aliases:");
    for a in aliases {
        let _ = writeln!(
            out,
            "{indent}  {} <- {} ({})",
            printable(&a.output),
            printable(&a.input),
            printable(a.kind.as_str())
        );
    }
}

pub fn validate(path: &Path) -> Result<(), Failure> {
    let file = open(path)?;
    let blob = parse(path, &file)?;
    blob.verify_payload()
        .map_err(|err| Failure::coded(err.error_code(), format!("{}: {err}", path.display())))?;
    let plan = alias_validate::validate_format(&blob.header)
        .map_err(|err| Failure::coded(err.error_code(), format!("{}: {err}", path.display())))?;
    for warning in plan.warnings() {
        eprintln!("warning: {}", printable(&warning.to_string()));
    }
    emit(&format!(
        "ok: {} blob for {}, {} bindings, {} aliases, {} engine bytes\n",
        blob.format,
        printable(&blob.header.backend_id),
        blob.header.bindings.len(),
        plan.aliases().len(),
        blob.engine.len()
    ))
}

/// Writes `input` in the `to` format to `output`.
///
/// Nothing is lost whatever happens: the output is written to a temporary file beside it and renamed into
/// place only when complete, so a refused or failed conversion leaves an existing `output` as it was; an
/// `output` that is the input itself (the same path, a hard link or a symlink to it) is refused before
/// anything is written, since the input is read while the output is written.
pub fn convert(input: &Path, output: &Path, to: Target) -> Result<(), Failure> {
    let file = open(input)?;
    if same_file(input, output) {
        return Err(Failure::coded(
            ErrorCode::InvalidArgument,
            format!(
                "cannot convert {} onto itself ({} is the same file): write to another path",
                input.display(),
                output.display()
            ),
        ));
    }
    let blob = parse(input, &file)?;
    // Either target is refused before anything is written when it cannot express the blob.
    let tr02 = match to {
        Target::Native => {
            blob_format::native::check_header(&blob.header).map_err(|err| {
                Failure::coded(
                    err.error_code(),
                    format!("{}: cannot convert to native: {err}", input.display()),
                )
            })?;
            None
        }
        Target::Tr02 => {
            Some(blob_format::upstream::write_tr02(&blob.header, blob.engine).map_err(|err| {
                Failure::coded(
                    err.error_code(),
                    format!("{}: cannot convert to tr02: {err}", input.display()),
                )
            })?)
        }
    };
    let write_err = |err: std::io::Error| {
        Failure::coded(ErrorCode::AccessFailed, format!("cannot write {}: {err}", output.display()))
    };
    crate::out_file::replace(output, |out| match &tr02 {
        None => blob_format::native::write(&blob.header, blob.engine, out),
        Some(bytes) => out.write_all(bytes),
    })
    .map_err(write_err)
}

/// Whether `a` and `b` name the same file (after links): by device and inode on Unix, by canonical path
/// elsewhere.
fn same_file(a: &Path, b: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match (std::fs::metadata(a), std::fs::metadata(b)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false, // `b` does not exist yet: it cannot be `a`
        }
    }
    #[cfg(not(unix))]
    {
        matches!((std::fs::canonicalize(a), std::fs::canonicalize(b)), (Ok(a), Ok(b)) if a == b)
    }
}
