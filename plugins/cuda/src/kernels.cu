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
__device__ __forceinline__ float ld(const T* p, i64 i) { return h2f(p[i]); }
__device__ __forceinline__ void st(T* p, i64 i, float f) { p[i] = f2h(f); }
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
__device__ __forceinline__ float ld(const T* p, i64 i) { return p[i]; }
__device__ __forceinline__ void st(T* p, i64 i, float f) { p[i] = f; }
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

#define NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Block-wide max (the sum is in kernels/common.cuh); `scratch` holds 32 floats; every thread gets the result.

__device__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : NEG_INF;
    return warp_max(v);
}

// ---------------------------------------------------------------------------------------------------------
// Embedding: out[r, :] = table[idx[r], :] (+ table2[idx2[r], :] when `table2` is set: token plus position
// embedding in one launch). Grid: rows. Ids outside the table zero the row and set ERR_TOKEN.

struct GatherP {
    const T* table;
    const i64* idx;
    const T* table2;
    const i64* pos2;  // table2's row for output row r is pos2[0] + r
    T* out;
    int* err;
    int rows, n, n2, dim;
};

extern "C" __global__ void gather(GatherP p) {
    pdl_wait();
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
    pdl_wait();
    pdl_launch();
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += (i64)gridDim.x * blockDim.x)
        st(p.out, i, ld(p.a, i) + ld(p.b, i));
}

// RMS norm of each row. Grid: rows; block: 256.
struct RmsP {
    const T* x;
    const T* w;
    T* out;
    int rows, dim;
    float eps;
};

extern "C" __global__ void rms_norm(RmsP p) {
    pdl_wait();
    pdl_launch();
    __shared__ float scratch[32];
    const i64 base = (i64)blockIdx.x * p.dim;
    float ss = 0.f;
    for (int d = threadIdx.x; d < p.dim; d += blockDim.x) {
        float v = ld(p.x, base + d);
        ss += v * v;
    }
    ss = block_sum(ss, scratch);
    const float inv = rsqrtf(ss / (float)p.dim + p.eps);
    for (int d = threadIdx.x; d < p.dim; d += blockDim.x)
        st(p.out, base + d, ld(p.x, base + d) * inv * ld(p.w, d));
}

// ---------------------------------------------------------------------------------------------------------
// KV-cache update, in place: cache[i][h, pos + t, :] = upd[i][t, h * Dh : (h + 1) * Dh] (token-major) or
// upd[i][h, t, :] (head-major) for up to two caches (K and V in one launch). Grid: (Tq, H, n).

struct KvP {
    T* cache[2];
    const T* upd[2];
    const i64* pos;
    int* err;
    int n, Tq, H, L, Dh;
    int u_ts, u_hs;  // the update's strides (elements) per row t and per head h: token-major or head-major
};

extern "C" __global__ void kv_update(KvP p) {
    pdl_wait();
    pdl_launch();
    const int t = blockIdx.x, h = blockIdx.y, i = blockIdx.z;
    const i64 row = p.pos[0] + t;
    if (row < 0 || row >= p.L) {
        if (threadIdx.x == 0) atomicOr(p.err, ERR_POSITION);
        return;
    }
    T* dst = p.cache[i] + ((i64)h * p.L + row) * p.Dh;
    const T* src = p.upd[i] + (i64)t * p.u_ts + (i64)h * p.u_hs;
    for (int d = threadIdx.x; d < p.Dh; d += blockDim.x) dst[d] = src[d];
}

// ---------------------------------------------------------------------------------------------------------
// Decode attention, split over the cache (flash-decoding) with the merge folded in. Query t sits at position
// qpos = pos[0] + t and attends to rows 0..=qpos of its KV head (query head h reads KV head h / group:
// grouped-query attention reads each shared K and V row from the one cache, never a repeated copy). Grid (H,
// nchunks, Tq), block chunk * tpr threads: a block takes one chunk of `chunk` rows; `tpr` adjacent threads
// share a row's q.k (K rows read once, 16 bytes at a time), a block softmax gives the chunk's max and sum, and
// groups of threads accumulate the weighted V rows (V rows read once). Each block writes its partial output,
// max and sum; the last block of (t, h) to finish (a ticket counter) merges the chunks' partials, writes the
// output and resets its counter for the next launch (or graph replay). Chunks past qpos return at once, so
// only the valid prefix of the cache is read. With `early` set (the call writes the caches only at rows
// pos[0].. and never writes `pos`), the rows before pos[0] are requested before `pdl_wait`: the cache streams
// in while the projections that produce the query finish.

