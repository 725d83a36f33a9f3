//! Which path the attention of one ubatch takes: the `spark_attn` op, or none (the graph's
//! dense attention of stock ggml ops) from [`crate::dense_switch`]'s switch point on. The
//! spark-gemma2 graph asks through the C function [`spark_attn_path`] (a proc of the "Spark"
//! registry entry, docs/INTERFACES.md) for each layer and builds the nodes of the answer.

use crate::dense_switch::{self, Part, WeightBackend};
use std::ffi::{c_char, c_int, CStr};

/// `enum spark_attn_path` of the graph's C header: the `spark_attn` op.
pub const ATTN_PATH_SPARSE: i32 = 1;
/// `enum spark_attn_path`: the graph's dense attention.
pub const ATTN_PATH_DENSE: i32 = 2;

/// The path of a ubatch of `n_tokens` tokens through an attention layer whose weights are on
/// `backend`: [`ATTN_PATH_DENSE`] or [`ATTN_PATH_SPARSE`].
pub fn path_on(backend: WeightBackend, n_tokens: usize) -> i32 {
    if dense_switch::takes_dense(Part::Attention, backend, n_tokens) {
        ATTN_PATH_DENSE
    } else {
        ATTN_PATH_SPARSE
    }
}

/// C ABI `int spark_attn_path(const char * backend, int64_t n_tokens, int32_t * out)`: the
/// path ([`path_on`]) of a ubatch of `n_tokens` tokens through an attention layer whose weights
/// are on the device of ggml backend registry `backend` (NULL: not known). Writes `*out` and
/// returns 0; returns -1 and leaves `*out` alone when `out` is null or `n_tokens` is below 1.
///
/// # Safety
/// `backend` must be null or a NUL-terminated string; `out` null or valid for writing an
/// `int32_t`.
pub unsafe extern "C" fn spark_attn_path(
    backend: *const c_char,
    n_tokens: i64,
    out: *mut i32,
) -> c_int {
    crate::ffi::guard("spark_attn_path", -1, || {
        let Some(t) = usize::try_from(n_tokens).ok().filter(|&t| t >= 1) else {
            return -1;
        };
        if out.is_null() {
            return -1;
        }
        // SAFETY: null or NUL-terminated (contract).
        let name = (!backend.is_null()).then(|| unsafe { CStr::from_ptr(backend) });
        let path = path_on(WeightBackend::from_registry_name(name), t);
        // SAFETY: non-null and writable per the contract; unaligned write for safety.
        unsafe { out.write_unaligned(path) };
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(name: Option<&CStr>, n_tokens: i64) -> Option<i32> {
        let mut out = -7;
        let p = name.map_or(std::ptr::null(), CStr::as_ptr);
        // SAFETY: a C string or null; `out` is writable.
        match unsafe { spark_attn_path(p, n_tokens, &mut out) } {
            0 => Some(out),
            rc => {
                assert_eq!((rc, out), (-1, -7), "written on failure");
                None
            }
        }
    }

    #[test]
    fn cuda_switches_to_the_dense_graph_from_32_tokens_the_rest_never() {
        let cuda = cfg!(feature = "cuda");
        for t in [1, 8, 31, 32, 512, 4096] {
            let want = if cuda && t >= 32 {
                ATTN_PATH_DENSE
            } else {
                ATTN_PATH_SPARSE
            };
            assert_eq!(ask(Some(c"CUDA"), t), Some(want), "CUDA, {t} tokens");
            for other in [Some(c"CPU"), Some(c"RPC"), Some(c"Vulkan"), None] {
                assert_eq!(
                    ask(other, t),
                    Some(ATTN_PATH_SPARSE),
                    "{other:?}, {t} tokens"
                );
            }
        }
    }

    #[test]
    fn bad_sizes_and_a_null_out_are_refused() {
        assert_eq!(ask(Some(c"CPU"), 0), None);
        assert_eq!(ask(Some(c"CPU"), -3), None);
        // SAFETY: a null `out` is part of the contract.
        assert_eq!(
            unsafe { spark_attn_path(c"CPU".as_ptr(), 1, std::ptr::null_mut()) },
            -1
        );
    }
}
