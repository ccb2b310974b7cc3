// The CUDA delegate's typed kernels, compiled by NVRTC once per process per device and element type: with
// `-DKV_F16` the float type `T` holds IEEE half bits (converted with PTX `cvt`), with `-DKV_BF16` bfloat16
// bits (converted with integer arithmetic: the top half of an f32, rounded to nearest even), without either
// `T` is `float`; no header is needed. Every kernel takes one parameter struct by value; `src/kernels.rs`
// mirrors each struct field for field (`#[repr(C)]`). Arithmetic is in f32 throughout; `T` is only how values
// are stored. The products are in `kernels/linear.cu` (appended to this file); the untyped kernels of the
// general path (elementwise, cast, copies) are in `general.cu`. Every kernel here waits for the previous
// kernel of its call with `pdl_wait` before it reads that kernel's outputs or writes anything, so it may be
// launched overlapping it (`kernels/common.cuh`).
//
// Positions are read from device memory (`pos[0]`), never passed by value, so a captured CUDA graph replays
// a decode step at whatever position the caller's position tensor holds. Out-of-range token ids and positions
// set a bit in `err` and the offending work is skipped (a kernel cannot return an error); the delegate
// reports the bit.

typedef long long i64;
typedef unsigned long long u64;

#define ERR_TOKEN 1
#define ERR_POSITION 2

#if defined(KV_F16) || defined(KV_BF16)
typedef unsigned short T;
#ifdef KV_F16
__device__ __forceinline__ float h2f(unsigned short h) { return f16_to_f32(h); }
__device__ __forceinline__ unsigned short f2h(float f) { return f32_to_f16(f); }
#else
__device__ __forceinline__ float h2f(unsigned short h) { return bf16_to_f32(h); }
__device__ __forceinline__ unsigned short f2h(float f) { return f32_to_bf16(f); }
#endif
__device__ __forceinline__ float val(T v) { return h2f(v); }
__device__ __forceinline__ float ld(const T* p, i64 i) { return h2f(p[i]); }
__device__ __forceinline__ void st(T* p, i64 i, float f) { p[i] = f2h(f); }
__device__ __forceinline__ float rnd(float f) { return h2f(f2h(f)); }  // f as T holds it
#define VEC 8
// Eight values from 16 aligned bytes.
__device__ __forceinline__ void cvt_vec(uint4 u, float* out) {
    unsigned int w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        out[2 * i] = h2f((unsigned short)(w[i] & 0xffffu));
        out[2 * i + 1] = h2f((unsigned short)(w[i] >> 16));
    }
}
#else
typedef float T;
__device__ __forceinline__ float val(T v) { return v; }
__device__ __forceinline__ float ld(const T* p, i64 i) { return p[i]; }
__device__ __forceinline__ void st(T* p, i64 i, float f) { p[i] = f; }
__device__ __forceinline__ float rnd(float f) { return f; }
#define VEC 4
__device__ __forceinline__ void cvt_vec(uint4 u, float* out) {
    out[0] = __uint_as_float(u.x);
    out[1] = __uint_as_float(u.y);
    out[2] = __uint_as_float(u.z);
    out[3] = __uint_as_float(u.w);
}
#endif

// VEC values from 16 aligned bytes: the raw load (to issue early) and its conversion.
__device__ __forceinline__ uint4 ld_raw(const T* p) { return *reinterpret_cast<const uint4*>(p); }
__device__ __forceinline__ void ld_vec(const T* p, float* out) { cvt_vec(ld_raw(p), out); }

// VEC values stored as 16 aligned bytes, each rounded as `st` rounds it.
__device__ __forceinline__ void st_vec(T* p, const float* v) {
    T t[VEC];
#pragma unroll
    for (int i = 0; i < VEC; i++) {
#if defined(KV_F16) || defined(KV_BF16)
        t[i] = f2h(v[i]);
#else
        t[i] = v[i];
#endif
    }
    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(t);
}

// Whether `p` (null counts) is 16-byte aligned: where whole runs of VEC values load as one.
__device__ __forceinline__ bool aligned16(const void* p) { return ((u64)p & 15ull) == 0; }

// ---------------------------------------------------------------------------------------------------------
// Embedding: out[r, :] = table[idx[r], :] (+ table2[idx2[r], :] when `table2` is set: token plus position
// embedding in one launch; * scale[0] when `scale` is set: Gemma's `embed_scale`). Grid: rows. Ids outside the
// table zero the row and set ERR_TOKEN.

struct GatherP {
    const T* table;
    const i64* idx;
    const T* table2;
    const i64* pos2;  // table2's row for output row r is pos2[0] + r
    T* out;
    int* err;
    int rows, n, n2, dim;
    const T* scale;  // one value, or null
};

