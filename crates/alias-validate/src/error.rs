//! The one error type of this crate: a variant per rule, each carrying the names involved.

use blob_format::model::{DType, Dim, DisplayShape, Role};
use et_error::{ErrorCode, HasErrorCode};

use crate::residency::{DirectAccess, MemoryKind};

/// Why a blob's aliasing (or one call's aliased input) was refused.
///
/// Every variant names the tensors involved and its message says what would fix it. Rules on the blob and
/// its engine report [`ErrorCode::InvalidProgram`] (as upstream's delegate init does), an engine that cannot
/// verify a `kv_cache_update` alias reports [`ErrorCode::NotSupported`], and the per-call residency gate
/// reports [`ErrorCode::InvalidArgument`]; see [`HasErrorCode`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ----- binding table -----
    /// Two bindings carry the same engine tensor name; binding is by name, so the table is ambiguous.
    #[error(
        "binding '{name}' appears twice in the binding table (bindings #{first} and #{second}); every engine \
         tensor must be bound exactly once: re-export the blob"
    )]
    DuplicateBinding {
        /// The repeated name.
        name: String,
        /// Index of its first binding in `Header::bindings`.
        first: usize,
        /// Index of its second binding in `Header::bindings`.
        second: usize,
    },

    /// A binding is not threaded as a delegate argument, yet it is not the output of an alias: its data
    /// would have nowhere to come from or go to.
    #[error(
        "binding '{name}' ({role}) is not threaded as a delegate argument, but it is not an aliased output, so \
         its data would have nowhere to go; only an output listed in aliased_io may be left unthreaded (the \
         engine writes it into the aliased input's storage): thread '{name}' as a delegate argument or add \
         its alias"
    )]
    UnthreadedNotAliasedOutput {
        /// The binding's name.
        name: String,
        /// The binding's role.
        role: Role,
    },

    // ----- alias table -----
    /// An alias names a tensor that no binding has (upstream: "aliased_io names not found").
    #[error(
        "aliased_io names not found (output={output}, input={input}): {}; every alias must name two bound \
         engine tensors: fix the aliased_io entry or re-export the blob",
        missing_names(.output, .input, *.output_found, *.input_found)
    )]
    AliasNamesNotFound {
        /// The alias's output name.
        output: String,
        /// The alias's input name.
        input: String,
        /// Whether a binding named `output` exists.
        output_found: bool,
        /// Whether a binding named `input` exists.
        input_found: bool,
    },

    /// An alias's output is bound as an input, or its input as an output.
    #[error(
        "alias {output} -> {input}: '{name}' is bound as an {found}, but the alias's {expected} side must be \
         an engine {expected}; aliased_io entries read (output, input): fix the entry's order or names"
    )]
    AliasRoleMismatch {
        /// The alias's output name.
        output: String,
        /// The alias's input name.
        input: String,
        /// The side whose binding has the wrong role (`output` or `input`).
        name: String,
        /// The role the alias needs there.
        expected: Role,
        /// The role the binding has.
        found: Role,
    },

    /// One output appears in two alias entries.
    #[error(
        "output '{output}' is aliased twice (into input '{first_input}' and into input '{second_input}'); an \
         output writes into one input's storage only: remove one of the aliased_io entries"
    )]
    OutputAliasedTwice {
        /// The output aliased twice.
        output: String,
        /// The input of the first entry.
        first_input: String,
        /// The input of the second entry.
        second_input: String,
    },

    /// Two outputs alias the same input, so both would write one storage.
    #[error(
        "input '{input}' is the alias target of two outputs ('{first_output}' and '{second_output}'), which \
         would both write its storage; keep one alias per input"
    )]
    InputAliasedTwice {
        /// The input aliased twice.
        input: String,
        /// The output of the first alias.
        first_output: String,
        /// The output of the second alias.
        second_output: String,
    },

    /// The alias kind is neither `kv_cache_update` nor `user` (a typo, or a kind from a newer exporter).
    #[error(
        "alias {output} -> {input} has unknown kind '{kind}'{}; this build understands only \
         'kv_cache_update' and 'user': fix the exporter's typo, or upgrade the runtime if a newer exporter \
         wrote it",
        .suggestion.map(|s| format!(" (did you mean '{s}'?)")).unwrap_or_default()
    )]
    UnknownAliasKind {
        /// The alias's output name.
        output: String,
        /// The alias's input name.
        input: String,
        /// The kind as written.
        kind: String,
        /// The known kind closest to `kind`, when it is close enough to be a likely typo.
        suggestion: Option<&'static str>,
    },

    /// A `user` alias joins two tensors whose declared shapes differ.
    #[error(
        "user alias {output} -> {input}: shapes differ (output {} vs input {}); two tensors share storage only \
         when their rank and every dim agree (a dynamic dim matches only a dynamic dim): fix the alias or the \
         exported shapes",
        DisplayShape(.output_shape),
        DisplayShape(.input_shape)
    )]
    UserAliasShapeMismatch {
        /// The alias's output name.
        output: String,
        /// The alias's input name.
        input: String,
        /// The output's declared shape.
        output_shape: Vec<Dim>,
        /// The input's declared shape.
        input_shape: Vec<Dim>,
    },

    /// A `user` alias joins two tensors whose element types differ.
    #[error(
        "user alias {output} -> {input}: dtypes differ (output {output_dtype} vs input {input_dtype}); two \
         tensors share storage only when their element types agree: fix the alias or the exported dtypes"
    )]
    UserAliasDTypeMismatch {
        /// The alias's output name.
        output: String,
        /// The alias's input name.
        input: String,
        /// The output's dtype.
        output_dtype: DType,
        /// The input's dtype.
        input_dtype: DType,
    },

    // ----- blob against engine -----
    /// The engine reports two tensors of one name.
    #[error(
        "the engine reports two tensors named '{name}'; binding is by name, so the engine's I/O is ambiguous: \
         rebuild the engine with unique tensor names"
    )]
    DuplicateEngineTensor {
        /// The repeated name.
        name: String,
    },

    /// A blob binding names no engine tensor.
    #[error(
        "the blob binds {role} '{name}', but the engine has no tensor named '{name}'; the blob and its engine \
         do not belong together: re-export the blob from this engine"
    )]
    BindingNotInEngine {
        /// The binding's name.
        name: String,
        /// The binding's role in the blob.
        role: Role,
    },

    /// A blob binding and its engine tensor disagree on input/output.
    #[error(
        "tensor '{name}' is bound as an {blob_role} in the blob but is an {engine_role} of the engine: \
         re-export the blob from this engine"
    )]
    BindingRoleMismatch {
        /// The tensor's name.
        name: String,
        /// Its role in the blob.
        blob_role: Role,
        /// Its role in the engine.
        engine_role: Role,
    },

    /// An engine tensor has no binding in the blob (and is not an output the engine aliases).
    #[error(
        "engine {role} '{name}' has no binding in the blob, so the delegate could not give it storage: \
         re-export the blob so that it binds every engine tensor"
    )]
    EngineTensorUnbound {
        /// The engine tensor's name.
        name: String,
        /// Its role in the engine.
        role: Role,
    },

    /// A blob binding's dtype differs from its engine tensor's.
    #[error(
        "tensor '{name}': the blob records dtype {blob} but the engine declares {engine}: re-export the blob \
         from this engine"
    )]
    BindingDTypeMismatch {
        /// The tensor's name.
        name: String,
        /// The dtype the blob records.
        blob: DType,
        /// The dtype the engine declares.
        engine: DType,
    },

    /// A blob binding's shape differs from its engine tensor's (rank, or a static dim both declare).
    #[error(
        "tensor '{name}': the blob records shape {} but the engine declares {}: re-export the blob from this \
         engine",
        DisplayShape(.blob),
        DisplayShape(.engine)
    )]
    BindingShapeMismatch {
        /// The tensor's name.
        name: String,
        /// The shape the blob records.
        blob: Vec<Dim>,
        /// The shape the engine declares.
        engine: Vec<Dim>,
    },

    /// A `kv_cache_update` alias names another input than the one the engine writes in place.
    #[error(
        "kv_cache_update alias of output '{output}': the blob says it writes into input '{blob_input}', but \
         the engine writes it into input '{engine_input}' (the engine is the source of truth): re-export the \
         blob from this engine"
    )]
    KvCacheInputMismatch {
        /// The aliased output.
        output: String,
        /// The input the blob names.
        blob_input: String,
        /// The input the engine names.
        engine_input: String,
    },

    /// A `kv_cache_update` alias names an output the engine does not alias at all.
    #[error(
        "kv_cache_update alias {output} -> {input}: the engine does not alias output '{output}' (it writes no \
         input in place); re-export the blob from this engine, or declare the alias 'user' if the exporter \
         shares the storage on purpose"
    )]
    KvCacheNotAliasedByEngine {
        /// The aliased output.
        output: String,
        /// The input the blob names.
        input: String,
    },

    /// A `kv_cache_update` alias cannot be verified: the engine library cannot report aliases.
    #[error(
        "kv_cache_update alias {output} -> {input} cannot be verified: this engine library cannot report \
         which input an output writes in place (TensorRT 10.15+ or TensorRT-RTX 1.7+ can): run with a newer \
         engine library"
    )]
    EngineCannotReportAliases {
        /// The aliased output.
        output: String,
        /// The input the blob names.
        input: String,
    },

    /// A `user` alias puts an output onto another input than the one the engine itself writes in place.
    #[error(
        "user alias {output} -> {blob_input} conflicts with the engine, which writes output '{output}' into \
         input '{engine_input}': remove the user alias or re-export the blob from this engine"
    )]
    UserAliasConflictsWithEngine {
        /// The aliased output.
        output: String,
        /// The input the blob names.
        blob_input: String,
        /// The input the engine names.
        engine_input: String,
    },

    /// The engine says an output writes in place into a tensor that is not one of its inputs.
    #[error(
        "the engine aliases output '{output}' onto '{input}', which is not an input of the engine; the \
         engine's alias report is inconsistent: rebuild the engine"
    )]
    EngineAliasUnresolved {
        /// The engine output.
        output: String,
        /// What the engine named as its aliased input.
        input: String,
    },

    // ----- argument layout -----
    /// An alias writes into an input that takes no delegate argument, so there is no caller storage to
    /// update in place.
    #[error(
        "aliased output '{output}' writes into input '{input}', which takes no delegate argument: thread \
         '{input}' as an argument (re-export the blob)"
    )]
    AliasInputNotThreaded {
        /// The aliased output.
        output: String,
        /// The input it writes.
        input: String,
    },

    // ----- per call -----
    /// An aliased input's storage is host memory on a discrete GPU: the engine would update a staging copy
    /// and the update would be lost.
    #[error(
        "aliased input '{name}' must be on GPU or unified memory (it is in {residency} memory, so the engine's \
         in-place update would land in a staging copy and be lost): allocate it as device or managed memory"
    )]
    AliasedInputNotOnDevice {
        /// The input's name.
        name: String,
        /// Where its storage is.
        residency: MemoryKind,
    },

    /// An aliased input's storage is memory the delegate does not write directly (e.g. device memory for a
    /// delegate that computes on the CPU): its in-place update would not reach the caller.
    #[error(
        "aliased input '{name}' must be in memory this delegate updates in place ({direct}); it is in \
         {residency} memory, so the update would not reach the caller: allocate it as {direct} memory"
    )]
    AliasedInputNotDirect {
        /// The input's name.
        name: String,
        /// Where its storage is.
        residency: MemoryKind,
        /// The memory the delegate writes directly.
        direct: DirectAccess,
    },

    /// An aliased input has zero bytes: there is no storage to update in place.
    #[error(
        "aliased input '{name}' must be on GPU or unified memory and non-empty (it has zero bytes, so the \
         delegate would bind a scratch buffer and the in-place update would be lost): pass the cache's real \
         storage"
    )]
    AliasedInputEmpty {
        /// The input's name.
        name: String,
    },
}

