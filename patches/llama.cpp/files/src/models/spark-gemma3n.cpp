// Gemma 3n's sparse FFN layers on the Spark backend's ops.
//
// Gemma 3n (gemma3n.cpp) applies Spark's statistical top-k to the FFN of its first
// n_layer_sparsity layers: gate = W_gate x, theta = mean(gate) + std(gate) * f_sparsity_std_mul
// (unbiased std; the multiplier is Q(0.95), so ~5 % of the neurons pass), then
// out = W_down (gelu(relu(gate - theta)) * (W_up x)). Upstream computes all of it densely.
// When a ggml backend registry entry named "Spark" exports spark_ffn_up (the plugin loaded with
// GGML_BACKEND_PATH), those layers run as Spark-Gemma2's FFN does (spark-gemma2.cpp), with the
// whole of x as K2's input (r_f = 0) and the given multiplier as the cutoff:
//   gate = W_gate x                            stock ggml_mul_mat (every neuron's score)
//   out  = sum over the kept neurons j of gelu_tanh(gate_j - theta) (W_up_j . x) V_j
//          on spark_ffn_fused + spark_ffn_sum, or spark_ffn_up + spark_ffn_down, as the
//          backend's spark_ffn_tiling answers for the ubatch
// V is W_down neuron-major ([n_embd, n_ff]: row j is neuron j's output vector). The file stores
// W_down [n_ff, n_embd] with its quantization blocks along n_ff, so one neuron's weights are a
// strided column and a block of 32 neurons holds a kept one 81 % of the time: skipping neurons
// there saves almost nothing. load_tensors therefore makes V from the file's W_down once, when
// the model loads (users keep the file they downloaded), in the type spark_down_type picks.
// W_up's and W_down's rows of those layers load as row gathers (gemma3n.cpp), which keeps them
// out of repacked CPU buffers: the ops read W_up's rows, and load_tensors reads W_down back.
// Without the entry, or with LoRA adapters on the model (the ops read W_up and V themselves),
// nothing here runs and the graph is upstream's.

#include "models.h"
#include "spark-ops.h"

#include "ggml-backend.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <vector>

bool llama_model_gemma3n::spark_sparse_ffn_available() {
    return spark_kernel("spark_ffn_up") != nullptr;
}

//
// the neuron-major down weights
//

// The storage type of V for a file's W_down of type `file_type`. Default: bf16 for a bf16
// file, f16 otherwise: every weight of the file's q8_0 / q4_K / q6_K / f16 / bf16 blocks within
// f16 rounding (2^-11 relative), where re-quantizing along the other axis would add a second
// quantization error of the file's own size; V is read 5 % at a time in decode, so its width
// costs little there (docs/PERF.md, "Gemma 3n": the KL divergence, memory and speed of each).
// SPARK_GEMMA3N_V_TYPE = f16, bf16, f32, q8_0 (half the memory of f16, an error 1/8 of q4_K's
// step) or file (W_down's own type where n_embd fills its blocks and no importance matrix is
// needed to make it, else the default) overrides it.
static ggml_type spark_down_type(ggml_type file_type, int64_t n_embd) {
    const ggml_type fallback = file_type == GGML_TYPE_BF16 ? GGML_TYPE_BF16 : GGML_TYPE_F16;
    const char * want = std::getenv("SPARK_GEMMA3N_V_TYPE");
    if (want == nullptr || *want == '\0') {
        return fallback;
    }
    static const struct { const char * name; ggml_type type; } types[] = {
        { "f16", GGML_TYPE_F16 }, { "bf16", GGML_TYPE_BF16 }, { "f32", GGML_TYPE_F32 }, { "q8_0", GGML_TYPE_Q8_0 },
    };
    for (const auto & t : types) {
        if (std::strcmp(want, t.name) == 0) {
            return n_embd % ggml_blck_size(t.type) == 0 ? t.type : fallback;
        }
    }
    if (std::strcmp(want, "file") == 0) {
        // types that need an importance matrix (the IQ1/IQ2 families) cannot be re-made here
        if (n_embd % ggml_blck_size(file_type) == 0 && !ggml_quantize_requires_imatrix(file_type)) {
            return file_type;
        }
        return fallback;
    }
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
        LLAMA_LOG_WARN("%s: SPARK_GEMMA3N_V_TYPE=%s is not one of f16, bf16, f32, q8_0, file: using %s\n", __func__, want,
                       ggml_type_name(fallback));
    }
    return fallback;
}

