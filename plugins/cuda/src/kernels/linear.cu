// ---------------------------------------------------------------------------------------------------------
// Every product of the typed path (appended to `kernels.cu`, so `T`, `VEC` and the loads are that file's):
// y[mat][m, n] = a[m, :] . w[mat][n, :] (+ bias[mat][n]) (+ res[mat][m, n]) (+ res2[mat][m, n]) for up to three matrices sharing
// `a` (the Q, K and V projections, or gate and up, in one launch; each its own width). Weights are stored
// [N, K]: `torch.nn.Linear`'s layout as the user stores it, and a `[K, N]` weight transposed once at upload.
//
// Decode multiplies one row by the weights: the work is reading them once, in order. A warp owns one output
// column: it reads that column's contiguous weight row, 16 bytes per lane at a time, and adds its lanes' sums,
// so no block shares a column, no partial sum is written and no second pass runs. The first `GEMV_PRE` loads
// of each lane, the norm's gains and the bias are issued before `pdl_wait` when each holds one value all call
// (the plan's `early`): the weights stream in while the previous kernel finishes. Right after the wait,
// everything else the warp reads (the activation, the residual, the position) is requested at once, so one
// memory round trip follows the wait, not three. Few registers matter more than many early loads: a block
// that fits beside the kernel it overlaps starts sooner (measured on the H200: 4 early loads and a budget of
// three blocks an SM took config (c) from 661 to 599 us a step and the Llama-3.2-1B shape from 1397 to
// 1256 us, against 8 early loads and no budget). With `norm_w` set, `a` is RMS-normalised with that gain on
// the way (each warp computes the row's norm itself; the whole row passes through its lanes anyway); with
// `centred` too it is LayerNorm's instead (`plan::Norm`: the row's mean subtracted first, then the bias
// `norm_b`, when set, added after the gain; the mean and the variance each a pass over the row). A matrix
// with a cache also writes its outputs into the cache row at pos + m (the KV-cache update fused into the
// projection that computes it).
// The matrices in `rope_mats` (bit per matrix) are stored rotated by Hugging Face's rotate-half RoPE (one row,
// heads of `rope_dh`, each rotated in its first `2 * rope_half` columns, the rest as computed: a partial
// rotary; `cos` and `sin` one row of tables): warps 2j and 2j + 1 compute columns d and d + rope_half of one
// head and meet in shared memory before they store.
// `gemv_glu` is Hugging Face's SwiGLU: matrices 0 and 1 are the gate and up projections of one width, each pair
// of warps computes one column of both (in the `_waves` entry, each warp both), and the block writes
// silu(gate) * up into `y[0]` instead (rounded as the separate ops round); with `activation`, gelu(gate) * up
// (a gated GELU: Gemma's MLP).
// A launch that fuses the norm, or of two blocks an SM or more (`p.staged`, decided by `kernels::gemv_stage`),
// takes `gemv_stream` instead: each block stages its row of `a` once, times the norm's gains, in f32 in shared
// memory, and its warps then only stream weights. There the row's conversion and normalisation, done by every
// warp, cost more issue slots than the bandwidth leaves (Nsight Compute on the H200: the vocabulary projection
// issued an instruction in 68 % of its schedulers' cycles at 63 % of the DRAM bandwidth). Such a launch has at
// most a wave of blocks (`kernels::gemv_blocks`); one of more groups of columns than that takes the `_waves`
// entries (`gemv_waves_body`), whose blocks each take several groups with one staging. One of at most two
// blocks an SM, over rows longer than GEMV_PRE loads a lane, takes the `_deep` entries (`kernels::gemv_entry`):
// the budget of two blocks an SM holds twice the loads in flight, all requested before the wait.
// Grid (one block a group of GEMV_WARPS columns, or at most a wave of blocks for the `_waves` entries; M);
// block GEMV_WARPS warps (`gemv_glu`: a group is GEMV_WARPS / 2 columns of each matrix, GEMV_WARPS in its
// `_waves` entry).

#define GEMV_WARPS 8
// Tunables (`#ifndef`: a sweep may set them, see `kernels/tuning.rs`).
#ifndef GEMV_PRE
#define GEMV_PRE 4
#endif
#ifndef GEMV_BLOCKS_PER_SM
#define GEMV_BLOCKS_PER_SM 3
#endif
// The `_deep` entries (`kernels::GemvEntry::Deep`): a staged launch of at most GEMV_DEEP_BLOCKS_PER_SM blocks an
// SM keeps GEMV_DEEP_DEPTH weight loads of 16 bytes in flight a lane (the first GEMV_DEEP_PRE before its wait),
// which the register budget of fewer blocks an SM allows.
#ifndef GEMV_DEEP_BLOCKS_PER_SM
#define GEMV_DEEP_BLOCKS_PER_SM 2
#endif
#ifndef GEMV_DEEP_DEPTH
#define GEMV_DEEP_DEPTH 8
#endif
#ifndef GEMV_DEEP_PRE
#define GEMV_DEEP_PRE 8
#endif

