//! The parameters of the Spark custom ops, carried by their graph nodes (docs/INTERFACES.md,
//! "Parameters in the node").
//!
//! A ggml custom op gets a function pointer and a `userdata` pointer of the process that built
//! the graph, which mean nothing in another process (an `rpc-server` running the node). So the
//! graph stores each Spark node's parameters in the node itself, in the part of its `op_params`
//! that ggml's `struct ggml_custom_op_params` leaves free, through the registry proc
//! `spark_op_set_params` ([`spark_op_set_params`]); ggml's `userdata` is not used. The node's
//! `op_params` (`GGML_MAX_OP_PARAMS` = 64 bytes) are laid out as:
//!
//! | bytes | what | who |
//! |---|---|---|
//! | 0..24 | `struct ggml_custom_op_params { fun, n_tasks, userdata }` | ggml |
//! | 24..32 | the call's shared state `{next chunk, threads done}` (two `u32`, zero at rest) | [`crate::cpu_op`] |
//! | 32..36 | [`MAGIC`]: the block below is present | [`spark_op_set_params`] |
//! | 36..60 | `struct spark_op_params { layer, k, r, softcap, ffn_cutoff, ffn_z }` ([`OpParams`]) | [`spark_op_set_params`] |
//! | 60..64 | unused | |
//!
//! In this crate `params_block` always names a pointer to bytes 36..60 of a node ([`block`]),
//! never ggml's `userdata`.
//!
//! The sizes that this rests on (ggml's struct and `GGML_MAX_OP_PARAMS`) are checked against
//! ggml's headers by `probe/graph_abi.c` (`tests/registry.rs`). The FFN ops read the whole
//! block through [`read_ffn`] (the layer and a [`Cutoff`]: `k`, `ffn_cutoff`, `ffn_z`),
//! `spark_attn` its first four fields as [`AttnParams`], `spark_rope` all of it as
//! [`RopeParams`] (the C header's `struct spark_rope_params`, which the graph copies into the
//! block).

use crate::topk::Cutoff;
use llama_cpp_sys_2 as sys;
use std::ffi::{c_int, c_void};

/// `SPARK_FFN_CUTOFF_TOP_K` of the C header's `enum spark_ffn_cutoff` ([`OpParams::ffn_cutoff`]):
/// z = Q(1 - k/F) from `k` ([`Cutoff::TopK`]).
pub const FFN_CUTOFF_TOP_K: i32 = 0;
/// `SPARK_FFN_CUTOFF_STD_MUL` of `enum spark_ffn_cutoff`: z = `ffn_z` as given
/// ([`Cutoff::StdMul`]; `k` unused).
pub const FFN_CUTOFF_STD_MUL: i32 = 1;

/// `spark_attn`'s view of the block: the first four fields of [`OpParams`].
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

/// The layer index of a Spark op's parameters: both views start with `int32_t layer` (checked
/// below), so every op reads it the same way for its messages. `None` for null.
///
/// # Safety
/// `params_block` is null or points to an [`OpParams`] or an [`AttnParams`].
pub(crate) unsafe fn layer_of(params_block: *const c_void) -> Option<i32> {
    // SAFETY: per the contract, a non-null pointer starts with an i32; read unaligned.
    (!params_block.is_null()).then(|| unsafe { params_block.cast::<i32>().read_unaligned() })
}

/// `spark_rope`'s view of the block: `struct spark_rope_params` of the C header, the same 24
/// bytes as [`OpParams`] (the graph copies it into one; layout pinned by `probe/graph_abi.c`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RopeParams {
    /// Layer index (for messages).
    pub layer: i32,
    /// The first part's width r (even, 0 < r < H; the second part is the other H - r channels,
    /// H even).
    pub r: i32,
    /// The frequency base (> 0): theta_i = pos * freq_scale * freq_base^(-2i/width).
    pub freq_base: f32,
    /// llama.cpp's rope frequency scale (1 without linear scaling).
    pub freq_scale: f32,
    /// Multiplies every output channel (attn_factor, and Q's attention scale for Q).
    pub scale: f32,
    /// 0.
    pub reserved: i32,
}

