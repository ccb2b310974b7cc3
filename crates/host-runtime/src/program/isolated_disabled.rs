//! No plugin runs isolated on this target (worker processes are Linux only): the fallback of
//! `isolated.rs`, with the same functions, none of which ever meets an isolated call.

use std::sync::Arc;

use delegate_abi::host::Plugin;
use delegate_abi::{Compatibility, DelegateError, ExecStats, MemoryKind};

use super::attached::BlobBytes;
use super::plan::PlannedCall;
use super::{Buffer, Error, LoadedMethod};
use crate::buffer::{AllocError, Storage};
use crate::cuda::Contexts;
use crate::plugins::Served;

/// Never constructed: no call runs in a worker.
pub(super) enum Started {}

/// Never constructed: no call waits for a worker.
pub(super) enum Unstarted {}

impl Unstarted {
    pub(super) fn name(&self) -> &str {
        match *self {}
    }
}

pub(super) fn started_name(call: &Started) -> &str {
    match *call {}
}

pub(super) fn execute(call: &mut Started) -> Result<ExecStats, DelegateError> {
    match *call {}
}

pub(super) fn compatibility(plugin: &Served, blob: &[u8]) -> Result<Compatibility, DelegateError> {
    match plugin {
        Served::InProcess(plugin) => plugin.compatibility(blob),
        Served::Isolated(isolated) => match *isolated {},
    }
}

pub(super) fn streamed(plugin: &Served) -> bool {
    plugin.info().memory_kinds.contains(&MemoryKind::Device)
}

pub(super) fn check_shared_memory(_plugin: &Served, _memory: MemoryKind) -> Result<(), String> {
    Ok(())
}

pub(super) fn any_isolated<'a>(_calls: impl Iterator<Item = &'a PlannedCall>) -> bool {
    false
}

pub(super) fn zeroed(
    memory: MemoryKind,
    device: i32,
    len: usize,
    contexts: &mut Contexts,
    _shared: bool,
) -> Result<Storage, AllocError> {
    Storage::zeroed(memory, device, len, contexts)
}

pub(super) fn in_process(plugin: Served, blob: BlobBytes) -> Result<(Arc<Plugin>, BlobBytes), Unstarted> {
    match plugin {
        Served::InProcess(plugin) => Ok((plugin, blob)),
        Served::Isolated(isolated) => match isolated {},
    }
}

pub(super) fn start(_methods: &mut [LoadedMethod], _buffers: &[Buffer]) -> Result<(), Error> {
    Ok(())
}