struct GemvP {
    const T* a;
    const T* w[3];
    const T* bias[3];
    const T* res[3];
    T* y[3];
    T* cache[3];     // per matrix, a KV cache [H, L, Dh] whose row pos + m also receives y[mat][m, :]
    const T* norm_w;  // RMS-norm gain [K], or null
    const T* norm_b;  // LayerNorm's bias [K] (with `centred`), or null
    const i64* pos;   // the cache position (with any cache)
    int* err;
    int n[3];         // output columns per matrix
    int M, K, nmat, vec_ok;  // vec_ok: K % VEC == 0 and `a`, every `w`, `norm_w` and `norm_b` 16-byte aligned
    float eps;
    int H, L, Dh;
    int early;  // the weights, gains and biases may be read before `pdl_wait` (each holds one value all call)
    const T* cos;  // the RoPE's tables, 2 * rope_half values each (with any `rope_mats`)
    const T* sin;
    int rope_half, rope_mats;
    int staged;  // the launch stages `a`'s row in dynamic shared memory (4 * K bytes, `kernels::gemv_stage`)
    int groups;  // groups of GEMV_WARPS columns (`gemv_glu`: GEMV_WARPS / 2 of each matrix): the blocks of a
                 // full grid; the `_waves` entries' blocks take every gridDim.x-th
    int centred;  // with `norm_w`: LayerNorm (the row's mean subtracted first), not RMS norm
    int activation;  // 0, or the GELU stored instead of the product (one matrix; `gemv_glu`: the gate's): its index,
                     // 11 (erf form) or 12 (tanh form), as `unary` numbers them
    // Per matrix, the weight row (and bias element) of output column c: row_off + (c / row_group) * row_stride
    // + c % row_group (`plan::WeightRows`: every row, or the rows of one slice of a product's columns).
    int row_off[3], row_group[3], row_stride[3];
    int rope_dh;  // a rotated matrix's head width (2 * rope_half, or more: a partial rotary)
    const T* res2[3];  // per matrix, a second residual added after `res` (a parallel residual), or null
    const T* cap_div;  // soft-capping `tanh(y / cap_div[0]) * cap_mul[0]` of the one product last, or null
    const T* cap_mul;
};

// 16 bytes of a weight row: read once a step, so never kept in L1 (measured on the H200: the Llama-3.2-1B
// shape 1092 -> 1077 us, (c) at 8191 649 -> 646, (b) at 512 105 -> 107); through the read-only path when
// `fixed` (the plan's `early`: the weights hold one value all call, so no kernel of the call writes them).
__device__ __forceinline__ uint4 ld_weight(const T* p, bool fixed) {
    uint4 u;
    if (fixed) {
        asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                     : "l"(p));
    } else {
        asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                     : "l"(p));
    }
    return u;
}

// `ld_weight` as one statement, each form predicated on `fixed`: no branch around every load (`gemv_rings`).
// Measured on the H200 in the experiment that grew that loop, where every weight load took this form: config
// (c) at 4096, 572.7 -> 548.8 us a step. The one-group loops keep `ld_weight`: their registers are at the
// launch bound, and this form was not measured against it there alone.
__device__ __forceinline__ uint4 ld_weight_pred(const T* p, bool fixed) {
    uint4 u;
    asm volatile(
        "{\n\t.reg .pred f;\n\tsetp.ne.b32 f, %5, 0;\n\t"
        "@f ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n\t"
        "@!f ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n\t}"
        : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
        : "l"(p), "r"((int)fixed));
    return u;
}

// One of the three entries of a parameter array, picked with selects: indexing the by-value parameter struct
// with a run-time index would copy it to local memory.
template <typename P>
__device__ __forceinline__ P pick(const P (&a)[3], int i) {
    return i == 0 ? a[0] : i == 1 ? a[1] : a[2];
}

// What the lane that stores a column adds to its sum, and where its cache row is, requested before the sum
// is ready so no memory round trip follows it: the bias (before `pdl_wait` when the plan allows), the
// residual and the position (right after the wait, beside the activation).
struct GemvTail {
    T bias, res, res2, cos, sin;
    i64 row;
};

__device__ __forceinline__ bool roped(const GemvP& p, int mat) { return (p.rope_mats >> mat) & 1; }

// A rotated matrix's column for its warp's index `i`: in the rotated part of a head of `dh`, the pair
// i = 2j, 2j + 1 takes columns d and d + half; past it, column i.
__device__ __forceinline__ int rope_col(int i, int half, int dh) {
    const int r = i % dh;
    return r < 2 * half ? i - r + (r >> 1) + (r & 1) * half : i;
}

// Whether column `col` of a rotated matrix is in the rotated part of its head.
__device__ __forceinline__ bool rope_rotates(const GemvP& p, int col) { return col % p.rope_dh < 2 * p.rope_half; }

// The weight row (and bias element) output column `col` of matrix `mat` reads (`row_off`, ...).
__device__ __forceinline__ int gemv_wrow(const GemvP& p, int mat, int col) {
    const int group = pick(p.row_group, mat);
    return pick(p.row_off, mat) + (col / group) * pick(p.row_stride, mat) + col % group;
}

__device__ __forceinline__ GemvTail gemv_bias(const GemvP& p, int mat, int col, bool stores) {
    const T* bias = pick(p.bias, mat);
    GemvTail tail;
    tail.bias = stores && bias ? bias[gemv_wrow(p, mat, col)] : (T)0;
    tail.res = tail.res2 = (T)0;
    tail.cos = tail.sin = (T)0;
    tail.row = 0;
    return tail;
}

// Where output (m, col) of matrix `mat` sits in its output and its residual.
__device__ __forceinline__ i64 gemv_at(const GemvP& p, int mat, int m, int col) {
    return (i64)m * pick(p.n, mat) + col;
}

// `rope`: the RoPE's table values too (`gemv_rope`).
__device__ __forceinline__ void gemv_after_wait(const GemvP& p, int mat, int m, int col, bool stores,
                                                GemvTail& tail, bool rope) {
    const T* res = pick(p.res, mat);
    if (stores && res) tail.res = res[gemv_at(p, mat, m, col)];
    const T* res2 = pick(p.res2, mat);
    if (stores && res2) tail.res2 = res2[gemv_at(p, mat, m, col)];
    if (stores && pick(p.cache, mat)) tail.row = p.pos[0] + m;
    if (rope && stores && roped(p, mat) && rope_rotates(p, col)) {
        tail.cos = p.cos[col % p.rope_dh];
        tail.sin = p.sin[col % p.rope_dh];
    }
}

