//! Run-time compiled kernels: NVRTC compiles a CUDA C source to PTX, the driver loads it into a context, and
//! [`Context::compile_module`] does both once per process per device, keyed by the source's hash and the
//! options.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result as driver_result, sys};
use cudarc::nvrtc::result as nvrtc;

use crate::context::Context;
use crate::driver::{self, guard};
use crate::error::{CompileFailure, Error, Result};
use crate::stream::StreamRef;

/// Whether `libnvrtc` can be loaded.
fn nvrtc_present() -> bool {
    // SAFETY: `is_culib_present` only `dlopen`s NVRTC's library names and drops what it opened; loading NVRTC
    // runs its initialisers, which have no preconditions.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

fn unavailable(reason: String) -> Error {
    Error::LibraryUnavailable { library: "nvrtc", reason }
}

fn c_text(call: &'static str, what: &str, text: &str) -> Result<CString> {
    CString::new(text).map_err(|_| Error::OutOfRange { call, what: format!("{what} with a NUL byte") })
}

/// The program name NVRTC reports in its log: the source's xxh3-128.
fn program_name(source: &str) -> String {
    format!("module_{:032x}.cu", xxhash_rust::xxh3::xxh3_128(source.as_bytes()))
}

/// Compiles CUDA C `source` to PTX with NVRTC's `options` (e.g. `--gpu-architecture=compute_90`). Needs
/// `libnvrtc`, not a driver or a GPU.
///
/// # Errors
/// [`Error::LibraryUnavailable`] (`NotSupported`) without NVRTC; [`Error::Compile`] with NVRTC's log when
/// the source does not compile; [`Error::OutOfRange`] for a source or option containing a NUL byte.
pub fn compile_ptx(source: &str, options: &[&str]) -> Result<String> {
    let name = program_name(source);
    let c_source = c_text("nvrtcCreateProgram", "a source", source)?;
    let c_name = c_text("nvrtcCreateProgram", "a name", &name)?;
    for option in options {
        c_text("nvrtcCompileProgram", "an option", option)?;
    }
    if !nvrtc_present() {
        let tried = driver::candidates(&["nvrtc"]);
        return Err(unavailable(format!(
            "libnvrtc could not be loaded ({} names tried, libnvrtc.so.13 among them); install the CUDA \
             toolkit's NVRTC or add its directory to LD_LIBRARY_PATH",
            tried.len()
        )));
    }
    let failed = |reason: String, log: String| {
        Error::Compile(Box::new(CompileFailure {
            name: name.clone(),
            options: options.join(" "),
            reason,
            log: log.trim().to_owned(),
        }))
    };
    guard(
        |message| unavailable(format!("NVRTC lacks an entry point: {message}")),
        || {
            let program = nvrtc::create_program(&c_source, Some(&c_name))
                .map_err(|e| failed(format!("{:?}", e.0), String::new()))?;
            // SAFETY: `program` was created above and is destroyed once, below; every option is free of NUL
            // bytes (checked above), so cudarc's conversion cannot panic.
            let compiled = unsafe { nvrtc::compile_program(program, options) };
            let outcome = match compiled {
                // SAFETY: `program` is live and compiled.
                Ok(()) => unsafe { nvrtc::get_ptx(program) }
                    .map(|ptx| {
                        ptx.iter().take_while(|&&c| c != 0).map(|&c| c as u8 as char).collect::<String>()
                    })
                    .map_err(|e| failed(format!("nvrtcGetPTX: {:?}", e.0), String::new())),
                Err(e) => {
                    // SAFETY: `program` is live; its log is there whether or not it compiled.
                    let log = unsafe { nvrtc::get_program_log(program) }
                        .map(|log| log.iter().take_while(|&&c| c != 0).map(|&c| c as u8 as char).collect())
                        .unwrap_or_default();
                    Err(failed(format!("{:?}", e.0), log))
                }
            };
            // SAFETY: `program` was created above and is destroyed once, here.
            if let Err(err) = unsafe { nvrtc::destroy_program(program) } {
                tracing::warn!("leaking an NVRTC program: {:?}", err.0);
            }
            outcome
        },
    )
}

/// A loaded module (`cuModuleLoadData`), unloaded when the last [`Function`] of it and the cache's reference
/// are gone.
pub struct Module {
    raw: sys::CUmodule,
    ctx: Context,
    name: String,
}

// SAFETY: a `CUmodule` may be used from any host thread with its context current (every use binds it); the
// handle is owned by this value alone.
unsafe impl Send for Module {}
// SAFETY: `&self` only looks functions up, which the driver allows from several threads at once.
unsafe impl Sync for Module {}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module").field("name", &self.name).field("device", &self.ctx.ordinal()).finish()
    }
}

