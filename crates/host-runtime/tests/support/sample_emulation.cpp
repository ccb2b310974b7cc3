// Runs the device loop's sampler kernel (src/cuda/sample.cu, included below) on the CPU: one CUDA block of
// 1024 threads emulated by 1024 std::threads, `__syncthreads` a barrier of all of them, each warp intrinsic
// a barrier of the warp's 32 around slots they share, `__shared__` variables static (one block, one launch at a
// time), and every round-to-nearest intrinsic the IEEE-754 operation it names (built with -ffp-contract=off,
// so nothing is fused but `fmaf`).
//
// Usage: sample_emulation CASES OUT. CASES: a u32 count, then per case u32 vocab, u32 dtype (0 f32, 1 f16,
// 2 bf16), f32 temperature, u32 top_k, f32 top_p, f32 min_p, f32 penalty, u64 seed, u32 step, u32 history
// length, that many i64 ids, and vocab logits of dtype; all little-endian. OUT: one i64 token per case.
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

struct Dim3 {
    unsigned x, y, z;
};
thread_local Dim3 threadIdx;
const Dim3 blockIdx{0, 0, 0};
static std::barrier<>* block_barrier;
static std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
static unsigned ballot_slots[1024];
static float float_slots[1024];
static unsigned uint_slots[1024];

#define __global__
#define __device__
#define __shared__ static
#define __launch_bounds__(threads)

inline void __syncthreads() { block_barrier->arrive_and_wait(); }
inline void warp_sync() { warp_barriers[threadIdx.x / 32]->arrive_and_wait(); }
inline unsigned __ballot_sync(unsigned, bool predicate) {
    ballot_slots[threadIdx.x] = predicate;
    warp_sync();
    unsigned first = threadIdx.x / 32 * 32, ballot = 0;
    for (unsigned lane = 0; lane < 32; ++lane) {
        if (ballot_slots[first + lane]) { ballot |= 1u << lane; }
    }
    warp_sync();
    return ballot;
}
template <typename T> T shuffle_down(T* slots, T value, int offset) {
    slots[threadIdx.x] = value;
    warp_sync();
    T result = (threadIdx.x & 31) + offset < 32 ? slots[threadIdx.x + offset] : value;
    warp_sync();
    return result;
}
inline float __shfl_down_sync(unsigned, float value, int offset) { return shuffle_down(float_slots, value, offset); }
inline unsigned __shfl_down_sync(unsigned, unsigned value, int offset) { return shuffle_down(uint_slots, value, offset); }
inline unsigned __match_any_sync(unsigned, unsigned value) {
    uint_slots[threadIdx.x] = value;
    warp_sync();
    unsigned first = threadIdx.x / 32 * 32, peers = 0;
    for (unsigned lane = 0; lane < 32; ++lane) {
        if (uint_slots[first + lane] == value) { peers |= 1u << lane; }
    }
    warp_sync();
    return peers;
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }
inline unsigned atomicOr(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_or(v); }
inline float __fmaf_rn(float a, float b, float c) { return std::fmaf(a, b, c); }
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
inline float __fsub_rn(float a, float b) { volatile float r = a - b; return r; }
inline float __fdiv_rn(float a, float b) { volatile float r = a / b; return r; }
inline float __uint_as_float(unsigned x) { float f; std::memcpy(&f, &x, 4); return f; }
inline float __int_as_float(unsigned x) { return __uint_as_float(x); }
inline unsigned __float_as_uint(float f) { unsigned x; std::memcpy(&x, &f, 4); return x; }
using std::isinf;
using std::isnan;

#include KV_SAMPLE_SOURCE

template <typename T> T read(FILE* in) {
    T value;
    if (fread(&value, sizeof value, 1, in) != 1) { std::exit(3); }
    return value;
}

int main(int argc, char** argv) {
    if (argc != 3) { return 2; }
    FILE* in = std::fopen(argv[1], "rb");
    FILE* out = std::fopen(argv[2], "wb");
    if (!in || !out) { return 2; }
    block_barrier = new std::barrier<>(1024);
    for (int w = 0; w < 32; ++w) { warp_barriers.emplace_back(new std::barrier<>(32)); }
    unsigned cases = read<unsigned>(in);
    for (unsigned c = 0; c < cases; ++c) {
        unsigned vocab = read<unsigned>(in), dtype = read<unsigned>(in);
        float temperature = read<float>(in);
        unsigned top_k = read<unsigned>(in);
        float top_p = read<float>(in), min_p = read<float>(in), penalty = read<float>(in);
        unsigned long long seed = read<unsigned long long>(in);
        unsigned draws = read<unsigned>(in), history = read<unsigned>(in);
        std::vector<unsigned> seen(vocab / 32 + 1, 0);
        for (unsigned i = 0; i < history; ++i) {
            long long id = read<long long>(in);
            if (id >= 0 && id < (long long)vocab) { seen[id / 32] |= 1u << (id % 32); }
        }
        std::vector<unsigned char> row(vocab * (dtype == 0 ? 4 : 2) + 8);
        if (vocab > 0 && fread(row.data(), dtype == 0 ? 4 : 2, vocab, in) != vocab) { return 3; }
        std::vector<unsigned> keys(vocab + 1);
        long long token = -1;
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < 1024; ++t) {
            threads.emplace_back([&, t] {
                threadIdx = Dim3{t, 0, 0};
                kv_sample(row.data(), (int)dtype, vocab, temperature, top_k, top_p, min_p, penalty, seed,
                          seen.data(), &draws, keys.data(), &token);
            });
        }
        for (auto& thread : threads) { thread.join(); }
        std::fwrite(&token, 8, 1, out);
    }
    return std::fclose(out) == 0 ? 0 : 4;
}
