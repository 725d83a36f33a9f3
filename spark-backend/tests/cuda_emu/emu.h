// A CPU emulation of the small part of CUDA C that src/attention/attn.cu and src/ffn/ffn.cu use, so that g++ can compile
// the kernel file unchanged and run it (tests/cuda_emu/main.rs). Not fast, not general:
// - one fiber (ucontext) per CUDA thread of a block, all on the calling OS thread: a thread
//   runs until it reaches a barrier or returns, then the next one runs (round robin); blocks one
//   after another (in order, or shuffled: emu_block_order);
// - `__shared__` is static storage (one block at a time), `__syncthreads` a barrier of the
//   block's fibers;
// - warp shuffles and ballots go through a per-warp exchange buffer and a per-warp barrier, so
//   every lane of a warp must reach them together (as the kernels guarantee);
// - f16 -> f32 in software.
#pragma once
#include <algorithm>
#include <atomic>
#include <cmath>
#include <math.h>
#include <cstdint>
#include <cstring>
#include <memory>
#include <setjmp.h>
#include <ucontext.h>
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
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};

struct EmuDim {
    unsigned x = 1, y = 1, z = 1;
};
inline EmuDim threadIdx, blockIdx; // of the fiber running now
inline EmuDim blockDim, gridDim;

// The fibers of the block running now. A fiber starts on its own stack from its ucontext (one
// setcontext) and from then on switches with _setjmp/_longjmp, which unlike swapcontext save
// no signal mask (no system call per switch): the scheduler's resume point, each fiber's,
// whether it has started and returned, and the one running.
struct EmuJmp {
    jmp_buf b;
};
inline EmuJmp emu_scheduler;
inline std::vector<EmuJmp> emu_resume;
inline std::vector<ucontext_t> emu_contexts;
inline std::vector<char> emu_started, emu_returned;
inline unsigned emu_current = 0;

// Hands the OS thread back to the scheduler, which resumes this fiber after every other
// runnable one has had its turn.
inline void emu_yield() {
    if (!_setjmp(emu_resume[emu_current].b)) _longjmp(emu_scheduler.b, 1);
}

// A barrier of n fibers: the last to arrive starts the next generation and goes on; the others
// yield until the generation changes.
struct EmuBarrier {
    unsigned n, count = 0;
    unsigned long long generation = 0;
    explicit EmuBarrier(unsigned n) : n(n) {}
    void arrive_and_wait() {
        const unsigned long long g = generation;
        if (++count == n) {
            count = 0;
            ++generation;
            return;
        }
        while (generation == g) emu_yield();
    }
};

struct EmuWarp {
    EmuBarrier bar{32};
    alignas(8) unsigned char slot[32][8];
};
inline EmuBarrier* emu_block_barrier = nullptr;
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

// The body the fibers of emu_run call, type-erased for makecontext.
inline void (*emu_body_fn)(const void*) = nullptr;
inline const void* emu_body_arg = nullptr;
inline void emu_fiber_main() {
    emu_body_fn(emu_body_arg);
    emu_returned[emu_current] = 1;
    _longjmp(emu_scheduler.b, 1); // never returns: the context has no uc_link
}

// Runs body() (a kernel call) as each thread of grid x block (block.y = block.z = 1), blocks one
// after another in emu_blocks' order: per block, one fiber per thread, run round robin until
// every one has returned.
template <class Body>
inline void emu_run(EmuDim grid, EmuDim block, const Body& body) {
    constexpr size_t STACK = 256 << 10;
    gridDim = grid;
    blockDim = block;
    const unsigned nt = block.x;
    const std::vector<unsigned long long> order = emu_blocks(grid);
    EmuBarrier bar(nt);
    emu_block_barrier = &bar;
    emu_warps.clear();
    for (unsigned w = 0; w < (nt + 31) / 32; ++w) emu_warps.push_back(std::make_unique<EmuWarp>());
    emu_or_slots.assign(nt, 0);
    emu_contexts.assign(nt, ucontext_t{});
    emu_resume.assign(nt, EmuJmp{});
    emu_started.assign(nt, 0);
    emu_returned.assign(nt, 0);
    std::unique_ptr<char[]> stacks(new char[STACK * nt]); // pages untouched until used
    emu_body_fn = [](const void* b) { (*static_cast<const Body*>(b))(); };
    emu_body_arg = &body;
    for (const unsigned long long b : order) {
        blockIdx = EmuDim{unsigned(b % grid.x), unsigned(b / grid.x % grid.y), unsigned(b / grid.x / grid.y)};
        for (unsigned t = 0; t < nt; ++t) {
            ucontext_t& c = emu_contexts[t];
            getcontext(&c);
            c.uc_stack.ss_sp = stacks.get() + STACK * t;
            c.uc_stack.ss_size = STACK;
            c.uc_link = nullptr;
            makecontext(&c, emu_fiber_main, 0);
            emu_started[t] = 0;
            emu_returned[t] = 0;
        }
        // (volatile: the loop's state lives across _setjmp's second return)
        for (volatile unsigned left = nt; left > 0;) {
            for (volatile unsigned t = 0; t < nt; t = t + 1) {
                if (emu_returned[t]) continue;
                emu_current = t;
                threadIdx = EmuDim{t, 0, 0};
                if (!_setjmp(emu_scheduler.b)) {
                    if (!emu_started[t]) {
                        emu_started[t] = 1;
                        setcontext(&emu_contexts[t]);
                    }
                    _longjmp(emu_resume[t].b, 1);
                }
                if (emu_returned[t]) left = left - 1;
            }
        }
    }
}

// Runs kernel(args) over grid x block (block.y = block.z = 1), blocks in emu_blocks' order.
template <class Args>
inline void emu_launch(void (*kernel)(const Args), EmuDim grid, EmuDim block, const Args& args) {
    emu_run(grid, block, [&] { kernel(args); });
}
