//! Row kernels: the SIMD versions against the scalar reference and float64 on odd lengths, and
//! quantized rows (through ggml's traits) against float64 on the dequantized weights.

mod ffn_helpers;

use ffn_helpers::{Rng, Weights};
use proptest::prelude::*;
use spark_backend::arch::{self, Isa, Kernels};
use spark_backend::rows::{self, Activation, Row, RowType};

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
fn check_float_kernels(k: &Kernels, w: &[f32], x: &[f32], alpha: f32) {
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
        // SAFETY: the kernels come from `arch::table` (features detected), and the row holds
        // n elements.
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
    let kernels = available_tables();
    for &n in &LENGTHS {
        let w = rng.normals(n, 1.0);
        let x = rng.normals(n, 2.0);
        for k in &kernels {
            check_float_kernels(k, &w, &x, -0.75);
        }
    }
}

/// Every kernel table the running CPU has, the generic one first.
fn available_tables() -> Vec<&'static Kernels> {
    Isa::available()
        .into_iter()
        .map(|isa| arch::table(isa).expect("available ISA has a table"))
        .collect()
}

#[test]
fn simd_axpy_equals_generic_bit_for_bit_on_any_slice() {
    // Every version uses one fused multiply-add per element, so tiling an output across
    // threads at any boundary cannot change a result.
    let generic = arch::table(Isa::Generic).unwrap();
    let mut rng = Rng::new(2);
    let n = 2304;
    let w = rng.normals(n, 1.0);
    for k in available_tables() {
        for ty in [RowType::F32, RowType::F16, RowType::Bf16] {
            let bytes = encode(ty, &w);
            let (a, s) = match ty {
                RowType::F32 => (k.axpy_f32, generic.axpy_f32),
                RowType::F16 => (k.axpy_f16, generic.axpy_f16),
                _ => (k.axpy_bf16, generic.axpy_bf16),
            };
            for start in [0usize, 1, 5, 16, 333] {
                let esz = if ty == RowType::F32 { 4 } else { 2 };
                let y0 = rng.normals(n - start, 1.0);
                let (mut y1, mut y2) = (y0.clone(), y0.clone());
                // SAFETY: features detected by `arch::table`; the row slice holds n - start
                // elements.
                unsafe {
                    a(&bytes[start * esz..], 0.3, &mut y1);
                    s(&bytes[start * esz..], 0.3, &mut y2);
                }
                assert_eq!(y1, y2, "{:?} {ty:?} start {start}", k.isa);
            }
        }
    }
}

