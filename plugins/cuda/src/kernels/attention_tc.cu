// ---------------------------------------------------------------------------------------------------------
// Decode attention on tensor cores (f16 and bf16, sm_80 and later, heads of 64 or 128 values in aligned
// rows): `attention`'s contract, ranges, partials and merge, with each tile of 16 cache rows scored and
// accumulated by warp-wide MMAs (m16n8k16, f32 accumulators) instead of a lane's scalar loop, and one block
// for the `hpb` query heads of a KV head that a block takes (each K and V row read once for all of them).
// For 16 rows of 128 values a warp's loop is about 225 SASS instructions (f16); `attention`'s, about 1 250.
//
// A warp takes every ATTN_WARPS-th tile of its block's range; lane = 4 g + c4.
// - Scores, S^T = K Q^T: the tile's rows are M, the head's values K, the block's heads N (column n holds
//   head h0 + n % hpb). The lane holds K rows g and g + 8 as the 16-byte chunks 4 c + c4 (the order of a
//   dot product's terms is free, so a chunk's raw bytes are the fragment, and the same chunk of q is B's).
//   It gets the scores of rows g and g + 8 for columns 2 c4 and 2 c4 + 1.
// - Outputs, O^T += V^T P^T: the head's values are M, the tile's rows K. The lane loads V rows 2 c4 + {0, 1,
//   8, 9} as the chunks 8 c + g and pairs their halves with byte permutes (values 8 (8 c + g) + 2 j and + 1
//   are M rows g and g + 8 of output tile 4 c + j); P^T's fragment comes from the score lanes by shuffles.
// P is rounded to T for the MMA; the softmax's maxima and sums stay f32 (in log2 units: x = s scale log2 e).

#if (defined(KV_F16) || defined(KV_BF16)) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)

#ifdef KV_F16
#define TC_TYPE "f16"
#else
#define TC_TYPE "bf16"
#endif

#define LOG2E 1.4426950408889634f
// Tunables (`#ifndef`: a sweep may set them, see `kernels/tuning.rs`).
#ifndef ATTN_TC_BLOCKS_PER_SM
#define ATTN_TC_BLOCKS_PER_SM 3  // the launch bound (`kernels::ATTN_TC_BLOCKS_PER_SM`): no spill
#endif

// d += a b for one m16n8k16 tile: a 16 x 16 (row-major fragment a0..a3), b 16 x 8 (b0, b1), T values; d f32.
__device__ __forceinline__ void mma_tile(float (&d)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32." TC_TYPE "." TC_TYPE ".f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two floats rounded to T and packed, `lo` in the low half.
__device__ __forceinline__ unsigned pack_pair(float lo, float hi) {
    unsigned r;
    asm("cvt.rn." TC_TYPE "x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// 2^x for `merge_add` (`exp2_approx`).
struct Exp2 {
    __device__ __forceinline__ float operator()(float x) const { return exp2_approx(x); }
};

__device__ __forceinline__ unsigned word(const uint4& u, int i) {
    return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w;
}

// A warp's tile as one lane holds it: its chunks of K rows g, g + 8 and of V rows 2 c4 + {0, 1, 8, 9}.
template <int DH>
struct TcTile {
    uint4 k[2][DH / 32];
    uint4 v[4][DH / 64];
};

// A warp's running softmax as one lane holds it: for columns 2 c4 and 2 c4 + 1 the maximum (the warp's) and
// the sum over the lane's rows, and output tiles' accumulators.
template <int DH>
struct TcSoft {
    float m[2], l[2];
    float o[DH / 16][4];
};

// Loads the rows j >= lo of the tile at row r0; a row past `last` reads row `last` (it scores NEG_INF, so
// its weight is 0, and its values are finite).
template <int DH>
__device__ __forceinline__ void tc_load(TcTile<DH>& tl, const T* kb, const T* vb, i64 r0, i64 lo, i64 last,
                                        int g, int c4) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const i64 j = r0 + g + 8 * r;
        if (j >= lo) {
            const T* row = kb + min(j, last) * DH;
#pragma unroll
            for (int c = 0; c < DH / 32; c++) tl.k[r][c] = ld_raw(row + (4 * c + c4) * VEC);
        }
    }
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const i64 j = r0 + 2 * c4 + (r & 1) + 8 * (r >> 1);
        if (j >= lo) {
            const T* row = vb + min(j, last) * DH;
#pragma unroll
            for (int c = 0; c < DH / 64; c++) tl.v[r][c] = ld_raw(row + (8 * c + g) * VEC);
        }
    }
}

