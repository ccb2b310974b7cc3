//! Runs the example through any loaded delegate plugin, with caller-owned caches, and checks it against the
//! oracle: the acceptance check as a small host, safe from end to end (arguments are built with
//! [`delegate_abi::host::ArgList`]). Moved here from `kv-example` (its `drive` module) so that the example
//! depends on the graph format only, not on the plugin ABI or on this plugin.

use delegate_abi::host::{ArgError, ArgList, Instance, Plugin};
use delegate_abi::{DTypeCode, DelegateError, InitContext, MemoryKind};
use et_error::{ErrorCode, HasErrorCode};
use kv_example::check::{argmax, Report, Verifier};
use kv_example::{Config, OracleError};

/// How aliased output slots are bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SlotMode {
    /// Each cache output slot is the cache's own storage (bound in place): nothing is copied.
    ZeroCopy,
    /// Separate output slots, as upstream's memory planner lays them out: the delegate reflects the updated
    /// cache into the slot, and the host writes the slot back into the cache (ExecuTorch's `copy_`).
    CopyBack,
}

/// Why a run could not complete (a check that fails is not an error: it is in the report).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriveError {
    /// The plugin refused a blob or a call.
    #[error("delegate: {0}")]
    Delegate(#[from] DelegateError),
    /// An argument could not be described (a bug in this crate).
    #[error("argument: {0}")]
    Arg(#[from] ArgError),
    /// The oracle could not follow (a token or position out of range).
    #[error("oracle: {0}")]
    Oracle(#[from] OracleError),
}

impl HasErrorCode for DriveError {
    fn error_code(&self) -> ErrorCode {
        match self {
            DriveError::Delegate(err) => err.code,
            DriveError::Arg(err) => err.error_code(),
            DriveError::Oracle(err) => err.error_code(),
        }
    }
}

/// Bytes copied by kind, summed over calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Delegate calls made.
    pub calls: u64,
    /// Bytes the delegate reflected from a cache into a separate output slot.
    pub reflect_bytes: u64,
    /// Bytes the host wrote back from output slots into caches.
    pub write_back_bytes: u64,
}

/// Caller-owned state: per layer a K and a V cache (zero at start), the separate output slots copy-back mode
/// uses, and the copy counters.
#[derive(Debug, Clone)]
pub struct Caches {
    cfg: Config,
    caches: Vec<Vec<f32>>,
    slots: Vec<Vec<f32>>,
    /// Bytes copied so far.
    pub counters: Counters,
}

impl Caches {
    /// Zeroed caches for `cfg`.
    pub fn new(cfg: &Config) -> Caches {
        Caches {
            cfg: cfg.clone(),
            caches: vec![vec![0.0; cfg.cache_len()]; 2 * cfg.layers],
            slots: vec![vec![0.0; cfg.cache_len()]; 2 * cfg.layers],
            counters: Counters::default(),
        }
    }

    /// Every layer's `(k, v)` caches, `[heads, max_len, head_dim]` row-major.
    pub fn layers(&self) -> Vec<(&[f32], &[f32])> {
        self.caches.chunks_exact(2).map(|kv| (kv[0].as_slice(), kv[1].as_slice())).collect()
    }

    /// One call of a prefill or decode instance exported by [`kv_example::export`], with its argument order:
    /// `tokens, input_pos, k_cache_0, v_cache_0, ..., k_cache_out_0, v_cache_out_0, ..., logits, next_token`.
    /// Returns the logits, `[tokens.len(), vocab]` flattened, and the delegate's `next_token`.
    pub fn call(
        &mut self,
        instance: &mut Instance,
        tokens: &[i64],
        position: i64,
        mode: SlotMode,
    ) -> Result<(Vec<f32>, i64), DriveError> {
        let rows = tokens.len() as i64;
        let vocab = self.cfg.vocab;
        let position = [position];
        let mut logits = vec![0.0f32; tokens.len() * vocab];
        let mut next_token = [-1i64];
        let shape: Vec<i64> = self.cfg.cache_shape().iter().map(|&d| d as i64).collect();
        let (f32, host) = (DTypeCode::F32, MemoryKind::Host);
        let stats = {
            let mut list = ArgList::with_capacity(4 + 4 * self.cfg.layers);
            list.push_input(as_bytes_i64(tokens), DTypeCode::I64, &[rows], host)?;
            list.push_input(as_bytes_i64(&position), DTypeCode::I64, &[1], host)?;
            let mut inouts = Vec::with_capacity(self.caches.len());
            for cache in &mut self.caches {
                inouts.push(list.push_inout(as_bytes_f32(cache), f32, &shape, host)?);
            }
            match mode {
                SlotMode::ZeroCopy => {
                    for slot in inouts {
                        list.push_output_in_place(slot, f32, &shape)?;
                    }
                }
                SlotMode::CopyBack => {
                    for slot in &mut self.slots {
                        list.push_output(as_bytes_f32(slot), f32, &shape, host)?;
                    }
                }
            }
            list.push_output(as_bytes_f32(&mut logits), f32, &[rows, vocab as i64], host)?;
            list.push_output(bytemuck::cast_slice_mut(&mut next_token), DTypeCode::I64, &[1], host)?;
            instance.execute(&mut list, None)?
        };
        self.counters.calls += 1;
        self.counters.reflect_bytes += stats.reflect_bytes;
        if mode == SlotMode::CopyBack {
            for (cache, slot) in self.caches.iter_mut().zip(&self.slots) {
                cache.copy_from_slice(slot);
                self.counters.write_back_bytes += 4 * slot.len() as u64;
            }
        }
        Ok((logits, next_token[0]))
    }
}

fn as_bytes_f32(values: &mut [f32]) -> &mut [u8] {
    bytemuck::cast_slice_mut(values)
}

fn as_bytes_i64(values: &[i64]) -> &[u8] {
    bytemuck::cast_slice(values)
}

/// What [`acceptance`] ran and found.
#[derive(Debug, Clone)]
pub struct Acceptance {
    /// Every check; [`Report::passed`] is the verdict.
    pub report: Report,
    /// The generated tokens (the decode steps' inputs after the prompt).
    pub tokens: Vec<i64>,
    /// Prefill's logits, then each decode step's.
    pub logits: Vec<Vec<f32>>,
    /// Copies of the main run (prefill and decode steps; the A/B scenario not included).
    pub counters: Counters,
}

fn init(plugin: &Plugin, blob: &[u8]) -> Result<Instance, DriveError> {
    Ok(plugin.init(&InitContext { blob, compile_specs: &[], runtime_specs: &[] })?)
}

/// The acceptance check: prefill and decode as separate instances sharing zeroed caller-owned caches,
/// `steps` decode steps feeding back the argmax, every step's logits and caches checked against the oracle,
/// plus upstream's A/B scenario on fresh caches (checks `caches-zeroed`, `next-token`, `ab-differs`,
/// `no-nan`, `matches-oracle`). `steps` at most [`Config::max_decode_steps`].
pub fn acceptance(
    plugin: &Plugin,
    cfg: &Config,
    prefill_blob: &[u8],
    decode_blob: &[u8],
    steps: usize,
    mode: SlotMode,
) -> Result<Acceptance, DriveError> {
    let mut prefill = init(plugin, prefill_blob)?;
    let mut decode = init(plugin, decode_blob)?;
    let mut verifier = Verifier::new(cfg);
    let mut caches = Caches::new(cfg);
    verifier.caches_zeroed(&caches.layers());

    let (prompt_logits, mut next) = caches.call(&mut prefill, &cfg.prompt, 0, mode)?;
    verifier.prefill(&cfg.prompt, &prompt_logits, &caches.layers())?;
    let last_row = cfg.prompt_len().saturating_sub(1) * cfg.vocab;
    let mut token = argmax(&prompt_logits[last_row..]) as i64;
    let mut next_token_agrees = next == token;
    let mut tokens = Vec::with_capacity(steps);
    let mut logits = vec![prompt_logits];
    for step in 0..steps {
        let position = cfg.prompt_len() + step;
        let step_logits;
        (step_logits, next) = caches.call(&mut decode, &[token], position as i64, mode)?;
        verifier.decode(token, position, &step_logits, &caches.layers())?;
        tokens.push(token);
        token = argmax(&step_logits) as i64;
        next_token_agrees &= next == token;
        logits.push(step_logits);
    }
    verifier.push(
        "next-token",
        next_token_agrees,
        format!("the delegate's next_token is the argmax of the logits at all {} calls", steps + 1),
    );

    // Upstream's A/B: A decodes token 5 at position 1 on a zeroed cache; B decodes 9 at 0, then 5 at 1.
    let mut ab = init(plugin, decode_blob)?;
    let (logits_a, _) = Caches::new(cfg).call(&mut ab, &[5 % cfg.vocab as i64], 1, mode)?;
    let mut b = Caches::new(cfg);
    b.call(&mut ab, &[9 % cfg.vocab as i64], 0, mode)?;
    let (logits_b, _) = b.call(&mut ab, &[5 % cfg.vocab as i64], 1, mode)?;
    verifier.ab(&logits_a, &logits_b);

    Ok(Acceptance { report: verifier.finish(), tokens, logits, counters: caches.counters })
}
