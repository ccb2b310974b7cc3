//! The doorbell an isolated call rings for each `execute`: one page of memory shared by the host and its
//! worker, holding a request counter, an answer counter and the answer. Each side spins briefly for the other
//! while that pays off ([`Budget`]), then sleeps on a futex, so a call answered quickly crosses without
//! entering the kernel at all, where a socket round trip costs two wake-ups through it.
//!
//! The socket stays: init travels over it, an error's message follows the ring that says the call failed (rare,
//! and of any length up to a cap: the host reads it while the worker writes it), and its end of file is how a
//! sleeping worker learns that its host is gone.
//!
//! The page's memory file is sealed at one page before the worker gets it, so a worker cannot shrink it
//! from under the host's mapping; what it writes into the page is read by the host as untrusted words (the
//! host keeps its own request number, and an answer is one code and two counters, checked by the caller).
#![allow(unsafe_code)]

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use delegate_abi::{DelegateError, ExecStats};
use rustix::thread::futex;

use super::mapping::Mapping;

/// How long the host spins for an answer before it sleeps: a call answered sooner never enters the kernel.
const HOST_SPIN: Duration = Duration::from_micros(50);

/// How long a worker spins for the next request after answering one: a decode loop's next step usually
/// comes sooner.
const WORKER_SPIN: Duration = Duration::from_micros(50);

/// The longest the host sleeps before it looks whether its worker is still alive.
const HOST_SLICE: Duration = Duration::from_millis(10);

/// The longest a worker sleeps before it looks whether its host is still there.
const WORKER_SLICE: Duration = Duration::from_millis(50);

/// The shared page's words. Host and worker are the same build (the worker is started by the host), so the
/// layout is private to this module.
#[repr(C)]
struct Words {
    /// Bumped by the host for each request.
    request: AtomicU32,
    /// Set by the worker to the request it has answered.
    answer: AtomicU32,
    /// 1 while the worker sleeps (or is about to) on `request`.
    worker_asleep: AtomicU32,
    /// 1 while the host sleeps (or is about to) on `answer`.
    host_asleep: AtomicU32,
    /// Set by the host before its last ring: the worker is to finish.
    stop: AtomicU32,
    /// 0: the call succeeded; otherwise the error's code, whose message follows on the socket.
    code: AtomicU32,
    /// The CPU the host last rang from, plus one (0: unknown).
    host_cpu: AtomicU32,
    reflect_bytes: AtomicU64,
    staged_bytes: AtomicU64,
}

const PAGE: u64 = 4096;
const _: () = assert!(std::mem::size_of::<Words>() as u64 <= PAGE);

/// One side's mapping of the shared page.
pub(super) struct Bell {
    mapping: Mapping,
    /// Host: the last request it rang (its own count, not the page's, which the worker can write).
    rung: AtomicU32,
    /// This side's spin budget: [`HOST_SPIN`] or [`WORKER_SPIN`], adapted.
    budget: Budget,
    /// Worker: how often it was woken from sleep (it looks whether it shares its host's CPU every so often).
    wakes: AtomicU32,
}

// SAFETY: the mapping is memory of the whole process, unmapped only when the `Bell` is dropped, and it is
// reached only as `&Words`: atomics, which any thread may use at once (the other process already does).
unsafe impl Send for Bell {}
// SAFETY: as for `Send`: every access is through atomics.
unsafe impl Sync for Bell {}

/// How a ring ended, for the host.
pub(super) enum Rung {
    /// The call succeeded.
    Ok(ExecStats),
    /// The call failed; its code and message are on the socket.
    Failed,
    /// No answer within the deadline.
    TimedOut,
    /// The worker is gone.
    Died,
}

/// What a waiting worker was woken by.
pub(super) enum Woken {
    /// A request, to be answered with this number.
    Request(u32),
    /// The host asked it to finish, or went away.
    Finish,
}

impl Bell {
    /// The host's side: a fresh page in a memory file, to be sent to the worker at init.
    pub(super) fn create() -> Result<(Bell, OwnedFd), DelegateError> {
        let internal = |what: &str, err: rustix::io::Errno| DelegateError::internal(format!("{what}: {err}"));
        let flags = rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING;
        let fd = rustix::fs::memfd_create("kv-delegate-bell", flags)
            .map_err(|err| internal("cannot make the doorbell's memory file", err))?;
        rustix::fs::ftruncate(&fd, PAGE).map_err(|err| internal("cannot size the doorbell", err))?;
        crate::buffer::seal(&fd, rustix::fs::SealFlags::empty())
            .map_err(|err| internal("cannot seal the doorbell", err))?;
        let bell = Bell {
            mapping: Mapping::new(fd.as_fd(), PAGE, true)?,
            rung: AtomicU32::new(0),
            budget: Budget::new(HOST_SPIN),
            wakes: AtomicU32::new(0),
        };
        bell.words().host_cpu.store(this_cpu(), Ordering::Relaxed);
        Ok((bell, fd))
    }

