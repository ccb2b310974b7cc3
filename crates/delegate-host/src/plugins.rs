//! `plugins`: every plugin candidate as a table for people or JSON for programs. The registry decides; this
//! module only renders.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use delegate_abi::host::HostConfig;
use et_error::ErrorCode;
use host_runtime::plugin_manifest::PluginManifest;
use host_runtime::plugins::{Candidate, Discovery, Registry, Status};
use serde_json::{json, Value};

use crate::{emit, printable, Failure};

/// How this run discovers and runs plugins; set once by `main`.
static FLAGS: OnceLock<PluginFlags> = OnceLock::new();

/// The global plugin flags.
#[derive(Debug, Clone, Copy)]
pub struct PluginFlags {
    /// `--probe`: load every library now instead of reading manifests only.
    pub probe: bool,
    /// `--isolate`: every library-loaded plugin runs in a worker process.
    pub isolate: bool,
    /// `--deadline-ms`: the per-call deadline of isolated plugins.
    pub deadline: std::time::Duration,
}

/// Records the global plugin flags for every discovery of this run.
pub fn set_flags(flags: PluginFlags) {
    let _ = FLAGS.set(flags);
}

/// The registry of this run: plugins in `dirs`, then `DELEGATE_PLUGIN_PATH`, then the plugins this binary
/// embeds (the reference and CUDA delegates; host-runtime links none itself). Without `--probe` no library
/// is opened until a program needs its backend (manifests only); with it, every library is loaded now and
/// checked against its manifest when it has one.
pub fn registry(dirs: &[PathBuf]) -> Registry {
    let flags = FLAGS.get().copied();
    let discovery = Discovery::new().dirs(dirs).use_env(true).probe(flags.is_some_and(|f| f.probe));
    // Workers are this very binary (`delegate-host worker`); without knowing where it is, nothing isolates
    // (a plugin whose manifest asks for isolation then serves nothing, and says why).
    let discovery = match std::env::current_exe() {
        Ok(exe) => discovery.isolation(
            host_runtime::isolate::Isolation::new(exe, ["worker"])
                .all(flags.is_some_and(|f| f.isolate))
                .deadline(flags.map_or(host_runtime::isolate::DEFAULT_DEADLINE, |f| f.deadline)),
        ),
        Err(_) => discovery,
    };
    embed_shipped(Registry::discover(discovery))
}

/// The plugins `delegate-host` ships inside its binary, after every library found: the reference delegate
/// (CPU) and the CUDA delegate (listed unavailable, with the reason, on a machine without a GPU).
fn embed_shipped(registry: Registry) -> Registry {
    let config = HostConfig::default();
    registry
        .with_embedded(reference_delegate::delegate_root(), &config)
        .with_embedded(cuda_delegate::delegate_root(), &config)
}

/// `--probe` loads every library into this process and `--isolate` keeps every library out of it: asked
/// together, the run is refused in one line rather than one of them silently dropped.
pub fn refuse_probe_with_isolate(probe: bool, isolate: bool) -> Result<(), Failure> {
    if probe && isolate {
        return Err(Failure::coded(
            ErrorCode::InvalidArgument,
            "--probe loads every plugin library into this process, which --isolate forbids: use one or the \
             other (with --isolate, plugins are listed from their manifests and each runs in a worker)",
        ));
    }
    Ok(())
}

/// `worker`: serves the host that started this process (see `host_runtime::isolate`).
pub fn worker() -> Result<(), Failure> {
    host_runtime::isolate::serve_inherited()
        .map_err(|err| Failure::coded(ErrorCode::Internal, err.to_string()))
}

