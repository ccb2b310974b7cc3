//! Argument planning: every call of a program checked against its blob and the plugin serving it, and each
//! delegate argument's source decided, before any memory is allocated or any delegate initialised.
//!
//! The checks, in the order they run: the blob (readable, valid, for the call's backend, aliasing within
//! the rules), the plugin (one serves the backend and says it can run the blob), the arguments (as many as
//! the blob threads, each bound to something its role can take) and their memory (dtype, shape and memory
//! kind the blob and the plugin accept).

use alias_validate::{ArgLayout, ArgSlot};
use blob_format::model::{Binding, Dim, DisplayShape, Role};
use blob_format::Blob;
use delegate_abi::{Compatibility, DTypeCode, MemoryKind, PluginInfo};
use program_manifest::{ArgRef, BlobSource, Call, Location, Manifest, Method, TensorDecl};
use sha2::{Digest, Sha256};

use super::attached::BlobBytes;
use super::{isolated, Error, Mode};
use crate::blob_file::BlobFile;
use crate::lend::{ArgPlan, ArgSource};
use crate::plugins::{Registry, Served};

/// A call checked against its blob and plugin, not yet initialised.
pub(super) struct PlannedCall {
    pub(super) file: BlobBytes,
    /// SHA-256 of the blob's bytes, lowercase hex: the call's part of the program's identity (cache files).
    pub(super) blob_sha256: String,
    pub(super) plugin: Served,
    pub(super) args: Vec<ArgPlan>,
    /// The buffer each copy-back scratch slot mirrors, by scratch index.
    pub(super) scratch_of: Vec<usize>,
    /// Whether the plugin accepts device memory: it runs on the GPU and gets the program's stream.
    pub(super) streamed: bool,
}

/// The call being planned: what every refusal names.
struct CallAt<'a> {
    manifest: &'a Manifest,
    method: &'a Method,
    index: usize,
    call: &'a Call,
}

impl CallAt<'_> {
    fn wrong(&self, location: Location, message: String) -> Error {
        Error::Arguments {
            manifest: self.manifest.path.clone(),
            location,
            method: self.method.name.clone(),
            call: self.index,
            message,
        }
    }
}

/// Checks call `index` of `method` against its blob and the plugin serving it, and plans its arguments.
/// Allocates no buffer memory and initialises no delegate.
pub(super) fn plan_call(
    manifest: &Manifest,
    method: &Method,
    index: usize,
    blob: Option<BlobBytes>,
    buffers: &[&TensorDecl],
    registry: &Registry,
    mode: Mode,
) -> Result<PlannedCall, Error> {
    let at = CallAt { manifest, method, index, call: &method.calls[index] };
    let file = match blob {
        Some(bytes) => bytes,
        None => open_blob(at.call)?,
    };
    let call = at.call;
    let blob = Blob::parse(file.bytes())
        .map_err(|source| Error::Blob { blob: Box::new(call.blob.clone()), source })?;
    let layout = check_blob(&at, &blob)?;
    let plugin = serving_plugin(&at, registry, file.bytes())?;
    check_positions(&at, plugin.info())?;
    let (args, scratch_of) = plan_arguments(&at, &blob, &layout, buffers, &plugin, mode)?;
    let streamed = isolated::streamed(&plugin);
    let blob_sha256 = Sha256::digest(file.bytes()).iter().map(|b| format!("{b:02x}")).collect();
    Ok(PlannedCall { file, blob_sha256, plugin, args, scratch_of, streamed })
}

/// A plugin that states a maximum number of positions (`Capabilities::max_positions`, `0`: none) is refused
/// at load for a program whose caches hold more (`[generate] max_positions`), before it is initialised.
fn check_positions(at: &CallAt<'_>, info: &PluginInfo) -> Result<(), Error> {
    let most = info.capabilities.max_positions;
    let needs = at.manifest.generate.as_ref().and_then(|g| g.max_positions);
    match needs {
        Some(needs) if most > 0 && needs > most => Err(Error::TooManyPositions {
            method: at.method.name.clone(),
            call: format!("call {} ({})", at.index, at.call.backend),
            plugin: info.name.clone(),
            most,
            needs,
        }),
        _ => Ok(()),
    }
}