extern "C" __global__ void gather(GatherP p) {
    TRACE_BEGIN(TRACE_GATHER);
    pdl_wait();
    TRACE_WAITED();
    pdl_launch();
    const int r = blockIdx.x;
    const i64 id = p.idx[r];
    bool ok = id >= 0 && id < p.n;
    i64 id2 = 0;
    if (p.table2) {
        id2 = p.pos2[0] + r;
        if (id2 < 0 || id2 >= p.n2) {
            if (threadIdx.x == 0) atomicOr(p.err, ERR_POSITION);
            ok = false;
        }
    }
    if (!ok && threadIdx.x == 0 && !(id >= 0 && id < p.n)) atomicOr(p.err, ERR_TOKEN);
    for (int d = threadIdx.x; d < p.dim; d += blockDim.x) {
        float v = 0.f;
        if (ok) {
            v = ld(p.table, id * p.dim + d);
            if (p.table2) v += ld(p.table2, id2 * p.dim + d);
            if (p.scale) v *= ld(p.scale, 0);
        }
        st(p.out, (i64)r * p.dim + d, v);
    }
}

// out = a + b, elementwise.
struct AddP {
    const T* a;
    const T* b;
    T* out;
    i64 n;
};

extern "C" __global__ void add(AddP p) {
    TRACE_BEGIN(TRACE_ADD);
    pdl_wait();
    TRACE_WAITED();
    pdl_launch();
    // Runs of VEC values a thread where every operand is aligned (the same sums, value by value).
    const bool runs = p.n % VEC == 0 && aligned16(p.a) && aligned16(p.b) && aligned16(p.out);
    const i64 stride = (i64)gridDim.x * blockDim.x;
    if (runs) {
        for (i64 c = (i64)blockIdx.x * blockDim.x + threadIdx.x; c < p.n / VEC; c += stride) {
            float a[VEC], b[VEC];
            ld_vec(p.a + c * VEC, a);
            ld_vec(p.b + c * VEC, b);
#pragma unroll
            for (int k = 0; k < VEC; k++) a[k] += b[k];
            st_vec(p.out + c * VEC, a);
        }
        return;
    }
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += stride)
        st(p.out, i, ld(p.a, i) + ld(p.b, i));
}

// RMS norm of each row, or LayerNorm (`centred`: the row's mean subtracted first, `plan::Norm`), times the
// gains `w`, plus the bias `b` when set, then plus the residual `res` when set (the norm rounded to T first, as
// the separate ops round: Gemma 2's post-norms). Grid: rows; block: 256.
struct RmsP {
    const T* x;
    const T* w;
    const T* b;  // LayerNorm's bias [dim], or null
    T* out;
    int rows, dim;
    float eps;
    int centred;
    const T* res;  // [rows, dim] added after the norm, or null
};

// `rms_norm` over runs of VEC values a thread (rows of whole runs, every operand aligned): the value-a-thread
// loop's arithmetic; only which values each thread's partial sums take differs (the f32 sums' order).
__device__ __forceinline__ void rms_norm_runs(const RmsP& p, i64 base, float* scratch) {
    const int runs = p.dim / VEC;
    float mean = 0.f;
    if (p.centred) {
        float s = 0.f;
        for (int c = threadIdx.x; c < runs; c += blockDim.x) {
            float v[VEC];
            ld_vec(p.x + base + c * VEC, v);
#pragma unroll
            for (int k = 0; k < VEC; k++) s += v[k];
        }
        mean = block_sum(s, scratch) / (float)p.dim;
    }
    float ss = 0.f;
    for (int c = threadIdx.x; c < runs; c += blockDim.x) {
        float v[VEC];
        ld_vec(p.x + base + c * VEC, v);
#pragma unroll
        for (int k = 0; k < VEC; k++) ss += (v[k] - mean) * (v[k] - mean);
    }
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / (float)p.dim + p.eps);
    for (int c = threadIdx.x; c < runs; c += blockDim.x) {
        float v[VEC], w[VEC], b[VEC], r[VEC];
        ld_vec(p.x + base + c * VEC, v);
        ld_vec(p.w + c * VEC, w);
        if (p.b) ld_vec(p.b + c * VEC, b);
        if (p.res) ld_vec(p.res + base + c * VEC, r);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            const float y = (v[k] - mean) * inv * w[k];
            const float z = p.b ? y + b[k] : y;
            v[k] = p.res ? rnd(z) + r[k] : z;
        }
        st_vec(p.out + base + c * VEC, v);
    }
}

