//! What `export::reference` writes: parseable blobs whose bindings and aliases are as intended, and a
//! manifest of the agreed schema.

use blob_format::model::{AliasKind, DType, Dim, Format, PayloadKind, Role};
use blob_format::Blob;
use kv_example::export::{self, Backend, Target, CUDA_BACKEND, DECODE_BLOB, MANIFEST, PREFILL_BLOB};
use kv_example::{BenchConfig, Config, ConfigError, ExportError, Weights};
use program_manifest::{Manifest, MemoryKind, ProgramSpec};
use ref_graph::{half, Data, ElemType, Graph};

#[test]
fn blobs_parse_with_name_ordered_bindings_and_aliases() {
    let cfg = Config::tiny();
    let dir = tempfile::tempdir().expect("temp dir");
    let program = export::reference(&cfg, dir.path()).expect("export");
    assert_eq!(program.prefill_blob, dir.path().join(PREFILL_BLOB));
    assert_eq!(program.decode_blob, dir.path().join(DECODE_BLOB));

    for (path, rows) in [(&program.prefill_blob, 4u64), (&program.decode_blob, 1)] {
        let bytes = std::fs::read(path).expect("written");
        let blob = Blob::parse(&bytes).expect("parses");
        blob.verify_payload().expect("checksum");
        assert!(matches!(blob.format, Format::Native { major: 1, .. }));
        let h = &blob.header;
        assert_eq!(h.producer.as_ref().map(|p| p.name.as_str()), Some("kv-example"));
        assert_eq!(h.backend_id, "ReferenceBackend");
        assert_eq!(h.payload_kind, PayloadKind::ReferenceGraph);
        let names: Vec<_> = h.bindings.iter().map(|b| (b.name.as_str(), b.role)).collect();
        assert_eq!(
            names,
            [
                ("tokens", Role::Input),
                ("input_pos", Role::Input),
                ("k_cache_0", Role::Input),
                ("v_cache_0", Role::Input),
                ("k_cache_out_0", Role::Output),
                ("v_cache_out_0", Role::Output),
                ("logits", Role::Output),
                ("next_token", Role::Output),
            ]
        );
        assert!(h.bindings.iter().all(|b| b.threaded));
        assert_eq!(h.bindings[0].dtype, Some(DType::I64));
        assert_eq!(h.bindings[0].shape, Some(vec![Dim::Static(rows)]));
        assert_eq!(h.bindings[6].shape, Some(vec![Dim::Static(rows), Dim::Static(64)]));
        assert_eq!(h.bindings[2].shape, Some(vec![Dim::Static(2), Dim::Static(16), Dim::Static(16)]));
        assert_eq!((h.bindings[6].dtype, h.bindings[2].dtype), (Some(DType::F32), Some(DType::F32)));
        assert_eq!(h.bindings[7].dtype, Some(DType::I64));
        assert_eq!(h.bindings[7].shape, Some(vec![Dim::Static(1)]));
        let aliases: Vec<_> =
            h.aliases.iter().map(|a| (a.output.as_str(), a.input.as_str(), &a.kind)).collect();
        assert_eq!(
            aliases,
            [
                ("k_cache_out_0", "k_cache_0", &AliasKind::KvCacheUpdate),
                ("v_cache_out_0", "v_cache_0", &AliasKind::KvCacheUpdate)
            ]
        );

        // The payload is a graph whose outputs are in another order than the blob's arguments, and the
        // blob's aliases are exactly the graph's own.
        let graph = Graph::decode(blob.engine).expect("graph");
        let outputs: Vec<_> = graph.outputs().iter().map(|&id| graph.tensor(id).name.as_str()).collect();
        assert_eq!(outputs, ["logits", "next_token", "k_cache_out_0", "v_cache_out_0"]);
        let plan = alias_validate::validate_with_engine(h, &graph).expect("aliases agree with the graph");
        assert_eq!(plan.aliases().len(), 2);
        assert!(plan.warnings().is_empty());
    }
}

