//! Forking a sequence: [`Program::fork`] copies the first positions of the caches into a second set of
//! caches ([`Caches`]; or [`Program::fork_into`] a set allocated before, [`Program::new_caches`], with no
//! host synchronisation), and [`Program::swap_caches`] makes a set the program's, so two sequences branch
//! from one prefix and decode in turn through the same delegate instances and weights (one `init` per call).
//!
//! ```no_run
//! # use host_runtime::program::{Error, Program};
//! # use host_runtime::generate::continue_from;
//! # fn branch(program: &mut Program, a: i64, b: i64) -> Result<(), Error> {
//! // The caches hold 12 positions; branch b starts from the first 8 with token `b` at 8.
//! let mut other = program.fork(8)?.caches;
//! let next_a = continue_from(program, 12, &[a], 0)?; // branch a, on the program's caches
//! program.swap_caches(&mut other)?;
//! let next_b = continue_from(program, 8, &[b], 0)?; // branch b, on the fork's
//! program.swap_caches(&mut other)?; // branch a's caches are the program's again
//! # Ok(()) }
//! ```
//!
//! ## What a swap relies on, and what it refuses
//!
//! A call's argument list is built from the storages' addresses (see `crate::lend`); a swap rebuilds every
//! list over the new storages, so each `execute` is given the caches of the current sequence. That is enough
//! for a delegate instance that reads the caches only through the arguments of each call and keeps no
//! sequence state of its own. A CUDA graph holds the addresses it was captured with: a replay after a swap is
//! refused ([`Program::replay`]) and the generation loop captures its graph anew on every run.
//!
//! ## The one rule of moving a sequence: [`Program::check_sequence_reuse`]
//!
//! A fork, a rewind ([`Program::rewind`]) and a restored cache file ([`Program::restore_cache`]) each move
//! the sequence by moving the caller's caches only, so each is refused, in one line naming the action, the
//! method, the call, the plugin and why, unless every call of the program can take it:
//! - a call in this process whose instance keeps sequence state of its own (the instance's own answer,
//!   `Instance::sequence_state`: the reference delegate's graphs with delegate-owned `state`, a plugin that
//!   does not state `rewind_fork_without_reinit` for every instance) is refused, since that state would stay
//!   at another position or sequence ([`Error::NotForkable`] for a fork, [`Error::NotRewindable`] for the
//!   others, both `NotSupported`);
//! - a call in a worker process is refused: the host cannot ask its instance, and for a fork its worker
//!   mapped the program's memory once, at start.
//!
//! [`Program::reset`] is not refused: it starts a new sequence at position 0, which a causal decoder's state
//! indexed by position (the reference graph's `state`) rewrites row by row before reading it, as it does
//! the caller's caches.

use std::ops::Range;
use std::path::Path;

use delegate_abi::host::SequenceState;

use super::torn::Torn;
use super::{lifecycle, Buffer, CallInstance, Error, LoadedCall, Program};
use crate::buffer::Storage;
use crate::cuda::{self, Contexts};

/// A second set of a program's caches (one storage per buffer, of the same size and memory kind), made by
/// [`Program::fork`] or [`Program::new_caches`] and run by swapping it in ([`Program::swap_caches`]). It carries what belongs to a
/// sequence: its caches, how many positions they hold, and whether a failed run left them torn.
#[derive(Debug)]
pub struct Caches {
    /// The program it was forked from: only that program takes it.
    program: u64,
    storages: Vec<Storage>,
    position: Option<u64>,
    torn: Option<Torn>,
}

impl Caches {
    /// The positions these caches hold (see [`Program::position`]).
    pub fn position(&self) -> Option<u64> {
        self.position
    }
}

/// What [`Program::fork`] made.
#[derive(Debug)]
#[non_exhaustive]
pub struct Fork {
    /// The new sequence's caches, holding the prefix.
    pub caches: Caches,
    /// Bytes copied: the prefix's rows of every cache (every head's; a whole buffer where no sequence axis
    /// is known).
    pub bytes_copied: u64,
}

/// The byte ranges holding the first `prefix` positions (at most the axis' length) of buffer `decl`: along
/// the second-to-last axis (`[.., L, Dh]`) when it is as long as the caches' positions (`max`), else the one
/// axis that is, one range per block before that axis (per head); the whole buffer when no axis is known.
fn prefix_ranges(decl: &program_manifest::TensorDecl, max: Option<u64>, prefix: u64) -> Vec<Range<usize>> {
    let dims: Vec<usize> = decl.shape.iter().map(|&d| d as usize).collect();
    let second_last = dims.len().checked_sub(2).filter(|&a| max == Some(decl.shape[a]));
    let Some(axis) = second_last.or_else(|| lifecycle::sequence_axis(decl, max)) else {
        let whole = 0..dims.iter().product::<usize>() * decl.dtype.size_bytes();
        return std::iter::once(whole).collect();
    };
    let outer: usize = dims[..axis].iter().product();
    let row = dims[axis + 1..].iter().product::<usize>() * decl.dtype.size_bytes();
    let (block, take) = (dims[axis] * row, (prefix as usize).min(dims[axis]) * row);
    (0..outer).map(|o| o * block..o * block + take).collect()
}

