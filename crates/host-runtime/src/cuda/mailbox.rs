//! The token mailbox: pinned host memory that the feedback kernel writes each generated token into, with the
//! device's clock, and a count last, while the host polls it: tokens reach the host as they are made, with no
//! copy and no host synchronisation per step (the device loop's streaming, `generate::generate_streaming`).
//!
//! Layout, in 64-bit words: `[0]` the tokens published; `[1]` a device clock reading ([`Mailbox::clock`],
//! for the clock calibration); `[2 .. 2 + capacity]` the tokens; `[2 + capacity .. 2 + 2 * capacity]` the
//! device's `%globaltimer` (nanoseconds) when each was written. The kernel writes a token and its time, fences
//! (`__threadfence_system`), then the count: a host that reads the count with acquire ordering reads every
//! token below it whole.

use std::sync::atomic::Ordering;

use cuda_rt::{Context, DevicePtr, Error};

use super::PinnedStorage;

/// Pinned memory the device writes tokens into and the host polls (module docs).
pub(crate) struct Mailbox {
    memory: PinnedStorage,
    capacity: u32,
}

impl std::fmt::Debug for Mailbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mailbox").field("capacity", &self.capacity).finish_non_exhaustive()
    }
}

impl Mailbox {
    /// A zeroed mailbox of `capacity` tokens, portable to every context of the device's process.
    ///
    /// # Errors
    /// [`Error::Allocation`] when the driver refuses the pinned memory.
    pub(crate) fn new(ctx: &Context, capacity: u32) -> Result<Mailbox, Error> {
        let words = 2 + 2 * capacity as usize;
        Ok(Mailbox { memory: PinnedStorage::zeroed(ctx, words * 8)?, capacity })
    }

    /// The address the device writes through (pinned memory is mapped at its host address under unified
    /// addressing).
    pub(crate) fn device_ptr(&self) -> DevicePtr {
        self.memory.device_ptr()
    }

    /// The tokens published so far (acquire: every token below the count is readable whole).
    pub(crate) fn published(&self) -> u32 {
        let count = self.memory.atomic_words()[0].load(Ordering::Acquire);
        u32::try_from(count).unwrap_or(u32::MAX).min(self.capacity)
    }

    /// Published token `n` (below [`Mailbox::published`]) and the device time it was written at, in
    /// nanoseconds of `%globaltimer`.
    pub(crate) fn token(&self, n: u32) -> (i64, u64) {
        let words = self.memory.atomic_words();
        let n = n as usize;
        let token = words[2 + n].load(Ordering::Relaxed) as i64;
        let time = words[2 + self.capacity as usize + n].load(Ordering::Relaxed);
        (token, time)
    }

    /// The device clock the clock kernel wrote, once it has (0 before).
    pub(crate) fn clock(&self) -> u64 {
        self.memory.atomic_words()[1].load(Ordering::Acquire)
    }
}
