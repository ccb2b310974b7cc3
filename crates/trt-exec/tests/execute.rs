//! The execute path's decisions that need no GPU: reusable call plans (no allocation per call), address
//! checks TensorRT's `setTensorAddress` contract demands, copy directions, profile bounds, and the runner's
//! argument views with their device check. The path itself (TensorRT-RTX `enqueueV3`) cannot run on any GPU
//! of this workplace; a missing CUDA driver's clean `NotSupported` is `cuda-rt`'s test.

use alias_validate::validate_with_engine;
use blob_format::model::{Alias, AliasKind, Binding, DType, Header, PayloadKind};
use et_error::MemoryKind;
use et_error::{ErrorCode, HasErrorCode};
use trt_exec::{
    check_profile, host_memory_engine_visible, tensor_bytes, Address, ArgView, BindingError, BindingPlan,
    Copy, EngineIo, IoArg, ReflectCopy, TENSOR_ALIGNMENT,
};

fn kv_single() -> EngineIo {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kv_single.json");
    EngineIo::from_json(&std::fs::read_to_string(path).expect("fixture")).expect("parses")
}

/// `k_cache, update, write_idx, k_cache_out, logits`, with `k_cache_out` aliasing `k_cache`.
fn kv_plan() -> (EngineIo, BindingPlan) {
    let io = kv_single();
    let order = ["k_cache", "update", "write_idx", "k_cache_out", "logits"];
    let header = Header::new(
        "TensorRTBackend",
        PayloadKind::TensorRtPlan,
        order
            .iter()
            .map(|n| Binding::untyped(*n, io.tensor(n).expect("fixture tensor").mode.into()))
            .collect(),
        vec![Alias { output: "k_cache_out".into(), input: "k_cache".into(), kind: AliasKind::KvCacheUpdate }],
    );
    let aliases = validate_with_engine(&header, &io).expect("validates");
    let plan = BindingPlan::new(&header, &io, &aliases).expect("plans");
    (io, plan)
}

/// Device views for every argument, the cache output sharing the cache's storage.
fn views<'a>(io: &EngineIo, plan: &BindingPlan, shapes: &'a [Vec<i64>]) -> Vec<ArgView<'a>> {
    plan.args()
        .iter()
        .zip(shapes)
        .enumerate()
        .map(|(i, (arg, shape))| {
            let t = io.tensor(&arg.tensor).expect("tensor");
            let nbytes = tensor_bytes(arg.dtype, &t.shape).expect("static");
            let address = if arg.tensor == "k_cache_out" { 0x10_0000 } else { 0x10_0000 * (i as u64 + 1) };
            ArgView { address, nbytes, residency: MemoryKind::Device, dtype: arg.dtype, shape }
        })
        .collect()
}

fn shapes(io: &EngineIo, plan: &BindingPlan) -> Vec<Vec<i64>> {
    plan.args().iter().map(|a| io.tensor(&a.tensor).expect("tensor").shape.clone()).collect()
}

#[test]
fn a_reused_call_plan_never_reallocates_and_matches_a_fresh_one() {
    let (io, plan) = kv_plan();
    let shapes = shapes(&io, &plan);
    let mut call = plan.new_call();
    let names: Vec<&str> = call.bindings.iter().map(|b| b.tensor.as_str()).collect();
    assert_eq!(names, ["k_cache", "update", "write_idx", "k_cache_out", "logits"]);
    let (bindings, before, after) = (call.bindings.as_ptr(), call.before.as_ptr(), call.after.as_ptr());

    // In place, all on device, caller stream: nothing to copy, nothing to wait for.
    let mut args = views(&io, &plan, &shapes);
    plan.prepare_into(&args, false, true, &mut call).expect("fits");
    assert_eq!(call, plan.prepare(&args, false, true).expect("fits"));
    assert!(!call.synchronize && call.before.is_empty() && call.after.is_empty());

    // Host update (staged), host logits (read back), separate cache output slot (reflected).
    args[1].residency = MemoryKind::Host;
    args[4].residency = MemoryKind::Host;
    args[3].address = 0x90_0000;
    plan.prepare_into(&args, false, true, &mut call).expect("fits");
    assert_eq!(call, plan.prepare(&args, false, true).expect("fits"));
    assert_eq!(call.before, [Copy::Stage { arg: 1, slot: 0, bytes: 64 }]);
    assert_eq!(
        call.after,
        [
            Copy::Reflect { from_arg: 0, to_arg: 3, bytes: 1024 },
            Copy::ReadBack { slot: 2, arg: 4, bytes: 64 }
        ]
    );
    assert_eq!(call.bindings[3].address, Address::Arg(0), "the engine still writes the caller's cache");
    assert!(call.synchronize);

    // A failing call leaves no stale copies behind for the next one.
    let mut bad = args.clone();
    bad[2].nbytes = 3;
    plan.prepare_into(&bad, false, true, &mut call).expect_err("size");
    assert!(call.before.is_empty() && call.after.is_empty());
    let args = views(&io, &plan, &shapes);
    plan.prepare_into(&args, false, true, &mut call).expect("fits");
    assert!(call.before.is_empty() && call.after.is_empty() && !call.synchronize);

    assert_eq!(
        (call.bindings.as_ptr(), call.before.as_ptr(), call.after.as_ptr()),
        (bindings, before, after),
        "prepare_into reuses the storage new_call made"
    );
}

