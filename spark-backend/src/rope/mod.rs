//! `spark_rope`: Spark's rotary embedding of Q or K in one op (docs/SPEC.md section 4,
//! docs/INTERFACES.md). A head of width H is two rotary embeddings, the predictor's first r
//! channels and the other H - r, each NEOX-paired within its part (channel `o + i` with
//! `o + i + w/2` for a part of width w at offset o) with
//!
//!   theta_i = freq_scale * (pos * theta_scale^i),  theta_scale = freq_base^(-2/w)
//!   y[o + i]       = x[o + i] * (cos theta_i * scale) - x[o + i + w/2] * (sin theta_i * scale)
//!   y[o + i + w/2] = x[o + i] * (sin theta_i * scale) + x[o + i + w/2] * (cos theta_i * scale)
//!
//! in f32 with exactly these operations, which are those of ggml-cuda's NEOX rope without YaRN
//! (`rope_neox` + `rope_yarn` at ext_factor 0; ggml's CPU rope differs from it by the rounding of
//! its iterated theta). The graph uses it where stock ggml would need two `ggml_rope_ext` nodes
//! (one per part; each scales the channels it rotates), so that Q costs one kernel on a GPU.
//!
//! Arguments: `dst->src[0]` = x `[H, n_head, n_tokens]` f32 (rows of H contiguous values, any
//! row and token strides: Q or K as views of the stacked Q/K/V product), `src[1]` = the
//! positions, i32 `[n_tokens]` contiguous; dst `[H, n_head, n_tokens]` f32 contiguous; the
//! parameters are the node's block read as [`RopeParams`].
//!
//! [`rope_angles`] (once per token: every head of it shares them) and [`rope_head`] are the
//! scalar functions both the CPU op ([`cpu_op`]) and the CUDA kernel (`rope.cu`, per block)
//! compute; [`RopeCall`] the checks they share.

pub mod cpu_op;
pub mod cuda_plan;

#[cfg(feature = "cuda")]
pub(crate) mod cuda_launch;

use crate::params::RopeParams;
use crate::tensor::{views, TensorView, GGML_TYPE_F32};
use crate::KernelError;
use llama_cpp_sys_2 as sys;
use std::ffi::c_void;

/// `spark_rope`'s tensors and parameters, checked.
#[derive(Debug, Clone, Copy)]
pub struct RopeCall {
    /// x, `[H, n_head, n_tokens]`.
    pub x: TensorView,
    /// Positions, `[n_tokens]` i32.
    pub pos: TensorView,
    /// dst, `[H, n_head, n_tokens]` contiguous.
    pub dst: TensorView,
    /// The parameters.
    pub params: RopeParams,
}

impl RopeCall {
    /// H.
    pub fn head_dim(&self) -> usize {
        self.dst.ne[0]
    }

    /// Heads per token.
    pub fn n_head(&self) -> usize {
        self.dst.ne[1]
    }

    /// Tokens.
    pub fn n_tokens(&self) -> usize {
        self.dst.ne[2]
    }

    /// Rows (one head of one token each): `n_head * n_tokens`.
    pub fn n_rows(&self) -> usize {
        self.n_head() * self.n_tokens()
    }

    /// Reads and checks `dst`, its two sources and the parameter block.
    ///
    /// # Safety
    /// `dst` is null or a live tensor whose sources are null or live; `params_block` is null or
    /// points to a parameter block (`crate::params::block`).
    pub unsafe fn read(
        dst: *const sys::ggml_tensor,
        params_block: *const c_void,
    ) -> Result<Self, KernelError> {
        // SAFETY: forwarded contract.
        let (dst, [x, pos]) = unsafe { views::<2>(dst)? };
        if params_block.is_null() {
            return Err(KernelError::Param(crate::params::MISSING.into()));
        }
        // SAFETY: a non-null block is a live 24-byte parameter block (contract); RopeParams is
        // its 24-byte view (asserted in crate::params), read unaligned.
        let params = unsafe { params_block.cast::<RopeParams>().read_unaligned() };
        let call = RopeCall {
            x,
            pos,
            dst,
            params,
        };
        call.check()?;
        Ok(call)
    }

