//! The generic kernels of quantized rows: ggml's own type traits (the same code ggml's
//! `mul_mat` runs), for every block-quantized [`RowType`] (the k-quants, the IQ family, the
//! ternary and FP4 types). Every table chooses them for the types it has no kernel of its own
//! for (`arch::table`: `DotKernel::GgmlVecDot`, `AxpyKernel::GgmlToFloatThen`,
//! `ToF32Kernel::GgmlToFloat`), and the generic table's q8_0 / q4_0 / q6_K kernels are them.
//!
//! `ggml_get_type_traits_cpu(ty)` gives `vec_dot` and the row type's `vec_dot_type`, whose own
//! `from_float` quantizes an f32 activation for it; `ggml_get_type_traits(ty)` gives `to_float`
//! (ggml's dequantizer). They are loaded once per type into a table ([`traits`]); a type
//! missing any of them is refused with [`KernelError::UnsupportedType`]. In the pinned ggml
//! every type with a `to_float` also has a CPU `vec_dot` (tested: `tests/ffn_rows.rs`).
//! `ggml_cpu_init()` (fp16 and GELU tables, ggml's clock) runs once before the first use.

use crate::kernel_types::RowType;
use crate::KernelError;
use llama_cpp_sys_2 as sys;
use std::ffi::c_void;
use std::sync::{Once, OnceLock};

type VecDot =
    unsafe extern "C" fn(i32, *mut f32, usize, *const c_void, usize, *const c_void, usize, i32);
type FromFloat = unsafe extern "C" fn(*const f32, *mut c_void, i64);
type ToFloat = unsafe extern "C" fn(*const c_void, *mut f32, i64);

/// The ggml functions and block layout for one quantized row type.
#[derive(Clone, Copy)]
struct Traits {
    vec_dot: VecDot,
    from_float: FromFloat,
    to_float: ToFloat,
    /// Elements and bytes per block of the activation type (`vec_dot_type`).
    act_block_elems: usize,
    act_block_bytes: usize,
}

/// Runs `ggml_cpu_init` once per process.
pub fn ensure_cpu_init() {
    static INIT: Once = Once::new();
    // SAFETY: ggml_cpu_init takes no arguments and guards its own one-time table set-up with
    // ggml's critical section; `Once` additionally serialises our callers.
    INIT.call_once(|| unsafe { sys::ggml_cpu_init() });
}

fn load_traits(ty: RowType) -> Option<Traits> {
    // `axpy` dequantizes whole blocks into chunks of CHUNK elements.
    if !ty.is_quantized() || !CHUNK.is_multiple_of(ty.block_elems()) {
        return None;
    }
    ensure_cpu_init();
    // SAFETY: the trait getters return pointers to static tables for any valid type id; every
    // RowType maps to a valid ggml type.
    unsafe {
        let cpu = sys::ggml_get_type_traits_cpu(ty.ggml());
        let base = sys::ggml_get_type_traits(ty.ggml());
        if cpu.is_null() || base.is_null() {
            return None;
        }
        let (cpu, base) = (&*cpu, &*base);
        let act = sys::ggml_get_type_traits(cpu.vec_dot_type);
        if act.is_null() {
            return None;
        }
        let act = &*act;
        Some(Traits {
            vec_dot: cpu.vec_dot?,
            from_float: sys::ggml_get_type_traits_cpu(cpu.vec_dot_type)
                .as_ref()?
                .from_float?,
            to_float: base.to_float?,
            act_block_elems: usize::try_from(act.blck_size).ok()?,
            act_block_bytes: act.type_size,
        })
    }
}

/// The traits of `ty`, loaded on first use (one table slot per type).
fn traits(ty: RowType) -> Result<&'static Traits, KernelError> {
    static TABLE: [OnceLock<Option<Traits>>; RowType::ALL.len()] =
        [const { OnceLock::new() }; RowType::ALL.len()];
    TABLE[ty.index()]
        .get_or_init(|| load_traits(ty))
        .as_ref()
        .ok_or(KernelError::UnsupportedType {
            tensor: "row",
            ty: ty.ggml(),
        })
}