// Stores output (m, col) of matrix `mat`, and into its cache row when it has a cache.
__device__ __forceinline__ void gemv_put(const GemvP& p, int mat, int m, int col, float s, i64 row) {
    T* cache = pick(p.cache, mat);
    st(pick(p.y, mat), gemv_at(p, mat, m, col), s);
    if (cache) {
        if (row >= 0 && row < p.L) {
            st(cache, ((i64)(col / p.Dh) * p.L + row) * p.Dh + col % p.Dh, s);
        } else {
            atomicOr(p.err, ERR_POSITION);
        }
    }
}

// GELU of the product `x` as the general path's `unary` computes it: the erf form (`func` 11) or the tanh form.
__device__ __forceinline__ float gemv_gelu(int func, float x) {
    if (func == 11) return 0.5f * x * (1.f + erff(x / 1.41421356f));
    const float c = sqrtf(2.f / 3.14159265f);
    return 0.5f * x * (1.f + tanhf(c * (x + 0.044715f * x * x * x)));
}

// Soft-capping of the product `s` as its three ops compute it (`plan::Softcap`): tanh(s / c1) * c2, each
// result rounded to T as the op's output holds it.
__device__ __forceinline__ float gemv_softcap(const GemvP& p, float s) {
    return rnd(tanhf(rnd(rnd(s) / ld(p.cap_div, 0)))) * ld(p.cap_mul, 0);
}

__device__ __forceinline__ void gemv_store(const GemvP& p, int mat, int m, int col, float s,
                                           const GemvTail& tail) {
    if (pick(p.bias, mat)) s += val(tail.bias);
    if (pick(p.res, mat)) s += val(tail.res);
    if (pick(p.res2, mat)) s += val(tail.res2);
    if (p.activation) s = gemv_gelu(p.activation, rnd(s));  // the product as it would have been stored
    if (p.cap_div) s = gemv_softcap(p, s);
    gemv_put(p, mat, m, col, s, tail.row);
}

// A GEMV with rotated matrices: each warp of a pair leaves its column's value (as the product would have
// stored it; no residual: the plan rotates none) in shared memory, then stores x * cos + rot * sin, rot its
// partner's value (negated in the first half), each product and the sum rounded as the RoPE's ops round.
// Matrices not rotated store as usual.
__device__ __forceinline__ void gemv_rope_store(const GemvP& p, int mat, int m, int col, float s,
                                                const GemvTail& tail, bool stores) {
    __shared__ float xs[GEMV_WARPS];
    const int warp = threadIdx.x >> 5;
    if (stores && roped(p, mat)) xs[warp] = rnd(pick(p.bias, mat) ? s + val(tail.bias) : s);
    __syncthreads();
    if (!stores) return;
    if (!roped(p, mat) || !rope_rotates(p, col)) {
        gemv_store(p, mat, m, col, s, tail);
        return;
    }
    const float rot = warp & 1 ? xs[warp ^ 1] : -xs[warp ^ 1];
    const float a = rnd(__fmul_rn(xs[warp], val(tail.cos))), b = rnd(__fmul_rn(rot, val(tail.sin)));
    gemv_put(p, mat, m, col, __fadd_rn(a, b), tail.row);
}

// VEC values of `a` (`raw`, at `k`), normalised with the gains `gain` when the product fuses a norm: LayerNorm's
// (less `mean`, plus the bias) when `centred`.
__device__ __forceinline__ void gemv_act(const GemvP& p, uint4 raw, uint4 gain, float inv, float mean, int k,
                                         float* out) {
    cvt_vec(raw, out);
    if (p.norm_w) {
        float g[VEC];
        cvt_vec(gain, g);
        if (p.centred) {
            float b[VEC];
            if (p.norm_b) {
                cvt_vec(ld_raw(p.norm_b + k), b);
            } else {
#pragma unroll
                for (int v = 0; v < VEC; v++) b[v] = 0.f;
            }
#pragma unroll
            for (int v = 0; v < VEC; v++) out[v] = (out[v] - mean) * inv * g[v] + b[v];
        } else {
#pragma unroll
            for (int v = 0; v < VEC; v++) out[v] *= inv * g[v];
        }
    }
}

// silu(x) as the general path's unary computes it, rounded to T as its output holds it.
__device__ __forceinline__ float silu_t(float x) { return rnd(x / (1.f + expf(-x))); }

// The gate's activation of `gemv_glu`, rounded to T as its output holds it: SiLU, or the GELU `p.activation`
// names (a gated GELU: Gemma's MLP).
__device__ __forceinline__ float glu_act(const GemvP& p, float x) {
    return p.activation ? rnd(gemv_gelu(p.activation, x)) : silu_t(x);
}

// `gemv_glu`'s store: the gate warp of each pair leaves its column's value (as the gate product would have
// stored it) in shared memory; the up warp writes silu(gate) * up there (as the two ops would have; `glu_act`).
__device__ __forceinline__ void gemv_glu_store(const GemvP& p, int mat, int m, int col, float s,
                                               const GemvTail& tail, bool stores) {
    __shared__ float gates[GEMV_WARPS / 2];
    const int pair = threadIdx.x >> 6;
    if (stores && pick(p.bias, mat)) s += val(tail.bias);  // no residual: the plan pairs none
    if (stores && mat == 0) gates[pair] = rnd(s);
    __syncthreads();
    if (stores && mat == 1) st(p.y[0], gemv_at(p, 0, m, col), glu_act(p, gates[pair]) * rnd(s));
}

