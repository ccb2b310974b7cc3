//! [`Plugin`]: a loaded library (or an embedded root module), its negotiated tables and checked metadata.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use abi_stable::library::lib_header_from_path;
use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::std_types::{RResult, RSlice, RStr};

use super::instance::Instance;
use super::load_error::{defining_crate, map_library_error};
use super::{HostConfig, LoadError};
use crate::abi::{AbiRange, DelegateRootRef, HostOffer, PluginModuleRef, RError, ROptionValue, RSpec};
use crate::delegate::{Compatibility, DelegateError, InitContext, OptionValue, PluginInfo};

/// A loaded, negotiated plugin. Cheap to share: `Send + Sync`; the library stays loaded forever.
#[derive(Clone)]
pub struct Plugin {
    inner: Arc<PluginInner>,
}

struct PluginInner {
    path: Option<PathBuf>,
    module: PluginModuleRef,
    info: PluginInfo,
    version: semver::Version,
    abi_version: u32,
    plugin_range: AbiRange,
}

impl fmt::Debug for Plugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plugin")
            .field("path", &self.inner.path)
            .field("name", &self.inner.info.name)
            .field("version", &self.inner.info.version)
            .field("abi_version", &self.inner.abi_version)
            .finish()
    }
}

impl Plugin {
    /// Loads the plugin library at `path`, checks its root module, negotiates the ABI version and reads
    /// its metadata. Runs no plugin `init` (nor `Delegate::new`).
    pub fn load(path: &Path, config: &HostConfig) -> Result<Plugin, LoadError> {
        Plugin::load_as(path, path, config)
    }

    /// [`Plugin::load`] of a library the dynamic loader opens as `open` (e.g. `/proc/self/fd/N`, a file the
    /// caller has already read and checked), recorded, and named in errors, as `path`.
    pub fn load_as(open: &Path, path: &Path, config: &HostConfig) -> Result<Plugin, LoadError> {
        // The loader's own words for a library of another architecture are misleading ("No such file or
        // directory" for a file that exists), so an ELF header is read first and a mismatch named.
        if let Some(reason) = foreign_elf(open) {
            return Err(LoadError::NotALibrary { path: path.to_path_buf(), reason });
        }
        let header = lib_header_from_path(open).map_err(|e| map_library_error(path, e, None))?;
        let plugin_layout = header.layout().map(defining_crate);
        let root: DelegateRootRef =
            super::root::init_root(header).map_err(|e| map_library_error(path, e, plugin_layout))?;
        Plugin::handshake(root, Some(path.to_path_buf()), config, config.forward_logs)
    }

    /// A plugin linked into this binary, from the `delegate_root()` that [`crate::export_delegate!`]
    /// generated (e.g. `reference_delegate::delegate_root()`), through exactly the same tables as a dylib.
    pub fn embedded(root: DelegateRootRef) -> Result<Plugin, LoadError> {
        Plugin::embedded_with(root, &HostConfig::default())
    }

    /// [`Plugin::embedded`] with a configuration (e.g. an ABI range to test negotiation). Logs are never
    /// forwarded: an embedded plugin already shares this process's `tracing`.
    pub fn embedded_with(root: DelegateRootRef, config: &HostConfig) -> Result<Plugin, LoadError> {
        Plugin::handshake(root, None, config, false)
    }