// w [n_ff, n_embd] (ggml order) as f32 rows, transposed: out[j*n_embd + e] = w[e][j]
static void spark_transpose_to_f32(const ggml_tensor * w, std::vector<float> & out) {
    const int64_t n_ff = w->ne[0], n_embd = w->ne[1];
    std::vector<uint8_t> raw(ggml_nbytes(w));
    ggml_backend_tensor_get(w, raw.data(), 0, raw.size());
    const ggml_to_float_t to_float = w->type == GGML_TYPE_F32 ? nullptr : ggml_get_type_traits(w->type)->to_float;
    out.resize(n_ff * n_embd);
    // a block of rows of w at a time, dequantized, then written column-wise: each neuron's
    // output vector gets kBlock consecutive values per pass
    const int64_t kBlock = 64;
    std::vector<float> rows(kBlock * n_ff);
    for (int64_t e0 = 0; e0 < n_embd; e0 += kBlock) {
        const int64_t ne = std::min(kBlock, n_embd - e0);
        for (int64_t e = 0; e < ne; ++e) {
            const uint8_t * src = raw.data() + (e0 + e) * w->nb[1];
            if (to_float) {
                to_float(src, rows.data() + e * n_ff, n_ff);
            } else {
                std::memcpy(rows.data() + e * n_ff, src, n_ff * sizeof(float));
            }
        }
        for (int64_t j = 0; j < n_ff; ++j) {
            float * dst = out.data() + j * n_embd + e0;
            for (int64_t e = 0; e < ne; ++e) {
                dst[e] = rows[e * n_ff + j];
            }
        }
    }
}

// Where layer il's V goes: the buffer type that holds its ffn_down (the CPU's or a GPU's), the
// CPU's for a host buffer (also a memory-mapped file's).
static ggml_backend_buffer_type_t spark_down_buft(const ggml_tensor * down) {
    ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(down->buffer);
    return ggml_backend_buft_is_host(buft) ? ggml_backend_cpu_buffer_type() : buft;
}

