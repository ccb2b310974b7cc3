//! The delegate driven in-process through the `Delegate` trait, as a host would drive it: caller-owned caches
//! threaded as arguments, in-place and copy-back output slots, and every way a call or a blob can be wrong.

use blob_format::model::{Alias, AliasKind, Binding, DType, Dim, Header, PayloadKind, Producer, Role};
use delegate_abi::host::ArgList;
use delegate_abi::{
    Compatibility, DTypeCode, Delegate, DelegateError, ErrorCode, ExecStats, InitContext, MemoryKind,
};
use ref_graph::{ElemType, Graph, GraphBuilder};
use reference_delegate::{ReferenceDelegate, ReferenceHandle, BACKEND_ID};

#[path = "support/calls.rs"]
mod calls;
use calls::{expect_code, init, plain_blob, run_list};

const VOCAB: u64 = 5;
const HEADS: u64 = 1;
const LEN: u64 = 4;
const HEAD_DIM: u64 = 2;
const CACHE: [i64; 3] = [HEADS as i64, LEN as i64, HEAD_DIM as i64];
const CACHE_ELEMS: usize = (HEADS * LEN * HEAD_DIM) as usize;

fn weights(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32 + 1.0) * seed).sin()).collect()
}

/// A one-layer attention decoder over `rows` tokens; graph outputs are `[logits, k_cache_out, v_cache_out]`.
fn graph(rows: u64) -> Graph {
    graph_with(rows, false)
}

/// The decoder with caller caches, or (`owned`) with delegate-owned caches: then its only output is `logits`.
fn graph_with(rows: u64, owned: bool) -> Graph {
    let mut b = GraphBuilder::new();
    let tokens = b.input("tokens", ElemType::I64, &[rows]).expect("fresh");
    let pos = b.input("input_pos", ElemType::I64, &[1]).expect("fresh");
    let cache = [HEADS, LEN, HEAD_DIM];
    let (k_cache, v_cache) = if owned {
        (b.state("k_cache", ElemType::F32, &cache).expect("fresh"), b.state("v_cache", ElemType::F32, &cache))
    } else {
        (b.input("k_cache", ElemType::F32, &cache).expect("fresh"), b.input("v_cache", ElemType::F32, &cache))
    };
    let v_cache = v_cache.expect("fresh");
    let emb = b.constant_f32("emb", &[VOCAB, 2], weights(10, 0.7)).expect("sized");
    let wq = b.constant_f32("wq", &[2, 2], weights(4, 1.3)).expect("sized");
    let wk = b.constant_f32("wk", &[2, 2], weights(4, 2.1)).expect("sized");
    let wv = b.constant_f32("wv", &[2, 2], weights(4, 0.9)).expect("sized");
    let wo = b.constant_f32("wo", &[2, VOCAB], weights(10, 1.7)).expect("sized");
    let x = b.gather("x", emb, tokens).expect("typed");
    let q = b.mat_mul("q", x, wq).expect("typed");
    let k = b.mat_mul("k", x, wk).expect("typed");
    let v = b.mat_mul("v", x, wv).expect("typed");
    let k_out = b.kv_cache_update("k_cache_out", k_cache, k, pos).expect("typed");
    let v_out = b.kv_cache_update("v_cache_out", v_cache, v, pos).expect("typed");
    let attn = b.causal_attention("attn", q, k_out, v_out, pos).expect("typed");
    let logits = b.mat_mul("logits", attn, wo).expect("typed");
    let outputs = if owned { vec![logits] } else { vec![logits, k_out, v_out] };
    for out in outputs {
        b.output(out).expect("declared");
    }
    b.finish().expect("valid")
}

fn binding(name: &str, role: Role, dtype: DType, shape: &[u64]) -> Binding {
    Binding {
        name: name.to_owned(),
        role,
        dtype: Some(dtype),
        shape: Some(shape.iter().map(|&d| Dim::Static(d)).collect()),
        threaded: true,
    }
}

