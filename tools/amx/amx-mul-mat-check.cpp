// ggml's AMX matrix products against its plain CPU ones, one weight shape and type at a time.
//
// For each case (a weight of type T and shape {K, N, ne2, ne3}, an f32 input of `rows` rows per
// batch) it does what llama.cpp's loader does with a weight: asks the CPU device whether the
// AMX buffer type takes GGML_OP_MUL_MAT for that weight (`weight_buft_supported` in
// src/llama-model-loader.cpp: a probe input of 512 rows and the weight's batch dims). Where it
// does, the weight goes into an AMX buffer (ggml_backend_tensor_set: the AMX buffer packs it) and
// into a plain CPU buffer, the same graph runs on the CPU backend over both, and the two outputs
// are compared with each other and with a float64 product of the dequantized weight (ggml's
// to_float) and the input. Where the AMX buffer type refuses, llama.cpp keeps the weight out of
// it, and the case is reported as refused (nothing to compare).
//
// Pass: AMX and plain agree to max |amx - plain| / rms(f64) <= 1e-3 (both quantize the input to
// the same dot type, so only the float sum order differs: ~1e-6 seen) and, for f16 weights,
// <= 1e-2 (the AMX f16 kernel multiplies f32 inputs, the plain one f16-rounded inputs: ~1e-3);
// a wrong kernel gives O(1), inf or NaN.
//
// Usage: amx-mul-mat-check [--threads N] [--rows R,R,...] [--types T,T,...] [--buffer-type NAME]
//                          [--zeros P] [--full-n] [CASE...] [--gguf FILE]...
//   CASE      K,N[,NE2[,NE3]][:B]  a weight shape; :B gives the input B batches against a 2-D
//             weight (broadcast, as ggml_mul_mat allows); types whose block does not divide K
//             are left out
//   --gguf    every tensor of FILE with ne[0] a multiple of 32 and two or more dims, of one of
//             --types, in the file's type, as a case (N shortened: see below)
//   (none)    the built-in cases: every kernel path of ggml-cpu/amx/mmq.cpp (one K block and many;
//             N a multiple of 32 and of 64; 2-D, 3-D and 4-D weights; batched inputs)
//   --buffer-type  the extra buffer type to check (default AMX; CPU_REPACK for the repacked
//             SIMD layouts)
//   --zeros   the share of the input's values that are exactly 0 (default 0)
//   --full-n  no shortening of N
// N above 256 is shortened to 192 + N % 64: the kernels tile N in blocks of 32 (64 for one row)
// and each block is independent, so only N modulo 64 and the number of blocks > 2 matter.
// Default rows: 1 (the one-row VNNI path), 17 (a partial tile), 32 (one 2 x 2 tile block), 100.
//
// Exit status: 0 every case agrees (or was refused), 1 a case disagrees or crashed, 2 usage
// error, 77 this ggml build or CPU has no such buffer type (a skip: it says why).
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "gguf.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace {

struct weight_case {
    ggml_type type;
    int64_t ne[4];     // the weight's shape
    int64_t batches;   // the input's ne2 (>= the weight's ne2)
    std::string from;  // where the case came from: "built-in" or a tensor's name
};

struct outcome {
    bool taken = false;      // the AMX buffer type takes the weight
    int signal = 0;          // the signal that ended the product's process (0: it finished)
    double amx_vs_plain = 0; // max |amx - plain| / rms(f64)
    double amx_vs_f64 = 0;   // max |amx - f64| / rms(f64)
    double plain_vs_f64 = 0; // max |plain - f64| / rms(f64)
};

[[noreturn]] void usage(const char * msg) {
    std::fprintf(stderr, "amx-mul-mat-check: %s\n", msg);
    std::fprintf(stderr, "usage: amx-mul-mat-check [--threads N] [--rows R,R,...] [--types T,T,...] "
                         "[--buffer-type NAME] [--zeros P] [--full-n] [K,N[,NE2[,NE3]][:B]...] "
                         "[--gguf FILE]...\n");
    std::exit(2);
}