impl Module {
    /// The kernel `name` (an `extern "C" __global__` function of the source).
    ///
    /// # Errors
    /// [`Error::Driver`] (`CUDA_ERROR_NOT_FOUND`) when the module has no such function.
    pub fn function(self: &Arc<Module>, name: &str) -> Result<Function> {
        let c_name = c_text("cuModuleGetFunction", "a function name", name)?;
        self.ctx.bind()?;
        let raw = driver::call("cuModuleGetFunction", self.ctx.ordinal(), || {
            // SAFETY: `raw` is a live module of this context (unloaded only on drop).
            unsafe { driver_result::module::get_function(self.raw, c_name) }
        })?;
        Ok(Function { raw, module: Arc::clone(self) })
    }

    /// The bytes of the module's `__device__` variable `name`, copied to the host once the context's work
    /// is done (a synchronous copy: a host synchronisation, counted by [`crate::stats`]). For diagnostics that
    /// kernels leave in module memory, such as a tuning build's trace.
    ///
    /// # Errors
    /// [`Error::Driver`] (`CUDA_ERROR_NOT_FOUND`) when the module has no such variable, or when the copy fails.
    pub fn read_global(&self, name: &str) -> Result<Vec<u8>> {
        let c_name = c_text("cuModuleGetGlobal", "a variable name", name)?;
        self.ctx.bind()?;
        let (ptr, len) = driver::call("cuModuleGetGlobal", self.ctx.ordinal(), || {
            // SAFETY: `raw` is a live module of this context (unloaded only on drop).
            unsafe { driver_result::module::get_global(self.raw, c_name) }
        })?;
        self.ctx.synchronize()?;
        let mut out = vec![0u8; len];
        crate::stats::count_host_sync();
        driver::call("cuMemcpyDtoH", self.ctx.ordinal(), || {
            // SAFETY: the context is current; `ptr` is the variable's address in this live module, `len` its
            // size as the driver reported it, and `out` holds exactly `len` bytes. The copy is synchronous.
            unsafe { driver_result::memcpy_dtoh_sync(&mut out, ptr) }
        })?;
        Ok(out)
    }

    /// The program name NVRTC compiled it under (`module_<xxh3-128 of the source>.cu`).
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let unloaded = self.ctx.bind().and_then(|()| {
            driver::call("cuModuleUnload", self.ctx.ordinal(), || {
                // SAFETY: `raw` was loaded by `cuModuleLoadData` and is unloaded once, here; no `Function` of it
                // remains (each holds an `Arc` of this module).
                unsafe { driver_result::module::unload(self.raw) }
            })
        });
        if let Err(err) = unloaded {
            tracing::warn!("leaking CUDA module {}: {err}", self.name);
        }
    }
}

/// Grid, block and dynamic shared memory of one kernel launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}

/// A kernel of a loaded [`Module`] (which it keeps loaded).
#[derive(Debug)]
pub struct Function {
    raw: sys::CUfunction,
    module: Arc<Module>,
}

// SAFETY: a `CUfunction` may be launched from any host thread with its context current (every use binds it).
unsafe impl Send for Function {}
// SAFETY: launching from several threads at once is allowed by the driver.
unsafe impl Sync for Function {}

