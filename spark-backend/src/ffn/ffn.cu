// Spark FFN kernels (SPEC.md section 4, docs/INTERFACES.md "CUDA launchers"), launched by
// spark-backend/src/ffn/cuda_plan.rs on ggml-cuda's stream. Deterministic: every output value is
// computed by one thread in a fixed order; reductions use fixed trees; no float atomics.
#include "common.cuh"

#define SPARK_THRESHOLD_THREADS 1024
// Scores per thread held in registers from the statistics pass to the counting pass (rows of
// up to 16 * 1024 scores; longer rows are read again).
#define SPARK_THRESHOLD_CACHE 16

// 1 when score v gives a nonzero activation under threshold th (dense: gelu(v) itself).
__device__ __forceinline__ u32 spark_kept(float v, int dense, float th) {
    const float a = dense ? spark_gelu_tanh(v) : (v > th ? spark_gelu_tanh(v - th) : 0.0f);
    return a != 0.0f ? 1u : 0u;
}

// theta from the per-warp shifted sums (red1, red2) and finite counts (redi) of nw warps, added
// in warp order (SPEC 1: mean and unbiased std in f64), rounded down to f32 so that
// v > theta_f32 exactly when v > theta (topk::threshold). Called by one thread.
__device__ __forceinline__ float spark_theta_of_warps(const double * red1, const double * red2, const int * redi,
                                                      int nw, double shift, double q) {
    double t1 = 0.0, t2 = 0.0;
    int total = 0;
    for (int w = 0; w < nw; ++w) { t1 += red1[w]; t2 += red2[w]; total += redi[w]; }
    const double nf = (double)total;
    const double mean_shifted = t1 / nf;
    double var = 0.0;
    if (total >= 2) var = fmax((t2 - t1 * mean_shifted) / (nf - 1.0), 0.0);
    const double sd = sqrt(var);
    const double mean = shift + mean_shifted;
    return __double2float_rd(sd == 0.0 ? mean : mean + sd * q);
}

// The smallest `first` of the block's threads (warp butterflies, then the nw warps' minima
// through redi), in every thread. Every thread of the block must call it.
__device__ __forceinline__ int spark_block_first(int first, int * redi, int nw) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int m = 16; m > 0; m >>= 1) first = min(first, __shfl_xor_sync(SPARK_FULL_MASK, first, m));
    if (lane == 0) redi[warp] = first;
    __syncthreads();
    int all = first;
    for (int w = 0; w < nw; ++w) all = min(all, redi[w]);
    return all;
}

// theta from each thread's shifted sums s1, s2 and finite count cnt (spark_theta_of_warps over
// the warps' butterfly sums), written to *th and returned in every thread. redi may still be
// read by other threads (spark_block_first) when a thread arrives: the first barrier waits for
// them. Every thread of the block must call it.
__device__ __forceinline__ float spark_block_theta_of(double s1, double s2, int cnt, double shift, double q,
                                                      double * red1, double * red2, int * redi, int nw, float * th) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    s1 = spark_warp_sum_f64(s1);
    s2 = spark_warp_sum_f64(s2);
    for (int m = 16; m > 0; m >>= 1) cnt += __shfl_xor_sync(SPARK_FULL_MASK, cnt, m);
    __syncthreads();
    if (lane == 0) { red1[warp] = s1; red2[warp] = s2; redi[warp] = cnt; }
    __syncthreads();
    if (threadIdx.x == 0) *th = spark_theta_of_warps(red1, red2, redi, nw, shift, q);
    __syncthreads();
    return *th;
}

