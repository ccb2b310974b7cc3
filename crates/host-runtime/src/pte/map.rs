//! A `.pte` program mapped onto a [`Manifest`], in steps: refuse what the host does not run, collect the
//! buffers every method shares, then map each method ([`super::method`]).

use std::collections::BTreeMap;
use std::path::Path;

use program_manifest::{Manifest, TensorDecl};
use pte_format::model::{Instruction, InstructionRef, Method as PteMethod};

use super::decl::{buffer_key, decl, describe};
use super::method::MethodMap;
use super::{At, Error, Problem, CLONE, COPY};
use crate::plugins::Registry;
use crate::program::HostCopy;

/// A `.pte` program mapped onto a manifest, whose calls' blobs are payloads of the file, with the host
/// copies of each method: what [`crate::program::Program::load_attached`] takes.
pub(super) struct Mapped {
    pub(super) manifest: Manifest,
    /// Each method's host copies, by method name.
    pub(super) copies: BTreeMap<String, Vec<HostCopy>>,
    /// The `max_seq_len` compile spec of the last delegate call that carries one.
    pub(super) max_positions: Option<u64>,
}

/// Maps `pte`, read from `path`, onto a manifest, refusing first every operator, instruction and backend
/// the host (with `registry`'s plugins) does not run.
pub(super) fn map_program(
    path: &Path,
    pte: &pte_format::Program<'_>,
    registry: &Registry,
) -> Result<Mapped, Error> {
    for method in &pte.methods {
        for (at, instruction) in method.instructions() {
            refuse_unsupported(path, method, at, instruction, registry)?;
        }
    }
    let buffers = Buffers::collect(path, pte)?;
    let mut methods = BTreeMap::new();
    let mut copies = BTreeMap::new();
    let mut max_positions = None;
    for method in &pte.methods {
        let mapped = MethodMap::new(path, method, &buffers)?.map()?;
        max_positions = mapped.max_positions.or(max_positions);
        copies.insert(method.name.to_owned(), mapped.copies);
        methods.insert(method.name.to_owned(), mapped.method);
    }
    let manifest = Manifest { path: path.to_owned(), buffers: buffers.into_decls(), methods, generate: None };
    Ok(Mapped { manifest, copies, max_positions })
}

/// Refuses `instruction` unless the host runs it: a `DelegateCall` whose backend a plugin of `registry`
/// serves, an `aten::copy_`, an `aten::clone.out` or a `FreeCall`.
fn refuse_unsupported(
    path: &Path,
    method: &PteMethod<'_>,
    at: InstructionRef,
    instruction: &Instruction<'_>,
    registry: &Registry,
) -> Result<(), Error> {
    let (path, name, at) = (path.to_owned(), method.name.to_owned(), At(at));
    match instruction {
        Instruction::Kernel(k) if k.name == COPY || (k.name == CLONE && k.overload == "out") => Ok(()),
        Instruction::Kernel(k) => Err(Error::Operator {
            path,
            method: name,
            at,
            operator: method.operators[k.operator].to_string(),
        }),
        Instruction::Delegate(call) => {
            let backend = method.delegates[call.delegate].id;
            if registry.served(backend).is_some() {
                return Ok(());
            }
            let available = match registry.backends() {
                b if b.is_empty() => "none".to_owned(),
                b => b.join(", "),
            };
            Err(Error::NoPlugin { path, method: name, at, backend: backend.to_owned(), available })
        }
        Instruction::Free { .. } => Ok(()),
        other => Err(Error::Instruction { path, method: name, at, kind: other.kind() }),
    }
}

/// Every method's mutable buffers, shared by key ([`buffer_key`]), each with the method that declared it
/// first; a buffer's slot is its index in key order, the manifest's order.
pub(super) struct Buffers(BTreeMap<String, (TensorDecl, String)>);

impl Buffers {
    /// The buffers of every method of `pte`; two methods that declare one buffer differently are refused.
    fn collect(path: &Path, pte: &pte_format::Program<'_>) -> Result<Buffers, Error> {
        let mut buffers: BTreeMap<String, (TensorDecl, String)> = BTreeMap::new();
        for method in &pte.methods {
            let fail = |problem| Error::Program {
                path: path.to_owned(),
                method: method.name.to_owned(),
                problem: Box::new(problem),
            };
            for b in method.mutable_buffers() {
                let key = buffer_key(&b);
                let d = decl(method, b.value, &format!("buffer '{key}'"), &key).map_err(fail)?;
                match buffers.get(&key) {
                    Some((other, in_method)) if other != &d => {
                        let (first, second) = (describe(&d), describe(other));
                        let other = in_method.clone();
                        return Err(fail(Problem::BufferMismatch { name: key, first, second, other }));
                    }
                    Some(_) => {}
                    None => {
                        buffers.insert(key, (d, method.name.to_owned()));
                    }
                }
            }
        }
        Ok(Buffers(buffers))
    }

    /// The slot of buffer `key` (collected, so present).
    pub(super) fn index(&self, key: &str) -> usize {
        self.0.keys().position(|k| k == key).expect("a collected buffer")
    }

    /// The declaration of the buffer in slot `index`.
    pub(super) fn decl(&self, index: usize) -> &TensorDecl {
        self.0.values().nth(index).map(|(d, _)| d).expect("a buffer slot")
    }

    fn into_decls(self) -> BTreeMap<String, TensorDecl> {
        self.0.into_iter().map(|(k, (d, _))| (k, d)).collect()
    }
}
