//! The CUDA launchers' validation (`spark_backend::ffn::cuda_plan`): a pure function of tensor
//! metadata, run here on host tensors. It accepts what the CPU ops accept for the weight types
//! the kernels read and rejects the rest with the CPU ops' wording; with the `cuda` feature, a
//! launcher called with bad inputs reports the op's one line and returns non-zero without a
//! CUDA call (no driver here) and without touching the tensors.

mod ffn_helpers;

use ffn_helpers::{op_case, OpCase, Rng, Weights};
use llama_cpp_sys_2 as sys;
use spark_backend::ffn::cpu_ops::{spark_ffn_down, spark_ffn_fused, spark_ffn_sum, spark_ffn_up};
use spark_backend::ffn::cuda_plan as check;
use spark_backend::params::OpParams;
use spark_backend::rows::RowType;
use spark_backend::topk::{norm_ppf, Cutoff};
use spark_backend::KernelError;
use std::ffi::c_void;

const D: usize = 768;
const R: usize = 256;
const F: usize = 96;
const T: usize = 3;

fn case(ty: RowType) -> OpCase {
    op_case(&mut Rng::new(7), ty, D, R, F, T, 10, 3).0
}

fn scores(c: &OpCase) -> *mut sys::ggml_tensor {
    c.ggml.f32_tensor(F, T, &vec![0.5; F * T])
}

fn params(c: &OpCase) -> *const c_void {
    (&*c.params as *const OpParams).cast()
}

fn fused_dst(c: &OpCase, v: *mut sys::ggml_tensor, p: usize) -> *mut sys::ggml_tensor {
    let s = scores(c);
    c.ggml.custom(
        &[D, T, p],
        &mut [s, c.h, c.k2, v],
        spark_ffn_fused,
        &*c.params,
    )
}

#[test]
fn good_ffn_calls_give_plans_with_the_tensors_addresses_and_shapes() {
    for ty in [
        RowType::Q8_0,
        RowType::F16,
        RowType::Q4K,
        RowType::Q6K,
        RowType::Bf16,
    ] {
        let c = case(ty);
        let dst = fused_dst(&c, c.v, 16);
        // SAFETY: live tensors of c's context; params is a spark_ffn_params.
        let plan =
            unsafe { check::fused(dst, params(&c)) }.unwrap_or_else(|e| panic!("{ty:?}: {e}"));
        assert_eq!(
            (plan.stage.f, plan.stage.d, plan.stage.n_tokens, plan.p),
            (F, D, T, 16)
        );
        assert_eq!(
            (plan.stage.cutoff, plan.stage.layer, plan.stage.r_f()),
            (Cutoff::TopK(10), 3, R)
        );
        // SAFETY: live tensors.
        unsafe {
            assert_eq!(plan.out, (*dst).data as u64);
            assert_eq!(plan.stage.h, (*c.h).data as u64);
            assert_eq!(plan.v.ptr, (*c.v).data as u64);
            assert_eq!(plan.v.row_stride, (*c.v).nb[1] as u64);
            assert_eq!(plan.stage.k2.ptr, (*c.k2).data as u64);
        }
        assert_eq!((plan.v.ty, plan.v.cols, plan.v.rows), (ty.ggml(), D, F));
        assert!(!plan.stage.dense());

        let s = scores(&c);
        let u = c
            .ggml
            .custom(&[T, F], &mut [s, c.h, c.k2], spark_ffn_up, &*c.params);
        // SAFETY: as above.
        let up = unsafe { check::up(u, params(&c)) }.unwrap();
        assert_eq!(up.stage, plan.stage.clone_with_scores(s));
        let out = c
            .ggml
            .custom(&[D, T], &mut [u, c.v], spark_ffn_down, &*c.params);
        // SAFETY: as above.
        let down = unsafe { check::down(out) }.unwrap();
        assert_eq!((down.n_tokens, down.out_row, down.v), (T, D, plan.v));
        let sum = c
            .ggml
            .custom(&[D, T], &mut [dst], spark_ffn_sum, std::ptr::null());
        // SAFETY: as above.
        let sp = unsafe { check::sum(sum) }.unwrap();
        assert_eq!((sp.d, sp.n_tokens, sp.p, sp.out_row), (D, T, 16, D));
    }
}

