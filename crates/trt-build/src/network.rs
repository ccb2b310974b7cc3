//! A small network description and `build_engine`: TensorRT-RTX builds it ahead of time, on CPU.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use blob_format::model::DType;
use trt_exec::{dtype_name, library, trt_dtype, AliasPair, EngineIo, IoMode, IoTensor, LogSink};

use crate::error::{Error, Result};

/// A network: nodes in topological order, each producing one tensor named after the node, and the node names
/// marked as engine outputs, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkDesc {
    /// Nodes; a node may only use tensors of earlier nodes.
    pub nodes: Vec<Node>,
    /// Nodes whose tensors are engine outputs, in order.
    pub outputs: Vec<String>,
}

/// One node: an operation producing the tensor `name`.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// The produced tensor's name (an engine I/O name for inputs and outputs).
    pub name: String,
    /// What produces it.
    pub op: Op,
}

/// The operations a [`NetworkDesc`] can use.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Op {
    /// An engine input.
    Input {
        /// Element type.
        dtype: DType,
        /// Static extents.
        shape: Vec<i64>,
    },
    /// Constant weights, little-endian bytes of `dtype` in row-major order.
    Constant {
        /// Element type.
        dtype: DType,
        /// Extents.
        shape: Vec<i64>,
        /// The bytes (`numel * dtype.size_bytes()` of them).
        data: Vec<u8>,
    },
    /// Batched matrix multiply over the last two axes (`IMatrixMultiplyLayer`).
    MatMul {
        /// Left operand.
        a: String,
        /// Whether to transpose the left operand's last two axes.
        transpose_a: bool,
        /// Right operand.
        b: String,
        /// Whether to transpose the right operand's last two axes.
        transpose_b: bool,
    },
    /// A broadcasting binary operation (`IElementWiseLayer`).
    ElementWise {
        /// Left operand.
        a: String,
        /// Right operand.
        b: String,
        /// The operation.
        op: BinaryOp,
    },
    /// Mean over one axis, kept as extent 1 (`IReduceLayer`, `kAVG`).
    ReduceMean {
        /// Input.
        input: String,
        /// Axis.
        axis: u32,
    },
    /// An element-wise unary function (`IUnaryLayer`).
    Unary {
        /// Input.
        input: String,
        /// The function.
        op: UnaryOp,
    },
    /// Softmax over one axis (`ISoftMaxLayer`).
    Softmax {
        /// Input.
        input: String,
        /// Axis.
        axis: u32,
    },
    /// Transpose / reshape / transpose (`IShuffleLayer`).
    Shuffle {
        /// Input.
        input: String,
        /// Permutation applied first.
        first_transpose: Option<Vec<i32>>,
        /// Reshape dimensions (0 copies, -1 infers).
        reshape: Option<Vec<i64>>,
        /// Permutation applied after the reshape.
        second_transpose: Option<Vec<i32>>,
    },
    /// Gathers slices of `data` along `axis` at `indices` (`IGatherLayer`), e.g. an embedding lookup.
    Gather {
        /// Data.
        data: String,
        /// Indices (i32 or i64).
        indices: String,
        /// Axis.
        axis: i32,
    },
    /// Converts the element type (`ICastLayer`).
    Cast {
        /// Input.
        input: String,
        /// Target type.
        to: DType,
    },
    /// Writes `update` into the engine input `cache` at `write_indices` in place (`IKVCacheUpdateLayer`,
    /// `kLINEAR`); the node's tensor is the updated cache, which TensorRT aliases onto `cache`.
    KvCacheUpdate {
        /// The cache: an engine input `[batch, heads, max_len, head_dim]`.
        cache: String,
        /// The new entries `[batch, heads, seq, head_dim]`.
        update: String,
        /// Write positions `[batch]` (i32 or i64).
        write_indices: String,
    },
}

/// Element-wise binary operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    /// a + b
    Add,
    /// a - b
    Sub,
    /// a * b
    Mul,
    /// a / b
    Div,
    /// a > b (bool)
    Greater,
    /// a < b (bool)
    Less,
}

impl BinaryOp {
    fn trt(self) -> trtx::ElementWiseOperation {
        use trtx::ElementWiseOperation as E;
        match self {
            BinaryOp::Add => E::kSUM,
            BinaryOp::Sub => E::kSUB,
            BinaryOp::Mul => E::kPROD,
            BinaryOp::Div => E::kDIV,
            BinaryOp::Greater => E::kGREATER,
            BinaryOp::Less => E::kLESS,
        }
    }
}

/// Element-wise unary functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnaryOp {
    /// Square root.
    Sqrt,
    /// e^x.
    Exp,
}

