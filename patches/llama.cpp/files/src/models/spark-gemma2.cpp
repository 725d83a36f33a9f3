// Spark-Gemma2: Gemma-2 with the Spark Transformer's statistical-top-k FFN and attention
// ("Spark Transformer: Reactivating Sparsity in FFN and Attention", 2025).
//
// Statistical top-k of x (length d, target k): theta = mean(x) + std(x) * Q(1 - k/d), with the
// unbiased std and Q the inverse standard normal CDF.
//   FFN      : s = K1 h[:r_f], a = gelu_tanh(relu(s - theta)), out = sum_j a_j (K2_j . h[r_f:]) V_j
//   attention: per head q, k split at r_a; s1 = softcap(q1 . k1) over the valid positions C; keep
//              s1 > theta (all of C when |C| <= k_a, the maxima when nothing exceeds theta);
//              w = softmax over the kept of s1, times softplus(q2 . k2); out = sum_j w_j v_j
//
// Two implementations of the same math:
//   - dense: stock ggml ops only, runs on every backend (the reference inside llama.cpp)
//   - sparse: when a ggml backend registry entry named "Spark" exists (registered in-process or
//     loaded with GGML_BACKEND_PATH) and exports "spark_ffn_fused" + "spark_ffn_sum" (the fused
//     FFN path), "spark_ffn_up" + "spark_ffn_down" (the two-stage FFN path) and "spark_attn",
//     those kernels run as ggml custom ops and skip the work for dropped neurons and positions
//     (the FFN predictor K1 h[:r_f] stays a stock ggml_mul_mat). Which FFN path a ubatch takes,
//     and into how many chunks, the backend answers through "spark_ffn_tiling", and whether its
//     attention runs spark_attn through "spark_attn_path": both may answer the dense graph (a
//     GPU above its switch point, where tensor cores beat the sparse kernels); each node carries
//     its parameters (layer, k, ...) in its own op_params, stored by "spark_op_set_params", so it
//     holds no pointer of this process (spark-backend.h).

#include "models.h"
#include "spark-backend.h"
#include "spark-ops.h"

#include "llama-kv-cache.h"
#include "llama-kv-cache-iswa.h"

#include "ggml-backend.h"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

//
// inverse normal CDF
//

static const double spark_acklam_a[6] = {
    -3.969683028665376e+01,  2.209460984245205e+02, -2.759285104469687e+02,
     1.383577518672690e+02, -3.066479806614716e+01,  2.506628277459239e+00,
};
static const double spark_acklam_b[5] = {
    -5.447609879822406e+01,  1.615858368580409e+02, -1.556989798598866e+02,
     6.680131188771972e+01, -1.328068155288572e+01,
};
static const double spark_acklam_c[6] = {
    -7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
    -2.549732539343734e+00,  4.374664141464968e+00,  2.938163982698783e+00,
};
static const double spark_acklam_d[4] = {
     7.784695709041462e-03,  3.224671290700398e-01,  2.445134137142996e+00,
     3.754408661907416e+00,
};
static const double spark_acklam_p_low = 0.02425;

// Q(p) for p in (0, 1): Acklam's rational approximation (relative error 1.15e-9) refined by one
// Halley step on Phi(x) - p, which brings it to double precision
static double spark_inverse_normal_cdf(double p) {
    const double * a = spark_acklam_a;
    const double * b = spark_acklam_b;
    const double * c = spark_acklam_c;
    const double * d = spark_acklam_d;

    double x;
    if (p < spark_acklam_p_low) {
        const double q = std::sqrt(-2.0*std::log(p));
        x =  (((((c[0]*q + c[1])*q + c[2])*q + c[3])*q + c[4])*q + c[5]) /
              ((((d[0]*q + d[1])*q + d[2])*q + d[3])*q + 1.0);
    } else if (p <= 1.0 - spark_acklam_p_low) {
        const double q = p - 0.5;
        const double r = q*q;
        x = (((((a[0]*r + a[1])*r + a[2])*r + a[3])*r + a[4])*r + a[5])*q /
            (((((b[0]*r + b[1])*r + b[2])*r + b[3])*r + b[4])*r + 1.0);
    } else {
        const double q = std::sqrt(-2.0*std::log1p(-p));
        x = -(((((c[0]*q + c[1])*q + c[2])*q + c[3])*q + c[4])*q + c[5]) /
              ((((d[0]*q + d[1])*q + d[2])*q + d[3])*q + 1.0);
    }

    // Halley: e = Phi(x) - p, u = e / phi(x), x -= u / (1 + x u / 2)
    const double e = 0.5*std::erfc(-x/std::sqrt(2.0)) - p;
    const double u = e*std::sqrt(2.0*M_PI)*std::exp(0.5*x*x);
    x = x - u/(1.0 + 0.5*x*u);

    return x;
}

//
// hyper-parameters and tensors
//

void llama_model_spark_gemma2::load_arch_hparams(llama_model_loader & ml) {
    // Gemma-2: sliding window on the even layers (0, 2, 4, ...), attention logit soft-capping
    hparams.swa_type = LLAMA_SWA_TYPE_STANDARD;
    hparams.n_swa = 4096;
    hparams.set_swa_pattern(2);
    hparams.rope_freq_base_train_swa  = hparams.rope_freq_base_train;
    hparams.rope_freq_scale_train_swa = hparams.rope_freq_scale_train;

    ml.get_key(LLM_KV_ATTENTION_SLIDING_WINDOW,    hparams.n_swa, false);
    ml.get_key(LLM_KV_ATTENTION_LAYERNORM_RMS_EPS, hparams.f_norm_rms_eps);
    ml.get_key(LLM_KV_ATTN_LOGIT_SOFTCAPPING,      hparams.f_attn_logit_softcapping, false);
    ml.get_key(LLM_KV_FINAL_LOGIT_SOFTCAPPING,     hparams.f_final_logit_softcapping, false);

    // 0 turns a soft-cap off
    hparams.attn_soft_cap = hparams.f_attn_logit_softcapping > 0.0f;

    hparams.f_attention_scale = 1.0f / std::sqrt(float(hparams.n_embd_head_k()));
    ml.get_key(LLM_KV_ATTENTION_SCALE, hparams.f_attention_scale, false);

    ml.get_key(LLM_KV_SPARK_FFN_K,  spark_ffn_k);
    ml.get_key(LLM_KV_SPARK_FFN_R,  spark_ffn_r);
    ml.get_key(LLM_KV_SPARK_ATTN_K, spark_attn_k);
    ml.get_key(LLM_KV_SPARK_ATTN_R, spark_attn_r);

    const uint32_t n_embd = hparams.n_embd;
    const uint32_t n_head = hparams.n_embd_head_k();
    const uint32_t n_ff   = hparams.n_ff();

    const LLM_KV kv(arch);
    auto invalid = [&](llm_kv key, const std::string & why) {
        return std::runtime_error(format("invalid %s: %s", kv(key).c_str(), why.c_str()));
    };
    if (spark_ffn_r == 0 || spark_ffn_r >= n_embd) {
        throw invalid(LLM_KV_SPARK_FFN_R, format("%u, must be in (0, embedding_length = %u)", spark_ffn_r, n_embd));
    }
    if (spark_attn_r == 0 || spark_attn_r >= n_head || spark_attn_r % 2 != 0 || (n_head - spark_attn_r) % 2 != 0) {
        throw invalid(LLM_KV_SPARK_ATTN_R, format("%u, must be even, in (0, key_length = %u), with key_length - r even", spark_attn_r, n_head));
    }
    if (spark_ffn_k == 0 || spark_ffn_k > INT32_MAX) {
        throw invalid(LLM_KV_SPARK_FFN_K, format("%u, must be at least 1", spark_ffn_k));
    }
    if (spark_attn_k == 0 || spark_attn_k > INT32_MAX) {
        throw invalid(LLM_KV_SPARK_ATTN_K, format("%u, must be at least 1", spark_attn_k));
    }
    if (hparams.n_embd_head_v() != n_head) {
        throw std::runtime_error(format("spark-gemma2 needs key_length == value_length, got %u and %u", n_head, hparams.n_embd_head_v()));
    }
    if (!(std::isfinite(hparams.f_norm_rms_eps) && hparams.f_norm_rms_eps >= 0.0f)) {
        // ggml's rms_norm asserts eps >= 0 (false for NaN too) when the graph runs
        throw invalid(LLM_KV_ATTENTION_LAYERNORM_RMS_EPS, format("%g, must be finite and >= 0", hparams.f_norm_rms_eps));
    }
    if (hparams.n_head() == 0 || hparams.n_head_kv() == 0 || hparams.n_head() % hparams.n_head_kv() != 0) {
        throw std::runtime_error(format("spark-gemma2 needs head_count (%u) to be a multiple of head_count_kv (%u)", hparams.n_head(), hparams.n_head_kv()));
    }

    spark_ffn_z = spark_ffn_k < n_ff ? spark_inverse_normal_cdf(1.0 - double(spark_ffn_k)/double(n_ff)) : 0.0;

    spark_ffn_params.resize(hparams.n_layer());
    spark_attn_params.resize(hparams.n_layer());
    for (uint32_t il = 0; il < hparams.n_layer(); ++il) {
        spark_ffn_params[il]  = { (int32_t) il, (int32_t) spark_ffn_k };
        spark_attn_params[il] = { (int32_t) il, (int32_t) spark_attn_k, (int32_t) spark_attn_r,
                                  hparams.attn_soft_cap ? hparams.f_attn_logit_softcapping : 0.0f };
    }

    switch (hparams.n_layer()) {
        // the layer counts of Gemma-2's sizes (upstream's gemma2 names them the same way)
        case 26: type = LLM_TYPE_2B; break;
        case 42: type = LLM_TYPE_9B; break;
        case 46: type = LLM_TYPE_27B; break;
        default: type = LLM_TYPE_UNKNOWN;
    }
}

