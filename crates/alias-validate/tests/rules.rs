//! Every rule, data-driven: a blob header and (optionally) an engine are written as short text, and
//! [`check`] renders what validation decides — the plan, or the error with its ExecuTorch code — for an insta
//! snapshot. The snapshots are the expected messages users read.

use alias_validate::residency::{DirectAccess, MemoryKind};
use alias_validate::{
    validate_format, validate_with_engine, AliasPlan, AliasSource, EngineTensor, Error, ValidKind, Warning,
};
use blob_format::model::{Alias, AliasKind, Binding, DType, Dim, Header, PayloadKind, Role};
use et_error::{ErrorCode, HasErrorCode};

#[path = "support/data_engine.rs"]
mod data_engine;
use data_engine::DataEngine;

// ----- test data: headers and engines from text -----

/// One tensor line: `in|out NAME [DTYPE] [[d0,d1,?]] [unthreaded] [aliases INPUT]`.
struct TensorSpec {
    role: Role,
    name: String,
    dtype: Option<DType>,
    shape: Option<Vec<Dim>>,
    threaded: bool,
    aliases: Option<String>,
}

fn parse_tensor(line: &str) -> TensorSpec {
    let mut words = line.split_whitespace();
    let role = match words.next() {
        Some("in") => Role::Input,
        Some("out") => Role::Output,
        other => panic!("test data: tensor line must start with in/out, got {other:?} in {line:?}"),
    };
    let name = words.next().unwrap_or_else(|| panic!("test data: no name in {line:?}")).to_owned();
    let mut spec = TensorSpec { role, name, dtype: None, shape: None, threaded: true, aliases: None };
    while let Some(word) = words.next() {
        if let Some(dims) = word.strip_prefix('[').and_then(|w| w.strip_suffix(']')) {
            let dims = dims.split(',').filter(|d| !d.is_empty());
            spec.shape = Some(
                dims.map(|d| match d {
                    "?" => Dim::Dynamic,
                    n => Dim::Static(n.parse().unwrap_or_else(|_| panic!("test data: bad dim {n:?}"))),
                })
                .collect(),
            );
        } else if word == "unthreaded" {
            spec.threaded = false;
        } else if word == "aliases" {
            spec.aliases = Some(words.next().expect("test data: `aliases` needs an input name").to_owned());
        } else {
            spec.dtype =
                Some(DType::from_name(word).unwrap_or_else(|| panic!("test data: bad word {word:?}")));
        }
    }
    spec
}

fn lines(text: &str) -> impl Iterator<Item = &str> {
    text.split([';', '\n']).map(str::trim).filter(|line| !line.is_empty())
}

/// A header from binding lines and alias lines `OUTPUT -> INPUT [KIND]` (no kind: the default).
fn header(bindings: &str, aliases: &str) -> Header {
    Header::new(
        "TensorRTBackend",
        PayloadKind::TensorRtPlan,
        lines(bindings)
            .map(parse_tensor)
            .map(|t| Binding {
                name: t.name,
                role: t.role,
                dtype: t.dtype,
                shape: t.shape,
                threaded: t.threaded,
            })
            .collect(),
        lines(aliases)
            .map(|line| {
                let words: Vec<&str> = line.split_whitespace().collect();
                let [output, "->", input, rest @ ..] = words.as_slice() else {
                    panic!("test data: alias line must be `OUTPUT -> INPUT [KIND]`: {line:?}")
                };
                let kind = rest.first().map_or(AliasKind::default(), |kind| AliasKind::from_wire(kind));
                Alias { output: (*output).to_owned(), input: (*input).to_owned(), kind }
            })
            .collect(),
    )
}

