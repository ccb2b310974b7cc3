//! The delegate blob wire format.
#![deny(missing_docs)]
#![forbid(unsafe_code)]
pub mod model;
