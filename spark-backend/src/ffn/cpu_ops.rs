//! The ggml custom ops of the Spark FFN (contract in `docs/INTERFACES.md`; the predictor before
//! them is a stock `ggml_mul_mat`): the two-stage path `spark_ffn_up` + `spark_ffn_down`, and
//! the fused path `spark_ffn_fused` + `spark_ffn_sum` the graph takes for small batches.
//!
//! Every op enters through [`crate::cpu_op::enter`] (one protocol for all Spark ops: checks, one
//! message format, NaN on failure). Each op cuts its output into fixed work chunks (a function
//! of the shapes only, defined once below and used both to compute and to NaN-fill), and the
//! threads of a call take them from a shared counter (`crate::cpu_op::Claims`): up, blocks of
//! [`UP_BLOCK`] neurons (rows of `u`); down, blocks of about [`DOWN_COLS`] columns of every
//! token row; fused and sum, the units of [`super::tiling::FusedUnits`] and
//! [`super::tiling::SumUnits`] for the call's `nth` (rows of a chunk's partial plane for a
//! group of tokens, or part of one token's row; ranges of whole cache lines). Each element is
//! computed by one thread in an order that does not depend on the chunk, so results do not
//! depend on `nth` or on the schedule.

use super::fused::{self, FusedInputs};
use super::shapes::{self, StageDims};
use super::shared::{Batch, Scratch, UpInputs};
use super::tiling::{FusedUnit, FusedUnits, SumUnits};
use super::two_stage;
use crate::cpu_op::{Claims, SparkOp};
use crate::params;
use crate::rows::paging::Paging;
use crate::rows::{RowMatrix, RowType};
use crate::stats;
use crate::tensor::{views, TensorView};
use crate::topk::Cutoff;
use crate::KernelError;
use llama_cpp_sys_2 as sys;
use std::cell::RefCell;
use std::ffi::c_void;
use std::ops::Range;

/// Output-dimension ranges of `spark_ffn_down` are multiples of this many elements (and of the
/// weight type's block size), so SIMD loops run on whole vectors.
const DIM_ALIGN: usize = super::tiling::DIM_ALIGN;

/// Neurons per work chunk of `spark_ffn_up` (108 chunks at F = 13824; the op runs for ubatches
/// of more than `super::tiling::FUSED_MAX_TOKENS` = 512 tokens, so a chunk is at least ~60 K
/// gated dot products).
pub(crate) const UP_BLOCK: usize = 128;

/// Columns per work chunk of `spark_ffn_down`, before rounding up to the alignment (9 chunks
/// at D = 2304; the op runs for ubatches of more than 512 tokens, as `spark_ffn_up`).
pub(crate) const DOWN_COLS: usize = 256;

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::new());
}

crate::cpu_op::custom_op! {
    /// `spark_ffn_up`: thresholds and gated value products, `dst u [n_tokens, F]`.
    ///
    /// # Safety
    /// Called by ggml's CPU backend with a live custom-op `dst` whose `src[0..3]` are the
    /// tensors of `docs/INTERFACES.md`. Its parameters are the `struct spark_op_params` stored
    /// in `dst` (`crate::params`; none stored is reported as an error); ggml's `userdata` is not
    /// read.
    spark_ffn_up => Up
}

crate::cpu_op::custom_op! {
    /// `spark_ffn_down`: `dst [D, n_tokens] = sum_j u_j V_j` over neurons with `u_j != 0`.
    ///
    /// # Safety
    /// Called by ggml's CPU backend with a live custom-op `dst` whose `src[0..2]` are `u` and
    /// `V` of `docs/INTERFACES.md`. Of the parameters stored in `dst`, only the layer is read (for
    /// messages); ggml's `userdata` is not read.
    spark_ffn_down => Down
}

crate::cpu_op::custom_op! {
    /// `spark_ffn_fused`: stages 2 and 3 over P fixed neuron chunks; `dst [D, n_tokens, P]`
    /// holds one partial output per chunk (the graph takes P from `super::tiling`).
    ///
    /// # Safety
    /// Called by ggml's CPU backend with a live custom-op `dst` whose `src[0..4]` are the
    /// tensors of `docs/INTERFACES.md`. Its parameters are the `struct spark_op_params` stored
    /// in `dst` (`crate::params`; none stored is reported as an error); ggml's `userdata` is not
    /// read.
    spark_ffn_fused => Fused
}

