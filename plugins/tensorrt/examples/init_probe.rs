//! Builds a small KV-cache engine with TensorRT-RTX on this machine, wraps it in a native blob, and calls the
//! plugin's `init` on it, printing what happens: the check run on each machine kind (CPU-only, H200).
//!
//! `KV_TENSORRT_LIB=/path/libtensorrt_rtx.so.1 cargo run -p tensorrt-delegate --example init_probe [BLOB...]`
//! (extra blob paths are also tried, e.g. the example decoder's blobs that `cargo run -p kv-example-trt
//! --example export_example -- DIR` writes, or `crates/blob-format/tests/fixtures/upstream/tr02_kv_cache.blob`;
//! `--write-blob PATH` also saves the KV blob).

use delegate_abi::{Delegate, InitContext};
use tensorrt_delegate::TensorRtDelegate;

#[path = "../tests/common/kv_blob.rs"]
mod kv_blob;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let version = trt_exec::library::load()?.version;
    println!("library: {}", version.describe());
    let blob = kv_blob::native_blob()?;
    let mut args = std::env::args().skip(1);
    let mut extra = Vec::new();
    while let Some(arg) = args.next() {
        if arg == "--write-blob" {
            let path = args.next().ok_or("--write-blob needs a path")?;
            std::fs::write(&path, &blob)?;
            println!("wrote {path}");
        } else {
            extra.push((arg.clone(), std::fs::read(&arg)?));
        }
    }
    let mut blobs = vec![("native KV blob".to_owned(), blob)];
    blobs.extend(extra);
    let delegate = TensorRtDelegate::new();
    for (name, bytes) in blobs {
        let ctx = InitContext { blob: &bytes, compile_specs: &[], runtime_specs: &[] };
        match delegate.init(ctx) {
            Ok(handle) => println!("init({name}): OK; engine io: {:?}", handle.engine_io()),
            Err(err) => {
                println!("init({name}): {} (0x{:02x}): {}", err.code.name(), err.code.as_u32(), err.message)
            }
        }
    }
    Ok(())
}