// Per token t (one block each): the statistical top-k threshold of s[t*F .. t*F + F) (SPEC 1:
// mean and unbiased std over the finite scores, in f64, shifted by the first finite score as
// spark-backend's topk::mean_std), rounded down to f32 like topk::threshold, and the number of
// kept neurons (nonzero activation, as ffn::activation). `q` = z of theta = mean + std * z from
// the host (topk::Cutoff::z: Q(1 - k/F), or Gemma 3n's std multiplier as given).
// dense != 0 (k >= F): theta is not used; kept counts gelu(s) != 0.
// Thread i takes scores i, i + 1024, ... in that order; a row of up to 16K scores is loaded once
// (all of a thread's loads in flight together) and kept in registers for every pass.
extern "C" __global__ void __launch_bounds__(SPARK_THRESHOLD_THREADS)
spark_ffn_threshold(const float * s, int F, int dense, double q, float * theta, u32 * kept) {
    spark_pdl_enter();
    __shared__ double red1[SPARK_THRESHOLD_THREADS / 32];
    __shared__ double red2[SPARK_THRESHOLD_THREADS / 32];
    __shared__ int redi[SPARK_THRESHOLD_THREADS / 32];
    __shared__ float th;
    const int t = blockIdx.x, tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int nw = SPARK_THRESHOLD_THREADS / 32;
    const float * x = s + (i64)t * F;
    const bool cached = F <= SPARK_THRESHOLD_CACHE * SPARK_THRESHOLD_THREADS;
    float v[SPARK_THRESHOLD_CACHE];
    if (cached) {
#pragma unroll
        for (int c = 0; c < SPARK_THRESHOLD_CACHE; ++c) {
            const int j = tid + c * SPARK_THRESHOLD_THREADS;
            v[c] = j < F ? x[j] : 0.0f;
        }
    }

    if (!dense) {
        // 1. the first finite score (the shift)
        int first = F;
        if (cached) {
#pragma unroll
            for (int c = SPARK_THRESHOLD_CACHE - 1; c >= 0; --c) {
                const int j = tid + c * SPARK_THRESHOLD_THREADS;
                if (j < F && isfinite(v[c])) first = j;
            }
        } else {
            for (int j = tid; j < F; j += SPARK_THRESHOLD_THREADS) {
                if (isfinite(x[j])) { first = j; break; }
            }
        }
        first = spark_block_first(first, redi, nw);
        if (first == F) {
            if (tid == 0) { theta[t] = __int_as_float(0x7f800000); kept[t] = 0; }
            return; // no finite score: nothing kept (uniform across the block)
        }
        const double shift = (double)x[first];
        // 2. shifted sums and count over the finite scores, fixed order: thread-strided, warp
        //    butterfly, then the warps in order (thread 0)
        double s1 = 0.0, s2 = 0.0;
        int cnt = 0;
        if (cached) {
#pragma unroll
            for (int c = 0; c < SPARK_THRESHOLD_CACHE; ++c) {
                const int j = tid + c * SPARK_THRESHOLD_THREADS;
                if (j < F && isfinite(v[c])) {
                    const double d = (double)v[c] - shift;
                    s1 += d;
                    s2 += d * d;
                    cnt += 1;
                }
            }
        } else {
            for (int j = tid; j < F; j += SPARK_THRESHOLD_THREADS) {
                const float xv = x[j];
                if (isfinite(xv)) {
                    const double d = (double)xv - shift;
                    s1 += d;
                    s2 += d * d;
                    cnt += 1;
                }
            }
        }
        spark_block_theta_of(s1, s2, cnt, shift, q, red1, red2, redi, nw, &th);
        if (tid == 0) theta[t] = th;
    }
    // 3. kept neurons
    const float thv = dense ? 0.0f : th;
    u32 c = 0;
    if (cached) {
#pragma unroll
        for (int e = 0; e < SPARK_THRESHOLD_CACHE; ++e) {
            if (tid + e * SPARK_THRESHOLD_THREADS < F) c += spark_kept(v[e], dense, thv);
        }
    } else {
        for (int j = tid; j < F; j += SPARK_THRESHOLD_THREADS) c += spark_kept(x[j], dense, thv);
    }
    for (int m = 16; m > 0; m >>= 1) c += __shfl_xor_sync(SPARK_FULL_MASK, c, m);
    __syncthreads(); // thread 0 has read redi above
    if (lane == 0) redi[warp] = (int)c;
    __syncthreads();
    if (tid == 0) {
        u32 total = 0;
        for (int w = 0; w < nw; ++w) total += (u32)redi[w];
        kept[t] = total;
        if (dense) theta[t] = -__int_as_float(0x7f800000);
    }
}

