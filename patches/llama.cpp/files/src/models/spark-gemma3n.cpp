// Gemma 3n's sparse FFN layers on the Spark backend's ops.
//
// Gemma 3n (gemma3n.cpp) applies Spark's statistical top-k to the FFN of its first
// n_layer_sparsity layers: gate = W_gate x, theta = mean(gate) + std(gate) * f_sparsity_std_mul
// (unbiased std; the multiplier is Q(0.95), so ~5 % of the neurons pass), then
// out = W_down (gelu(relu(gate - theta)) * (W_up x)). Upstream computes all of it densely.
// When a ggml backend registry entry named "Spark" exports spark_ffn_up (the plugin loaded with
// GGML_BACKEND_PATH), those layers run as:
//   gate = W_gate x                                   stock ggml_mul_mat (every neuron's score)
//   u    = spark_ffn_up(gate, x, W_up)                 threshold, gelu_tanh and the up dot
//                                                      products of the kept neurons only
//   out  = W_down u                                    stock ggml_mul_mat
// W_up's rows are read one neuron at a time, so gemma3n.cpp loads them as row gathers (out of
// repacked CPU buffers) when the entry is there. W_down stays in the file's layout (quantization
// blocks along n_ff, so one neuron's weights are a strided column): its product is dense.
// Without the entry, or with LoRA adapters on the model (the op reads W_up itself), nothing
// here runs and the graph is upstream's.

#include "models.h"
#include "spark-ops.h"

#include <atomic>

bool llama_model_gemma3n::spark_sparse_ffn_available() {
    return spark_kernel("spark_ffn_up") != nullptr;
}

ggml_tensor * llama_model_gemma3n::graph::build_spark_ffn(ggml_tensor * cur, int il) {
    if (!spark_sparse_ffn_available()) {
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
    const int64_t n_ff         = layer.ffn_gate->ne[1];
    const int64_t n_tokens_cur = cur->ne[1];

    ggml_tensor * gate = build_lora_mm(layer.ffn_gate, cur);  // [n_ff, n_tokens]
    cb(gate, "ffn_gate", il);

    // u [n_tokens, n_ff]: neuron j's values for every token, 0 for the neurons a token dropped
    const spark_op_params params = { il, 0, 0, 0.0f, SPARK_FFN_CUTOFF_STD_MUL, f_sparsity_std_mul };
    ggml_tensor * args[3] = { gate, cur, layer.ffn_up };
    ggml_tensor * u = spark_node(ctx0, spark_kernel("spark_ffn_up"), args, 3, n_tokens_cur, n_ff, 1, 1, params);
    cb(u, "spark_ffn_u_sparse", il);

    u = n_tokens_cur == 1 ? ggml_reshape_2d(ctx0, u, n_ff, 1) : ggml_cont(ctx0, ggml_transpose(ctx0, u));  // [n_ff, n_tokens]
    return build_lora_mm(layer.ffn_down, u);
}
