//! Shared by the attention tests: random cases in llama.cpp's KV-cache layouts and a float64
//! reference of SPEC.md section 4 written from the spec, independent of the kernel.

#![allow(dead_code)]

use llama_cpp_sys_2 as sys;
use spark_backend::attention::cpu_op::spark_attn;
use spark_backend::attention::{AttnCall, SparseAttention};
use spark_backend::params::{AttnParams, OpParams};
use spark_backend::tensor::TensorView;
use spark_backend::topk::norm_ppf;
use spark_backend::KernelError;
use std::ffi::c_void;

/// SplitMix64: small, deterministic.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.unit().max(1e-300);
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

/// Cache element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ty {
    F16,
    F32,
}

impl Ty {
    pub fn size(self) -> usize {
        match self {
            Ty::F16 => 2,
            Ty::F32 => 4,
        }
    }
    pub fn ggml(self) -> u32 {
        match self {
            Ty::F16 => 1,
            Ty::F32 => 0,
        }
    }
    /// The value as stored (rounded to f16 where needed), widened to f64.
    pub fn round(self, x: f64) -> f64 {
        match self {
            Ty::F16 => f64::from(half::f16::from_f64(x).to_f32()),
            Ty::F32 => f64::from(x as f32),
        }
    }
    fn write(self, buf: &mut [u8], off: usize, x: f64) {
        match self {
            Ty::F16 => {
                buf[off..off + 2].copy_from_slice(&half::f16::from_f64(x).to_bits().to_le_bytes())
            }
            Ty::F32 => buf[off..off + 4].copy_from_slice(&(x as f32).to_le_bytes()),
        }
    }
}

/// How positions are masked.
#[derive(Clone, Copy, Debug)]
pub enum MaskKind {
    /// Token t (at absolute position n_kv - T + t) sees positions <= its own.
    Causal,
    /// Causal and at most `w` positions back (Gemma-2's sliding layers).
    Sliding(usize),
    /// Causal with random holes (other sequences' cells), each position kept with probability p.
    Holes(f64),
    /// Everything valid.
    Full,
}

/// Shape and content of one random case.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    pub h: usize,
    pub r: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub n_tokens: usize,
    pub n_kv: usize,
    pub n_stream: usize,
    pub k_ty: Ty,
    pub v_ty: Ty,
    pub v_transposed: bool,
    pub mask_ty: Ty,
    pub mask: MaskKind,
    pub k_keep: i32,
    pub softcap: f32,
    /// Extra cache cells beyond n_kv (the view is a prefix of a larger cache).
    pub spare_cells: usize,
    /// Scale of q1 (larger spreads the scores).
    pub q_scale: f64,
    pub seed: u64,
}

impl Spec {
    pub fn new(
        h: usize,
        r: usize,
        n_head: usize,
        n_head_kv: usize,
        n_tokens: usize,
        n_kv: usize,
    ) -> Self {
        Spec {
            h,
            r,
            n_head,
            n_head_kv,
            n_tokens,
            n_kv,
            n_stream: 1,
            k_ty: Ty::F16,
            v_ty: Ty::F16,
            v_transposed: false,
            mask_ty: Ty::F32,
            mask: MaskKind::Causal,
            k_keep: 4,
            softcap: 50.0,
            spare_cells: 3,
            q_scale: 1.0,
            seed: 1,
        }
    }
    pub fn params(&self) -> AttnParams {
        AttnParams {
            layer: 3,
            k: self.k_keep,
            r: self.r as i32,
            softcap: self.softcap,
        }
    }
}

/// A built case: buffers in ggml layouts and exact (as stored) values for the reference.
pub struct Case {
    pub spec: Spec,
    pub q: Vec<f32>,
    pub k: Vec<u8>,
    pub v: Vec<u8>,
    pub mask: Vec<u8>,
    pub k_nb: [usize; 4],
    pub v_nb: [usize; 4],
    pub mask_nb: [usize; 4],
    pub mask_rows: usize,
    /// Exact K values [s][g][j][i].
    pub k_exact: Vec<f64>,
    pub v_exact: Vec<f64>,
    /// valid[s][t][j].
    pub valid: Vec<bool>,
}