impl RopeParams {
    /// The block as the graph stores it: these 24 bytes in a [`OpParams`] (the C graph copies
    /// a `struct spark_rope_params` into a `struct spark_op_params` the same way).
    pub fn as_block(&self) -> OpParams {
        // SAFETY: both are #[repr(C)] structs of six 4-byte i32/f32 fields (sizes asserted
        // below), and every bit pattern is a valid i32 or f32.
        unsafe { std::mem::transmute::<RopeParams, OpParams>(*self) }
    }
}

/// An FFN op's layer and threshold cutoff from `params_block` (the whole block of [`block`]): one
/// check for the CPU ops and the CUDA launchers. Errors ([`crate::KernelError::Param`], naming
/// the field): no block, an `ffn_cutoff` other than [`FFN_CUTOFF_TOP_K`] and
/// [`FFN_CUTOFF_STD_MUL`], `k < 1` with `TOP_K`, a non-finite `ffn_z` with `STD_MUL`.
///
/// # Safety
/// `params_block` is null or points to an [`OpParams`].
pub(crate) unsafe fn read_ffn(
    params_block: *const c_void,
) -> Result<(i32, Cutoff), crate::KernelError> {
    use crate::KernelError;
    if params_block.is_null() {
        return Err(KernelError::Param(MISSING.into()));
    }
    // SAFETY: params_block points to a live spark_op_params (contract); read unaligned to be safe.
    let params = unsafe { params_block.cast::<OpParams>().read_unaligned() };
    let cutoff = match params.ffn_cutoff {
        FFN_CUTOFF_TOP_K => {
            let k = usize::try_from(params.k)
                .ok()
                .filter(|&k| k >= 1)
                .ok_or_else(|| KernelError::Param(format!("k = {} (must be >= 1)", params.k)))?;
            Cutoff::TopK(k)
        }
        FFN_CUTOFF_STD_MUL => {
            if !params.ffn_z.is_finite() {
                return Err(KernelError::Param(format!(
                    "ffn_z = {} (must be finite with SPARK_FFN_CUTOFF_STD_MUL)",
                    params.ffn_z
                )));
            }
            Cutoff::StdMul(f64::from(params.ffn_z))
        }
        other => {
            return Err(KernelError::Param(format!(
                "ffn_cutoff = {other} (must be {FFN_CUTOFF_TOP_K} = SPARK_FFN_CUTOFF_TOP_K or \
                 {FFN_CUTOFF_STD_MUL} = SPARK_FFN_CUTOFF_STD_MUL)"
            )))
        }
    };
    Ok((params.layer, cutoff))
}

/// Why an op has no parameters: its node carries no block.
pub const MISSING: &str =
    "the node carries no Spark parameters (spark_op_set_params was not called on it)";

/// `struct spark_op_params` of the graph's C header
/// (`patches/llama.cpp/files/src/models/spark-backend.h`): what the graph stores in each
/// Spark node (layout pinned by `probe/graph_abi.c`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct OpParams {
    /// Layer index (for statistics and messages).
    pub layer: i32,
    /// k_f (the FFN ops with [`FFN_CUTOFF_TOP_K`]) or k_a (`spark_attn`).
    pub k: i32,
    /// r_a (`spark_attn`); 0 for the FFN ops.
    pub r: i32,
    /// `spark_attn`'s logit soft-cap (0 = off); 0 for the FFN ops.
    pub softcap: f32,
    /// `enum spark_ffn_cutoff` (the FFN ops: [`FFN_CUTOFF_TOP_K`] or [`FFN_CUTOFF_STD_MUL`]);
    /// 0 for `spark_attn`.
    pub ffn_cutoff: i32,
    /// The std multiplier z of [`FFN_CUTOFF_STD_MUL`] (finite); 0 otherwise.
    pub ffn_z: f32,
}

/// `sizeof(struct ggml_custom_op_params)` (ggml-impl.h: a function pointer, an int and a
/// pointer), the part of `op_params` that ggml reads; checked by `tests/registry.rs`.
pub const GGML_CUSTOM_OP_PARAMS_SIZE: usize = 24;
/// Byte offset in `op_params` of the call's shared state (`crate::cpu_op`): two `u32`.
pub const CALL_STATE_OFFSET: usize = GGML_CUSTOM_OP_PARAMS_SIZE;
/// Byte offset in `op_params` of [`MAGIC`], followed by the [`OpParams`].
pub const BLOCK_OFFSET: usize = CALL_STATE_OFFSET + 8;
/// Marks a stored block: "SPK1" read as a little-endian `u32`.
pub const MAGIC: u32 = u32::from_le_bytes(*b"SPK1");

