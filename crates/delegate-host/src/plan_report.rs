//! `inspect --plan`: for each call of a program (or a blob) that the CUDA delegate runs, the launches its
//! planner lowers the payload to ([`cuda_delegate::report`], on the CPU, no GPU needed), fused or on their
//! own and why, then a summary: launches a call, fused and not, launches per layer.
//!
//! Reading stays bounded as `inspect`'s does: the program data is read, then each CUDA call's payload alone
//! (it must be read whole to be planned) and let go before the next; other payloads are never read.

use std::fmt::Write as _;
use std::path::Path;

use cuda_delegate::report::{plan_report, PlanReport};
use cuda_delegate::BACKEND_ID;
use et_error::{ErrorCode, HasErrorCode};
use serde_json::{json, Value as Json};

use crate::blob::{Head, Unread};
use crate::{emit, printable, Failure};

/// One delegate call: where it is, and its report when the CUDA delegate runs it.
struct Call {
    /// `method 'forward', call at 0:1 (delegate 0)`, or `the blob` for a blob file.
    at: String,
    method: Option<String>,
    instruction: Option<String>,
    backend: String,
    report: Option<PlanReport>,
}

/// Prints the plan of every CUDA call of the program or blob at `path`.
pub fn inspect_plan(path: &Path, json: bool) -> Result<(), Failure> {
    let head = Head::open(path)?;
    let calls = if pte_format::is_program(&head.first) {
        program_calls(path, &head)?
    } else {
        vec![blob_call(path, &head)?]
    };
    if json {
        emit(&format!("{}\n", calls_json(&calls)))
    } else {
        emit(&calls_text(&calls))
    }
}

/// The report of `payload`, or one line naming the call.
fn planned(path: &Path, at: &str, payload: &[u8]) -> Result<PlanReport, Failure> {
    plan_report(payload).map_err(|err| {
        Failure::coded(
            err.error_code(),
            format!("{}: {at}, {BACKEND_ID}: cannot plan its payload: {err}", path.display()),
        )
    })
}

fn unreadable(path: &Path, at: &str, err: &std::io::Error) -> Failure {
    Failure::coded(
        ErrorCode::AccessFailed,
        format!("{}: {at}: cannot read its payload: {err}", path.display()),
    )
}

fn program_calls(path: &Path, head: &Head) -> Result<Vec<Call>, Failure> {
    let bytes = crate::pte::program_data(path, head)?;
    let program = crate::pte::parse(path, head, &bytes)?;
    let mut calls = Vec::new();
    for method in &program.methods {
        for (at, call) in method.delegate_calls() {
            let delegate = &method.delegates[call.delegate];
            let place =
                format!("method '{}', call at {at} (delegate {})", printable(method.name), call.delegate);
            let report = if delegate.id == BACKEND_ID {
                let payload = crate::pte::payload(head, &delegate.processed)
                    .map_err(|err| unreadable(path, &place, &err))?;
                Some(planned(path, &place, &payload)?)
            } else {
                None
            };
            calls.push(Call {
                at: place,
                method: Some(method.name.to_owned()),
                instruction: Some(at.to_string()),
                backend: delegate.id.to_owned(),
                report,
            });
        }
    }
    Ok(calls)
}

/// A blob file: planned whole when it is for the CUDA delegate.
fn blob_call(path: &Path, head: &Head) -> Result<Call, Failure> {
    let at = "the blob".to_owned();
    let header = head.blob_header(0, head.len).map_err(|err| {
        let (message, code) = match err {
            Unread::Io(err) => (format!("cannot read it: {err}"), ErrorCode::AccessFailed),
            Unread::Blob(err) => (err.to_string(), err.error_code()),
        };
        Failure::coded(code, format!("{}: {message}", path.display()))
    })?;
    let backend = header.header.backend_id;
    let report = if backend == BACKEND_ID {
        let bytes = head.read_at(0, head.len).map_err(|err| unreadable(path, &at, &err))?;
        Some(planned(path, &at, &bytes)?)
    } else {
        None
    };
    Ok(Call { at, method: None, instruction: None, backend, report })
}

