//! The rules: [`validate_format`] (the blob alone) and [`validate_with_engine`] (the blob against its engine).

use std::collections::HashMap;

use blob_format::model::{Alias, AliasKind, DType, Dim, Header, Role};

use crate::engine::{EngineIntrospect, EngineTensor};
use crate::plan::{AliasPlan, AliasSource, PlannedAlias, ValidKind, Warning};
use crate::Error;

/// Checks the rules that need no engine: the binding table, the alias table, known kinds, and `user` aliases
/// against the shapes and dtypes the blob records.
///
/// The rules, in the order they are checked (the first failure is returned):
/// 1. binding names are unique;
/// 2. for each alias, in table order: both names resolve to bindings, the output to an output and the input
///    to an input; the kind is `kv_cache_update` or `user`; no output and no input appears in two aliases; a
///    `user` alias joins tensors of equal dtype and equal shape (compared as declared, a dynamic dim equals
///    only a dynamic dim) where the blob records them;
/// 3. every unthreaded binding is the output of an alias.
///
/// A `user` alias whose shapes or dtypes the blob does not record is accepted with a
/// [`Warning::UserAliasUnchecked`]; [`validate_with_engine`] checks it.
///
/// # Errors
///
/// The [`Error`] variant of the first rule broken, all [`et_error::ErrorCode::InvalidProgram`].
pub fn validate_format(header: &Header) -> Result<AliasPlan, Error> {
    let checked = check_format(header)?;
    let warnings = checked
        .unchecked_user
        .iter()
        .map(|&i| {
            let alias = &checked.aliases[i];
            tracing::debug!(
                output = %alias.output,
                input = %alias.input,
                "user alias left for the engine check"
            );
            Warning::UserAliasUnchecked { output: alias.output.clone(), input: alias.input.clone() }
        })
        .collect();
    Ok(AliasPlan { aliases: checked.aliases, warnings })
}

/// Checks every rule of [`validate_format`], then the blob against its engine.
///
/// Engine rules, in order:
/// 1. the engine's tensor names are unique;
/// 2. every binding names an engine tensor of the same role, and their dtypes and shapes agree where both
///    are known (rank always; a static dim must equal a static dim, a dynamic dim on either side agrees);
/// 3. every engine input has a binding, and so does every engine output the engine does not alias;
/// 4. each blob alias, in table order: a `kv_cache_update` alias must be the engine's own
///    ([`EngineIntrospect::aliased_input`] of its output equals its input), and is
///    [`et_error::ErrorCode::NotSupported`] when the engine cannot report aliases; a `user` alias must not
///    contradict an engine alias of its output, and joins tensors of equal dtype and shape as the engine
///    declares them;
/// 5. each engine alias the blob lacks, in engine order, is added as `kv_cache_update` with
///    [`AliasSource::Engine`] and a [`Warning::EngineAliasAdded`] (also logged with `tracing::warn!`), provided
///    its input is an engine input no other alias targets.
///
/// Whatever [`validate_format`] refuses, this refuses too.
///
/// # Errors
///
/// The [`Error`] variant of the first rule broken.
///
/// # Examples
///
/// ```
/// use alias_validate::{validate_with_engine, AliasSource, EngineIntrospect, EngineTensor, ValidKind};
/// use blob_format::model::{Binding, Dim, DType, Header, PayloadKind, Role};
///
/// /// An engine whose output `k_out` writes input `k` in place.
/// struct Engine;
/// impl EngineIntrospect for Engine {
///     fn tensors(&self) -> Vec<EngineTensor> {
///         let t = |name: &str, role| EngineTensor {
///             name: name.into(), role, dtype: Some(DType::F16), shape: vec![Dim::Static(16)],
///         };
///         vec![t("k", Role::Input), t("k_out", Role::Output)]
///     }
///     fn reports_aliases(&self) -> bool { true }
///     fn aliased_input(&self, output: &str) -> Option<String> {
///         (output == "k_out").then(|| "k".to_owned())
///     }
/// }
///
/// // A blob that forgot to record the alias.
/// let header = Header {
///     producer: None,
///     backend_id: "TensorRTBackend".into(),
///     payload_kind: PayloadKind::TensorRtPlan,
///     bindings: vec![Binding::untyped("k", Role::Input), Binding::untyped("k_out", Role::Output)],
///     aliases: vec![],
///     device_id: 0,
///     hardware_compatible: false,
///     hardware_target: None,
///     engine_library_version: None,
///     engine_metadata: None,
/// };
/// let plan = validate_with_engine(&header, &Engine)?;
/// let alias = plan.alias_for_output("k_out").expect("the engine's alias is added");
/// assert_eq!(alias.input, "k");
/// assert_eq!((alias.kind, alias.source), (ValidKind::KvCacheUpdate, AliasSource::Engine));
/// assert_eq!(plan.warnings().len(), 1);
/// # Ok::<(), alias_validate::Error>(())
/// ```
pub fn validate_with_engine(header: &Header, engine: &dyn EngineIntrospect) -> Result<AliasPlan, Error> {
    let FormatChecked { by_name, mut aliases, .. } = check_format(header)?;
    let tensors = engine.tensors();
    let facts = EngineFacts::read(engine, &tensors)?;
    check_bindings_against_engine(header, &facts)?;
    check_engine_tensors_bound(&tensors, &facts, &by_name)?;
    for alias in &aliases {
        check_blob_alias(header, &facts, alias)?;
    }
    let mut warnings = Vec::new();
    for (output, input) in &facts.aliases {
        if aliases.iter().any(|alias| alias.output == *output) {
            continue; // A blob alias of this output, verified in step 4.
        }
        let (alias, warning) = engine_alias_added(&facts, &by_name, &aliases, output, input)?;
        tracing::warn!(output = %output, input = %input, "{warning}");
        warnings.push(warning);
        aliases.push(alias);
    }
    Ok(AliasPlan { aliases, warnings })
}

