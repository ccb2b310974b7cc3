//! The binding plan against engine introspection captured from real TensorRT-RTX builds
//! (`tests/fixtures/*.json`, refreshed by `fixtures_match_real_builds`). No TensorRT needed.

use alias_validate::{validate_with_engine, ValidKind};
use blob_format::model::{Alias, AliasKind, Binding, DType, Header, PayloadKind, Role};
use et_error::MemoryKind;
use et_error::{ErrorCode, HasErrorCode};
use trt_exec::{Address, ArgRole, ArgView, BindingError, BindingPlan, CallPlan, Copy, EngineIo};

fn fixture(name: &str) -> EngineIo {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(format!("{name}.json"));
    EngineIo::from_json(&std::fs::read_to_string(&path).expect("fixture exists")).expect("fixture parses")
}

/// A header binding `order` (inputs must come first in `order` only if the test wants TR02 compatibility).
fn header(io: &EngineIo, order: &[&str], aliases: &[(&str, &str, AliasKind)]) -> Header {
    Header::new(
        "TensorRTBackend",
        PayloadKind::TensorRtPlan,
        order
            .iter()
            .map(|name| {
                let t = io.tensor(name).expect("fixture tensor");
                Binding::untyped(*name, t.mode.into())
            })
            .collect(),
        aliases
            .iter()
            .map(|(o, i, k)| Alias { output: (*o).into(), input: (*i).into(), kind: k.clone() })
            .collect(),
    )
}

fn plan(io: &EngineIo, header: &Header) -> BindingPlan {
    let aliases = validate_with_engine(header, io).expect("validates");
    BindingPlan::new(header, io, &aliases).expect("plans")
}

/// Argument views for `plan`'s arguments: each its own device storage of the engine's shape, except where
/// `tweak` changes one.
struct Args {
    shapes: Vec<Vec<i64>>,
    views: Vec<(u64, u64, MemoryKind, DType)>,
}

impl Args {
    fn device(plan: &BindingPlan, io: &EngineIo) -> Args {
        let mut shapes = Vec::new();
        let mut views = Vec::new();
        for (i, arg) in plan.args().iter().enumerate() {
            let t = io.tensor(&arg.tensor).expect("tensor");
            let bytes = t.shape.iter().product::<i64>() as u64 * arg.dtype.size_bytes() as u64;
            shapes.push(t.shape.clone());
            views.push((0x10_0000 * (i as u64 + 1), bytes, MemoryKind::Device, arg.dtype));
        }
        Args { shapes, views }
    }

    fn index(plan: &BindingPlan, name: &str) -> usize {
        plan.args().iter().position(|a| a.tensor == name).expect("bound")
    }

    /// The output slot shares the input's storage (the caller binds in place).
    fn share(&mut self, plan: &BindingPlan, output: &str, input: &str) {
        let (o, i) = (Self::index(plan, output), Self::index(plan, input));
        self.views[o] = self.views[i];
    }

    fn set(&mut self, plan: &BindingPlan, name: &str, residency: MemoryKind, nbytes: Option<u64>) {
        let i = Self::index(plan, name);
        self.views[i].2 = residency;
        if let Some(n) = nbytes {
            self.views[i].1 = n;
        }
    }

    fn views(&self) -> Vec<ArgView<'_>> {
        self.views
            .iter()
            .zip(&self.shapes)
            .map(|(&(address, nbytes, residency, dtype), shape)| ArgView {
                address,
                nbytes,
                residency,
                dtype,
                shape,
            })
            .collect()
    }

    fn prepare(&self, plan: &BindingPlan, caller_stream: bool) -> Result<CallPlan, BindingError> {
        plan.prepare(&self.views(), false, caller_stream)
    }
}

const DECODER_KV: [(&str, &str, AliasKind); 2] = [
    ("k_cache_out_0", "k_cache_0", AliasKind::KvCacheUpdate),
    ("v_cache_out_0", "v_cache_0", AliasKind::KvCacheUpdate),
];