// The warp's dot product (each lane its part) of its weight row with `a`'s row, normalised when the product
// fuses a norm, reading `a` from global memory: the first GEMV_PRE loads of weights and gains requested before
// `pdl_wait` when `early`, the row's first GEMV_PRE chunks right after it, the rest in the loop.
__device__ __forceinline__ float gemv_dot(const GemvP& p, int mat, int m, int col, bool stores, GemvTail& tail,
                                          const T* wr, const T* ar, bool live, bool rope) {
    const int lane = threadIdx.x & 31;
    float acc = 0.f;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    uint4 w_pre[GEMV_PRE], g_pre[GEMV_PRE], a_pre[GEMV_PRE];
#pragma unroll
    for (int i = 0; i < GEMV_PRE; i++) {
        const int k = (i * 32 + lane) * VEC;
        w_pre[i] = live && k < p.K ? ld_weight(wr + k, p.early) : zero;
        g_pre[i] = p.norm_w && k < p.K ? ld_raw(p.norm_w + k) : zero;
    }
    pdl_wait();
    TRACE_WAITED();
    pdl_launch();
    gemv_after_wait(p, mat, m, col, stores, tail, rope);
#pragma unroll
    for (int i = 0; i < GEMV_PRE; i++) {
        const int k = (i * 32 + lane) * VEC;
        a_pre[i] = k < p.K ? ld_raw(ar + k) : zero;
    }
    float inv = 1.f, mean = 0.f;
    if (p.norm_w) {
        float x[VEC];
        if (p.centred) {
            float s = 0.f;
#pragma unroll
            for (int i = 0; i < GEMV_PRE; i++) {
                cvt_vec(a_pre[i], x);  // zeros past the row's end
#pragma unroll
                for (int v = 0; v < VEC; v++) s += x[v];
            }
            for (int k = (GEMV_PRE * 32 + lane) * VEC; k < p.K; k += 32 * VEC) {
                ld_vec(ar + k, x);
#pragma unroll
                for (int v = 0; v < VEC; v++) s += x[v];
            }
            mean = warp_sum(s) / (float)p.K;
        }
        float ss = 0.f;
#pragma unroll
        for (int i = 0; i < GEMV_PRE; i++) {
            if ((i * 32 + lane) * VEC < p.K) {
                cvt_vec(a_pre[i], x);
#pragma unroll
                for (int v = 0; v < VEC; v++) ss += (x[v] - mean) * (x[v] - mean);
            }
        }
        for (int k = (GEMV_PRE * 32 + lane) * VEC; k < p.K; k += 32 * VEC) {
            ld_vec(ar + k, x);
#pragma unroll
            for (int v = 0; v < VEC; v++) ss += (x[v] - mean) * (x[v] - mean);
        }
        inv = rsqrtf(warp_sum(ss) / (float)p.K + p.eps);
    }
#pragma unroll
    for (int i = 0; i < GEMV_PRE; i++) {
        const int k = (i * 32 + lane) * VEC;
        if (k < p.K) {
            float x[VEC], wv[VEC];
            gemv_act(p, a_pre[i], g_pre[i], inv, mean, k, x);
            cvt_vec(w_pre[i], wv);
#pragma unroll
            for (int v = 0; v < VEC; v++) acc += x[v] * wv[v];
        }
    }
#pragma unroll 4
    for (int k = (GEMV_PRE * 32 + lane) * VEC; k < p.K; k += 32 * VEC) {
        float x[VEC], wv[VEC];
        gemv_act(p, ld_raw(ar + k), p.norm_w ? ld_raw(p.norm_w + k) : zero, inv, mean, k, x);
        cvt_vec(ld_weight(wr + k, p.early), wv);
#pragma unroll
        for (int v = 0; v < VEC; v++) acc += x[v] * wv[v];
    }
    return acc;
}

// A staged block's weight loads in flight a lane (tunable), and the row's 16-byte chunks a thread stages at once.
#ifndef GEMV_DEPTH
#define GEMV_DEPTH 4
#endif
#define GEMV_BATCH 2
// 16 bytes of the warp's weight row at k, or zeros past its end (or for a warp with no column).
__device__ __forceinline__ uint4 gemv_w(const GemvP& p, const T* wr, bool live, int k) {
    return live && k < p.K ? ld_weight(wr + k, p.early) : make_uint4(0u, 0u, 0u, 0u);
}

// Adds the staged row's VEC values at `x` times a chunk of weights to `acc`, four at a time.
__device__ __forceinline__ void gemv_fma(float& acc, const float* x, const float* wv) {
#pragma unroll
    for (int v = 0; v < VEC; v += 4) {
        const float4 xv = *reinterpret_cast<const float4*>(x + v);
        acc += xv.x * wv[v] + xv.y * wv[v + 1] + xv.z * wv[v + 2] + xv.w * wv[v + 3];
    }
}

// A staged block's dynamic shared memory: `a`'s row times the norm's gains, in f32 (`p.staged`: 4 * K bytes);
// with a LayerNorm (`centred`), the row as it is, then normalised in place (`gemv_centre_staged`).
extern __shared__ float gemv_xs[];

