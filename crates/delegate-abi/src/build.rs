//! Constructors for the structs a plugin builds: [`PluginInfo`], [`WireFormatSupport`] and [`Capabilities`].
//!
//! These structs grow as the ABI gains fields (`capabilities` was appended after release 0.1.0), so they are
//! `#[non_exhaustive]`: outside this crate they are built with a constructor and `with_*` methods, never by a
//! struct literal, and a field added later (with a default that an older plugin is read as, see
//! [`crate::capabilities`]) breaks no plugin's build. Their fields stay public to read and to set.
//!
//! ```
//! use delegate_abi::{Capabilities, MemoryKind, PluginInfo};
//!
//! let info = PluginInfo::new("doubler", "0.1.0")
//!     .with_backend("DoublerBackend")
//!     .with_wire_format("native", "^1")
//!     .with_memory_kinds([MemoryKind::Host])
//!     .with_binds_aliases_in_place(true)
//!     .with_capabilities(Capabilities::default().with_rewind_fork_without_reinit(true));
//! assert_eq!(info.backends, ["DoublerBackend"]);
//! assert!(info.capabilities.rewind_fork_without_reinit);
//! ```

use crate::capabilities::Capabilities;
use crate::delegate::{PluginInfo, WireFormatSupport};
use crate::tensor::MemoryKind;

impl PluginInfo {
    /// A plugin named `name` at `version` (semver) that serves no backend yet, reads no wire format, takes
    /// host memory, binds no alias in place (the host copies, which is always correct) and states no
    /// capabilities ([`Capabilities::default`]). Add the rest with the `with_*` methods.
    pub fn new(name: impl Into<String>, version: impl Into<String>) -> PluginInfo {
        PluginInfo {
            name: name.into(),
            version: version.into(),
            backends: Vec::new(),
            wire_formats: Vec::new(),
            memory_kinds: vec![MemoryKind::Host],
            binds_aliases_in_place: false,
            capabilities: Capabilities::default(),
        }
    }

    /// Adds an ExecuTorch backend id it serves.
    pub fn with_backend(mut self, backend: impl Into<String>) -> PluginInfo {
        self.backends.push(backend.into());
        self
    }

    /// Adds a wire format it reads: its name (`"native"`, `"tr01"`, `"tr02"`) and a semver requirement over
    /// the format's versions (`">=1.0, <2"`).
    pub fn with_wire_format(mut self, format: impl Into<String>, versions: impl Into<String>) -> PluginInfo {
        self.wire_formats.push(WireFormatSupport::new(format, versions));
        self
    }

    /// Sets the memory kinds its arguments may live in (replacing the default, host memory).
    pub fn with_memory_kinds(mut self, kinds: impl IntoIterator<Item = MemoryKind>) -> PluginInfo {
        self.memory_kinds = kinds.into_iter().collect();
        self
    }

    /// Sets whether it binds aliased outputs in place ([`PluginInfo::binds_aliases_in_place`]).
    pub fn with_binds_aliases_in_place(mut self, binds: bool) -> PluginInfo {
        self.binds_aliases_in_place = binds;
        self
    }

    /// Sets what it states before any `init` ([`Capabilities`]).
    pub fn with_capabilities(mut self, capabilities: Capabilities) -> PluginInfo {
        self.capabilities = capabilities;
        self
    }
}

impl WireFormatSupport {
    /// A wire format by name and a semver requirement over its versions.
    pub fn new(format: impl Into<String>, versions: impl Into<String>) -> WireFormatSupport {
        WireFormatSupport { format: format.into(), versions: versions.into() }
    }
}

impl Capabilities {
    /// Sets the memory kinds whose cache arguments it updates where they are
    /// ([`Capabilities::in_place_memory_kinds`]; an empty list states "none").
    pub fn with_in_place_memory_kinds(mut self, kinds: impl IntoIterator<Item = MemoryKind>) -> Capabilities {
        self.in_place_memory_kinds = Some(kinds.into_iter().collect());
        self
    }

    /// Sets [`Capabilities::caller_stream`].
    pub fn with_caller_stream(mut self, on: bool) -> Capabilities {
        self.caller_stream = on;
        self
    }

    /// Sets [`Capabilities::cuda_graph_capturable`].
    pub fn with_cuda_graph_capturable(mut self, on: bool) -> Capabilities {
        self.cuda_graph_capturable = on;
        self
    }

    /// Sets [`Capabilities::device_positions`].
    pub fn with_device_positions(mut self, on: bool) -> Capabilities {
        self.device_positions = on;
        self
    }

    /// Sets [`Capabilities::rewind_fork_without_reinit`].
    pub fn with_rewind_fork_without_reinit(mut self, on: bool) -> Capabilities {
        self.rewind_fork_without_reinit = on;
        self
    }

    /// Sets [`Capabilities::max_positions`] (`0`: no limit stated).
    pub fn with_max_positions(mut self, max: u64) -> Capabilities {
        self.max_positions = max;
        self
    }
}
