//! CUDA memory for caller-owned buffers, through `cuda-rt`: device, managed and pinned host storage
//! ([`DeviceStorage`], [`ManagedStorage`], [`PinnedStorage`], each a `cuda_rt::Allocation` of that kind),
//! zeroed at allocation and freed on drop, and the lending of device or managed memory to one call's argument
//! list ([`push_raw`]).
//!
//! Nothing here runs unless a program declares a non-host buffer: [`Contexts::get`] opens a device's primary
//! context on first use, and a machine without a driver or without the device gets a typed [`Error`]
//! (`NotSupported`), never a panic.
//!
//! It also holds what the program's stream needs: the stream as the ABI carries it (`abi_stream`),
//! device-to-device copies queued on it (`copy_async`), the generation loop's feedback kernel
//! ([`FeedbackKernel`]), its sampler kernel (`sample`) and token mailbox (`mailbox`), and graph replays
//! (`replay`). Their soundness rests on the program's stream
//! invariant (`crate::program`'s docs): the [`crate::program::Program`] owns every storage it queues work on,
//! frees none before that work completes (a CUDA allocation synchronises its context before it is freed; the
//! program synchronises its stream when dropped), and touches none from the host before synchronising.
//!
//! This module, `buffer`'s host allocations and `lend`'s argument lists are the only `unsafe` code of the
//! crate; the CUDA calls themselves are `cuda-rt`'s.
#![allow(unsafe_code)]

use std::ffi::c_void;
use std::marker::PhantomData;

use delegate_abi::host::{ArgError, ArgList, Slot};
use delegate_abi::{DTypeCode, MemoryKind, TensorArg, ARG_INOUT, ARG_WRITABLE};

pub use cuda_rt::{Context, Contexts, DevicePtr, Error, Event, Graph, Stream, StreamRef};

use cuda_rt::memory::DeviceAddressable;
use cuda_rt::{Allocation, Function, LaunchConfig};
use delegate_abi::CudaStream;

mod mailbox;
mod sample;

pub(crate) use mailbox::Mailbox;
pub(crate) use sample::{LogitsType, SampleArgs, SampleKernel};

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

/// Device or managed memory borrowed for reading by one delegate call: only [`RawInput::device`] and
/// [`RawInput::managed`] make one, from a live allocation that the shared borrow keeps from being written or
/// freed while it lives.
#[derive(Debug)]
pub struct RawInput<'a> {
    ptr: *mut c_void,
    len: usize,
    memory: MemoryKind,
    device: i32,
    borrow: PhantomData<&'a [u8]>,
}