std::vector<std::string> split(const std::string & s, char sep) {
    std::vector<std::string> out;
    size_t start = 0;
    while (true) {
        size_t end = s.find(sep, start);
        out.push_back(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
        if (end == std::string::npos) {
            return out;
        }
        start = end + 1;
    }
}

int64_t parse_int(const std::string & s, const char * what) {
    char * end = nullptr;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || v <= 0) {
        usage((std::string("not a positive number for ") + what + ": '" + s + "'").c_str());
    }
    return v;
}

ggml_type parse_type(const std::string & name) {
    for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
        const char * n = ggml_type_name((ggml_type) t);
        if (n && ggml_get_type_traits((ggml_type) t)->blck_size > 0 && strcasecmp(n, name.c_str()) == 0) {
            return (ggml_type) t;
        }
    }
    usage(("unknown ggml type '" + name + "'").c_str());
}

bool g_full_n = false;  // --full-n: no shortening

int64_t shortened_n(int64_t n) {
    return n > 256 && !g_full_n ? 192 + n % 64 : n;
}

// The types ggml-cpu/amx has kernels for (qtype_has_amx_kernels, and f16).
const ggml_type AMX_TYPES[] = {GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q8_0, GGML_TYPE_Q4_K,
                               GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_XS, GGML_TYPE_F16};

std::vector<weight_case> builtin_cases(const std::vector<ggml_type> & types) {
    // {K, N, ne2, ne3, input batches}
    const int64_t shapes[][5] = {
        {32, 64, 1, 1, 1},    // one K block (patch 0010)
        {256, 96, 1, 1, 1},   // N % 64 == 32
        {512, 128, 1, 1, 1},
        {256, 64, 3, 1, 3},   // a 3-D weight, as Gemma 3n's altup_proj {n_embd, n_embd, 3}
        {256, 64, 1, 1, 3},   // a 2-D weight against 3 input batches
        {256, 64, 2, 2, 2},   // a 4-D weight
    };
    std::vector<weight_case> out;
    for (ggml_type t : types) {
        for (const auto & s : shapes) {
            if (s[0] % ggml_blck_size(t)) {
                continue;
            }
            out.push_back({t, {s[0], s[1], s[2], s[3]}, s[4], "built-in"});
        }
    }
    return out;
}

void add_gguf_cases(const char * path, const std::vector<ggml_type> & types, std::vector<weight_case> & out) {
    gguf_init_params params = {/*no_alloc =*/true, /*ctx =*/nullptr};
    ggml_context * meta = nullptr;
    params.ctx = &meta;
    gguf_context * g = gguf_init_from_file(path, params);
    if (!g) {
        std::fprintf(stderr, "amx-mul-mat-check: cannot read '%s' as a GGUF file\n", path);
        std::exit(2);
    }
    std::set<std::tuple<int, int64_t, int64_t, int64_t, int64_t>> seen;
    for (ggml_tensor * t = ggml_get_first_tensor(meta); t; t = ggml_get_next_tensor(meta, t)) {
        if (ggml_n_dims(t) < 2 || t->ne[0] % 32 || ggml_get_type_traits(t->type)->to_float == nullptr) {
            continue;
        }
        if (std::find(types.begin(), types.end(), t->type) == types.end()) {
            continue;
        }
        const int64_t n = shortened_n(t->ne[1]);
        if (!seen.insert({t->type, t->ne[0], n, t->ne[2], t->ne[3]}).second) {
            continue;
        }
        out.push_back({t->type, {t->ne[0], n, t->ne[2], t->ne[3]}, t->ne[2], t->name});
    }
    gguf_free(g);
    ggml_free(meta);
}

// Normal values with std 1/sqrt(k) in the weight's type (quantized by ggml itself).
std::vector<uint8_t> random_weight(const ggml_tensor * w, std::mt19937 & rng) {
    const int64_t k = w->ne[0];
    const int64_t nrows = ggml_nrows(w);
    std::normal_distribution<float> dist(0.0f, 1.0f / std::sqrt((float) k));
    std::vector<float> f(k * nrows);
    for (float & v : f) {
        v = dist(rng);
    }
    std::vector<uint8_t> bytes(ggml_nbytes(w));
    if (w->type == GGML_TYPE_F32) {
        std::memcpy(bytes.data(), f.data(), bytes.size());
    } else if (w->type == GGML_TYPE_F16) {
        ggml_fp32_to_fp16_row(f.data(), (ggml_fp16_t *) bytes.data(), (int64_t) f.size());
    } else {
        ggml_quantize_chunk(w->type, f.data(), bytes.data(), 0, nrows, k, nullptr);
    }
    return bytes;
}