// Adds the tile at row r0 (rows from `stop` on score NEG_INF) to the warp's softmax; `qf` is Q^T's fragment,
// `sl2` the score scale times log2 e. `CAP`: `sl2` is the score scale itself and the scaled scores are
// soft-capped at `cap` before the change to log2 units (a separate instantiation: the uncapped loop is
// unchanged).
template <int DH, bool CAP>
__device__ __forceinline__ void tc_use(TcSoft<DH>& s, const TcTile<DH>& tl, const uint4 (&qf)[DH / 32], i64 r0,
                                       i64 stop, float sl2, float cap, int g, int c4) {
    float sa[4] = {0.f, 0.f, 0.f, 0.f}, sb[4] = {0.f, 0.f, 0.f, 0.f};  // two chains of MMAs, not one
#pragma unroll
    for (int c = 0; c < DH / 32; c++) {
        mma_tile(sa, tl.k[0][c].x, tl.k[1][c].x, tl.k[0][c].y, tl.k[1][c].y, qf[c].x, qf[c].y);
        mma_tile(sb, tl.k[0][c].z, tl.k[1][c].z, tl.k[0][c].w, tl.k[1][c].w, qf[c].z, qf[c].w);
    }
    const bool in0 = r0 + g < stop, in1 = r0 + g + 8 < stop;
    float x[4], p[4], alpha[2];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float dot = CAP ? soft_cap((sa[i] + sb[i]) * sl2, cap) * LOG2E : (sa[i] + sb[i]) * sl2;
        x[i] = (i < 2 ? in0 : in1) ? dot : NEG_INF;
    }
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const float mx = warp_reduce(fmaxf(x[e], x[e + 2]), MaxOp(), 4);  // over the tile's rows
        const float m = fmaxf(s.m[e], mx);                                 // finite: row r0 is below `stop`
        alpha[e] = exp2_approx(s.m[e] - m);
        p[e] = exp2_approx(x[e] - m);
        p[e + 2] = exp2_approx(x[e + 2] - m);
        s.l[e] = s.l[e] * alpha[e] + p[e] + p[e + 2];
        s.m[e] = m;
    }
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
        for (int i = 0; i < DH / 16; i++) {
            s.o[i][0] *= alpha[0];
            s.o[i][1] *= alpha[1];
            s.o[i][2] *= alpha[0];
            s.o[i][3] *= alpha[1];
        }
    }
    // P^T's fragment: rows 2 c4, 2 c4 + 1 (b0) and 2 c4 + 8, 2 c4 + 9 (b1) of column g, from the lanes that
    // scored them (g' = 2 c4 and 2 c4 + 1, c4' = g / 2; column g is their first or second).
    const unsigned even = pack_pair(p[0], p[2]), odd = pack_pair(p[1], p[3]);  // rows g, g + 8 a column
    const int src = 8 * c4 + (g >> 1);
    const unsigned e0 = __shfl_sync(0xffffffffu, even, src), o0 = __shfl_sync(0xffffffffu, odd, src);
    const unsigned e1 = __shfl_sync(0xffffffffu, even, src + 4), o1 = __shfl_sync(0xffffffffu, odd, src + 4);
    const unsigned v0 = (g & 1) ? o0 : e0, v1 = (g & 1) ? o1 : e1;
    const unsigned b0 = __byte_perm(v0, v1, 0x5410), b1 = __byte_perm(v0, v1, 0x7632);
#pragma unroll
    for (int c = 0; c < DH / 64; c++) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const unsigned w0 = word(tl.v[0][c], j), w1 = word(tl.v[1][c], j);
            const unsigned w2 = word(tl.v[2][c], j), w3 = word(tl.v[3][c], j);
            mma_tile(s.o[4 * c + j], __byte_perm(w0, w1, 0x5410), __byte_perm(w0, w1, 0x7632),
                     __byte_perm(w2, w3, 0x5410), __byte_perm(w2, w3, 0x7632), b0, b1);
        }
    }
}

