// The job files of the CUDA emulators (attn_emu.cpp, ffn_emu.cpp), read the same way by both:
// little-endian, u64 memory size, the memory image; u32 launch count; per launch u32 kernel,
// u32 grid x, y, z, u32 block x, then the arguments in the emulator's own encoding. After the
// launches the emulator writes the memory image to its output file.
#pragma once

#include "emu.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace job {

// The emulator's name, for its error lines.
inline const char* program = "emu";

[[noreturn]] inline void die(const char* m) {
    std::fprintf(stderr, "%s: %s\n", program, m);
    std::exit(2);
}

template <class T>
T take(std::FILE* f) {
    T v;
    if (std::fread(&v, sizeof v, 1, f) != 1) die("short job file");
    return v;
}

// The memory image of a job (`base`: 64-byte aligned, as device allocations are at least
// 256-byte aligned) and the file, positioned at the launch count.
struct Job {
    std::FILE* f = nullptr;
    std::vector<unsigned char> mem;
    unsigned char* base = nullptr;
    unsigned long long size = 0;
};

// Opens argv[1] (`name JOB OUT [ORDER]` is the usage; ORDER, a decimal seed, sets
// emu_block_order) and reads its memory image.
inline Job open(int argc, char** argv, const char* name) {
    program = name;
    if (argc != 3 && argc != 4) {
        std::fprintf(stderr, "usage: %s JOB OUT [ORDER]\n", name);
        std::exit(2);
    }
    if (argc == 4) {
        char* end = nullptr;
        emu_block_order = std::strtoull(argv[3], &end, 10);
        if (end == argv[3] || *end != 0) die("ORDER is not a decimal number");
    }
    Job j;
    j.f = std::fopen(argv[1], "rb");
    if (!j.f) die("cannot open job");
    j.size = take<unsigned long long>(j.f);
    j.mem.resize(j.size + 64);
    j.base = j.mem.data() + (64 - (reinterpret_cast<uintptr_t>(j.mem.data()) % 64)) % 64;
    if (j.size && std::fread(j.base, 1, j.size, j.f) != j.size) die("short memory image");
    return j;
}

// The start of one launch: which kernel, and its grid and block.
struct Launch {
    unsigned kernel;
    EmuDim grid;
    EmuDim block;
};

inline Launch launch(std::FILE* f) {
    const auto kernel = take<unsigned>(f);
    EmuDim grid{take<unsigned>(f), take<unsigned>(f), take<unsigned>(f)};
    EmuDim block{take<unsigned>(f), 1, 1};
    return {kernel, grid, block};
}

// Closes the job and writes its memory image to argv[2].
inline void finish(Job& j, char** argv) {
    std::fclose(j.f);
    std::FILE* o = std::fopen(argv[2], "wb");
    if (!o || std::fwrite(j.base, 1, j.size, o) != j.size) die("cannot write output");
    std::fclose(o);
}

}  // namespace job