/// The blob's header: delegate arguments list cache outputs *before* logits, unlike the graph.
fn header(rows: u64) -> Header {
    let cache = [HEADS, LEN, HEAD_DIM];
    Header {
        producer: Some(Producer { name: "in-process test".to_owned(), version: "0".to_owned() }),
        backend_id: BACKEND_ID.to_owned(),
        payload_kind: PayloadKind::ReferenceGraph,
        bindings: vec![
            binding("tokens", Role::Input, DType::I64, &[rows]),
            binding("input_pos", Role::Input, DType::I64, &[1]),
            binding("k_cache", Role::Input, DType::F32, &cache),
            binding("v_cache", Role::Input, DType::F32, &cache),
            binding("k_cache_out", Role::Output, DType::F32, &cache),
            binding("v_cache_out", Role::Output, DType::F32, &cache),
            binding("logits", Role::Output, DType::F32, &[rows, VOCAB]),
        ],
        aliases: ["k", "v"]
            .iter()
            .map(|kv| Alias {
                output: format!("{kv}_cache_out"),
                input: format!("{kv}_cache"),
                kind: AliasKind::KvCacheUpdate,
            })
            .collect(),
        device_id: 0,
        hardware_compatible: false,
        hardware_target: None,
        engine_library_version: None,
        engine_metadata: None,
    }
}

fn blob_with(header: &Header, rows: u64) -> Vec<u8> {
    blob_format::native::to_vec(header, &graph(rows).encode())
}

/// Caller-owned state: the two caches, separate output slots (used in copy-back mode) and the logits.
struct State {
    k: Vec<f32>,
    v: Vec<f32>,
    k_slot: Vec<f32>,
    v_slot: Vec<f32>,
    logits: Vec<f32>,
}

