//! Plugin-side glue behind [`crate::export_delegate!`]: generic `extern "C"` entries over a [`Delegate`].
//!
//! Each entry catches panics, turns them into `Internal` errors and poisons the plugin; a poisoned plugin
//! answers every later call with `InvalidState`. The execute path allocates nothing.
//!
//! The entries are generic over an [`Exported`] *marker*, a type the macro declares next to the state, not
//! over the delegate type itself: so any crate may export any delegate (a thin cdylib crate exports the
//! delegate of an rlib crate it depends on, which the orphan rule would forbid for a trait impl on the
//! delegate type), and one binary may embed several.

use std::any::Any;
use std::cell::Cell;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Once, OnceLock};

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

/// Ties a [`Delegate`] to its [`PluginState`]: implemented by [`crate::export_delegate!`] for a marker type
/// it declares.
#[doc(hidden)]
pub trait Exported: 'static {
    /// The exported delegate.
    type Delegate: Delegate;

    /// The plugin's state.
    fn state() -> &'static PluginState<Self::Delegate>;
}

/// The root module of `E`'s delegate, built once and never freed (the host may call it from any thread).
#[doc(hidden)]
pub fn root_module<E: Exported>() -> DelegateRootRef {
    *E::state().root.get_or_init(|| DelegateRoot { negotiate: negotiate_entry::<E> }.leak_into_prefix())
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

fn plugin_name<E: Exported>() -> String {
    match E::state().info.get() {
        Some(info) => info.name().to_string(),
        None => std::any::type_name::<E::Delegate>().to_string(),
    }
}

fn poison<E: Exported>(entry: &str, payload: &(dyn Any + Send)) -> RError {
    let message = format!("panic in {entry}: {}", panic_text(payload));
    let state = E::state();
    let _ = state.poison_message.set(message.clone());
    state.poisoned.store(true, Ordering::Release);
    RError::from_delegate(DelegateError::internal(format!("plugin {} {message}", plugin_name::<E>())))
}

#[cold]
fn poisoned_error<E: Exported>() -> RError {
    let why = E::state().poison_message.get().map_or("unknown panic", String::as_str);
    RError::from_delegate(DelegateError::new(
        ErrorCode::InvalidState,
        format!("plugin {} is poisoned by an earlier panic: {why}", plugin_name::<E>()),
    ))
}

/// Runs `body` with the delegate: refuses when poisoned, builds it once, catches panics.
#[inline]
fn guarded<E: Exported, R>(
    entry: &'static str,
    body: impl FnOnce(&E::Delegate) -> Result<R, DelegateError>,
) -> RResult<R, RError> {
    let state = E::state();
    if state.poisoned.load(Ordering::Acquire) {
        return RResult::RErr(poisoned_error::<E>());
    }
    install_quiet_panic_hook();
    let previous = IN_PLUGIN_CALL.with(|flag| flag.replace(true));
    let result = catch_unwind(AssertUnwindSafe(|| body(state.delegate.get_or_init(E::Delegate::new))));
    IN_PLUGIN_CALL.with(|flag| flag.set(previous));
    match result {
        Ok(Ok(value)) => RResult::ROk(value),
        Ok(Err(err)) => RResult::RErr(RError::from_delegate(err)),
        Err(payload) => RResult::RErr(poison::<E>(entry, &*payload)),
    }
}

thread_local! {
    /// Whether this thread is inside a guarded plugin entry, where a panic is caught and becomes an error.
    static IN_PLUGIN_CALL: Cell<bool> = const { Cell::new(false) };
}

/// Installs, once per copy of the standard library (a dylib plugin has its own, an embedded plugin shares the
/// host's), a panic hook that keeps caught plugin panics off stderr: the host reports them as one `Internal`
/// error carrying the panic message, so the default hook's text and backtrace hint would only be noise. The
/// text goes to the log (`debug`, target `delegate_abi::panic`); every other panic goes to the hook that was
/// there before.
fn install_quiet_panic_hook() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_PLUGIN_CALL.with(Cell::get) {
                tracing::debug!(target: "delegate_abi::panic", "caught plugin panic: {info}");
            } else {
                previous(info);
            }
        }));
    });
}

fn info_record<E: Exported>() -> PluginInfoRecordRef {
    *E::state().info.get_or_init(|| PluginInfoRecord::from_info(E::Delegate::info()).leak_into_prefix())
}

