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
