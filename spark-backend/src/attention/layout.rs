//! One `spark_attn` call as the CPU op and the CUDA launcher read it (docs/INTERFACES.md): its
//! tensors as views ([`AttnCall`], from `dst` and the parameter block, metadata only) and their checked
//! shapes, types and strides ([`AttnLayout`]).
//!
//! Dimensions (ggml order, ne0 fastest), with `S` the number of KV streams (1 unless llama.cpp
//! splits the batch into streams):
//! - q    `[H, N, T, S]` f32
//! - k, v `[H, KV, n_kv, S]` f16 or f32, any byte strides (a transposed V cache included); or
//!   any other type ggml converts to f32 in blocks (bf16, q8_0, q4_0, ...: [`CacheType`]) with
//!   adjacent blocks, H whole blocks and, for k, r too (the predictor's dims are a block prefix)
//! - mask `[n_kv, >= T, N / i, S / j]` f32 or f16 (dims 2 and 3 broadcast like ggml's)
//! - dst  `[H, N, T, S]` f32 with adjacent elements

pub(crate) use crate::kernel_types::{CacheType, ElemType};
use crate::params::AttnParams;
use crate::tensor::TensorView;
use crate::KernelError;
use llama_cpp_sys_2 as sys;
use std::ffi::c_void;

pub(crate) use crate::tensor::GGML_TYPE_F32;

/// A strided tensor: element `(i0, i1, i2, i3)` at `data + sum(i_d * nb[d])` (for a
/// [`CacheType::Blocks`] cache, block `i0 / block` at `i0 / block * nb[0]`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Strided<T = ElemType> {
    /// First byte.
    pub(crate) data: *mut u8,
    /// Element type.
    pub(crate) ty: T,
    /// Byte strides.
    pub(crate) nb: [usize; 4],
    /// Extent of each dimension.
    pub(crate) ne: [usize; 4],
}

impl Strided {
    fn new(view: &TensorView, tensor: &'static str) -> Result<Self, KernelError> {
        Ok(Self {
            data: view.data,
            ty: ElemType::from_ggml(view.ty, tensor)?,
            nb: view.nb,
            ne: view.ne,
        })
    }
}

impl Strided<CacheType> {
    /// A K or V cache view; a block type must have adjacent blocks (nb0 = the block's bytes)
    /// and rows of whole blocks, with the first `prefix` elements whole blocks too (k's
    /// predictor dims r; 0 for v).
    fn cache(view: &TensorView, tensor: &'static str, prefix: usize) -> Result<Self, KernelError> {
        let ty = CacheType::from_ggml(view.ty, tensor)?;
        if let CacheType::Blocks(t) = ty {
            let (be, bb) = (t.block_elems(), t.block_bytes());
            if view.nb[0] != bb || !view.ne[0].is_multiple_of(be) || !prefix.is_multiple_of(be) {
                return Err(shape_err(format!(
                    "{tensor} cache of type {}: rows of {} elements{} are not whole blocks of {be} \
                     adjacent elements ({bb} bytes; nb0 = {})",
                    t.name(),
                    view.ne[0],
                    if prefix > 0 { format!(" split at {prefix}") } else { String::new() },
                    view.nb[0]
                )));
            }
        }
        Ok(Self {
            data: view.data,
            ty,
            nb: view.nb,
            ne: view.ne,
        })
    }
}

impl<T> Strided<T> {
    /// The same view with element type `ty`.
    pub(crate) fn with_ty<U>(&self, ty: U) -> Strided<U> {
        Strided {
            data: self.data,
            ty,
            nb: self.nb,
            ne: self.ne,
        }
    }

    /// Byte offset of `(i0, i1, i2, i3)`.
    #[inline(always)]
    pub(crate) fn offset(&self, i: [usize; 4]) -> usize {
        i[0] * self.nb[0] + i[1] * self.nb[1] + i[2] * self.nb[2] + i[3] * self.nb[3]
    }
}

