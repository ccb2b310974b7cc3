//! Decides whether a delegate blob's aliased I/O (an engine output written in place into an input's storage)
//! is sound, and turns it into a validated [`AliasPlan`]; it never touches memory.
//!
//! Three layers of rules, each failure a distinct [`Error`] variant that names the tensors involved and maps
//! to ExecuTorch's code through [`et_error::HasErrorCode`]:
//!
//! - [`validate_format`]: the blob alone (binding table, alias table, known kinds, `user` shapes where the
//!   blob records them). This is what `delegate-host validate` runs.
//! - [`validate_with_engine`]: the blob against its engine through [`EngineIntrospect`] (every binding is
//!   an engine tensor of the same role, dtype and shape; `kv_cache_update` aliases are the engine's own;
//!   engine aliases the blob lacks are added with a [`Warning`]). Delegates run this at init.
//! - [`residency::DirectAccess::check`]: per call, before any staging or zero-byte path, an aliased input
//!   must be memory the engine writes directly (device or managed memory for a discrete GPU, any for an
//!   integrated one, host-visible memory for a CPU engine) and non-empty.
//!
//! [`ArgLayout`] then lays the validated plan over the delegate's argument positions once (which binding
//! each position carries, which positions are aliased inputs, which slot writes which input), so the host and
//! every delegate resolve positions the same way.
//!
//! Binding is by name: a [`PlannedAlias`] carries indices into `Header::bindings` resolved from names, so the
//! order of outputs in the blob does not matter.
//!
//! ## Examples
//!
//! ```
//! use alias_validate::residency::{self, MemoryKind};
//! use alias_validate::{validate_format, ArgLayout, ValidKind};
//! use blob_format::model::{Alias, AliasKind, Binding, Header, PayloadKind, Role};
//! use et_error::{ErrorCode, HasErrorCode};
//!
//! let header = Header {
//!     producer: None,
//!     backend_id: "TensorRTBackend".into(),
//!     payload_kind: PayloadKind::TensorRtPlan,
//!     bindings: vec![
//!         Binding::untyped("tokens", Role::Input),
//!         Binding::untyped("k_cache", Role::Input),
//!         Binding::untyped("logits", Role::Output),
//!         Binding::untyped("k_cache_out", Role::Output),
//!     ],
//!     aliases: vec![Alias {
//!         output: "k_cache_out".into(),
//!         input: "k_cache".into(),
//!         kind: AliasKind::KvCacheUpdate,
//!     }],
//!     device_id: 0,
//!     hardware_compatible: false,
//!     hardware_target: None,
//!     engine_library_version: None,
//!     engine_metadata: None,
//! };
//!
//! // At load: the alias resolves by name to binding indices.
//! let plan = validate_format(&header)?;
//! let alias = plan.alias_for_output("k_cache_out").expect("validated above");
//! assert_eq!(alias.kind, ValidKind::KvCacheUpdate);
//! assert_eq!(header.bindings[alias.input_binding].name, "k_cache");
//! assert!(plan.is_aliased_input("k_cache"));
//!
//! // A typo in the kind is refused by name.
//! let mut typo = header.clone();
//! typo.aliases[0].kind = AliasKind::from_wire("kv_cache_updat");
//! let err = validate_format(&typo).unwrap_err();
//! assert_eq!(err.error_code(), ErrorCode::InvalidProgram);
//! assert!(err.to_string().contains("'kv_cache_updat'"));
//!
//! // Positions: one per threaded binding; the cache output slot writes the cache input's position.
//! let layout = ArgLayout::new(&header, &plan)?;
//! assert_eq!(layout.slots()[3].in_place_of(), Some(1));
//! assert!(layout.slots()[1].is_alias_target());
//!
//! // On every call, for every aliased input: the caller's storage must be where the engine writes.
//! let gpu = residency::DirectAccess::DISCRETE_GPU;
//! gpu.check("k_cache", MemoryKind::Device, 4096)?;
//! let err = gpu.check("k_cache", MemoryKind::Host, 4096).unwrap_err();
//! assert_eq!(err.error_code(), ErrorCode::InvalidArgument);
//! assert!(err.to_string().starts_with("aliased input 'k_cache' must be on GPU or unified memory"));
//! # Ok::<(), alias_validate::Error>(())
//! ```
//!
//! ## Feature Flags
//!
//! None.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod engine;
mod error;
pub mod layout;
mod plan;
pub mod residency;
mod validate;

pub use engine::{EngineIntrospect, EngineTensor};
pub use error::Error;
pub use layout::{ArgAlias, ArgLayout, ArgSlot, UnthreadedAlias};
pub use plan::{AliasPlan, AliasSource, PlannedAlias, ValidKind, Warning};
pub use validate::{validate_format, validate_with_engine};