impl State {
    fn new(rows: usize) -> State {
        State {
            k: vec![0.0; CACHE_ELEMS],
            v: vec![0.0; CACHE_ELEMS],
            k_slot: vec![0.0; CACHE_ELEMS],
            v_slot: vec![0.0; CACHE_ELEMS],
            logits: vec![0.0; rows * VOCAB as usize],
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Slots {
    InPlace,
    CopyBack,
}

fn step(
    delegate: &ReferenceDelegate,
    handle: &mut ReferenceHandle,
    state: &mut State,
    tokens: &[i64],
    position: i64,
    slots: Slots,
) -> Result<ExecStats, DelegateError> {
    let position = [position];
    let rows = tokens.len() as i64;
    let mut list = ArgList::new();
    let f32 = DTypeCode::F32;
    let host = MemoryKind::Host;
    list.push_input(bytemuck::cast_slice(tokens), DTypeCode::I64, &[rows], host).expect("sized");
    list.push_input(bytemuck::cast_slice(&position), DTypeCode::I64, &[1], host).expect("sized");
    let k = list.push_inout(bytemuck::cast_slice_mut(&mut state.k), f32, &CACHE, host).expect("sized");
    let v = list.push_inout(bytemuck::cast_slice_mut(&mut state.v), f32, &CACHE, host).expect("sized");
    match slots {
        Slots::InPlace => {
            list.push_output_in_place(k, f32, &CACHE).expect("same size");
            list.push_output_in_place(v, f32, &CACHE).expect("same size");
        }
        Slots::CopyBack => {
            list.push_output(bytemuck::cast_slice_mut(&mut state.k_slot), f32, &CACHE, host).expect("sized");
            list.push_output(bytemuck::cast_slice_mut(&mut state.v_slot), f32, &CACHE, host).expect("sized");
        }
    }
    list.push_output(bytemuck::cast_slice_mut(&mut state.logits), f32, &[rows, VOCAB as i64], host)
        .expect("sized");
    run_list(delegate, handle, &list)
}

/// Pushes the one-row graph's two inputs: `tokens` and `input_pos`, each `i64 [1]` in host memory.
fn push_tokens<'a>(list: &mut ArgList<'a>, tokens: &'a [i64; 1], pos: &'a [i64; 1]) {
    list.push_input(bytemuck::cast_slice(tokens), DTypeCode::I64, &[1], MemoryKind::Host).expect("sized");
    list.push_input(bytemuck::cast_slice(pos), DTypeCode::I64, &[1], MemoryKind::Host).expect("sized");
}

/// Pushes what follows the caches in a one-row call: separate k and v output slots, then the logits.
fn push_slots_and_logits<'a>(
    list: &mut ArgList<'a>,
    k: &'a mut [f32],
    v: &'a mut [f32],
    logits: &'a mut [f32],
) {
    for slot in [k, v] {
        list.push_output(bytemuck::cast_slice_mut(slot), DTypeCode::F32, &CACHE, MemoryKind::Host)
            .expect("sized");
    }
    list.push_output(bytemuck::cast_slice_mut(logits), DTypeCode::F32, &[1, VOCAB as i64], MemoryKind::Host)
        .expect("sized");
}

fn row(cache: &[f32], r: usize) -> &[f32] {
    &cache[r * HEAD_DIM as usize..(r + 1) * HEAD_DIM as usize]
}

#[test]
fn info_describes_the_plugin() {
    let info = ReferenceDelegate::info();
    assert_eq!(info.name, "reference-delegate");
    assert_eq!(info.version, env!("CARGO_PKG_VERSION"));
    assert_eq!(info.backends, ["ReferenceBackend"]);
    assert_eq!(info.wire_formats[0].format, "native");
    assert_eq!(info.wire_formats[0].versions, ">=1.0, <2");
    assert!(info.binds_aliases_in_place);
    assert!(
        info.memory_kinds.contains(&MemoryKind::Host) && !info.memory_kinds.contains(&MemoryKind::Device)
    );
}

#[test]
fn each_step_sees_the_previous_steps_update_in_the_callers_cache() {
    let delegate = ReferenceDelegate::new();
    let mut handle = init(&delegate, &blob_with(&header(1), 1)).expect("valid blob");
    let mut state = State::new(1);

    let stats = step(&delegate, &mut handle, &mut state, &[3], 0, Slots::InPlace).expect("step 0");
    assert_eq!(stats, ExecStats::default(), "in place: nothing copied");
    let k_row0 = row(&state.k, 0).to_vec();
    assert!(k_row0.iter().all(|&x| x != 0.0), "step 0 wrote row 0 of the caller's cache: {k_row0:?}");
    assert!(state.k[HEAD_DIM as usize..].iter().all(|&x| x == 0.0), "other rows untouched");

    step(&delegate, &mut handle, &mut state, &[1], 1, Slots::InPlace).expect("step 1");
    assert_eq!(row(&state.k, 0), k_row0, "step 1 keeps step 0's row");
    assert!(row(&state.k, 1).iter().all(|&x| x != 0.0), "step 1 wrote row 1");
    let after_both = state.logits.clone();

    // Scenario A of upstream's check: the same token at position 1 on a zeroed cache gives other logits.
    let mut fresh = State::new(1);
    step(&delegate, &mut handle, &mut fresh, &[1], 1, Slots::InPlace).expect("step on a zeroed cache");
    let diff = after_both.iter().zip(&fresh.logits).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(diff > 1e-3, "step 1 must depend on step 0's cache row (max diff {diff})");
    assert!(after_both.iter().chain(&fresh.logits).all(|x| x.is_finite()));
}

#[test]
fn copy_back_gives_the_same_logits_and_counts_reflect_bytes() {
    let delegate = ReferenceDelegate::new();
    let blob = blob_with(&header(1), 1);
    let mut in_place = init(&delegate, &blob).expect("valid blob");
    let mut copy_back = init(&delegate, &blob).expect("valid blob");
    let (mut a, mut b) = (State::new(1), State::new(1));
    for (position, token) in [(0, 2), (1, 4), (2, 0)] {
        let sa =
            step(&delegate, &mut in_place, &mut a, &[token], position, Slots::InPlace).expect("in place");
        let sb =
            step(&delegate, &mut copy_back, &mut b, &[token], position, Slots::CopyBack).expect("copy back");
        assert_eq!(a.logits, b.logits, "step at {position}");
        assert_eq!((a.k.as_slice(), a.v.as_slice()), (b.k.as_slice(), b.v.as_slice()));
        assert_eq!((b.k_slot.as_slice(), b.v_slot.as_slice()), (b.k.as_slice(), b.v.as_slice()), "reflected");
        assert_eq!(sa.reflect_bytes, 0);
        assert_eq!(sb.reflect_bytes, 2 * 4 * CACHE_ELEMS as u64, "both caches reflected once");
        assert_eq!(sb.staged_bytes, 0);
    }
}

#[test]
fn prefill_and_decode_instances_share_the_callers_cache() {
    let delegate = ReferenceDelegate::new();
    let mut prefill = init(&delegate, &blob_with(&header(3), 3)).expect("prefill blob");
    let mut decode = init(&delegate, &blob_with(&header(1), 1)).expect("decode blob");
    let mut state = State::new(3);
    step(&delegate, &mut prefill, &mut state, &[1, 2, 3], 0, Slots::InPlace).expect("prefill");
    let prefill_last = state.logits[2 * VOCAB as usize..].to_vec();

    // Decoding the same three tokens one by one reproduces prefill's caches and last logits.
    let mut one_by_one = State::new(1);
    for (position, token) in [1, 2, 3].into_iter().enumerate() {
        step(&delegate, &mut decode, &mut one_by_one, &[token], position as i64, Slots::InPlace)
            .expect("decode");
    }
    let close = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-6);
    assert!(close(&one_by_one.k, &state.k) && close(&one_by_one.v, &state.v));
    assert!(close(&one_by_one.logits, &prefill_last), "{:?} vs {prefill_last:?}", one_by_one.logits);

