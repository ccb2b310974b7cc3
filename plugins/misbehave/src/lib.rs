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
//!
//! ```text
//! cargo build -p misbehave-delegate     # target/debug/libmisbehave_delegate.so
//! ```
//!
//! ## Feature Flags
//!
//! None.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

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
        PluginInfo { name: "misbehave-delegate".to_owned(), ..ReferenceDelegate::info() }
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
            _ => self.0.execute(handle, args),
        }
    }
}

delegate_abi::export_delegate!(Misbehave);