// The block's share of staging `a`'s row: this thread's chunks c0, c0 + blockDim, ... into `gemv_xs` (times
// the gains when the product fuses an RMS norm; `g0` the first chunk's gains, requested earlier), and their sum
// of squares (with a LayerNorm: the chunks as they are, and their sum). GEMV_BATCH chunks are requested at once: a store to shared memory would otherwise order each load
// after the last (`ar` may point anywhere).
__device__ __forceinline__ float gemv_stage_row(const GemvP& p, const T* ar, uint4 g0) {
    const int chunks = p.K / VEC, c0 = threadIdx.x;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    float ss = 0.f;
    for (int cb = c0; cb < chunks; cb += GEMV_BATCH * blockDim.x) {
        uint4 raw[GEMV_BATCH], gain[GEMV_BATCH];
#pragma unroll
        for (int j = 0; j < GEMV_BATCH; j++) {
            const int c = cb + j * blockDim.x;
            raw[j] = c < chunks ? ld_raw(ar + c * VEC) : zero;
            gain[j] = p.norm_w && c < chunks ? (c == c0 ? g0 : ld_raw(p.norm_w + c * VEC)) : zero;
        }
#pragma unroll
        for (int j = 0; j < GEMV_BATCH; j++) {
            const int c = cb + j * blockDim.x;
            if (c >= chunks) break;
            float x[VEC];
            cvt_vec(raw[j], x);
            if (p.norm_w && p.centred) {
#pragma unroll
                for (int v = 0; v < VEC; v++) ss += x[v];
            } else if (p.norm_w) {
                float g[VEC];
                cvt_vec(gain[j], g);
#pragma unroll
                for (int v = 0; v < VEC; v++) {
                    ss += x[v] * x[v];
                    x[v] *= g[v];
                }
            }
            float4* to = reinterpret_cast<float4*>(gemv_xs + c * VEC);
#pragma unroll
            for (int v = 0; v < VEC; v += 4) to[v / 4] = make_float4(x[v], x[v + 1], x[v + 2], x[v + 3]);
        }
    }
    return ss;
}

// The norm's scale from the warps' sums of squares in `s_ss` (GEMV_WARPS floats, published by the staging's
// barrier).
__device__ __forceinline__ float gemv_norm_scale(const GemvP& p, const float* s_ss) {
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < GEMV_WARPS; i++) ss += s_ss[i];
    return rsqrtf(ss / (float)p.K + p.eps);
}

// A staged LayerNorm: the row is staged as it is and `s_sum` holds the warps' sums of it (published by the
// staging's barrier). Each thread then takes the chunks it staged: their squared distances from the mean (one
// more barrier publishes the variance), then each value normalised in place, (x - mean) * inv * gain + bias;
// a last barrier publishes the row. The products then need no scale: returns 1.
__device__ __forceinline__ float gemv_centre_staged(const GemvP& p, const float* s_sum) {
    __shared__ float s_var[GEMV_WARPS];
    const int chunks = p.K / VEC;
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < GEMV_WARPS; i++) sum += s_sum[i];
    const float mean = sum / (float)p.K;
    float vs = 0.f;
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
#pragma unroll
        for (int v = 0; v < VEC; v++) {
            const float d = gemv_xs[c * VEC + v] - mean;
            vs += d * d;
        }
    }
    vs = warp_sum(vs);
    if ((threadIdx.x & 31) == 0) s_var[threadIdx.x >> 5] = vs;
    __syncthreads();
    float var = 0.f;
#pragma unroll
    for (int i = 0; i < GEMV_WARPS; i++) var += s_var[i];
    const float inv = rsqrtf(var / (float)p.K + p.eps);
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
        float g[VEC], b[VEC];
        cvt_vec(ld_raw(p.norm_w + c * VEC), g);
        if (p.norm_b) {
            cvt_vec(ld_raw(p.norm_b + c * VEC), b);
        } else {
#pragma unroll
            for (int v = 0; v < VEC; v++) b[v] = 0.f;
        }
#pragma unroll
        for (int v = 0; v < VEC; v++) {
            float* x = gemv_xs + c * VEC + v;
            *x = (*x - mean) * inv * g[v] + b[v];
        }
    }
    __syncthreads();
    return 1.f;
}

// The norm's scale of a staged row (`gemv_norm_scale`, or the LayerNorm's in-place pass), 1 without a norm.
__device__ __forceinline__ float gemv_staged_scale(const GemvP& p, const float* s_ss) {
    if (!p.norm_w) return 1.f;
    return p.centred ? gemv_centre_staged(p, s_ss) : gemv_norm_scale(p, s_ss);
}

// A warp's sum (each lane its part) of its weight row `wr` times the staged row, `w` holding the row's first
// ring of loads: each load is replaced as it is used by the one a ring ahead while the row has one.
template <int DEPTH>
__device__ __forceinline__ float gemv_ragged(const GemvP& p, uint4 (&w)[DEPTH], const T* wr, bool live) {
    const int lane = threadIdx.x & 31, chunks = p.K / VEC;
    float acc = 0.f;
    for (int cb = lane; cb < chunks; cb += DEPTH * 32) {
#pragma unroll
        for (int i = 0; i < DEPTH; i++) {
            const int k = cb + i * 32;
            if (k < chunks) {
                float wv[VEC];
                cvt_vec(w[i], wv);
                w[i] = gemv_w(p, wr, live, (k + DEPTH * 32) * VEC);
                gemv_fma(acc, gemv_xs + k * VEC, wv);
            }
        }
    }
    return acc;
}

