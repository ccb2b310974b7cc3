// Index walks of the general path's kernels (`general.cu`), in a file of their own so that the host C++
// compiler runs them too (`tests/walk.rs`, `tests/support/walk_emulation.cpp`, against a plain 64-bit walk).

typedef long long i64;

// Element i of `dims` (row-major, `rank` axes, `n` elements in all) walked along two stride lists: adds its
// offsets along `sa` to `a` and along `sb` to `b`. A launch of fewer than 2^32 elements (every launch of a
// decode step and most of a prefill's) walks in 32 bits: each extent is at most `n`, so every index and extent
// fits, and a 32-bit division costs a fraction of a 64-bit one (the same for every thread: no divergence).
__device__ __forceinline__ void walk2(i64 i, i64 n, int rank, const i64* dims, const i64* sa, const i64* sb,
                                      i64& a, i64& b) {
    if (n <= 0xffffffffLL) {
        unsigned u = (unsigned)i;
        for (int d = rank - 1; d >= 0; d--) {
            const unsigned e = (unsigned)dims[d];
            const unsigned c = u % e;
            u /= e;
            a += (i64)c * sa[d];
            b += (i64)c * sb[d];
        }
        return;
    }
    for (int d = rank - 1; d >= 0; d--) {
        const i64 c = i % dims[d];
        i /= dims[d];
        a += c * sa[d];
        b += c * sb[d];
    }
}

// Whether strides `s` walk `dims` (row-major, `rank` axes) as one contiguous run: element i at offset i. An
// axis of extent 1 takes any stride (its index is always 0).
__device__ __forceinline__ bool contiguous(int rank, const i64* dims, const i64* s) {
    i64 run = 1;
    for (int d = rank - 1; d >= 0; d--) {
        if (dims[d] != 1 && s[d] != run) return false;
        run *= dims[d];
    }
    return true;
}

