//! Plugin logs to the host's `tracing` subscriber.
//!
//! A plugin dylib links its own copy of `tracing`, whose global dispatcher the host never sees. In the
//! handshake the host offers two callbacks; the plugin glue installs [`Forwarder`] as the dylib's global
//! subscriber, which formats each event and calls back. The host side ([`host_log`]) re-emits the record
//! with the plugin's level and target, through one leaked callsite per distinct `(level, target)` (at most
//! [`MAX_CALLSITES`], later targets fall back to `delegate_plugin`), so the host's filters see real targets.
//!
//! A plugin linked into the host (embedded) shares the host's `tracing` and gets no callbacks.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use abi_stable::std_types::RStr;
use tracing::callsite::{Callsite, Identifier};
use tracing::field::{Field, FieldSet, Visit};
use tracing::metadata::Kind;
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};

use crate::abi::{LogEnabledFn, LogFn, LogLevel};

/// Most distinct `(level, target)` pairs the host creates callsites for.
pub const MAX_CALLSITES: usize = 1024;

/// Target used once [`MAX_CALLSITES`] is reached.
const FALLBACK_TARGET: &str = "delegate_plugin";

// ---------------------------------------------------------------- plugin side

/// The subscriber a plugin dylib installs: forwards every enabled event to the host.
pub(crate) struct Forwarder {
    log: LogFn,
    enabled: LogEnabledFn,
}

/// Installs the forwarder as this copy of `tracing`'s global default, once; later calls do nothing.
pub(crate) fn install_forwarder(log: LogFn, enabled: LogEnabledFn) {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        // Fails only if something in this dylib already set a global subscriber; then that one wins.
        let _ = tracing::subscriber::set_global_default(Forwarder { log, enabled });
    });
}

struct MessageVisitor<'a> {
    out: &'a mut String,
}

impl Visit for MessageVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            let _ = write!(self.out, "{value}");
        } else {
            let _ = write!(self.out, " {}={value:?}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.out, "{value:?}");
        } else {
            let _ = write!(self.out, " {}={value:?}", field.name());
        }
    }
}

impl Subscriber for Forwarder {
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if metadata.is_span() {
            Interest::never()
        } else {
            Interest::sometimes()
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        if metadata.is_span() {
            return false;
        }
        (self.enabled)(LogLevel::from_tracing(metadata.level()) as u8, metadata.target().into())
    }

    fn new_span(&self, _span: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _span: &Id, _values: &Record<'_>) {}

    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut message = String::new();
        event.record(&mut MessageVisitor { out: &mut message });
        let meta = event.metadata();
        // Drop the leading space when an event has fields but no message.
        let text = message.strip_prefix(' ').unwrap_or(&message);
        (self.log)(LogLevel::from_tracing(meta.level()) as u8, meta.target().into(), text.into());
    }

    fn enter(&self, _span: &Id) {}

    fn exit(&self, _span: &Id) {}
}

// ---------------------------------------------------------------- host side

struct DynCallsite {
    meta: OnceLock<Metadata<'static>>,
}

impl Callsite for DynCallsite {
    fn set_interest(&self, _interest: Interest) {}

    fn metadata(&self) -> &Metadata<'_> {
        self.meta.get().expect("the metadata is set before the callsite is registered or shared")
    }
}

type CallsiteMap = HashMap<(u8, String), &'static DynCallsite>;

fn callsite(level: u8, target: &str) -> &'static DynCallsite {
    static MAP: OnceLock<Mutex<CallsiteMap>> = OnceLock::new();
    static COUNT: AtomicUsize = AtomicUsize::new(0);
    let map = MAP.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = map.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(cs) = map.get(&(level, target.to_string())) {
        return cs;
    }
    let key_target = if COUNT.load(Ordering::Relaxed) >= MAX_CALLSITES { FALLBACK_TARGET } else { target };
    if let Some(cs) = map.get(&(level, key_target.to_string())) {
        return cs;
    }
    COUNT.fetch_add(1, Ordering::Relaxed);
    let leaked_target: &'static str = Box::leak(key_target.to_string().into_boxed_str());
    let cs: &'static DynCallsite = Box::leak(Box::new(DynCallsite { meta: OnceLock::new() }));
    let _ = cs.meta.set(Metadata::new(
        "plugin log",
        leaked_target,
        LogLevel::to_tracing(level),
        None,
        None,
        None,
        FieldSet::new(&["message"], Identifier(cs)),
        Kind::EVENT,
    ));
    tracing::callsite::register(cs);
    map.insert((level, key_target.to_string()), cs);
    cs
}

fn level_passes(level: &Level) -> bool {
    *level <= tracing::level_filters::LevelFilter::current()
}

/// The host's [`LogEnabledFn`].
pub(crate) extern "C" fn host_log_enabled(level: u8, target: RStr<'_>) -> bool {
    catch_unwind(AssertUnwindSafe(|| {
        if !level_passes(&LogLevel::to_tracing(level)) {
            return false;
        }
        let meta = callsite(level, target.as_str()).metadata();
        tracing::dispatcher::get_default(|d| d.enabled(meta))
    }))
    .unwrap_or(false)
}

/// The host's [`LogFn`]: re-emits a plugin record as a host `tracing` event.
pub(crate) extern "C" fn host_log(level: u8, target: RStr<'_>, message: RStr<'_>) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if !level_passes(&LogLevel::to_tracing(level)) {
            return;
        }
        let meta = callsite(level, target.as_str()).metadata();
        let fields = meta.fields();
        let Some(field) = fields.field("message") else { return };
        let text = format_args!("{}", message.as_str());
        let values = [(&field, Some(&text as &dyn tracing::Value))];
        let values = fields.value_set(&values);
        tracing::dispatcher::get_default(|d| {
            if d.enabled(meta) {
                d.event(&Event::new(meta, &values));
            }
        });
    }));
}