bool llama_model_gemma3n::load_tensors(llama_model_loader & ml) {
    if (!llama_model_base::load_tensors(ml)) {
        return false;
    }
    if (!spark_sparse_ffn_available()) {
        return true;
    }
    const int n_sparse = std::min<int>(n_layer_sparsity, (int) hparams.n_layer());
    spark_ffn_down_nm.assign(n_sparse, nullptr);

    // 0. which layers keep upstream's graph on their device: those whose W_up and W_down (V
    //    goes beside it) sit where an FFN op of either path does not run
    std::vector<bool> upstream(n_sparse);
    for (int il = 0; il < n_sparse; ++il) {
        upstream[il] = !spark_ops_run_where({ "spark_ffn_fused", "spark_ffn_sum", "spark_ffn_up", "spark_ffn_down" },
                                            { layers[il].ffn_up, layers[il].ffn_down });
    }
    if (!ml.no_alloc) {  // not in the memory-fit pass, whose placements are trials
        spark_each_run_off(upstream, [&](int il) { return layers[il].ffn_down; }, [](int first, int last, const char * where) {
            LLAMA_LOG_INFO("%s: Spark: sparse FFN layers %d-%d are on %s, which does not run the Spark ops: "
                           "they keep upstream's graph there\n", "load_tensors", first, last, where);
        });
    }

    // 1. the tensors, one context per buffer type (V sits where its layer's other weights are)
    std::vector<std::pair<ggml_backend_buffer_type_t, ggml_context_ptr>> ctxs;
    for (int il = 0; il < n_sparse; ++il) {
        if (upstream[il]) {
            continue;
        }
        const ggml_tensor * down = layers[il].ffn_down;
        const ggml_backend_buffer_type_t buft = spark_down_buft(down);
        auto it = std::find_if(ctxs.begin(), ctxs.end(), [&](const auto & c) { return c.first == buft; });
        if (it == ctxs.end()) {
            ggml_init_params params = { (size_t) n_sparse * ggml_tensor_overhead(), nullptr, true };
            ctxs.emplace_back(buft, ggml_context_ptr(ggml_init(params)));
            it = std::prev(ctxs.end());
        }
        const int64_t n_ff = down->ne[0], n_embd = down->ne[1];
        ggml_tensor * v = ggml_new_tensor_2d(it->second.get(), spark_down_type(down->type, n_embd), n_embd, n_ff);
        ggml_format_name(v, "blk.%d.spark_ffn_down_nm", il);
        spark_ffn_down_nm[il] = v;
    }

    // 2. their buffers, held with the file's (memory_breakdown counts them); in the memory-fit
    //    pass a dummy one, as llama_model_base gives the file's weights
    for (auto & [buft, ctx] : ctxs) {
        ggml_backend_buffer_t buf = ml.no_alloc ? ggml_backend_buft_alloc_buffer(buft, 0)
                                                : ggml_backend_alloc_ctx_tensors_from_buft(ctx.get(), buft);
        if (buf == nullptr) {
            throw std::runtime_error(format("%s: cannot allocate %zu bytes of %s for the neuron-major ffn_down",
                                            __func__, ggml_backend_alloc_ctx_tensors_from_buft_size(ctx.get(), buft),
                                            ggml_backend_buft_name(buft)));
        }
        if (ml.no_alloc) {
            for (ggml_tensor * t = ggml_get_first_tensor(ctx.get()); t != nullptr; t = ggml_get_next_tensor(ctx.get(), t)) {
                t->buffer = buf;  // weights: the scheduler does not place them
            }
        }
        ggml_backend_buffer_set_usage(buf, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
        add_load_time_weights(std::move(ctx), ggml_backend_buffer_ptr(buf));
    }
    if (ml.no_alloc) {
        return true;
    }

    // 3. their data: each layer's ffn_down read back, transposed and stored in V's type
    std::vector<float> nm;
    std::vector<uint8_t> stored;
    size_t total = 0;
    int first = -1, last = -1;  // the layers with a V
    for (int il = 0; il < n_sparse; ++il) {
        ggml_tensor * v = spark_ffn_down_nm[il];
        if (v == nullptr) {
            continue;
        }
        first = first < 0 ? il : first;
        last  = il;
        spark_transpose_to_f32(layers[il].ffn_down, nm);
        stored.resize(ggml_nbytes(v));
        ggml_quantize_chunk(v->type, nm.data(), stored.data(), 0, v->ne[1], v->ne[0], nullptr);
        ggml_backend_tensor_set(v, stored.data(), 0, stored.size());
        total += ggml_nbytes(v);
    }
    if (first >= 0) {
        const ggml_tensor * v = spark_ffn_down_nm[first];
        LLAMA_LOG_INFO("%s: Spark: neuron-major ffn_down of layers %d-%d (%s), %.2f MiB in %s\n", __func__, first, last,
                       ggml_type_name(v->type), total / 1024.0 / 1024.0, ggml_backend_buffer_name(v->buffer));
    }
    return true;
}

//
// the graph
//

ggml_tensor * llama_model_gemma3n::graph::build_spark_ffn(ggml_tensor * cur, int il) {
    const auto & g3n = static_cast<const llama_model_gemma3n &>(model);
    if (il >= (int) g3n.spark_ffn_down_nm.size() || g3n.spark_ffn_down_nm[il] == nullptr || !spark_sparse_ffn_available()) {
        return nullptr;
    }
    if (loras != nullptr && !loras->empty()) {
        static std::atomic<bool> warned{false};
        if (!warned.exchange(true)) {
            LLAMA_LOG_WARN("%s: LoRA adapters are loaded: Gemma 3n's sparse FFN layers run upstream's dense graph\n", __func__);
        }
        return nullptr;
    }
    const auto & layer = model.layers[il];
    ggml_tensor * v = g3n.spark_ffn_down_nm[il];

    // a ubatch the Spark backend sends to the dense graph (a GPU above its switch point) keeps
    // upstream's graph, gate and all
    spark_ffn_tiling tiling = {};
    if (spark_ffn_ask_tiling(layer.ffn_up, std::max<int64_t>(cur->ne[1], 1), layer.ffn_gate->ne[1], cur->ne[0], tiling) &&
        tiling.path == SPARK_FFN_PATH_DENSE) {
        return nullptr;
    }

    ggml_tensor * gate = build_lora_mm(layer.ffn_gate, cur);  // [n_ff, n_tokens]
    cb(gate, "ffn_gate", il);

    const spark_op_params params = { il, 0, 0, 0.0f, SPARK_FFN_CUTOFF_STD_MUL, f_sparsity_std_mul };

    return spark_build_sparse_ffn(ctx0, gate, cur, layer.ffn_up, v, params,
                                  [&](ggml_tensor * t, const char * name) { cb(t, name, il); });
}
