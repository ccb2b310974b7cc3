//! Method inputs and outputs in every memory kind, the program's stream, and generation options, through the
//! library API. Everything here runs without a GPU: CUDA memory is refused with typed errors at load, and
//! where a driver exists the same tests check the loaded program instead (so none passes silently either
//! way).

use std::path::{Path, PathBuf};

use delegate_abi::host::HostConfig;
use delegate_abi::MemoryKind;
use et_error::{ErrorCode, HasErrorCode};
use host_runtime::buffer::AllocError;
use host_runtime::generate::{device_loop_refusal, generate, generate_with, Options};
use host_runtime::manifest::Manifest;
use host_runtime::plugins::{Discovery, Registry};
use host_runtime::program::{Error, IoRole, Mode, Program};

fn export(dir: &Path) -> (kv_example::Config, PathBuf) {
    let cfg = kv_example::Config::tiny();
    kv_example::export::reference(&cfg, dir).expect("export");
    (cfg, dir.join("program.toml"))
}

/// The exported manifest with `edit` applied, written next to it as `name`.
fn edited(dir: &Path, name: &str, edit: impl Fn(String) -> String) -> PathBuf {
    let text = std::fs::read_to_string(dir.join("program.toml")).expect("manifest");
    let changed = edit(text.clone());
    assert_ne!(changed, text, "the edit changed nothing:\n{text}");
    let path = dir.join(name);
    std::fs::write(&path, changed).expect("write");
    path
}

/// Declares every method input and output in `memory`.
fn io_in(memory: &str) -> impl Fn(String) -> String + '_ {
    move |text: String| {
        let mut spec =
            host_runtime::manifest::ProgramSpec::parse(Path::new("program.toml"), &text).expect("spec");
        for method in spec.methods.values_mut() {
            for tensor in method.inputs.iter_mut().chain(method.outputs.iter_mut()) {
                tensor.memory = Some(memory.to_owned());
            }
        }
        spec.to_toml().expect("toml")
    }
}

fn load(path: &Path, mode: Mode) -> Result<Program, Error> {
    let registry = Registry::discover(Discovery::new())
        .with_embedded(reference_delegate::delegate_root(), &HostConfig::default());
    Program::load(Manifest::load(path).expect("manifest"), &registry, mode)
}

fn has_driver() -> bool {
    host_runtime::cuda::Context::open(0).is_ok()
}

