//! What a host must know about a plugin before it runs anything: [`Capabilities`], part of
//! [`PluginInfo`](crate::PluginInfo).
//!
//! # Defaults
//!
//! These fields were appended to the ABI's `PluginInfoRecord` after release 0.1.0 (see
//! [`crate::abi::PluginInfoRecord`]); a plugin built before them does not state them, and the host reads
//! [`Capabilities::default`] for it. Each default is the answer that cannot make a host do something the
//! plugin does not support:
//!
//! | field | default | why it is safe |
//! |---|---|---|
//! | `in_place_memory_kinds` | `None` (not stated) | the host infers what it always did (managed memory; device memory for a plugin that accepts it, else host and pinned): the rule 0.1.0 hosts applied to these very plugins. `Some(vec![])` states "none". |
//! | `caller_stream` | `false` | the host may not count on work queued on its stream; it waits for the call to return. |
//! | `cuda_graph_capturable` | `false` | a CUDA-graph run is refused at load rather than captured and broken mid-run. |
//! | `device_positions` | `false` | the host writes each step's position where the plugin reads it on the host side. |
//! | `rewind_fork_without_reinit` | `false` | any instance may keep sequence state of its own: a host that cannot ask the instance refuses to rewind, restore or fork its sequence. |
//! | `max_positions` | `0` (no limit stated) | the plugin checks positions itself at `init`/`execute`, as it did before. |
//!
//! # Per instance: `Delegate::keeps_sequence_state`
//!
//! `rewind_fork_without_reinit` is a statement about every instance. Whether one instance keeps sequence
//! state of its own may depend on its blob (the reference delegate keeps a graph's delegate-owned `state`
//! itself, and nothing for a graph without), so a host asks each instance
//! ([`Delegate::keeps_sequence_state`](crate::Delegate::keeps_sequence_state), the table entry
//! `keeps_sequence_state` appended after release 0.1.0) and that answer decides. The plugin-level statement
//! answers where the instance cannot be asked (a plugin built before the entry) and is the method's default.
//! A plugin whose instances differ states `false` and answers per instance.
//!
//! Build one from the defaults with the `with_*` methods (`Capabilities::default().with_caller_stream(true)`):
//! the struct is `#[non_exhaustive]`, so a field added later does not break your plugin.

use crate::tensor::MemoryKind;

/// What a plugin can do, stated before any `init`. See the [module docs](self) for each default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Memory kinds whose cache arguments it reads and writes where they are (no staging copy per call);
    /// `None`: not stated (the host infers, see the module docs).
    pub in_place_memory_kinds: Option<Vec<MemoryKind>>,
    /// Whether it queues its work on the caller's CUDA stream (`ExecuteArgs::stream`) instead of completing
    /// it before `execute` returns.
    pub caller_stream: bool,
    /// Whether its `execute` on the caller's stream can be captured into a CUDA graph and replayed: no host
    /// synchronisation, no synchronous copy, no host-side value baked in per call.
    pub cuda_graph_capturable: bool,
    /// Whether it reads the position input from device memory when it is there (on the stream), so a replayed
    /// graph sees each step's position.
    pub device_positions: bool,
    /// Whether every initialised instance serves any position in any order (all its sequence state is in the
    /// caller's caches), so a rewind, a restored cache or a fork needs no new `init`. An instance's own
    /// answer ([`Delegate::keeps_sequence_state`](crate::Delegate::keeps_sequence_state)) decides where a
    /// host can ask it: see the [module docs](self).
    pub rewind_fork_without_reinit: bool,
    /// The most positions (cache rows) it supports; `0`: no limit stated.
    pub max_positions: u64,
}

impl Capabilities {
    /// The stated capabilities as short words for a listing, e.g. `["caller-stream", "cuda-graph",
    /// "device-positions", "in-place: device,managed", "max-positions 8192"]`; empty for the defaults.
    pub fn words(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (on, word) in [
            (self.caller_stream, "caller-stream"),
            (self.cuda_graph_capturable, "cuda-graph"),
            (self.device_positions, "device-positions"),
            (self.rewind_fork_without_reinit, "rewind-fork"),
        ] {
            if on {
                out.push(word.to_owned());
            }
        }
        if let Some(kinds) = &self.in_place_memory_kinds {
            let names: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
            out.push(format!("in-place: {}", if names.is_empty() { "none".into() } else { names.join(",") }));
        }
        if self.max_positions > 0 {
            out.push(format!("max-positions {}", self.max_positions));
        }
        out
    }
}

impl crate::PluginInfo {
    /// Whether this plugin updates `memory` in place (no staging copy per call): what it states
    /// ([`Capabilities::in_place_memory_kinds`]); when it states nothing (a plugin built before capabilities),
    /// what hosts have always inferred: managed memory always, device memory for a plugin that accepts it,
    /// host and pinned memory otherwise. The one rule every host applies.
    pub fn updates_in_place(&self, memory: MemoryKind) -> bool {
        if let Some(kinds) = &self.capabilities.in_place_memory_kinds {
            return kinds.contains(&memory);
        }
        let gpu = self.memory_kinds.contains(&MemoryKind::Device);
        match memory {
            MemoryKind::Managed => true,
            MemoryKind::Device => gpu,
            MemoryKind::Host | MemoryKind::Pinned => !gpu,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_state_nothing_and_list_as_no_words() {
        let none = Capabilities::default();
        assert_eq!(none.in_place_memory_kinds, None);
        assert!(!none.caller_stream && !none.cuda_graph_capturable && !none.device_positions);
        assert!(!none.rewind_fork_without_reinit);
        assert_eq!(none.max_positions, 0);
        assert!(none.words().is_empty());
        let cuda = Capabilities {
            in_place_memory_kinds: Some(vec![MemoryKind::Device, MemoryKind::Managed]),
            caller_stream: true,
            cuda_graph_capturable: true,
            max_positions: 8,
            ..Capabilities::default()
        };
        assert_eq!(
            cuda.words(),
            ["caller-stream", "cuda-graph", "in-place: device,managed", "max-positions 8"]
        );
        let stages_all = Capabilities { in_place_memory_kinds: Some(vec![]), ..Capabilities::default() };
        assert_eq!(stages_all.words(), ["in-place: none"]);
    }
}