/// `plugin-manifest LIB...`: loads each library once and writes its manifest next to it.
pub fn write_manifests(libraries: &[PathBuf], isolate: bool) -> Result<(), Failure> {
    let mut out = String::new();
    for library in libraries {
        let manifest = PluginManifest { isolate, ..describe(library)? };
        let path = PluginManifest::path_for(library);
        std::fs::write(&path, manifest.to_json()).map_err(|err| {
            Failure::coded(ErrorCode::AccessFailed, format!("cannot write {}: {err}", path.display()))
        })?;
        let _ = writeln!(
            out,
            "{}: {} {} ({})",
            path.display(),
            manifest.name,
            manifest.version,
            manifest.backends.join(", ")
        );
    }
    emit(&out)
}

fn describe(library: &Path) -> Result<PluginManifest, Failure> {
    // The hash written is of the very bytes loaded and described.
    host_runtime::plugins::describe_library(library, &HostConfig::default())
        .map_err(|err| Failure::coded(ErrorCode::InvalidArgument, format!("{}: {err}", library.display())))
}

/// Lists every candidate that discovery in `dirs` (then `DELEGATE_PLUGIN_PATH`, then the embedded plugins)
/// finds.
pub fn plugins(dirs: &[PathBuf], json: bool) -> Result<(), Failure> {
    let registry = registry(dirs);
    if json {
        let list: Vec<Value> = registry.candidates().iter().map(|c| candidate_json(&registry, c)).collect();
        emit(&format!("{}\n", Value::Array(list)))
    } else {
        let mut out = table(&registry);
        out.push_str(&serving_table(&registry));
        emit(&out)
    }
}

/// Per backend: which candidate serves it, where it runs, and why it was chosen.
fn serving_table(registry: &Registry) -> String {
    let mut out = String::new();
    for backend in registry.backends() {
        let (Some(c), Some(why)) = (registry.candidate_for_backend(&backend), registry.why_serves(&backend))
        else {
            continue;
        };
        let _ = writeln!(
            out,
            "{}: served by {} ({}, {}): {}",
            printable(&backend),
            printable(&c.location()),
            c.info.as_ref().map_or("-", |i| i.name.as_str()),
            placement(registry, c),
            printable(&why)
        );
    }
    if out.is_empty() {
        out
    } else {
        format!("\n{out}")
    }
}

/// Where a candidate's plugin runs: `isolated` (worker processes) or `in process`; `-` for one that cannot
/// run.
pub fn placement(registry: &Registry, c: &Candidate) -> &'static str {
    match c.status {
        Status::Rejected(_) | Status::NoManifest | Status::Unavailable(_) => "-",
        _ if registry.runs_isolated(c) => "isolated",
        _ => "in process",
    }
}

/// Per backend a candidate serves, why it was chosen.
fn serves_why(registry: &Registry, c: &Candidate) -> Value {
    let map: serde_json::Map<String, Value> = c
        .serves
        .iter()
        .filter_map(|b| {
            let now = registry.candidate_for_backend(b)?;
            if !std::ptr::eq(now, c) {
                return None;
            }
            Some((b.clone(), Value::from(registry.why_serves(b)?)))
        })
        .collect();
    Value::Object(map)
}