    // The decode instance continues from the cache prefill wrote.
    let mut shared = State { logits: vec![0.0; VOCAB as usize], ..state };
    step(&delegate, &mut decode, &mut shared, &[4], 3, Slots::InPlace).expect("decode after prefill");
    assert!(row(&shared.k, 3).iter().all(|&x| x != 0.0));
    assert!(close(&shared.k[..3 * HEAD_DIM as usize], &one_by_one.k[..3 * HEAD_DIM as usize]));
}

#[test]
fn bad_calls_are_refused_before_anything_runs() {
    let delegate = ReferenceDelegate::new();
    let mut handle = init(&delegate, &blob_with(&header(1), 1)).expect("valid blob");
    let mut state = State::new(1);

    // Wrong count.
    let tokens = [1i64];
    let mut list = ArgList::new();
    list.push_input(bytemuck::cast_slice(&tokens), DTypeCode::I64, &[1], MemoryKind::Host).expect("sized");
    expect_code(
        run_list(&delegate, &mut handle, &list),
        ErrorCode::InvalidArgument,
        "the call has 1 arguments",
    );

    // A position past the cache, a token past the vocabulary.
    expect_code(
        step(&delegate, &mut handle, &mut state, &[1], 4, Slots::InPlace),
        ErrorCode::InvalidArgument,
        "position 4 from 'input_pos' does not fit",
    );
    expect_code(
        step(&delegate, &mut handle, &mut state, &[1], -1, Slots::InPlace),
        ErrorCode::InvalidArgument,
        "position -1",
    );
    expect_code(
        step(&delegate, &mut handle, &mut state, &[VOCAB as i64], 0, Slots::InPlace),
        ErrorCode::InvalidArgument,
        "outside table 'emb'",
    );

    // Wrong dtype at a position: the message names the position and the tensor.
    let pos = [0i64];
    let wrong = [0.0f32; 2];
    let mut list = ArgList::new();
    list.push_input(bytemuck::cast_slice(&wrong), DTypeCode::F32, &[2], MemoryKind::Host).expect("sized");
    list.push_input(bytemuck::cast_slice(&pos), DTypeCode::I64, &[1], MemoryKind::Host).expect("sized");
    for cache in [&mut state.k, &mut state.v] {
        list.push_inout(bytemuck::cast_slice_mut(cache), DTypeCode::F32, &CACHE, MemoryKind::Host)
            .expect("ok");
    }
    push_slots_and_logits(&mut list, &mut state.k_slot, &mut state.v_slot, &mut state.logits);
    expect_code(
        run_list(&delegate, &mut handle, &list),
        ErrorCode::InvalidArgument,
        "argument 0 ('tokens'): is f32 [2], expected i64 [1]",
    );
    drop(list);

    // A read-only cache cannot be updated in place.
    let mut list = ArgList::new();
    push_tokens(&mut list, &tokens, &pos);
    list.push_input(bytemuck::cast_slice(&state.k), DTypeCode::F32, &CACHE, MemoryKind::Host).expect("ok");
    list.push_inout(bytemuck::cast_slice_mut(&mut state.v), DTypeCode::F32, &CACHE, MemoryKind::Host)
        .expect("ok");
    push_slots_and_logits(&mut list, &mut state.k_slot, &mut state.v_slot, &mut state.logits);
    expect_code(
        run_list(&delegate, &mut handle, &list),
        ErrorCode::InvalidArgument,
        "argument 2 ('k_cache'): is read-only",
    );
    drop(list);
    assert!(state.k.iter().chain(&state.v).all(|&x| x == 0.0), "nothing ran");

    // A refused call leaves the handle usable.
    step(&delegate, &mut handle, &mut state, &[1], 0, Slots::InPlace).expect("a good call after bad ones");
    assert!(row(&state.k, 0).iter().all(|&x| x != 0.0));
}

