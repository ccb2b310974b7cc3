//! Everything about calls whose plugin runs isolated in a worker process (Linux only; other targets use
//! `isolated_disabled.rs`, where no plugin is ever isolated): where their memory lives, what they are told
//! at planning, and how their workers start once every argument list exists.

use std::sync::Arc;

use delegate_abi::host::Plugin;
use delegate_abi::{Compatibility, DelegateError, ExecStats, MemoryKind};

use super::attached::BlobBytes;
use super::plan::PlannedCall;
use super::{Buffer, CallInstance, Error, LoadedMethod};
use crate::buffer::{AllocError, HostStorage, Storage};
use crate::cuda::Contexts;
use crate::isolate::{IsolatedCall, IsolatedPlugin, Region};
use crate::plugins::Served;

/// A call's instance running in its worker process.
pub(super) type Started = Box<IsolatedCall>;

/// A call bound for a worker process that starts once the call's argument list exists (at the end of
/// loading, which leaves no call in this state): the plugin and the blob to give it.
pub(super) struct Unstarted {
    plugin: Box<IsolatedPlugin>,
    blob: BlobBytes,
}

impl Unstarted {
    pub(super) fn name(&self) -> &str {
        &self.plugin.info.name
    }
}

pub(super) fn started_name(call: &Started) -> &str {
    call.name()
}

pub(super) fn execute(call: &mut Started) -> Result<ExecStats, DelegateError> {
    call.execute()
}

/// The plugin's own compatibility answer; an isolated plugin gives it in its worker, before its init.
pub(super) fn compatibility(plugin: &Served, blob: &[u8]) -> Result<Compatibility, DelegateError> {
    match plugin {
        Served::InProcess(plugin) => plugin.compatibility(blob),
        Served::Isolated(_) => Ok(Compatibility::Supported),
    }
}

/// Whether the plugin gets the program's stream: it runs here and accepts device memory. A worker
/// synchronises its own stream before it answers.
pub(super) fn streamed(plugin: &Served) -> bool {
    match plugin {
        Served::InProcess(plugin) => plugin.info().memory_kinds.contains(&MemoryKind::Device),
        Served::Isolated(_) => false,
    }
}

/// Refuses memory a worker cannot map: it shares host memory (memory files) and device memory (CUDA IPC)
/// only.
pub(super) fn check_shared_memory(plugin: &Served, memory: MemoryKind) -> Result<(), String> {
    if matches!(plugin, Served::Isolated(_)) && !matches!(memory, MemoryKind::Host | MemoryKind::Device) {
        return Err(format!(
            "plugin '{}' runs isolated in a worker process, which shares host and device memory only",
            plugin.info().name
        ));
    }
    Ok(())
}

/// Whether any planned call runs isolated: then the program's host memory lives in memory files, which a
/// worker process reads and writes in place.
pub(super) fn any_isolated<'a>(mut calls: impl Iterator<Item = &'a PlannedCall>) -> bool {
    calls.any(|call| matches!(call.plugin, Served::Isolated(_)))
}

/// Storage for a tensor; host memory in a shared memory file when `shared` (a program with isolated calls).
pub(super) fn zeroed(
    memory: MemoryKind,
    device: i32,
    len: usize,
    contexts: &mut Contexts,
    shared: bool,
) -> Result<Storage, AllocError> {
    match (memory, shared) {
        (MemoryKind::Host, true) => Ok(Storage::Host(HostStorage::shared(len)?)),
        _ => Storage::zeroed(memory, device, len, contexts),
    }
}

/// The plugin of a call that runs here, or the call bound for a worker.
pub(super) fn in_process(plugin: Served, blob: BlobBytes) -> Result<(Arc<Plugin>, BlobBytes), Unstarted> {
    match plugin {
        Served::InProcess(plugin) => Ok((plugin, blob)),
        Served::Isolated(plugin) => Err(Unstarted { plugin: Box::new(plugin), blob }),
    }
}

/// Starts the worker of every isolated call, now that its argument list exists: the worker gets the list's
/// memory files and rebuilds the list over them.
pub(super) fn start(methods: &mut [LoadedMethod], buffers: &[Buffer]) -> Result<(), Error> {
    let regions = shared_regions(methods, buffers)?;
    for m in methods {
        for (index, call) in m.calls.iter_mut().enumerate() {
            let CallInstance::Unstarted(unstarted) = &call.instance else { continue };
            let started = IsolatedCall::start(
                (*unstarted.plugin).clone(),
                unstarted.blob.bytes(),
                &call.arg_list,
                &regions,
            );
            call.instance = CallInstance::Isolated(Box::new(started.map_err(|source| Error::Delegate {
                method: m.decl.name.clone(),
                call: index,
                backend: call.backend.clone(),
                stage: "init",
                source,
            })?));
        }
    }
    Ok(())
}

/// The memory files and device allocations of every storage a worker may be lent.
fn shared_regions(methods: &[LoadedMethod], buffers: &[Buffer]) -> Result<Vec<Region>, Error> {
    let storages = buffers.iter().map(|b| &b.storage).chain(methods.iter().flat_map(|m| {
        m.inputs.iter().chain(&m.outputs).chain(m.calls.iter().flat_map(|c| c.scratch.iter()))
    }));
    storages.filter_map(Region::of).map(|region| region.map_err(|reason| Error::Share { reason })).collect()
}