// Layer il's K2 [D - r_f, F] and V [D, F] (ffn_up, ffn_down_t), or the one tensor that holds
// both side by side, ffn_k2v [(D - r_f) + D, F] (spark-convert --pair-k2v; docs/SPEC.md section
// 3): the first layer decides which, every other must agree. In a paired file ffn_up and
// ffn_down both point at ffn_k2v; K2's part must end on a whole block of its type, where V's
// view starts.
template <typename Create>
static void spark_create_ffn_rows(llama_model_spark_gemma2 & model, llama_layer & layer, int il, Create create) {
    const int64_t n_embd = model.hparams.n_embd;
    const int64_t n_ff   = model.hparams.n_ff();
    const int64_t n_k2   = n_embd - (int64_t) model.spark_ffn_r;

    ggml_tensor * paired = create(LLM_TENSOR_SPARK_FFN_K2V, {n_k2 + n_embd, n_ff}, llama_model_loader::TENSOR_NOT_REQUIRED);
    if (il == 0) {
        model.spark_ffn_paired = paired != nullptr;
    } else if ((paired != nullptr) != model.spark_ffn_paired) {
        throw std::runtime_error(format("blk.%d: a file holds every layer's K2 and V as ffn_k2v (K2 and V side by side) "
                                        "or every layer's as ffn_up and ffn_down_t, not a mix (layer 0 has %s)", il,
                                        model.spark_ffn_paired ? "ffn_k2v" : "ffn_up and ffn_down_t"));
    }
    if (paired == nullptr) {
        layer.ffn_up   = create(LLM_TENSOR_SPARK_FFN_K2, {n_k2,   n_ff}, 0);
        layer.ffn_down = create(LLM_TENSOR_FFN_DOWN_T,   {n_embd, n_ff}, 0);
        return;
    }
    if (n_k2 % ggml_blck_size(paired->type) != 0) {
        throw std::runtime_error(format("%s: its K2 part (%lld columns, embedding_length - spark.ffn_r) is not whole %s "
                                        "blocks of %lld, so V's part cannot start on a block (spark-convert writes "
                                        "such a model as f16, or without --pair-k2v)", paired->name, (long long) n_k2,
                                        ggml_type_name(paired->type), (long long) ggml_blck_size(paired->type)));
    }
    layer.ffn_up   = paired;
    layer.ffn_down = paired;
}

int64_t llama_model_spark_gemma2::quant_block_span(const ggml_tensor * t) const {
    const int64_t n_embd = hparams.n_embd;
    const int64_t n_k2   = n_embd - (int64_t) spark_ffn_r;
    for (uint32_t il = 0; il < hparams.n_layer(); ++il) {
        if (std::string(t->name) == tn(LLM_TENSOR_SPARK_FFN_K2V, "weight", il)) {
            return std::gcd(n_k2, n_embd);
        }
    }
    return t->ne[0];
}

void llama_model_spark_gemma2::load_arch_tensors(llama_model_loader &) {
    LLAMA_LOAD_LOCALS;

    const int64_t n_ffn_r = spark_ffn_r;

    tok_embd = create_tensor(tn(LLM_TENSOR_TOKEN_EMBD, "weight"), {n_embd, n_vocab}, 0);

    output_norm = create_tensor(tn(LLM_TENSOR_OUTPUT_NORM, "weight"), {n_embd}, 0);
    output      = create_tensor(tn(LLM_TENSOR_TOKEN_EMBD,  "weight"), {n_embd, n_vocab}, TENSOR_DUPLICATED); // tied

    for (int i = 0; i < n_layer; ++i) {
        auto & layer = layers[i];

        layer.attn_norm = create_tensor(tn(LLM_TENSOR_ATTN_NORM, "weight", i), {n_embd}, 0);

        create_tensor_qkv(layer, i, n_embd, n_embd_head_k * n_head, n_embd_k_gqa, n_embd_v_gqa, 0);
        layer.wo = create_tensor(tn(LLM_TENSOR_ATTN_OUT, "weight", i), {n_embd_head_k * n_head, n_embd}, 0);
        layer.attn_post_norm = create_tensor(tn(LLM_TENSOR_ATTN_POST_NORM, "weight", i), {n_embd}, 0);

        layer.ffn_norm = create_tensor(tn(LLM_TENSOR_FFN_NORM, "weight", i), {n_embd}, 0);
        // K1 (predictor rows), K2 (value rows) and V (neuron-major): row j belongs to neuron j
        layer.ffn_gate = create_tensor(tn(LLM_TENSOR_FFN_GATE, "weight", i), {n_ffn_r, n_ff}, 0);
        // K2 and V are read by rows: where the layer runs on the CPU they are on-demand tensors
        // (llama.cpp's --lazy-mode on: mapped even without mmap, never read at load, no
        // readahead; auto takes only tensors over 4 GiB, so no Spark layer's)
        const int lazy = ggml_backend_dev_type(dev_layer(i)) == GGML_BACKEND_DEVICE_TYPE_CPU ? TENSOR_READ_LAZY : 0;
        spark_create_ffn_rows(*this, layer, i, [&](llm_tensor kind, std::initializer_list<int64_t> ne, int flags) {
            return create_tensor(tn(kind, "weight", i), ne, flags | lazy);
        });
        layer.ffn_post_norm = create_tensor(tn(LLM_TENSOR_FFN_POST_NORM, "weight", i), {n_embd}, 0);
    }
}

