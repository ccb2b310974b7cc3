//! Process-wide counters of what the host waited for: [`host_syncs`] counts every time a thread of this
//! process blocked on the GPU through this crate.
//!
//! Counted: every context, stream and event synchronisation ([`crate::Context::synchronize`],
//! [`crate::Context::synchronize_stream`], [`crate::Stream::synchronize`], [`crate::Event::synchronize`]) and
//! every blocking copy or memset ([`crate::Allocation::read`], `write`, `clear`, `copy_from`, and the host
//! views of managed memory, which synchronise the context first). An operation that blocks once counts once:
//! `write` is a synchronous copy followed by a context synchronisation, and counts one.
//!
//! The counter is a `static` of this crate, so it is shared by everything linked into one binary: the host
//! and every plugin embedded in it through its rlib (`delegate_root()`). A plugin loaded from a dylib links its
//! own copy of this crate and counts into its own copy of the counter, which the host does not see; a host
//! measuring such a plugin's synchronisations must ask the plugin.
//!
//! [`thread_host_syncs`] counts the calling thread's alone (a generation loop and the delegates it calls run
//! on one thread, so other threads' synchronisations do not blur its count).
//!
//! ```
//! let before = cuda_rt::stats::thread_host_syncs();
//! // ... decode steps ...
//! let per_step = (cuda_rt::stats::thread_host_syncs() - before) as f64 / 10.0;
//! assert!(per_step >= 0.0);
//! ```

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

static HOST_SYNCS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static THREAD_HOST_SYNCS: Cell<u64> = const { Cell::new(0) };
}

/// Host synchronisations since the process started, by every thread (see the module docs for what counts).
pub fn host_syncs() -> u64 {
    HOST_SYNCS.load(Ordering::Relaxed)
}

/// Host synchronisations the calling thread made since it started: what a loop that runs its delegates on
/// its own thread measures, unaffected by other threads.
pub fn thread_host_syncs() -> u64 {
    THREAD_HOST_SYNCS.with(Cell::get)
}

/// Counts one host synchronisation.
pub(crate) fn count_host_sync() {
    HOST_SYNCS.fetch_add(1, Ordering::Relaxed);
    THREAD_HOST_SYNCS.with(|n| n.set(n.get() + 1));
}

#[cfg(test)]
mod tests {
    #[test]
    fn counting_is_monotonic_and_seen_by_readers() {
        let before = super::host_syncs();
        super::count_host_sync();
        super::count_host_sync();
        // Other tests of this process may count too: at least our two.
        assert!(super::host_syncs() >= before + 2);
        // On this thread, exactly our two.
        let mine = super::thread_host_syncs();
        super::count_host_sync();
        super::count_host_sync();
        assert_eq!(super::thread_host_syncs(), mine + 2);
    }
}