    /// The worker's side: the page the host sent. A worker starts on its host's CPU (where it was forked);
    /// it steps off it, so that the two spin on CPUs of their own.
    pub(super) fn open(fd: BorrowedFd<'_>) -> Result<Bell, DelegateError> {
        let bell = Bell {
            mapping: Mapping::new(fd, PAGE, true)?,
            rung: AtomicU32::new(0),
            budget: Budget::new(WORKER_SPIN),
            wakes: AtomicU32::new(0),
        };
        bell.step_off_host();
        Ok(bell)
    }

    fn words(&self) -> &Words {
        // SAFETY: the mapping is one page, page-aligned (as `mmap` returns it), readable and writable, and lives
        // as long as `self`; its file is sealed at one page by the host before the worker gets it, so neither
        // side can shrink it from under the other's mapping. `Words` fits in it (asserted above) and is all
        // atomics, for which any bit pattern is valid (a fresh memory file reads as zeros): whatever the other
        // process writes into it (through the same atomics or not) is a value, never undefined behaviour.
        unsafe { &*self.mapping.ptr.cast::<Words>() }
    }

    /// Host: rings for one request and waits for its answer until `until`, spinning first, then sleeping in
    /// slices, asking `alive` after each slice whether the worker is still running.
    pub(super) fn call(&self, until: Instant, mut alive: impl FnMut() -> bool) -> Rung {
        let words = self.words();
        let seq = self.rung.load(Ordering::Relaxed).wrapping_add(1);
        self.rung.store(seq, Ordering::Relaxed);
        words.host_cpu.store(this_cpu(), Ordering::Relaxed);
        words.request.store(seq, Ordering::SeqCst);
        if words.worker_asleep.load(Ordering::SeqCst) != 0 {
            wake(&words.request);
        }
        let answered = |word: u32| word == seq;
        if !self.budget.spin(|| answered(words.answer.load(Ordering::Acquire))) {
            loop {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Rung::TimedOut;
                }
                if sleep(&words.answer, &words.host_asleep, left.min(HOST_SLICE), answered) {
                    break;
                }
                if !alive() {
                    // It may have answered just before it went.
                    if answered(words.answer.load(Ordering::Acquire)) {
                        break;
                    }
                    return Rung::Died;
                }
            }
        }
        the_answer(words)
    }

    /// Host: asks the worker to finish (it destroys its instance and exits).
    pub(super) fn finish(&self) {
        let words = self.words();
        words.stop.store(1, Ordering::SeqCst);
        let seq = self.rung.load(Ordering::Relaxed).wrapping_add(1);
        self.rung.store(seq, Ordering::Relaxed);
        words.request.store(seq, Ordering::SeqCst);
        wake(&words.request);
    }

    /// Worker: whether the host has asked it to finish.
    pub(super) fn finishing(&self) -> bool {
        self.words().stop.load(Ordering::SeqCst) != 0
    }

    /// Worker: waits for the request after `last`, spinning first, then sleeping in slices, asking `host_gone`
    /// after each slice whether the host is still there.
    pub(super) fn next(&self, last: u32, mut host_gone: impl FnMut() -> bool) -> Woken {
        let words = self.words();
        let arrived = |word: u32| word != last;
        if !self.budget.spin(|| arrived(words.request.load(Ordering::Acquire))) {
            while !sleep(&words.request, &words.worker_asleep, WORKER_SLICE, arrived) {
                if host_gone() {
                    return Woken::Finish;
                }
            }
            // Woken from sleep, perhaps onto its host's CPU (the scheduler likes to keep a pair that wakes each
            // other together), where neither side's spin can pay off: now and then, step off it.
            if self.wakes.fetch_add(1, Ordering::Relaxed) % Budget::PROBE_EVERY == 0 {
                self.step_off_host();
            }
        }
        if words.stop.load(Ordering::Acquire) != 0 {
            return Woken::Finish;
        }
        Woken::Request(words.request.load(Ordering::Acquire))
    }

    /// Worker: moves off the CPU its host last rang from, if it is on it.
    fn step_off_host(&self) {
        if let Some(cpu) = self.words().host_cpu.load(Ordering::Relaxed).checked_sub(1) {
            step_off(cpu as usize);
        }
    }

    /// Worker: answers request `seq` (an error's message is to follow on the socket).
    pub(super) fn answer(&self, seq: u32, result: &Result<ExecStats, DelegateError>) {
        let words = self.words();
        let (code, stats) = match result {
            Ok(stats) => (0, *stats),
            // An error with code 0 (`Ok`) would read as success: send it as `Internal`.
            Err(err) => (err.code.as_u32().max(1), ExecStats::default()),
        };
        words.code.store(code, Ordering::Relaxed);
        words.reflect_bytes.store(stats.reflect_bytes, Ordering::Relaxed);
        words.staged_bytes.store(stats.staged_bytes, Ordering::Relaxed);
        words.answer.store(seq, Ordering::SeqCst);
        if words.host_asleep.load(Ordering::SeqCst) != 0 {
            wake(&words.answer);
        }
    }
}

