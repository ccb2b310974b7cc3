//! [`Module`]: a safe ExecuTorch `Module` over one program's bytes, and the inputs and outputs of its calls.

use std::ffi::CString;
use std::path::Path;

use delegate_abi::DTypeCode;
use et_error::ErrorCode;

use super::check::parse;
use crate::backend::{self, scalar_type_of};
use crate::ffi::{KvdTensor, LoadFailure, RawModule, KVD_MAX_RANK};
use crate::planned::{ActiveStream, ManagedPlan, PlannedMemory, SpanError};
use crate::program_file::ProgramFile;
use crate::{BridgeError, InputProblem};

/// A method input: caller memory, read (copied into the method's planned input) during the call only.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// The bytes.
    pub data: &'a [u8],
    /// Element type.
    pub dtype: DTypeCode,
    /// Shape.
    pub shape: &'a [i64],
}

/// An output as [`Module::execute`] returns it: the bytes were copied into the caller's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputMeta {
    /// Bytes written.
    pub nbytes: usize,
    /// ExecuTorch's scalar type code.
    pub scalar_type: i32,
    /// Shape.
    pub shape: Vec<i64>,
}

/// An ExecuTorch `Module` over one `.pte`, arenas shared across its methods (`share_memory_arenas = true`),
/// loaded from the program's bytes read once ([`ProgramFile`]; ExecuTorch never opens the file, and delegate
/// payloads are lent from those bytes, uncopied); its planned memory in host memory (the Module's own buffers)
/// or in CUDA managed memory ([`Module::open_with`], [`crate::planned`]). Every Module checks, before
/// ExecuTorch loads the program, that each argument a delegate writes is planned memory ([`crate::written`]).
pub struct Module {
    raw: RawModule,
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module").field("path", &self.path()).finish()
    }
}

fn runtime(what: String, code: ErrorCode) -> BridgeError {
    BridgeError::Runtime { what, code, detail: backend::take_last_error() }
}

impl Module {
    /// Reads ([`ProgramFile::read`]) and loads the program (not its methods).
    ///
    /// # Errors
    /// As [`Module::from_program`], and [`BridgeError::Io`] when the file cannot be read.
    pub fn open(path: &Path) -> Result<Module, BridgeError> {
        Module::open_with(path, PlannedMemory::Host, &[])
    }

    /// Reads ([`ProgramFile::read`]) and loads the program with its planned memory in `memory`, as
    /// [`Module::from_program`].
    ///
    /// # Errors
    /// As [`Module::from_program`], and [`BridgeError::Io`] when the file cannot be read.
    pub fn open_with(path: &Path, memory: PlannedMemory, methods: &[String]) -> Result<Module, BridgeError> {
        Module::from_program(ProgramFile::read(path)?, memory, methods)
    }

    /// Loads the program in `program` (those bytes: ExecuTorch opens no file) with its planned memory in
    /// `memory`. For [`PlannedMemory::Managed`], `methods` are the methods whose planned buffers mem_id 1 and 2
    /// are shared (sized to the largest of them, as ExecuTorch's `share_memory_arenas` sizes its own): every
    /// method that will be loaded; [`Module::load_method`] refuses any other.
    ///
    /// # Errors
    /// [`BridgeError::Program`] or [`BridgeError::UnplannedWrite`] for a program that `pte-format` cannot read
    /// or whose DelegateCall writes a tensor that is not planned memory (checked before ExecuTorch loads it);
    /// [`BridgeError::Runtime`] with ExecuTorch's code when it cannot load the program;
    /// [`BridgeError::ManagedMemory`] when managed memory cannot be had (no CUDA driver or GPU, or the
    /// allocation failed).
    pub fn from_program(
        program: ProgramFile,
        memory: PlannedMemory,
        methods: &[String],
    ) -> Result<Module, BridgeError> {
        let mut module = Module::load_host(program)?;
        if memory == PlannedMemory::Managed {
            let sizes = module.planned_sizes(methods)?;
            let plan = ManagedPlan::new(&sizes).map_err(|source| BridgeError::ManagedMemory { source })?;
            module.raw.use_managed(plan);
        }
        Ok(module)
    }

    /// Opens the program with its planned memory supplied as for managed memory, but in host memory: the
    /// allocator route of [`Module::open_with`], tested without a GPU.
    #[cfg(test)]
    pub(crate) fn open_host_supplied(path: &Path, methods: &[String]) -> Result<Module, BridgeError> {
        let mut module = Module::load_host(ProgramFile::read(path)?)?;
        let sizes = module.planned_sizes(methods)?;
        module.raw.use_managed(ManagedPlan::in_host_memory(&sizes));
        Ok(module)
    }