struct graph_run {
    ggml_context * ctx = nullptr;
    ggml_backend_buffer_t w_buf = nullptr;
    ggml_backend_buffer_t x_buf = nullptr;
    ~graph_run() {
        ggml_backend_buffer_free(w_buf);
        ggml_backend_buffer_free(x_buf);
        ggml_free(ctx);
    }
};

// y = mul_mat(w, x) on the CPU backend with w in a buffer of `buft`; the output as f32 values.
std::vector<float> run(ggml_backend_t backend, ggml_backend_buffer_type_t buft, const weight_case & c,
                       int64_t rows, const std::vector<uint8_t> & w_bytes, const std::vector<float> & x_vals) {
    graph_run g;
    ggml_init_params ip = {ggml_tensor_overhead() * 8 + ggml_graph_overhead(), nullptr, true};
    g.ctx = ggml_init(ip);
    ggml_tensor * w = ggml_new_tensor_4d(g.ctx, c.type, c.ne[0], c.ne[1], c.ne[2], c.ne[3]);
    ggml_tensor * x = ggml_new_tensor_4d(g.ctx, GGML_TYPE_F32, c.ne[0], rows, c.batches, c.ne[3]);
    ggml_tensor * y = ggml_mul_mat(g.ctx, w, x);
    ggml_cgraph * gf = ggml_new_graph(g.ctx);
    ggml_build_forward_expand(gf, y);

    // The weight's buffer: at least its plain size, so that a kernel reading the plain layout's
    // strides in a smaller packed buffer reads garbage, not outside the allocation.
    const size_t w_size = std::max(ggml_backend_buft_get_alloc_size(buft, w), ggml_nbytes(w));
    g.w_buf = ggml_backend_buft_alloc_buffer(buft, w_size + 4096);
    void * base = ggml_backend_buffer_get_base(g.w_buf);
    if (ggml_backend_tensor_alloc(g.w_buf, w, base) != GGML_STATUS_SUCCESS) {
        std::fprintf(stderr, "amx-mul-mat-check: cannot place the weight in %s\n", ggml_backend_buft_name(buft));
        std::exit(1);
    }
    ggml_backend_tensor_set(w, w_bytes.data(), 0, w_bytes.size());

    // x and y in a plain CPU buffer (y through its own allocation in the same buffer).
    const size_t x_size = ggml_nbytes(x), y_size = ggml_nbytes(y), align = 64;
    g.x_buf = ggml_backend_buft_alloc_buffer(ggml_backend_cpu_buffer_type(), x_size + y_size + 2 * align);
    char * xbase = (char *) ggml_backend_buffer_get_base(g.x_buf);
    ggml_backend_tensor_alloc(g.x_buf, x, xbase);
    ggml_backend_tensor_alloc(g.x_buf, y, xbase + (x_size + align - 1) / align * align);
    ggml_backend_tensor_set(x, x_vals.data(), 0, x_size);

    if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) {
        std::fprintf(stderr, "amx-mul-mat-check: graph compute failed\n");
        std::exit(1);
    }
    std::vector<float> out(ggml_nelements(y));
    ggml_backend_tensor_get(y, out.data(), 0, y_size);
    return out;
}