impl Case {
    pub fn build(spec: Spec) -> Case {
        let Spec {
            h,
            n_head,
            n_head_kv: kv,
            n_tokens: t,
            n_kv,
            n_stream: ns,
            ..
        } = spec;
        let mut rng = Rng::new(spec.seed);
        let cells = n_kv + spec.spare_cells;
        let q: Vec<f32> = (0..h * n_head * t * ns)
            .map(|idx| {
                let i = idx % h;
                let scale = if i < spec.r { spec.q_scale } else { 1.0 };
                (rng.normal() * scale / (h as f64).sqrt()) as f32
            })
            .collect();
        // K cache: [H, KV, cells, S] contiguous; the view covers n_kv cells.
        let ke = spec.k_ty.size();
        let k_nb = [ke, ke * h, ke * h * kv, ke * h * kv * cells];
        let mut k = vec![0u8; ke * h * kv * cells * ns];
        let mut k_exact = vec![0f64; ns * kv * n_kv * h];
        for s in 0..ns {
            for j in 0..cells {
                for g in 0..kv {
                    for i in 0..h {
                        let x = rng.normal();
                        spec.k_ty.write(
                            &mut k,
                            i * k_nb[0] + g * k_nb[1] + j * k_nb[2] + s * k_nb[3],
                            x,
                        );
                        if j < n_kv {
                            k_exact[((s * kv + g) * n_kv + j) * h + i] = spec.k_ty.round(x);
                        }
                    }
                }
            }
        }
        // V cache: normal [H, KV, cells, S], or llama.cpp's transposed storage
        // [cells, H, KV, S] seen through an [H, KV, n_kv, S] view with nb0 = cells * es.
        let ve = spec.v_ty.size();
        let v_nb = if spec.v_transposed {
            [ve * cells, ve * cells * h, ve, ve * cells * h * kv]
        } else {
            [ve, ve * h, ve * h * kv, ve * h * kv * cells]
        };
        let mut v = vec![0u8; ve * h * kv * cells * ns];
        let mut v_exact = vec![0f64; ns * kv * n_kv * h];
        for s in 0..ns {
            for j in 0..cells {
                for g in 0..kv {
                    for i in 0..h {
                        let x = rng.unit() * 2.0 - 1.0;
                        spec.v_ty.write(
                            &mut v,
                            i * v_nb[0] + g * v_nb[1] + j * v_nb[2] + s * v_nb[3],
                            x,
                        );
                        if j < n_kv {
                            v_exact[((s * kv + g) * n_kv + j) * h + i] = spec.v_ty.round(x);
                        }
                    }
                }
            }
        }
        // Mask [n_kv, rows, 1, S], rows padded past T like llama.cpp may.
        let mask_rows = t + 2;
        let me = spec.mask_ty.size();
        let mask_nb = [me, me * n_kv, me * n_kv * mask_rows, me * n_kv * mask_rows];
        let mut mask = vec![0u8; me * n_kv * mask_rows * ns];
        let mut valid = vec![false; ns * t * n_kv];
        for s in 0..ns {
            for tt in 0..mask_rows {
                let p = (n_kv + tt).saturating_sub(t); // absolute position of token tt
                for j in 0..n_kv {
                    let ok = tt < t
                        && match spec.mask {
                            MaskKind::Full => true,
                            MaskKind::Causal => j <= p,
                            MaskKind::Sliding(w) => j <= p && j + w > p,
                            MaskKind::Holes(keep) => j <= p && (j == p || rng.unit() < keep),
                        };
                    if tt < t {
                        valid[(s * t + tt) * n_kv + j] = ok;
                    }
                    let x = if ok { 0.0 } else { f64::NEG_INFINITY };
                    spec.mask_ty.write(
                        &mut mask,
                        j * mask_nb[0] + tt * mask_nb[1] + s * mask_nb[3],
                        x,
                    );
                }
            }
        }
        Case {
            spec,
            q,
            k,
            v,
            mask,
            k_nb,
            v_nb,
            mask_nb,
            mask_rows,
            k_exact,
            v_exact,
            valid,
        }
    }

