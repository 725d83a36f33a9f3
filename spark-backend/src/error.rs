//! Errors reported by kernels and by the FFI layer.

/// Why a kernel could not run on the tensors it was given.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum KernelError {
    /// A tensor's type is not one the kernel supports.
    #[error("{tensor}: unsupported type {name} (ggml type {ty})", name = type_name(*ty))]
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

/// ggml's name of type id `ty` (`ggml_type_name`: "iq4_xs", "q8_K"), or "unknown" for an id
/// outside ggml's table.
fn type_name(ty: u32) -> String {
    use llama_cpp_sys_2 as sys;
    if ty >= sys::GGML_TYPE_COUNT {
        return "unknown".to_owned();
    }
    // SAFETY: `ty` is below GGML_TYPE_COUNT, so ggml indexes its static type-traits table and
    // returns that entry's static name (or null where an entry has none, handled below).
    let p = unsafe { sys::ggml_type_name(ty) };
    if p.is_null() {
        return "unknown".to_owned();
    }
    // SAFETY: a non-null name of ggml's static table: NUL-terminated and never freed.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::KernelError;

    #[test]
    fn unsupported_types_are_named() {
        let e = |ty| {
            KernelError::UnsupportedType {
                tensor: "ffn_up",
                ty,
            }
            .to_string()
        };
        assert_eq!(e(15), "ffn_up: unsupported type q8_K (ggml type 15)");
        assert_eq!(e(24), "ffn_up: unsupported type i8 (ggml type 24)");
        assert_eq!(e(1000), "ffn_up: unsupported type unknown (ggml type 1000)");
    }
}
