//! One method of a `.pte` program mapped onto a manifest method: its inputs, outputs and buffers bound,
//! then each delegate call mapped onto a [`Call`] whose blob is the delegate's payload, and each trivial
//! operator onto a [`HostCopy`] (or elided).

use std::collections::BTreeMap;
use std::path::Path;

use alias_validate::{ArgLayout, ArgSlot};
use blob_format::model::{DType, Role};
use blob_format::Blob;
use program_manifest::{ArgRef, BlobSource, Call, Location, Method, Payload, TensorDecl};
use pte_format::model::{
    Delegate, DelegateCall, Instruction, InstructionRef, KernelCall, Method as PteMethod, MutableBuffer,
};

use super::decl::{buffer_key, decl, io_decls};
use super::map::Buffers;
use super::{At, Error, Problem, CLONE, COPY};
use crate::program::{CopySlot, HostCopy};

/// Where a value lives once mapped.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Bound {
    Input(usize),
    Output(usize),
    Buffer(String),
}

/// A method mapped: the manifest's method, its host copies, and the `max_seq_len` compile spec of its last
/// delegate call that carries one.
pub(super) struct MappedMethod {
    pub(super) method: Method,
    pub(super) copies: Vec<HostCopy>,
    pub(super) max_positions: Option<u64>,
}

/// One method being mapped, instruction by instruction.
pub(super) struct MethodMap<'m, 'a> {
    path: &'m Path,
    method: &'m PteMethod<'a>,
    buffers: &'m Buffers,
    /// The method's own mutable buffers.
    own_buffers: Vec<MutableBuffer<'a>>,
    /// Where each value read or written so far lives.
    bound: BTreeMap<usize, Bound>,
    inputs: Vec<TensorDecl>,
    outputs: Vec<TensorDecl>,
    /// `clone.out(src, _, out)` into method output `out`: `src` is bound to the output directly.
    clone_into: BTreeMap<usize, usize>,
    /// `copy_(buffer, src)` write-backs: the buffer key by source value.
    writes_back: BTreeMap<usize, String>,
    calls: Vec<Call>,
    copies: Vec<HostCopy>,
    max_positions: Option<u64>,
}

impl<'m, 'a> MethodMap<'m, 'a> {
    /// Binds `method`'s inputs, outputs and buffers (`buffers`: every method's) and finds the clones and
    /// write-backs that can be elided.
    pub(super) fn new(
        path: &'m Path,
        method: &'m PteMethod<'a>,
        buffers: &'m Buffers,
    ) -> Result<Self, Error> {
        let fail = |problem| program_error(path, method, problem);
        let mut bound = BTreeMap::new();
        // Inputs and outputs are named apart (input "0" and output "0" are two tensors).
        let inputs = io_decls(method, &method.inputs, "input").map_err(fail)?;
        for (i, &value) in method.inputs.iter().enumerate() {
            bound.insert(value, Bound::Input(i));
        }
        let outputs = io_decls(method, &method.outputs, "output").map_err(fail)?;
        for (i, &value) in method.outputs.iter().enumerate() {
            bound.entry(value).or_insert(Bound::Output(i));
        }
        let own_buffers = method.mutable_buffers();
        for b in &own_buffers {
            bound.insert(b.value, Bound::Buffer(buffer_key(b)));
        }
        let clone_into = clone_targets(method, &bound);
        let writes_back = own_buffers
            .iter()
            .flat_map(|b| b.write_backs.iter().filter_map(|w| Some((w.src?, buffer_key(b)))))
            .collect();
        Ok(MethodMap {
            path,
            method,
            buffers,
            own_buffers,
            bound,
            inputs,
            outputs,
            clone_into,
            writes_back,
            calls: Vec::new(),
            copies: Vec::new(),
            max_positions: None,
        })
    }

    /// Maps each delegate call and each host copy, in execution order.
    pub(super) fn map(mut self) -> Result<MappedMethod, Error> {
        let method = self.method;
        for (at, instruction) in method.instructions() {
            match instruction {
                Instruction::Delegate(call) => self.delegate_call(at, call)?,
                Instruction::Kernel(k) => self.host_copy(at, k)?,
                _ => {}
            }
        }
        let name = self.method.name.to_owned();
        Ok(MappedMethod {
            method: Method { name, inputs: self.inputs, outputs: self.outputs, calls: self.calls },
            copies: self.copies,
            max_positions: self.max_positions,
        })
    }