/// The tensors of one `spark_attn` call, as views (metadata only).
#[derive(Debug, Clone, Copy)]
pub struct AttnCall {
    /// Queries (`src[0]`).
    pub q: TensorView,
    /// K cache view (`src[1]`).
    pub k: TensorView,
    /// V cache view (`src[2]`).
    pub v: TensorView,
    /// Mask (`src[3]`).
    pub mask: TensorView,
    /// The output.
    pub dst: TensorView,
}

impl AttnCall {
    /// Reads the views of `dst` and its four sources and the params struct, reading no tensor
    /// data: the one reading of a `spark_attn` call for the CPU op (`super::cpu_op`) and the CUDA
    /// launcher (`super::cuda_plan`), with the same messages.
    ///
    /// # Safety
    /// `dst` must be null or a live `ggml_tensor` whose `src[0..4]` are null or live;
    /// `params_block` null or a live `AttnParams` (in host memory).
    pub unsafe fn read(
        dst: *const sys::ggml_tensor,
        params_block: *const c_void,
    ) -> Result<(Self, AttnParams), KernelError> {
        // SAFETY: per the contract, dst is null or live.
        let dst_ref =
            unsafe { dst.as_ref() }.ok_or_else(|| KernelError::Shape("dst is null".into()))?;
        if params_block.is_null() {
            return Err(KernelError::Param(crate::params::MISSING.into()));
        }
        // SAFETY: a non-null params_block is a live AttnParams (contract); read unaligned to be safe.
        let params = unsafe { params_block.cast::<AttnParams>().read_unaligned() };
        let src = |i: usize, name: &str| -> Result<TensorView, KernelError> {
            // SAFETY: sources are null (reported) or live; from_raw copies struct fields only.
            unsafe { TensorView::from_raw(dst_ref.src[i]) }
                .map_err(|e| KernelError::Shape(format!("{name}: {e}")))
        };
        let call = Self {
            q: src(0, "q")?,
            k: src(1, "k")?,
            v: src(2, "v")?,
            mask: src(3, "mask")?,
            // SAFETY: dst is live; metadata only.
            dst: unsafe { TensorView::from_raw(dst) }
                .map_err(|e| KernelError::Shape(format!("dst: {e}")))?,
        };
        Ok((call, params))
    }
}

/// The checked arguments of one `spark_attn` call.
#[derive(Clone, Copy, Debug)]
pub struct AttnLayout {
    /// H, the head dim.
    pub head_dim: usize,
    /// N, query heads.
    pub n_head: usize,
    /// KV, key/value heads.
    pub n_head_kv: usize,
    /// T, query tokens per stream.
    pub n_tokens: usize,
    /// n_kv, cache positions.
    pub n_kv: usize,
    /// S, streams.
    pub(crate) n_stream: usize,
    /// Queries.
    pub(crate) q: Strided,
    /// Key cache view.
    pub(crate) k: Strided<CacheType>,
    /// Value cache view.
    pub(crate) v: Strided<CacheType>,
    /// KQ mask.
    pub(crate) mask: Strided,
    /// Output.
    pub(crate) dst: Strided,
    /// Layer index for statistics.
    pub(crate) layer: i32,
    /// k_a, positions kept per query (>= 1).
    pub k_keep: usize,
    /// r_a, predictor dims (0 < r < H).
    pub r: usize,
    /// c_attn (0 = off).
    pub(crate) softcap: f32,
}

fn shape_err(msg: String) -> KernelError {
    KernelError::Shape(msg)
}

