//! The workspace's one vocabulary: ExecuTorch's numeric error codes ([`ErrorCode`], `runtime/core/error.h`),
//! where a tensor's bytes live ([`MemoryKind`]) and what its elements are ([`DType`]). Every crate that names
//! one of these names it from here: the formats (blob-format, program-manifest), the rules (alias-validate),
//! the CUDA layer (cuda-rt) and the plugin ABI (delegate-abi), which keeps only its `repr(C)` mirror of them
//! and the one conversion pair next to it.
//!
//! Error codes are the only error data that crosses the plugin ABI besides a message. Their numeric values are
//! part of the ABI: they never change, and codes this build does not know survive a round trip through
//! [`ErrorCode::from_u32`] as [`ErrorCode::Unknown`].
//!
//! ## Examples
//!
//! ```
//! use et_error::{DType, ErrorCode, MemoryKind};
//!
//! let code = ErrorCode::InvalidProgram;
//! assert_eq!(code.as_u32(), 0x23);
//! assert_eq!(ErrorCode::from_u32(0x23), code);
//! assert_eq!(code.to_string(), "InvalidProgram (0x23)");
//!
//! // A program manifest's `memory = "pinned"`, and what the host may do with such bytes.
//! let pinned = MemoryKind::from_name("pinned").expect("a memory kind");
//! assert!(pinned.is_host_visible() && !MemoryKind::Device.is_host_visible());
//!
//! assert_eq!(DType::from_name("bf16").map(DType::size_bytes), Some(2));
//! ```
//!
//! ## Feature Flags
//!
//! None.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod code;
mod dtype;
mod memory;

pub use code::{ErrorCode, HasErrorCode};
pub use dtype::DType;
pub use memory::MemoryKind;
