//! Plugin-side glue behind [`crate::export_delegate!`]: generic `extern "C"` entries over a [`Delegate`].
//!
//! Each entry catches panics, turns them into `Internal` errors and poisons the plugin; a poisoned plugin
//! answers every later call with `InvalidState`. The execute path allocates nothing.

use std::any::Any;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::OnceLock;

use abi_stable::prefix_type::PrefixTypeTrait;
use abi_stable::std_types::{ROption, RResult, RSlice, RStr, RString};

use crate::abi::{
    negotiate, AbiRange, DelegateRoot, DelegateRootRef, HostOfferRef, Negotiated, PluginInfoRecord,
    PluginInfoRecordRef, PluginModule, PluginModuleRef, RCompatibility, RError, ROptionValue, RSpec,
    RawHandle, Refusal,
};
use crate::delegate::{
    CudaStream, Delegate, DelegateError, ErrorCode, ExecStats, ExecuteArgs, InitContext, Spec,
};
use crate::tensor::TensorArg;

/// Per-plugin state, one `static` per exported type (written by [`crate::export_delegate!`]).
#[doc(hidden)]
pub struct PluginState<T> {
    abi: AbiRange,
    delegate: OnceLock<T>,
    info: OnceLock<PluginInfoRecordRef>,
    module: OnceLock<PluginModuleRef>,
    root: OnceLock<DelegateRootRef>,
    poisoned: AtomicBool,
    poison_message: OnceLock<String>,
    negotiated: AtomicU32,
}

impl<T> PluginState<T> {
    /// A fresh state that announces `abi`.
    pub const fn new(abi: AbiRange) -> PluginState<T> {
        PluginState {
            abi,
            delegate: OnceLock::new(),
            info: OnceLock::new(),
            module: OnceLock::new(),
            root: OnceLock::new(),
            poisoned: AtomicBool::new(false),
            poison_message: OnceLock::new(),
            negotiated: AtomicU32::new(0),
        }
    }

    /// The ABI version agreed in the latest successful handshake, `None` before any.
    pub fn negotiated_version(&self) -> Option<u32> {
        match self.negotiated.load(Ordering::Acquire) {
            0 => None,
            version => Some(version),
        }
    }
}

/// Ties a [`Delegate`] to its [`PluginState`]; implemented by [`crate::export_delegate!`].
#[doc(hidden)]
pub trait Exported: Delegate + Sized {
    /// The plugin's state.
    fn state() -> &'static PluginState<Self>;
}

/// The root module of `T`, built once and never freed (the host may call it from any thread).
#[doc(hidden)]
pub fn root_module<T: Exported>() -> DelegateRootRef {
    *T::state().root.get_or_init(|| DelegateRoot { negotiate: negotiate_entry::<T> }.leak_into_prefix())
}

fn panic_text(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".to_string()
    }
}

fn plugin_name<T: Exported>() -> String {
    match T::state().info.get() {
        Some(info) => info.name().to_string(),
        None => std::any::type_name::<T>().to_string(),
    }
}

fn poison<T: Exported>(entry: &str, payload: &(dyn Any + Send)) -> RError {
    let message = format!("panic in {entry}: {}", panic_text(payload));
    let state = T::state();
    let _ = state.poison_message.set(message.clone());
    state.poisoned.store(true, Ordering::Release);
    RError::from_delegate(DelegateError::internal(format!("plugin {} {message}", plugin_name::<T>())))
}

#[cold]
fn poisoned_error<T: Exported>() -> RError {
    let why = T::state().poison_message.get().map_or("unknown panic", String::as_str);
    RError::from_delegate(DelegateError::new(
        ErrorCode::InvalidState,
        format!("plugin {} is poisoned by an earlier panic: {why}", plugin_name::<T>()),
    ))
}

/// Runs `body` with the delegate: refuses when poisoned, builds it once, catches panics.
#[inline]
fn guarded<T: Exported, R>(
    entry: &'static str,
    body: impl FnOnce(&T) -> Result<R, DelegateError>,
) -> RResult<R, RError> {
    let state = T::state();
    if state.poisoned.load(Ordering::Acquire) {
        return RResult::RErr(poisoned_error::<T>());
    }
    match catch_unwind(AssertUnwindSafe(|| body(state.delegate.get_or_init(T::new)))) {
        Ok(Ok(value)) => RResult::ROk(value),
        Ok(Err(err)) => RResult::RErr(RError::from_delegate(err)),
        Err(payload) => RResult::RErr(poison::<T>(entry, &*payload)),
    }
}

fn info_record<T: Exported>() -> PluginInfoRecordRef {
    *T::state().info.get_or_init(|| PluginInfoRecord::from_info(T::info()).leak_into_prefix())
}

fn module<T: Exported>() -> PluginModuleRef {
    *T::state().module.get_or_init(|| {
        PluginModule {
            info: info_entry::<T>,
            is_available: is_available_entry::<T>,
            compatibility: compatibility_entry::<T>,
            init: init_entry::<T>,
            execute: execute_entry::<T>,
            destroy: destroy_entry::<T>,
            set_option: set_option_entry::<T>,
            get_option: get_option_entry::<T>,
            poison_message: poison_message_entry::<T>,
        }
        .leak_into_prefix()
    })
}

