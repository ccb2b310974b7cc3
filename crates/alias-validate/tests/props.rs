//! Property tests: validation is total (never panics) on arbitrary headers and engines, and every plan it
//! returns keeps the invariants delegates rely on.

use std::collections::HashSet;

use alias_validate::residency::{DirectAccess, MemoryKind};
use alias_validate::{
    validate_format, validate_with_engine, AliasPlan, AliasSource, EngineIntrospect, EngineTensor, ValidKind,
};
use blob_format::model::{Alias, AliasKind, Binding, DType, Dim, Header, PayloadKind, Role};
use proptest::prelude::*;
use proptest::sample::Index;

#[path = "support/data_engine.rs"]
mod data_engine;
use data_engine::DataEngine;

/// A small name pool, so that collisions (duplicates, aliases that resolve, engine/blob overlap) are common.
const NAMES: [&str; 6] = ["a", "b", "c", "k", "k_out", "v"];

fn name() -> impl Strategy<Value = String> {
    prop_oneof![4 => proptest::sample::select(NAMES.as_slice()).prop_map(str::to_owned), 1 => "[a-z_]{0,3}"]
}

fn role() -> impl Strategy<Value = Role> {
    prop_oneof![Just(Role::Input), Just(Role::Output)]
}

fn dtype() -> impl Strategy<Value = Option<DType>> {
    proptest::option::of(proptest::sample::select(DType::ALL.as_slice()))
}

fn dim() -> impl Strategy<Value = Dim> {
    prop_oneof![
        3 => (0u64..3).prop_map(Dim::Static),
        1 => Just(Dim::Dynamic),
        1 => any::<u64>().prop_map(Dim::Static),
    ]
}

fn shape() -> impl Strategy<Value = Vec<Dim>> {
    proptest::collection::vec(dim(), 0..3)
}

fn binding() -> impl Strategy<Value = Binding> {
    (name(), role(), dtype(), proptest::option::of(shape()), proptest::bool::weighted(0.85))
        .prop_map(|(name, role, dtype, shape, threaded)| Binding { name, role, dtype, shape, threaded })
}

fn kind() -> impl Strategy<Value = AliasKind> {
    prop_oneof![
        6 => Just(AliasKind::KvCacheUpdate),
        4 => Just(AliasKind::User),
        1 => prop_oneof![Just("kv_cache_updat".to_owned()), Just(String::new()), ".{0,16}"]
            .prop_map(|kind| AliasKind::from_wire(&kind)),
    ]
}

fn alias() -> impl Strategy<Value = Alias> {
    (name(), name(), kind()).prop_map(|(output, input, kind)| Alias { output, input, kind })
}

fn header() -> impl Strategy<Value = Header> {
    // Mostly well-formed tables (distinct names, aliases from an output to an input) so that the accepting
    // paths are reached, with arbitrary bindings and aliases mixed in so that every refusal is too.
    let attributes = (role(), dtype(), proptest::option::of(shape()), proptest::bool::weighted(0.9));
    (
        proptest::sample::subsequence(NAMES.as_slice(), 0..=NAMES.len()).prop_shuffle(),
        proptest::collection::vec(attributes, NAMES.len()),
        proptest::option::weighted(0.2, binding()),
        proptest::collection::vec((any::<Index>(), any::<Index>(), kind()), 0..4),
        proptest::option::weighted(0.2, alias()),
    )
        .prop_map(|(names, attributes, extra_binding, picked_aliases, extra_alias)| {
            let mut bindings: Vec<Binding> = names
                .iter()
                .zip(attributes)
                .map(|(name, (role, dtype, shape, threaded))| Binding {
                    name: (*name).to_owned(),
                    role,
                    dtype,
                    shape,
                    threaded,
                })
                .collect();
            let (outputs, inputs) = names_by_role(&bindings);
            let mut aliases: Vec<Alias> = picked_aliases
                .into_iter()
                .filter(|_| !outputs.is_empty() && !inputs.is_empty())
                .map(|(output, input, kind)| Alias {
                    output: output.get(&outputs).clone(),
                    input: input.get(&inputs).clone(),
                    kind,
                })
                .collect();
            bindings.extend(extra_binding);
            aliases.extend(extra_alias);
            Header::new("TensorRTBackend", PayloadKind::TensorRtPlan, bindings, aliases)
        })
}