crate::cpu_op::custom_op! {
    /// `spark_ffn_sum`: `dst [D, n_tokens]` = the sum of the P partials of `spark_ffn_fused`,
    /// in chunk order.
    ///
    /// # Safety
    /// Called by ggml's CPU backend with a live custom-op `dst` whose `src[0]` is the
    /// `spark_ffn_fused` output. Of the parameters stored in `dst`, only the layer is read (for
    /// messages); ggml's `userdata` is not read.
    spark_ffn_sum => Sum
}

/// A weight matrix view over a 2-D ggml tensor.
///
/// # Safety
/// `v` describes a live tensor whose data covers `ne[1]` rows at stride `nb[1]`.
unsafe fn weight<'a>(v: &TensorView, name: &'static str) -> Result<RowMatrix<'a>, KernelError> {
    let ty = RowType::from_ggml(v.ty).ok_or(KernelError::UnsupportedType {
        tensor: name,
        ty: v.ty,
    })?;
    if v.nb[0] != ty.block_bytes() || v.ne[2] != 1 || v.ne[3] != 1 {
        return Err(KernelError::Shape(format!(
            "{name}: not a packed 2-D matrix (ne {:?})",
            v.ne
        )));
    }
    let row = ty.row_bytes(v.ne[0]).ok_or_else(|| {
        KernelError::Shape(format!(
            "{name}: {} columns are not whole {} blocks",
            v.ne[0],
            ty.name()
        ))
    })?;
    let len = if v.ne[1] == 0 {
        0
    } else {
        (v.ne[1] - 1) * v.nb[1] + row
    };
    // SAFETY: per the function contract the tensor's data covers `len` bytes.
    let data = unsafe { std::slice::from_raw_parts(v.data.cast_const(), len) };
    RowMatrix::new(ty, v.ne[0], v.ne[1], v.nb[1], data)
        .map_err(|e| KernelError::Shape(format!("{name}: {e}")))
}

/// An f32 tensor's rows as one slice (rows at stride `nb[1]`).
///
/// # Safety
/// `v` describes a live f32 tensor whose data covers `ne[1]` rows at stride `nb[1]`.
unsafe fn f32_rows<'a>(v: &TensorView) -> (&'a [f32], usize) {
    let stride = v.nb[1] / 4;
    let len = if v.ne[1] == 0 {
        0
    } else {
        (v.ne[1] - 1) * stride + v.ne[0]
    };
    // SAFETY: per the function contract.
    (
        unsafe { std::slice::from_raw_parts(v.data.cast::<f32>().cast_const(), len) },
        stride,
    )
}

/// The checked inputs `spark_ffn_up` and `spark_ffn_fused` share: scores [F, T] and h [D, T]
/// as f32 rows, K2 [D - r_f, F], the threshold cutoff and the layer.
struct StageInputs<'a> {
    layer: i32,
    cutoff: Cutoff,
    scores: &'a [f32],
    batch: Batch<'a>,
    k2: RowMatrix<'a>,
}

impl<'a> StageInputs<'a> {
    /// # Safety
    /// `s`, `h` and `k2` describe live tensors; `params_block` is null or a `spark_op_params`.
    unsafe fn new(
        s: &TensorView,
        h: &TensorView,
        k2: &TensorView,
        params_block: *mut c_void,
    ) -> Result<Self, KernelError> {
        // SAFETY: params_block is null or a spark_op_params (contract).
        let (layer, cutoff) = unsafe { params::read_ffn(params_block)? };
        let StageDims { d, n_tokens, .. } = shapes::stage(s, h, k2)?;
        // SAFETY: k2 is a live tensor (contract).
        let k2m = unsafe { weight(k2, "ffn_up")? };
        // SAFETY: s and h are live f32 tensors with the checked shapes.
        let (scores, _) = unsafe { f32_rows(s) };
        // SAFETY: as above.
        let (h_data, stride) = unsafe { f32_rows(h) };
        Ok(Self {
            layer,
            cutoff,
            scores,
            batch: Batch {
                h: h_data,
                stride,
                width: d,
                n_tokens,
            },
            k2: k2m,
        })
    }

    fn f(&self) -> usize {
        self.k2.n_rows()
    }

    fn dims(&self) -> StageDims {
        StageDims {
            f: self.f(),
            d: self.batch.width,
            n_tokens: self.batch.n_tokens,
        }
    }

