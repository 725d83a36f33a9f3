//! Quantizing f32 rows to a row type with ggml's reference quantizers (for tests, benches and
//! the synthetic models); the kernels of quantized rows are `arch::generic::ggml`'s.

use crate::kernel_types::RowType;
use crate::KernelError;
use llama_cpp_sys_2 as sys;

pub use crate::arch::generic::ggml::{dequantize_ggml, ensure_cpu_init};

/// Quantizes `n_rows` rows of `n_cols` f32 values to `ty` with ggml's reference quantizer
/// (`ggml_quantize_chunk`): without an importance matrix, except for the types ggml cannot
/// quantize without one (`ggml_quantize_requires_imatrix`: iq2_xxs, iq2_xs, iq1_s), which get
/// a uniform one (every column weighted 1). Float types are converted element-wise.
pub fn quantize_rows(ty: RowType, x: &[f32], n_cols: usize) -> Result<Vec<u8>, KernelError> {
    let row_bytes = ty.row_bytes(n_cols).ok_or_else(|| {
        KernelError::Shape(format!(
            "{n_cols} columns are not whole {} blocks",
            ty.name()
        ))
    })?;
    if n_cols == 0 || !x.len().is_multiple_of(n_cols) {
        return Err(KernelError::Shape(format!(
            "{} values are not rows of {n_cols}",
            x.len()
        )));
    }
    let n_rows = x.len() / n_cols;
    let mut out = vec![0u8; n_rows * row_bytes];
    match ty {
        RowType::F32 => out.copy_from_slice(crate::rows::f32_bytes(x)),
        RowType::F16 => {
            for (o, &v) in out.chunks_exact_mut(2).zip(x) {
                o.copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
            }
        }
        RowType::Bf16 => {
            for (o, &v) in out.chunks_exact_mut(2).zip(x) {
                o.copy_from_slice(&half::bf16::from_f32(v).to_le_bytes());
            }
        }
        _ => {
            ensure_cpu_init();
            // SAFETY: a plain query of a static property of a valid type id.
            let uniform = unsafe { sys::ggml_quantize_requires_imatrix(ty.ggml()) }
                .then(|| vec![1f32; n_cols]);
            let imatrix = uniform.as_ref().map_or(std::ptr::null(), |w| w.as_ptr());
            // SAFETY: `x` holds n_rows * n_cols floats and `out` the n_rows * row_bytes bytes
            // ggml writes for them; `imatrix` is null (allowed for types that do not require
            // one) or n_cols weights, one per column, as ggml reads it.
            let written = unsafe {
                sys::ggml_quantize_chunk(
                    ty.ggml(),
                    x.as_ptr(),
                    out.as_mut_ptr().cast(),
                    0,
                    n_rows as i64,
                    n_cols as i64,
                    imatrix,
                )
            };
            if written != out.len() {
                return Err(KernelError::Shape(format!(
                    "ggml wrote {written} bytes, expected {}",
                    out.len()
                )));
            }
        }
    }
    Ok(out)
}
