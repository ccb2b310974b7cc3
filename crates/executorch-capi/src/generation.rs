//! What the sampler and stop-checker functions of `kv_delegate.h` decide, in safe code: a C++ application
//! that runs its own ExecuTorch `Module` picks each token from the logits with the same [`sampling::Sampler`]
//! as `delegate-host run` and `et-run` (a seed gives the same tokens everywhere), and ends a reply by the same
//! rules ([`text_gen::StopChecker`]: end-of-sequence ids, stop strings, a token budget).

use et_error::{ErrorCode, HasErrorCode};
use sampling::{Params, Sampler};
use text_gen::{StopChecker, StopReason, StopRules};

/// Why a sampler or stop-checker call was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum GenerationError {
    /// A pointer argument is null where the call needs memory (`InvalidArgument`).
    #[error("{function}: {argument} is NULL{why}")]
    Null {
        /// The C function.
        function: &'static str,
        /// The argument.
        argument: &'static str,
        /// What it must be, when a length was given with it.
        why: String,
    },
    /// A length larger than any array a process can hold (`InvalidArgument`).
    #[error("{function}: {argument} {len} is larger than any array")]
    Length {
        /// The C function.
        function: &'static str,
        /// The length argument.
        argument: &'static str,
        /// Its value.
        len: usize,
    },
    /// A sampling parameter out of its range (`InvalidArgument`).
    #[error("kvd_sampler_new: {0}")]
    Param(#[from] sampling::BadParam),
    /// A string that is not UTF-8 (`InvalidArgument`).
    #[error("{function}: {argument} is not UTF-8 text")]
    NotUtf8 {
        /// The C function.
        function: &'static str,
        /// The argument (with its index in a list).
        argument: String,
    },
    /// An empty row of logits (`InvalidArgument`).
    #[error("kvd_sampler_sample: vocab is 0: pass the last row of the logits, one value per token id")]
    NoLogits,
}

impl HasErrorCode for GenerationError {
    fn error_code(&self) -> ErrorCode {
        ErrorCode::InvalidArgument
    }
}

/// `kvd_sampler_new`'s parameters checked into a sampler.
///
/// # Errors
/// [`GenerationError::Param`] naming the first parameter out of range.
pub fn sampler(params: Params) -> Result<Sampler, GenerationError> {
    Ok(Sampler::new(params)?)
}

/// `kvd_sampler_sample`: the token for generated token `step` from the last row of the logits.
///
/// # Errors
/// [`GenerationError::NoLogits`] for an empty row.
pub fn sample(sampler: &Sampler, logits: &[f32], history: &[i64], step: u64) -> Result<i64, GenerationError> {
    if logits.is_empty() {
        return Err(GenerationError::NoLogits);
    }
    // A row fits a process's memory, so its index fits an i64.
    Ok(sampler.pick(logits, history, step) as i64)
}

/// `kvd_stop_checker_new`: the rules from their C form (`max_new_tokens` 0: no budget).
pub fn stop_checker(eos: &[i64], stops: Vec<String>, max_new_tokens: u64) -> StopChecker {
    let max_new_tokens = (max_new_tokens > 0).then_some(max_new_tokens);
    StopChecker::new(StopRules { eos: eos.to_vec(), stops, max_new_tokens })
}

/// The header's `KVD_STOP_*` value of a stop reason (0, `KVD_STOP_NONE`, for none).
pub fn stop_code(reason: Option<StopReason>) -> i32 {
    match reason {
        None => 0,
        Some(StopReason::Eos) => 1,
        Some(StopReason::StopString) => 2,
        Some(StopReason::Length) => 3,
    }
}