impl Function {
    /// Queues the kernel on `stream` (`cuLaunchKernel`); binds the module's context first. This path stays
    /// on `cuLaunchKernel`, which every driver has, rather than sharing [`Function::launch_overlapped`]'s
    /// `cuLaunchKernelEx`, which drivers before CUDA 12 lack.
    ///
    /// # Safety
    /// `params` holds one pointer per kernel parameter, in order, each to a value of that parameter's type
    /// (read during this call); every memory the kernel reads or writes through them is valid for that use and
    /// not used by anything else until the stream has executed the kernel; the launch configuration keeps the
    /// kernel within the bounds it was written for.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver refuses the launch (e.g. too many threads per block).
    pub unsafe fn launch(
        &self,
        config: LaunchConfig,
        stream: StreamRef<'_>,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let ctx = &self.module.ctx;
        ctx.bind()?;
        driver::call("cuLaunchKernel", ctx.ordinal(), || {
            // SAFETY: `raw` belongs to a loaded module (kept by `self.module`); the context is current;
            // `params` and the memory they reach are valid per this function's contract; `stream` is valid for
            // its borrow.
            unsafe {
                driver_result::launch_kernel(
                    self.raw,
                    config.grid,
                    config.block,
                    config.shared_mem_bytes,
                    stream.cu(),
                    params,
                )
            }
        })
    }

    /// As [`Function::launch`], with programmatic stream serialization (`cuLaunchKernelEx`; compute
    /// capability 9.0 and later, see [`Context::overlaps_launches`]): the kernel may start while the previous
    /// kernel of `stream` is still running, once that kernel has executed `griddepcontrol.launch_dependents`
    /// (or finished). A CUDA graph captured from the stream keeps the overlap.
    ///
    /// # Safety
    /// As [`Function::launch`]; and the kernel executes `griddepcontrol.wait` before it reads anything the
    /// previous kernel of `stream` writes, or writes anything that kernel reads or writes.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver refuses the launch.
    pub unsafe fn launch_overlapped(
        &self,
        config: LaunchConfig,
        stream: StreamRef<'_>,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let mut attributes = [overlap_attribute()];
        // SAFETY: `launch_ex`'s contract is `launch`'s, which this function's includes; the kernel waits as the
        // overlap attribute requires, per this function's contract.
        unsafe { self.launch_ex(config, stream, params, &mut attributes) }
    }