    pub fn q_view(&mut self) -> TensorView {
        let Spec {
            h,
            n_head,
            n_tokens,
            n_stream,
            ..
        } = self.spec;
        TensorView {
            ty: 0,
            ne: [h, n_head, n_tokens, n_stream],
            nb: [4, 4 * h, 4 * h * n_head, 4 * h * n_head * n_tokens],
            data: self.q.as_mut_ptr().cast(),
        }
    }
    pub fn k_view(&mut self) -> TensorView {
        let s = self.spec;
        TensorView {
            ty: s.k_ty.ggml(),
            ne: [s.h, s.n_head_kv, s.n_kv, s.n_stream],
            nb: self.k_nb,
            data: self.k.as_mut_ptr(),
        }
    }
    pub fn v_view(&mut self) -> TensorView {
        let s = self.spec;
        TensorView {
            ty: s.v_ty.ggml(),
            ne: [s.h, s.n_head_kv, s.n_kv, s.n_stream],
            nb: self.v_nb,
            data: self.v.as_mut_ptr(),
        }
    }
    pub fn mask_view(&mut self) -> TensorView {
        let s = self.spec;
        TensorView {
            ty: s.mask_ty.ggml(),
            ne: [s.n_kv, self.mask_rows, 1, s.n_stream],
            nb: self.mask_nb,
            data: self.mask.as_mut_ptr(),
        }
    }
    /// A dst view over `out` (which must hold H * N * T * S floats).
    pub fn dst_view(&self, out: &mut [f32]) -> TensorView {
        let Spec {
            h,
            n_head,
            n_tokens,
            n_stream,
            ..
        } = self.spec;
        assert_eq!(out.len(), h * n_head * n_tokens * n_stream);
        TensorView {
            ty: 0,
            ne: [h, n_head, n_tokens, n_stream],
            nb: [4, 4 * h, 4 * h * n_head, 4 * h * n_head * n_tokens],
            data: out.as_mut_ptr().cast(),
        }
    }
    pub fn out_len(&self) -> usize {
        let s = self.spec;
        s.h * s.n_head * s.n_tokens * s.n_stream
    }
    /// The case's call checked by the kernel, writing into `out` (`out_len()` floats), with the
    /// work units of a call on one thread.
    pub fn sparse_attention(
        &mut self,
        out: &mut [f32],
        params: &AttnParams,
    ) -> Result<SparseAttention, KernelError> {
        let call = AttnCall {
            q: self.q_view(),
            k: self.k_view(),
            v: self.v_view(),
            mask: self.mask_view(),
            dst: self.dst_view(out),
        };
        SparseAttention::new(&call, params)
    }

    pub fn q_at(&self, s: usize, t: usize, n: usize) -> &[f32] {
        let Spec {
            h,
            n_head,
            n_tokens,
            ..
        } = self.spec;
        let o = ((s * n_tokens + t) * n_head + n) * h;
        &self.q[o..o + h]
    }
    pub fn k_at(&self, s: usize, g: usize, j: usize) -> &[f64] {
        let Spec {
            h, n_head_kv, n_kv, ..
        } = self.spec;
        let o = ((s * n_head_kv + g) * n_kv + j) * h;
        &self.k_exact[o..o + h]
    }
    pub fn v_at(&self, s: usize, g: usize, j: usize) -> &[f64] {
        let Spec {
            h, n_head_kv, n_kv, ..
        } = self.spec;
        let o = ((s * n_head_kv + g) * n_kv + j) * h;
        &self.v_exact[o..o + h]
    }
    pub fn valid_list(&self, s: usize, t: usize) -> Vec<u32> {
        let Spec { n_tokens, n_kv, .. } = self.spec;
        (0..n_kv as u32)
            .filter(|&j| self.valid[(s * n_tokens + t) * n_kv + j as usize])
            .collect()
    }
}

