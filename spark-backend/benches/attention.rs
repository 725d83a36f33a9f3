//! Spark sparse attention (`spark_attn`) against dense attention built from ggml's own ops, all
//! run as ggml graphs on one persistent 2-thread ggml threadpool, in the same run.
//!
//! Shapes: one Gemma-2 2B attention layer (H 256, r_a 128, k_a 256, 8 query / 4 KV heads,
//! soft-cap 50), f16 KV cache, `n_kv` valid positions, a batch of 1 or 64 query tokens at the
//! end of the context (causal mask).
//!
//! Methods:
//! - `spark`: the custom op; V cache in the plain (flash-attention) layout, which spark-gemma2
//!   keeps since patch 0004.
//! - `spark_vtrans`: the same op over the transposed V cache (llama.cpp's layout without flash
//!   attention, what the spark-gemma2 graph passed before patch 0004).
//! - `dense_mul_mat`: what llama.cpp's `build_attn_mha` does without flash attention:
//!   `mul_mat(K, q)`, soft-cap as `scale(tanh(scale(kq, 1/c)), c)`, `soft_max_ext` with the mask,
//!   `mul_mat(V^T, kq)` over the transposed V cache llama.cpp keeps in that mode, permute + cont.
//! - `dense_flash`: `ggml_flash_attn_ext` with the same soft-cap (f16 mask, plain V).
//!
//! So that every call reads its KV cache from memory as a real multi-layer decode does, each
//! method cycles through enough distinct layers' caches to exceed the 32 MiB L3 (>= 64 MiB).
//! Run: `cargo bench -p spark-backend --bench attention` (`SPARK_BENCH_THREADS=1` for one thread).

use criterion::{criterion_group, criterion_main, Criterion};
use llama_cpp_sys_2 as sys;
use spark_backend::attention::cpu_op::spark_attn;
use spark_backend::params::{AttnParams, OpParams};
use std::ffi::c_void;
use std::time::Duration;

const H: i64 = 256;
const R: i32 = 128;
const K_KEEP: i32 = 256;
const N_HEAD: i64 = 8;
const N_HEAD_KV: i64 = 4;
const SOFTCAP: f32 = 50.0;
const F16: sys::ggml_type = sys::GGML_TYPE_F16;
const F32: sys::ggml_type = sys::GGML_TYPE_F32;

/// Deterministic values: a cheap hash mapped to roughly N(0, 1) (sum of uniforms).
fn normalish(i: u64, seed: u64) -> f32 {
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ seed.wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    let mut s = 0.0f32;
    for _ in 0..4 {
        x ^= x >> 29;
        x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x ^= x >> 32;
        s += (x & 0xffff) as f32 / 65536.0;
    }
    (s - 2.0) * 1.73
}

/// Fills a tensor (contiguous, f16 or f32) with `f(index)`.
///
/// # Safety
/// `t` must be an allocated contiguous f16 or f32 tensor.
unsafe fn fill(t: *mut sys::ggml_tensor, f: impl Fn(u64) -> f32) {
    // SAFETY: per the contract.
    unsafe {
        let n = (sys::ggml_nbytes(t) / if (*t).type_ == F16 { 2 } else { 4 }) as u64;
        for i in 0..n {
            let v = f(i);
            if (*t).type_ == F16 {
                *(*t).data.cast::<u16>().add(i as usize) = half::f16::from_f32(v).to_bits();
            } else {
                *(*t).data.cast::<f32>().add(i as usize) = v;
            }
        }
    }
}

/// One benchmark configuration's graphs: `graphs[method][layer]`.
struct Setup {
    ctx: *mut sys::ggml_context,
    graphs: Vec<Vec<*mut sys::ggml_cgraph>>,
    _params: Box<AttnParams>,
}

const METHODS: [&str; 4] = ["spark", "spark_vtrans", "dense_mul_mat", "dense_flash"];

