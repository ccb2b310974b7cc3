//! A plugin library that misbehaves inside `execute` the way a native library can, on request: the fixture
//! for isolated plugins (`host_runtime::isolate`). Otherwise it is the reference delegate (backend
//! `ReferenceBackend`), under the plugin name `misbehave-delegate`, so a program runs through it to the
//! same tokens.
//!
//! `MISBEHAVE` in the environment of the process that runs `execute` chooses, once per process:
//!
//! | value | effect in `execute` |
//! |---|---|
//! | unset or empty | none: the reference delegate's `execute` |
//! | `abort` | `abort()`: the process ends with `SIGABRT` |
//! | `hang` | sleeps forever |
//! | `exit` | `exit(3)` |
//! | `abort-once:<file>` | if `<file>` does not exist: creates it, then aborts; otherwise none |
//! | `long-error:<n>` | fails with an `n`-byte message (`x` repeated) |
//! | `stats` | the reference delegate's `execute`, then reports `u64::MAX` bytes reflected and staged (in zero-copy mode, where the reference delegate reports none of its own) |
//!
//! Some values act from inside a worker process on what the host shares with it (descriptor 3 is the
//! worker's socket to its host; the host's memory files show in `/proc/self/fd` as `/memfd:kv-delegate-*`).
//! They know the host-worker protocol of `host_runtime::isolate` (an answer is a little-endian `u32` length,
//! then a kind byte: 0 success with two `u64` counters, 1 failure with a `u32` code and the message):
//!
//! | value | effect in `execute` |
//! |---|---|
//! | `trickle` | writes an answer header announcing 100 000 bytes on the socket, then one byte every 100 ms from a thread of its own; fails |
//! | `answer-twice` | writes a success answer on the socket, then fails (its failure is a second answer) |
//! | `code-ok` | writes a failure answer with code 0 (`Ok`) on the socket, then fails |
//! | `shrink` | tries to shrink each of the host's memory files it holds or maps to 0 bytes; fails, saying what each attempt got |
//! | `fds` | fails, listing its open descriptors and what each is |
//!
//! ```text
//! cargo build -p misbehave-delegate     # target/debug/libmisbehave_delegate.so
//! ```
//!
//! ## Feature Flags
//!
//! None.
#![deny(unsafe_code)]
#![deny(missing_docs)]

use std::io::Write;
use std::os::unix::net::UnixStream;

use delegate_abi::{Compatibility, Delegate, DelegateError, ExecuteArgs, InitContext, PluginInfo};
use reference_delegate::ReferenceDelegate;

/// The reference delegate, misbehaving on request.
pub struct Misbehave(ReferenceDelegate);

impl Delegate for Misbehave {
    type Handle = <ReferenceDelegate as Delegate>::Handle;

    fn new() -> Self {
        Misbehave(ReferenceDelegate::new())
    }

    fn info() -> PluginInfo {
        let mut info = ReferenceDelegate::info();
        info.name = "misbehave-delegate".to_owned();
        info
    }

    fn compatibility(&self, blob: &[u8]) -> Compatibility {
        self.0.compatibility(blob)
    }

    fn init(&self, ctx: InitContext<'_>) -> Result<Self::Handle, DelegateError> {
        self.0.init(ctx)
    }

    fn execute(&self, handle: &mut Self::Handle, args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
        let request = std::env::var("MISBEHAVE").unwrap_or_default();
        match request.split_once(':').unwrap_or((request.as_str(), "")) {
            ("abort", _) => std::process::abort(),
            ("hang", _) => loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            },
            ("exit", _) => std::process::exit(3),
            ("abort-once", marker) if !std::path::Path::new(marker).exists() => {
                let _ = std::fs::write(marker, b"aborted once\n");
                std::process::abort()
            }
            ("long-error", n) => Err(DelegateError::internal("x".repeat(n.parse().unwrap_or(0)))),
            ("stats", _) => {
                self.0.execute(handle, args)?;
                args.record_reflect(u64::MAX);
                args.record_staging(u64::MAX);
                Ok(())
            }
            ("trickle", _) => trickle(),
            ("answer-twice", _) => {
                let mut answer = 17u32.to_le_bytes().to_vec();
                answer.push(0);
                answer.extend_from_slice(&[0; 16]);
                write_socket(&answer)?;
                Err(DelegateError::internal("failed after answering success"))
            }
            ("code-ok", _) => {
                let message = b"an error that says it is Ok";
                let mut answer = (5 + message.len() as u32).to_le_bytes().to_vec();
                answer.push(1);
                answer.extend_from_slice(&0u32.to_le_bytes());
                answer.extend_from_slice(message);
                write_socket(&answer)?;
                Err(DelegateError::internal("the real error"))
            }
            ("shrink", _) => Err(DelegateError::internal(shrink_memory_files())),
            ("fds", _) => Err(DelegateError::internal(format!("fds: {}", open_descriptors()))),
            _ => self.0.execute(handle, args),
        }
    }
}