/// The line said when nothing is planned.
fn nothing_to_plan(calls: &[Call]) -> Option<String> {
    if calls.iter().any(|c| c.report.is_some()) {
        return None;
    }
    let mut backends: Vec<&str> = calls.iter().map(|c| c.backend.as_str()).collect();
    backends.sort_unstable();
    backends.dedup();
    let others = if backends.is_empty() {
        "it has no delegate calls".to_owned()
    } else {
        format!("its calls run on {}", backends.join(", "))
    };
    Some(format!("no call runs on the CUDA delegate ({BACKEND_ID}), so there is no plan: {others}"))
}

fn calls_text(calls: &[Call]) -> String {
    let mut out = String::new();
    if let Some(note) = nothing_to_plan(calls) {
        let _ = writeln!(out, "{}", printable(&note));
        return out;
    }
    for call in calls {
        match &call.report {
            Some(report) => report_text(&mut out, &call.at, report),
            None => {
                let _ = writeln!(
                    out,
                    "{}: {}, not planned (not the CUDA delegate's)",
                    call.at,
                    printable(&call.backend)
                );
            }
        }
    }
    out
}

fn report_text(out: &mut String, at: &str, report: &PlanReport) {
    let _ = writeln!(
        out,
        "{at}, {BACKEND_ID}: {} ops lowered to {} launches a call: {} fused, {} on their own",
        report.ops,
        report.launches.len(),
        report.fused(),
        report.general()
    );
    for (i, launch) in report.launches.iter().enumerate() {
        let layer = launch.layer.map_or("-".to_owned(), |l| format!("L{l}"));
        let path = if launch.fused { "fused" } else { "alone" };
        let writes: Vec<_> = launch.writes.iter().map(|w| printable(w).into_owned()).collect();
        // A launch of the GEMM path may write only its own scratch, which has no name in the graph.
        let writes = if writes.is_empty() { "(scratch)".to_owned() } else { writes.join(", ") };
        let _ = writeln!(out, "  {i:>4}  {layer:<4} {path}  {:<28} -> {writes}", launch.kind);
        if let Some(reason) = &launch.reason {
            let _ = writeln!(out, "              why: {}", printable(reason));
        }
    }
    let _ = writeln!(out, "  summary: {}", summary(report));
}

/// `47 launches a call, 30 fused, 17 on their own; 2 layers (by names): 20 launches per layer, 5 before
/// the first layer, 2 after the last`.
fn summary(report: &PlanReport) -> String {
    let mut line = format!(
        "{} launches a call, {} fused, {} on their own",
        report.launches.len(),
        report.fused(),
        report.general()
    );
    if let Some(layers) = &report.layers {
        let counts = &layers.launches;
        let per_layer = if counts.windows(2).all(|w| w[0] == w[1]) {
            format!("{} launches per layer", counts[0])
        } else {
            let list: Vec<String> = counts.iter().map(usize::to_string).collect();
            format!("launches per layer {}", list.join(", "))
        };
        let _ = write!(
            line,
            "; {} layers (by {}): {per_layer}, {} before the first layer, {} after the last",
            counts.len(),
            layers.rule.as_str(),
            layers.before,
            layers.after
        );
    }
    line
}

fn report_json(report: &PlanReport) -> Json {
    let launches: Vec<_> = report
        .launches
        .iter()
        .enumerate()
        .map(|(i, l)| {
            json!({
                "index": i,
                "kind": l.kind,
                "fused": l.fused,
                "layer": l.layer,
                "writes": l.writes,
                "reason": l.reason,
            })
        })
        .collect();
    let layers = report.layers.as_ref().map(|l| {
        json!({
            "rule": l.rule.as_str(),
            "count": l.launches.len(),
            "launches": l.launches,
            "before": l.before,
            "after": l.after,
        })
    });
    json!({
        "ops": report.ops,
        "launches": launches,
        "summary": {
            "launches": report.launches.len(),
            "fused": report.fused(),
            "general": report.general(),
            "layers": layers,
        },
    })
}

fn calls_json(calls: &[Call]) -> Json {
    let entries: Vec<_> = calls
        .iter()
        .map(|c| {
            json!({
                "method": c.method,
                "instruction": c.instruction,
                "backend": c.backend,
                "plan": c.report.as_ref().map(report_json),
            })
        })
        .collect();
    json!({"backend": BACKEND_ID, "calls": entries, "note": nothing_to_plan(calls)})
}