#[test]
fn a_cache_in_device_memory_fails_the_residency_gate() {
    let delegate = ReferenceDelegate::new();
    let mut handle = init(&delegate, &blob_with(&header(1), 1)).expect("valid blob");
    let mut state = State::new(1);
    let (tokens, pos) = ([1i64], [0i64]);
    let mut list = ArgList::new();
    push_tokens(&mut list, &tokens, &pos);
    let mut k =
        delegate_abi::TensorArg::describe(DTypeCode::F32, &CACHE, MemoryKind::Device).expect("rank 3");
    k.nbytes = 4 * CACHE_ELEMS as u64;
    k.data = 0x1000 as *mut std::ffi::c_void;
    k.flags = delegate_abi::ARG_WRITABLE | delegate_abi::ARG_INOUT;
    // SAFETY: the arg is device memory, which neither the list nor the delegate dereferences on the host
    // (the delegate refuses it before touching memory); every host arg comes from live borrows.
    unsafe { list.push_raw(k) }.expect("sized");
    list.push_inout(bytemuck::cast_slice_mut(&mut state.v), DTypeCode::F32, &CACHE, MemoryKind::Host)
        .expect("ok");
    push_slots_and_logits(&mut list, &mut state.k_slot, &mut state.v_slot, &mut state.logits);
    let err = run_list(&delegate, &mut handle, &list).expect_err("device cache");
    assert_eq!(err.code, ErrorCode::InvalidArgument, "{err}");
    // The gate's own words (a later argument check would refuse the same argument with the same code, so
    // only the message proves the gate ran, and ran first).
    assert_eq!(
        err.message,
        "argument 2: aliased input 'k_cache' must be in memory this delegate updates in place (host, managed \
         or pinned); it is in device memory, so the update would not reach the caller: allocate it as host, \
         managed or pinned memory"
    );
}

#[test]
fn blobs_for_other_backends_or_payloads_are_incompatible() {
    let delegate = ReferenceDelegate::new();
    assert_eq!(delegate.compatibility(&blob_with(&header(1), 1)), Compatibility::Supported);

    let mut other = header(1);
    other.backend_id = "TensorRTBackend".to_owned();
    let blob = blob_with(&other, 1);
    assert!(
        matches!(delegate.compatibility(&blob), Compatibility::Unsupported { reason } if reason.contains("TensorRTBackend"))
    );
    expect_code(init(&delegate, &blob), ErrorCode::DelegateInvalidCompatibility, "not 'ReferenceBackend'");

    let mut plan = header(1);
    plan.payload_kind = PayloadKind::TensorRtPlan;
    let blob = blob_with(&plan, 1);
    assert!(matches!(delegate.compatibility(&blob), Compatibility::Unsupported { .. }));
    expect_code(init(&delegate, &blob), ErrorCode::DelegateInvalidCompatibility, "tensorrt-plan");

    assert!(matches!(delegate.compatibility(b"not a blob at all"), Compatibility::Unsupported { .. }));
    expect_code(init(&delegate, b"not a blob at all"), ErrorCode::DelegateInvalidCompatibility, "magic");
}

#[test]
fn corrupt_payloads_and_wrong_alias_tables_are_refused_at_init() {
    let delegate = ReferenceDelegate::new();
    let mut blob = blob_with(&header(1), 1);
    let last = blob.len() - 1;
    blob[last] ^= 0xff;
    expect_code(init(&delegate, &blob), ErrorCode::InvalidProgram, "checksum");

    // The alias table claims k_cache_out writes into v_cache; the graph says k_cache.
    let mut crossed = header(1);
    crossed.aliases[0].input = "v_cache".to_owned();
    expect_code(init(&delegate, &blob_with(&crossed, 1)), ErrorCode::InvalidProgram, "k_cache_out");

    // A binding whose recorded shape disagrees with the graph.
    let mut shape = header(1);
    shape.bindings[6].shape = Some(vec![Dim::Static(1), Dim::Static(6)]);
    expect_code(init(&delegate, &blob_with(&shape, 1)), ErrorCode::InvalidProgram, "logits");

    // A user alias is metadata the graph cannot perform.
    let mut user = header(1);
    user.aliases[0].kind = AliasKind::User;
    expect_code(
        init(&delegate, &blob_with(&user, 1)),
        ErrorCode::NotSupported,
        "user alias 'k_cache_out' -> 'k_cache' is not supported",
    );
}

