// The CUDA delegate's untyped kernels: the general path's elementwise ops, means, casts, strided copies,
// positions and rotate-half RoPE, for any element type of payload 1.3, compiled by NVRTC once per process per
// device. Each kernel takes the element type as a code (`DT_*`, the same for every thread of a launch, so the
// switch never diverges) and computes in f32 (i64 in i64), exactly as `ref_graph::UnaryFn::apply` and the
// reference delegate do. One parameter struct by value per kernel; `src/kernels/general.rs` mirrors them
// (`#[repr(C)]`). Shapes are static per launch; nothing reads a host value, so a captured CUDA graph replays.

typedef long long i64;

#define DT_F32 0
#define DT_F16 1
#define DT_BF16 2
#define DT_I64 3
#define MAX_RANK 6

// Float to i64: truncation toward zero, NaN to 0, out-of-range values saturated (Rust's `as i64`).
__device__ __forceinline__ i64 f32_to_i64(float v) {
    if (v != v) return 0;
    if (v >= 9223372036854775808.f) return 0x7fffffffffffffffLL;
    if (v <= -9223372036854775808.f) return (i64)0x8000000000000000ULL;
    return (i64)v;
}

__device__ __forceinline__ float ldf(const void* p, i64 i, int dt) {
    switch (dt) {
        case DT_F16: return f16_to_f32(((const unsigned short*)p)[i]);
        case DT_BF16: return bf16_to_f32(((const unsigned short*)p)[i]);
        case DT_I64: return (float)((const i64*)p)[i];
        default: return ((const float*)p)[i];
    }
}

__device__ __forceinline__ void stf(void* p, i64 i, float v, int dt) {
    switch (dt) {
        case DT_F16: ((unsigned short*)p)[i] = f32_to_f16(v); break;
        case DT_BF16: ((unsigned short*)p)[i] = f32_to_bf16(v); break;
        case DT_I64: ((i64*)p)[i] = f32_to_i64(v); break;
        default: ((float*)p)[i] = v;
    }
}

// `v` rounded to element type `dt` (as storing it and reading it back would).
__device__ __forceinline__ float round_to(float v, int dt) {
    switch (dt) {
        case DT_F16: return f16_to_f32(f32_to_f16(v));
        case DT_BF16: return bf16_to_f32(f32_to_bf16(v));
        default: return v;
    }
}

#define GRID_LOOP(i, n) \
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

// ---------------------------------------------------------------------------------------------------------
// Sixteen bytes at a time: the flat elementwise kernels and RoPE move a run of `lanes16(dt)` consecutive
// elements a thread (one 16-byte load per operand) where every operand is 16-byte aligned and the count a
// multiple of the run; element for element the arithmetic is the scalar path's. i64 never takes it. A run's
// loop is a template of the element type (`RUNS_BY_TYPE` picks it once a launch), so it holds no branch on
// the type: the value-a-thread loops test the type code for every value, which costs more than the bytes.

// Elements of type `dt` in 16 bytes; 0 for i64.
__device__ __forceinline__ int lanes16(int dt) { return dt == DT_F32 ? 4 : dt == DT_I64 ? 0 : 8; }

__device__ __forceinline__ bool al16(const void* p) { return ((unsigned long long)p & 15ull) == 0; }

// Runs `fn<DT>(p)` for the launch's float type `dt`.
#define RUNS_BY_TYPE(dt, fn, p)       \
    do {                              \
        if ((dt) == DT_F32)           \
            fn<DT_F32>(p);            \
        else if ((dt) == DT_F16)      \
            fn<DT_F16>(p);            \
        else                          \
            fn<DT_BF16>(p);           \
    } while (0)

// Run `c` of 16 bytes of `p` (elements [c, c + 1) * L of type DT), as f32.
template <int DT>
__device__ __forceinline__ void ld_run(const void* p, i64 c, float (&v)[8]) {
    const uint4 u = ((const uint4*)p)[c];
    const unsigned int w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (DT == DT_F32) {
            v[k] = __uint_as_float(w[k]);
        } else {
            const unsigned short lo = (unsigned short)(w[k] & 0xffffu), hi = (unsigned short)(w[k] >> 16);
            v[2 * k] = DT == DT_F16 ? f16_to_f32(lo) : bf16_to_f32(lo);
            v[2 * k + 1] = DT == DT_F16 ? f16_to_f32(hi) : bf16_to_f32(hi);
        }
    }
}