/// The call's own blob file, opened beneath the program's directory when the manifest confines it there.
fn open_blob(call: &Call) -> Result<BlobBytes, Error> {
    let opened = match &call.blob {
        BlobSource::File { path, root: Some(root) } => BlobFile::open_beneath(root, path),
        BlobSource::File { path, root: None } => BlobFile::open(path),
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "the program file's bytes were not attached",
        )),
    };
    opened.map(BlobBytes::File).map_err(|source| Error::BlobIo { blob: Box::new(call.blob.clone()), source })
}

/// The blob's checks: for the call's backend, aliasing within the rules, as many arguments as the call
/// passes. Returns the blob's argument layout.
fn check_blob(at: &CallAt<'_>, blob: &Blob<'_>) -> Result<ArgLayout, Error> {
    let (call, header) = (at.call, &blob.header);
    if header.backend_id != call.backend {
        return Err(at.wrong(
            call.location,
            format!(
                "blob {} is for backend '{}', but the call names '{}'",
                call.blob, header.backend_id, call.backend
            ),
        ));
    }
    let alias = |source| Error::Alias { blob: Box::new(call.blob.clone()), source };
    let plan = alias_validate::validate_format(header).map_err(alias)?;
    let layout = ArgLayout::new(header, &plan).map_err(alias)?;
    if layout.len() != call.args.len() {
        let threaded: Vec<String> = layout.slots().iter().map(|s| format!("{} {}", s.role, s.name)).collect();
        return Err(at.wrong(
            call.location,
            format!(
                "the call passes {} arguments but blob {} threads {} ({})",
                call.args.len(),
                call.blob,
                layout.len(),
                threaded.join(", ")
            ),
        ));
    }
    Ok(layout)
}

/// The plugin serving the call's backend, once it has said it can run the blob (its header-only answer,
/// before anything is allocated or initialised; an isolated plugin gives it in its worker, before its init).
fn serving_plugin(at: &CallAt<'_>, registry: &Registry, blob: &[u8]) -> Result<Served, Error> {
    let call = at.call;
    let plugin = registry.served(&call.backend).ok_or_else(|| Error::NoPlugin {
        manifest: at.manifest.path.clone(),
        location: call.location,
        backend: call.backend.clone(),
        available: match registry.backends() {
            backends if backends.is_empty() => "none".to_owned(),
            backends => backends.join(", "),
        },
        unavailable: registry
            .unavailable_for(&call.backend)
            .map(|(name, reason)| format!("; plugin {name} offers it but is unavailable: {reason}"))
            .chain(registry.without_manifest().map(|library| {
                format!(
                    "; library {} has no manifest, so this host never opens it and does not know whether it \
                     serves '{}' (write one with `delegate-host plugin-manifest {}`)",
                    library.display(),
                    call.backend,
                    library.display()
                )
            }))
            .collect(),
    })?;
    match isolated::compatibility(&plugin, blob) {
        Ok(Compatibility::Supported) => Ok(plugin),
        Ok(Compatibility::RebuildRecommended { reason }) => {
            tracing::warn!(blob = %call.blob, plugin = %plugin.info().name, "rebuild recommended: {reason}");
            Ok(plugin)
        }
        Ok(Compatibility::Unsupported { reason }) => Err(Error::Incompatible {
            blob: Box::new(call.blob.clone()),
            plugin: plugin.info().name.clone(),
            reason,
        }),
        Err(source) => Err(Error::Delegate {
            method: at.method.name.clone(),
            call: at.index,
            backend: call.backend.clone(),
            stage: "compatibility",
            source,
        }),
    }
}

/// The arguments planned so far: what binding the next one must not repeat.
struct Planned {
    args: Vec<ArgPlan>,
    /// The buffer each copy-back scratch slot mirrors, by scratch index.
    scratch_of: Vec<usize>,
    /// (buffer, argument position) of the buffers bound to inputs.
    input_buffers: Vec<(usize, usize)>,
}