#[test]
fn addresses_tensorrt_would_refuse_are_refused_before_anything_runs() {
    let (io, plan) = kv_plan();
    let shapes = shapes(&io, &plan);
    let mut args = views(&io, &plan, &shapes);
    args[1].address = 0x10_0040; // 64-byte aligned only
    let err = plan.prepare(&args, false, true).expect_err("misaligned");
    assert_eq!(
        err.to_string(),
        "argument 1 ('update') at 0x100040 is not 256-byte aligned, as TensorRT requires of bound tensors"
    );
    assert_eq!(err.error_code(), ErrorCode::InvalidArgument);
    assert_eq!(TENSOR_ALIGNMENT, 256);
    // A host input is staged into an aligned buffer: its own alignment does not matter.
    args[1].residency = MemoryKind::Host;
    assert!(plan.prepare(&args, false, true).is_ok());

    let mut args = views(&io, &plan, &shapes);
    args[4].address = 0;
    let err = plan.prepare(&args, false, true).expect_err("null");
    assert_eq!(err, BindingError::NullAddress { index: 4, name: "logits".into(), nbytes: 64 });
    assert_eq!(err.to_string(), "argument 4 ('logits') has 64 bytes at a null address");
}

#[test]
fn reflects_copy_device_to_device_or_into_host_slots() {
    assert_eq!(ReflectCopy::into_slot(MemoryKind::Device), ReflectCopy::DeviceToDevice);
    assert_eq!(ReflectCopy::into_slot(MemoryKind::Managed), ReflectCopy::DeviceToDevice);
    assert_eq!(ReflectCopy::into_slot(MemoryKind::Host), ReflectCopy::DeviceToHost);
    assert_eq!(ReflectCopy::into_slot(MemoryKind::Pinned), ReflectCopy::DeviceToHost);
}

#[test]
fn host_memory_is_bound_directly_only_with_coherent_pageable_access_on_an_integrated_gpu() {
    assert!(host_memory_engine_visible(true, true));
    assert!(!host_memory_engine_visible(true, false), "integrated without pageable access: stage");
    assert!(!host_memory_engine_visible(false, true), "discrete GPU with HMM: still stage, never bind host");
    assert!(!host_memory_engine_visible(false, false));
}

#[test]
fn dynamic_inputs_must_lie_within_the_optimisation_profile() {
    assert!(check_profile(0, "tokens", &[4], &[1], &[16]).is_ok());
    assert!(check_profile(0, "tokens", &[1], &[1], &[16]).is_ok());
    assert!(check_profile(0, "tokens", &[16], &[1], &[16]).is_ok());
    let err = check_profile(0, "tokens", &[17], &[1], &[16]).expect_err("too long");
    assert_eq!(
        err.to_string(),
        "argument 0 ('tokens') has shape [17], outside the engine's profile [1]..=[16]"
    );
    assert_eq!(err.error_code(), ErrorCode::InvalidArgument);
    assert!(check_profile(0, "tokens", &[0], &[1], &[16]).is_err());
    assert!(check_profile(0, "tokens", &[4, 1], &[1], &[16]).is_err(), "rank differs");
}

#[test]
fn tensor_sizes_refuse_negative_extents_and_overflow() {
    assert_eq!(tensor_bytes(DType::F32, &[1, 2, 16, 16]), Some(2048));
    assert_eq!(tensor_bytes(DType::I64, &[]), Some(8), "a scalar");
    assert_eq!(tensor_bytes(DType::F32, &[0, 4]), Some(0));
    assert_eq!(tensor_bytes(DType::F32, &[-1, 4]), None);
    assert_eq!(tensor_bytes(DType::F32, &[i64::MAX, 4]), None);
}

#[test]
fn runner_arguments_become_plan_views_on_the_engines_device_only() {
    for residency in [MemoryKind::Host, MemoryKind::Pinned, MemoryKind::Device, MemoryKind::Managed] {
        let arg = IoArg {
            ptr: 0x7000_0000 as *mut std::ffi::c_void,
            nbytes: 1024,
            residency,
            device: 0,
            dtype: DType::F32,
            shape: &[1, 2, 16, 8],
        };
        let view = arg.view(3, 0).expect("same device");
        assert_eq!(
            view,
            ArgView {
                address: 0x7000_0000,
                nbytes: 1024,
                residency,
                dtype: DType::F32,
                shape: &[1, 2, 16, 8]
            }
        );
    }
    // Device memory of another GPU than the engine's is refused; host memory has no device.
    let other = IoArg {
        ptr: 0x7000_0000 as *mut std::ffi::c_void,
        nbytes: 16,
        residency: MemoryKind::Device,
        device: 1,
        dtype: DType::F32,
        shape: &[4],
    };
    let err = other.view(2, 0).expect_err("wrong device");
    assert_eq!(err.to_string(), "argument 2 is memory of CUDA device 1, but the engine runs on device 0");
    assert_eq!(err.error_code(), ErrorCode::InvalidArgument);
    assert!(other.view(2, 1).is_ok());
    assert!(IoArg { residency: MemoryKind::Managed, ..other }.view(2, 0).is_err(), "managed memory too");
    assert!(IoArg { residency: MemoryKind::Host, ..other }.view(2, 0).is_ok(), "host memory has no device");
    assert!(IoArg { nbytes: 0, ..other }.view(2, 0).is_ok(), "an empty tensor binds the scratch");
}