// Stores the run's values as run `c` of 16 bytes of `p`, each rounded to DT as `stf` rounds it.
template <int DT>
__device__ __forceinline__ void st_run(void* p, i64 c, const float (&v)[8]) {
    unsigned int w[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (DT == DT_F32) {
            w[k] = __float_as_uint(v[k]);
        } else {
            const unsigned int lo = DT == DT_F16 ? f32_to_f16(v[2 * k]) : f32_to_bf16(v[2 * k]);
            const unsigned int hi = DT == DT_F16 ? f32_to_f16(v[2 * k + 1]) : f32_to_bf16(v[2 * k + 1]);
            w[k] = lo | (hi << 16);
        }
    }
    ((uint4*)p)[c] = make_uint4(w[0], w[1], w[2], w[3]);
}

// `v` rounded to DT (`round_to`).
template <int DT>
__device__ __forceinline__ float rounded(float v) {
    return DT == DT_F16 ? f16_to_f32(f32_to_f16(v)) : DT == DT_BF16 ? bf16_to_f32(f32_to_bf16(v)) : v;
}

// Whether a flat launch of `n` elements of `dt` over these operands (null: absent) takes runs of 16 bytes.
__device__ __forceinline__ bool by16(i64 n, int dt, const void* a, const void* b, const void* c) {
    const int l = lanes16(dt);
    return l != 0 && n % l == 0 && al16(a) && al16(b) && al16(c);
}

// ---------------------------------------------------------------------------------------------------------
// out = a OP b with NumPy broadcasting: `dims` are out's extents, `sa` and `sb` each operand's stride (in
// elements) along each of out's axes, 0 where the operand is broadcast. OP: 0 add, 1 sub, 2 mul, 3 div.

struct BinaryP {
    const void* a;
    const void* b;
    void* out;
    i64 n;
    int rank, dt, op, pad;
    i64 dims[MAX_RANK];
    i64 sa[MAX_RANK];
    i64 sb[MAX_RANK];
};

template <int DT>
__device__ __forceinline__ void binary_runs(const BinaryP& p) {
    constexpr int L = DT == DT_F32 ? 4 : 8;
    const i64 runs = p.n / L;
    GRID_LOOP(c, runs) {
        float x[8], y[8];
        ld_run<DT>(p.a, c, x);
        ld_run<DT>(p.b, c, y);
#pragma unroll
        for (int k = 0; k < L; k++) x[k] = p.op == 0 ? x[k] + y[k] : p.op == 1 ? x[k] - y[k] : p.op == 2 ? x[k] * y[k] : x[k] / y[k];
        st_run<DT>(p.out, c, x);
    }
}