/// What the engine says of itself, read once (engine rule 1).
struct EngineFacts<'t> {
    /// The engine's tensors, by name (names are unique).
    by_name: HashMap<&'t str, &'t EngineTensor>,
    /// Whether the engine can report its aliases.
    reports_aliases: bool,
    /// The engine's own aliases, output -> input, in engine order (asked once per output).
    aliases: Vec<(&'t str, String)>,
    /// Index into `aliases` by output name.
    alias_index: HashMap<&'t str, usize>,
}

impl<'t> EngineFacts<'t> {
    /// Indexes `tensors` (the engine's own) by name and asks the engine for each output's alias.
    fn read(engine: &dyn EngineIntrospect, tensors: &'t [EngineTensor]) -> Result<Self, Error> {
        let mut by_name: HashMap<&str, &EngineTensor> = HashMap::with_capacity(tensors.len());
        for tensor in tensors {
            if by_name.insert(tensor.name.as_str(), tensor).is_some() {
                return Err(Error::DuplicateEngineTensor { name: tensor.name.clone() });
            }
        }
        let reports_aliases = engine.reports_aliases();
        let aliases: Vec<(&str, String)> = if reports_aliases {
            tensors
                .iter()
                .filter(|tensor| tensor.role == Role::Output)
                .filter_map(|tensor| {
                    engine.aliased_input(&tensor.name).map(|input| (tensor.name.as_str(), input))
                })
                .collect()
        } else {
            Vec::new()
        };
        let alias_index = aliases.iter().enumerate().map(|(index, (output, _))| (*output, index)).collect();
        Ok(EngineFacts { by_name, reports_aliases, aliases, alias_index })
    }

    /// The input the engine aliases onto `output`, if any.
    fn alias_of(&self, output: &str) -> Option<&str> {
        self.alias_index.get(output).map(|&index| self.aliases[index].1.as_str())
    }
}