impl<'a> RawInput<'a> {
    /// Device memory, lent for reading for `'a`.
    pub fn device(storage: &'a DeviceStorage) -> RawInput<'a> {
        RawInput::of(storage.as_ptr(), storage.len(), MemoryKind::Device, storage.device())
    }

    /// Managed memory, lent for reading for `'a`.
    pub fn managed(storage: &'a ManagedStorage) -> RawInput<'a> {
        RawInput::of(storage.as_ptr(), storage.len(), MemoryKind::Managed, storage.device())
    }

    fn of(ptr: *mut c_void, len: usize, memory: MemoryKind, device: i32) -> RawInput<'a> {
        RawInput { ptr, len, memory, device, borrow: PhantomData }
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Pushes device or managed memory onto `args` as a read-only input (`push_input`'s flags: none).
pub fn push_raw_input<'a>(
    args: &mut ArgList<'a>,
    memory: RawInput<'a>,
    dtype: DTypeCode,
    shape: &[i64],
) -> Result<(), ArgError> {
    let index = args.len();
    let mut arg = TensorArg::describe(dtype, shape, memory.memory)
        .ok_or(ArgError::RankTooLarge { index, rank: shape.len() })?;
    arg.data = memory.ptr;
    arg.nbytes = memory.len as u64;
    arg.device_id = memory.device;
    arg.flags = 0;
    // SAFETY: `memory` is a live device or managed allocation of `len` bytes on `device` (only
    // `RawInput::{device, managed}` make one, from a `cuda_rt::Allocation`, freed on drop, which the shared
    // borrow `'a` rules out while the list lives). The argument is not writable, and the shared borrow keeps
    // every writer (they need `&mut`) away for `'a`; other read-only arguments may share the address, as shared
    // slices may.
    unsafe { args.push_raw(arg) }.map(drop)
}

/// The program's stream as the plugin ABI carries it to a delegate.
///
/// Only `Program` calls this, for the stream it owns; it takes on [`CudaStream::from_raw`]'s contract through
/// its stream invariant (see the module docs): the stream outlives every call given it (the program
/// synchronises it before dropping it), and no argument memory is touched by the host or freed before the
/// work queued on it completes.
pub(crate) fn abi_stream(stream: &Stream) -> CudaStream {
    // SAFETY: a stream made by `Stream::new` in the primary context of the device every CUDA storage of the
    // program lives on (the program refuses a second device at load); valid until the program drops it, after
    // synchronising; the completion rule is the program's stream invariant, cited above.
    unsafe { CudaStream::from_raw(stream.as_ref().as_raw()) }
        .expect("cuStreamCreate never returns the null stream")
}

/// Queues a device-to-device copy of `src` over `dst` (same kind and size) on the program's `stream`; returns
/// the bytes copied.
pub(crate) fn copy_async<K: DeviceAddressable>(
    dst: &mut Allocation<K>,
    src: &Allocation<K>,
    stream: &Stream,
) -> Result<u64, Error> {
    if dst.len() != src.len() {
        return Err(Error::SizeMismatch {
            call: "cuMemcpyDtoDAsync",
            dst: dst.len() as u64,
            src: src.len() as u64,
        });
    }
    // SAFETY: both are live allocations of `len` bytes, distinct (one borrowed mutably, one shared), so not
    // overlapping; under the program's stream invariant (module docs) neither is freed before the stream has
    // executed the copy (a CUDA allocation synchronises its context before it is freed) and the host touches
    // neither before synchronising the stream.
    unsafe {
        dst.context().copy_dtod_async(dst.device_ptr(), src.device_ptr(), dst.len() as u64, stream.as_ref())
    }?;
    Ok(dst.len() as u64)
}

/// Queues a device-to-device copy of each byte range of `src` over the same range of `dst` (same kind) on
/// the program's `stream`: a cache's prefix rows, one range per head. Returns the bytes copied.
pub(crate) fn copy_ranges_async<K: DeviceAddressable>(
    dst: &mut Allocation<K>,
    src: &Allocation<K>,
    ranges: &[std::ops::Range<usize>],
    stream: &Stream,
) -> Result<u64, Error> {
    let mut bytes = 0;
    for range in ranges.iter().filter(|r| !r.is_empty()) {
        let len = range.end.saturating_sub(range.start);
        if range.end > dst.len() || range.end > src.len() {
            return Err(Error::SizeMismatch {
                call: "cuMemcpyDtoDAsync",
                dst: dst.len() as u64,
                src: range.end as u64,
            });
        }
        let offset = range.start as u64;
        // SAFETY: the range lies inside both live allocations (checked above), which are distinct (one
        // borrowed mutably, one shared), so the copies do not overlap; under the program's stream invariant
        // (module docs) neither is freed before the stream has executed the copy (a CUDA allocation
        // synchronises its context before it is freed) and the host touches neither before synchronising.
        unsafe {
            dst.context().copy_dtod_async(
                dst.device_ptr() + offset,
                src.device_ptr() + offset,
                len as u64,
                stream.as_ref(),
            )
        }?;
        bytes += len as u64;
    }
    Ok(bytes)
}

/// Queues one replay of `graph` on the program's `stream`.
pub(crate) fn replay(graph: &Graph, stream: &Stream) -> Result<(), Error> {
    // SAFETY: `graph` was captured on this stream from the program's own storages and the generation loop's
    // history, all alive until the stream passes (CUDA allocations synchronise before they are freed, the
    // program synchronises before it drops its storages), and untouched by the host until then (the program's
    // stream invariant).
    unsafe { graph.launch(stream.as_ref()) }
}

/// The generation loop's feedback kernel: after a method ran, copies its next token into the decode
/// method's token input, sets the decode method's position input to the position the method ran at plus the
/// rows it processed, appends the token to a token history and, when streaming, publishes it in the token
/// mailbox (`cuda/mailbox.rs`), all on the device. Its module also holds the clock kernel that calibrates the
/// mailbox's device times against the host's clock.
///
/// Compiled with NVRTC once per process per device (`cuda_rt::Context::compile_module` caches it).
pub struct FeedbackKernel {
    function: Function,
    clock: Function,
}

impl std::fmt::Debug for FeedbackKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeedbackKernel").finish_non_exhaustive()
    }
}

/// The kernels: one thread each. `position_from` and `position_to` may be the same address (decode feeding
/// itself): it is read before it is written. `mailbox` is 0 when nothing streams; otherwise the token and the
/// device time are written, fenced for the host, and then the count (the mailbox's layout).
const FEEDBACK_SOURCE: &str = r#"
__device__ unsigned long long kv_now()
{
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    return now;
}

extern "C" __global__ void kv_feedback(
    const long long* next_token, const long long* position_from, long long rows,
    long long* token_to, long long* position_to,
    long long* history, unsigned int* length, unsigned int capacity,
    unsigned long long* mailbox)
{
    if (blockIdx.x != 0 || threadIdx.x != 0) { return; }
    long long token = next_token[0];
    long long position = position_from[0] + rows;
    token_to[0] = token;
    position_to[0] = position;
    unsigned int n = length[0];
    if (n < capacity) { history[n] = token; }
    length[0] = n + 1;
    if (mailbox != 0 && n < capacity) {
        volatile unsigned long long* box = mailbox;
        box[2 + n] = (unsigned long long)token;
        box[2 + capacity + n] = kv_now();
        __threadfence_system();
        box[0] = n + 1;
    }
}

extern "C" __global__ void kv_clock(unsigned long long* mailbox)
{
    if (blockIdx.x != 0 || threadIdx.x != 0) { return; }
    unsigned long long now = kv_now();
    ((volatile unsigned long long*)mailbox)[1] = now == 0 ? 1 : now;
}
"#;

/// The device addresses one feedback launch reads and writes, each of a storage the program owns (`i64 [1]`
/// each, but for the history), the history's own, and the mailbox's (0: none).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FeedbackArgs {
    pub next_token: DevicePtr,
    pub position_from: DevicePtr,
    pub rows: i64,
    pub token_to: DevicePtr,
    pub position_to: DevicePtr,
    pub history: DevicePtr,
    pub length: DevicePtr,
    pub capacity: u32,
    pub mailbox: DevicePtr,
}

