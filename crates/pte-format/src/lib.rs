//! Reads ExecuTorch `.pte` programs (container `ET12`, ExecuTorch 1.x) into a checked, borrowed view:
//! extended header, segments, methods with their values, chains and instructions, delegates with their
//! payloads, mutable buffers.
//!
//! [`Program::parse`] checks the container with overflow-free arithmetic (identifier, the `eh00` extended
//! header, program size, segment base offset and data size, every segment's extent inside the file), runs
//! the FlatBuffers verifier over the program data, and resolves every index (values, operators, delegates,
//! segments, inline delegate data) against its table, so any input either reads or fails with a typed
//! [`Error`] naming the field and offset, never a panic. Payloads (delegate data, segments, compile spec
//! values) are sub-slices of the input, never copies: a `.pte` read from an mmap stays in the mmap.
//!
//! The schema is ExecuTorch 1.5.1's (`schema/program.fbs`, BSD-licensed, see `schema/README.md`); the Rust
//! code generated from it is committed and checked by `cargo xtask codegen --check`.
//!
//! ## Examples
//!
//! ```
//! use pte_format::model::{DataLocation, Instruction};
//! use pte_format::{testing, Program};
//!
//! // A KV-cache decoder laid out as ExecuTorch 1.5.1 writes it (`testing` builds it for tests).
//! let bytes = testing::kv_decoder(b"delegate payload");
//! let program = Program::parse(&bytes)?;
//! assert_eq!(program.extended_header.map(|h| h.segment_base_offset % 128), Some(0));
//!
//! let forward = program.method("forward").expect("forward");
//! assert_eq!(forward.inputs, [testing::kv::TOKENS, testing::kv::INPUT_POS]);
//! let (_, call) = forward.delegate_calls().next().expect("one DelegateCall");
//! let delegate = &forward.delegates[call.delegate];
//! assert_eq!(delegate.id, "ReferenceBackend");
//! assert_eq!(delegate.processed.location, DataLocation::Segment);
//! // The payload is borrowed from the file, at the offset the segment table says.
//! assert_eq!(delegate.processed.data, b"delegate payload");
//! let at = delegate.processed.offset as usize;
//! assert_eq!(delegate.processed.data.as_ptr(), bytes[at..].as_ptr());
//!
//! // KV caches: planned tensors named by the exporter and written back by `aten::copy_`.
//! let buffers = forward.mutable_buffers();
//! let names: Vec<_> = buffers.iter().map(|b| b.name).collect();
//! assert_eq!(names, [Some("k_cache"), Some("v_cache")]);
//! assert_eq!(buffers[0].allocation.mem_id, 2);
//! assert_eq!(buffers[0].write_backs[0].src, Some(testing::kv::K_NEW));
//!
//! // Operators ExecuTorch runs itself.
//! let ops: Vec<_> = forward.kernel_calls().map(|(_, k)| format!("{}", forward.operators[k.operator])).collect();
//! assert_eq!(ops, ["aten::copy_", "aten::copy_", "aten::clone.out"]);
//! assert!(matches!(forward.chains[0].instructions[0], Instruction::Delegate(_)));
//! # Ok::<(), pte_format::Error>(())
//! ```
//!
//! ## Container layout
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | u32 LE flatbuffer root offset |
//! | 4 | 4 | file identifier `ET12` |
//! | 8 | 32 | optional extended header: magic `eh00`, u32 length (32; at least 24), u64 program size, u64 segment base offset, u64 segment data size (absent when the length is 24) |
//! | ... | ... | the rest of the flatbuffer, up to the program size (the whole file without a header) |
//! | segment base | segment data size | segments, each at `base + segments[i].offset` |
//!
//! ExecuTorch inserts the header only when there is segment data, aligns the segment base offset and each
//! segment to 128 bytes; this reader does not require the alignment. Without a header, segments must be
//! empty (ExecuTorch lists an empty constant segment even then).
//!
//! ## Unsafe code
//!
//! The crate `deny`s `unsafe_code` instead of forbidding it: the generated FlatBuffers accessors in the
//! private `generated` module use `unsafe` internally, sound because the verifier runs first; that module
//! alone allows it, and no other code here uses `unsafe`.
//!
//! ## Feature Flags
//!
//! - `testing`: the `testing` module, a builder writing small `.pte` files as ExecuTorch lays them out,
//!   for tests of this crate and of its users (not an exporter).
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod buffers;
mod container;
mod error;
mod generated;
pub mod model;
mod read;
#[cfg(feature = "testing")]
pub mod testing;

pub use container::{
    is_program, EXTENDED_HEADER_LEN, EXTENDED_HEADER_MAGIC, EXTENDED_HEADER_OFFSET, IDENTIFIER,
};
pub use error::Error;

/// How many of a file's first bytes hold its program data (the extended header's program size, or the whole
/// file without one), from `first`, the file's first [`PROGRAM_EXTENT_BYTES`] bytes (or all of it when it is
/// shorter), `file_len` being its length: what [`Program::parse_prefix`] needs.
///
/// # Errors
/// The container errors of [`Program::parse`] (identifier, extended header, program size, segment area).
pub fn program_extent(first: &[u8], file_len: u64) -> Result<u64, Error> {
    Ok(container::layout(first, file_len)?.program_size)
}

