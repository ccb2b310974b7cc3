//! The device generation loop, CUDA graphs and the program's stream, end to end on a GPU, with a small
//! GPU delegate of this test's own (`CountingBackend`): each call writes its tokens into a device cache at
//! `input_pos` and computes the next token from the whole cache prefix, on the caller's stream, so a lost or
//! reordered update changes every later token. An independent host model gives the expected tokens. Its
//! logits are exact (multiples of 1/4, in f32 or bf16) and depend on the cache too, so the device loop's
//! sampler kernel and the host's `sampling::Sampler` are compared on the same logits, token for token, with
//! tokens streamed through the mailbox.
//!
//! On a machine without a CUDA driver every test checks the typed `NotSupported` refusal instead and says
//! that it needs a GPU, so none passes silently. Run on a GPU machine with
//! `cargo test -p host-runtime --test device_loop -- --nocapture`.

use std::ffi::c_void;
use std::path::Path;

use blob_format::model::{Alias, AliasKind, Binding, DType, Dim, Header, PayloadKind, Role};
use cuda_rt::{Context, Function, LaunchConfig, StreamRef};
use delegate_abi::host::HostConfig;
use delegate_abi::{
    Compatibility, Delegate, DelegateError, ExecuteArgs, InitContext, MemoryKind, PluginInfo,
};
use et_error::{ErrorCode, HasErrorCode};
use host_runtime::generate::{
    continue_from, device_loop_refusal, generate_streaming, generate_with, Options, StreamedGeneration,
};
use host_runtime::manifest::Manifest;
use host_runtime::plugins::{Discovery, Registry};
use host_runtime::program::{Error, Mode, Program};
use sampling::{Params, Sampler};

#[path = "support/sampler_params.rs"]
mod sampler_params;
use sampler_params::parameter_sets;

const BACKEND: &str = "CountingBackend";
const PROMPT: [i64; 3] = [3, 1, 4];
const POSITIONS: usize = 12;
const VOCAB: usize = 7;

const KERNEL: &str = r#"
extern "C" __global__ void counting_step(
    const long long* tokens, const long long* pos_in, const long long* cache_in, long long* cache_out,
    long long* next_out, void* logits, long long rows, long long capacity, long long vocab, int bf16)
{
    if (blockIdx.x != 0 || threadIdx.x != 0) { return; }
    long long pos = pos_in[0];
    if (cache_out != cache_in) { for (long long k = 0; k < capacity; ++k) { cache_out[k] = cache_in[k]; } }
    for (long long i = 0; i < rows; ++i) { if (pos + i < capacity) { cache_out[pos + i] = tokens[i]; } }
    long long end = pos + rows < capacity ? pos + rows : capacity;
    long long sum = 0;
    for (long long k = 0; k < end; ++k) { sum += cache_out[k] * (k + 1); }
    long long next = (sum + pos) % vocab;
    next_out[0] = next;
    // Exact logits that follow the sequence: -5 to 5 in steps of 1/4, many ids tied.
    for (long long j = 0; j < vocab; ++j) {
        float value = (float)((sum * 7 + j * 13 + pos * 3) % 41) * 0.25f - 5.0f;
        if (bf16) { ((unsigned short*)logits)[j] = (unsigned short)(__float_as_uint(value) >> 16); }
        else { ((float*)logits)[j] = value; }
    }
}
"#;

/// The model on the host: the cache after each step and the token it produces.
fn expected(steps: usize, start: Option<i64>) -> (Vec<i64>, Vec<i64>) {
    let mut cache = vec![0i64; POSITIONS];
    let step = |cache: &mut Vec<i64>, tokens: &[i64], pos: i64| {
        for (i, &t) in tokens.iter().enumerate() {
            cache[pos as usize + i] = t;
        }
        let end = pos as usize + tokens.len();
        let sum: i64 = cache[..end].iter().enumerate().map(|(k, &v)| v * (k as i64 + 1)).sum();
        (sum + pos) % VOCAB as i64
    };
    let mut tokens = vec![step(&mut cache, &PROMPT, 0)];
    let first = start.unwrap_or(PROMPT.len() as i64);
    for pos in first..first + steps as i64 {
        let last = *tokens.last().expect("prefill's token");
        tokens.push(step(&mut cache, &[last], pos));
    }
    (tokens, cache)
}

