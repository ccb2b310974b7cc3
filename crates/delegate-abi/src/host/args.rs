//! [`ArgList`]: the arguments of one call, built safely from the caller's borrows.

use std::fmt;
use std::marker::PhantomData;

use crate::delegate::ErrorCode;
use crate::tensor::{DTypeCode, MemoryKind, TensorArg, UnknownCode, ARG_INOUT, ARG_WRITABLE, MAX_RANK};

/// Why an [`ArgList`] refused an argument.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ArgError {
    /// More dimensions than a [`TensorArg`] carries.
    #[error("argument {index}: rank {rank} exceeds the maximum {max}", max = MAX_RANK)]
    RankTooLarge {
        /// Position the argument would take.
        index: usize,
        /// Its rank.
        rank: usize,
    },
    /// A negative extent, or a product that overflows.
    #[error("argument {index}: shape {shape:?} has a negative extent or overflows")]
    BadShape {
        /// Position the argument would take.
        index: usize,
        /// The shape.
        shape: Vec<i64>,
    },
    /// Buffer size differs from `dtype size × number of elements`.
    #[error("argument {index}: {dtype}{shape:?} needs {expected} bytes, the buffer has {found}")]
    SizeMismatch {
        /// Position the argument would take.
        index: usize,
        /// Element type.
        dtype: DTypeCode,
        /// Shape.
        shape: Vec<i64>,
        /// `dtype size × numel`.
        expected: u64,
        /// Buffer length.
        found: u64,
    },
    /// A Rust slice is host memory; device memory goes through [`ArgList::push_raw`].
    #[error(
        "argument {index}: a borrowed slice cannot be {memory} memory; use push_raw for device pointers"
    )]
    NotHostVisible {
        /// Position the argument would take.
        index: usize,
        /// The kind asked for.
        memory: MemoryKind,
    },
    /// A raw argument carries a dtype or memory-kind byte this build does not know (an FFI caller's bug).
    #[error("argument {index}: {code}")]
    UnknownCode {
        /// Position the argument would take.
        index: usize,
        /// The byte, and which code it is.
        code: UnknownCode,
    },
    /// The slot is from another list, from before [`ArgList::clear`], or not an inout argument.
    #[error("argument {index}: slot {slot} is not an inout argument of this list ({why})")]
    BadSlot {
        /// Position the argument would take.
        index: usize,
        /// The slot's position.
        slot: usize,
        /// Which check failed.
        why: &'static str,
    },
}

impl et_error::HasErrorCode for ArgError {
    fn error_code(&self) -> ErrorCode {
        ErrorCode::InvalidArgument
    }
}

/// A handle to an argument of an [`ArgList`], used to alias an output onto an inout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    list: u64,
    generation: u64,
    index: usize,
}

impl Slot {
    /// Position of the argument in the call.
    pub fn index(self) -> usize {
        self.index
    }
}

/// The arguments of one `execute`, tied to the borrows of the caller memory they describe.
///
/// Built safely: inputs borrow `&'a [u8]`, outputs and inouts `&'a mut [u8]`, so nothing else can touch a
/// written buffer while the list lives. [`ArgList::push_output_in_place`] makes an output share an inout's
/// storage (zero-copy aliasing), the one sharing the ABI allows. [`ArgList::clear`] keeps capacity and
/// [`ArgList::recycle`] also releases the borrows, so a decode loop reuses one list without allocating.
pub struct ArgList<'a> {
    args: Vec<TensorArg>,
    id: u64,
    generation: u64,
    _borrows: PhantomData<&'a mut [u8]>,
}

impl fmt::Debug for ArgList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.args.iter()).finish()
    }
}

impl Default for ArgList<'_> {
    fn default() -> Self {
        ArgList::new()
    }
}