#define SPARK_UP_WARPS 8

// u[j*T + t] = gelu(s_tj - theta_t) * (K2_j . h_t[r_f:]) for active (j, t), else exactly 0
// (dense: gelu(s_tj) * dot for every j; zero activations give 0). One warp per neuron j: the
// lanes test 32 tokens' scores at once and the warp computes the dots of the active ones, so
// K2_j is read once per ubatch (from L1/L2 after the first token). grid: ceil(F / 8), block 256.
extern "C" __global__ void __launch_bounds__(SPARK_UP_WARPS * 32)
spark_ffn_up(const float * s, int F, int T, const float * theta, int dense,
             const u8 * h, i64 h_stride, int r_f, const u8 * k2, i64 k2_stride, int k2_type, int d2,
             float * u) {
    spark_pdl_enter();
    const int lane = threadIdx.x % 32;
    const int j = blockIdx.x * SPARK_UP_WARPS + threadIdx.x / 32;
    if (j >= F) return; // warp-uniform
    const u8 * row = k2 + (i64)j * k2_stride;
    for (int t0 = 0; t0 < T; t0 += 32) {
        const int t = t0 + lane;
        float a = 0.0f;
        if (t < T) {
            const float v = s[(i64)t * F + j];
            if (dense) a = spark_gelu_tanh(v);
            else {
                const float th = theta[t];
                a = v > th ? spark_gelu_tanh(v - th) : 0.0f;
            }
        }
        u32 active = __ballot_sync(SPARK_FULL_MASK, a != 0.0f);
        float val = 0.0f;
        while (active) {
            const int b = __ffs(active) - 1;
            active &= active - 1;
            const float * x = (const float *)(h + (i64)(t0 + b) * h_stride) + r_f;
            const float dot = spark_row_dot(row, k2_type, x, d2, lane);
            if (lane == b) val = a * dot;
        }
        if (t < T) u[(i64)j * T + t] = val;
    }
}

// The statistical top-k threshold of the row x (F scores) computed by every thread of a block
// of NT threads, as spark_ffn_threshold computes it (first finite score as the shift, f64
// sums thread-strided, warp butterflies, warps in order), read twice from memory instead of
// held in registers; +inf when no score is finite (nothing kept). Not for dense cutoffs.
// Every thread of the block must call it (it synchronizes the block).
template <int NT>
__device__ __forceinline__ float spark_block_theta(const float * x, int F, double q) {
    __shared__ double red1[NT / 32];
    __shared__ double red2[NT / 32];
    __shared__ int redi[NT / 32];
    __shared__ float th;
    const int tid = threadIdx.x;
    int first = F;
    for (int j = tid; j < F; j += NT) {
        if (isfinite(x[j])) { first = j; break; }
    }
    first = spark_block_first(first, redi, NT / 32);
    if (first == F) return __int_as_float(0x7f800000); // uniform across the block
    const double shift = (double)x[first];
    double s1 = 0.0, s2 = 0.0;
    int cnt = 0;
    for (int j = tid; j < F; j += NT) {
        const float xv = x[j];
        if (isfinite(xv)) {
            const double d = (double)xv - shift;
            s1 += d;
            s2 += d * d;
            cnt += 1;
        }
    }
    return spark_block_theta_of(s1, s2, cnt, shift, q, red1, red2, redi, NT / 32, &th);
}

#define SPARK_SELECT_THREADS 256
// Neurons per block of spark_ffn_select_up: 4 per warp.
#define SPARK_SELECT_NEURONS 32