/// Names of the output bindings and of the input bindings.
fn names_by_role(bindings: &[Binding]) -> (Vec<String>, Vec<String>) {
    let of = |role| bindings.iter().filter(|b| b.role == role).map(|b| b.name.clone()).collect::<Vec<_>>();
    (of(Role::Output), of(Role::Input))
}

fn engine() -> impl Strategy<Value = DataEngine> {
    let tensor = (name(), role(), dtype(), shape()).prop_map(|(name, role, dtype, shape)| EngineTensor {
        name,
        role,
        dtype,
        shape,
    });
    (
        proptest::collection::vec(tensor, 0..7),
        proptest::collection::vec((name(), name()), 0..3),
        proptest::bool::weighted(0.8),
    )
        .prop_map(|(tensors, aliases, reports_aliases)| DataEngine { tensors, aliases, reports_aliases })
}

/// An engine that agrees with the header's bindings (same names, roles, dtypes, shapes), with the given
/// aliases: it exercises the accepting paths that arbitrary engines rarely reach.
fn matching_engine(header: &Header, aliases: Vec<(String, String)>) -> DataEngine {
    let tensors = header
        .bindings
        .iter()
        .map(|b| EngineTensor {
            name: b.name.clone(),
            role: b.role,
            dtype: b.dtype,
            shape: b.shape.clone().unwrap_or_default(),
        })
        .collect();
    DataEngine { tensors, aliases, reports_aliases: true }
}