    /// Maps a `DelegateCall`: its payload checked as a blob, each argument bound by value index.
    fn delegate_call(&mut self, at: InstructionRef, call: &DelegateCall) -> Result<(), Error> {
        let method = self.method;
        let delegate = &method.delegates[call.delegate];
        if let Some(n) = max_seq_len(delegate) {
            self.max_positions = Some(n);
        }
        let layout = self.layout(at, delegate)?;
        if layout.len() != call.args.len() {
            let (passed, threaded) = (call.args.len(), layout.len());
            return Err(self.fail(Problem::ArgCount { at: At(at), passed, threaded }));
        }
        let mut args = Vec::with_capacity(call.args.len());
        for (pos, (slot, &value)) in layout.slots().iter().zip(&call.args).enumerate() {
            let bound = match self.bound.get(&value) {
                Some(b) => b.clone(),
                None if !matches!(slot.role, Role::Output) => {
                    return Err(self.fail(Problem::Unbound { at: At(at), value }))
                }
                None => self.bind_output(at, pos, slot, value, call)?,
            };
            args.push(match &bound {
                Bound::Input(i) => ArgRef::Input(self.inputs[*i].name.clone()),
                Bound::Output(i) => ArgRef::Output(self.outputs[*i].name.clone()),
                Bound::Buffer(k) => ArgRef::Buffer(k.clone()),
            });
            self.bound.insert(value, bound);
        }
        let payload = &delegate.processed;
        let blob = BlobSource::Payload(Box::new(Payload {
            program: self.path.to_owned(),
            call: format!("method '{}' instruction {} ({})", method.name, At(at), delegate.id),
            label: payload.label(),
            range: payload.range(),
        }));
        let n = args.len();
        let (location, arg_locations) = (Location::default(), vec![Location::default(); n]);
        self.calls.push(Call { blob, backend: delegate.id.to_owned(), args, location, arg_locations });
        Ok(())
    }

    /// The argument layout of `delegate`'s payload, read as a blob and checked against the aliasing rules.
    fn layout(&self, at: InstructionRef, delegate: &Delegate<'_>) -> Result<ArgLayout, Error> {
        let (path, method, backend) =
            (self.path.to_owned(), self.method.name.to_owned(), delegate.id.to_owned());
        let blob = Blob::parse(delegate.processed.data).map_err(|source| Error::Blob {
            path: path.clone(),
            method: method.clone(),
            at: At(at),
            backend: backend.clone(),
            source: Box::new(source),
        })?;
        let alias = |source| Error::Alias { path, method, at: At(at), backend, source: Box::new(source) };
        match alias_validate::validate_format(&blob.header) {
            Ok(plan) => ArgLayout::new(&blob.header, &plan).map_err(alias),
            Err(source) => Err(alias(source)),
        }
    }

    /// Where an output nothing bound yet (`value`, at position `pos` of `call`) lives: the buffer its
    /// aliased input is bound to when the program writes it back there (or planned it on the buffer's own
    /// storage), the method output a clone copies it into, else a new internal output `%v<value>`.
    fn bind_output(
        &mut self,
        at: InstructionRef,
        pos: usize,
        slot: &ArgSlot,
        value: usize,
        call: &DelegateCall,
    ) -> Result<Bound, Error> {
        let aliased_buffer = slot.in_place_of().and_then(|input| match self.bound.get(&call.args[input]) {
            Some(Bound::Buffer(k)) => Some(k.clone()),
            _ => None,
        });
        if let Some(k) = aliased_buffer {
            if self.writes_back.get(&value) == Some(&k) || self.planned_on(value, &k) {
                return Ok(Bound::Buffer(k));
            }
        }
        if let Some(&o) = self.clone_into.get(&value) {
            return Ok(Bound::Output(o));
        }
        self.internal_output(value, &format!("argument {pos} of instruction {}", At(at)))
    }

    /// Whether the memory planner placed `value` on the storage of this method's buffer `key`.
    fn planned_on(&self, value: usize, key: &str) -> bool {
        let planned = self.method.tensor(value).and_then(|t| t.allocation);
        self.own_buffers.iter().any(|b| buffer_key(b) == key && Some(b.allocation) == planned)
    }

    /// A new output `%v<value>` of the method for an internal value (`what`, for messages).
    fn internal_output(&mut self, value: usize, what: &str) -> Result<Bound, Error> {
        let d = decl(self.method, value, what, &format!("%v{value}")).map_err(|p| self.fail(p))?;
        self.outputs.push(d);
        Ok(Bound::Output(self.outputs.len() - 1))
    }