/// Tensor lines (`out NAME ... aliases INPUT` marks the engine's own alias); a first line `no-alias-report`
/// makes an engine library that cannot report aliases. A missing shape is a scalar (`[]`).
fn engine(text: &str) -> DataEngine {
    let mut engine = DataEngine { tensors: Vec::new(), aliases: Vec::new(), reports_aliases: true };
    for line in lines(text) {
        if line == "no-alias-report" {
            engine.reports_aliases = false;
            continue;
        }
        let t = parse_tensor(line);
        if let Some(input) = t.aliases {
            engine.aliases.push((t.name.clone(), input));
        }
        engine.tensors.push(EngineTensor {
            name: t.name,
            role: t.role,
            dtype: t.dtype,
            shape: t.shape.unwrap_or_default(),
        });
    }
    engine
}

// ----- rendering -----

fn render_plan(header: &Header, plan: &AliasPlan) -> String {
    let mut out = String::from("ok\n");
    for alias in plan.aliases() {
        // The plan's indices must point at the bindings of those names: binding is by name.
        if let Some(i) = alias.output_binding {
            assert_eq!(header.bindings[i].name, alias.output, "output_binding index");
            assert_eq!(header.bindings[i].role, Role::Output);
        }
        assert_eq!(header.bindings[alias.input_binding].name, alias.input, "input_binding index");
        assert_eq!(header.bindings[alias.input_binding].role, Role::Input);
        let output_binding = alias.output_binding.map_or("none".to_owned(), |i| format!("#{i}"));
        out += &format!(
            "  alias {} -> {} ({}, from {:?}, output binding {}, input binding #{})\n",
            alias.output, alias.input, alias.kind, alias.source, output_binding, alias.input_binding
        );
    }
    for warning in plan.warnings() {
        out += &format!("  warning: {warning}\n");
    }
    out
}

fn render_error(error: &Error) -> String {
    format!("error {}: {error}\n  {error:?}\n", error.error_code())
}

fn render(header: &Header, result: &Result<AliasPlan, Error>) -> String {
    match result {
        Ok(plan) => render_plan(header, plan),
        Err(error) => render_error(error),
    }
}

/// Validates at format level and, given an engine, against it; renders both verdicts.
fn check(bindings: &str, aliases: &str, engine_text: Option<&str>) -> String {
    let header = header(bindings, aliases);
    let format = validate_format(&header);
    let mut out = format!("format: {}", render(&header, &format));
    if let Some(engine_text) = engine_text {
        let with_engine = validate_with_engine(&header, &engine(engine_text));
        // Whatever the format rules refuse, the engine rules refuse too (the same error).
        if let Err(format_error) = &format {
            assert_eq!(
                with_engine.as_ref().err(),
                Some(format_error),
                "engine check must keep format errors"
            );
        }
        out += &format!("engine: {}", render(&header, &with_engine));
    }
    out
}

fn format_error(bindings: &str, aliases: &str) -> Error {
    validate_format(&header(bindings, aliases)).expect_err("test expects a format error")
}

fn engine_error(bindings: &str, aliases: &str, engine_text: &str) -> Error {
    validate_with_engine(&header(bindings, aliases), &engine(engine_text)).expect_err("test expects an error")
}

fn plan_with_engine(bindings: &str, aliases: &str, engine_text: &str) -> AliasPlan {
    validate_with_engine(&header(bindings, aliases), &engine(engine_text)).expect("test expects a plan")
}

// ----- common models -----

/// One-layer decoder, aliased output *after* the user output (TensorRT's own order).
const DECODER: &str = "in tokens i64 [1,1]; in k_cache f16 [1,2,16,16]; \
                       out logits f32 [1,64]; out k_cache_out f16 [1,2,16,16]";
const DECODER_ENGINE: &str = "in tokens i64 [1,1]; in k_cache f16 [1,2,16,16]; \
                              out logits f32 [1,64]; out k_cache_out f16 [1,2,16,16] aliases k_cache";

/// K and V caches.
const KV: &str = "in tokens i64 [1,1]; in k_cache f16 [16,32]; in v_cache f16 [16,32]; \
                  out logits f32 [1,64]; out k_out f16 [16,32]; out v_out f16 [16,32]";
