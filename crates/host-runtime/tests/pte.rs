//! `.pte` programs loaded onto the program machinery: the oracle's tokens, zero bytes copied per decode step
//! in zero-copy mode and the caches' bytes in copy-back mode, shared caches across methods, and the typed
//! refusals (an operator the host does not run, an unknown backend id).

#[path = "support/kv_pte.rs"]
mod kv_pte;

use std::path::{Path, PathBuf};

use delegate_abi::host::HostConfig;
use et_error::{ErrorCode, HasErrorCode};
use host_runtime::generate::{default_steps, generate, Generation};
use host_runtime::plugins::{Discovery, Registry};
use host_runtime::program::{Mode, Origin};
use host_runtime::pte;
use pte_format::testing::{InstructionSpec, ProgramSpec};

const STEPS: usize = 12;

fn write(dir: &Path, name: &str, spec: &ProgramSpec) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, spec.to_bytes()).expect("write");
    path
}

fn registry() -> Registry {
    Registry::discover(Discovery::new())
        .with_embedded(reference_delegate::delegate_root(), &HostConfig::default())
}

fn run(path: &Path, mode: Mode) -> Generation {
    let prompt = kv_pte::config().prompt;
    let mut program = pte::load(path, &registry(), mode, Some(&prompt)).expect("loads");
    generate(&mut program, STEPS, |_, _| Ok(())).expect("generates")
}

#[test]
fn single_and_two_method_programs_give_the_oracle_tokens_in_both_modes() {
    let dir = tempfile::tempdir().expect("temp dir");
    let cache_bytes = 2 * kv_pte::config().cache_shape().iter().product::<usize>() as u64 * 4;
    for two in [false, true] {
        let path = write(dir.path(), "p.pte", &kv_pte::spec(two));
        let zero = run(&path, Mode::ZeroCopy);
        assert_eq!(zero.tokens, kv_pte::oracle_tokens(STEPS), "two methods: {two}");
        let decode = zero.mean_decode_copies();
        assert_eq!(decode.total(), 0, "zero-copy copies nothing per decode step: {decode:?}");
        let copy_back = run(&path, Mode::CopyBack);
        assert_eq!(copy_back.tokens, zero.tokens);
        let decode = copy_back.mean_decode_copies();
        assert_eq!(decode.writeback_bytes, cache_bytes, "copy-back writes both caches back: {decode:?}");
        assert_eq!(decode.op_bytes, 0, "the logits clone is elided: {decode:?}");
    }
}

#[test]
fn the_methods_of_a_two_method_program_share_its_caches() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write(dir.path(), "p.pte", &kv_pte::spec(true));
    let prompt = kv_pte::config().prompt;
    let program = pte::load(&path, &registry(), Mode::ZeroCopy, Some(&prompt)).expect("loads");
    let g = program.manifest().generate.as_ref().expect("a generator");
    let room = g.max_positions.expect("the caches' positions") as usize - prompt.len();
    assert_eq!(default_steps(&program, None, None), room, "as many steps as the caches hold");
    assert_eq!(default_steps(&program, None, Some(5)), room + prompt.len() - 5, "from --position");
    assert_eq!(default_steps(&program, Some(3), None), 3, "--steps");
    let buffers: Vec<_> = program.manifest().buffers.keys().cloned().collect();
    assert_eq!(buffers, ["k_cache_0", "v_cache_0"]);
    let decode = &program.manifest().methods["decode"];
    let inputs: Vec<_> = decode.inputs.iter().map(|d| d.name.as_str()).collect();
    let outputs: Vec<_> = decode.outputs.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(inputs, ["0", "1"]);
    assert_eq!(outputs, ["0", "%v7"], "the method's output, then the delegate's unread next_token");
    assert!(pte::is_internal("%v7") && !pte::is_internal("0"));
}

