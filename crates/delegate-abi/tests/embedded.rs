//! In-process plugins (the embedded path) through the same tables: negotiation with both sides' ranges,
//! argument checks and the checked borrows a delegate sees.

use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::std_types::{RSlice, RStr};
use delegate_abi::abi::{negotiate, AbiRange, HostOffer, VersionMismatch};
use delegate_abi::host::{ArgError, ArgList, HostConfig, LoadError, Plugin};
use delegate_abi::testing::{self, Fixture};
use delegate_abi::{
    CodeKind, Compatibility, DTypeCode, Delegate, DelegateError, ErrorCode, ExecuteArgs, InitContext,
    MemoryKind, PluginInfo, TensorArg, UnknownCode,
};

/// Records what `borrow` answers for a configured request.
pub struct Probe;

/// Which borrow `Probe::execute` tries.
pub struct ProbeHandle {
    reads: Vec<usize>,
    write: usize,
}

/// The metadata every delegate of this file starts from.
fn probe_info() -> PluginInfo {
    let mut info = testing::info("probe", "ProbeBackend");
    info.version = "1.2.3".into();
    info
}

impl Delegate for Probe {
    type Handle = ProbeHandle;

    fn new() -> Self {
        Probe
    }

    fn info() -> PluginInfo {
        probe_info()
    }

    fn compatibility(&self, _blob: &[u8]) -> Compatibility {
        Compatibility::Supported
    }

    fn init(&self, ctx: InitContext<'_>) -> Result<ProbeHandle, DelegateError> {
        // blob = [write, reads...]
        let (&write, reads) =
            ctx.blob.split_first().ok_or_else(|| DelegateError::invalid_program("empty"))?;
        Ok(ProbeHandle { reads: reads.iter().map(|&r| usize::from(r)).collect(), write: usize::from(write) })
    }

    fn execute(&self, handle: &mut ProbeHandle, args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
        if args.stream().is_some() {
            args.record_staging(1);
        }
        match handle.reads.as_slice() {
            [] => {
                let ([], [w]) = args.borrow([], [handle.write])?;
                w.fill(1);
            }
            [r] => {
                let ([_], [w]) = args.borrow([*r], [handle.write])?;
                w.fill(2);
            }
            _ => return Err(DelegateError::invalid_argument("probe takes at most one read")),
        }
        Ok(())
    }
}

mod current {
    delegate_abi::export_delegate!(@embedded super::Probe);
}

/// Same delegate announcing other ABI ranges (a "newer" plugin).
pub struct NewerProbe;
impl Fixture for NewerProbe {
    fn info() -> PluginInfo {
        let mut info = probe_info();
        info.name = "newer".into();
        info.backends = vec!["B".into()];
        info
    }
}

mod speaks_1_to_2 {
    delegate_abi::export_delegate!(@embedded delegate_abi::testing::Scripted<super::NewerProbe>, abi = 1..=2);

    /// What the plugin side recorded in the latest handshake.
    pub fn negotiated_version() -> Option<u32> {
        use delegate_abi::__private::Exported;
        __DelegateAbiPlugin::state().negotiated_version()
    }
}

/// Speaks only ABI 2 and 3.
pub struct FuturePlugin;
impl Fixture for FuturePlugin {
    fn info() -> PluginInfo {
        NewerProbe::info()
    }
}

mod speaks_2_to_3 {
    delegate_abi::export_delegate!(@embedded delegate_abi::testing::Scripted<super::FuturePlugin>, abi = 2..=3);
}

/// Names no backend.
pub struct Nameless;
impl Fixture for Nameless {
    fn info() -> PluginInfo {
        let mut info = probe_info();
        info.backends.clear();
        info
    }
}

mod nameless {
    delegate_abi::export_delegate!(@embedded delegate_abi::testing::Scripted<super::Nameless>);
}

#[test]
fn negotiation_rule_covers_both_directions() {
    // (host, plugin, expected)
    let cases = [
        ((1, 1), (1, 1), Ok(1)),
        ((1, 2), (1, 1), Ok(1)), // new host, old plugin
        ((1, 1), (1, 2), Ok(1)), // old host, new plugin
        ((1, 3), (2, 5), Ok(3)),
        ((2, 3), (1, 1), Err(())), // host dropped 1
        ((1, 1), (2, 3), Err(())), // plugin dropped 1
        ((2, 1), (1, 2), Err(())), // inverted host range
    ];
    for ((hmin, hmax), (pmin, pmax), expected) in cases {
        let (host, plugin) = (AbiRange::new(hmin, hmax), AbiRange::new(pmin, pmax));
        let got = negotiate(host, plugin);
        match expected {
            Ok(v) => assert_eq!(got, Ok(v), "host {host} plugin {plugin}"),
            Err(()) => assert_eq!(got, Err(VersionMismatch { plugin, host }), "host {host} plugin {plugin}"),
        }
    }
}

