//! A small engine with one in-place KV cache, built with TensorRT-RTX on this machine and wrapped in a native
//! blob: what the plugin's `init` tests and the `init_probe` example hand to `init` (weight values do not
//! matter to `init`). Included with `#[path]`.
#![allow(dead_code)]

use trt_build::BuildOptions;

/// [`trt_build::samples::kv_single`] built on CPU and exported as a native blob, arguments in input-then-output order.
pub fn native_blob() -> Result<Vec<u8>, trt_build::Error> {
    let built = trt_build::build_engine(&trt_build::samples::kv_single(), &BuildOptions::default())?;
    eprintln!("built the KV engine: {} bytes in {:?}", built.plan.len(), built.build_time);
    Ok(trt_build::export::native_blob(&built, &trt_build::samples::KV_SINGLE_ORDER)?.1)
}
