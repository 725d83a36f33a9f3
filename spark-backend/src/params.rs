//! The parameters of the Spark custom ops, carried by their graph nodes (docs/INTERFACES.md,
//! "Parameters in the node").
//!
//! A ggml custom op gets a function pointer and a `userdata` pointer of the process that built
//! the graph, which mean nothing in another process (an `rpc-server` running the node). So the
//! graph stores each Spark node's parameters in the node itself, in the part of its `op_params`
//! that ggml's `struct ggml_custom_op_params` leaves free, through the registry proc
//! `spark_op_set_params` ([`spark_op_set_params`]); `userdata` is not used. The node's
//! `op_params` (`GGML_MAX_OP_PARAMS` = 64 bytes) are laid out as:
//!
//! | bytes | what | who |
//! |---|---|---|
//! | 0..24 | `struct ggml_custom_op_params { fun, n_tasks, userdata }` | ggml |
//! | 24..32 | the call's shared state `{next chunk, threads done}` (two `u32`, zero at rest) | [`crate::op`] |
//! | 32..36 | [`MAGIC`]: the block below is present | [`spark_op_set_params`] |
//! | 36..52 | `struct spark_op_params { layer, k, r, softcap }` ([`OpParams`]) | [`spark_op_set_params`] |
//!
//! The sizes that this rests on (ggml's struct and `GGML_MAX_OP_PARAMS`) are checked against
//! ggml's headers by `probe/graph_abi.c` (`tests/registry.rs`). The FFN ops read the block as
//! [`FfnParams`] (its first two fields), `spark_attn` as [`AttnParams`] (all four).

use llama_cpp_sys_2 as sys;
use std::ffi::{c_int, c_void};

/// The FFN ops' view of the block: its first two fields (`layer`, `k`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FfnParams {
    /// Layer index (for statistics).
    pub layer: i32,
    /// k_f: neurons kept per token (k >= F keeps all, unshifted).
    pub k: i32,
}

/// `spark_attn`'s view of the block: all of [`OpParams`].
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
/// `userdata` is null or points to a [`FfnParams`] or an [`AttnParams`].
pub(crate) unsafe fn layer_of(userdata: *const c_void) -> Option<i32> {
    // SAFETY: per the contract, a non-null pointer starts with an i32; read unaligned.
    (!userdata.is_null()).then(|| unsafe { userdata.cast::<i32>().read_unaligned() })
}

/// The FFN op's parameters and its k_f (>= 1) from `userdata` (the block of [`block`]): one
/// check for the CPU ops and the CUDA launchers.
///
/// # Safety
/// `userdata` is null or points to a [`FfnParams`].
pub(crate) unsafe fn read_ffn(
    userdata: *const c_void,
) -> Result<(FfnParams, usize), crate::KernelError> {
    use crate::KernelError;
    if userdata.is_null() {
        return Err(KernelError::Param(MISSING.into()));
    }
    // SAFETY: userdata points to a live spark_ffn_params (contract); read unaligned to be safe.
    let params = unsafe { userdata.cast::<FfnParams>().read_unaligned() };
    let k = usize::try_from(params.k)
        .ok()
        .filter(|&k| k >= 1)
        .ok_or_else(|| KernelError::Param(format!("k = {} (must be >= 1)", params.k)))?;
    Ok((params, k))
}

/// Why an op has no parameters: its node carries no block.
pub const MISSING: &str =
    "the node carries no Spark parameters (spark_op_set_params was not called on it)";

/// `struct spark_op_params` of the graph's C header
/// (`patches/llama.cpp/files/src/models/spark-gemma2-backend.h`): what the graph stores in each
/// Spark node (layout pinned by `probe/graph_abi.c`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct OpParams {
    /// Layer index (for statistics and messages).
    pub layer: i32,
    /// k_f (the FFN ops) or k_a (`spark_attn`).
    pub k: i32,
    /// r_a (`spark_attn`); 0 for the FFN ops.
    pub r: i32,
    /// `spark_attn`'s logit soft-cap (0 = off); 0 for the FFN ops.
    pub softcap: f32,
}

/// `sizeof(struct ggml_custom_op_params)` (ggml-impl.h: a function pointer, an int and a
/// pointer), the part of `op_params` that ggml reads; checked by `tests/registry.rs`.
pub const GGML_CUSTOM_OP_PARAMS_SIZE: usize = 24;
/// Byte offset in `op_params` of the call's shared state (`crate::op`): two `u32`.
pub const CALL_STATE_OFFSET: usize = GGML_CUSTOM_OP_PARAMS_SIZE;
/// Byte offset in `op_params` of [`MAGIC`], followed by the [`OpParams`].
pub const BLOCK_OFFSET: usize = CALL_STATE_OFFSET + 8;
/// Marks a stored block: "SPK1" read as a little-endian `u32`.
pub const MAGIC: u32 = u32::from_le_bytes(*b"SPK1");

const OP_PARAMS_BYTES: usize = std::mem::size_of::<[i32; 16]>();

const _: () = {
    assert!(std::mem::offset_of!(FfnParams, layer) == 0);
    assert!(std::mem::offset_of!(AttnParams, layer) == 0);
    // The views are prefixes of the stored block.
    assert!(std::mem::offset_of!(FfnParams, k) == std::mem::offset_of!(OpParams, k));
    assert!(std::mem::offset_of!(AttnParams, k) == std::mem::offset_of!(OpParams, k));
    assert!(std::mem::offset_of!(AttnParams, r) == std::mem::offset_of!(OpParams, r));
    assert!(std::mem::offset_of!(AttnParams, softcap) == std::mem::offset_of!(OpParams, softcap));
    assert!(std::mem::size_of::<AttnParams>() == std::mem::size_of::<OpParams>());
    // The block fits `op_params` and leaves ggml's part alone; u32 fields stay aligned.
    assert!(BLOCK_OFFSET + 4 + std::mem::size_of::<OpParams>() <= OP_PARAMS_BYTES);
    assert!(CALL_STATE_OFFSET.is_multiple_of(4) && BLOCK_OFFSET.is_multiple_of(4));
};

/// Where `dst`'s stored parameters are, as the `userdata` the ops and their checks read
/// ([`FfnParams`] / [`AttnParams`] views); null when `dst` is null or carries no block.
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