impl AttnLayout {
    /// Checks the call's tensors against the contract above and `params` (k >= 1, 0 < r < H,
    /// softcap finite and >= 0). Errors name the offending argument.
    pub(crate) fn new(call: &AttnCall, params: &AttnParams) -> Result<Self, KernelError> {
        let AttnCall { q, k, v, mask, dst } = call;
        if q.ty != GGML_TYPE_F32 {
            return Err(KernelError::UnsupportedType {
                tensor: "q",
                ty: q.ty,
            });
        }
        if dst.ty != GGML_TYPE_F32 {
            return Err(KernelError::UnsupportedType {
                tensor: "dst",
                ty: dst.ty,
            });
        }
        let [h, n, t, s] = q.ne;
        let [kh, kv, n_kv, ks] = k.ne;
        if h == 0 || n == 0 || kv == 0 {
            return Err(shape_err(format!(
                "q {:?} / k {:?}: empty head dimension",
                q.ne, k.ne
            )));
        }
        if kh != h || ks != s {
            return Err(shape_err(format!(
                "k {:?} does not match q {:?} (want [H, KV, n_kv, S])",
                k.ne, q.ne
            )));
        }
        if n % kv != 0 {
            return Err(shape_err(format!(
                "q heads {n} not a multiple of k heads {kv}"
            )));
        }
        if v.ne != k.ne {
            return Err(shape_err(format!("v {:?} differs from k {:?}", v.ne, k.ne)));
        }
        if dst.ne != q.ne {
            return Err(shape_err(format!(
                "dst {:?} differs from q {:?}",
                dst.ne, q.ne
            )));
        }
        if dst.nb[0] != 4 {
            return Err(shape_err(format!(
                "dst elements are not adjacent (nb0 = {})",
                dst.nb[0]
            )));
        }
        let [m0, m1, m2, m3] = mask.ne;
        if m0 != n_kv || m1 < t || m2 == 0 || m3 == 0 || n % m2 != 0 || s % m3 != 0 {
            return Err(shape_err(format!(
                "mask {:?} does not fit [n_kv = {n_kv}, >= {t}, divides {n}, divides {s}]",
                mask.ne
            )));
        }
        let k_keep = usize::try_from(params.k)
            .ok()
            .filter(|&x| x >= 1)
            .ok_or_else(|| {
                KernelError::Param(format!("attention k = {} (must be >= 1)", params.k))
            })?;
        let r = usize::try_from(params.r)
            .ok()
            .filter(|&x| x >= 1 && x < h)
            .ok_or_else(|| {
                KernelError::Param(format!("attention r = {} (must be in 1..{h})", params.r))
            })?;
        if !(params.softcap.is_finite() && params.softcap >= 0.0) {
            return Err(KernelError::Param(format!(
                "attention softcap = {} (must be finite, >= 0)",
                params.softcap
            )));
        }
        Ok(Self {
            head_dim: h,
            n_head: n,
            n_head_kv: kv,
            n_tokens: t,
            n_kv,
            n_stream: s,
            q: Strided::new(q, "q")?,
            k: Strided::cache(k, "k", r)?,
            v: Strided::cache(v, "v", 0)?,
            mask: Strided::new(mask, "mask")?,
            dst: Strided::new(dst, "dst")?,
            layer: params.layer,
            k_keep,
            r,
            softcap: params.softcap,
        })
    }

