//! Row kernels: the SIMD versions against the scalar reference and float64 on odd lengths, and
//! quantized rows (through ggml's traits) against float64 on the dequantized weights.

mod ffn_common;

use ffn_common::{Rng, Weights};
use proptest::prelude::*;
use spark_backend::rows::{self, simd, Activation, Row, RowType};

const LENGTHS: [usize; 10] = [1, 2, 7, 8, 31, 33, 255, 256, 1000, 2304];

fn encode(ty: RowType, x: &[f32]) -> Vec<u8> {
    rows::quant::quantize_rows(ty, x, x.len()).unwrap()
}

fn decoded(ty: RowType, bytes: &[u8], n: usize) -> Vec<f64> {
    let mut out = vec![0f32; n];
    rows::to_f32(Row::new(ty, n, bytes).unwrap(), &mut out);
    out.into_iter().map(f64::from).collect()
}

/// Checks every float kernel of `k` against float64 on one row and activation.
fn check_float_kernels(k: &simd::Kernels, w: &[f32], x: &[f32], alpha: f32) {
    let n = x.len();
    for ty in [RowType::F32, RowType::F16, RowType::Bf16] {
        let bytes = encode(ty, w);
        let wd = decoded(ty, &bytes, n);
        let exact: f64 = wd.iter().zip(x).map(|(a, &b)| a * f64::from(b)).sum();
        let mag: f64 = wd
            .iter()
            .zip(x)
            .map(|(a, &b)| (a * f64::from(b)).abs())
            .sum();
        let (dot, axpy, conv) = match ty {
            RowType::F32 => (k.dot_f32, k.axpy_f32, None),
            RowType::F16 => (k.dot_f16, k.axpy_f16, Some(k.f16_to_f32)),
            _ => (k.dot_bf16, k.axpy_bf16, Some(k.bf16_to_f32)),
        };
        // SAFETY: the kernels come from `simd::avx2()` (features detected) or SCALAR, and
        // the row holds n elements.
        let got = unsafe { dot(&bytes, x) };
        let tol = 1e-6 * mag + 1e-30;
        assert!(
            (f64::from(got) - exact).abs() <= tol,
            "{:?} {ty:?} n={n}: dot {got} vs {exact}",
            k.isa
        );
        let mut y: Vec<f32> = x.iter().map(|v| v * 0.5).collect();
        // SAFETY: as above; y has n elements.
        unsafe { axpy(&bytes, alpha, &mut y) };
        for i in 0..n {
            let want = f64::from(x[i] * 0.5) + f64::from(alpha) * wd[i];
            let scale = f64::from(x[i] * 0.5).abs() + (f64::from(alpha) * wd[i]).abs();
            assert!(
                (f64::from(y[i]) - want).abs() <= 1e-6 * scale + 1e-30,
                "{:?} {ty:?} axpy n={n} i={i}",
                k.isa
            );
        }
        if let Some(conv) = conv {
            let mut out = vec![0f32; n];
            // SAFETY: as above.
            unsafe { conv(&bytes, &mut out) };
            assert!(
                out.iter().zip(&wd).all(|(&a, &b)| f64::from(a) == b),
                "{:?} {ty:?} to_f32",
                k.isa
            );
        }
    }
}

#[test]
fn float_kernels_match_float64_on_odd_lengths() {
    let mut rng = Rng::new(1);
    let kernels: Vec<simd::Kernels> = std::iter::once(simd::SCALAR).chain(simd::avx2()).collect();
    for &n in &LENGTHS {
        let w = rng.normals(n, 1.0);
        let x = rng.normals(n, 2.0);
        for k in &kernels {
            check_float_kernels(k, &w, &x, -0.75);
        }
    }
}

