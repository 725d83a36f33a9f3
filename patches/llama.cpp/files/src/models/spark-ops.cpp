// The graph helpers of spark-ops.h.

#include "spark-ops.h"

#include "llama-impl.h"

#include "ggml-backend.h"

#include <algorithm>
#include <atomic>
#include <cstring>

void * spark_proc(const char * name) {
    ggml_backend_reg_t reg = ggml_backend_reg_by_name("Spark");
    if (reg == nullptr) {
        return nullptr;
    }
    return ggml_backend_reg_get_proc_address(reg, name);
}

ggml_custom_op_t spark_kernel(const char * name) {
    if (spark_proc("spark_op_set_params") == nullptr) {
        if (ggml_backend_reg_by_name("Spark") != nullptr) {
            static std::atomic<bool> warned{false};
            if (!warned.exchange(true)) {
                LLAMA_LOG_WARN("%s: the Spark backend does not export spark_op_set_params (built for another "
                               "llama.cpp?): the dense graph runs\n", __func__);
            }
        }
        return nullptr;
    }
    return (ggml_custom_op_t) spark_proc(name);
}

ggml_tensor * spark_node(ggml_context * ctx, ggml_custom_op_t fun, ggml_tensor ** args, int n_args,
                         int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3, const spark_op_params & p) {
    ggml_tensor * node = ggml_custom_4d(ctx, GGML_TYPE_F32, ne0, ne1, ne2, ne3, args, n_args, fun, GGML_N_TASKS_MAX, nullptr);
    spark_op_set_params_t set_params = (spark_op_set_params_t) spark_proc("spark_op_set_params");
    GGML_ASSERT(set_params != nullptr && set_params(node, &p) == 0);
    return node;
}

ggml_tensor * spark_rope_node(ggml_context * ctx, ggml_custom_op_t fun, ggml_tensor * x, ggml_tensor * pos,
                              const spark_rope_params & p) {
    static_assert(sizeof(spark_rope_params) == sizeof(spark_op_params), "spark_rope_params is a view of the block");
    spark_op_params block;
    memcpy(&block, &p, sizeof(block));
    ggml_tensor * args[2] = { x, pos };
    return spark_node(ctx, fun, args, 2, x->ne[0], x->ne[1], x->ne[2], 1, block);
}

// the device of the non-host buffer that holds w (a view: its source's); nullptr for host memory
// or no buffer yet (known is set false when ggml names no device for a non-host buffer)
static ggml_backend_dev_t spark_weight_device(const ggml_tensor * w, bool & known) {
    known = true;
    while (w != nullptr && w->buffer == nullptr && w->view_src != nullptr) {
        w = w->view_src;  // a graph's view of a weight gets its buffer when the graph is allocated
    }
    if (w == nullptr || w->buffer == nullptr) {
        return nullptr;
    }
    ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(w->buffer);
    if (ggml_backend_buft_is_host(buft)) {
        return nullptr;
    }
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
    known = dev != nullptr;
    return dev;
}

bool spark_weight_device_runs(const ggml_tensor * w, const std::function<ggml_tensor *(ggml_context *)> & make_node) {
    bool known = true;
    ggml_backend_dev_t dev = spark_weight_device(w, known);
    if (dev == nullptr) {
        return known;
    }
    ggml_init_params params = { 16 * ggml_tensor_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(params);
    if (ctx == nullptr) {
        return false;
    }
    const bool runs = ggml_backend_dev_supports_op(dev, make_node(ctx));
    ggml_free(ctx);
    return runs;
}

// whether ggml would run a node of the Spark op `fun` where `weight` lives (spark_ops_run_where):
// the backends that run Spark ops decide by the op's function alone (patch 0008's launcher
// table, patch 0009's named ops), so a one-element source stands in for the op's real ones
static bool spark_op_runs_on_weight_device(const ggml_tensor * weight, ggml_custom_op_t fun) {
    return spark_weight_device_runs(weight, [&](ggml_context * ctx) {
        ggml_tensor * arg = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 1);
        return ggml_custom_4d(ctx, GGML_TYPE_F32, 1, 1, 1, 1, &arg, 1, fun, 1, nullptr);
    });
}

bool spark_ops_run_where(std::initializer_list<const char *> ops, std::initializer_list<const ggml_tensor *> weights) {
    for (const char * name : ops) {
        ggml_custom_op_t fun = spark_kernel(name);
        if (fun == nullptr) {
            continue;  // not exported: the graph never builds it
        }
        for (const ggml_tensor * w : weights) {
            if (!spark_op_runs_on_weight_device(w, fun)) {
                return false;
            }
        }
    }
    return true;
}

void spark_each_run_off(const std::vector<bool> & off, const std::function<const ggml_tensor *(int)> & weight,
                        const std::function<void(int, int, const char *)> & say) {
    const int n = (int) off.size();
    for (int il = 0; il < n;) {
        if (!off[il]) {
            ++il;
            continue;
        }
        const char * where = ggml_backend_buffer_name(weight(il)->buffer);
        int end = il + 1;
        while (end < n && off[end] && strcmp(ggml_backend_buffer_name(weight(end)->buffer), where) == 0) {
            ++end;
        }
        say(il, end - 1, where);
        il = end;
    }
}

void spark_ffn_warn_dense(const char * why) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
        LLAMA_LOG_WARN("%s: %s: the FFN runs on the dense graph\n", __func__, why);
    }
}