/// Engine rule 2: every binding against its engine tensor.
fn check_bindings_against_engine(header: &Header, facts: &EngineFacts<'_>) -> Result<(), Error> {
    for binding in &header.bindings {
        let Some(tensor) = facts.by_name.get(binding.name.as_str()) else {
            return Err(Error::BindingNotInEngine { name: binding.name.clone(), role: binding.role });
        };
        if tensor.role != binding.role {
            return Err(Error::BindingRoleMismatch {
                name: binding.name.clone(),
                blob_role: binding.role,
                engine_role: tensor.role,
            });
        }
        if let (Some(blob), Some(engine)) = (binding.dtype, tensor.dtype) {
            if blob != engine {
                return Err(Error::BindingDTypeMismatch { name: binding.name.clone(), blob, engine });
            }
        }
        if let Some(blob) = &binding.shape {
            if !shapes_agree(blob, &tensor.shape) {
                return Err(Error::BindingShapeMismatch {
                    name: binding.name.clone(),
                    blob: blob.clone(),
                    engine: tensor.shape.clone(),
                });
            }
        }
    }
    Ok(())
}

/// Engine rule 3: every engine tensor the delegate must give storage to has a binding.
fn check_engine_tensors_bound(
    tensors: &[EngineTensor],
    facts: &EngineFacts<'_>,
    by_name: &HashMap<&str, usize>,
) -> Result<(), Error> {
    for tensor in tensors {
        let needs_binding = tensor.role == Role::Input || facts.alias_of(&tensor.name).is_none();
        if needs_binding && !by_name.contains_key(tensor.name.as_str()) {
            return Err(Error::EngineTensorUnbound { name: tensor.name.clone(), role: tensor.role });
        }
    }
    Ok(())
}

/// Engine rule 4: one blob alias against the engine's.
fn check_blob_alias(header: &Header, facts: &EngineFacts<'_>, alias: &PlannedAlias) -> Result<(), Error> {
    let engine_input = facts.alias_of(&alias.output);
    match alias.kind {
        ValidKind::KvCacheUpdate => check_kv_cache_alias(facts.reports_aliases, engine_input, alias),
        ValidKind::User => {
            if let Some(engine_input) = engine_input.filter(|&input| input != alias.input) {
                return Err(Error::UserAliasConflictsWithEngine {
                    output: alias.output.clone(),
                    blob_input: alias.input.clone(),
                    engine_input: engine_input.to_owned(),
                });
            }
            // Both names are engine tensors (rule 2); the engine's declaration decides the shapes, and the
            // dtype is the engine's where it reports one, else the blob's (they agree when both exist).
            let side = |name: &str, binding: Option<usize>| {
                let tensor = facts.by_name.get(name);
                let dtype = tensor
                    .and_then(|t| t.dtype)
                    .or_else(|| binding.and_then(|i| header.bindings.get(i)).and_then(|b| b.dtype));
                (dtype, tensor.map(|t| t.shape.as_slice()))
            };
            let output = side(&alias.output, alias.output_binding);
            check_user(&alias.output, &alias.input, output, side(&alias.input, Some(alias.input_binding)))?;
            Ok(())
        }
    }
}

/// A `kv_cache_update` alias must be the engine's own, which needs an engine that reports aliases.
fn check_kv_cache_alias(
    reports_aliases: bool,
    engine_input: Option<&str>,
    alias: &PlannedAlias,
) -> Result<(), Error> {
    let (output, input) = (alias.output.clone(), alias.input.clone());
    if !reports_aliases {
        return Err(Error::EngineCannotReportAliases { output, input });
    }
    match engine_input {
        None => Err(Error::KvCacheNotAliasedByEngine { output, input }),
        Some(engine_input) if engine_input != alias.input => Err(Error::KvCacheInputMismatch {
            output,
            blob_input: input,
            engine_input: engine_input.to_owned(),
        }),
        Some(_) => Ok(()),
    }
}

