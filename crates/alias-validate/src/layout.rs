//! The argument layout: which binding each delegate argument position carries and what part it plays in
//! aliasing, resolved by name once from a header and its validated [`AliasPlan`].
//!
//! Every party that maps positions to tensors (the host planning a call, a delegate planning its bindings)
//! starts from the same [`ArgLayout`] and extends it with what only it knows (the host its buffers, a
//! delegate its engine's tensors), so the rules below live in one place:
//!
//! - positions are the blob's **threaded** bindings in binding-table order (inputs and outputs interleaved
//!   as the blob records them); an unthreaded binding takes no position;
//! - an input that an alias writes in place is an [`ArgAlias::Target`]: it must pass the
//!   [`crate::residency`] gate on every call;
//! - a threaded output that an alias writes in place is an [`ArgAlias::InPlace`] slot naming its input's
//!   position: bound to the input's storage (zero-copy) or to other storage the delegate reflects into;
//! - an aliased output that takes no position (unthreaded in the blob, or added from the engine) is an
//!   [`UnthreadedAlias`]: the delegate binds it to its input's storage.

use blob_format::model::{Header, Role};

use crate::{AliasPlan, Error, ValidKind};

/// What part one argument position plays in aliasing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ArgAlias {
    /// No alias touches it.
    None,
    /// An input some output writes in place (caller-owned state, e.g. a KV cache).
    Target {
        /// Index of the alias in [`AliasPlan::aliases`].
        alias: usize,
        /// Position of the output slot that writes it, when that output is threaded.
        output_arg: Option<usize>,
        /// Why they alias.
        kind: ValidKind,
    },
    /// An output written in place into the input at `input_arg`.
    InPlace {
        /// Index of the alias in [`AliasPlan::aliases`].
        alias: usize,
        /// Position of the input it writes.
        input_arg: usize,
        /// Why they alias.
        kind: ValidKind,
    },
}

/// One delegate argument position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgSlot {
    /// Index of its binding in `Header::bindings`.
    pub binding: usize,
    /// The tensor it binds (the binding's name).
    pub name: String,
    /// Input or output.
    pub role: Role,
    /// Its part in aliasing.
    pub alias: ArgAlias,
}

impl ArgSlot {
    /// Whether it is an input some output writes in place (the residency gate applies).
    pub fn is_alias_target(&self) -> bool {
        matches!(self.alias, ArgAlias::Target { .. })
    }

    /// For an in-place output slot, the position of the input it writes.
    pub fn in_place_of(&self) -> Option<usize> {
        match self.alias {
            ArgAlias::InPlace { input_arg, .. } => Some(input_arg),
            _ => None,
        }
    }

    /// Whether the delegate writes its storage: an output, or an input an output writes in place.
    pub fn is_written(&self) -> bool {
        self.role == Role::Output || self.is_alias_target()
    }
}

/// An aliased output that takes no argument position: written into the input at `input_arg`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnthreadedAlias {
    /// Index of the alias in [`AliasPlan::aliases`].
    pub alias: usize,
    /// The output tensor.
    pub output: String,
    /// Position of the input whose storage it writes.
    pub input_arg: usize,
}

/// Every delegate argument position of one blob, resolved by name; see the [module docs](self).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArgLayout {
    slots: Vec<ArgSlot>,
    unthreaded: Vec<UnthreadedAlias>,
}

impl ArgLayout {
    /// Lays out `header`'s arguments with `plan`'s aliases (from [`crate::validate_format`] or
    /// [`crate::validate_with_engine`] over the same header).
    ///
    /// # Errors
    /// [`Error::AliasInputNotThreaded`] when an alias writes into an input that takes no argument position
    /// (validation refuses unthreaded inputs, so only a plan from another header gets here).
    pub fn new(header: &Header, plan: &AliasPlan) -> Result<ArgLayout, Error> {
        let mut slots: Vec<ArgSlot> = header
            .bindings
            .iter()
            .enumerate()
            .filter(|(_, binding)| binding.threaded)
            .map(|(binding, b)| ArgSlot {
                binding,
                name: b.name.clone(),
                role: b.role,
                alias: ArgAlias::None,
            })
            .collect();
        let position = |slots: &[ArgSlot], name: &str, role: Role| {
            slots.iter().position(|slot| slot.role == role && slot.name == name)
        };
        let mut unthreaded = Vec::new();
        for (index, alias) in plan.aliases().iter().enumerate() {
            let input_arg = position(&slots, &alias.input, Role::Input).ok_or_else(|| {
                Error::AliasInputNotThreaded { output: alias.output.clone(), input: alias.input.clone() }
            })?;
            let output_arg = position(&slots, &alias.output, Role::Output);
            slots[input_arg].alias = ArgAlias::Target { alias: index, output_arg, kind: alias.kind };
            match output_arg {
                Some(output_arg) => {
                    slots[output_arg].alias = ArgAlias::InPlace { alias: index, input_arg, kind: alias.kind }
                }
                None => {
                    unthreaded.push(UnthreadedAlias { alias: index, output: alias.output.clone(), input_arg })
                }
            }
        }
        Ok(ArgLayout { slots, unthreaded })
    }

