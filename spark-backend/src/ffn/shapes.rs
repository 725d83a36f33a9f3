//! The shape rules of the FFN custom ops (docs/INTERFACES.md), from tensor metadata only: one
//! set of checks and messages for the CPU ops' `prepare` (`crate::ffn::cpu_ops`) and the CUDA
//! launchers' checks (`crate::cuda::check`). Weight types and data access are each side's own.

use crate::tensor::{expect_2d, expect_f32_rows, TensorView};
use crate::KernelError;

/// The sizes of an FFN stage (`spark_ffn_up`, `spark_ffn_fused`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StageDims {
    /// F, the neurons.
    pub(crate) f: usize,
    /// D, the model width.
    pub(crate) d: usize,
    /// Tokens of the ubatch.
    pub(crate) n_tokens: usize,
}

/// Scores `s` [F, T] (contiguous f32 rows), `h` [D, T] (f32 rows) and K2 [D - r_f, F] with
/// `0 < D - r_f <= D` (r_f = 0: K2 spans all of h).
pub(crate) fn stage(
    s: &TensorView,
    h: &TensorView,
    k2: &TensorView,
) -> Result<StageDims, KernelError> {
    expect_f32_rows(s, "scores")?;
    expect_f32_rows(h, "h")?;
    let (f, n_tokens, d) = (s.ne[0], s.ne[1], h.ne[0]);
    expect_2d(s, "scores", f, n_tokens)?;
    expect_2d(h, "h", d, n_tokens)?;
    expect_2d(k2, "ffn_up", k2.ne[0], f)?;
    if k2.ne[0] == 0 || k2.ne[0] > d {
        return Err(KernelError::Shape(format!(
            "ffn_up width {} not in (0, D = {d}]",
            k2.ne[0]
        )));
    }
    if s.nb[1] != 4 * f {
        return Err(KernelError::Shape("scores rows must be contiguous".into()));
    }
    Ok(StageDims { f, d, n_tokens })
}

/// `spark_ffn_fused`: V [D, F] and dst [D, T, P] contiguous f32 with 1 <= P <= F; returns P.
pub(crate) fn fused_dst(
    dims: StageDims,
    v: &TensorView,
    out: &TensorView,
) -> Result<usize, KernelError> {
    let StageDims { f, d, n_tokens } = dims;
    expect_2d(v, "ffn_down_t", d, f)?;
    let p = out.ne[2];
    if out.ne != [d, n_tokens, p, 1] || p == 0 || p > f {
        return Err(KernelError::Shape(format!(
            "dst: ne {:?}, expected [{d}, {n_tokens}, P, 1] with 1 <= P <= F = {f}",
            out.ne
        )));
    }
    expect_f32_rows(out, "dst")?;
    if out.nb[1] != 4 * d || out.nb[2] != 4 * d * n_tokens {
        return Err(KernelError::Shape("dst must be contiguous".into()));
    }
    Ok(p)
}

/// `spark_ffn_up`: dst u [T, F] contiguous f32 (neuron-major).
pub(crate) fn up_dst(dims: StageDims, out: &TensorView) -> Result<(), KernelError> {
    expect_2d(out, "dst", dims.n_tokens, dims.f)?;
    expect_f32_rows(out, "dst")?;
    if out.nb[1] != 4 * dims.n_tokens {
        return Err(KernelError::Shape("dst must be contiguous".into()));
    }
    Ok(())
}

/// `spark_ffn_down`: u [T, F] contiguous f32, V [D, F], dst [D, T] f32 rows; returns
/// (T, F, D).
pub(crate) fn down(
    u: &TensorView,
    v: &TensorView,
    out: &TensorView,
) -> Result<(usize, usize, usize), KernelError> {
    expect_f32_rows(u, "u")?;
    let (n_tokens, f, d) = (u.ne[0], u.ne[1], v.ne[0]);
    expect_2d(u, "u", n_tokens, f)?;
    expect_2d(v, "ffn_down_t", d, f)?;
    if u.nb[1] != 4 * n_tokens {
        return Err(KernelError::Shape("u must be contiguous".into()));
    }
    expect_2d(out, "dst", d, n_tokens)?;
    expect_f32_rows(out, "dst")?;
    Ok((n_tokens, f, d))
}

/// `spark_ffn_sum`: partials [D, T, P] contiguous f32 with P >= 1, dst [D, T] contiguous f32;
/// returns (D, T, P).
pub(crate) fn sum(
    partials: &TensorView,
    out: &TensorView,
) -> Result<(usize, usize, usize), KernelError> {
    let (d, n_tokens, p) = (partials.ne[0], partials.ne[1], partials.ne[2]);
    expect_f32_rows(partials, "partials")?;
    let len = d * n_tokens;
    if partials.ne[3] != 1 || partials.nb[1] != 4 * d || partials.nb[2] != 4 * len || p == 0 {
        return Err(KernelError::Shape(format!(
            "partials: ne {:?} nb {:?}, expected contiguous [D, n_tokens, P >= 1, 1]",
            partials.ne, partials.nb
        )));
    }
    expect_2d(out, "dst", d, n_tokens)?;
    expect_f32_rows(out, "dst")?;
    if out.nb[1] != 4 * d {
        return Err(KernelError::Shape("dst must be contiguous".into()));
    }
    Ok((d, n_tokens, p))
}