// the name of the backend registry of the device that holds w ("CPU" for host memory and for a
// tensor not yet in a buffer), or nullptr when ggml does not say
static const char * spark_weight_backend(const ggml_tensor * w) {
    bool known = true;
    ggml_backend_dev_t dev = spark_weight_device(w, known);
    if (dev == nullptr) {
        return known ? "CPU" : nullptr;
    }
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    return reg ? ggml_backend_reg_name(reg) : nullptr;
}

bool spark_weight_on_rpc(const ggml_tensor * w) {
    const char * name = spark_weight_backend(w);
    return name != nullptr && strncmp(name, "RPC", 3) == 0;  // "RPC", or "RPC[host:port]" per server
}

bool spark_ffn_ask_tiling(const ggml_tensor * w, int64_t n_tokens, int64_t n_ff, int64_t n_embd, spark_ffn_tiling & out) {
    if (ggml_backend_reg_by_name("Spark") == nullptr) {
        return false;
    }
    spark_ffn_tiling_t tiling = (spark_ffn_tiling_t) spark_proc("spark_ffn_tiling");
    if (tiling == nullptr) {
        spark_ffn_warn_dense("the Spark backend does not export spark_ffn_tiling (built for another llama.cpp?)");
        return false;
    }
    if (tiling(spark_weight_backend(w), n_tokens, n_ff, n_embd, &out) != 0) {
        spark_ffn_warn_dense("spark_ffn_tiling refused the ubatch");
        return false;
    }
    const bool fused_ok = out.path == SPARK_FFN_PATH_FUSED && out.n_chunk >= 1 && out.n_chunk <= n_ff;
    if (!fused_ok && out.path != SPARK_FFN_PATH_TWO_STAGE && out.path != SPARK_FFN_PATH_DENSE) {
        spark_ffn_warn_dense("spark_ffn_tiling answered no valid path");
        return false;
    }
    return true;
}

bool spark_attn_takes_dense(const ggml_tensor * w, int64_t n_tokens) {
    spark_attn_path_t ask = (spark_attn_path_t) spark_proc("spark_attn_path");
    int32_t path = SPARK_ATTN_PATH_SPARSE;
    if (ask == nullptr || ask(spark_weight_backend(w), std::max<int64_t>(n_tokens, 1), &path) != 0) {
        return false;
    }
    return path == SPARK_ATTN_PATH_DENSE;
}

ggml_tensor * spark_build_sparse_ffn(ggml_context * ctx, ggml_tensor * s, ggml_tensor * h, ggml_tensor * k2,
                                     ggml_tensor * v, const spark_op_params & p,
                                     const std::function<void(ggml_tensor *, const char *)> & name,
                                     bool * dense) {
    const int64_t n_ff = s->ne[0], n_embd = h->ne[0], n_tokens = h->ne[1];
    spark_ffn_tiling tiling = {};
    if (!spark_ffn_ask_tiling(k2, std::max<int64_t>(n_tokens, 1), n_ff, n_embd, tiling)) {
        return nullptr;
    }
    if (tiling.path == SPARK_FFN_PATH_DENSE) {
        if (dense != nullptr) {
            *dense = true;
        }
        return nullptr;
    }
    if (tiling.path == SPARK_FFN_PATH_FUSED) {
        ggml_custom_op_t fused_kernel = spark_kernel("spark_ffn_fused");
        ggml_custom_op_t sum_kernel   = spark_kernel("spark_ffn_sum");
        if (!fused_kernel || !sum_kernel) {
            spark_ffn_warn_dense("the Spark backend chose the fused path but does not export spark_ffn_fused and spark_ffn_sum");
            return nullptr;
        }
        // partial[:, :, c] = sum_j u_j V_j over the kept neurons j of chunk c (n_chunk contiguous
        // chunks of n_ff); the sum adds them in chunk order, so no result depends on the threads
        ggml_tensor * fused_args[4] = { s, h, k2, v };
        ggml_tensor * partial = spark_node(ctx, fused_kernel, fused_args, 4, n_embd, n_tokens, tiling.n_chunk, 1, p);
        if (tiling.n_chunk == 1) {  // the one partial is the output (CUDA adds its chunks itself)
            ggml_tensor * out = ggml_reshape_2d(ctx, partial, n_embd, n_tokens);
            name(out, "spark_ffn_sparse");
            return out;
        }
        name(partial, "spark_ffn_partial");
        ggml_tensor * out = spark_node(ctx, sum_kernel, &partial, 1, n_embd, n_tokens, 1, 1, p);
        name(out, "spark_ffn_sparse");
        return out;
    }
    ggml_custom_op_t up_kernel   = spark_kernel("spark_ffn_up");
    ggml_custom_op_t down_kernel = spark_kernel("spark_ffn_down");
    if (!up_kernel || !down_kernel) {
        spark_ffn_warn_dense("the Spark backend chose the two-stage path but does not export spark_ffn_up and spark_ffn_down");
        return nullptr;
    }
    // u = gelu_tanh(soft(s)) * (K2 h[r_f:]) for the kept neurons only, neuron-major [n_tokens, n_ff]
    ggml_tensor * up_args[3] = { s, h, k2 };
    ggml_tensor * u = spark_node(ctx, up_kernel, up_args, 3, n_tokens, n_ff, 1, 1, p);
    name(u, "spark_ffn_u_sparse");
    // out = sum_j u_j V_j over the kept neurons
    ggml_tensor * down_args[2] = { u, v };
    ggml_tensor * out = spark_node(ctx, down_kernel, down_args, 2, n_embd, n_tokens, 1, 1, p);
    name(out, "spark_ffn_sparse");
    return out;
}