#[test]
fn embedded_old_host_new_plugin_and_new_host_old_plugin() {
    let old_host = HostConfig::default().with_abi_range(AbiRange::new(1, 1));
    let new_host = HostConfig::default().with_abi_range(AbiRange::new(1, 2));

    let p = Plugin::embedded_with(speaks_1_to_2::delegate_root(), &old_host).expect("old host, new plugin");
    assert_eq!((p.abi_version(), p.abi_range()), (1, AbiRange::new(1, 2)));
    let p = Plugin::embedded_with(speaks_1_to_2::delegate_root(), &new_host).expect("new host, new plugin");
    assert_eq!(p.abi_version(), 2);
    // The plugin side recorded the same answer.
    assert_eq!(speaks_1_to_2::negotiated_version(), Some(2));
    let p = Plugin::embedded_with(current::delegate_root(), &new_host).expect("new host, old plugin");
    assert_eq!(p.abi_version(), 1);

    let err = Plugin::embedded_with(speaks_2_to_3::delegate_root(), &old_host).expect_err("disjoint");
    assert!(matches!(err, LoadError::AbiVersionDisjoint { path: None, .. }), "{err:?}");
    assert_eq!(err.to_string(), "plugin speaks ABI 2..=3, host 1..=1");
    assert_eq!(err.path(), None);
}

#[test]
fn metadata_without_a_backend_is_rejected() {
    let err = Plugin::embedded(nameless::delegate_root()).expect_err("no backend");
    assert_eq!(
        err.to_string(),
        "plugin metadata is invalid: plugin probe names no backend id, or an empty one"
    );
}

fn probe(blob: &[u8]) -> delegate_abi::host::Instance {
    let plugin = Plugin::embedded(current::delegate_root()).expect("embedded");
    assert_eq!(plugin.info().version, "1.2.3");
    assert_eq!(plugin.path(), None);
    plugin.init(&InitContext { blob, compile_specs: &[], runtime_specs: &[] }).expect("init")
}

#[test]
fn execute_args_borrow_refuses_an_inout_and_its_in_place_output_at_once() {
    let mut cache = [0u8; 8];
    let mut args = ArgList::new();
    let slot = args.push_inout(&mut cache, DTypeCode::I32, &[2], MemoryKind::Host).expect("inout");
    args.push_output_in_place(slot, DTypeCode::I32, &[2]).expect("aliased");
    assert!(args.as_slice()[0].same_storage(&args.as_slice()[1]));
    assert!(args.as_slice()[0].is_inout() && !args.as_slice()[1].is_inout());

    // Read the inout while writing its alias: refused.
    let err = probe(&[1, 0]).execute(&mut args, None).expect_err("overlap refused");
    assert_eq!(err.code, ErrorCode::InvalidArgument);
    assert_eq!(err.message, "argument 1 is written while argument 0 shares its storage");
    // Writing the alias alone is fine, and lands in the caller's cache.
    probe(&[1]).execute(&mut args, None).expect("alone");
    drop(args);
    assert_eq!(cache, [1u8; 8]);
}

#[test]
fn execute_args_borrow_refuses_writing_an_input_and_out_of_range() {
    let input = [0u8; 4];
    let mut out = [0u8; 4];
    let mut args = ArgList::new();
    args.push_input(&input, DTypeCode::U8, &[4], MemoryKind::Host).expect("input");
    args.push_output(&mut out, DTypeCode::U8, &[4], MemoryKind::Host).expect("output");
    let err = probe(&[0]).execute(&mut args, None).expect_err("input is read-only");
    assert_eq!(err.message, "argument 0 is read-only");
    let err = probe(&[9]).execute(&mut args, None).expect_err("out of range");
    assert_eq!(err.message, "argument 9 requested but the call has 2 arguments");
    // SAFETY: the probe only asks whether a stream is present and never hands it to CUDA, so this dangling
    // handle is never used.
    let stream = unsafe { delegate_abi::CudaStream::from_raw(8 as *mut _) };
    assert!(stream.is_some());
    // SAFETY: null is "no stream"; nothing is wrapped.
    assert!(unsafe { delegate_abi::CudaStream::from_raw(std::ptr::null_mut()) }.is_none());
    let stats = probe(&[1, 0]).execute(&mut args, stream).expect("ok");
    assert_eq!(stats.staged_bytes, 1, "the stream and the stats cross");
    drop(args);
    assert_eq!(out, [2u8; 4]);
}

