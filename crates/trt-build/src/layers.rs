//! One TensorRT layer per [`Op`]: each node of a [`NetworkDesc`](crate::NetworkDesc) added to the network,
//! its operands looked up among the tensors of earlier nodes, one function per op.

use std::collections::HashMap;

use blob_format::model::DType;
use trt_exec::trt_dtype;
use trtx::network::Layer;
use trtx::trtx_sys::AsLayer;
use trtx::{NetworkDefinition, Tensor};

use crate::error::{Error, Result};
use crate::network::{Node, Op};

/// The tensors of the nodes added so far, by node name.
pub(crate) type Tensors<'n> = HashMap<String, Tensor<'n>>;

/// A [`Error::Network`] at `node`.
pub(crate) fn net_err(node: &str, message: impl Into<String>) -> Error {
    Error::Network { node: node.to_owned(), message: message.into() }
}

/// A [`Error::Network`] at `node` for a layer TensorRT refused.
pub(crate) fn trt_err(node: &str, err: trtx::Error) -> Error {
    net_err(node, format!("TensorRT refused the layer: {err}"))
}

/// Adds `node`'s layer to `network` and returns the tensor it produces (not yet named).
pub(crate) fn add_node<'n>(
    network: &mut NetworkDefinition<'n>,
    tensors: &Tensors<'n>,
    node: &Node,
) -> Result<Tensor<'n>> {
    let name = node.name.as_str();
    let get = |operand: &str| {
        tensors.get(operand).copied().ok_or_else(|| net_err(name, format!("uses unknown tensor '{operand}'")))
    };
    match &node.op {
        Op::Input { dtype, shape } => add_input(network, name, *dtype, shape),
        Op::Constant { dtype, shape, data } => add_constant(network, name, *dtype, shape, data),
        Op::MatMul { a, transpose_a, b, transpose_b } => {
            add_matmul(network, name, (get(a)?, *transpose_a), (get(b)?, *transpose_b))
        }
        Op::ElementWise { a, b, op } => {
            let (a, b) = (get(a)?, get(b)?);
            let layer = network.add_elementwise(&a, &b, op.trt());
            output(network, name, layer)
        }
        Op::ReduceMean { input, axis } => add_reduce_mean(network, name, get(input)?, *axis),
        Op::Unary { input, op } => {
            let input = get(input)?;
            let layer = network.add_unary(&input, op.trt());
            output(network, name, layer)
        }
        Op::Softmax { input, axis } => add_softmax(network, name, get(input)?, *axis),
        Op::Shuffle { input, first_transpose, reshape, second_transpose } => {
            let shuffle = Shuffle { first_transpose, reshape, second_transpose };
            add_shuffle(network, name, get(input)?, shuffle)
        }
        Op::Gather { data, indices, axis } => {
            let (data, indices) = (get(data)?, get(indices)?);
            let layer = network.add_gather(&data, &indices, *axis);
            output(network, name, layer)
        }
        Op::Cast { input, to } => add_cast(network, name, get(input)?, *to),
        Op::KvCacheUpdate { cache, update, write_indices } => {
            let cache_t = get(cache)?;
            if !cache_t.is_network_input(network) {
                return Err(net_err(name, format!("KV cache '{cache}' must be an engine input")));
            }
            let (update, indices) = (get(update)?, get(write_indices)?);
            let layer = network.add_kv_cache_update(&cache_t, &update, &indices, trtx::KVCacheMode::kLINEAR);
            output(network, name, layer)
        }
    }
}

/// The first output of a just-added layer, or the node's error when TensorRT refused the layer.
fn output<'n, L: AsLayer>(
    network: &NetworkDefinition<'n>,
    name: &str,
    layer: trtx::Result<Layer<'n, L>>,
) -> Result<Tensor<'n>> {
    layer.and_then(|layer| layer.output(network, 0)).map_err(|e| trt_err(name, e))
}

fn tensorrt_dtype(name: &str, dtype: DType) -> Result<trtx::DataType> {
    trt_dtype(dtype).ok_or_else(|| net_err(name, format!("TensorRT has no {dtype} type")))
}

fn add_input<'n>(
    network: &mut NetworkDefinition<'n>,
    name: &str,
    dtype: DType,
    shape: &[i64],
) -> Result<Tensor<'n>> {
    let dt = tensorrt_dtype(name, dtype)?;
    network.add_input(name, dt, shape).map_err(|e| trt_err(name, e))
}