fn address_of<'a>(call: &'a CallPlan, tensor: &str) -> &'a Address {
    &call.bindings.iter().find(|b| b.tensor == tensor).expect("bound").address
}

#[test]
fn aliased_outputs_after_user_outputs_bind_by_name_onto_their_caches() {
    let io = fixture("decoder_decode");
    // TensorRT orders outputs logits, k_cache_out, v_cache_out; this blob puts the caches first. Binding is by
    // name, so both orders bind the same tensors.
    for order in [
        ["tokens", "input_pos", "k_cache_0", "v_cache_0", "k_cache_out_0", "v_cache_out_0", "logits"],
        ["tokens", "input_pos", "k_cache_0", "v_cache_0", "logits", "k_cache_out_0", "v_cache_out_0"],
    ] {
        let h = header(&io, &order, &DECODER_KV);
        let plan = plan(&io, &h);
        let names: Vec<&str> = plan.args().iter().map(|a| a.tensor.as_str()).collect();
        assert_eq!(names, order);
        let k_out = Args::index(&plan, "k_cache_out_0");
        assert_eq!(
            plan.args()[k_out].role,
            ArgRole::AliasedOutput {
                input: "k_cache_0".into(),
                input_arg: 2,
                kind: ValidKind::KvCacheUpdate
            }
        );
        let mut args = Args::device(&plan, &io);
        args.share(&plan, "k_cache_out_0", "k_cache_0");
        args.share(&plan, "v_cache_out_0", "v_cache_0");
        let call = args.prepare(&plan, true).expect("fits");
        assert_eq!(*address_of(&call, "k_cache_out_0"), Address::Arg(2));
        assert_eq!(*address_of(&call, "v_cache_out_0"), Address::Arg(3));
        assert_eq!(*address_of(&call, "logits"), Address::Arg(Args::index(&plan, "logits")));
    }
}

#[test]
fn two_caches_bound_in_place_copy_nothing_and_do_not_block_a_caller_stream() {
    let io = fixture("decoder_decode");
    let order = ["tokens", "input_pos", "k_cache_0", "v_cache_0", "logits", "k_cache_out_0", "v_cache_out_0"];
    let plan = plan(&io, &header(&io, &order, &DECODER_KV));
    let mut args = Args::device(&plan, &io);
    args.share(&plan, "k_cache_out_0", "k_cache_0");
    args.share(&plan, "v_cache_out_0", "v_cache_0");
    let call = args.prepare(&plan, true).expect("fits");
    assert!(call.before.is_empty() && call.after.is_empty());
    assert_eq!((call.reflect_bytes, call.staged_bytes, call.synchronize), (0, 0, false));
    // Without a caller stream the delegate's own stream must be drained before returning.
    assert!(args.prepare(&plan, false).expect("fits").synchronize);
}

#[test]
fn two_caches_in_separate_output_slots_are_reflected_after_the_engine_and_synchronised() {
    let io = fixture("decoder_decode");
    let order = ["tokens", "input_pos", "k_cache_0", "v_cache_0", "logits", "k_cache_out_0", "v_cache_out_0"];
    let plan = plan(&io, &header(&io, &order, &DECODER_KV));
    let args = Args::device(&plan, &io);
    let call = args.prepare(&plan, true).expect("fits");
    let cache_bytes = 2 * 16 * 16 * 4; // [1, heads 2, max_len 16, head_dim 16] f32
    assert_eq!(
        call.after,
        [
            Copy::Reflect { from_arg: 2, to_arg: 5, bytes: cache_bytes },
            Copy::Reflect { from_arg: 3, to_arg: 6, bytes: cache_bytes },
        ]
    );
    // The engine still writes the caller's cache in place; the slot only receives a copy.
    assert_eq!(*address_of(&call, "k_cache_out_0"), Address::Arg(2));
    assert_eq!(call.reflect_bytes, 2 * cache_bytes);
    assert!(call.synchronize, "a reflect must complete before execute returns");
}

