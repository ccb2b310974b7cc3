// What every kernel source shares (prepended by `kernels::SOURCE` and `kernels::general::SOURCE`): the half
// types' conversions (f32 arithmetic everywhere), warp- and block-wide reductions, and the dependent-launch
// controls.

__device__ __forceinline__ float f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ unsigned short f32_to_f16(float f) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float bf16_to_f32(unsigned short h) {
    return __uint_as_float(((unsigned int)h) << 16);
}
// Round to nearest even; a NaN stays a (quiet) NaN, as `half::bf16::from_f32`.
__device__ __forceinline__ unsigned short f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

#define NEG_INF __int_as_float(0xff800000)

// Warp- and block-wide reductions by `Op` (a sum or a maximum); every thread gets the result.
struct SumOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// Over the lanes that differ from this one only in the lane index's bits from `from` up: 1, the whole warp; 4,
// the 8 lanes of this lane % 4.
template <typename Op>
__device__ __forceinline__ float warp_reduce(float v, Op op, int from = 1) {
#pragma unroll
    for (int o = 16; o >= from; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// `scratch` holds 32 floats; `identity` is the op's (0 for a sum, -inf for a maximum).
template <typename Op>
__device__ float block_reduce(float v, float identity, float* scratch, Op op) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = warp_reduce(v, op);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : identity;
    return warp_reduce(v, op);
}

__device__ __forceinline__ float warp_sum(float v) { return warp_reduce(v, SumOp()); }
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    return block_reduce(v, 0.f, scratch, SumOp());
}

// Programmatic dependent launch (sm_90 and later; a no-op before). A typed kernel launched with it may start
// while the previous kernel of its stream is still running: before `pdl_wait` it reads only what no kernel of
// the call writes (weights, the position, cache rows before it) and writes nothing; `pdl_wait` returns once the
// previous kernel has finished and its writes are visible (and, since that kernel waited the same way, every
// kernel before it); `pdl_launch` then lets the next kernel start its own prologue. Every kernel of a call
// calls `pdl_wait` before `pdl_launch`, so a kernel never overtakes one it does not wait for.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