/// What every accepted plan guarantees.
fn assert_plan_invariants(header: &Header, plan: &AliasPlan) {
    let mut outputs = HashSet::new();
    let mut inputs = HashSet::new();
    for alias in plan.aliases() {
        assert!(outputs.insert(&alias.output), "output {} aliased twice", alias.output);
        assert!(inputs.insert(&alias.input), "input {} aliased twice", alias.input);
        let input = &header.bindings[alias.input_binding];
        assert_eq!((input.name.as_str(), input.role), (alias.input.as_str(), Role::Input));
        match alias.output_binding {
            Some(i) => {
                let output = &header.bindings[i];
                assert_eq!((output.name.as_str(), output.role), (alias.output.as_str(), Role::Output));
            }
            None => assert_eq!(alias.source, AliasSource::Engine, "only engine-added aliases may be unbound"),
        }
        assert_eq!(plan.alias_for_output(&alias.output), Some(alias));
        if alias.source == AliasSource::Engine {
            assert_eq!(alias.kind, ValidKind::KvCacheUpdate);
        }
    }
    let names: HashSet<&str> = header.bindings.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names.len(), header.bindings.len(), "binding names are unique in an accepted header");
    for binding in header.bindings.iter().filter(|b| !b.threaded) {
        assert!(outputs.contains(&binding.name), "unthreaded {} is an aliased output", binding.name);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn format_validation_is_total(header in header()) {
        if let Ok(plan) = validate_format(&header) {
            assert_plan_invariants(&header, &plan);
            prop_assert_eq!(plan.aliases().len(), header.aliases.len());
            prop_assert!(plan.aliases().iter().all(|a| a.source == AliasSource::Blob));
        }
    }

    #[test]
    fn engine_validation_is_total(header in header(), engine in engine()) {
        let with_engine = validate_with_engine(&header, &engine);
        let format = validate_format(&header);
        if let Ok(plan) = &with_engine {
            assert_plan_invariants(&header, plan);
        }
        // The engine check refuses whatever the format check refuses, with the same error.
        if let Err(error) = format {
            prop_assert_eq!(with_engine.err(), Some(error));
        }
    }

    #[test]
    fn engine_that_matches_accepts_what_the_format_accepts(header in header()) {
        // An engine agreeing with every binding and reporting exactly the blob's kv_cache_update aliases.
        let aliases = header
            .aliases
            .iter()
            .filter(|a| a.kind == AliasKind::KvCacheUpdate)
            .map(|a| (a.output.clone(), a.input.clone()))
            .collect();
        let engine = matching_engine(&header, aliases);
        if let Ok(format_plan) = validate_format(&header) {
            // Every format check passed; only `user` shapes left unchecked by the blob could still fail, and
            // the engine declares the blob's own shapes (scalar when unknown), which then agree.
            let plan = validate_with_engine(&header, &engine);
            let unknown_user_shapes = format_plan.warnings().len();
            if unknown_user_shapes == 0 {
                let plan = plan.expect("a matching engine accepts a format-valid blob");
                prop_assert_eq!(plan.aliases(), format_plan.aliases());
                prop_assert!(plan.warnings().is_empty());
            }
        }
    }

    #[test]
    fn engine_near_the_header_keeps_plan_invariants(
        header in header(),
        picked_aliases in proptest::collection::vec((any::<Index>(), any::<Index>()), 0..4),
        extra_alias in proptest::option::weighted(0.2, (name(), name())),
        extra_output in proptest::option::weighted(0.3, name()),
        reports_aliases in proptest::bool::weighted(0.9),
    ) {
        // An engine that agrees with the blob's bindings, with aliases mostly from its outputs to its inputs
        // (and an unbound extra output sometimes): the accepting paths (engine-added aliases, aliased
        // outputs the blob does not bind) are reached often.
        let (mut outputs, inputs) = names_by_role(&header.bindings);
        outputs.extend(extra_output.clone());
        let mut aliases: Vec<(String, String)> = picked_aliases
            .into_iter()
            .filter(|_| !outputs.is_empty() && !inputs.is_empty())
            .map(|(output, input)| (output.get(&outputs).clone(), input.get(&inputs).clone()))
            .collect();
        aliases.extend(extra_alias);
        let mut engine = matching_engine(&header, aliases);
        engine.reports_aliases = reports_aliases;
        if let Some(name) = extra_output {
            engine.tensors.push(EngineTensor { name, role: Role::Output, dtype: None, shape: Vec::new() });
        }
        let with_engine = validate_with_engine(&header, &engine);
        if let Ok(plan) = &with_engine {
            assert_plan_invariants(&header, plan);
            // Every plan alias of kind kv_cache_update is the engine's own.
            for alias in plan.aliases().iter().filter(|a| a.kind == ValidKind::KvCacheUpdate) {
                prop_assert_eq!(engine.aliased_input(&alias.output), Some(alias.input.clone()));
            }
            // Every engine alias is in the plan.
            for tensor in engine.tensors.iter().filter(|t| t.role == Role::Output) {
                if let Some(input) = engine.aliased_input(&tensor.name).filter(|_| reports_aliases) {
                    let planned = plan.alias_for_output(&tensor.name).expect("engine alias planned");
                    prop_assert_eq!(&planned.input, &input);
                }
            }
            let added = plan.aliases().iter().filter(|a| a.source == AliasSource::Engine).count();
            prop_assert_eq!(plan.warnings().len(), added, "one warning per engine-added alias");
        }
        if let Err(error) = validate_format(&header) {
            prop_assert_eq!(with_engine.err(), Some(error));
        }
    }

    #[test]
    fn residency_gate_is_total(name in ".{0,8}", nbytes in any::<u64>(), integrated in any::<bool>(),
                               residency in proptest::sample::select(MemoryKind::ALL.as_slice())) {
        let accepted = DirectAccess::gpu(integrated).check(&name, residency, nbytes).is_ok();
        let writable = matches!(residency, MemoryKind::Device | MemoryKind::Managed) || integrated;
        prop_assert_eq!(accepted, writable && nbytes > 0);
    }
}
