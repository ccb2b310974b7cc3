//! Our delegates for a C or C++ ExecuTorch 1.5.1 application: this crate builds `libkv_delegate.a` and
//! `libkv_delegate.so`, whose C functions (declared in `include/kv_delegate.h`) register the reference delegate,
//! the CUDA delegate (where a driver and a GPU are) and the plugin libraries in `DELEGATE_PLUGIN_PATH` in
//! ExecuTorch's backend registry through `executorch-bridge`, and check a program's bytes before ExecuTorch
//! loads them. The application then loads and runs programs with ExecuTorch's own API.
//!
//! The C functions:
//!
//! | function | what it does |
//! |---|---|
//! | `kvd_register_backends()` | registers once; returns ExecuTorch's error code (0 is `Error::Ok`) |
//! | `kvd_check_program(data, len)` | checks a program's bytes before ExecuTorch loads exactly those bytes: a delegate output in the program's constant data is `InvalidProgram` ([`check`]) |
//! | `kvd_backend_count()`, `kvd_backend_name(i)` | the backend ids registered |
//! | `kvd_version()` | this library's version (the header's `KVD_VERSION`) |
//! | `kvd_last_error(buf, cap)` | the message of the calling thread's last failure: registration, the check, a sampler or stop checker call, or a delegate's `init`/`execute` |
//! | `kvd_sampler_new(...)`, `kvd_sampler_sample(...)`, `kvd_sampler_free(s)` | picks each token from the logits the application's `Module` returned: repetition penalty, temperature, top-k, top-p, min-p and a seed, the arithmetic of `delegate-host run` and `et-run` ([`generation`]) |
//! | `kvd_stop_checker_new(...)`, `kvd_stop_checker_push(...)`, `kvd_stop_checker_free(c)` | ends a reply at an end-of-sequence id, a stop string or a token budget |
//!
//! `docs/cpp.md` is the guide (link lines for the static and the shared library, the run-time library path, the
//! errors); `examples/cpp/decode.cpp` is a whole application (decoding through ExecuTorch's `Module`, each token
//! picked by `kvd_sampler_sample` and the reply ended by `kvd_stop_checker_push`),
//! built and run against a committed `.pte` by this crate's test `cpp_example`.
//!
//! ## Examples
//!
//! The same calls from Rust (a C program calls the same symbols through the header):
//!
//! ```no_run
//! let code = kv_delegate::kvd_register_backends();
//! assert_eq!(code, 0, "{}", kv_delegate::last_error().unwrap_or_default());
//! let ids: Vec<String> = kv_delegate::registered().iter().map(|id| id.to_string_lossy().into_owned()).collect();
//! assert!(ids.iter().any(|id| id == "ReferenceBackend"));
//! // Before ExecuTorch loads a program: check the bytes it will load (the safe function behind
//! // `kvd_check_program`).
//! let bytes = std::fs::read("fixtures/executorch/buffers_2m_planned.pte").expect("a program");
//! kv_delegate::check::check_program(&bytes).expect("a program ExecuTorch may load");
//! ```
//!
//! ## Logging
//!
//! Registering routes ExecuTorch's log messages into `tracing` (the bridge does), and this library prints
//! `tracing` to stderr at level `warn` (ExecuTorch's errors, a delegate's failures), or as the `KVD_LOG`
//! environment variable says (`tracing_subscriber`'s `EnvFilter` syntax: `KVD_LOG=off`, `KVD_LOG=info`),
//! unless the process already set a `tracing` subscriber.
//!
//! ## Unsafe code
//!
//! Only in the private `ffi` and `generation_ffi` modules (the exported `#[no_mangle]` functions, the caller's
//! buffer in `kvd_last_error`, the caller's program bytes in `kvd_check_program`, the caller's logits, ids and
//! strings and the handles it owns in the sampler and stop-checker functions), every block with a
//! `// SAFETY:` comment; the rest of the crate denies `unsafe_code`.
//!
//! ## Feature Flags
//!
//! None.
#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod check;
mod ffi;
pub mod generation;
mod generation_ffi;
mod registration;

pub use ffi::{
    kvd_backend_count, kvd_backend_name, kvd_check_program, kvd_last_error, kvd_register_backends,
    kvd_version,
};
pub use generation_ffi::{
    kvd_sampler_free, kvd_sampler_new, kvd_sampler_sample, kvd_stop_checker_free, kvd_stop_checker_new,
    kvd_stop_checker_push, KvdSampler, KvdStopChecker,
};
pub use registration::{last_error, registered, VERSION};
