// What every kernel source shares (prepended by `kernels::SOURCE` and `kernels::general::SOURCE`): the half
// types' conversions (f32 arithmetic everywhere) and warp- and block-wide sums.

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

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Block-wide sum; `scratch` holds 32 floats; every thread gets the result.
__device__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < warps ? scratch[lane] : 0.f;
    return warp_sum(v);
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