extern "C" __global__ void rms_norm(RmsP p) {
    TRACE_BEGIN(TRACE_RMS);
    pdl_wait();
    TRACE_WAITED();
    pdl_launch();
    __shared__ float scratch[32];
    const i64 base = (i64)blockIdx.x * p.dim;
    if (p.dim % VEC == 0 && aligned16(p.x + base) && aligned16(p.w) && aligned16(p.b) && aligned16(p.out + base) &&
        aligned16(p.res ? p.res + base : nullptr)) {
        rms_norm_runs(p, base, scratch);
        return;
    }
    float mean = 0.f;
    if (p.centred) {
        float s = 0.f;
        for (int d = threadIdx.x; d < p.dim; d += blockDim.x) s += ld(p.x, base + d);
        mean = block_sum(s, scratch) / (float)p.dim;
    }
    float ss = 0.f;
    for (int d = threadIdx.x; d < p.dim; d += blockDim.x) {
        float v = ld(p.x, base + d) - mean;
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / (float)p.dim + p.eps);
    for (int d = threadIdx.x; d < p.dim; d += blockDim.x) {
        const float y = (ld(p.x, base + d) - mean) * inv * ld(p.w, d);
        const float z = p.b ? y + ld(p.b, d) : y;
        st(p.out, base + d, p.res ? rnd(z) + ld(p.res, base + d) : z);
    }
}

// ---------------------------------------------------------------------------------------------------------
// KV-cache update, in place: cache[i][h, pos + t, :] = upd[i][t, h * Dh : (h + 1) * Dh] (token-major) or
// upd[i][h, t, :] (head-major) for up to two caches (K and V in one launch). Grid: (Tq, n); a block's threads
// take a row's heads in runs of VEC values (16 bytes) where the heads are whole runs and both buffers aligned,
// else a value each.

struct KvP {
    T* cache[2];
    const T* upd[2];
    const i64* pos;
    int* err;
    int n, Tq, H, L, Dh;
    int u_ts, u_hs;  // the update's strides (elements) per row t and per head h: token-major or head-major
};

