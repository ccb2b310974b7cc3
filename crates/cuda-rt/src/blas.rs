//! cuBLAS: one handle per context, used on the caller's stream (`libcublas` loaded at run time).

use cudarc::cublas::{result as blas, sys};

use crate::context::Context;
use crate::driver::{self, guard};
use crate::error::{Error, Result};
use crate::memory::DevicePtr;
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

/// A cuBLAS handle created in one context, destroyed on drop. Each call takes the stream it runs on.
pub struct Blas {
    handle: sys::cublasHandle_t,
    ctx: Context,
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
        Ok(Blas { handle, ctx: ctx.clone() })
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
        let int = |what: &str, value: usize| {
            i32::try_from(value)
                .map_err(|_| Error::OutOfRange { call: "cublasSgemm", what: format!("{what} = {value}") })
        };
        let (m, n, k) = (int("m", gemm.m)?, int("n", gemm.n)?, int("k", gemm.k)?);
        let (lda, ldb, ldc) = (int("lda", gemm.lda)?, int("ldb", gemm.ldb)?, int("ldc", gemm.ldc)?);
        let op = |t: bool| {
            if t {
                sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        self.ctx.bind()?;
        let ordinal = self.ctx.ordinal();
        let failed = |call: &'static str| {
            move |e: blas::CublasError| Error::Blas { call, ordinal, status: format!("{:?}", e.0) }
        };
        guard(
            |message| unavailable(format!("cuBLAS lacks an entry point: {message}")),
            || {
                // SAFETY: `handle` is live (destroyed only on drop); `stream` is valid for its borrow (the same
                // cuBLAS and driver stream handle).
                unsafe { blas::set_stream(self.handle, stream.cu().cast()) }
                    .map_err(failed("cublasSetStream"))?;
                // SAFETY: the context is current; `alpha` and `beta` are host values read during the call (the
                // handle's default host pointer mode); the matrices are valid per this function's contract.
                unsafe {
                    blas::sgemm(
                        self.handle,
                        op(gemm.transpose_a),
                        op(gemm.transpose_b),
                        m,
                        n,
                        k,
                        &gemm.alpha,
                        gemm.a as usize as *const f32,
                        lda,
                        gemm.b as usize as *const f32,
                        ldb,
                        &gemm.beta,
                        gemm.c as usize as *mut f32,
                        ldc,
                    )
                }
                .map_err(failed("cublasSgemm"))
            },
        )
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