/// Plans every argument: what it binds (by role) and whether the bound tensor fits the blob and the plugin.
fn plan_arguments(
    at: &CallAt<'_>,
    blob: &Blob<'_>,
    layout: &ArgLayout,
    buffers: &[&TensorDecl],
    plugin: &Served,
    mode: Mode,
) -> Result<(Vec<ArgPlan>, Vec<usize>), Error> {
    let mut planned =
        Planned { args: Vec::with_capacity(layout.len()), scratch_of: Vec::new(), input_buffers: Vec::new() };
    for (pos, (slot, arg)) in layout.slots().iter().zip(&at.call.args).enumerate() {
        let location = at.call.arg_locations[pos];
        let binding = &blob.header.bindings[slot.binding];
        let arg_at = ArgAt { pos, slot, binding, layout };
        let in_place = plugin.info().binds_aliases_in_place;
        let (decl, source) = bind(at, &arg_at, arg, buffers, (mode, in_place), &planned)
            .map_err(|message| at.wrong(location, message))?;
        if let ArgSource::BufferRead(b) | ArgSource::BufferInOut(b) = source {
            planned.input_buffers.push((b, pos));
        }
        if let ArgSource::BufferScratch(_) = source {
            planned.scratch_of.push(buffer_index(buffers, &decl.name));
        }
        check_fits(&arg_at, decl, plugin).map_err(|message| at.wrong(location, message))?;
        if let Some(reason) = step_copy(source, decl, plugin.info()).filter(|_| mode.is_strict()) {
            return Err(not_zero_copy(at, &arg_at, decl, reason));
        }
        let dtype = DTypeCode::try_from(decl.dtype).map_err(|err| at.wrong(location, err.to_string()))?;
        planned.args.push(ArgPlan { source, dtype, shape: decl.shape.iter().map(|&d| d as i64).collect() });
    }
    Ok((planned.args, planned.scratch_of))
}

/// One argument position of the call, with the blob's view of it.
struct ArgAt<'a> {
    pos: usize,
    slot: &'a ArgSlot,
    binding: &'a Binding,
    layout: &'a ArgLayout,
}

fn buffer_index(buffers: &[&TensorDecl], name: &str) -> usize {
    buffers.iter().position(|b| b.name == name).expect("manifest checked buffer names")
}

/// What argument `arg` binds and how it is filled, or why its role cannot take it.
fn bind<'m>(
    at: &CallAt<'m>,
    arg_at: &ArgAt<'_>,
    arg: &ArgRef,
    buffers: &[&'m TensorDecl],
    (mode, plugin_binds_in_place): (Mode, bool),
    planned: &Planned,
) -> Result<(&'m TensorDecl, ArgSource), String> {
    let (pos, binding) = (arg_at.pos, &arg_at.binding.name);
    let method = at.method;
    match (arg_at.slot.role, arg) {
        (Role::Input, ArgRef::Input(name)) => {
            let i = method.inputs.iter().position(|d| d.name == *name).expect("manifest checked input names");
            if arg_at.slot.is_alias_target() {
                return Err(format!(
                    "argument {pos} ('{binding}') is an aliased input: the delegate updates it in place, so it must be bound to a buffer, not to input '{name}'"
                ));
            }
            Ok((&method.inputs[i], ArgSource::Input(i)))
        }
        (Role::Output, ArgRef::Output(name)) => {
            let i =
                method.outputs.iter().position(|d| d.name == *name).expect("manifest checked output names");
            if planned.args.iter().any(|a| matches!(a.source, ArgSource::Output(o) if o == i)) {
                return Err(format!("output '{name}' is bound to more than one argument"));
            }
            Ok((&method.outputs[i], ArgSource::Output(i)))
        }
        (Role::Input, ArgRef::Buffer(name)) => {
            let b = buffer_index(buffers, name);
            if let Some(&(_, other)) = planned.input_buffers.iter().find(|(u, _)| *u == b) {
                return Err(format!("buffer '{name}' is bound to input arguments {other} and {pos}"));
            }
            let source = if arg_at.slot.is_alias_target() {
                ArgSource::BufferInOut(b)
            } else {
                ArgSource::BufferRead(b)
            };
            Ok((buffers[b], source))
        }
        (Role::Output, ArgRef::Buffer(name)) => {
            let b = buffer_index(buffers, name);
            let mode = slot_mode(mode, plugin_binds_in_place);
            bind_mutation_output(at, arg_at, (b, name), mode, planned).map(|source| (buffers[b], source))
        }
        (role, arg) => {
            Err(format!("argument {pos} binds engine {role} '{binding}', which cannot take '{arg}'"))
        }
    }
}