    /// Query heads per KV head (N / KV).
    pub(crate) fn group_size(&self) -> usize {
        self.n_head / self.n_head_kv
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use llama_cpp_sys_2::GGML_TYPE_F16;

    fn view(ty: u32, ne: [usize; 4]) -> TensorView {
        let es = if ty == GGML_TYPE_F16 { 2 } else { 4 };
        let nb = [
            es,
            es * ne[0],
            es * ne[0] * ne[1],
            es * ne[0] * ne[1] * ne[2],
        ];
        TensorView {
            ty,
            ne,
            nb,
            data: std::ptr::NonNull::<u8>::dangling().as_ptr(),
        }
    }

    fn call(
        q: TensorView,
        k: TensorView,
        v: TensorView,
        mask: TensorView,
        dst: TensorView,
    ) -> AttnCall {
        AttnCall { q, k, v, mask, dst }
    }

    fn params() -> AttnParams {
        AttnParams {
            layer: 0,
            k: 4,
            r: 2,
            softcap: 0.0,
        }
    }

    #[test]
    fn accepts_the_contract_shapes() {
        let q = view(0, [8, 4, 3, 1]);
        let k = view(1, [8, 2, 10, 1]);
        let m = view(0, [10, 3, 1, 1]);
        let l = AttnLayout::new(&call(q, k, k, m, q), &params()).unwrap();
        assert_eq!(
            (
                l.head_dim,
                l.n_head,
                l.n_head_kv,
                l.n_tokens,
                l.n_kv,
                l.group_size()
            ),
            (8, 4, 2, 3, 10, 2)
        );
    }

    /// A q8_0 view of `ne` (blocks of 32 elements in 34 bytes, adjacent).
    fn q8_0_view(ne: [usize; 4]) -> TensorView {
        let row = ne[0] / 32 * 34;
        TensorView {
            ty: llama_cpp_sys_2::GGML_TYPE_Q8_0,
            ne,
            nb: [34, row, row * ne[1], row * ne[1] * ne[2]],
            data: std::ptr::NonNull::<u8>::dangling().as_ptr(),
        }
    }

    /// Quantized caches are read in whole blocks: H and k's r must be whole blocks.
    #[test]
    fn block_caches_need_whole_blocks() {
        let q = view(0, [64, 4, 3, 1]);
        let m = view(0, [10, 3, 1, 1]);
        let kq = q8_0_view([64, 2, 10, 1]);
        let p = |r| AttnParams {
            layer: 0,
            k: 4,
            r,
            softcap: 0.0,
        };
        let l = AttnLayout::new(&call(q, kq, kq, m, q), &p(32)).unwrap();
        assert_eq!(l.k.ty, CacheType::Blocks(crate::rows::RowType::Q8_0));
        let err = AttnLayout::new(&call(q, kq, kq, m, q), &p(16))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("k cache of type q8_0") && err.contains("split at 16"),
            "{err}"
        );
        let (q48, m48) = (view(0, [48, 4, 3, 1]), m);
        let k48 = q8_0_view([48, 2, 10, 1]);
        let err = AttnLayout::new(&call(q48, k48, k48, m48, q48), &p(32))
            .unwrap_err()
            .to_string();
        assert!(err.contains("rows of 48 elements"), "{err}");
    }

    #[test]
    fn rejects_bad_arguments_with_a_named_error() {
        let q = view(0, [8, 4, 3, 1]);
        let k = view(1, [8, 2, 10, 1]);
        let m = view(0, [10, 3, 1, 1]);
        let p = params();
        let bad_k = view(1, [8, 3, 10, 1]);
        assert!(AttnLayout::new(&call(q, bad_k, bad_k, m, q), &p)
            .unwrap_err()
            .to_string()
            .contains("multiple"));
        let q16 = view(1, [8, 4, 3, 1]);
        assert!(matches!(
            AttnLayout::new(&call(q16, k, k, m, q), &p),
            Err(KernelError::UnsupportedType { tensor: "q", .. })
        ));
        let kq = view(llama_cpp_sys_2::GGML_TYPE_Q8_1, [8, 2, 10, 1]);
        assert!(matches!(
            AttnLayout::new(&call(q, kq, k, m, q), &p),
            Err(KernelError::UnsupportedType { tensor: "k", .. })
        ));
        let short_mask = view(0, [10, 2, 1, 1]);
        assert!(AttnLayout::new(&call(q, k, k, short_mask, q), &p)
            .unwrap_err()
            .to_string()
            .contains("mask"));
        let v_other = view(1, [8, 2, 9, 1]);
        assert!(AttnLayout::new(&call(q, k, v_other, m, q), &p)
            .unwrap_err()
            .to_string()
            .contains("v "));
        for (kk, r, c) in [
            (0, 2, 0.0),
            (4, 0, 0.0),
            (4, 8, 0.0),
            (4, 2, -1.0),
            (4, 2, f32::NAN),
        ] {
            let p = AttnParams {
                layer: 0,
                k: kk,
                r,
                softcap: c,
            };
            assert!(matches!(
                AttnLayout::new(&call(q, k, k, m, q), &p),
                Err(KernelError::Param(_))
            ));
        }
    }
}
