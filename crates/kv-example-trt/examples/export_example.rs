//! Exports kv-example's decoder as a TensorRT program: `prefill.blob` (prompt rows) and `decode.blob` (one row),
//! native blobs holding TensorRT-RTX engines built here on CPU, plus `program.toml` in kv-example's manifest
//! schema (backend `TensorRTBackend`, cache buffers `[1, heads, max_len, head_dim]` f32 in device memory, and
//! the `[generate]` section).
//!
//! ```text
//! KV_TENSORRT_LIB=/path/libtensorrt_rtx.so.1 cargo run -p kv-example-trt --example export_example -- DIR [--big]
//! ```
//!
//! `cargo xtask export-example --backend tensorrt DIR [--big]` installs the library and runs exactly this.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use blob_format::model::TENSORRT_BACKEND;
use kv_example::export::{DECODE_BLOB, MANIFEST, PREFILL_BLOB};
use kv_example_trt::decoder_blob;
use trt_build::BuildOptions;

const USAGE: &str = "usage: export_example DIR [--big]";

fn main() -> ExitCode {
    let mut dir: Option<PathBuf> = None;
    let mut big = false;
    for arg in std::env::args_os().skip(1) {
        match arg.to_str() {
            Some("--big") => big = true,
            Some("-h" | "--help") => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            Some(flag) if flag.starts_with('-') => {
                eprintln!("error: unknown option {flag}\n{USAGE}");
                return ExitCode::from(2);
            }
            _ if dir.is_none() => dir = Some(PathBuf::from(arg)),
            _ => {
                eprintln!("error: more than one directory given\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let Some(dir) = dir else {
        eprintln!("error: no output directory given\n{USAGE}");
        return ExitCode::from(2);
    };
    match export(&dir, big) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

fn export(dir: &Path, big: bool) -> Result<(), Box<dyn std::error::Error>> {
    let started = Instant::now();
    let cfg = if big { kv_example::Config::big() } else { kv_example::Config::tiny() };
    let library = trt_exec::library::load()?;
    println!(
        "building kv-example's {} decoder with {} (layers {}, heads {} x {}, max length {}, vocab {})",
        if big { "big" } else { "tiny" },
        library.version.describe(),
        cfg.layers,
        cfg.heads,
        cfg.head_dim,
        cfg.max_len,
        cfg.vocab
    );
    let weights = kv_example::Weights::generate(&cfg);
    let options = BuildOptions { progress: true, ..BuildOptions::default() };
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    for (method, rows, file) in [("prefill", cfg.prompt_len(), PREFILL_BLOB), ("decode", 1, DECODE_BLOB)] {
        let (header, blob, built) = decoder_blob(&cfg, &weights, rows, &options)?;
        // The blob binds what the reference program's calls thread, in the same order, so kv-example's
        // manifest `args` apply unchanged.
        let ours: Vec<&str> =
            header.bindings.iter().filter(|b| b.threaded).map(|b| b.name.as_str()).collect();
        let theirs = kv_example_trt::reference_order(&cfg, rows);
        if ours != theirs {
            return Err(
                format!("{method}: argument order {ours:?} differs from kv-example's {theirs:?}").into()
            );
        }
        let path = dir.join(file);
        std::fs::write(&path, &blob).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!(
            "wrote {} ({method}, rows {rows}): {} bytes, engine {} bytes built in {:.2?}, {} aliases",
            path.display(),
            blob.len(),
            built.plan.len(),
            built.build_time,
            header.aliases.len()
        );
    }
    let mut manifest = kv_example::export::manifest(&cfg);
    kv_example::export::without_next_token(&mut manifest);
    for buffer in manifest.buffers.values_mut() {
        // TensorRT's KV-cache layer wants a batch axis; the bytes are those of kv-example's buffers.
        buffer.shape = [1, cfg.heads, cfg.max_len, cfg.head_dim].iter().map(|&d| d as i64).collect();
        buffer.memory = "device".to_owned();
    }
    for call in manifest.methods.values_mut().flat_map(|m| m.calls.iter_mut()) {
        call.backend = TENSORRT_BACKEND.to_owned();
    }
    let path = dir.join(MANIFEST);
    std::fs::write(&path, manifest.to_toml()?)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!(
        "wrote {} (backend {TENSORRT_BACKEND}, {} device cache buffers, methods {})",
        path.display(),
        manifest.buffers.len(),
        manifest.methods.keys().cloned().collect::<Vec<_>>().join(", ")
    );
    println!("exported in {:.2?}", started.elapsed());
    Ok(())
}