/// The threshold kernel gets z from the host: Q(1 - k/F) for the top-k cutoff, the std
/// multiplier as given for Gemma 3n's (never dense, k unused); and K2 may span all of h
/// (r_f = 0), which the up kernel gets as its offset into h.
#[test]
fn the_plans_pass_the_cutoffs_z_and_accept_k2_over_all_of_h() {
    use check::Arg;
    let c = case(RowType::Q8_0);
    let threshold_args = |plan: &check::StagePlan| -> (Vec<Arg>, Vec<Arg>) {
        let up = check::UpPlan {
            stage: *plan,
            out: 1 << 30,
        };
        let l = up.launches(1 << 20).unwrap();
        assert_eq!(
            l.iter().map(|l| l.kernel).collect::<Vec<_>>(),
            [check::FfnKernel::Threshold, check::FfnKernel::Up]
        );
        (l[0].args.clone(), l[1].args.clone())
    };
    // top-k (the case's k = 10 of F = 96)
    let dst = fused_dst(&c, c.v, 16);
    // SAFETY: live tensors of c's context; params is a spark_op_params.
    let plan = unsafe { check::fused(dst, params(&c)) }.unwrap();
    let q = norm_ppf(1.0 - 10.0 / F as f64);
    assert_eq!(plan.stage.z(), q);
    let (th, up) = threshold_args(&plan.stage);
    assert_eq!(&th[1..4], &[Arg::I32(F as i32), Arg::I32(0), Arg::F64(q)]);
    assert_eq!(up[7], Arg::I32(R as i32), "r_f");
    assert_eq!(up[11], Arg::I32((D - R) as i32), "K2 columns");
    // dense top-k: z unused (0), the dense flag set
    let dense = ffn_helpers::op_params(3, Cutoff::TopK(F));
    // SAFETY: as above.
    let plan = unsafe { check::fused(dst, (&dense as *const OpParams).cast()) }.unwrap();
    assert!(plan.stage.dense());
    let (th, _) = threshold_args(&plan.stage);
    assert_eq!(&th[2..4], &[Arg::I32(1), Arg::F64(0.0)]);
    // Gemma 3n: the std multiplier, K2 [D, F] over all of h
    let z = f64::from(ffn_helpers::GEMMA3N_STD_MUL);
    let gemma = ffn_helpers::op_params(4, Cutoff::StdMul(z));
    let mut rng = Rng::new(11);
    let k2w = Weights::random(&mut rng, RowType::Q8_0, D, F, 0.3);
    let k2 = c.ggml.tensor(RowType::Q8_0, D, F, &k2w.bytes);
    let s = scores(&c);
    let fused = c
        .ggml
        .custom(&[D, T, 16], &mut [s, c.h, k2, c.v], spark_ffn_fused, &gemma);
    let u = c
        .ggml
        .custom(&[T, F], &mut [s, c.h, k2], spark_ffn_up, &gemma);
    let ud = (&gemma as *const OpParams).cast();
    // SAFETY: live tensors of c's context; ud is a spark_op_params.
    let (fp, up_plan) = unsafe { (check::fused(fused, ud), check::up(u, ud)) };
    let (fp, up_plan) = (fp.unwrap(), up_plan.unwrap());
    assert_eq!(up_plan.stage, fp.stage);
    let st = fp.stage;
    assert_eq!(
        (
            st.cutoff,
            st.layer,
            st.r_f(),
            st.k2.cols,
            st.dense(),
            st.z()
        ),
        (Cutoff::StdMul(z), 4, 0, D, false, z)
    );
    let (th, up) = threshold_args(&st);
    assert_eq!(&th[1..4], &[Arg::I32(F as i32), Arg::I32(0), Arg::F64(z)]);
    assert_eq!(
        (up[4], up[7], up[11]),
        (Arg::I32(0), Arg::I32(0), Arg::I32(D as i32))
    );
    // K2 wider than h is still refused
    let wide = c
        .ggml
        .tensor(RowType::Q8_0, D + 32, F, &vec![0u8; 34 * (D + 32) / 32 * F]);
    let bad = c
        .ggml
        .custom(&[T, F], &mut [s, c.h, wide], spark_ffn_up, &gemma);
    // SAFETY: as above.
    let e = unsafe { check::up(bad, ud) }.expect_err("K2 wider than h");
    assert_eq!(
        e.to_string(),
        format!(
            "shape mismatch: ffn_up width {} not in (0, D = {D}]",
            D + 32
        )
    );
}

