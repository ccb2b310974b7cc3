//! What the CUDA delegate's decode benches (`hf_decode`, `export_decode`) share: a decode step timed as a CUDA
//! graph replay (`decode`), chains of as many launches (`chain`), the bytes a step must read (`traffic`), the
//! JSON line both print (`report`), and the hollow exported graphs `export_decode` fills (`hollow`, also read
//! by `tests/hollow.rs`).

#![allow(dead_code)]

pub mod chain;
pub mod decode;
pub mod hollow;
pub mod report;
pub mod traffic;