#[test]
fn manifest_matches_the_schema_and_round_trips() {
    let cfg = Config::tiny();
    let dir = tempfile::tempdir().expect("temp dir");
    let program = export::reference(&cfg, dir.path()).expect("export");
    assert_eq!(program.manifest_path, dir.path().join(MANIFEST));
    let text = std::fs::read_to_string(&program.manifest_path).expect("written");
    let parsed = ProgramSpec::parse(&program.manifest_path, &text).expect("parses");
    assert_eq!(parsed, program.manifest);
    // And a host's checked reading accepts it, blob paths resolved next to the manifest.
    let checked = Manifest::parse(&program.manifest_path, &text).expect("checks");
    assert_eq!(checked.methods["decode"].calls[0].blob.path(), Some(program.decode_blob.as_path()));
    assert_eq!(checked.generate.and_then(|g| g.max_positions), Some(cfg.max_len as u64));

    // Also readable as plain TOML by a host with its own structs.
    let value: toml::Value = toml::from_str(&text).expect("toml");
    assert_eq!(value["format"].as_integer(), Some(1));
    assert_eq!(value["buffers"]["k_cache_0"]["shape"].as_array().map(|a| a.len()), Some(3));
    assert_eq!(value["buffers"]["v_cache_0"]["memory"].as_str(), Some("host"));
    let decode = &value["methods"]["decode"];
    assert_eq!(decode["calls"][0]["blob"].as_str(), Some("decode.blob"));
    assert_eq!(decode["calls"][0]["backend"].as_str(), Some("ReferenceBackend"));
    let args: Vec<_> =
        decode["calls"][0]["args"].as_array().expect("array").iter().filter_map(|a| a.as_str()).collect();
    assert_eq!(
        args,
        [
            "input:tokens",
            "input:input_pos",
            "buffer:k_cache_0",
            "buffer:v_cache_0",
            "buffer:k_cache_0",
            "buffer:v_cache_0",
            "output:logits",
            "output:next_token"
        ]
    );
    assert_eq!(value["methods"]["prefill"]["inputs"][0]["shape"][0].as_integer(), Some(4));
    assert_eq!(value["methods"]["prefill"]["outputs"][0]["shape"][1].as_integer(), Some(64));
    let generate = &value["generate"];
    assert_eq!(generate["prompt"].as_array().map(|p| p.len()), Some(4));
    assert_eq!(generate["prefill"].as_str(), Some("prefill"));
    assert_eq!(generate["token_input"].as_str(), Some("tokens"));
    assert_eq!(generate["position_input"].as_str(), Some("input_pos"));
    assert_eq!(generate["logits_output"].as_str(), Some("logits"));
    assert_eq!(generate["next_token_output"].as_str(), Some("next_token"));
    assert_eq!(checked_next_token(&program), Some("next_token".to_owned()));
    let outputs = &value["methods"]["decode"]["outputs"];
    assert_eq!(outputs[1]["name"].as_str(), Some("next_token"));
    assert_eq!(outputs[1]["dtype"].as_str(), Some("i64"));
    // Host memory is the default, so today's manifests are unchanged: no `memory` on inputs or outputs.
    assert!(
        outputs[0].get("memory").is_none() && value["methods"]["decode"]["inputs"][0].get("memory").is_none()
    );
}

fn checked_next_token(program: &kv_example::ExportedProgram) -> Option<String> {
    let text = std::fs::read_to_string(&program.manifest_path).expect("written");
    Manifest::parse(&program.manifest_path, &text).expect("checks").generate.and_then(|g| g.next_token_output)
}

#[test]
fn big_config_exports_one_buffer_pair_per_layer() {
    let cfg = Config::big();
    let manifest = export::manifest(&cfg);
    assert_eq!(manifest.buffers.len(), 16);
    assert_eq!(manifest.buffers["k_cache_7"].shape, [8, 1024, 64]);
    let args = &manifest.methods["decode"].calls[0].args;
    assert_eq!(args.len(), 2 + 16 + 16 + 2);
    assert_eq!(args[2..4], ["buffer:k_cache_0", "buffer:v_cache_0"]);
    assert_eq!(args[18..20], ["buffer:k_cache_0", "buffer:v_cache_0"]);
    assert_eq!(args[34..], ["output:logits", "output:next_token"]);
}

#[test]
fn invalid_configs_and_unwritable_dirs_are_typed_errors() {
    let dir = tempfile::tempdir().expect("temp dir");
    let too_long = Config { prompt: vec![1; 17], ..Config::tiny() };
    assert!(matches!(
        export::reference(&too_long, dir.path()),
        Err(ExportError::Config(ConfigError::PromptLength { len: 17, max_len: 16 }))
    ));
    let bad_token = Config { prompt: vec![1, 64], ..Config::tiny() };
    assert!(matches!(
        export::reference(&bad_token, dir.path()),
        Err(ExportError::Config(ConfigError::PromptToken { .. }))
    ));
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").expect("write");
    let err = export::reference(&Config::tiny(), &file.join("sub")).expect_err("parent is a file");
    assert!(matches!(err, ExportError::Io { .. }), "{err}");
}

