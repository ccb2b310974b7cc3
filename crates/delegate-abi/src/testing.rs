//! Test support (feature `test-support`): delegates in a few lines, for tests, benchmarks and test plugins.
//!
//! A test delegate is usually "metadata, plus perhaps one behaviour". Implement [`Fixture`] for a marker type
//! (only [`Fixture::info`] is required) and export [`Scripted`] over it; [`info`] gives the metadata most
//! tests need. [`Scripted`] also misbehaves on request, chosen per instance by compile specs, so tests
//! running in parallel against one loaded library do not disturb each other:
//!
//! | where | key | value | effect |
//! |---|---|---|---|
//! | compile spec | `init` | `panic` | `init` panics |
//! | compile spec | `init` | `fail:<code>` | `init` fails with ExecuTorch code `<code>` (decimal) |
//! | compile spec | `execute` | `noop` (default) | `execute` runs [`Fixture::execute`] (by default: nothing) |
//! | compile spec | `execute` | `panic` | `execute` panics |
//! | compile spec | `execute` | `fail:<code>` | `execute` fails with code `<code>` |
//! | compile spec | `execute` | `fill:<byte>` | `execute` writes `<byte>` into every writable argument |
//! | option | `panic` | any | `set_option` panics |
//! | option (get) | `executions` | | number of successful `execute` calls so far |
//!
//! Other options go to [`Fixture::set_option`].
//!
//! ```
//! use delegate_abi::host::Plugin;
//! use delegate_abi::testing::{self, Fixture, Scripted};
//! use delegate_abi::PluginInfo;
//!
//! struct Future;
//! impl Fixture for Future {
//!     fn info() -> PluginInfo {
//!         testing::info("future", "FutureBackend")
//!     }
//! }
//! delegate_abi::export_delegate!(@embedded Scripted<Future>, abi = 2..=3);
//!
//! let err = Plugin::embedded(delegate_root()).unwrap_err();
//! assert_eq!(err.to_string(), "plugin speaks ABI 2..=3, host 1..=1");
//! ```

use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::delegate::{
    Compatibility, Delegate, DelegateError, ErrorCode, ExecuteArgs, InitContext, OptionValue, PluginInfo,
};
use crate::tensor::MemoryKind;

/// Metadata for a test delegate: `name`, version `0.1.0`, one backend id, no wire formats, host memory,
/// aliased outputs bound in place, no capabilities stated ([`crate::Capabilities::default`]). Change it with the
/// `with_*` methods, or set a field.
pub fn info(name: &str, backend: &str) -> PluginInfo {
    PluginInfo::new(name, "0.1.0")
        .with_backend(backend)
        .with_memory_kinds([MemoryKind::Host])
        .with_binds_aliases_in_place(true)
}

/// What makes one test delegate differ from another; everything but [`Fixture::info`] has a default.
pub trait Fixture: 'static {
    /// The metadata ([`Delegate::info`]).
    fn info() -> PluginInfo;

    /// [`Delegate::availability`]; the default is available.
    fn availability() -> Result<(), DelegateError> {
        Ok(())
    }

    /// [`Delegate::compatibility`]; the default supports every blob.
    fn compatibility(blob: &[u8]) -> Compatibility {
        let _ = blob;
        Compatibility::Supported
    }

    /// Runs first in [`Delegate::init`], before the compile specs are read; the default accepts.
    fn init(ctx: &InitContext<'_>) -> Result<(), DelegateError> {
        let _ = ctx;
        Ok(())
    }

    /// What `execute` does when no compile spec says otherwise; the default does nothing.
    fn execute(args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
        let _ = args;
        Ok(())
    }

    /// Options other than `panic`; the default knows none.
    fn set_option(key: &str, value: OptionValue) -> Result<(), DelegateError> {
        Err(DelegateError::new(ErrorCode::NotFound, format!("unknown option '{key}' = {value:?}")))
    }
}

/// What an instance of [`Scripted`] does in `execute`, from its `execute` compile spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Behaviour {
    /// Runs [`Fixture::execute`].
    Noop,
    /// Panics.
    Panic,
    /// Fails with the code.
    Fail(u32),
    /// Fills every writable argument with the byte.
    Fill(u8),
}

