//! The manifest reader's unit tests.

use super::*;

const GOOD: &str = r#"format = 1
[buffers.k]
dtype = "f32"
shape = [2, 4]

[methods.decode]
inputs = [{ name = "tokens", dtype = "i64", shape = [1] }, { name = "pos", dtype = "i64", shape = [1] }]
outputs = [{ name = "logits", dtype = "f32", shape = [1, 8] }]
[[methods.decode.calls]]
blob = "decode.blob"
backend = "ReferenceBackend"
args = ["input:tokens", "input:pos", "buffer:k", "buffer:k", "output:logits"]

[generate]
prefill = "decode"
decode = "decode"
prompt = [3]
token_input = "tokens"
position_input = "pos"
logits_output = "logits"
"#;

fn parse(text: &str) -> Result<Manifest, Error> {
    Manifest::parse(Path::new("dir/program.toml"), text)
}

fn error(text: &str) -> String {
    match parse(text) {
        Ok(_) => panic!("expected an error"),
        Err(err) => err.to_string(),
    }
}

#[test]
fn reads_a_program() {
    let m = parse(GOOD).expect("valid manifest");
    assert_eq!(m.buffers["k"].nbytes(), 32);
    assert_eq!(m.buffers["k"].memory, MemoryKind::Host);
    assert_eq!(m.buffers["k"].device, 0);
    let on_device =
        parse(&GOOD.replace("shape = [2, 4]", "shape = [2, 4]\nmemory = \"managed\"\ndevice = 3"))
            .expect("valid manifest");
    assert_eq!((on_device.buffers["k"].memory, on_device.buffers["k"].device), (MemoryKind::Managed, 3));
    let io = &m.methods["decode"];
    assert_eq!((io.inputs[0].memory, io.outputs[0].memory), (MemoryKind::Host, MemoryKind::Host));
    let io_on_device = parse(
        &GOOD
            .replace("shape = [1] }, {", "shape = [1], memory = \"device\", device = 1 }, {")
            .replace("shape = [1, 8] }", "shape = [1, 8], memory = \"managed\" }"),
    )
    .expect("valid manifest");
    let io = &io_on_device.methods["decode"];
    assert_eq!((io.inputs[0].memory, io.inputs[0].device), (MemoryKind::Device, 1));
    assert_eq!((io.inputs[1].memory, io.outputs[0].memory), (MemoryKind::Host, MemoryKind::Managed));
    let call = &m.methods["decode"].calls[0];
    assert_eq!(call.blob.path(), Some(Path::new("dir/decode.blob")));
    assert_eq!(call.args[2], ArgRef::Buffer("k".into()));
    assert_eq!(call.arg_locations[0], Location { line: 12, column: 9 });
    assert_eq!(call.location, Location { line: 9, column: 1 }, "the call's [[methods.decode.calls]] header");
    assert_eq!(m.generate.expect("generate").prompt, vec![3]);
}

#[test]
fn a_tensor_whose_size_overflows_is_refused_by_the_one_checked_product() {
    let huge = GOOD.replace("shape = [2, 4]", "shape = [4294967296, 4294967296]");
    assert_eq!(
        error(&huge),
        "dir/program.toml:4:9: 'k' (f32 [4294967296, 4294967296]) is too large to allocate: its size in bytes \
         overflows"
    );
    // The same refusal for every reader that builds a declaration (a `.pte` mapped onto a manifest).
    let err = TensorDecl::new("k_cache", DType::F32, vec![1 << 31, 1 << 31, 1 << 31], MemoryKind::Host)
        .expect_err("2^93 elements");
    assert_eq!(err.name, "k_cache");
    assert_eq!(checked_nbytes(DType::F32, &[1 << 62]), None, "elements fit, bytes do not");
    assert_eq!(checked_nbytes(DType::F32, &[2, 4]), Some(32));
    assert_eq!(checked_nbytes(DType::I64, &[]), Some(8), "a scalar");
    // A declaration built by hand never panics: it reports a size no allocation satisfies.
    let by_hand = TensorDecl { shape: vec![u64::MAX, 2], ..small_decl() };
    assert_eq!((by_hand.numel(), by_hand.nbytes()), (u64::MAX, u64::MAX));
}

