//! Helpers shared by the FFN tests and the FFN benchmark: a seeded random source, a float64
//! reference of SPEC sections 1 and 4, and a small owner of a ggml context that builds and runs
//! graphs (stock ops and the Spark custom ops) on ggml's own CPU threads.
#![allow(dead_code)]

use llama_cpp_sys_2 as sys;
use spark_backend::ffn::cpu_ops::{spark_ffn_down, spark_ffn_fused, spark_ffn_sum, spark_ffn_up};
use spark_backend::ffn::{Batch, FfnWeights};
use spark_backend::params::OpParams;
use spark_backend::rows::{quant, RowMatrix, RowType};
use spark_backend::topk::Cutoff;
use std::ffi::c_void;

/// Gemma 3n's `f_sparsity_std_mul` (upstream llama.cpp src/models/gemma3n.cpp): the f32 nearest
/// Q(0.95), the std multiplier of its sparse FFN layers' threshold.
pub const GEMMA3N_STD_MUL: f32 = 1.644_853_4;

/// The block the graph stores for an FFN op of layer `layer` with `cutoff` (`spark_op_params`:
/// `SPARK_FFN_CUTOFF_TOP_K` with k, or `SPARK_FFN_CUTOFF_STD_MUL` with ffn_z).
pub fn op_params(layer: i32, cutoff: Cutoff) -> OpParams {
    match cutoff {
        Cutoff::TopK(k) => OpParams {
            layer,
            k: i32::try_from(k).expect("k fits an int32_t"),
            ffn_cutoff: spark_backend::params::FFN_CUTOFF_TOP_K,
            ..OpParams::default()
        },
        Cutoff::StdMul(z) => OpParams {
            layer,
            ffn_cutoff: spark_backend::params::FFN_CUTOFF_STD_MUL,
            ffn_z: z as f32,
            ..OpParams::default()
        },
    }
}

/// `n` rows of `d` values back to back, as the FFN kernels' input batch.
pub fn batch(h: &[f32], d: usize, n: usize) -> Batch<'_> {
    Batch {
        h,
        stride: d,
        width: d,
        n_tokens: n,
    }
}

/// xorshift64* random numbers (deterministic per seed).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(1e-300);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
    pub fn normals(&mut self, n: usize, scale: f64) -> Vec<f32> {
        (0..n).map(|_| (self.normal() * scale) as f32).collect()
    }
}

/// A weight matrix stored in `ty` plus its exact f32 values after storage (dequantized).
pub struct Weights {
    pub ty: RowType,
    pub n_cols: usize,
    pub n_rows: usize,
    pub bytes: Vec<u8>,
    pub values: Vec<f32>,
}

impl Weights {
    pub fn random(rng: &mut Rng, ty: RowType, n_cols: usize, n_rows: usize, scale: f64) -> Self {
        let raw = rng.normals(n_cols * n_rows, scale);
        let bytes = quant::quantize_rows(ty, &raw, n_cols).expect("quantize");
        let m = RowMatrix::packed(ty, n_cols, n_rows, &bytes).expect("matrix");
        let mut values = vec![0f32; n_cols * n_rows];
        for (j, out) in values.chunks_exact_mut(n_cols).enumerate() {
            spark_backend::rows::to_f32(m.row(j), out);
        }
        Self {
            ty,
            n_cols,
            n_rows,
            bytes,
            values,
        }
    }
    pub fn matrix(&self) -> RowMatrix<'_> {
        RowMatrix::packed(self.ty, self.n_cols, self.n_rows, &self.bytes).expect("matrix")
    }
    pub fn row_f64(&self, j: usize) -> impl Iterator<Item = f64> + '_ {
        self.values[j * self.n_cols..(j + 1) * self.n_cols]
            .iter()
            .map(|&v| f64::from(v))
    }
}

