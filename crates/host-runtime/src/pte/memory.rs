//! Where a `.pte` program's buffers (its KV caches) and its methods' inputs and outputs live: in memory every
//! delegate call's plugin updates in place, so no call stages a cache per step. ExecuTorch plans them in host
//! memory; a program whose calls run on the GPU gets them in device memory instead (as kv-example's CUDA
//! programs declare them), which is also what the device loop and its CUDA graph need.

use program_manifest::{Manifest, MemoryKind};

use crate::plugins::Registry;

/// The buffers' memory: the first of host, device, managed that every call's plugin updates in place (host
/// when none is, or when a backend has no plugin: loading names that).
pub fn buffer_memory(manifest: &Manifest, registry: &Registry) -> MemoryKind {
    let infos: Vec<_> = manifest
        .methods
        .values()
        .flat_map(|m| m.calls.iter())
        .filter_map(|call| registry.served(&call.backend))
        .map(|served| served.info().clone())
        .collect();
    [MemoryKind::Host, MemoryKind::Device, MemoryKind::Managed]
        .into_iter()
        .find(|&kind| infos.iter().all(|info| info.updates_in_place(kind)))
        .unwrap_or(MemoryKind::Host)
}

/// Puts every buffer of `manifest`, and every input and output of its methods, in `memory`.
pub fn place(manifest: &mut Manifest, memory: MemoryKind) {
    let methods = manifest.methods.values_mut().flat_map(|m| m.inputs.iter_mut().chain(m.outputs.iter_mut()));
    for decl in manifest.buffers.values_mut().chain(methods) {
        decl.memory = memory;
    }
}