#[test]
fn simd_axpy_equals_scalar_bit_for_bit_on_any_slice() {
    // Both use one fused multiply-add per element, so tiling an output across threads at any
    // boundary cannot change a result.
    let Some(avx) = simd::avx2() else { return };
    let mut rng = Rng::new(2);
    let n = 2304;
    let w = rng.normals(n, 1.0);
    for ty in [RowType::F32, RowType::F16, RowType::Bf16] {
        let bytes = encode(ty, &w);
        let (a, s) = match ty {
            RowType::F32 => (avx.axpy_f32, simd::SCALAR.axpy_f32),
            RowType::F16 => (avx.axpy_f16, simd::SCALAR.axpy_f16),
            _ => (avx.axpy_bf16, simd::SCALAR.axpy_bf16),
        };
        for start in [0usize, 1, 5, 16, 333] {
            let esz = if ty == RowType::F32 { 4 } else { 2 };
            let y0 = rng.normals(n - start, 1.0);
            let (mut y1, mut y2) = (y0.clone(), y0.clone());
            // SAFETY: features detected; the row slice holds n - start elements.
            unsafe {
                a(&bytes[start * esz..], 0.3, &mut y1);
                s(&bytes[start * esz..], 0.3, &mut y2);
            }
            assert_eq!(y1, y2, "{ty:?} start {start}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn simd_matches_scalar_reference(n in 1usize..600, seed in any::<u64>(), alpha in -4.0f32..4.0) {
        let mut rng = Rng::new(seed);
        let w = rng.normals(n, 1.0);
        let x = rng.normals(n, 1.0);
        check_float_kernels(&simd::SCALAR, &w, &x, alpha);
        if let Some(k) = simd::avx2() {
            check_float_kernels(&k, &w, &x, alpha);
        }
    }
}

/// Bound on |quantized dot - exact dot| from quantizing the activation: per element at most
/// half a step of its block's scale (max|x| / 127), plus f32 rounding.
fn act_quant_bound(w: &[f64], x: &[f32], block: usize) -> f64 {
    let mut bound = 0.0;
    for (wb, xb) in w.chunks(block).zip(x.chunks(block)) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
        let step = amax / 127.0;
        bound += wb.iter().map(|v| v.abs()).sum::<f64>() * step * 0.51;
    }
    let mag: f64 = w
        .iter()
        .zip(x)
        .map(|(a, &b)| (a * f64::from(b)).abs())
        .sum();
    bound + 1e-5 * mag
}

#[test]
fn quantized_dot_and_axpy_match_float64_on_dequantized_weights() {
    let mut rng = Rng::new(3);
    for ty in RowType::quantized() {
        let be = ty.block_elems();
        for blocks in [1usize, 3, 9] {
            let n = be * blocks;
            let w = Weights::random(&mut rng, ty, n, 2, 0.05);
            let x = rng.normals(n, 1.0);
            let mut act = Activation::new();
            act.prepare(ty, &x).unwrap();
            let m = w.matrix();
            for j in 0..2 {
                let wd: Vec<f64> = w.row_f64(j).collect();
                let exact: f64 = wd.iter().zip(&x).map(|(a, &b)| a * f64::from(b)).sum();
                let got = rows::dot(m.row(j), &act);
                // The activation is quantized in blocks of 32 (q8_0/q8_1) or 256 (q8_K).
                let bound = act_quant_bound(&wd, &x, be.max(32).min(n));
                assert!(
                    (f64::from(got) - exact).abs() <= bound,
                    "{ty:?} n={n}: {got} vs {exact} (bound {bound})"
                );
                let mut y = vec![0.25f32; n];
                rows::axpy(m.row(j), 1.5, &mut y);
                for i in 0..n {
                    let want = 0.25 + 1.5 * wd[i];
                    assert!(
                        (f64::from(y[i]) - want).abs() <= 1e-6 * (0.25 + (1.5 * wd[i]).abs()),
                        "{ty:?} axpy"
                    );
                }
            }
        }
    }
}

#[test]
fn row_slices_dequantize_like_the_whole_row() {
    let mut rng = Rng::new(4);
    for ty in RowType::ALL {
        let n = 512;
        let w = Weights::random(&mut rng, ty, n, 1, 1.0);
        let row = w.matrix().row(0);
        let be = ty.block_elems().max(16);
        let mut part = vec![0f32; n - be];
        rows::to_f32(row.slice(be, n), &mut part);
        assert_eq!(&part[..], &w.values[be..], "{ty:?}");
    }
}

#[test]
fn row_and_matrix_constructors_reject_bad_sizes() {
    assert!(Row::new(RowType::Q8_0, 33, &[0u8; 100]).is_err());
    assert!(Row::new(RowType::F16, 10, &[0u8; 19]).is_err());
    assert!(rows::RowMatrix::new(RowType::F32, 4, 3, 16, &[0u8; 47]).is_err());
    assert!(rows::RowMatrix::new(RowType::F32, 4, 3, 12, &[0u8; 100]).is_err());
    assert!(rows::RowMatrix::new(RowType::F32, 4, 3, 16, &[0u8; 48]).is_ok());
    let mut a = Activation::new();
    assert!(a.prepare(RowType::Q4K, &[0.0; 100]).is_err());
    for ty in RowType::ALL {
        assert_eq!(RowType::from_ggml(ty.ggml()), Some(ty));
    }
    assert_eq!(RowType::from_ggml(4), None);
    assert_eq!(RowType::from_ggml(20), None);
}

#[test]
fn fused_quantized_kernels_equal_ggml_dequantize_then_axpy_bit_for_bit() {
    let mut rng = Rng::new(5);
    for ty in RowType::quantized() {
        let n = 2304;
        let w = Weights::random(&mut rng, ty, n, 1, 0.7);
        let row = w.matrix().row(0);
        let mut reference = vec![0f32; n];
        // SAFETY: the row holds n elements of ty.
        unsafe { rows::quant::dequantize_ggml(ty, row.bytes(), &mut reference) };
        let mut ours = vec![0f32; n];
        rows::to_f32(row, &mut ours);
        assert!(
            ours.iter()
                .zip(&reference)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{ty:?} to_f32"
        );
        let y0 = rng.normals(n, 1.0);
        let mut fused = y0.clone();
        rows::axpy(row, -0.37, &mut fused);
        let mut split = y0.clone();
        rows::axpy_f32(&reference, -0.37, &mut split);
        assert!(
            fused
                .iter()
                .zip(&split)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "{ty:?} axpy"
        );
    }
}

#[test]
fn axpy4_equals_four_axpy_calls_bit_for_bit() {
    // Every type (q8_0 has its own one-pass kernel, the rest run four axpy calls) on whole-block
    // lengths, including one block and lengths that are not multiples of 8 blocks.
    let mut rng = Rng::new(6);
    for ty in RowType::ALL {
        let be = ty.block_elems();
        for blocks in [1usize, 3, 9, 72] {
            let n = be * blocks;
            let w = Weights::random(&mut rng, ty, n, 4, 0.7);
            let m = w.matrix();
            let alphas = [0.31f32, -1.7, 2.5e-3, 0.0];
            let y0 = rng.normals(n, 1.0);
            let mut one_pass = y0.clone();
            rows::axpy4(
                [m.row(0), m.row(1), m.row(2), m.row(3)],
                alphas,
                &mut one_pass,
            );
            let mut sequential = y0.clone();
            for (j, &a) in alphas.iter().enumerate() {
                rows::axpy(m.row(j), a, &mut sequential);
            }
            assert!(
                one_pass
                    .iter()
                    .zip(&sequential)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{ty:?} n={n}"
            );
        }
    }
}

/// The type facts the op entry points turn into slice lengths (`RowType::block_bytes`,
/// `block_elems`, the ggml id) must be those of the ggml this crate links, not typed copies.
#[test]
fn row_type_sizes_and_ids_equal_the_linked_ggml() {
    use llama_cpp_sys_2 as sys;
    for ty in RowType::ALL {
        // SAFETY: plain queries of ggml's static type-traits table for a valid type id.
        let (bytes, elems, name) = unsafe {
            (
                sys::ggml_type_size(ty.ggml()),
                sys::ggml_blck_size(ty.ggml()),
                std::ffi::CStr::from_ptr(sys::ggml_type_name(ty.ggml())),
            )
        };
        assert_eq!(ty.block_bytes(), bytes, "{ty:?}: bytes per block");
        assert_eq!(ty.block_elems() as i64, elems, "{ty:?}: elements per block");
        assert_eq!(
            ty.name(),
            name.to_str().unwrap(),
            "{ty:?}: ggml's name for the id"
        );
        assert_eq!(RowType::from_ggml(ty.ggml()), Some(ty));
        assert_eq!(ty.row_bytes(3 * ty.block_elems()), Some(3 * bytes));
    }
    // ggml's row size for a whole row, as ggml computes it (ggml_row_size).
    for ty in RowType::ALL {
        let n = 2 * 256;
        // SAFETY: as above.
        let want = unsafe { sys::ggml_row_size(ty.ggml(), n as i64) };
        assert_eq!(ty.row_bytes(n), Some(want), "{ty:?}: row of {n}");
    }
}

/// The folded q8_0 accumulation written out from its definition: per block, the coefficient
/// `alpha * d` rounded to f32, then one fused multiply-add per weight.
fn folded_q8_0_reference(row: &[u8], alpha: f32, y: &mut [f32]) {
    for (b, yb) in y.chunks_exact_mut(32).enumerate() {
        let block = &row[34 * b..34 * (b + 1)];
        let c = alpha * half::f16::from_le_bytes([block[0], block[1]]).to_f32();
        for (i, yi) in yb.iter_mut().enumerate() {
            *yi = f32::from(block[2 + i] as i8).mul_add(c, *yi);
        }
    }
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

#[test]
fn folded_axpy_equals_its_definition_bit_for_bit() {
    // Every type, 0 to 4 rows, both starts, whole-block lengths from one block to Gemma-2 2B's
    // D. q8_0 against the definition above (the AVX2 pass and the portable function both);
    // other types against one exact `axpy` per row.
    let mut rng = Rng::new(16);
    let alphas = [0.31f32, -1.7, 2.5e-3, 0.0];
    for ty in RowType::ALL {
        for blocks in [1usize, 3, 9, 72] {
            let n = ty.block_elems() * blocks;
            let w = Weights::random(&mut rng, ty, n, 4, 0.7);
            let m = w.matrix();
            let all = [m.row(0), m.row(1), m.row(2), m.row(3)];
            let y0 = rng.normals(n, 1.0);
            for k in 0..=4 {
                for start in [rows::Start::Accumulate, rows::Start::Zero] {
                    let mut got = match start {
                        // the old values must not be read
                        rows::Start::Zero => vec![f32::NAN; n],
                        rows::Start::Accumulate => y0.clone(),
                    };
                    rows::axpy_folded(&all[..k], &alphas[..k], &mut got, start);
                    let mut want = match start {
                        rows::Start::Zero => vec![0f32; n],
                        rows::Start::Accumulate => y0.clone(),
                    };
                    let mut portable = want.clone();
                    for (row, &a) in all[..k].iter().zip(&alphas) {
                        if ty == RowType::Q8_0 {
                            folded_q8_0_reference(row.bytes(), a, &mut want);
                            rows::quant::axpy_q8_0_folded_scalar(row.bytes(), a, &mut portable);
                        } else {
                            rows::axpy(*row, a, &mut want);
                            portable.clone_from(&want);
                        }
                    }
                    let what = format!("{ty:?} n={n} rows={k} {start:?}");
                    assert!(same_bits(&got, &want), "{what}");
                    assert!(same_bits(&portable, &want), "{what} (portable)");
                }
            }
        }
    }
}

proptest! {
    #[test]
    fn folded_q8_0_axpy_is_within_one_rounding_of_the_exact_one(
        seed in 0u64..1_000_000,
        blocks in 1usize..12,
        alpha in -8.0f32..8.0,
    ) {
        // Folding the scale changes each term by the rounding of `alpha * d` (2^-24 relative)
        // on top of the exact path's one rounding per fused multiply-add.
        let mut rng = Rng::new(seed);
        let n = 32 * blocks;
        let w = Weights::random(&mut rng, RowType::Q8_0, n, 4, 0.7);
        let m = w.matrix();
        let all = [m.row(0), m.row(1), m.row(2), m.row(3)];
        let alphas = [alpha, -0.5 * alpha, 1.3, -2.1];
        let y0 = rng.normals(n, 1.0);
        let mut folded = y0.clone();
        rows::axpy_folded(&all, &alphas, &mut folded, rows::Start::Accumulate);
        let mut exact = y0.clone();
        rows::axpy4(all, alphas, &mut exact);
        for e in 0..n {
            let mag: f64 = f64::from(y0[e]).abs()
                + (0..4).map(|j| (f64::from(alphas[j]) * w.row_f64(j).nth(e).unwrap()).abs()).sum::<f64>();
            let diff = (f64::from(folded[e]) - f64::from(exact[e])).abs();
            prop_assert!(diff <= 8.0 * f64::from(f32::EPSILON) * mag, "element {e}: {diff} vs {mag}");
        }
    }
}