std::unique_ptr<llm_graph_context> llama_model_spark_gemma2::build_arch_graph(const llm_graph_params & params) const {
    return std::make_unique<graph>(*this, params);
}

//
// graph helpers
//

// c[0] x^(n-1) + ... + c[n-1] by Horner's rule
static ggml_tensor * spark_poly(ggml_context * ctx, ggml_tensor * x, const double * c, int n) {
    ggml_tensor * acc = ggml_scale_bias(ctx, x, (float) c[0], (float) c[1]);
    for (int i = 2; i < n; ++i) {
        acc = ggml_scale_bias(ctx, ggml_mul(ctx, acc, x), 1.0f, (float) c[i]);
    }
    return acc;
}

// 1 - step(x): 1 where x <= 0
static ggml_tensor * spark_not_positive(ggml_context * ctx, ggml_tensor * x) {
    return ggml_scale_bias(ctx, ggml_step(ctx, x), -1.0f, 1.0f);
}

// Q(p) element-wise from stock ops: Acklam's three branches, each evaluated on inputs clamped
// into its own domain (so none produces NaN) and blended with 0/1 weights. log_t = log(1 - p).
static ggml_tensor * spark_inverse_normal_cdf_graph(ggml_context * ctx, ggml_tensor * p, ggml_tensor * log_t) {
    const float p_low  = (float) spark_acklam_p_low;
    const float p_high = 1.0f - p_low;

    // central: p in [p_low, p_high]
    ggml_tensor * qc = ggml_scale_bias(ctx, ggml_clamp(ctx, p, p_low, p_high), 1.0f, -0.5f);
    ggml_tensor * rc = ggml_sqr(ctx, qc);
    ggml_tensor * xc = ggml_div(ctx,
            ggml_mul(ctx, spark_poly(ctx, rc, spark_acklam_a, 6), qc),
            ggml_scale_bias(ctx, ggml_mul(ctx, spark_poly(ctx, rc, spark_acklam_b, 5), rc), 1.0f, 1.0f));

    // lower tail: p < p_low
    ggml_tensor * ql = ggml_sqrt(ctx, ggml_scale(ctx, ggml_log(ctx, ggml_clamp(ctx, p, 1e-30f, p_low)), -2.0f));
    ggml_tensor * xl = ggml_div(ctx,
            spark_poly(ctx, ql, spark_acklam_c, 6),
            ggml_scale_bias(ctx, ggml_mul(ctx, spark_poly(ctx, ql, spark_acklam_d, 4), ql), 1.0f, 1.0f));

    // upper tail: p > p_high, i.e. log(1 - p) < log(p_low)
    ggml_tensor * qu = ggml_sqrt(ctx, ggml_scale(ctx, ggml_clamp(ctx, log_t, -1e30f, logf(p_low)), -2.0f));
    ggml_tensor * xu = ggml_scale(ctx, ggml_div(ctx,
            spark_poly(ctx, qu, spark_acklam_c, 6),
            ggml_scale_bias(ctx, ggml_mul(ctx, spark_poly(ctx, qu, spark_acklam_d, 4), qu), 1.0f, 1.0f)), -1.0f);

    ggml_tensor * w_l = ggml_step(ctx, ggml_scale_bias(ctx, p, -1.0f, p_low));              // p < p_low
    ggml_tensor * w_u = ggml_step(ctx, ggml_scale_bias(ctx, log_t, -1.0f, logf(p_low)));   // 1 - p < p_low
    ggml_tensor * w_c = ggml_scale_bias(ctx, ggml_add(ctx, w_l, w_u), -1.0f, 1.0f);

    return ggml_add(ctx, ggml_add(ctx, ggml_mul(ctx, xc, w_c), ggml_mul(ctx, xl, w_l)), ggml_mul(ctx, xu, w_u));
}

// gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), exactly (ggml_gelu's CPU
// version looks the result up in an fp16 table)
static ggml_tensor * spark_gelu_tanh(ggml_context * ctx, ggml_tensor * x) {
    const float c = 0.7978845608028654f; // sqrt(2/pi)
    ggml_tensor * inner = ggml_mul(ctx, x, ggml_scale_bias(ctx, ggml_sqr(ctx, x), 0.044715f*c, c));
    return ggml_mul(ctx, ggml_scale(ctx, x, 0.5f), ggml_scale_bias(ctx, ggml_tanh(ctx, inner), 1.0f, 1.0f));
}

llama_model_spark_gemma2::graph::attn_rows llama_model_spark_gemma2::graph::build_spark_attn_rows(ggml_tensor * kq_mask, uint32_t k) const {
    GGML_ASSERT(kq_mask->type == GGML_TYPE_F32 && "spark-gemma2 needs an f32 KQ mask (flash attention off)");

    attn_rows rows;

    // the mask holds 0 for positions in C and -inf elsewhere
    rows.valid = ggml_exp(ctx0, kq_mask);
    cb(rows.valid, "spark_attn_valid", -1);

    ggml_tensor * count = ggml_sum_rows(ctx0, rows.valid);
    rows.count    = ggml_clamp(ctx0, count, 1.0f, FLT_MAX);
    rows.count_m1 = ggml_clamp(ctx0, ggml_scale_bias(ctx0, count, 1.0f, -1.0f), 1.0f, FLT_MAX);
    rows.keep_all = spark_not_positive(ctx0, ggml_scale_bias(ctx0, count, 1.0f, -((float) k + 0.5f)));

    // p = 1 - k/|C|, computed through log(1 - p) = log k - log |C| to keep the upper tail accurate
    ggml_tensor * log_t = ggml_scale_bias(ctx0, ggml_log(ctx0, rows.count), -1.0f, logf((float) k));
    ggml_tensor * p     = ggml_scale_bias(ctx0, ggml_exp(ctx0, log_t), -1.0f, 1.0f);
    rows.z = spark_inverse_normal_cdf_graph(ctx0, p, log_t);
    cb(rows.z, "spark_attn_z", -1);

    return rows;
}

// Whether the layer's FFN (attention) steps aside for the dense graph on its device: a device
// that does not run the Spark ops (Vulkan, Metal, SYCL, HIP, a CUDA build without the plugin's
// launchers), where Spark nodes would run on the CPU and copy the weights back at every
// evaluation. Not an rpc-server without the plugin: ggml-rpc's supports_op answers true for
// every op whatever its server's backend runs, so the dense graph's out_prod could reach a
// server backend that aborts on it (ggml-cuda with quantized V); its Spark nodes stay on the
// client as before (said at load).
static bool spark_ffn_steps_aside(const llama_layer & layer) {
    return !spark_weight_on_rpc(layer.ffn_up) &&
           !spark_ops_run_where({ "spark_ffn_fused", "spark_ffn_sum", "spark_ffn_up", "spark_ffn_down" },
                                { layer.ffn_up, layer.ffn_down });
}