/// One candidate as the `--json` object; its keys are part of the CLI's promise (see STABILITY.md).
fn candidate_json(registry: &Registry, c: &Candidate) -> Value {
    let info = c.info.as_ref();
    let status_text;
    let (status, reason, shadowed_by) = match &c.status {
        Status::Rejected(reason) => ("rejected", Some(reason.as_str()), None),
        Status::Unavailable(reason) => ("unavailable", Some(reason.as_str()), None),
        Status::Shadowed { by } => (
            "shadowed",
            None,
            Some(by.as_ref().map_or_else(|| "(embedded)".to_string(), |p| p.display().to_string())),
        ),
        Status::Loaded => ("loaded", None, None),
        Status::Listed => ("listed", None, None),
        Status::NoManifest => ("no-manifest", None, None),
        other => {
            status_text = other.to_string();
            ("other", Some(status_text.as_str()), None)
        }
    };
    json!({
        "path": c.path,
        "embedded": c.path.is_none(),
        "status": status,
        "reason": reason,
        "shadowed_by": shadowed_by,
        "name": info.map(|i| &i.name),
        "version": info.map(|i| &i.version),
        "abi_version": c.abi_version,
        "backends": info.map(|i| i.backends.clone()).unwrap_or_default(),
        "serves": c.serves,
        "serves_why": serves_why(registry, c),
        "isolated": registry.runs_isolated(c),
        "wire_formats": info.map(|i| i.wire_formats.iter()
            .map(|w| json!({"format": w.format, "versions": w.versions}))
            .collect::<Vec<_>>()).unwrap_or_default(),
        "memory_kinds": info.map(|i| i.memory_kinds.iter().map(|m| m.name()).collect::<Vec<_>>())
            .unwrap_or_default(),
        "binds_aliases_in_place": info.map(|i| i.binds_aliases_in_place),
        "capabilities": info.map(|i| capabilities_json(&i.capabilities)),
        "manifest": c.manifest.as_ref().map(|m| json!({"sha256": m.sha256, "abi": {"min": m.abi.min, "max": m.abi.max}})),
    })
}

/// The capabilities as `--json` shows them: every field, the defaults included (an older plugin's).
fn capabilities_json(c: &delegate_abi::Capabilities) -> Value {
    json!({
        "in_place_memory_kinds": c.in_place_memory_kinds.as_ref().map(|k| k.iter().map(|m| m.name()).collect::<Vec<_>>()),
        "caller_stream": c.caller_stream,
        "cuda_graph_capturable": c.cuda_graph_capturable,
        "device_positions": c.device_positions,
        "rewind_fork_without_reinit": c.rewind_fork_without_reinit,
        "max_positions": c.max_positions,
    })
}

/// The capabilities cell: the stated ones as words, `none stated` for the defaults.
fn capabilities_cell(c: &delegate_abi::Capabilities) -> String {
    let words = c.words();
    if words.is_empty() {
        "none stated".to_owned()
    } else {
        words.join("; ")
    }
}

/// A human table: one row per candidate, `STATUS` last (it carries the reason). A backend a candidate offers
/// but does not serve is parenthesised.
fn table(registry: &Registry) -> String {
    const HEADERS: [&str; 9] =
        ["PATH", "NAME", "VERSION", "ABI", "BACKENDS", "WIRE FORMATS", "CAPABILITIES", "RUNS", "STATUS"];
    let candidates = registry.candidates();
    let rows: Vec<[String; 9]> = candidates
        .iter()
        .map(|c| {
            let info = c.info.as_ref();
            let or_dash = |s: Option<String>| s.unwrap_or_else(|| "-".to_string());
            [
                c.location(),
                or_dash(info.map(|i| i.name.clone())),
                or_dash(info.map(|i| i.version.clone())),
                or_dash(c.abi_version.map(|v| v.to_string())),
                or_dash(info.map(|i| {
                    i.backends
                        .iter()
                        .map(|b| if c.serves.contains(b) { b.clone() } else { format!("({b})") })
                        .collect::<Vec<_>>()
                        .join(",")
                })),
                or_dash(info.map(|i| {
                    i.wire_formats
                        .iter()
                        .map(|w| format!("{} {}", w.format, w.versions))
                        .collect::<Vec<_>>()
                        .join("; ")
                })),
                or_dash(info.map(|i| capabilities_cell(&i.capabilities))),
                placement(registry, c).to_owned(),
                c.status.to_string(),
            ]
            .map(|cell| printable(&cell).into_owned())
        })
        .collect();
    let mut widths = HEADERS.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell:<width$}  ", width = widths[i]);
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&HEADERS);
    for row in &rows {
        line(&row.each_ref().map(String::as_str));
    }
    if candidates.is_empty() {
        out.push_str("(no plugin candidates found)\n");
    }
    out
}
