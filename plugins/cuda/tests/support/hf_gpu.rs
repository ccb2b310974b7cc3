//! The Hugging Face forms on the GPU (`support/hf.rs`'s decoder, f32, f16 and bf16), checked against the CPU
//! reference delegate running the same graph: every step's logits within the float type's tolerance, the
//! greedy tokens equal in f32, the caches (device memory, updated in place) equal at the end, no host
//! synchronisation inside `execute`, and the decode step captured once as a CUDA graph and replayed.

use cuda_rt::{Allocation, Context, Device, Stream};
use delegate_abi::host::{ArgList, Instance, Plugin, Slot};
use delegate_abi::{CudaStream, DTypeCode, ExecStats, InitContext, MemoryKind};
use host_runtime::cuda::{push_raw, push_raw_input, Access, RawInput, RawMemory};
use ref_graph::{ElemType, Graph};

use super::gpu;
use super::hf::{self, Hf};

const PROMPT: [i64; 5] = [3, 17, 42, 5, 88];
const STEPS: usize = 12;

/// Largest difference from the reference, relative to the largest reference logit (at least 1). The CPU
/// reference rounds every op's output to the model's type as the GPU does and computes in f32, so what
/// differs is summation order: a few f32 ulps, or one rounding of the storage type flipped (f16 2^-11,
/// bf16 2^-8 relative) and carried through two layers.
fn tolerance(dtype: ElemType) -> f32 {
    match dtype {
        ElemType::F16 => 2e-2,
        ElemType::Bf16 => 1e-1,
        _ => 1e-4,
    }
}

fn code(dtype: ElemType) -> DTypeCode {
    DTypeCode::try_from(dtype.dtype()).expect("a tensor dtype")
}

fn floats(bytes: &[u8], dtype: ElemType) -> Vec<f32> {
    match dtype {
        ElemType::F16 => {
            bytes.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect()
        }
        ElemType::Bf16 => {
            bytes.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32()).collect()
        }
        _ => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
    }
}

fn relative_diff(actual: &[f32], expected: &[f32]) -> f32 {
    assert_eq!(actual.len(), expected.len());
    let scale = expected.iter().fold(1f32, |m, v| m.max(v.abs()));
    let diff = |(a, e): (&f32, &f32)| if (a - e).is_nan() { f32::INFINITY } else { (a - e).abs() };
    actual.iter().zip(expected).map(diff).fold(0.0, f32::max) / scale
}

fn shape(graph: &Graph, name: &str) -> Vec<i64> {
    let id = graph.find(name).unwrap_or_else(|| panic!("no tensor {name}"));
    graph.tensor(id).shape.iter().map(|&d| d as i64).collect()
}

fn cache_bytes(cfg: &Hf) -> usize {
    cfg.cache_shape().iter().product::<u64>() as usize * cfg.dtype.size_bytes()
}

/// One method on both delegates.
struct Method {
    graph: Graph,
    reference: Instance,
    cuda: Instance,
}

impl Method {
    fn new(cfg: &Hf, rows: u64, reference: &Plugin, cuda: &Plugin) -> Method {
        let graph = hf::build(cfg, rows);
        let init = |plugin: &Plugin, backend: &str| {
            let blob = hf::blob(&graph, backend);
            plugin.init(&InitContext { blob: &blob, compile_specs: &[], runtime_specs: &[] }).expect("init")
        };
        let reference = init(reference, reference_delegate::BACKEND_ID);
        let cuda = init(cuda, cuda_delegate::BACKEND_ID);
        Method { graph, reference, cuda }
    }
}

/// The reference delegate's call on host memory: (logits, next token).
fn reference_call(m: &mut Method, caches: &mut [Vec<u8>], ids: &[i64], pos: i64) -> (Vec<f32>, i64) {
    let g = &m.graph;
    let dtype = g.tensor(g.find(hf::LOGITS).expect("logits")).dtype;
    let logits_shape = shape(g, hf::LOGITS);
    let mut logits = vec![0u8; logits_shape.iter().product::<i64>() as usize * dtype.size_bytes()];
    let mut next = [0i64];
    let position = [pos];
    {
        let mut list = ArgList::new();
        list.push_input(bytemuck::cast_slice(ids), DTypeCode::I64, &shape(g, hf::IDS), MemoryKind::Host)
            .expect("ids");
        list.push_input(bytemuck::cast_slice(&position), DTypeCode::I64, &[1], MemoryKind::Host)
            .expect("pos");
        let cache_shape = shape(g, &hf::k_cache(0));
        let slots: Vec<Slot> = caches
            .iter_mut()
            .map(|c| list.push_inout(c, code(dtype), &cache_shape, MemoryKind::Host).expect("cache"))
            .collect();
        list.push_output(&mut logits, code(dtype), &logits_shape, MemoryKind::Host).expect("logits");
        list.push_output(bytemuck::cast_slice_mut(&mut next), DTypeCode::I64, &[1], MemoryKind::Host)
            .expect("next");
        for slot in slots {
            list.push_output_in_place(slot, code(dtype), &cache_shape).expect("cache out");
        }
        m.reference.execute(&mut list, None).expect("the reference runs the graph");
    }
    (floats(&logits, dtype), next[0])
}