const KV_ENGINE: &str = "in tokens i64 [1,1]; in k_cache f16 [16,32]; in v_cache f16 [16,32]; \
                         out logits f32 [1,64]; out k_out f16 [16,32] aliases k_cache; \
                         out v_out f16 [16,32] aliases v_cache";

// ----- accepted plans -----

#[test]
fn kv_cache_alias_accepted() {
    insta::assert_snapshot!(check(DECODER, "k_cache_out -> k_cache kv_cache_update", Some(DECODER_ENGINE)));
}

#[test]
fn missing_kind_is_kv_cache_update() {
    let plan = validate_format(&header(DECODER, "k_cache_out -> k_cache")).expect("valid");
    assert_eq!(plan.aliases()[0].kind, ValidKind::KvCacheUpdate);
}

#[test]
fn aliased_output_order_does_not_matter() {
    // Aliased output after the user output (engine order) and before it (ExecuTorch's mutation-first
    // order): the plan binds by name, so both resolve the alias to the binding of that name.
    let after = "in k_cache f32 [1,2,16,8]; in update f32 [1,2,1,8]; in write_idx i32 [1]; \
                 out logits f32 [1]; out k_cache_out f32 [1,2,16,8]";
    let before = "in k_cache f32 [1,2,16,8]; in update f32 [1,2,1,8]; in write_idx i32 [1]; \
                  out k_cache_out f32 [1,2,16,8]; out logits f32 [1]";
    let engine = "in k_cache f32 [1,2,16,8]; in update f32 [1,2,1,8]; in write_idx i32 [1]; \
                  out logits f32 [1]; out k_cache_out f32 [1,2,16,8] aliases k_cache";
    let alias = "k_cache_out -> k_cache";
    for (bindings, output_index) in [(after, 4), (before, 3)] {
        let plan = plan_with_engine(bindings, alias, engine);
        let planned = plan.alias_for_output("k_cache_out").expect("aliased");
        assert_eq!(planned.output_binding, Some(output_index));
        assert_eq!(planned.input_binding, 0);
        assert!(plan.alias_for_output("logits").is_none());
        assert!(plan.warnings().is_empty());
    }
    insta::assert_snapshot!(format!(
        "after:\n{}before:\n{}",
        check(after, alias, Some(engine)),
        check(before, alias, Some(engine))
    ));
}

#[test]
fn two_aliased_caches() {
    let plan = plan_with_engine(KV, "k_out -> k_cache; v_out -> v_cache", KV_ENGINE);
    assert_eq!(plan.aliased_input_names().collect::<Vec<_>>(), ["k_cache", "v_cache"]);
    assert!(plan.is_aliased_input("v_cache") && !plan.is_aliased_input("tokens"));
    assert_eq!(plan.alias_for_input("v_cache").map(|a| a.output.as_str()), Some("v_out"));
    // Lookups by binding index, as a delegate walking its arguments does.
    assert_eq!(plan.alias_for_input_binding(2).map(|a| a.output.as_str()), Some("v_out"));
    assert_eq!(plan.alias_for_output_binding(4).map(|a| a.input.as_str()), Some("k_cache"));
    assert!(plan.alias_for_input_binding(0).is_none() && plan.alias_for_output_binding(3).is_none());
    insta::assert_snapshot!(check(KV, "k_out -> k_cache; v_out -> v_cache", Some(KV_ENGINE)));
}

#[test]
fn upstream_blob_without_shapes_validates() {
    // Upstream blobs record no dtype or shape; the engine supplies them.
    let bindings = "in k_cache; in update; in write_idx; out k_cache_out; out logits";
    let engine = "in k_cache f32 [1,2,16,8]; in update f32 [1,2,1,8]; in write_idx i32 [1]; \
                  out k_cache_out f32 [1,2,16,8] aliases k_cache; out logits f32 [1]";
    insta::assert_snapshot!(check(bindings, "k_cache_out -> k_cache kv_cache_update", Some(engine)));
}