#[test]
fn an_f16_config_exports_f16_everywhere_and_reads_back() {
    let cfg = Config { dtype: ElemType::F16, ..Config::tiny() };
    let dir = tempfile::tempdir().expect("temp dir");
    let target = Target { backend: Backend::Cuda, memory: MemoryKind::Device };
    let program = export::program(&cfg, dir.path(), &target).expect("export");
    let weights = Weights::generate(&cfg);

    for (path, rows) in [(&program.prefill_blob, 4u64), (&program.decode_blob, 1)] {
        let bytes = std::fs::read(path).expect("written");
        let blob = Blob::parse(&bytes).expect("parses");
        blob.verify_payload().expect("checksum");
        let h = &blob.header;
        assert_eq!(h.backend_id, CUDA_BACKEND);
        assert_eq!(h.backend_id, "CudaBackend");
        let dtypes: Vec<_> = h.bindings.iter().map(|b| (b.name.as_str(), b.dtype)).collect();
        assert_eq!(
            dtypes,
            [
                ("tokens", Some(DType::I64)),
                ("input_pos", Some(DType::I64)),
                ("k_cache_0", Some(DType::F16)),
                ("v_cache_0", Some(DType::F16)),
                ("k_cache_out_0", Some(DType::F16)),
                ("v_cache_out_0", Some(DType::F16)),
                ("logits", Some(DType::F16)),
                ("next_token", Some(DType::I64)),
            ]
        );
        assert_eq!(h.bindings[6].shape, Some(vec![Dim::Static(rows), Dim::Static(64)]));

        let graph = Graph::decode(blob.engine).expect("graph");
        alias_validate::validate_with_engine(h, &graph).expect("aliases and types agree with the graph");
        // Every float tensor is f16; only token ids, positions and the next token are i64.
        for t in graph.tensors() {
            let int = ["tokens", "input_pos", "positions", "next_token"].contains(&t.name.as_str());
            assert_eq!(t.dtype, if int { ElemType::I64 } else { ElemType::F16 }, "{}", t.name);
        }
        // Weights are the f32 weights rounded to nearest even.
        let w_out = graph.constant(graph.find("w_out").expect("w_out")).expect("a constant");
        let expected: Vec<half::f16> = weights.w_out.iter().map(|&x| half::f16::from_f32(x)).collect();
        assert_eq!(w_out, &Data::F16(expected));
    }

    // The manifest declares f16 caches and logits, and device memory on buffers, inputs and outputs.
    let text = std::fs::read_to_string(&program.manifest_path).expect("written");
    let checked = Manifest::parse(&program.manifest_path, &text).expect("checks");
    assert_eq!(checked.generate.as_ref().and_then(|g| g.next_token_output.as_deref()), Some("next_token"));
    let value: toml::Value = toml::from_str(&text).expect("toml");
    for buffer in ["k_cache_0", "v_cache_0"] {
        assert_eq!(value["buffers"][buffer]["dtype"].as_str(), Some("f16"));
        assert_eq!(value["buffers"][buffer]["memory"].as_str(), Some("device"));
    }
    for method in ["prefill", "decode"] {
        let m = &value["methods"][method];
        assert_eq!(m["calls"][0]["backend"].as_str(), Some("CudaBackend"));
        let tensors: Vec<_> = ["inputs", "outputs"]
            .iter()
            .flat_map(|k| m[k].as_array().expect("array").iter())
            .map(|t| (t["name"].as_str(), t["dtype"].as_str(), t["memory"].as_str()))
            .collect();
        assert_eq!(
            tensors,
            [
                (Some("tokens"), Some("i64"), Some("device")),
                (Some("input_pos"), Some("i64"), Some("device")),
                (Some("logits"), Some("f16"), Some("device")),
                (Some("next_token"), Some("i64"), Some("device")),
            ]
        );
    }
}