static bool spark_attn_steps_aside(const llama_layer & layer) {
    return !spark_weight_on_rpc(layer.wo) && !spark_ops_run_where({ "spark_attn", "spark_rope" }, { layer.wo });
}

// Whether spark_attn reads a cache of these types where the layer lives: the CPU op (host
// memory, or an rpc-server's CPU) reads every type the context accepts (patch 0003); the GPU
// kernels read f16 and f32 caches only, so a layer on a GPU with another cache type takes the
// dense attention, which converts the cache to f32 with stock ops (said once).
static bool spark_attn_reads_cache(const llama_layer & layer, ggml_type type_k, ggml_type type_v) {
    auto in_place = [](ggml_type t) { return t == GGML_TYPE_F16 || t == GGML_TYPE_F32; };
    if (in_place(type_k) && in_place(type_v)) {
        return true;
    }
    const ggml_tensor * w = layer.wo;
    if (w == nullptr || w->buffer == nullptr || ggml_backend_buffer_is_host(w->buffer) || spark_weight_on_rpc(w)) {
        return true;
    }
    static std::atomic<bool> said{false};
    if (!said.exchange(true)) {
        LLAMA_LOG_WARN("spark-gemma2: the GPU's Spark attention reads f16 and f32 KV caches, not K %s / V %s: "
                       "layers on %s take the dense attention\n", ggml_type_name(type_k), ggml_type_name(type_v),
                       ggml_backend_buffer_name(w->buffer));
    }
    return false;
}

// The dense FFN's down projection, out [n_embd, n_tokens] = sum_j u[j, t] V_j for gated values
// u [n_ff, n_tokens] and V neuron-major ([n_embd, n_ff]), in two forms of stock ops.
//
// As an outer-product sum, wherever V's device runs it (ggml-cpu's out_prod takes f32, f16 and
// the quantized types; ggml-cuda's and ggml-vulkan's f32 only). ggml_out_prod spreads its work
// over output rows only (one per token), so the neurons are cut into n_chunk groups that sum
// separately (n_tokens * n_chunk rows for the threads) and the partial sums are added up
// afterwards.
static int64_t spark_down_chunks(int64_t n_ff) {
    return n_ff % 16 == 0 ? 16 : 1;
}

static ggml_type spark_down_out_prod_type(const ggml_tensor * down) {
    return down->type == GGML_TYPE_BF16 ? GGML_TYPE_F32 : down->type;  // ggml-cpu's out_prod takes no bf16
}

// whether the device holding V runs spark_down_out_prod's product for a ubatch of n_tokens
static bool spark_down_out_prod_runs(const ggml_tensor * down, int64_t n_tokens) {
    const int64_t n_embd = down->ne[0], n_ff = down->ne[1], n_chunk = spark_down_chunks(n_ff);
    return spark_weight_device_runs(down, [&](ggml_context * ctx) {
        ggml_tensor * v  = ggml_new_tensor_3d(ctx, spark_down_out_prod_type(down), n_embd, n_ff/n_chunk, n_chunk);
        ggml_tensor * ut = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, n_tokens, n_ff/n_chunk, n_chunk);
        return ggml_out_prod(ctx, v, ut);
    });
}

static ggml_tensor * spark_down_out_prod(ggml_context * ctx, ggml_tensor * down, ggml_tensor * u) {
    const int64_t n_embd = down->ne[0], n_ff = down->ne[1], n_tokens = u->ne[1];
    const int64_t n_chunk = spark_down_chunks(n_ff);
    if (spark_down_out_prod_type(down) != down->type) {
        down = ggml_cast(ctx, down, spark_down_out_prod_type(down));
    }
    // the chunks as a 3-D view with V's own row stride (a paired file's V rows are not packed)
    ggml_tensor * v  = ggml_view_3d(ctx, down, n_embd, n_ff/n_chunk, n_chunk, down->nb[1], down->nb[1]*(n_ff/n_chunk), 0);
    ggml_tensor * ut = ggml_reshape_3d(ctx, ggml_cont(ctx, ggml_transpose(ctx, u)), n_tokens, n_ff/n_chunk, n_chunk);
    ggml_tensor * partial = ggml_out_prod(ctx, v, ut);                        // [n_embd, n_tokens, n_chunk]
    partial = ggml_cont(ctx, ggml_permute(ctx, partial, 1, 2, 0, 3));       // [n_chunk, n_embd, n_tokens]
    return ggml_reshape_2d(ctx, ggml_sum_rows(ctx, partial), n_embd, n_tokens);
}

// As a stock matrix product, which a GPU runs on its tensor cores: V copied to stock layout
// [n_ff, n_embd] in the graph, at every evaluation (f32 and bf16 weights keep their type, the
// others become f16, quantized rows dequantized by a get_rows of every neuron first: ~(4 + 2)
// bytes per weight written and read again), worth it only for ubatches big enough that the
// product dominates (the Spark backend's switch point), or where the device runs no out_prod of
// V's type (a layer there without the Spark ops, or without the plugin).
static ggml_tensor * spark_down_mul_mat(ggml_context * ctx, ggml_tensor * down, ggml_tensor * u) {
    const int64_t n_ff = down->ne[1];
    const bool keeps_type = down->type == GGML_TYPE_F32 || down->type == GGML_TYPE_BF16;
    ggml_tensor * v = down;
    if (ggml_is_quantized(down->type)) {
        ggml_tensor * every_row = ggml_cast(ctx, ggml_arange(ctx, 0.0f, (float) n_ff, 1.0f), GGML_TYPE_I32);
        v = ggml_get_rows(ctx, down, every_row);                               // f32 [n_embd, n_ff]
    }
    ggml_tensor * v_stock = ggml_cast(ctx, ggml_transpose(ctx, v), keeps_type ? down->type : GGML_TYPE_F16);  // [n_ff, n_embd]
    return ggml_mul_mat(ctx, v_stock, u);                                     // [n_embd, n_tokens]
}

// K2 [D - r_f, F] and V [D, F] of a layer as the graph reads them: the tensors themselves, or in
// a paired file views of ffn_k2v (rows of K2's then V's elements; the kernels and stock ops
// address rows by the stride nb[1]). A view lives where its source does (spark-ops.cpp asks the
// source), so the device questions give the same answers for either layout.
struct spark_ffn_rows {
    ggml_tensor * k2;
    ggml_tensor * v;
};

static spark_ffn_rows spark_ffn_k2_v(ggml_context * ctx, const llama_model_spark_gemma2 & model, const llama_layer & layer) {
    if (!model.spark_ffn_paired) {
        return { layer.ffn_up, layer.ffn_down };
    }
    ggml_tensor * k2v = layer.ffn_up;  // ffn_up and ffn_down both name the paired tensor
    const int64_t n_embd = model.hparams.n_embd;
    const int64_t n_k2   = n_embd - (int64_t) model.spark_ffn_r;
    return {
        ggml_view_2d(ctx, k2v, n_k2,   k2v->ne[1], k2v->nb[1], 0),
        ggml_view_2d(ctx, k2v, n_embd, k2v->ne[1], k2v->nb[1], ggml_row_size(k2v->type, n_k2)),
    };
}