#[test]
fn unthreaded_aliased_output_accepted() {
    let bindings = "in tokens; in k_cache; out logits; out k_cache_out unthreaded";
    let plan = validate_format(&header(bindings, "k_cache_out -> k_cache")).expect("valid");
    assert_eq!(plan.aliases().len(), 1);
}

#[test]
fn no_aliases_is_an_empty_plan() {
    let plan = validate_format(&header("in input f32 [1,3,4,4]; out output f32 [1,3,4,4]", "")).expect("ok");
    assert!(plan.is_empty() && plan.warnings().is_empty());
}

// ----- user aliases -----

#[test]
fn user_alias_matching_shapes() {
    let bindings = "in x f32 [4,?]; in state f32 [2,?,8]; out y f32 [4,?]; out state_out f32 [2,?,8]";
    let engine = "in x f32 [4,?]; in state f32 [2,?,8]; out y f32 [4,?]; out state_out f32 [2,?,8]";
    let plan = plan_with_engine(bindings, "state_out -> state user", engine);
    assert_eq!(plan.aliases()[0].kind, ValidKind::User);
    assert!(plan.warnings().is_empty());
    insta::assert_snapshot!(check(bindings, "state_out -> state user", Some(engine)));
}

#[test]
fn user_alias_mismatching_shapes() {
    let bindings = "in state f32 [2,16,8]; out state_out f32 [2,16,4]";
    let error = format_error(bindings, "state_out -> state user");
    assert!(matches!(&error, Error::UserAliasShapeMismatch { output, input, .. }
        if output == "state_out" && input == "state"));
    assert_eq!(error.error_code(), ErrorCode::InvalidProgram);
    insta::assert_snapshot!(check(bindings, "state_out -> state user", None));
}

#[test]
fn user_alias_rank_mismatch() {
    insta::assert_snapshot!(check(
        "in state f32 [2,16,8]; out state_out f32 [2,128]",
        "state_out -> state user",
        None
    ));
}

#[test]
fn user_alias_dynamic_dim_equals_only_dynamic() {
    // A static 16 where the other side declares a dynamic dim: not provably the same storage size.
    let bindings = "in state f32 [2,?]; out state_out f32 [2,16]";
    assert!(matches!(
        format_error(bindings, "state_out -> state user"),
        Error::UserAliasShapeMismatch { .. }
    ));
    insta::assert_snapshot!(check(bindings, "state_out -> state user", None));
}

#[test]
fn user_alias_dtype_mismatch() {
    let bindings = "in state f32 [2,16]; out state_out f16 [2,16]";
    assert!(matches!(
        format_error(bindings, "state_out -> state user"),
        Error::UserAliasDTypeMismatch { .. }
    ));
    insta::assert_snapshot!(check(bindings, "state_out -> state user", None));
}

#[test]
fn user_alias_unknown_shapes_deferred_then_checked_by_engine() {
    // Upstream-style blob: no shapes, so the format level defers with a warning...
    let bindings = "in state; out state_out";
    let plan = validate_format(&header(bindings, "state_out -> state user")).expect("deferred, not refused");
    assert!(matches!(plan.warnings(), [Warning::UserAliasUnchecked { output, .. }] if output == "state_out"));
    // ...and the engine's shapes decide.
    let good = "in state f32 [2,16]; out state_out f32 [2,16]";
    assert!(plan_with_engine(bindings, "state_out -> state user", good).warnings().is_empty());
    let bad = "in state f32 [2,16]; out state_out f32 [2,8]";
    insta::assert_snapshot!(check(bindings, "state_out -> state user", Some(bad)));
}

#[test]
fn user_alias_conflicting_with_engine_alias() {
    let bindings = "in a f32 [4]; in b f32 [4]; out o f32 [4]";
    let engine = "in a f32 [4]; in b f32 [4]; out o f32 [4] aliases b";
    let error = engine_error(bindings, "o -> a user", engine);
    assert!(matches!(error, Error::UserAliasConflictsWithEngine { .. }));
    insta::assert_snapshot!(check(bindings, "o -> a user", Some(engine)));
}