/// StagePlan equality modulo the scores tensor (each call above makes its own).
trait WithScores {
    fn clone_with_scores(&self, s: *mut sys::ggml_tensor) -> Self;
}

impl WithScores for check::StagePlan {
    fn clone_with_scores(&self, s: *mut sys::ggml_tensor) -> Self {
        // SAFETY: a live tensor.
        let data = unsafe { (*s).data } as u64;
        check::StagePlan { s: data, ..*self }
    }
}

fn fused_err(dst: *mut sys::ggml_tensor, userdata: *const c_void) -> KernelError {
    // SAFETY: live tensors; userdata null or a spark_ffn_params.
    unsafe { check::fused(dst, userdata) }.expect_err("must be rejected")
}

#[test]
fn bad_ffn_calls_are_rejected_from_metadata() {
    let c = case(RowType::Q8_0);
    let good = fused_dst(&c, c.v, 16);
    // null userdata, k = 0
    assert!(matches!(
        fused_err(good, std::ptr::null()),
        KernelError::Param(_)
    ));
    let zero_k = OpParams {
        layer: 3,
        k: 0,
        ..Default::default()
    };
    let e = fused_err(good, (&zero_k as *const OpParams).cast());
    assert_eq!(e.to_string(), "invalid parameter: k = 0 (must be >= 1)");
    // an unknown cutoff, a non-finite std multiplier: the CPU ops' lines
    let unknown = OpParams {
        ffn_cutoff: 9,
        ..zero_k
    };
    let e = fused_err(good, (&unknown as *const OpParams).cast());
    assert_eq!(
        e.to_string(),
        "invalid parameter: ffn_cutoff = 9 (must be 0 = SPARK_FFN_CUTOFF_TOP_K or \
         1 = SPARK_FFN_CUTOFF_STD_MUL)"
    );
    let nan_z = ffn_helpers::op_params(3, Cutoff::StdMul(f64::NAN));
    let e = fused_err(good, (&nan_z as *const OpParams).cast());
    assert_eq!(
        e.to_string(),
        "invalid parameter: ffn_z = NaN (must be finite with SPARK_FFN_CUTOFF_STD_MUL)"
    );
    // a weight type the kernels do not read (q2_K: the CPU op reads it, the GPU does not)
    let mut rng = Rng::new(3);
    let q2 = Weights::random(&mut rng, RowType::Q2K, D, F, 0.3);
    let v_q2 = c.ggml.tensor(RowType::Q2K, D, F, &q2.bytes);
    let e = fused_err(fused_dst(&c, v_q2, 16), params(&c));
    assert_eq!(
        e,
        KernelError::UnsupportedType {
            tensor: "ffn_down_t",
            ty: RowType::Q2K.ggml()
        }
    );
    // V with the wrong number of neurons, P > F, a null dst
    let v_short = c
        .ggml
        .tensor(RowType::Q8_0, D, F - 1, &vec![0u8; 34 * D / 32 * (F - 1)]);
    assert!(matches!(
        fused_err(fused_dst(&c, v_short, 16), params(&c)),
        KernelError::Shape(_)
    ));
    assert!(matches!(
        fused_err(fused_dst(&c, c.v, F + 1), params(&c)),
        KernelError::Shape(_)
    ));
    assert!(matches!(
        fused_err(std::ptr::null_mut(), params(&c)),
        KernelError::Shape(_)
    ));
    // a transposed (non-packed) V view
    // SAFETY: a live tensor of c's context.
    let vt = unsafe { sys::ggml_transpose(c.ggml.ctx, c.v) };
    assert!(fused_err(fused_dst(&c, vt, 16), params(&c))
        .to_string()
        .contains("ffn_down_t"));
}