#[test]
fn a_user_alias_binds_the_output_onto_the_inputs_storage() {
    let io = fixture("user_state");
    assert!(io.aliases.is_empty(), "the engine cannot see user aliases");
    let h = header(&io, &["state", "x", "state_out"], &[("state_out", "state", AliasKind::User)]);
    let plan = plan(&io, &h);
    assert_eq!(
        plan.args()[2].role,
        ArgRole::AliasedOutput { input: "state".into(), input_arg: 0, kind: ValidKind::User }
    );
    assert_eq!(plan.args()[0].role, ArgRole::AliasedInput { outputs: vec!["state_out".into()] });
    let mut args = Args::device(&plan, &io);
    args.share(&plan, "state_out", "state");
    let call = args.prepare(&plan, true).expect("fits");
    assert_eq!(*address_of(&call, "state_out"), Address::Arg(0));
    // The gate applies to user-aliased inputs too.
    args.set(&plan, "state", MemoryKind::Host, None);
    args.share(&plan, "state_out", "state");
    let err = args.prepare(&plan, true).expect_err("host state refused");
    assert!(err.to_string().starts_with("aliased input 'state' must be on GPU or unified memory"), "{err}");
}

#[test]
fn a_host_resident_aliased_input_is_refused_before_any_staging() {
    let io = fixture("decoder_decode");
    let order = ["tokens", "input_pos", "k_cache_0", "v_cache_0", "k_cache_out_0", "v_cache_out_0", "logits"];
    let plan = plan(&io, &header(&io, &order, &DECODER_KV));
    let mut args = Args::device(&plan, &io);
    args.share(&plan, "k_cache_out_0", "k_cache_0");
    args.share(&plan, "v_cache_out_0", "v_cache_0");
    // tokens on the host would be staged; the cache on the host must be refused first, whatever else is wrong.
    args.set(&plan, "tokens", MemoryKind::Host, None);
    args.set(&plan, "k_cache_0", MemoryKind::Host, None);
    args.set(&plan, "logits", MemoryKind::Device, Some(3)); // also a size error, reported only after the gate
    let err = args.prepare(&plan, true).expect_err("refused");
    assert!(
        matches!(err, BindingError::Residency(alias_validate::Error::AliasedInputNotOnDevice { ref name, .. }) if name == "k_cache_0"),
        "{err:?}"
    );
    assert_eq!(err.error_code(), ErrorCode::InvalidArgument);
    assert!(
        err.to_string().starts_with("aliased input 'k_cache_0' must be on GPU or unified memory"),
        "{err}"
    );
    // Pinned host memory is still host memory on a discrete GPU.
    args.set(&plan, "k_cache_0", MemoryKind::Pinned, None);
    args.share(&plan, "k_cache_out_0", "k_cache_0");
    assert!(args.prepare(&plan, true).is_err());
    // Managed memory passes; the host tokens are then staged and force a sync.
    args.set(&plan, "k_cache_0", MemoryKind::Managed, None);
    args.share(&plan, "k_cache_out_0", "k_cache_0");
    args.set(&plan, "logits", MemoryKind::Device, Some(64 * 4));
    let call = args.prepare(&plan, true).expect("fits");
    assert_eq!(call.before, [Copy::Stage { arg: 0, slot: 0, bytes: 8 }]); // one i64 token
    assert_eq!(*address_of(&call, "tokens"), Address::Staging(0));
    assert!(call.synchronize);
}

#[test]
fn a_zero_byte_aliased_input_is_refused() {
    let io = fixture("kv_single");
    let h = header(
        &io,
        &["k_cache", "update", "write_idx", "k_cache_out", "logits"],
        &[("k_cache_out", "k_cache", AliasKind::KvCacheUpdate)],
    );
    let plan = plan(&io, &h);
    let mut args = Args::device(&plan, &io);
    args.set(&plan, "k_cache", MemoryKind::Device, Some(0));
    args.share(&plan, "k_cache_out", "k_cache");
    let err = args.prepare(&plan, true).expect_err("refused");
    assert!(
        matches!(err, BindingError::Residency(alias_validate::Error::AliasedInputEmpty { ref name }) if name == "k_cache"),
        "{err:?}"
    );
    assert_eq!(err.error_code(), ErrorCode::InvalidArgument);
}