// Few tokens (the fused path's decode kernels, T <= 8), threshold and up in one launch: block
// (b, t) computes token t's threshold itself (spark_block_theta; every block of the token gets
// the same value) and then, as spark_ffn_up does, u[j*T + t] = gelu(s_tj - theta_t) *
// (K2_j . h_t[r_f:]) for its 32 neurons j (exact 0 for dropped ones; dense: gelu(s_tj) * dot):
// warp w takes neurons 4w .. 4w+3 of the block, its lanes 0-3 test them and the warp computes
// the active ones' dots in order. Same products and sums as spark_ffn_threshold + spark_ffn_up,
// so u is bit-identical to theirs. theta[t] (block 0) and kept[t * gridDim.x + b] (the block's
// count of nonzero activations) are written when those pointers are not null (statistics).
// Block (0, 0) zeroes the n_done counters at `done` (spark_ffn_gather's, when it adds the
// chunks itself; n_done 0 otherwise). grid: (ceil(F / 32), T), block 256.
extern "C" __global__ void __launch_bounds__(SPARK_SELECT_THREADS)
spark_ffn_select_up(const float * s, int F, int T, int dense, double q,
                    const u8 * h, i64 h_stride, int r_f, const u8 * k2, i64 k2_stride, int k2_type, int d2,
                    float * u, float * theta, u32 * kept, u32 * done, int n_done) {
    spark_pdl_enter();
    if (blockIdx.x == 0 && blockIdx.y == 0) {
        for (int i = threadIdx.x; i < n_done; i += SPARK_SELECT_THREADS) done[i] = 0u;
    }
    __shared__ int nact[SPARK_SELECT_THREADS / 32];
    const int t = blockIdx.y, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const float * x = s + (i64)t * F;
    const float th = dense ? -__int_as_float(0x7f800000) : spark_block_theta<SPARK_SELECT_THREADS>(x, F, q);
    const int per = SPARK_SELECT_NEURONS / (SPARK_SELECT_THREADS / 32);
    const int j = blockIdx.x * SPARK_SELECT_NEURONS + warp * per + lane; // lanes < per only
    float a = 0.0f;
    if (lane < per && j < F) {
        const float v = x[j];
        a = dense ? spark_gelu_tanh(v) : (v > th ? spark_gelu_tanh(v - th) : 0.0f);
    }
    const u32 live = __ballot_sync(SPARK_FULL_MASK, a != 0.0f);
    u32 active = live;
    float val = 0.0f;
    const float * hx = (const float *)(h + (i64)t * h_stride) + r_f;
    while (active) {
        const int b = __ffs(active) - 1;
        active &= active - 1;
        const u8 * row = k2 + (i64)(blockIdx.x * SPARK_SELECT_NEURONS + warp * per + b) * k2_stride;
        const float dot = spark_row_dot(row, k2_type, hx, d2, lane);
        if (lane == b) val = a * dot;
    }
    if (lane < per && j < F) u[(i64)j * T + t] = val;
    if (kept) {
        if (lane == 0) nact[warp] = __popc(live);
        __syncthreads();
        if (threadIdx.x == 0) {
            int n = 0;
            for (int w = 0; w < SPARK_SELECT_THREADS / 32; ++w) n += nact[w];
            kept[(i64)t * gridDim.x + blockIdx.x] = (u32)n;
        }
    }
    if (theta && blockIdx.x == 0 && threadIdx.x == 0) theta[t] = th;
}

#define SPARK_GATHER_THREADS 128
// Neurons of a chunk one step of spark_ffn_gather examines (4 rounds of 128).
#define SPARK_GATHER_STAGE 512

// acc + sum over the m staged entries e, in order, of us[e] * V_{js[e]}[d], V rows of type TY
// (SPARK_UNROLL rows' loads in flight before their multiply-adds).
template <int TY>
__device__ __forceinline__ float spark_v_axpy_t(float acc, const float * us, const u32 * js, int m,
                                                const u8 * v, i64 v_stride, int d) {
    int e = 0;
    for (; e + SPARK_UNROLL <= m; e += SPARK_UNROLL) {
        float w[SPARK_UNROLL];
#pragma unroll
        for (int q = 0; q < SPARK_UNROLL; ++q) w[q] = spark_load(v + (i64)js[e + q] * v_stride, TY, d);
#pragma unroll
        for (int q = 0; q < SPARK_UNROLL; ++q) acc = fmaf(us[e + q], w[q], acc);
    }
    for (; e < m; ++e) acc = fmaf(us[e], spark_load(v + (i64)js[e] * v_stride, TY, d), acc);
    return acc;
}