#[test]
fn targets_choose_backend_and_memory_and_reference_stays_as_it_was() {
    let cfg = Config::tiny();
    assert_eq!(export::manifest(&cfg), export::manifest_for(&cfg, &Target::REFERENCE));
    assert_eq!(Target::default(), Target { backend: Backend::Reference, memory: MemoryKind::Host });
    assert_eq!((Backend::Reference.id(), Backend::Cuda.id()), ("ReferenceBackend", "CudaBackend"));
    let managed =
        export::manifest_for(&cfg, &Target { backend: Backend::Reference, memory: MemoryKind::Managed });
    assert!(managed.buffers.values().all(|b| b.memory == "managed"));
    let decode = &managed.methods["decode"];
    assert!(decode.inputs.iter().chain(&decode.outputs).all(|t| t.memory.as_deref() == Some("managed")));
    assert_eq!(decode.calls[0].backend, "ReferenceBackend");
    // The header differs between backends only in its id and engine description.
    let (r, c) = (export::header(&cfg, 1), export::header_for(&cfg, 1, Backend::Cuda));
    assert_eq!((r.bindings, r.aliases), (c.bindings.clone(), c.aliases.clone()));
    assert_eq!(c.backend_id, "CudaBackend");
}

#[test]
fn bench_presets_validate_and_describe_the_issues_models() {
    for which in BenchConfig::ALL {
        let cfg = Config::bench(which);
        cfg.validate().expect("a bench preset is a model");
        assert_eq!(BenchConfig::from_name(which.name()), Some(which));
        // The manifest checks (cheap: no weights are generated).
        let text = export::manifest_for(&cfg, &Target { backend: Backend::Cuda, memory: MemoryKind::Device })
            .to_toml()
            .expect("serializes");
        Manifest::parse(std::path::Path::new("program.toml"), &text).expect("checks");
    }
    assert_eq!(Config::bench(BenchConfig::A), Config::tiny());
    let b = Config::bench(BenchConfig::B);
    assert_eq!(
        (b.layers, b.heads, b.head_dim, b.max_len, b.vocab, b.dtype),
        (8, 8, 64, 1024, 512, ElemType::F16)
    );
    assert_eq!(2 * b.layers * b.cache_len() * 2, 16 << 20, "16 MiB of f16 cache");
    let c = Config::bench(BenchConfig::C);
    assert_eq!(
        (c.layers, c.heads, c.head_dim, c.max_len, c.vocab, c.dtype),
        (32, 8, 128, 8192, 1024, ElemType::F16)
    );
    assert_eq!(2 * c.layers * c.cache_len() * 2, 1 << 30, "1 GiB of f16 cache");
    for cfg in [&b, &c] {
        assert_eq!(cfg.prompt.len(), 16);
        assert_eq!(cfg.prompt, (0..16).map(|i| (i * 37 + 5) % cfg.vocab as i64).collect::<Vec<_>>());
    }
    let seeds = [Config::tiny().seed, Config::big().seed, b.seed, c.seed];
    assert!(seeds.iter().enumerate().all(|(i, s)| !seeds[..i].contains(s)), "distinct seeds {seeds:x?}");
    assert_eq!(BenchConfig::from_name("B"), Some(BenchConfig::B));
    assert_eq!(BenchConfig::from_name("d"), None);
}

#[test]
fn an_integer_dtype_is_refused() {
    let cfg = Config { dtype: ElemType::I64, ..Config::tiny() };
    assert_eq!(cfg.validate(), Err(ConfigError::DType { dtype: ElemType::I64 }));
    let dir = tempfile::tempdir().expect("temp dir");
    let err = export::reference(&cfg, dir.path()).expect_err("i64 weights");
    assert_eq!(
        err.to_string(),
        "invalid config: config field 'dtype' is i64; the example computes in f32 or f16"
    );
}

#[test]
fn without_next_token_gives_a_logits_only_manifest_that_checks() {
    let mut manifest = export::manifest(&Config::tiny());
    export::without_next_token(&mut manifest);
    for method in manifest.methods.values() {
        assert_eq!(method.outputs.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["logits"]);
        assert_eq!(method.calls[0].args.last().map(String::as_str), Some("output:logits"));
        assert_eq!(method.calls[0].args.len(), 7);
    }
    assert_eq!(manifest.generate.as_ref().and_then(|g| g.next_token_output.clone()), None);
    let text = manifest.to_toml().expect("serializes");
    Manifest::parse(std::path::Path::new("program.toml"), &text).expect("checks");
}