/// An output bound to buffer `name`: the buffer's mutation, which must alias the input bound to the same
/// buffer at an earlier argument (the in-place slot refers to that argument, so it is pushed first).
fn bind_mutation_output(
    at: &CallAt<'_>,
    arg_at: &ArgAt<'_>,
    (b, name): (usize, &str),
    mode: Mode,
    planned: &Planned,
) -> Result<ArgSource, String> {
    let (pos, binding) = (arg_at.pos, &arg_at.binding.name);
    let Some(input_arg) = arg_at.slot.in_place_of() else {
        return Err(format!(
            "argument {pos} ('{binding}') writes buffer '{name}', but the blob aliases no input to that output, so the buffer would not be updated in place"
        ));
    };
    let bound_there =
        input_arg < pos && matches!(&at.call.args[input_arg], ArgRef::Buffer(other) if other == name);
    if !bound_there {
        return Err(format!(
            "argument {pos} ('{binding}') is the mutation output of buffer '{name}', so its aliased input '{}' must be bound to buffer '{name}' at an earlier argument",
            arg_at.layout.slots()[input_arg].name
        ));
    }
    Ok(match mode {
        Mode::ZeroCopy | Mode::RequireZeroCopy => ArgSource::BufferInPlace(b),
        Mode::CopyBack => ArgSource::BufferScratch(planned.scratch_of.len()),
    })
}

/// How a mutation output slot is passed to a plugin: a plugin that does not bind aliased outputs in place
/// gets a separate output slot that the host writes back (copy-back), whatever the program's mode, since an
/// in-place slot would hand it one storage twice. Strict zero-copy then refuses the call ([`step_copy`]).
fn slot_mode(mode: Mode, plugin_binds_in_place: bool) -> Mode {
    if plugin_binds_in_place {
        mode
    } else {
        Mode::CopyBack
    }
}

/// Why an argument's cache bytes are copied on every step of a call.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CopyReason {
    /// The buffer lives in a memory kind the plugin does not update in place: it stages the buffer into its
    /// own memory (and back) each step.
    Staging {
        /// The buffer's memory kind.
        memory: MemoryKind,
        /// The plugin's name.
        plugin: String,
    },
    /// The plugin does not bind aliased outputs in place: it reflects the updated cache into a separate
    /// output slot, which the host writes back into the buffer.
    WriteBack {
        /// The plugin's name.
        plugin: String,
    },
    /// A `.pte` program's host copy (an `aten::copy_` or `aten::clone.out` no binding elides) reads or
    /// writes the buffer.
    HostCopy,
}

impl std::fmt::Display for CopyReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CopyReason::Staging { memory, plugin } => write!(
                f,
                "a staging copy, because plugin '{plugin}' does not update {memory} memory in place (put the buffer in memory it does)"
            ),
            CopyReason::WriteBack { plugin } => write!(
                f,
                "a reflect and a write-back, because plugin '{plugin}' does not bind aliased outputs in place"
            ),
            CopyReason::HostCopy => f.write_str(
                "a host copy of the program (a write-back no delegate output aliases away, or a clone)",
            ),
        }
    }
}

/// The one rule of whether an argument copies cache bytes on every step, and why: a buffer in memory the
/// plugin does not update in place is staged; a buffer's copy-back slot (the host's write-backs, counted in
/// [`super::CopyStats::writeback_bytes`], are exactly these slots) is reflected into and written back.
/// Method inputs and outputs are not cache bytes. [`Mode::RequireZeroCopy`] refuses any `Some`.
pub(super) fn step_copy(source: ArgSource, decl: &TensorDecl, info: &PluginInfo) -> Option<CopyReason> {
    let plugin = || info.name.clone();
    match source {
        ArgSource::Input(_) | ArgSource::Output(_) => None,
        ArgSource::BufferScratch(_) => Some(CopyReason::WriteBack { plugin: plugin() }),
        ArgSource::BufferRead(_) | ArgSource::BufferInOut(_) | ArgSource::BufferInPlace(_) => {
            let memory = decl.memory;
            (!info.updates_in_place(memory)).then(|| CopyReason::Staging { memory, plugin: plugin() })
        }
    }
}