const OP_PARAMS_BYTES: usize = std::mem::size_of::<[i32; 16]>();

const _: () = {
    assert!(std::mem::offset_of!(OpParams, layer) == 0);
    assert!(std::mem::offset_of!(AttnParams, layer) == 0);
    // spark_attn's view is a prefix of the stored block.
    assert!(std::mem::offset_of!(AttnParams, k) == std::mem::offset_of!(OpParams, k));
    assert!(std::mem::offset_of!(AttnParams, r) == std::mem::offset_of!(OpParams, r));
    assert!(std::mem::offset_of!(AttnParams, softcap) == std::mem::offset_of!(OpParams, softcap));
    assert!(std::mem::size_of::<AttnParams>() <= std::mem::size_of::<OpParams>());
    // spark_rope's view covers the block exactly.
    assert!(std::mem::offset_of!(RopeParams, layer) == 0);
    assert!(std::mem::size_of::<RopeParams>() == std::mem::size_of::<OpParams>());
    // The layout of the module doc's table (six 4-byte fields; pinned against the C header by
    // probe/graph_abi.c).
    assert!(std::mem::offset_of!(OpParams, ffn_cutoff) == 16);
    assert!(std::mem::offset_of!(OpParams, ffn_z) == 20);
    assert!(std::mem::size_of::<OpParams>() == 24);
    // The block fits `op_params` and leaves ggml's part alone; u32 fields stay aligned.
    assert!(BLOCK_OFFSET + 4 + std::mem::size_of::<OpParams>() <= OP_PARAMS_BYTES);
    assert!(CALL_STATE_OFFSET.is_multiple_of(4) && BLOCK_OFFSET.is_multiple_of(4));
};

/// Where `dst`'s stored parameters are, as the `params_block` the ops and their checks read
/// ([`OpParams`] / [`AttnParams`]); null when `dst` is null or carries no block.
///
/// # Safety
/// `dst` is null or a live ggml tensor.
pub(crate) unsafe fn block(dst: *const sys::ggml_tensor) -> *const c_void {
    if dst.is_null() {
        return std::ptr::null();
    }
    // SAFETY: dst is live (contract); op_params is an inline i32 array of the tensor, and
    // BLOCK_OFFSET + 4 + size_of::<OpParams>() fits it (const assertion above).
    unsafe {
        let base = std::ptr::addr_of!((*dst).op_params).cast::<u8>();
        let magic = base.add(BLOCK_OFFSET).cast::<u32>().read_unaligned();
        if magic == MAGIC {
            base.add(BLOCK_OFFSET + 4).cast()
        } else {
            std::ptr::null()
        }
    }
}

/// Stores `p` in `node`'s `op_params` ([`MAGIC`] and the block) and zeroes the call state.
///
/// # Safety
/// `node` is a live ggml tensor that no thread is computing.
pub unsafe fn store(node: *mut sys::ggml_tensor, p: &OpParams) {
    // SAFETY: node is live and not being computed (contract); the writes stay inside its inline
    // op_params array past ggml's struct (const assertions above).
    unsafe {
        let base = std::ptr::addr_of_mut!((*node).op_params).cast::<u8>();
        std::ptr::write_bytes(base.add(CALL_STATE_OFFSET), 0, 8);
        base.add(BLOCK_OFFSET).cast::<u32>().write_unaligned(MAGIC);
        base.add(BLOCK_OFFSET + 4)
            .cast::<OpParams>()
            .write_unaligned(*p);
    }
}

/// Removes a stored block from `node` (it then carries no Spark parameters: its op reports
/// [`MISSING`]) and zeroes the call state.
///
/// # Safety
/// `node` is a live ggml tensor that no thread is computing.
pub unsafe fn clear(node: *mut sys::ggml_tensor) {
    // SAFETY: as for `store`.
    unsafe {
        let base = std::ptr::addr_of_mut!((*node).op_params).cast::<u8>();
        std::ptr::write_bytes(
            base.add(CALL_STATE_OFFSET),
            0,
            8 + 4 + std::mem::size_of::<OpParams>(),
        );
    }
}

