//! Small networks with known aliasing, for tests of anything that builds, exports or runs TensorRT engines.

use blob_format::model::DType;

use crate::{BinaryOp, NetworkDesc, Node, Op};

fn node(name: &str, op: Op) -> Node {
    Node { name: name.to_owned(), op }
}

/// One KV cache, as upstream's `tr02_kv_cache.blob`: `k_cache` `[1, 2, 16, 8]` is updated in place at
/// `write_idx` with `update` (`k_cache_out` aliases it, which TensorRT reports), plus `logits = update * 2`.
/// Inputs then outputs: `k_cache`, `update`, `write_idx`, `k_cache_out`, `logits`.
pub fn kv_single() -> NetworkDesc {
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

/// [`kv_single`]'s tensors in delegate-argument order (inputs, then outputs).
pub const KV_SINGLE_ORDER: [&str; 5] = ["k_cache", "update", "write_idx", "k_cache_out", "logits"];
