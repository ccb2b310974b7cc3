//! A step allocates nothing on the host: `Program::execute` of a call with 98 arguments (64 buffers: 32
//! updated in place, 32 only read), whose argument list was built once at load.

#[path = "support/wide.rs"]
mod wide;

use delegate_abi::host::HostConfig;
use delegate_abi::testing::Scripted;
use host_runtime::manifest::Manifest;
use host_runtime::plugins::{Discovery, Registry};
use host_runtime::program::{Mode, Program};

#[global_allocator]
static GLOBAL: delegate_abi::testing::CountingAllocator = delegate_abi::testing::CountingAllocator;

delegate_abi::export_delegate!(@embedded Scripted<wide::Noop>);

#[test]
fn a_step_of_a_64_buffer_call_allocates_nothing_in_either_mode() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (path, args) = wide::write(dir.path(), 32, 32);
    assert_eq!(args, 98);
    let config = HostConfig::default();
    let registry = Registry::discover(Discovery::new()).with_embedded(delegate_root(), &config);
    for mode in [Mode::ZeroCopy, Mode::CopyBack] {
        let mut program =
            Program::load(Manifest::load(&path).expect("manifest"), &registry, mode).expect("loads");
        let step = program.method_id("step").expect("method");
        program.enqueue_id(step).expect("warm-up step");
        let probe = delegate_abi::testing::allocations();
        drop(std::hint::black_box(vec![0u8; 16]));
        assert!(delegate_abi::testing::allocations() > probe, "the counter sees this thread's allocations");
        let before = delegate_abi::testing::allocations();
        for _ in 0..100 {
            program.enqueue_id(step).expect("step");
        }
        let allocated = delegate_abi::testing::allocations() - before;
        assert_eq!(allocated, 0, "{mode:?}: {allocated} allocations in 100 steps");
        // The input is still the caller's to fill between steps, through the same storage the list lends.
        program.input_mut("step", "x").expect("host input").fill(1);
        program.enqueue_id(step).expect("a step after the host wrote the input");
    }
}