impl Setup {
    fn new(n_kv: i64, n_tokens: i64) -> Setup {
        let layer_bytes = (2 * H * N_HEAD_KV * n_kv * 2) as usize;
        let n_layers = (64usize << 20).div_ceil(layer_bytes).max(2);
        // K, V, V^T per layer, plus activations; generous.
        let mem = n_layers
            * (3 * layer_bytes / 2 + (N_HEAD * n_kv * n_tokens * 4 * 6) as usize + (4 << 20))
            + (64 << 20);
        let p = sys::ggml_init_params {
            mem_size: mem,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: false,
        };
        // SAFETY: plain context creation; checked below.
        let ctx = unsafe { sys::ggml_init(p) };
        assert!(!ctx.is_null(), "ggml_init({mem}) failed");
        let mut params = Box::new(AttnParams {
            layer: 0,
            k: K_KEEP,
            r: R,
            softcap: SOFTCAP,
        });
        let ud: *mut c_void = (&mut *params as *mut AttnParams).cast();
        let block = OpParams {
            layer: 0,
            k: K_KEEP,
            r: R,
            softcap: SOFTCAP,
            ..OpParams::default()
        };
        let mut graphs = vec![Vec::new(), Vec::new(), Vec::new(), Vec::new()];
        // SAFETY: all tensors come from `ctx` (host memory) and are filled before use.
        unsafe {
            // Query (roped and scaled by 1/sqrt(H) already): shared by all layers.
            let q = sys::ggml_new_tensor_3d(ctx, F32, H, N_HEAD, n_tokens);
            // A spread of first-part scores like a trained model's (std ~ 2).
            fill(q, |i| {
                normalish(i, 1) * if (i as i64 % H) < R as i64 { 4.0 } else { 1.0 } / 16.0
            });
            // Causal mask of the last n_tokens positions: f32 (mul_mat path, spark) and f16 (flash).
            let mask32 = sys::ggml_new_tensor_2d(ctx, F32, n_kv, n_tokens);
            let mask16 = sys::ggml_new_tensor_2d(ctx, F16, n_kv, n_tokens);
            let masked = |i: u64| {
                let (j, t) = ((i as i64) % n_kv, (i as i64) / n_kv);
                if j <= n_kv - n_tokens + t {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            };
            fill(mask32, masked);
            fill(mask16, masked);
            for l in 0..n_layers as u64 {
                let k = sys::ggml_new_tensor_3d(ctx, F16, H, N_HEAD_KV, n_kv);
                fill(k, |i| normalish(i, 10 + l));
                let v = sys::ggml_new_tensor_3d(ctx, F16, H, N_HEAD_KV, n_kv);
                fill(v, |i| normalish(i, 1000 + l));
                // Transposed V storage [n_kv, H, KV] with the same values.
                let vt = sys::ggml_new_tensor_3d(ctx, F16, n_kv, H, N_HEAD_KV);
                {
                    let src = (*v).data.cast::<u16>();
                    let dst = (*vt).data.cast::<u16>();
                    for g in 0..N_HEAD_KV {
                        for j in 0..n_kv {
                            for i in 0..H {
                                *dst.add(((g * H + i) * n_kv + j) as usize) =
                                    *src.add(((j * N_HEAD_KV + g) * H + i) as usize);
                            }
                        }
                    }
                }

                // The spark_attn node over V view `v` (same q, K and mask).
                let spark_node = |v: *mut sys::ggml_tensor| {
                    let mut args = [q, k, v, mask32];
                    let out = sys::ggml_custom_4d(
                        ctx,
                        F32,
                        H,
                        N_HEAD,
                        n_tokens,
                        1,
                        args.as_mut_ptr(),
                        4,
                        Some(spark_attn),
                        -1,
                        ud,
                    );
                    // The op reads its parameters from the node, as the graph stores them
                    // (`spark_op_set_params`), not from `userdata`.
                    spark_backend::params::store(out, &block);
                    graph(ctx, out)
                };
                // spark
                graphs[0].push(spark_node(v));
                // spark over the transposed V cache (llama.cpp's layout without flash attention,
                // which spark-gemma2 used before patch 0004): V rows read at a stride of n_kv.
                graphs[1].push(spark_node(sys::ggml_permute(ctx, vt, 2, 0, 1, 3))); // [H, KV, n_kv]

                // dense, mul_mat path (llama.cpp without flash attention)
                let qp = sys::ggml_permute(ctx, q, 0, 2, 1, 3); // [H, T, N]
                let kp = sys::ggml_permute(ctx, k, 0, 2, 1, 3); // [H, n_kv, KV]
                let kq = sys::ggml_mul_mat(ctx, kp, qp); // [n_kv, T, N]
                let kq = sys::ggml_scale(ctx, kq, 1.0 / SOFTCAP);
                let kq = sys::ggml_tanh(ctx, kq);
                let kq = sys::ggml_scale(ctx, kq, SOFTCAP);
                let kq = sys::ggml_soft_max_ext(ctx, kq, mask32, 1.0, 0.0);
                let kqv = sys::ggml_mul_mat(ctx, vt, kq); // [H, T, N]
                let o = sys::ggml_cont(ctx, sys::ggml_permute(ctx, kqv, 0, 2, 1, 3)); // [H, N, T]
                graphs[2].push(graph(ctx, o));

                // dense, flash attention
                let vp = sys::ggml_permute(ctx, v, 0, 2, 1, 3);
                let fa = sys::ggml_flash_attn_ext(ctx, qp, kp, vp, mask16, 1.0, 0.0, SOFTCAP);
                sys::ggml_flash_attn_ext_set_prec(fa, sys::GGML_PREC_F32);
                graphs[3].push(graph(ctx, fa));
            }
        }
        Setup {
            ctx,
            graphs,
            _params: params,
        }
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        // SAFETY: created by ggml_init; graphs live inside it and are not used afterwards.
        unsafe { sys::ggml_free(self.ctx) };
    }
}

/// A forward graph ending at `out`.
///
/// # Safety
/// `out` must belong to `ctx`.
unsafe fn graph(ctx: *mut sys::ggml_context, out: *mut sys::ggml_tensor) -> *mut sys::ggml_cgraph {
    // SAFETY: per the contract.
    unsafe {
        let gf = sys::ggml_new_graph(ctx);
        sys::ggml_build_forward_expand(gf, out);
        gf
    }
}

/// Runs graphs on one persistent ggml threadpool.
struct Runner {
    pool: *mut sys::ggml_threadpool,
    n_threads: i32,
    work: Vec<u8>,
}

impl Runner {
    fn new() -> Runner {
        // SAFETY: default parameters for n_threads() threads; the pool is checked and freed on drop.
        let pool = unsafe {
            let mut p = sys::ggml_threadpool_params_default(n_threads());
            sys::ggml_threadpool_new(&mut p)
        };
        assert!(!pool.is_null());
        Runner {
            pool,
            n_threads: n_threads(),
            work: Vec::new(),
        }
    }