#[test]
fn cuda_memory_on_two_devices_is_refused_at_load_naming_both() {
    let dir = tempfile::tempdir().expect("temp dir");
    export(dir.path());
    let path = edited(dir.path(), "two.toml", |text| {
        let text = text.replacen("memory = \"host\"", "memory = \"managed\"\ndevice = 0", 1);
        text.replacen("memory = \"host\"", "memory = \"managed\"\ndevice = 1", 1)
    });
    let err = load(&path, Mode::ZeroCopy).err().expect("refused before anything is allocated");
    assert_eq!(err.error_code(), ErrorCode::NotSupported);
    assert!(matches!(err, Error::Devices { first_device: 0, second_device: 1, .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "buffer 'k_cache_0' is on CUDA device 0 but buffer 'v_cache_0' is on device 1; this host runs a program's CUDA memory on one device"
    );
}

#[test]
fn inputs_and_outputs_in_device_memory_are_refused_for_a_plugin_that_reads_host_memory() {
    let dir = tempfile::tempdir().expect("temp dir");
    export(dir.path());
    let path = edited(dir.path(), "device_io.toml", io_in("device"));
    // The argument check runs before any memory is allocated: the same error with or without a driver.
    let err = load(&path, Mode::ZeroCopy).err().expect("refused");
    assert_eq!(err.error_code(), ErrorCode::InvalidArgument);
    let text = err.to_string();
    assert!(
        text.contains("argument 0 ('tokens') is in device memory, but plugin 'reference-delegate' does not accept device memory"),
        "{text}"
    );
}

#[test]
fn managed_and_pinned_inputs_and_outputs_load_only_with_a_driver_and_decode_the_same_tokens() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_, host_path) = export(dir.path());
    let reference = generate(&mut load(&host_path, Mode::ZeroCopy).expect("host"), 3, |_, _| Ok(()))
        .expect("generate")
        .tokens;
    for memory in ["managed", "pinned"] {
        let path = edited(dir.path(), &format!("{memory}_io.toml"), io_in(memory));
        match (host_runtime::cuda::Context::open(0), load(&path, Mode::ZeroCopy)) {
            (Err(cuda), Err(err)) => {
                eprintln!("this test needs a GPU for {memory} memory; without one it checks the typed error");
                assert_eq!(err.error_code(), ErrorCode::NotSupported, "{err}");
                assert!(
                    matches!(&err, Error::TensorMemory { role: IoRole::Input, tensor, source, .. }
                        if tensor == "tokens" && *source == AllocError::Cuda(cuda.clone())),
                    "{err:?}"
                );
                assert!(
                    err.to_string().starts_with("method 'decode': input 'tokens'")
                        || err.to_string().starts_with("method 'prefill': input 'tokens'"),
                    "{err}"
                );
                assert!(
                    err.to_string().contains(&format!("input 'tokens' wants {memory} memory but")),
                    "{err}"
                );
            }
            (Ok(_), Ok(mut program)) => {
                let kind = if memory == "managed" { MemoryKind::Managed } else { MemoryKind::Pinned };
                assert_eq!(program.input_memory("decode", "tokens").expect("input"), kind);
                assert_eq!(program.output_memory("decode", "logits").expect("output"), kind);
                let generation = generate(&mut program, 3, |_, _| Ok(())).expect("generate");
                assert_eq!(generation.tokens, reference, "{memory}");
                assert!(!generation.device_loop, "no next-token output: the host loop");
                // Host-visible kinds are borrowed in place.
                assert!(program.input_mut("decode", "tokens").is_ok());
                assert!(program.output("decode", "logits").is_ok());
                assert!(program.cuda_stream().is_some(), "CUDA memory: the program owns a stream");
                // The reference delegate computes on the host and does not state that it can be captured.
                let err = program.capture("decode").expect_err("host computation is not replayable");
                assert_eq!(err.error_code(), ErrorCode::NotSupported);
                assert_eq!(
                    err.to_string(),
                    "a delegate of method 'decode' did not keep its work on the stream: call 0 (ReferenceBackend) is served by plugin 'reference-delegate', which does not state the capability cuda_graph_capturable"
                );
            }
            (cuda, program) => panic!("CUDA {:?} but load {:?}", cuda.err(), program.err()),
        }
    }
}