/// Runs `f` on the `FfnWeights` over the matrices of K1, K2 and V with `cutoff` (the matrices
/// borrow the weights, so they live in this call).
pub fn with_ffn_weights<R>(
    k1: &Weights,
    k2: &Weights,
    v: &Weights,
    cutoff: Cutoff,
    f: impl FnOnce(&FfnWeights<'_>) -> R,
) -> R {
    let (m1, m2, mv) = (k1.matrix(), k2.matrix(), v.matrix());
    f(&FfnWeights {
        k1: &m1,
        k2: &m2,
        v: &mv,
        cutoff,
    })
}

/// Two-pass f64 mean and unbiased standard deviation of `x` (all entries).
pub fn ref_mean_std(x: &[f32]) -> (f64, f64) {
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let var = x
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / (n - 1.0);
    (mean, var.sqrt())
}

/// f64 reference of SPEC 1: theta (None when k >= d), two-pass mean and unbiased std.
pub fn ref_threshold(x: &[f32], k: usize) -> Option<f64> {
    ref_threshold_for(x, Cutoff::TopK(k))
}

/// f64 reference threshold under `cutoff`: `mean + std * z` (two-pass mean, unbiased std) with
/// z = Q(1 - k/d) for `TopK(k)` (None when k >= d) or z as given for `StdMul(z)` (Gemma 3n).
pub fn ref_threshold_for(x: &[f32], cutoff: Cutoff) -> Option<f64> {
    let d = x.len();
    let z = match cutoff {
        Cutoff::TopK(k) if k >= d => return None,
        Cutoff::TopK(k) => spark_backend::topk::norm_ppf(1.0 - k as f64 / d as f64),
        Cutoff::StdMul(z) => z,
    };
    let (mean, std) = ref_mean_std(x);
    Some(mean + std * z)
}

pub fn ref_gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

/// f64 reference of the up stage given the scores: u[j * n_tokens + t].
pub fn ref_up(
    scores: &[f32],
    h: &[f32],
    d: usize,
    n_tokens: usize,
    k2: &Weights,
    k: usize,
) -> Vec<f64> {
    ref_up_for(scores, h, d, n_tokens, k2, Cutoff::TopK(k))
}

/// [`ref_up`] under any cutoff: `u_j = gelu_tanh(s_j - theta) * (K2_j . h[r_f:])` for
/// `s_j > theta` ([`ref_threshold_for`]), else 0; r_f = D - K2's columns (0: all of h).
pub fn ref_up_for(
    scores: &[f32],
    h: &[f32],
    d: usize,
    n_tokens: usize,
    k2: &Weights,
    cutoff: Cutoff,
) -> Vec<f64> {
    let f = k2.n_rows;
    let r = d - k2.n_cols;
    let mut u = vec![0f64; f * n_tokens];
    for t in 0..n_tokens {
        let s = &scores[t * f..(t + 1) * f];
        let theta = ref_threshold_for(s, cutoff);
        for j in 0..f {
            let a = match theta {
                Some(th) if f64::from(s[j]) > th => ref_gelu(f64::from(s[j]) - th),
                Some(_) => 0.0,
                None => ref_gelu(f64::from(s[j])),
            };
            if a != 0.0 {
                let dot: f64 = k2
                    .row_f64(j)
                    .zip(&h[t * d + r..(t + 1) * d])
                    .map(|(w, &x)| w * f64::from(x))
                    .sum();
                u[j * n_tokens + t] = a * dot;
            }
        }
    }
    u
}

/// f64 reference of the down stage: out[t * D + i] = sum_j u[j][t] V_j[i].
pub fn ref_down(u: &[f32], n_tokens: usize, v: &Weights) -> Vec<f64> {
    let d = v.n_cols;
    let mut out = vec![0f64; n_tokens * d];
    for j in 0..v.n_rows {
        for t in 0..n_tokens {
            let a = f64::from(u[j * n_tokens + t]);
            if a != 0.0 {
                for (o, w) in out[t * d..(t + 1) * d].iter_mut().zip(v.row_f64(j)) {
                    *o += a * w;
                }
            }
        }
    }
    out
}

/// f64 predictor scores: s[t * F + j] = K1_j . h_t[:r].
pub fn ref_scores(h: &[f32], d: usize, n_tokens: usize, k1: &Weights) -> Vec<f64> {
    let f = k1.n_rows;
    let mut s = vec![0f64; n_tokens * f];
    for t in 0..n_tokens {
        for j in 0..f {
            s[t * f + j] = k1
                .row_f64(j)
                .zip(&h[t * d..t * d + k1.n_cols])
                .map(|(w, &x)| w * f64::from(x))
                .sum();
        }
    }
    s
}

/// Owner of a ggml context with its own memory (freed on drop).
pub struct Ggml {
    pub ctx: *mut sys::ggml_context,
}

impl Ggml {
    pub fn new(mem_bytes: usize) -> Self {
        quant::ensure_cpu_init();
        let params = sys::ggml_init_params {
            mem_size: mem_bytes,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: false,
        };
        // SAFETY: plain init with ggml-owned memory.
        let ctx = unsafe { sys::ggml_init(params) };
        assert!(!ctx.is_null(), "ggml_init failed");
        Self { ctx }
    }

    /// A new 2-D tensor holding `bytes` (already in the tensor's type).
    pub fn tensor(
        &self,
        ty: RowType,
        ne0: usize,
        ne1: usize,
        bytes: &[u8],
    ) -> *mut sys::ggml_tensor {
        // SAFETY: ctx is live; ggml asserts on out-of-memory.
        let t = unsafe { sys::ggml_new_tensor_2d(self.ctx, ty.ggml(), ne0 as i64, ne1 as i64) };
        // SAFETY: t is a fresh tensor of nbytes bytes.
        let n = unsafe { sys::ggml_nbytes(t) };
        assert_eq!(n, bytes.len(), "tensor size");
        // SAFETY: t->data holds n bytes, bytes has n bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), (*t).data.cast::<u8>(), n) };
        t
    }

    pub fn f32_tensor(&self, ne0: usize, ne1: usize, x: &[f32]) -> *mut sys::ggml_tensor {
        self.tensor(RowType::F32, ne0, ne1, spark_backend::rows::f32_bytes(x))
    }

    /// K2 [k2_cols, n_rows] and V [v_cols, n_rows] of type `ty` (`k2`, `v`: their packed rows)
    /// stored side by side as in a `--pair-k2v` file: one tensor whose row j is K2's row j then
    /// V's row j. Returns that tensor and its two row views ([`Ggml::row_views`]), K2's and V's.
    pub fn side_by_side(
        &self,
        ty: RowType,
        (k2, k2_cols): (&[u8], usize),
        (v, v_cols): (&[u8], usize),
        n_rows: usize,
    ) -> (*mut sys::ggml_tensor, [*mut sys::ggml_tensor; 2]) {
        let (k2_row, v_row) = (k2.len() / n_rows, v.len() / n_rows);
        let rows = k2.chunks_exact(k2_row).zip(v.chunks_exact(v_row));
        let bytes: Vec<u8> = rows.flat_map(|(a, b)| a.iter().chain(b)).copied().collect();
        let both = self.tensor(ty, k2_cols + v_cols, n_rows, &bytes);
        (both, self.row_views(both, [k2_cols, v_cols]))
    }

    /// Side-by-side row views of a 2-D tensor: view i has `widths[i]` elements per row,
    /// starting after the previous views' elements, at the tensor's row stride.
    pub fn row_views<const N: usize>(
        &self,
        t: *mut sys::ggml_tensor,
        widths: [usize; N],
    ) -> [*mut sys::ggml_tensor; N] {
        let mut offset = 0;
        widths.map(|w| {
            // SAFETY: t is a live 2-D tensor of this context; each view lies inside its rows
            // (the widths sum to at most ne0, whole blocks of t's type).
            unsafe {
                let v = sys::ggml_view_2d(self.ctx, t, w as i64, (*t).ne[1], (*t).nb[1], offset);
                offset += sys::ggml_row_size((*t).type_, w as i64);
                v
            }
        })
    }

    /// Copies out an f32 tensor (contiguous).
    pub fn read(&self, t: *mut sys::ggml_tensor) -> Vec<f32> {
        // SAFETY: t is a live contiguous f32 tensor of this context.
        unsafe {
            let n = sys::ggml_nelements(t) as usize;
            std::slice::from_raw_parts((*t).data.cast::<f32>(), n).to_vec()
        }
    }

    /// `ggml_custom_4d` with the given sources and op, `params` (null: none) stored in the node
    /// as the graph stores them (`spark_op_set_params`); `ne` lists up to 4 sizes
    /// (missing ones are 1).
    pub fn custom(
        &self,
        ne: &[usize],
        args: &mut [*mut sys::ggml_tensor],
        op: unsafe extern "C" fn(*mut sys::ggml_tensor, i32, i32, *mut c_void),
        params: *const OpParams,
    ) -> *mut sys::ggml_tensor {
        let size = |i: usize| ne.get(i).copied().unwrap_or(1) as i64;
        // SAFETY: args are live tensors of this context; params is null or valid for a read
        // (caller), stored in the node as the graph stores it (spark_op_set_params).
        unsafe {
            let node = sys::ggml_custom_4d(
                self.ctx,
                RowType::F32.ggml(),
                size(0),
                size(1),
                size(2),
                size(3),
                args.as_mut_ptr(),
                args.len() as i32,
                Some(op),
                -1, // GGML_N_TASKS_MAX
                std::ptr::null_mut(),
            );
            if !params.is_null() {
                spark_backend::params::store(node, &params.read_unaligned());
            }
            node
        }
    }

    /// The predictor scores `mul_mat(K1, h[:r_f])`, [F, n_tokens].
    pub fn predictor(
        &self,
        h: *mut sys::ggml_tensor,
        k1: *mut sys::ggml_tensor,
    ) -> *mut sys::ggml_tensor {
        // SAFETY: h [D, n_tokens] f32 and K1 [r_f, F] are live tensors of this context.
        unsafe {
            let hp = sys::ggml_view_2d(self.ctx, h, (*k1).ne[0], (*h).ne[1], (*h).nb[1], 0);
            sys::ggml_mul_mat(self.ctx, k1, hp)
        }
    }

    /// The Spark FFN as the INTERFACES.md graph: mul_mat + spark_ffn_up + spark_ffn_down.
    /// Returns (scores, u, out).
    pub fn spark_ffn(
        &self,
        h: *mut sys::ggml_tensor,
        k1: *mut sys::ggml_tensor,
        k2: *mut sys::ggml_tensor,
        v: *mut sys::ggml_tensor,
        params: *const OpParams,
    ) -> [*mut sys::ggml_tensor; 3] {
        // SAFETY: live tensors of this context with INTERFACES.md shapes.
        unsafe {
            let (d, n_tokens) = ((*h).ne[0] as usize, (*h).ne[1] as usize);
            let f = (*k1).ne[1] as usize;
            let s = self.predictor(h, k1);
            let u = self.custom(&[n_tokens, f], &mut [s, h, k2], spark_ffn_up, params);
            let out = self.custom(&[d, n_tokens], &mut [u, v], spark_ffn_down, params);
            [s, u, out]
        }
    }

    /// The Spark FFN on the fused path of INTERFACES.md: mul_mat + spark_ffn_fused (P
    /// chunks) + spark_ffn_sum. Returns (scores, partials, out).
    pub fn spark_ffn_fused(
        &self,
        h: *mut sys::ggml_tensor,
        k1: *mut sys::ggml_tensor,
        k2: *mut sys::ggml_tensor,
        v: *mut sys::ggml_tensor,
        n_chunks: usize,
        params: *const OpParams,
    ) -> [*mut sys::ggml_tensor; 3] {
        // SAFETY: live tensors of this context with INTERFACES.md shapes.
        unsafe {
            let (d, n_tokens) = ((*h).ne[0] as usize, (*h).ne[1] as usize);
            let s = self.predictor(h, k1);
            let partials = self.custom(
                &[d, n_tokens, n_chunks],
                &mut [s, h, k2, v],
                spark_ffn_fused,
                params,
            );
            let out = self.custom(&[d, n_tokens], &mut [partials], spark_ffn_sum, params);
            [s, partials, out]
        }
    }

    /// The dense gated GELU FFN of Gemma-2: down(gelu(gate h) * (up h)).
    pub fn dense_ffn(
        &self,
        h: *mut sys::ggml_tensor,
        gate: *mut sys::ggml_tensor,
        up: *mut sys::ggml_tensor,
        down: *mut sys::ggml_tensor,
    ) -> *mut sys::ggml_tensor {
        // SAFETY: live tensors of this context with matching shapes.
        unsafe {
            let g = sys::ggml_gelu(self.ctx, sys::ggml_mul_mat(self.ctx, gate, h));
            let x = sys::ggml_mul(self.ctx, g, sys::ggml_mul_mat(self.ctx, up, h));
            sys::ggml_mul_mat(self.ctx, down, x)
        }
    }

    /// Builds the graph ending at `out`.
    pub fn graph(&self, out: *mut sys::ggml_tensor) -> *mut sys::ggml_cgraph {
        // SAFETY: ctx is live and out belongs to it.
        unsafe {
            let g = sys::ggml_new_graph(self.ctx);
            sys::ggml_build_forward_expand(g, out);
            g
        }
    }

    /// Computes `graph` on `n_threads` ggml threads (work buffer from the context).
    pub fn compute(&self, graph: *mut sys::ggml_cgraph, n_threads: i32) {
        // SAFETY: graph belongs to this context, which has room for the work buffer.
        let status = unsafe { sys::ggml_graph_compute_with_ctx(self.ctx, graph, n_threads) };
        assert_eq!(status, 0, "ggml_graph_compute failed");
    }
}

impl Drop for Ggml {
    fn drop(&mut self) {
        // SAFETY: ctx came from ggml_init and is freed once.
        unsafe { sys::ggml_free(self.ctx) };
    }
}

/// A persistent ggml thread pool and a reusable plan, as llama.cpp runs graphs.
pub struct Runner {
    pool: *mut sys::ggml_threadpool,
    work: Vec<u8>,
    n_threads: i32,
}

impl Runner {
    pub fn new(n_threads: i32) -> Self {
        quant::ensure_cpu_init();
        // SAFETY: default params for n_threads, then a pool owned by this struct.
        let pool = unsafe {
            let mut p = sys::ggml_threadpool_params_default(n_threads);
            sys::ggml_threadpool_new(&mut p)
        };
        assert!(!pool.is_null(), "ggml_threadpool_new failed");
        Self {
            pool,
            work: Vec::new(),
            n_threads,
        }
    }

    pub fn compute(&mut self, graph: *mut sys::ggml_cgraph) {
        // SAFETY: graph is live; the plan's work buffer is owned here and sized by ggml.
        unsafe {
            let mut plan = sys::ggml_graph_plan(graph, self.n_threads, self.pool);
            if self.work.len() < plan.work_size {
                self.work.resize(plan.work_size, 0);
            }
            plan.work_data = self.work.as_mut_ptr();
            let status = sys::ggml_graph_compute(graph, &mut plan);
            assert_eq!(status, 0, "ggml_graph_compute failed");
        }
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        // SAFETY: pool came from ggml_threadpool_new and is freed once.
        unsafe { sys::ggml_threadpool_free(self.pool) };
    }
}

/// Magnitude scale of the up stage per element: (|a| + |s_j| + |theta|) * sum |K2_j h2|, the
/// middle terms covering the rounding of `s_j - theta` near the threshold.
pub fn up_scale(scores: &[f32], h: &[f32], d: usize, n: usize, k2: &Weights, k: usize) -> Vec<f64> {
    up_scale_for(scores, h, d, n, k2, Cutoff::TopK(k))
}

/// [`up_scale`] under any cutoff.
pub fn up_scale_for(
    scores: &[f32],
    h: &[f32],
    d: usize,
    n: usize,
    k2: &Weights,
    cutoff: Cutoff,
) -> Vec<f64> {
    let f = k2.n_rows;
    let r = d - k2.n_cols;
    let mut out = vec![0f64; f * n];
    for t in 0..n {
        let s = &scores[t * f..(t + 1) * f];
        let theta = ref_threshold_for(s, cutoff);
        for j in 0..f {
            let sj = f64::from(s[j]);
            let a = match theta {
                Some(th) if sj > th => ref_gelu(sj - th).abs() + sj.abs() + th.abs(),
                Some(_) => continue,
                None => ref_gelu(sj).abs() + sj.abs(),
            };
            let dot: f64 = k2
                .row_f64(j)
                .zip(&h[t * d + r..(t + 1) * d])
                .map(|(w, &x)| (w * f64::from(x)).abs())
                .sum();
            out[j * n + t] = a * dot;
        }
    }
    out
}

/// Asserts `|got - want| <= rel * mag` element by element.
pub fn assert_close(got: &[f32], want: &[f64], mag: &[f64], rel: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, ((&g, &w), &m)) in got.iter().zip(want).zip(mag).enumerate() {
        assert!(
            (f64::from(g) - w).abs() <= rel * m + 1e-30,
            "{what}: element {i}: {g} vs {w} (scale {m})"
        );
    }
}

