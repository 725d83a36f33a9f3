// Runs a launch sequence of src/ffn/ffn.cu on the CPU (emu.h), for tests/cuda_emu/ffn.rs.
// Compiled with the -D type macros of src/cuda/options.rs (type_macros), as NVRTC is, and
// src/cuda on the include path (ffn.cu includes "common.cuh").
//
// Job file (little-endian): u64 memory size, the memory image; u32 launch count; per launch:
// u32 kernel (its index in FfnKernel::ALL: 0 threshold, 1 up, 2 select_up, 3 gather, 4 v_tiled,
// 5 sum), u32 grid x, y, z, u32 block x, u32 argument count, per argument u32 kind (0 address
// as an offset into the image, 1 int, 2 i64, 3 double: the variants of ffn::cuda_plan::Arg) and its
// u64 bits. The kinds must match the kernel's parameter types (checked). Writes the memory
// image after the launches to the output file.
#include "job.h"
#include "../../src/ffn/ffn.cu"

#include <cstdio>
#include <cstdlib>

using job::die;
using job::take;

struct Args {
    std::vector<std::pair<unsigned, unsigned long long>> a;
    unsigned char* base;
    unsigned long long size;
    unsigned long long raw(size_t i, unsigned kind) const {
        if (i >= a.size()) die("too few arguments");
        if (a[i].first != kind) die("argument kind differs from the kernel's parameter type");
        return a[i].second;
    }
    template <class T>
    T* p(size_t i) const {
        const auto off = raw(i, 0);
        if (off == 0 || off >= size) die("address outside the image");
        return reinterpret_cast<T*>(base + off);
    }
    // an address that may be 0 (a null pointer the kernel tests)
    template <class T>
    T* p_or_null(size_t i) const {
        return raw(i, 0) == 0 ? nullptr : p<T>(i);
    }
    int i(size_t k) const { return int(raw(k, 1)); }
    long long l(size_t k) const { return (long long)raw(k, 2); }
    double f(size_t k) const { return __longlong_as_double((long long)raw(k, 3)); }
    void count(size_t n) const {
        if (a.size() != n) die("argument count differs from the kernel's");
    }
};

int main(int argc, char** argv) {
    job::Job j = job::open(argc, argv, "ffn_emu");
    std::FILE* f = j.f;
    unsigned char* base = j.base;
    const auto size = j.size;
    const auto n = take<unsigned>(f);
    for (unsigned l = 0; l < n; ++l) {
        const auto [kernel, grid, block] = job::launch(f);
        Args a{{}, base, size};
        const auto na = take<unsigned>(f);
        for (unsigned i = 0; i < na; ++i) {
            const auto kind = take<unsigned>(f);
            a.a.emplace_back(kind, take<unsigned long long>(f));
        }
        switch (kernel) {
            case 0:
                a.count(6);
                emu_run(grid, block, [&] {
                    spark_ffn_threshold(a.p<const float>(0), a.i(1), a.i(2), a.f(3), a.p<float>(4), a.p<u32>(5));
                });
                break;
            case 1:
                a.count(13);
                emu_run(grid, block, [&] {
                    spark_ffn_up(a.p<const float>(0), a.i(1), a.i(2), a.p<const float>(3), a.i(4), a.p<const u8>(5),
                                 a.l(6), a.i(7), a.p<const u8>(8), a.l(9), a.i(10), a.i(11), a.p<float>(12));
                });
                break;
            case 2:
                a.count(17);
                emu_run(grid, block, [&] {
                    spark_ffn_select_up(a.p<const float>(0), a.i(1), a.i(2), a.i(3), a.f(4), a.p<const u8>(5), a.l(6),
                                        a.i(7), a.p<const u8>(8), a.l(9), a.i(10), a.i(11), a.p<float>(12),
                                        a.p<float>(13), a.p<u32>(14), a.p_or_null<u32>(15), a.i(16));
                });
                break;
            case 3:
                a.count(11);
                emu_run(grid, block, [&] {
                    spark_ffn_gather(a.p<const float>(0), a.i(1), a.i(2), a.i(3), a.p<const u8>(4), a.l(5), a.i(6),
                                     a.i(7), a.p<float>(8), a.p_or_null<float>(9), a.p_or_null<u32>(10));
                });
                break;
            case 4:
                a.count(11);
                emu_run(grid, block, [&] {
                    spark_ffn_v_tiled(a.p<const float>(0), a.i(1), a.i(2), a.i(3), a.p<const u8>(4), a.l(5), a.i(6),
                                      a.i(7), a.p<float>(8), a.l(9), a.l(10));
                });
                break;
            case 5:
                a.count(6);
                emu_run(grid, block, [&] {
                    spark_ffn_sum(a.p<const float>(0), a.i(1), a.i(2), a.i(3), a.p<float>(4), a.l(5));
                });
                break;
            default: die("unknown kernel");
        }
    }
    job::finish(j, argv);
    return 0;
}