fn module<E: Exported>() -> PluginModuleRef {
    *E::state().module.get_or_init(|| {
        PluginModule {
            info: info_entry::<E>,
            is_available: is_available_entry::<E>,
            compatibility: compatibility_entry::<E>,
            init: init_entry::<E>,
            execute: execute_entry::<E>,
            destroy: destroy_entry::<E>,
            set_option: set_option_entry::<E>,
            get_option: get_option_entry::<E>,
            poison_message: poison_message_entry::<E>,
            keeps_sequence_state: keeps_sequence_state_entry::<E>,
        }
        .leak_into_prefix()
    })
}

extern "C" fn negotiate_entry<E: Exported>(offer: HostOfferRef) -> RResult<Negotiated, Refusal> {
    let plugin_range = E::state().abi;
    // A panic in `info` is caught below and refuses the handshake: keep its text off stderr too.
    install_quiet_panic_hook();
    let previous = IN_PLUGIN_CALL.with(|flag| flag.replace(true));
    let result = catch_unwind(AssertUnwindSafe(|| {
        let version = negotiate(offer.abi(), plugin_range).map_err(|err| err.to_string())?;
        // Metadata first: a plugin whose `info` panics is refused here, before the host sees a table.
        let _ = info_record::<E>();
        if offer.forward_logs() {
            crate::logging::install_forwarder(offer.log(), offer.log_enabled());
        }
        E::state().negotiated.store(version, Ordering::Release);
        tracing::debug!(version, host = %offer.abi(), plugin = %plugin_range, "negotiated the delegate ABI");
        Ok::<_, String>(Negotiated { version, plugin_range, module: module::<E>() })
    }));
    IN_PLUGIN_CALL.with(|flag| flag.set(previous));
    match result {
        Ok(Ok(negotiated)) => RResult::ROk(negotiated),
        Ok(Err(message)) => RResult::RErr(Refusal { plugin_range, message: message.into() }),
        Err(payload) => {
            let err = poison::<E>("negotiate", &*payload);
            RResult::RErr(Refusal { plugin_range, message: err.message })
        }
    }
}

extern "C" fn info_entry<E: Exported>() -> PluginInfoRecordRef {
    info_record::<E>()
}

extern "C" fn is_available_entry<E: Exported>() -> RResult<bool, RError> {
    // An unavailable delegate answers with its reason; `false` without a reason is what older plugins say.
    guarded::<E, _>("is_available", |d| d.availability().map(|()| true))
}

extern "C" fn compatibility_entry<E: Exported>(blob: RSlice<'_, u8>) -> RResult<RCompatibility, RError> {
    guarded::<E, _>("compatibility", |d| Ok(d.compatibility(blob.as_slice()).into()))
}

fn specs<'a>(raw: RSlice<'a, RSpec<'a>>) -> Vec<Spec<'a>> {
    raw.as_slice().iter().map(|s| Spec { key: s.key.as_str(), value: s.value.as_slice() }).collect()
}

extern "C" fn init_entry<E: Exported>(
    blob: RSlice<'_, u8>,
    compile_specs: RSlice<'_, RSpec<'_>>,
    runtime_specs: RSlice<'_, RSpec<'_>>,
) -> RResult<RawHandle, RError> {
    guarded::<E, _>("init", |d| {
        let compile = specs(compile_specs);
        let runtime = specs(runtime_specs);
        let ctx = InitContext { blob: blob.as_slice(), compile_specs: &compile, runtime_specs: &runtime };
        let handle = d.init(ctx)?;
        Ok(RawHandle::new(Box::into_raw(Box::new(handle)).cast::<c_void>()))
    })
}

/// Checks the codes of every argument from the other side, once per call, so the delegate reads them
/// infallibly (see `tensor`'s module docs). Allocates only on failure.
#[inline]
fn check_codes(args: &[TensorArg]) -> Result<(), DelegateError> {
    for (position, arg) in args.iter().enumerate() {
        if let Err(err) = arg.check_codes() {
            return Err(DelegateError::invalid_argument(format!("argument {position}: {err}")));
        }
    }
    Ok(())
}