#[test]
fn a_non_delegated_operator_refuses_the_program_naming_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut spec = kv_pte::spec(false);
    spec.methods[0].operators.push(("aten::mul".to_owned(), "out".to_owned()));
    spec.methods[0].instructions.push(InstructionSpec::Kernel { op: 2, args: vec![8, 8, 8] });
    let path = write(dir.path(), "mul.pte", &spec);
    let err = pte::load(&path, &registry(), Mode::ZeroCopy, None).err().expect("refused");
    assert_eq!(err.error_code(), ErrorCode::NotSupported);
    assert_eq!(
        err.to_string(),
        format!(
            "{}: method 'forward' instruction 4 calls operator 'aten::mul.out', which delegate-host does not run; it runs DelegateCalls, aten::copy_ write-backs and aten::clone.out only. ExecuTorch's runtime runs the operators a partly delegated program keeps outside: et-run {}",
            path.display(),
            path.display()
        )
    );
}

#[test]
fn a_backend_no_plugin_serves_is_named() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut spec = kv_pte::spec(false);
    spec.methods[0].delegates[0].id = "NoSuchBackend".to_owned();
    let path = write(dir.path(), "unknown.pte", &spec);
    let err = pte::load(&path, &registry(), Mode::ZeroCopy, None).err().expect("refused");
    assert_eq!(err.error_code(), ErrorCode::NotFound);
    let message = err.to_string();
    assert!(message.contains("method 'forward' instruction 0 calls backend 'NoSuchBackend'"), "{message}");
}

#[test]
fn a_program_run_once_writes_its_output_and_its_buffers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write(dir.path(), "p.pte", &kv_pte::spec(false));
    let mut program = pte::load(&path, &registry(), Mode::ZeroCopy, None).expect("loads");
    assert!(program.manifest().generate.is_none(), "no prompt, no generation");
    assert_eq!(program.origin(), Origin::Pte, "the program knows its file, no caller sniffs it again");
    assert_eq!(default_steps(&program, None, None), 15, "not a generator: the fixed default");
    program.write_input("forward", "0", &5i64.to_le_bytes()).expect("token");
    program.write_input("forward", "1", &0i64.to_le_bytes()).expect("position");
    let stats = program.execute("forward").expect("runs");
    assert_eq!(stats.copies.total(), 0);
    let logits = program.read_output("forward", "0").expect("logits");
    assert!(logits.iter().any(|&b| b != 0));
    assert!(
        program.buffer("k_cache_0").expect("cache").iter().any(|&b| b != 0),
        "the cache was written in place"
    );
}

#[test]
fn a_prompt_for_a_program_that_is_no_generator_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut spec = kv_pte::spec(false);
    spec.methods[0].name = "step".to_owned();
    let path = write(dir.path(), "step.pte", &spec);
    let err = pte::load(&path, &registry(), Mode::ZeroCopy, Some(&[1])).err().expect("refused");
    assert_eq!(err.error_code(), ErrorCode::InvalidArgument);
    assert!(
        err.to_string().contains("neither methods 'prefill' and 'decode' nor a method 'forward'"),
        "{err}"
    );
}

#[test]
fn a_truncated_program_is_a_typed_format_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let bytes = kv_pte::bytes(false);
    let path = dir.path().join("cut.pte");
    std::fs::write(&path, &bytes[..bytes.len() / 2]).expect("write");
    let err = pte::load(&path, &registry(), Mode::ZeroCopy, None).err().expect("refused");
    assert!(matches!(err, pte::Error::Format { .. }), "{err}");
    assert_eq!(err.error_code(), ErrorCode::InvalidProgram);
}

