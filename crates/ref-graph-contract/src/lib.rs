//! The contract every executor of reference graphs ([`ref_graph`]) keeps, written once: the reference delegate
//! (CPU) and the CUDA delegate (GPU) run the same payload and refuse, describe and bind a blob by the rules
//! here, so they answer alike and in the same words.
//!
//! - [`blob`]: reading a blob ([`read_blob`]: parsed, its header fit for the executor's backend, its payload
//!   verified and decoded), [`blob_compatibility`] and [`payload_compatibility`], and [`header_mismatch`], the
//!   reasons a header is refused.
//! - [`plan`]: the [`BindingPlan`], every argument position resolved once to its graph tensor by name, as an
//!   [`ArgSpec`] (type, extents, aliasing).
//! - [`info`]: the executor's self-description ([`reference_graph_info`]) and whether an instance keeps
//!   sequence state of its own ([`keeps_sequence_state`]).
//! - [`Executor`]: one executor's backend and name, the `compatibility` and the start of `init` of its
//!   [`delegate_abi::Delegate`] implementation.
//!
//! It depends on the format ([`ref_graph`], [`blob_format`]), the rules ([`alias_validate`]) and the ABI
//! ([`delegate_abi`]), never on a delegate: every delegate depends on it.
//!
//! ## Examples
//!
//! ```
//! use delegate_abi::Compatibility;
//! use ref_graph_contract::Executor;
//!
//! const EXECUTOR: Executor = Executor { backend: "MyBackend", name: "my delegate" };
//! match EXECUTOR.compatibility(b"not a blob") {
//!     Compatibility::Unsupported { reason } => assert!(!reason.is_empty()),
//!     other => panic!("garbage accepted: {other:?}"),
//! }
//! ```
//!
//! ## Feature Flags
//!
//! None.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod blob;
mod error;
mod executor;
pub mod info;
pub mod plan;

pub use blob::{blob_compatibility, header_mismatch, payload_compatibility, read_blob, WIRE_FORMAT_VERSIONS};
pub use error::Error;
pub use executor::{Executor, Opened};
pub use info::{keeps_sequence_state, reference_graph_info};
pub use plan::{ArgSpec, BindingPlan};
