//! Errors reported by kernels and by the FFI layer.

/// Why a kernel could not run on the tensors it was given.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum KernelError {
    /// A tensor's type is not one the kernel supports.
    #[error("{tensor}: unsupported type {ty}")]
    UnsupportedType {
        /// Which argument (e.g. "ffn_up").
        tensor: &'static str,
        /// ggml type id.
        ty: u32,
    },
    /// Shapes of the op's arguments disagree.
    #[error("shape mismatch: {0}")]
    Shape(String),
    /// A parameter (k, r, ...) is out of range.
    #[error("invalid parameter: {0}")]
    Param(String),
}