#[test]
fn a_clone_that_cannot_be_elided_runs_as_a_host_copy_and_is_counted() {
    use pte_format::model::ScalarType;
    use pte_format::testing::{TensorSpec, ValueSpec};
    let dir = tempfile::tempdir().expect("temp dir");
    let mut spec = kv_pte::spec(false);
    let vocab = kv_pte::config().vocab as i32;
    let forward = &mut spec.methods[0];
    // A second output cloned from the same delegate logits: the logits are read twice, so neither clone is
    // elided by binding and both run on the host.
    forward.values.push(ValueSpec::Tensor(TensorSpec::planned(ScalarType::Float, &[1, vocab], 1, 1 << 16)));
    forward.outputs.push(11);
    forward.instructions.push(InstructionSpec::Kernel { op: 1, args: vec![6, 9, 11] });
    let path = write(dir.path(), "two_clones.pte", &spec);
    let generation = run(&path, Mode::ZeroCopy);
    assert_eq!(generation.tokens, kv_pte::oracle_tokens(STEPS));
    let decode = generation.mean_decode_copies();
    assert_eq!(decode.op_bytes, 2 * vocab as u64 * 4, "{decode:?}");
    assert_eq!(decode.writeback_bytes + decode.reflect_bytes, 0, "{decode:?}");

    let prompt = kv_pte::config().prompt;
    let mut program = pte::load(&path, &registry(), Mode::ZeroCopy, Some(&prompt)).expect("loads");
    let outputs: Vec<_> =
        program.manifest().methods["forward"].outputs.iter().map(|d| d.name.clone()).collect();
    assert_eq!(outputs, ["0", "1", "%v6", "%v7"]);
    generate(&mut program, 1, |_, _| Ok(())).expect("generates");
    let first = program.read_output("forward", "0").expect("0").into_owned();
    assert!(first.iter().any(|&b| b != 0));
    assert_eq!(first, program.read_output("forward", "1").expect("1").into_owned());
    assert_eq!(first, program.read_output("forward", "%v6").expect("%v6").into_owned());
}

/// An `aten::copy_` that is no aliased write-back (a method input copied into a mutable buffer of its own)
/// runs as a host copy: the buffer holds the input after every run, and the copy is counted.
#[test]
fn a_copy_into_a_buffer_that_no_alias_elides_changes_the_buffer() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = kv_pte::spec_with_token_copy();
    let path = write(dir.path(), "copy.pte", &spec);
    let mut program = pte::load(&path, &registry(), Mode::ZeroCopy, None).expect("loads");
    assert!(program.manifest().buffers.contains_key("last_token"));
    assert_eq!(program.buffer("last_token").expect("buffer").as_ref(), 0i64.to_le_bytes());
    for (position, token) in [(0i64, 5i64), (1, 9)] {
        program.write_input("forward", "0", &token.to_le_bytes()).expect("token");
        program.write_input("forward", "1", &position.to_le_bytes()).expect("position");
        let stats = program.execute("forward").expect("runs");
        assert_eq!(program.buffer("last_token").expect("buffer").as_ref(), token.to_le_bytes());
        assert_eq!(stats.copies.writeback_bytes, 8, "the copy into the buffer is counted as a write-back");
    }
    assert!(program.buffer("k_cache_0").expect("cache").iter().any(|&b| b != 0), "the caches still update");
}

#[test]
fn each_call_names_its_payload_by_the_place_pte_format_reports() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write(dir.path(), "p.pte", &kv_pte::spec(true));
    let bytes = std::fs::read(&path).expect("read");
    let read = pte_format::Program::parse(&bytes).expect("parses");
    let program = pte::load(&path, &registry(), Mode::ZeroCopy, None).expect("loads");
    for method in &read.methods {
        let calls = &program.manifest().methods[method.name].calls;
        let delegates: Vec<_> = method.delegate_calls().map(|(_, c)| &method.delegates[c.delegate]).collect();
        assert_eq!(calls.len(), delegates.len(), "method {}", method.name);
        for (call, delegate) in calls.iter().zip(delegates) {
            let program_manifest::BlobSource::Payload(payload) = &call.blob else {
                panic!("a .pte call's blob is a payload of the file: {:?}", call.blob)
            };
            assert_eq!(payload.program, path);
            assert_eq!(
                (payload.label.as_str(), payload.range.clone()),
                (delegate.processed.label().as_str(), delegate.processed.range())
            );
            let (start, end) = (payload.range.start as usize, payload.range.end as usize);
            assert_eq!(&bytes[start..end], delegate.processed.data, "the range holds the payload");
            assert!(call.blob.path().is_none(), "no blob file to open");
            assert!(
                call.blob.to_string().contains(&format!("method '{}' instruction", method.name)),
                "{}",
                call.blob
            );
        }
    }
}
