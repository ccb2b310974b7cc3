//! A small engine with one in-place KV cache, built with TensorRT-RTX on this machine and wrapped in a native
//! blob: what the plugin's `init` tests and the `init_probe` example hand to `init` (weight values do not
//! matter to `init`; kv-example's decoder cannot be linked here, since both it, through the reference
//! delegate, and this plugin export a plugin root module). Included with `#[path]`.
#![allow(dead_code)]

use blob_format::model::DType;
use trt_build::{BinaryOp, BuildOptions, NetworkDesc, Node, Op};

/// `k_cache` updated in place at `write_idx` (`k_cache_out` aliases it, TensorRT reports), plus `logits`.
pub fn network() -> NetworkDesc {
    let node = |name: &str, op: Op| Node { name: name.to_owned(), op };
    NetworkDesc {
        nodes: vec![
            node("k_cache", Op::Input { dtype: DType::F32, shape: vec![1, 2, 16, 8] }),
            node("update", Op::Input { dtype: DType::F32, shape: vec![1, 2, 1, 8] }),
            node("write_idx", Op::Input { dtype: DType::I32, shape: vec![1] }),
            node(
                "k_cache_out",
                Op::KvCacheUpdate {
                    cache: "k_cache".into(),
                    update: "update".into(),
                    write_indices: "write_idx".into(),
                },
            ),
            node(
                "two",
                Op::Constant {
                    dtype: DType::F32,
                    shape: vec![1, 1, 1, 1],
                    data: 2.0f32.to_le_bytes().to_vec(),
                },
            ),
            node("logits", Op::ElementWise { a: "update".into(), b: "two".into(), op: BinaryOp::Mul }),
        ],
        outputs: vec!["k_cache_out".into(), "logits".into()],
    }
}

/// [`network`] built on CPU and exported as a native blob, arguments in input-then-output order.
pub fn native_blob() -> Result<Vec<u8>, trt_build::Error> {
    let built = trt_build::build_engine(&network(), &BuildOptions::default())?;
    eprintln!("built the KV engine: {} bytes in {:?}", built.plan.len(), built.build_time);
    let order = ["k_cache", "update", "write_idx", "k_cache_out", "logits"];
    Ok(trt_build::export::native_blob(&built, &order)?.1)
}