/// One FFN layer's tensors in a ggml context, with the op parameters.
pub struct OpCase {
    pub ggml: Ggml,
    pub params: Box<OpParams>,
    pub h: *mut sys::ggml_tensor,
    pub k1: *mut sys::ggml_tensor,
    pub k2: *mut sys::ggml_tensor,
    pub v: *mut sys::ggml_tensor,
}

/// Random K1, K2, V of `ty` and h for `n_tokens` tokens, as ggml tensors; returns the case,
/// the weights and h's values.
#[allow(clippy::too_many_arguments)]
pub fn op_case(
    rng: &mut Rng,
    ty: RowType,
    d: usize,
    r: usize,
    f: usize,
    n_tokens: usize,
    k: i32,
    layer: i32,
) -> (OpCase, [Weights; 3], Vec<f32>) {
    let k1 = Weights::random(rng, ty, r, f, 0.3);
    let k2 = Weights::random(rng, ty, d - r, f, 0.3);
    let v = Weights::random(rng, ty, d, f, 0.3);
    let h = rng.normals(n_tokens * d, 1.0);
    let ggml = Ggml::new(64 << 20);
    let ht = ggml.f32_tensor(d, n_tokens, &h);
    let k1t = ggml.tensor(ty, r, f, &k1.bytes);
    let k2t = ggml.tensor(ty, d - r, f, &k2.bytes);
    let vt = ggml.tensor(ty, d, f, &v.bytes);
    let case = OpCase {
        ggml,
        params: Box::new(OpParams {
            layer,
            k,
            ..Default::default()
        }),
        h: ht,
        k1: k1t,
        k2: k2t,
        v: vt,
    };
    (case, [k1, k2, v], h)
}