/// The CPU this thread runs on, plus one (0 is "unknown" in the page).
fn this_cpu() -> u32 {
    u32::try_from(rustix::thread::sched_getcpu()).map_or(0, |cpu| cpu.saturating_add(1))
}

/// Moves this thread off `cpu` when it may run elsewhere, then gives its affinity back: the scheduler is
/// left free to place it from then on (nothing stays pinned), but a worker forked beside its host and then
/// spinning for it does not wait for the scheduler to notice two busy tasks on one CPU.
fn step_off(cpu: usize) {
    use rustix::thread::{sched_getaffinity, sched_setaffinity};
    let Ok(allowed) = sched_getaffinity(None) else { return };
    if allowed.count() < 2 || !allowed.is_set(cpu) || rustix::thread::sched_getcpu() != cpu {
        return;
    }
    let mut elsewhere = allowed;
    elsewhere.unset(cpu);
    if sched_setaffinity(None, &elsewhere).is_ok() {
        let _ = sched_setaffinity(None, &allowed);
    }
}

/// The answer the worker left in the page (read after its `answer` word was seen with `Acquire`).
fn the_answer(words: &Words) -> Rung {
    match words.code.load(Ordering::Relaxed) {
        0 => Rung::Ok(ExecStats {
            reflect_bytes: words.reflect_bytes.load(Ordering::Relaxed),
            staged_bytes: words.staged_bytes.load(Ordering::Relaxed),
        }),
        _ => Rung::Failed,
    }
}

/// Spins until `done` or `budget` has passed; whether it is done.
fn spin(budget: Duration, done: impl Fn() -> bool) -> bool {
    let start = Instant::now();
    loop {
        for _ in 0..64 {
            if done() {
                return true;
            }
            std::hint::spin_loop();
        }
        if start.elapsed() >= budget {
            return done();
        }
    }
}

/// One side's spin budget, adapted to how the last waits went. Spinning pays off when the two sides run on
/// cores of their own: an answer then crosses in well under a microsecond. When they share a core (a loaded
/// machine, or the scheduler placing a woken worker beside its host) it only keeps the other side from
/// running; but it is also what lets the scheduler see two busy tasks on one core and move one away. So a side
/// keeps its full budget through [`Budget::PATIENCE`] misses in a row, then stops spinning, with a full spin
/// every [`Budget::PROBE_EVERY`] waits to find out whether it pays off again.
struct Budget {
    full: Duration,
    /// Misses in a row, and waits since the last probe once spinning has stopped.
    misses: AtomicU32,
}

impl Budget {
    const PATIENCE: u32 = 8;
    const PROBE_EVERY: u32 = 64;

    fn new(full: Duration) -> Budget {
        Budget { full, misses: AtomicU32::new(0) }
    }

    /// Spins for `done` within the budget, then adapts it.
    fn spin(&self, done: impl Fn() -> bool) -> bool {
        let misses = self.misses.load(Ordering::Relaxed);
        let spinning = misses < Budget::PATIENCE || (misses - Budget::PATIENCE) % Budget::PROBE_EVERY == 0;
        let hit = spin(if spinning { self.full } else { Duration::ZERO }, done);
        self.misses.store(if hit { 0 } else { misses.saturating_add(1) }, Ordering::Relaxed);
        hit
    }
}

