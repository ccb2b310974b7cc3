//! ABI overhead of one `execute` with 8 tensor args into a delegate that does nothing: a direct in-process
//! trait call vs the same call through the ABI tables (embedded, and the real `abi-test` dylib from disk).
//!
//! `cargo bench -p delegate-abi --bench execute`; prints the medians and their ratios at the end. The
//! dylib is `abi-test` built with `--release` into `target/plugin-tests`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;

use criterion::Criterion;
use delegate_abi::host::{ArgList, HostConfig, Instance, Plugin};
use delegate_abi::testing;
use delegate_abi::{
    Compatibility, DTypeCode, Delegate, DelegateError, ExecStats, ExecuteArgs, InitContext, MemoryKind,
    PluginInfo,
};

/// Does nothing, like `abi-test`'s default behaviour, in as little code as a delegate can be (so the direct
/// and embedded figures stay comparable with earlier runs).
pub struct NoOp;

impl Delegate for NoOp {
    type Handle = u64;
    fn new() -> Self {
        NoOp
    }
    fn info() -> PluginInfo {
        testing::info("noop", "NoOpBackend")
    }
    fn compatibility(&self, _blob: &[u8]) -> Compatibility {
        Compatibility::Supported
    }
    fn init(&self, _ctx: InitContext<'_>) -> Result<u64, DelegateError> {
        Ok(0)
    }
    #[inline(never)]
    fn execute(&self, handle: &mut u64, args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
        *handle += args.len() as u64;
        Ok(())
    }
}

delegate_abi::export_delegate!(@embedded NoOp);

const GROUP: &str = "execute_8_args";

/// 4 inputs, 2 inout caches, and their 2 in-place outputs.
fn build_args<'a>(inputs: &'a [Vec<u8>], caches: &'a mut [Vec<u8>]) -> ArgList<'a> {
    let mut args = ArgList::with_capacity(8);
    for input in inputs {
        args.push_input(input, DTypeCode::F32, &[1, 16], MemoryKind::Host).expect("input");
    }
    let mut slots = Vec::new();
    for cache in caches.iter_mut() {
        slots.push(args.push_inout(cache, DTypeCode::F32, &[1, 2, 16, 16], MemoryKind::Host).expect("cache"));
    }
    for slot in slots {
        args.push_output_in_place(slot, DTypeCode::F32, &[1, 2, 16, 16]).expect("alias");
    }
    assert_eq!(args.len(), 8);
    args
}

fn bench_through(c: &mut Criterion, name: &str, mut instance: Instance) {
    let inputs = vec![vec![0u8; 64]; 4];
    let mut caches = vec![vec![0u8; 2048]; 2];
    let mut args = build_args(&inputs, &mut caches);
    c.bench_function(&format!("{GROUP}/{name}"), |b| {
        b.iter(|| black_box(instance.execute(black_box(&mut args), None)).expect("noop"))
    });
}

fn benches(c: &mut Criterion) {
    // Direct in-process trait call over the same 8 TensorArgs.
    {
        let inputs = vec![vec![0u8; 64]; 4];
        let mut caches = vec![vec![0u8; 2048]; 2];
        let args = build_args(&inputs, &mut caches);
        let delegate = NoOp::new();
        let mut handle = 0u64;
        c.bench_function(&format!("{GROUP}/direct_trait_call"), |b| {
            b.iter(|| {
                let mut stats = ExecStats::default();
                // SAFETY: `args` was built by `ArgList`, which upholds `ExecuteArgs::new`'s contract, and
                // lives across the call.
                let mut exec = unsafe { ExecuteArgs::new(black_box(args.as_slice()), None, &mut stats) };
                black_box(black_box(&delegate).execute(&mut handle, &mut exec)).expect("noop");
                black_box(stats)
            })
        });
    }
    let ctx = InitContext { blob: b"", compile_specs: &[], runtime_specs: &[] };
    let embedded = Plugin::embedded(delegate_root()).expect("embedded");
    bench_through(c, "abi_embedded", embedded.init(&ctx).expect("init"));
    let dylib =
        Plugin::load(&common::abi_test_plugin_release(), &HostConfig::default()).expect("abi-test loads");
    bench_through(c, "abi_dylib", dylib.init(&ctx).expect("init"));

    // What a host pays per call in all: the 8 arguments pushed into a recycled list (as host-runtime does
    // every step), then the call through the dylib.
    let mut instance = dylib.init(&ctx).expect("init");
    let inputs = vec![vec![0u8; 64]; 4];
    let mut caches = vec![vec![0u8; 2048]; 2];
    let mut spare = ArgList::with_capacity(8);
    c.bench_function(&format!("{GROUP}/abi_dylib_with_arg_building"), |b| {
        b.iter(|| {
            let mut args = std::mem::take(&mut spare).recycle();
            for input in &inputs {
                args.push_input(input, DTypeCode::F32, &[1, 16], MemoryKind::Host).expect("input");
            }
            let (first, second) = caches.split_at_mut(1);
            let k =
                args.push_inout(&mut first[0], DTypeCode::F32, &[1, 2, 16, 16], MemoryKind::Host).expect("k");
            let v = args
                .push_inout(&mut second[0], DTypeCode::F32, &[1, 2, 16, 16], MemoryKind::Host)
                .expect("v");
            args.push_output_in_place(k, DTypeCode::F32, &[1, 2, 16, 16]).expect("k out");
            args.push_output_in_place(v, DTypeCode::F32, &[1, 2, 16, 16]).expect("v out");
            black_box(instance.execute(black_box(&mut args), None)).expect("noop");
            spare = args.recycle();
        })
    });
}

fn median_ns(name: &str) -> Option<f64> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    // Criterion stores `group/name` ids as `group_name`.
    let path = target.join("criterion").join(format!("{GROUP}_{name}")).join("new/estimates.json");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    json["median"]["point_estimate"].as_f64()
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c);
    c.final_summary();
    if let (Some(direct), Some(embedded), Some(dylib)) =
        (median_ns("direct_trait_call"), median_ns("abi_embedded"), median_ns("abi_dylib"))
    {
        println!("median per execute (8 args): direct trait call {direct:.1} ns, through the ABI embedded {embedded:.1} ns, dylib {dylib:.1} ns");
        println!("ratio ABI/direct: embedded {:.2}x, dylib {:.2}x; ABI overhead (dylib - direct) {:.1} ns (target < 1000 ns)",
            embedded / direct, dylib / direct, dylib - direct);
        if let Some(total) = median_ns("abi_dylib_with_arg_building") {
            println!(
                "host + ABI per call, arguments built each call: {total:.1} ns ({:.1} ns over a direct call)",
                total - direct
            );
        }
    }
}