    /// As [`Function::launch_overlapped`] when `overlapped`, else as [`Function::launch`] (but through
    /// `cuLaunchKernelEx`), in thread-block clusters of `cluster` blocks (x, y, z; each divides the grid's):
    /// a cluster's blocks run at once, on one GPU processing cluster, and may read each other's shared
    /// memory. Compute capability 9.0 and later; a cluster of more than 8 blocks also needs
    /// [`Function::allow_large_clusters`].
    ///
    /// # Safety
    /// As [`Function::launch_overlapped`] when `overlapped`, else as [`Function::launch`]; and the kernel was
    /// written for clusters of this shape (every block of a cluster meets the cluster's barriers).
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver refuses the launch (a cluster that does not divide the grid, or
    /// larger than the device or the function allows).
    pub unsafe fn launch_clustered(
        &self,
        config: LaunchConfig,
        cluster: (u32, u32, u32),
        overlapped: bool,
        stream: StreamRef<'_>,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let mut attributes = [cluster_attribute(cluster), overlap_attribute()];
        let used = if overlapped { 2 } else { 1 };
        // SAFETY: `launch_ex`'s contract is `launch`'s, which this function's includes; the kernel meets its
        // clusters' barriers and (with the overlap attribute) waits as it requires, per this contract.
        unsafe { self.launch_ex(config, stream, params, &mut attributes[..used]) }
    }

    /// `cuLaunchKernelEx` with `attributes`.
    ///
    /// # Safety
    /// As [`Function::launch`], and whatever `attributes` ask of the kernel (see the callers).
    unsafe fn launch_ex(
        &self,
        config: LaunchConfig,
        stream: StreamRef<'_>,
        params: &mut [*mut c_void],
        attributes: &mut [sys::CUlaunchAttribute],
    ) -> Result<()> {
        let ctx = &self.module.ctx;
        ctx.bind()?;
        let launch = cu_launch_config(config, stream.cu(), attributes);
        driver::call("cuLaunchKernelEx", ctx.ordinal(), || {
            // SAFETY: `launch` and the attributes it points to live across the call; `raw` belongs to a loaded
            // module (kept by `self.module`); the context is current; `params` and the memory they reach are
            // valid per this function's contract; `stream` is valid for its borrow; no `extra` array.
            unsafe { sys::cuLaunchKernelEx(&launch, self.raw, params.as_mut_ptr(), std::ptr::null_mut()) }
                .result()
        })
    }

    /// Lets the function run in clusters of more than 8 blocks (the portable most), up to what the device
    /// allows (`CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`; 16 on the H100 and H200).
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver refuses (e.g. before compute capability 9.0).
    pub fn allow_large_clusters(&self) -> Result<()> {
        self.set_attribute(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
    }

    /// Asks the driver to run the function with `percent` of each SM's unified L1 and shared memory as
    /// shared memory (`CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT`, a hint): kernels of one stream
    /// that prefer the same split spare the SMs a reconfiguration between them.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver refuses (a percentage past 100).
    pub fn prefer_shared_carveout(&self, percent: u32) -> Result<()> {
        let percent = std::ffi::c_int::try_from(percent).unwrap_or(std::ffi::c_int::MAX);
        self.set_attribute(
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
            percent,
        )
    }

    /// `cuFuncSetAttribute` of `attribute` to `value`.
    fn set_attribute(&self, attribute: sys::CUfunction_attribute, value: std::ffi::c_int) -> Result<()> {
        let ctx = &self.module.ctx;
        ctx.bind()?;
        driver::call("cuFuncSetAttribute", ctx.ordinal(), || {
            // SAFETY: `raw` belongs to a loaded module (kept by `self.module`); the context is current.
            unsafe { sys::cuFuncSetAttribute(self.raw, attribute, value) }.result()
        })
    }

    /// The most blocks of `config` (its block size and shared memory) that one cluster of this function can
    /// hold on the device, all resident at once (`cuOccupancyMaxPotentialClusterSize`, which respects the
    /// function's launch bounds and [`Function::allow_large_clusters`]).
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver refuses (e.g. before compute capability 9.0).
    pub fn max_cluster_blocks(&self, config: LaunchConfig) -> Result<u32> {
        self.occupancy(
            "cuOccupancyMaxPotentialClusterSize",
            sys::cuOccupancyMaxPotentialClusterSize,
            config,
            &mut [],
        )
    }

    /// How many clusters of `cluster` blocks of `config` (its block size and shared memory; the grid is
    /// ignored) the device holds resident at once (`cuOccupancyMaxActiveClusters`): where a launch has more,
    /// the rest wait for a second wave.
    ///
    /// # Errors
    /// [`Error::Driver`] when the driver refuses (e.g. a cluster larger than the function allows).
    pub fn max_active_clusters(&self, config: LaunchConfig, cluster: (u32, u32, u32)) -> Result<u32> {
        // The driver checks the grid against the cluster: one cluster's worth.
        let config = LaunchConfig { grid: cluster, ..config };
        let attributes = &mut [cluster_attribute(cluster)];
        self.occupancy("cuOccupancyMaxActiveClusters", sys::cuOccupancyMaxActiveClusters, config, attributes)
    }

    /// A driver occupancy query `query` (named `call`) of this function launched as `config` with
    /// `attributes`: its count, 0 if negative.
    fn occupancy(
        &self,
        call: &'static str,
        query: unsafe fn(*mut std::ffi::c_int, sys::CUfunction, *const sys::CUlaunchConfig) -> sys::CUresult,
        config: LaunchConfig,
        attributes: &mut [sys::CUlaunchAttribute],
    ) -> Result<u32> {
        let ctx = &self.module.ctx;
        ctx.bind()?;
        let launch = cu_launch_config(config, std::ptr::null_mut(), attributes);
        let mut count: std::ffi::c_int = 0;
        driver::call(call, ctx.ordinal(), || {
            // SAFETY: `query` is one of the driver's occupancy queries (count, function, launch configuration);
            // `launch`, the attributes it points to and `count` live across the call; `raw` belongs to a loaded
            // module (kept by `self.module`); the context is current.
            unsafe { query(&mut count, self.raw, &launch) }.result()
        })?;
        Ok(u32::try_from(count).unwrap_or(0))
    }

    /// The module it belongs to.
    pub fn module(&self) -> &Arc<Module> {
        &self.module
    }
}

/// The driver's launch configuration of `config` on `stream` with `attributes` (which it points to: they must
/// outlive its use).
fn cu_launch_config(
    config: LaunchConfig,
    stream: sys::CUstream,
    attributes: &mut [sys::CUlaunchAttribute],
) -> sys::CUlaunchConfig {
    sys::CUlaunchConfig {
        gridDimX: config.grid.0,
        gridDimY: config.grid.1,
        gridDimZ: config.grid.2,
        blockDimX: config.block.0,
        blockDimY: config.block.1,
        blockDimZ: config.block.2,
        sharedMemBytes: config.shared_mem_bytes,
        hStream: stream,
        attrs: attributes.as_mut_ptr(),
        numAttrs: attributes.len() as u32,
    }
}

/// A launch attribute `id` with its value zeroed (the caller sets the field `id` names).
fn launch_attribute(id: sys::CUlaunchAttributeID) -> sys::CUlaunchAttribute {
    sys::CUlaunchAttribute { id, pad: [0; 4], value: sys::CUlaunchAttributeValue { pad: [0; 64] } }
}

/// The launch attribute of programmatic stream serialization (see [`Function::launch_overlapped`]).
fn overlap_attribute() -> sys::CUlaunchAttribute {
    let mut attribute =
        launch_attribute(sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
    attribute.value.programmaticStreamSerializationAllowed = 1;
    attribute
}

/// The launch attribute of clusters of `blocks` (x, y, z; see [`Function::launch_clustered`]).
fn cluster_attribute(blocks: (u32, u32, u32)) -> sys::CUlaunchAttribute {
    let mut attribute = launch_attribute(sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
    attribute.value.clusterDim.x = blocks.0;
    attribute.value.clusterDim.y = blocks.1;
    attribute.value.clusterDim.z = blocks.2;
    attribute
}

/// A cache key: device, source hash, options.
type Key = (i32, u128, Vec<String>);

fn cache() -> &'static Mutex<HashMap<Key, Arc<Module>>> {
    static MODULES: OnceLock<Mutex<HashMap<Key, Arc<Module>>>> = OnceLock::new();
    MODULES.get_or_init(Mutex::default)
}

impl Context {
    /// The module compiled from CUDA C `source` with NVRTC `options` and loaded into this context: compiled
    /// once per process per device, keyed by the source's xxh3-128 and the options; later calls return the
    /// same module. Without an architecture option (`--gpu-architecture` / `-arch`), the device's own virtual
    /// architecture (`compute_<major><minor>`) is added.
    ///
    /// # Errors
    /// As [`compile_ptx`]; [`Error::Driver`] when the driver cannot load the PTX.
    pub fn compile_module(&self, source: &str, options: &[&str]) -> Result<Arc<Module>> {
        let mut options: Vec<String> = options.iter().map(|o| (*o).to_owned()).collect();
        if !options.iter().any(|o| o.starts_with("--gpu-architecture") || o.starts_with("-arch")) {
            let (major, minor) = self.compute_capability();
            options.push(format!("--gpu-architecture=compute_{major}{minor}"));
        }
        let key: Key = (self.ordinal(), xxhash_rust::xxh3::xxh3_128(source.as_bytes()), options);
        let mut modules = cache().lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(module) = modules.get(&key) {
            return Ok(Arc::clone(module));
        }
        let option_refs: Vec<&str> = key.2.iter().map(String::as_str).collect();
        let ptx = compile_ptx(source, &option_refs)?;
        let image = c_text("cuModuleLoadData", "PTX", &ptx)?;
        self.bind()?;
        let raw = driver::call("cuModuleLoadData", self.ordinal(), || {
            // SAFETY: `image` is NUL-terminated PTX text that lives for the call; the context is current.
            unsafe { driver_result::module::load_data(image.as_ptr().cast()) }
        })?;
        let module = Arc::new(Module { raw, ctx: self.clone(), name: program_name(source) });
        tracing::debug!(module = module.name(), device = self.ordinal(), "compiled and loaded a CUDA module");
        modules.insert(key, Arc::clone(&module));
        Ok(module)
    }
}
