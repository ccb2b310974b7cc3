//! Whether an instance keeps sequence state of its own crosses the ABI per instance
//! (`Delegate::keeps_sequence_state`, the appended table entry `keeps_sequence_state`): a delegate whose answer
//! depends on its blob answers per blob, and one that does not override it answers what its capabilities
//! state for every instance. (A table built before the entry: `release_0_1_0.rs`.)

use delegate_abi::host::{Plugin, SequenceState};
use delegate_abi::testing::{self, Fixture};
use delegate_abi::{
    Capabilities, Compatibility, Delegate, DelegateError, ErrorCode, ExecuteArgs, InitContext, PluginInfo,
};

/// Keeps sequence state of its own for a blob that says `state`, none otherwise, as the reference delegate
/// does for graphs with and without delegate-owned `state`.
pub struct PerBlob;

impl Delegate for PerBlob {
    type Handle = bool;

    fn new() -> Self {
        PerBlob
    }

    fn info() -> PluginInfo {
        testing::info("per-blob", "PerBlobBackend")
    }

    fn compatibility(&self, _blob: &[u8]) -> Compatibility {
        Compatibility::Supported
    }

    fn init(&self, ctx: InitContext<'_>) -> Result<bool, DelegateError> {
        Ok(ctx.blob == b"state")
    }

    fn execute(&self, _handle: &mut bool, _args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
        Ok(())
    }

    fn keeps_sequence_state(&self, handle: &bool) -> bool {
        *handle
    }
}

mod per_blob {
    delegate_abi::export_delegate!(@embedded super::PerBlob);
}

/// States nothing and does not override `keeps_sequence_state`.
pub struct Unstated;
impl Fixture for Unstated {
    fn info() -> PluginInfo {
        testing::info("unstated", "UnstatedBackend")
    }
}

mod unstated {
    delegate_abi::export_delegate!(@embedded delegate_abi::testing::Scripted<super::Unstated>);
}

/// States `rewind_fork_without_reinit` and does not override `keeps_sequence_state`.
pub struct Stated;
impl Fixture for Stated {
    fn info() -> PluginInfo {
        let capabilities = Capabilities::default().with_rewind_fork_without_reinit(true);
        testing::info("stated", "StatedBackend").with_capabilities(capabilities)
    }
}

mod stated {
    delegate_abi::export_delegate!(@embedded delegate_abi::testing::Scripted<super::Stated>);
}

fn state_of(plugin: &Plugin, blob: &[u8]) -> Result<SequenceState, DelegateError> {
    let instance =
        plugin.init(&InitContext { blob, compile_specs: &[], runtime_specs: &[] }).expect("initialises");
    instance.sequence_state()
}

#[test]
fn each_instance_answers_for_its_own_blob() {
    let plugin = Plugin::embedded(per_blob::delegate_root()).expect("embedded");
    assert!(!plugin.info().capabilities.rewind_fork_without_reinit, "not for every instance");
    let keeps = SequenceState { keeps_own: true, per_instance: true };
    assert_eq!(state_of(&plugin, b"state").expect("answers"), keeps);
    let keeps_none = SequenceState { keeps_own: false, per_instance: true };
    assert_eq!(state_of(&plugin, b"caches").expect("answers"), keeps_none);
}

#[test]
fn without_an_override_the_stated_capability_answers_for_every_instance() {
    let unstated = Plugin::embedded(unstated::delegate_root()).expect("embedded");
    let answer = state_of(&unstated, b"any").expect("answers");
    assert_eq!(answer, SequenceState { keeps_own: true, per_instance: true }, "it may keep state");
    let stated = Plugin::embedded(stated::delegate_root()).expect("embedded");
    let answer = state_of(&stated, b"any").expect("answers");
    assert_eq!(answer, SequenceState { keeps_own: false, per_instance: true });
}

/// A delegate that panics when asked, poisoning its plugin.
pub struct Panicky;
impl Delegate for Panicky {
    type Handle = ();
    fn new() -> Self {
        Panicky
    }
    fn info() -> PluginInfo {
        testing::info("panicky", "PanickyBackend")
    }
    fn compatibility(&self, _blob: &[u8]) -> Compatibility {
        Compatibility::Supported
    }
    fn init(&self, _ctx: InitContext<'_>) -> Result<(), DelegateError> {
        Ok(())
    }
    fn execute(&self, _handle: &mut (), _args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
        Ok(())
    }
    fn keeps_sequence_state(&self, _handle: &()) -> bool {
        panic!("panicky: asked")
    }
}

mod panicky {
    delegate_abi::export_delegate!(@embedded super::Panicky);
}

#[test]
fn a_panic_while_answering_is_an_error_and_poisons_the_plugin() {
    let plugin = Plugin::embedded(panicky::delegate_root()).expect("embedded");
    let err = state_of(&plugin, b"").expect_err("a panic is no answer");
    assert_eq!(err.code, ErrorCode::Internal);
    assert_eq!(err.message, "plugin panicky panic in keeps_sequence_state: panicky: asked");
    assert_eq!(plugin.poisoned().as_deref(), Some("panic in keeps_sequence_state: panicky: asked"));
}