/// Sleeps on `word` until `done` holds for it or `slice` has passed, with `asleep` raised so that the other
/// side, having moved the word, knows to wake the sleeper. Whether `done` holds.
fn sleep(word: &AtomicU32, asleep: &AtomicU32, slice: Duration, done: impl Fn(u32) -> bool) -> bool {
    // Raised before the word is read, lowered after: the other side moves the word before it reads `asleep`
    // (all `SeqCst`), so either this side sees the word moved or that side sees it asleep and wakes it.
    asleep.store(1, Ordering::SeqCst);
    let current = word.load(Ordering::SeqCst);
    if !done(current) {
        let timeout = futex::Timespec {
            tv_sec: i64::try_from(slice.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(slice.subsec_nanos()),
        };
        // EAGAIN (the word moved before the kernel looked), EINTR and ETIMEDOUT all return here; the word is
        // looked at again below.
        let _ = futex::wait(word, futex::Flags::empty(), current, Some(&timeout));
    }
    asleep.store(0, Ordering::SeqCst);
    done(word.load(Ordering::Acquire))
}

fn wake(word: &AtomicU32) {
    // Not `PRIVATE`: the word is in memory shared with another process.
    let _ = futex::wake(word, futex::Flags::empty(), 1);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host bell and a worker bell over the same page: two mappings of one memory file, as the two
    /// processes have them.
    fn pair() -> (Bell, Bell) {
        let (host, file) = Bell::create().expect("a doorbell");
        let worker = Bell::open(file.as_fd()).expect("the worker's mapping");
        (host, worker)
    }

    fn stats(n: u64) -> ExecStats {
        ExecStats { reflect_bytes: n, staged_bytes: 2 * n }
    }

    #[test]
    fn each_call_gets_the_answer_to_its_own_request_whether_the_sides_spin_or_sleep() {
        let (host, worker) = pair();
        let served = std::thread::spawn(move || {
            let mut last = 0;
            let mut answered = 0u64;
            loop {
                match worker.next(last, || false) {
                    Woken::Finish => return answered,
                    Woken::Request(seq) => {
                        last = seq;
                        answered += 1;
                        // Every fourth call outlasts both spin budgets, so both sides also sleep.
                        if answered % 4 == 0 {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                        worker.answer(seq, &Ok(stats(answered)));
                    }
                }
            }
        });
        for n in 1..=200u64 {
            match host.call(Instant::now() + Duration::from_secs(10), || true) {
                Rung::Ok(got) => assert_eq!(got, stats(n), "call {n} got another call's answer"),
                _ => panic!("call {n} was not answered"),
            }
            if n % 50 == 0 {
                // The worker has gone to sleep on its futex by now: the next ring must wake it.
                std::thread::sleep(Duration::from_millis(60));
            }
        }
        host.finish();
        assert_eq!(served.join().expect("the worker thread"), 200);
    }

    #[test]
    fn a_failed_call_says_so_and_an_error_coded_ok_is_not_success() {
        let (host, worker) = pair();
        let served = std::thread::spawn(move || {
            let errors = [
                DelegateError::invalid_argument("bad"),
                DelegateError::new(delegate_abi::ErrorCode::Ok, "an error that says Ok"),
            ];
            let mut last = 0;
            for err in errors {
                let Woken::Request(seq) = worker.next(last, || false) else { panic!("finished early") };
                last = seq;
                worker.answer(seq, &Err(err));
            }
        });
        for _ in 0..2 {
            assert!(matches!(host.call(Instant::now() + Duration::from_secs(10), || true), Rung::Failed));
        }
        served.join().expect("the worker thread");
    }

    #[test]
    fn an_unanswered_call_times_out_at_its_deadline_and_a_dead_worker_is_noticed() {
        let (host, _worker) = pair();
        let start = Instant::now();
        assert!(matches!(host.call(Instant::now() + Duration::from_millis(50), || true), Rung::TimedOut));
        assert!(start.elapsed() >= Duration::from_millis(50));
        let start = Instant::now();
        assert!(matches!(host.call(Instant::now() + Duration::from_secs(60), || false), Rung::Died));
        assert!(start.elapsed() < Duration::from_secs(10), "a dead worker was waited for until the deadline");
    }

    #[test]
    fn a_worker_can_neither_resize_the_doorbell_nor_move_the_host_off_its_own_count() {
        let (host, file) = Bell::create().expect("a doorbell");
        // Shrunk, the page would be gone from under the host's mapping: SIGBUS at its next look.
        assert_eq!(rustix::fs::ftruncate(&file, 0), Err(rustix::io::Errno::PERM));
        assert_eq!(rustix::fs::ftruncate(&file, 2 * PAGE), Err(rustix::io::Errno::PERM));
        let worker = Bell::open(file.as_fd()).expect("the worker's mapping");
        // A worker that writes the request word (here: answers a request far ahead and says so) does not
        // change which request the host rings next: the host waits for the answer to its own.
        worker.words().request.store(1000, Ordering::SeqCst);
        worker.answer(1000, &Ok(stats(1)));
        assert!(matches!(host.call(Instant::now() + Duration::from_millis(30), || true), Rung::TimedOut));
        assert_eq!(worker.words().request.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_sleeping_worker_finishes_when_asked_or_when_its_host_is_gone() {
        let (host, worker) = pair();
        let waiting = std::thread::spawn(move || matches!(worker.next(0, || false), Woken::Finish));
        std::thread::sleep(Duration::from_millis(20));
        host.finish();
        assert!(waiting.join().expect("the worker thread"), "a finish rang as a request");

        let (_host, worker) = pair();
        let gone = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            let waiting =
                scope.spawn(|| matches!(worker.next(0, || gone.load(Ordering::SeqCst)), Woken::Finish));
            std::thread::sleep(Duration::from_millis(20));
            gone.store(true, Ordering::SeqCst);
            assert!(waiting.join().expect("the worker thread"));
        });
    }
}
