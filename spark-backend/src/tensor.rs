//! A checked, read-only view of a `ggml_tensor` handed to a custom op.

use crate::KernelError;
use llama_cpp_sys_2 as sys;

/// Shape, strides, type and data pointer of a ggml tensor, copied out of the C struct.
#[derive(Debug, Clone, Copy)]
pub struct TensorView {
    /// ggml type id (`GGML_TYPE_*`).
    pub ty: u32,
    /// Elements per dimension, ne[0] fastest.
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
    pub unsafe fn from_raw(t: *const sys::ggml_tensor) -> Result<Self, KernelError> {
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

    /// Number of rows (ne[1] * ne[2] * ne[3]).
    pub fn n_rows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }

    /// True when rows are stored contiguously along ne[0] for an element of `elem_bytes`.
    pub fn is_row_contiguous(&self, elem_bytes: usize) -> bool {
        self.nb[0] == elem_bytes
    }
}
