//! What the driver knows about an address: the pointer-kind query a residency gate needs to check that
//! memory said to be device or managed really is (`cuPointerGetAttributes`).

use std::ffi::c_void;

use cudarc::driver::sys;

use crate::context::Context;
use crate::driver;
use crate::error::Result;

/// The kind of memory an address belongs to, as the driver sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PointerKind {
    /// Not known to CUDA: ordinary pageable host memory (or no memory at all).
    Unregistered,
    /// Host memory known to CUDA: pinned (`cuMemHostAlloc`) or registered (`cuMemHostRegister`).
    Host,
    /// Device memory.
    Device,
    /// Managed (unified) memory.
    Managed,
}

/// What the driver reports about an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PointerInfo {
    /// The memory kind.
    pub kind: PointerKind,
    /// The device the memory belongs to (`None` for [`PointerKind::Unregistered`]).
    pub device: Option<i32>,
}

/// Decodes the attributes `cuPointerGetAttributes` wrote: the `CUmemorytype` (0 when the address is unknown),
/// the managed flag and the device ordinal.
pub(crate) fn decode(memory_type: u32, is_managed: bool, device: i32) -> PointerInfo {
    const HOST: u32 = sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32;
    const DEVICE: u32 = sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32;
    const UNIFIED: u32 = sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED as u32;
    let kind = match memory_type {
        _ if is_managed => PointerKind::Managed,
        UNIFIED => PointerKind::Managed,
        DEVICE => PointerKind::Device,
        HOST => PointerKind::Host,
        _ => PointerKind::Unregistered,
    };
    PointerInfo { kind, device: (kind != PointerKind::Unregistered).then_some(device) }
}

impl Context {
    /// What the driver knows about `ptr`: device, managed, registered host or unknown memory, and its device.
    /// Reads no memory; any address may be asked about.
    ///
    /// # Errors
    /// [`crate::Error::Driver`] when the driver refuses the query itself.
    pub fn pointer_info(&self, ptr: *const c_void) -> Result<PointerInfo> {
        self.bind()?;
        let mut memory_type: u32 = 0;
        let mut is_managed: u32 = 0;
        let mut device: i32 = -1;
        let mut attributes = [
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        ];
        let mut data: [*mut c_void; 3] = [
            (&mut memory_type as *mut u32).cast(),
            (&mut is_managed as *mut u32).cast(),
            (&mut device as *mut i32).cast(),
        ];
        let known = driver::call("cuPointerGetAttributes", self.ordinal(), || {
            // SAFETY: `attributes` and `data` hold 3 entries each; every data pointer points to a live local of
            // at least the attribute's size (a 4-byte `CUmemorytype`, a boolean written into a zeroed `u32`, a
            // 4-byte `int` ordinal); the driver reads `ptr` only as an address. An address CUDA does not know
            // leaves the values untouched and returns success.
            let queried = unsafe {
                sys::cuPointerGetAttributes(
                    3,
                    attributes.as_mut_ptr(),
                    data.as_mut_ptr(),
                    ptr as usize as u64,
                )
            };
            match queried {
                sys::CUresult::CUDA_SUCCESS => Ok(true),
                // Some drivers answer an address they do not know with `CUDA_ERROR_INVALID_VALUE`.
                sys::CUresult::CUDA_ERROR_INVALID_VALUE => Ok(false),
                other => other.result().map(|()| true),
            }
        })?;
        Ok(if known { decode(memory_type, is_managed != 0, device) } else { decode(0, false, -1) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_decode_to_the_kind_the_residency_gate_needs() {
        let host = sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32;
        let device = sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32;
        let unified = sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED as u32;
        assert_eq!(decode(0, false, -1), PointerInfo { kind: PointerKind::Unregistered, device: None });
        assert_eq!(decode(host, false, 0), PointerInfo { kind: PointerKind::Host, device: Some(0) });
        assert_eq!(decode(device, false, 1), PointerInfo { kind: PointerKind::Device, device: Some(1) });
        // Managed memory reports a physical type (device or host) plus the managed flag.
        assert_eq!(decode(device, true, 0), PointerInfo { kind: PointerKind::Managed, device: Some(0) });
        assert_eq!(decode(host, true, 0).kind, PointerKind::Managed);
        assert_eq!(decode(unified, false, 0).kind, PointerKind::Managed);
    }
}
