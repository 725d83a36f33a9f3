//! A checked view of a `ggml_tensor` handed to a custom op, and the NaN fill of an op whose
//! arguments fail their checks.

use crate::KernelError;
use llama_cpp_sys_2 as sys;

/// ggml type id of f32 (`GGML_TYPE_F32`), the type of every custom op's output.
pub(crate) const GGML_TYPE_F32: u32 = sys::GGML_TYPE_F32;

/// Shape, strides, type and data pointer of a ggml tensor, copied out of the C struct.
#[derive(Debug, Clone, Copy)]
pub struct TensorView {
    /// ggml type id (`GGML_TYPE_*`).
    pub ty: u32,
    /// Elements per dimension, `ne[0]` fastest.
    pub ne: [usize; 4],
    /// Byte strides per dimension.
    pub nb: [usize; 4],
    /// First byte of the data.
    pub data: *mut u8,
}

impl TensorView {
    /// Copies the fields of `t`.
    ///
    /// # Safety
    /// `t` must point to a live, initialised `ggml_tensor` whose `data` covers its `ne`/`nb`.
    pub(crate) unsafe fn from_raw(t: *const sys::ggml_tensor) -> Result<Self, KernelError> {
        if t.is_null() {
            return Err(KernelError::Shape("missing tensor argument".into()));
        }
        // SAFETY: the caller guarantees `t` points to a live ggml_tensor.
        let t = unsafe { &*t };
        let mut ne = [0usize; 4];
        for (d, n) in ne.iter_mut().zip(t.ne) {
            *d = usize::try_from(n).map_err(|_| KernelError::Shape(format!("negative ne {n}")))?;
        }
        if t.data.is_null() {
            return Err(KernelError::Shape("tensor has no data".into()));
        }
        Ok(Self {
            ty: t.type_,
            ne,
            nb: t.nb,
            data: t.data.cast(),
        })
    }

    /// Number of rows (`ne[1] * ne[2] * ne[3]`).
    pub(crate) fn n_rows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }
}

/// Fills block `ith` of `nth` contiguous blocks of dst's rows with NaN, if dst is a non-null f32
/// tensor. The blocks of `0..nth` are disjoint and cover dst; `(0, 1)` is the whole tensor. Used
/// when an op's arguments fail their checks (`crate::cpu_op`), where no op-specific share exists.
///
/// # Safety
/// `dst` must be null or a live tensor whose data (if non-null) covers its shape and strides,
/// and no other thread may access block `ith` meanwhile.
pub(crate) unsafe fn fill_nan_rows(dst: *mut sys::ggml_tensor, ith: usize, nth: usize) {
    // SAFETY: per the contract.
    let Ok(view) = (unsafe { TensorView::from_raw(dst) }) else {
        return;
    };
    if view.ty != GGML_TYPE_F32 {
        return;
    }
    let rows = view.n_rows();
    let per = rows.div_ceil(nth);
    let (r0, r1) = ((ith * per).min(rows), ((ith + 1) * per).min(rows));
    for r in r0..r1 {
        let (i1, i2, i3) = (
            r % view.ne[1],
            (r / view.ne[1]) % view.ne[2],
            r / (view.ne[1] * view.ne[2]),
        );
        let row = view
            .data
            .wrapping_add(i1 * view.nb[1] + i2 * view.nb[2] + i3 * view.nb[3]);
        for i in 0..view.ne[0] {
            // SAFETY: element (i, i1, i2, i3) lies inside dst's data; rows are split by thread.
            unsafe {
                row.wrapping_add(i * view.nb[0])
                    .cast::<f32>()
                    .write_unaligned(f32::NAN)
            };
        }
    }
}

/// The views of `dst` and its first `N` sources, from metadata only (no tensor data is read):
/// the CPU ops' `prepare` and the CUDA launchers' checks (`crate::cuda::check`) start here.
///
/// # Safety
/// `dst` is null or a live ggml tensor whose sources are null or live.
pub(crate) unsafe fn views<const N: usize>(
    dst: *const sys::ggml_tensor,
) -> Result<(TensorView, [TensorView; N]), KernelError> {
    if dst.is_null() {
        return Err(KernelError::Shape("dst is null".into()));
    }
    // SAFETY: per the contract; from_raw copies struct fields only.
    let out = unsafe { TensorView::from_raw(dst)? };
    // SAFETY: dst is live; its src pointers are null or live tensors.
    let srcs = unsafe { (*dst).src };
    let mut views = [out; N];
    for (i, v) in views.iter_mut().enumerate() {
        // SAFETY: as above; from_raw rejects null pointers and reads no data.
        *v = unsafe { TensorView::from_raw(srcs[i]) }
            .map_err(|e| KernelError::Shape(format!("args[{i}]: {e}")))?;
    }
    Ok((out, views))
}

/// `v` is 2-D with shape `[ne0, ne1]`.
pub(crate) fn expect_2d(
    v: &TensorView,
    name: &str,
    ne0: usize,
    ne1: usize,
) -> Result<(), KernelError> {
    if v.ne != [ne0, ne1, 1, 1] {
        return Err(KernelError::Shape(format!(
            "{name}: ne {:?}, expected [{ne0}, {ne1}, 1, 1]",
            v.ne
        )));
    }
    Ok(())
}

/// `v` holds f32 rows: contiguous values, a row stride that is a multiple of 4 and covers the row.
pub(crate) fn expect_f32_rows(v: &TensorView, name: &'static str) -> Result<(), KernelError> {
    if v.ty != GGML_TYPE_F32 {
        return Err(KernelError::UnsupportedType {
            tensor: name,
            ty: v.ty,
        });
    }
    if v.nb[0] != 4 || !v.nb[1].is_multiple_of(4) || v.nb[1] < 4 * v.ne[0] {
        return Err(KernelError::Shape(format!(
            "{name}: f32 rows not contiguous (nb {:?})",
            v.nb
        )));
    }
    Ok(())
}
