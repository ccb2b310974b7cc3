//! Tensor views as they cross the boundary: `#[repr(C)]`, fixed size, no allocation per call.

use std::ffi::c_void;
use std::fmt;

use abi_stable::StableAbi;

/// Largest rank a [`TensorArg`] carries inline.
pub const MAX_RANK: usize = 8;

/// Where a tensor's bytes live.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, StableAbi)]
pub enum MemoryKind {
    /// Ordinary host memory.
    Host = 0,
    /// CUDA device memory (`cudaMalloc`).
    Device = 1,
    /// CUDA managed (unified) memory, visible to host and device.
    Managed = 2,
    /// Pinned host memory (`cudaMallocHost`), host memory the device can read by DMA.
    Pinned = 3,
}

impl MemoryKind {
    /// Every kind.
    pub const ALL: [MemoryKind; 4] =
        [MemoryKind::Host, MemoryKind::Device, MemoryKind::Managed, MemoryKind::Pinned];

    /// Whether the host may dereference it.
    pub const fn is_host_visible(self) -> bool {
        matches!(self, MemoryKind::Host | MemoryKind::Managed | MemoryKind::Pinned)
    }

    /// `"host"`, `"device"`, `"managed"` or `"pinned"`.
    pub const fn name(self) -> &'static str {
        match self {
            MemoryKind::Host => "host",
            MemoryKind::Device => "device",
            MemoryKind::Managed => "managed",
            MemoryKind::Pinned => "pinned",
        }
    }

    /// Parses a [`MemoryKind::name`].
    pub fn from_name(name: &str) -> Option<MemoryKind> {
        Self::ALL.into_iter().find(|kind| kind.name() == name)
    }
}

impl fmt::Display for MemoryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Element type codes on the wire of the ABI (stable numbers, independent of `blob-format`'s enum order).
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, StableAbi)]
pub enum DTypeCode {
    /// 32-bit float.
    F32 = 0,
    /// 16-bit IEEE float.
    F16 = 1,
    /// bfloat16.
    BF16 = 2,
    /// 64-bit float.
    F64 = 3,
    /// Signed 8-bit integer.
    I8 = 4,
    /// Unsigned 8-bit integer.
    U8 = 5,
    /// Signed 32-bit integer.
    I32 = 6,
    /// Signed 64-bit integer.
    I64 = 7,
    /// Boolean, one byte.
    Bool = 8,
}

impl DTypeCode {
    /// Every code.
    pub const ALL: [DTypeCode; 9] = [
        DTypeCode::F32,
        DTypeCode::F16,
        DTypeCode::BF16,
        DTypeCode::F64,
        DTypeCode::I8,
        DTypeCode::U8,
        DTypeCode::I32,
        DTypeCode::I64,
        DTypeCode::Bool,
    ];

    /// Size of one element in bytes.
    pub const fn size_bytes(self) -> usize {
        match self {
            DTypeCode::F32 | DTypeCode::I32 => 4,
            DTypeCode::F16 | DTypeCode::BF16 => 2,
            DTypeCode::F64 | DTypeCode::I64 => 8,
            DTypeCode::I8 | DTypeCode::U8 | DTypeCode::Bool => 1,
        }
    }

    /// `"f32"`, `"i64"`, ... (the same spelling as `blob-format`).
    pub const fn name(self) -> &'static str {
        match self {
            DTypeCode::F32 => "f32",
            DTypeCode::F16 => "f16",
            DTypeCode::BF16 => "bf16",
            DTypeCode::F64 => "f64",
            DTypeCode::I8 => "i8",
            DTypeCode::U8 => "u8",
            DTypeCode::I32 => "i32",
            DTypeCode::I64 => "i64",
            DTypeCode::Bool => "bool",
        }
    }

    /// Parses a [`DTypeCode::name`].
    pub fn from_name(name: &str) -> Option<DTypeCode> {
        Self::ALL.into_iter().find(|code| code.name() == name)
    }
}

impl fmt::Display for DTypeCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// [`TensorArg::flags`] bit: the delegate may write the bytes (outputs, and inputs that an output aliases).
pub const ARG_WRITABLE: u32 = 1 << 0;

/// [`TensorArg::flags`] bit: a writable input, i.e. caller-owned state (a KV cache) the delegate reads and
/// updates in place. Always set together with [`ARG_WRITABLE`]; an in-place output shares its storage.
pub const ARG_INOUT: u32 = 1 << 1;

