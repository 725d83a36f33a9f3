// A CPU emulation of the small part of CUDA C that src/attention/attn.cu and src/ffn/ffn.cu use, so that g++ can compile
// the kernel file unchanged and run it (tests/cuda_emu/main.rs). Not fast, not general:
// - one std::thread per CUDA thread of a block, blocks one after another (in order, or shuffled:
//   emu_block_order);
// - `__shared__` is static storage (one block at a time), `__syncthreads` a std::barrier;
// - warp shuffles and ballots go through a per-warp exchange buffer and a per-warp barrier, so
//   every lane of a warp must reach them together (as the kernels guarantee);
// - f16 -> f32 in software.
#pragma once
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <math.h>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define SPARK_ATTN_EMULATION 1
#define SPARK_CUDA_EMU 1
#define __launch_bounds__(...)
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

struct alignas(8) float2 {
    float x, y;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }

struct EmuDim {
    unsigned x = 1, y = 1, z = 1;
};
inline thread_local EmuDim threadIdx, blockIdx;
inline EmuDim blockDim, gridDim;

struct EmuWarp {
    std::barrier<> bar{32};
    alignas(8) unsigned char slot[32][8];
};
inline std::barrier<>* emu_block_barrier = nullptr;
inline std::vector<std::unique_ptr<EmuWarp>> emu_warps;
inline std::vector<int> emu_or_slots; // one per thread of the block, for __syncthreads_or

inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }

inline int __syncthreads_or(int p) {
    emu_or_slots[threadIdx.x] = p != 0;
    __syncthreads();
    int r = 0;
    for (int v : emu_or_slots) r |= v;
    __syncthreads(); // nobody writes a slot again before every thread has read them all
    return r;
}

template <class T>
inline T __shfl_xor_sync(unsigned, T v, int o) {
    EmuWarp& w = *emu_warps[threadIdx.x >> 5];
    const unsigned lane = threadIdx.x & 31;
    std::memcpy(w.slot[lane], &v, sizeof(T));
    w.bar.arrive_and_wait();
    T r;
    std::memcpy(&r, w.slot[lane ^ unsigned(o)], sizeof(T));
    w.bar.arrive_and_wait();
    return r;
}

inline unsigned __ballot_sync(unsigned, bool p) {
    EmuWarp& w = *emu_warps[threadIdx.x >> 5];
    const unsigned lane = threadIdx.x & 31;
    w.slot[lane][0] = p ? 1 : 0;
    w.bar.arrive_and_wait();
    unsigned b = 0;
    for (unsigned i = 0; i < 32; ++i) b |= unsigned(w.slot[i][0]) << i;
    w.bar.arrive_and_wait();
    return b;
}

// Integer atomics and fences: blocks run one after another here, so a fence orders nothing a
// real GPU could reorder; what the emulation checks is the logic around them (which block is
// last, and that the result does not depend on it: emu_block_order).
inline unsigned atomicAdd(unsigned* p, unsigned v) {
    return std::atomic_ref<unsigned>(*p).fetch_add(v);
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
// A load past the L1 cache (ld.global.cg).
inline float __ldcg(const float* p) { return *p; }

inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(unsigned x) { return __builtin_ffs(int(x)); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
inline int __float_as_int(float f) {
    int i;
    std::memcpy(&i, &f, 4);
    return i;
}
inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
// double -> float rounded toward -inf (round to nearest, then one step down when above).
inline float __double2float_rd(double x) {
    float f = float(x);
    if (!std::isnan(x) && double(f) > x) f = std::nextafterf(f, -INFINITY);
    return f;
}
inline double __longlong_as_double(long long i) {
    double d;
    std::memcpy(&d, &i, 8);
    return d;
}
inline long long __double_as_longlong(double d) {
    long long i;
    std::memcpy(&i, &d, 8);
    return i;
}

// IEEE binary16 bits -> f32 (exact, subnormals, inf and NaN included).
inline float spark_h2f(unsigned short h) {
    const unsigned sign = unsigned(h >> 15) << 31;
    const unsigned e = (h >> 10) & 0x1f, m = h & 0x3ff;
    unsigned bits;
    if (e == 0) {
        if (m == 0) {
            bits = sign;
        } else {
            // subnormal: m * 2^-24
            const float f = float(m) * 5.9604644775390625e-8f;
            std::memcpy(&bits, &f, 4);
            bits |= sign;
        }
    } else if (e == 31) {
        bits = sign | 0x7f800000u | (m << 13);
    } else {
        bits = sign | ((e + 112) << 23) | (m << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// The order the blocks of a grid run in: 0 runs them in order (x fastest, then y, then z);
// any other value a permutation of them drawn from that seed (the same for the same seed and
// grid). A kernel whose output depends on the order blocks run in (or on which runs last) gives
// different images under different seeds (tests/cuda_emu/ffn.rs runs each launch sequence twice).
inline unsigned long long emu_block_order = 0;

// The blocks of grid in the order emu_block_order says, as linear indices.
inline std::vector<unsigned long long> emu_blocks(EmuDim grid) {
    const unsigned long long n = (unsigned long long)grid.x * grid.y * grid.z;
    std::vector<unsigned long long> order(n);
    for (unsigned long long i = 0; i < n; ++i) order[i] = i;
    unsigned long long x = emu_block_order;
    for (unsigned long long i = n; x != 0 && i > 1; --i) { // Fisher-Yates, splitmix64 draws
        x += 0x9e3779b97f4a7c15ull;
        unsigned long long z = x;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        std::swap(order[i - 1], order[z % i]);
    }
    return order;
}

// Runs body() (a kernel call) as each thread of grid x block (block.y = block.z = 1), blocks one
// after another in emu_blocks' order: one std::thread per thread of a block, each running its
// part of every block, with a barrier between blocks (the next block's threads start once the
// last thread of the previous one has returned).
template <class Body>
inline void emu_run(EmuDim grid, EmuDim block, const Body& body) {
    gridDim = grid;
    blockDim = block;
    const unsigned nt = block.x;
    const std::vector<unsigned long long> order = emu_blocks(grid);
    std::barrier<> bar(nt);
    std::barrier<> between(nt);
    emu_block_barrier = &bar;
    emu_warps.clear();
    for (unsigned w = 0; w < (nt + 31) / 32; ++w) emu_warps.push_back(std::make_unique<EmuWarp>());
    emu_or_slots.assign(nt, 0);
    std::vector<std::thread> threads;
    threads.reserve(nt);
    for (unsigned t = 0; t < nt; ++t)
        threads.emplace_back([=, &body, &order, &between] {
            threadIdx = EmuDim{t, 0, 0};
            for (const unsigned long long b : order) {
                blockIdx = EmuDim{unsigned(b % grid.x), unsigned(b / grid.x % grid.y), unsigned(b / grid.x / grid.y)};
                body();
                between.arrive_and_wait();
            }
        });
    for (auto& th : threads) th.join();
}

// Runs kernel(args) over grid x block (block.y = block.z = 1), blocks in emu_blocks' order.
template <class Args>
inline void emu_launch(void (*kernel)(const Args), EmuDim grid, EmuDim block, const Args& args) {
    emu_run(grid, block, [&] { kernel(args); });
}
