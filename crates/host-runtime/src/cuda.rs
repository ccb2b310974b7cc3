//! CUDA memory for caller-owned buffers, through `cuda-rt`: device, managed and pinned host storage
//! ([`DeviceStorage`], [`ManagedStorage`], [`PinnedStorage`], each a `cuda_rt::Allocation` of that kind),
//! zeroed at allocation and freed on drop, and the lending of device or managed memory to one call's argument
//! list ([`push_raw`]).
//!
//! Nothing here runs unless a program declares a non-host buffer: [`Contexts::get`] opens a device's primary
//! context on first use, and a machine without a driver or without the device gets a typed [`Error`]
//! (`NotSupported`), never a panic.
//!
//! [`push_raw`] and `blob_file`'s mapping are the only `unsafe` code of the crate; the CUDA calls themselves
//! are `cuda-rt`'s.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::marker::PhantomData;

use delegate_abi::host::{ArgError, ArgList, Slot};
use delegate_abi::{DTypeCode, MemoryKind, TensorArg, ARG_INOUT, ARG_WRITABLE};

pub use cuda_rt::{Context, Contexts, Error};

/// Device memory (`cuMemAlloc`): the host cannot dereference it.
pub type DeviceStorage = cuda_rt::Allocation<cuda_rt::Device>;

/// Managed (unified) memory (`cuMemAllocManaged`, attached globally): one address valid on host and device.
pub type ManagedStorage = cuda_rt::Allocation<cuda_rt::Managed>;

/// Pinned (page-locked) host memory (`cuMemHostAlloc`, portable to every context).
pub type PinnedStorage = cuda_rt::Allocation<cuda_rt::Pinned>;

/// Device or managed memory borrowed mutably for one delegate call: only [`RawMemory::device`] and
/// [`RawMemory::managed`] make one, from a live allocation, so its address is always an allocation of its
/// size that nothing else touches while the borrow lives.
#[derive(Debug)]
pub struct RawMemory<'a> {
    ptr: *mut c_void,
    len: usize,
    memory: MemoryKind,
    device: i32,
    borrow: PhantomData<&'a mut [u8]>,
}

impl<'a> RawMemory<'a> {
    /// Device memory, lent for `'a`.
    pub fn device(storage: &'a mut DeviceStorage) -> RawMemory<'a> {
        RawMemory::of(storage.as_ptr(), storage.len(), MemoryKind::Device, storage.device())
    }

    /// Managed memory, lent for `'a`.
    pub fn managed(storage: &'a mut ManagedStorage) -> RawMemory<'a> {
        RawMemory::of(storage.as_ptr(), storage.len(), MemoryKind::Managed, storage.device())
    }

    fn of(ptr: *mut c_void, len: usize, memory: MemoryKind, device: i32) -> RawMemory<'a> {
        RawMemory { ptr, len, memory, device, borrow: PhantomData }
    }

    /// The address.
    pub fn as_ptr(&self) -> *mut c_void {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `Device` or `Managed`.
    pub fn memory(&self) -> MemoryKind {
        self.memory
    }

    /// The CUDA device ordinal.
    pub fn device_ordinal(&self) -> i32 {
        self.device
    }
}

/// How a [`RawMemory`] argument is passed, mirroring `ArgList`'s safe pushes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read only (`push_input`: no flags).
    Read,
    /// Caller-owned state read and updated in place (`push_inout`: writable + inout); its slot serves
    /// `push_output_in_place`.
    InOut,
    /// An output slot (`push_output`: writable).
    Write,
}

/// Pushes device or managed memory onto `args` as `dtype × shape`, with the flags the safe pushes set for
/// `access` and the memory's kind and device ordinal. Allocates nothing beyond the list's capacity.
pub fn push_raw<'a>(
    args: &mut ArgList<'a>,
    memory: RawMemory<'a>,
    dtype: DTypeCode,
    shape: &[i64],
    access: Access,
) -> Result<Slot, ArgError> {
    let index = args.len();
    let mut arg = TensorArg::describe(dtype, shape, memory.memory)
        .ok_or(ArgError::RankTooLarge { index, rank: shape.len() })?;
    arg.data = memory.as_ptr();
    arg.nbytes = memory.len as u64;
    arg.device_id = memory.device;
    arg.flags = match access {
        Access::Read => 0,
        Access::InOut => ARG_WRITABLE | ARG_INOUT,
        Access::Write => ARG_WRITABLE,
    };
    // SAFETY: `memory` is a live device or managed allocation of `len` bytes on `device` (only
    // `RawMemory::{device, managed}` make one, from a `cuda_rt::Allocation`, which frees on drop, and the
    // borrow `'a` rules that out while the list lives). It is borrowed mutably for `'a`, the list's lifetime,
    // and consumed here, so nothing else writes it and no other argument of the list gets this address except
    // through `push_output_in_place`, which shares it at the same address and size as the ABI allows. Managed
    // memory is host-visible: valid for host reads and writes of `len` bytes, and cuda-rt synchronises its own
    // memsets and copies before returning, so no device work writes it behind the delegate.
    unsafe { args.push_raw(arg) }
}
