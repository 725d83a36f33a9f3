// The C interface between the graphs that use the Spark backend (spark-gemma2.cpp, and Gemma 3n's
// sparse layers through spark-ops.h) and the procs of its "Spark" registry entry beyond its
// custom ops (docs/INTERFACES.md of the Spark project). Plain C, so that the backend checks its
// mirror of it with a C compiler.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_tensor;

// the ways the FFN of a ubatch runs
enum spark_ffn_path {
    SPARK_FFN_PATH_FUSED     = 1, // spark_ffn_fused into n_chunk partial outputs, then spark_ffn_sum (n_chunk > 1)
    SPARK_FFN_PATH_TWO_STAGE = 2, // spark_ffn_up (gated values), then spark_ffn_down (V rows)
    SPARK_FFN_PATH_DENSE     = 3, // no Spark op: the graph's dense FFN of stock ops, V's product a matrix
                                  // product over a stock-layout copy of V (a GPU's tensor cores, big ubatches)
};

// how the FFN of one ubatch runs
struct spark_ffn_tiling {
    int32_t path;    // enum spark_ffn_path
    int32_t n_chunk; // the fused path's chunks P, 1 <= P <= n_ff (1 on the other paths)
};

// "spark_ffn_tiling": the path and chunk count of a ubatch of n_tokens tokens through an FFN of
// n_ff neurons and width n_embd whose weights are on a device of the ggml backend registry named
// `backend` ("CPU", "CUDA", "RPC", ...; NULL when not known). Writes *out and returns 0, or
// returns -1 and leaves *out alone (a size below 1, out NULL). n_chunk 1 on the fused path: the
// fused node's one partial is the output (no spark_ffn_sum node)
typedef int (*spark_ffn_tiling_t)(const char * backend, int64_t n_tokens, int64_t n_ff, int64_t n_embd,
                                  struct spark_ffn_tiling * out);

// the ways the attention of a ubatch runs
enum spark_attn_path {
    SPARK_ATTN_PATH_SPARSE = 1, // spark_attn
    SPARK_ATTN_PATH_DENSE  = 2, // no Spark op: the graph's dense attention of stock ops
};

// "spark_attn_path": the path (enum spark_attn_path) of a ubatch of n_tokens tokens through an
// attention layer whose weights are on a device of the ggml backend registry named `backend`
// (NULL when not known). Writes *out and returns 0, or returns -1 and leaves *out alone
// (n_tokens below 1, out NULL)
typedef int (*spark_attn_path_t)(const char * backend, int64_t n_tokens, int32_t * out);

// how an FFN op sets a token's threshold theta = mean + std * z over its n_ff scores (SPEC 1)
enum spark_ffn_cutoff {
    SPARK_FFN_CUTOFF_TOP_K   = 0, // z = Q(1 - k/n_ff) from k (spark-gemma2; k >= n_ff keeps every neuron, unshifted)
    SPARK_FFN_CUTOFF_STD_MUL = 1, // z = ffn_z as given (Gemma 3n's f_sparsity_std_mul = Q(0.95)); k unused
};

// the parameters of a Spark custom op, which its node carries in its own op_params (stored by
// spark_op_set_params), so that the node holds no pointer of the process that built the graph
// and can run in another one (ggml-rpc's named custom ops); ggml's userdata is not used
struct spark_op_params {
    int32_t layer;      // for statistics and messages
    int32_t k;          // k_f (the FFN ops with SPARK_FFN_CUTOFF_TOP_K) or k_a (spark_attn)
    int32_t r;          // r_a (spark_attn), 0 for the FFN ops
    float   softcap;    // spark_attn's logit soft-cap (0 = off), 0 for the FFN ops
    int32_t ffn_cutoff; // enum spark_ffn_cutoff (the FFN ops), 0 for spark_attn
    float   ffn_z;      // the std multiplier of SPARK_FFN_CUTOFF_STD_MUL (finite), 0 otherwise
};

