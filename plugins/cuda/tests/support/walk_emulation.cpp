// The general path's index walks (`src/kernels/walk.cuh`) run by the host C++ compiler against a plain 64-bit
// walk: `tests/walk.rs` builds and runs this, which prints the number of disagreements and exits 1 if any.
//
// Cases: random shapes of rank 0 to 6 with extents 1 to 7, strides random (zero for a broadcast, negative,
// contiguous) over every element; shapes of 2^32 - 1, 2^32 and 2^34 elements at sampled indices (the last
// 32-bit launch and 64-bit ones); and `contiguous` against "element i sits at offset i" by brute force.
#include <cstdio>
#include <cstdint>
#include <random>

#define __device__
#define __forceinline__ inline
#include WALK_SOURCE

// The walk every launch once took: 64-bit division by each extent, innermost axis first.
static void walk_reference(i64 i, int rank, const i64* dims, const i64* sa, const i64* sb, i64& a, i64& b) {
    for (int d = rank - 1; d >= 0; d--) {
        const i64 c = i % dims[d];
        i /= dims[d];
        a += c * sa[d];
        b += c * sb[d];
    }
}

static long failures = 0;

static void check(i64 i, i64 n, int rank, const i64* dims, const i64* sa, const i64* sb) {
    i64 a = 3, b = -5, ra = 3, rb = -5;
    walk2(i, n, rank, dims, sa, sb, a, b);
    walk_reference(i, rank, dims, sa, sb, ra, rb);
    if (a != ra || b != rb) {
        if (failures < 10) std::printf("walk2 of %lld of %lld elements: %lld %lld, not %lld %lld\n", i, n, a, b, ra, rb);
        failures++;
    }
}

int main() {
    std::mt19937_64 rng(45);
    i64 dims[6], sa[6], sb[6];
    for (int round = 0; round < 20000; round++) {
        const int rank = (int)(rng() % 7);
        i64 n = 1;
        for (int d = 0; d < rank; d++) {
            dims[d] = 1 + (i64)(rng() % 7);
            n *= dims[d];
        }
        // Contiguous, broadcast or arbitrary strides, by axis.
        i64 run = 1;
        for (int d = rank - 1; d >= 0; d--) {
            const int kind = (int)(rng() % 4);
            sa[d] = kind == 0 ? run : kind == 1 ? 0 : (i64)(rng() % 41) - 20;
            sb[d] = round % 3 == 0 ? run : (i64)(rng() % 9);
            run *= dims[d];
        }
        for (i64 i = 0; i < n; i++) check(i, n, rank, dims, sa, sb);
        // `contiguous`: element i at offset i for every i, exactly when it says so.
        bool at_i = true;
        for (i64 i = 0; i < n; i++) {
            i64 a = 0, b = 0;
            walk_reference(i, rank, dims, sa, sb, a, b);
            at_i = at_i && a == i;
        }
        if (contiguous(rank, dims, sa) != at_i) {
            if (failures < 10) std::printf("contiguous says %d for a walk with element i at i: %d\n", contiguous(rank, dims, sa), at_i);
            failures++;
        }
    }
    // Around the 32-bit bound: [4095, 1048577] has 2^32 - 1 elements (the last 32-bit walk), then 2^32, 3 * 2^31
    // (indices past 2^32 that 32 bits would wrap) and 2^34.
    const i64 big[4][3] = {{1, 4095, 1048577}, {1, 65536, 65536}, {3, 65536, 32768}, {4, 65536, 65536}};
    for (const auto& shape : big) {
        const i64 n = shape[0] * shape[1] * shape[2];
        const i64 sa3[3] = {shape[1] * shape[2], shape[2], 1}, sb3[3] = {7, 0, 3};
        for (int k = 0; k < 200000; k++) {
            const i64 i = k < 100 ? n - 1 - k : (i64)(rng() % (uint64_t)n);
            check(i, n, 3, shape, sa3, sb3);
        }
    }
    std::printf("%ld disagreements\n", failures);
    return failures == 0 ? 0 : 1;
}