    fn check(&self) -> Result<(), KernelError> {
        let (x, pos, dst, p) = (&self.x, &self.pos, &self.dst, &self.params);
        for (v, name) in [(x, "x"), (dst, "dst")] {
            if v.ty != GGML_TYPE_F32 {
                return Err(KernelError::UnsupportedType {
                    tensor: name,
                    ty: v.ty,
                });
            }
        }
        if pos.ty != sys::GGML_TYPE_I32 {
            return Err(KernelError::UnsupportedType {
                tensor: "positions",
                ty: pos.ty,
            });
        }
        let [h, n_head, n_tokens, n3] = dst.ne;
        if x.ne != dst.ne || n3 != 1 {
            return Err(KernelError::Shape(format!(
                "x ne {:?} and dst ne {:?} must be one [H, n_head, n_tokens, 1]",
                x.ne, dst.ne
            )));
        }
        if pos.ne != [n_tokens, 1, 1, 1] || pos.nb[0] != 4 {
            return Err(KernelError::Shape(format!(
                "positions: ne {:?} nb0 {}, expected [{n_tokens}, 1, 1, 1] contiguous i32",
                pos.ne, pos.nb[0]
            )));
        }
        let contiguous = [4, 4 * h, 4 * h * n_head, 4 * h * n_head * n_tokens];
        if dst.nb != contiguous {
            return Err(KernelError::Shape(format!(
                "dst: nb {:?}, expected contiguous {contiguous:?}",
                dst.nb
            )));
        }
        if x.nb[0] != 4 || x.nb[1] % 4 != 0 || x.nb[2] % 4 != 0 || x.nb[1] < 4 * h {
            return Err(KernelError::Shape(format!(
                "x: nb {:?}: rows of {h} contiguous f32 values, strides multiples of 4 bytes",
                x.nb
            )));
        }
        let r = usize::try_from(p.r)
            .ok()
            .filter(|&r| 0 < r && r < h && r % 2 == 0 && h % 2 == 0);
        if r.is_none() {
            return Err(KernelError::Param(format!(
                "r = {} (must be even, 0 < r < H = {h}, H even)",
                p.r
            )));
        }
        if !(p.freq_base.is_finite() && p.freq_base > 0.0) {
            return Err(KernelError::Param(format!(
                "freq_base = {} (must be finite and > 0)",
                p.freq_base
            )));
        }
        if !(p.freq_scale.is_finite() && p.scale.is_finite()) {
            return Err(KernelError::Param(format!(
                "freq_scale = {}, scale = {} (must be finite)",
                p.freq_scale, p.scale
            )));
        }
        Ok(())
    }
}

/// The scaled (cos, sin) of every pair of a head of width `h` at position `pos`, first part's
/// pairs first (module docs; `r` checked by [`RopeCall`]): what every head of one token shares.
/// The exact f32 operations of the CUDA kernel.
pub fn rope_angles(pos: i32, p: &RopeParams, h: usize, angles: &mut Vec<(f32, f32)>) {
    angles.clear();
    let r = p.r as usize;
    for width in [r, h - r] {
        let theta_scale = p.freq_base.powf(-2.0 / width as f32);
        for i in 0..width / 2 {
            let theta = p.freq_scale * (pos as f32 * theta_scale.powf(i as f32));
            angles.push((theta.cos() * p.scale, theta.sin() * p.scale));
        }
    }
}

/// One head: `out[..H]` from `x[..H]` with the angles of its token ([`rope_angles`]).
pub fn rope_head(x: &[f32], angles: &[(f32, f32)], r: usize, out: &mut [f32]) {
    let h = out.len();
    let mut pairs = angles.iter();
    for (offset, width) in [(0, r), (r, h - r)] {
        let half = width / 2;
        for (i, &(c, s)) in (0..half).zip(&mut pairs) {
            let (x0, x1) = (x[offset + i], x[offset + i + half]);
            out[offset + i] = x0 * c - x1 * s;
            out[offset + i + half] = x0 * s + x1 * c;
        }
    }
}