/// The bytes [`program_extent`] needs to see: the identifier and the extended header (40).
pub const PROGRAM_EXTENT_BYTES: usize = 40;
use model::{ExtendedHeader, Method, NamedData, Segment, SubsegmentOffsets};

/// The newest `Program.version` this build reads (ExecuTorch 1.5.1's `kMaxSupportedSchemaVersion`).
pub const MAX_SCHEMA_VERSION: u32 = 0;

/// A `.pte` program read from bytes it borrows.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Program<'a> {
    /// `Program.version`, the schema version (0 in ExecuTorch 1.x).
    pub version: u32,
    /// The extended header, when the file has one (it does whenever it has segment data).
    pub extended_header: Option<ExtendedHeader>,
    /// Bytes of program data: the header's `program_size`, or the whole file without a header.
    pub program_size: u64,
    /// `Program.segments`, located in the file and borrowed.
    pub segments: Vec<Segment<'a>>,
    /// `Program.execution_plan`: the methods.
    pub methods: Vec<Method<'a>>,
    /// `Program.constant_segment`: where constant tensors are.
    pub constant_segment: Option<SubsegmentOffsets>,
    /// `Program.mutable_data_segments`: initial values of mutable tensors, when the export stored them.
    pub mutable_data_segments: Vec<SubsegmentOffsets>,
    /// `Program.named_data`: segments by name.
    pub named_data: Vec<NamedData<'a>>,
}

impl<'a> Program<'a> {
    /// Reads a `.pte` file: container, FlatBuffers verification, every index checked. O(program metadata);
    /// payload bytes are never read or copied.
    ///
    /// # Errors
    /// [`Error::UnsupportedIdentifier`] and [`Error::NewerSchema`] (`NotSupported`) for ExecuTorch versions
    /// this build does not read; every other [`Error`] (`InvalidProgram`) names what is malformed and where.
    pub fn parse(bytes: &'a [u8]) -> Result<Program<'a>, Error> {
        Program::parse_prefix(bytes, bytes.len() as u64)
    }

    /// [`Program::parse`] from the first bytes of a file of `file_len` bytes: `prefix` holds at least the
    /// program data ([`program_extent`] bytes), and every extent is checked against `file_len`. Segments and
    /// delegate payloads outside `prefix` are located and sized but their [`Segment::data`] and
    /// [`DelegateData::data`](model::DelegateData::data) hold only the bytes inside it: what a tool that
    /// shows a program reads, whatever the size of its payloads.
    ///
    /// # Errors
    /// As [`Program::parse`]; [`Error::Truncated`] when `prefix` ends inside the program data.
    pub fn parse_prefix(prefix: &'a [u8], file_len: u64) -> Result<Program<'a>, Error> {
        let bytes = prefix;
        let layout = container::layout(bytes, file_len)?;
        // `layout` checked `program_size <= file_len`; the prefix must hold the program data.
        let program_bytes = usize::try_from(layout.program_size).ok().and_then(|n| bytes.get(..n)).ok_or(
            Error::Truncated { what: "the program data", need: layout.program_size, len: bytes.len() as u64 },
        )?;
        let root = generated::et::root_as_program_with_opts(&read::verifier_options(), program_bytes)
            .map_err(|err| Error::Flatbuffer {
                program_size: layout.program_size,
                detail: read::one_line(&err.to_string()),
            })?;
        if root.version() > MAX_SCHEMA_VERSION {
            return Err(Error::NewerSchema { version: root.version(), max: MAX_SCHEMA_VERSION });
        }
        let segments = read::segments(bytes, &root, layout.segments)?;
        let constant_segment = root
            .constant_segment()
            .map(|c| read::subsegment(c, segments.len(), || "constant_segment".to_owned()))
            .transpose()?;
        let mutable_data_segments = match root.mutable_data_segments() {
            None => Vec::new(),
            Some(raw) => raw
                .iter()
                .enumerate()
                .map(|(i, m)| read::subsegment(m, segments.len(), || format!("mutable_data_segments[{i}]")))
                .collect::<Result<Vec<_>, _>>()?,
        };
        let named_data = read::named_data(&root, segments.len())?;
        let parts = read::ProgramParts { bytes, segments: &segments, inline: root.backend_delegate_data() };
        let methods = match root.execution_plan() {
            None => Vec::new(),
            Some(plans) => plans
                .iter()
                .enumerate()
                .map(|(i, plan)| read::method(&parts, i, plan))
                .collect::<Result<Vec<_>, _>>()?,
        };
        Ok(Program {
            version: root.version(),
            extended_header: layout.header,
            program_size: layout.program_size,
            segments,
            methods,
            constant_segment,
            mutable_data_segments,
            named_data,
        })
    }

    /// The method called `name`.
    pub fn method(&self, name: &str) -> Option<&Method<'a>> {
        self.methods.iter().find(|m| m.name == name)
    }
}