/// Copies `ranges` of `src` into the same ranges of `dst` (same kind and size): queued on `stream` for
/// device and managed memory, by the host for host and pinned memory (the caller has waited for the
/// stream). Returns the bytes copied.
fn copy_ranges(
    dst: &mut Storage,
    src: &Storage,
    ranges: &[Range<usize>],
    stream: Option<&cuda::Stream>,
) -> Result<u64, cuda::Error> {
    let mismatch = |dst: &Storage, src: &Storage| cuda::Error::KindMismatch {
        call: "fork copy",
        dst: dst.memory().name(),
        src: src.memory().name(),
    };
    match (dst, src, stream) {
        (Storage::Device(d), Storage::Device(s), Some(stream)) => {
            cuda::copy_ranges_async(d, s, ranges, stream)
        }
        (Storage::Managed(d), Storage::Managed(s), Some(stream)) => {
            cuda::copy_ranges_async(d, s, ranges, stream)
        }
        (Storage::Host(d), Storage::Host(s), _) => Ok(copy_host(d.bytes_mut(), s.bytes(), ranges)),
        (Storage::Pinned(d), Storage::Pinned(s), _) => Ok(copy_host(d.bytes_mut(), s.bytes(), ranges)),
        (dst, src, _) => Err(mismatch(dst, src)),
    }
}

/// Host copies of `ranges` (clipped to both slices).
fn copy_host(dst: &mut [u8], src: &[u8], ranges: &[Range<usize>]) -> u64 {
    let end = dst.len().min(src.len());
    let mut bytes = 0;
    for range in ranges {
        let range = range.start.min(end)..range.end.min(end);
        dst[range.clone()].copy_from_slice(&src[range.clone()]);
        bytes += range.len() as u64;
    }
    bytes
}

/// A move of the sequence that carries the caller's caches only ([`Program::check_sequence_reuse`]).
#[derive(Debug, Clone, Copy)]
pub(super) enum Reuse<'a> {
    /// [`Program::rewind`] to this position.
    Rewind(u64),
    /// [`Program::restore_cache`] of this file.
    Restore(&'a Path),
    /// [`Program::save_cache`] to this file (which a later restore would read back).
    Save(&'a Path),
    /// [`Program::fork`], [`Program::new_caches`] or [`Program::fork_into`].
    Fork,
}

impl Reuse<'_> {
    /// The action, for `cannot ...`.
    fn action(self) -> String {
        match self {
            Reuse::Rewind(position) => format!("rewind to position {position}"),
            Reuse::Restore(path) => format!("restore cache file {}", path.display()),
            Reuse::Save(path) => format!("save cache file {}", path.display()),
            Reuse::Fork => "fork".to_owned(),
        }
    }

    /// The action as the subject of "does not carry".
    fn noun(self) -> &'static str {
        match self {
            Reuse::Rewind(_) => "a rewind",
            Reuse::Restore(_) => "a restored cache file",
            Reuse::Save(_) => "a saved cache file",
            Reuse::Fork => "a forked sequence",
        }
    }
}

/// Why `call` cannot take `reuse`, after "is served by plugin 'NAME'" (see the module docs), or `None`.
fn call_refusal(call: &LoadedCall, reuse: Reuse<'_>) -> Option<String> {
    let CallInstance::InProcess(instance) = &call.instance else {
        return Some(match reuse {
            Reuse::Fork => " in a worker process, which maps the program's memory once, at start".to_owned(),
            _ => " in a worker process, where the host cannot ask its instance whether it keeps sequence state \
                  of its own"
                .to_owned(),
        });
    };
    match instance.sequence_state() {
        Ok(SequenceState { keeps_own: false, .. }) => None,
        Ok(SequenceState { per_instance: true, .. }) => Some(format!(
            ", whose instance says it keeps sequence state of its own (keeps_sequence_state), which {} does \
             not carry",
            reuse.noun()
        )),
        Ok(SequenceState { per_instance: false, .. }) => Some(
            ", which predates per-instance answers and does not state the capability \
             rewind_fork_without_reinit (it may keep sequence state of its own)"
                .to_owned(),
        ),
        Err(err) => {
            Some(format!(", which cannot say whether its instance keeps sequence state of its own: {err}"))
        }
    }
}

