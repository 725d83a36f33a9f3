/* Layout probe for tests/registry.rs: the C interface between the spark-gemma2 graph and the
 * procs of the "Spark" entry (src/models/spark-gemma2-backend.h of the patched llama.cpp) as the
 * C compiler sees it, and the Rust signature of spark_ffn_tiling (src/ffn/tiling.rs) written as
 * a C type and checked against the header's typedef (a mismatch is a compile error). */
#include <stddef.h>
#include <stdint.h>

#include "spark-gemma2-backend.h"

/* unsafe extern "C" fn(i64, i64, i64, *mut FfnTiling) -> c_int */
typedef int (*spark_rust_ffn_tiling_t)(int64_t n_tokens, int64_t n_ff, int64_t n_embd, struct spark_ffn_tiling * out);

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
};
