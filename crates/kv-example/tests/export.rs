//! What `export::reference` writes: parseable blobs whose bindings and aliases are as intended, and a
//! manifest of the agreed schema.

use blob_format::model::{AliasKind, DType, Dim, Format, PayloadKind, Role};
use blob_format::Blob;
use kv_example::export::{self, DECODE_BLOB, MANIFEST, PREFILL_BLOB};
use kv_example::{Config, ConfigError, ExportError};
use program_manifest::{Manifest, ProgramSpec};
use ref_graph::Graph;

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
            ]
        );
        assert!(h.bindings.iter().all(|b| b.threaded));
        assert_eq!(h.bindings[0].dtype, Some(DType::I64));
        assert_eq!(h.bindings[0].shape, Some(vec![Dim::Static(rows)]));
        assert_eq!(h.bindings[6].shape, Some(vec![Dim::Static(rows), Dim::Static(64)]));
        assert_eq!(h.bindings[2].shape, Some(vec![Dim::Static(2), Dim::Static(16), Dim::Static(16)]));
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
        assert_eq!(outputs, ["logits", "k_cache_out_0", "v_cache_out_0"]);
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
    assert_eq!(checked.methods["decode"].calls[0].blob, program.decode_blob);
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
            "output:logits"
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
}

#[test]
fn big_config_exports_one_buffer_pair_per_layer() {
    let cfg = Config::big();
    let manifest = export::manifest(&cfg);
    assert_eq!(manifest.buffers.len(), 16);
    assert_eq!(manifest.buffers["k_cache_7"].shape, [8, 1024, 64]);
    let args = &manifest.methods["decode"].calls[0].args;
    assert_eq!(args.len(), 2 + 16 + 16 + 1);
    assert_eq!(args[2..4], ["buffer:k_cache_0", "buffer:v_cache_0"]);
    assert_eq!(args[18..20], ["buffer:k_cache_0", "buffer:v_cache_0"]);
    assert_eq!(args.last().map(String::as_str), Some("output:logits"));
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