/// A method's device-resident arguments besides the caches.
struct DeviceIo {
    ids: Allocation<Device>,
    pos: Allocation<Device>,
    logits: Allocation<Device>,
    next: Allocation<Device>,
}

impl DeviceIo {
    fn new(ctx: &Context, m: &Method) -> DeviceIo {
        let g = &m.graph;
        let logits = g.tensor(g.find(hf::LOGITS).expect("logits"));
        let alloc = |bytes| Allocation::<Device>::zeroed(ctx, bytes).expect("device memory");
        DeviceIo {
            ids: alloc(g.tensor(g.find(hf::IDS).expect("ids")).nbytes()),
            pos: alloc(8),
            logits: alloc(logits.nbytes()),
            next: alloc(8),
        }
    }

    /// Writes the call's tokens and position (blocking copies: outside any measured or captured region).
    fn set(&mut self, ids: &[i64], pos: i64) {
        self.ids.write(bytemuck::cast_slice(ids)).expect("ids");
        self.pos.write(bytemuck::bytes_of(&pos)).expect("position");
    }

    fn read(&self, dtype: ElemType) -> (Vec<f32>, i64) {
        let next = self.next.read().expect("next token");
        (
            floats(&self.logits.read().expect("logits"), dtype),
            i64::from_le_bytes(next[..8].try_into().expect("8")),
        )
    }
}

/// The CUDA delegate's call with every argument in device memory, queued on `stream` (not waited for):
/// the host synchronisations `execute` made, and its stats.
fn cuda_call(
    m: &mut Method,
    io: &mut DeviceIo,
    caches: &mut [Allocation<Device>],
    stream: Option<&Stream>,
) -> Result<(u64, ExecStats), delegate_abi::DelegateError> {
    let g = &m.graph;
    let dtype = g.tensor(g.find(hf::LOGITS).expect("logits")).dtype;
    let cache_shape = shape(g, &hf::k_cache(0));
    let mut list = ArgList::new();
    let DeviceIo { ids, pos, logits, next } = io;
    push_raw_input(&mut list, RawInput::device(ids), DTypeCode::I64, &shape(g, hf::IDS)).expect("ids");
    push_raw_input(&mut list, RawInput::device(pos), DTypeCode::I64, &[1]).expect("pos");
    let slots: Vec<Slot> = caches
        .iter_mut()
        .map(|c| {
            push_raw(&mut list, RawMemory::device(c), code(dtype), &cache_shape, Access::InOut)
                .expect("cache")
        })
        .collect();
    push_raw(&mut list, RawMemory::device(logits), code(dtype), &shape(g, hf::LOGITS), Access::Write)
        .expect("logits");
    push_raw(&mut list, RawMemory::device(next), DTypeCode::I64, &[1], Access::Write).expect("next");
    for slot in slots {
        list.push_output_in_place(slot, code(dtype), &cache_shape).expect("cache out");
    }
    // SAFETY: the stream is a live stream of device 0's primary context, and every argument outlives the
    // work queued on it (the caller synchronises before reading or freeing anything).
    let raw = stream.and_then(|s| unsafe { CudaStream::from_raw(s.as_ref().as_raw()) });
    let before = cuda_rt::stats::thread_host_syncs();
    let stats = m.cuda.execute(&mut list, raw)?;
    Ok((cuda_rt::stats::thread_host_syncs() - before, stats))
}

/// Both delegates, the caches of each, and the methods.
struct Pair {
    cfg: Hf,
    /// The prompt the prefill method takes (its rows).
    prompt: Vec<i64>,
    prefill: Method,
    decode: Method,
    host_caches: Vec<Vec<u8>>,
    caches: Vec<Allocation<Device>>,
    prefill_io: DeviceIo,
    decode_io: DeviceIo,
    stream: Stream,
}

