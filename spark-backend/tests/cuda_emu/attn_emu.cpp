// Runs a launch sequence of src/attention/attn.cu on the CPU (emu.h), for tests/cuda_emu/main.rs.
//
// Job file (little-endian): u64 memory size, the memory image; u32 launch count; per launch:
// u32 kernel (0 scores, 1 select, 2 output, 3 select_output: AttnKernel::ALL's order), u32 grid x, y, z, u32 block x, u32 args
// size, the args bytes with the eleven address fields given as offsets into the memory image.
// Writes the memory image after the launches to the output file.
#include "job.h"
#include "../../src/attention/attn.cu"

#include <cstdio>
#include <cstdlib>

using job::die;
using job::take;

int main(int argc, char** argv) {
    job::Job j = job::open(argc, argv, "attn_emu");
    std::FILE* f = j.f;
    unsigned char* base = j.base;
    const auto size = j.size;
    const auto n = take<unsigned>(f);
    for (unsigned i = 0; i < n; ++i) {
        const auto [kernel, grid, block] = job::launch(f);
        if (take<unsigned>(f) != sizeof(SparkAttnArgs)) die("args size differs from struct SparkAttnArgs");
        SparkAttnArgs a = take<SparkAttnArgs>(f);
        unsigned long long* addr[] = {&a.q, &a.k, &a.v, &a.mask, &a.dst, &a.scores, &a.list, &a.count, &a.norm, &a.partial, &a.done};
        for (auto* p : addr) *p += reinterpret_cast<unsigned long long>(base);
        switch (kernel) {
            case 0: emu_launch(spark_attn_scores, grid, block, a); break;
            case 1: emu_launch(spark_attn_select, grid, block, a); break;
            case 2: emu_launch(spark_attn_output, grid, block, a); break;
            case 3: emu_launch(spark_attn_select_output, grid, block, a); break;
            default: die("unknown kernel");
        }
    }
    job::finish(j, argv);
    return 0;
}