struct Counting;

struct Handle {
    ctx: Context,
    kernel: Function,
}

impl Delegate for Counting {
    type Handle = Handle;

    fn new() -> Self {
        Counting
    }

    fn info() -> PluginInfo {
        PluginInfo::new("counting-delegate", "0.1.0")
            .with_backend(BACKEND)
            .with_memory_kinds([MemoryKind::Device, MemoryKind::Managed])
            .with_binds_aliases_in_place(true)
            .with_capabilities(
                delegate_abi::Capabilities::default()
                    .with_caller_stream(true)
                    .with_cuda_graph_capturable(true)
                    .with_rewind_fork_without_reinit(true),
            )
    }

    fn compatibility(&self, _blob: &[u8]) -> Compatibility {
        Compatibility::Supported
    }

    fn init(&self, _ctx: InitContext<'_>) -> Result<Handle, DelegateError> {
        let failed = |err: cuda_rt::Error| DelegateError::new(err.error_code(), err.to_string());
        let ctx = Context::open(0).map_err(failed)?;
        let kernel =
            ctx.compile_module(KERNEL, &[]).and_then(|m| m.function("counting_step")).map_err(failed)?;
        Ok(Handle { ctx, kernel })
    }

    fn execute(&self, handle: &mut Handle, args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
        let failed = |err: cuda_rt::Error| DelegateError::new(err.error_code(), err.to_string());
        let address = |i: usize| args.arg(i).map(|a| a.data as u64);
        let (mut tokens, mut pos, mut cache_in, mut cache_out, mut next, mut logits) =
            (address(0)?, address(1)?, address(2)?, address(3)?, address(4)?, address(5)?);
        let mut rows = (args.arg(0)?.nbytes / 8) as i64;
        let capacity_bytes = args.arg(2)?.nbytes;
        let logits_arg = args.arg(5)?;
        let (mut capacity, mut vocab) = ((capacity_bytes / 8) as i64, logits_arg.shape[1]);
        let mut bf16 = i32::from(logits_arg.nbytes == vocab as u64 * 2);
        if cache_in != cache_out {
            args.record_reflect(capacity_bytes);
        }
        let mut params: [*mut c_void; 10] = [
            (&mut tokens as *mut u64).cast(),
            (&mut pos as *mut u64).cast(),
            (&mut cache_in as *mut u64).cast(),
            (&mut cache_out as *mut u64).cast(),
            (&mut next as *mut u64).cast(),
            (&mut logits as *mut u64).cast(),
            (&mut rows as *mut i64).cast(),
            (&mut capacity as *mut i64).cast(),
            (&mut vocab as *mut i64).cast(),
            (&mut bf16 as *mut i32).cast(),
        ];
        let stream = match args.stream() {
            // SAFETY: the host's stream, valid until the work queued on it completes (the ABI's contract).
            Some(stream) => unsafe { StreamRef::from_raw(stream.as_raw()) },
            None => StreamRef::legacy_default(),
        };
        let config = LaunchConfig { grid: (1, 1, 1), block: (1, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the parameters match `counting_step`'s, in order; the host passed device or managed memory of
        // the declared sizes (tokens `rows` i64, position 1, caches `capacity`, next 1, logits `vocab` f32 or
        // bf16, told apart by their bytes),
        // kept for the delegate until the stream passes this work (the ABI's completion rule).
        unsafe { handle.kernel.launch(config, stream, &mut params) }.map_err(failed)?;
        if args.stream().is_none() {
            handle.ctx.synchronize().map_err(failed)?;
        }
        Ok(())
    }
}

delegate_abi::export_delegate!(@embedded Counting);

/// The shape of a counting program: its vocabulary, cache positions and logits type.
#[derive(Clone, Copy)]
struct Shape {
    vocab: usize,
    positions: usize,
    logits: DType,
}

/// The shape the greedy tests use.
const SMALL: Shape = Shape { vocab: VOCAB, positions: POSITIONS, logits: DType::F32 };

fn blob(rows: u64, shape: Shape) -> Vec<u8> {
    let binding = |name: &str, role, dtype, shape: &[u64]| Binding {
        name: name.to_owned(),
        role,
        dtype: Some(dtype),
        shape: Some(shape.iter().map(|&d| Dim::Static(d)).collect()),
        threaded: true,
    };
    let cache = [shape.positions as u64];
    let header = Header::new(
        BACKEND,
        PayloadKind::Other("counting".to_owned()),
        vec![
            binding("tokens", Role::Input, DType::I64, &[rows]),
            binding("input_pos", Role::Input, DType::I64, &[1]),
            binding("cache", Role::Input, DType::I64, &cache),
            binding("cache_out", Role::Output, DType::I64, &cache),
            binding("next", Role::Output, DType::I64, &[1]),
            binding("logits", Role::Output, shape.logits, &[1, shape.vocab as u64]),
        ],
        vec![Alias {
            output: "cache_out".to_owned(),
            input: "cache".to_owned(),
            kind: AliasKind::KvCacheUpdate,
        }],
    );
    blob_format::native::to_vec(&header, b"counting")
}

/// Writes a program of `shape` with its cache and every method input and output in `memory`.
fn write_shaped(dir: &Path, memory: &str, shape: Shape) -> std::path::PathBuf {
    let Shape { vocab, positions, logits } = shape;
    let tag = format!("{memory}-{vocab}-{positions}-{}", logits.name());
    std::fs::write(dir.join(format!("prefill-{tag}.blob")), blob(PROMPT.len() as u64, shape)).expect("blob");
    std::fs::write(dir.join(format!("decode-{tag}.blob")), blob(1, shape)).expect("blob");
    let method = |rows: usize, blob: &str| {
        format!(
            "inputs = [{{ name = \"tokens\", dtype = \"i64\", shape = [{rows}], memory = \"{memory}\" }}, \
             {{ name = \"input_pos\", dtype = \"i64\", shape = [1], memory = \"{memory}\" }}]\n\
             outputs = [{{ name = \"next\", dtype = \"i64\", shape = [1], memory = \"{memory}\" }}, \
             {{ name = \"logits\", dtype = \"{}\", shape = [1, {vocab}], memory = \"{memory}\" }}]\n\
             calls = [{{ blob = \"{blob}\", backend = \"{BACKEND}\", args = [\"input:tokens\", \"input:input_pos\", \
             \"buffer:cache\", \"buffer:cache\", \"output:next\", \"output:logits\"] }}]\n",
            logits.name()
        )
    };
    let text = format!(
        "format = 1\n\n[buffers.cache]\ndtype = \"i64\"\nshape = [{positions}]\nmemory = \"{memory}\"\n\n\
         [methods.prefill]\n{}\n[methods.decode]\n{}\n\
         [generate]\nprefill = \"prefill\"\ndecode = \"decode\"\nprompt = {PROMPT:?}\ntoken_input = \"tokens\"\n\
         position_input = \"input_pos\"\nlogits_output = \"logits\"\nnext_token_output = \"next\"\n\
         max_positions = {positions}\n",
        method(PROMPT.len(), &format!("prefill-{tag}.blob")),
        method(1, &format!("decode-{tag}.blob")),
    );
    let path = dir.join(format!("{tag}.toml"));
    std::fs::write(&path, text).expect("manifest");
    path
}

fn load(path: &Path, mode: Mode) -> Result<Program, Error> {
    let config = HostConfig::default();
    let registry = Registry::discover(Discovery::new()).with_embedded(delegate_root(), &config);
    Program::load(Manifest::load(path).expect("manifest"), &registry, mode)
}

fn cache(program: &Program) -> Vec<i64> {
    let bytes = program.buffer("cache").expect("cache");
    bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
}

/// The program in `memory`, or `None` after checking the typed refusal of a machine without a driver.
fn program(dir: &Path, memory: &str, mode: Mode) -> Option<Program> {
    shaped(dir, memory, mode, SMALL)
}

/// The program of `shape` in `memory`, or `None` after checking the typed refusal of a machine without a
/// driver.
fn shaped(dir: &Path, memory: &str, mode: Mode, shape: Shape) -> Option<Program> {
    let path = write_shaped(dir, memory, shape);
    match (Context::open(0), load(&path, mode)) {
        (Ok(_), Ok(program)) => Some(program),
        (Err(cuda), Err(err)) => {
            eprintln!("this test needs a GPU; without one it checks the typed refusal only: {err}");
            assert_eq!(err.error_code(), ErrorCode::NotSupported, "{err}");
            // Every call was planned (blob, aliases, arguments, memory kinds) before the cache's allocation.
            assert!(matches!(&err, Error::BufferMemory { buffer, .. } if buffer == "cache"), "{err:?}");
            assert!(err.to_string().contains(&cuda.to_string()), "{err}");
            assert!(!Path::new("/dev/nvidiactl").exists(), "a driver exists but: {cuda}");
            None
        }
        (cuda, program) => panic!("CUDA {:?} but load {:?}", cuda.err(), program.err()),
    }
}

fn options(steps: usize, cuda_graph: bool) -> Options {
    let mut options = Options::steps(steps);
    options.cuda_graph = cuda_graph;
    options.gpu_timing = true;
    options
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn the_device_loop_decodes_the_models_tokens_with_no_host_synchronisation_per_step() {
    let dir = tempfile::tempdir().expect("temp dir");
    for memory in ["device", "managed"] {
        let Some(mut program) = program(dir.path(), memory, Mode::ZeroCopy) else { return };
        let steps = POSITIONS - PROMPT.len();
        let (tokens, final_cache) = expected(steps, None);
        assert_eq!(device_loop_refusal(&program).expect("generate"), None, "{memory}");

        let generation =
            generate_with(&mut program, &options(steps, false), |_, _| Ok(())).expect("device loop");
        assert!(generation.device_loop && !generation.cuda_graph);
        assert_eq!(generation.tokens, tokens, "{memory}");
        assert_eq!(cache(&program), final_cache, "{memory}: no lost or reordered cache update");
        assert_eq!(generation.host_syncs, 0, "{memory}: no host synchronisation during the decode steps");
        assert!(generation.readback_host_syncs >= 1, "the tokens are read back once");
        assert_eq!(generation.mean_decode_copies().total(), 0, "zero-copy");
        assert!(generation.steps.iter().skip(1).all(|s| s.gpu_micros.is_some_and(|t| t >= 0.0)));
        let positions: Vec<i64> = generation.steps.iter().map(|s| s.position).collect();
        assert_eq!(positions, (0..=steps as i64).map(|i| if i == 0 { 0 } else { 2 + i }).collect::<Vec<_>>());

        // The host loop over the same device memory agrees (a copy per input and output, synchronised).
        program.reset_buffers().expect("reset");
        let mut host = options(steps, false);
        host.host_loop = true;
        let by_host = generate_with(&mut program, &host, |_, _| Ok(())).expect("host loop");
        assert!(!by_host.device_loop);
        assert_eq!(by_host.tokens, tokens, "{memory}");
        assert!(by_host.host_syncs >= steps as u64, "the host loop synchronises every step");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn a_cuda_graph_replays_the_decode_step_and_decodes_the_same_tokens() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(mut program) = program(dir.path(), "device", Mode::ZeroCopy) else { return };
    let steps = POSITIONS - PROMPT.len();
    let generation = generate_with(&mut program, &options(steps, true), |_, _| Ok(())).expect("graph");
    assert!(generation.device_loop && generation.cuda_graph);
    assert!(generation.capture_micros.is_some());
    let (tokens, final_cache) = expected(steps, None);
    assert_eq!(generation.tokens, tokens);
    assert_eq!(cache(&program), final_cache);
    assert_eq!(generation.host_syncs, 0);

    // A captured method on its own, replayed by hand.
    program.reset_buffers().expect("reset");
    let captured = program.capture("decode").expect("capture");
    assert_eq!(captured.nodes(), 1, "one kernel: the delegate's");
    program.write_input("decode", "tokens", &5i64.to_le_bytes()).expect("write");
    program.write_input("decode", "input_pos", &0i64.to_le_bytes()).expect("write");
    program.replay(&captured).expect("replay");
    assert_eq!(cache(&program)[0], 5, "the replay ran the delegate's kernel");
    let mut other = self::program(dir.path(), "device", Mode::ZeroCopy).expect("a GPU, as above");
    let err = other.replay(&captured).expect_err("another program's graph");
    assert_eq!(err.to_string(), "the graph was captured by another program, whose memory it uses");
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn copy_back_on_device_memory_writes_back_on_the_stream_and_agrees_with_zero_copy() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(mut program) = program(dir.path(), "device", Mode::CopyBack) else { return };
    let steps = 4;
    for graph in [false, true] {
        program.reset_buffers().expect("reset");
        let generation =
            generate_with(&mut program, &options(steps, graph), |_, _| Ok(())).expect("copy-back");
        let (tokens, final_cache) = expected(steps, None);
        assert_eq!(generation.tokens, tokens, "graph {graph}");
        assert_eq!(cache(&program), final_cache, "graph {graph}");
        let copies = generation.mean_decode_copies();
        assert_eq!(copies.reflect_bytes, POSITIONS as u64 * 8);
        assert_eq!(copies.writeback_bytes, POSITIONS as u64 * 8, "the host's write-back");
        assert_eq!(generation.host_syncs, 0, "write-backs of device memory are queued, not waited for");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn decode_starts_at_a_given_position_on_the_device() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(mut program) = program(dir.path(), "device", Mode::ZeroCopy) else { return };
    let start = POSITIONS as i64 - 2;
    let mut opts = options(2, true);
    opts.start_position = Some(start);
    let generation = generate_with(&mut program, &opts, |_, _| Ok(())).expect("from a position");
    assert_eq!(generation.tokens, expected(2, Some(start)).0);
    let positions: Vec<i64> = generation.steps.iter().map(|s| s.position).collect();
    assert_eq!(positions, [0, start, start + 1]);
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn device_inputs_are_not_borrowed_in_place_but_written_and_read_through_copies() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(mut program) = program(dir.path(), "device", Mode::ZeroCopy) else { return };
    let err = program.input_mut("decode", "tokens").expect_err("device memory");
    assert_eq!(err.error_code(), ErrorCode::InvalidArgument);
    assert_eq!(
        err.to_string(),
        "method 'decode': input 'tokens' is in device memory, which the host cannot borrow in place; write it with write_input"
    );
    let err = program.output("decode", "next").expect_err("device memory");
    assert!(err.to_string().ends_with("read it with read_output"), "{err}");
    program.write_input("decode", "tokens", &6i64.to_le_bytes()).expect("write");
    program.write_input("decode", "input_pos", &0i64.to_le_bytes()).expect("write");
    let before = cuda_rt::stats::thread_host_syncs();
    program.enqueue("decode").expect("enqueue");
    assert_eq!(cuda_rt::stats::thread_host_syncs(), before, "enqueue returns with the work queued");
    let next = program.read_output("decode", "next").expect("read");
    assert_eq!(
        i64::from_le_bytes(next[..8].try_into().expect("8 bytes")),
        6 % VOCAB as i64,
        "cache[0] = 6, so the sum is 6 at position 0"
    );
    assert!(program.input_ptr("decode", "tokens").is_ok_and(|p| p != 0));
}

/// The model's step on the host: `tokens` written at `pos`, the next token from the cache up to them.
fn model_step(cache: &mut [i64], tokens: &[i64], pos: usize) -> i64 {
    cache[pos..pos + tokens.len()].copy_from_slice(tokens);
    let end = pos + tokens.len();
    let sum: i64 = cache[..end].iter().enumerate().map(|(k, &v)| v * (k as i64 + 1)).sum();
    (sum + pos as i64) % VOCAB as i64
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn forked_device_caches_are_copied_on_the_stream_and_each_branch_decodes_as_the_model() {
    let dir = tempfile::tempdir().expect("temp dir");
    for memory in ["device", "managed"] {
        let Some(mut program) = program(dir.path(), memory, Mode::ZeroCopy) else { return };
        let generation = generate_with(&mut program, &options(5, true), |_, _| Ok(())).expect("graph");
        let (tokens, cache_a) = expected(5, None);
        assert_eq!(generation.tokens, tokens, "{memory}");
        assert_eq!(program.position(), Some(8));
        let captured = program.capture("decode").expect("capture");
        let mut caches = program.new_caches().expect("allocates");
        let before = cuda_rt::stats::thread_host_syncs();
        let bytes = program.fork_into(5, &mut caches).expect("forks");
        assert_eq!(cuda_rt::stats::thread_host_syncs(), before, "{memory}: the copy is queued on the stream");
        assert_eq!(bytes, 5 * 8, "five i64 rows");
        assert_eq!(program.fork(5).expect("forks").bytes_copied, 5 * 8);
        program.swap_caches(&mut caches).expect("swaps");
        let err = program.replay(&captured).expect_err("captured with the other caches");
        assert_eq!(err.error_code(), ErrorCode::InvalidArgument, "{err}");
        // Branch b: token 6 at position 5, then 2 steps; its caches hold the prefix only.
        let mut model = cache_a.clone();
        model[5..].fill(0);
        let mut expect_b = vec![model_step(&mut model, &[6], 5)];
        for pos in 6..8 {
            let last = *expect_b.last().expect("a token");
            expect_b.push(model_step(&mut model, &[last], pos));
        }
        assert_eq!(continue_from(&mut program, 5, &[6], 2).expect("branch b"), expect_b, "{memory}");
        assert_eq!(cache(&program), model, "{memory}: the prefix copied, nothing past it");
        // A new CUDA graph in the fork's caches: captured over their addresses, branch a's untouched.
        program.reset().expect("reset");
        let again = generate_with(&mut program, &options(5, true), |_, _| Ok(())).expect("graph");
        assert_eq!(again.tokens, tokens, "{memory}");
        program.swap_caches(&mut caches).expect("swaps back");
        assert_eq!(cache(&program), cache_a, "{memory}: branch a's caches are as it left them");
        assert_eq!(
            continue_from(&mut program, 8, &[tokens[5]], 0).expect("branch a"),
            expected(6, None).0[6..]
        );
    }
}

/// Runs `program`'s generation streamed, checking that the tokens reach the callback in order, once each,
/// and are the generation's; stops after the token of index `stop_at` when given.
fn streamed(
    program: &mut Program,
    options: &Options,
    sampler: &Sampler,
    stop_at: Option<usize>,
) -> StreamedGeneration {
    let mut seen: Vec<i64> = Vec::new();
    let generation = generate_streaming(program, options, sampler, |token| {
        assert_eq!(token.index, seen.len(), "in order, once each");
        assert!(token.lag_tokens <= host_runtime::generate::AHEAD as u64, "{token:?}");
        seen.push(token.token);
        Ok(Some(token.index) != stop_at)
    })
    .expect("streamed generation");
    assert_eq!(seen, generation.generation.tokens, "every token streamed, and only the generation's");
    assert_eq!(generation.stream.tokens, seen.len());
    generation
}

fn sampler(params: Params) -> Sampler {
    Sampler::new(params).expect("valid parameters")
}

/// For a seed and parameters, the device loop's sampler kernel draws the tokens the host loop's
/// `sampling::Sampler` draws from the same logits, token for token: over a vocabulary larger than the
/// candidate bound (the kernel selects 1024 of 3000 ids, many tied), a small one, and bf16 logits; eagerly
/// and as a CUDA graph; with no host synchronisation during the decode steps.
#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn the_device_sampler_draws_the_host_samplers_tokens_for_every_seed_and_parameter_set() {
    let dir = tempfile::tempdir().expect("temp dir");
    let shapes = [
        Shape { vocab: 3000, positions: 40, logits: DType::F32 },
        Shape { vocab: VOCAB, positions: 40, logits: DType::F32 },
        Shape { vocab: 3000, positions: 40, logits: DType::BF16 },
    ];
    for shape in shapes {
        let Some(mut program) = shaped(dir.path(), "device", Mode::ZeroCopy, shape) else { return };
        let steps = shape.positions - PROMPT.len();
        for (i, params) in parameter_sets().into_iter().enumerate() {
            let s = sampler(params);
            let what = format!("vocab {} {:?}, {params:?}", shape.vocab, shape.logits);
            let mut on_device = options(steps, i % 2 == 1);
            on_device.gpu_timing = false;
            program.reset_buffers().expect("reset");
            let device = streamed(&mut program, &on_device, &s, None);
            assert!(device.generation.device_loop && device.stream.device_loop, "{what}");
            assert_eq!(device.stream.sampled_on_device, !s.is_plain_greedy(), "{what}");
            assert_eq!(device.generation.cuda_graph, i % 2 == 1, "{what}");
            assert_eq!(device.generation.host_syncs, 0, "{what}: no host synchronisation per decode step");
            assert_eq!(device.generation.tokens.len(), steps + 1, "{what}");

            let mut on_host = on_device.clone();
            on_host.host_loop = true;
            on_host.cuda_graph = false;
            program.reset_buffers().expect("reset");
            let host = streamed(&mut program, &on_host, &s, None);
            assert!(!host.generation.device_loop && !host.stream.device_loop, "{what}");
            assert_eq!(
                device.generation.tokens, host.generation.tokens,
                "{what}: the device draws the host's tokens"
            );
            // The tokens are not all one id: the draws are real.
            if !s.is_plain_greedy() && params.temperature > 0.0 {
                let first = device.generation.tokens[0];
                assert!(device.generation.tokens.iter().any(|&t| t != first), "{what}");
            }
        }
    }
}

/// Streaming on the device loop: every token reaches the caller in order, exactly once; a stop ends the
/// generation at that token (prefill's included) and leaves the position after the tokens fed; the lag is
/// measured; greedy streams the program's own tokens.
#[test]
#[ignore = "needs an NVIDIA GPU and driver: `cargo xtask gpu-test` runs it on one (--include-ignored, KV_REQUIRE_GPU=1)"]
fn streaming_hands_on_every_token_once_in_order_and_honours_a_stop() {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(mut program) = program(dir.path(), "device", Mode::ZeroCopy) else { return };
    let steps = POSITIONS - PROMPT.len();
    // Greedy: the model's tokens, through the mailbox.
    let greedy = streamed(&mut program, &options(steps, true), &sampler(Params::default()), None);
    assert_eq!(greedy.generation.tokens, expected(steps, None).0);
    assert!(greedy.stream.device_loop && !greedy.stream.sampled_on_device);
    assert_eq!(greedy.generation.host_syncs, 0);
    assert!(greedy.stream.mean_lag_micros.is_some_and(|us| us >= 0.0), "{:?}", greedy.stream);
    assert!(greedy.stream.max_lag_tokens <= host_runtime::generate::AHEAD as u64);
    assert_eq!(program.position(), Some(POSITIONS as u64));

    let sampled = sampler(Params { temperature: 1.0, seed: 9, ..Params::default() });
    for graph in [false, true] {
        program.reset_buffers().expect("reset");
        let all = streamed(&mut program, &options(steps, graph), &sampled, None);
        for stop in [0, 3] {
            program.reset_buffers().expect("reset");
            let cut = streamed(&mut program, &options(steps, graph), &sampled, Some(stop));
            assert_eq!(
                cut.generation.tokens,
                all.generation.tokens[..=stop],
                "graph {graph}, stop at {stop}"
            );
            assert_eq!(cut.generation.steps.len(), stop + 1);
            assert_eq!(program.position(), Some((PROMPT.len() + stop) as u64), "the tokens fed");
        }
        // The host loop stopped early with GPU timing: only the steps that ran are timed (the events of the
        // others were never recorded).
        let mut host = options(steps, false);
        host.host_loop = true;
        program.reset_buffers().expect("reset");
        let cut = streamed(&mut program, &host, &sampled, Some(2));
        assert_eq!(cut.generation.tokens, all.generation.tokens[..=2], "graph {graph}: the host's draws");
        assert!(cut.generation.steps.iter().skip(1).all(|s| s.gpu_micros.is_some()));
    }
}