/// Engine rule 5: an engine alias the blob lacks, added (the engine is the source of truth) provided its input
/// is a bound engine input no other alias targets.
fn engine_alias_added(
    facts: &EngineFacts<'_>,
    by_name: &HashMap<&str, usize>,
    aliases: &[PlannedAlias],
    output: &str,
    input: &str,
) -> Result<(PlannedAlias, Warning), Error> {
    let unresolved = || Error::EngineAliasUnresolved { output: output.to_owned(), input: input.to_owned() };
    let input_tensor = facts.by_name.get(input).ok_or_else(unresolved)?;
    if input_tensor.role != Role::Input {
        return Err(unresolved());
    }
    // Rule 3 bound every engine input; stay total regardless.
    let input_binding = by_name
        .get(input)
        .copied()
        .ok_or_else(|| Error::EngineTensorUnbound { name: input.to_owned(), role: Role::Input })?;
    if let Some(previous) = aliases.iter().find(|alias| alias.input == input) {
        return Err(Error::InputAliasedTwice {
            input: input.to_owned(),
            first_output: previous.output.clone(),
            second_output: output.to_owned(),
        });
    }
    let output_binding = by_name.get(output).copied();
    let warning = Warning::EngineAliasAdded {
        output: output.to_owned(),
        input: input.to_owned(),
        output_bound: output_binding.is_some(),
    };
    let alias = PlannedAlias {
        output: output.to_owned(),
        input: input.to_owned(),
        kind: ValidKind::KvCacheUpdate,
        output_binding,
        input_binding,
        source: AliasSource::Engine,
    };
    Ok((alias, warning))
}

/// What the format rules established.
struct FormatChecked<'h> {
    /// Binding index by name (names are unique).
    by_name: HashMap<&'h str, usize>,
    /// The blob's aliases, resolved.
    aliases: Vec<PlannedAlias>,
    /// Indices into `aliases` of `user` aliases the blob's own records could not fully check.
    unchecked_user: Vec<usize>,
}

fn check_format(header: &Header) -> Result<FormatChecked<'_>, Error> {
    let by_name = index_bindings(header)?;
    let mut aliases: Vec<PlannedAlias> = Vec::with_capacity(header.aliases.len());
    let mut unchecked_user = Vec::new();
    for alias in &header.aliases {
        let (planned, user_checked) = resolve_blob_alias(header, &by_name, &aliases, alias)?;
        if !user_checked {
            unchecked_user.push(aliases.len());
        }
        aliases.push(planned);
    }
    check_unthreaded(header, &aliases)?;
    Ok(FormatChecked { by_name, aliases, unchecked_user })
}

/// Format rule 1: unique binding names; each binding's index by name.
fn index_bindings(header: &Header) -> Result<HashMap<&str, usize>, Error> {
    let mut by_name: HashMap<&str, usize> = HashMap::with_capacity(header.bindings.len());
    for (index, binding) in header.bindings.iter().enumerate() {
        if let Some(&first) = by_name.get(binding.name.as_str()) {
            return Err(Error::DuplicateBinding { name: binding.name.clone(), first, second: index });
        }
        by_name.insert(binding.name.as_str(), index);
    }
    Ok(by_name)
}

/// Format rule 2 for one alias of the table, given the aliases before it: the alias resolved, and whether
/// everything a `user` alias needs was recorded (always `true` for `kv_cache_update`).
fn resolve_blob_alias(
    header: &Header,
    by_name: &HashMap<&str, usize>,
    earlier: &[PlannedAlias],
    alias: &Alias,
) -> Result<(PlannedAlias, bool), Error> {
    let output_binding = by_name.get(alias.output.as_str()).copied();
    let input_binding = by_name.get(alias.input.as_str()).copied();
    let (Some(output_binding), Some(input_binding)) = (output_binding, input_binding) else {
        return Err(Error::AliasNamesNotFound {
            output: alias.output.clone(),
            input: alias.input.clone(),
            output_found: output_binding.is_some(),
            input_found: input_binding.is_some(),
        });
    };
    let output = &header.bindings[output_binding];
    let input = &header.bindings[input_binding];
    for (binding, expected) in [(output, Role::Output), (input, Role::Input)] {
        if binding.role != expected {
            return Err(Error::AliasRoleMismatch {
                output: alias.output.clone(),
                input: alias.input.clone(),
                name: binding.name.clone(),
                expected,
                found: binding.role,
            });
        }
    }
    let kind = ValidKind::from_alias_kind(&alias.kind).ok_or_else(|| unknown_kind(alias))?;
    check_aliased_once(earlier, alias)?;
    let user_checked = kind != ValidKind::User
        || check_user(
            &alias.output,
            &alias.input,
            (output.dtype, output.shape.as_deref()),
            (input.dtype, input.shape.as_deref()),
        )?;
    let planned = PlannedAlias {
        output: alias.output.clone(),
        input: alias.input.clone(),
        kind,
        output_binding: Some(output_binding),
        input_binding,
        source: AliasSource::Blob,
    };
    Ok((planned, user_checked))
}

