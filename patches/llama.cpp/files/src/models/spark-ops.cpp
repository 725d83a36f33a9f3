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