impl HasErrorCode for Error {
    fn error_code(&self) -> ErrorCode {
        match self {
            Error::EngineCannotReportAliases { .. } => ErrorCode::NotSupported,
            Error::AliasedInputNotOnDevice { .. }
            | Error::AliasedInputNotDirect { .. }
            | Error::AliasedInputEmpty { .. } => ErrorCode::InvalidArgument,
            Error::DuplicateBinding { .. }
            | Error::UnthreadedNotAliasedOutput { .. }
            | Error::AliasNamesNotFound { .. }
            | Error::AliasRoleMismatch { .. }
            | Error::OutputAliasedTwice { .. }
            | Error::InputAliasedTwice { .. }
            | Error::UnknownAliasKind { .. }
            | Error::UserAliasShapeMismatch { .. }
            | Error::UserAliasDTypeMismatch { .. }
            | Error::DuplicateEngineTensor { .. }
            | Error::BindingNotInEngine { .. }
            | Error::BindingRoleMismatch { .. }
            | Error::EngineTensorUnbound { .. }
            | Error::BindingDTypeMismatch { .. }
            | Error::BindingShapeMismatch { .. }
            | Error::KvCacheInputMismatch { .. }
            | Error::KvCacheNotAliasedByEngine { .. }
            | Error::UserAliasConflictsWithEngine { .. }
            | Error::EngineAliasUnresolved { .. }
            | Error::AliasInputNotThreaded { .. } => ErrorCode::InvalidProgram,
        }
    }
}

fn missing_names(output: &str, input: &str, output_found: bool, input_found: bool) -> String {
    match (output_found, input_found) {
        (false, false) => format!("no binding is named '{output}' or '{input}'"),
        (false, true) => format!("no binding is named '{output}'"),
        (true, false) => format!("no binding is named '{input}'"),
        // Not constructed by this crate, but keep the message sensible for any caller that does.
        (true, true) => "both names are bound".to_owned(),
    }
}
