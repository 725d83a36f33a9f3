// Spark attention (SPEC.md section 4, docs/INTERFACES.md `spark_attn`) on the GPU.
//
// For every query (head n, token t, stream s), with KV head g = n / (N / KV) and C the positions
// whose mask element is exactly 0:
//
//   s1_j = capA(q1 . k1_j)                       j in C, dims 0..r
//   S    = C if |C| <= k, else { j in C : s1_j > theta }, theta = mean + std * Q(1 - k/|C|)
//          (statistics in f64 over the finite s1_j, as crate::topk; no entry above theta: every
//          j with s1_j == max)
//   w_j  = softmax_S(s1)_j * softplus(q2 . k2_j)  dims r..H, j in S only
//   o    = sum_{j in S} w_j v_j                   (zero row when C or S is empty)
//
// Compiled at load time by NVRTC with no headers at all (CUDA 13's NVRTC has no built-in
// cuda_fp16.h; f16 is converted with one PTX cvt instruction instead). The host
// side is spark-backend/src/attention/cuda_plan.rs; `struct SparkAttnArgs` below is `AttnArgs` there
// (same field order, C layout, passed by value to every kernel).
//
// ## Launch sequence (one `spark_attn` node, all on ggml-cuda's stream)
//
// The queries are processed in slabs (streams s0..s0+ns, tokens t0..t0+nt of each) so that the
// scratch stays under a fixed budget; decode and ubatches up to 256 tokens at depth 4096 fit in
// one slab. Qs = ns * nt * N queries per slab, query index qi = ((s - s0) * nt + (t - t0)) * N + n.
// Scratch (one stream-ordered allocation, reused by every slab):
//   scores  f32 [Qs, n_kv]        capped first-part scores (written for valid positions only)
//   list    i32 [Qs, n_kv]        kept positions, ascending, per query
//   count   i32 [Qs]              |S| per query (copied to the host only for statistics)
//   norm    f32 [Qs, 2]           (max kept score, 1 / softmax denominator) per query
//   partial f32 [Qs, CH, H]       per-chunk outputs (only when CH > 1)
//   done    u32 [Qs]              chunks of each query finished (only when CH > 1; zeroed by
//                                 scores, counted by output)
//
// Few queries (Qs <= FUSED_MAX_QUERIES of cuda_plan.rs: one-token decode) take two kernels,
// scores then select_output; more take three, scores, select, output.
//
// 1. spark_attn_scores   grid (ceil(n_kv / P), KV * ceil(G / GB), ns * ceil(nt / TT)),
//                        block 256 (8 warps), P = 32 positions per block (one pass of its warps).
//    A block holds M = (<= TT tokens) x (<= GB heads of one KV group) <= 8 queries (GB =
//    min(G, 8), TT = max(1, 8 / GB)), so each K1 row read from the cache serves every head of
//    the group and several tokens. A warp takes 4 positions at a time: lane (p, m) = (lane / 8,
//    lane % 8) reads the mask of position p for query m, a ballot skips positions no query of the
//    block may see (causal upper triangle, outside the window, other sequences, padding), and
//    the K1 rows of the others are read once (half2 loads over the r dims split across lanes),
//    reduced by an xor butterfly, soft-capped and written by lane (p, m) if valid. The blocks of
//    the first positions zero their queries' `done` counters.
// 2. The selection of one query (spark_select_row), by one block of 128 threads over the
//    query's scores row; thread tid takes positions tid, tid + 128, ... (copied once into shared
//    memory for rows up to SPARK_SEL_CACHE = 4096 positions, read again per pass above that):
//    (a) |C|, the number of finite scores and the first finite position (integer reductions);
//    (b) if |C| > k: shifted f64 sums of the finite scores (fixed per-thread strides, xor
//        butterflies, warp partials in order), theta in f64 as topk.rs, rounded down to f32;
//    (c) |S| = |{s > theta}| and mx, their max score; when 0, the tie rule: mx = the max over
//        the non-NaN scores, S = the positions equal to it;
//    (d) ordered compaction (ballot prefix within a warp, per-round warp counts in shared
//        memory) of the kept positions of a range of ranks into list, ascending;
//    (e) z = sum over kept of expf(s - mx) in f64 (per thread in order, fixed tree).
//    spark_attn_select (grid Qs) writes every rank, count = |S| and norm = (mx, 1 / z);
//    spark_attn_select_output (grid (Qs, CH)) selects in every block of the query (the same
//    result in each), writes the ranks of its chunk (chunk 0: count and norm too) and goes on
//    as the output kernel: the same values and scratch as the separate kernels.
// 3. spark_attn_output   grid (Qs, CH), block 128: chunk c of query qi takes kept entries
//    [c |S| / CH, (c + 1) |S| / CH) in sub-batches of 64 positions: each warp computes q2 . k2_j
//    for some of them (half2 loads, xor butterfly) and w_j = softplus(.) * (expf(s1_j - mx) / z)
//    into shared memory; then every thread accumulates its dims of w_j v_j over the sub-batch in
//    position order (coalesced rows of the f16 V cache; with 16-byte aligned f16 rows, groups of
//    H / 8 threads each load 16 bytes of a row, the block's groups take every rows-th position
//    in order and their sums are added in group order). CH == 1 writes dst directly; else
//    each chunk writes its partial row, and the query's last chunk to finish (an integer
//    atomic count in `done` after a fence) adds the CH partial rows in chunk order into dst.
//    Which block is last varies from run to run; what it computes does not. Nothing kept:
//    chunk 0 writes the zero row.
//
// Deterministic: every partition is a fixed function of the shapes and of |S|, reductions are
// xor butterflies and ordered loops, no float atomics. One query's result depends only on its
// own inputs (not on the slab, the block's other queries or the number of tokens): the same
// token gives the same output in decode and in a prefill ubatch.
//
// Limits checked by the host: H <= 512 (shared-memory query rows), blockDim a multiple of 32,
// H <= 8 * blockDim of the output kernel, the select kernel's blockDim equal to the output's.