/// The CUDA kernels read f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K and q6_K
/// weights. Every other type the CPU ops take (q2_K, q3_K, the IQ family, the ternary and FP4
/// types, ...) is refused from metadata, in K2 or in V, with an error naming the tensor and
/// the type; the launcher then reports that line and fills dst with NaN (patch 0008's
/// `supports_op` accepts a custom node by its function, not by its weights' types, so ggml
/// cannot hand such a node back to the CPU: `--dense` or weights left on the CPU run those
/// files).
#[test]
fn weight_types_the_kernels_do_not_read_are_refused_by_name() {
    let gpu = [
        RowType::F32,
        RowType::F16,
        RowType::Bf16,
        RowType::Q8_0,
        RowType::Q4_0,
        RowType::Q4_1,
        RowType::Q5_0,
        RowType::Q5_1,
        RowType::Q4K,
        RowType::Q5K,
        RowType::Q6K,
    ];
    let c = case(RowType::Q8_0);
    for ty in RowType::ALL {
        // Metadata is all the checks read: zero bytes of the right size will do.
        let zeros = |cols: usize| vec![0u8; ty.row_bytes(cols).unwrap() * F];
        let k2 = c.ggml.tensor(ty, D - R, F, &zeros(D - R));
        let v = c.ggml.tensor(ty, D, F, &zeros(D));
        for (k2, v, name) in [(c.k2, v, "ffn_down_t"), (k2, c.v, "ffn_up")] {
            let s = scores(&c);
            let dst = c.ggml.custom(
                &[D, T, 16],
                &mut [s, c.h, k2, v],
                spark_ffn_fused,
                &*c.params,
            );
            // SAFETY: live tensors of c's context; params is a spark_ffn_params.
            let got = unsafe { check::fused(dst, params(&c)) };
            if gpu.contains(&ty) {
                got.unwrap_or_else(|e| panic!("{ty:?} {name}: {e}"));
            } else {
                let e = got.expect_err("must be refused");
                assert_eq!(
                    e,
                    KernelError::UnsupportedType {
                        tensor: name,
                        ty: ty.ggml()
                    },
                    "{ty:?}"
                );
                assert_eq!(
                    e.to_string(),
                    format!(
                        "{name}: unsupported type {} (ggml type {})",
                        ty.name(),
                        ty.ggml()
                    )
                );
            }
        }
    }
}

#[cfg(feature = "cuda")]
#[test]
fn a_launcher_given_bad_inputs_reports_the_ops_line_and_fails_without_cuda() {
    use spark_backend::cpu_op::fault;
    use spark_backend::registry::LAUNCHERS;
    let c = case(RowType::Q8_0);
    let dst = fused_dst(&c, c.v, 16);
    let n = D * T * 16;
    // SAFETY: dst holds n f32 values on the host.
    let host = |dst: *mut sys::ggml_tensor| unsafe {
        std::slice::from_raw_parts_mut((*dst).data.cast::<f32>(), n)
    };
    host(dst).fill(1234.5);
    let zero_k = OpParams {
        layer: 5,
        k: 0,
        ..Default::default()
    };
    let fused = LAUNCHERS
        .iter()
        .find(|l| l.name == "spark_ffn_fused")
        .unwrap();
    let before = fault::reports().len();
    let stored = spark_backend::params::OpParams {
        layer: zero_k.layer,
        k: zero_k.k,
        ..Default::default()
    };
    // SAFETY: dst is a live node that no thread computes.
    unsafe { spark_backend::params::store(dst, &stored) };
    // SAFETY: a live custom-op tensor carrying its params; the launcher validates before any
    // CUDA call and this machine has no driver, so nothing is enqueued or written. ggml-cuda's
    // userdata is not read.
    let rc = unsafe { (fused.launch)(dst, 0, std::ptr::null_mut(), std::ptr::null_mut()) };
    assert_ne!(rc, 0);
    let lines = fault::reports();
    assert!(
        lines[before..].contains(
            &"spark-backend: spark_ffn_fused: layer 5: invalid parameter: k = 0 (must be >= 1); \
              output set to NaN"
                .to_string()
        ),
        "{:?}",
        &lines[before..]
    );
    if spark_backend::cuda::driver::libraries().is_err() {
        assert!(
            host(dst).iter().all(|&x| x == 1234.5),
            "the host tensor was written"
        );
    }
    // no parameters in the node: `layer ?`
    let bare = c.ggml.custom(
        &[D, T, 16],
        &mut [scores(&c), c.h, c.k2, c.v],
        spark_ffn_fused,
        std::ptr::null(),
    );
    let before = fault::reports().len();
    // SAFETY: as above.
    let rc = unsafe { (fused.launch)(bare, 0, std::ptr::null_mut(), std::ptr::null_mut()) };
    assert_ne!(rc, 0);
    // (the report list is the process's: tests running beside this one add to it too)
    assert!(fault::reports()[before..]
        .iter()
        .any(|l| l.starts_with("spark-backend: spark_ffn_fused: layer ?: invalid parameter")));
}