#[test]
fn an_unthreaded_aliased_output_takes_no_argument_and_binds_to_its_cache() {
    let io = fixture("kv_single");
    let mut h = header(
        &io,
        &["k_cache", "update", "write_idx", "logits", "k_cache_out"],
        &[("k_cache_out", "k_cache", AliasKind::KvCacheUpdate)],
    );
    h.bindings[4].threaded = false;
    let plan = plan(&io, &h);
    assert_eq!(plan.args().len(), 4);
    assert_eq!(plan.unthreaded()[0].tensor, "k_cache_out");
    let args = Args::device(&plan, &io);
    let call = args.prepare(&plan, true).expect("fits");
    assert_eq!(*address_of(&call, "k_cache_out"), Address::Arg(0));
    assert!(call.after.is_empty());
}

#[test]
fn arguments_that_do_not_fit_are_refused_with_their_names() {
    let io = fixture("kv_single");
    let order = ["k_cache", "update", "write_idx", "k_cache_out", "logits"];
    let plan = plan(&io, &header(&io, &order, &[("k_cache_out", "k_cache", AliasKind::KvCacheUpdate)]));
    let mut args = Args::device(&plan, &io);
    args.share(&plan, "k_cache_out", "k_cache");
    let views = args.views();
    let err = plan.prepare(&views[..4], false, true).expect_err("count");
    assert_eq!(
        err.to_string(),
        "the call passes 4 arguments but the blob binds 5 (k_cache, update, write_idx, k_cache_out, logits)"
    );
    let mut bad = views.clone();
    bad[2].dtype = DType::I64;
    assert_eq!(
        plan.prepare(&bad, false, true).expect_err("dtype").to_string(),
        "argument 2 ('write_idx') is i64 but the engine tensor is i32"
    );
    let mut bad = views.clone();
    bad[1].shape = &[1, 2, 2, 8];
    assert_eq!(
        plan.prepare(&bad, false, true).expect_err("shape").to_string(),
        "argument 1 ('update') has shape [1, 2, 2, 8] but the engine tensor is [1, 2, 1, 8]"
    );
    let mut bad = views;
    bad[4].nbytes = 7;
    let err = plan.prepare(&bad, false, true).expect_err("size");
    assert_eq!(err.to_string(), "argument 4 ('logits') has 7 bytes but shape and dtype need 64");
    assert_eq!(err.error_code(), ErrorCode::InvalidArgument);
}

#[test]
fn a_host_output_is_read_back_and_synchronised() {
    let io = fixture("kv_single");
    let order = ["k_cache", "update", "write_idx", "k_cache_out", "logits"];
    let plan = plan(&io, &header(&io, &order, &[("k_cache_out", "k_cache", AliasKind::KvCacheUpdate)]));
    let mut args = Args::device(&plan, &io);
    args.share(&plan, "k_cache_out", "k_cache");
    args.set(&plan, "logits", MemoryKind::Host, None);
    let call = args.prepare(&plan, true).expect("fits");
    assert_eq!(call.after, [Copy::ReadBack { slot: 2, arg: 4, bytes: 64 }]);
    assert!(call.synchronize);
}

#[test]
fn a_blob_binding_the_engine_lacks_is_an_invalid_program() {
    let io = fixture("user_state");
    let mut h = header(&io, &["state", "x", "state_out"], &[]);
    h.bindings[1] = Binding::untyped("y", Role::Input);
    let aliases = alias_validate::validate_format(&h).expect("format is fine");
    let err = BindingPlan::new(&h, &io, &aliases).expect_err("y is not in the engine");
    assert_eq!(
        err.to_string(),
        "binding 'y' names no tensor of the engine (engine tensors: state, x, state_out); re-export the blob"
    );
    assert_eq!(err.error_code(), ErrorCode::InvalidProgram);
}
