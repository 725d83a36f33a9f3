//! The ggml custom ops of the Spark FFN (contract in `docs/INTERFACES.md`; the predictor before
//! them is a stock `ggml_mul_mat`): the two-stage path `spark_ffn_up` + `spark_ffn_down`, and
//! the fused path `spark_ffn_fused` + `spark_ffn_sum` the graph takes for small batches.
//!
//! ggml calls each op on all `nth` threads at once with no barrier inside a node, so each
//! thread computes a fixed share (up: a neuron range; down and sum: an output range; fused:
//! every nth chunk) and results do not depend on `nth`. Errors (bad shapes, types or
//! parameters) print one line to stderr (the first few per process) and fill the thread's share
//! of dst with NaN, so a broken graph shows in the logits; panics are caught and handled the
//! same way, never unwinding into C.

use crate::ffn::{self, Scratch};
use crate::params::FfnParams;
use crate::rows::{RowMatrix, RowType};
use crate::stats;
use crate::tensor::{TensorView, GGML_TYPE_F32};
use crate::KernelError;
use llama_cpp_sys_2 as sys;
use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Output-dimension ranges of `spark_ffn_down` are multiples of this many elements (and of the
/// weight type's block size), so SIMD loops run on whole vectors.
const DIM_ALIGN: usize = 16;

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::new());
}