#[cfg(feature = "cuda")]
#[test]
fn a_launcher_refuses_tensors_that_reach_past_the_address_space_before_any_plan() {
    // The CPU entry's first check, for the CUDA launchers too (an RPC client chooses ne and nb,
    // and ggml_nbytes wraps): a dst of 64 x 2^32 rows at a stride of 2^40 is refused, not
    // written, and nothing is enqueued.
    use spark_backend::cpu_op::fault;
    use spark_backend::registry::LAUNCHERS;
    let c = case(RowType::Q8_0);
    let dst = fused_dst(&c, c.v, 16);
    let stored = spark_backend::params::OpParams {
        layer: 3,
        k: 4,
        ..Default::default()
    };
    // SAFETY: dst is a live node that no thread computes; only its metadata is changed, and
    // the launcher refuses it before reading any data.
    unsafe {
        spark_backend::params::store(dst, &stored);
        (*dst).ne[1] = 1 << 32;
        (*dst).nb[1] = 1 << 40;
    }
    let fused = LAUNCHERS
        .iter()
        .find(|l| l.name == "spark_ffn_fused")
        .unwrap();
    let before = fault::reports().len();
    // SAFETY: a live custom-op tensor carrying its params; the launcher refuses it from its
    // metadata before any CUDA call.
    let rc = unsafe { (fused.launch)(dst, 0, std::ptr::null_mut(), std::ptr::null_mut()) };
    assert_ne!(rc, 0);
    // (the report list is the process's: tests running beside this one add to it too)
    let lines = fault::reports();
    assert!(
        lines[before..].iter().any(|line| line
            .starts_with("spark-backend: spark_ffn_fused: layer 3: dst: ne ")
            && line.contains("span more than the address space")
            && line.ends_with("; output not written")),
        "{:?}",
        &lines[before..]
    );
}

/// A decode step's FFN on the GPU at Spark Gemma-2 2B's shapes (D 2304, F 13824, r_f 1024,
/// q8_0; the graph's 16 chunks, or CUDA's one with the chunks added inside) and 9B's (D 3584,
/// F 21504, r_f 1536): two kernels, select-up and gather (then the sum node with 16), each
/// launching at least twice an H100's / H200's 132 SMs in blocks for one token (the issue's
/// budget: every kernel that moves more than 1 MB on at least 2 x SM-count blocks). Eight
/// tokens (the decode path's most) take the same two kernels.
#[test]
fn decode_ffn_is_two_kernels_of_at_least_two_blocks_per_h100_sm() {
    const SMS: u32 = 132;
    for (d, f, r_f) in [(2304, 13824, 1024), (3584, 21504, 1536)] {
        for n_tokens in [1, check::SPARSE_MAX_TOKENS] {
            let weight = |rows, cols| check::GpuWeight {
                ty: RowType::Q8_0.ggml(),
                ptr: 1 << 32,
                row_stride: (cols / 32 * 34) as u64,
                cols,
                rows,
            };
            for p in [16, 1] {
                let plan = check::FusedPlan {
                    stage: check::StagePlan {
                        layer: 0,
                        cutoff: Cutoff::TopK(f * 8 / 100),
                        f,
                        d,
                        n_tokens,
                        s: 1 << 20,
                        h: 1 << 24,
                        h_stride: 4 * d as u64,
                        k2: weight(f, d - r_f),
                    },
                    v: weight(f, d),
                    p,
                    out: 1 << 28,
                };
                let launches = plan.launches(1 << 30).unwrap();
                let kernels: Vec<_> = launches.iter().map(|l| l.kernel).collect();
                assert_eq!(
                    kernels,
                    [check::FfnKernel::SelectUp, check::FfnKernel::Gather]
                );
                for l in &launches {
                    let per_token = l.grid.0 * l.grid.1 * l.grid.2 / n_tokens as u32;
                    assert!(
                        per_token >= 2 * SMS,
                        "{:?} at D {d}: {per_token} blocks per token",
                        l.kernel
                    );
                }
            }
        }
    }
}