// Would llama.cpp's loader put this weight in `buft`? (weight_buft_supported, MUL_MAT case)
bool buft_takes(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft, const weight_case & c) {
    ggml_init_params ip = {ggml_tensor_overhead() * 8, nullptr, true};
    ggml_context * ctx = ggml_init(ip);
    ggml_tensor * w = ggml_new_tensor_4d(ctx, c.type, c.ne[0], c.ne[1], c.ne[2], c.ne[3]);
    ggml_tensor * b = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, c.ne[0], 512, c.ne[2], c.ne[3]);
    ggml_tensor * op = ggml_mul_mat(ctx, w, b);
    w->buffer = ggml_backend_buft_alloc_buffer(buft, 0);
    bool ok = ggml_backend_dev_supports_op(dev, op);
    ggml_backend_buffer_free(w->buffer);
    ggml_free(ctx);
    return ok;
}

// max |a - b| / rms(ref); inf where a or b has a non-finite value.
template <typename T>
double rel_error(const std::vector<float> & a, const std::vector<T> & b, const std::vector<double> & ref) {
    double sq = 0, worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        sq += ref[i] * ref[i];
        if (!std::isfinite(a[i]) || !std::isfinite((double) b[i])) {
            return INFINITY;
        }
        worst = std::max(worst, std::fabs(a[i] - (double) b[i]));
    }
    const double rms = std::sqrt(sq / (double) ref.size());
    return worst / (rms > 0 ? rms : 1.0);
}

// The share of the input's values that are exactly 0 (--zeros): Gemma 3n's sparse FFN layers
// feed their down product ~95 % zeros, whole zero blocks among them.
double g_zeros = 0.0;

outcome check(ggml_backend_dev_t dev, ggml_backend_t backend, ggml_backend_buffer_type_t amx,
              const weight_case & c, int64_t rows, std::mt19937 & rng) {
    outcome o;
    o.taken = buft_takes(dev, amx, c);
    if (!o.taken) {
        return o;
    }
    ggml_init_params ip = {ggml_tensor_overhead() * 2, nullptr, true};
    ggml_context * meta = ggml_init(ip);
    ggml_tensor * w = ggml_new_tensor_4d(meta, c.type, c.ne[0], c.ne[1], c.ne[2], c.ne[3]);
    const std::vector<uint8_t> w_bytes = random_weight(w, rng);
    ggml_free(meta);

    const int64_t k = c.ne[0], n = c.ne[1], b2 = c.batches, b3 = c.ne[3];
    std::vector<float> x(k * rows * b2 * b3);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::uniform_real_distribution<double> share(0.0, 1.0);
    for (float & v : x) {
        v = dist(rng);
        if (g_zeros > 0 && share(rng) < g_zeros) {
            v = 0.0f;
        }
    }
    const std::vector<float> y_amx = run(backend, amx, c, rows, w_bytes, x);
    const std::vector<float> y_plain = run(backend, ggml_backend_cpu_buffer_type(), c, rows, w_bytes, x);

    // float64: y[i3][i2][r][j] = sum_k w[i3][i2 / (b2 / ne2)][j][k] * x[i3][i2][r][k]
    std::vector<float> wf(k);
    const auto * traits = ggml_get_type_traits(c.type);
    const size_t row_bytes = ggml_row_size(c.type, k);
    std::vector<double> ref(y_plain.size());
    const int64_t ratio = b2 / c.ne[2];
    for (int64_t i3 = 0; i3 < b3; ++i3) {
        for (int64_t i2 = 0; i2 < b2; ++i2) {
            const int64_t w2 = i2 / ratio;
            for (int64_t j = 0; j < n; ++j) {
                const uint8_t * wrow = w_bytes.data() + ((i3 * c.ne[2] + w2) * n + j) * row_bytes;
                if (c.type == GGML_TYPE_F32) {
                    std::memcpy(wf.data(), wrow, k * sizeof(float));
                } else {
                    traits->to_float(wrow, wf.data(), k);
                }
                for (int64_t r = 0; r < rows; ++r) {
                    const float * xr = x.data() + ((i3 * b2 + i2) * rows + r) * k;
                    double acc = 0;
                    for (int64_t e = 0; e < k; ++e) {
                        acc += (double) wf[e] * (double) xr[e];
                    }
                    ref[((i3 * b2 + i2) * rows + r) * n + j] = acc;
                }
            }
        }
    }
    o.amx_vs_plain = rel_error(y_amx, y_plain, ref);
    o.amx_vs_f64 = rel_error(y_amx, ref, ref);
    o.plain_vs_f64 = rel_error(y_plain, ref, ref);
    return o;
}

