//! cuBLAS: one handle per context, used on the caller's stream (`libcublas` loaded at run time).
//!
//! A handle may own a workspace ([`Blas::set_workspace`]): every call then hands it to cuBLAS after binding
//! the call's stream (`cublasSetStream` resets it to cuBLAS's own pool), so a product allocates nothing and
//! can be captured into a CUDA graph.

use std::ffi::c_void;

use cudarc::cublas::{result as blas, sys};

use crate::context::Context;
use crate::driver::{self, guard};
use crate::error::{Error, Result};
use crate::memory::{Allocation, Device, DevicePtr};
use crate::stream::StreamRef;

/// Whether `libcublas` can be loaded.
fn cublas_present() -> bool {
    // SAFETY: `is_culib_present` only `dlopen`s cuBLAS's library names and drops what it opened; loading
    // cuBLAS runs its initialisers, which have no preconditions.
    unsafe { sys::is_culib_present() }
}

fn unavailable(reason: String) -> Error {
    Error::LibraryUnavailable { library: "cublas", reason }
}

/// One single-precision matrix product `C = alpha * op(A) * op(B) + beta * C` in cuBLAS's column-major
/// convention: `op(A)` is `m × k`, `op(B)` is `k × n`, `C` is `m × n`; `lda`, `ldb`, `ldc` are the leading
/// dimensions (rows of the stored matrix). A row-major product `C = A B` is the column-major `Cᵀ = Bᵀ Aᵀ`:
/// swap the operands and `m`/`n`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sgemm {
    /// Whether `A` is transposed.
    pub transpose_a: bool,
    /// Whether `B` is transposed.
    pub transpose_b: bool,
    /// Rows of `op(A)` and `C`.
    pub m: usize,
    /// Columns of `op(B)` and `C`.
    pub n: usize,
    /// Columns of `op(A)`, rows of `op(B)`.
    pub k: usize,
    /// Scale of the product.
    pub alpha: f32,
    /// Device address of `A` (f32).
    pub a: DevicePtr,
    /// Leading dimension of `A`.
    pub lda: usize,
    /// Device address of `B` (f32).
    pub b: DevicePtr,
    /// Leading dimension of `B`.
    pub ldb: usize,
    /// Scale of `C`'s previous contents.
    pub beta: f32,
    /// Device address of `C` (f32).
    pub c: DevicePtr,
    /// Leading dimension of `C`.
    pub ldc: usize,
}

/// The element type of a [`GemmEx`]'s three matrices; the product accumulates in f32 whatever it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmType {
    /// `f32`, multiplied in full f32 (no TF32: the handle keeps cuBLAS's default math mode).
    F32,
    /// IEEE half, on tensor cores.
    F16,
    /// bfloat16, on tensor cores.
    Bf16,
}

impl GemmType {
    fn cuda(self) -> sys::cudaDataType {
        match self {
            GemmType::F32 => sys::cudaDataType::CUDA_R_32F,
            GemmType::F16 => sys::cudaDataType::CUDA_R_16F,
            GemmType::Bf16 => sys::cudaDataType::CUDA_R_16BF,
        }
    }
}

/// One matrix product `C = alpha * op(A) * op(B) + beta * C` of `dtype` matrices, accumulated in f32
/// (`cublasGemmEx`, compute type `CUBLAS_COMPUTE_32F`): [`Sgemm`]'s column-major convention and fields, the
/// addresses holding `dtype` values; `alpha` and `beta` are f32.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GemmEx {
    /// The element type of `A`, `B` and `C`.
    pub dtype: GemmType,
    /// The product's shape, scales and matrices.
    pub product: Sgemm,
}

/// A product's dimensions as cuBLAS takes them.
struct Dims {
    ops: (sys::cublasOperation_t, sys::cublasOperation_t),
    mnk: (i32, i32, i32),
    lds: (i32, i32, i32),
}