#[test]
fn every_tables_quantized_kernels_equal_the_generic_ones_bit_for_bit() {
    // q8_0, q4_0 and q6_K: axpy, dequantization, the four-row axpy and the folded axpy (1 to 4
    // rows, both starts) of every table against the generic table (ggml's `to_float`, then one
    // FMA per element; the folded arithmetic row by row), on lengths of 1 to 72 blocks.
    let generic = arch::table(Isa::Generic).unwrap();
    let mut rng = Rng::new(17);
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    for k in available_tables() {
        for ty in [RowType::Q8_0, RowType::Q4_0, RowType::Q6K] {
            for blocks in [1usize, 3, 9, 72] {
                let n = ty.block_elems() * blocks;
                let w = Weights::random(&mut rng, ty, n, 4, 0.7);
                let m = w.matrix();
                let rows4 = [0, 1, 2, 3].map(|j| m.row(j).bytes());
                let y0 = rng.normals(n, 1.0);
                let what = format!("{:?} {ty:?} n={n}", k.isa);
                let (axpy, to_f32, g_axpy, g_to_f32) = match ty {
                    RowType::Q8_0 => (
                        k.axpy_q8_0,
                        k.to_f32_q8_0,
                        generic.axpy_q8_0,
                        generic.to_f32_q8_0,
                    ),
                    RowType::Q4_0 => (
                        k.axpy_q4_0,
                        k.to_f32_q4_0,
                        generic.axpy_q4_0,
                        generic.to_f32_q4_0,
                    ),
                    _ => (
                        k.axpy_q6_k,
                        k.to_f32_q6_k,
                        generic.axpy_q6_k,
                        generic.to_f32_q6_k,
                    ),
                };
                let (mut got, mut want) = (y0.clone(), y0.clone());
                // SAFETY: both tables' features were detected; every row holds n elements of ty.
                unsafe {
                    axpy(rows4[0], -0.37, &mut got);
                    g_axpy(rows4[0], -0.37, &mut want);
                }
                assert!(same(&got, &want), "{what} axpy");
                let (mut got, mut want) = (vec![0f32; n], vec![0f32; n]);
                // SAFETY: as above.
                unsafe {
                    to_f32(rows4[1], &mut got);
                    g_to_f32(rows4[1], &mut want);
                }
                assert!(same(&got, &want), "{what} to_f32");
                if ty != RowType::Q8_0 {
                    continue;
                }
                let alphas = [0.31f32, -1.7, 2.5e-3, 0.0];
                let (mut got, mut want) = (y0.clone(), y0.clone());
                // SAFETY: as above.
                unsafe {
                    (k.axpy4_q8_0)(rows4, alphas, &mut got);
                    (generic.axpy4_q8_0)(rows4, alphas, &mut want);
                }
                assert!(same(&got, &want), "{what} axpy4");
                for r in 1..=4 {
                    for start in [rows::Start::Accumulate, rows::Start::Zero] {
                        let mut got = match start {
                            rows::Start::Zero => vec![f32::NAN; n],
                            rows::Start::Accumulate => y0.clone(),
                        };
                        let mut want = y0.clone();
                        // SAFETY: as above.
                        unsafe {
                            (k.axpy_q8_0_folded)(&rows4[..r], &alphas[..r], &mut got, start);
                            (generic.axpy_q8_0_folded)(&rows4[..r], &alphas[..r], &mut want, start);
                        }
                        assert!(same(&got, &want), "{what} folded rows={r} {start:?}");
                    }
                }
            }
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
        for k in available_tables() {
            check_float_kernels(k, &w, &x, alpha);
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
    // 20 is iq4_nl, which ggml dequantizes: a row type since the generic path; q8_K (15, an
    // activation-only type without `to_float`) and ids beyond ggml's table are not.
    assert_eq!(RowType::from_ggml(20), Some(RowType::Iq4Nl));
    assert_eq!(RowType::from_ggml(15), None);
    assert_eq!(RowType::from_ggml(1000), None);
    assert!(a.prepare(RowType::Iq4Xs, &[0.0; 100]).is_err());
    assert!(a.prepare(RowType::Iq4Nl, &[0.0; 48]).is_err());
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
    // D. q8_0 against the definition above (the process's table; every table equals the
    // generic one, tested above); other types against one exact `axpy` per row.
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
                    for (row, &a) in all[..k].iter().zip(&alphas) {
                        if ty == RowType::Q8_0 {
                            folded_q8_0_reference(row.bytes(), a, &mut want);
                        } else {
                            rows::axpy(*row, a, &mut want);
                        }
                    }
                    let what = format!("{ty:?} n={n} rows={k} {start:?}");
                    assert!(same_bits(&got, &want), "{what}");
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

/// ggml's own dequantizer of `ty` (`ggml_get_type_traits(ty)->to_float`, called directly, not
/// through the crate's traits table) on a row of `n` elements.
fn ggml_to_float(ty: RowType, bytes: &[u8], n: usize) -> Vec<f32> {
    use llama_cpp_sys_2 as sys;
    // SAFETY: a valid type id; ggml returns a pointer into its static table.
    let traits = unsafe { &*sys::ggml_get_type_traits(ty.ggml()) };
    let to_float = traits
        .to_float
        .expect("ggml dequantizes every quantized RowType");
    // SAFETY: ggml's own row size for n elements of ty.
    let need = unsafe { sys::ggml_row_size(ty.ggml(), n as i64) };
    assert!(bytes.len() >= need, "{ty:?}: short row");
    let mut out = vec![0f32; n];
    // SAFETY: `bytes` holds the row's `need` bytes and `out` n floats.
    unsafe { to_float(bytes.as_ptr().cast(), out.as_mut_ptr(), n as i64) };
    out
}

/// Elements per block of the activation type ggml's CPU `vec_dot` of `ty` rows reads.
fn vec_dot_block(ty: RowType) -> usize {
    use llama_cpp_sys_2 as sys;
    // SAFETY: plain queries of ggml's static type-traits tables for valid ids.
    unsafe {
        let cpu = &*sys::ggml_get_type_traits_cpu(ty.ggml());
        sys::ggml_blck_size(cpu.vec_dot_type) as usize
    }
}

/// `x` as ggml's `vec_dot` of `ty` rows sees it: quantized by ggml's CPU `from_float` of the
/// row type's `vec_dot_type` (q8_0, q8_1 or q8_K), then decoded value by value (`d * q`; q8_0
/// through ggml's `to_float`, q8_1 and q8_K, which have none, from their block layouts:
/// `{f16 d, f16 s, i8 q[32]}` and `{f32 d, i8 q[256], i16 bsums[16]}`, sizes checked).
fn activation_as_vec_dot_reads_it(ty: RowType, x: &[f32]) -> Vec<f64> {
    use llama_cpp_sys_2 as sys;
    let n = x.len();
    // SAFETY: plain queries of ggml's static type-traits tables for valid ids.
    let (vt, from_float, be, bb) = unsafe {
        let vt = (*sys::ggml_get_type_traits_cpu(ty.ggml())).vec_dot_type;
        let from_float = (*sys::ggml_get_type_traits_cpu(vt)).from_float.unwrap();
        (
            vt,
            from_float,
            sys::ggml_blck_size(vt) as usize,
            sys::ggml_type_size(vt),
        )
    };
    let mut q = vec![0u8; n / be * bb];
    // SAFETY: n is whole blocks of `vt` (the caller's lengths); q holds their bytes.
    unsafe { from_float(x.as_ptr(), q.as_mut_ptr().cast(), n as i64) };
    fn int8(b: &[u8], at: usize, be: usize) -> impl Iterator<Item = f64> + '_ {
        b[at..at + be].iter().map(|&v| f64::from(v as i8))
    }
    match vt {
        sys::GGML_TYPE_Q8_0 => {
            let mut out = vec![0f32; n];
            // SAFETY: ggml dequantizes q8_0; q holds n elements.
            unsafe {
                let tf = (*sys::ggml_get_type_traits(vt)).to_float.unwrap();
                tf(q.as_ptr().cast(), out.as_mut_ptr(), n as i64);
            }
            out.into_iter().map(f64::from).collect()
        }
        sys::GGML_TYPE_Q8_1 => {
            assert_eq!((be, bb), (32, 36));
            q.chunks_exact(bb)
                .flat_map(|b| {
                    let d = f64::from(half::f16::from_le_bytes([b[0], b[1]]).to_f32());
                    int8(b, 4, be).map(move |v| d * v)
                })
                .collect()
        }
        sys::GGML_TYPE_Q8_K => {
            assert_eq!((be, bb), (256, 4 + 256 + 32));
            q.chunks_exact(bb)
                .flat_map(|b| {
                    let d = f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                    int8(b, 4, be).map(move |v| d * v)
                })
                .collect()
        }
        other => panic!("{ty:?}: unexpected vec_dot_type {other}"),
    }
}

/// Every id ggml can dequantize (a `to_float` in its type traits, or f32 itself, with a block
/// size) is a row type, and no other id is; each of them has the CPU `vec_dot` and activation
/// quantizer the generic path calls, so preparing an activation for it succeeds.
#[test]
fn every_type_ggml_dequantizes_is_a_row_type_and_no_other() {
    use llama_cpp_sys_2 as sys;
    let mut supported = 0;
    for id in 0..sys::GGML_TYPE_COUNT + 3 {
        let dequantizable = id < sys::GGML_TYPE_COUNT && {
            // SAFETY: an id below GGML_TYPE_COUNT indexes ggml's static table.
            let t = unsafe { &*sys::ggml_get_type_traits(id) };
            t.blck_size > 0 && (id == sys::GGML_TYPE_F32 || t.to_float.is_some())
        };
        let ty = RowType::from_ggml(id);
        assert_eq!(ty.is_some(), dequantizable, "ggml type {id}");
        let Some(ty) = ty else { continue };
        supported += 1;
        let n = 2 * ty.block_elems().max(vec_dot_block(ty));
        let mut act = Activation::new();
        act.prepare(ty, &vec![0.5; n])
            .unwrap_or_else(|e| panic!("{ty:?}: {e}"));
    }
    assert_eq!(supported, RowType::ALL.len());
}

/// The generic path (every quantized type: ggml's `vec_dot` against the quantized activation;
/// `axpy` and `to_f32` through ggml's `to_float`) against ggml's dequantizer called directly
/// and float64 arithmetic, on one to nine blocks. The IQ types that need an importance matrix
/// to quantize get a uniform one (`quantize_rows`).
#[test]
fn every_quantized_type_matches_ggml_dequantize_and_float64() {
    let mut rng = Rng::new(41);
    for ty in RowType::quantized() {
        let act_block = vec_dot_block(ty);
        let be = ty.block_elems().max(act_block);
        for blocks in [1usize, 2, 9] {
            let n = be * blocks;
            let raw = rng.normals(3 * n, 0.4);
            let bytes = rows::quant::quantize_rows(ty, &raw, n).unwrap();
            let m = rows::RowMatrix::packed(ty, n, 3, &bytes).unwrap();
            let x = rng.normals(n, 1.0);
            let mut act = Activation::new();
            act.prepare(ty, &x).unwrap();
            for j in 0..3 {
                let what = format!("{ty:?} n={n} row {j}");
                let row = m.row(j);
                let reference = ggml_to_float(ty, row.bytes(), n);
                assert!(
                    reference.iter().all(|v| v.is_finite()) && reference.iter().any(|&v| v != 0.0),
                    "{what}: degenerate quantization"
                );
                let mut ours = vec![0f32; n];
                rows::to_f32(row, &mut ours);
                assert!(same_bits(&ours, &reference), "{what}: to_f32");

                let wd: Vec<f64> = reference.iter().map(|&v| f64::from(v)).collect();
                let exact: f64 = wd.iter().zip(&x).map(|(a, &b)| a * f64::from(b)).sum();
                let got = rows::dot(row, &act);
                let bound = act_quant_bound(&wd, &x, act_block.min(n));
                assert!(
                    (f64::from(got) - exact).abs() <= bound,
                    "{what}: dot {got} vs {exact} (bound {bound})"
                );
                // And sharply: the same dot on the activation as ggml quantizes it, to f32
                // rounding.
                let xq = activation_as_vec_dot_reads_it(ty, &x);
                let exact_q: f64 = wd.iter().zip(&xq).map(|(a, b)| a * b).sum();
                let mag_q: f64 = wd.iter().zip(&xq).map(|(a, b)| (a * b).abs()).sum();
                // q4_1 / q5_1 rows (q8_1 activations) add their block minimum times the
                // block's activation sum, which q8_1 stores as f16 (2^-11 relative).
                let f16_sums: f64 = if act_block == 32 && ty.block_bytes() > 18 {
                    wd.chunks(32)
                        .zip(xq.chunks(32))
                        .map(|(w, x)| {
                            let wmax = w.iter().fold(0f64, |m, v| m.max(v.abs()));
                            wmax * x.iter().sum::<f64>().abs() / 2048.0
                        })
                        .sum()
                } else {
                    0.0
                };
                assert!(
                    (f64::from(got) - exact_q).abs() <= 1e-5 * mag_q + f16_sums,
                    "{what}: dot {got} vs {exact_q} on the quantized activation (sum of |terms| {mag_q})"
                );

                let y0 = rng.normals(n, 1.0);
                let mut y = y0.clone();
                rows::axpy(row, -0.8, &mut y);
                for i in 0..n {
                    let want = f64::from(y0[i]) - 0.8 * wd[i];
                    let scale = f64::from(y0[i]).abs() + (0.8 * wd[i]).abs();
                    assert!(
                        (f64::from(y[i]) - want).abs() <= 1e-6 * scale + 1e-30,
                        "{what}: axpy element {i}"
                    );
                }
            }
        }
    }
}