impl Pair {
    /// Every normalised projection stages its row (`kernels::gemv_stage`). A vocabulary and SwiGLU this wide
    /// make the vocabulary and gate/up projections 1 125 and 1 024 groups of columns, more than a wave of
    /// blocks, so a block takes several (`kernels::gemv_blocks`, the `_waves` entries); a hidden size of
    /// 1 024 makes their rows whole rings of loads, which run on from one column into the next.
    fn wide(dtype: ElemType) -> Hf {
        Hf { vocab: 9000, ffn: 4096, dim: 1024, heads: 8, head_dim: 128, ..Hf::tiny(dtype) }
    }

    /// The same projections over rows of 64 values, less than a ring: a block of the `_waves` entries loads
    /// each of its groups' first ring as the group starts.
    fn narrow(dtype: ElemType) -> Hf {
        Hf { vocab: 9000, ffn: 4096, ..Hf::tiny(dtype) }
    }

    /// Two KV heads of 64 values, each shared by 4 query heads, over a cache of 1 024 rows: on sm_90 the
    /// tensor-core attention's ranges of a KV head are one thread-block cluster of 8 blocks
    /// (`kernels::attention_tc_cluster`), which merge through each other's shared memory.
    fn clustered(dtype: ElemType) -> Hf {
        Hf { dim: 512, heads: 8, kv_heads: 2, head_dim: 64, max_len: 1024, ..Hf::tiny(dtype) }
    }

    /// As [`Pair::clustered`] over a cache of 8 192 rows: a KV head's ranges are one cluster of 16 blocks,
    /// whose warps take up to 4 tiles of 16 rows each.
    fn clustered_long(dtype: ElemType) -> Hf {
        Hf { max_len: 8192, ..Pair::clustered(dtype) }
    }

    /// [`Pair::wide`]'s heads of 128 (4 query heads a KV head, one tensor-core block) over a cache of 8 192
    /// rows: config (c)'s heads and cache, whose ranges (up to a few dozen a head) merge by tickets
    /// (`kernels::attention_tc_cluster` keeps clusters for heads of 64).
    fn ticket_long(dtype: ElemType) -> Hf {
        Hf { max_len: 8192, ..Pair::wide(dtype) }
    }

    /// 12 query heads of 128 over 4 KV heads (3 a KV head, so one a tensor-core block) and 2 048 cache rows,
    /// merged by tickets.
    fn ticket_uneven(dtype: ElemType) -> Hf {
        Hf { dim: 1536, heads: 12, kv_heads: 4, max_len: 2048, ..Pair::wide(dtype) }
    }

    fn new(ctx: &Context, cfg: Hf) -> Pair {
        Pair::with_prompt(ctx, cfg, PROMPT.to_vec())
    }

    /// A pair whose prefill method takes `prompt`'s rows.
    fn with_prompt(ctx: &Context, cfg: Hf, prompt: Vec<i64>) -> Pair {
        let reference = Plugin::embedded(reference_delegate::delegate_root()).expect("reference plugin");
        let cuda = super::plugin();
        let prefill = Method::new(&cfg, prompt.len() as u64, &reference, &cuda);
        let decode = Method::new(&cfg, 1, &reference, &cuda);
        let n = 2 * cfg.layers;
        let caches =
            (0..n).map(|_| Allocation::<Device>::zeroed(ctx, cache_bytes(&cfg)).expect("cache")).collect();
        Pair {
            host_caches: vec![vec![0u8; cache_bytes(&cfg)]; n],
            caches,
            prefill_io: DeviceIo::new(ctx, &prefill),
            decode_io: DeviceIo::new(ctx, &decode),
            stream: Stream::new(ctx).expect("stream"),
            cfg,
            prompt,
            prefill,
            decode,
        }
    }

    /// The prompt on both: the reference's next token, after checking the GPU's logits and token.
    fn prefill(&mut self) -> i64 {
        let (expected, token) = reference_call(&mut self.prefill, &mut self.host_caches, &self.prompt, 0);
        self.prefill_io.set(&self.prompt, 0);
        cuda_call(&mut self.prefill, &mut self.prefill_io, &mut self.caches, Some(&self.stream))
            .expect("prefill");
        self.stream.synchronize().expect("stream");
        self.check("prefill", &expected, token);
        token
    }

