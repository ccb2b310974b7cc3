// ---------------------------------------------------------------------------------------------------------
// Prefill attention on tensor cores (f16 and bf16, sm_80 and later, heads of 64 or 128 values in aligned rows;
// appended after `attention_tc.cu`, whose MMA helpers it uses): flash attention of a chunk of `Tq` query rows
// over the caches, each query row t at position pos[0] + t attending to cache rows 0..=pos[0] + t of its KV
// head (the chunk's own rows were written by the cache update before it). `attention`'s parameters (`AttnP`:
// q and out head- or token-major by their strides, grouped-query heads, the scale; no soft cap).
//
// Grid (ceil(Tq / PF_ROWS), H), PF_WARPS warps a block: a block takes PF_ROWS query rows of one query head,
// warp w the 16 from 16 w. The block walks the cache in tiles of PF_KEYS rows up to its last query's position:
// the tile's K and V rows go to shared memory once for all its warps (rows padded by 8 values so the MMAs'
// fragment loads hit distinct banks), then each warp whose rows reach the tile scores it (S = Q K^T: its query
// rows are M, the tile's rows N, the head's values K; m16n8k16, f32 accumulators), masks each row's scores past
// its position, keeps a running softmax a row (max and sum in log2 units, f32), and accumulates O += P V (P
// rounded to T for the MMA, as `attention_tc` rounds it). A lane holds rows g and g + 8 of its warp's 16
// (lane = 4 g + c4). At the end each row's output is O / sum, rounded to T. Rows past the chunk compute a
// clamped row's values and store nothing. A position that puts the chunk past the cache sets ERR_POSITION
// and the launch writes nothing.

#if (defined(KV_F16) || defined(KV_BF16)) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)

#define PF_WARPS 4
#define PF_ROWS (16 * PF_WARPS)  // query rows a block (`kernels::PREFILL_ROWS`)
#define PF_KEYS 64               // cache rows a tile

// Two T values as one 32-bit MMA operand, `lo` in the low half.
__device__ __forceinline__ unsigned pack_raw(T lo, T hi) { return (unsigned)lo | ((unsigned)hi << 16); }

template <int DH>
__device__ __forceinline__ void attention_prefill_body(const AttnP& p) {
    constexpr int DHP = DH + 8;  // a shared row's stride in values
    __shared__ __align__(16) T ksm[PF_KEYS * DHP];
    __shared__ __align__(16) T vsm[PF_KEYS * DHP];
    pdl_wait();
    pdl_launch();
    const i64 pos0 = p.pos[0];
    if (pos0 < 0 || pos0 + p.Tq > p.L) {
        if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) atomicOr(p.err, ERR_POSITION);
        return;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c4 = lane & 3;
    const int h = blockIdx.y, t0 = blockIdx.x * PF_ROWS, tw = t0 + 16 * warp;
    const i64 kvh = h / p.group;
    const T* kb = p.k + kvh * p.L * DH;
    const T* vb = p.v + kvh * p.L * DH;
    // The lane's two rows, clamped into the chunk (a row past it computes the last row's values, unstored).
    const int last = p.Tq - 1;
    const int ta = min(tw + g, last), tb = min(tw + g + 8, last);
    const i64 pa = pos0 + ta, pb = pos0 + tb;  // their positions: the last cache row each attends to
    // Q's A fragments: rows g, g + 8; values 16 ks + 2 c4 (+ 1) and + 8.
    unsigned qa[DH / 16][4];
    const T* qra = p.q + (i64)ta * p.q_ts + (i64)h * p.q_hs;
    const T* qrb = p.q + (i64)tb * p.q_ts + (i64)h * p.q_hs;
#pragma unroll
    for (int ks = 0; ks < DH / 16; ks++) {
        const int d = 16 * ks + 2 * c4;
        qa[ks][0] = *reinterpret_cast<const unsigned*>(qra + d);
        qa[ks][1] = *reinterpret_cast<const unsigned*>(qrb + d);
        qa[ks][2] = *reinterpret_cast<const unsigned*>(qra + d + 8);
        qa[ks][3] = *reinterpret_cast<const unsigned*>(qrb + d + 8);
    }
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
    float o[DH / 8][4];
#pragma unroll
    for (int i = 0; i < DH / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[i][e] = 0.f;
    const float sl2 = p.scale * LOG2E;
    const i64 end = pos0 + min(t0 + PF_ROWS, p.Tq);      // one past the block's last cache row
    const i64 warp_last = pos0 + min(tw + 15, last);     // the warp's last cache row
    for (i64 k0 = 0; k0 < end; k0 += PF_KEYS) {
        __syncthreads();  // every warp is done with the previous tile
        for (int i = threadIdx.x; i < PF_KEYS * (DH / VEC); i += blockDim.x) {
            const int r = i / (DH / VEC), c = i % (DH / VEC);
            const i64 j = k0 + r;
            uint4 kv = make_uint4(0u, 0u, 0u, 0u), vv = kv;
            if (j < end) {
                kv = ld_raw(kb + j * DH + c * VEC);
                vv = ld_raw(vb + j * DH + c * VEC);
            }
            *reinterpret_cast<uint4*>(ksm + r * DHP + c * VEC) = kv;
            *reinterpret_cast<uint4*>(vsm + r * DHP + c * VEC) = vv;
        }
        __syncthreads();
        if (k0 > warp_last || tw > last) continue;  // past every row of the warp (its later tiles too)
        // S: 8 column tiles of 8 cache rows; column 2 c4 (+ 1) of tile nt is cache row k0 + 8 nt + 2 c4 (+ 1).
        float s[PF_KEYS / 8][4];
#pragma unroll
        for (int nt = 0; nt < PF_KEYS / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) s[nt][e] = 0.f;
#pragma unroll
            for (int ks = 0; ks < DH / 16; ks++) {
                const T* kr = ksm + (8 * nt + g) * DHP + 16 * ks + 2 * c4;
                mma_tile(s[nt], qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3],
                         *reinterpret_cast<const unsigned*>(kr), *reinterpret_cast<const unsigned*>(kr + 8));
            }
        }
        // Row r of the lane (0: g, 1: g + 8): its scores masked past its position (log2 units), the new maximum
        // over its quad's lanes (the row's 64 columns), its weights, and its running sum and outputs rescaled.
        // Every row reaches cache row 0, so from the first tile on each maximum is finite.
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const i64 pr = r == 0 ? pa : pb;
            float mx = m[r];
#pragma unroll
            for (int nt = 0; nt < PF_KEYS / 8; nt++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const i64 j = k0 + 8 * nt + 2 * c4 + e;
                    const float x = j <= pr ? s[nt][2 * r + e] * sl2 : NEG_INF;
                    s[nt][2 * r + e] = x;
                    mx = fmaxf(mx, x);
                }
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float alpha = exp2_approx(m[r] - mx);  // 0 on the first tile (m = -inf)
            m[r] = mx;
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < PF_KEYS / 8; nt++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float w = exp2_approx(s[nt][2 * r + e] - mx);
                    s[nt][2 * r + e] = w;
                    sum += w;
                }
            }
            l[r] = l[r] * alpha + sum;  // the lane's columns; the quad's meet at the end