fn parse_behaviour(key: &str, value: &[u8]) -> Result<Behaviour, DelegateError> {
    let text = std::str::from_utf8(value)
        .map_err(|_| DelegateError::invalid_argument(format!("compile spec '{key}' is not UTF-8")))?;
    let bad = || DelegateError::invalid_argument(format!("compile spec '{key}': cannot parse '{text}'"));
    Ok(match text.split_once(':') {
        None if text == "noop" => Behaviour::Noop,
        None if text == "panic" => Behaviour::Panic,
        Some(("fail", code)) => Behaviour::Fail(code.parse().map_err(|_| bad())?),
        Some(("fill", byte)) => Behaviour::Fill(byte.parse().map_err(|_| bad())?),
        _ => return Err(bad()),
    })
}

/// A delegate made of a [`Fixture`] and the scripted behaviours of the module docs.
#[derive(Debug)]
pub struct Scripted<F> {
    name: String,
    executions: AtomicU64,
    _fixture: PhantomData<fn() -> F>,
}

/// One instance of [`Scripted`]: what its `execute` does.
#[derive(Debug)]
pub struct ScriptedHandle {
    execute: Behaviour,
}

impl ScriptedHandle {
    /// What `execute` does.
    pub fn behaviour(&self) -> Behaviour {
        self.execute
    }
}

impl<F: Fixture> Delegate for Scripted<F> {
    type Handle = ScriptedHandle;

    fn new() -> Self {
        Scripted { name: F::info().name, executions: AtomicU64::new(0), _fixture: PhantomData }
    }

    fn info() -> PluginInfo {
        F::info()
    }

    fn availability(&self) -> Result<(), DelegateError> {
        F::availability()
    }

    fn compatibility(&self, blob: &[u8]) -> Compatibility {
        F::compatibility(blob)
    }

    fn init(&self, ctx: InitContext<'_>) -> Result<ScriptedHandle, DelegateError> {
        F::init(&ctx)?;
        let mut execute = Behaviour::Noop;
        for spec in ctx.compile_specs {
            match spec.key {
                "init" => match parse_behaviour(spec.key, spec.value)? {
                    Behaviour::Panic => panic!("{}: init panics as asked", self.name),
                    Behaviour::Fail(code) => {
                        return Err(DelegateError::new(
                            ErrorCode::from_u32(code),
                            format!("{}: init fails as asked", self.name),
                        ))
                    }
                    Behaviour::Noop | Behaviour::Fill(_) => {}
                },
                "execute" => execute = parse_behaviour(spec.key, spec.value)?,
                other => {
                    return Err(DelegateError::invalid_argument(format!(
                        "{}: unknown compile spec '{other}'",
                        self.name
                    )))
                }
            }
        }
        Ok(ScriptedHandle { execute })
    }

    fn execute(&self, handle: &mut ScriptedHandle, args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
        match handle.execute {
            Behaviour::Noop => F::execute(args)?,
            Behaviour::Panic => panic!("{}: execute panics as asked", self.name),
            Behaviour::Fail(code) => {
                return Err(DelegateError::new(
                    ErrorCode::from_u32(code),
                    format!("{}: execute fails as asked", self.name),
                ))
            }
            Behaviour::Fill(byte) => {
                for index in 0..args.len() {
                    if args.arg(index)?.is_writable() {
                        let ([], [bytes]) = args.borrow([], [index])?;
                        bytes.fill(byte);
                    }
                }
            }
        }
        self.executions.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn set_option(&self, key: &str, value: OptionValue) -> Result<(), DelegateError> {
        match key {
            "panic" => panic!("{}: set_option panics as asked", self.name),
            _ => F::set_option(key, value),
        }
    }

    fn get_option(&self, key: &str) -> Result<OptionValue, DelegateError> {
        match key {
            "executions" => Ok(OptionValue::Int(self.executions.load(Ordering::Relaxed) as i64)),
            _ => Err(DelegateError::new(ErrorCode::NotFound, format!("unknown option '{key}'"))),
        }
    }
}

thread_local! {
    static ALLOCATIONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A global allocator that counts the calling thread's allocations and reallocations (forwarding to the
/// system allocator), for tests that check a path allocates nothing. Install it in the test binary:
///
/// ```text
/// #[global_allocator]
/// static GLOBAL: delegate_abi::testing::CountingAllocator = delegate_abi::testing::CountingAllocator;
/// ```
///
/// and compare [`allocations`] before and after.
#[derive(Debug, Default, Clone, Copy)]
pub struct CountingAllocator;

/// Allocations and reallocations this thread made through [`CountingAllocator`] so far.
pub fn allocations() -> u64 {
    ALLOCATIONS.with(std::cell::Cell::get)
}

// SAFETY: forwards every call to `System` unchanged, only counting in a const-initialised thread-local (which
// allocates nothing).
unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { std::alloc::System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: same contract as ours.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as ours.
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}
