//! `spark_rope`, the ggml custom op (module docs of [`super`]). The graph creates it with
//! `ggml_custom_4d(ctx, GGML_TYPE_F32, H, n_head, n_tokens, 1, {x, pos}, 2, spark_rope,
//! GGML_N_TASKS_MAX, NULL)` and stores a `struct spark_rope_params` in the node. Its chunks are
//! contiguous blocks of rows (one head of one token each), a function of the shapes and `nth`;
//! every row is computed the same way whoever computes it.

use super::{rope_angles, rope_head, RopeCall};
use crate::cpu_op::{Claims, SparkOp};
use crate::KernelError;
use llama_cpp_sys_2 as sys;
use std::ffi::c_void;
use std::ops::Range;

crate::cpu_op::custom_op! {
    /// The `ggml_custom_op_t` of Spark's rotary embedding. Arguments: `dst->src[0..2]` = x,
    /// positions; the parameters are the `struct spark_rope_params` stored in `dst`
    /// (`crate::params`); ggml's `userdata` is not read.
    ///
    /// # Safety
    /// ggml calls this with a live `dst` whose sources and data are valid for their shapes.
    spark_rope => Rope
}

/// Chunks per thread: a few, so that a slow thread does not hold the others up.
const CHUNKS_PER_THREAD: usize = 4;

/// `spark_rope`, checked, cut into chunks of rows.
pub(crate) struct Rope {
    call: RopeCall,
    n_chunks: usize,
}

impl Rope {
    fn rows(&self, c: usize) -> Range<usize> {
        let n = self.call.n_rows();
        c * n / self.n_chunks..(c + 1) * n / self.n_chunks
    }

    /// dst's row `row`.
    ///
    /// # Safety
    /// The caller owns the row (its chunk was claimed) and drops the slice before the call ends.
    unsafe fn out_row<'a>(&self, row: usize) -> &'a mut [f32] {
        let h = self.call.head_dim();
        // SAFETY: dst is contiguous [H, rows] f32 (checked); row < rows.
        unsafe { std::slice::from_raw_parts_mut(self.call.dst.data.cast::<f32>().add(row * h), h) }
    }
}

impl SparkOp for Rope {
    const NAME: &'static str = "spark_rope";

    unsafe fn prepare(
        dst: *mut sys::ggml_tensor,
        params_block: *mut c_void,
        nth: usize,
    ) -> Result<Self, KernelError> {
        // SAFETY: forwarded contract.
        let call = unsafe { RopeCall::read(dst, params_block) }?;
        let n_chunks = call.n_rows().min(nth.max(1) * CHUNKS_PER_THREAD).max(1);
        Ok(Rope { call, n_chunks })
    }

    fn n_chunks(&self) -> usize {
        self.n_chunks
    }

    unsafe fn run(&self, _ith: usize, claims: &mut Claims<'_>) -> Result<(), KernelError> {
        let c = &self.call;
        let (h, n_head, r) = (c.head_dim(), c.n_head(), c.params.r as usize);
        // the angles of the token the last row was of (rows are heads of a token, then tokens)
        let mut angles = Vec::with_capacity(h / 2);
        let mut angles_of = None;
        for chunk in claims {
            for row in self.rows(chunk) {
                let (n, t) = (row % n_head, row / n_head);
                if angles_of != Some(t) {
                    // SAFETY: pos holds n_tokens i32 values (checked), live for the call.
                    let pos = unsafe { c.pos.data.cast::<i32>().add(t).read_unaligned() };
                    rope_angles(pos, &c.params, h, &mut angles);
                    angles_of = Some(t);
                }
                // SAFETY: x holds H f32 values at every (n, t) offset (checked strides), live
                // for the call.
                let x = unsafe {
                    let at = c.x.data.add(t * c.x.nb[2] + n * c.x.nb[1]).cast::<f32>();
                    std::slice::from_raw_parts(at.cast_const(), h)
                };
                // SAFETY: chunk was claimed by this thread (SparkOp contract).
                rope_head(x, &angles, r, unsafe { self.out_row(row) });
            }
        }
        Ok(())
    }

    unsafe fn fill_chunk(&self, c: usize, value: f32) {
        for row in self.rows(c) {
            // SAFETY: the caller claimed chunk c (SparkOp contract).
            unsafe { self.out_row(row) }.fill(value);
        }
    }
}
