//! The C-layout parameter blocks the graph passes to each custom op as `userdata`
//! (see `docs/INTERFACES.md`). The patch series declares the same structs in C.

/// Parameters of `spark_ffn`: `struct spark_ffn_params { int32_t layer; int32_t k; }`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FfnParams {
    /// Layer index (for statistics).
    pub layer: i32,
    /// k_f: neurons kept per token (k >= F keeps all, unshifted).
    pub k: i32,
}

/// Parameters of `spark_attn`:
/// `struct spark_attn_params { int32_t layer; int32_t k; int32_t r; float softcap; }`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnParams {
    /// Layer index (for statistics).
    pub layer: i32,
    /// k_a: positions kept per query.
    pub k: i32,
    /// r_a: predictor dims per head.
    pub r: i32,
    /// c_attn: attention logit soft-cap (0 = off).
    pub softcap: f32,
}

/// The layer index of a Spark op's parameter struct: both structs start with `int32_t layer`
/// (checked below), so every op reads it the same way for its messages. `None` for null.
///
/// # Safety
/// `userdata` is null or points to a [`FfnParams`] or an [`AttnParams`].
pub(crate) unsafe fn layer_of(userdata: *const std::ffi::c_void) -> Option<i32> {
    // SAFETY: per the contract, a non-null pointer starts with an i32; read unaligned.
    (!userdata.is_null()).then(|| unsafe { userdata.cast::<i32>().read_unaligned() })
}

/// The FFN op's parameters and its k_f (>= 1) from `userdata`: one check for the CPU ops and
/// the CUDA launchers.
///
/// # Safety
/// `userdata` is null or points to a [`FfnParams`].
pub(crate) unsafe fn read_ffn(
    userdata: *const std::ffi::c_void,
) -> Result<(FfnParams, usize), crate::KernelError> {
    use crate::KernelError;
    if userdata.is_null() {
        return Err(KernelError::Param("spark_ffn_params is null".into()));
    }
    // SAFETY: userdata points to a live spark_ffn_params (contract); read unaligned to be safe.
    let params = unsafe { userdata.cast::<FfnParams>().read_unaligned() };
    let k = usize::try_from(params.k)
        .ok()
        .filter(|&k| k >= 1)
        .ok_or_else(|| KernelError::Param(format!("k = {} (must be >= 1)", params.k)))?;
    Ok((params, k))
}

const _: () = {
    assert!(std::mem::offset_of!(FfnParams, layer) == 0);
    assert!(std::mem::offset_of!(AttnParams, layer) == 0);
};