    /// Per method, its name and the sizes of its planned buffers (mem_id 1 first).
    fn planned_sizes(&mut self, methods: &[String]) -> Result<Vec<(String, Vec<u64>)>, BridgeError> {
        let mut sizes = Vec::with_capacity(methods.len());
        for method in methods {
            let name = cname(method)?;
            let planned = self.raw.planned_sizes(&name);
            let planned = planned.map_err(|code| {
                runtime(format!("{}: reading method '{method}''s planned buffers", self.path()), code)
            })?;
            sizes.push((method.clone(), planned));
        }
        Ok(sizes)
    }

    /// The path the program was read from, as messages show it.
    pub fn path(&self) -> &str {
        self.raw.program().path()
    }

    /// Where this Module's planned memory lives.
    pub fn planned_memory(&self) -> PlannedMemory {
        if self.raw.managed().is_some() {
            PlannedMemory::Managed
        } else {
            PlannedMemory::Host
        }
    }

    /// Checks what the program's delegates write ([`crate::written`]), then has ExecuTorch load it from
    /// `program`'s bytes, its planned memory the Module's own.
    fn load_host(program: ProgramFile) -> Result<Module, BridgeError> {
        let path = program.path().to_owned();
        if let Some(refusal) = crate::written::unplanned_write(&parse(Path::new(&path), program.bytes())?) {
            return Err(refusal);
        }
        let mut raw = RawModule::new(program, true)
            .map_err(|code| runtime(format!("{path}: creating the Module"), code))?;
        raw.load().map_err(|code| runtime(format!("{path}: ExecuTorch cannot load the program"), code))?;
        let (wrapped, write_backs) = crate::counted_copy_kernels();
        tracing::debug!(target: "executorch_bridge", wrapped, write_backs, path = %path, "copy kernels counted");
        Ok(Module { raw })
    }

    /// Loads `method`: ExecuTorch plans its memory and runs every delegate's `init`.
    ///
    /// # Errors
    /// [`BridgeError::Runtime`] with ExecuTorch's code (a plugin's `init` error keeps its code);
    /// [`BridgeError::MethodNotPlanned`] for a method a managed Module's planned memory was not sized for
    /// ([`Module::from_program`]'s `methods`), refused before ExecuTorch sees it.
    pub fn load_method(&mut self, method: &str) -> Result<(), BridgeError> {
        let name = cname(method)?;
        backend::take_last_error();
        let loaded = if self.raw.managed().is_none() {
            self.raw.load_method(&name).map_err(LoadFailure::Code)
        } else {
            self.raw.load_method_managed(&name)
        };
        loaded.map_err(|failure| match failure {
            LoadFailure::Plan(SpanError::NotPlannedFor { method, planned_for }) => {
                BridgeError::MethodNotPlanned { method, planned_for }
            }
            LoadFailure::Plan(SpanError::Memory(source)) => BridgeError::ManagedMemory { source },
            LoadFailure::Code(code) => runtime(format!("{}: loading method '{method}'", self.path()), code),
        })
    }