// Thread-block clusters (sm_90 and later): the block's rank in its cluster, the cluster's blocks, barriers of
// every thread of the cluster, and loads from the shared memory of another block of the cluster (`at`: a
// shared-memory address of this block, `rank`: whose same address).
__device__ __forceinline__ int cluster_rank() {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return (int)r;
}
__device__ __forceinline__ int cluster_blocks() {
    unsigned n;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    return (int)n;
}
// Publishes the thread's writes to the cluster (release at cluster scope: on sm_90 a MEMBAR.GPU, which waits
// for the thread's outstanding writes) and acquires every other thread's.
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}
// Waits until every thread of the cluster has arrived, publishing nothing: what a block needs before it exits
// while the others may still read its shared memory (their reads are done once their values were used). No
// MEMBAR, so no wait for the thread's output stores. Measured on the H200 against `cluster_sync` here:
// see BENCHMARKS.md, "Thirteenth pass".
__device__ __forceinline__ void cluster_meet() {
    asm volatile("barrier.cluster.arrive.relaxed;\n\tbarrier.cluster.wait;" ::: "memory");
}
__device__ __forceinline__ unsigned cluster_map(const float* at, int rank) {
    unsigned remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(remote)
                 : "r"((unsigned)__cvta_generic_to_shared(at)), "r"(rank));
    return remote;
}
__device__ __forceinline__ float2 cluster_ld2(unsigned at) {
    float2 v;
    asm volatile("ld.shared::cluster.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(at));
    return v;
}
__device__ __forceinline__ float4 cluster_ld4(unsigned at) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(at));
    return v;
}

#ifndef ATTN_CLUSTER_END_SYNC
#define ATTN_CLUSTER_END_SYNC 0
#endif
#define ATTN_CLUSTER_MAX 16  // the most blocks a cluster merges (`kernels::ATTN_CLUSTER_MAX`: sm_90's largest)
#ifndef ATTN_CLUSTER_BATCH
#define ATTN_CLUSTER_BATCH 16  // blocks' partials a merging thread requests at once (tunable)
#endif

// The merge of a cluster's ranges (`attention_tc_cluster`: one cluster a block of heads, a block a range). Each
// block left its partial in its own shared memory, `cp`: the heads' values, then a max (log2 units) and sum a
// head (max NEG_INF: no range). After the cluster's barrier the 4-value columns of the heads are dealt to the
// cluster's blocks in turn; a thread reads its column of ATTN_CLUSTER_BATCH blocks at once (distributed
// shared memory, no L2 round trip, no ticket) and merges them. The last barrier keeps each block's shared
// memory until the others have read it.
template <int DH>
__device__ __forceinline__ void attn_cluster_merge(const AttnP& p, int h0, int hpb, int t, const float* cp) {
    cluster_sync();
    const int rank = cluster_rank(), blocks = cluster_blocks();
    const float* cml = cp + hpb * DH;
    for (int col = rank + blocks * (int)threadIdx.x; col < hpb * DH / 4; col += blocks * (int)blockDim.x) {
        const int n = 4 * col / DH, d = 4 * col % DH;
        float m = NEG_INF, l = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
        for (int b0 = 0; b0 < ATTN_CLUSTER_MAX && b0 < blocks; b0 += ATTN_CLUSTER_BATCH) {
            float2 ml[ATTN_CLUSTER_BATCH];
            float4 o[ATTN_CLUSTER_BATCH];
#pragma unroll
            for (int b = 0; b < ATTN_CLUSTER_BATCH; b++) {
                if (b0 + b < blocks) {
                    ml[b] = cluster_ld2(cluster_map(cml + 2 * n, b0 + b));
                    o[b] = cluster_ld4(cluster_map(cp + 4 * col, b0 + b));
                }
            }
#pragma unroll
            for (int b = 0; b < ATTN_CLUSTER_BATCH; b++) {
                if (b0 + b >= blocks || ml[b].x == NEG_INF) continue;  // past the cluster, or a block with no range
                merge_add(m, l, acc, ml[b].x, ml[b].y, o[b], Exp2());
            }
        }
        if (m != NEG_INF) attn_store(p, t, h0 + n, d, 4, acc, l);
    }
#if ATTN_CLUSTER_END_SYNC  // tunable, 1: the end's barrier publishes too, as the first (what `cluster_meet` saves)
    cluster_sync();
#else
    cluster_meet();
#endif
}