#define ATTN_KVECS 16  // K row vectors held in registers (a 128-wide f16 or a 64-wide f32 head)
#define ATTN_VPREFETCH 8  // V rows per thread requested before the softmax

struct AttnP {
    const T* q;
    const T* k;
    const T* v;
    T* out;
    const i64* pos;
    float* o_part;           // [Tq, H, nchunks, Dh]
    float* ml;               // [Tq, H, nchunks, 2]
    unsigned int* counters;  // [Tq, H], zero between launches
    int* err;
    int Tq, H, L, Dh, chunk, nchunks, vec_ok;
    float scale;
    int tpr;         // threads per cache row in the K pass (a power of two dividing 32); blockDim = chunk * tpr
    int q_ts, q_hs;  // q's and out's strides (elements) per row t and per query head h
    int group;       // query heads per KV head: query head h reads KV head h / group
    int early;       // rows before pos[0] may be read before `pdl_wait`
};

// The last block of (t, h): out = sum_c exp(m_c - max) o_c / sum_c exp(m_c - max) l_c over the `nvalid`
// chunks' partials (read from L2: other blocks wrote them). `wts` holds nvalid floats; `vr` blockDim * 4.
__device__ void attn_merge(const AttnP& p, int h, int t, int nvalid, float* wts, float* vr, float* scratch) {
    const i64 base = ((i64)t * p.H + h) * p.nchunks;
    float mx = NEG_INF;
    for (int c = threadIdx.x; c < nvalid; c += blockDim.x) mx = fmaxf(mx, __ldcg(p.ml + (base + c) * 2));
    mx = block_max(mx, scratch);
    float den = 0.f;
    for (int c = threadIdx.x; c < nvalid; c += blockDim.x) {
        const float w = __expf(__ldcg(p.ml + (base + c) * 2) - mx);
        wts[c] = w;
        den += w * __ldcg(p.ml + (base + c) * 2 + 1);
    }
    den = block_sum(den, scratch);  // its barriers also publish `wts`
    // Groups of Dh / 4 threads each add every ngrp-th chunk's partial, 16 bytes at a time (one float at a
    // time for a head size not a multiple of 4); the groups' sums meet in `vr`.
    const int w4 = p.Dh % 4 == 0 ? 4 : 1;
    const int dl = p.Dh / w4, ngrp = max(1, (int)blockDim.x / dl);
    for (int idx = threadIdx.x; idx < ngrp * dl; idx += blockDim.x) {
        const int grp = idx / dl, d = (idx % dl) * w4;
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        const float* part = p.o_part + base * p.Dh + d;
#pragma unroll 4
        for (int c = grp; c < nvalid; c += ngrp) {
            const float w = wts[c];
            if (w4 == 4) {
                const float4 o = __ldcg(reinterpret_cast<const float4*>(part + (i64)c * p.Dh));
                acc[0] += w * o.x;
                acc[1] += w * o.y;
                acc[2] += w * o.z;
                acc[3] += w * o.w;
            } else {
                acc[0] += w * __ldcg(part + (i64)c * p.Dh);
            }
        }
        for (int u = 0; u < w4; u++) vr[grp * p.Dh + d + u] = acc[u];
    }
    __syncthreads();
    const float inv = 1.f / den;
    const i64 qbase = (i64)t * p.q_ts + (i64)h * p.q_hs;
    for (int d = threadIdx.x; d < p.Dh; d += blockDim.x) {
        float s = 0.f;
        for (int g = 0; g < ngrp; g++) s += vr[g * p.Dh + d];
        st(p.out, qbase + d, s * inv);
    }
}