impl Program {
    /// Refuses `reuse` unless every call of the program can take it (see the module docs): a fork with
    /// [`Error::NotForkable`], a rewind or a restore with [`Error::NotRewindable`], naming the first call that
    /// cannot, its plugin and why.
    pub(super) fn check_sequence_reuse(&self, reuse: Reuse<'_>) -> Result<(), Error> {
        let refusal = self.methods.iter().find_map(|m| {
            m.calls.iter().enumerate().find_map(|(index, call)| {
                let why = call_refusal(call, reuse)?;
                Some(format!(
                    "method '{}', call {index} ({}) is served by plugin '{}'{why}",
                    m.decl.name,
                    call.backend,
                    call.instance.plugin_name()
                ))
            })
        });
        match (refusal, reuse) {
            (None, _) => Ok(()),
            (Some(reason), Reuse::Fork) => Err(Error::NotForkable { reason }),
            (Some(reason), _) => Err(Error::NotRewindable { action: reuse.action(), reason }),
        }
    }

    /// Forks the sequence: a second set of caches ([`Caches`], the same buffers in the same memory kinds)
    /// holding a copy of the first `prefix` positions of the program's caches, and nothing else (every row
    /// past the prefix is zero, and is never read: see [`Program::rewind`]). The program's own caches and
    /// position are left as they are; run the fork by swapping it in ([`Program::swap_caches`]), which shares
    /// the program's delegate instances and weights (no second `init`).
    ///
    /// [`Program::new_caches`], then [`Program::fork_into`]: allocating CUDA memory zeroes it, which waits
    /// for the device; to fork with no host synchronisation at all, allocate once and fork into those caches.
    ///
    /// # Errors
    /// As [`Program::fork_into`], checked before anything is allocated; [`Error::BufferMemory`] when
    /// allocating fails.
    pub fn fork(&self, prefix: u64) -> Result<Fork, Error> {
        self.check_fork(prefix)?;
        let mut caches = self.new_caches()?;
        let bytes_copied = self.copy_prefix(prefix, &mut caches)?;
        Ok(Fork { caches, bytes_copied })
    }

