//! The device generation loop, CUDA graphs and the program's stream, end to end on a GPU, with a small
//! GPU delegate of this test's own (`CountingBackend`): each call writes its tokens into a device cache at
//! `input_pos` and computes the next token from the whole cache prefix, on the caller's stream, so a lost or
//! reordered update changes every later token. An independent host model gives the expected tokens.
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
use host_runtime::generate::{continue_from, device_loop_refusal, generate_with, Options};
use host_runtime::manifest::Manifest;
use host_runtime::plugins::{Discovery, Registry};
use host_runtime::program::{Error, Mode, Program};

const BACKEND: &str = "CountingBackend";
const PROMPT: [i64; 3] = [3, 1, 4];
const POSITIONS: usize = 12;
const VOCAB: usize = 7;

const KERNEL: &str = r#"
extern "C" __global__ void counting_step(
    const long long* tokens, const long long* pos_in, const long long* cache_in, long long* cache_out,
    long long* next_out, float* logits, long long rows, long long capacity, long long vocab)
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
    for (long long j = 0; j < vocab; ++j) { logits[j] = (j == next) ? 1.0f : 0.0f; }
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
        let (mut capacity, mut vocab) = (POSITIONS as i64, VOCAB as i64);
        if cache_in != cache_out {
            args.record_reflect(POSITIONS as u64 * 8);
        }
        let mut params: [*mut c_void; 9] = [
            (&mut tokens as *mut u64).cast(),
            (&mut pos as *mut u64).cast(),
            (&mut cache_in as *mut u64).cast(),
            (&mut cache_out as *mut u64).cast(),
            (&mut next as *mut u64).cast(),
            (&mut logits as *mut u64).cast(),
            (&mut rows as *mut i64).cast(),
            (&mut capacity as *mut i64).cast(),
            (&mut vocab as *mut i64).cast(),
        ];
        let stream = match args.stream() {
            // SAFETY: the host's stream, valid until the work queued on it completes (the ABI's contract).
            Some(stream) => unsafe { StreamRef::from_raw(stream.as_raw()) },
            None => StreamRef::legacy_default(),
        };
        let config = LaunchConfig { grid: (1, 1, 1), block: (1, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the parameters match `counting_step`'s, in order; the host passed device or managed memory of
        // the declared sizes (tokens `rows` i64, position 1, caches `capacity`, next 1, logits `vocab` f32),
        // kept for the delegate until the stream passes this work (the ABI's completion rule).
        unsafe { handle.kernel.launch(config, stream, &mut params) }.map_err(failed)?;
        if args.stream().is_none() {
            handle.ctx.synchronize().map_err(failed)?;
        }
        Ok(())
    }
}

delegate_abi::export_delegate!(@embedded Counting);

fn blob(rows: u64) -> Vec<u8> {
    let binding = |name: &str, role, dtype, shape: &[u64]| Binding {
        name: name.to_owned(),
        role,
        dtype: Some(dtype),
        shape: Some(shape.iter().map(|&d| Dim::Static(d)).collect()),
        threaded: true,
    };
    let cache = [POSITIONS as u64];
    let header = Header::new(
        BACKEND,
        PayloadKind::Other("counting".to_owned()),
        vec![
            binding("tokens", Role::Input, DType::I64, &[rows]),
            binding("input_pos", Role::Input, DType::I64, &[1]),
            binding("cache", Role::Input, DType::I64, &cache),
            binding("cache_out", Role::Output, DType::I64, &cache),
            binding("next", Role::Output, DType::I64, &[1]),
            binding("logits", Role::Output, DType::F32, &[1, VOCAB as u64]),
        ],
        vec![Alias {
            output: "cache_out".to_owned(),
            input: "cache".to_owned(),
            kind: AliasKind::KvCacheUpdate,
        }],
    );
    blob_format::native::to_vec(&header, b"counting")
}

/// Writes the program with its cache and every method input and output in `memory`.
fn write_program(dir: &Path, memory: &str) -> std::path::PathBuf {
    std::fs::write(dir.join("prefill.blob"), blob(PROMPT.len() as u64)).expect("blob");
    std::fs::write(dir.join("decode.blob"), blob(1)).expect("blob");
    let method = |rows: usize, blob: &str| {
        format!(
            "inputs = [{{ name = \"tokens\", dtype = \"i64\", shape = [{rows}], memory = \"{memory}\" }}, \
             {{ name = \"input_pos\", dtype = \"i64\", shape = [1], memory = \"{memory}\" }}]\n\
             outputs = [{{ name = \"next\", dtype = \"i64\", shape = [1], memory = \"{memory}\" }}, \
             {{ name = \"logits\", dtype = \"f32\", shape = [1, {VOCAB}], memory = \"{memory}\" }}]\n\
             calls = [{{ blob = \"{blob}\", backend = \"{BACKEND}\", args = [\"input:tokens\", \"input:input_pos\", \
             \"buffer:cache\", \"buffer:cache\", \"output:next\", \"output:logits\"] }}]\n"
        )
    };
    let text = format!(
        "format = 1\n\n[buffers.cache]\ndtype = \"i64\"\nshape = [{POSITIONS}]\nmemory = \"{memory}\"\n\n\
         [methods.prefill]\n{}\n[methods.decode]\n{}\n\
         [generate]\nprefill = \"prefill\"\ndecode = \"decode\"\nprompt = {PROMPT:?}\ntoken_input = \"tokens\"\n\
         position_input = \"input_pos\"\nlogits_output = \"logits\"\nnext_token_output = \"next\"\n\
         max_positions = {POSITIONS}\n",
        method(PROMPT.len(), "prefill.blob"),
        method(1, "decode.blob"),
    );
    let path = dir.join(format!("{memory}.toml"));
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
    let path = write_program(dir, memory);
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
