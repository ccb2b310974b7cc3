// The device loop's sampler: one block of 1024 threads draws generated token `step` from one row of logits,
// following the contract of the `sampling` crate (its crate docs) operation for operation, so that it picks
// the token `sampling::Sampler::pick` picks from the same logits. Every floating-point operation is an explicit
// round-to-nearest intrinsic (`__fdiv_rn`, `__fmul_rn`, `__fadd_rn`, `__fsub_rn`, `__fmaf_rn`) and the module
// is compiled with `--fmad=false`: nothing is contracted or approximated.
//
// State the kernel keeps across steps, all in device memory (graph capturable: no launch argument changes
// from step to step): `draws`, the number of tokens drawn so far (the step), and `seen`, one bit per id of
// the history (prompt and generated tokens) for the repetition penalty. `keys` is scratch of `vocab` words.

#define KV_THREADS 1024
#define KV_MAX_CANDIDATES 1024
#define KV_FULL 0xffffffffu

// Philox4x32-10 (sampling::philox4x32_10): the first output word.
__device__ unsigned int kv_philox_first(unsigned int c0, unsigned int c1, unsigned int c2, unsigned int c3,
                                        unsigned int k0, unsigned int k1)
{
    for (int i = 0; i < 10; ++i) {
        if (i > 0) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        unsigned int hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        unsigned int hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        unsigned int n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
    }
    return c0;
}

// sampling::uniform: the top 24 bits of the first word times 2^-24.
__device__ float kv_uniform(unsigned long long seed, unsigned long long step)
{
    unsigned int word = kv_philox_first((unsigned int)step, (unsigned int)(step >> 32), 0u, 0u,
                                        (unsigned int)seed, (unsigned int)(seed >> 32));
    return __fmul_rn((float)(word >> 8), __int_as_float(0x33800000));
}

// sampling::exp, the contract's exponential.
__device__ float kv_exp(float x)
{
    if (!(x >= -87.0f)) { return 0.0f; }
    float n = rintf(__fmul_rn(x, __int_as_float(0x3fb8aa3b)));
    float r = __fmaf_rn(-n, __int_as_float(0xb95e8083), __fmaf_rn(-n, __int_as_float(0x3f318000), x));
    float p = __int_as_float(0x39506967);
    p = __fmaf_rn(p, r, __int_as_float(0x3ab743ce));
    p = __fmaf_rn(p, r, __int_as_float(0x3c088908));
    p = __fmaf_rn(p, r, __int_as_float(0x3d2aa9c1));
    p = __fmaf_rn(p, r, __int_as_float(0x3e2aaaaa));
    p = __fmaf_rn(p, r, __int_as_float(0x3f000000));
    float y = __fadd_rn(__fmaf_rn(p, __fmul_rn(r, r), r), 1.0f);
    return __fmul_rn(y, __int_as_float(((int)n + 127) << 23));
}

