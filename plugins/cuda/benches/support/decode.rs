//! One decode step of a reference graph on the CUDA delegate, timed as a CUDA graph replayed at a held position:
//! the graph packed as every exporter packs it (`delegate-pack`: every input then every output a binding, each
//! in-place output aliased to its input), initialised through the plugin ABI, every argument in device memory.
//!
//! Arguments are laid out from the graph alone: an input that an output updates in place (a KV cache, an
//! `assign` target such as StaticCache's `cumulative_length`) is passed in-out and its output bound to it; an
//! `i64` input of rank 2 (`input_ids [1, T]`) holds token 1, any other `i64` input (`cache_position`, a
//! counter) the position; float inputs and caches start at zero; other outputs are written to their own memory.

use std::collections::HashMap;

use cuda_rt::{Allocation, Context, Device, Event, Graph as CudaGraph, Stream};
use delegate_abi::host::{ArgList, Instance, Plugin, Slot};
use delegate_abi::{CudaStream, DTypeCode, InitContext};
use host_runtime::cuda::{push_raw, push_raw_input, Access, RawInput, RawMemory};
use ref_graph::{ElemType, Graph, TensorId};

use super::chain::Chain;

/// What a timed decode step gives (all zero where nothing was timed).
#[derive(Default)]
pub struct Timed {
    /// GPU microseconds a step, the mean of the timed replays.
    pub gpu_us_per_step: f64,
    /// Seconds spent packing the blob and initialising the delegate (upload and kernel compilation included).
    pub init_s: f64,
    /// Launches a step's CUDA graph holds (its nodes).
    pub launches: usize,
    /// GPU microseconds of an empty chain of as many launches, timed alike (`chain.rs`): the step's launch
    /// floor.
    pub empty_chain_us: f64,
    /// GPU microseconds of a relay chain of as many launches (each reads the last one's output): the floor of
    /// as many launches that depend on each other.
    pub relay_chain_us: f64,
}

fn text(err: impl std::fmt::Display) -> String {
    err.to_string()
}

/// Packs `graph`, initialises the CUDA delegate with it, runs one plain call (the delegate checks new pointers
/// with the driver once), captures a second one and times `steps` replays after 10 untimed ones.
pub fn time_decode(graph: &Graph, position: i64, steps: usize) -> Result<Timed, String> {
    let ctx = Context::open(0).map_err(text)?;
    let started = std::time::Instant::now();
    let blob = delegate_pack::pack_graph(graph, cuda_delegate::BACKEND_ID).map_err(text)?;
    let plugin = Plugin::embedded(cuda_delegate::delegate_root()).map_err(text)?;
    let mut instance =
        plugin.init(&InitContext { blob: &blob, compile_specs: &[], runtime_specs: &[] }).map_err(text)?;
    drop(blob);
    let init_s = started.elapsed().as_secs_f64();
    let mut io = Io::new(&ctx, graph, position)?;
    let stream = Stream::new(&ctx).map_err(text)?;
    call(&mut instance, graph, &mut io, &stream)?;
    stream.synchronize().map_err(text)?;
    stream.begin_capture().map_err(text)?;
    let captured = call(&mut instance, graph, &mut io, &stream);
    let step = stream.end_capture().map_err(text)?;
    captured?;
    // SAFETY: the captured call's memory (`io`, the instance's own) lives and is touched by nothing else until
    // `time_replays` returns, having synchronised the stream; the stream is of the graph's context.
    let gpu_us_per_step = unsafe { time_replays(&ctx, &stream, &step, steps) }?;
    let launches = step.nodes();
    let empty_chain_us = super::chain::time_chain(&ctx, launches, steps, Chain::Empty)?;
    let relay_chain_us = super::chain::time_chain(&ctx, launches, steps, Chain::Relay)?;
    Ok(Timed { gpu_us_per_step, init_s, launches, empty_chain_us, relay_chain_us })
}