// The warp's dot product (each lane its part) of its weight row with `a`'s row, normalised when the product
// fuses a norm. The block stages the row once, times the gains, in f32 (`gemv_stage_row`), so a warp's loop is
// only its weights: DEPTH loads of 16 bytes a lane stay in flight (the first PRE requested before `pdl_wait`
// when `early`), each replaced by the load DEPTH steps ahead as it is used. The norm's scale
// multiplies the sum (a * g * inv . w = inv * (a * g . w)). One barrier publishes both the staged row and the
// warps' sums of squares (`block_sum` would add a second).
template <int DEPTH, int PRE>
__device__ __forceinline__ float gemv_stream(const GemvP& p, int mat, int m, int col, bool stores,
                                             GemvTail& tail, const T* wr, const T* ar, bool live, bool rope) {
    __shared__ float s_ss[GEMV_WARPS];
    const int step = 32 * VEC;
    const int lane = threadIdx.x & 31, chunks = p.K / VEC, c0 = threadIdx.x;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    uint4 w[DEPTH];
    uint4 g0 = zero;
    if (p.norm_w && p.early && c0 < chunks) g0 = ld_raw(p.norm_w + c0 * VEC);
#pragma unroll
    for (int i = 0; i < PRE && i < DEPTH; i++) w[i] = gemv_w(p, wr, live, i * step + lane * VEC);
    pdl_wait();
    TRACE_WAITED();
    pdl_launch();
    gemv_after_wait(p, mat, m, col, stores, tail, rope);
    if (p.norm_w && !p.early && c0 < chunks) g0 = ld_raw(p.norm_w + c0 * VEC);
    float ss = gemv_stage_row(p, ar, g0);
#pragma unroll
    for (int i = PRE; i < DEPTH; i++) w[i] = gemv_w(p, wr, live, i * step + lane * VEC);
    if (p.norm_w) {
        ss = warp_sum(ss);
        if (lane == 0) s_ss[threadIdx.x >> 5] = ss;
    }
    __syncthreads();
    const float scale = gemv_staged_scale(p, s_ss);
    float acc = gemv_ragged<DEPTH>(p, w, wr, live);
    if (p.norm_w) acc *= scale;
    return acc;
}

// Registers budgeted for GEMV_BLOCKS_PER_SM blocks an SM (see above). The epilogue: a plain store, `gemv_glu`'s
// or `gemv_rope`'s (each its own entry, so the plain GEMV keeps its registers).
#define GEMV_PLAIN 0
#define GEMV_GLU 1
#define GEMV_ROPE 2

// The column a warp computes in group `g` (the GEMV_WARPS columns block g of a full grid would take), of
// which matrix, and its weight row; `live` is false past the last column.
struct GemvCol {
    int col, mat;
    bool live;
    const T* wr;
};

template <int KIND>
__device__ __forceinline__ GemvCol gemv_col(const GemvP& p, int g) {
    GemvCol c;
    c.col = g * GEMV_WARPS + (threadIdx.x >> 5);
    c.mat = 0;
    if (p.nmat > 1 && c.col >= p.n[0]) {
        c.col -= p.n[0];
        c.mat = 1;
        if (p.nmat > 2 && c.col >= p.n[1]) {
            c.col -= p.n[1];
            c.mat = 2;
        }
    }
    if (KIND == GEMV_ROPE && roped(p, c.mat)) c.col = rope_col(c.col, p.rope_half, p.rope_dh);
    if (KIND == GEMV_GLU) {
        // Warps 2j and 2j + 1: column g * GEMV_WARPS / 2 + j of the gate and of the up matrix.
        c.col = g * (GEMV_WARPS / 2) + (threadIdx.x >> 6);
        c.mat = (threadIdx.x >> 5) & 1;
    }
    c.live = c.col < pick(p.n, c.mat);
    c.wr = pick(p.w, c.mat) + (i64)(c.live ? gemv_wrow(p, c.mat, c.col) : 0) * p.K;
    return c;
}

// The warp's lanes' sums made one and stored as the launch's kind stores.
template <int KIND>
__device__ __forceinline__ void gemv_finish(const GemvP& p, const GemvCol& c, int m, float acc,
                                            const GemvTail& tail) {
    const bool stores = c.live && (threadIdx.x & 31) == 0;
    acc = warp_sum(acc);
    if (KIND == GEMV_GLU) {
        gemv_glu_store(p, c.mat, m, c.col, acc, tail, stores);
    } else if (KIND == GEMV_ROPE) {
        gemv_rope_store(p, c.mat, m, c.col, acc, tail, stores);
    } else if (stores) {
        gemv_store(p, c.mat, m, c.col, acc, tail);
    }
}

// A warp's sum (each lane its part) over a row of whole rings (chunks a multiple of GEMV_DEPTH * 32) with the
// staged row: `w` holds the row's first ring; each load is replaced as it is used by the one a ring ahead,
// and in the last ring by the first of the warp's next column (`next`, none when it is not live), so a
// warp's loads run on from column to column with no bounds check.
__device__ __forceinline__ float gemv_rings(const GemvP& p, uint4 (&w)[GEMV_DEPTH], const T* wr,
                                            const GemvCol& next, int rings) {
    const int lane = threadIdx.x & 31;
    float acc = 0.f;
    for (int r = 0; r < rings; r++) {
        const int cb = lane + r * GEMV_DEPTH * 32;
        const bool last = r == rings - 1;
        const T* from = last ? next.wr + lane * VEC : wr + (cb + GEMV_DEPTH * 32) * VEC;
        const bool more = !last || next.live;
#pragma unroll
        for (int i = 0; i < GEMV_DEPTH; i++) {
            float wv[VEC];
            cvt_vec(w[i], wv);
            w[i] = more ? ld_weight_pred(from + i * 32 * VEC, p.early) : make_uint4(0u, 0u, 0u, 0u);
            gemv_fma(acc, gemv_xs + (cb + i * 32) * VEC, wv);
        }
    }
    return acc;
}

// The `_waves` entries' start, once a block: the warp's first ring of loads of its first weight row `wr` (the
// first GEMV_PRE before `pdl_wait` when `early`) and the block's row of `a` staged around them; returns the
// norm's scale (1 without a norm).
__device__ __forceinline__ float gemv_waves_start(const GemvP& p, const T* wr, bool live, uint4 (&w)[GEMV_DEPTH]) {
    __shared__ float s_ss[GEMV_WARPS];
    const int lane = threadIdx.x & 31, chunks = p.K / VEC, c0 = threadIdx.x;
    uint4 g0 = make_uint4(0u, 0u, 0u, 0u);
    if (p.norm_w && p.early && c0 < chunks) g0 = ld_raw(p.norm_w + c0 * VEC);
#pragma unroll
    for (int i = 0; i < GEMV_PRE && i < GEMV_DEPTH; i++) w[i] = gemv_w(p, wr, live, (i * 32 + lane) * VEC);
    pdl_wait();
    TRACE_WAITED();
    pdl_launch();
    if (p.norm_w && !p.early && c0 < chunks) g0 = ld_raw(p.norm_w + c0 * VEC);
    float ss = gemv_stage_row(p, p.a + (i64)blockIdx.y * p.K, g0);
#pragma unroll
    for (int i = GEMV_PRE; i < GEMV_DEPTH; i++) w[i] = gemv_w(p, wr, live, (i * 32 + lane) * VEC);
    if (p.norm_w) {
        ss = warp_sum(ss);
        if (lane == 0) s_ss[threadIdx.x >> 5] = ss;
    }
    __syncthreads();
    return gemv_staged_scale(p, s_ss);
}