ggml_tensor * llama_model_spark_gemma2::graph::build_spark_ffn(const llama_model_spark_gemma2 & model, ggml_tensor * cur, int il) const {
    const auto & layer = model.layers[il];
    const auto [k2, v] = spark_ffn_k2_v(ctx0, model, layer);

    const int64_t n_ffn_r = model.spark_ffn_r;
    const int64_t n_ff    = layer.ffn_gate->ne[1];

    const int64_t n_tokens_cur = cur->ne[1];

    // the predictor scores are a dense product in both paths: s = K1 h[:r_f], [n_ff, n_tokens].
    // h[:r_f] is copied contiguous only when it is not: with more than one token its rows are
    // n_embd apart (the CPU's repacked GEMMs, AMX among them, take a contiguous src1 only); a
    // decode step's one row is contiguous already, so it costs no copy (one kernel less per
    // layer on a GPU)
    ggml_tensor * h1 = ggml_view_2d(ctx0, cur, n_ffn_r, n_tokens_cur, cur->nb[1], 0);
    if (!ggml_is_contiguous(h1)) {
        h1 = ggml_cont(ctx0, h1);
    }
    ggml_tensor * s  = build_lora_mm(layer.ffn_gate, h1);
    cb(s, "spark_ffn_score", il);

    const llama_spark_ffn_params & ffn = model.spark_ffn_params[il];
    const spark_op_params params = { ffn.layer, ffn.k, 0, 0.0f, SPARK_FFN_CUTOFF_TOP_K, 0.0f };

    // a layer whose weights sit on a device that does not run the Spark ops steps aside for the
    // dense graph there (said at load); the Spark backend may answer the dense path too
    bool dense_answered = false;
    if (!spark_ffn_steps_aside(layer)) {
        ggml_tensor * sparse = spark_build_sparse_ffn(ctx0, s, cur, k2, v, params,
                                                      [&](ggml_tensor * t, const char * name) { cb(t, name, il); },
                                                      &dense_answered);
        if (sparse != nullptr) {
            return sparse;
        }
    }

    ggml_tensor * h2 = ggml_cont(ctx0, ggml_view_2d(ctx0, cur, n_embd - n_ffn_r, n_tokens_cur, cur->nb[1], n_ffn_r*ggml_element_size(cur)));

    ggml_tensor * a = s;
    if (model.spark_ffn_k < (uint64_t) n_ff) {
        // theta = mean + std * z with the unbiased std
        ggml_tensor * centered = ggml_sub(ctx0, s, ggml_mean(ctx0, s));
        ggml_tensor * var      = ggml_scale(ctx0, ggml_mean(ctx0, ggml_sqr(ctx0, centered)), (float) n_ff / (float) (n_ff - 1));
        ggml_tensor * shift    = ggml_scale(ctx0, ggml_sqrt(ctx0, var), (float) model.spark_ffn_z);
        a = ggml_relu(ctx0, ggml_sub(ctx0, centered, shift));
        cb(a, "spark_ffn_soft", il);
    }
    a = spark_gelu_tanh(ctx0, a);
    cb(a, "spark_ffn_act", il);

    ggml_tensor * g = build_lora_mm(k2, h2);
    cb(g, "spark_ffn_value", il);

    ggml_tensor * u = ggml_mul(ctx0, a, g);
    cb(u, "spark_ffn_u", il);

    // the Spark backend's dense answer (a GPU's tensor cores), or a device whose out_prod cannot
    // take V's type (ggml-cuda's and ggml-vulkan's take f32 only): V's product as a matrix
    // product; else the outer-product sum (no copy of V)
    const bool by_mul_mat = dense_answered || !spark_down_out_prod_runs(v, n_tokens_cur);
    ggml_tensor * out = by_mul_mat ? spark_down_mul_mat(ctx0, v, u) : spark_down_out_prod(ctx0, v, u);
    cb(out, "spark_ffn_dense", il);
    return out;
}

// q1: [r, n_tokens, n_head, n_stream], q2: [H - r, ...] (RoPE'd, scaled, permuted)
// k, v: the layer's cache views as returned by get_k / get_v
ggml_tensor * llama_model_spark_gemma2::graph::build_spark_attn_dense(
        const llama_model_spark_gemma2 & model,
        ggml_tensor * q1, ggml_tensor * q2, ggml_tensor * k, ggml_tensor * v,
        ggml_tensor * kq_mask, const attn_rows & rows, int il) const {
    const int64_t n_r = model.spark_attn_r;

    // K cache [H, n_head_kv, n_kv, n_stream] -> the two parts, permuted to [part, n_kv, n_head_kv, n_stream]
    // (a quantized cache's part starts on a whole block: llama_init_from_model checks r; it is
    // converted to f32 first, as the K-shift does)
    auto k_part = [&](int64_t offset, int64_t width) {
        ggml_tensor * x = ggml_view_4d(ctx0, k, width, k->ne[1], k->ne[2], k->ne[3], k->nb[1], k->nb[2], k->nb[3],
                ggml_row_size(k->type, offset));
        if (ggml_is_quantized(k->type)) {
            x = ggml_cast(ctx0, x, GGML_TYPE_F32);
        }
        // copied contiguous: each part is a prefix or suffix of the cache's rows, and ggml-vulkan's
        // one-token matrix-vector product reads such a view wrongly (mean KL divergence 1.3 against
        // the CPU at -ub 1 on lavapipe, 1e-6 with the copies); small next to the scores
        return ggml_cont(ctx0, ggml_permute(ctx0, x, 0, 2, 1, 3));
    };
    ggml_tensor * k1 = k_part(0, n_r);
    ggml_tensor * k2 = k_part(n_r, k->ne[0] - n_r);

    // s1: [n_kv, n_tokens, n_head, n_stream]
    ggml_tensor * s1 = ggml_mul_mat(ctx0, k1, q1);
    ggml_prec_set_acc(s1, GGML_PREC_F32);
    if (hparams.attn_soft_cap) {
        const float cap = hparams.f_attn_logit_softcapping;
        s1 = ggml_scale(ctx0, ggml_tanh(ctx0, ggml_scale(ctx0, s1, 1.0f/cap)), cap);
    }
    cb(s1, "spark_attn_s1", il);

    // statistics over C only
    ggml_tensor * s1_valid = ggml_mul(ctx0, s1, rows.valid);
    ggml_tensor * mean     = ggml_div(ctx0, ggml_sum_rows(ctx0, s1_valid), rows.count);
    ggml_tensor * dev      = ggml_mul(ctx0, ggml_sub(ctx0, s1, mean), rows.valid);
    ggml_tensor * var      = ggml_div(ctx0, ggml_sum_rows(ctx0, ggml_sqr(ctx0, dev)), rows.count_m1);
    ggml_tensor * theta    = ggml_add(ctx0, mean, ggml_mul(ctx0, ggml_sqrt(ctx0, var), rows.z));
    cb(theta, "spark_attn_theta", il);

    // kept: s1 > theta, or s1 equal to the row maximum (the fallback when nothing exceeds theta;
    // otherwise the maximum is above theta anyway), or everything when |C| <= k
    ggml_tensor * s1_masked = ggml_add(ctx0, s1, kq_mask);
    ggml_tensor * row_max   = ggml_pool_1d(ctx0, s1_masked, GGML_OP_POOL_MAX, s1_masked->ne[0], s1_masked->ne[0], 0);
    ggml_tensor * above     = ggml_step(ctx0, ggml_sub(ctx0, s1_masked, theta));
    ggml_tensor * is_max    = spark_not_positive(ctx0, ggml_scale(ctx0, ggml_sub(ctx0, s1_masked, row_max), -1.0f)); // s1 >= max
    ggml_tensor * keep      = ggml_add(ctx0, ggml_add(ctx0, above, is_max), rows.keep_all);
    keep = ggml_mul(ctx0, ggml_clamp(ctx0, keep, 0.0f, 1.0f), rows.valid);
    cb(keep, "spark_attn_keep", il);

    // softmax over the kept positions (log 0 = -inf drops the others)
    ggml_tensor * w = ggml_soft_max(ctx0, ggml_add(ctx0, s1, ggml_log(ctx0, keep)));

    // times softplus(q2 . k2); finite everywhere, so the zero weights stay zero
    ggml_tensor * s2 = ggml_mul_mat(ctx0, k2, q2);
    ggml_prec_set_acc(s2, GGML_PREC_F32);
    w = ggml_mul(ctx0, w, ggml_softplus(ctx0, s2));
    cb(w, "spark_attn_w", il);

    // V: [n_kv, H, n_head_kv, n_stream] (a quantized cache, never transposed, converted to f32 first)
    const bool v_trans = v->nb[1] > v->nb[2];
    if (ggml_is_quantized(v->type)) {
        v = ggml_cast(ctx0, v, GGML_TYPE_F32);
    }
    v = ggml_permute(ctx0, v, 0, 2, 1, 3);
    if (!v_trans) {
        v = ggml_cont(ctx0, ggml_transpose(ctx0, v));
    }

    ggml_tensor * kqv = ggml_mul_mat(ctx0, v, w);      // [H, n_tokens, n_head, n_stream]
    ggml_tensor * cur = ggml_permute(ctx0, kqv, 0, 2, 1, 3);
    cur = ggml_cont_2d(ctx0, cur, cur->ne[0]*cur->ne[1], cur->ne[2]*cur->ne[3]);
    cb(cur, "spark_attn_dense", il);
    return cur;
}