/// One delegate argument: a view of caller memory plus its metadata. Plain data, `Copy`, no destructor.
#[repr(C)]
#[derive(Clone, Copy, StableAbi)]
pub struct TensorArg {
    /// First byte (host or device address); may be null when `nbytes` is 0.
    pub data: *mut c_void,
    /// Size in bytes.
    pub nbytes: u64,
    /// Number of valid entries in `shape`.
    pub rank: u32,
    /// Flags, see [`ARG_WRITABLE`] and [`ARG_INOUT`].
    pub flags: u32,
    /// Extents, the first `rank` valid.
    pub shape: [i64; MAX_RANK],
    /// CUDA device ordinal for device and managed memory; 0 otherwise.
    pub device_id: i32,
    /// Element type.
    pub dtype: DTypeCode,
    /// Where the bytes live.
    pub memory: MemoryKind,
    /// Reserved, zero.
    pub reserved: [u8; 2],
}

impl TensorArg {
    /// Metadata without memory, e.g. to describe what a call expects.
    pub fn describe(dtype: DTypeCode, shape: &[i64], memory: MemoryKind) -> Option<TensorArg> {
        if shape.len() > MAX_RANK {
            return None;
        }
        let mut dims = [0i64; MAX_RANK];
        dims[..shape.len()].copy_from_slice(shape);
        Some(TensorArg {
            data: std::ptr::null_mut(),
            nbytes: 0,
            rank: shape.len() as u32,
            flags: 0,
            shape: dims,
            device_id: 0,
            dtype,
            memory,
            reserved: [0; 2],
        })
    }

    /// The valid extents.
    pub fn dims(&self) -> &[i64] {
        &self.shape[..(self.rank as usize).min(MAX_RANK)]
    }

    /// Product of the extents (1 for a scalar), or `None` if an extent is negative or it overflows.
    pub fn numel(&self) -> Option<u64> {
        self.dims().iter().try_fold(1u64, |acc, &d| u64::try_from(d).ok().and_then(|d| acc.checked_mul(d)))
    }

    /// Element type.
    pub fn dtype(&self) -> DTypeCode {
        self.dtype
    }

    /// Where the bytes live.
    pub fn memory(&self) -> MemoryKind {
        self.memory
    }

    /// Whether the delegate may write it.
    pub fn is_writable(&self) -> bool {
        self.flags & ARG_WRITABLE != 0
    }

    /// Whether the two args' byte ranges intersect (an empty range intersects nothing).
    pub fn overlaps(&self, other: &TensorArg) -> bool {
        if self.nbytes == 0 || other.nbytes == 0 {
            return false;
        }
        let (a, b) = (self.data as usize as u128, other.data as usize as u128);
        a < b + u128::from(other.nbytes) && b < a + u128::from(self.nbytes)
    }

    /// Whether it is a writable input (caller-owned state updated in place).
    pub fn is_inout(&self) -> bool {
        self.flags & ARG_INOUT != 0
    }

    /// Whether both args are the same storage: same address and size (an input and its in-place output).
    pub fn same_storage(&self, other: &TensorArg) -> bool {
        self.data == other.data && self.nbytes == other.nbytes
    }

    /// # Safety
    /// The arg must be host-visible and valid for reads of `nbytes` for `'a`.
    pub(crate) unsafe fn host_bytes<'a>(&self) -> &'a [u8] {
        if self.nbytes == 0 || self.data.is_null() {
            return &[];
        }
        // SAFETY: the caller guarantees `data` is valid for reads of `nbytes` for 'a; nbytes fits in memory
        // because the storage exists.
        unsafe { std::slice::from_raw_parts(self.data as *const u8, self.nbytes as usize) }
    }

    /// # Safety
    /// The arg must be host-visible, writable and valid for writes of `nbytes` for `'a`, and no other
    /// reference to its bytes may live during `'a`.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn host_bytes_mut<'a>(&self) -> &'a mut [u8] {
        if self.nbytes == 0 || self.data.is_null() {
            return &mut [];
        }
        // SAFETY: the caller guarantees exclusive, writable access to `nbytes` bytes at `data` for 'a.
        unsafe { std::slice::from_raw_parts_mut(self.data as *mut u8, self.nbytes as usize) }
    }
}

impl fmt::Debug for TensorArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorArg")
            .field("data", &self.data)
            .field("nbytes", &self.nbytes)
            .field("dtype", &self.dtype)
            .field("shape", &self.dims())
            .field("memory", &self.memory)
            .field("device_id", &self.device_id)
            .field("writable", &self.is_writable())
            .finish()
    }
}
