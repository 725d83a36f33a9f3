// Runs src/rope/rope.cu's one launch on the CPU (emu.h), for tests/cuda_emu/rope.rs.
//
// Job file (little-endian): u64 memory size, the memory image; u32 launch count; per launch:
// u32 kernel (0: spark_rope), u32 grid x, y, z, u32 block x, u32 args size, the args bytes
// (struct SparkRopeArgs) with the three address fields given as offsets into the memory image.
// Writes the memory image after the launches to the output file.
#include "job.h"
#include "../../src/rope/rope.cu"

using job::die;
using job::take;

int main(int argc, char** argv) {
    job::Job j = job::open(argc, argv, "rope_emu");
    std::FILE* f = j.f;
    const auto n = take<unsigned>(f);
    for (unsigned i = 0; i < n; ++i) {
        const auto [kernel, grid, block] = job::launch(f);
        if (take<unsigned>(f) != sizeof(SparkRopeArgs)) die("args size differs from struct SparkRopeArgs");
        SparkRopeArgs a = take<SparkRopeArgs>(f);
        for (auto* p : {&a.x, &a.pos, &a.dst}) {
            if (*p == 0 || *p >= j.size) die("address outside the image");
            *p += reinterpret_cast<unsigned long long>(j.base);
        }
        if (kernel != 0) die("unknown kernel");
        emu_launch(spark_rope, grid, block, a);
    }
    job::finish(j, argv);
    return 0;
}