/// The float64 reference for one query: scores, threshold and selection per SPEC 1 and 4.
pub struct RefRow {
    /// C (valid positions).
    pub valid: Vec<u32>,
    /// capA(q1 . k1_j) for j in C, same order.
    pub s1: Vec<f64>,
    /// theta (None when |C| <= k: no sparsification).
    pub theta: Option<f64>,
    /// S per the reference.
    pub kept: Vec<u32>,
}

pub fn cap(x: f64, c: f64) -> f64 {
    if c == 0.0 {
        x
    } else {
        c * (x / c).tanh()
    }
}

pub fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

pub fn reference_row(case: &Case, s: usize, t: usize, n: usize) -> RefRow {
    let spec = case.spec;
    let g = n / (spec.n_head / spec.n_head_kv);
    let q = case.q_at(s, t, n);
    let valid = case.valid_list(s, t);
    let s1: Vec<f64> = valid
        .iter()
        .map(|&j| {
            let k = case.k_at(s, g, j as usize);
            let dot: f64 = (0..spec.r).map(|i| f64::from(q[i]) * k[i]).sum();
            cap(dot, f64::from(spec.softcap))
        })
        .collect();
    let d = valid.len();
    let k = spec.k_keep as usize;
    if d <= k {
        return RefRow {
            kept: valid.clone(),
            valid,
            s1,
            theta: None,
        };
    }
    let mean = s1.iter().sum::<f64>() / d as f64;
    let var = s1.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (d as f64 - 1.0);
    let theta = mean + var.sqrt() * norm_ppf(1.0 - k as f64 / d as f64);
    let mut kept: Vec<u32> = valid
        .iter()
        .zip(&s1)
        .filter(|(_, &x)| x > theta)
        .map(|(&j, _)| j)
        .collect();
    if kept.is_empty() {
        let mx = s1.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        kept = valid
            .iter()
            .zip(&s1)
            .filter(|(_, &x)| x == mx)
            .map(|(&j, _)| j)
            .collect();
    }
    RefRow {
        valid,
        s1,
        theta: Some(theta),
        kept,
    }
}

/// o per SPEC 4 for a given selection, in f64, plus the per-element magnitude sum |w_j v_j|.
pub fn reference_output(
    case: &Case,
    s: usize,
    t: usize,
    n: usize,
    kept: &[u32],
) -> (Vec<f64>, Vec<f64>) {
    let spec = case.spec;
    let h = spec.h;
    let g = n / (spec.n_head / spec.n_head_kv);
    let q = case.q_at(s, t, n);
    let mut o = vec![0f64; h];
    let mut mag = vec![0f64; h];
    if kept.is_empty() {
        return (o, mag);
    }
    let s1: Vec<f64> = kept
        .iter()
        .map(|&j| {
            let k = case.k_at(s, g, j as usize);
            cap(
                (0..spec.r).map(|i| f64::from(q[i]) * k[i]).sum(),
                f64::from(spec.softcap),
            )
        })
        .collect();
    let mx = s1.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let z: f64 = s1.iter().map(|x| (x - mx).exp()).sum();
    for (c, &j) in kept.iter().enumerate() {
        let k = case.k_at(s, g, j as usize);
        let d2: f64 = (spec.r..h).map(|i| f64::from(q[i]) * k[i]).sum();
        let w = (s1[c] - mx).exp() / z * softplus(d2);
        let v = case.v_at(s, g, j as usize);
        for i in 0..h {
            o[i] += w * v[i];
            mag[i] += (w * v[i]).abs();
        }
    }
    (o, mag)
}

/// A ggml context with its tensors allocated in host memory; freed on drop.
pub struct Ctx(pub *mut sys::ggml_context);

impl Ctx {
    pub fn new(bytes: usize) -> Self {
        let p = sys::ggml_init_params {
            mem_size: bytes,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: false,
        };
        // SAFETY: plain ggml context creation; the result is checked.
        let ctx = unsafe { sys::ggml_init(p) };
        assert!(!ctx.is_null());
        Ctx(ctx)
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: created by ggml_init, freed once.
        unsafe { sys::ggml_free(self.0) };
    }
}