// One logit widened to f32: dtype 0 f32, 1 f16, 2 bf16 (exact widenings).
__device__ float kv_logit(const void* row, int dtype, unsigned int i)
{
    if (dtype == 1) {
        unsigned int h = ((const unsigned short*)row)[i];
        unsigned int sign = (h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
        if (exponent == 0x1fu) { return __uint_as_float(sign | 0x7f800000u | (mantissa << 13)); }
        if (exponent != 0) { return __uint_as_float(sign | ((exponent + 112u) << 23) | (mantissa << 13)); }
        // Zero or subnormal: mantissa * 2^-24, exact in f32.
        return __uint_as_float(sign | __float_as_uint(__fmul_rn((float)mantissa, __int_as_float(0x33800000))));
    }
    if (dtype == 2) { return __int_as_float(((unsigned int)((const unsigned short*)row)[i]) << 16); }
    return ((const float*)row)[i];
}

// Steps 1 and 3: the penalised logit, divided by the temperature (a NaN becomes -inf).
__device__ float kv_scaled(const void* row, int dtype, const unsigned int* seen, float penalty,
                           float temperature, unsigned int i)
{
    float l = kv_logit(row, dtype, i);
    if (penalty != 1.0f && ((seen[i >> 5] >> (i & 31)) & 1u)) {
        l = l > 0.0f ? __fdiv_rn(l, penalty) : __fmul_rn(l, penalty);
    }
    if (temperature == 0.0f) { return l; }
    if (isnan(l)) { return __int_as_float(0xff800000); }
    return __fdiv_rn(l, temperature);
}

// The order of step 4 as an unsigned key: larger key, larger in f32's total order.
__device__ unsigned int kv_key(float v)
{
    unsigned int bits = __float_as_uint(v);
    return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

__device__ float kv_unkey(unsigned int key)
{
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// A candidate: key high, the id's complement low, so that the larger composite comes first in the contract's
// order (larger key, then smaller id). 0 is below every candidate (a key is never 0: a NaN is never a key).
__device__ unsigned long long kv_candidate(unsigned int key, unsigned int id)
{
    return ((unsigned long long)key << 32) | (unsigned long long)(KV_FULL - id);
}

// Greedy's preference (ref_graph::argmax): a number beats a NaN, a larger value a smaller one, equal values
// the smaller id, and among NaNs the larger id (the last index when every value is NaN).
__device__ bool kv_prefer(float a, unsigned int ia, float b, unsigned int ib)
{
    bool na = isnan(a), nb = isnan(b);
    if (na != nb) { return nb; }
    if (na) { return ia > ib; }
    if (a != b) { return a > b; }
    return ia < ib;
}

extern "C" __global__ void __launch_bounds__(KV_THREADS) kv_sample(
    const void* row, int dtype, unsigned int vocab,
    float temperature, unsigned int top_k, float top_p, float min_p, float penalty, unsigned long long seed,
    unsigned int* seen, unsigned int* draws, unsigned int* keys, long long* token_out)
{
    __shared__ unsigned long long cand[KV_MAX_CANDIDATES];
    __shared__ float prob[KV_MAX_CANDIDATES];
    __shared__ unsigned int hist[256];
    __shared__ unsigned int warp_counts[KV_THREADS / 32];
    __shared__ float best_value[KV_THREADS / 32];
    __shared__ unsigned int best_id[KV_THREADS / 32];
    __shared__ unsigned int s_prefix, s_need, s_equal, s_taken, s_greater, s_chosen;
    __shared__ float s_total;

    const unsigned int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const unsigned int step = draws[0];
    unsigned int chosen = 0;

    if (vocab == 0) {
        // An empty row gives 0.
    } else if (temperature == 0.0f) {
        // Step 2: greedy over the penalised logits, a block reduction of argmax's preference.
        float bv = kv_scaled(row, dtype, seen, penalty, 0.0f, tid < vocab ? tid : 0);
        unsigned int bi = tid < vocab ? tid : 0;
        for (unsigned int i = tid + KV_THREADS; i < vocab; i += KV_THREADS) {
            float v = kv_scaled(row, dtype, seen, penalty, 0.0f, i);
            if (kv_prefer(v, i, bv, bi)) { bv = v; bi = i; }
        }
        for (int offset = 16; offset > 0; offset >>= 1) {
            float ov = __shfl_down_sync(KV_FULL, bv, offset);
            unsigned int oi = __shfl_down_sync(KV_FULL, bi, offset);
            if (kv_prefer(ov, oi, bv, bi)) { bv = ov; bi = oi; }
        }
        if (lane == 0) { best_value[warp] = bv; best_id[warp] = bi; }
        __syncthreads();
        if (tid == 0) {
            float v = best_value[0];
            unsigned int id = best_id[0];
            for (unsigned int w = 1; w < KV_THREADS / 32; ++w) {
                if (kv_prefer(best_value[w], best_id[w], v, id)) { v = best_value[w]; id = best_id[w]; }
            }
            s_chosen = id;
        }
        __syncthreads();
        chosen = s_chosen;
    } else {
        // Step 5: K candidates.
        unsigned int k = top_k == 0 ? KV_MAX_CANDIDATES : top_k;
        if (k > KV_MAX_CANDIDATES) { k = KV_MAX_CANDIDATES; }
        if (k > vocab) { k = vocab; }
        if (tid == 0) { s_prefix = 0; s_need = k; s_taken = 0; s_greater = 0; }
        // The k-th largest key, a byte at a time from the top (radix select): `s_prefix` ends as that key,
        // `s_need` as how many ids of exactly that key are candidates (the smallest ids among them) and
        // `s_equal` as how many ids have it. The first pass computes the keys; lanes of a warp that count into
        // the same bucket add once (`__match_any_sync`), as logits crowd into few buckets.
        unsigned int mask = 0;
        for (int shift = 24; shift >= 0; shift -= 8) {
            if (tid < 256) { hist[tid] = 0; }
            __syncthreads();
            const unsigned int prefix = s_prefix;
            for (unsigned int base = 0; base < vocab; base += KV_THREADS) {
                const unsigned int i = base + tid;
                unsigned int key = 0;
                if (i < vocab) {
                    if (shift == 24) {
                        key = kv_key(kv_scaled(row, dtype, seen, penalty, temperature, i));
                        keys[i] = key;
                    } else {
                        key = keys[i];
                    }
                }
                const bool counted = i < vocab && (key & mask) == prefix;
                const unsigned int bucket = counted ? (key >> shift) & 255u : 256u + lane;
                const unsigned int peers = __match_any_sync(KV_FULL, bucket);
                if (counted && (__ffs(peers) - 1) == (int)lane) { atomicAdd(&hist[bucket], __popc(peers)); }
            }
            __syncthreads();
            if (tid == 0) {
                unsigned int above = 0, need = s_need;
                for (int b = 255; b >= 0; --b) {
                    if (above + hist[b] >= need) {
                        s_prefix = prefix | ((unsigned int)b << shift);
                        s_need = need - above;
                        s_equal = hist[b];
                        break;
                    }
                    above += hist[b];
                }
            }
            mask |= 255u << shift;
            __syncthreads();
        }
        const unsigned int threshold = s_prefix, need = s_need, greater = k - need;
        if (need == s_equal) {
            // Every id at the threshold is a candidate: no order to keep while gathering (sorted below).
            for (unsigned int i = tid; i < vocab; i += KV_THREADS) {
                const unsigned int key = keys[i];
                if (key >= threshold) { cand[atomicAdd(&s_greater, 1u)] = kv_candidate(key, i); }
            }
        } else {
            // The ids above the threshold in any order, those at it in id order until `need` are taken (a
            // scan of each chunk's flags by warp ballots).
            for (unsigned int base = 0; base < vocab; base += KV_THREADS) {
                const unsigned int i = base + tid;
                const unsigned int key = i < vocab ? keys[i] : 0;
                const bool above = i < vocab && key > threshold;
                const bool at = i < vocab && key == threshold;
                if (above) { cand[atomicAdd(&s_greater, 1u)] = kv_candidate(key, i); }
                const unsigned int ballot = __ballot_sync(KV_FULL, at);
                if (lane == 0) { warp_counts[warp] = __popc(ballot); }
                __syncthreads();
                unsigned int rank = s_taken + __popc(ballot & ((1u << lane) - 1u));
                for (unsigned int w = 0; w < warp; ++w) { rank += warp_counts[w]; }
                if (at && rank < need) { cand[greater + rank] = kv_candidate(key, i); }
                __syncthreads();
                if (tid == 0) {
                    unsigned int chunk = 0;
                    for (unsigned int w = 0; w < KV_THREADS / 32; ++w) { chunk += warp_counts[w]; }
                    s_taken += chunk;
                }
                __syncthreads();
            }
        }
        // Step 4 over the candidates: a bitonic sort, largest first, padded with zeros to a power of two.
        unsigned int size = 1;
        while (size < k) { size <<= 1; }
        for (unsigned int i = k + tid; i < size; i += KV_THREADS) { cand[i] = 0; }
        for (unsigned int span = 2; span <= size; span <<= 1) {
            for (unsigned int stride = span >> 1; stride > 0; stride >>= 1) {
                __syncthreads();
                unsigned int i = tid, j = tid ^ stride;
                if (i < size && j > i) {
                    unsigned long long a = cand[i], b = cand[j];
                    bool descending = (i & span) == 0;
                    if (descending ? a < b : a > b) { cand[i] = b; cand[j] = a; }
                }
            }
        }
        __syncthreads();
        // Step 6: the weights in parallel, their sum in sorted order, the probabilities in parallel.
        const float top = kv_unkey((unsigned int)(cand[0] >> 32));
        const bool infinite = isinf(top);
        if (tid < k) {
            float l = kv_unkey((unsigned int)(cand[tid] >> 32));
            prob[tid] = infinite ? 1.0f : kv_exp(__fsub_rn(l, top));
        }
        __syncthreads();
        if (tid == 0) {
            float total = 0.0f;
            for (unsigned int i = 0; i < k; ++i) { total = __fadd_rn(total, prob[i]); }
            s_total = total;
        }
        __syncthreads();
        if (tid < k) { prob[tid] = __fdiv_rn(prob[tid], s_total); }
        __syncthreads();
        // Steps 7 to 9, in sorted order.
        if (tid == 0) {
            unsigned int keep = k;
            if (top_p < 1.0f) {
                float running = 0.0f;
                for (unsigned int i = 0; i < k; ++i) {
                    running = __fadd_rn(running, prob[i]);
                    if (running >= top_p) { keep = i + 1; break; }
                }
            }
            const float floor = __fmul_rn(min_p, prob[0]);
            float kept = 0.0f;
            for (unsigned int i = 0; i < keep; ++i) {
                if (prob[i] >= floor) { kept = __fadd_rn(kept, prob[i]); }
            }
            const float target = __fmul_rn(kv_uniform(seed, step), kept);
            float running = 0.0f;
            unsigned int pick = KV_FULL, last = 0;
            for (unsigned int i = 0; i < keep; ++i) {
                if (!(prob[i] >= floor)) { continue; }
                last = i;
                running = __fadd_rn(running, prob[i]);
                if (running > target) { pick = i; break; }
            }
            if (pick == KV_FULL) { pick = last; }
            s_chosen = KV_FULL - (unsigned int)(cand[pick] & 0xffffffffu);
        }
        __syncthreads();
        chosen = s_chosen;
    }
    if (tid == 0) {
        token_out[0] = (long long)chosen;
        if (chosen < vocab) { atomicOr(&seen[chosen >> 5], 1u << (chosen & 31)); }
        draws[0] = step + 1;
    }
}
