//! The library floor of the plugin code, below isolation and the registry: the plugin manifest
//! ([`manifest`]), a library's bytes verified against it (`verify`), and loading a library checked against
//! it (`load`). Nothing here knows of workers or of which plugin serves a backend.

mod load;
pub mod manifest;
pub(crate) mod verify;

pub use load::describe_library;
pub(crate) use load::{load_checked, manifest_of};