    /// The GPU's outputs of the last call against the reference's.
    fn check(&self, what: &str, expected: &[f32], token: i64) {
        let io = if what == "prefill" { &self.prefill_io } else { &self.decode_io };
        let (logits, next) = io.read(self.cfg.dtype);
        let diff = relative_diff(&logits, expected);
        let dtype = self.cfg.dtype;
        assert!(
            diff <= tolerance(dtype),
            "{dtype} {what}: logits differ from the reference by {diff:e} (relative)"
        );
        if dtype == ElemType::F32 {
            assert_eq!(next, token, "{what}: the device argmax is the reference's token");
        }
    }

    /// The caches on the GPU against the reference's (only the rows written: the rest are zero on both).
    fn check_caches(&self) {
        for (i, (device, host)) in self.caches.iter().zip(&self.host_caches).enumerate() {
            let got = floats(&device.read().expect("cache"), self.cfg.dtype);
            let want = floats(host, self.cfg.dtype);
            let diff = relative_diff(&got, &want);
            assert!(diff <= tolerance(self.cfg.dtype), "{}: cache {i} differs by {diff:e}", self.cfg.dtype);
        }
    }
}

const DTYPES: [ElemType; 3] = [ElemType::F32, ElemType::F16, ElemType::Bf16];

/// Prefill and 12 decode steps of the Hugging Face forms in f32, f16 and bf16, each in both shapes
/// ([`Pair::wide`] and [`Pair::narrow`]: the `_waves` GEMVs over whole rings and over shorter rows): each
/// step's logits against the CPU reference's (the GPU fed the reference's tokens, so a near tie that rounding
/// breaks the other way cannot hide a wrong step), the tokens equal in f32, no host synchronisation in any
/// decode `execute`, no byte staged or reflected, and the device caches equal to the reference's at the end.
#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn hf_decoder_matches_the_cpu_reference_in_every_float_type() {
    let Some(ctx) = gpu() else { return };
    for cfg in DTYPES.into_iter().flat_map(|dtype| [Pair::wide(dtype), Pair::narrow(dtype)]) {
        decode_against_reference(&ctx, cfg);
    }
}

/// Gemma 2's logit soft-capping (`causal_attention`'s `softcap`) in every attention entry: `attention` with
/// whole vectors (f32; halves with heads of 16), without (halves with heads of 12), `attention_tc` merging by
/// tickets (halves with heads of 128) and in clusters (halves with heads of 64, sm_90): prefill and decode
/// against the CPU reference as above. The cap (0.5) is below these scores, so an ignored cap shows.
#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn soft_capped_attention_matches_the_cpu_reference_in_every_kernel() {
    let Some(ctx) = gpu() else { return };
    let capped = |cfg: Hf| Hf { softcap: Some(0.5), ..cfg };
    for dtype in DTYPES {
        let odd = Hf { head_dim: 12, ..Hf::tiny(dtype) };
        for cfg in [Pair::narrow(dtype), odd, Pair::wide(dtype), Pair::clustered(dtype)] {
            decode_against_reference(&ctx, capped(cfg));
        }
    }
}

/// Prefill and [`STEPS`] decode steps of `cfg` on the GPU against the CPU reference (see
/// [`hf_decoder_matches_the_cpu_reference_in_every_float_type`]).
fn decode_against_reference(ctx: &Context, cfg: Hf) {
    decode_after_prompt(ctx, cfg, PROMPT.to_vec());
}

/// [`decode_against_reference`] after a prefill of `prompt`.
fn decode_after_prompt(ctx: &Context, cfg: Hf, prompt: Vec<i64>) {
    let dtype = cfg.dtype;
    let mut pair = Pair::with_prompt(ctx, cfg, prompt);
    let mut token = pair.prefill();
    for step in 0..STEPS {
        let pos = (pair.prompt.len() + step) as i64;
        let (expected, next) = reference_call(&mut pair.decode, &mut pair.host_caches, &[token], pos);
        pair.decode_io.set(&[token], pos);
        let (syncs, stats) =
            cuda_call(&mut pair.decode, &mut pair.decode_io, &mut pair.caches, Some(&pair.stream))
                .expect("decode");
        assert_eq!(syncs, 0, "{dtype} step {step}: execute waited for the GPU");
        assert_eq!((stats.staged_bytes, stats.reflect_bytes), (0, 0), "{dtype}: nothing copied");
        pair.stream.synchronize().expect("stream");
        pair.check(&format!("decode step {step}"), &expected, next);
        token = next;
    }
    pair.check_caches();
}

