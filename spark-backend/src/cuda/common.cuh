// Shared device code of the Spark CUDA kernels: fixed-width integer names, f16/bf16 conversion
// without the CUDA headers (NVRTC compiles this with no include path), ggml's weight block
// layouts (checked against the -D macros the host computes from ggml: SPARK_T_*, SPARK_BLCK_*,
// SPARK_SIZE_*, see src/cuda/options.rs), one-element dequantization, and deterministic warp
// and block reductions (fixed trees, no atomics).
#pragma once

typedef signed char s8;
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

#if !defined(SPARK_T_F32) || !defined(SPARK_BLCK_Q8_0) || !defined(SPARK_SIZE_Q6_K)
#error "compile with the -D macros of spark-backend/src/cuda/options.rs (nvrtc_options)"
#endif

#define SPARK_FULL_MASK 0xffffffffu

__device__ __forceinline__ float spark_f16(u16 h) {
#ifdef SPARK_CUDA_EMU
    return spark_h2f(h); // tests/cuda_emu/emu.h: host emulation only, never defined by NVRTC
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#endif
}

__device__ __forceinline__ float spark_bf16(u16 b) {
    return __uint_as_float(((u32)b) << 16);
}

// ggml-common.h block layouts (QK_K = 256, K_SCALE_SIZE = 12). Half values are stored as u16.
struct block_q8_0 { u16 d; s8 qs[32]; };
struct block_q4_0 { u16 d; u8 qs[16]; };
struct block_q4_1 { u16 d; u16 m; u8 qs[16]; };
struct block_q5_0 { u16 d; u8 qh[4]; u8 qs[16]; };
struct block_q5_1 { u16 d; u16 m; u8 qh[4]; u8 qs[16]; };
struct block_q4_K { u16 d; u16 dmin; u8 scales[12]; u8 qs[128]; };
struct block_q5_K { u16 d; u16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; };
struct block_q6_K { u8 ql[128]; u8 qh[64]; s8 scales[16]; u16 d; };

static_assert(SPARK_BLCK_F32 == 1 && SPARK_SIZE_F32 == 4, "f32 layout");
static_assert(SPARK_BLCK_F16 == 1 && SPARK_SIZE_F16 == 2, "f16 layout");
static_assert(SPARK_BLCK_BF16 == 1 && SPARK_SIZE_BF16 == 2, "bf16 layout");
static_assert(SPARK_BLCK_Q8_0 == 32 && sizeof(block_q8_0) == SPARK_SIZE_Q8_0, "q8_0 layout");
static_assert(SPARK_BLCK_Q4_0 == 32 && sizeof(block_q4_0) == SPARK_SIZE_Q4_0, "q4_0 layout");
static_assert(SPARK_BLCK_Q4_1 == 32 && sizeof(block_q4_1) == SPARK_SIZE_Q4_1, "q4_1 layout");
static_assert(SPARK_BLCK_Q5_0 == 32 && sizeof(block_q5_0) == SPARK_SIZE_Q5_0, "q5_0 layout");
static_assert(SPARK_BLCK_Q5_1 == 32 && sizeof(block_q5_1) == SPARK_SIZE_Q5_1, "q5_1 layout");
static_assert(SPARK_BLCK_Q4_K == 256 && sizeof(block_q4_K) == SPARK_SIZE_Q4_K, "q4_K layout");
static_assert(SPARK_BLCK_Q5_K == 256 && sizeof(block_q5_K) == SPARK_SIZE_Q5_K, "q5_K layout");
static_assert(SPARK_BLCK_Q6_K == 256 && sizeof(block_q6_K) == SPARK_SIZE_Q6_K, "q6_K layout");

// ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j (0..7) of a q4_K/q5_K block.
__device__ __forceinline__ void spark_scale_min_k4(int j, const u8 * q, float & sc, float & m) {
    if (j < 4) {
        sc = (float)(q[j] & 63);
        m = (float)(q[j + 4] & 63);
    } else {
        sc = (float)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        m = (float)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

// Value i of a row of ggml type `ty` starting at `row` (as ggml's dequantize_row_* computes it).
__device__ __forceinline__ float spark_load(const u8 * row, int ty, int i) {
    switch (ty) {
    case SPARK_T_F32:
        return ((const float *)row)[i];
    case SPARK_T_F16:
        return spark_f16(((const u16 *)row)[i]);
    case SPARK_T_BF16:
        return spark_bf16(((const u16 *)row)[i]);
    case SPARK_T_Q8_0: {
        const block_q8_0 * b = (const block_q8_0 *)row + i / 32;
        return (float)b->qs[i % 32] * spark_f16(b->d);
    }
    case SPARK_T_Q4_0: {
        const block_q4_0 * b = (const block_q4_0 *)row + i / 32;
        const int j = i % 32;
        const int q = j < 16 ? (b->qs[j] & 0xF) : (b->qs[j - 16] >> 4);
        return (float)(q - 8) * spark_f16(b->d);
    }
    case SPARK_T_Q4_1: {
        const block_q4_1 * b = (const block_q4_1 *)row + i / 32;
        const int j = i % 32;
        const int q = j < 16 ? (b->qs[j] & 0xF) : (b->qs[j - 16] >> 4);
        return (float)q * spark_f16(b->d) + spark_f16(b->m);
    }
    case SPARK_T_Q5_0: {
        const block_q5_0 * b = (const block_q5_0 *)row + i / 32;
        const u32 qh = (u32)b->qh[0] | ((u32)b->qh[1] << 8) | ((u32)b->qh[2] << 16) | ((u32)b->qh[3] << 24);
        const int j = i % 32;
        int q;
        if (j < 16) {
            q = (int)((b->qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10));
        } else {
            q = (int)((b->qs[j - 16] >> 4) | ((qh >> (j - 16 + 12)) & 0x10));
        }
        return (float)(q - 16) * spark_f16(b->d);
    }
    case SPARK_T_Q5_1: {
        const block_q5_1 * b = (const block_q5_1 *)row + i / 32;
        const u32 qh = (u32)b->qh[0] | ((u32)b->qh[1] << 8) | ((u32)b->qh[2] << 16) | ((u32)b->qh[3] << 24);
        const int j = i % 32;
        int q;
        if (j < 16) {
            q = (int)((b->qs[j] & 0x0F) | (((qh >> j) << 4) & 0x10));
        } else {
            q = (int)((b->qs[j - 16] >> 4) | ((qh >> (j - 16 + 12)) & 0x10));
        }
        return (float)q * spark_f16(b->d) + spark_f16(b->m);
    }
    case SPARK_T_Q4_K: {
        const block_q4_K * b = (const block_q4_K *)row + i / 256;
        const int e = i % 256, g = e / 64, hi = (e % 64) >= 32, l = e % 32;
        float sc, m;
        spark_scale_min_k4(2 * g + hi, b->scales, sc, m);
        const u8 q = b->qs[32 * g + l];
        const float d1 = spark_f16(b->d) * sc, m1 = spark_f16(b->dmin) * m;
        return d1 * (float)(hi ? (q >> 4) : (q & 0xF)) - m1;
    }
    case SPARK_T_Q5_K: {
        const block_q5_K * b = (const block_q5_K *)row + i / 256;
        const int e = i % 256, g = e / 64, hi = (e % 64) >= 32, l = e % 32;
        float sc, m;
        spark_scale_min_k4(2 * g + hi, b->scales, sc, m);
        const u8 q = b->qs[32 * g + l];
        const int bit = (b->qh[l] >> (2 * g + hi)) & 1;
        const float d1 = spark_f16(b->d) * sc, m1 = spark_f16(b->dmin) * m;
        return d1 * (float)((hi ? (q >> 4) : (q & 0xF)) + 16 * bit) - m1;
    }
    case SPARK_T_Q6_K: {
        const block_q6_K * b = (const block_q6_K *)row + i / 256;
        const int e = i % 256, n = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
        const u8 * ql = b->ql + 64 * n;
        const u8 * qh = b->qh + 32 * n;
        const s8 * sc = b->scales + 8 * n;
        const u8 lo = (quarter & 1) ? ql[l + 32] : ql[l];
        const int nib = (quarter & 2) ? (lo >> 4) : (lo & 0xF);
        const int q = (int)(s8)(nib | (((qh[l] >> (2 * quarter)) & 3) << 4)) - 32;
        return spark_f16(b->d) * (float)sc[l / 16 + 2 * quarter] * (float)q;
    }
    default:
        return __int_as_float(0x7fc00000); // NaN: the host validates types before launching
    }
}

// Sum over the 32 lanes by a butterfly: every lane ends with the same value (each level adds
// a + b on one lane and b + a on its partner, which are equal), in a fixed order.
__device__ __forceinline__ float spark_warp_sum(float v) {
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(SPARK_FULL_MASK, v, m);
    return v;
}

__device__ __forceinline__ double spark_warp_sum_f64(double v) {
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(SPARK_FULL_MASK, v, m);
    return v;
}

// Calls F<SPARK_T_x>(args...) for the runtime type `ty` (every type spark_load knows), so that
// a loop over one row type is straight-line code the compiler can schedule: loads of several
// elements issued before the first of them is used, instead of one memory latency per element.
// Unknown types take F<-1>, whose spark_load returns NaN (the host validates types).
#define SPARK_DISPATCH_TYPE(ty, F, ...)                                              \
    switch (ty) {                                                                    \
    case SPARK_T_F32: return F<SPARK_T_F32>(__VA_ARGS__);                            \
    case SPARK_T_F16: return F<SPARK_T_F16>(__VA_ARGS__);                            \
    case SPARK_T_BF16: return F<SPARK_T_BF16>(__VA_ARGS__);                          \
    case SPARK_T_Q8_0: return F<SPARK_T_Q8_0>(__VA_ARGS__);                          \
    case SPARK_T_Q4_0: return F<SPARK_T_Q4_0>(__VA_ARGS__);                          \
    case SPARK_T_Q4_1: return F<SPARK_T_Q4_1>(__VA_ARGS__);                          \
    case SPARK_T_Q5_0: return F<SPARK_T_Q5_0>(__VA_ARGS__);                          \
    case SPARK_T_Q5_1: return F<SPARK_T_Q5_1>(__VA_ARGS__);                          \
    case SPARK_T_Q4_K: return F<SPARK_T_Q4_K>(__VA_ARGS__);                          \
    case SPARK_T_Q5_K: return F<SPARK_T_Q5_K>(__VA_ARGS__);                          \
    case SPARK_T_Q6_K: return F<SPARK_T_Q6_K>(__VA_ARGS__);                          \
    default: return F<-1>(__VA_ARGS__);                                              \
    }

// Elements in flight per thread in the unrolled loops below.
#define SPARK_UNROLL 8

// row . x over n values of a row of type TY: lane l takes values l, l + 32, ... and adds their
// products in that order (SPARK_UNROLL loads in flight), then spark_warp_sum.
template <int TY>
__device__ __forceinline__ float spark_row_dot_t(const u8 * row, const float * x, int n, int lane) {
    float acc = 0.0f;
    int i = lane;
    for (; i + (SPARK_UNROLL - 1) * 32 < n; i += SPARK_UNROLL * 32) {
        float w[SPARK_UNROLL], xv[SPARK_UNROLL];
#pragma unroll
        for (int q = 0; q < SPARK_UNROLL; ++q) {
            w[q] = spark_load(row, TY, i + 32 * q);
            xv[q] = x[i + 32 * q];
        }
#pragma unroll
        for (int q = 0; q < SPARK_UNROLL; ++q) acc = fmaf(w[q], xv[q], acc);
    }
    for (; i < n; i += 32) acc = fmaf(spark_load(row, TY, i), x[i], acc);
    return spark_warp_sum(acc);
}

// row . x over n values (every lane returns the same value); spark_row_dot_t for type `ty`.
__device__ __forceinline__ float spark_row_dot(const u8 * row, int ty, const float * x, int n, int lane) {
    SPARK_DISPATCH_TYPE(ty, spark_row_dot_t, row, x, n, lane)
}

// Programmatic dependent launch (compute capability 9.0 and up, where the launchers set the
// attribute: cuda::launch): waits until the kernel before this one on the stream has finished
// and its writes are visible, then lets the kernel after this one start launching (it waits
// the same way before it reads anything). The first statement of every Spark kernel: nothing
// before it reads memory. Compiles to nothing below sm_90 and in the CPU emulation.
__device__ __forceinline__ void spark_pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// Whether this block is the last of n blocks that count themselves at *counter (same answer in
// every thread of the block; every thread must call it): the block's writes are made visible
// device-wide (fence) before it is counted, and the last block's fence orders its reads of the
// others' writes (read them with __ldcg, past the L1) after the count. Integer atomics only.
__device__ __forceinline__ bool spark_last_block(u32 * counter, u32 n) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(counter, 1u) == n - 1u;
    __syncthreads();
    if (last) __threadfence();
    return last != 0;
}

// gelu_tanh as spark-backend's ffn::gelu_tanh: gelu(-inf) = 0, NaN stays NaN.
__device__ __forceinline__ float spark_gelu_tanh(float x) {
    if (x == -__int_as_float(0x7f800000)) return 0.0f;
    // 0.5 x (1 + tanh y) computed as x / (1 + exp(-2y)), as the CPU's ffn::gelu_tanh does: the
    // same function, one expf, and no cancellation in 1 + tanh y for negative y.
    const float two_c = 2.0f * 0.7978846f; // 2 sqrt(2/pi)
    const float y2 = two_c * (x + 0.044715f * x * x * x);
    return x / (1.0f + expf(-y2));
}