#[test]
fn bindings_resolve_by_name_not_by_graph_order() {
    let delegate = ReferenceDelegate::new();
    let handle = init(&delegate, &blob_with(&header(1), 1)).expect("valid blob");
    let names: Vec<_> = handle.plan().args().iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["tokens", "input_pos", "k_cache", "v_cache", "k_cache_out", "v_cache_out", "logits"]);
    let graph_outputs: Vec<_> =
        handle.graph().outputs().iter().map(|&id| handle.graph().tensor(id).name.as_str()).collect();
    assert_eq!(graph_outputs, ["logits", "k_cache_out", "v_cache_out"]);
    let args = handle.plan().args();
    assert_eq!((args[4].aliases_arg, args[5].aliases_arg, args[6].aliases_arg), (Some(2), Some(3), None));
    assert!(args[2].aliased_input && args[3].aliased_input && !args[0].aliased_input);
}

#[test]
fn the_exported_plugin_gives_the_same_results_through_the_abi() {
    let plugin =
        delegate_abi::host::Plugin::embedded(reference_delegate::delegate_root()).expect("handshake");
    assert_eq!(plugin.info(), &ReferenceDelegate::info());
    let blob = blob_with(&header(1), 1);
    assert_eq!(plugin.compatibility(&blob).expect("answer"), Compatibility::Supported);
    let mut instance =
        plugin.init(&InitContext { blob: &blob, compile_specs: &[], runtime_specs: &[] }).expect("init");

    // The same two steps in-process, for reference.
    let delegate = ReferenceDelegate::new();
    let mut handle = init(&delegate, &blob).expect("init");
    let mut direct = State::new(1);
    step(&delegate, &mut handle, &mut direct, &[2], 0, Slots::InPlace).expect("step 0");
    step(&delegate, &mut handle, &mut direct, &[4], 1, Slots::InPlace).expect("step 1");

    let mut state = State::new(1);
    for (position, token) in [(0i64, 2i64), (1, 4)] {
        let (tokens, pos) = ([token], [position]);
        let (f32, host) = (DTypeCode::F32, MemoryKind::Host);
        let mut list = ArgList::new();
        list.push_input(bytemuck::cast_slice(&tokens), DTypeCode::I64, &[1], host).expect("sized");
        list.push_input(bytemuck::cast_slice(&pos), DTypeCode::I64, &[1], host).expect("sized");
        let k = list.push_inout(bytemuck::cast_slice_mut(&mut state.k), f32, &CACHE, host).expect("sized");
        let v = list.push_inout(bytemuck::cast_slice_mut(&mut state.v), f32, &CACHE, host).expect("sized");
        list.push_output_in_place(k, f32, &CACHE).expect("same size");
        list.push_output(bytemuck::cast_slice_mut(&mut state.v_slot), f32, &CACHE, host).expect("sized");
        list.push_output(bytemuck::cast_slice_mut(&mut state.logits), f32, &[1, VOCAB as i64], host)
            .expect("sized");
        let _ = v;
        let stats = instance.execute(&mut list, None).expect("execute through the ABI");
        // k is bound in place, v has its own slot: exactly one cache is reflected.
        assert_eq!(stats.reflect_bytes, 4 * CACHE_ELEMS as u64);
    }
    assert_eq!(state.logits, direct.logits);
    assert_eq!((state.k.as_slice(), state.v.as_slice()), (direct.k.as_slice(), direct.v.as_slice()));
    assert_eq!(state.v_slot, state.v);

    // Errors cross with their code and message.
    let tokens = [1i64];
    let mut list = ArgList::new();
    list.push_input(bytemuck::cast_slice(&tokens), DTypeCode::I64, &[1], MemoryKind::Host).expect("sized");
    let err = instance.execute(&mut list, None).expect_err("one argument");
    assert_eq!(err.code, ErrorCode::InvalidArgument);
    assert!(err.message.contains("the call has 1 arguments, but this blob binds 7"), "{err}");
    assert!(plugin.poisoned().is_none());
}

