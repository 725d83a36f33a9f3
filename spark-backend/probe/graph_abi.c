/* Layout probe for tests/registry.rs: the C interface between the spark-gemma2 graph and the
 * procs of the "Spark" entry (src/models/spark-backend.h of the patched llama.cpp) as the
 * C compiler sees it, and the Rust signatures of spark_ffn_tiling (src/ffn/tiling.rs) and
 * spark_attn_path (src/attention/path.rs) written as C types and checked against the header's
 * typedefs (a mismatch is a compile error). */
#include <stddef.h>
#include <stdint.h>

#include "spark-backend.h"

/* unsafe extern "C" fn(*const c_char, i64, i64, i64, *mut FfnTiling) -> c_int */
typedef int (*spark_rust_ffn_tiling_t)(const char * backend, int64_t n_tokens, int64_t n_ff, int64_t n_embd,
                                       struct spark_ffn_tiling * out);

_Static_assert(__builtin_types_compatible_p(spark_ffn_tiling_t, spark_rust_ffn_tiling_t),
               "src/ffn/tiling.rs spark_ffn_tiling differs from spark_ffn_tiling_t");

const size_t spark_probe_ffn_tiling_layout[] = {
    sizeof(struct spark_ffn_tiling),
    _Alignof(struct spark_ffn_tiling),
    offsetof(struct spark_ffn_tiling, path),
    offsetof(struct spark_ffn_tiling, n_chunk),
    sizeof(((struct spark_ffn_tiling *) 0)->path),
    sizeof(((struct spark_ffn_tiling *) 0)->n_chunk),
    SPARK_FFN_PATH_FUSED,
    SPARK_FFN_PATH_TWO_STAGE,
    SPARK_FFN_PATH_DENSE,
};

/* unsafe extern "C" fn(*const c_char, i64, *mut i32) -> c_int (src/attention/path.rs) */
typedef int (*spark_rust_attn_path_t)(const char * backend, int64_t n_tokens, int32_t * out);

_Static_assert(__builtin_types_compatible_p(spark_attn_path_t, spark_rust_attn_path_t),
               "src/attention/path.rs spark_attn_path differs from spark_attn_path_t");

const size_t spark_probe_attn_path_values[] = {
    SPARK_ATTN_PATH_SPARSE,
    SPARK_ATTN_PATH_DENSE,
};

/* The parameter block a Spark node carries (src/params.rs): struct spark_op_params and enum
 * spark_ffn_cutoff of the header, the Rust signature of spark_op_set_params, and the facts of ggml's op_params that the block's
 * placement rests on (ggml-impl.h's struct ggml_custom_op_params comes first, GGML_MAX_OP_PARAMS
 * bytes in all). */
#include "ggml.h"
#include "ggml-impl.h"

/* unsafe extern "C" fn(*mut ggml_tensor, *const OpParams) -> c_int */
typedef int (*spark_rust_op_set_params_t)(struct ggml_tensor * node, const struct spark_op_params * p);

_Static_assert(__builtin_types_compatible_p(spark_op_set_params_t, spark_rust_op_set_params_t),
               "src/params.rs spark_op_set_params differs from spark_op_set_params_t");

const size_t spark_probe_op_params_layout[] = {
    sizeof(struct spark_op_params),
    _Alignof(struct spark_op_params),
    offsetof(struct spark_op_params, layer),
    offsetof(struct spark_op_params, k),
    offsetof(struct spark_op_params, r),
    offsetof(struct spark_op_params, softcap),
    offsetof(struct spark_op_params, ffn_cutoff),
    offsetof(struct spark_op_params, ffn_z),
    SPARK_FFN_CUTOFF_TOP_K,
    SPARK_FFN_CUTOFF_STD_MUL,
    sizeof(struct ggml_custom_op_params),
    GGML_MAX_OP_PARAMS,
    sizeof(struct spark_rope_params),
    _Alignof(struct spark_rope_params),
    offsetof(struct spark_rope_params, layer),
    offsetof(struct spark_rope_params, r),
    offsetof(struct spark_rope_params, freq_base),
    offsetof(struct spark_rope_params, freq_scale),
    offsetof(struct spark_rope_params, scale),
    offsetof(struct spark_rope_params, reserved),
    sizeof(((struct ggml_tensor *) 0)->op_params),
    _Alignof(int32_t),
};

/* unsafe extern "C" fn(*const MemoryNeed, *mut c_char, usize) -> c_int (src/rows/budget.rs) */
typedef int (*spark_rust_memory_plan_t)(const struct spark_memory_need * need, char * why, size_t why_len);

_Static_assert(__builtin_types_compatible_p(spark_memory_plan_t, spark_rust_memory_plan_t),
               "src/rows/budget.rs spark_memory_plan differs from spark_memory_plan_t");

/* unsafe extern "C" fn(u64, c_int, *const c_char, *mut c_char, usize) -> c_int (src/rows/budget.rs) */
typedef int (*spark_rust_memory_context_t)(uint64_t bytes, int weights_locked, const char * what, char * why, size_t why_len);

_Static_assert(__builtin_types_compatible_p(spark_memory_context_t, spark_rust_memory_context_t),
               "src/rows/budget.rs spark_memory_context differs from spark_memory_context_t");

const size_t spark_probe_memory_need_layout[] = {
    sizeof(struct spark_memory_need),
    _Alignof(struct spark_memory_need),
    offsetof(struct spark_memory_need, made_at_load),
    offsetof(struct spark_memory_need, mapped_whole),
    offsetof(struct spark_memory_need, mapped_rows),
    offsetof(struct spark_memory_need, mapped_lookup),
    offsetof(struct spark_memory_need, rows_per_token),
};

/* unsafe extern "C" fn(*const Bytes, usize) -> c_int (src/rows/paging.rs) */
typedef int (*spark_rust_memory_loaded_t)(const struct spark_bytes * ranges, size_t n);

_Static_assert(__builtin_types_compatible_p(spark_memory_loaded_t, spark_rust_memory_loaded_t),
               "src/rows/paging.rs spark_memory_loaded differs from spark_memory_loaded_t");

_Static_assert(__builtin_types_compatible_p(spark_memory_resident_t, spark_rust_memory_loaded_t),
               "src/rows/paging.rs spark_memory_resident differs from spark_memory_resident_t");

const size_t spark_probe_bytes_layout[] = {
    sizeof(struct spark_bytes),
    _Alignof(struct spark_bytes),
    offsetof(struct spark_bytes, data),
    offsetof(struct spark_bytes, size),
};
