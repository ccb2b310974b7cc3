// ---------------------------------------------------------------------------------------------------------
// Prefill attention on tensor cores (f16 and bf16, sm_80 and later, heads of 64 or 128 values in aligned rows;
// appended after `attention_tc.cu`, whose MMA helpers it uses): flash attention of a chunk of `Tq` query rows
// over the caches, each query row t at position pos[0] + t attending to cache rows 0..=pos[0] + t of its KV
// head (the chunk's own rows were written by the cache update before it). `attention`'s parameters (`AttnP`:
// q and out head- or token-major by their strides, grouped-query heads, the scale; no soft cap).
//
// Grid (ceil(Tq / PF_ROWS), H), PF_WARPS warps a block: a block takes PF_ROWS query rows of one query head,
// warp w the 16 from 16 w. The block walks the cache in tiles of PF_KEYS rows up to its last query's position:
// the tile's K and V rows go to shared memory once for all its warps, by `cp.async` (heads of 64: the next tile
// requested while this one is used; rows padded by 8 values so the MMAs' fragment loads, `ldmatrix` of eight
// rows at a time, hit distinct banks), then each warp whose rows reach the tile scores it (S = Q K^T: its query
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
#define PF_STAGES(DH) ((DH) == 64 ? 2 : 1)  // tiles in flight

// Four 8 x 8 matrices of T from shared memory, lane l giving the address of row l % 8 of matrix l / 8 (16
// aligned bytes): lane 4 g + c4 gets elements (g, 2 c4) and (g, 2 c4 + 1) of each matrix, or with `.trans`
// (2 c4, g) and (2 c4 + 1, g): an m16n8k16 B fragment of row-major keys (K: non-transposed) or values (V).
__device__ __forceinline__ void ldsm4(unsigned (&r)[4], const T* row) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void ldsm4_trans(unsigned (&r)[4], const T* row) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

// One tile of PF_KEYS cache rows from k0 (K and V rows in shared memory, `kt` and `vt`) into a warp's running
// softmax and output: its lane's rows at positions pa and pb, Q's fragments `qa`, the scale in log2 units.
template <int DH>
__device__ __forceinline__ void pf_tile(const T* kt, const T* vt, const unsigned (&qa)[DH / 16][4], i64 k0, i64 pa,
                                        i64 pb, float sl2, float (&m)[2], float (&l)[2], float (&o)[DH / 8][4]) {
    constexpr int DHP = DH + 8;
    const int lane = threadIdx.x & 31, g = lane >> 2, c4 = lane & 3;
    // S: 8 column tiles of 8 cache rows; column 2 c4 (+ 1) of tile nt is cache row k0 + 8 nt + 2 c4 (+ 1).
    float s[PF_KEYS / 8][4];
    // K's B fragments by ldmatrix: lane l addresses cache row 8 nt + l % 8 at values 16 ks + 8 (l / 8) (two
    // column steps ks a load: matrices 0, 1 are ks's b0, b1; 2, 3 those of ks + 1).
    const int lr = lane & 7, lm = lane >> 3;
#pragma unroll
    for (int nt = 0; nt < PF_KEYS / 8; nt++) {
#pragma unroll
        for (int e = 0; e < 4; e++) s[nt][e] = 0.f;
#pragma unroll
        for (int ks = 0; ks < DH / 16; ks += 2) {
            unsigned b[4];
            ldsm4(b, kt + (8 * nt + lr) * DHP + 16 * ks + 8 * lm);
            mma_tile(s[nt], qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], b[0], b[1]);
            mma_tile(s[nt], qa[ks + 1][0], qa[ks + 1][1], qa[ks + 1][2], qa[ks + 1][3], b[2], b[3]);
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
        // Lane l addresses cache row 16 kk + 8 ((l / 8) % 2) + l % 8 at values 8 (i + l / 16): matrices 0, 1
        // are value column i's b0, b1; 2, 3 those of i + 1.
        const T* vr = vt + (16 * kk + 8 * (lm & 1) + lr) * DHP + 8 * (lm >> 1);
#pragma unroll
        for (int i = 0; i < DH / 8; i += 2) {
            unsigned b[4];
            ldsm4_trans(b, vr + 8 * i);
            mma_tile(o[i], a0, a1, a2, a3, b[0], b[1]);
            mma_tile(o[i + 1], a0, a1, a2, a3, b[2], b[3]);
        }
    }
}

// 16 bytes from global memory to shared memory without a register round trip (zeros where `in` is false),
// in the commit group the next `cp_async_commit` closes.
__device__ __forceinline__ void cp_async16(T* dst, const T* src, bool in) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(in ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most N of this thread's commit groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

// Requests the tile of PF_KEYS cache rows from k0 (rows from `end` on as zeros) into `kt` and `vt`, one
// commit group.
template <int DH>
__device__ __forceinline__ void pf_load(T* kt, T* vt, const T* kb, const T* vb, i64 k0, i64 end) {
    constexpr int DHP = DH + 8;
    for (int i = threadIdx.x; i < PF_KEYS * (DH / VEC); i += blockDim.x) {
        const int r = i / (DH / VEC), c = i % (DH / VEC);
        const i64 j = k0 + r;
        const i64 at = j < end ? j * DH + c * VEC : 0;
        cp_async16(kt + r * DHP + c * VEC, kb + at, j < end);
        cp_async16(vt + r * DHP + c * VEC, vb + at, j < end);
    }
    cp_async_commit();
}

template <int DH>
__device__ __forceinline__ void attention_prefill_body(const AttnP& p) {
    constexpr int DHP = DH + 8;  // a shared row's stride in values
    __shared__ __align__(16) T ksm[PF_STAGES(DH)][PF_KEYS * DHP];
    __shared__ __align__(16) T vsm[PF_STAGES(DH)][PF_KEYS * DHP];
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
    // Tiles in flight: heads of 64 keep the next tile's request going while this one is used (two buffers of
    // each; heads of 128 have room for one within the static shared memory).
    const int tiles = (int)((end + PF_KEYS - 1) / PF_KEYS);
    if (PF_STAGES(DH) == 2) pf_load<DH>(ksm[0], vsm[0], kb, vb, 0, end);
    for (int it = 0; it < tiles; it++) {
        const i64 k0 = (i64)it * PF_KEYS;
        const int buf = PF_STAGES(DH) == 2 ? it & 1 : 0;
        if (PF_STAGES(DH) == 1) {
            pf_load<DH>(ksm[0], vsm[0], kb, vb, k0, end);
            cp_async_wait<0>();
        } else if (it + 1 < tiles) {
            pf_load<DH>(ksm[(buf + 1) % PF_STAGES(DH)], vsm[(buf + 1) % PF_STAGES(DH)], kb, vb, k0 + PF_KEYS, end);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // the tile is in shared memory for every warp
        // A warp past its rows' positions skips the tile (and its later ones).
        if (k0 <= warp_last && tw <= last) pf_tile<DH>(ksm[buf], vsm[buf], qa, k0, pa, pb, sl2, m, l, o);
        __syncthreads();  // every warp is done with the tile before its buffer is refilled
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