    fn handshake(
        root: DelegateRootRef,
        path: Option<PathBuf>,
        config: &HostConfig,
        forward_logs: bool,
    ) -> Result<Plugin, LoadError> {
        let host = config.abi_range;
        // One small leak per load: the offer is a prefix type, which abi_stable hands out as 'static.
        let offer = HostOffer {
            abi: host,
            forward_logs,
            log: crate::logging::host_log,
            log_enabled: crate::logging::host_log_enabled,
        }
        .leak_into_prefix();
        let negotiated = match (root.negotiate())(offer) {
            RResult::ROk(n) => n,
            RResult::RErr(refusal) => {
                let plugin = refusal.plugin_range;
                return Err(if crate::abi::negotiate(host, plugin).is_err() {
                    LoadError::AbiVersionDisjoint { path, plugin, host }
                } else {
                    LoadError::Refused { path, plugin, message: refusal.message.into_string() }
                });
            }
        };
        let plugin = negotiated.plugin_range;
        if !host.contains(negotiated.version) || !plugin.contains(negotiated.version) {
            return Err(LoadError::BadAnswer { path, chosen: negotiated.version, host, plugin });
        }
        let module = negotiated.module;
        let info = match (module.info())().try_to_info() {
            Ok(info) => info,
            Err(err) => return Err(LoadError::InvalidInfo { path, reason: err.to_string() }),
        };
        if info.name.trim().is_empty() {
            return Err(LoadError::InvalidInfo { path, reason: "the plugin name is empty".into() });
        }
        if info.backends.is_empty() || info.backends.iter().any(|b| b.trim().is_empty()) {
            return Err(LoadError::InvalidInfo {
                path,
                reason: format!("plugin {} names no backend id, or an empty one", info.name),
            });
        }
        let version = match semver::Version::parse(&info.version) {
            Ok(version) => version,
            Err(err) => {
                let reason = format!(
                    "plugin {} has version '{}', which is not semver: {err}",
                    info.name, info.version
                );
                return Err(LoadError::InvalidInfo { path, reason });
            }
        };
        for wire in &info.wire_formats {
            if let Err(err) = semver::VersionReq::parse(&wire.versions) {
                let reason = format!(
                    "plugin {} reads wire format {} versions '{}', which is not a semver range: {err}",
                    info.name, wire.format, wire.versions
                );
                return Err(LoadError::InvalidInfo { path, reason });
            }
        }
        Ok(Plugin {
            inner: Arc::new(PluginInner {
                path,
                module,
                info,
                version,
                abi_version: negotiated.version,
                plugin_range: plugin,
            }),
        })
    }

    /// The metadata, read at load time.
    pub fn info(&self) -> &PluginInfo {
        &self.inner.info
    }

    /// The plugin version, parsed (checked to be semver at load time).
    pub fn version(&self) -> &semver::Version {
        &self.inner.version
    }

    /// The negotiated ABI version.
    pub fn abi_version(&self) -> u32 {
        self.inner.abi_version
    }

    /// The ABI versions the plugin speaks.
    pub fn abi_range(&self) -> AbiRange {
        self.inner.plugin_range
    }

    /// The file it was loaded from; `None` when embedded.
    pub fn path(&self) -> Option<&Path> {
        self.inner.path.as_deref()
    }

    /// Whether [`Plugin::availability`] is `Ok`. A poisoned plugin is not available.
    pub fn is_available(&self) -> bool {
        self.availability().is_ok()
    }

    /// Whether the plugin can run on this machine, and if not, the reason it gives (`Delegate::availability`).
    pub fn availability(&self) -> Result<(), DelegateError> {
        match (self.inner.module.is_available())() {
            RResult::ROk(true) => Ok(()),
            RResult::ROk(false) => Err(DelegateError::not_supported(format!(
                "plugin {} says it cannot run on this machine (it gives no reason)",
                self.info().name
            ))),
            RResult::RErr(err) => Err(err.into_delegate()),
        }
    }

    /// The message of the panic that poisoned the plugin, if one did.
    pub fn poisoned(&self) -> Option<String> {
        // Guarded entry: present since ABI 1, read through its accessor so an older table answers `None`.
        let entry = self.inner.module.poison_message()?;
        entry().into_option().map(|s| s.into_string())
    }

    /// The header-only answer about `blob`.
    pub fn compatibility(&self, blob: &[u8]) -> Result<Compatibility, DelegateError> {
        (self.inner.module.compatibility())(RSlice::from_slice(blob))
            .into_result()
            .map(Compatibility::from)
            .map_err(RError::into_delegate)
    }

    /// Prepares a blob; the blob is lent to the plugin for the call only (no copy).
    pub fn init(&self, ctx: &InitContext<'_>) -> Result<Instance, DelegateError> {
        let compile: Vec<RSpec<'_>> = ctx.compile_specs.iter().map(spec).collect();
        let runtime: Vec<RSpec<'_>> = ctx.runtime_specs.iter().map(spec).collect();
        let handle = (self.inner.module.init())(
            RSlice::from_slice(ctx.blob),
            RSlice::from_slice(&compile),
            RSlice::from_slice(&runtime),
        )
        .into_result()
        .map_err(RError::into_delegate)?;
        Ok(Instance::new(self.inner.module, handle, self.clone()))
    }