fn add_constant<'n>(
    network: &mut NetworkDefinition<'n>,
    name: &str,
    dtype: DType,
    shape: &[i64],
    data: &[u8],
) -> Result<Tensor<'n>> {
    let dt = tensorrt_dtype(name, dtype)?;
    let numel = shape.iter().try_fold(1i64, |acc, &d| if d < 0 { None } else { acc.checked_mul(d) });
    let expected =
        numel.and_then(|n| usize::try_from(n).ok()).and_then(|n| n.checked_mul(dtype.size_bytes()));
    if expected != Some(data.len()) {
        let message =
            format!("constant of shape {shape:?} {dtype} needs {expected:?} bytes, got {}", data.len());
        return Err(net_err(name, message));
    }
    let layer = network.add_constant_owned(shape, data.to_vec(), dt, None);
    output(network, name, layer)
}

/// `a` and `b`, each with whether its last two axes are transposed.
fn add_matmul<'n>(
    network: &mut NetworkDefinition<'n>,
    name: &str,
    (a, transpose_a): (Tensor<'n>, bool),
    (b, transpose_b): (Tensor<'n>, bool),
) -> Result<Tensor<'n>> {
    let op = |t: bool| if t { trtx::MatrixOperation::kTRANSPOSE } else { trtx::MatrixOperation::kNONE };
    let layer = network.add_matrix_multiply(&a, op(transpose_a), &b, op(transpose_b));
    output(network, name, layer)
}

/// TensorRT's axis masks hold 8 axes.
fn check_axis(name: &str, what: &str, axis: u32) -> Result<()> {
    if axis >= 8 {
        return Err(net_err(name, format!("{what} axis {axis} is out of range")));
    }
    Ok(())
}

fn add_reduce_mean<'n>(
    network: &mut NetworkDefinition<'n>,
    name: &str,
    input: Tensor<'n>,
    axis: u32,
) -> Result<Tensor<'n>> {
    check_axis(name, "reduce", axis)?;
    let axes = trtx::Axes::from_slice(&[axis]);
    let layer = network.add_reduce(&input, trtx::ReduceOperation::kAVG, axes, true);
    output(network, name, layer)
}

fn add_softmax<'n>(
    network: &mut NetworkDefinition<'n>,
    name: &str,
    input: Tensor<'n>,
    axis: u32,
) -> Result<Tensor<'n>> {
    check_axis(name, "softmax", axis)?;
    let layer = network.add_softmax(&input, trtx::Axes::from_slice(&[axis]));
    output(network, name, layer)
}

/// [`Op::Shuffle`]'s three optional steps.
struct Shuffle<'a> {
    first_transpose: &'a Option<Vec<i32>>,
    reshape: &'a Option<Vec<i64>>,
    second_transpose: &'a Option<Vec<i32>>,
}

fn add_shuffle<'n>(
    network: &mut NetworkDefinition<'n>,
    name: &str,
    input: Tensor<'n>,
    shuffle: Shuffle<'_>,
) -> Result<Tensor<'n>> {
    let Shuffle { first_transpose, reshape, second_transpose } = shuffle;
    if [first_transpose, second_transpose].into_iter().flatten().any(|perm| perm.len() > 8) {
        return Err(net_err(name, "a permutation has more than 8 axes"));
    }
    let mut layer = network.add_shuffle(&input).map_err(|e| trt_err(name, e))?;
    if let Some(perm) = first_transpose {
        layer.set_first_transpose(network, perm).map_err(|e| trt_err(name, e))?;
    }
    if let Some(dims) = reshape {
        layer.set_reshape_dimensions(network, dims).map_err(|e| trt_err(name, e))?;
    }
    if let Some(perm) = second_transpose {
        layer.set_second_transpose(network, perm).map_err(|e| trt_err(name, e))?;
    }
    output(network, name, Ok(layer))
}

fn add_cast<'n>(
    network: &mut NetworkDefinition<'n>,
    name: &str,
    input: Tensor<'n>,
    to: DType,
) -> Result<Tensor<'n>> {
    let dt = tensorrt_dtype(name, to)?;
    let layer = network.add_cast(&input, dt);
    output(network, name, layer)
}