/// Strict zero-copy's refusal of argument `arg_at` of the call, bound to `decl`.
fn not_zero_copy(at: &CallAt<'_>, arg_at: &ArgAt<'_>, decl: &TensorDecl, reason: CopyReason) -> Error {
    Error::NotZeroCopy {
        method: at.method.name.clone(),
        call: format!("call {} ({})", at.index, at.call.backend),
        argument: format!(
            "argument {} ('{}', bound to buffer '{}')",
            arg_at.pos, arg_at.binding.name, decl.name
        ),
        reason: Box::new(reason),
    }
}

fn shape_fits(declared: &[Dim], actual: &[u64]) -> bool {
    declared.len() == actual.len()
        && declared.iter().zip(actual).all(|(d, &a)| matches!(d, Dim::Dynamic) || *d == Dim::Static(a))
}

/// Whether the tensor bound to an argument has the dtype and shape the blob declares, in a memory kind the
/// plugin accepts.
fn check_fits(arg_at: &ArgAt<'_>, decl: &TensorDecl, plugin: &Served) -> Result<(), String> {
    let (pos, binding) = (arg_at.pos, arg_at.binding);
    let name = &binding.name;
    if let Some(dtype) = binding.dtype.filter(|&dtype| dtype != decl.dtype) {
        return Err(format!(
            "argument {pos} ('{name}') is {dtype} in the blob but '{}' is {}",
            decl.name, decl.dtype
        ));
    }
    if let Some(shape) = binding.shape.as_ref().filter(|shape| !shape_fits(shape, &decl.shape)) {
        return Err(format!(
            "argument {pos} ('{name}') has shape {} in the blob but '{}' has shape {:?}",
            DisplayShape(shape),
            decl.name,
            decl.shape
        ));
    }
    let memory = decl.memory;
    let accepted = &plugin.info().memory_kinds;
    if !accepted.contains(&memory) {
        let what = if *name == decl.name {
            format!("argument {pos} ('{name}')")
        } else {
            format!("argument {pos} ('{name}', bound to '{}')", decl.name)
        };
        return Err(format!(
            "{what} is in {memory} memory, but plugin '{}' does not accept {memory} memory (it accepts {})",
            plugin.info().name,
            accepted.iter().map(|m| m.name()).collect::<Vec<_>>().join(", ")
        ));
    }
    isolated::check_shared_memory(plugin, memory)
        .map_err(|why| format!("argument {pos} ('{name}') is in {memory} memory, but {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_dimension_fits_any_extent_and_ranks_must_match() {
        assert!(shape_fits(&[Dim::Dynamic, Dim::Static(4)], &[7, 4]));
        assert!(!shape_fits(&[Dim::Static(3)], &[4]));
        assert!(!shape_fits(&[Dim::Static(4)], &[4, 1]));
    }

    #[test]
    fn a_gpu_plugin_updates_device_and_managed_memory_in_place_and_a_cpu_plugin_host_pinned_and_managed() {
        use delegate_abi::testing::info;
        let cpu = info("cpu", "B").with_memory_kinds([MemoryKind::Host, MemoryKind::Managed]);
        let gpu = info("gpu", "B").with_memory_kinds([MemoryKind::Device, MemoryKind::Host]);
        let in_place = |info: &PluginInfo| {
            [MemoryKind::Host, MemoryKind::Pinned, MemoryKind::Managed, MemoryKind::Device]
                .map(|memory| info.updates_in_place(memory))
        };
        assert_eq!(in_place(&cpu), [true, true, true, false]);
        assert_eq!(in_place(&gpu), [false, false, true, true]);
        // What a plugin states wins over the inference.
        let stated = |kinds: Vec<MemoryKind>| {
            gpu.clone()
                .with_capabilities(delegate_abi::Capabilities::default().with_in_place_memory_kinds(kinds))
        };
        assert_eq!(in_place(&stated(vec![MemoryKind::Device])), [false, false, false, true]);
        assert_eq!(in_place(&stated(vec![])), [false; 4], "a plugin may state that it stages every kind");
    }
}