impl UnaryOp {
    fn trt(self) -> trtx::UnaryOperation {
        match self {
            UnaryOp::Sqrt => trtx::UnaryOperation::kSQRT,
            UnaryOp::Exp => trtx::UnaryOperation::kEXP,
        }
    }
}

/// How to build.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// Workspace memory pool limit in bytes.
    pub workspace_bytes: usize,
    /// Show an indicatif progress bar per build phase TensorRT reports (hidden when stderr is not a terminal).
    #[cfg(feature = "progress")]
    pub progress: bool,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            workspace_bytes: 256 << 20,
            #[cfg(feature = "progress")]
            progress: false,
        }
    }
}

/// A built engine: the serialized plan plus what TensorRT reported about the network at build time.
#[derive(Debug, Clone)]
pub struct BuiltEngine {
    /// The serialized plan (TensorRT-RTX plans start with `vtrt`).
    pub plan: Vec<u8>,
    /// I/O tensors and aliases, from TensorRT's network API (`INetworkDefinition`, `IKVCacheUpdateLayer`).
    pub io: EngineIo,
    /// Wall time of `buildSerializedNetwork`.
    pub build_time: Duration,
}

/// Shows TensorRT's build phases as indicatif bars.
#[cfg(feature = "progress")]
struct ProgressBars {
    multi: indicatif::MultiProgress,
    bars: std::sync::Mutex<HashMap<String, indicatif::ProgressBar>>,
}