#[test]
fn arg_list_refuses_mismatches() {
    let data = [0u8; 12];
    let mut mutable = [0u8; 12];
    let mut other_cache = [0u8; 12];
    let mut args = ArgList::new();
    assert_eq!(
        args.push_input(&data, DTypeCode::F32, &[4], MemoryKind::Host),
        Err(ArgError::SizeMismatch {
            index: 0,
            dtype: DTypeCode::F32,
            shape: vec![4],
            expected: 16,
            found: 12
        })
    );
    assert_eq!(
        args.push_input(&data, DTypeCode::F32, &[4], MemoryKind::Host).expect_err("size").to_string(),
        "argument 0: f32[4] needs 16 bytes, the buffer has 12"
    );
    assert_eq!(
        args.push_input(&data, DTypeCode::U8, &[1; 9], MemoryKind::Host),
        Err(ArgError::RankTooLarge { index: 0, rank: 9 })
    );
    assert_eq!(
        args.push_input(&data, DTypeCode::U8, &[-3, -4], MemoryKind::Host),
        Err(ArgError::BadShape { index: 0, shape: vec![-3, -4] })
    );
    assert_eq!(
        args.push_input(&data, DTypeCode::U8, &[12], MemoryKind::Device),
        Err(ArgError::NotHostVisible { index: 0, memory: MemoryKind::Device })
    );
    assert!(args.is_empty(), "refused args are not pushed");

    args.push_input(&data, DTypeCode::F32, &[3], MemoryKind::Host).expect("input");
    let mut raw = args.as_slice()[0];
    raw.flags = 0;
    // SAFETY: a read-only view of `data`, which outlives the list.
    let input = unsafe { args.push_raw(raw) }.expect("raw input");
    assert!(matches!(
        args.push_output_in_place(input, DTypeCode::F32, &[3]),
        Err(ArgError::BadSlot { why: "it was not pushed with push_inout", .. })
    ));
    let cache = args.push_inout(&mut mutable, DTypeCode::F32, &[3], MemoryKind::Pinned).expect("inout");
    assert!(matches!(
        args.push_output_in_place(cache, DTypeCode::F32, &[4]),
        Err(ArgError::SizeMismatch { expected: 16, found: 12, .. })
    ));
    // Same bytes, other view: allowed; it keeps the inout's memory kind.
    args.push_output_in_place(cache, DTypeCode::U8, &[12]).expect("same bytes");
    assert_eq!(args.as_slice()[3].memory(), MemoryKind::Pinned);

    let mut other = ArgList::new();
    other.push_inout(&mut other_cache, DTypeCode::F32, &[3], MemoryKind::Host).expect("inout");
    assert!(matches!(
        other.push_output_in_place(cache, DTypeCode::F32, &[3]),
        Err(ArgError::BadSlot { why: "it belongs to another list", .. })
    ));

    let capacity_before = args.as_slice().len();
    args.clear();
    assert!(args.is_empty());
    assert!(matches!(
        args.push_output_in_place(cache, DTypeCode::F32, &[3]),
        Err(ArgError::BadSlot { why: "the list was cleared since", .. })
    ));
    assert_eq!(capacity_before, 4);
}

#[test]
fn push_raw_checks_rank_and_size_too() {
    let mut args = ArgList::new();
    let mut raw = TensorArg::describe(DTypeCode::F32, &[2, 2], MemoryKind::Device).expect("rank ok");
    raw.nbytes = 15;
    raw.data = 0x1000 as *mut _;
    // SAFETY: the arg is refused before anything could dereference it.
    let err = unsafe { args.push_raw(raw) }.expect_err("size");
    assert!(matches!(err, ArgError::SizeMismatch { expected: 16, found: 15, .. }), "{err:?}");
    raw.nbytes = 16;
    raw.device_id = 3;
    // SAFETY: the list is never executed, so the fake device pointer is never used.
    unsafe { args.push_raw(raw) }.expect("device arg");
    assert_eq!(args.as_slice()[0].device_id, 3);
    assert_eq!(args.as_slice()[0].memory(), MemoryKind::Device);
}