extern "C" __global__ void attention(AttnP p) {
    extern __shared__ float sm[];
    float* qs = sm;                          // [Dh]
    float* ps = qs + p.Dh;                   // [chunk]
    float* vr = ps + p.chunk;                // [blockDim * VEC]: per-group V sums, then the merge's
    float* scratch = vr + blockDim.x * VEC;  // [32]
    float* wts = scratch + 32;               // [nchunks]: the merge's chunk weights
    __shared__ unsigned int ticket;
    const int h = blockIdx.x, c = blockIdx.y, t = blockIdx.z;
    if (!p.early) pdl_wait();
    const i64 pos0 = p.pos[0];
    const i64 qpos = pos0 + t;
    const int start = c * p.chunk;
    if (qpos < 0 || qpos >= p.L) {
        if (threadIdx.x == 0 && h == 0 && c == 0) atomicOr(p.err, ERR_POSITION);
        return;
    }
    if (start > qpos) return;
    // Rows before `ready` may be read now.
    const i64 ready = p.early ? pos0 : (i64)p.L;
    const int r = threadIdx.x / p.tpr, part = threadIdx.x % p.tpr;
    const int per = p.Dh / p.tpr;
    const i64 j = start + r;
    const int count = (int)min((i64)p.chunk, qpos - start + 1);
    // V: groups of threads share a row, each thread VEC adjacent dimensions loaded 16 bytes at a time (or one
    // dimension without aligned rows); the groups take rows in turn, and their sums meet in shared memory.
    const int vec = p.vec_ok ? VEC : 1;
    const int lanes = p.Dh / vec, groups = blockDim.x / lanes;
    const int g = threadIdx.x / lanes, dv = (threadIdx.x % lanes) * vec;
    const i64 kvh = h / p.group;
    const T* kr = p.k + (kvh * p.L + j) * p.Dh + part * per;
    const T* vb = p.v + (kvh * p.L + start) * p.Dh + dv;
    // Every load that depends on nothing computed here is issued first (this thread's part of its K row, its
    // first V rows), so their latency overlaps the previous kernel, the query load and the softmax.
    const bool kfits = p.vec_ok && per <= ATTN_KVECS * VEC;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    uint4 kraw[ATTN_KVECS];
    uint4 vpre[ATTN_VPREFETCH];
    if (kfits) {
#pragma unroll
        for (int i = 0; i < ATTN_KVECS; i++)
            kraw[i] = (j < ready && j <= qpos && i * VEC < per) ? ld_raw(kr + i * VEC) : zero;
    }
    if (p.vec_ok) {
#pragma unroll
        for (int u = 0; u < ATTN_VPREFETCH; u++) {
            const int jj = g + u * groups;
            vpre[u] = (g < groups && jj < count && start + jj < ready) ? ld_raw(vb + (i64)jj * p.Dh) : zero;
        }
    }
    if (p.early) {
        pdl_wait();
        // The rows this call's earlier kernels wrote.
        if (kfits && j >= ready && j <= qpos) {
#pragma unroll
            for (int i = 0; i < ATTN_KVECS; i++)
                if (i * VEC < per) kraw[i] = ld_raw(kr + i * VEC);
        }
        if (p.vec_ok) {
#pragma unroll
            for (int u = 0; u < ATTN_VPREFETCH; u++) {
                const int jj = g + u * groups;
                if (g < groups && jj < count && start + jj >= ready) vpre[u] = ld_raw(vb + (i64)jj * p.Dh);
            }
        }
    }
    pdl_launch();
    const i64 qbase = (i64)t * p.q_ts + (i64)h * p.q_hs;
    for (int d = threadIdx.x; d < p.Dh; d += blockDim.x) qs[d] = ld(p.q, qbase + d) * p.scale;
    __syncthreads();

    const float* q = qs + part * per;
    float acc = 0.f;
    if (j <= qpos) {
        if (kfits) {
#pragma unroll
            for (int i = 0; i < ATTN_KVECS; i++) {
                if (i * VEC < per) {
                    float kv[VEC];
                    cvt_vec(kraw[i], kv);
#pragma unroll
                    for (int u = 0; u < VEC; u++) acc += q[i * VEC + u] * kv[u];
                }
            }
        } else if (p.vec_ok) {
            for (int d = 0; d < per; d += VEC) {
                float kv[VEC];
                ld_vec(kr + d, kv);
#pragma unroll
                for (int u = 0; u < VEC; u++) acc += q[d + u] * kv[u];
            }
        } else {
            for (int d = 0; d < per; d++) acc += q[d] * ld(kr, d);
        }
    }
    // The row's threads are adjacent lanes of one warp: add their parts.
    for (int o = p.tpr / 2; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    const float s = j <= qpos ? acc : NEG_INF;
    const float mx = block_max(s, scratch);
    const float e = j <= qpos ? __expf(s - mx) : 0.f;
    const float l = block_sum(part == 0 ? e : 0.f, scratch);
    if (part == 0 && r < p.chunk) ps[r] = e;
    __syncthreads();

    if (g < groups) {
        float accv[VEC];
#pragma unroll
        for (int u = 0; u < VEC; u++) accv[u] = 0.f;
        if (p.vec_ok) {
#pragma unroll
            for (int u = 0; u < ATTN_VPREFETCH; u++) {
                const int jj = g + u * groups;
                if (jj < count) {
                    float vv[VEC];
                    cvt_vec(vpre[u], vv);
                    const float w = ps[jj];
#pragma unroll
                    for (int x = 0; x < VEC; x++) accv[x] += w * vv[x];
                }
            }
#pragma unroll 8
            for (int jj = g + ATTN_VPREFETCH * groups; jj < count; jj += groups) {
                float vv[VEC];
                ld_vec(vb + (i64)jj * p.Dh, vv);
                const float w = ps[jj];
#pragma unroll
                for (int u = 0; u < VEC; u++) accv[u] += w * vv[u];
            }
        } else {
#pragma unroll 4
            for (int jj = g; jj < count; jj += groups) accv[0] += ps[jj] * ld(vb, (i64)jj * p.Dh);
        }
        for (int u = 0; u < vec; u++) vr[g * p.Dh + dv + u] = accv[u];
    }
    __syncthreads();
    const i64 slot = ((i64)t * p.H + h) * p.nchunks + c;
    for (int d = threadIdx.x; d < p.Dh; d += blockDim.x) {
        float sum = 0.f;
        for (int g2 = 0; g2 < groups; g2++) sum += vr[g2 * p.Dh + d];
        p.o_part[slot * p.Dh + d] = sum;
    }
    if (threadIdx.x == 0) {
        p.ml[slot * 2] = mx;
        p.ml[slot * 2 + 1] = l;
    }
    // Publish this chunk, then take a ticket: the last of the valid chunks merges them.
    __threadfence();
    __syncthreads();
    unsigned int* counter = p.counters + (i64)t * p.H + h;
    const int nvalid = (int)(qpos / p.chunk) + 1;
    if (threadIdx.x == 0) ticket = atomicAdd(counter, 1u);
    __syncthreads();
    if (ticket != (unsigned int)(nvalid - 1)) return;
    __threadfence();
    attn_merge(p, h, t, nvalid, wts, vr, scratch);
    if (threadIdx.x == 0) *counter = 0u;
}

// ---------------------------------------------------------------------------------------------------------
// out[0] = index of the largest value of x's last row (the first of equals; NaN never wins, but a row of NaN
// only gives the last index, as `ref_graph::argmax` does). One block.

struct ArgmaxP {
    const T* x;
    i64* out;
    int M, N;
};

extern "C" __global__ void argmax(ArgmaxP p) {
    pdl_wait();
    pdl_launch();
    __shared__ float best_v[1024];
    __shared__ int best_i[1024];
    const T* row = p.x + (i64)(p.M - 1) * p.N;
    float bv = NEG_INF;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < p.N; i += blockDim.x) {
        const float v = ld(row, i);
        if (v == v && (v > bv || (v == bv && i < bi))) {
            bv = v;
            bi = i;
        }
    }
    best_v[threadIdx.x] = bv;
    best_i[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const float ov = best_v[threadIdx.x + s];
            const int oi = best_i[threadIdx.x + s];
            if (ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x])) {
                best_v[threadIdx.x] = ov;
                best_i[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    // A row of NaN only: the last index, as `ref_graph::argmax` (each NaN replaces the one before).
    if (threadIdx.x == 0) p.out[0] = best_i[0] == 0x7fffffff ? p.N - 1 : best_i[0];
}
