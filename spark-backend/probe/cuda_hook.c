/* Signature probe for tests/cuda_hook.rs: the Rust declarations of patch 0008's hook
 * (src/cuda/hook.rs: CustomLaunch, RegisterCustomOp) written as C types, checked against the
 * typedefs of the patched ggml-cuda.h. build.rs compiles this with SPARK_HAVE_CUDA_HOOK only
 * when the staged header has the typedefs; a mismatch is a compile error. */
#include <stdbool.h>

#ifdef SPARK_HAVE_CUDA_HOOK
#include "ggml-cuda.h"

/* unsafe extern "C" fn(*mut ggml_tensor, c_int, *mut c_void, *mut c_void) -> c_int */
typedef int (*spark_rust_custom_launch_t)(struct ggml_tensor * dst, int device, void * stream, void * userdata);
/* unsafe extern "C" fn(ggml_custom_op_t, Option<CustomLaunch>) -> bool */
typedef bool (*spark_rust_register_custom_op_t)(ggml_custom_op_t fun, spark_rust_custom_launch_t launch);

_Static_assert(__builtin_types_compatible_p(ggml_backend_cuda_custom_launch_t, spark_rust_custom_launch_t),
               "src/cuda/hook.rs CustomLaunch differs from ggml_backend_cuda_custom_launch_t");
_Static_assert(__builtin_types_compatible_p(ggml_backend_cuda_register_custom_op_t, spark_rust_register_custom_op_t),
               "src/cuda/hook.rs RegisterCustomOp differs from ggml_backend_cuda_register_custom_op_t");

const int spark_probe_cuda_hook = 1;
#else
const int spark_probe_cuda_hook = 0;
#endif
