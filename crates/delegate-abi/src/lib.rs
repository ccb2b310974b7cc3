//! The stable delegate plugin ABI.
#![deny(missing_docs)]
pub mod delegate;
pub mod tensor;
pub use delegate::*;
pub use tensor::*;
