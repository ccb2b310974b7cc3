//! A small network description and `build_engine`: TensorRT-RTX builds it ahead of time, on CPU.

#[cfg(feature = "progress")]
use std::collections::HashMap;
use std::time::{Duration, Instant};

use blob_format::model::DType;
use trt_exec::{dtype_name, library, AliasPair, EngineIo, IoMode, IoTensor, LogSink};

use crate::error::{Error, Result};
use crate::layers::{add_node, net_err, trt_err, Tensors};

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
    pub(crate) fn trt(self) -> trtx::ElementWiseOperation {
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
    pub(crate) fn trt(self) -> trtx::UnaryOperation {
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

/// Builds `desc` into a serialized TensorRT-RTX plan, on CPU (TensorRT-RTX builds ahead of time without a GPU).
///
/// The returned [`BuiltEngine::io`] is read back from TensorRT's network after construction: I/O names,
/// modes, dtypes and shapes as TensorRT resolved them, and one alias per `IKVCacheUpdateLayer` whose output is
/// an engine output and whose cache is an engine input.
pub fn build_engine(desc: &NetworkDesc, options: &BuildOptions) -> Result<BuiltEngine> {
    let lib = library::load()?;
    let sink = LogSink::default();
    let logger = trtx::Logger::new(sink.clone()).map_err(|e| build_err(&sink, "creating the logger", e))?;
    let mut builder = trtx::Builder::new(&logger).map_err(|e| build_err(&sink, "creating the builder", e))?;
    let mut network = builder.create_network(0).map_err(|e| build_err(&sink, "creating the network", e))?;
    let tensors = add_nodes(&mut network, &desc.nodes)?;
    mark_outputs(&mut network, &tensors, &desc.outputs)?;
    let io = capture_io(&network, lib)?;
    let mut config =
        builder.create_config().map_err(|e| build_err(&sink, "creating the builder config", e))?;
    configure(&mut config, options, &sink)?;
    let started = Instant::now();
    let plan = builder
        .build_serialized_network(&mut network, &mut config)
        .map_err(|e| build_err(&sink, "buildSerializedNetwork", e))?;
    let build_time = started.elapsed();
    let plan = plan.to_vec();
    tracing::info!(bytes = plan.len(), ms = build_time.as_millis() as u64, "built TensorRT-RTX engine");
    Ok(BuiltEngine { plan, io, build_time })
}

/// A build step TensorRT refused, with TensorRT's error-level log lines so far.
fn build_err(sink: &LogSink, what: &str, e: trtx::Error) -> Error {
    Error::Build { message: format!("{what}: {e}"), log: sink.take_errors() }
}

/// Adds every node's layer in order, each output tensor named after its node.
fn add_nodes<'n>(network: &mut trtx::NetworkDefinition<'n>, nodes: &[Node]) -> Result<Tensors<'n>> {
    let mut tensors = Tensors::new();
    for node in nodes {
        let name = node.name.as_str();
        if tensors.contains_key(name) {
            return Err(net_err(name, "a tensor of this name already exists"));
        }
        let tensor = add_node(network, &tensors, node)?;
        if !matches!(node.op, Op::Input { .. }) {
            tensor.set_name(network, name).map_err(|e| trt_err(name, e))?;
        }
        tensors.insert(node.name.clone(), tensor);
    }
    Ok(tensors)
}

/// Marks `outputs` as the engine's outputs, in order; none may be an engine input.
fn mark_outputs(
    network: &mut trtx::NetworkDefinition<'_>,
    tensors: &Tensors<'_>,
    outputs: &[String],
) -> Result<()> {
    for output in outputs {
        let tensor = tensors
            .get(output)
            .copied()
            .ok_or_else(|| net_err(output, "marked as an output but no node produces it"))?;
        if tensor.is_network_input(network) {
            return Err(net_err(output, "an engine input cannot also be an engine output"));
        }
        network.mark_output(&tensor);
    }
    Ok(())
}

/// Applies `options` to the builder config: the workspace pool, and the progress bars when asked for.
#[cfg_attr(not(feature = "progress"), allow(unused_variables))]
fn configure(config: &mut trtx::BuilderConfig<'_>, options: &BuildOptions, sink: &LogSink) -> Result<()> {
    config.set_memory_pool_limit(trtx::MemoryPoolType::kWORKSPACE, options.workspace_bytes);
    #[cfg(feature = "progress")]
    if options.progress {
        let monitor = ProgressBars {
            multi: indicatif::MultiProgress::new(),
            bars: std::sync::Mutex::new(HashMap::new()),
        };
        config
            .set_progress_monitor(Box::new(monitor))
            .map_err(|e| build_err(sink, "setting the progress monitor", e))?;
    }
    Ok(())
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