    fn up(&self) -> UpInputs<'_> {
        UpInputs {
            scores: self.scores,
            batch: self.batch,
            k2: &self.k2,
            cutoff: self.cutoff,
        }
    }

    /// Records thread `ith`'s kept count (tokens are counted once, by thread 0).
    fn record(&self, ith: usize, kept: u64) {
        let tokens = if ith == 0 {
            self.batch.n_tokens as u64
        } else {
            0
        };
        stats::record_ffn(self.layer, kept, tokens, self.f() as u64);
    }
}

/// `spark_ffn_up`, checked. Chunk `c` is the rows of `u` (one per neuron, `n_tokens` values
/// each) of neurons `c * UP_BLOCK .. (c + 1) * UP_BLOCK` (the last one shorter).
pub(crate) struct Up<'a> {
    inputs: StageInputs<'a>,
    u: *mut f32,
}

impl Up<'_> {
    fn block(&self, c: usize) -> Range<usize> {
        let f = self.inputs.f();
        (c * UP_BLOCK).min(f)..((c + 1) * UP_BLOCK).min(f)
    }

    /// Rows `neurons` of `u`. The slice points into ggml's dst, not into `self`.
    ///
    /// # Safety
    /// The caller owns rows `neurons` of `u` and drops the slice before the op call returns.
    unsafe fn rows<'s>(&self, neurons: &Range<usize>) -> &'s mut [f32] {
        let n_tokens = self.inputs.batch.n_tokens;
        // SAFETY: rows `neurons` lie inside u (shape checked in prepare); the caller owns them.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.u.add(neurons.start * n_tokens),
                neurons.len() * n_tokens,
            )
        }
    }
}

impl SparkOp for Up<'_> {
    const NAME: &'static str = "spark_ffn_up";

    unsafe fn prepare(
        dst: *mut sys::ggml_tensor,
        params_block: *mut c_void,
        _nth: usize,
    ) -> Result<Self, KernelError> {
        // SAFETY: the op contract: dst and its sources are live.
        let (out, [s, h, k2]) = unsafe { views::<3>(dst)? };
        // SAFETY: as above.
        let inputs = unsafe { StageInputs::new(&s, &h, &k2, params_block)? };
        shapes::up_dst(inputs.dims(), &out)?;
        Ok(Self {
            inputs,
            u: out.data.cast(),
        })
    }

    fn n_chunks(&self) -> usize {
        self.inputs.f().div_ceil(UP_BLOCK)
    }

    unsafe fn run(&self, ith: usize, claims: &mut Claims<'_>) -> Result<(), KernelError> {
        let up = self.inputs.up();
        let kept = SCRATCH.with(|sc| {
            let sc = &mut sc.borrow_mut();
            let mut kept = 0;
            for (i, c) in claims.enumerate() {
                if i == 0 {
                    two_stage::up_prepare(&up, sc)?;
                    if ith == 0 {
                        Paging::global().request_all_if_streaming(up.k2, Some(self.inputs.layer));
                    }
                }
                let neurons = self.block(c);
                // SAFETY: chunk c was claimed by this thread (SparkOp contract).
                let u = unsafe { self.rows(&neurons) };
                kept += two_stage::up_block(&up, neurons, u, sc)?;
            }
            Ok::<_, KernelError>(kept)
        })?;
        self.inputs.record(ith, kept);
        Ok(())
    }

    unsafe fn fill_chunk(&self, c: usize, value: f32) {
        // SAFETY: the caller claimed chunk c (SparkOp contract).
        unsafe { self.rows(&self.block(c)) }.fill(value);
    }
}

/// `spark_ffn_down`, checked. Chunk `c` is columns `c * w .. (c + 1) * w` of every token row of
/// dst, `w` = [`DOWN_COLS`] rounded up to a multiple of lcm(16, V's block size) (the last one
/// shorter).
pub(crate) struct Down<'a> {
    u: &'a [f32],
    v: RowMatrix<'a>,
    n_tokens: usize,
    out: *mut u8,
    out_row_bytes: usize,
}