#[test]
fn user_alias_needs_no_alias_report() {
    let bindings = "in state f32 [2,16]; out state_out f32 [2,16]";
    let engine = "no-alias-report; in state f32 [2,16]; out state_out f32 [2,16]";
    let plan = plan_with_engine(bindings, "state_out -> state user", engine);
    assert_eq!(plan.aliases().len(), 1);
}

// ----- engine reconciliation -----

#[test]
fn engine_alias_missing_from_blob_is_added_with_warning() {
    // The blob records the K alias only; the engine also aliases V.
    let plan = plan_with_engine(KV, "k_out -> k_cache", KV_ENGINE);
    let added = plan.alias_for_output("v_out").expect("engine alias added");
    assert_eq!(added.kind, ValidKind::KvCacheUpdate);
    assert_eq!(added.source, AliasSource::Engine);
    assert_eq!(added.output_binding, Some(5));
    assert_eq!(plan.aliases()[0].source, AliasSource::Blob);
    assert!(matches!(plan.warnings(), [Warning::EngineAliasAdded { output, input, output_bound: true }]
        if output == "v_out" && input == "v_cache"));
    insta::assert_snapshot!(check(KV, "k_out -> k_cache", Some(KV_ENGINE)));
}

#[test]
fn engine_alias_of_output_the_blob_does_not_bind() {
    // The aliased output is not listed in the blob at all: no delegate argument, output_binding None.
    let bindings = "in tokens i64 [1,1]; in k_cache f16 [1,2,16,16]; out logits f32 [1,64]";
    let plan = plan_with_engine(bindings, "", DECODER_ENGINE);
    let added = plan.alias_for_output("k_cache_out").expect("engine alias added");
    assert_eq!((added.output_binding, added.input_binding), (None, 1));
    insta::assert_snapshot!(check(bindings, "", Some(DECODER_ENGINE)));
}

#[test]
fn blob_alias_the_engine_disagrees_with() {
    let engine_text = "in tokens i64 [1,1]; in k_cache f16 [16,32]; in v_cache f16 [16,32]; \
                       out logits f32 [1,64]; out k_out f16 [16,32] aliases v_cache; \
                       out v_out f16 [16,32] aliases k_cache";
    let error = engine_error(KV, "k_out -> k_cache; v_out -> v_cache", engine_text);
    assert!(matches!(&error, Error::KvCacheInputMismatch { output, blob_input, engine_input }
        if output == "k_out" && blob_input == "k_cache" && engine_input == "v_cache"));
    insta::assert_snapshot!(check(KV, "k_out -> k_cache; v_out -> v_cache", Some(engine_text)));
}

#[test]
fn blob_alias_the_engine_does_not_have() {
    let engine_text = "in tokens i64 [1,1]; in k_cache f16 [1,2,16,16]; out logits f32 [1,64]; \
                       out k_cache_out f16 [1,2,16,16]";
    let error = engine_error(DECODER, "k_cache_out -> k_cache", engine_text);
    assert!(matches!(error, Error::KvCacheNotAliasedByEngine { .. }));
    insta::assert_snapshot!(check(DECODER, "k_cache_out -> k_cache", Some(engine_text)));
}

#[test]
fn engine_that_cannot_report_aliases() {
    let engine_text = format!("no-alias-report; {DECODER_ENGINE}");
    let error = engine_error(DECODER, "k_cache_out -> k_cache", &engine_text);
    assert_eq!(error.error_code(), ErrorCode::NotSupported);
    insta::assert_snapshot!(check(DECODER, "k_cache_out -> k_cache", Some(&engine_text)));
}