impl FeedbackKernel {
    /// Compiles (once per process per device) and loads the kernels.
    ///
    /// # Errors
    /// No NVRTC (`NotSupported`), or the driver refuses the module.
    pub fn new(ctx: &Context) -> Result<FeedbackKernel, Error> {
        let module = ctx.compile_module(FEEDBACK_SOURCE, &[])?;
        Ok(FeedbackKernel { function: module.function("kv_feedback")?, clock: module.function("kv_clock")? })
    }

    /// Queues the kernel on the program's `stream`.
    ///
    /// Only the generation loop calls this (`generate`'s `DeviceLoop::feedback`, through
    /// `Program::queue_on_stream`), on a program's stream, with addresses of that program's own device or
    /// managed storages (eight bytes each at least: the manifest declares the tokens, positions and
    /// next-token tensors `i64`) or of the loop's sampler token, resolved once when its `FeedbackLink` was made
    /// (a storage keeps its address for the program's life; the link's program is checked at every launch),
    /// and of the loop's history (`capacity` tokens), length and mailbox (a [`Mailbox`] of `capacity` tokens,
    /// or 0), made on that program's device; the program's stream invariant keeps them alive and untouched
    /// by the host until the stream has run the kernel, but for the mailbox, which the host reads only through
    /// [`Mailbox`]'s atomic words.
    pub(crate) fn launch(&self, stream: &Stream, args: FeedbackArgs) -> Result<(), Error> {
        let FeedbackArgs {
            mut next_token,
            mut position_from,
            mut rows,
            mut token_to,
            mut position_to,
            mut history,
            mut length,
            mut capacity,
            mut mailbox,
        } = args;
        let mut params: [*mut c_void; 9] = [
            (&mut next_token as *mut DevicePtr).cast(),
            (&mut position_from as *mut DevicePtr).cast(),
            (&mut rows as *mut i64).cast(),
            (&mut token_to as *mut DevicePtr).cast(),
            (&mut position_to as *mut DevicePtr).cast(),
            (&mut history as *mut DevicePtr).cast(),
            (&mut length as *mut DevicePtr).cast(),
            (&mut capacity as *mut u32).cast(),
            (&mut mailbox as *mut DevicePtr).cast(),
        ];
        let config = LaunchConfig { grid: (1, 1, 1), block: (1, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: `params` points at nine locals of the kernel's parameter types, in order (device pointers
        // are 64-bit `CUdeviceptr`s, `long long` is `i64`, `unsigned int` is `u32`), read during the call. The
        // kernel reads `next_token` and `position_from` (8 bytes each), writes `token_to` and `position_to`
        // (8 bytes each), `history` below `capacity` entries, `length` (4 bytes) and, when not 0, whole
        // aligned words of the mailbox below its `2 + 2 * capacity`: every one an allocation of at least that
        // size, alive and untouched by the host until the stream has run the kernel, the mailbox read only
        // atomically (this function's callers, above). One thread, within the bounds it was written for.
        unsafe { self.function.launch(config, stream.as_ref(), &mut params) }
    }

    /// Queues the clock kernel on the program's `stream`: it writes the device's `%globaltimer` into
    /// `mailbox`'s clock word.
    pub(crate) fn launch_clock(&self, stream: &Stream, mailbox: &Mailbox) -> Result<(), Error> {
        let mut address = mailbox.device_ptr();
        let mut params: [*mut c_void; 1] = [(&mut address as *mut DevicePtr).cast()];
        let config = LaunchConfig { grid: (1, 1, 1), block: (1, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: one 64-bit device pointer, the kernel's one parameter; it writes the mailbox's second word,
        // inside the pinned allocation `mailbox` owns, which the borrow keeps alive until the call returns and
        // the device loop (its owner) until the stream has run it (a CUDA allocation synchronises before it
        // is freed); the host reads that word only atomically ([`Mailbox::clock`]).
        unsafe { self.clock.launch(config, stream.as_ref(), &mut params) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Needs NVRTC (not a GPU): `cargo xtask test` provides it and sets `KV_REQUIRE_NVRTC`; without NVRTC the
    /// test checks the typed error instead.
    #[test]
    fn the_feedback_kernel_compiles_where_nvrtc_exists() {
        match cuda_rt::compile_ptx(FEEDBACK_SOURCE, &["--gpu-architecture=compute_90"]) {
            Ok(ptx) => {
                assert!(ptx.contains(".entry kv_feedback"), "{ptx}");
                assert!(ptx.contains(".entry kv_clock"), "{ptx}");
                assert!(
                    ptx.contains("membar.sys") || ptx.contains("fence.sc.sys"),
                    "the fence before the count"
                );
            }
            Err(err) => {
                assert!(std::env::var_os("KV_REQUIRE_NVRTC").is_none(), "KV_REQUIRE_NVRTC is set but: {err}");
                eprintln!(
                    "this test needs NVRTC (a CUDA toolkit); without it it checks the typed error: {err}"
                );
                assert!(matches!(err, Error::LibraryUnavailable { library: "nvrtc", .. }), "{err:?}");
            }
        }
    }
}