// spark_rope's view of the parameter block (the same 24 bytes as struct spark_op_params; the graph
// copies it into one for spark_op_set_params): a head of width H is two rotary embeddings, the
// first over channels 0..r, the second over r..H, each NEOX-paired (channel i with i + width/2)
// with theta_i = pos * freq_scale * freq_base^(-2i/width), every output channel times scale
struct spark_rope_params {
    int32_t layer;      // for messages
    int32_t r;          // the first part's width (r_a: even, 0 < r < H, H even)
    float   freq_base;  // > 0
    float   freq_scale; // llama.cpp's rope frequency scale (1 without linear scaling)
    float   scale;      // multiplies every channel: attn_factor, and Q's attention scale for Q
    int32_t reserved;   // 0
};

// "spark_op_set_params": stores *p in node, a GGML_OP_CUSTOM node made with one of the entry's
// custom ops, before the graph is computed. Returns 0, or -1 and changes nothing (node or p NULL,
// node not a custom op)
typedef int (*spark_op_set_params_t)(struct ggml_tensor * node, const struct spark_op_params * p);

// a model's weights in host memory by how they are held and read, counted by the graph at load
// before their data is read (bytes; weights on another device are not counted)
struct spark_memory_need {
    uint64_t made_at_load;   // host memory filled at load: repacked for the CPU, or read without mmap
    uint64_t mapped_whole;   // mapped from the file and read whole by every token (attention, the FFN
                             // predictor K1, norms, the output matrix; K2 and V too under --load-mode mlock or
                             // where the Spark FFN ops do not run)
    uint64_t mapped_rows;    // mapped K2 and V of the layers the Spark FFN ops run: a token reads rows
    uint64_t mapped_lookup;  // the mapped token embedding where the output is a copy (made at load,
                             // or on a device): get_rows reads one row a token
    uint64_t rows_per_token; // what one token reads of mapped_rows (k_f of n_ff neurons per layer)
                             // and of mapped_lookup (one row)
};

// "spark_memory_plan": weighs *need against the memory left to the process (MemAvailable, the
// cgroup's limit, SPARK_MEMORY). Returns 0 when the model loads (with one line on stderr when its
// FFN rows will be read from storage), 1 when what every token reads cannot stay in memory (why
// gets the message naming the sizes, NUL-terminated, cut to why_len bytes; the load should fail
// with it), -1 when need is NULL
typedef int (*spark_memory_plan_t)(const struct spark_memory_need * need, char * why, size_t why_len);

// "spark_memory_context": weighs `bytes` of host memory that a context of a planned model is about
// to use (what: "the KV cache", "the compute buffers"; weights_locked: the model's mapped weights
// are locked, --load-mode mlock) against the memory left now beside the weights every token reads
// whole. Returns 0 when they fit (and when no model was planned or SPARK_PAGING=never), 1 when
// they do not (one line on stderr naming the sizes; why gets the error, NUL-terminated, cut to
// why_len bytes; the context should fail with it), -1 when what is NULL
typedef int (*spark_memory_context_t)(uint64_t bytes, int weights_locked, const char * what, char * why, size_t why_len);

// one range of a model's weights in host memory
struct spark_bytes {
    const void * data;
    uint64_t     size;
};

// "spark_memory_loaded": called at the end of a model's load with its memory-mapped FFN row
// tensors (K2, V). When the load's plan found that everything fits (SPARK_PAGING=auto), the
// pages not yet in memory are read now, one sequential read per range, rather than a few at a
// time by the first tokens (one line on stderr when that is 256 MiB or more). Returns 0, or -1
// when ranges is NULL and n is not 0
typedef int (*spark_memory_loaded_t)(const struct spark_bytes * ranges, size_t n);

// "spark_memory_resident": called at the end of a model's load with its weights in host memory
// that every token reads whole (attention, FFN predictor, norms, output). When the load's plan
// found that its FFN rows stream (not under SPARK_PAGING=never), the pages not yet in memory are
// read now, one sequential read per range: a loader that reads the rows on demand only asks for
// the rest ahead (one line on stderr when that is 256 MiB or more). Returns 0, or -1 when ranges
// is NULL and n is not 0
typedef int (*spark_memory_resident_t)(const struct spark_bytes * ranges, size_t n);

#ifdef __cplusplus
}
#endif