/// # Safety
/// [`PluginModule::execute`]'s contract.
unsafe extern "C" fn execute_entry<E: Exported>(
    handle: RawHandle,
    args: RSlice<'_, TensorArg>,
    stream: *mut c_void,
    stats: &mut ExecStats,
) -> RResult<(), RError> {
    guarded::<E, _>("execute", |d| {
        if handle.as_ptr().is_null() {
            return Err(DelegateError::new(
                ErrorCode::DelegateInvalidHandle,
                "execute called with a null handle",
            ));
        }
        let args = args.as_slice();
        check_codes(args)?;
        // SAFETY: the caller passes a handle returned by `init_entry::<E>` of this plugin and not yet
        // destroyed, used by no other call now (`PluginModule::execute`'s contract; `host::Instance` owns the
        // handle and takes `&mut self`), so this is a live, exclusively borrowed `Box<E::Delegate::Handle>`.
        let handle = unsafe { &mut *handle.as_ptr().cast::<<E::Delegate as Delegate>::Handle>() };
        // SAFETY: a non-null `stream` is a valid CUDA stream whose caller obeys the completion rule
        // (`PluginModule::execute`'s contract), which is `CudaStream::from_raw`'s.
        let stream = unsafe { CudaStream::from_raw(stream) };
        // SAFETY: `args` satisfies `ExecuteArgs::new`'s contract (`PluginModule::execute`'s, upheld by
        // `host::ArgList`), and its codes were checked just above.
        let mut args = unsafe { ExecuteArgs::new(args, stream, stats) };
        d.execute(handle, &mut args)
    })
}

/// # Safety
/// [`PluginModule::keeps_sequence_state`]'s contract.
unsafe extern "C" fn keeps_sequence_state_entry<E: Exported>(handle: RawHandle) -> RResult<u8, RError> {
    guarded::<E, _>("keeps_sequence_state", |d| {
        if handle.as_ptr().is_null() {
            return Err(DelegateError::new(
                ErrorCode::DelegateInvalidHandle,
                "keeps_sequence_state called with a null handle",
            ));
        }
        // SAFETY: the caller passes a handle returned by `init_entry::<E>` of this plugin and not yet
        // destroyed, used by no other call now (`PluginModule::keeps_sequence_state`'s contract), so this is a
        // live `Box<E::Delegate::Handle>`, borrowed shared for the call.
        let handle = unsafe { &*handle.as_ptr().cast::<<E::Delegate as Delegate>::Handle>() };
        Ok(u8::from(d.keeps_sequence_state(handle)))
    })
}

/// # Safety
/// [`PluginModule::destroy`]'s contract.
unsafe extern "C" fn destroy_entry<E: Exported>(handle: RawHandle) -> RResult<(), RError> {
    // Not refused when poisoned: freeing is always safe to attempt, and a panic here is caught again.
    let state = E::state();
    let result = catch_unwind(AssertUnwindSafe(|| {
        if handle.as_ptr().is_null() {
            return;
        }
        // SAFETY: the caller passes a handle `init_entry::<E>` returned, destroys it once and never uses it
        // afterwards (`PluginModule::destroy`'s contract), so ownership of the box returns here.
        let handle = unsafe { Box::from_raw(handle.as_ptr().cast::<<E::Delegate as Delegate>::Handle>()) };
        match state.delegate.get() {
            Some(d) => d.destroy(*handle),
            None => drop(handle),
        }
    }));
    match result {
        Ok(()) => RResult::ROk(()),
        Err(payload) => RResult::RErr(poison::<E>("destroy", &*payload)),
    }
}

extern "C" fn set_option_entry<E: Exported>(key: RStr<'_>, value: ROptionValue) -> RResult<(), RError> {
    guarded::<E, _>("set_option", |d| d.set_option(key.as_str(), value.into()))
}

extern "C" fn get_option_entry<E: Exported>(key: RStr<'_>) -> RResult<ROptionValue, RError> {
    guarded::<E, _>("get_option", |d| d.get_option(key.as_str()).map(ROptionValue::from))
}

extern "C" fn poison_message_entry<E: Exported>() -> ROption<RString> {
    let state = E::state();
    if state.poisoned.load(Ordering::Acquire) {
        ROption::RSome(state.poison_message.get().map_or("unknown panic", String::as_str).into())
    } else {
        ROption::RNone
    }
}