fn small_decl() -> TensorDecl {
    TensorDecl::new("t", DType::F32, vec![1], MemoryKind::Host).expect("small")
}

#[test]
fn blobs_outside_the_program_load_only_when_allowed() {
    let text = GOOD.replace("blob = \"decode.blob\"", "blob = \"../shared/decode.blob\"");
    assert!(parse(&text).is_err());
    let m = Manifest::parse_with(Path::new("dir/program.toml"), &text, BlobPaths::Anywhere).expect("allowed");
    let anywhere = BlobSource::file("dir/../shared/decode.blob");
    assert_eq!(m.methods["decode"].calls[0].blob, anywhere, "no directory to stay inside");
    let within = parse(GOOD).expect("valid manifest");
    assert_eq!(
        within.methods["decode"].calls[0].blob,
        BlobSource::File { path: "dir/decode.blob".into(), root: Some("dir".into()) },
        "the reader opens the blob beneath the manifest's directory, links resolved"
    );
    let inside = GOOD.replace("blob = \"decode.blob\"", "blob = \"./blobs/decode.blob\"");
    let call = &parse(&inside).expect("inside").methods["decode"].calls[0];
    assert_eq!(call.blob.path(), Some(Path::new("dir/./blobs/decode.blob")));
}

#[test]
fn logits_of_every_float_type_a_host_reads_are_accepted() {
    for dtype in ["f32", "f16", "bf16"] {
        let text = GOOD.replace(
            "name = \"logits\", dtype = \"f32\"",
            &format!("name = \"logits\", dtype = \"{dtype}\""),
        );
        let m = parse(&text).unwrap_or_else(|e| panic!("{dtype} logits: {e}"));
        assert_eq!(m.methods["decode"].outputs[0].dtype.name(), dtype);
    }
}