#define SPARK_MAX_HEAD_DIM 512
#define SPARK_QB 8
#define SPARK_SUB 64
#define SPARK_OUT_ACC 8
#define SPARK_POS_UNROLL 4
#define SPARK_SUM_UNROLL 8
#define SPARK_FULL_MASK 0xffffffffu
// Positions a selection holds in shared memory (longer rows are read again in every pass).
#define SPARK_SEL_CACHE 4096
// Most threads per block of the output kernels (cuda_plan.rs's OUTPUT_THREADS, checked there).
#define SPARK_OUT_THREADS 128

struct SparkAttnArgs {
    // Device addresses.
    unsigned long long q, k, v, mask, dst;
    unsigned long long scores, list, count, norm, partial, done;
    // Byte strides (ggml nb) of q, k, v, mask, dst.
    long long q_nb[4], k_nb[4], v_nb[4], m_nb[4], d_nb[4];
    int head_dim, n_head, n_head_kv, n_tokens, n_kv, n_stream;
    int mask_ne2, mask_ne3;
    // Element types (1 = f16, 0 = f32) and the fast paths: k_vec 1 = half2 loads (f16, adjacent
    // elements, 4-byte aligned rows, r and H even); v_vec 1 = half2 loads (the same for V),
    // 2 = 16-byte loads (f16, adjacent elements, 16-byte aligned rows, H % 8 == 0).
    int k_f16, v_f16, mask_f16, k_vec, v_vec;
    int keep, r;
    float softcap;
    // Slab: streams s0..s0+ns, tokens t0..t0+nt.
    int s0, ns, t0, nt;
    // Scores-kernel blocking: heads per block (GB), tokens per block (TT), positions per block.
    int heads_per_block, tokens_per_block, pos_per_block;
    // Output chunks per query (CH).
    int chunks;
};

// ---------------------------------------------------------------------------------------------
// Scalar helpers

// Programmatic dependent launch (sm_90 and up, where the launcher sets the attribute): wait for
// the kernel before this one on the stream and its writes, then let the next one start
// launching; the first statement of every kernel below (as ffn.cu's spark_pdl_enter, which
// this header-free file cannot include). Nothing below sm_90 and in the CPU emulation.
__device__ __forceinline__ void spark_attn_pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

__device__ __forceinline__ float spark_inf_f() { return __int_as_float(0x7f800000); }
__device__ __forceinline__ double spark_inf_d() { return __longlong_as_double(0x7ff0000000000000LL); }
__device__ __forceinline__ bool spark_finite_f(float x) {
    return (__float_as_int(x) & 0x7f800000) != 0x7f800000;
}
__device__ __forceinline__ bool spark_finite_d(double x) {
    return (__double_as_longlong(x) & 0x7ff0000000000000LL) != 0x7ff0000000000000LL;
}

#ifndef SPARK_ATTN_EMULATION
// IEEE binary16 bits -> f32 (exact).
__device__ __forceinline__ float spark_h2f(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
#endif

// Two adjacent f16 at a 4-byte aligned address (element 0 in the low half).
__device__ __forceinline__ float2 spark_load_h2(const char* p) {
    const unsigned int u = *(const unsigned int*)p;
    return make_float2(spark_h2f((unsigned short)(u & 0xffffu)), spark_h2f((unsigned short)(u >> 16)));
}

// acc[e] += w * (f16 element e of the 16 bytes raw), e = 0..7.
__device__ __forceinline__ void spark_axpy_h8(float w, const uint4 raw, float* acc) {
    const unsigned int u[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        acc[2 * k] = fmaf(w, spark_h2f((unsigned short)(u[k] & 0xffffu)), acc[2 * k]);
        acc[2 * k + 1] = fmaf(w, spark_h2f((unsigned short)(u[k] >> 16)), acc[2 * k + 1]);
    }
}

__device__ __forceinline__ float spark_load(const char* p, int f16) {
    return f16 ? spark_h2f(*(const unsigned short*)p) : *(const float*)p;
}

// Mask element is a valid position: exactly 0 (either sign).
__device__ __forceinline__ bool spark_mask_valid(const char* p, int f16) {
    return f16 ? ((*(const unsigned short*)p) & 0x7fffu) == 0u : *(const float*)p == 0.0f;
}

__device__ __forceinline__ float spark_softplus(float x) {
    // max(x, 0) + ln(1 + e^-|x|): never overflows; NaN propagates.
    return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)));
}

