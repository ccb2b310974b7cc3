//! The CUDA delegate ([`cuda_delegate::CudaDelegate`]) as a plugin library: this crate only exports the
//! plugin entry symbol, so the delegate itself stays an rlib that hosts can embed next to other plugins.
//!
//! ## Examples
//!
//! ```text
//! cargo build -p cuda-delegate-dylib               # target/debug/libcuda_delegate_dylib.so
//! delegate-host plugins --plugin-dir target/debug  # lists it, unavailable without a GPU, with the reason
//! ```
//!
//! ## Feature Flags
//!
//! None.

delegate_abi::export_delegate!(cuda_delegate::CudaDelegate);