impl Dims {
    fn of(gemm: &Sgemm, call: &'static str) -> Result<Dims> {
        let int = |what: &str, value: usize| {
            i32::try_from(value).map_err(|_| Error::OutOfRange { call, what: format!("{what} = {value}") })
        };
        let op = |t: bool| {
            if t {
                sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        Ok(Dims {
            ops: (op(gemm.transpose_a), op(gemm.transpose_b)),
            mnk: (int("m", gemm.m)?, int("n", gemm.n)?, int("k", gemm.k)?),
            lds: (int("lda", gemm.lda)?, int("ldb", gemm.ldb)?, int("ldc", gemm.ldc)?),
        })
    }
}

/// Which cuBLAS entry point queues a product.
#[derive(Clone, Copy)]
enum Entry {
    /// `cublasSgemm`: f32 matrices.
    Sgemm,
    /// `cublasGemmEx` with f32 accumulation and cuBLAS's default algorithm, matrices of this type.
    GemmEx(sys::cudaDataType),
}

impl Entry {
    /// The cuBLAS call's name, for errors.
    fn call(self) -> &'static str {
        match self {
            Entry::Sgemm => "cublasSgemm",
            Entry::GemmEx(_) => "cublasGemmEx",
        }
    }
}

/// A cuBLAS handle created in one context, destroyed on drop. Each call takes the stream it runs on.
pub struct Blas {
    handle: sys::cublasHandle_t,
    ctx: Context,
    /// The workspace every call hands cuBLAS ([`Blas::set_workspace`]), if any.
    workspace: Option<Allocation<Device>>,
}

// SAFETY: a cuBLAS handle may be used from any host thread, one at a time (every use takes `&mut self`), with
// its context current (every use binds it).
unsafe impl Send for Blas {}

impl std::fmt::Debug for Blas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Blas").field("device", &self.ctx.ordinal()).finish_non_exhaustive()
    }
}

impl Blas {
    /// A cuBLAS handle in `ctx` (`cublasCreate`).
    ///
    /// # Errors
    /// [`Error::LibraryUnavailable`] (`NotSupported`) without `libcublas`; [`Error::Blas`] when cuBLAS
    /// refuses.
    pub fn new(ctx: &Context) -> Result<Blas> {
        if !cublas_present() {
            let tried = driver::candidates(&["cublas"]);
            return Err(unavailable(format!(
                "libcublas could not be loaded ({} names tried, libcublas.so.13 among them); install cuBLAS or \
                 add its directory to LD_LIBRARY_PATH",
                tried.len()
            )));
        }
        ctx.bind()?;
        let ordinal = ctx.ordinal();
        let handle = guard(
            |message| unavailable(format!("cuBLAS lacks an entry point: {message}")),
            || {
                blas::create_handle().map_err(|e| Error::Blas {
                    call: "cublasCreate",
                    ordinal,
                    status: format!("{:?}", e.0),
                })
            },
        )?;
        Ok(Blas { handle, ctx: ctx.clone(), workspace: None })
    }

    /// Gives the handle `workspace` (device memory of its context) for every later call: cuBLAS then
    /// allocates nothing while a product runs, which a CUDA graph capture requires. cuBLAS asks for 32 MiB
    /// on Hopper (less before); a smaller one limits the algorithms it may pick.
    pub fn set_workspace(&mut self, workspace: Allocation<Device>) {
        self.workspace = Some(workspace);
    }