    fn compute(&mut self, gf: *mut sys::ggml_cgraph) {
        // SAFETY: gf is a valid graph; the work buffer is sized from the plan and outlives the call.
        unsafe {
            let mut plan = sys::ggml_graph_plan(gf, self.n_threads, self.pool);
            if self.work.len() < plan.work_size {
                self.work.resize(plan.work_size, 0);
            }
            plan.work_data = self.work.as_mut_ptr();
            let status = sys::ggml_graph_compute(gf, &mut plan);
            assert_eq!(status, sys::GGML_STATUS_SUCCESS);
        }
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        // SAFETY: created by ggml_threadpool_new, freed once.
        unsafe { sys::ggml_threadpool_free(self.pool) };
    }
}

/// ggml threads: `SPARK_BENCH_THREADS`, default 2.
fn n_threads() -> i32 {
    std::env::var("SPARK_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n >= 1)
        .unwrap_or(2)
}

fn bench_attention(c: &mut Criterion) {
    let mut runner = Runner::new();
    let mut group = c.benchmark_group("attention");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for (n_kv, n_tokens) in [(512i64, 1i64), (4096, 1), (512, 64), (4096, 64)] {
        let setup = Setup::new(n_kv, n_tokens);
        spark_backend::stats::reset();
        for (mi, method) in METHODS.iter().enumerate() {
            let graphs = &setup.graphs[mi];
            let mut next = 0usize;
            group.bench_function(format!("{method}/n_kv={n_kv}/batch={n_tokens}"), |b| {
                b.iter(|| {
                    runner.compute(graphs[next % graphs.len()]);
                    next += 1;
                })
            });
            if mi == 0 {
                let st = spark_backend::stats::snapshot(0).unwrap_or_default();
                println!(
                    "spark n_kv={n_kv} batch={n_tokens}: mean positions kept per (query, head) {:.1}",
                    st.attn_mean_positions()
                );
            }
        }
    }
    group.finish();
}

criterion_group!(benches, bench_attention);
criterion_main!(benches);