/// C ABI `int spark_op_set_params(struct ggml_tensor * node, const struct spark_op_params * p)`
/// (a proc of the "Spark" entry): stores `*p` in the Spark custom-op node `node`, made by
/// `ggml_custom_4d` with one of the entry's ops, before the graph is computed. Returns 0, or -1
/// (and changes nothing) when `node` or `p` is null or `node` is not a `GGML_OP_CUSTOM` node.
///
/// # Safety
/// `node` is null or a live ggml tensor not being computed; `p` is null or valid for reading
/// one `struct spark_op_params`.
pub unsafe extern "C" fn spark_op_set_params(
    node: *mut sys::ggml_tensor,
    p: *const OpParams,
) -> c_int {
    crate::ffi::guard("spark_op_set_params", -1, || {
        // SAFETY: node is null or live (contract).
        if node.is_null() || p.is_null() || unsafe { (*node).op } != sys::GGML_OP_CUSTOM {
            return -1;
        }
        // SAFETY: p is valid for one read (contract); node is live and not being computed.
        unsafe { store(node, &p.read_unaligned()) };
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KernelError;

    fn read(p: &OpParams) -> Result<(i32, Cutoff), KernelError> {
        // SAFETY: a live OpParams.
        unsafe { read_ffn((p as *const OpParams).cast()) }
    }

    fn param_error(p: &OpParams) -> String {
        match read(p) {
            Err(KernelError::Param(m)) => m,
            other => panic!("{p:?}: {other:?}"),
        }
    }

    #[test]
    fn read_ffn_gives_the_cutoff_of_the_block() {
        let top = OpParams {
            layer: 4,
            k: 41,
            ..OpParams::default()
        };
        assert_eq!(read(&top).unwrap(), (4, Cutoff::TopK(41)));
        let z = 1.644_853_4_f32;
        let std_mul = OpParams {
            layer: 2,
            k: 0, // unused
            ffn_cutoff: FFN_CUTOFF_STD_MUL,
            ffn_z: z,
            ..OpParams::default()
        };
        assert_eq!(read(&std_mul).unwrap(), (2, Cutoff::StdMul(f64::from(z))));
        assert_eq!(f64::from(z), 1.644_853_353_500_366_2);
        // SAFETY: null is allowed.
        let missing = unsafe { read_ffn(std::ptr::null()) };
        assert_eq!(missing, Err(KernelError::Param(MISSING.into())));
    }

    #[test]
    fn read_ffn_names_the_bad_field() {
        let base = OpParams {
            layer: 1,
            k: 10,
            ..OpParams::default()
        };
        assert_eq!(
            param_error(&OpParams { k: 0, ..base }),
            "k = 0 (must be >= 1)"
        );
        assert_eq!(
            param_error(&OpParams { k: -3, ..base }),
            "k = -3 (must be >= 1)"
        );
        for cutoff in [2, -1, 7] {
            assert_eq!(
                param_error(&OpParams {
                    ffn_cutoff: cutoff,
                    ..base
                }),
                format!(
                    "ffn_cutoff = {cutoff} (must be 0 = SPARK_FFN_CUTOFF_TOP_K or \
                     1 = SPARK_FFN_CUTOFF_STD_MUL)"
                )
            );
        }
        for (z, shown) in [
            (f32::NAN, "NaN"),
            (f32::INFINITY, "inf"),
            (f32::NEG_INFINITY, "-inf"),
        ] {
            assert_eq!(
                param_error(&OpParams {
                    ffn_cutoff: FFN_CUTOFF_STD_MUL,
                    ffn_z: z,
                    ..base
                }),
                format!("ffn_z = {shown} (must be finite with SPARK_FFN_CUTOFF_STD_MUL)")
            );
        }
        // ffn_z is not read with TOP_K, nor k with STD_MUL
        let nan_z = OpParams {
            ffn_z: f32::NAN,
            ..base
        };
        assert_eq!(read(&nan_z).unwrap(), (1, Cutoff::TopK(10)));
    }
}