constexpr unsigned CASE_SECONDS = 120;

// check() in a child process, so that a kernel that crashes is one failed case, not the end of
// the run. The parent never computes (no OpenMP threads exist when it forks).
outcome check_isolated(ggml_backend_dev_t dev, ggml_backend_buffer_type_t amx, int threads,
                       const weight_case & c, int64_t rows, uint32_t seed) {
    int fds[2];
    if (pipe(fds) != 0) {
        std::perror("amx-mul-mat-check: pipe");
        std::exit(1);
    }
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid < 0) {
        std::perror("amx-mul-mat-check: fork");
        std::exit(1);
    }
    if (pid == 0) {
        close(fds[0]);
        alarm(CASE_SECONDS);  // a kernel that never returns ends as SIGALRM: a failed case
        ggml_backend_t backend = ggml_backend_dev_init(dev, nullptr);
        ggml_backend_cpu_set_n_threads(backend, threads);
        std::mt19937 rng(seed);
        const outcome o = check(dev, backend, amx, c, rows, rng);
        ggml_backend_free(backend);
        const ssize_t n = write(fds[1], &o, sizeof o);
        _exit(n == (ssize_t) sizeof o ? 0 : 1);
    }
    close(fds[1]);
    outcome o;
    const ssize_t n = read(fds[0], &o, sizeof o);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status)) {
        o = outcome{};
        o.taken = true;
        o.signal = WTERMSIG(status);
    } else if (n != (ssize_t) sizeof o || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        std::fprintf(stderr, "amx-mul-mat-check: a product's process failed (exit %d)\n",
                     WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        std::exit(1);
    }
    return o;
}

// ggml's debug lines (one per packed weight) are noise here; the rest goes to stderr.
void log_without_debug(ggml_log_level level, const char * text, void *) {
    if (level != GGML_LOG_LEVEL_DEBUG) {
        std::fputs(text, stderr);
    }
}

}  // namespace