/// The worker's socket (descriptor 3), as a stream of its own (a duplicate).
#[allow(unsafe_code)]
fn socket() -> Result<UnixStream, DelegateError> {
    use std::os::fd::BorrowedFd;
    // SAFETY: borrowed only to be duplicated at once. In a worker, descriptor 3 is the socket the worker's
    // `serve` owns for the whole call; elsewhere it may be closed, and the duplicate fails (EBADF, handled).
    let fd = unsafe { BorrowedFd::borrow_raw(3) };
    let owned = fd
        .try_clone_to_owned()
        .map_err(|err| DelegateError::internal(format!("descriptor 3 (the worker's socket): {err}")))?;
    Ok(UnixStream::from(owned))
}

fn write_socket(bytes: &[u8]) -> Result<(), DelegateError> {
    socket()?.write_all(bytes).map_err(|err| DelegateError::internal(format!("writing the socket: {err}")))
}

/// Announces a 100 000-byte answer, then sends one byte every 100 ms from a thread of its own, for ever.
fn trickle() -> Result<(), DelegateError> {
    let mut socket = socket()?;
    write_socket(&100_000u32.to_le_bytes())?;
    std::thread::spawn(move || {
        while socket.write_all(b"x").is_ok() {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    });
    Err(DelegateError::internal("trickling"))
}

/// This process's open descriptors: `number -> target`, each `/proc/self/fd` link.
fn descriptors() -> Vec<(u32, String)> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return Vec::new() };
    let mut found: Vec<(u32, String)> = dir
        .flatten()
        .filter_map(|entry| {
            let fd = entry.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(entry.path()).ok()?;
            Some((fd, target.to_string_lossy().into_owned()))
        })
        .collect();
    found.sort();
    found
}

/// `0 -> /dev/null, 1 -> pipe:[123], ...`
fn open_descriptors() -> String {
    let listed: Vec<String> = descriptors().iter().map(|(fd, target)| format!("{fd} -> {target}")).collect();
    listed.join(", ")
}

/// Tries to cut each of the host's memory files to 0 bytes, reached through the descriptors this process
/// holds and through its mappings (`/proc/self/map_files`, where the worker keeps the blob and the buffers
/// once it has mapped them); says what each attempt got, once per file name and outcome.
fn shrink_memory_files() -> String {
    let mut reached: Vec<(String, String)> =
        descriptors().into_iter().map(|(fd, target)| (format!("/proc/self/fd/{fd}"), target)).collect();
    if let Ok(dir) = std::fs::read_dir("/proc/self/map_files") {
        for entry in dir.flatten() {
            if let Ok(target) = std::fs::read_link(entry.path()) {
                reached.push((
                    entry.path().to_string_lossy().into_owned(),
                    target.to_string_lossy().into_owned(),
                ));
            }
        }
    }
    let mut said = std::collections::BTreeSet::new();
    for (path, target) in reached {
        if !target.starts_with("/memfd:kv-delegate-") {
            continue;
        }
        let name = target.trim_start_matches("/memfd:").trim_end_matches(" (deleted)");
        let opened = std::fs::OpenOptions::new().write(true).open(&path);
        let outcome = opened.and_then(|file| file.set_len(0));
        said.insert(match outcome {
            Ok(()) => format!("{name}: shrunk"),
            Err(err) => format!("{name}: {err}"),
        });
    }
    let said: Vec<String> = said.into_iter().collect();
    format!("shrinking the host's memory files: {}", said.join("; "))
}

delegate_abi::export_delegate!(Misbehave);