// A warp's sum over weight row `wr` with the staged row, `w` holding its first ring: over rows of whole rings
// (`rings` of them) the loads run on into `next`'s row (`gemv_rings`); else `w` then holds the first ring of
// `next`'s row, loaded after this row's last (`gemv_ragged`).
__device__ __forceinline__ float gemv_row(const GemvP& p, uint4 (&w)[GEMV_DEPTH], const T* wr, bool live,
                                          const GemvCol& next, int rings, bool whole) {
    if (whole) return gemv_rings(p, w, wr, next, rings);
    const float acc = gemv_ragged<GEMV_DEPTH>(p, w, wr, live);
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int i = 0; i < GEMV_DEPTH; i++) w[i] = gemv_w(p, next.wr, next.live, (i * 32 + lane) * VEC);
    return acc;
}

// The `_waves` entries' staged path (a launch of more groups than a wave of blocks, `kernels::gemv_blocks`):
// as `gemv_stream`, but a block takes the groups blockIdx.x, blockIdx.x + gridDim.x, ... with one staging of
// the row, and a warp's loads run on from one column into its next (measured on the H200, same call: the
// Llama-3.2-1B shape 1029.0 -> 965.3 us a step, its gate/up and vocabulary projections 1 024 and 16 032 groups
// on 396 blocks; now 342 and 392, `kernels::gemv_blocks`). A group's residual and cache row are requested as it starts: in a build where one kernel
// took both paths, requesting the first group's before the staging held registers across it (spills), and
// config (c) lost 20 us a step. Its own entries keep `gemv_stream` as it was.
template <int KIND>
__device__ __forceinline__ void gemv_waves_body(const GemvP& p) {
    TRACE_BEGIN(TRACE_GEMV);
    const int lane = threadIdx.x & 31, chunks = p.K / VEC, m = blockIdx.y;
    const int rings = chunks / (GEMV_DEPTH * 32);
    const bool whole = chunks % (GEMV_DEPTH * 32) == 0;
    if (!p.early) pdl_wait();  // a later `pdl_wait` returns at once
    GemvCol c = gemv_col<KIND>(p, blockIdx.x);
    GemvTail tail = gemv_bias(p, c.mat, c.col, c.live && lane == 0);
    uint4 w[GEMV_DEPTH];
    const float inv = gemv_waves_start(p, c.wr, c.live, w);
    for (int g = blockIdx.x; g < p.groups; g += gridDim.x) {
        if (g != (int)blockIdx.x) tail = gemv_bias(p, c.mat, c.col, c.live && lane == 0);
        gemv_after_wait(p, c.mat, m, c.col, c.live && lane == 0, tail, KIND == GEMV_ROPE);
        const GemvCol next = gemv_col<KIND>(p, g + gridDim.x);
        const float acc = gemv_row(p, w, c.wr, c.live, next, rings, whole);
        gemv_finish<KIND>(p, c, m, acc * inv, tail);
        // The epilogues' shared values are read before the next group writes them.
        if (KIND != GEMV_PLAIN && g + gridDim.x < p.groups) __syncthreads();
        c = next;
    }
    TRACE_WORKED();
}

// Column `col` of the gate (`mat` 0) or up (1) matrix of `gemv_glu_waves_body`.
__device__ __forceinline__ GemvCol glu_col(const GemvP& p, int mat, int col) {
    GemvCol c;
    c.col = col;
    c.mat = mat;
    c.live = col < p.n[0];
    c.wr = p.w[mat] + (i64)(c.live ? gemv_wrow(p, mat, col) : 0) * p.K;
    return c;
}

// `gemv_glu`'s `_waves` entry: a warp computes column j of both the gate and the up matrix, its gate row and
// then its up row, its loads running on from one row into the next and into its next column, and stores
// silu(gate) * up itself (rounded as `gemv_glu_store` rounds), so no warp waits for another: the paired warps
// of `gemv_glu` meet at two barriers a group. A block takes GEMV_WARPS columns at a time, the groups
// blockIdx.x, blockIdx.x + gridDim.x, ... of them. Measured on the H200, same call: the Llama-3.2-1B shape
// 937.9 -> 901.3 us a step (its gate/up, alone under Nsight Compute, 24.8 -> 22.9 us).
__device__ __forceinline__ void gemv_glu_waves_body(const GemvP& p) {
    const int groups = (p.n[0] + GEMV_WARPS - 1) / GEMV_WARPS;
    if ((int)blockIdx.x >= groups) return;  // a launch sized by half-width groups (`kernels::gemv_blocks`)
    TRACE_BEGIN(TRACE_GEMV);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, chunks = p.K / VEC, m = blockIdx.y;
    const int rings = chunks / (GEMV_DEPTH * 32);
    const bool whole = chunks % (GEMV_DEPTH * 32) == 0;
    if (!p.early) pdl_wait();  // a later `pdl_wait` returns at once
    GemvCol gate = glu_col(p, 0, blockIdx.x * GEMV_WARPS + warp);
    uint4 w[GEMV_DEPTH];
    const float inv = gemv_waves_start(p, gate.wr, gate.live, w);
    for (int g = blockIdx.x; g < groups; g += gridDim.x) {
        const bool stores = gate.live && lane == 0;
        const T bg = stores && p.bias[0] ? p.bias[0][gemv_wrow(p, 0, gate.col)] : (T)0;
        const T bu = stores && p.bias[1] ? p.bias[1][gemv_wrow(p, 1, gate.col)] : (T)0;
        const GemvCol up = glu_col(p, 1, gate.col), next = glu_col(p, 0, (g + gridDim.x) * GEMV_WARPS + warp);
        const float sg = warp_sum(gemv_row(p, w, gate.wr, gate.live, up, rings, whole) * inv);
        const float su = warp_sum(gemv_row(p, w, up.wr, up.live, next, rings, whole) * inv);
        if (stores) {
            const float xg = p.bias[0] ? sg + val(bg) : sg, xu = p.bias[1] ? su + val(bu) : su;
            st(p.y[0], gemv_at(p, 0, m, gate.col), glu_act(p, rnd(xg)) * rnd(xu));
        }
        gate = next;
    }
    TRACE_WORKED();
}

