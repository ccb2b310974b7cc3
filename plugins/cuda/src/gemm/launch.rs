//! The GEMM path on the device: the cuBLAS handle (its workspace given at `init`, so a product allocates
//! nothing and can be captured into a CUDA graph), the scratch of the path's roles, and the products as
//! cuBLAS calls on the call's stream.

use cuda_rt::{Allocation, Blas, Context, Device, DevicePtr, GemmEx, GemmType, Sgemm};

use super::{Expansion, Part, Product};
use crate::plan::Float;

/// The workspace cuBLAS is given: what it asks for on Hopper (32 MiB; 4 MiB before it).
const WORKSPACE_BYTES: usize = 32 << 20;

/// The GEMM path of one engine.
#[derive(Debug)]
pub(crate) struct Runner {
    blas: Blas,
    expansion: Expansion,
    /// One buffer per [`super::Role`]; the scratch tensors' addresses point into them.
    _scratch: Vec<Allocation<Device>>,
}

impl Runner {
    /// The runner of `expansion` on `ctx`, each scratch tensor's address written into `ptrs` (indexed by
    /// tensor, the scratch ids included). `None` when no step takes the path, or when cuBLAS cannot be loaded:
    /// the steps then keep their GEMVs (slower for many rows, never wrong).
    pub(crate) fn new(
        ctx: &Context,
        expansion: Expansion,
        ptrs: &mut [DevicePtr],
    ) -> cuda_rt::Result<Option<Runner>> {
        if !expansion.any() {
            return Ok(None);
        }
        let mut blas = match Blas::new(ctx) {
            Ok(blas) => blas,
            Err(err @ cuda_rt::Error::LibraryUnavailable { .. }) => {
                tracing::warn!("products of many rows run as GEMVs: {err}");
                return Ok(None);
            }
            Err(err) => return Err(err),
        };
        blas.set_workspace(Allocation::<Device>::zeroed(ctx, WORKSPACE_BYTES)?);
        let scratch = expansion
            .role_bytes
            .iter()
            .map(|&bytes| Allocation::<Device>::zeroed(ctx, bytes.max(4)))
            .collect::<cuda_rt::Result<Vec<_>>>()?;
        for &(id, role) in &expansion.scratch {
            ptrs[id.0] = scratch[role as usize].device_ptr();
        }
        Ok(Some(Runner { blas, expansion, _scratch: scratch }))
    }

    /// The most launches a call of the plan queues: one a step, or its parts for a step on the GEMM path.
    pub(crate) fn launches(&self) -> usize {
        self.expansion.launches()
    }

    /// The launches of step `index` when it takes the GEMM path.
    pub(crate) fn parts(&self, index: usize) -> Option<&[Part]> {
        self.expansion.of(index)
    }

    /// The cuBLAS handle the products run on ([`Blas::gemm_ex`] of a [`call`], queued by the engine's
    /// launches: the crate's FFI layer).
    pub(crate) fn blas(&mut self) -> &mut Blas {
        &mut self.blas
    }
}

/// The cuBLAS call of `product` with its operands at `a`, `w` (the whole `[N, K]` weight; the product reads
/// its rows from `w_row` on) and `y`. Row-major `y = a w^T` is
/// column-major `y^T = w a^T`: `w` stored row-major `[N, K]` is column-major `w^T` (`K x N`, leading dimension
/// `K`), so cuBLAS's `A` is `w` transposed (`N x K`), its `B` is `a` as stored (column-major `a^T`, `K x M`),
/// and its `C` is `y` (column-major `N x M`, leading dimension `N`).
pub(crate) fn call(product: &Product, a: DevicePtr, w: DevicePtr, y: DevicePtr) -> GemmEx {
    let (m, n, k) = (product.m as usize, product.n as usize, product.k as usize);
    let (dtype, elem) = match product.float {
        Float::F32 => (GemmType::F32, 4),
        Float::F16 => (GemmType::F16, 2),
        Float::Bf16 => (GemmType::Bf16, 2),
    };
    let w = w + u64::from(product.w_row) * u64::from(product.k) * elem;
    GemmEx {
        dtype,
        product: Sgemm {
            transpose_a: true,
            transpose_b: false,
            m: n,
            n: m,
            k,
            alpha: 1.0,
            a: w,
            lda: k,
            b: a,
            ldb: k,
            beta: 0.0,
            c: y,
            ldc: n,
        },
    }
}