extern "C" fn negotiate_entry<T: Exported>(offer: HostOfferRef) -> RResult<Negotiated, Refusal> {
    let plugin_range = T::state().abi;
    let result = catch_unwind(AssertUnwindSafe(|| {
        let version = negotiate(offer.abi(), plugin_range).map_err(|err| err.to_string())?;
        // Metadata first: a plugin whose `info` panics is refused here, before the host sees a table.
        let _ = info_record::<T>();
        if offer.forward_logs() {
            crate::logging::install_forwarder(offer.log(), offer.log_enabled());
        }
        T::state().negotiated.store(version, Ordering::Release);
        tracing::debug!(version, host = %offer.abi(), plugin = %plugin_range, "negotiated the delegate ABI");
        Ok::<_, String>(Negotiated { version, plugin_range, module: module::<T>() })
    }));
    match result {
        Ok(Ok(negotiated)) => RResult::ROk(negotiated),
        Ok(Err(message)) => RResult::RErr(Refusal { plugin_range, message: message.into() }),
        Err(payload) => {
            let err = poison::<T>("negotiate", &*payload);
            RResult::RErr(Refusal { plugin_range, message: err.message })
        }
    }
}

extern "C" fn info_entry<T: Exported>() -> PluginInfoRecordRef {
    info_record::<T>()
}

extern "C" fn is_available_entry<T: Exported>() -> RResult<bool, RError> {
    guarded::<T, _>("is_available", |d| Ok(d.is_available()))
}

extern "C" fn compatibility_entry<T: Exported>(blob: RSlice<'_, u8>) -> RResult<RCompatibility, RError> {
    guarded::<T, _>("compatibility", |d| Ok(d.compatibility(blob.as_slice()).into()))
}

fn specs<'a>(raw: RSlice<'a, RSpec<'a>>) -> Vec<Spec<'a>> {
    raw.as_slice().iter().map(|s| Spec { key: s.key.as_str(), value: s.value.as_slice() }).collect()
}

extern "C" fn init_entry<T: Exported>(
    blob: RSlice<'_, u8>,
    compile_specs: RSlice<'_, RSpec<'_>>,
    runtime_specs: RSlice<'_, RSpec<'_>>,
) -> RResult<RawHandle, RError> {
    guarded::<T, _>("init", |d| {
        let compile = specs(compile_specs);
        let runtime = specs(runtime_specs);
        let ctx = InitContext { blob: blob.as_slice(), compile_specs: &compile, runtime_specs: &runtime };
        let handle = d.init(ctx)?;
        Ok(RawHandle(Box::into_raw(Box::new(handle)).cast::<c_void>()))
    })
}

extern "C" fn execute_entry<T: Exported>(
    handle: RawHandle,
    args: RSlice<'_, TensorArg>,
    stream: *mut c_void,
    stats: &mut ExecStats,
) -> RResult<(), RError> {
    guarded::<T, _>("execute", |d| {
        if handle.0.is_null() {
            return Err(DelegateError::new(
                ErrorCode::DelegateInvalidHandle,
                "execute called with a null handle",
            ));
        }
        // SAFETY: the host passes only handles returned by `init_entry::<T>` of this plugin and not yet
        // destroyed (`host::Instance` owns the handle and takes `&mut self`), so this is a live, exclusively
        // borrowed `Box<T::Handle>`.
        let handle = unsafe { &mut *handle.0.cast::<T::Handle>() };
        let stream = if stream.is_null() { None } else { Some(CudaStream(stream)) };
        // SAFETY: the host builds `args` with `host::ArgList`, whose construction upholds `ExecuteArgs::new`'s
        // contract (host memory borrowed for the call, writable only when exclusively borrowed, sharing only
        // between an inout and its in-place output), or with `ArgList::push_raw`, whose caller promised it.
        let mut args = unsafe { ExecuteArgs::new(args.as_slice(), stream, stats) };
        d.execute(handle, &mut args)
    })
}

extern "C" fn destroy_entry<T: Exported>(handle: RawHandle) -> RResult<(), RError> {
    // Not refused when poisoned: freeing is always safe to attempt, and a panic here is caught again.
    let state = T::state();
    let result = catch_unwind(AssertUnwindSafe(|| {
        if handle.0.is_null() {
            return;
        }
        // SAFETY: as in `execute_entry`; the host calls destroy once per handle and never uses it afterwards,
        // so ownership of the box returns here.
        let handle = unsafe { Box::from_raw(handle.0.cast::<T::Handle>()) };
        match state.delegate.get() {
            Some(d) => d.destroy(*handle),
            None => drop(handle),
        }
    }));
    match result {
        Ok(()) => RResult::ROk(()),
        Err(payload) => RResult::RErr(poison::<T>("destroy", &*payload)),
    }
}

extern "C" fn set_option_entry<T: Exported>(key: RStr<'_>, value: ROptionValue) -> RResult<(), RError> {
    guarded::<T, _>("set_option", |d| d.set_option(key.as_str(), value.into()))
}

extern "C" fn get_option_entry<T: Exported>(key: RStr<'_>) -> RResult<ROptionValue, RError> {
    guarded::<T, _>("get_option", |d| d.get_option(key.as_str()).map(ROptionValue::from))
}

extern "C" fn poison_message_entry<T: Exported>() -> ROption<RString> {
    let state = T::state();
    if state.poisoned.load(Ordering::Acquire) {
        ROption::RSome(state.poison_message.get().map_or("unknown panic", String::as_str).into())
    } else {
        ROption::RNone
    }
}