    /// Runs `method` on `inputs`; copies its outputs into `outputs` (one buffer per output, each large
    /// enough) and describes them. Returns the method's output count.
    ///
    /// # Errors
    /// [`BridgeError::Input`] for an input whose slice is not exactly its shape x dtype bytes, or whose shape
    /// ExecuTorch cannot carry (nothing runs); [`BridgeError::Runtime`] with ExecuTorch's code (a plugin's
    /// `execute` error keeps its code).
    pub fn execute(
        &mut self,
        method: &str,
        inputs: &[Input<'_>],
        outputs: &mut [&mut [u8]],
    ) -> Result<Vec<OutputMeta>, BridgeError> {
        let name = cname(method)?;
        let raw_inputs = inputs
            .iter()
            .enumerate()
            .map(|(index, input)| raw_input(index, input))
            .collect::<Result<Vec<_>, _>>()?;
        let mut raw_outputs: Vec<KvdTensor> = outputs
            .iter_mut()
            .map(|buf| KvdTensor {
                data: buf.as_mut_ptr().cast(),
                capacity: buf.len() as u64,
                nbytes: 0,
                shape: [0; KVD_MAX_RANK],
                rank: 0,
                scalar_type: 0,
            })
            .collect();
        backend::take_last_error();
        // A managed Module's delegates run on its stream (see `crate::planned`).
        let _stream = self.raw.managed().and_then(ManagedPlan::stream).cloned().map(ActiveStream::enter);
        let count = self
            .raw
            .execute(&name, &raw_inputs, &mut raw_outputs)
            .map_err(|code| runtime(format!("{}: executing method '{method}'", self.path()), code))?;
        Ok(raw_outputs
            .iter()
            .take(count)
            .map(|o| OutputMeta {
                nbytes: o.nbytes as usize,
                scalar_type: o.scalar_type,
                shape: o.shape[..(o.rank as usize).min(KVD_MAX_RANK)].to_vec(),
            })
            .collect())
    }
}

/// The largest dimension ExecuTorch's tensors carry (`SizesType` is `int32_t`).
const MAX_SIZE: i64 = i32::MAX as i64;

/// Checks method input `index` and describes it for the shim: at most [`KVD_MAX_RANK`] dimensions, each one
/// fitting ExecuTorch's 32-bit sizes, and a slice of exactly shape x dtype bytes (the shim builds the tensor
/// from the shape and reads that many bytes).
fn raw_input(index: usize, input: &Input<'_>) -> Result<KvdTensor, BridgeError> {
    let refuse =
        |problem| BridgeError::Input { index, dtype: input.dtype, shape: input.shape.to_vec(), problem };
    let rank = input.shape.len();
    if rank > KVD_MAX_RANK {
        return Err(refuse(InputProblem::Rank { rank, max: KVD_MAX_RANK }));
    }
    let mut expected = Some(input.dtype.size_bytes() as u64);
    for (dim, &size) in input.shape.iter().enumerate() {
        if !(0..=MAX_SIZE).contains(&size) {
            return Err(refuse(InputProblem::Size { dim, size, max: MAX_SIZE }));
        }
        expected = expected.and_then(|bytes| bytes.checked_mul(size as u64));
    }
    let actual = input.data.len() as u64;
    if expected != Some(actual) {
        return Err(refuse(InputProblem::Length { expected, actual }));
    }
    let mut shape = [0i64; KVD_MAX_RANK];
    shape[..rank].copy_from_slice(input.shape);
    Ok(KvdTensor {
        data: input.data.as_ptr().cast_mut().cast(),
        capacity: actual,
        nbytes: actual,
        shape,
        rank: rank as u32,
        scalar_type: scalar_type_of(input.dtype),
    })
}

fn cname(method: &str) -> Result<CString, BridgeError> {
    CString::new(method)
        .map_err(|_| BridgeError::Protocol(format!("method name {method:?} contains a NUL byte")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(data: &[u8], dtype: DTypeCode, shape: &[i64]) -> Option<InputProblem> {
        match raw_input(2, &Input { data, dtype, shape }) {
            Ok(_) => None,
            Err(BridgeError::Input { index, dtype: d, shape: s, problem }) => {
                assert_eq!((index, d, s.as_slice()), (2, dtype, shape), "the error names the input");
                Some(problem)
            }
            Err(other) => panic!("expected an input error, got {other}"),
        }
    }

    #[test]
    fn an_input_must_be_exactly_its_shape_times_its_dtype_and_fit_executorchs_sizes() {
        // An 8-byte slice declared [4] i64 (32 bytes): the shim would read 24 bytes past it.
        assert_eq!(
            problem(&[0; 8], DTypeCode::I64, &[4]),
            Some(InputProblem::Length { expected: Some(32), actual: 8 })
        );
        let err =
            raw_input(0, &Input { data: &[0; 8], dtype: DTypeCode::I64, shape: &[4] }).expect_err("short");
        assert_eq!(
            err.to_string(),
            "input 0 (i64 [4]): its shape x dtype is 32 bytes, but the slice holds 8"
        );
        assert_eq!(et_error::HasErrorCode::error_code(&err), ErrorCode::InvalidArgument);
        // Too long is refused too: the tensor would not say what the caller handed over.
        assert_eq!(
            problem(&[0; 12], DTypeCode::F32, &[2]),
            Some(InputProblem::Length { expected: Some(8), actual: 12 })
        );
        // Sizes are narrowed to ExecuTorch's int32 with a check, never truncated (2^32 + 1 would become 1).
        assert_eq!(
            problem(&[0; 8], DTypeCode::I64, &[(1 << 32) + 1]),
            Some(InputProblem::Size { dim: 0, size: (1 << 32) + 1, max: i64::from(i32::MAX) })
        );
        assert_eq!(
            problem(&[], DTypeCode::I64, &[1, -1]),
            Some(InputProblem::Size { dim: 1, size: -1, max: i64::from(i32::MAX) })
        );
        // A product past 64 bits is a length problem, not an overflow.
        let huge = [i64::from(i32::MAX); 3];
        assert_eq!(
            problem(&[], DTypeCode::I64, &huge),
            Some(InputProblem::Length { expected: None, actual: 0 })
        );
        assert_eq!(
            problem(&[], DTypeCode::F32, &[0; 17]),
            Some(InputProblem::Rank { rank: 17, max: KVD_MAX_RANK })
        );
        // What fits is described as it is.
        let raw =
            raw_input(1, &Input { data: &[0; 24], dtype: DTypeCode::F32, shape: &[2, 3] }).expect("fits");
        assert_eq!((raw.nbytes, raw.rank, &raw.shape[..2]), (24, 2, &[2i64, 3][..]));
        assert_eq!(problem(&[0; 8], DTypeCode::I64, &[]), None, "a scalar is one element");
    }
}