#[test]
fn delegate_error_messages_name_the_code() {
    let err = DelegateError::new(ErrorCode::InvalidArgument, "bad");
    assert_eq!(err.to_string(), "InvalidArgument: bad");
}

/// Reports a version that is not semver.
pub struct BadVersion;
impl Fixture for BadVersion {
    fn info() -> PluginInfo {
        let mut info = probe_info();
        info.version = "one".into();
        info
    }
}

mod bad_version {
    delegate_abi::export_delegate!(@embedded delegate_abi::testing::Scripted<super::BadVersion>);
}

#[test]
fn a_version_that_is_not_semver_is_rejected() {
    let err = Plugin::embedded(bad_version::delegate_root()).expect_err("bad version");
    assert!(matches!(err, LoadError::InvalidInfo { .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with("plugin metadata is invalid: plugin probe has version 'one', which is not semver"),
        "{err}"
    );
}

#[test]
fn versions_are_parsed_for_ordering() {
    let plugin = Plugin::embedded(current::delegate_root()).expect("embedded");
    assert_eq!(plugin.version(), &semver::Version::new(1, 2, 3));
}

extern "C" fn no_log(_level: u8, _target: RStr<'_>, _message: RStr<'_>) {}

extern "C" fn no_log_enabled(_level: u8, _target: RStr<'_>) -> bool {
    false
}

/// Overwrites the byte behind a one-byte wire code, as a host written in another language could.
fn forge<T>(code: &mut T, byte: u8) {
    assert_eq!(std::mem::size_of::<T>(), 1);
    // SAFETY: `T` is `RawDType` or `RawMemoryKind`, `#[repr(transparent)]` over a `u8` that may hold any byte;
    // `code` is a live exclusive borrow of it.
    unsafe { std::ptr::from_mut(code).cast::<u8>().write(byte) }
}

#[test]
fn a_foreign_host_sending_an_unknown_code_gets_invalid_argument_before_the_delegate_runs() {
    // Drive the raw tables as a host in another language would, without `host::ArgList`'s checks.
    let offer =
        HostOffer { abi: AbiRange::CURRENT, forward_logs: false, log: no_log, log_enabled: no_log_enabled }
            .leak_into_prefix();
    let negotiated = (current::delegate_root().negotiate())(offer).into_result().ok().expect("handshake");
    let module = negotiated.module;
    // Probe: write argument 1, read nothing.
    let handle = (module.init())(RSlice::from_slice(&[1]), RSlice::from_slice(&[]), RSlice::from_slice(&[]))
        .into_result()
        .expect("init");

    let input = [0u8; 4];
    let mut output = [0u8; 4];
    let mut list = ArgList::new();
    list.push_input(&input, DTypeCode::U8, &[4], MemoryKind::Host).expect("input");
    list.push_output(&mut output, DTypeCode::U8, &[4], MemoryKind::Host).expect("output");
    let good: Vec<TensorArg> = list.as_slice().to_vec();
    let call = |args: &[TensorArg]| {
        let mut stats = delegate_abi::ExecStats::default();
        // SAFETY: `handle` is live and used by no other call; every arg points into `input` / `output`, which
        // outlive the call, the output exclusively (its `ArgList` is not used meanwhile); no stream.
        unsafe { (module.execute())(handle, RSlice::from_slice(args), std::ptr::null_mut(), &mut stats) }
            .into_result()
            .map_err(delegate_abi::abi::RError::into_delegate)
    };

    let mut bad_dtype = good.clone();
    forge(&mut bad_dtype[1].dtype, 200);
    let err = call(&bad_dtype).expect_err("refused");
    assert_eq!(err.code, ErrorCode::InvalidArgument);
    assert_eq!(err.message, "argument 1: dtype code 200 is not one this build knows (0..=8)");

    let mut bad_memory = good.clone();
    forge(&mut bad_memory[0].memory, 9);
    let err = call(&bad_memory).expect_err("refused");
    assert_eq!(err.code, ErrorCode::InvalidArgument);
    assert_eq!(err.message, "argument 0: memory kind code 9 is not one this build knows (0..=3)");

    // The delegate never ran on the bad calls, and runs on the good one.
    call(&good).expect("the same args with known codes");
    drop(list);
    assert_eq!(output, [1u8; 4]);
    // SAFETY: `handle` came from this module's `init`, is destroyed once and not used afterwards.
    unsafe { (module.destroy())(handle) }.into_result().expect("destroyed");
}

#[test]
fn push_raw_refuses_unknown_codes_naming_the_position() {
    let data = [0u8; 4];
    let mut args = ArgList::new();
    args.push_input(&data, DTypeCode::U8, &[4], MemoryKind::Host).expect("input");
    let mut raw = args.as_slice()[0];
    forge(&mut raw.dtype, 42);
    // SAFETY: a read-only view of `data`, which outlives the list; it is refused anyway.
    let err = unsafe { args.push_raw(raw) }.expect_err("unknown dtype");
    assert_eq!(
        err,
        ArgError::UnknownCode { index: 1, code: UnknownCode { kind: CodeKind::DType, byte: 42 } }
    );
    assert_eq!(err.to_string(), "argument 1: dtype code 42 is not one this build knows (0..=8)");
    assert_eq!(args.len(), 1, "refused args are not pushed");
}

/// Reads argument 0 as `i64`s and writes their sum into argument 1 as `f32`.
pub struct Typed;
impl Fixture for Typed {
    fn info() -> PluginInfo {
        testing::info("typed", "TypedBackend")
    }

    fn execute(args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
        let sum: i64 = args.borrow_typed::<i64, 1, 0>([0], [])?.0[0].iter().sum();
        let ([], [out]) = args.borrow_typed::<f32, 0, 1>([], [1])?;
        out.fill(sum as f32);
        Ok(())
    }
}

mod typed {
    delegate_abi::export_delegate!(@embedded delegate_abi::testing::Scripted<super::Typed>);
}

#[test]
fn borrow_typed_checks_the_dtype_and_the_alignment() {
    let plugin = Plugin::embedded(typed::delegate_root()).expect("embedded");
    let mut instance =
        plugin.init(&InitContext { blob: b"", compile_specs: &[], runtime_specs: &[] }).expect("init");
    let numbers = [2i64, 5];
    let mut out = [0f32; 2];

    let mut args = ArgList::new();
    args.push_input(bytemuck::cast_slice::<_, u8>(&numbers), DTypeCode::I64, &[2], MemoryKind::Host)
        .expect("input");
    args.push_output(bytemuck::cast_slice_mut::<_, u8>(&mut out), DTypeCode::F32, &[2], MemoryKind::Host)
        .expect("output");
    instance.execute(&mut args, None).expect("typed");
    drop(args);
    assert_eq!(out, [7.0, 7.0]);

    // The same bytes announced as another dtype.
    let mut args = ArgList::new();
    args.push_input(bytemuck::cast_slice::<_, u8>(&numbers), DTypeCode::F64, &[2], MemoryKind::Host)
        .expect("input");
    args.push_output(bytemuck::cast_slice_mut::<_, u8>(&mut out), DTypeCode::F32, &[2], MemoryKind::Host)
        .expect("output");
    let err = instance.execute(&mut args, None).expect_err("dtype mismatch");
    assert_eq!(
        (err.code, err.message.as_str()),
        (ErrorCode::InvalidArgument, "argument 0 is f64, borrowed as i64")
    );
    drop(args);

    // An i64 argument one byte off its alignment.
    let backing = [0u64; 3];
    let misaligned = &bytemuck::cast_slice::<_, u8>(&backing)[1..17];
    let mut args = ArgList::new();
    args.push_input(misaligned, DTypeCode::I64, &[2], MemoryKind::Host).expect("input");
    args.push_output(bytemuck::cast_slice_mut::<_, u8>(&mut out), DTypeCode::F32, &[2], MemoryKind::Host)
        .expect("output");
    let err = instance.execute(&mut args, None).expect_err("misaligned");
    assert_eq!(err.code, ErrorCode::InvalidArgument);
    assert_eq!(err.message, "argument 0 is not 8-byte aligned, which i64 elements need");
}

/// A plugin's own typed error.
#[derive(Debug, thiserror::Error)]
#[error("the engine is out of tokens")]
struct EngineError;

impl et_error::HasErrorCode for EngineError {
    fn error_code(&self) -> ErrorCode {
        ErrorCode::OutOfResources
    }
}

fn engine_step() -> Result<(), EngineError> {
    Err(EngineError)
}

#[test]
fn question_mark_converts_a_plugins_own_error_keeping_its_code_and_message() {
    fn execute() -> Result<(), DelegateError> {
        engine_step()?;
        Ok(())
    }
    let err = execute().expect_err("fails");
    assert_eq!(err, DelegateError::new(ErrorCode::OutOfResources, "the engine is out of tokens"));
}