#[test]
fn engine_alias_onto_input_a_user_alias_already_targets() {
    let bindings = "in s f32 [4]; out a f32 [4]; out b f32 [4]";
    let engine_text = "in s f32 [4]; out a f32 [4]; out b f32 [4] aliases s";
    let error = engine_error(bindings, "a -> s user", engine_text);
    assert!(matches!(error, Error::InputAliasedTwice { .. }));
    insta::assert_snapshot!(check(bindings, "a -> s user", Some(engine_text)));
}

#[test]
fn engine_alias_onto_a_non_input() {
    let bindings = "in x f32 [4]; out y f32 [4]; out z f32 [4]";
    insta::assert_snapshot!(format!(
        "onto output:\n{}onto unknown name:\n{}",
        check(bindings, "", Some("in x f32 [4]; out y f32 [4] aliases z; out z f32 [4]")),
        check(bindings, "", Some("in x f32 [4]; out y f32 [4] aliases w; out z f32 [4]"))
    ));
}

// ----- bindings against the engine -----

#[test]
fn binding_not_in_engine() {
    insta::assert_snapshot!(check(
        "in tokens; in k_cache; out logits; out k_cache_out",
        "",
        Some("in tokens; in k_cache; out logits")
    ));
}

#[test]
fn binding_role_differs_from_engine() {
    insta::assert_snapshot!(check("in x; out y", "", Some("out x; out y")));
}

#[test]
fn engine_input_without_binding() {
    insta::assert_snapshot!(check("in x; out y", "", Some("in x; in mask; out y")));
}

#[test]
fn engine_output_without_binding() {
    insta::assert_snapshot!(check("in x; out y", "", Some("in x; out y; out extra")));
}

#[test]
fn dtype_differs_from_engine() {
    insta::assert_snapshot!(check("in x f16 [4]; out y f32 [4]", "", Some("in x f32 [4]; out y f32 [4]")));
}

#[test]
fn shape_differs_from_engine() {
    insta::assert_snapshot!(check(
        "in x f32 [4,8]; out y f32 [4]",
        "",
        Some("in x f32 [4,16]; out y f32 [4]")
    ));
}

#[test]
fn dynamic_dims_agree_with_engine_dims() {
    // Between blob and engine a dynamic dim is "not known" on that side: rank and static dims must agree.
    plan_with_engine("in x f32 [?,8]; out y f32 [4,?]", "", "in x f32 [4,8]; out y f32 [4,?]");
    let error = engine_error("in x f32 [?,8,1]; out y f32 [4]", "", "in x f32 [4,8]; out y f32 [4]");
    assert!(matches!(error, Error::BindingShapeMismatch { .. }));
}

#[test]
fn duplicate_engine_tensor() {
    insta::assert_snapshot!(check("in x; out y", "", Some("in x; out y; out y")));
}

// ----- binding table -----

#[test]
fn duplicate_binding() {
    let error = format_error("in x; in k; out y; out k", "");
    assert!(matches!(error, Error::DuplicateBinding { first: 1, second: 3, .. }));
    insta::assert_snapshot!(check("in x; in k; out y; out k", "", None));
}

#[test]
fn unthreaded_output_that_is_not_aliased() {
    insta::assert_snapshot!(check("in x; out y unthreaded; out z", "", None));
}

#[test]
fn unthreaded_input() {
    insta::assert_snapshot!(check("in x unthreaded; out y", "", None));
}

// ----- alias table -----

#[test]
fn alias_names_not_found() {
    let bindings = "in k_cache; out k_cache_out";
    for (alias, output_found, input_found) in
        [("k_out -> k_cache", false, true), ("k_cache_out -> k", true, false), ("a -> b", false, false)]
    {
        let error = format_error(bindings, alias);
        assert!(
            matches!(error, Error::AliasNamesNotFound { output_found: o, input_found: i, .. }
                if o == output_found && i == input_found),
            "{alias}"
        );
        assert!(error.to_string().starts_with("aliased_io names not found (output="), "{error}");
    }
    insta::assert_snapshot!(format!(
        "{}{}{}",
        check(bindings, "k_out -> k_cache", None),
        check(bindings, "k_cache_out -> k", None),
        check(bindings, "a -> b", None)
    ));
}