// DEPTH and PRE: the staged path's loads in flight a lane and those requested before the wait (`gemv_stream`).
template <int KIND, int DEPTH, int PRE>
__device__ __forceinline__ void gemv_body(const GemvP& p) {
    TRACE_BEGIN(TRACE_GEMV);
    const int lane = threadIdx.x & 31;
    const int m = blockIdx.y;
    const GemvCol at = gemv_col<KIND>(p, blockIdx.x);
    const int col = at.col, mat = at.mat;
    const bool live = at.live;
    const T* wr = at.wr;
    const T* ar = p.a + (i64)m * p.K;
    const bool stores = live && lane == 0;
    if (!p.early) pdl_wait();  // a later `pdl_wait` returns at once
    GemvTail tail = gemv_bias(p, mat, col, stores);
    float acc = 0.f;
    if (p.staged) {
        acc = gemv_stream<DEPTH, PRE>(p, mat, m, col, stores, tail, wr, ar, live, KIND == GEMV_ROPE);
    } else if (p.vec_ok) {
        acc = gemv_dot(p, mat, m, col, stores, tail, wr, ar, live, KIND == GEMV_ROPE);
    } else {
        pdl_wait();
        TRACE_WAITED();
        pdl_launch();
        gemv_after_wait(p, mat, m, col, stores, tail, KIND == GEMV_ROPE);
        float inv = 1.f, mean = 0.f;
        if (p.norm_w) {
            if (p.centred) {
                float s = 0.f;
                for (int k = lane; k < p.K; k += 32) s += ld(ar, k);
                mean = warp_sum(s) / (float)p.K;
            }
            float ss = 0.f;
            for (int k = lane; k < p.K; k += 32) ss += (ld(ar, k) - mean) * (ld(ar, k) - mean);
            inv = rsqrtf(warp_sum(ss) / (float)p.K + p.eps);
        }
        if (live) {
            for (int k = lane; k < p.K; k += 32) {
                float x = ld(ar, k);
                if (p.norm_w && p.centred) {
                    x = (x - mean) * inv * ld(p.norm_w, k) + (p.norm_b ? ld(p.norm_b, k) : 0.f);
                } else if (p.norm_w) {
                    x = x * inv * ld(p.norm_w, k);
                }
                acc += x * ld(wr, k);
            }
        }
    }
    acc = warp_sum(acc);
    TRACE_WORKED();
    if (KIND == GEMV_GLU) {
        gemv_glu_store(p, mat, m, col, acc, tail, stores);
    } else if (KIND == GEMV_ROPE) {
        gemv_rope_store(p, mat, m, col, acc, tail, stores);
    } else if (stores) {
        gemv_store(p, mat, m, col, acc, tail);
    }
}

// The entries `kernels.rs` loads by name: each kind's one-group and `_waves` body.
#define GEMV_ENTRY(name, per_sm, call)                                                           \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32, per_sm) name(GemvP p) { call; }
#define GEMV_GROUP(kind) gemv_body<kind, GEMV_DEPTH, GEMV_PRE>(p)
#define GEMV_DEEP(kind) gemv_body<kind, GEMV_DEEP_DEPTH, GEMV_DEEP_PRE>(p)
GEMV_ENTRY(gemv, GEMV_BLOCKS_PER_SM, GEMV_GROUP(GEMV_PLAIN))
GEMV_ENTRY(gemv_glu, GEMV_BLOCKS_PER_SM, GEMV_GROUP(GEMV_GLU))
GEMV_ENTRY(gemv_rope, GEMV_BLOCKS_PER_SM, GEMV_GROUP(GEMV_ROPE))
GEMV_ENTRY(gemv_deep, GEMV_DEEP_BLOCKS_PER_SM, GEMV_DEEP(GEMV_PLAIN))
GEMV_ENTRY(gemv_glu_deep, GEMV_DEEP_BLOCKS_PER_SM, GEMV_DEEP(GEMV_GLU))
GEMV_ENTRY(gemv_rope_deep, GEMV_DEEP_BLOCKS_PER_SM, GEMV_DEEP(GEMV_ROPE))
GEMV_ENTRY(gemv_waves, GEMV_BLOCKS_PER_SM, gemv_waves_body<GEMV_PLAIN>(p))
GEMV_ENTRY(gemv_glu_waves, GEMV_BLOCKS_PER_SM, gemv_glu_waves_body(p))
GEMV_ENTRY(gemv_rope_waves, GEMV_BLOCKS_PER_SM, gemv_waves_body<GEMV_ROPE>(p))
