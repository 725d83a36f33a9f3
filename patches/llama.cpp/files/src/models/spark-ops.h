// How a llama.cpp model graph reaches the Spark backend's custom ops: the graph helpers that
// spark-gemma2.cpp (Spark-Gemma2's sparse FFN and attention) and spark-gemma3n.cpp (Gemma 3n's
// sparse FFN layers) share. The C interface they speak is spark-gemma2-backend.h.
#pragma once

#include "spark-gemma2-backend.h"

#include "ggml.h"

#include <cstdint>

// a proc of the "Spark" ggml backend registry entry (registered in-process or loaded with
// GGML_BACKEND_PATH), or nullptr (no such entry, or no such proc)
void * spark_proc(const char * name);

// a custom op exported by the "Spark" registry entry, or nullptr (also when the entry cannot
// store the parameters in the node: a backend built for another llama.cpp, said once)
ggml_custom_op_t spark_kernel(const char * name);

// a Spark custom-op node of shape [ne0, ne1, ne2, ne3]: fun (from spark_kernel) over args, its
// parameters p stored in the node's op_params (no pointer of this process in it)
ggml_tensor * spark_node(ggml_context * ctx, ggml_custom_op_t fun, ggml_tensor ** args, int n_args,
                         int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3, const spark_op_params & p);