/// Quantizes `x` to the activation type that `vec_dot` of `ty` rows expects, into `out`.
pub(crate) fn quantize_activation(
    ty: RowType,
    x: &[f32],
    out: &mut Vec<u8>,
) -> Result<(), KernelError> {
    let t = traits(ty)?;
    if !x.len().is_multiple_of(t.act_block_elems) || !x.len().is_multiple_of(ty.block_elems()) {
        return Err(KernelError::Shape(format!(
            "activation of {} elements is not whole {} blocks",
            x.len(),
            ty.name()
        )));
    }
    out.clear();
    out.resize(x.len() / t.act_block_elems * t.act_block_bytes, 0);
    // SAFETY: `out` holds exactly the bytes `from_float` writes for x.len() elements (whole
    // blocks, checked above); `x` is readable for x.len() f32.
    unsafe { (t.from_float)(x.as_ptr(), out.as_mut_ptr().cast(), x.len() as i64) };
    Ok(())
}

/// ggml `vec_dot` of a quantized row of `n` elements with a prepared activation.
///
/// # Safety
/// `row` must hold a row of `n` elements of `ty` and `act` the same `n` elements quantized by
/// [`quantize_activation`] for `ty` (both are checked by length here as a last defence).
pub(crate) unsafe fn vec_dot(ty: RowType, n: usize, row: &[u8], act: &[u8]) -> f32 {
    let t = traits(ty).expect("activation prepared, so the traits loaded");
    assert!(
        row.len() >= ty.row_bytes(n).unwrap_or(usize::MAX),
        "short quantized row"
    );
    assert!(
        act.len() >= n / t.act_block_elems * t.act_block_bytes,
        "short activation"
    );
    let mut s = 0f32;
    // SAFETY: lengths checked above; nrc = 1 reads one row and one activation and writes `s`.
    unsafe {
        (t.vec_dot)(
            n as i32,
            &mut s,
            0,
            row.as_ptr().cast(),
            0,
            act.as_ptr().cast(),
            0,
            1,
        )
    };
    s
}

/// Elements dequantized per step of [`axpy_via_ggml`]: a multiple of every block size ggml has (types
/// with larger blocks would be refused by [`load_traits`]).
const CHUNK: usize = 256;

/// `y += alpha * row` for a quantized row of `y.len()` elements, dequantized by ggml's
/// `to_float` in chunks of 256 into a stack buffer of this call, then `axpy_f32` per chunk
/// (the generic kernels' way, and every table's for the types without a kernel of its own).
///
/// # Safety
/// `row` must hold `y.len()` elements of `ty` (checked by length); `axpy_f32`'s CPU features
/// must be present.
pub(crate) unsafe fn axpy_via_ggml(
    ty: RowType,
    row: &[u8],
    alpha: f32,
    y: &mut [f32],
    axpy_f32: crate::arch::table::AxpyFn,
) {
    let t = traits(ty).expect("quantized RowType with ggml traits");
    let per = ty.block_bytes();
    let be = ty.block_elems();
    assert!(
        row.len() >= ty.row_bytes(y.len()).unwrap_or(usize::MAX),
        "short quantized row"
    );
    let mut buf = [0f32; CHUNK];
    for (i, yc) in y.chunks_mut(CHUNK).enumerate() {
        let src = &row[i * CHUNK / be * per..];
        let n = yc.len();
        // SAFETY: `src` holds at least n / be whole blocks (row length checked above and n is a
        // multiple of be because y.len() is); `buf` holds n <= CHUNK floats; `axpy_f32`'s
        // features are the caller's promise.
        unsafe {
            (t.to_float)(src.as_ptr().cast(), buf.as_mut_ptr(), n as i64);
            axpy_f32(f32_bytes(&buf[..n]), alpha, yc);
        }
    }
}

/// `out = row` through ggml's own `to_float` (the reference the fused kernels are tested
/// against).
///
/// # Safety
/// `row` must hold `out.len()` elements of `ty` (checked by length).
pub unsafe fn dequantize_ggml(ty: RowType, row: &[u8], out: &mut [f32]) {
    let t = traits(ty).expect("quantized RowType with ggml traits");
    assert!(
        row.len() >= ty.row_bytes(out.len()).unwrap_or(usize::MAX),
        "short quantized row"
    );
    // SAFETY: length checked above.
    unsafe { (t.to_float)(row.as_ptr().cast(), out.as_mut_ptr(), out.len() as i64) };
}

/// The bytes of an f32 slice.
fn f32_bytes(x: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and any byte pattern is a valid u8; the length in bytes is
    // 4 * len and the lifetime is tied to `x`.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<u8>(), std::mem::size_of_val(x)) }
}