#[test]
fn host_inputs_and_outputs_are_written_and_read_in_any_way_with_typed_errors() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_, path) = export(dir.path());
    let mut program = load(&path, Mode::ZeroCopy).expect("loads");
    assert!(program.cuda_stream().is_none() && program.cuda_context().is_none(), "host memory only");
    assert_eq!(program.input_memory("decode", "tokens").expect("input"), MemoryKind::Host);

    program.write_input("decode", "tokens", &7i64.to_le_bytes()).expect("write");
    assert_eq!(program.input_mut("decode", "tokens").expect("borrow"), 7i64.to_le_bytes());
    let err = program.write_input("decode", "tokens", &[0; 4]).expect_err("wrong size");
    assert_eq!(err.to_string(), "method 'decode': input 'tokens' holds 8 bytes, 4 were given");
    assert_eq!(err.error_code(), ErrorCode::InvalidArgument);
    let err = program.write_input("decode", "nope", &[0; 8]).expect_err("no such input");
    assert_eq!(err.to_string(), "method 'decode' has no input 'nope'");
    let err = program.write_input("nope", "tokens", &[0; 8]).expect_err("no such method");
    assert_eq!(err.to_string(), "the program has no method 'nope'");

    // Host memory has no device address.
    let err = program.input_ptr("decode", "tokens").expect_err("host memory");
    assert!(matches!(&err, Error::Memory { role: IoRole::Input, memory: MemoryKind::Host, .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "method 'decode': input 'tokens' is in host memory, which has no device address"
    );
    assert_eq!(err.error_code(), ErrorCode::InvalidArgument);
    assert!(matches!(
        program.output_ptr("decode", "logits"),
        Err(Error::Memory { role: IoRole::Output, .. })
    ));

    // enqueue on a program without CUDA memory is complete on return: the output is readable at once.
    program.write_input("decode", "input_pos", &0i64.to_le_bytes()).expect("write");
    let before = cuda_rt::stats::thread_host_syncs();
    program.enqueue("decode").expect("enqueue");
    let logits = program.read_output("decode", "logits").expect("read");
    assert!(matches!(logits, std::borrow::Cow::Borrowed(_)), "host memory is not copied to be read");
    assert_eq!(logits.as_ref(), program.output("decode", "logits").expect("borrow"));
    assert!(logits.iter().any(|&b| b != 0), "decode wrote its logits");
    program.synchronize().expect("nothing to wait for");
    assert_eq!(cuda_rt::stats::thread_host_syncs(), before, "host memory never synchronises");

    // Graphs need CUDA memory.
    let err = program.capture("decode").expect_err("no CUDA memory");
    assert_eq!(err.to_string(), "capturing a CUDA graph needs CUDA memory, but the program declares none");
}

#[test]
fn a_cuda_graph_needs_the_device_loop_and_says_why_it_cannot_run() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (_, path) = export(dir.path());
    let mut program = load(&path, Mode::ZeroCopy).expect("loads");
    let why = device_loop_refusal(&program).expect("generate section").expect("no device loop");
    assert_eq!(why, "input 'tokens' of method 'decode' is in host memory, not device or managed memory");
    let mut options = Options::steps(2);
    options.cuda_graph = true;
    let err = generate_with(&mut program, &options, |_, _| Ok(())).expect_err("refused");
    assert_eq!(
        err.to_string(),
        "a CUDA graph needs the device loop, which cannot run: input 'tokens' of method 'decode' is in host memory, not device or managed memory"
    );
    assert_eq!(err.error_code(), ErrorCode::NotSupported, "the program cannot, whatever the caller asks");
}

#[test]
fn decode_starts_at_the_position_asked_for_and_refuses_one_that_does_not_fit() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (cfg, path) = export(dir.path());
    let mut program = load(&path, Mode::ZeroCopy).expect("loads");
    let max = cfg.max_len as i64;
    let mut options = Options::steps(2);
    options.start_position = Some(max - 2);
    let generation = generate_with(&mut program, &options, |_, _| Ok(())).expect("fits");
    let positions: Vec<i64> = generation.steps.iter().map(|s| s.position).collect();
    assert_eq!(positions, [0, max - 2, max - 1]);
    assert_eq!(generation.host_syncs, 0, "host memory: no CUDA synchronisation at all");
    assert!(!generation.device_loop && !generation.cuda_graph);
    assert!(generation.mean_decode_gpu_micros().is_none(), "no GPU, no GPU time");

    program.reset_buffers().expect("reset");
    options.start_position = Some(max - 1);
    let err = generate_with(&mut program, &options, |_, _| Ok(())).expect_err("one past the caches");
    assert!(
        err.to_string().starts_with(&format!("2 decode steps from position {} do not fit", max - 1)),
        "{err}"
    );
    options.start_position = Some(1);
    let err = generate_with(&mut program, &options, |_, _| Ok(())).expect_err("inside the prompt");
    assert!(err.to_string().contains("do not fit"), "{err}");
    assert!(!has_driver() || program.cuda_stream().is_none());
}