// `attention_tc` with `W` warps a block; `CLUSTER`: the blocks of a head block's ranges are one cluster, and
// merge in distributed shared memory (`attn_cluster_merge`) instead of by a ticket and L2.
template <int DH, int W, bool CLUSTER>
__device__ __forceinline__ void attention_tc_body(const AttnP& p, float* sm) {
    TRACE_BEGIN(TRACE_ATTN);
    const int hpb = p.hpb;
    float* gm = sm;                                              // [W * 8]: the warps' maxima a column
    float* gl = gm + W * 8;                                      // [W * 8]: and sums
    // [W * hpb * DH]: their outputs; for the ticket merge at least 6 * max(blockDim, hpb * DH), its states.
    float* go = gl + W * 8;
    const int outputs = W * hpb * DH;
    float* cp = go + (CLUSTER ? outputs : max(outputs, 6 * max((int)blockDim.x, hpb * DH)));  // [hpb (DH + 2)]
    const int h0 = blockIdx.x * hpb, c = blockIdx.y, t = blockIdx.z;
    // This block's rows: ranges of whole tiles, which its warps take in turn.
    const int step = 16 * W;
    AttnRange r;
    const bool ranged = attn_range(p, t, c, h0 == 0 && c == 0, 16, r);
    // A cluster's block with no range still meets the others, unless no block merges: a position out of the
    // cache (no ranges) or one range.
    if (!ranged && (!CLUSTER || r.pos0 + t < 0 || r.pos0 + t >= p.L || r.nvalid == 1)) return;
    const int nvalid = r.nvalid;
    if (ranged) {
        const i64 pos0 = r.pos0, start = r.start, stop = r.stop;
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c4 = lane & 3;
        const i64 kvh = h0 / p.group;
        const T* kb = p.k + kvh * p.L * DH;
        const T* vb = p.v + kvh * p.L * DH;
        const i64 first = start + 16 * warp;
        TcTile<DH> tile;
        if (p.early) {  // rows before pos0 stream in while the projections that produce q finish
            if (first < stop && first < pos0) tc_load(tile, kb, vb, first, 0, min(stop, pos0) - 1, g, c4);
            pdl_wait();
            TRACE_WAITED();
            if (first < stop && first + 16 > pos0) tc_load(tile, kb, vb, first, pos0, stop - 1, g, c4);
        } else if (first < stop) {
            tc_load(tile, kb, vb, first, 0, stop - 1, g, c4);
        }
        pdl_launch();
        uint4 qf[DH / 32];
        const i64 qcol = (i64)t * p.q_ts + (i64)(h0 + g % hpb) * p.q_hs;
#pragma unroll
        for (int i = 0; i < DH / 32; i++) qf[i] = ld_raw(p.q + qcol + (4 * i + c4) * VEC);
        TcSoft<DH> s;
#pragma unroll
        for (int e = 0; e < 2; e++) {
            s.m[e] = NEG_INF;
            s.l[e] = 0.f;
        }
#pragma unroll
        for (int i = 0; i < DH / 16; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) s.o[i][e] = 0.f;
        const float sl2 = p.scale * LOG2E;
        // One tile in flight a warp: the wave of blocks (`kernels::attention_tc_splits`) keeps enough in flight
        // an SM; a second tile requested ahead needs 227 registers, two blocks an SM, and measured no faster.
        if (p.softcap > 0.f) {
            for (i64 r0 = first; r0 < stop; r0 += step) {
                if (r0 != first) tc_load(tile, kb, vb, r0, 0, stop - 1, g, c4);
                tc_use<DH, true>(s, tile, qf, r0, stop, p.scale, p.softcap, g, c4);
            }
        } else {
            for (i64 r0 = first; r0 < stop; r0 += step) {
                if (r0 != first) tc_load(tile, kb, vb, r0, 0, stop - 1, g, c4);
                tc_use<DH, false>(s, tile, qf, r0, stop, sl2, 0.f, g, c4);
            }
        }
        // The warp's state a column: its sum over every row (the lanes' rows meet), its outputs in shared
        // memory.
#pragma unroll
        for (int e = 0; e < 2; e++) {
            s.l[e] = warp_reduce(s.l[e], SumOp(), 4);
            const int col = 2 * c4 + e;
            if (g == 0) {
                gm[warp * 8 + col] = s.m[e];
                gl[warp * 8 + col] = s.l[e];
            }
            if (col < hpb) {
                float* out = go + (warp * hpb + col) * DH;
#pragma unroll
                for (int i = 0; i < DH / 16; i++) {
                    const int d = 8 * (8 * (i / 4) + g) + 2 * (i % 4);
                    out[d] = s.o[i][e];
                    out[d + 1] = s.o[i][e + 2];
                }
            }
        }
        __syncthreads();
    } else {
        // It writes outputs in the merge: only once the previous kernel is done.
        if (p.early) pdl_wait();
        pdl_launch();
    }
    // The warps' states, rescaled to the block's max, make the block's partial a head; a block whose range
    // is the whole prefix writes the outputs itself. Maxima go to `ml` in natural-log units, as `attention`'s.
    const i64 slot0 = ((i64)t * p.H + h0) * p.splits + c;  // head h0 + n: slot0 + n splits
    for (int idx = threadIdx.x; idx < hpb * DH; idx += blockDim.x) {
        const int n = idx / DH, d = idx % DH;
        float mx = NEG_INF, l = 0.f, o = 0.f;
        if (ranged) {
            for (int w = 0; w < W; w++) mx = fmaxf(mx, gm[w * 8 + n]);
            for (int w = 0; w < W; w++) {
                if (gm[w * 8 + n] == NEG_INF) continue;
                const float f = exp2_approx(gm[w * 8 + n] - mx);
                l += f * gl[w * 8 + n];
                o += f * go[(w * hpb + n) * DH + d];
            }
        }
        const i64 slot = slot0 + (i64)n * p.splits;
        if (nvalid == 1) {
            st(p.out, (i64)t * p.q_ts + (i64)(h0 + n) * p.q_hs + d, o / l);
        } else if (CLUSTER) {
            cp[idx] = o;
            if (d == 0) {
                cp[hpb * DH + 2 * n] = mx;
                cp[hpb * DH + 2 * n + 1] = l;
            }
        } else {
            p.o_part[slot * DH + d] = o;
            if (d == 0) {
                p.ml[slot * 2] = mx / LOG2E;
                p.ml[slot * 2 + 1] = l;
            }
        }
    }
    TRACE_WORKED();
#ifdef KV_DIAG_NO_MERGE  // diagnostics (`kernels/tuning.rs`): no ticket, no merge; timing only, wrong outputs
    return;
#endif
    if (nvalid == 1) return;
    if (CLUSTER) {
        TRACE_KIND(TRACE_MERGE);
        attn_cluster_merge<DH>(p, h0, hpb, t, cp);
        return;
    }
    if (!attn_last_range(p, t, h0, nvalid)) return;
    TRACE_KIND(TRACE_MERGE);
#ifdef KV_TRACE_MERGE
    TRACE_WORKED();  // diagnostics: the ticket taken (the merge's loads: `attn_merge`)
#endif
#ifdef KV_DIAG_TICKET_ONLY  // diagnostics: the ticket, no merge; timing only, wrong outputs
    attn_reset_ticket(p, t, h0);
    return;
#endif
    attn_merge(p, h0, hpb, t, nvalid, go);
}

extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32, ATTN_TC_BLOCKS_PER_SM) attention_tc(AttnP p) {
    extern __shared__ float sm[];
    if (p.Dh == 64) {
        attention_tc_body<64, ATTN_WARPS, false>(p, sm);
    } else {
        attention_tc_body<128, ATTN_WARPS, false>(p, sm);
    }
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
// `attention_tc` in clusters (sm_90 and later): launched with a cluster of `splits` blocks (1, splits, 1),
// ATTN_CLUSTER_WARPS warps a block, and as many ranges as one cluster holds (`kernels::attention_tc_cluster`:
// where a warp's tile each covers the cache).
#define ATTN_CLUSTER_WARPS 8  // `kernels::ATTN_CLUSTER_THREADS`; two blocks an SM hold 128 registers a thread
#ifndef ATTN_CLUSTER_BLOCKS_PER_SM
#define ATTN_CLUSTER_BLOCKS_PER_SM 2  // the launch bound (tunable): 128 registers a thread, no spill
#endif
extern "C" __global__ void __launch_bounds__(ATTN_CLUSTER_WARPS * 32, ATTN_CLUSTER_BLOCKS_PER_SM)
    attention_tc_cluster(AttnP p) {
    extern __shared__ float sm[];
    attention_tc_body<64, ATTN_CLUSTER_WARPS, true>(p, sm);
}
#endif

#endif