#[test]
fn alias_written_backwards() {
    insta::assert_snapshot!(check("in k_cache; out k_cache_out", "k_cache -> k_cache_out", None));
}

#[test]
fn alias_between_two_outputs() {
    insta::assert_snapshot!(check("in k; out a; out b", "a -> b user", None));
}

#[test]
fn output_aliased_twice() {
    insta::assert_snapshot!(check(KV, "k_out -> k_cache; k_out -> v_cache", Some(KV_ENGINE)));
}

#[test]
fn two_outputs_on_one_input() {
    insta::assert_snapshot!(check(KV, "k_out -> k_cache; v_out -> k_cache", Some(KV_ENGINE)));
}

#[test]
fn unknown_kind_typo() {
    let error = format_error(DECODER, "k_cache_out -> k_cache kv_cache_updat");
    assert!(matches!(&error, Error::UnknownAliasKind { kind, suggestion: Some("kv_cache_update"), .. }
        if kind == "kv_cache_updat"));
    insta::assert_snapshot!(check(DECODER, "k_cache_out -> k_cache kv_cache_updat", Some(DECODER_ENGINE)));
}

#[test]
fn unknown_kind_from_newer_exporter() {
    let error = format_error(DECODER, "k_cache_out -> k_cache paged_kv_update_v2");
    assert!(matches!(error, Error::UnknownAliasKind { suggestion: None, .. }));
    insta::assert_snapshot!(check(DECODER, "k_cache_out -> k_cache paged_kv_update_v2", None));
}

#[test]
fn unknown_kind_differing_in_case() {
    assert!(matches!(
        format_error(DECODER, "k_cache_out -> k_cache USER"),
        Error::UnknownAliasKind { suggestion: Some("user"), .. }
    ));
}

// ----- residency gate -----

#[test]
fn residency_gate() {
    let mut out = String::new();
    for integrated in [false, true] {
        for residency in MemoryKind::ALL {
            for nbytes in [4096, 0] {
                let verdict = match DirectAccess::gpu(integrated).check("k_cache", residency, nbytes) {
                    Ok(()) => "ok".to_owned(),
                    Err(error) => format!("error {}: {error}", error.error_code()),
                };
                out += &format!("integrated={integrated} {residency} {nbytes}B: {verdict}\n");
            }
        }
    }
    insta::assert_snapshot!(out);
}

#[test]
fn host_resident_aliased_input_refused() {
    for residency in [MemoryKind::Host, MemoryKind::Pinned] {
        let error =
            DirectAccess::gpu(false).check("k_cache", residency, 4096).expect_err("host on discrete GPU");
        assert_eq!(error.error_code(), ErrorCode::InvalidArgument);
        assert!(error.to_string().starts_with("aliased input 'k_cache' must be on GPU or unified memory"));
    }
}

#[test]
fn zero_byte_aliased_input_refused() {
    for residency in [MemoryKind::Device, MemoryKind::Managed] {
        for integrated in [false, true] {
            let error = DirectAccess::gpu(integrated).check("v_cache", residency, 0).expect_err("zero bytes");
            assert_eq!(error, Error::AliasedInputEmpty { name: "v_cache".to_owned() });
            assert_eq!(error.error_code(), ErrorCode::InvalidArgument);
            assert!(error.to_string().contains("aliased input 'v_cache' must be on GPU or unified memory"));
        }
    }
}

#[test]
fn integrated_gpu_host_memory_accepted() {
    for residency in MemoryKind::ALL {
        assert_eq!(DirectAccess::gpu(true).check("k_cache", residency, 1), Ok(()), "{residency}");
    }
}

#[test]
fn device_and_managed_accepted_on_discrete_gpu() {
    for residency in [MemoryKind::Device, MemoryKind::Managed] {
        assert_eq!(DirectAccess::gpu(false).check("k_cache", residency, 1), Ok(()), "{residency}");
    }
}