    /// Maps an `aten::copy_` or `aten::clone.out` onto a host copy, after the delegate calls before it; a
    /// copy of a value onto itself (one the binding already elided) is no copy.
    fn host_copy(&mut self, at: InstructionRef, k: &KernelCall<'_>) -> Result<(), Error> {
        let operator = self.method.operators[k.operator].to_string();
        let operands =
            |message: String| Problem::Operands { at: At(at), operator: operator.clone(), message };
        let (src, dst) = copy_operands(k).map_err(|m| self.fail(operands(m.into())))?;
        let from = match self.bound.get(&src) {
            Some(b) => b.clone(),
            None => return Err(self.fail(Problem::Unbound { at: At(at), value: src })),
        };
        let to = match self.bound.get(&dst) {
            Some(b) => b.clone(),
            None => {
                let b = self.internal_output(dst, &format!("argument of instruction {}", At(at)))?;
                self.bound.insert(dst, b.clone());
                b
            }
        };
        // The out argument of an `out` overload (and copy_'s fourth) is the same value.
        if from == to {
            return Ok(());
        }
        let (from, to) = (self.slot(&from), self.slot(&to));
        let (a, b) = (self.type_of(from), self.type_of(to));
        if a != b {
            let message = format!(
                "copies {} {:?} into {} {:?}; the host copies equal types and shapes only",
                a.0, a.1, b.0, b.1
            );
            return Err(self.fail(operands(message)));
        }
        self.copies.push(HostCopy { after: self.calls.len().checked_sub(1), from, to });
        Ok(())
    }

    fn slot(&self, bound: &Bound) -> CopySlot {
        match bound {
            Bound::Input(i) => CopySlot::Input(*i),
            Bound::Output(i) => CopySlot::Output(*i),
            Bound::Buffer(k) => CopySlot::Buffer(self.buffers.index(k)),
        }
    }

    /// The element type and shape of what `slot` holds.
    fn type_of(&self, slot: CopySlot) -> (DType, Vec<u64>) {
        let d = match slot {
            CopySlot::Input(i) => &self.inputs[i],
            CopySlot::Output(i) => &self.outputs[i],
            CopySlot::Buffer(i) => self.buffers.decl(i),
        };
        (d.dtype, d.shape.clone())
    }

    fn fail(&self, problem: Problem) -> Error {
        program_error(self.path, self.method, problem)
    }
}

fn program_error(path: &Path, method: &PteMethod<'_>, problem: Problem) -> Error {
    Error::Program { path: path.to_owned(), method: method.name.to_owned(), problem: Box::new(problem) }
}

/// The `max_seq_len` compile spec of `delegate` (an ASCII integer), the last when it carries several.
fn max_seq_len(delegate: &Delegate<'_>) -> Option<u64> {
    let mut specs = delegate.compile_specs.iter().rev().filter(|spec| spec.key == "max_seq_len");
    specs.find_map(|spec| std::str::from_utf8(spec.value).ok()?.trim().parse().ok())
}

/// The (source, destination) of `copy_(self, src, ...)` or `clone.out(self, memory_format, out)`.
fn copy_operands(k: &KernelCall<'_>) -> Result<(usize, usize), &'static str> {
    if k.name == COPY {
        match (k.args.first(), k.args.get(1)) {
            (Some(&dst), Some(&src)) => Ok((src, dst)),
            _ => Err("expects (self, src, ...)"),
        }
    } else {
        match (k.args.first(), k.args.last()) {
            (Some(&src), Some(&out)) if k.args.len() == 3 => Ok((src, out)),
            _ => Err("expects (self, memory_format, out)"),
        }
    }
}

/// `clone.out(src, _, out)` into a method output whose `src` nothing else reads and nothing binds yet:
/// `src` may be bound to the output directly. Output index by source value.
fn clone_targets(method: &PteMethod<'_>, bound: &BTreeMap<usize, Bound>) -> BTreeMap<usize, usize> {
    // How many instructions read each value: 2 for a value one delegate call writes and only the clone reads.
    let mut reads: BTreeMap<usize, usize> = BTreeMap::new();
    for (_, instruction) in method.instructions() {
        let args: &[usize] = match instruction {
            Instruction::Kernel(k) => &k.args,
            Instruction::Delegate(c) => &c.args,
            _ => &[],
        };
        for &a in args {
            *reads.entry(a).or_default() += 1;
        }
    }
    let mut clone_into = BTreeMap::new();
    for (_, k) in method.kernel_calls().filter(|(_, k)| k.name == CLONE) {
        if let (Some(&src), Some(&out)) = (k.args.first(), k.args.last()) {
            if let Some(Bound::Output(o)) = bound.get(&out) {
                if !bound.contains_key(&src) && reads.get(&src) == Some(&2) {
                    clone_into.insert(src, *o);
                }
            }
        }
    }
    clone_into
}