impl<'a> ArgList<'a> {
    /// An empty list.
    pub fn new() -> ArgList<'a> {
        ArgList::with_capacity(0)
    }

    /// An empty list with room for `capacity` arguments.
    pub fn with_capacity(capacity: usize) -> ArgList<'a> {
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        ArgList {
            args: Vec::with_capacity(capacity),
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            generation: 0,
            _borrows: PhantomData,
        }
    }

    /// Number of arguments.
    pub fn len(&self) -> usize {
        self.args.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.args.is_empty()
    }

    /// The arguments as they cross.
    pub fn as_slice(&self) -> &[TensorArg] {
        &self.args
    }

    /// Removes every argument, keeping capacity. Slots handed out before are refused afterwards.
    pub fn clear(&mut self) {
        self.args.clear();
        self.generation += 1;
    }

    /// Empties the list and releases its borrows, keeping its capacity, so the next step can borrow the
    /// same buffers again (a list's lifetime is fixed, so [`ArgList::clear`] alone cannot do that):
    ///
    /// ```
    /// # use delegate_abi::{host::ArgList, DTypeCode, MemoryKind};
    /// let mut cache = vec![0u8; 16];
    /// let mut spare: ArgList<'static> = ArgList::with_capacity(8);
    /// for _step in 0..3 {
    ///     let mut args = spare.recycle();
    ///     args.push_inout(&mut cache, DTypeCode::F32, &[4], MemoryKind::Host)?;
    ///     // instance.execute(&mut args, None)?;
    ///     spare = args.recycle();
    /// }
    /// # Ok::<(), delegate_abi::host::ArgError>(())
    /// ```
    pub fn recycle<'b>(mut self) -> ArgList<'b> {
        self.clear();
        ArgList {
            args: std::mem::take(&mut self.args),
            id: self.id,
            generation: self.generation,
            _borrows: PhantomData,
        }
    }

    fn slot(&self, index: usize) -> Slot {
        Slot { list: self.id, generation: self.generation, index }
    }

    fn describe(
        &self,
        dtype: DTypeCode,
        shape: &[i64],
        memory: MemoryKind,
        data: *mut std::ffi::c_void,
        nbytes: usize,
    ) -> Result<TensorArg, ArgError> {
        let index = self.args.len();
        let mut arg = TensorArg::describe(dtype, shape, memory)
            .ok_or(ArgError::RankTooLarge { index, rank: shape.len() })?;
        let numel = arg.numel().ok_or_else(|| ArgError::BadShape { index, shape: shape.to_vec() })?;
        let expected = numel
            .checked_mul(dtype.size_bytes() as u64)
            .ok_or_else(|| ArgError::BadShape { index, shape: shape.to_vec() })?;
        if expected != nbytes as u64 {
            return Err(ArgError::SizeMismatch {
                index,
                dtype,
                shape: shape.to_vec(),
                expected,
                found: nbytes as u64,
            });
        }
        arg.data = data;
        arg.nbytes = nbytes as u64;
        Ok(arg)
    }

    fn host_memory(&self, memory: MemoryKind) -> Result<(), ArgError> {
        if memory.is_host_visible() {
            Ok(())
        } else {
            Err(ArgError::NotHostVisible { index: self.args.len(), memory })
        }
    }

    fn push(&mut self, arg: TensorArg) -> Slot {
        let index = self.args.len();
        self.args.push(arg);
        self.slot(index)
    }

    /// A read-only input.
    pub fn push_input(
        &mut self,
        data: &'a [u8],
        dtype: DTypeCode,
        shape: &[i64],
        memory: MemoryKind,
    ) -> Result<(), ArgError> {
        self.host_memory(memory)?;
        let arg = self.describe(dtype, shape, memory, data.as_ptr().cast_mut().cast(), data.len())?;
        self.push(arg);
        Ok(())
    }

    /// A writable input: caller-owned state (a KV cache) that the delegate reads and updates in place.
    pub fn push_inout(
        &mut self,
        data: &'a mut [u8],
        dtype: DTypeCode,
        shape: &[i64],
        memory: MemoryKind,
    ) -> Result<Slot, ArgError> {
        self.host_memory(memory)?;
        let mut arg = self.describe(dtype, shape, memory, data.as_mut_ptr().cast(), data.len())?;
        arg.flags |= ARG_WRITABLE | ARG_INOUT;
        Ok(self.push(arg))
    }

    /// An output the delegate writes.
    pub fn push_output(
        &mut self,
        data: &'a mut [u8],
        dtype: DTypeCode,
        shape: &[i64],
        memory: MemoryKind,
    ) -> Result<(), ArgError> {
        self.host_memory(memory)?;
        let mut arg = self.describe(dtype, shape, memory, data.as_mut_ptr().cast(), data.len())?;
        arg.flags |= ARG_WRITABLE;
        self.push(arg);
        Ok(())
    }

    /// An output that is the same storage as the inout at `slot` (zero-copy aliasing): same address and
    /// size; `dtype × shape` must cover exactly that size.
    pub fn push_output_in_place(
        &mut self,
        slot: Slot,
        dtype: DTypeCode,
        shape: &[i64],
    ) -> Result<(), ArgError> {
        let index = self.args.len();
        let bad = |why| ArgError::BadSlot { index, slot: slot.index, why };
        if slot.list != self.id {
            return Err(bad("it belongs to another list"));
        }
        if slot.generation != self.generation {
            return Err(bad("the list was cleared since"));
        }
        let target = *self.args.get(slot.index).ok_or_else(|| bad("out of range"))?;
        if target.flags & ARG_INOUT == 0 {
            return Err(bad("it was not pushed with push_inout"));
        }
        let mut arg = self.describe(dtype, shape, target.memory(), target.data, target.nbytes as usize)?;
        arg.device_id = target.device_id;
        arg.flags |= ARG_WRITABLE;
        self.push(arg);
        Ok(())
    }

    /// Pushes a raw argument as is, after the same rank and size checks (device memory, FFI callers), and a
    /// check of its dtype and memory-kind codes (an arg read from foreign memory may carry any byte). The
    /// slot serves [`ArgList::push_output_in_place`] when the arg is flagged [`ARG_INOUT`].
    ///
    /// # Safety
    /// Whenever the list is passed to [`Instance::execute`](crate::host::Instance::execute), for that call:
    /// host-visible memory at `arg.data` must be valid for reads of `arg.nbytes` bytes, and for writes when
    /// [`ARG_WRITABLE`] is set, with nothing else accessing it (a written arg) or writing it (a read one); a
    /// writable arg may share storage with another arg of the list only at the same address and size; device
    /// memory must be a live allocation of `arg.nbytes` bytes on `arg.device_id`. Between calls the memory may
    /// be used freely: a host may build a list once and pass it to every call (host-runtime does), as long as
    /// the memory outlives the list's last call.
    pub unsafe fn push_raw(&mut self, arg: TensorArg) -> Result<Slot, ArgError> {
        let index = self.args.len();
        let code = |code| ArgError::UnknownCode { index, code };
        let dtype = DTypeCode::try_from(arg.dtype).map_err(code)?;
        let memory = MemoryKind::try_from(arg.memory).map_err(code)?;
        let nbytes = usize::try_from(arg.nbytes).unwrap_or(usize::MAX);
        let mut checked = self.describe(dtype, arg.dims(), memory, arg.data, nbytes)?;
        checked.device_id = arg.device_id;
        checked.flags = arg.flags & (ARG_WRITABLE | ARG_INOUT);
        if checked.flags & ARG_INOUT != 0 {
            checked.flags |= ARG_WRITABLE;
        }
        Ok(self.push(checked))
    }
}
