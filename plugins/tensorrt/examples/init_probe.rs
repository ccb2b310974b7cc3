//! Builds the example decoder engine with TensorRT-RTX on this machine, wraps it in a native blob, and calls
//! the plugin's `init` on it, printing what happens: the check run on each machine kind (CPU-only, H200).
//!
//! `KV_TENSORRT_LIB=/path/libtensorrt_rtx.so.1 cargo run -p tensorrt-delegate --example init_probe [BLOB...]`
//! (extra blob paths are also tried, e.g. `shared/fixtures/upstream/tr02_kv_cache.blob`; `--write-blob PATH`
//! also saves the decoder blob).

use delegate_abi::{Delegate, InitContext};
use tensorrt_delegate::TensorRtDelegate;
use trt_exec::decoder::{arg_order, decoder_network, DecoderConfig, DecoderWeights};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let version = trt_exec::library::load()?.version;
    println!("library: {}", version.describe());
    // Weight values do not matter to `init` (`cargo run -p trt-exec --example export_example` writes the
    // decoder with kv-example's real weights; pass its blobs as extra arguments to probe them too).
    let cfg = DecoderConfig::TINY;
    let weights = DecoderWeights::zeros(&cfg);
    let net = decoder_network(&cfg, &weights, 1)?;
    let built = trt_exec::build_engine(&net, &trt_exec::BuildOptions::default())?;
    println!("built decoder engine: {} bytes in {:?}", built.plan.len(), built.build_time);
    let order = arg_order(&cfg);
    let order: Vec<&str> = order.iter().map(String::as_str).collect();
    let (_, blob) = trt_exec::export::native_blob(&built, &order)?;
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
    let mut blobs = vec![("native decoder blob".to_owned(), blob)];
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