int main(int argc, char ** argv) {
    int threads = 2;
    std::string buft_name = "AMX";
    std::vector<int64_t> rows = {1, 17, 32, 100};
    std::vector<ggml_type> types(std::begin(AMX_TYPES), std::end(AMX_TYPES));
    std::vector<weight_case> cases;
    bool explicit_cases = false;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        auto value = [&](const char * what) -> std::string {
            if (i + 1 >= argc) {
                usage((std::string(what) + " needs a value").c_str());
            }
            return argv[++i];
        };
        if (a == "--full-n") {
            g_full_n = true;
        } else if (a == "--zeros") {
            g_zeros = std::atof(value("--zeros").c_str());
        } else if (a == "--buffer-type") {
            buft_name = value("--buffer-type");
        } else if (a == "--threads") {
            threads = (int) parse_int(value("--threads"), "--threads");
        } else if (a == "--rows") {
            rows.clear();
            for (const auto & r : split(value("--rows"), ',')) {
                rows.push_back(parse_int(r, "--rows"));
            }
        } else if (a == "--types") {
            types.clear();
            for (const auto & t : split(value("--types"), ',')) {
                types.push_back(parse_type(t));
            }
        } else if (a == "--gguf") {
            add_gguf_cases(value("--gguf").c_str(), types, cases);
            explicit_cases = true;
        } else if (a == "-h" || a == "--help") {
            usage("ggml's AMX matrix products against the plain CPU ones");
        } else if (!a.empty() && a[0] != '-') {
            std::vector<std::string> shape_b = split(a, ':');
            std::vector<std::string> dims = split(shape_b[0], ',');
            if (dims.size() < 2 || dims.size() > 4 || shape_b.size() > 2) {
                usage(("a case is K,N[,NE2[,NE3]][:B], not '" + a + "'").c_str());
            }
            int64_t ne[4] = {1, 1, 1, 1};
            for (size_t d = 0; d < dims.size(); ++d) {
                ne[d] = parse_int(dims[d], "a case's dims");
            }
            const int64_t b = shape_b.size() == 2 ? parse_int(shape_b[1], "a case's batches") : ne[2];
            if (b % ne[2]) {
                usage(("the input batches of '" + a + "' are not a multiple of NE2").c_str());
            }
            for (ggml_type t : types) {
                if (ne[0] % ggml_blck_size(t) == 0) {  // rows of whole blocks only
                    cases.push_back({t, {ne[0], shortened_n(ne[1]), ne[2], ne[3]}, b, "argument"});
                }
            }
            explicit_cases = true;
        } else {
            usage(("unknown option '" + a + "'").c_str());
        }
    }
    if (!explicit_cases) {
        cases = builtin_cases(types);
    }

    ggml_log_set(log_without_debug, nullptr);
    ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (!dev) {
        std::fprintf(stderr, "amx-mul-mat-check: no CPU device in this ggml\n");
        return 1;
    }
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    auto get_extra = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(
        reg, "ggml_backend_dev_get_extra_bufts");
    ggml_backend_buffer_type_t amx = nullptr;
    std::string extra_names;
    for (ggml_backend_buffer_type_t * b = get_extra ? get_extra(dev) : nullptr; b && *b; ++b) {
        extra_names += std::string(extra_names.empty() ? "" : ", ") + ggml_backend_buft_name(*b);
        if (buft_name == ggml_backend_buft_name(*b)) {
            amx = *b;
        }
    }
    if (!amx) {
        std::printf("skip: this ggml has no %s buffer type (extra buffer types: %s; AMX_INT8 = %d: "
                    "for AMX, built for a CPU without AMX, or the kernel refused the tiles)\n",
                    buft_name.c_str(), extra_names.empty() ? "none" : extra_names.c_str(),
                    ggml_cpu_has_amx_int8());
        return 77;
    }

    std::printf("%-8s %6s %5s %4s %4s %5s  %-7s %12s %12s %12s  %s\n", "type", "K", "N", "ne2", "ne3",
                "rows", buft_name.c_str(), "extra-plain", "extra-f64", "plain-f64", "case");
    int failed = 0, compared = 0;
    uint32_t seed = 1234;
    for (const weight_case & c : cases) {
        for (int64_t r : rows) {
            const outcome o = check_isolated(dev, amx, threads, c, r, seed++);
            const double tol = c.type == GGML_TYPE_F16 ? 1e-2 : 1e-3;
            const bool ok = !o.taken || (o.signal == 0 && o.amx_vs_plain <= tol);
            failed += !ok;
            compared += o.taken;
            if (o.signal) {
                std::printf("%-8s %6lld %5lld %4lld %4lld %5lld  %-7s %12s %12s %12s  %s  FAIL (%s)\n",
                            ggml_type_name(c.type), (long long) c.ne[0], (long long) c.ne[1],
                            (long long) c.ne[2], (long long) c.ne[3], (long long) r, "taken", "crashed",
                            "-", "-", c.from.c_str(), strsignal(o.signal));
            } else if (o.taken) {
                std::printf("%-8s %6lld %5lld %4lld %4lld %5lld  %-7s %12.3g %12.3g %12.3g  %s%s\n",
                            ggml_type_name(c.type), (long long) c.ne[0], (long long) c.ne[1],
                            (long long) c.ne[2], (long long) c.ne[3], (long long) r, "taken",
                            o.amx_vs_plain, o.amx_vs_f64, o.plain_vs_f64, c.from.c_str(),
                            ok ? "" : "  FAIL");
            } else {
                std::printf("%-8s %6lld %5lld %4lld %4lld %5lld  %-7s %12s %12s %12s  %s\n",
                            ggml_type_name(c.type), (long long) c.ne[0], (long long) c.ne[1],
                            (long long) c.ne[2], (long long) c.ne[3], (long long) r, "refused", "-",
                            "-", "-", c.from.c_str());
            }
            std::fflush(stdout);
        }
    }
    std::printf("%d of %d %s products disagree with the plain CPU's (tolerance 1e-3, f16 1e-2)\n",
                failed, compared, buft_name.c_str());
    return failed ? 1 : 0;
}