#[test]
fn argmax_gives_the_index_of_the_largest_value_of_the_last_row() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", ElemType::F32, &[2, 4]).expect("fresh");
    let next = b.argmax("next", x).expect("typed");
    b.output(next).expect("declared");
    let graph = b.finish().expect("valid");
    let delegate = ReferenceDelegate::new();
    let blob = plain_blob(&graph, &["x"], &["next"]);
    assert_eq!(delegate.compatibility(&blob), Compatibility::Supported);
    let mut handle = init(&delegate, &blob).expect("valid blob");

    let nan = f32::NAN;
    for (last_row, expected) in [
        ([0.5, 2.0, 2.0, -1.0], 1), // first of equals
        ([nan, 1.0, 0.5, 0.75], 1), // a NaN never wins
        ([1.0, nan, 3.0, nan], 2),  // not even after the best
        ([-1.0, -2.0, f32::NEG_INFINITY, -0.5], 3),
        ([nan, nan, nan, nan], 3), // all NaN: the last index, as `ref_graph::argmax`
    ] {
        // The first row is larger everywhere: only the last row counts.
        let x_values = [[100.0f32; 4], last_row].concat();
        let mut out = [-7i64];
        let mut list = ArgList::new();
        list.push_input(bytemuck::cast_slice(&x_values), DTypeCode::F32, &[2, 4], MemoryKind::Host)
            .expect("sized");
        list.push_output(bytemuck::cast_slice_mut(&mut out), DTypeCode::I64, &[1], MemoryKind::Host)
            .expect("sized");
        run_list(&delegate, &mut handle, &list).expect("runs");
        drop(list);
        assert_eq!(out, [expected], "last row {last_row:?}");
    }
}

#[test]
fn delegate_owned_caches_persist_per_instance_and_match_caller_caches() {
    let delegate = ReferenceDelegate::new();
    let mut owned_header = header(1);
    owned_header.bindings.retain(|b| b.name == "tokens" || b.name == "input_pos" || b.name == "logits");
    owned_header.aliases.clear();
    let owned_blob = blob_format::native::to_vec(&owned_header, &graph_with(1, true).encode());
    let mut owned = init(&delegate, &owned_blob).expect("a blob with delegate-owned caches");
    let mut caller = init(&delegate, &blob_with(&header(1), 1)).expect("valid blob");
    let mut state = State::new(1);

    let owned_step = |handle: &mut ReferenceHandle, token: i64, position: i64| {
        let (tokens, position) = ([token], [position]);
        let mut logits = vec![0.0f32; VOCAB as usize];
        let mut list = ArgList::new();
        let host = MemoryKind::Host;
        list.push_input(bytemuck::cast_slice(&tokens), DTypeCode::I64, &[1], host).expect("sized");
        list.push_input(bytemuck::cast_slice(&position), DTypeCode::I64, &[1], host).expect("sized");
        list.push_output(bytemuck::cast_slice_mut(&mut logits), DTypeCode::F32, &[1, VOCAB as i64], host)
            .expect("sized");
        let stats = run_list(&delegate, handle, &list).expect("owned step");
        assert_eq!(stats, ExecStats::default(), "the delegate's own caches move nothing across the ABI");
        logits
    };
    // Each step of the owned instance sees its earlier steps, exactly as the caller's caches do.
    for (position, token) in [(0, 2), (1, 4), (2, 0), (3, 1)] {
        step(&delegate, &mut caller, &mut state, &[token], position, Slots::InPlace).expect("caller step");
        assert_eq!(owned_step(&mut owned, token, position), state.logits, "step at {position}");
    }
    // A second instance starts from zeroed caches of its own: its first step at position 3 differs.
    let mut other = init(&delegate, &owned_blob).expect("valid blob");
    let mut fresh = State::new(1);
    step(&delegate, &mut caller, &mut fresh, &[1], 3, Slots::InPlace).expect("caller step on zeroed caches");
    assert_eq!(owned_step(&mut other, 1, 3), fresh.logits, "instances do not share state");
}