/// Defines a `ggml_custom_op_t` entry point `$name` that runs `$body(dst, ith, nth, userdata)`
/// under [`run_guarded`] (errors and panics become one stderr line and a NaN-filled share of
/// dst; nothing unwinds into C).
macro_rules! custom_op {
    ($(#[$doc:meta])* $name:ident => $body:ident) => {
        $(#[$doc])*
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            dst: *mut sys::ggml_tensor,
            ith: c_int,
            nth: c_int,
            userdata: *mut c_void,
        ) {
            // SAFETY: forwarded contract of this function (its `# Safety` section).
            run_guarded(stringify!($name), dst, ith, nth, || unsafe {
                $body(dst, ith, nth, userdata)
            });
        }
    };
}

custom_op! {
    /// `spark_ffn_up`: thresholds and gated value products, `dst u [n_tokens, F]`.
    ///
    /// # Safety
    /// Called by ggml's CPU backend with a live custom-op `dst` whose `src[0..3]` are the
    /// tensors of `docs/INTERFACES.md` and `userdata` pointing to a `struct spark_ffn_params`
    /// (or null, which is reported as an error).
    spark_ffn_up => up
}

custom_op! {
    /// `spark_ffn_down`: `dst [D, n_tokens] = sum_j u_j V_j` over neurons with `u_j != 0`.
    ///
    /// # Safety
    /// Called by ggml's CPU backend with a live custom-op `dst` whose `src[0..2]` are `u` and
    /// `V` of `docs/INTERFACES.md`; `userdata` is not read.
    spark_ffn_down => down
}

custom_op! {
    /// `spark_ffn_fused`: stages 2 and 3 over P fixed neuron chunks; `dst [D, n_tokens, P]`
    /// holds one partial output per chunk (the graph picks P: `ffn::fused::default_chunks(F)`).
    ///
    /// # Safety
    /// Called by ggml's CPU backend with a live custom-op `dst` whose `src[0..4]` are the
    /// tensors of `docs/INTERFACES.md` and `userdata` pointing to a `struct spark_ffn_params`
    /// (or null, which is reported as an error).
    spark_ffn_fused => fused
}

custom_op! {
    /// `spark_ffn_sum`: `dst [D, n_tokens]` = the sum of the P partials of `spark_ffn_fused`,
    /// in chunk order.
    ///
    /// # Safety
    /// Called by ggml's CPU backend with a live custom-op `dst` whose `src[0]` is the
    /// `spark_ffn_fused` output; `userdata` is not read.
    spark_ffn_sum => sum
}

/// How many error lines are printed per process before going quiet.
const MAX_ERROR_LINES: usize = 8;

fn run_guarded(
    name: &str,
    dst: *mut sys::ggml_tensor,
    ith: c_int,
    nth: c_int,
    body: impl FnOnce() -> Result<(), KernelError>,
) {
    static PRINTED: AtomicUsize = AtomicUsize::new(0);
    let outcome = catch_unwind(AssertUnwindSafe(body));
    let message = match outcome {
        Ok(Ok(())) => return,
        Ok(Err(e)) => (ith == 0).then(|| e.to_string()),
        Err(_) => Some(format!("panic in thread {ith}")),
    };
    if let Some(m) = message {
        if PRINTED.fetch_add(1, Ordering::Relaxed) < MAX_ERROR_LINES {
            eprintln!("spark: {name}: {m}; output set to NaN");
        }
    }
    // SAFETY: dst is the op's live output tensor (ggml contract); only this thread's share of
    // its rows is written.
    unsafe { crate::tensor::fill_nan_share(dst, ith.max(0) as usize, nth.max(1) as usize) };
}

/// The tensor views of dst and its first `n` sources.
///
/// # Safety
/// `dst` is null or a live ggml tensor whose sources are null or live.
unsafe fn views<const N: usize>(
    dst: *mut sys::ggml_tensor,
) -> Result<(TensorView, [TensorView; N]), KernelError> {
    if dst.is_null() {
        return Err(KernelError::Shape("dst is null".into()));
    }
    // SAFETY: per the function contract.
    let out = unsafe { TensorView::from_raw(dst)? };
    // SAFETY: dst is live; src pointers are null or live tensors.
    let srcs = unsafe { (*dst).src };
    let mut views = [out; N];
    for (i, v) in views.iter_mut().enumerate() {
        // SAFETY: as above; from_raw rejects null pointers.
        *v = unsafe { TensorView::from_raw(srcs[i]) }
            .map_err(|e| KernelError::Shape(format!("args[{i}]: {e}")))?;
    }
    Ok((out, views))
}

fn expect_2d(v: &TensorView, name: &str, ne0: usize, ne1: usize) -> Result<(), KernelError> {
    if v.ne != [ne0, ne1, 1, 1] {
        return Err(KernelError::Shape(format!(
            "{name}: ne {:?}, expected [{ne0}, {ne1}, 1, 1]",
            v.ne
        )));
    }
    Ok(())
}

fn expect_f32_rows(v: &TensorView, name: &'static str) -> Result<(), KernelError> {
    if v.ty != GGML_TYPE_F32 {
        return Err(KernelError::UnsupportedType {
            tensor: name,
            ty: v.ty,
        });
    }
    if v.nb[0] != 4 || !v.nb[1].is_multiple_of(4) || v.nb[1] < 4 * v.ne[0] {
        return Err(KernelError::Shape(format!(
            "{name}: f32 rows not contiguous (nb {:?})",
            v.nb
        )));
    }
    Ok(())
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

/// An f32 tensor's rows as one slice (rows at stride nb[1]).
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

fn thread_share(ith: c_int, nth: c_int) -> Result<(usize, usize), KernelError> {
    if nth < 1 || ith < 0 || ith >= nth {
        return Err(KernelError::Param(format!("thread {ith} of {nth}")));
    }
    Ok((ith as usize, nth as usize))
}

/// `k_f` from the op's userdata.
///
/// # Safety
/// `userdata` is null or points to a `spark_ffn_params`.
unsafe fn read_params(userdata: *mut c_void) -> Result<(FfnParams, usize), KernelError> {
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

/// Checks the shared inputs of `spark_ffn_up` and `spark_ffn_fused`: scores [F, T] and h
/// [D, T] as f32 rows, K2 [D - r_f, F]; returns (F, T, D) and K2's matrix.
///
/// # Safety
/// `k2` describes a live tensor.
unsafe fn check_up_inputs<'a>(
    s: &TensorView,
    h: &TensorView,
    k2: &TensorView,
) -> Result<(usize, usize, usize, RowMatrix<'a>), KernelError> {
    expect_f32_rows(s, "scores")?;
    expect_f32_rows(h, "h")?;
    // SAFETY: k2 is a live tensor (contract).
    let k2m = unsafe { weight(k2, "ffn_up")? };
    let (f, n_tokens, d) = (s.ne[0], s.ne[1], h.ne[0]);
    expect_2d(s, "scores", f, n_tokens)?;
    expect_2d(h, "h", d, n_tokens)?;
    expect_2d(k2, "ffn_up", k2.ne[0], f)?;
    if k2.ne[0] == 0 || k2.ne[0] >= d {
        return Err(KernelError::Shape(format!(
            "ffn_up width {} not in (0, D = {d})",
            k2.ne[0]
        )));
    }
    if s.nb[1] != 4 * f {
        return Err(KernelError::Shape("scores rows must be contiguous".into()));
    }
    Ok((f, n_tokens, d, k2m))
}

/// # Safety
/// See [`spark_ffn_fused`].
unsafe fn fused(
    dst: *mut sys::ggml_tensor,
    ith: c_int,
    nth: c_int,
    userdata: *mut c_void,
) -> Result<(), KernelError> {
    let (ith, nth) = thread_share(ith, nth)?;
    // SAFETY: userdata is null or a spark_ffn_params (contract).
    let (params, k) = unsafe { read_params(userdata)? };
    // SAFETY: the op contract: dst and its sources are live.
    let (out, [s, h, k2, v]) = unsafe { views::<4>(dst)? };
    // SAFETY: as above.
    let (f, n_tokens, d, k2m) = unsafe { check_up_inputs(&s, &h, &k2)? };
    // SAFETY: v is a live tensor (contract).
    let vm = unsafe { weight(&v, "ffn_down_t")? };
    expect_2d(&v, "ffn_down_t", d, f)?;
    let p = out.ne[2];
    if out.ne != [d, n_tokens, p, 1] || p == 0 || p > f {
        return Err(KernelError::Shape(format!(
            "dst: ne {:?}, expected [{d}, {n_tokens}, P, 1] with 1 <= P <= F = {f}",
            out.ne
        )));
    }
    expect_f32_rows(&out, "dst")?;
    let len = d * n_tokens;
    if out.nb[1] != 4 * d || out.nb[2] != 4 * len {
        return Err(KernelError::Shape("dst must be contiguous".into()));
    }
    // SAFETY: s and h are live f32 tensors with the checked shapes.
    let (scores, _) = unsafe { f32_rows(&s) };
    // SAFETY: as above.
    let (h_data, h_stride) = unsafe { f32_rows(&h) };
    let inputs = ffn::fused::FusedInputs {
        scores,
        h: h_data,
        h_stride,
        n_tokens,
        k2: &k2m,
        v: &vm,
        k,
    };
    let chunks = (ith..p).step_by(nth).map(|c| {
        // SAFETY: partial c (len contiguous f32 values) lies inside dst (shape and strides
        // checked) and belongs to this thread alone: chunk c goes to thread c % nth.
        let partial =
            unsafe { std::slice::from_raw_parts_mut(out.data.cast::<f32>().add(c * len), len) };
        (c, partial)
    });
    let kept =
        SCRATCH.with(|sc| ffn::fused::chunk_partials(&inputs, p, chunks, &mut sc.borrow_mut()))?;
    let tokens = if ith == 0 { n_tokens as u64 } else { 0 };
    stats::record_ffn(params.layer, kept, tokens, f as u64);
    Ok(())
}

/// # Safety
/// See [`spark_ffn_sum`].
unsafe fn sum(
    dst: *mut sys::ggml_tensor,
    ith: c_int,
    nth: c_int,
    _userdata: *mut c_void,
) -> Result<(), KernelError> {
    let (ith, nth) = thread_share(ith, nth)?;
    // SAFETY: the op contract: dst and its sources are live.
    let (out, [partials]) = unsafe { views::<1>(dst)? };
    let (d, n_tokens, p) = (partials.ne[0], partials.ne[1], partials.ne[2]);
    expect_f32_rows(&partials, "partials")?;
    let len = d * n_tokens;
    if partials.ne[3] != 1 || partials.nb[1] != 4 * d || partials.nb[2] != 4 * len || p == 0 {
        return Err(KernelError::Shape(format!(
            "partials: ne {:?} nb {:?}, expected contiguous [D, n_tokens, P >= 1, 1]",
            partials.ne, partials.nb
        )));
    }
    expect_2d(&out, "dst", d, n_tokens)?;
    expect_f32_rows(&out, "dst")?;
    if out.nb[1] != 4 * d {
        return Err(KernelError::Shape("dst must be contiguous".into()));
    }
    // SAFETY: partials is a live contiguous f32 tensor of p * len values (checked above).
    let all =
        unsafe { std::slice::from_raw_parts(partials.data.cast::<f32>().cast_const(), p * len) };
    let range = ffn::split_range(len, nth, ith, DIM_ALIGN);
    // SAFETY: elements `range` of dst (contiguous, len values) belong to this thread alone:
    // the shares of split_range are disjoint.
    let mine = unsafe {
        std::slice::from_raw_parts_mut(out.data.cast::<f32>().add(range.start), range.len())
    };
    ffn::fused::sum_partials(all, len, range, mine)
}

/// # Safety
/// See [`spark_ffn_up`].
unsafe fn up(
    dst: *mut sys::ggml_tensor,
    ith: c_int,
    nth: c_int,
    userdata: *mut c_void,
) -> Result<(), KernelError> {
    let (ith, nth) = thread_share(ith, nth)?;
    // SAFETY: userdata is null or a spark_ffn_params (contract).
    let (params, k) = unsafe { read_params(userdata)? };
    // SAFETY: the op contract: dst and its sources are live.
    let (out, [s, h, k2]) = unsafe { views::<3>(dst)? };
    // SAFETY: as above.
    let (f, n_tokens, d, k2m) = unsafe { check_up_inputs(&s, &h, &k2)? };
    expect_2d(&out, "dst", n_tokens, f)?;
    expect_f32_rows(&out, "dst")?;
    if out.nb[1] != 4 * n_tokens {
        return Err(KernelError::Shape("dst must be contiguous".into()));
    }
    // SAFETY: s and h are live f32 tensors with the checked shapes.
    let (scores, _) = unsafe { f32_rows(&s) };
    // SAFETY: as above.
    let (h_data, h_stride) = unsafe { f32_rows(&h) };
    let neurons = ffn::split_range(f, nth, ith, 1);
    // SAFETY: dst rows `neurons` (n_tokens f32 each, contiguous) belong to this thread alone:
    // the shares of split_range are disjoint.
    let u = unsafe {
        std::slice::from_raw_parts_mut(
            out.data.cast::<f32>().add(neurons.start * n_tokens),
            neurons.len() * n_tokens,
        )
    };
    let kept = SCRATCH.with(|sc| {
        let mut sc = sc.borrow_mut();
        ffn::up_range(
            scores, h_data, h_stride, d, n_tokens, &k2m, k, neurons, u, &mut sc,
        )
    })?;
    let tokens = if ith == 0 { n_tokens as u64 } else { 0 };
    stats::record_ffn(params.layer, kept, tokens, f as u64);
    Ok(())
}

/// # Safety
/// See [`spark_ffn_down`].
unsafe fn down(
    dst: *mut sys::ggml_tensor,
    ith: c_int,
    nth: c_int,
    _userdata: *mut c_void,
) -> Result<(), KernelError> {
    let (ith, nth) = thread_share(ith, nth)?;
    // SAFETY: the op contract: dst and its sources are live.
    let (out, [u, v]) = unsafe { views::<2>(dst)? };
    expect_f32_rows(&u, "u")?;
    // SAFETY: v is a live tensor (contract).
    let vm = unsafe { weight(&v, "ffn_down_t")? };
    let (n_tokens, f, d) = (u.ne[0], u.ne[1], v.ne[0]);
    expect_2d(&u, "u", n_tokens, f)?;
    expect_2d(&v, "ffn_down_t", d, f)?;
    if u.nb[1] != 4 * n_tokens {
        return Err(KernelError::Shape("u must be contiguous".into()));
    }
    expect_2d(&out, "dst", d, n_tokens)?;
    expect_f32_rows(&out, "dst")?;
    // SAFETY: u is a live f32 tensor with the checked shape.
    let (u_data, _) = unsafe { f32_rows(&u) };
    let align = lcm(DIM_ALIGN, vm.ty().block_elems());
    let dims: Range<usize> = ffn::split_range(d, nth, ith, align);
    let mut rows: Vec<&mut [f32]> = (0..n_tokens)
        .map(|t| {
            // SAFETY: columns `dims` of dst row t lie inside dst (shape checked) and belong to
            // this thread alone: the shares of split_range are disjoint.
            unsafe {
                let p = out.data.add(t * out.nb[1]).cast::<f32>().add(dims.start);
                std::slice::from_raw_parts_mut(p, dims.len())
            }
        })
        .collect();
    SCRATCH.with(|sc| ffn::down_range(u_data, &vm, dims, &mut rows, &mut sc.borrow_mut()))
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
