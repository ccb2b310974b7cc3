//! Torn buffers: what a failed run may have left half-written, and the refusal of every later run that reads
//! them until the caller resets (see [`Program`]'s docs).

use std::collections::BTreeSet;

use super::{CopySlot, Error, LoadedMethod, MethodId, Program};
use crate::lend::ArgSource;

/// Buffers that a failed method run may have left half-written: the host cannot tell how far a call got
/// before its plugin failed or its worker was killed, so every buffer the method writes is suspect until the
/// caller resets ([`Program::reset`]).
#[derive(Debug, Clone)]
pub(super) struct Torn {
    /// The buffers' indices in the manifest's declarations.
    buffers: BTreeSet<usize>,
    /// The first failed call, as `method 'decode', call 0 (ReferenceBackend)`.
    failed: String,
}

impl Torn {
    /// The first failed call, as `method 'decode', call 0 (ReferenceBackend)`.
    pub(super) fn failed(&self) -> &str {
        &self.failed
    }
}

impl LoadedMethod {
    /// Whether a call or host copy of the method reads buffer `b` (as an input, in place or by a copy).
    fn reads(&self, b: usize) -> bool {
        let by_call = self.calls.iter().flat_map(|c| &c.args).any(|a| match a.source {
            ArgSource::BufferRead(x) | ArgSource::BufferInOut(x) | ArgSource::BufferInPlace(x) => x == b,
            _ => false,
        });
        by_call || self.copies.iter().any(|c| c.from == CopySlot::Buffer(b))
    }

    /// The buffers a run of the method may write: in place, by a write-back, or by a host copy.
    fn writes(&self) -> BTreeSet<usize> {
        let in_place = self.calls.iter().flat_map(|c| &c.args).filter_map(|a| match a.source {
            ArgSource::BufferInOut(b) | ArgSource::BufferInPlace(b) => Some(b),
            _ => None,
        });
        let written_back = self.calls.iter().flat_map(|c| c.writebacks.iter().map(|&(_, b)| b));
        let copied = self.copies.iter().filter_map(|c| match c.to {
            CopySlot::Buffer(b) => Some(b),
            _ => None,
        });
        in_place.chain(written_back).chain(copied).collect()
    }
}

impl Program {
    /// The buffers a failed run may have left half-written, by name (empty unless a run failed since the last
    /// [`Program::reset`] or [`Program::reset_buffers`]).
    pub fn torn_buffers(&self) -> Vec<&str> {
        self.torn.iter().flat_map(|t| &t.buffers).map(|&b| self.buffers[b].decl.name.as_str()).collect()
    }

    /// Refuses a run of `method` that would read a torn buffer.
    pub(super) fn refuse_torn(&self, method: MethodId) -> Result<(), Error> {
        let (Some(torn), Some(m)) = (&self.torn, self.methods.get(method.0)) else { return Ok(()) };
        let read: Vec<String> = torn
            .buffers
            .iter()
            .filter(|&&b| m.reads(b))
            .map(|&b| format!("'{}'", self.buffers[b].decl.name))
            .collect();
        if read.is_empty() {
            return Ok(());
        }
        Err(Error::TornBuffers {
            method: m.decl.name.clone(),
            buffers: format!("{} {}", if read.len() == 1 { "buffer" } else { "buffers" }, read.join(", ")),
            failed: torn.failed.clone(),
        })
    }

    /// Marks the buffers `method` writes as torn after a run of it failed at call `at` (`None`: before its
    /// first call).
    pub(super) fn tear(&mut self, method: MethodId, at: Option<usize>) {
        let Some(m) = self.methods.get(method.0) else { return };
        let written = m.writes();
        if written.is_empty() {
            return;
        }
        let name = &m.decl.name;
        let failed = match at.and_then(|i| m.calls.get(i).map(|c| (i, c))) {
            Some((i, call)) => format!("method '{name}', call {i} ({})", call.backend),
            None => format!("method '{name}'"),
        };
        self.tear_buffers(written, failed);
    }

    /// Marks `buffers` (indices in the manifest's declarations) torn after `failed` (as `method 'decode',
    /// call 0 (ReferenceBackend)` or `the restore of cache file x`) failed part-way through writing them; the
    /// first failure is the one named.
    pub(super) fn tear_buffers(&mut self, buffers: impl IntoIterator<Item = usize>, failed: String) {
        match &mut self.torn {
            Some(torn) => torn.buffers.extend(buffers),
            None => self.torn = Some(Torn { buffers: buffers.into_iter().collect(), failed }),
        }
    }
}