// Q and K are split per head at r and each part RoPE'd as a rotary embedding of its own width,
// so the heads stay whole and contiguous. With stock ops that is one rope over the first r
// channels and one offset to the H - r after them (each rope copies the channels it does not
// rotate); where the layer runs the Spark attention, Q takes the Spark backend's spark_rope
// instead (both parts and the attention scale in one node: one kernel on a GPU, where K's
// second rope is fused with its cache store by ggml-cuda)
ggml_tensor * llama_model_spark_gemma2::graph::build_spark_attn(
        const llama_model_spark_gemma2 & model, ggml_tensor * cur, ggml_tensor * inp_pos,
        const llm_graph_input_attn_kv_iswa * inp_attn, ggml_custom_op_t attn_kernel,
        const attn_rows & rows, int il) const {
    const int64_t n_embd_head  = hparams.n_embd_head_k();
    const int64_t n_r          = model.spark_attn_r;
    const float   freq_base_l  = model.get_rope_freq_base (cparams, il);
    const float   freq_scale_l = model.get_rope_freq_scale(cparams, il);
    const bool    is_swa       = hparams.is_swa(il);

    auto [Qcur, Kcur, Vcur] = build_qkv(model.layers[il], cur, n_embd_head, n_head, n_head_kv, il);

    // `scale` multiplies every channel once: each rope scales the channels it rotates (its
    // attn_factor multiplies cos and sin) and copies the others, so Q's attention scale costs
    // no node of its own
    auto rope_parts = [&](ggml_tensor * x, float scale) {
        auto rope = [&](ggml_tensor * y, int64_t width) {
            return ggml_rope_ext(ctx0, y, inp_pos, nullptr, width, rope_type, n_ctx_orig,
                    freq_base_l, freq_scale_l, ext_factor, attn_factor * scale, beta_fast, beta_slow);
        };
        return ggml_rope_set_offset(rope(rope(x, n_r), n_embd_head - n_r), n_r);
    };

    // (r is even, in (0, H), with H - r even: load_hparams; not on an RPC device: its graphs keep
    // the stock ropes, as before the op; a server without the plugin refused a graph that
    // referenced the client's spark_rope node)
    ggml_custom_op_t rope_kernel = attn_kernel ? spark_kernel("spark_rope") : nullptr;
    const bool one_rope = rope_kernel != nullptr && ext_factor == 0.0f && rope_type == LLAMA_ROPE_TYPE_NEOX &&
                          !spark_weight_on_rpc(model.layers[il].wo);
    if (one_rope) {
        const spark_rope_params rp = { il, (int32_t) n_r, freq_base_l, freq_scale_l,
                                       attn_factor * hparams.f_attention_scale, 0 };
        Qcur = spark_rope_node(ctx0, rope_kernel, Qcur, inp_pos, rp);
    } else {
        Qcur = rope_parts(Qcur, hparams.f_attention_scale);
    }
    Kcur = rope_parts(Kcur, 1.0f);
    cb(Qcur, "Qcur", il);
    cb(Kcur, "Kcur", il);
    cb(Vcur, "Vcur", il);

    // store K and V in the cache
    const auto * mctx_iswa = inp_attn->mctx;
    const auto * mctx_cur  = is_swa ? mctx_iswa->get_swa() : mctx_iswa->get_base();

    // V and Q first, so that K's last rope is followed at once by the VIEW and SET_ROWS of its
    // store: ggml-cuda fuses that ROPE, VIEW, SET_ROWS run into one kernel (one launch less
    // per layer; the node order changes nothing else)
    ggml_build_forward_expand(gf, Vcur);
    ggml_build_forward_expand(gf, Qcur);

    const auto & k_idxs = is_swa ? inp_attn->get_k_idxs_swa() : inp_attn->get_k_idxs();
    const auto & v_idxs = is_swa ? inp_attn->get_v_idxs_swa() : inp_attn->get_v_idxs();
    ggml_build_forward_expand(gf, mctx_cur->cpy_k(ctx0, Kcur, k_idxs, il));
    ggml_build_forward_expand(gf, mctx_cur->cpy_v(ctx0, Vcur, v_idxs, il));

    ggml_tensor * kq_mask = is_swa ? inp_attn->get_kq_mask_swa() : inp_attn->get_kq_mask();
    ggml_tensor * k = mctx_cur->get_k(ctx0, il);
    ggml_tensor * v = mctx_cur->get_v(ctx0, il);

    if (attn_kernel) {
        return build_spark_attn_sparse(model, attn_kernel, Qcur, k, v, kq_mask, il);
    }
    // each head's two parts, then the same stream split and permutation as build_attn_mha
    const int64_t n_stream = k->ne[3];
    auto part = [&](int64_t offset, int64_t width) {
        return ggml_cont(ctx0, ggml_view_3d(ctx0, Qcur, width, Qcur->ne[1], Qcur->ne[2],
                Qcur->nb[1], Qcur->nb[2], offset*ggml_element_size(Qcur)));
    };
    auto split = [&](ggml_tensor * x) {
        x = ggml_view_4d(ctx0, x, x->ne[0], x->ne[1], x->ne[2]/n_stream, n_stream,
                x->nb[1], x->nb[2], x->nb[2]*(x->ne[2]/n_stream), 0);
        return ggml_permute(ctx0, x, 0, 2, 1, 3);
    };
    return build_spark_attn_dense(model, split(part(0, n_r)), split(part(n_r, n_embd_head - n_r)), k, v, kq_mask, rows, il);
}

