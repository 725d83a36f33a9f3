// The graph helpers of spark-ops.h.

#include "spark-ops.h"

#include "llama-impl.h"

#include "ggml-backend.h"

#include <atomic>

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

void spark_ffn_warn_dense(const char * why) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
        LLAMA_LOG_WARN("%s: %s: the FFN runs on the dense graph\n", __func__, why);
    }
}

bool spark_ffn_ask_tiling(int64_t n_tokens, int64_t n_ff, int64_t n_embd, spark_ffn_tiling & out) {
    if (ggml_backend_reg_by_name("Spark") == nullptr) {
        return false;
    }
    spark_ffn_tiling_t tiling = (spark_ffn_tiling_t) spark_proc("spark_ffn_tiling");
    if (tiling == nullptr) {
        spark_ffn_warn_dense("the Spark backend does not export spark_ffn_tiling (built for another llama.cpp?)");
        return false;
    }
    if (tiling(n_tokens, n_ff, n_embd, &out) != 0) {
        spark_ffn_warn_dense("spark_ffn_tiling refused the ubatch");
        return false;
    }
    const bool fused_ok = out.path == SPARK_FFN_PATH_FUSED && out.n_chunk >= 1 && out.n_chunk <= n_ff;
    if (!fused_ok && out.path != SPARK_FFN_PATH_TWO_STAGE) {
        spark_ffn_warn_dense("spark_ffn_tiling answered no valid path");
        return false;
    }
    return true;
}