    /// A second set of zeroed caches for this program (one storage per buffer, of its size, memory kind and
    /// device), holding position 0: a sequence to fork into ([`Program::fork_into`]) or start afresh
    /// ([`Program::swap_caches`]). CUDA memory is zeroed synchronously (the one host synchronisation of a
    /// fork); allocate before decoding and reuse the caches for later branches.
    ///
    /// # Errors
    /// [`Error::NotForkable`] (see the module docs); [`Error::BufferMemory`] when allocating fails.
    pub fn new_caches(&self) -> Result<Caches, Error> {
        self.check_sequence_reuse(Reuse::Fork)?;
        let mut contexts = Contexts::new();
        let storages = self
            .buffers
            .iter()
            .map(|b: &Buffer| {
                let memory = b.storage.memory();
                Storage::zeroed(memory, b.decl.device, b.storage.len(), &mut contexts)
                    .map_err(|source| Error::BufferMemory { buffer: b.decl.name.clone(), memory, source })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        Ok(Caches { program: self.id, storages, position: Some(0), torn: None })
    }

    /// Copies the first `prefix` positions of the program's caches into `caches` (another set of this
    /// program's, [`Program::new_caches`] or an earlier fork, not swapped in), which then hold position
    /// `prefix` and are no longer torn; their rows past the prefix keep whatever they held, which is never
    /// read. Returns the bytes copied: the prefix's rows of every head of every cache (a whole buffer where
    /// no sequence axis is known: the second-to-last axis, `[.., L, Dh]`, or else the one axis, as long as
    /// `[generate].max_positions`).
    ///
    /// Device and managed caches are copied on the program's stream, queued after any work there (no host
    /// synchronisation; one copy per head); host and pinned caches by the host, after waiting for queued
    /// work.
    ///
    /// # Errors
    /// [`Error::Usage`] for caches of another program; [`Error::NotForkable`] (see the module docs);
    /// [`Error::TornFork`] when a failed run left the program's caches torn; [`Error::PositionUnknown`] when
    /// the program does not know its position ([`Program::position`]); [`Error::ForkPastPosition`] when
    /// `prefix` is past it; [`Error::BufferAccess`] or [`Error::Stream`] when copying fails.
    pub fn fork_into(&self, prefix: u64, caches: &mut Caches) -> Result<u64, Error> {
        self.check_caches(caches)?;
        self.check_fork(prefix)?;
        self.copy_prefix(prefix, caches)
    }

    /// Refuses a fork of `prefix` positions of the program's caches.
    fn check_fork(&self, prefix: u64) -> Result<(), Error> {
        self.check_sequence_reuse(Reuse::Fork)?;
        if let Some(torn) = &self.torn {
            let names: Vec<String> = self.torn_buffers().iter().map(|n| format!("'{n}'")).collect();
            let noun = if names.len() == 1 { "buffer" } else { "buffers" };
            return Err(Error::TornFork {
                buffers: format!("{noun} {}", names.join(", ")),
                failed: torn.failed().to_owned(),
            });
        }
        let position = self.position.ok_or(Error::PositionUnknown)?;
        if prefix > position {
            return Err(Error::ForkPastPosition { prefix, position });
        }
        Ok(())
    }

    /// Refuses caches another program made.
    fn check_caches(&self, caches: &Caches) -> Result<(), Error> {
        if caches.program != self.id || caches.storages.len() != self.buffers.len() {
            return Err(Error::Usage("the caches were forked from another program".into()));
        }
        Ok(())
    }

    /// Copies the prefix rows of every buffer into `caches` (checked); returns the bytes copied.
    fn copy_prefix(&self, prefix: u64, caches: &mut Caches) -> Result<u64, Error> {
        let stream = self.gpu.as_ref().map(|g| &g.stream);
        let mut bytes_copied = 0;
        for (buffer, storage) in self.buffers.iter().zip(&mut caches.storages) {
            if storage.host_copied() {
                self.synchronize()?;
            }
            let ranges = prefix_ranges(&buffer.decl, self.max_positions(), prefix);
            let copied = copy_ranges(storage, &buffer.storage, &ranges, stream).map_err(|source| {
                Error::BufferAccess { buffer: buffer.decl.name.clone(), action: "forking", source }
            })?;
            if let Some(gpu) = self.gpu.as_ref().filter(|_| !storage.host_copied()) {
                gpu.queued();
            }
            bytes_copied += copied;
        }
        caches.position = Some(prefix);
        caches.torn = None;
        Ok(bytes_copied)
    }

    /// Exchanges the program's caches with `caches` (made for this program by [`Program::fork`] or
    /// [`Program::new_caches`]): their
    /// storages, positions ([`Program::position`]) and torn marks. Every later run reads and writes the
    /// caches swapped in; swap again to go back. Each call's argument list is rebuilt over the new storages
    /// (nothing is copied), and a CUDA graph captured before is refused at replay ([`Program::replay`]).
    /// Work already queued keeps using the storages it was queued with (they stay alive in `caches`); host
    /// and pinned caches are waited for first when work is queued, since they leave the program's care.
    ///
    /// # Errors
    /// [`Error::Usage`] for caches forked from another program; [`Error::Stream`] when waiting fails;
    /// [`Error::Lend`] when an argument list cannot be rebuilt (the caches are then left as they were).
    pub fn swap_caches(&mut self, caches: &mut Caches) -> Result<(), Error> {
        self.check_caches(caches)?;
        if self.buffers.iter().any(|b| b.storage.host_copied()) {
            self.synchronize()?;
        }
        self.exchange(caches);
        if let Err(err) = super::load::lend_arguments(&mut self.methods, &mut self.buffers) {
            self.exchange(caches);
            super::load::lend_arguments(&mut self.methods, &mut self.buffers)?;
            return Err(err);
        }
        std::mem::swap(&mut self.position, &mut caches.position);
        std::mem::swap(&mut self.torn, &mut caches.torn);
        self.cache_epoch += 1;
        Ok(())
    }

    /// Exchanges the buffers' storages with `caches`'.
    fn exchange(&mut self, caches: &mut Caches) {
        for (buffer, storage) in self.buffers.iter_mut().zip(&mut caches.storages) {
            std::mem::swap(&mut buffer.storage, storage);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use program_manifest::{MemoryKind, TensorDecl};

    #[test]
    fn the_prefix_is_one_range_per_head_along_the_second_to_last_axis() {
        // [2, 4, 3] f32: two heads of four rows of 12 bytes; [4, 4, 3] has two axes of 4: the second-to-last.
        let decl = TensorDecl::new("k", blob_format::model::DType::F32, vec![2, 4, 3], MemoryKind::Host)
            .expect("decl");
        assert_eq!(prefix_ranges(&decl, Some(4), 2), [0..24, 48..72]);
        let square = TensorDecl::new("k", blob_format::model::DType::F32, vec![4, 4, 3], MemoryKind::Host)
            .expect("decl");
        assert_eq!(prefix_ranges(&square, Some(4), 1), [0..12, 48..60, 96..108, 144..156]);
        let whole = prefix_ranges(&decl, None, 2);
        assert_eq!((whole.len(), whole.first()), (1, Some(&(0..96))), "no positions known: the whole buffer");
        let mut dst = [0u8; 8];
        assert_eq!(copy_host(&mut dst, &[1, 2, 3, 4, 5, 6, 7, 8], &[0..2, 4..6]), 4);
        assert_eq!(dst, [1, 2, 0, 0, 5, 6, 0, 0]);
    }
}
