//! What the host adds per `execute`: `Program::enqueue_id` of one call with 8 arguments (an input, 3 buffers
//! updated in place and their 3 in-place outputs, an output) into a delegate that does nothing, embedded, so
//! the figure is the host plus the ABI. Compare with `delegate-abi`'s `execute` bench (the ABI alone).
//!
//! `cargo bench -p host-runtime --bench execute`.

#[path = "../tests/support/wide.rs"]
mod wide;

use criterion::Criterion;
use delegate_abi::host::HostConfig;
use delegate_abi::testing::Scripted;
use host_runtime::manifest::Manifest;
use host_runtime::plugins::{Discovery, Registry};
use host_runtime::program::{Mode, Program};

delegate_abi::export_delegate!(@embedded Scripted<wide::Noop>);

fn main() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut criterion = Criterion::default().configure_from_args();
    let config = HostConfig::default();
    let registry = Registry::discover(Discovery::new()).with_embedded(delegate_root(), &config);
    for (caches, reads) in [(3, 0), (32, 32)] {
        let (path, args) = wide::write(dir.path(), caches, reads);
        let mut program = Program::load(Manifest::load(&path).expect("manifest"), &registry, Mode::ZeroCopy)
            .expect("loads");
        let step = program.method_id("step").expect("method");
        criterion.bench_function(&format!("host_execute_{args}_args"), |b| {
            b.iter(|| program.enqueue_id(step).expect("step"))
        });
    }
    criterion.final_summary();
}
