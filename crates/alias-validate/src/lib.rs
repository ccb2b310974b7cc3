//! Aliasing rules for delegate blobs.
#![deny(missing_docs)]
#![forbid(unsafe_code)]
pub mod engine;
pub use engine::{EngineIntrospect, EngineTensor};
