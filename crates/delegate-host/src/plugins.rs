//! `plugins`: every plugin candidate as a table for people or JSON for programs. The registry decides; this
//! module only renders.

use std::fmt::Write as _;
use std::path::PathBuf;

use host_runtime::plugins::{Candidate, Registry, Status};
use serde_json::{json, Value};

use crate::{emit, printable, Failure};

/// Lists every candidate that discovery in `dirs` (then `DELEGATE_PLUGIN_PATH`, then the embedded plugin)
/// finds.
pub fn plugins(dirs: &[PathBuf], json: bool) -> Result<(), Failure> {
    let registry = Registry::discover(dirs, true, true);
    if json {
        let list: Vec<Value> = registry.candidates().iter().map(candidate_json).collect();
        emit(&format!("{}\n", Value::Array(list)))
    } else {
        emit(&table(registry.candidates()))
    }
}

/// One candidate as the `--json` object; its keys are part of the CLI's promise (see STABILITY.md).
fn candidate_json(c: &Candidate) -> Value {
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
        "wire_formats": info.map(|i| i.wire_formats.iter()
            .map(|w| json!({"format": w.format, "versions": w.versions}))
            .collect::<Vec<_>>()).unwrap_or_default(),
        "memory_kinds": info.map(|i| i.memory_kinds.iter().map(|m| m.name()).collect::<Vec<_>>())
            .unwrap_or_default(),
        "binds_aliases_in_place": info.map(|i| i.binds_aliases_in_place),
    })
}

/// A human table: one row per candidate, `STATUS` last (it carries the reason). A backend a candidate offers
/// but does not serve is parenthesised.
fn table(candidates: &[Candidate]) -> String {
    const HEADERS: [&str; 7] = ["PATH", "NAME", "VERSION", "ABI", "BACKENDS", "WIRE FORMATS", "STATUS"];
    let rows: Vec<[String; 7]> = candidates
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
