/* Layout probe for tests/registry.rs: the C compiler's view of ggml's backend registry structs,
 * taken from the patched llama.cpp sources this crate links against. */
#include <stddef.h>

#include "ggml-backend-impl.h"

const size_t spark_probe_reg_layout[] = {
    GGML_BACKEND_API_VERSION,
    sizeof(struct ggml_backend_reg),
    _Alignof(struct ggml_backend_reg),
    offsetof(struct ggml_backend_reg, api_version),
    offsetof(struct ggml_backend_reg, iface),
    offsetof(struct ggml_backend_reg, context),
    sizeof(struct ggml_backend_reg_i),
    _Alignof(struct ggml_backend_reg_i),
    offsetof(struct ggml_backend_reg_i, get_name),
    offsetof(struct ggml_backend_reg_i, get_device_count),
    offsetof(struct ggml_backend_reg_i, get_device),
    offsetof(struct ggml_backend_reg_i, get_proc_address),
};
