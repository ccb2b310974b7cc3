//! A delegate plugin that does nothing, on purpose, and misbehaves on request: the fixture for
//! `delegate-abi`'s ABI tests and the ABI-overhead benchmark.
//!
//! Behaviour is chosen per instance through compile specs (so tests running in parallel against the same
//! loaded library do not disturb each other), and per plugin through options:
//!
//! | where | key | value | effect |
//! |---|---|---|---|
//! | compile spec | `init` | `panic` | `init` panics |
//! | compile spec | `init` | `fail:<code>` | `init` fails with ExecuTorch code `<code>` (decimal) |
//! | compile spec | `execute` | `noop` (default) | `execute` touches nothing |
//! | compile spec | `execute` | `panic` | `execute` panics |
//! | compile spec | `execute` | `fail:<code>` | `execute` fails with code `<code>` |
//! | compile spec | `execute` | `fill:<byte>` | `execute` writes `<byte>` into every writable argument |
//! | option | `log` | string | logs it with `tracing::info!` (target `abi_test`) and `tracing::debug!` |
//! | option | `panic` | any | `set_option` panics |
//! | option (get) | `executions` | | number of successful `execute` calls so far |
//!
//! ## Examples
//!
//! ```text
//! cargo build -p abi-test        # target/debug/libabi_test.so
//! ```
//!
//! ## Feature Flags
//!
//! None.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use std::sync::atomic::{AtomicU64, Ordering};

use delegate_abi::{
    Compatibility, Delegate, DelegateError, ErrorCode, ExecuteArgs, InitContext, MemoryKind, OptionValue,
    PluginInfo, WireFormatSupport,
};

/// Backend id this plugin serves.
pub const BACKEND: &str = "AbiTestBackend";

/// What an instance does in `execute`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Nothing.
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

/// The delegate.
#[derive(Debug, Default)]
pub struct AbiTestDelegate {
    executions: AtomicU64,
}

/// One instance: what its `execute` does.
#[derive(Debug)]
pub struct Handle {
    execute: Behaviour,
}

impl Delegate for AbiTestDelegate {
    type Handle = Handle;

    fn new() -> Self {
        AbiTestDelegate::default()
    }

    fn info() -> PluginInfo {
        PluginInfo {
            name: "abi-test".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            backends: vec![BACKEND.into()],
            wire_formats: vec![WireFormatSupport { format: "native".into(), versions: ">=1.0, <2".into() }],
            memory_kinds: vec![MemoryKind::Host, MemoryKind::Pinned],
            binds_aliases_in_place: true,
        }
    }

    fn is_available(&self) -> bool {
        true
    }

    fn compatibility(&self, blob: &[u8]) -> Compatibility {
        match blob {
            b"" => Compatibility::Unsupported { reason: "empty blob".into() },
            b"old" => Compatibility::RebuildRecommended { reason: "blob built by an older abi-test".into() },
            _ => Compatibility::Supported,
        }
    }

    fn init(&self, ctx: InitContext<'_>) -> Result<Handle, DelegateError> {
        let mut execute = Behaviour::Noop;
        for spec in ctx.compile_specs {
            match spec.key {
                "init" => match parse_behaviour(spec.key, spec.value)? {
                    Behaviour::Panic => panic!("abi-test: init panics as asked"),
                    Behaviour::Fail(code) => {
                        return Err(DelegateError::new(
                            ErrorCode::from_u32(code),
                            "abi-test: init fails as asked",
                        ))
                    }
                    Behaviour::Noop | Behaviour::Fill(_) => {}
                },
                "execute" => execute = parse_behaviour(spec.key, spec.value)?,
                other => {
                    return Err(DelegateError::invalid_argument(format!(
                        "abi-test: unknown compile spec '{other}'"
                    )))
                }
            }
        }
        tracing::debug!(blob_bytes = ctx.blob.len(), "abi-test: init");
        Ok(Handle { execute })
    }

    fn execute(&self, handle: &mut Handle, args: &mut ExecuteArgs<'_>) -> Result<(), DelegateError> {
        match handle.execute {
            Behaviour::Noop => {}
            Behaviour::Panic => panic!("abi-test: execute panics as asked"),
            Behaviour::Fail(code) => {
                return Err(DelegateError::new(ErrorCode::from_u32(code), "abi-test: execute fails as asked"))
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
        match (key, value) {
            ("log", OptionValue::Str(message)) => {
                tracing::info!("{message}");
                tracing::debug!(detail = 7, "debug: {message}");
                Ok(())
            }
            ("panic", _) => panic!("abi-test: set_option panics as asked"),
            (key, value) => {
                Err(DelegateError::new(ErrorCode::NotFound, format!("unknown option '{key}' = {value:?}")))
            }
        }
    }

    fn get_option(&self, key: &str) -> Result<OptionValue, DelegateError> {
        match key {
            "executions" => Ok(OptionValue::Int(self.executions.load(Ordering::Relaxed) as i64)),
            _ => Err(DelegateError::new(ErrorCode::NotFound, format!("unknown option '{key}'"))),
        }
    }
}

delegate_abi::export_delegate!(AbiTestDelegate);