__device__ __forceinline__ float spark_v_axpy(int ty, float acc, const float * us, const u32 * js, int m,
                                              const u8 * v, i64 v_stride, int d) {
    SPARK_DISPATCH_TYPE(ty, spark_v_axpy_t, acc, us, js, m, v, v_stride, d)
}

// Few tokens (the fused path, T <= 8): out[(c*T + t)*D + d] = sum over the neurons j of chunk c
// ([c*F/P, (c+1)*F/P)) with u[j*T + t] != 0, in increasing order, of u * V_j[d]: one thread per
// output value, one block per (128 columns, token, chunk). The block compacts its chunk's
// nonzero u in steps of 512 neurons (ballots, then the warps' counts in order) into shared
// memory, so each thread's loop issues only independent V loads; only active V rows are read.
// Same products in the same order as spark_ffn_v_tiled.
// With `done` (zeroed counters, one per (token, column block)), the blocks also add the chunks:
// each counts itself after writing its partial column block, and the last of a (token, column
// block)'s P chunks writes sum[t*D + d] = the P partials added in chunk order (as
// spark_ffn_sum), whichever block that is. grid: (ceil(D / 128), T, P), block 128.
extern "C" __global__ void __launch_bounds__(SPARK_GATHER_THREADS)
spark_ffn_gather(const float * u, int F, int T, int P, const u8 * v, i64 v_stride, int v_type, int D,
                 float * out, float * sum, u32 * done) {
    spark_pdl_enter();
    __shared__ float us[SPARK_GATHER_STAGE];
    __shared__ u32 js[SPARK_GATHER_STAGE];
    __shared__ int wcount[SPARK_GATHER_THREADS / 32];
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int d = blockIdx.x * SPARK_GATHER_THREADS + tid;
    const int t = blockIdx.y, c = blockIdx.z;
    const int lo = (int)((i64)c * F / P), hi = (int)((i64)(c + 1) * F / P);
    float acc = 0.0f;
    for (int j0 = lo; j0 < hi; j0 += SPARK_GATHER_STAGE) {
        int m = 0; // entries staged so far in this step (uniform)
        for (int r = 0; r < SPARK_GATHER_STAGE && j0 + r < hi; r += SPARK_GATHER_THREADS) {
            const int j = j0 + r + tid;
            const float uv = j < hi ? u[(i64)j * T + t] : 0.0f;
            const u32 mask = __ballot_sync(SPARK_FULL_MASK, uv != 0.0f);
            if (lane == 0) wcount[warp] = __popc(mask);
            __syncthreads();
            int before = m, round = 0;
            for (int w = 0; w < SPARK_GATHER_THREADS / 32; ++w) {
                if (w < warp) before += wcount[w];
                round += wcount[w];
            }
            if (uv != 0.0f) {
                const int e = before + __popc(mask & ((1u << lane) - 1u));
                js[e] = (u32)j;
                us[e] = uv;
            }
            m += round;
            __syncthreads(); // wcount is read by every thread before the next round writes it
        }
        if (d < D) acc = spark_v_axpy(v_type, acc, us, js, m, v, v_stride, d);
        __syncthreads(); // the entries are read before the next step stages its own
    }
    if (d < D) out[((i64)c * T + t) * D + d] = acc;
    if (done && spark_last_block(done + (i64)t * gridDim.x + blockIdx.x, (u32)P) && d < D) {
        const i64 plane = (i64)T * D, i = (i64)t * D + d;
        float total = __ldcg(out + i);
        for (int k = 1; k < P; ++k) total += __ldcg(out + (i64)k * plane + i);
        sum[i] = total;
    }
}

#define SPARK_TILE_T 32
#define SPARK_TILE_D 64
#define SPARK_TILE_J 32

