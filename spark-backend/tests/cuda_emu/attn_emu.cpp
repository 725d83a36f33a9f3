// Runs a launch sequence of src/attention/attn.cu on the CPU (emu.h), for tests/cuda_emu/main.rs.
//
// Job file (little-endian): u64 memory size, the memory image; u32 launch count; per launch:
// u32 kernel (0 scores, 1 select, 2 output, 3 reduce), u32 grid x, y, z, u32 block x, u32 args
// size, the args bytes with the ten address fields given as offsets into the memory image.
// Writes the memory image after the launches to the output file.
#include "emu.h"
#include "../../src/attention/attn.cu"

#include <cstdio>
#include <cstdlib>

static void die(const char* m) {
    std::fprintf(stderr, "attn_emu: %s\n", m);
    std::exit(2);
}

template <class T>
static T take(std::FILE* f) {
    T v;
    if (std::fread(&v, sizeof v, 1, f) != 1) die("short job file");
    return v;
}

int main(int argc, char** argv) {
    if (argc != 3) die("usage: attn_emu JOB OUT");
    std::FILE* f = std::fopen(argv[1], "rb");
    if (!f) die("cannot open job");
    const auto size = take<unsigned long long>(f);
    std::vector<unsigned char> mem(size + 64);
    // 64-byte aligned base, as device allocations are (at least) 256-byte aligned.
    unsigned char* base = mem.data() + (64 - (reinterpret_cast<uintptr_t>(mem.data()) % 64)) % 64;
    if (size && std::fread(base, 1, size, f) != size) die("short memory image");
    const auto n = take<unsigned>(f);
    for (unsigned i = 0; i < n; ++i) {
        const auto kernel = take<unsigned>(f);
        EmuDim grid{take<unsigned>(f), take<unsigned>(f), take<unsigned>(f)};
        EmuDim block{take<unsigned>(f), 1, 1};
        if (take<unsigned>(f) != sizeof(SparkAttnArgs)) die("args size differs from struct SparkAttnArgs");
        SparkAttnArgs a = take<SparkAttnArgs>(f);
        unsigned long long* addr[] = {&a.q, &a.k, &a.v, &a.mask, &a.dst, &a.scores, &a.list, &a.count, &a.norm, &a.partial};
        for (auto* p : addr) *p += reinterpret_cast<unsigned long long>(base);
        switch (kernel) {
            case 0: emu_launch(spark_attn_scores, grid, block, a); break;
            case 1: emu_launch(spark_attn_select, grid, block, a); break;
            case 2: emu_launch(spark_attn_output, grid, block, a); break;
            case 3: emu_launch(spark_attn_reduce, grid, block, a); break;
            default: die("unknown kernel");
        }
    }
    std::fclose(f);
    std::FILE* o = std::fopen(argv[2], "wb");
    if (!o || std::fwrite(base, 1, size, o) != size) die("cannot write output");
    std::fclose(o);
    return 0;
}