impl Down<'_> {
    fn width(&self) -> usize {
        DOWN_COLS.next_multiple_of(lcm(DIM_ALIGN, self.v.ty().block_elems()))
    }

    fn block(&self, c: usize) -> Range<usize> {
        let (d, w) = (self.v.n_cols(), self.width());
        (c * w).min(d)..((c + 1) * w).min(d)
    }

    /// Columns `dims` of every token row of dst (slices into ggml's dst, not into `self`).
    ///
    /// # Safety
    /// The caller owns columns `dims` of dst and drops the slices before the op call returns.
    unsafe fn rows<'s>(&self, dims: &Range<usize>) -> Vec<&'s mut [f32]> {
        (0..self.n_tokens)
            .map(|t| {
                // SAFETY: columns `dims` of row t lie inside dst (shape checked in prepare);
                // the caller owns them.
                unsafe {
                    let p = self.out.add(t * self.out_row_bytes).cast::<f32>();
                    std::slice::from_raw_parts_mut(p.add(dims.start), dims.len())
                }
            })
            .collect()
    }
}

impl SparkOp for Down<'_> {
    const NAME: &'static str = "spark_ffn_down";

    unsafe fn prepare(
        dst: *mut sys::ggml_tensor,
        _userdata: *mut c_void,
        _nth: usize,
    ) -> Result<Self, KernelError> {
        // SAFETY: the op contract: dst and its sources are live.
        let (out, [u, v]) = unsafe { views::<2>(dst)? };
        let (n_tokens, _, _) = shapes::down(&u, &v, &out)?;
        // SAFETY: v is a live tensor (contract).
        let vm = unsafe { weight(&v, "ffn_down_t")? };
        // SAFETY: u is a live f32 tensor with the checked shape.
        let (u_data, _) = unsafe { f32_rows(&u) };
        Ok(Self {
            u: u_data,
            v: vm,
            n_tokens,
            out: out.data,
            out_row_bytes: out.nb[1],
        })
    }

    fn n_chunks(&self) -> usize {
        self.v.n_cols().div_ceil(self.width())
    }

    unsafe fn run(&self, ith: usize, claims: &mut Claims<'_>) -> Result<(), KernelError> {
        SCRATCH.with(|sc| {
            let sc = &mut sc.borrow_mut();
            for (i, c) in claims.enumerate() {
                if i == 0 {
                    two_stage::down_prepare(self.u, self.v.n_rows(), self.n_tokens, sc)?;
                    if ith == 0 {
                        Paging::global().request_all_if_streaming(&self.v, None);
                    }
                }
                let dims = self.block(c);
                // SAFETY: chunk c was claimed by this thread (SparkOp contract).
                let mut rows = unsafe { self.rows(&dims) };
                two_stage::down_cols(&self.v, dims, &mut rows, sc)?;
            }
            Ok(())
        })
    }

    unsafe fn fill_chunk(&self, c: usize, value: f32) {
        // SAFETY: the caller claimed chunk c (SparkOp contract).
        for row in unsafe { self.rows(&self.block(c)) } {
            row.fill(value);
        }
    }
}

/// `spark_ffn_fused`, checked. Work chunk `u` is unit `u` of [`FusedUnits`] for the call's
/// `nth`: rows of one neuron chunk's partial plane for a group of tokens, or part of one
/// token's row.
pub(crate) struct Fused<'a> {
    inputs: StageInputs<'a>,
    v: RowMatrix<'a>,
    /// P, the neuron chunks (partial planes).
    p: usize,
    units: FusedUnits,
    out: *mut f32,
    /// The call's threads (each requests its share of rows that stream from storage).
    nth: usize,
}

impl Fused<'_> {
    /// Work unit `u` and its elements of the partials (a slice into ggml's dst, not into
    /// `self`).
    ///
    /// # Safety
    /// The caller owns unit `u` and drops the slice before the op call returns.
    unsafe fn unit<'s>(&self, u: usize) -> (FusedUnit, &'s mut [f32]) {
        let one = self.units.get(u);
        let span = self.units.span(&one);
        // SAFETY: the unit's span lies inside dst ([D, n_tokens, P] contiguous f32, checked in
        // prepare; the units of `FusedUnits` for these shapes are within it for u < count());
        // the caller owns it.
        let rows = unsafe { std::slice::from_raw_parts_mut(self.out.add(span.start), span.len()) };
        (one, rows)
    }
}

