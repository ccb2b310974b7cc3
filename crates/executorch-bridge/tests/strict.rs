//! `--require-zero-copy` in ExecuTorch's runtime: a program with a cache write-back `copy_` (the planning pass
//! did not place the KV output on the buffer, or kept a self-copy), or whose plugin does not bind aliased
//! outputs in place, is refused before it runs, naming the method, the instruction, the buffer and the reason;
//! the same program runs without strict mode and copies the caches every step. A planned program runs under
//! strict mode copying nothing.

mod common;

use std::path::Path;

use delegate_abi::host::HostConfig;
use delegate_abi::testing::{self, Fixture, Scripted};
use delegate_abi::PluginInfo;
use et_error::{ErrorCode, HasErrorCode};
use executorch_bridge::runner::{self, Protocol, Report};
use executorch_bridge::BridgeError;
use host_runtime::plugins::{Discovery, Registry};

fn registry() -> Registry {
    Registry::discover(Discovery::new())
        .with_embedded(reference_delegate::delegate_root(), &HostConfig::default())
}

fn run(path: &Path, registry: &Registry, require_zero_copy: bool) -> Result<Report, BridgeError> {
    let protocol = Protocol { prompt: common::PROMPT.to_vec(), steps: common::STEPS, require_zero_copy };
    runner::run(path, registry, &protocol)
}

/// The programs of `dir`: (unplanned, planned), one method each, as ExecuTorch lays them out; the committed
/// fixtures are the same design (fixtures/executorch/README.md).
fn programs(dir: &Path) -> (common::Case, common::Case) {
    let mut cases = common::own_cases(dir).into_iter();
    let unplanned = cases.next().expect("buffers_1m");
    let planned = cases.next().expect("buffers_1m_planned");
    assert!(!unplanned.zero_copy && planned.zero_copy);
    (unplanned, planned)
}

#[test]
fn a_write_back_the_planning_pass_did_not_remove_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (unplanned, _) = programs(dir.path());
    let report = run(&unplanned.path, &registry(), false).expect("runs without strict mode");
    assert!(report.decode.iter().all(|s| s.write_back_bytes == unplanned.cache_bytes), "{:?}", report.decode);

    let err = run(&unplanned.path, &registry(), true).expect_err("refused");
    assert_eq!(err.error_code(), ErrorCode::NotSupported, "{err}");
    let BridgeError::NotZeroCopy { method, instruction, argument, reason } = &err else {
        panic!("not a strict refusal: {err:?}")
    };
    assert_eq!(method, "forward");
    assert!(instruction.ends_with("(aten::copy_)"), "{instruction}");
    assert!(argument.starts_with("buffer "), "{argument}");
    assert!(reason.contains("did not place that KV output on the buffer"), "{reason}");
}

#[test]
fn the_committed_unplanned_fixtures_are_refused_and_the_planned_ones_run() {
    let Some(cases) = common::fixture_cases() else { return };
    for case in cases {
        let result = run(&case.path, &registry(), true);
        match (case.zero_copy, result) {
            (true, Ok(report)) => assert_eq!(report.tokens, case.tokens, "{}", case.path.display()),
            (false, Err(BridgeError::NotZeroCopy { .. })) => {}
            (_, other) => panic!("{}: {other:?}", case.path.display()),
        }
    }
}

/// The reference backend's id, served by a plugin that does not bind aliased outputs in place; it is never
/// initialised: the program is refused before ExecuTorch loads it.
struct NotInPlace;
impl Fixture for NotInPlace {
    fn info() -> PluginInfo {
        testing::info("not-in-place", common::BACKEND).with_binds_aliases_in_place(false)
    }
}
delegate_abi::export_delegate!(@embedded Scripted<NotInPlace>);

#[test]
fn a_plugin_that_does_not_bind_aliases_in_place_is_refused_even_for_a_planned_program() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_, planned) = programs(dir.path());
    let registry =
        Registry::discover(Discovery::new()).with_embedded(delegate_root(), &HostConfig::default());
    let err = run(&planned.path, &registry, true).expect_err("refused");
    let BridgeError::NotZeroCopy { method, instruction, reason, .. } = &err else {
        panic!("not a strict refusal: {err:?}")
    };
    assert_eq!(method, "forward");
    assert!(instruction.contains("DelegateCall to ReferenceBackend"), "{instruction}");
    assert!(reason.contains("does not bind aliased outputs in place"), "{reason}");
    // Without strict mode such a plugin's run writes the caches back every step: tests/not_in_place.rs.
}

#[test]
fn a_planned_program_runs_under_strict_mode_copying_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_, planned) = programs(dir.path());
    let report = run(&planned.path, &registry(), true).expect("runs");
    assert_eq!(report.tokens, planned.tokens);
    assert!(report.decode.iter().all(|s| s.total() == 0 && s.write_back_calls == 0), "{:?}", report.decode);
}
