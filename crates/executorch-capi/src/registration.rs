//! What `kvd_register_backends` does, in safe code: the plugins an application of this library gets, their
//! registration once per process, the ids registered, and the calling thread's last failure.

use std::cell::RefCell;
use std::ffi::{CStr, CString};
use std::sync::{Mutex, OnceLock, PoisonError};

use delegate_abi::host::HostConfig;
use et_error::{ErrorCode, HasErrorCode};
use host_runtime::isolate::Isolation;
use host_runtime::plugins::{Discovery, Registry};

/// This library's version, as `kvd_version()` returns it (and as the header's `KVD_VERSION` says).
pub const VERSION: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(version) => version,
        Err(_) => panic!("a crate version has no NUL byte"),
    };

/// The environment variable that sets what this library logs to stderr (`tracing_subscriber`'s filter).
const LOG_ENV: &str = "KVD_LOG";

/// The backend ids registered, set once by the first registration that succeeds.
static REGISTERED: OnceLock<Vec<CString>> = OnceLock::new();

thread_local! {
    static LAST_ERROR: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// The backend ids `kvd_register_backends` registered (empty before it succeeded).
pub fn registered() -> &'static [CString] {
    REGISTERED.get().map_or(&[], Vec::as_slice)
}

/// The calling thread's last failure: of `kvd_register_backends` or `kvd_check_program`, or, newer, of a
/// delegate's `init` or `execute` under ExecuTorch (the bridge's message). It stays until the next failure on
/// this thread, or until `kvd_last_error` copied it whole.
pub fn last_error() -> Option<String> {
    let newer = executorch_bridge::take_last_error();
    LAST_ERROR.with(|last| {
        let mut last = last.borrow_mut();
        if newer.is_some() {
            *last = newer;
        }
        last.clone()
    })
}

/// Forgets the calling thread's last failure (`kvd_last_error` copied it whole).
pub(crate) fn forget_last_error() {
    LAST_ERROR.with(|last| *last.borrow_mut() = None);
}

/// Records `message` as the calling thread's last failure.
pub(crate) fn record(message: String) {
    // A message the bridge kept from before this failure is older: it must not replace this one.
    let _ = executorch_bridge::take_last_error();
    LAST_ERROR.with(|last| *last.borrow_mut() = Some(message));
}

/// Registers the backends once per process (a failed attempt may be retried); ExecuTorch's code on failure,
/// its message recorded as this thread's last error.
pub(crate) fn register() -> ErrorCode {
    static LOCK: Mutex<()> = Mutex::new(());
    let _serial = LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    if REGISTERED.get().is_some() {
        return ErrorCode::Ok;
    }
    log_to_stderr();
    match executorch_bridge::register(&registry()) {
        Ok(ids) => {
            // The bridge handed each id to ExecuTorch as a C string, so none holds a NUL byte.
            let _ = REGISTERED.set(ids.into_iter().filter_map(|id| CString::new(id).ok()).collect());
            ErrorCode::Ok
        }
        Err(err) => {
            let code = err.error_code();
            record(format!("kvd_register_backends: {err}"));
            code
        }
    }
}

/// The plugins this library serves: `DELEGATE_PLUGIN_PATH`'s libraries (listed from their manifests, loaded
/// only for an id they serve), then the reference and CUDA delegates linked into it.
///
/// Isolation requests are honoured, never dropped (as `et-run` does): a library whose manifest asks to run in a
/// worker process is served isolated, which the bridge refuses, naming it, rather than passing it over for an
/// embedded delegate. No worker is ever started, so the worker command is never run.
fn registry() -> Registry {
    let config = HostConfig::default();
    let discovery = Discovery::new().use_env(true).isolation(Isolation::new("delegate-host", ["worker"]));
    Registry::discover(discovery)
        .with_embedded(reference_delegate::delegate_root(), &config)
        .with_embedded(cuda_delegate::delegate_root(), &config)
}

/// Prints `tracing` (ExecuTorch's log, which the bridge routes there, and the delegates' failures) to stderr
/// at `warn`, or as `KVD_LOG` says, unless the process set a subscriber already.
fn log_to_stderr() {
    let filter = tracing_subscriber::EnvFilter::try_from_env(LOG_ENV)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .try_init();
}