// KV streams (one per sequence unless the cache is unified, e.g. llama-server -np 4 or
// llama-perplexity over several chunks): the ubatch's tokens come in equal blocks, one per
// stream, as build_attn_mha splits them; the kernel takes q [H, n_head, T/S, S], k and v
// [H, n_head_kv, n_kv, S], the mask [n_kv, T/S, 1, S]
ggml_tensor * llama_model_spark_gemma2::graph::build_spark_attn_sparse(
        const llama_model_spark_gemma2 & model, ggml_custom_op_t attn_kernel,
        ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, ggml_tensor * kq_mask, int il) const {
    const int64_t n_embd_head = hparams.n_embd_head_k();
    const int64_t n_stream    = k->ne[3];
    const int64_t n_tokens_s  = q->ne[2]/n_stream;
    q = ggml_reshape_4d(ctx0, q, n_embd_head, n_head, n_tokens_s, n_stream);

    // the kernel addresses V as [H, n_head_kv, n_kv, S]; the non-flash-attention cache stores it transposed
    if (v->nb[1] > v->nb[2]) {
        v = ggml_permute(ctx0, v, 2, 1, 0, 3);
    }
    ggml_tensor * args[4] = { q, k, v, kq_mask };
    const llama_spark_attn_params & ap = model.spark_attn_params[il];
    ggml_tensor * cur = spark_node(ctx0, attn_kernel, args, 4, n_embd_head, n_head, n_tokens_s, n_stream,
            spark_op_params{ ap.layer, ap.k, ap.r, ap.softcap, 0, 0.0f });
    cb(cur, "spark_attn_sparse", il);
    return ggml_reshape_2d(ctx0, cur, n_embd_head*n_head, n_tokens_s*n_stream);
}

//
// the graph
//

// Says which layers sit on a device that does not run the Spark ops, one line per run of such
// layers on one device: on an rpc-server without the plugin their Spark nodes run on the CPU and
// copy what they read from there at every evaluation; elsewhere (Vulkan, Metal, SYCL, HIP, a
// CUDA build without the plugin's launchers) they step aside for the dense graph there.
static void spark_say_layers_off_the_spark_devices(const llama_model_spark_gemma2 & model) {
    const size_t n = model.layers.size();
    std::vector<bool> aside(n), on_cpu(n);
    for (size_t il = 0; il < n; ++il) {
        const auto & layer = model.layers[il];
        const bool off = !spark_ops_run_where({ "spark_attn", "spark_rope", "spark_ffn_fused", "spark_ffn_sum", "spark_ffn_up", "spark_ffn_down" },
                                              { layer.ffn_up, layer.ffn_down, layer.wo });
        const bool rpc = spark_weight_on_rpc(layer.ffn_up);
        aside[il]  = off && !rpc;
        on_cpu[il] = off && rpc;
    }
    auto weight = [&](int il) { return model.layers[il].ffn_up; };
    spark_each_run_off(aside, weight, [](int first, int last, const char * where) {
        LLAMA_LOG_WARN("spark-gemma2: layers %d-%d are on %s, which does not run the Spark ops: they run the dense "
                       "graph there, stock ops over every neuron and position (a lower -ngl keeps them on the CPU's "
                       "Spark kernels; a CUDA build with the plugin's CUDA kernels runs them there)\n", first, last, where);
    });
    spark_each_run_off(on_cpu, weight, [](int first, int last, const char * where) {
        LLAMA_LOG_WARN("spark-gemma2: layers %d-%d are on %s, which does not run the Spark ops: their Spark nodes run "
                       "on the CPU and copy what they read from there at every evaluation (a lower -ngl keeps them on "
                       "the CPU; an rpc-server with the plugin runs them there)\n", first, last, where);
    });
}

// The FFN row tensors, of which a Spark step reads the rows its neurons choose: every layer's K2
// and V (ffn_up, ffn_down; in a paired file both are ffn_k2v, one tensor)
static std::set<const ggml_tensor *> spark_ffn_row_tensors(const llama_model_spark_gemma2 & model) {
    std::set<const ggml_tensor *> rows;
    for (const auto & layer : model.layers) {
        for (const ggml_tensor * t : { layer.ffn_up, layer.ffn_down }) {
            if (t != nullptr) {
                rows.insert(t);
            }
        }
    }
    return rows;
}

// Whether the embedding is read by rows, one a token (get_rows): the tied output is a copy of
// its own (made at load, repacked, or on a device), so no step reads the embedding's bytes whole
static bool spark_embd_by_rows(const llama_model_spark_gemma2 & model) {
    return model.output != nullptr && model.output != model.tok_embd && model.output->buffer != nullptr;
}

// The loaded FFN row tensors (K2, V) in host memory go to the Spark backend, which reads them
// into memory now when the load's plan found that the whole model fits (spark_memory_loaded)
static void spark_read_rows_now(const llama_model_spark_gemma2 & model) {
    const auto loaded = (spark_memory_loaded_t) spark_proc("spark_memory_loaded");
    if (loaded == nullptr) {
        return;
    }
    std::vector<spark_bytes> ranges;
    for (const ggml_tensor * t : spark_ffn_row_tensors(model)) {
        if (t->data != nullptr && t->buffer != nullptr && ggml_backend_buffer_is_host(t->buffer)) {
            ranges.push_back({ t->data, (uint64_t) ggml_nbytes(t) });
        }
    }
    loaded(ranges.data(), ranges.size());
}

// The loaded weights every token reads whole (every tensor in host memory but the FFN rows and an
// embedding read by rows) go to the Spark backend, which reads those not in memory now when the
// load's plan found that the rows stream (spark_memory_resident): with the rows read on demand the
// loader only asked for them ahead
static void spark_read_whole_now(const llama_model_spark_gemma2 & model) {
    const auto resident = (spark_memory_resident_t) spark_proc("spark_memory_resident");
    if (resident == nullptr) {
        return;
    }
    std::set<const ggml_tensor *> by_rows = spark_ffn_row_tensors(model);
    if (spark_embd_by_rows(model)) {
        by_rows.insert(model.tok_embd);
    }
    std::vector<spark_bytes> ranges;
    std::set<const void *> seen;  // a tied output is the embedding's bytes again
    for (const auto & [name, t] : model.tensors_by_name) {
        if (by_rows.count(t) == 0 && t->data != nullptr && t->buffer != nullptr &&
            ggml_backend_buffer_is_host(t->buffer) && seen.insert(t->data).second) {
            ranges.push_back({ t->data, (uint64_t) ggml_nbytes(t) });
        }
    }
    resident(ranges.data(), ranges.size());
}

bool llama_model_spark_gemma2::load_tensors(llama_model_loader & ml) {
    if (!llama_model_base::load_tensors(ml)) {
        return false;
    }
    if (!ml.no_alloc) {  // not in the memory-fit pass, whose placements are trials
        spark_say_layers_off_the_spark_devices(*this);
        spark_read_rows_now(*this);
        spark_read_whole_now(*this);
    }
    return true;
}

// whether the load locks the model's pages in memory (--load-mode mlock / mmap+mlock)
static bool spark_weights_locked(const llama_model_params & params) {
    return params.load_mode == LLAMA_LOAD_MODE_MLOCK || params.load_mode == LLAMA_LOAD_MODE_MMAP_MLOCK;
}

