// AMX tiles in software, for running ggml's AMX code (ggml/src/ggml-cpu/amx/) on an x86-64 CPU
// that has AVX-512 VNNI but no AMX. Test-only: tools/amx-check.sh --emulate force-includes this
// header (-include) into the C++ files of a separate ggml build made with -mamx-int8; nothing
// the project ships is built with it.
//
// What ggml's AMX code uses, and what it does here (Intel SDM vol. 2, TILELOADD, TILESTORED,
// TILEZERO, TDPBSSD, LDTILECFG; the 64-byte configuration of palette 1):
//   _tile_loadconfig(cfg)      rows[t] = cfg[48 + t], colsb[t] = cfg[16 + 2t] (little endian),
//                              every tile zeroed
//   _tile_loadd(t, base, s)    row r < rows[t]: colsb[t] bytes from base + r * s; the rest zero
//   _tile_stream_loadd         the same (a cache hint only)
//   _tile_stored(t, base, s)   row r < rows[t]: colsb[t] bytes to base + r * s
//   _tile_zero(t)              every byte of the tile zero
//   _tile_dpbssd(c, a, b)      C[m][n] += sum over k < colsb[a] / 4 and i < 4 of
//                              int8 A[m][4k + i] * int8 B[k][4n + i], m < rows[c],
//                              n < colsb[c] / 4, in wrapping 32-bit arithmetic
//   _tile_release()            nothing
// and the kernel's permission request, syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, ...), which
// answers 0 (granted) here, as on an AMX machine; every other syscall goes to the kernel.
//
// The state is per thread, as the tile registers are.
#pragma once

#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

namespace spark_amx_emu {

constexpr int N_TILES = 8;
constexpr int MAX_ROWS = 16;
constexpr int MAX_COLSB = 64;

struct tiles {
    uint8_t rows[N_TILES] = {};
    uint16_t colsb[N_TILES] = {};
    alignas(64) uint8_t data[N_TILES][MAX_ROWS][MAX_COLSB] = {};
};

inline tiles & state() {
    static thread_local tiles t;
    return t;
}

inline void loadconfig(const void * config) {
    const uint8_t * c = static_cast<const uint8_t *>(config);
    tiles & s = state();
    for (int t = 0; t < N_TILES; ++t) {
        uint16_t colsb;
        std::memcpy(&colsb, c + 16 + 2 * t, sizeof colsb);
        s.rows[t] = c[48 + t] <= MAX_ROWS ? c[48 + t] : MAX_ROWS;
        s.colsb[t] = colsb <= MAX_COLSB ? colsb : MAX_COLSB;
    }
    std::memset(s.data, 0, sizeof s.data);
}

inline void loadd(int t, const void * base, long stride) {
    tiles & s = state();
    std::memset(s.data[t], 0, sizeof s.data[t]);
    for (int r = 0; r < s.rows[t]; ++r) {
        std::memcpy(s.data[t][r], static_cast<const uint8_t *>(base) + r * stride, s.colsb[t]);
    }
}

inline void stored(int t, void * base, long stride) {
    const tiles & s = state();
    for (int r = 0; r < s.rows[t]; ++r) {
        std::memcpy(static_cast<uint8_t *>(base) + r * stride, s.data[t][r], s.colsb[t]);
    }
}

inline void zero(int t) {
    std::memset(state().data[t], 0, sizeof state().data[t]);
}

inline void dpbssd(int c, int a, int b) {
    tiles & s = state();
    const int m_rows = s.rows[c];
    const int n_cols = s.colsb[c] / 4;
    const int k_quads = s.colsb[a] / 4;
    for (int m = 0; m < m_rows; ++m) {
        for (int n = 0; n < n_cols; ++n) {
            uint32_t acc;
            std::memcpy(&acc, &s.data[c][m][4 * n], sizeof acc);
            for (int k = 0; k < k_quads; ++k) {
                for (int i = 0; i < 4; ++i) {
                    const int32_t x = static_cast<int8_t>(s.data[a][m][4 * k + i]);
                    const int32_t y = static_cast<int8_t>(s.data[b][k][4 * n + i]);
                    acc += static_cast<uint32_t>(x * y);
                }
            }
            std::memcpy(&s.data[c][m][4 * n], &acc, sizeof acc);
        }
    }
}

// Before the macro below exists, so `::syscall` here is the C library's.
template <typename... Args> long syscall_or_grant(long number, Args... args) {
    if (number == SYS_arch_prctl) {
        return 0;
    }
    return ::syscall(number, args...);
}

}  // namespace spark_amx_emu

#undef _tile_loadconfig
#undef _tile_loadd
#undef _tile_stream_loadd
#undef _tile_stored
#undef _tile_zero
#undef _tile_dpbssd
#undef _tile_release
#define _tile_loadconfig(config) spark_amx_emu::loadconfig(config)
#define _tile_loadd(t, base, stride) spark_amx_emu::loadd((t), (base), (long) (stride))
#define _tile_stream_loadd(t, base, stride) spark_amx_emu::loadd((t), (base), (long) (stride))
#define _tile_stored(t, base, stride) spark_amx_emu::stored((t), (base), (long) (stride))
#define _tile_zero(t) spark_amx_emu::zero(t)
#define _tile_dpbssd(c, a, b) spark_amx_emu::dpbssd((c), (a), (b))
#define _tile_release() ((void) 0)
#define syscall(...) spark_amx_emu::syscall_or_grant(__VA_ARGS__)