#[test]
fn errors_name_line_and_column() {
    let cases = [
        (GOOD.replace("format = 1", "format = 2"), "dir/program.toml:1:10: manifest format 2 is not supported; this build reads format 1"),
        (GOOD.replace("\"buffer:k\", \"output", "\"buffer:q\", \"output"), "dir/program.toml:12:50: the program declares no buffer named 'q'"),
        (GOOD.replace("\"input:pos\"", "\"pos\""), "dir/program.toml:12:25: argument 'pos' must be 'input:NAME', 'output:NAME' or 'buffer:NAME'"),
        (GOOD.replace("dtype = \"f32\"\nshape", "dtype = \"f33\"\nshape"), "dir/program.toml:3:9: unknown dtype 'f33' for 'k' (expected one of: f32, f16, bf16, f64, i8, u8, i32, i64, bool)"),
        (GOOD.replace("prompt = [3]", "prompt = [3, 4]"), "dir/program.toml:17:10: prompt has 2 tokens but 'tokens' of method 'decode' takes 1"),
        (GOOD.replace("logits_output = \"logits\"", "logits_output = \"tokens\""), "dir/program.toml:20:17: method 'decode' has no output named 'tokens'"),
        (GOOD.replace("name = \"logits\", dtype = \"f32\"", "name = \"logits\", dtype = \"i32\""), "dir/program.toml:20:17: 'logits' of method 'decode' must be f32, f16 or bf16, not i32"),
        (
            GOOD.replace("prompt = [3]", "prompt = [3]\nmax_positions = 0"),
            "dir/program.toml:18:17: max_positions is 0 but the prompt alone has 1 tokens",
        ),
        (GOOD.replace("shape = [2, 4]", "shape = [2, -4]"), "dir/program.toml:4:9: shape of 'k' has negative extent -4; buffers need static shapes"),
        (GOOD.replace("shape = [2, 4]", "shape = [2, 4]\ndevice = 1"), "dir/program.toml:5:10: buffer 'k' is host memory; `device` applies to device and managed memory"),
        (GOOD.replace("shape = [1] }, { name = \"pos\"", "shape = [1], memory = \"vram\" }, { name = \"pos\""), "dir/program.toml:7:67: unknown memory kind 'vram' for input 'tokens' (expected host, device, managed or pinned)"),
        (GOOD.replace("shape = [1, 8] }", "shape = [1, 8], device = 2 }"), "dir/program.toml:8:71: output 'logits' is host memory; `device` applies to device and managed memory"),
        (GOOD.replace("logits_output = \"logits\"", "logits_output = \"logits\"\nnext_token_output = \"logits\""), "dir/program.toml:21:21: 'logits' of method 'decode' must be i64 [1], not f32 [1, 8]"),
        (GOOD.replace("logits_output = \"logits\"", "logits_output = \"logits\"\nnext_token_output = \"next\""), "dir/program.toml:21:21: method 'decode' has no output named 'next'"),
        (GOOD.replace("shape = [2, 4]", "shape = [2, 4]\nmemory = \"device\"\ndevice = -1"), "dir/program.toml:6:10: device -1 of buffer 'k' is not a CUDA device ordinal"),
        (GOOD.replace("blob = \"decode.blob\"", "blob = \"../decode.blob\""), "dir/program.toml:10:8: blob '../decode.blob' is outside the program's directory (an absolute path or one through '..'); a host loads it only when told to (delegate-host --allow-outside-blobs)"),
        (GOOD.replace("blob = \"decode.blob\"", "blob = \"/etc/decode.blob\""), "dir/program.toml:10:8: blob '/etc/decode.blob' is outside the program's directory (an absolute path or one through '..'); a host loads it only when told to (delegate-host --allow-outside-blobs)"),
        (GOOD.replace("blob = ", "blub = "), "dir/program.toml:10:1: unknown field `blub`, expected one of `blob`, `backend`, `args`"),
        (GOOD.replace("{ name = \"pos\"", "{ name = \"tokens\""), "dir/program.toml:7:69: method 'decode' declares 'tokens' twice"),
        (GOOD.replace("\"input:pos\"", "\"input:p\""), "dir/program.toml:12:25: method 'decode' declares no input named 'p'"),
        (GOOD.replace("\"output:logits\"", "\"output:l\""), "dir/program.toml:12:62: method 'decode' declares no output named 'l'"),
        (GOOD.replace("backend = \"ReferenceBackend\"", "backend = \"\""), "dir/program.toml:11:11: backend id is empty"),
    ];
    for (text, expected) in cases {
        assert_eq!(error(&text), expected);
    }
}

#[test]
fn the_buffers_tell_the_positions_only_when_every_buffer_agrees_on_its_second_to_last_axis() {
    let with = |shapes: &[&str]| {
        let buffers: String = shapes
            .iter()
            .enumerate()
            .map(|(i, shape)| format!("[buffers.b{i}]\ndtype = \"f32\"\nshape = {shape}\n"))
            .collect();
        let text = GOOD.replace("[buffers.k]\ndtype = \"f32\"\nshape = [2, 4]\n", &buffers);
        parse(&text.replace("\"buffer:k\", \"buffer:k\"", "\"buffer:b0\", \"buffer:b0\"")).expect("valid")
    };
    assert_eq!(with(&["[2, 16, 8]", "[2, 16, 8]"]).positions_from_buffers(), Some(16));
    assert_eq!(
        with(&["[1, 2, 16, 8]", "[16, 4]", "[3]"]).positions_from_buffers(),
        Some(16),
        "rank 1: no rows"
    );
    assert_eq!(with(&["[2, 16, 8]", "[2, 32, 8]"]).positions_from_buffers(), None, "they disagree");
    assert_eq!(with(&["[2, 16, 8]", "[1, 8]"]).positions_from_buffers(), None, "a [1, 8] state is no cache");
    assert_eq!(with(&["[16]"]).positions_from_buffers(), None, "no buffer has rows");
}