    /// `Delegate::set_option`.
    pub fn set_option(&self, key: &str, value: OptionValue) -> Result<(), DelegateError> {
        (self.inner.module.set_option())(RStr::from_str(key), ROptionValue::from(value))
            .into_result()
            .map_err(RError::into_delegate)
    }

    /// `Delegate::get_option`.
    pub fn get_option(&self, key: &str) -> Result<OptionValue, DelegateError> {
        (self.inner.module.get_option())(RStr::from_str(key))
            .into_result()
            .map(OptionValue::from)
            .map_err(RError::into_delegate)
    }
}

fn spec<'a>(s: &crate::delegate::Spec<'a>) -> RSpec<'a> {
    RSpec { key: RStr::from_str(s.key), value: RSlice::from_slice(s.value) }
}

/// ELF `e_machine` of this build's architecture, and its name.
const HOST_MACHINE: Option<(u16, &str)> = if cfg!(target_arch = "x86_64") {
    Some((62, "x86_64"))
} else if cfg!(target_arch = "aarch64") {
    Some((183, "aarch64"))
} else if cfg!(target_arch = "riscv64") {
    Some((243, "riscv64"))
} else {
    None
};

/// The name of an ELF machine code, for the ones a plugin is likely to be built for.
fn machine_name(machine: u16) -> String {
    match machine {
        3 => "x86 (32-bit)".to_owned(),
        40 => "arm (32-bit)".to_owned(),
        62 => "x86_64".to_owned(),
        183 => "aarch64".to_owned(),
        243 => "riscv".to_owned(),
        other => format!("ELF machine {other}"),
    }
}

/// Why the file at `path`, when it is an ELF file, cannot be this host's library: built for another
/// architecture, word size or byte order. `None` when it matches, is not ELF, or cannot be read (the loader
/// then says why).
fn foreign_elf(path: &Path) -> Option<String> {
    use std::io::Read as _;
    let mut head = [0u8; 20];
    std::fs::File::open(path).ok()?.read_exact(&mut head).ok()?;
    if head[..4] != *b"\x7fELF" {
        return None;
    }
    let (class, data) = (head[4], head[5]);
    let host_class = if cfg!(target_pointer_width = "64") { 2 } else { 1 };
    let host_data = if cfg!(target_endian = "little") { 1 } else { 2 };
    let machine = if data == 2 {
        u16::from_be_bytes([head[18], head[19]])
    } else {
        u16::from_le_bytes([head[18], head[19]])
    };
    let (host_machine, host_name) = HOST_MACHINE?;
    if class == host_class && data == host_data && machine == host_machine {
        return None;
    }
    let bits = match class {
        1 => "32-bit",
        2 => "64-bit",
        _ => "unknown-width",
    };
    let order = if data == 2 { "big-endian" } else { "little-endian" };
    Some(format!(
        "built for {} ({bits}, {order}), but this host is {host_name}: rebuild the plugin for this machine",
        machine_name(machine)
    ))
}

#[cfg(test)]
mod elf_tests {
    use super::*;

    fn elf(class: u8, data: u8, machine: u16) -> tempfile::NamedTempFile {
        let mut head = vec![0u8; 64];
        head[..4].copy_from_slice(b"\x7fELF");
        head[4] = class;
        head[5] = data;
        head[18..20].copy_from_slice(&machine.to_le_bytes());
        let file = tempfile::NamedTempFile::new().expect("temp file");
        std::fs::write(file.path(), head).expect("write");
        file
    }

    #[test]
    fn a_library_for_another_architecture_is_named_as_such() {
        let Some((host, name)) = HOST_MACHINE else { return };
        let other = if host == 183 { 62 } else { 183 };
        let file = elf(2, 1, other);
        let reason = foreign_elf(file.path()).expect("foreign");
        assert!(
            reason.starts_with(&format!(
                "built for {} (64-bit, little-endian), but this host is {name}",
                machine_name(other)
            )),
            "{reason}"
        );
        match Plugin::load(file.path(), &HostConfig::default()) {
            Err(LoadError::NotALibrary { reason: r, .. }) => assert_eq!(r, reason),
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("loaded a foreign library"),
        }
        // The host's own kind of ELF is left to the loader.
        assert_eq!(foreign_elf(elf(2, 1, host).path()), None);
        assert!(foreign_elf(elf(1, 1, host).path()).expect("32-bit").contains("32-bit"));
    }
}