/// Copies `bytes` into a tensor's data.
///
/// # Safety
/// `t` must be an allocated tensor of at least `bytes.len()` bytes.
unsafe fn fill(t: *mut sys::ggml_tensor, bytes: &[u8]) {
    // SAFETY: per the contract.
    unsafe {
        assert!(sys::ggml_nbytes(t) >= bytes.len());
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), (*t).data.cast::<u8>(), bytes.len());
    }
}

fn ty(t: Ty) -> sys::ggml_type {
    t.ggml()
}

/// The `spark_attn` node for `case` in `ctx`, as llama.cpp builds it (K and V views of a
/// larger cache; V either plain or transposed storage permuted to [H, KV, n_kv]), with
/// the parameters `userdata` points to (an `AttnParams`, or null for none) stored in the node as
/// the graph stores them (`spark_op_set_params`). `mutate` may alter the arguments before the
/// op is created.
pub fn build_op(
    ctx: &Ctx,
    case: &Case,
    userdata: *mut c_void,
    mutate: impl FnOnce(&mut [*mut sys::ggml_tensor; 4]),
) -> *mut sys::ggml_tensor {
    let s = case.spec;
    assert_eq!(s.n_stream, 1);
    let cells = s.n_kv + s.spare_cells;
    // SAFETY: every tensor comes from `ctx` (allocated, host memory), data copied to exact sizes.
    unsafe {
        let c = ctx.0;
        let q = sys::ggml_new_tensor_3d(c, 0, s.h as i64, s.n_head as i64, s.n_tokens as i64);
        fill(
            q,
            std::slice::from_raw_parts(case.q.as_ptr().cast::<u8>(), case.q.len() * 4),
        );
        let k_store =
            sys::ggml_new_tensor_3d(c, ty(s.k_ty), s.h as i64, s.n_head_kv as i64, cells as i64);
        fill(k_store, &case.k);
        let k = sys::ggml_view_3d(
            c,
            k_store,
            s.h as i64,
            s.n_head_kv as i64,
            s.n_kv as i64,
            (*k_store).nb[1],
            (*k_store).nb[2],
            0,
        );
        let v = if s.v_transposed {
            // llama.cpp's transposed V: [cells, H, KV] storage, viewed [n_kv, H, KV], then
            // permuted so that dims read [H, KV, n_kv] (nb0 = cells * elem).
            let v_store = sys::ggml_new_tensor_3d(
                c,
                ty(s.v_ty),
                cells as i64,
                s.h as i64,
                s.n_head_kv as i64,
            );
            fill(v_store, &case.v);
            let view = sys::ggml_view_3d(
                c,
                v_store,
                s.n_kv as i64,
                s.h as i64,
                s.n_head_kv as i64,
                (*v_store).nb[1],
                (*v_store).nb[2],
                0,
            );
            sys::ggml_permute(c, view, 2, 0, 1, 3)
        } else {
            let v_store = sys::ggml_new_tensor_3d(
                c,
                ty(s.v_ty),
                s.h as i64,
                s.n_head_kv as i64,
                cells as i64,
            );
            fill(v_store, &case.v);
            sys::ggml_view_3d(
                c,
                v_store,
                s.h as i64,
                s.n_head_kv as i64,
                s.n_kv as i64,
                (*v_store).nb[1],
                (*v_store).nb[2],
                0,
            )
        };
        let mask =
            sys::ggml_new_tensor_3d(c, ty(s.mask_ty), s.n_kv as i64, case.mask_rows as i64, 1);
        fill(mask, &case.mask);
        let mut args = [q, k, v, mask];
        mutate(&mut args);
        let node = sys::ggml_custom_4d(
            c,
            0,
            s.h as i64,
            s.n_head as i64,
            s.n_tokens as i64,
            1,
            args.as_mut_ptr(),
            4,
            Some(spark_attn),
            -1,
            std::ptr::null_mut(),
        );
        if !userdata.is_null() {
            let p = userdata.cast::<AttnParams>().read_unaligned();
            let block = OpParams {
                layer: p.layer,
                k: p.k,
                r: p.r,
                softcap: p.softcap,
                ..OpParams::default()
            };
            spark_backend::params::store(node, &block);
        }
        node
    }
}
