//! `trt_pack SPEC.json OUT.blob`: `delegate-pack`'s spec (a reference-graph description, its constants file,
//! the delegate's bindings in ExecuTorch's order) built into a TensorRT-RTX engine
//! ([`kv_example_trt::network_from_graph`]) and written as a native blob for `TensorRTBackend`, its arguments
//! in the spec's order. What `python/kv_delegate`'s `TensorRTBackend` runs (`$KV_TRT_PACK`). A refusal is one
//! `error:` line and exit status 2.
//!
//! ```text
//! KV_TENSORRT_LIB=/path/libtensorrt_rtx.so.1 cargo run -p kv-example-trt --example trt_pack -- SPEC.json OUT.blob
//! ```

use std::path::Path;
use std::process::ExitCode;

use blob_format::model::TENSORRT_BACKEND;
use delegate_pack::Spec;
use ref_graph::Graph;
use trt_build::BuildOptions;

fn pack(spec_path: &Path, out: &Path) -> Result<String, Box<dyn std::error::Error>> {
    let spec: Spec = serde_json::from_slice(&std::fs::read(spec_path)?)?;
    if spec.backend != TENSORRT_BACKEND {
        return Err(format!("backend '{}': trt_pack writes {TENSORRT_BACKEND} blobs", spec.backend).into());
    }
    let constants = match &spec.constants_file {
        Some(file) => std::fs::read(spec_path.parent().unwrap_or(Path::new(".")).join(file))?,
        None => Vec::new(),
    };
    let graph = Graph::from_description(&serde_json::to_vec(&spec.graph)?, &constants)?;
    let network = kv_example_trt::network_from_graph(&graph)?;
    let built = trt_build::build_engine(&network, &BuildOptions::default())?;
    let order: Vec<&str> = spec.bindings.iter().map(|b| b.name.as_str()).collect();
    let (header, blob) = trt_build::export::native_blob(&built, &order)?;
    std::fs::write(out, &blob)?;
    Ok(format!(
        "wrote {}: {} bytes, engine built in {:.0?}, {} aliases, {}",
        out.display(),
        blob.len(),
        built.build_time,
        header.aliases.len(),
        header.engine_library_version.as_deref().unwrap_or("TensorRT-RTX")
    ))
}

fn main() -> ExitCode {
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let [spec, out] = args.as_slice() else {
        eprintln!("error: usage: trt_pack SPEC.json OUT.blob");
        return ExitCode::from(2);
    };
    match pack(Path::new(spec), Path::new(out)) {
        Ok(line) => {
            eprintln!("{line}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(2)
        }
    }
}