/// GPU microseconds one replay of `graph` on `stream` takes: the mean of `replays` timed replays after 10
/// untimed ones, the stream synchronised before it returns.
///
/// # Safety
/// Every memory the graph's kernels touch is alive and used by nothing else until this returns; `stream` is of
/// the graph's context.
pub unsafe fn time_replays(
    ctx: &Context,
    stream: &Stream,
    graph: &CudaGraph,
    replays: usize,
) -> Result<f64, String> {
    let (start, end) = (Event::timed(ctx).map_err(text)?, Event::timed(ctx).map_err(text)?);
    // SAFETY: the memory the graph touches is valid until this function returns, per its contract, which
    // synchronises the stream first; the stream is of the graph's context.
    let replay = || unsafe { graph.launch(stream.as_ref()) }.map_err(text);
    for _ in 0..10 {
        replay()?;
    }
    start.record(stream.as_ref()).map_err(text)?;
    for _ in 0..replays {
        replay()?;
    }
    end.record(stream.as_ref()).map_err(text)?;
    end.synchronize().map_err(text)?;
    Ok(f64::from(end.elapsed_ms(&start).map_err(text)?) * 1e3 / replays as f64)
}

/// The call's device memory: one allocation per graph input, and per output not written in place.
struct Io {
    inputs: Vec<Allocation<Device>>,
    outputs: Vec<Option<Allocation<Device>>>,
}

impl Io {
    fn new(ctx: &Context, graph: &Graph, position: i64) -> Result<Io, String> {
        let targets: Vec<TensorId> = graph.in_place_pairs().map(|(_, input)| input).collect();
        let alloc = |id: TensorId| Allocation::<Device>::zeroed(ctx, graph.tensor(id).nbytes()).map_err(text);
        let mut inputs = Vec::with_capacity(graph.inputs().len());
        for &id in graph.inputs() {
            let mut memory = alloc(id)?;
            let decl = graph.tensor(id);
            if decl.dtype == ElemType::I64 && !targets.contains(&id) {
                let value = if decl.shape.len() == 2 { 1 } else { position };
                memory.write(bytemuck::cast_slice(&vec![value; decl.numel()])).map_err(text)?;
            }
            inputs.push(memory);
        }
        let outputs = graph
            .outputs()
            .iter()
            .map(|&id| if graph.in_place_of(id).is_some() { Ok(None) } else { alloc(id).map(Some) })
            .collect::<Result<_, _>>()?;
        Ok(Io { inputs, outputs })
    }
}

fn code_and_shape(graph: &Graph, id: TensorId) -> Result<(DTypeCode, Vec<i64>), String> {
    let decl = graph.tensor(id);
    let code = DTypeCode::try_from(decl.dtype.dtype()).map_err(|e| format!("{}: {e:?}", decl.name))?;
    Ok((code, decl.shape.iter().map(|&d| d as i64).collect()))
}

fn call(instance: &mut Instance, graph: &Graph, io: &mut Io, stream: &Stream) -> Result<(), String> {
    let targets: Vec<TensorId> = graph.in_place_pairs().map(|(_, input)| input).collect();
    let mut list = ArgList::new();
    let mut slots: HashMap<TensorId, Slot> = HashMap::new();
    for (&id, memory) in graph.inputs().iter().zip(io.inputs.iter_mut()) {
        let (code, shape) = code_and_shape(graph, id)?;
        if targets.contains(&id) {
            let slot =
                push_raw(&mut list, RawMemory::device(memory), code, &shape, Access::InOut).map_err(text)?;
            slots.insert(id, slot);
        } else {
            push_raw_input(&mut list, RawInput::device(memory), code, &shape).map_err(text)?;
        }
    }
    for (&id, memory) in graph.outputs().iter().zip(io.outputs.iter_mut()) {
        let (code, shape) = code_and_shape(graph, id)?;
        match (graph.in_place_of(id), memory) {
            (Some(input), _) => {
                let name = &graph.tensor(id).name;
                let slot = slots.remove(&input).ok_or_else(|| format!("{name}: a second in-place output"))?;
                list.push_output_in_place(slot, code, &shape).map_err(text)?;
            }
            (None, Some(memory)) => {
                push_raw(&mut list, RawMemory::device(memory), code, &shape, Access::Write).map_err(text)?;
            }
            (None, None) => return Err(format!("{}: no memory for this output", graph.tensor(id).name)),
        }
    }
    // SAFETY: `stream` is a live stream of the device's primary context, alive until it is synchronised.
    let raw = unsafe { CudaStream::from_raw(stream.as_ref().as_raw()) };
    instance.execute(&mut list, raw).map(|_| ()).map_err(text)
}
