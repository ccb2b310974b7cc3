// ---------------------------------------------------------------------------------------------------------
// `torch.nn.Linear`'s product (appended to `kernels.cu`, so `T`, `VEC` and the loads are that file's):
// y[m, n] = a[m, :] . w[n, :] (+ bias[n]), the weight stored [N, K] as the user stores it. Output n reads the
// contiguous weight row n, 16 bytes per lane at a time, and a warp adds its lanes' sums: for one-row decode the
// whole weight is read once, in order. Grid (ceil(N / warps per block), M); block a multiple of 32 threads.

struct GemvTP {
    const T* a;
    const T* w;
    const T* bias;  // null: no bias
    T* y;
    int M, K, N, vec_ok;  // vec_ok: K % VEC == 0 and `a`, `w` 16-byte aligned
};

extern "C" __global__ void gemv_t(GemvTP p) {
    const int lane = threadIdx.x & 31;
    const int n = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int m = blockIdx.y;
    if (n >= p.N) return;
    const T* wr = p.w + (i64)n * p.K;
    const T* ar = p.a + (i64)m * p.K;
    float acc = 0.f;
    if (p.vec_ok) {
#pragma unroll 4
        for (int k = lane * VEC; k < p.K; k += 32 * VEC) {
            float wv[VEC], av[VEC];
            ld_vec(wr + k, wv);
            ld_vec(ar + k, av);
#pragma unroll
            for (int v = 0; v < VEC; v++) acc += wv[v] * av[v];
        }
    } else {
        for (int k = lane; k < p.K; k += 32) acc += ld(wr, k) * ld(ar, k);
    }
    acc = warp_sum(acc);
    if (lane == 0) {
        if (p.bias) acc += ld(p.bias, n);
        st(p.y, (i64)m * p.N + n, acc);
    }
}