// Many tokens: out[c*plane + t*out_row + d] = sum over neurons j of chunk c ([c*F/P, (c+1)*F/P);
// P = 1 for spark_ffn_down) in increasing order with u[j*T + t] != 0 of u * V_j[d]. A block
// computes 32 tokens x 64 columns; it stages 32 neurons' u (32 x 32) and V values (32 x 64,
// dequantized once) in shared memory per step and skips V rows that no token of the tile uses.
// Same products in the same order as spark_ffn_gather, so a token's result does not depend
// on the path or on the other tokens. grid: (ceil(D / 64), ceil(T / 32), P), block 256.
extern "C" __global__ void __launch_bounds__(256)
spark_ffn_v_tiled(const float * u, int F, int T, int P, const u8 * v, i64 v_stride, int v_type,
                  int D, float * out, i64 out_row, i64 plane) {
    spark_pdl_enter();
    __shared__ float us[SPARK_TILE_J][SPARK_TILE_T + 1];
    __shared__ float vs[SPARK_TILE_J][SPARK_TILE_D];
    __shared__ int used[SPARK_TILE_J];
    const int tid = threadIdx.x, tt = tid % 32, cg = tid / 32;
    const int d0 = blockIdx.x * SPARK_TILE_D, t0 = blockIdx.y * SPARK_TILE_T, c = blockIdx.z;
    const int lo = (int)((i64)c * F / P), hi = (int)((i64)(c + 1) * F / P);
    float acc[8];
    for (int q = 0; q < 8; ++q) acc[q] = 0.0f;
    for (int jb = lo; jb < hi; jb += SPARK_TILE_J) {
        // u tile: thread (tt, cg) loads neurons cg*4 .. cg*4+3 of token t0 + tt
        int any = 0;
        for (int r = 0; r < 4; ++r) {
            const int n = cg * 4 + r, j = jb + n, t = t0 + tt;
            const float val = (j < hi && t < T) ? u[(i64)j * T + t] : 0.0f;
            us[n][tt] = val;
            any |= val != 0.0f;
        }
        if (!__syncthreads_or(any)) continue;
        if (tid < SPARK_TILE_J) {
            int w = 0;
            for (int k = 0; k < SPARK_TILE_T; ++k) w |= us[tid][k] != 0.0f;
            used[tid] = w;
        }
        __syncthreads();
        for (int e = tid; e < SPARK_TILE_J * SPARK_TILE_D; e += 256) {
            const int n = e / SPARK_TILE_D, col = e % SPARK_TILE_D, d = d0 + col;
            vs[n][col] = (used[n] && d < D) ? spark_load(v + (i64)(jb + n) * v_stride, v_type, d) : 0.0f;
        }
        __syncthreads();
        for (int n = 0; n < SPARK_TILE_J; ++n) {
            const float uv = us[n][tt];
            if (uv != 0.0f) {
                for (int q = 0; q < 8; ++q) acc[q] = fmaf(uv, vs[n][cg * 8 + q], acc[q]);
            }
        }
        __syncthreads();
    }
    const int t = t0 + tt;
    if (t >= T) return;
    float * o = out + (i64)c * plane + (i64)t * out_row;
    for (int q = 0; q < 8; ++q) {
        const int d = d0 + cg * 8 + q;
        if (d < D) o[d] = acc[q];
    }
}

// out[t*out_row + d] = partial[0][t][d] + partial[1][t][d] + ... in chunk order.
// grid: ceil(D*T / 256), block 256.
extern "C" __global__ void __launch_bounds__(256)
spark_ffn_sum(const float * partial, int D, int T, int P, float * out, i64 out_row) {
    spark_pdl_enter();
    const i64 i = (i64)blockIdx.x * 256 + threadIdx.x;
    const i64 len = (i64)D * T;
    if (i >= len) return;
    float acc = partial[i];
    int c = 1;
    for (; c + 3 < P; c += 4) { // four loads in flight, added in chunk order
        const float p0 = partial[(i64)c * len + i], p1 = partial[(i64)(c + 1) * len + i];
        const float p2 = partial[(i64)(c + 2) * len + i], p3 = partial[(i64)(c + 3) * len + i];
        acc += p0;
        acc += p1;
        acc += p2;
        acc += p3;
    }
    for (; c < P; ++c) acc += partial[(i64)c * len + i];
    out[(i / D) * out_row + i % D] = acc;
}