impl SparkOp for Fused<'_> {
    const NAME: &'static str = "spark_ffn_fused";

    unsafe fn prepare(
        dst: *mut sys::ggml_tensor,
        params_block: *mut c_void,
        nth: usize,
    ) -> Result<Self, KernelError> {
        // SAFETY: the op contract: dst and its sources are live.
        let (out, [s, h, k2, v]) = unsafe { views::<4>(dst)? };
        // SAFETY: as above.
        let inputs = unsafe { StageInputs::new(&s, &h, &k2, params_block)? };
        let p = shapes::fused_dst(inputs.dims(), &v, &out)?;
        // SAFETY: v is a live tensor (contract).
        let vm = unsafe { weight(&v, "ffn_down_t")? };
        let (d, n_tokens) = (vm.n_cols(), inputs.batch.n_tokens);
        let units = FusedUnits::new(p, n_tokens, d, vm.ty().block_elems(), nth);
        Ok(Self {
            inputs,
            v: vm,
            p,
            units,
            out: out.data.cast(),
            nth,
        })
    }

    fn n_chunks(&self) -> usize {
        self.units.count()
    }

    unsafe fn run(&self, ith: usize, claims: &mut Claims<'_>) -> Result<(), KernelError> {
        let inputs = FusedInputs {
            up: self.inputs.up(),
            v: &self.v,
        };
        let kept = SCRATCH.with(|sc| {
            let sc = &mut sc.borrow_mut();
            let mut kept = 0;
            for (i, u) in claims.enumerate() {
                if i == 0 {
                    fused::prepare(&inputs, self.p, sc)?;
                    fused::request_from_storage(&inputs, self.inputs.layer, ith, self.nth);
                }
                // SAFETY: unit u was claimed by this thread (SparkOp contract).
                let (one, rows) = unsafe { self.unit(u) };
                kept += fused::unit(&inputs, self.p, &one, rows, sc)?;
            }
            Ok::<_, KernelError>(kept)
        })?;
        self.inputs.record(ith, kept);
        Ok(())
    }

    unsafe fn fill_chunk(&self, u: usize, value: f32) {
        // SAFETY: the caller claimed unit u (SparkOp contract).
        unsafe { self.unit(u) }.1.fill(value);
    }
}

/// `spark_ffn_sum`, checked. Chunk `c` is the elements `SumUnits::get(c)` of dst (contiguous,
/// whole cache lines; [`SumUnits`] of `D * n_tokens` for the call's `nth`).
pub(crate) struct Sum<'a> {
    partials: &'a [f32],
    len: usize,
    units: SumUnits,
    out: *mut f32,
}

impl Sum<'_> {
    fn block(&self, c: usize) -> Range<usize> {
        self.units.get(c)
    }

    /// Elements `range` of dst (a slice into ggml's dst, not into `self`).
    ///
    /// # Safety
    /// The caller owns elements `range` of dst and drops the slice before the op call returns.
    unsafe fn elements<'s>(&self, range: &Range<usize>) -> &'s mut [f32] {
        // SAFETY: `range` lies inside dst (len contiguous values, checked in prepare); the
        // caller owns it.
        unsafe { std::slice::from_raw_parts_mut(self.out.add(range.start), range.len()) }
    }
}

impl SparkOp for Sum<'_> {
    const NAME: &'static str = "spark_ffn_sum";

    unsafe fn prepare(
        dst: *mut sys::ggml_tensor,
        _userdata: *mut c_void,
        nth: usize,
    ) -> Result<Self, KernelError> {
        // SAFETY: the op contract: dst and its sources are live.
        let (out, [partials]) = unsafe { views::<1>(dst)? };
        let (d, n_tokens, p) = shapes::sum(&partials, &out)?;
        let len = d * n_tokens;
        // SAFETY: partials is a live contiguous f32 tensor of p * len values (checked above).
        let all = unsafe {
            std::slice::from_raw_parts(partials.data.cast::<f32>().cast_const(), p * len)
        };
        Ok(Self {
            partials: all,
            len,
            units: SumUnits::new(len, nth),
            out: out.data.cast(),
        })
    }

    fn n_chunks(&self) -> usize {
        self.units.count()
    }

    unsafe fn run(&self, _ith: usize, claims: &mut Claims<'_>) -> Result<(), KernelError> {
        for c in claims {
            let range = self.block(c);
            // SAFETY: chunk c was claimed by this thread (SparkOp contract).
            let mine = unsafe { self.elements(&range) };
            fused::sum_partials(self.partials, self.len, range, mine)?;
        }
        Ok(())
    }

    unsafe fn fill_chunk(&self, c: usize, value: f32) {
        // SAFETY: the caller claimed chunk c (SparkOp contract).
        unsafe { self.elements(&self.block(c)) }.fill(value);
    }
}

fn lcm(a: usize, b: usize) -> usize {
    fn gcd(a: usize, b: usize) -> usize {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    a / gcd(a, b) * b
}
