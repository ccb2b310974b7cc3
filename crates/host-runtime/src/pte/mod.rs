//! ExecuTorch programs (`.pte`) loaded onto the program machinery of [`crate::program`]: no second runner.
//!
//! [`load`] maps the file read by `pte_format` onto a [`Manifest`] and loads it with
//! [`Program`]'s own checks, argument plans and modes:
//!
//! - **buffers**: every method's mutable buffers ([`pte_format::buffers`]) become the program's caller-owned
//!   buffers, zero-filled, named by their fully qualified name (`k_cache_0`), or `mem<id>@<offset>` (their
//!   planned place) when the export wrote none. Methods that name the same buffer (or plan an unnamed one at
//!   the same place) share one storage: the two methods of a prefill + decode program share their caches.
//! - **inputs and outputs**: a method's inputs and outputs, in the method's order, named by their fully
//!   qualified name or else by their index (`"0"`, `"1"`, ...). Delegate outputs that no output or buffer
//!   takes get storage as extra outputs named `%v<value>` (internal values: [`is_internal`]).
//! - **delegate calls**: each `DelegateCall` becomes a call whose blob is the delegate's processed payload,
//!   borrowed from the file's bytes (read once by [`crate::blob_file`], never copied per call), and whose
//!   arguments are mapped by value index: a method input, a method output, a buffer, or an internal value.
//! - **write-backs**: `aten::copy_(buffer, new)` where `new` is a delegate output that the blob aliases to
//!   that buffer's input (or that the memory planner placed on the buffer's own storage) is elided: the
//!   output *is* the buffer's mutation slot, so zero-copy mode binds it to the buffer's storage and copy-back
//!   mode gives it upstream's separate slot and write-back ([`Mode`]). Any other `aten::copy_` runs as a
//!   host copy (counted as a write-back).
//! - **trivial operators**: `aten::clone.out(src, memory_format, out)` of a delegate output into a method
//!   output is elided by binding the delegate's output slot to the method output (when nothing else reads
//!   `src`), else run as a host copy; `FreeCall`s are no-ops. Every other operator or instruction refuses the
//!   program before anything is allocated, with one error naming it.
//!
//! The mapping runs in steps, each in its own module: refuse every unsupported operator, instruction and
//! backend, then collect the buffers every method shares (`map`); then, per method, bind its inputs,
//! outputs and buffers and map each delegate call and each host copy in execution order (`method`).
//!
//! ## Generation convention
//!
//! [`load`] with a prompt makes the program a token generator ([`crate::generate`]) when it has methods
//! `prefill` and `decode` (the prompt fed in chunks of prefill's token count, the tokens short of a chunk
//! through decode: [`crate::generate`]), or one method `forward` (then used for both, the prompt fed in chunks
//! of its token count, which must divide it; one token at a time for `T = 1`). Each such method takes the
//! tokens at input 0 (`i64 [T]`) and the position of the first at input 1 (`i64 [1]`), and gives the logits
//! at output 0 (`f32` or `f16` `[T, vocab]`); the next token is the argmax of the last row. `max_positions`
//! is the `max_seq_len` compile spec of a delegate (an ASCII integer) when one carries it.

mod decl;
mod error;
mod generator;
mod map;
mod memory;
mod method;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use program_manifest::{BlobSource, Manifest};

pub use self::error::{At, Error, Problem};
use self::map::Mapped;
use crate::blob_file::BlobFile;
use crate::plugins::Registry;
use crate::program::{Attached, BlobBytes, Mode, Origin, Program};

/// The operator name of a write-back (any overload).
pub const COPY: &str = "aten::copy_";
/// The operator name of a clone; only its `out` overload is run.
pub const CLONE: &str = "aten::clone";

/// Whether `name` is an internal value of a `.pte` method (a delegate output no method output or buffer
/// takes), not one of its outputs.
pub fn is_internal(name: &str) -> bool {
    name.starts_with('%')
}

/// Whether `bytes` look like a `.pte` program (`ET12` at byte 4).
pub fn is_pte(bytes: &[u8]) -> bool {
    pte_format::is_program(bytes)
}

/// Loads the `.pte` program at `path` (read once into host memory, every delegate payload borrowed from it)
/// with the plugins of `registry` in `mode`; with a
/// `prompt`, as a token generator under the generation convention (module docs).
///
/// Every operator, instruction and backend is checked before any memory is allocated or any delegate
/// initialised; then [`Program::load`]'s checks and initialisation run over the mapped program. The buffers
/// (KV caches) are allocated in memory every call's plugin updates in place: host memory for the reference
/// delegate, device memory for the CUDA delegate.
///
/// # Errors
/// [`Error`]: one error naming the file, the method and the instruction where one is at fault.
pub fn load(path: &Path, registry: &Registry, mode: Mode, prompt: Option<&[i64]>) -> Result<Program, Error> {
    let file = Arc::new(BlobFile::open(path).map_err(|source| Error::Io { path: path.to_owned(), source })?);
    let pte = pte_format::Program::parse(file.bytes())
        .map_err(|source| Error::Format { path: path.to_owned(), source })?;
    let Mapped { mut manifest, copies, max_positions } = map::map_program(path, &pte, registry)?;
    let buffers = memory::buffer_memory(&manifest, registry);
    memory::place(&mut manifest, buffers);
    if let Some(prompt) = prompt {
        let generate = generator::generator(&manifest, prompt, max_positions)
            .map_err(|reason| Error::NotGenerator { path: path.to_owned(), reason })?;
        manifest.generate = Some(generate);
    }
    let attached = Attached { blobs: payloads(&manifest, &file), copies, origin: Origin::Pte };
    Ok(Program::load_attached(manifest, registry, mode, attached)?)
}

/// The bytes of each call's payload, borrowed from `file` (the program's), by (method, call index).
fn payloads(manifest: &Manifest, file: &Arc<BlobFile>) -> BTreeMap<(String, usize), BlobBytes> {
    let mut blobs = BTreeMap::new();
    for method in manifest.methods.values() {
        for (index, call) in method.calls.iter().enumerate() {
            if let BlobSource::Payload(payload) = &call.blob {
                // pte-format checked the range to lie inside the file, which is in memory: it fits a usize
                // (else the blob's bytes read as empty, and the blob reader refuses them).
                let at = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
                let range = at(payload.range.start)..at(payload.range.end);
                blobs.insert(
                    (method.name.clone(), index),
                    BlobBytes::Shared { file: Arc::clone(file), range },
                );
            }
        }
    }
    blobs
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_error_stays_small_enough_to_return_everywhere() {
        // clippy's `result_large_err` threshold is 128 bytes.
        assert!(std::mem::size_of::<super::Error>() < 128, "{} bytes", std::mem::size_of::<super::Error>());
    }
}
