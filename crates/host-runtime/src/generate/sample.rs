//! Sampling in the device loop: the sampler kernel's device state ([`DeviceSampler`]: the ids of the history
//! for the repetition penalty, the number of draws so far, scratch, the token drawn), made once per generation,
//! and the row of logits each link's kernel reads ([`LogitsRow`]). The kernel follows `sampling`'s contract,
//! so the device loop draws the tokens the host loop's [`sampling::Sampler::pick`] draws from the same logits.

use blob_format::model::DType;
use program_manifest::Generate;
use sampling::Sampler;

use super::device::{OnDevice, Purpose};
use crate::buffer::Storage;
use crate::cuda::{DevicePtr, LogitsType, SampleArgs, SampleKernel};
use crate::program::{Error, Program};

/// The last row of a method's logits output in device or managed memory, as the sampler kernel reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LogitsRow {
    /// The row's first element.
    ptr: DevicePtr,
    dtype: LogitsType,
    vocab: u32,
}

impl LogitsRow {
    /// The last row of `method`'s logits output (`[.., vocab]`).
    ///
    /// # Errors
    /// [`Error::Usage`] for an unknown method or output, [`Error::Memory`] when it is not device or managed
    /// memory, [`Error::Generation`] for logits that are not f32, f16 or bf16 or a vocabulary past `u32`.
    pub(crate) fn of(program: &Program, g: &Generate, method: &str) -> Result<LogitsRow, Error> {
        let address = program.output_ptr(method, &g.logits_output)?;
        let decl = program.manifest().methods[method]
            .outputs
            .iter()
            .find(|d| d.name == g.logits_output)
            .expect("the output has an address, so the method declares it");
        let unsupported = || {
            Error::Generation(format!(
                "output '{}' of method '{method}' holds {} logits of {:?}: the device loop's sampler reads f32, f16 \
                 or bf16 rows of at most 2^32 - 1 ids",
                g.logits_output, decl.dtype, decl.shape
            ))
        };
        let dtype = match decl.dtype {
            DType::F32 => LogitsType::F32,
            DType::F16 => LogitsType::F16,
            DType::BF16 => LogitsType::Bf16,
            _ => return Err(unsupported()),
        };
        let vocab = decl.shape.last().copied().unwrap_or(1);
        let elements: u64 = decl.shape.iter().product();
        let vocab32 = u32::try_from(vocab).map_err(|_| unsupported())?;
        let offset = (elements - vocab) * dtype.size() as u64;
        Ok(LogitsRow { ptr: address + offset, dtype, vocab: vocab32 })
    }

    /// Ids in the row.
    pub(crate) fn vocab(&self) -> u32 {
        self.vocab
    }
}

/// The sampler kernel and its device state for one generation (module docs).
pub(crate) struct DeviceSampler {
    kernel: SampleKernel,
    params: sampling::Params,
    vocab: u32,
    /// One bit per id of the history (`vocab` bits in `u32` words): the prompt's, then each token drawn.
    seen: (Storage, DevicePtr),
    /// The history's bits as the host set them (the prompt's, and prefill's token when drawn on the host).
    seen_host: Vec<u32>,
    /// The `u32` count of draws: the step of the next.
    draws: (Storage, DevicePtr),
    /// `vocab` `u32` keys, the kernel's scratch.
    keys: (Storage, DevicePtr),
    /// The `i64` token drawn, which the feedback kernel hands on.
    token: (Storage, DevicePtr),
}

impl DeviceSampler {
    /// The kernel (compiled once per process) and its state for rows of `vocab` ids on the program's device,
    /// the `prompt`'s ids (those within the vocabulary) in the history.
    ///
    /// # Errors
    /// [`Error::NoStream`] for a program without CUDA memory, [`Error::Stream`] when the kernel cannot be
    /// loaded or the history written, [`Error::LoopMemory`] when the state cannot be allocated.
    pub(crate) fn new(
        program: &Program,
        sampler: &Sampler,
        vocab: u32,
        prompt: &[i64],
    ) -> Result<DeviceSampler, Error> {
        let (mut device, kernel) = OnDevice::with_kernel(program, Purpose::Sampler, SampleKernel::new)?;
        let words = (vocab as usize).div_ceil(32);
        let mut sampler = DeviceSampler {
            kernel,
            params: *sampler.params(),
            vocab,
            seen: device.zeroed("sampler's history", words * 4)?,
            seen_host: vec![0; words],
            draws: device.zeroed("sampler's draw count", 4)?,
            keys: device.zeroed("sampler's scratch", vocab as usize * 4)?,
            token: device.zeroed("sampled token", 8)?,
        };
        for &id in prompt {
            sampler.mark(id);
        }
        sampler.write_state(0)?;
        Ok(sampler)
    }

    /// Sets `id`'s bit in the host's copy of the history, when it is within the vocabulary.
    fn mark(&mut self, id: i64) {
        if let Some(id) = u32::try_from(id).ok().filter(|&id| id < self.vocab) {
            self.seen_host[id as usize / 32] |= 1 << (id % 32);
        }
    }

    /// Writes the host's copy of the history and `draws` to the device (synchronous copies, before any draw).
    fn write_state(&mut self, draws: u32) -> Result<(), Error> {
        let written = |source| Error::Stream { action: "writing the device sampler's state for", source };
        let bits: Vec<u8> = self.seen_host.iter().flat_map(|w| w.to_le_bytes()).collect();
        self.seen.0.write(&bits).map_err(written)?;
        self.draws.0.write(&draws.to_le_bytes()).map_err(written)
    }

    /// Prefill's token was drawn on the host (its logits are not on the device): the device's next draw is
    /// step 1, with `token` in the history.
    ///
    /// # Errors
    /// [`Error::Stream`] when the state cannot be written.
    pub(crate) fn drawn_on_host(&mut self, token: i64) -> Result<(), Error> {
        self.mark(token);
        self.write_state(1)
    }

    /// Where the drawn token is, for the feedback kernel.
    pub(crate) fn token_ptr(&self) -> DevicePtr {
        self.token.1
    }

    /// Queues one draw from `row` on the program's stream.
    ///
    /// # Errors
    /// [`Error::Usage`] when `row` holds another vocabulary than the state was made for; [`Error::Stream`]
    /// when the launch fails.
    pub(crate) fn queue(&self, program: &Program, row: &LogitsRow) -> Result<(), Error> {
        if row.vocab != self.vocab {
            return Err(Error::Usage(format!(
                "the device sampler was prepared for {} ids, but a method's logits hold {}",
                self.vocab, row.vocab
            )));
        }
        let args = SampleArgs {
            row: row.ptr,
            dtype: row.dtype,
            vocab: row.vocab,
            params: self.params,
            seen: self.seen.1,
            draws: self.draws.1,
            keys: self.keys.1,
            token: self.token.1,
        };
        program.queue_on_stream("sampling on the device", "launching the sampler kernel on", |stream| {
            self.kernel.launch(stream, args)
        })
    }
}