/// The decode step captured once as a CUDA graph (every argument in device memory, the token and position
/// read from it) and replayed for the following steps: the same logits as the reference's, f32 tokens equal.
#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn hf_decode_step_replays_as_a_cuda_graph() {
    let Some(ctx) = gpu() else { return };
    for dtype in DTYPES {
        let mut pair = Pair::new(&ctx, Pair::wide(dtype));
        let mut token = pair.prefill();
        let pos = PROMPT.len() as i64;
        // The first step runs as a plain call (the delegate checks the new pointers with the driver once).
        let (expected, next) = reference_call(&mut pair.decode, &mut pair.host_caches, &[token], pos);
        pair.decode_io.set(&[token], pos);
        cuda_call(&mut pair.decode, &mut pair.decode_io, &mut pair.caches, Some(&pair.stream))
            .expect("decode");
        pair.stream.synchronize().expect("stream");
        pair.check("decode step 0", &expected, next);
        token = next;
        pair.stream.begin_capture().expect("capture");
        let captured = cuda_call(&mut pair.decode, &mut pair.decode_io, &mut pair.caches, Some(&pair.stream));
        let graph = pair.stream.end_capture().expect("a capturable decode step");
        assert_eq!(captured.expect("captured call").0, 0, "{dtype}: no host synchronisation while capturing");
        for step in 1..STEPS {
            let pos = (PROMPT.len() + step) as i64;
            let (expected, next) = reference_call(&mut pair.decode, &mut pair.host_caches, &[token], pos);
            pair.decode_io.set(&[token], pos);
            // SAFETY: the captured call's arguments (`pair`'s allocations) and the instance's own memory are
            // alive and untouched until the stream is synchronised below; the stream is of the graph's context.
            unsafe { graph.launch(pair.stream.as_ref()) }.expect("replay");
            pair.stream.synchronize().expect("stream");
            pair.check(&format!("replayed step {step}"), &expected, next);
            token = next;
        }
        pair.check_caches();
    }
}

/// Decode steps of [`Pair::clustered`] and [`Pair::clustered_long`] in f16 and bf16 (the types with the
/// tensor-core attention) at positions across their caches: from 1 range to all of a cluster's, some of its
/// blocks with no range and one whose range is short, warps of one tile to four (the long cache at 8 191);
/// each step's logits against the CPU reference's (the rows between are zero on both sides), and the caches
/// at the end.
#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn hf_attention_merged_in_clusters_matches_the_cpu_reference() {
    let Some(ctx) = gpu() else { return };
    let narrow = [5, 100, 129, 600, 1023].as_slice();
    let long = [5, 129, 600, 2100, 4096, 6000, 8191].as_slice();
    for dtype in [ElemType::F16, ElemType::Bf16] {
        for (cfg, positions) in [(Pair::clustered(dtype), narrow), (Pair::clustered_long(dtype), long)] {
            decode_at(&ctx, cfg, positions);
        }
    }
}

/// Decode steps of [`Pair::ticket_long`] and [`Pair::ticket_uneven`] in f16 and bf16 (the tensor-core
/// attention's ticket merge) at positions across their caches, from 1 range a head to all of them: each
/// step's logits against the CPU reference's, and the caches at the end.
#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn hf_attention_merged_by_tickets_matches_the_cpu_reference() {
    let Some(ctx) = gpu() else { return };
    let long = [5, 100, 1000, 4096, 8191].as_slice();
    let uneven = [5, 33, 700, 2047].as_slice();
    for dtype in [ElemType::F16, ElemType::Bf16] {
        for (cfg, positions) in [(Pair::ticket_long(dtype), long), (Pair::ticket_uneven(dtype), uneven)] {
            decode_at(&ctx, cfg, positions);
        }
    }
}

/// `cfg`'s prompt, then one decode step at each of `positions` (the rows between are zero on both sides),
/// each step's logits against the CPU reference's, and the caches at the end.
fn decode_at(ctx: &Context, cfg: Hf, positions: &[i64]) {
    let mut pair = Pair::new(ctx, cfg);
    let mut token = pair.prefill();
    for &pos in positions {
        let (expected, next) = reference_call(&mut pair.decode, &mut pair.host_caches, &[token], pos);
        pair.decode_io.set(&[token], pos);
        cuda_call(&mut pair.decode, &mut pair.decode_io, &mut pair.caches, Some(&pair.stream))
            .expect("decode");
        pair.stream.synchronize().expect("stream");
        let what = format!("{} heads, {} rows: decode at {pos}", pair.cfg.heads, pair.cfg.max_len);
        pair.check(&what, &expected, next);
        token = next;
    }
    pair.check_caches();
}