extern "C" __global__ void binary(BinaryP p) {
    pdl_wait();
    pdl_launch();
    // Operands of out's own shape, contiguous (a residual add, SwiGLU's product): element i of each is at i.
    const bool flat = contiguous(p.rank, p.dims, p.sa) && contiguous(p.rank, p.dims, p.sb);
    if (flat && by16(p.n, p.dt, p.a, p.b, p.out)) {
        RUNS_BY_TYPE(p.dt, binary_runs, p);
        return;
    }
    GRID_LOOP(i, p.n) {
        i64 ia = i, ib = i;
        if (!flat) {
            ia = ib = 0;
            walk2(i, p.n, p.rank, p.dims, p.sa, p.sb, ia, ib);
        }
        if (p.dt == DT_I64) {
            const unsigned long long x = ((const i64*)p.a)[ia], y = ((const i64*)p.b)[ib];
            // Two's-complement wrapping, as the reference's `wrapping_*`.
            ((i64*)p.out)[i] = (i64)(p.op == 0 ? x + y : p.op == 1 ? x - y : x * y);
        } else {
            const float x = ldf(p.a, ia, p.dt), y = ldf(p.b, ib, p.dt);
            stf(p.out, i, p.op == 0 ? x + y : p.op == 1 ? x - y : p.op == 2 ? x * y : x / y, p.dt);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// out = func(x), elementwise, in f32: `func` is `ref_graph::UnaryFn`'s index (Neg = 0 .. GeluTanh = 12).

struct UnaryP {
    const void* x;
    void* out;
    i64 n;
    int dt, func;
};

__device__ __forceinline__ float apply(int func, float x) {
    switch (func) {
        case 0: return -x;
        case 1: return 1.f / sqrtf(x);
        case 2: return sqrtf(x);
        case 3: return x * x;
        case 4: return 1.f / x;
        case 5: return expf(x);
        case 6: return cosf(x);
        case 7: return sinf(x);
        case 8: return tanhf(x);
        case 9: return 1.f / (1.f + expf(-x));
        case 10: return x / (1.f + expf(-x));
        case 11: return 0.5f * x * (1.f + erff(x / 1.41421356f));
        default: {
            const float c = sqrtf(2.f / 3.14159265f);
            return 0.5f * x * (1.f + tanhf(c * (x + 0.044715f * x * x * x)));
        }
    }
}

// `apply` as a call, for the loops over a 16-byte run: inlined eight times its thirteen functions make a body
// the compiler will not unroll, and a run's values indexed in a loop that is not unrolled live in local memory
// (a round trip to L1 or L2 a value). The call keeps the loop small, unrolled and the run in registers; a
// SiLU (SwiGLU's) is computed inline.
__device__ __noinline__ float apply_call(int func, float x) { return apply(func, x); }
__device__ __forceinline__ float apply_run(int func, float x) {
    return func == 10 ? x / (1.f + expf(-x)) : apply_call(func, x);
}

template <int DT>
__device__ __forceinline__ void unary_runs(const UnaryP& p) {
    constexpr int L = DT == DT_F32 ? 4 : 8;
    const i64 runs = p.n / L;
    GRID_LOOP(c, runs) {
        float x[8];
        ld_run<DT>(p.x, c, x);
#pragma unroll
        for (int k = 0; k < L; k++) x[k] = apply_run(p.func, x[k]);
        st_run<DT>(p.out, c, x);
    }
}

extern "C" __global__ void unary(UnaryP p) {
    pdl_wait();
    pdl_launch();
    if (by16(p.n, p.dt, p.x, p.out, nullptr)) {
        RUNS_BY_TYPE(p.dt, unary_runs, p);
        return;
    }
    GRID_LOOP(i, p.n) stf(p.out, i, apply(p.func, ldf(p.x, i, p.dt)), p.dt);
}

// ---------------------------------------------------------------------------------------------------------
// A gated unit, out = func(gate) * up, elementwise (a prefill's SwiGLU or gated GELU over its two products):
// func(gate) rounded to the element type before the product, as `unary` would store it for `binary`.

struct GluP {
    const void* gate;
    const void* up;
    void* out;
    i64 n;
    int dt, func;
};

template <int DT>
__device__ __forceinline__ void glu_runs(const GluP& p) {
    constexpr int L = DT == DT_F32 ? 4 : 8;
    const i64 runs = p.n / L;
    GRID_LOOP(c, runs) {
        float g[8], u[8];
        ld_run<DT>(p.gate, c, g);
        ld_run<DT>(p.up, c, u);
#pragma unroll
        for (int k = 0; k < L; k++) g[k] = rounded<DT>(apply_run(p.func, g[k])) * u[k];
        st_run<DT>(p.out, c, g);
    }
}

extern "C" __global__ void glu(GluP p) {
    pdl_wait();
    pdl_launch();
    if (by16(p.n, p.dt, p.gate, p.up, p.out)) {
        RUNS_BY_TYPE(p.dt, glu_runs, p);
        return;
    }
    GRID_LOOP(i, p.n) {
        const float g = round_to(apply(p.func, ldf(p.gate, i, p.dt)), p.dt);
        stf(p.out, i, g * ldf(p.up, i, p.dt), p.dt);
    }
}

// ---------------------------------------------------------------------------------------------------------
// out[r] = mean(x[r, :]) over rows of `dim`. Grid: rows; block: 256.

struct MeanP {
    const void* x;
    void* out;
    int rows, dim, dt;
};

extern "C" __global__ void mean_rows(MeanP p) {
    pdl_wait();
    pdl_launch();
    __shared__ float scratch[32];
    const i64 base = (i64)blockIdx.x * p.dim;
    float s = 0.f;
    for (int d = threadIdx.x; d < p.dim; d += blockDim.x) s += ldf(p.x, base + d, p.dt);
    s = block_sum(s, scratch);
    if (threadIdx.x == 0) stf(p.out, blockIdx.x, s / (float)p.dim, p.dt);
}

// ---------------------------------------------------------------------------------------------------------
// out = x converted: float to float through f32 (each rounding to nearest even), i64 to float rounded to
// nearest, float to i64 truncated (NaN 0, saturating), i64 to i64 copied.

struct CastP {
    const void* x;
    void* out;
    i64 n;
    int from, to;
};

extern "C" __global__ void cast(CastP p) {
    pdl_wait();
    pdl_launch();
    GRID_LOOP(i, p.n) {
        if (p.from == DT_I64 && p.to == DT_I64) {
            ((i64*)p.out)[i] = ((const i64*)p.x)[i];
        } else {
            stf(p.out, i, ldf(p.x, i, p.from), p.to);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// A strided copy of `elem`-byte elements (permute, slice, one part of a concat, a reshape into an output):
// for every index of `dims`, dst[dst_off + sum idx * ds] = src[src_off + sum idx * ss] (strides in elements).
// `elem` 16: runs of 16 bytes, what the engine makes of a copy whose last axis is contiguous on both sides
// (`engine::general::in_runs`).

struct CopyP {
    const void* src;
    void* dst;
    i64 n, src_off, dst_off;
    int rank, elem;
    i64 dims[MAX_RANK];
    i64 ss[MAX_RANK];
    i64 ds[MAX_RANK];
};

extern "C" __global__ void copy_strided(CopyP p) {
    pdl_wait();
    pdl_launch();
    GRID_LOOP(i, p.n) {
        i64 is = p.src_off, id = p.dst_off;
        walk2(i, p.n, p.rank, p.dims, p.ss, p.ds, is, id);
        switch (p.elem) {
            case 16:
                if (al16(p.src) && al16(p.dst)) {
                    ((uint4*)p.dst)[id] = ((const uint4*)p.src)[is];
                } else {
                    // Runs of 16 bytes between unaligned buffers (a caller's): byte by byte, the same bytes.
                    for (int k = 0; k < 16; k++) ((unsigned char*)p.dst)[id * 16 + k] = ((const unsigned char*)p.src)[is * 16 + k];
                }
                break;
            case 2: ((unsigned short*)p.dst)[id] = ((const unsigned short*)p.src)[is]; break;
            case 8: ((unsigned long long*)p.dst)[id] = ((const unsigned long long*)p.src)[is]; break;
            default: ((unsigned int*)p.dst)[id] = ((const unsigned int*)p.src)[is];
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// out[t] = pos[0] + t. One thread.

struct PositionsP {
    const i64* pos;
    i64* out;
    int count;
};

// ---------------------------------------------------------------------------------------------------------
// Up to COUNTERS_MAX scalar i64 sums in one launch, `dst[i][0] = src[i][0] + add[i]`: a StaticCache's
// counters (one a layer, each the position plus a constant), one thread each.

#define COUNTERS_MAX 8

struct CountersP {
    const i64* src[COUNTERS_MAX];
    i64* dst[COUNTERS_MAX];
    i64 add[COUNTERS_MAX];
    int n;
};

extern "C" __global__ void counters(CountersP p) {
    pdl_wait();
    pdl_launch();
    const int i = threadIdx.x;
    if (blockIdx.x == 0 && i < p.n) p.dst[i][0] = p.src[i][0] + p.add[i];
}

// ---------------------------------------------------------------------------------------------------------
// RoPE's tables of a step: for row t < rows and column j < 2 * half, the angle (position + t) * inv_freq[j %
// half] in f32, then its cos and sin stored in `dt`: the positions, their cast, the product by the inverse
// frequencies, the concat with itself, cos, sin and the casts to the model's type, with the same arithmetic.

struct RopeTablesP {
    const i64* pos;
    const float* inv_freq;
    void* cos;
    void* sin;
    int rows, half, dt, pad;
};

extern "C" __global__ void rope_tables(RopeTablesP p) {
    pdl_wait();
    pdl_launch();
    const i64 width = 2 * (i64)p.half;
    GRID_LOOP(i, (i64)p.rows * width) {
        const i64 t = i / width, j = i % width;
        const float angle = (float)(p.pos[0] + t) * p.inv_freq[j % p.half];
        stf(p.cos, i, cosf(angle), p.dt);
        stf(p.sin, i, sinf(angle), p.dt);
    }
}

extern "C" __global__ void positions(PositionsP p) {
    pdl_wait();
    pdl_launch();
    if (threadIdx.x == 0 && blockIdx.x == 0)
        for (int t = 0; t < p.count; t++) p.out[t] = p.pos[0] + t;
}

// ---------------------------------------------------------------------------------------------------------
// Rotate-half RoPE: out = x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x[.., half..], x[.., ..half])
// along the last axis (2 * half elements); `cos` and `sin` broadcast to x (`sc`, `ss` their strides along x's
// axes `dims`). Each product and the sum are rounded to the element type as the seven separate ops round them.

struct RopeP {
    const void* x;
    const void* cos;
    const void* sin;
    void* out;
    i64 n;
    int rank, dt, half, pad;
    i64 dims[MAX_RANK];
    i64 sc[MAX_RANK];
    i64 ss[MAX_RANK];
};

template <int DT>
__device__ __forceinline__ void rope_runs(const RopeP& p) {
    constexpr int L = DT == DT_F32 ? 4 : 8, SHIFT = DT == DT_F32 ? 2 : 3;
    // Runs a head (32-bit: a launch of runs under 2^32, as every launch is, divides in 32 bits).
    const int head_runs = 2 * p.half / L, half_runs = p.half / L;
    const i64 runs = p.n / L;
    const bool tables16 = al16(p.cos) && al16(p.sin);
    GRID_LOOP(c, runs) {
        i64 ic = 0, is = 0;
        walk2(c * L, p.n, p.rank, p.dims, p.sc, p.ss, ic, is);
        const bool first = (runs <= 0xffffffffLL ? (unsigned)c % (unsigned)head_runs : c % head_runs) < half_runs;
        float x[8], r[8], co[8], si[8];
        ld_run<DT>(p.x, c, x);
        ld_run<DT>(p.x, first ? c + half_runs : c - half_runs, r);
        if (tables16 && ((ic | is) & (L - 1)) == 0) {
            ld_run<DT>(p.cos, ic >> SHIFT, co);
            ld_run<DT>(p.sin, is >> SHIFT, si);
        } else {
#pragma unroll
            for (int k = 0; k < L; k++) {
                co[k] = ldf(p.cos, ic + k, DT);
                si[k] = ldf(p.sin, is + k, DT);
            }
        }
#pragma unroll
        for (int k = 0; k < L; k++) {
            const float a = rounded<DT>(x[k] * co[k]);
            const float b = rounded<DT>((first ? -r[k] : r[k]) * si[k]);
            x[k] = a + b;
        }
        st_run<DT>(p.out, c, x);
    }
}

extern "C" __global__ void rope(RopeP p) {
    pdl_wait();
    pdl_launch();
    // Runs of 16 bytes of x, its rotation and out when a half holds whole runs; the tables' elements of a run
    // are consecutive when their last axis is (a run of 16 bytes too where it falls on 16 bytes).
    const int l = lanes16(p.dt);
    if (by16(p.n, p.dt, p.x, p.out, nullptr) && p.half % l == 0 && p.sc[p.rank - 1] == 1 && p.ss[p.rank - 1] == 1) {
        RUNS_BY_TYPE(p.dt, rope_runs, p);
        return;
    }
    GRID_LOOP(i, p.n) {
        i64 ic = 0, is = 0;
        walk2(i, p.n, p.rank, p.dims, p.sc, p.ss, ic, is);
        const float rot = i % (2 * p.half) < p.half ? -ldf(p.x, i + p.half, p.dt) : ldf(p.x, i - p.half, p.dt);
        const float a = round_to(ldf(p.x, i, p.dt) * ldf(p.cos, ic, p.dt), p.dt);
        const float b = round_to(rot * ldf(p.sin, is, p.dt), p.dt);
        stf(p.out, i, a + b, p.dt);
    }
}