// The largest f32 not above t (as topk::round_down_f32): v > result exactly when v > t.
__device__ float spark_round_down(double t) {
    float r = (float)t;
    if ((double)r > t) {
        if (r == 0.0f) {
            r = __int_as_float(0x80000001);
        } else if (r > 0.0f) {
            r = __int_as_float(__float_as_int(r) - 1);
        } else {
            r = __int_as_float(__float_as_int(r) + 1);
        }
    }
    return r;
}

// Q(p) for 0 < p < 0.5: Acklam's approximation and one Halley step (topk::lower_ppf).
__device__ double spark_lower_ppf(double p) {
    const double a0 = -3.969683028665376e+01, a1 = 2.209460984245205e+02,
                 a2 = -2.759285104469687e+02, a3 = 1.383577518672690e+02,
                 a4 = -3.066479806614716e+01, a5 = 2.506628277459239e+00;
    const double b0 = -5.447609879822406e+01, b1 = 1.615858368580409e+02,
                 b2 = -1.556989798598866e+02, b3 = 6.680131188771972e+01,
                 b4 = -1.328068155288572e+01;
    const double c0 = -7.784894002430293e-03, c1 = -3.223964580411365e-01,
                 c2 = -2.400758277161838e+00, c3 = -2.549732539343734e+00,
                 c4 = 4.374664141464968e+00, c5 = 2.938163982698783e+00;
    const double d0 = 7.784695709041462e-03, d1 = 3.224671290700398e-01,
                 d2 = 2.445134137142996e+00, d3 = 3.754408661907416e+00;
    double x;
    if (p < 0.02425) {
        const double q = sqrt(-2.0 * log(p));
        x = (((((c0 * q + c1) * q + c2) * q + c3) * q + c4) * q + c5) /
            ((((d0 * q + d1) * q + d2) * q + d3) * q + 1.0);
    } else {
        const double q = p - 0.5;
        const double r = q * q;
        x = (((((a0 * r + a1) * r + a2) * r + a3) * r + a4) * r + a5) * q /
            (((((b0 * r + b1) * r + b2) * r + b3) * r + b4) * r + 1.0);
    }
    const double e = 0.5 * erfc(-x * 0.70710678118654752440) - p;
    const double u = e * 2.50662827463100050242 * exp(0.5 * x * x);
    const double refined = x - u / (1.0 + 0.5 * x * u);
    return spark_finite_d(refined) ? refined : x;
}

// Inverse CDF of N(0, 1) (topk::norm_ppf).
__device__ double spark_norm_ppf(double p) {
    if (p != p) return p;
    if (p <= 0.0) return -spark_inf_d();
    if (p >= 1.0) return spark_inf_d();
    if (p == 0.5) return 0.0;
    if (p > 0.5) return -spark_lower_ppf(1.0 - p);
    return spark_lower_ppf(p);
}

// ---------------------------------------------------------------------------------------------
// Warp and block reductions: xor butterflies (every lane ends with the bit-identical total) and
// warp partials combined in warp order. Every thread of the block gets the result.

