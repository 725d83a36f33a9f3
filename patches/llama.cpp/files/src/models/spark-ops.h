// How a llama.cpp model graph reaches the Spark backend's custom ops: the graph helpers that
// spark-gemma2.cpp (Spark-Gemma2's sparse FFN and attention) and spark-gemma3n.cpp (Gemma 3n's
// sparse FFN layers) share. The C interface they speak is spark-backend.h.
#pragma once

#include "spark-backend.h"

#include "ggml.h"

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <vector>

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

// a spark_rope node (fun from spark_kernel("spark_rope")) over x [H, n_head, n_tokens] (rows of H
// contiguous f32, any row and token strides) at positions pos: dst [H, n_head, n_tokens], the
// head's two rotary embeddings and the scale of p (spark-backend.h), the parameters copied into
// the node's block
ggml_tensor * spark_rope_node(ggml_context * ctx, ggml_custom_op_t fun, ggml_tensor * x, ggml_tensor * pos,
                              const spark_rope_params & p);

// Whether every Spark op named in `ops` that the backend exports runs where each of `weights`
// lives: on a host buffer (the CPU runs every Spark op), on a weight without a buffer (not
// placed yet), or on a device whose backend says it supports a node of the op (ggml-cuda with the
// plugin's CUDA launchers, an rpc-server with the plugin). False for the others (Vulkan, Metal,
// SYCL, HIP, a CUDA build without the launchers, an rpc-server without the plugin), where the
// scheduler would run the node on the CPU and copy the weights to it at every evaluation: the
// graphs build no Spark node there (spark-gemma2's layers take its dense graph, except on an
// rpc-server; Gemma 3n's sparse layers upstream's).
bool spark_ops_run_where(std::initializer_list<const char *> ops, std::initializer_list<const ggml_tensor *> weights);

// Calls say(first, last, buffer name) once for each run of consecutive layers first..last that
// `off` marks and whose weight(il) sits in one buffer: the load lines of the layers that do not
// run the Spark ops.
void spark_each_run_off(const std::vector<bool> & off, const std::function<const ggml_tensor *(int)> & weight,
                        const std::function<void(int, int, const char *)> & say);

// Whether the device that holds `w` runs the node that make_node builds in a scratch context
// (true for host memory and for a weight not yet in a buffer: the CPU runs every op): asked with
// stand-in tensors of the real types, as the backends decide by types and layout.
bool spark_weight_device_runs(const ggml_tensor * w, const std::function<ggml_tensor *(ggml_context *)> & make_node);

// Whether `w` sits on a device of ggml-rpc (a registry named "RPC" or "RPC[host:port]"), whose
// supports_op answers true for every op whatever its server runs.
bool spark_weight_on_rpc(const ggml_tensor * w);

// says once per process why a sparse FFN is not built ("<why>: the FFN runs on the dense graph")
void spark_ffn_warn_dense(const char * why);

// How the FFN of a ubatch runs (path and chunk count) is the Spark backend's decision: the
// graph asks spark_ffn_tiling, naming the backend registry of the device that holds the FFN's
// weight `w` ("CPU" for host memory), and builds the nodes of the answer, so none of the
// kernels' tiling constants is written in a graph. False for no answer: no "Spark" entry
// (silently), or one that does not answer (a backend without spark_ffn_tiling) or answers
// something invalid (with one warning); the graph then builds its dense FFN.
bool spark_ffn_ask_tiling(const ggml_tensor * w, int64_t n_tokens, int64_t n_ff, int64_t n_embd, spark_ffn_tiling & out);

// Whether the attention of a ubatch of n_tokens tokens whose layer's weight `w` sits where it
// does takes the graph's dense attention (the Spark backend's spark_attn_path answers
// SPARK_ATTN_PATH_DENSE: a GPU above its switch point). False without the proc (a backend
// built before it: spark_attn as always) or when it refuses the question.
bool spark_attn_takes_dense(const ggml_tensor * w, int64_t n_tokens);

// The sparse FFN's nodes: out [n_embd, n_tokens] = sum over each token's kept neurons j of
// gelu_tanh(s_j - theta) (K2_j . h[r_f:]) V_j, for scores s [n_ff, n_tokens], activations
// h [n_embd, n_tokens], K2 [n_embd - r_f, n_ff] and V [n_embd, n_ff] (neuron-major), the
// threshold set by p. The nodes are those of the path spark_ffn_tiling answers for the ubatch
// and the device of K2 (one chunk: the fused node is the output, no sum node) (a graph of no tokens, a reserve probe, gets a one-token ubatch's nodes, so that it holds
// the ops of the graphs that run); name(node, label) names the intermediate nodes and the
// output ("spark_ffn_sparse") as the caller's graph callback does. nullptr when the backend
// cannot run it (said once) or answers SPARK_FFN_PATH_DENSE for the ubatch (then *dense, when
// given, is set true: the caller's dense FFN should multiply V as a stock matrix product): the
// caller builds its dense FFN.
ggml_tensor * spark_build_sparse_ffn(ggml_context * ctx, ggml_tensor * s, ggml_tensor * h, ggml_tensor * k2,
                                     ggml_tensor * v, const spark_op_params & p,
                                     const std::function<void(ggml_tensor *, const char *)> & name,
                                     bool * dense = nullptr);