void llama_model_spark_gemma2::check_weights_before_loading() {
    const auto plan = (spark_memory_plan_t) spark_proc("spark_memory_plan");
    if (plan == nullptr) {
        return;  // no Spark backend: the dense graph reads every weight, as stock's does
    }
    const bool mlock = spark_weights_locked(params);
    // K2 and V are read by rows where the Spark FFN ops run and the pages are not locked (the
    // loader never locks on-demand tensors, --lazy-mode on)
    std::set<const ggml_tensor *> row_tensors;
    if (spark_proc("spark_ffn_fused") != nullptr) {
        for (const ggml_tensor * t : spark_ffn_row_tensors(*this)) {
            if (!mlock || (ml != nullptr && ml->lazy.has(t))) {
                row_tensors.insert(t);
            }
        }
    }
    const uint64_t n_ff = hparams.n_ff();
    const bool embd_by_rows = spark_embd_by_rows(*this);
    spark_memory_need need = {};
    std::set<std::string> mapped;  // a tied output is the embedding's bytes of the file again
    for (const auto & [name, t] : tensors_by_name) {
        const uint64_t bytes = ggml_nbytes(t);
        if (t->buffer == nullptr) {  // mapped by the loader next
            if (!mapped.insert(name).second) {
                continue;
            }
            if (row_tensors.count(t) != 0) {
                need.mapped_rows    += bytes;
                need.rows_per_token += (bytes * std::min<uint64_t>(spark_ffn_k, n_ff) + n_ff - 1) / n_ff;
            } else if (t == tok_embd && embd_by_rows) {
                need.mapped_lookup  += bytes;
                need.rows_per_token += t->nb[1];
            } else {
                need.mapped_whole += bytes;
            }
            continue;
        }
        // a buffer filled at load: host memory if the CPU's (repacked, or read without mmap)
        ggml_backend_dev_t dev = ggml_backend_buft_get_device(ggml_backend_buffer_get_type(t->buffer));
        const auto kind = dev ? ggml_backend_dev_type(dev) : GGML_BACKEND_DEVICE_TYPE_CPU;
        if (kind == GGML_BACKEND_DEVICE_TYPE_CPU || kind == GGML_BACKEND_DEVICE_TYPE_ACCEL) {
            need.made_at_load += bytes;
        }
    }
    char why[1024] = {};
    if (plan(&need, why, sizeof(why)) == 1) {
        throw std::runtime_error(why);
    }
}

void llama_model_spark_gemma2::check_host_memory(size_t bytes, const char * what) const {
    const auto check = (spark_memory_context_t) spark_proc("spark_memory_context");
    if (check == nullptr) {
        return;  // no Spark backend: no plan was made
    }
    const bool mlock = spark_weights_locked(params);
    char why[1024] = {};
    if (check(bytes, mlock ? 1 : 0, what, why, sizeof(why)) == 1) {
        throw std::runtime_error(why);
    }
}

llama_model_spark_gemma2::graph::graph(const llama_model & model_base, const llm_graph_params & params) : llm_graph_context(params) {
    const auto & model = static_cast<const llama_model_spark_gemma2 &>(model_base);

    GGML_ASSERT(hparams.n_embd_head_k() == hparams.n_embd_head_v());

    ggml_tensor * cur;
    ggml_tensor * inpL;

    inpL = build_inp_embd(model.tok_embd);

    inpL = ggml_scale(ctx0, inpL, sqrtf(n_embd));
    cb(inpL, "inp_scaled", -1);

    ggml_tensor * inp_pos = build_inp_pos();

    auto * inp_attn = build_attn_inp_kv_iswa();

    ggml_tensor * inp_out_ids = build_inp_out_ids();

    ggml_custom_op_t attn_kernel = spark_kernel("spark_attn");

    // the mask statistics are shared by all layers of one kind; only the dense attention uses
    // them (no Spark backend, or one that answers the dense path for this ubatch's size)
    attn_rows rows_global;
    attn_rows rows_swa;
    bool have_rows = false;
    auto rows_of = [&](bool swa) -> const attn_rows & {
        if (!have_rows) {
            rows_global = build_spark_attn_rows(inp_attn->get_kq_mask(),     model.spark_attn_k);
            rows_swa    = build_spark_attn_rows(inp_attn->get_kq_mask_swa(), model.spark_attn_k);
            have_rows   = true;
        }
        return swa ? rows_swa : rows_global;
    };
    static const attn_rows no_rows = {};

    for (int il = 0; il < n_layer; ++il) {
        const bool is_swa = hparams.is_swa(il);

        cur = build_norm(inpL, model.layers[il].attn_norm, NULL, LLM_NORM_RMS, il);
        cb(cur, "attn_norm", il);

        // the dense attention where the layer's device does not run spark_attn (said at load)
        // or where the Spark backend answers so for this ubatch (a GPU above its switch point)
        ggml_custom_op_t attn_layer = attn_kernel;
        const auto * mctx_layer = is_swa ? inp_attn->mctx->get_swa() : inp_attn->mctx->get_base();
        if (attn_layer != nullptr && (spark_attn_steps_aside(model.layers[il]) ||
                                      spark_attn_takes_dense(model.layers[il].wo, n_tokens) ||
                                      !spark_attn_reads_cache(model.layers[il], mctx_layer->get_k(ctx0, il)->type,
                                                              mctx_layer->get_v(ctx0, il)->type))) {
            attn_layer = nullptr;
        }
        cur = build_spark_attn(model, cur, inp_pos, inp_attn, attn_layer, attn_layer ? no_rows : rows_of(is_swa), il);
        cur = build_lora_mm(model.layers[il].wo, cur, model.layers[il].wo_s);
        cb(cur, "attn_out", il);

        if (il == n_layer - 1 && inp_out_ids) {
            cur  = ggml_get_rows(ctx0,  cur, inp_out_ids);
            inpL = ggml_get_rows(ctx0, inpL, inp_out_ids);
        }
        cur = build_norm(cur, model.layers[il].attn_post_norm, NULL, LLM_NORM_RMS, il);
        cb(cur, "attn_post_norm", il);

        ggml_tensor * sa_out = ggml_add(ctx0, cur, inpL);
        cb(sa_out, "sa_out", il);

        cur = build_norm(sa_out, model.layers[il].ffn_norm, NULL, LLM_NORM_RMS, il);
        cb(cur, "ffn_norm", il);

        cur = build_spark_ffn(model, cur, il);
        cb(cur, "ffn_out", il);

        cur = build_norm(cur, model.layers[il].ffn_post_norm, NULL, LLM_NORM_RMS, -1);
        cb(cur, "ffn_post_norm", -1);

        cur = ggml_add(ctx0, cur, sa_out);

        cur = build_cvec(cur, il);
        cb(cur, "l_out", il);

        inpL = cur;
    }
    cur = inpL;

    cur = build_norm(cur, model.output_norm, NULL, LLM_NORM_RMS, -1);

    cb(cur, "result_norm", -1);
    res->t_embd = cur;

    cur = build_lora_mm(model.output, cur, model.output_s);

    if (hparams.f_final_logit_softcapping > 0.0f) {
        cur = ggml_scale(ctx0, cur, 1.0f / hparams.f_final_logit_softcapping);
        cur = ggml_tanh(ctx0, cur);
        cur = ggml_scale(ctx0, cur, hparams.f_final_logit_softcapping);
    }

    cb(cur, "result_output", -1);
    res->t_logits = cur;

    ggml_build_forward_expand(gf, cur);
}
