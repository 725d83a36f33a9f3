// spark_rope on the GPU (src/rope/mod.rs has the math and the CPU op): one block per row (one
// head of one token), each thread a pair of channels of one of the head's two parts, the
// exact f32 operations of rope_head. The host side is src/rope/cuda_plan.rs; `struct
// SparkRopeArgs` below is `RopeArgs` there (same field order, C layout, passed by value).
// Compiled by NVRTC with no headers beyond common.cuh; powf, cosf and sinf are NVRTC's
// built-in device functions.
#include "common.cuh"

#define SPARK_ROPE_THREADS 128

struct SparkRopeArgs {
    // Device addresses: x [H, n_head, n_tokens] (rows of H contiguous f32), pos i32 [n_tokens],
    // dst [H, n_head, n_tokens] contiguous f32.
    unsigned long long x, pos, dst;
    // Element strides of x between heads and between tokens.
    long long x_head, x_token;
    int head_dim, n_head, r, reserved;
    float freq_base, freq_scale, scale, reserved_f;
};

// grid (n_head * n_tokens), block SPARK_ROPE_THREADS.
extern "C" __global__ void __launch_bounds__(SPARK_ROPE_THREADS) spark_rope(const SparkRopeArgs a) {
    spark_pdl_enter();
    const int row = blockIdx.x;
    const int n = row % a.n_head, t = row / a.n_head;
    const float * x = (const float *) a.x + t * a.x_token + n * a.x_head;
    float * y = (float *) a.dst + (long long) row * a.head_dim;
    const float p = (float) ((const int *) a.pos)[t];
    const int half_r = a.r / 2;
    for (int k = threadIdx.x; k < a.head_dim / 2; k += blockDim.x) {
        const bool first = k < half_r;
        const int width = first ? a.r : a.head_dim - a.r;
        const int offset = first ? 0 : a.r;
        const int i = first ? k : k - half_r;
        const int half = width / 2;
        const float theta_scale = powf(a.freq_base, -2.0f / (float) width);
        const float theta = a.freq_scale * (p * powf(theta_scale, (float) i));
        const float c = cosf(theta) * a.scale, s = sinf(theta) * a.scale;
        const float x0 = x[offset + i], x1 = x[offset + i + half];
        y[offset + i] = x0 * c - x1 * s;
        y[offset + i + half] = x0 * s + x1 * c;
    }
}
