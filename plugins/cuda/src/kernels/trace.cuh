// A timeline of a step, for GPU tuning only (`run.sh trace`: a `tuning` build with `-DKV_TRACE`; without the
// define every mark below is empty). Thread 0 of each block records when the block started, passed its wait,
// finished its main work and ended (the global timer, ns), with its kernel, SM and block, in a ring the
// delegate writes to `KV_CUDA_TRACE` when it is torn down (`kernels::tuning::dump_trace`).

#ifdef KV_TRACE
#define KV_TRACE_CAP (1 << 20)
// Each record: start (ns); the wait's and the work's offsets from it (ns, 32 bits each); the end's offset,
// the kernel (8 bits) and the SM (the 24 bits above); the block's linear index and the grid's size (32 bits
// each).
__device__ unsigned long long kv_trace[KV_TRACE_CAP * 4];
__device__ unsigned int kv_trace_n;
// When thread 0 of the block passed its wait: block-wide, so a helper a kernel calls may mark it too.
__shared__ unsigned long long kv_trace_waited;

__device__ __forceinline__ unsigned long long trace_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

struct Trace {
    unsigned long long t0, t2;
    unsigned int kind;
    __device__ explicit Trace(unsigned int k) : t0(trace_now()), t2(0), kind(k) {
        if (threadIdx.x == 0) kv_trace_waited = 0;
    }
    __device__ ~Trace() {
        if (threadIdx.x != 0) return;
        const unsigned long long t3 = trace_now();
        unsigned int sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        const unsigned int slot = atomicAdd(&kv_trace_n, 1u) % KV_TRACE_CAP;
        const unsigned long long block =
            blockIdx.x + (unsigned long long)gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        const unsigned long long grid = (unsigned long long)gridDim.x * gridDim.y * gridDim.z;
        unsigned long long* r = kv_trace + (unsigned long long)slot * 4;
        r[0] = t0;
        const unsigned long long t1 = kv_trace_waited;
        r[1] = (t1 ? t1 - t0 : 0ull) | ((t2 ? t2 - t0 : 0ull) << 32);
        r[2] = (t3 - t0) | ((unsigned long long)kind << 32) | ((unsigned long long)sm << 40);
        r[3] = block | (grid << 32);
    }
};
#define TRACE_BEGIN(k) Trace trace_(k)
#define TRACE_WAITED() (threadIdx.x == 0 ? (void)(kv_trace_waited = trace_now()) : (void)0)
#define TRACE_WORKED() (trace_.t2 = trace_now())
#define TRACE_KIND(k) (trace_.kind = (k))
#else
#define TRACE_BEGIN(k) ((void)0)
#define TRACE_WAITED() ((void)0)
#define TRACE_WORKED() ((void)0)
#define TRACE_KIND(k) ((void)0)
#endif

// The kernels as a trace names them.
#define TRACE_GATHER 1
#define TRACE_ADD 2
#define TRACE_RMS 3
#define TRACE_GEMV 4
#define TRACE_KV 5
#define TRACE_ATTN 6
#define TRACE_ARGMAX 7
#define TRACE_MERGE 8  // an attention block that merged its head's ranges
