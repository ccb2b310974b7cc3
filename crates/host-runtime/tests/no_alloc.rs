//! A step allocates nothing on the host: `Program::execute` of a call with 98 arguments (64 buffers: 32
//! updated in place, 32 only read), whose argument list was built once at load.

#[path = "support/wide.rs"]
mod wide;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use delegate_abi::host::HostConfig;
use delegate_abi::testing::Scripted;
use host_runtime::manifest::Manifest;
use host_runtime::plugins::Registry;
use host_runtime::program::{Mode, Program};

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

struct Counting;

// SAFETY: forwards to `System`, only counting calls in a const-initialised thread-local (no allocation).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

delegate_abi::export_delegate!(@embedded Scripted<wide::Noop>);

#[test]
fn a_step_of_a_64_buffer_call_allocates_nothing_in_either_mode() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (path, args) = wide::write(dir.path(), 32, 32);
    assert_eq!(args, 98);
    let config = HostConfig::default();
    let registry = Registry::discover_with(&[], None, false, &config).with_embedded(delegate_root(), &config);
    for mode in [Mode::ZeroCopy, Mode::CopyBack] {
        let mut program =
            Program::load(Manifest::load(&path).expect("manifest"), &registry, mode).expect("loads");
        let step = program.method_id("step").expect("method");
        program.enqueue_id(step).expect("warm-up step");
        let before = ALLOCATIONS.with(Cell::get);
        for _ in 0..100 {
            program.enqueue_id(step).expect("step");
        }
        let allocated = ALLOCATIONS.with(Cell::get) - before;
        assert_eq!(allocated, 0, "{mode:?}: {allocated} allocations in 100 steps");
        // The input is still the caller's to fill between steps, through the same storage the list lends.
        program.input_mut("step", "x").expect("host input").fill(1);
        program.enqueue_id(step).expect("a step after the host wrote the input");
    }
}