/// A token id outside the vocabulary and a position past the cache, in the Hugging Face forms (`[1, T]` ids,
/// head-major caches), are typed errors of the call that read them; the instance stays usable.
#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn hf_out_of_range_token_and_position_are_reported() {
    let Some(ctx) = gpu() else { return };
    let mut pair = Pair::new(&ctx, Pair::wide(ElemType::Bf16));
    let vocab = pair.cfg.vocab as i64;
    let max_len = pair.cfg.max_len as i64;
    for (ids, pos, expected) in [
        ([vocab + 3], 4, "a token id outside the embedding table"),
        ([1], max_len, "a position outside the cache"),
        ([-1], 4, "a token id outside the embedding table"),
    ] {
        pair.decode_io.set(&ids, pos);
        let err =
            cuda_call(&mut pair.decode, &mut pair.decode_io, &mut pair.caches, None).expect_err("refused");
        assert_eq!(err.code, et_error::ErrorCode::InvalidArgument, "{err}");
        assert!(err.to_string().contains(expected), "{err}");
    }
    pair.decode_io.set(&[1], 4);
    cuda_call(&mut pair.decode, &mut pair.decode_io, &mut pair.caches, None)
        .expect("a valid call after bad ones");
}

/// A prompt of `len` distinct tokens below `vocab`.
fn long_prompt(len: usize, vocab: u64) -> Vec<i64> {
    (0..len as i64).map(|i| (i * 37 + 11) % vocab as i64).collect()
}

/// Long prefills: the products run as cuBLAS GEMMs on tensor cores (`gemm`: f16 and bf16 with f32
/// accumulation, f32 without TF32) between the norms, SwiGLU, biases, residual adds and cache updates of the
/// plan's own launches, and in f16 and bf16 the attention of heads of 64 and 128 values is the prefill kernel
/// (`gemm::attention`: blocks of 64 query rows over tiles of 64 cache rows, causal per row). [`Pair::wide`]
/// (heads of 128) and [`Pair::clustered`] (heads of 64, 4 query heads a KV head) take a prompt of 100 tokens
/// (two blocks of query rows, the second partial; two cache tiles), [`Pair::narrow`] (heads of 16: the decode
/// kernels) one of 48; then [`STEPS`] decode steps, in every float type: the prompt's logits (every row) and
/// each step's within the type's tolerance of the CPU reference's, f32 tokens equal, the caches equal at the
/// end. Then each prefill captured as a CUDA graph (cuBLAS on the caller's stream with the workspace given at
/// `init`) and replayed: the same logits again.
#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn long_prefill_on_tensor_cores_matches_the_cpu_reference() {
    let Some(ctx) = gpu() else { return };
    cuda_rt::Blas::new(&ctx).expect("cuBLAS where the GPU is: a prefill's products run on it");
    for dtype in DTYPES {
        let shapes = [
            (Hf { max_len: 128, ..Pair::wide(dtype) }, 100),
            (Pair::clustered(dtype), 100),
            (Hf { max_len: 64, ..Pair::narrow(dtype) }, 48),
        ];
        for (cfg, len) in shapes {
            decode_after_prompt(&ctx, cfg.clone(), long_prompt(len, cfg.vocab));
            let mut pair = Pair::with_prompt(&ctx, cfg.clone(), long_prompt(len, cfg.vocab));
            pair.prefill();
            let prompt = pair.prompt.clone();
            let (expected, token) = reference_call(&mut pair.prefill, &mut pair.host_caches, &prompt, 0);
            pair.stream.begin_capture().expect("capture");
            let captured =
                cuda_call(&mut pair.prefill, &mut pair.prefill_io, &mut pair.caches, Some(&pair.stream));
            let graph = pair.stream.end_capture().expect("a capturable prefill");
            let syncs = captured.expect("captured call").0;
            assert_eq!(syncs, 0, "{dtype}: no host synchronisation while capturing");
            // SAFETY: the captured call's arguments (`pair`'s allocations) and the instance's own memory are
            // alive and untouched until the stream is synchronised below; the stream is of the graph's
            // context.
            unsafe { graph.launch(pair.stream.as_ref()) }.expect("replay");
            pair.stream.synchronize().expect("stream");
            pair.check("prefill", &expected, token);
            pair.check_caches();
        }
    }
}
