//! The result of validation: which outputs write into which inputs, bound by index into the blob's bindings.

use std::fmt;

use blob_format::model::AliasKind;

/// An alias kind this build understands (validation refuses every other).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValidKind {
    /// `kv_cache_update`: the engine itself writes the input in place; verified against the engine.
    KvCacheUpdate,
    /// `user`: declared by the exporter, invisible to the engine; trusted after a shape and dtype check.
    User,
}

impl ValidKind {
    /// The wire spelling: `"kv_cache_update"` or `"user"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ValidKind::KvCacheUpdate => AliasKind::KV_CACHE_UPDATE,
            ValidKind::User => AliasKind::USER,
        }
    }

    /// The known kind for a blob's kind, `None` for [`AliasKind::Unknown`].
    pub fn from_alias_kind(kind: &AliasKind) -> Option<ValidKind> {
        match kind {
            AliasKind::KvCacheUpdate => Some(ValidKind::KvCacheUpdate),
            AliasKind::User => Some(ValidKind::User),
            AliasKind::Unknown(_) => None,
        }
    }
}

impl fmt::Display for ValidKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<ValidKind> for AliasKind {
    fn from(kind: ValidKind) -> AliasKind {
        match kind {
            ValidKind::KvCacheUpdate => AliasKind::KvCacheUpdate,
            ValidKind::User => AliasKind::User,
        }
    }
}

/// Where a planned alias came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AliasSource {
    /// The blob's alias table.
    Blob,
    /// The engine reported it and the blob lacked it; added as `kv_cache_update` (the engine is the source of
    /// truth), with a [`Warning::EngineAliasAdded`].
    Engine,
}

/// One validated alias: output `output` writes in place into the storage of input `input`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct PlannedAlias {
    /// The output's engine tensor name.
    pub output: String,
    /// The input's engine tensor name.
    pub input: String,
    /// Why they alias.
    pub kind: ValidKind,
    /// Index of the output's binding in `Header::bindings`; `None` when the blob has no binding for it (an
    /// engine-reported alias of an output the blob does not list: it takes no delegate argument).
    pub output_binding: Option<usize>,
    /// Index of the input's binding in `Header::bindings`.
    pub input_binding: usize,
    /// Where the alias came from.
    pub source: AliasSource,
}

/// Something validation accepted but a person should know.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Warning {
    /// The engine aliases `output` onto `input` but the blob's alias table lacks it; the plan adds it as
    /// `kv_cache_update`.
    EngineAliasAdded {
        /// The engine output.
        output: String,
        /// The input it writes in place.
        input: String,
        /// Whether the blob has a binding for `output` at all.
        output_bound: bool,
    },
    /// Format-level validation could not check a `user` alias's shapes or dtypes because the blob does not
    /// record them for both tensors (upstream blobs never do); validation with an engine checks them.
    UserAliasUnchecked {
        /// The alias's output.
        output: String,
        /// The alias's input.
        input: String,
    },
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Warning::EngineAliasAdded { output, input, output_bound } => {
                write!(
                    f,
                    "the engine writes output '{output}' in place into input '{input}' but the blob's \
                     aliased_io lacks it; added as kv_cache_update (the engine is the source of truth)"
                )?;
                if !*output_bound {
                    write!(f, "; the blob has no binding for '{output}', so it takes no delegate argument")?;
                }
                f.write_str(": re-export the blob to record it")
            }
            Warning::UserAliasUnchecked { output, input } => write!(
                f,
                "user alias {output} -> {input}: the blob does not record both tensors' shape and dtype, so \
                 they are checked only against the engine at load"
            ),
        }
    }
}

/// The validated alias plan later crates consume: every alias resolved to binding indices, plus warnings.
///
/// Aliases are in the blob's order, followed by engine-added ones in the engine's tensor order. Lookups are
/// by name: the plan never relies on argument positions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AliasPlan {
    pub(crate) aliases: Vec<PlannedAlias>,
    pub(crate) warnings: Vec<Warning>,
}

impl AliasPlan {
    /// Every validated alias.
    pub fn aliases(&self) -> &[PlannedAlias] {
        &self.aliases
    }

    /// What validation accepted with a warning.
    pub fn warnings(&self) -> &[Warning] {
        &self.warnings
    }

    /// The alias whose output is `output`, if any.
    pub fn alias_for_output(&self, output: &str) -> Option<&PlannedAlias> {
        self.aliases.iter().find(|alias| alias.output == output)
    }

    /// The alias whose input is `input`, if any (validation guarantees at most one).
    pub fn alias_for_input(&self, input: &str) -> Option<&PlannedAlias> {
        self.aliases.iter().find(|alias| alias.input == input)
    }

    /// The alias whose output is bound at `index` in `Header::bindings`, if any.
    pub fn alias_for_output_binding(&self, index: usize) -> Option<&PlannedAlias> {
        self.aliases.iter().find(|alias| alias.output_binding == Some(index))
    }

    /// The alias whose input is bound at `index` in `Header::bindings`, if any: delegates walking their
    /// arguments by binding use it to find the inputs that must pass the [`crate::residency`] gate.
    pub fn alias_for_input_binding(&self, index: usize) -> Option<&PlannedAlias> {
        self.aliases.iter().find(|alias| alias.input_binding == index)
    }

    /// Whether `input` is an alias target, i.e. must pass the [`crate::residency`] gate on every call.
    pub fn is_aliased_input(&self, input: &str) -> bool {
        self.alias_for_input(input).is_some()
    }

    /// Names of every input that is an alias target, in plan order.
    pub fn aliased_input_names(&self) -> impl Iterator<Item = &str> + '_ {
        self.aliases.iter().map(|alias| alias.input.as_str())
    }

    /// Whether the plan has no aliases.
    pub fn is_empty(&self) -> bool {
        self.aliases.is_empty()
    }
}