/// No output and no input of `alias` appears in an earlier alias.
fn check_aliased_once(earlier: &[PlannedAlias], alias: &Alias) -> Result<(), Error> {
    if let Some(previous) = earlier.iter().find(|planned| planned.output == alias.output) {
        return Err(Error::OutputAliasedTwice {
            output: alias.output.clone(),
            first_input: previous.input.clone(),
            second_input: alias.input.clone(),
        });
    }
    if let Some(previous) = earlier.iter().find(|planned| planned.input == alias.input) {
        return Err(Error::InputAliasedTwice {
            input: alias.input.clone(),
            first_output: previous.output.clone(),
            second_output: alias.output.clone(),
        });
    }
    Ok(())
}

/// Format rule 3: unthreaded bindings must be aliased outputs.
fn check_unthreaded(header: &Header, aliases: &[PlannedAlias]) -> Result<(), Error> {
    for binding in header.bindings.iter().filter(|binding| !binding.threaded) {
        let aliased_output =
            binding.role == Role::Output && aliases.iter().any(|alias| alias.output == binding.name);
        if !aliased_output {
            return Err(Error::UnthreadedNotAliasedOutput { name: binding.name.clone(), role: binding.role });
        }
    }
    Ok(())
}

/// Checks a `user` alias's two sides, `(dtype, shape)` each where known. `Ok(true)` when everything was
/// known and agrees, `Ok(false)` when something was unknown (and what was known agrees).
fn check_user(
    output: &str,
    input: &str,
    (output_dtype, output_shape): (Option<DType>, Option<&[Dim]>),
    (input_dtype, input_shape): (Option<DType>, Option<&[Dim]>),
) -> Result<bool, Error> {
    if let (Some(output_dtype), Some(input_dtype)) = (output_dtype, input_dtype) {
        if output_dtype != input_dtype {
            return Err(Error::UserAliasDTypeMismatch {
                output: output.to_owned(),
                input: input.to_owned(),
                output_dtype,
                input_dtype,
            });
        }
    }
    let (Some(output_shape), Some(input_shape)) = (output_shape, input_shape) else {
        return Ok(false);
    };
    // As declared: `Dim` equality makes a dynamic dim equal only a dynamic dim.
    if output_shape != input_shape {
        return Err(Error::UserAliasShapeMismatch {
            output: output.to_owned(),
            input: input.to_owned(),
            output_shape: output_shape.to_vec(),
            input_shape: input_shape.to_vec(),
        });
    }
    Ok(output_dtype.is_some() && input_dtype.is_some())
}

/// Blob and engine shapes agree: same rank, and every pair of static dims equal (a dynamic dim on either side
/// is "not known" and agrees with anything).
fn shapes_agree(blob: &[Dim], engine: &[Dim]) -> bool {
    blob.len() == engine.len()
        && blob.iter().zip(engine).all(|pair| match pair {
            (Dim::Static(a), Dim::Static(b)) => a == b,
            _ => true,
        })
}

fn unknown_kind(alias: &Alias) -> Error {
    let kind = alias.kind.as_str();
    let lowered = kind.to_ascii_lowercase();
    let suggestion = [AliasKind::KV_CACHE_UPDATE, AliasKind::USER]
        .into_iter()
        .map(|known| (known, strsim::normalized_damerau_levenshtein(&lowered, known)))
        .filter(|&(_, similarity)| similarity >= 0.6)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(known, _)| known);
    Error::UnknownAliasKind {
        output: alias.output.clone(),
        input: alias.input.clone(),
        kind: kind.to_owned(),
        suggestion,
    }
}