__device__ __forceinline__ float spark_warp_sum_f(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(SPARK_FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ double spark_warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(SPARK_FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ int spark_warp_sum_i(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(SPARK_FULL_MASK, v, o);
    return v;
}
__device__ __forceinline__ int spark_warp_min_i(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(SPARK_FULL_MASK, v, o));
    return v;
}
__device__ __forceinline__ float spark_warp_max_f(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(SPARK_FULL_MASK, v, o));
    return v;
}

__device__ double spark_block_sum_d(double v, double* sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = spark_warp_sum_d(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    return spark_warp_sum_d(lane < nw ? sh[lane] : 0.0);
}
__device__ int spark_block_sum_i(int v, int* sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = spark_warp_sum_i(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    return spark_warp_sum_i(lane < nw ? sh[lane] : 0);
}
__device__ int spark_block_min_i(int v, int* sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = spark_warp_min_i(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    return spark_warp_min_i(lane < nw ? sh[lane] : 0x7fffffff);
}
__device__ float spark_block_max_f(float v, float* sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = spark_warp_max_f(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    return spark_warp_max_f(lane < nw ? sh[lane] : -spark_inf_f());
}

// Query qi of the slab -> (head, token, stream).
__device__ __forceinline__ void spark_query(const SparkAttnArgs& a, int qi, int& n, int& t, int& s) {
    n = qi % a.n_head;
    t = a.t0 + (qi / a.n_head) % a.nt;
    s = a.s0 + qi / (a.n_head * a.nt);
}

__device__ __forceinline__ const char* spark_mask_row(const SparkAttnArgs& a, int t, int n, int s) {
    return (const char*)a.mask + (long long)t * a.m_nb[1] + (long long)(n % a.mask_ne2) * a.m_nb[2] +
           (long long)(s % a.mask_ne3) * a.m_nb[3];
}

// ---------------------------------------------------------------------------------------------
// 1. First-part scores.

extern "C" __global__ void spark_attn_scores(const SparkAttnArgs a) {
    spark_attn_pdl_enter();
    __shared__ float2 qsh[SPARK_QB][SPARK_MAX_HEAD_DIM / 2];
    const int G = a.n_head / a.n_head_kv;
    const int GB = a.heads_per_block, TT = a.tokens_per_block;
    const int n_hsub = (G + GB - 1) / GB;
    const int g = blockIdx.y / n_hsub, hs = blockIdx.y % n_hsub;
    const int n_tb = (a.nt + TT - 1) / TT;
    const int sl = blockIdx.z / n_tb, tb = blockIdx.z % n_tb;
    const int s = a.s0 + sl;
    const int tA = a.t0 + tb * TT;
    const int tc = min(TT, a.t0 + a.nt - tA);
    const int nA = g * G + hs * GB;
    const int hc = min(GB, (g + 1) * G - nA);
    const int M = tc * hc;
    const int r = a.r;
    // The output's chunk counters of this block's queries start at 0 (the first position block
    // of each query group; the kernels after this one on the stream count).
    if (a.chunks > 1 && blockIdx.x == 0 && (int)threadIdx.x < M) {
        const int m = threadIdx.x;
        ((unsigned int*)a.done)[((long long)sl * a.nt + (tA + m / hc - a.t0)) * a.n_head + nA + m % hc] = 0u;
    }

    float* qf = (float*)&qsh[0][0];
    for (int idx = threadIdx.x; idx < M * r; idx += blockDim.x) {
        const int m = idx / r, i = idx % r;
        const int t = tA + m / hc, n = nA + m % hc;
        qf[m * SPARK_MAX_HEAD_DIM + i] =
            *(const float*)((const char*)a.q + (long long)i * a.q_nb[0] + (long long)n * a.q_nb[1] +
                            (long long)t * a.q_nb[2] + (long long)s * a.q_nb[3]);
    }
    __syncthreads();

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int lp = lane >> 3, lm = lane & 7;
    // The query of this lane's mask reads (lm < M), and its row of the scores buffer.
    const int lt = tA + (lm < M ? lm / hc : 0), ln = nA + (lm < M ? lm % hc : 0);
    const char* mrow = spark_mask_row(a, lt, ln, s);
    const long long qi_l = ((long long)(s - a.s0) * a.nt + (lt - a.t0)) * a.n_head + ln;
    float* srow = (float*)a.scores + qi_l * a.n_kv;
    const char* kbase = (const char*)a.k + (long long)g * a.k_nb[1] + (long long)s * a.k_nb[3];
    const int j_begin = blockIdx.x * a.pos_per_block;
    const int j_end = min(j_begin + a.pos_per_block, a.n_kv);
    const float cap = a.softcap, inv_cap = a.softcap > 0.0f ? 1.0f / a.softcap : 0.0f;

    for (int j0 = j_begin + warp * 4; j0 < j_end; j0 += nwarps * 4) {
        const int j = j0 + lp;
        const bool valid = lm < M && j < j_end && spark_mask_valid(mrow + (long long)j * a.m_nb[0], a.mask_f16);
        const unsigned bal = __ballot_sync(SPARK_FULL_MASK, valid);
        if (bal == 0u) continue;
        bool act[4];
        const char* row[4];
#pragma unroll
        for (int p = 0; p < 4; ++p) {
            act[p] = ((bal >> (8 * p)) & 0xffu) != 0u;
            row[p] = kbase + (long long)(act[p] ? j0 + p : j0) * a.k_nb[2];
        }
        float acc[4][SPARK_QB];
#pragma unroll
        for (int p = 0; p < 4; ++p)
#pragma unroll
            for (int m = 0; m < SPARK_QB; ++m) acc[p][m] = 0.0f;

        if (a.k_vec) {
            for (int c = lane; c < r / 2; c += 32) {
                float2 kf[4];
#pragma unroll
                for (int p = 0; p < 4; ++p)
                    kf[p] = act[p] ? spark_load_h2(row[p] + 4LL * c) : make_float2(0.0f, 0.0f);
#pragma unroll
                for (int m = 0; m < SPARK_QB; ++m) {
                    if (m < M) {
                        const float2 qv = qsh[m][c];
#pragma unroll
                        for (int p = 0; p < 4; ++p) acc[p][m] = fmaf(qv.y, kf[p].y, fmaf(qv.x, kf[p].x, acc[p][m]));
                    }
                }
            }
        } else {
            for (int i = lane; i < r; i += 32) {
                float kf[4];
#pragma unroll
                for (int p = 0; p < 4; ++p) kf[p] = act[p] ? spark_load(row[p] + (long long)i * a.k_nb[0], a.k_f16) : 0.0f;
#pragma unroll
                for (int m = 0; m < SPARK_QB; ++m) {
                    if (m < M) {
                        const float qv = qf[m * SPARK_MAX_HEAD_DIM + i];
#pragma unroll
                        for (int p = 0; p < 4; ++p) acc[p][m] = fmaf(qv, kf[p], acc[p][m]);
                    }
                }
            }
        }
#pragma unroll
        for (int p = 0; p < 4; ++p) {
            if (!act[p]) continue;
#pragma unroll
            for (int m = 0; m < SPARK_QB; ++m) {
                if (m < M) {
                    float x = spark_warp_sum_f(acc[p][m]);
                    if (cap > 0.0f) x = cap * tanhf(x * inv_cap);
                    if (lane == p * 8 + m && valid) srow[j] = x;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 2. Threshold, selection and softmax normaliser of one query, over its scores row.

// What every block of query qi computes from its row (the same values in each).
struct SparkSel {
    int kept;    // |S|
    float mx;    // max kept score (0 when nothing is kept)
    float inv_z; // 1 / sum over S of expf(s1_j - mx) (0 when nothing is kept)
};

// Steps (a)-(e) of the header for query qi, by the whole block (every thread must call it;
// every thread gets the result). Writes the kept positions of ranks [c |S| / CH, (c + 1) |S| /
// CH) into list (ascending positions; other blocks of the query write the other ranks) and
// makes them visible to the block. CACHED: the row fits SPARK_SEL_CACHE positions, which
// each thread copies once (its own positions: scores and mask validity) into shared memory
// for every pass; else each pass reads the row again. Thread tid takes positions tid + i *
// blockDim.x, i ascending, in every pass: the sums' order depends on the block size only.
template <bool CACHED>
__device__ SparkSel spark_select_row(const SparkAttnArgs& a, int qi, int c, int CH) {
    __shared__ double sh_d[32];
    __shared__ int sh_i[32];
    __shared__ float sh_f[32];
    __shared__ int sh_cnt[32][32]; // ballot counts per (round of a group, warp)
    int n, t, s;
    spark_query(a, qi, n, t, s);
    const char* mrow = spark_mask_row(a, t, n, s);
    const float* sc = (const float*)a.scores + (long long)qi * a.n_kv;
    int* list = (int*)a.list + (long long)qi * a.n_kv;
    const int nkv = a.n_kv, tid = threadIdx.x, bs = blockDim.x;
    const int lane = tid & 31, w = tid >> 5, nw = bs >> 5;

    // The cached row: each thread's own positions (no barrier needed: no thread reads
    // another's), scores and mask validity loaded together (an invalid position's score is
    // never read again).
    __shared__ float row_sh[CACHED ? SPARK_SEL_CACHE : 1];
    __shared__ unsigned char ok_sh[CACHED ? SPARK_SEL_CACHE : 1];
    if (CACHED) {
#pragma unroll 8
        for (int j = tid; j < nkv; j += bs) {
            row_sh[j] = sc[j];
            ok_sh[j] = spark_mask_valid(mrow + (long long)j * a.m_nb[0], a.mask_f16) ? 1 : 0;
        }
    }
    // Position j < n_kv: whether it is valid (its mask element is exactly 0), and its capped
    // score in x (only read when valid).
    auto elem = [&](int j, float& x) -> bool {
        if (CACHED) {
            x = row_sh[j];
            return ok_sh[j] != 0;
        }
        if (!spark_mask_valid(mrow + (long long)j * a.m_nb[0], a.mask_f16)) return false;
        x = sc[j];
        return true;
    };

    // (a) |C|, finite count, first finite position.
    int cnt = 0, nfin = 0, first = 0x7fffffff;
    for (int j = tid; j < nkv; j += bs) {
        float x;
        if (elem(j, x)) {
            ++cnt;
            if (spark_finite_f(x)) {
                ++nfin;
                first = min(first, j);
            }
        }
    }
    const int n_valid = spark_block_sum_i(cnt, sh_i);
    const int n_fin = spark_block_sum_i(nfin, sh_i);
    first = spark_block_min_i(first, sh_i);
    SparkSel sel = {0, 0.0f, 0.0f};
    if (n_valid == 0) return sel; // uniform across the block

    // (b) theta (only when |C| > k).
    const bool keep_all = a.keep >= n_valid;
    float theta = -spark_inf_f();
    if (!keep_all) {
        if (n_fin == 0) {
            theta = spark_inf_f();
        } else {
            const double shift = (double)sc[first];
            double s1 = 0.0, s2 = 0.0;
            for (int j = tid; j < nkv; j += bs) {
                float x;
                if (elem(j, x) && spark_finite_f(x)) {
                    const double d = (double)x - shift;
                    s1 += d;
                    s2 += d * d;
                }
            }
            s1 = spark_block_sum_d(s1, sh_d);
            s2 = spark_block_sum_d(s2, sh_d);
            const double nf = (double)n_fin;
            const double mean_shifted = s1 / nf;
            double var = n_fin < 2 ? 0.0 : (s2 - s1 * mean_shifted) / (nf - 1.0);
            if (!(var > 0.0)) var = 0.0;
            const double sd = sqrt(var);
            const double mean = shift + mean_shifted;
            const double q = spark_norm_ppf(1.0 - (double)a.keep / (double)n_valid);
            theta = spark_round_down(sd == 0.0 ? mean : mean + sd * q);
        }
    }

    // (c) |{s > theta}| and its maximum; the maximum over C for keep-all and the tie rule
    // (nothing above theta: S = the positions equal to that maximum).
    int above = 0;
    float mx_above = -spark_inf_f(), mx_all = -spark_inf_f();
    for (int j = tid; j < nkv; j += bs) {
        float x;
        if (elem(j, x)) {
            mx_all = fmaxf(mx_all, x);
            if (x > theta) {
                ++above;
                mx_above = fmaxf(mx_above, x);
            }
        }
    }
    mx_all = spark_block_max_f(mx_all, sh_f);
    int kept;
    float mx;
    bool ties = false;
    if (keep_all) {
        kept = n_valid;
        mx = mx_all;
    } else {
        above = spark_block_sum_i(above, sh_i);
        if (above > 0) {
            kept = above;
            mx = spark_block_max_f(mx_above, sh_f);
        } else {
            ties = true;
            mx = mx_all;
            int eq = 0;
            for (int j = tid; j < nkv; j += bs) {
                float x;
                if (elem(j, x) && x == mx) ++eq;
            }
            kept = spark_block_sum_i(eq, sh_i);
        }
    }

    // (d) ordered compaction of S: the rank of a kept position is the number of kept positions
    // before it (earlier rounds, earlier warps of its round, earlier lanes of its warp); this
    // block writes the ranks of its chunk. Rounds go in groups of 32 (one sh_cnt table each).
    // (e) alongside, z = sum over S of expf(s - mx), in f64, each thread over its positions in
    // order, then the block's fixed tree.
    // Position j (any value: false at and past n_kv) is in S; its score in x.
    auto in_s = [&](int j, float& x) -> bool {
        return j < nkv && elem(j, x) && (keep_all || (ties ? x == mx : x > theta));
    };
    const int lo = (int)(((long long)c * kept) / CH), hi = (int)(((long long)(c + 1) * kept) / CH);
    const int rounds = (nkv + bs - 1) / bs; // the same in every thread: the ballots' loop
    double z = 0.0;
    int base = 0;
    for (int g0 = 0; g0 < rounds; g0 += 32) {
        const int gn = min(32, rounds - g0);
        for (int i = 0; i < gn; ++i) {
            float x;
            const bool f = in_s(tid + (g0 + i) * bs, x);
            if (f) z += (double)expf(x - mx);
            const unsigned b = __ballot_sync(SPARK_FULL_MASK, f);
            if (lane == 0) sh_cnt[i][w] = __popc(b);
        }
        __syncthreads();
        for (int i = 0; i < gn; ++i) {
            int before = 0, all = 0;
            for (int k = 0; k < nw; ++k) {
                if (k < w) before += sh_cnt[i][k];
                all += sh_cnt[i][k];
            }
            float x;
            const bool f = in_s(tid + (g0 + i) * bs, x);
            const unsigned b = __ballot_sync(SPARK_FULL_MASK, f);
            const int rank = base + before + __popc(b & ((1u << lane) - 1u));
            if (f && rank >= lo && rank < hi) list[rank] = tid + (g0 + i) * bs;
            base += all;
        }
        __syncthreads(); // sh_cnt is read by every thread before the next group writes it
    }
    z = spark_block_sum_d(z, sh_d); // its barriers also publish the list entries to the block
    sel.kept = kept;
    sel.mx = mx;
    sel.inv_z = (float)(1.0 / z);
    return sel;
}

// spark_select_row, the row held in shared memory when it fits.
__device__ __forceinline__ SparkSel spark_select(const SparkAttnArgs& a, int qi, int c, int CH) {
    return a.n_kv <= SPARK_SEL_CACHE ? spark_select_row<true>(a, qi, c, CH) : spark_select_row<false>(a, qi, c, CH);
}

// count and norm of query qi (chunk 0's thread 0).
__device__ __forceinline__ void spark_write_selection(const SparkAttnArgs& a, int qi, const SparkSel& sel) {
    ((int*)a.count)[qi] = sel.kept;
    ((float*)a.norm)[2 * qi] = sel.mx;
    ((float*)a.norm)[2 * qi + 1] = sel.inv_z;
}

// Separate selection (many queries): one block per query writes its whole list, count, norm.
extern "C" __global__ void spark_attn_select(const SparkAttnArgs a) {
    spark_attn_pdl_enter();
    const int qi = blockIdx.x;
    const SparkSel sel = spark_select(a, qi, 0, 1);
    if (threadIdx.x == 0) spark_write_selection(a, qi, sel);
}

// ---------------------------------------------------------------------------------------------
// 3. Second-part dots, weights and the V gather over one chunk of one query's kept positions.

// acc += w[p] v_{pos[p]} for p = 0..NP-1, in that order, over this thread's dims (tid + u * bs,
// as pairs on the half2 path): the NP rows' loads are issued before their multiply-adds.
template <int NP>
__device__ __forceinline__ void spark_accumulate_v(const SparkAttnArgs& a, const float* w, const int* pos,
                                                   const char* vbase, int tid, int bs, float* acc) {
    const int H = a.head_dim;
    const char* vr[NP];
#pragma unroll
    for (int p = 0; p < NP; ++p) vr[p] = vbase + (long long)pos[p] * a.v_nb[2];
    if (a.v_vec) {
#pragma unroll
        for (int u = 0; u < SPARK_OUT_ACC / 2; ++u) {
            const int d2 = tid + u * bs;
            if (d2 < H / 2) {
                float2 vf[NP];
#pragma unroll
                for (int p = 0; p < NP; ++p) vf[p] = spark_load_h2(vr[p] + 4LL * d2);
#pragma unroll
                for (int p = 0; p < NP; ++p) {
                    acc[2 * u] = fmaf(w[p], vf[p].x, acc[2 * u]);
                    acc[2 * u + 1] = fmaf(w[p], vf[p].y, acc[2 * u + 1]);
                }
            }
        }
    } else {
#pragma unroll
        for (int u = 0; u < SPARK_OUT_ACC; ++u) {
            const int d = tid + u * bs;
            if (d < H) {
                float vf[NP];
#pragma unroll
                for (int p = 0; p < NP; ++p) vf[p] = spark_load(vr[p] + (long long)d * a.v_nb[0], a.v_f16);
#pragma unroll
                for (int p = 0; p < NP; ++p) acc[u] = fmaf(w[p], vf[p], acc[u]);
            }
        }
    }
}

// The 16-byte path (v_vec == 2: f16 V, 16-byte aligned rows, H % 8 == 0): thread (grp, part) =
// (tid / (H / 8), tid % (H / 8)) holds dims 8 part .. 8 part + 7 of its group's sum, and group
// grp of the block's rows = blockDim / (H / 8) groups takes positions grp, grp + rows, ... of the
// sub-batch in order, SPARK_POS_UNROLL rows' 16-byte loads in flight before their multiply-adds.
// The groups' sums are added in group order at the end (spark_attn_chunk).
__device__ __forceinline__ void spark_accumulate_v16(const SparkAttnArgs& a, const float* w, const int* pos, int cnt,
                                                     int grp, int rows, const char* vcol, float* acc) {
    int i = grp;
    for (; i + (SPARK_POS_UNROLL - 1) * rows < cnt; i += SPARK_POS_UNROLL * rows) {
        uint4 raw[SPARK_POS_UNROLL];
#pragma unroll
        for (int p = 0; p < SPARK_POS_UNROLL; ++p)
            raw[p] = *(const uint4*)(vcol + (long long)pos[i + p * rows] * a.v_nb[2]);
#pragma unroll
        for (int p = 0; p < SPARK_POS_UNROLL; ++p) spark_axpy_h8(w[i + p * rows], raw[p], acc);
    }
    for (; i < cnt; i += rows) spark_axpy_h8(w[i], *(const uint4*)(vcol + (long long)pos[i] * a.v_nb[2]), acc);
}

// ---------------------------------------------------------------------------------------------
// 3b. The last chunk of a query (spark_attn_output, CH > 1): chunk partials -> dst, in chunk order.

// Whether this block is the last of query qi's CH chunks to finish (same answer in every thread
// of the block): its partial row is made visible device-wide (fence) before it is counted, and
// the last block's fence orders its reads of the other rows after the count.
__device__ __forceinline__ bool spark_last_chunk(const SparkAttnArgs& a, int qi) {
    __shared__ int last;
    __threadfence();
    __syncthreads(); // every thread's row is written and fenced
    if (threadIdx.x == 0) last = atomicAdd((unsigned int*)a.done + qi, 1u) == (unsigned int)(a.chunks - 1);
    __syncthreads();
    if (last) __threadfence();
    return last != 0;
}

// dst row = query qi's CH partial rows added in chunk order (SPARK_SUM_UNROLL loads in flight), read past
// the L1 cache (the other blocks' rows were written from other SMs).
__device__ __forceinline__ void spark_sum_chunks(const SparkAttnArgs& a, int qi, float* dst_row) {
    const int CH = a.chunks, H = a.head_dim;
    const float* part = (const float*)a.partial + (long long)qi * CH * H;
    for (int d = threadIdx.x; d < H; d += blockDim.x) {
        float sum = __ldcg(part + d);
        int c = 1;
        for (; c + SPARK_SUM_UNROLL <= CH; c += SPARK_SUM_UNROLL) {
            float p[SPARK_SUM_UNROLL];
#pragma unroll
            for (int u = 0; u < SPARK_SUM_UNROLL; ++u) p[u] = __ldcg(part + (long long)(c + u) * H + d);
#pragma unroll
            for (int u = 0; u < SPARK_SUM_UNROLL; ++u) sum += p[u];
        }
        for (; c < CH; ++c) sum += __ldcg(part + (long long)c * H + d);
        dst_row[d] = sum;
    }
}

// Chunk c of query qi, given its selection: kept entries [c |S| / CH, (c + 1) |S| / CH) of its
// list. Nothing kept: chunk 0 writes the zero row, the other chunks nothing (no chunk counts).
__device__ void spark_attn_chunk(const SparkAttnArgs& a, int qi, int c, const SparkSel& sel) {
    __shared__ float2 q2sh[SPARK_MAX_HEAD_DIM / 2];
    __shared__ float wsh[SPARK_SUB];
    __shared__ int psh[SPARK_SUB];
    __shared__ float gsum[SPARK_OUT_ACC * SPARK_OUT_THREADS]; // the 16-byte path's group sums
    const int CH = a.chunks;
    int n, t, s;
    spark_query(a, qi, n, t, s);
    const int H = a.head_dim, r = a.r, h2 = H - r;
    const int g = n / (a.n_head / a.n_head_kv);
    const int tid = threadIdx.x, bs = blockDim.x;
    const int lane = tid & 31, warp = tid >> 5, nwarps = bs >> 5;
    float* dst_row = (float*)((char*)a.dst + (long long)n * a.d_nb[1] + (long long)t * a.d_nb[2] + (long long)s * a.d_nb[3]);
    const int kept = sel.kept;
    if (kept == 0) { // uniform across the block
        if (c == 0)
            for (int d = tid; d < H; d += bs) dst_row[d] = 0.0f;
        return;
    }

    float* q2f = (float*)&q2sh[0];
    for (int i = tid; i < h2; i += bs)
        q2f[i] = *(const float*)((const char*)a.q + (long long)(r + i) * a.q_nb[0] + (long long)n * a.q_nb[1] +
                                 (long long)t * a.q_nb[2] + (long long)s * a.q_nb[3]);
    const int lo = (int)(((long long)c * kept) / CH);
    const int hi = (int)(((long long)(c + 1) * kept) / CH);
    const float mx = sel.mx, inv_z = sel.inv_z;
    const int* list = (const int*)a.list + (long long)qi * a.n_kv;
    const float* sc = (const float*)a.scores + (long long)qi * a.n_kv;
    const char* kbase = (const char*)a.k + (long long)g * a.k_nb[1] + (long long)s * a.k_nb[3];
    const char* vbase = (const char*)a.v + (long long)g * a.v_nb[1] + (long long)s * a.v_nb[3];

    float acc[SPARK_OUT_ACC];
#pragma unroll
    for (int u = 0; u < SPARK_OUT_ACC; ++u) acc[u] = 0.0f;
    const bool v16 = a.v_vec == 2;
    const int tpr = v16 ? H / 8 : 1, rows = bs / tpr, grp = tid / tpr, part = tid % tpr;
    __syncthreads();

    for (int sb = lo; sb < hi; sb += SPARK_SUB) {
        const int cnt = min(SPARK_SUB, hi - sb);
        // Weights of the sub-batch: one warp per position.
        for (int i = warp; i < cnt; i += nwarps) {
            const int pos = list[sb + i];
            const char* row = kbase + (long long)pos * a.k_nb[2];
            float d = 0.0f;
            if (a.k_vec) {
                const int r2 = r / 2;
                for (int c2 = lane; c2 < h2 / 2; c2 += 32) {
                    const float2 kf = spark_load_h2(row + 4LL * (r2 + c2));
                    const float2 qv = q2sh[c2];
                    d = fmaf(qv.y, kf.y, fmaf(qv.x, kf.x, d));
                }
            } else {
                for (int i2 = lane; i2 < h2; i2 += 32)
                    d = fmaf(q2f[i2], spark_load(row + (long long)(r + i2) * a.k_nb[0], a.k_f16), d);
            }
            d = spark_warp_sum_f(d);
            if (lane == 0) {
                const float e = expf(sc[pos] - mx);
                wsh[i] = spark_softplus(d) * (e * inv_z);
                psh[i] = pos;
            }
        }
        __syncthreads();
        // o += w_j v_j over the sub-batch, in position order: SPARK_POS_UNROLL positions' V loads
        // in flight before their multiply-adds, then the rest one by one.
        if (v16) {
            if (grp < rows) spark_accumulate_v16(a, wsh, psh, cnt, grp, rows, vbase + 16LL * part, acc);
        } else {
            int i = 0;
            for (; i + SPARK_POS_UNROLL <= cnt; i += SPARK_POS_UNROLL)
                spark_accumulate_v<SPARK_POS_UNROLL>(a, wsh + i, psh + i, vbase, tid, bs, acc);
            for (; i < cnt; ++i) spark_accumulate_v<1>(a, wsh + i, psh + i, vbase, tid, bs, acc);
        }
        __syncthreads();
    }

    // Write: dst directly (one chunk) or this chunk's partial row.
    float* out = CH == 1 ? dst_row : (float*)a.partial + ((long long)qi * CH + c) * H;
    if (v16) {
        // the groups' sums added in group order
        if (grp < rows) {
#pragma unroll
            for (int e = 0; e < 8; ++e) gsum[grp * H + 8 * part + e] = acc[e];
        }
        __syncthreads();
        for (int d = tid; d < H; d += bs) {
            float v = gsum[d];
            for (int k = 1; k < rows; ++k) v += gsum[k * H + d];
            out[d] = v;
        }
    } else if (a.v_vec) {
#pragma unroll
        for (int u = 0; u < SPARK_OUT_ACC / 2; ++u) {
            const int d2 = tid + u * bs;
            if (d2 < H / 2) {
                out[2 * d2] = acc[2 * u];
                out[2 * d2 + 1] = acc[2 * u + 1];
            }
        }
    } else {
#pragma unroll
        for (int u = 0; u < SPARK_OUT_ACC; ++u) {
            const int d = tid + u * bs;
            if (d < H) out[d] = acc[u];
        }
    }
    if (CH > 1 && spark_last_chunk(a, qi)) spark_sum_chunks(a, qi, dst_row);
}

// Separate output (after spark_attn_select): grid (Qs, CH).
extern "C" __global__ void spark_attn_output(const SparkAttnArgs a) {
    spark_attn_pdl_enter();
    const int qi = blockIdx.x;
    SparkSel sel;
    sel.kept = ((const int*)a.count)[qi];
    sel.mx = ((const float*)a.norm)[2 * qi];
    sel.inv_z = ((const float*)a.norm)[2 * qi + 1];
    spark_attn_chunk(a, qi, blockIdx.y, sel);
}

// Selection and output in one launch (few queries): grid (Qs, CH); every block selects its
// query's row itself (the same result in each), writes the list entries of its chunk's ranks
// and goes on with that chunk. Chunk 0 writes count and norm. The same values as
// spark_attn_select + spark_attn_output with the same block size, scratch included.
extern "C" __global__ void spark_attn_select_output(const SparkAttnArgs a) {
    spark_attn_pdl_enter();
    const int qi = blockIdx.x, c = blockIdx.y;
    const SparkSel sel = spark_select(a, qi, c, a.chunks);
    if (c == 0 && threadIdx.x == 0) spark_write_selection(a, qi, sel);
    spark_attn_chunk(a, qi, c, sel);
}