    /// Every argument position, in order.
    pub fn slots(&self) -> &[ArgSlot] {
        &self.slots
    }

    /// Number of argument positions.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the blob takes no argument.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Aliased outputs that take no position, in plan order.
    pub fn unthreaded(&self) -> &[UnthreadedAlias] {
        &self.unthreaded
    }

    /// The position that binds tensor `name`, if it takes one.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.slots.iter().position(|slot| slot.name == name)
    }

    /// The tensor names in position order, joined with `", "` (for messages about argument counts).
    pub fn names(&self) -> String {
        self.slots.iter().map(|slot| slot.name.as_str()).collect::<Vec<_>>().join(", ")
    }
}

#[cfg(test)]
mod tests {
    use blob_format::model::{Alias, AliasKind, Binding, PayloadKind};

    use super::*;

    fn header(bindings: Vec<Binding>, aliases: &[(&str, &str)]) -> Header {
        Header::new(
            "B",
            PayloadKind::TensorRtPlan,
            bindings,
            aliases
                .iter()
                .map(|(output, input)| Alias {
                    output: (*output).into(),
                    input: (*input).into(),
                    kind: AliasKind::KvCacheUpdate,
                })
                .collect(),
        )
    }

    fn unthreaded(name: &str) -> Binding {
        Binding { threaded: false, ..Binding::untyped(name, Role::Output) }
    }

    #[test]
    fn positions_follow_threaded_bindings_and_aliases_pair_by_name_not_order() {
        // The cache output comes before the logits and the cache input after the tokens: pairing is by name.
        let h = header(
            vec![
                Binding::untyped("tokens", Role::Input),
                Binding::untyped("k_cache", Role::Input),
                Binding::untyped("k_cache_out", Role::Output),
                Binding::untyped("logits", Role::Output),
                Binding::untyped("v_cache", Role::Input),
                unthreaded("v_cache_out"),
            ],
            &[("v_cache_out", "v_cache"), ("k_cache_out", "k_cache")],
        );
        let plan = crate::validate_format(&h).expect("valid");
        let layout = ArgLayout::new(&h, &plan).expect("lays out");
        let names: Vec<&str> = layout.slots().iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["tokens", "k_cache", "k_cache_out", "logits", "v_cache"]);
        assert_eq!(layout.slots()[4].binding, 4);
        let kind = ValidKind::KvCacheUpdate;
        assert_eq!(layout.slots()[0].alias, ArgAlias::None);
        assert_eq!(layout.slots()[1].alias, ArgAlias::Target { alias: 1, output_arg: Some(2), kind });
        assert_eq!(layout.slots()[2].alias, ArgAlias::InPlace { alias: 1, input_arg: 1, kind });
        assert_eq!(layout.slots()[3].alias, ArgAlias::None);
        assert_eq!(layout.slots()[4].alias, ArgAlias::Target { alias: 0, output_arg: None, kind });
        assert_eq!(
            layout.unthreaded(),
            [UnthreadedAlias { alias: 0, output: "v_cache_out".into(), input_arg: 4 }]
        );
        assert!(layout.slots()[1].is_written() && layout.slots()[3].is_written());
        assert!(!layout.slots()[0].is_written());
        assert_eq!(layout.slots()[2].in_place_of(), Some(1));
        assert_eq!(layout.position("logits"), Some(3));
        assert_eq!(layout.position("v_cache_out"), None);
        assert_eq!(layout.names(), "tokens, k_cache, k_cache_out, logits, v_cache");
    }

    #[test]
    fn a_plan_whose_input_takes_no_position_is_refused_by_name() {
        let valid = header(
            vec![Binding::untyped("cache", Role::Input), Binding::untyped("cache_out", Role::Output)],
            &[("cache_out", "cache")],
        );
        let plan = crate::validate_format(&valid).expect("valid");
        // The same plan over a header that does not thread the input.
        let mut other = valid.clone();
        other.bindings[0].threaded = false;
        let err = ArgLayout::new(&other, &plan).expect_err("input takes no position");
        assert_eq!(err, Error::AliasInputNotThreaded { output: "cache_out".into(), input: "cache".into() });
        assert_eq!(et_error::HasErrorCode::error_code(&err), et_error::ErrorCode::InvalidProgram);
    }
}
