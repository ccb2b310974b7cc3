//! A shared library that aborts the process the moment the dynamic loader opens it, before any plugin entry
//! could be looked up: a constructor in `.init_array`, as native libraries have. It is the fixture for
//! discovery without loading (`host_runtime::plugins::Registry::discover`): listing plugins, and
//! running a program that does not need this library, must not open it.
//!
//! ```text
//! cargo build -p crash-on-load      # target/debug/libcrash_on_load.so
//! ```
//!
//! ## Feature Flags
//!
//! None.
#![deny(missing_docs)]

/// Runs when the library is loaded; ends the process.
extern "C" fn abort_on_load() {
    std::process::abort();
}

// The loader calls every function pointer in `.init_array` when it opens the library.
#[used]
#[link_section = ".init_array"]
static ABORT_ON_LOAD: extern "C" fn() = abort_on_load;