extern "C" __global__ void kv_update(KvP p) {
    TRACE_BEGIN(TRACE_KV);
    pdl_wait();
    TRACE_WAITED();
    pdl_launch();
    const int t = blockIdx.x, i = blockIdx.y;
    const i64 row = p.pos[0] + t;
    if (row < 0 || row >= p.L) {
        if (threadIdx.x == 0) atomicOr(p.err, ERR_POSITION);
        return;
    }
    const bool runs = p.Dh % VEC == 0 && aligned16(p.cache[i]) && aligned16(p.upd[i]);
    const int width = runs ? VEC : 1, per_head = p.Dh / width;
    for (int u = threadIdx.x; u < p.H * per_head; u += blockDim.x) {
        const int h = u / per_head, d = (u % per_head) * width;
        T* dst = p.cache[i] + ((i64)h * p.L + row) * p.Dh + d;
        const T* src = p.upd[i] + (i64)t * p.u_ts + (i64)h * p.u_hs + d;
        if (runs) {
            *reinterpret_cast<uint4*>(dst) = ld_raw(src);
        } else {
            *dst = *src;
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// Decode attention, split over the cache (flash-decoding) with the merge folded in. Query t sits at position
// qpos = pos[0] + t and attends to rows 0..=qpos of its KV head (query head h reads KV head h / group:
// grouped-query attention reads each shared K and V row from the one cache, never a repeated copy).
// Grid (H, splits, Tq), ATTN_WARPS warps a block. The valid rows are cut into `splits` ranges on the device,
// from the position (so a short prefix is not spread thin and a long one gives every block a few tiles): a
// block takes one range. Within it, groups of `lanes` adjacent threads each own a row at a time, a lane
// `Dh / lanes` of its elements (16 bytes when `vec_ok`): the lanes' partial q.k meet by shuffles, and each
// group keeps a running softmax (max, sum, weighted V) in registers, so no block-wide step runs per row. The
// rows of the next tile are requested before the current tile is used (two tiles of ATTN_U rows a group in
// flight). At the end the groups' states meet, by shuffles within each warp and then in shared memory, and
// the block writes its partial output, max and sum; the last block of (t, h) to finish (a ticket counter)
// merges the ranges, writes the output and resets its counter for the next launch (or graph replay). With
// `early` set (the call writes the caches only at rows pos[0].. and never writes `pos`), the first tile's rows
// before pos[0] are requested before `pdl_wait`: the cache streams in while the projections that produce the
// query finish. f16 and bf16 heads of 64 or 128 values run `attention_tc` (kernels/attention_tc.cu) instead,
// on tensor cores, where the device has them; both merge with `attn_merge`.

#define ATTN_WARPS 4
#ifndef ATTN_U
#define ATTN_U 4  // rows a group holds per tile (tunable, see `kernels/tuning.rs`)
#endif

struct AttnP {
    const T* q;
    const T* k;
    const T* v;
    T* out;
    const i64* pos;
    float* o_part;           // [Tq, H, splits, Dh]
    float* ml;               // [Tq, H, splits, 2]
    unsigned int* counters;  // [Tq, H], zero between launches
    int* err;
    int Tq, H, L, Dh, splits, vec_ok;
    float scale;
    int lanes;       // threads per row: Dh / VEC with vec_ok, else min(32, Dh rounded up to a power of two)
    int q_ts, q_hs;  // q's and out's strides (elements) per row t and per query head h
    int group;       // query heads per KV head: query head h reads KV head h / group
    int early;       // rows before pos[0] may be read before `pdl_wait`
    int hpb;         // query heads a block takes (`attention_tc`; 1 for `attention`)
    float softcap;   // logit soft-capping c (a scaled score s becomes c tanh(s / c)); 0: none
};

// Gemma 2's logit soft-capping of a scaled score `s` at `c` (> 0), in f32.
__device__ __forceinline__ float soft_cap(float s, float c) { return c * tanhf(s / c); }

// A group's running softmax over the rows it has seen: max, sum of exp(score - max), and the lane's elements
// of sum exp(score - max) v.
struct Soft {
    float m, l, o[8];
};

// Adds a row's score `x` (NEG_INF: not a row of the query) and the lane's `n` values of its V row.
__device__ __forceinline__ void soft_add(Soft& s, float x, const float* v, int n) {
    if (x == NEG_INF) return;
    const float m = fmaxf(s.m, x);
    const float c = __expf(s.m - m), e = __expf(x - m);
    s.l = s.l * c + e;
#pragma unroll
    for (int i = 0; i < 8; i++)
        if (i < n) s.o[i] = s.o[i] * c + e * v[i];
    s.m = m;
}

// The row's score from the lanes' partial dot products (a group is `lanes` adjacent lanes of one warp).
__device__ __forceinline__ float row_sum(float x, int lanes) {
    for (int o = lanes / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

// Merges running softmaxes (max `m`, sum `l`, the lane's first `n` values `o`) held by lanes whose indices
// differ in the bits from `first` (a power of two) below `end`: afterwards each such set of lanes holds the
// merged state.
template <int N>
__device__ __forceinline__ void lanes_merge(float& m, float& l, float (&o)[N], int n, int first, int end) {
    for (int off = first; off < end; off <<= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, off), l2 = __shfl_xor_sync(0xffffffffu, l, off);
        const float mx = fmaxf(m, m2);
        const float c = m == NEG_INF ? 0.f : __expf(m - mx), c2 = m2 == NEG_INF ? 0.f : __expf(m2 - mx);
        l = l * c + l2 * c2;
#pragma unroll
        for (int i = 0; i < N; i++) {
            if (i < n) o[i] = o[i] * c + __shfl_xor_sync(0xffffffffu, o[i], off) * c2;
        }
        m = mx;
    }
}

// Merges the running softmaxes of a warp's groups (`lanes` adjacent lanes each, the lane's first `n` values):
// afterwards every group holds the warp's state.
__device__ __forceinline__ void soft_merge_warp(Soft& s, int lanes, int n) { lanes_merge(s.m, s.l, s.o, n, lanes, 32); }

// The ticket merge's settings (tunable, see `kernels/tuning.rs`). Since (b) and the Llama shape merge in
// clusters, only (c) (and f32) run it: there these measured 515.5 -> 504.9 us a step at 4096 and 627.6 -> 620.8
// at 8191 on the H200, against shuffles off and batches of 8 (BENCHMARKS.md, "Sixteenth pass").
#ifndef ATTN_MERGE_SHFL
#define ATTN_MERGE_SHFL 1  // 1: a merge's groups meet by warp shuffles where they can, with no barrier
#endif
#ifndef ATTN_MERGE_BATCH
#define ATTN_MERGE_BATCH 12  // ranges a merging thread requests at once
#endif

// One step of an online softmax merge: the running state (max `m`, sum `l`, four values `acc`) takes a
// partial (max `pm`, sum `pl`, values `po`), both rescaled to the larger max. `ex` is the exponential the
// maxima are exponents of: e^x for `attn_merge`'s (natural-log units), 2^x for the cluster merge's (log2).
template <typename Exp>
__device__ __forceinline__ void merge_add(float& m, float& l, float (&acc)[4], float pm, float pl, float4 po,
                                          Exp ex) {
    const float mn = fmaxf(m, pm);
    const float a = ex(m - mn), e = ex(pm - mn);
    l = __fmaf_rn(l, a, pl * e);
    acc[0] = __fmaf_rn(acc[0], a, po.x * e);
    acc[1] = __fmaf_rn(acc[1], a, po.y * e);
    acc[2] = __fmaf_rn(acc[2], a, po.z * e);
    acc[3] = __fmaf_rn(acc[3], a, po.w * e);
    m = mn;
}
// e^x for `merge_add` (the fast `__expf`).
struct ExpE {
    __device__ __forceinline__ float operator()(float x) const { return __expf(x); }
};

// Writes a merged head's values d .. d + w4 - 1 (of query t, head h): num / den.
__device__ __forceinline__ void attn_store(const AttnP& p, int t, int h, int d, int w4, const float (&num)[4],
                                           float den) {
    const i64 at = (i64)t * p.q_ts + (i64)h * p.q_hs + d;
#pragma unroll
    for (int u = 0; u < 4; u++)
        if (u < w4) st(p.out, at + u, num[u] / den);
}

// Resets the ticket counter of (t, h) for the next launch (or graph replay): the merge's last act.
__device__ __forceinline__ void attn_reset_ticket(const AttnP& p, int t, int h) {
    if (threadIdx.x == 0) p.counters[(i64)t * p.H + h] = 0u;
}

// The merge's groups' states, in `sh` as `attn_merge` left them, meet: each column's output written (with
// ATTN_MERGE_SHFL, where the groups are adjacent lanes, `lanes_merge` instead).
__device__ void attn_meet(const AttnP& p, int t, int h0, int cols, int dl, int w4, int ngrp, const float* sh) {
    const int span = ngrp * cols;
    const float *gm = sh, *gl = gm + span, *go = gl + span;
    for (int col = threadIdx.x; col < cols; col += blockDim.x) {
        const int n = col / dl, d = (col % dl) * w4;
        float mx = NEG_INF;
        for (int g = 0; g < ngrp; g++) mx = fmaxf(mx, gm[g * cols + col]);
        float den = 0.f, num[4] = {0.f, 0.f, 0.f, 0.f};
        for (int g = 0; g < ngrp; g++) {
            const int k = g * cols + col;
            if (gm[k] == NEG_INF) continue;  // a group with no range
            const float w = __expf(gm[k] - mx);
            den += w * gl[k];
#pragma unroll
            for (int u = 0; u < 4; u++) num[u] += w * go[k * 4 + u];
        }
        attn_store(p, t, h0 + n, d, w4, num, den);
    }
}

// The merge, by the last block of (t, heads h0 .. h0 + hpb - 1): each head's out = sum_c exp(m_c - M) o_c /
// sum_c exp(m_c - M) l_c over the `nvalid` ranges' partials (read from L2: other blocks wrote them). A
// thread takes 4 values of a head (1 for a head size not a multiple of 4) and every ngrp-th range: it requests
// ATTN_MERGE_BATCH ranges' maxima, sums and values at once and merges them as they come (one round trip for
// up to ATTN_MERGE_BATCH * ngrp ranges, no barrier); the groups' states meet in `sh` (6 max(blockDim, hpb Dh)
// floats) after one barrier, or with ATTN_MERGE_SHFL, where a column's groups are adjacent lanes of whole
// warps, by shuffles. Then it resets the ticket counter of (t, h0) for the next launch.
__device__ void attn_merge(const AttnP& p, int h0, int hpb, int t, int nvalid, float* sh) {
    const int w4 = p.Dh % 4 == 0 ? 4 : 1;
    const int dl = p.Dh / w4, cols = hpb * dl;
    const int ngrp = max(1, (int)blockDim.x / cols), span = ngrp * cols;
    float* gm = sh;              // [span]: a group's max
    float* gl = gm + span;       // [span]: its sum
    float* go = gl + span;       // [4 span]: its values
    // Groups in adjacent lanes (whole warps of them) meet by shuffles, with no barrier; else in `sh`.
    const bool lanes = ATTN_MERGE_SHFL && (ngrp & (ngrp - 1)) == 0 && span % 32 == 0;
    for (int idx = threadIdx.x; idx < span; idx += blockDim.x) {
        const int grp = lanes ? idx % ngrp : idx / cols, col = lanes ? idx / ngrp : idx % cols;
        const int n = col / dl, d = (col % dl) * w4;
        const i64 base = ((i64)t * p.H + h0 + n) * p.splits;
        const float* part = p.o_part + base * p.Dh + d;
        float m = NEG_INF, l = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
        for (int c0 = grp; c0 < nvalid; c0 += ATTN_MERGE_BATCH * ngrp) {
            float2 ml[ATTN_MERGE_BATCH];
            float4 o[ATTN_MERGE_BATCH];
#pragma unroll
            for (int b = 0; b < ATTN_MERGE_BATCH; b++) {
                const int c = c0 + b * ngrp;
                ml[b] = make_float2(NEG_INF, 0.f);
                o[b] = make_float4(0.f, 0.f, 0.f, 0.f);
                if (c < nvalid) {
                    ml[b] = __ldcg(reinterpret_cast<const float2*>(p.ml + (base + c) * 2));
                    if (w4 == 4) {
                        o[b] = __ldcg(reinterpret_cast<const float4*>(part + (i64)c * p.Dh));
                    } else {
                        o[b].x = __ldcg(part + (i64)c * p.Dh);
                    }
                }
            }
#pragma unroll
            for (int b = 0; b < ATTN_MERGE_BATCH; b++) {
                if (ml[b].x == NEG_INF) continue;  // past the valid ranges
                merge_add(m, l, acc, ml[b].x, ml[b].y, o[b], ExpE());
            }
        }
#if defined(KV_TRACE) && defined(KV_TRACE_MERGE)
        if (threadIdx.x == 0) kv_trace_waited = trace_now();  // diagnostics: the merge's loads done
#endif
        if (lanes) {
            lanes_merge(m, l, acc, 4, 1, ngrp);  // the column's `ngrp` groups, adjacent lanes
            if (grp == 0) attn_store(p, t, h0 + n, d, w4, acc, l);
            continue;
        }
        gm[idx] = m;
        gl[idx] = l;
#pragma unroll
        for (int u = 0; u < 4; u++) go[idx * 4 + u] = acc[u];
    }
    if (!lanes) {
        __syncthreads();
        attn_meet(p, t, h0, cols, dl, w4, ngrp, sh);
    }
    attn_reset_ticket(p, t, h0);
}

// A ticket: adds 1 to `counter` and returns its old value, with one acquire-release atomic at GPU scope. After
// a block barrier it publishes every write of the block (the barrier orders the other threads' writes before
// this thread's release: the pattern of CUTLASS's barrier); with a barrier after it, the block sees every write
// that other blocks published the same way before their adds. No separate fence: on the H200 the two fences
// that stood around the atomic cost about 0.5 us of each merge's critical path (config (c): 557 -> 541 us).
__device__ __forceinline__ unsigned int atomic_add_acq_rel(unsigned int* counter) {
    unsigned int old;
    asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
    return old;
}

// Block c's range of query t's valid prefix (rows 0..=pos[0] + t): [start, stop) of `nvalid` ranges of whole
// `grain` rows, at most `splits`; `pos0` is pos[0].
struct AttnRange {
    i64 pos0, start, stop;
    int nvalid;
};

// Waits for the previous kernel (unless the call reads the caches early), reads the position and finds block
// c's range of query t; false when the block has none. A position out of the cache sets ERR_POSITION (once a
// launch: by its block `first`) and no block has a range.
__device__ __forceinline__ bool attn_range(const AttnP& p, int t, int c, bool first, i64 grain, AttnRange& r) {
    if (!p.early) {
        pdl_wait();
        TRACE_WAITED();
    }
    r.pos0 = p.pos[0];
    const i64 qpos = r.pos0 + t;
    if (qpos < 0 || qpos >= p.L) {
        if (threadIdx.x == 0 && first) atomicOr(p.err, ERR_POSITION);
        return false;
    }
    const i64 rows = qpos + 1;
    const i64 per = ((rows + p.splits - 1) / p.splits + grain - 1) / grain * grain;
    r.start = c * per;
    r.stop = min(r.start + per, rows);
    r.nvalid = (int)((rows + per - 1) / per);
    return r.start < rows;
}

// Publishes the block's range and takes a ticket of (t, h): true in the last of the `nvalid` ranges, which
// then merges them. One thread takes it for the block, after the barrier (its release publishes every
// thread's writes), and the barrier after it hands the other ranges' writes, acquired with the last ticket,
// to every thread of the last block.
__device__ __forceinline__ bool attn_last_range(const AttnP& p, int t, int h, int nvalid) {
    __shared__ unsigned int ticket;
    __syncthreads();
    if (threadIdx.x == 0) ticket = atomic_add_acq_rel(p.counters + (i64)t * p.H + h);
    __syncthreads();
    return ticket == (unsigned int)(nvalid - 1);
}

// One tile: row j of each of the group's ATTN_U rows (j >= stop: none), K and V 16 bytes a lane.
struct Tile {
    uint4 k[ATTN_U], v[ATTN_U];
};

__device__ __forceinline__ void tile_load(Tile& tl, const T* kb, const T* vb, i64 row, int G, i64 lo, i64 hi,
                                          int Dh) {
#pragma unroll
    for (int u = 0; u < ATTN_U; u++) {
        const i64 j = row + (i64)u * G;
        if (j >= lo && j < hi) {
            tl.k[u] = ld_raw(kb + j * Dh);
            tl.v[u] = ld_raw(vb + j * Dh);
        }
    }
}

// `CAP`: the scores are soft-capped at `cap` (a separate instantiation, so the uncapped loop is unchanged).
template <bool CAP>
__device__ __forceinline__ void tile_use(Soft& s, const Tile& tl, const float* qv, i64 row, int G, i64 stop,
                                         int lanes, float cap) {
#pragma unroll
    for (int u = 0; u < ATTN_U; u++) {
        float kv[VEC], vv[VEC];
        cvt_vec(tl.k[u], kv);
        float dot = 0.f;
#pragma unroll
        for (int e = 0; e < VEC; e++) dot += qv[e] * kv[e];
        dot = row_sum(dot, lanes);
        if (CAP) dot = soft_cap(dot, cap);
        cvt_vec(tl.v[u], vv);
        soft_add(s, row + (i64)u * G < stop ? dot : NEG_INF, vv, VEC);
    }
}

// The vectorised rows of `attention` from `first` on, two tiles in flight (`a` holds the first, loaded).
template <bool CAP>
__device__ __forceinline__ void attn_tiles(Soft& s, Tile& a, Tile& b, const T* kb, const T* vb, const float* qv,
                                           i64 first, int grp, int step, int G, i64 stop, const AttnP& p) {
    for (i64 row = first; row - grp < stop; row += 2 * step) {
        tile_load(b, kb, vb, row + step, G, 0, stop, p.Dh);
        tile_use<CAP>(s, a, qv, row, G, stop, p.lanes, p.softcap);
        tile_load(a, kb, vb, row + 2 * step, G, 0, stop, p.Dh);
        tile_use<CAP>(s, b, qv, row + step, G, stop, p.lanes, p.softcap);
    }
}

extern "C" __global__ void attention(AttnP p) {
    TRACE_BEGIN(TRACE_ATTN);
    extern __shared__ float sm[];
    const int G = blockDim.x / p.lanes;                  // row groups in the block
    const int W = ATTN_WARPS;
    float* gm = sm;                                      // [W]: the warps' maxima
    float* gl = gm + W;                                  // [W]: and sums
    float* go = gl + W;  // [max(W * Dh, 6 * max(blockDim, Dh))]: their outputs, then the merge's
    const int h = blockIdx.x, c = blockIdx.y, t = blockIdx.z;
    // This block's rows: ranges of whole loop iterations (two tiles of the block).
    const int step = ATTN_U * G;
    AttnRange r;
    if (!attn_range(p, t, c, h == 0 && c == 0, 2 * step, r)) return;
    const i64 pos0 = r.pos0, start = r.start, stop = r.stop;
    const int nvalid = r.nvalid;
    const int lr = threadIdx.x % p.lanes, grp = threadIdx.x / p.lanes, warp = threadIdx.x >> 5;
    const bool writes = (threadIdx.x & 31) < p.lanes;     // the warp's first group writes the warp's state
    const i64 kvh = h / p.group;
    const i64 qbase = (i64)t * p.q_ts + (i64)h * p.q_hs;
    Soft s;
    s.m = NEG_INF;
    s.l = 0.f;
#pragma unroll
    for (int i = 0; i < 8; i++) s.o[i] = 0.f;
    if (p.vec_ok) {
        const T* kb = p.k + kvh * p.L * p.Dh + lr * VEC;
        const T* vb = p.v + kvh * p.L * p.Dh + lr * VEC;
        const i64 first = start + grp;
        Tile a, b;
        // Rows before `ready` may be read now.
        const i64 ready = p.early ? pos0 : stop;
        tile_load(a, kb, vb, first, G, 0, min(ready, stop), p.Dh);
        if (p.early) {
            pdl_wait();
            TRACE_WAITED();
            tile_load(a, kb, vb, first, G, ready, stop, p.Dh);  // the rows this call's earlier kernels wrote
        }
        pdl_launch();
        float qv[VEC];
        ld_vec(p.q + qbase + lr * VEC, qv);
#pragma unroll
        for (int e = 0; e < VEC; e++) qv[e] *= p.scale;
        // Every group runs the same number of tiles (the shuffles need the whole warp): rows past `stop`
        // are not loaded and score NEG_INF.
        if (p.softcap > 0.f) {
            attn_tiles<true>(s, a, b, kb, vb, qv, first, grp, step, G, stop, p);
        } else {
            attn_tiles<false>(s, a, b, kb, vb, qv, first, grp, step, G, stop, p);
        }
        soft_merge_warp(s, p.lanes, VEC);
        if (writes) {
#pragma unroll
            for (int e = 0; e < VEC; e++) go[warp * p.Dh + lr * VEC + e] = s.o[e];
        }
    } else {
        // Rows not in whole aligned vectors: lane lr holds elements lr, lr + lanes, ... (at most 8).
        if (p.early) {
            pdl_wait();
            TRACE_WAITED();
        }
        pdl_launch();
        const int n = (p.Dh + p.lanes - 1) / p.lanes;
        float qv[8];
        for (int i = 0; i < n; i++) {
            const int d = lr + i * p.lanes;
            qv[i] = d < p.Dh ? ld(p.q, qbase + d) * p.scale : 0.f;
        }
        const T* kb = p.k + kvh * p.L * p.Dh;
        const T* vb = p.v + kvh * p.L * p.Dh;
        for (i64 base = start; base < stop; base += G) {
            const i64 j = base + grp;
            float dot = 0.f, vv[8];
            for (int i = 0; i < n; i++) {
                const int d = lr + i * p.lanes;
                const bool in = j < stop && d < p.Dh;
                dot += in ? qv[i] * ld(kb, j * p.Dh + d) : 0.f;
                vv[i] = in ? ld(vb, j * p.Dh + d) : 0.f;
            }
            dot = row_sum(dot, p.lanes);
            if (p.softcap > 0.f) dot = soft_cap(dot, p.softcap);
            soft_add(s, j < stop ? dot : NEG_INF, vv, n);
        }
        soft_merge_warp(s, p.lanes, n);
        for (int i = 0; i < n; i++) {
            const int d = lr + i * p.lanes;
            if (writes && d < p.Dh) go[warp * p.Dh + d] = s.o[i];
        }
    }
    if (writes && lr == 0) {
        gm[warp] = s.m;
        gl[warp] = s.l;
    }
    __syncthreads();
    // The warps' states, rescaled to the block's max, make the block's partial; a block whose range is the
    // whole prefix writes the output itself.
    float mx = NEG_INF;
    for (int w = 0; w < W; w++) mx = fmaxf(mx, gm[w]);
    float l = 0.f;
    for (int w = 0; w < W; w++)
        if (gm[w] != NEG_INF) l += __expf(gm[w] - mx) * gl[w];
    const i64 slot = ((i64)t * p.H + h) * p.splits + c;
    for (int d = threadIdx.x; d < p.Dh; d += blockDim.x) {
        float o = 0.f;
        for (int w = 0; w < W; w++)
            if (gm[w] != NEG_INF) o += __expf(gm[w] - mx) * go[w * p.Dh + d];
        if (nvalid == 1) {
            st(p.out, qbase + d, o / l);
        } else {
            p.o_part[slot * p.Dh + d] = o;
        }
    }
    TRACE_WORKED();
    if (nvalid == 1) return;
    if (threadIdx.x == 0) {
        p.ml[slot * 2] = mx;
        p.ml[slot * 2 + 1] = l;
    }
    if (!attn_last_range(p, t, h, nvalid)) return;
    TRACE_KIND(TRACE_MERGE);
    attn_merge(p, h, 1, t, nvalid, go);
}

// ---------------------------------------------------------------------------------------------------------
// out[0] = index of the largest value of x's last row (the first of equals; NaN never wins, but a row of NaN
// only gives the last index, as `ref_graph::argmax` does). Grid: up to ARGMAX_BLOCKS blocks of ARGMAX_THREADS,
// each taking a contiguous slice of the row; each block's best (value, index) goes to `part_v`/`part_i`, and
// the last block to finish (a ticket counter) picks among them, writes the index and resets its counter for
// the next launch (or graph replay). The first of equals wins whatever order the blocks finish in.

#define ARGMAX_THREADS 256
#define ARGMAX_NONE 0x7fffffff

struct ArgmaxP {
    const T* x;
    i64* out;
    float* part_v;           // [gridDim.x]
    int* part_i;             // [gridDim.x]
    unsigned int* counter;   // zero between launches
    int M, N;
};

// Keeps (v, i) in (bv, bi) when it is better: larger, or equal at a smaller index; NaN never.
__device__ __forceinline__ void arg_keep(float& bv, int& bi, float v, int i) {
    if (v == v && (v > bv || (v == bv && i < bi))) {
        bv = v;
        bi = i;
    }
}

// The block's best (value, index); thread 0 gets it. `sv`/`si` hold a value and an index per warp.
__device__ void block_best(float& bv, int& bi, float* sv, int* si) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        arg_keep(bv, bi, __shfl_xor_sync(0xffffffffu, bv, o), __shfl_xor_sync(0xffffffffu, bi, o));
    if (lane == 0) {
        sv[warp] = bv;
        si[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < ARGMAX_THREADS / 32; w++) arg_keep(bv, bi, sv[w], si[w]);
}

extern "C" __global__ void argmax(ArgmaxP p) {
    __shared__ float sv[ARGMAX_THREADS / 32];
    __shared__ int si[ARGMAX_THREADS / 32];
    __shared__ unsigned int ticket;
    TRACE_BEGIN(TRACE_ARGMAX);
    pdl_wait();
    TRACE_WAITED();
    pdl_launch();
    const T* row = p.x + (i64)(p.M - 1) * p.N;
    const int per = (p.N + gridDim.x - 1) / gridDim.x;
    const int lo = blockIdx.x * per, hi = min(p.N, lo + per);
    float bv = NEG_INF;
    int bi = ARGMAX_NONE;
#pragma unroll 8
    for (int i = lo + threadIdx.x; i < hi; i += ARGMAX_THREADS) arg_keep(bv, bi, ld(row, i), i);
    block_best(bv, bi, sv, si);
    TRACE_WORKED();
    if (threadIdx.x == 0) {
        p.part_v[blockIdx.x] = bv;
        p.part_i[blockIdx.x] = bi;
        ticket = atomic_add_acq_rel(p.counter);  // publishes this block's best; the last acquires every block's
    }
    __syncthreads();
    if (ticket != gridDim.x - 1) return;
    bv = NEG_INF;
    bi = ARGMAX_NONE;
    for (int b = threadIdx.x; b < gridDim.x; b += ARGMAX_THREADS)
        arg_keep(bv, bi, __ldcg(p.part_v + b), __ldcg(p.part_i + b));
    block_best(bv, bi, sv, si);
    if (threadIdx.x == 0) {
        // A row of NaN only: the last index, as `ref_graph::argmax` (each NaN replaces the one before).
        p.out[0] = bi == ARGMAX_NONE ? p.N - 1 : bi;
        *p.counter = 0u;
    }
}