#pragma unroll
            for (int i = 0; i < DH / 8; i++) {
                o[i][2 * r] *= alpha;
                o[i][2 * r + 1] *= alpha;
            }
        }
        // O += P V: P's A fragments from the score tiles (cache rows 16 kk + 2 c4 (+ 1) in tile 2 kk, + 8 in
        // tile 2 kk + 1), V's B fragments (cache rows 2 c4 (+ 1) and + 8, value 8 i + g) from shared memory.
#pragma unroll
        for (int kk = 0; kk < PF_KEYS / 16; kk++) {
            const unsigned a0 = pack_pair(s[2 * kk][0], s[2 * kk][1]);
            const unsigned a1 = pack_pair(s[2 * kk][2], s[2 * kk][3]);
            const unsigned a2 = pack_pair(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            const unsigned a3 = pack_pair(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            const T* vr = vsm + (16 * kk + 2 * c4) * DHP + g;
#pragma unroll
            for (int i = 0; i < DH / 8; i++) {
                const T* v = vr + 8 * i;
                mma_tile(o[i], a0, a1, a2, a3, pack_raw(v[0], v[DHP]), pack_raw(v[8 * DHP], v[9 * DHP]));
            }
        }
    }
    // Each row's sum over its quad's lanes, then its outputs (values 8 i + 2 c4 (+ 1)) divided by it.
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    const int rows[2] = {tw + g, tw + g + 8};
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (rows[r] > last) continue;
        T* out = p.out + (i64)rows[r] * p.q_ts + (i64)h * p.q_hs + 2 * c4;
        const float inv = 1.f / l[r];
#pragma unroll
        for (int i = 0; i < DH / 8; i++) {
            st(out, 8 * i, o[i][2 * r] * inv);
            st(out, 8 * i + 1, o[i][2 * r + 1] * inv);
        }
    }
}

extern "C" __global__ void __launch_bounds__(PF_WARPS * 32) attention_prefill64(AttnP p) {
    attention_prefill_body<64>(p);
}
extern "C" __global__ void __launch_bounds__(PF_WARPS * 32) attention_prefill128(AttnP p) {
    attention_prefill_body<128>(p);
}

#endif