#[cfg(feature = "progress")]
impl trtx::interfaces::MonitorProgress for ProgressBars {
    fn phase_start(&self, phase_name: &str, _parent_phase: Option<&str>, num_steps: i32) {
        let bar = self.multi.add(indicatif::ProgressBar::new(u64::try_from(num_steps).unwrap_or(0)));
        bar.set_style(
            indicatif::ProgressStyle::with_template("{msg:>32} [{bar:30}] {pos}/{len}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_message(phase_name.to_owned());
        if let Ok(mut bars) = self.bars.lock() {
            bars.insert(phase_name.to_owned(), bar);
        }
    }

    fn step_complete(&self, phase_name: &str, step: i32) -> std::ops::ControlFlow<()> {
        if let Some(bar) = self.bars.lock().ok().and_then(|b| b.get(phase_name).cloned()) {
            bar.set_position(u64::try_from(step).unwrap_or(0) + 1);
        }
        std::ops::ControlFlow::Continue(())
    }

    fn phase_finish(&self, phase_name: &str) {
        if let Some(bar) = self.bars.lock().ok().and_then(|mut b| b.remove(phase_name)) {
            bar.finish_and_clear();
        }
    }
}

fn net_err(node: &str, message: impl Into<String>) -> Error {
    Error::Network { node: node.to_owned(), message: message.into() }
}

fn trt_err(node: &str, err: trtx::Error) -> Error {
    net_err(node, format!("TensorRT refused the layer: {err}"))
}

/// Builds `desc` into a serialized TensorRT-RTX plan, on CPU (TensorRT-RTX builds ahead of time without a GPU).
///
/// The returned [`BuiltEngine::io`] is read back from TensorRT's network after construction: I/O names,
/// modes, dtypes and shapes as TensorRT resolved them, and one alias per `IKVCacheUpdateLayer` whose output is
/// an engine output and whose cache is an engine input.
pub fn build_engine(desc: &NetworkDesc, options: &BuildOptions) -> Result<BuiltEngine> {
    let lib = library::load()?;
    let sink = LogSink::default();
    let logger = trtx::Logger::new(sink.clone()).map_err(|e| Error::Build {
        message: format!("creating the logger: {e}"),
        log: sink.take_errors(),
    })?;
    let build_err = |what: &str, e: trtx::Error| Error::Build {
        message: format!("{what}: {e}"),
        log: sink.take_errors(),
    };
    let mut builder = trtx::Builder::new(&logger).map_err(|e| build_err("creating the builder", e))?;
    let mut network = builder.create_network(0).map_err(|e| build_err("creating the network", e))?;

    let mut tensors: HashMap<String, trtx::Tensor<'_>> = HashMap::new();
    for node in &desc.nodes {
        if tensors.contains_key(&node.name) {
            return Err(net_err(&node.name, "a tensor of this name already exists"));
        }
        let get = |name: &str| {
            tensors
                .get(name)
                .copied()
                .ok_or_else(|| net_err(&node.name, format!("uses unknown tensor '{name}'")))
        };
        let name = node.name.as_str();
        let tensor = match &node.op {
            Op::Input { dtype, shape } => {
                let dt = trt_dtype(*dtype)
                    .ok_or_else(|| net_err(name, format!("TensorRT has no {dtype} type")))?;
                network.add_input(name, dt, shape).map_err(|e| trt_err(name, e))?
            }
            Op::Constant { dtype, shape, data } => {
                let dt = trt_dtype(*dtype)
                    .ok_or_else(|| net_err(name, format!("TensorRT has no {dtype} type")))?;
                let numel =
                    shape.iter().try_fold(1i64, |acc, &d| if d < 0 { None } else { acc.checked_mul(d) });
                let expected = numel
                    .and_then(|n| usize::try_from(n).ok())
                    .and_then(|n| n.checked_mul(dtype.size_bytes()));
                if expected != Some(data.len()) {
                    return Err(net_err(
                        name,
                        format!(
                            "constant of shape {shape:?} {dtype} needs {expected:?} bytes, got {}",
                            data.len()
                        ),
                    ));
                }
                let layer = network
                    .add_constant_owned(shape, data.clone(), dt, None)
                    .map_err(|e| trt_err(name, e))?;
                layer.output(&network, 0).map_err(|e| trt_err(name, e))?
            }
            Op::MatMul { a, transpose_a, b, transpose_b } => {
                let (a, b) = (get(a)?, get(b)?);
                let op = |t: bool| {
                    if t {
                        trtx::MatrixOperation::kTRANSPOSE
                    } else {
                        trtx::MatrixOperation::kNONE
                    }
                };
                let layer = network
                    .add_matrix_multiply(&a, op(*transpose_a), &b, op(*transpose_b))
                    .map_err(|e| trt_err(name, e))?;
                layer.output(&network, 0).map_err(|e| trt_err(name, e))?
            }
            Op::ElementWise { a, b, op } => {
                let (a, b) = (get(a)?, get(b)?);
                let layer = network.add_elementwise(&a, &b, op.trt()).map_err(|e| trt_err(name, e))?;
                layer.output(&network, 0).map_err(|e| trt_err(name, e))?
            }
            Op::ReduceMean { input, axis } => {
                let input = get(input)?;
                if *axis >= 8 {
                    return Err(net_err(name, format!("reduce axis {axis} is out of range")));
                }
                let layer = network
                    .add_reduce(&input, trtx::ReduceOperation::kAVG, trtx::Axes::from_slice(&[*axis]), true)
                    .map_err(|e| trt_err(name, e))?;
                layer.output(&network, 0).map_err(|e| trt_err(name, e))?
            }
            Op::Unary { input, op } => {
                let input = get(input)?;
                let layer = network.add_unary(&input, op.trt()).map_err(|e| trt_err(name, e))?;
                layer.output(&network, 0).map_err(|e| trt_err(name, e))?
            }
            Op::Softmax { input, axis } => {
                let input = get(input)?;
                if *axis >= 8 {
                    return Err(net_err(name, format!("softmax axis {axis} is out of range")));
                }
                let layer = network
                    .add_softmax(&input, trtx::Axes::from_slice(&[*axis]))
                    .map_err(|e| trt_err(name, e))?;
                layer.output(&network, 0).map_err(|e| trt_err(name, e))?
            }
            Op::Shuffle { input, first_transpose, reshape, second_transpose } => {
                let input = get(input)?;
                for perm in [first_transpose, second_transpose].into_iter().flatten() {
                    if perm.len() > 8 {
                        return Err(net_err(name, "a permutation has more than 8 axes"));
                    }
                }
                let mut layer = network.add_shuffle(&input).map_err(|e| trt_err(name, e))?;
                if let Some(perm) = first_transpose {
                    layer.set_first_transpose(&mut network, perm).map_err(|e| trt_err(name, e))?;
                }
                if let Some(dims) = reshape {
                    layer.set_reshape_dimensions(&mut network, dims).map_err(|e| trt_err(name, e))?;
                }
                if let Some(perm) = second_transpose {
                    layer.set_second_transpose(&mut network, perm).map_err(|e| trt_err(name, e))?;
                }
                layer.output(&network, 0).map_err(|e| trt_err(name, e))?
            }
            Op::Gather { data, indices, axis } => {
                let (data, indices) = (get(data)?, get(indices)?);
                let layer = network.add_gather(&data, &indices, *axis).map_err(|e| trt_err(name, e))?;
                layer.output(&network, 0).map_err(|e| trt_err(name, e))?
            }
            Op::Cast { input, to } => {
                let input = get(input)?;
                let dt = trt_dtype(*to).ok_or_else(|| net_err(name, format!("TensorRT has no {to} type")))?;
                let layer = network.add_cast(&input, dt).map_err(|e| trt_err(name, e))?;
                layer.output(&network, 0).map_err(|e| trt_err(name, e))?
            }
            Op::KvCacheUpdate { cache, update, write_indices } => {
                let cache_t = get(cache)?;
                if !cache_t.is_network_input(&network) {
                    return Err(net_err(name, format!("KV cache '{cache}' must be an engine input")));
                }
                let (update, idx) = (get(update)?, get(write_indices)?);
                let layer = network
                    .add_kv_cache_update(&cache_t, &update, &idx, trtx::KVCacheMode::kLINEAR)
                    .map_err(|e| trt_err(name, e))?;
                layer.output(&network, 0).map_err(|e| trt_err(name, e))?
            }
        };
        if !matches!(node.op, Op::Input { .. }) {
            tensor.set_name(&mut network, name).map_err(|e| trt_err(name, e))?;
        }
        tensors.insert(node.name.clone(), tensor);
    }
    for output in &desc.outputs {
        let tensor = tensors
            .get(output)
            .copied()
            .ok_or_else(|| net_err(output, "marked as an output but no node produces it"))?;
        if tensor.is_network_input(&network) {
            return Err(net_err(output, "an engine input cannot also be an engine output"));
        }
        network.mark_output(&tensor);
    }

    let io = capture_io(&network, lib)?;

    let mut config = builder.create_config().map_err(|e| build_err("creating the builder config", e))?;
    config.set_memory_pool_limit(trtx::MemoryPoolType::kWORKSPACE, options.workspace_bytes);
    #[cfg(feature = "progress")]
    if options.progress {
        let monitor = ProgressBars {
            multi: indicatif::MultiProgress::new(),
            bars: std::sync::Mutex::new(HashMap::new()),
        };
        config
            .set_progress_monitor(Box::new(monitor))
            .map_err(|e| build_err("setting the progress monitor", e))?;
    }
    let started = Instant::now();
    let plan = builder
        .build_serialized_network(&mut network, &mut config)
        .map_err(|e| build_err("buildSerializedNetwork", e))?;
    let build_time = started.elapsed();
    let plan = plan.to_vec();
    tracing::info!(bytes = plan.len(), ms = build_time.as_millis() as u64, "built TensorRT-RTX engine");
    Ok(BuiltEngine { plan, io, build_time })
}

/// Reads I/O tensors and KV-cache aliases back from TensorRT's network.
fn capture_io(network: &trtx::NetworkDefinition<'_>, lib: &library::Library) -> Result<EngineIo> {
    let describe = |tensor: trtx::Tensor<'_>, mode: IoMode| -> Result<IoTensor> {
        let name = tensor
            .name(network)
            .map_err(|e| Error::Trt { call: "ITensor::getName", message: e.to_string() })?;
        let shape = tensor
            .dimensions(network)
            .map_err(|e| Error::Trt { call: "ITensor::getDimensions", message: e.to_string() })?;
        Ok(IoTensor { name, mode, dtype: dtype_name(tensor.data_type(network)), shape })
    };
    let mut tensors = Vec::new();
    for index in 0..network.nb_inputs() {
        let t = network.input(index).map_err(|e| Error::Trt { call: "getInput", message: e.to_string() })?;
        tensors.push(describe(t, IoMode::Input)?);
    }
    for index in 0..network.nb_outputs() {
        let t =
            network.output(index).map_err(|e| Error::Trt { call: "getOutput", message: e.to_string() })?;
        tensors.push(describe(t, IoMode::Output)?);
    }
    let mut aliases = Vec::new();
    for index in 0..network.nb_layers() {
        let layer =
            network.layer(index).map_err(|e| Error::Trt { call: "getLayer", message: e.to_string() })?;
        if layer.layer_type_dynamic() != trtx::LayerType::kKVCACHE_UPDATE {
            continue;
        }
        let cache = layer
            .input(network, 0)
            .map_err(|e| Error::Trt { call: "ILayer::getInput", message: e.to_string() })?;
        let out = layer
            .output(network, 0)
            .map_err(|e| Error::Trt { call: "ILayer::getOutput", message: e.to_string() })?;
        if cache.is_network_input(network) && out.is_network_output(network) {
            let input = cache
                .name(network)
                .map_err(|e| Error::Trt { call: "ITensor::getName", message: e.to_string() })?;
            let output = out
                .name(network)
                .map_err(|e| Error::Trt { call: "ITensor::getName", message: e.to_string() })?;
            aliases.push(AliasPair { output, input });
        }
    }
    Ok(EngineIo {
        library: Some(lib.version.describe()),
        reports_aliases: lib.version.reports_aliases(),
        tensors,
        aliases,
    })
}