/// A Gemma 3n sparse FFN layer's Spark nodes' inputs as ggml tensors: gate scores `s` [F, T]
/// (given, as Gemma 3n's dense `W_gate x` would give them: Gaussian-like, any mean), `h`
/// [D, T], K2 [D, F] over ALL of h (r_f = 0) and V [D, F] of type `ty`, with the parameters
/// `op_params(layer, StdMul(GEMMA3N_STD_MUL))`.
pub struct StdMulCase {
    pub ggml: Ggml,
    pub params: Box<OpParams>,
    pub s: *mut sys::ggml_tensor,
    pub h: *mut sys::ggml_tensor,
    pub k2: *mut sys::ggml_tensor,
    pub v: *mut sys::ggml_tensor,
    pub sv: Vec<f32>,
    pub hv: Vec<f32>,
    pub k2w: Weights,
    pub vw: Weights,
    pub cutoff: Cutoff,
}

/// A random [`StdMulCase`] of D = `d`, F = `f`, T = `n_tokens`.
pub fn std_mul_case(
    rng: &mut Rng,
    ty: RowType,
    d: usize,
    f: usize,
    n_tokens: usize,
    layer: i32,
) -> StdMulCase {
    let sv: Vec<f32> = rng
        .normals(n_tokens * f, 1.3)
        .into_iter()
        .map(|x| x - 0.4)
        .collect();
    let hv = rng.normals(n_tokens * d, 1.0);
    let k2w = Weights::random(rng, ty, d, f, 0.3);
    let vw = Weights::random(rng, ty, d, f, 0.3);
    let ggml = Ggml::new(64 << 20);
    let s = ggml.f32_tensor(f, n_tokens, &sv);
    let h = ggml.f32_tensor(d, n_tokens, &hv);
    let k2 = ggml.tensor(ty, d, f, &k2w.bytes);
    let v = ggml.tensor(ty, d, f, &vw.bytes);
    let cutoff = Cutoff::StdMul(f64::from(GEMMA3N_STD_MUL));
    StdMulCase {
        ggml,
        params: Box::new(op_params(layer, cutoff)),
        s,
        h,
        k2,
        v,
        sv,
        hv,
        k2w,
        vw,
        cutoff,
    }
}