    /// Binds the context and `stream` (and the workspace, which binding a stream resets), then runs
    /// `call` with the handle, mapping a refusal to [`Error::Blas`] naming `name`.
    fn on_stream(
        &mut self,
        stream: StreamRef<'_>,
        name: &'static str,
        call: impl FnOnce(sys::cublasHandle_t) -> std::result::Result<(), blas::CublasError>,
    ) -> Result<()> {
        self.ctx.bind()?;
        let ordinal = self.ctx.ordinal();
        let failed = |call: &'static str| {
            move |e: blas::CublasError| Error::Blas { call, ordinal, status: format!("{:?}", e.0) }
        };
        let handle = self.handle;
        let workspace = self.workspace.as_ref().map(|w| (w.device_ptr(), w.len()));
        guard(
            |message| unavailable(format!("cuBLAS lacks an entry point: {message}")),
            || {
                // SAFETY: `handle` is live (destroyed only on drop); `stream` is valid for its borrow (the same
                // cuBLAS and driver stream handle).
                unsafe { blas::set_stream(handle, stream.cu().cast()) }.map_err(failed("cublasSetStream"))?;
                if let Some((ptr, bytes)) = workspace {
                    // SAFETY: the workspace is device memory of the handle's context, `bytes` long, owned by
                    // `self` (so alive while the handle may use it) and used by nothing else.
                    unsafe { sys::cublasSetWorkspace_v2(handle, ptr as usize as *mut c_void, bytes) }
                        .result()
                        .map_err(failed("cublasSetWorkspace"))?;
                }
                call(handle).map_err(failed(name))
            },
        )
    }

    /// Queues `gemm` on `stream` (`cublasSetStream`, then `cublasSgemm`); `alpha` and `beta` are read from
    /// the host during the call.
    ///
    /// # Safety
    /// `a`, `b` and `c` are f32 device (or managed) memory of this context holding the matrices their
    /// dimensions and leading dimensions describe; `c` is not used by anything else, and `a` and `b` not
    /// written, until the stream has executed the product.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for a dimension over `i32::MAX`; [`Error::Blas`] when cuBLAS refuses (e.g. a
    /// leading dimension smaller than the rows).
    pub unsafe fn sgemm(&mut self, stream: StreamRef<'_>, gemm: &Sgemm) -> Result<()> {
        // SAFETY: forwarded from this function's contract (f32 matrices).
        unsafe { self.product(stream, gemm, Entry::Sgemm) }
    }

    /// Queues `gemm` on `stream` (`cublasSetStream`, the workspace, then `cublasGemmEx` with f32
    /// accumulation and cuBLAS's default algorithm choice); `alpha` and `beta` are read from the host during
    /// the call. f16 and bf16 products run on tensor cores.
    ///
    /// # Safety
    /// `a`, `b` and `c` are device (or managed) memory of this context holding `gemm.dtype` matrices their
    /// dimensions and leading dimensions describe; `c` is not used by anything else, and `a` and `b` not
    /// written, until the stream has executed the product.
    ///
    /// # Errors
    /// [`Error::OutOfRange`] for a dimension over `i32::MAX`; [`Error::Blas`] when cuBLAS refuses (e.g. a
    /// leading dimension smaller than the rows).
    pub unsafe fn gemm_ex(&mut self, stream: StreamRef<'_>, gemm: &GemmEx) -> Result<()> {
        // SAFETY: forwarded from this function's contract (`gemm.dtype` matrices).
        unsafe { self.product(stream, &gemm.product, Entry::GemmEx(gemm.dtype.cuda())) }
    }

    /// The one path of [`Blas::sgemm`] and [`Blas::gemm_ex`]: checks the dimensions fit cuBLAS's `i32`,
    /// binds the stream (and workspace) and queues the product through `entry`.
    ///
    /// # Safety
    /// `g`'s matrices are device (or managed) memory of this context holding values of `entry`'s type, as
    /// the callers' contracts state.
    unsafe fn product(&mut self, stream: StreamRef<'_>, g: &Sgemm, entry: Entry) -> Result<()> {
        let call = entry.call();
        let Dims { ops: (ta, tb), mnk: (m, n, k), lds: (lda, ldb, ldc) } = Dims::of(g, call)?;
        let (a, b) = (g.a as usize as *const c_void, g.b as usize as *const c_void);
        let c = g.c as usize as *mut c_void;
        self.on_stream(stream, call, |handle| match entry {
            // SAFETY: the context is current; `alpha` and `beta` are host values read during the call (the
            // handle's default host pointer mode); the f32 matrices are valid per the caller's contract.
            Entry::Sgemm => unsafe {
                blas::sgemm(
                    handle,
                    ta,
                    tb,
                    m,
                    n,
                    k,
                    &g.alpha,
                    a.cast(),
                    lda,
                    b.cast(),
                    ldb,
                    &g.beta,
                    c.cast(),
                    ldc,
                )
            },
            // SAFETY: as above; `alpha` and `beta` are f32 (the scale type of `CUBLAS_COMPUTE_32F`) and the
            // `ty` matrices are valid per the caller's contract.
            Entry::GemmEx(ty) => unsafe {
                blas::gemm_ex(
                    handle,
                    ta,
                    tb,
                    m,
                    n,
                    k,
                    (&g.alpha as *const f32).cast(),
                    a,
                    ty,
                    lda,
                    b,
                    ty,
                    ldb,
                    (&g.beta as *const f32).cast(),
                    c,
                    ty,
                    ldc,
                    sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            },
        })
    }

    /// The context the handle was created in.
    pub fn context(&self) -> &Context {
        &self.ctx
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        let ordinal = self.ctx.ordinal();
        let destroyed = self.ctx.bind().and_then(|()| {
            guard(
                |message| unavailable(format!("cuBLAS lacks an entry point: {message}")),
                || {
                    // SAFETY: `handle` was created by `cublasCreate` and is destroyed once, here.
                    unsafe { blas::destroy_handle(self.handle) }.map_err(|e| Error::Blas {
                        call: "cublasDestroy",
                        ordinal,
                        status: format!("{:?}", e.0),
                    })
                },
            )
        });
        if let Err(err) = destroyed {
            tracing::warn!("leaking a cuBLAS handle: {err}");
        }
    }
}
