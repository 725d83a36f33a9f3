//! The CUDA `spark_attn` launcher without a GPU: its metadata-only validation
//! (`spark_backend::attention::cuda_plan::check`) accepts what the CPU op accepts and rejects bad calls
//! with the CPU op's wording; the launcher reports the op's one line and returns non-zero
//! without touching the (host) tensors; attn.cu compiles through NVRTC for sm_75/80/90 and has
//! every kernel the plan launches. The kernels' arithmetic is checked on the CPU by
//! tests/cuda_emu.

mod attention_helpers;

use attention_helpers::{build_op, Case, Ctx, Spec, Ty};
use llama_cpp_sys_2 as sys;
use spark_backend::attention::cuda_plan::{self as attn, AttnKernel, AttnPlan, OUTPUT_CHUNKS};
use spark_backend::params::AttnParams;
use spark_backend::KernelError;
use std::ffi::c_void;

fn spec() -> Spec {
    let mut s = Spec::new(8, 4, 4, 2, 3, 37);
    s.k_keep = 4;
    s
}

/// What the op gets as userdata.
#[derive(Clone, Copy)]
enum User {
    /// The spec's parameters.
    Spec,
    /// These parameters.
    Params(AttnParams),
    /// A null pointer.
    Null,
}

/// `check` of the op built from `spec` with `user`, after `mutate` on its arguments.
fn checked(
    spec: Spec,
    user: User,
    mutate: impl FnOnce(&Ctx, &mut [*mut sys::ggml_tensor; 4]),
) -> Result<AttnPlan, KernelError> {
    let ctx = Ctx::new(64 << 20);
    let case = Case::build(spec);
    let mut p = match user {
        User::Params(p) => p,
        _ => spec.params(),
    };
    let user: *mut c_void = match user {
        User::Null => std::ptr::null_mut(),
        _ => (&mut p as *mut AttnParams).cast(),
    };
    let dst = build_op(&ctx, &case, user, |a| mutate(&ctx, a));
    // SAFETY: a live custom-op tensor of ctx with live sources; user is a spark_attn_params.
    unsafe { attn::check(dst, user) }
}

#[test]
fn accepts_the_cpu_ops_layouts() {
    for (k_ty, v_ty, v_t, m_ty) in [
        (Ty::F16, Ty::F16, false, Ty::F32),
        (Ty::F32, Ty::F32, false, Ty::F16),
        (Ty::F16, Ty::F16, true, Ty::F32),
    ] {
        let mut s = spec();
        (s.k_ty, s.v_ty, s.v_transposed, s.mask_ty) = (k_ty, v_ty, v_t, m_ty);
        let plan = checked(s, User::Spec, |_, _| {}).unwrap_or_else(|e| panic!("{s:?}: {e}"));
        let l = &plan.layout;
        assert_eq!(
            (
                l.head_dim,
                l.n_head,
                l.n_head_kv,
                l.n_tokens,
                l.n_kv,
                l.k_keep,
                l.r
            ),
            (8, 4, 2, 3, 37, 4, 4)
        );
        // 12 queries: selection and output in one launch, one block per query and chunk
        let chunks = OUTPUT_CHUNKS as u32;
        let launches = plan.launches(1 << 20).unwrap();
        let kinds: Vec<_> = launches.iter().map(|l| (l.kernel, l.grid)).collect();
        assert_eq!(kinds[1..], [(AttnKernel::SelectOutput, (12, chunks, 1))]);
        assert_eq!(kinds[0].0, AttnKernel::Scores);
        let a = launches[0].args;
        assert_eq!(a.k_vec == 1, k_ty == Ty::F16);
        assert_eq!(a.v_vec != 0, v_ty == Ty::F16 && !v_t);
        assert_eq!(a.chunks as usize, OUTPUT_CHUNKS);
        // more queries than that: one select block per query, then the output
        let mut separate = plan.clone();
        separate.fused_max_queries = 11;
        let launches = separate.launches(1 << 20).unwrap();
        let kinds: Vec<_> = launches.iter().map(|l| (l.kernel, l.grid)).collect();
        assert_eq!(
            kinds[1..],
            [
                (AttnKernel::Select, (12, 1, 1)),
                (AttnKernel::Output, (12, chunks, 1))
            ]
        );
    }
}

#[test]
fn rejects_bad_calls_with_the_cpu_ops_wording() {
    let err = |u: User, m: &dyn Fn(&Ctx, &mut [*mut sys::ggml_tensor; 4])| {
        checked(spec(), u, m).unwrap_err().to_string()
    };
    let base = spec().params();
    let none = |_: &Ctx, _: &mut [*mut sys::ggml_tensor; 4]| {};
    for (p, want) in [
        (AttnParams { k: 0, ..base }, "attention k = 0"),
        (AttnParams { r: 0, ..base }, "attention r = 0"),
        (AttnParams { r: 8, ..base }, "attention r = 8"),
        (
            AttnParams {
                softcap: f32::NAN,
                ..base
            },
            "softcap",
        ),
    ] {
        let e = err(User::Params(p), &none);
        assert!(e.contains(want), "{e}");
    }
    // No parameters.
    let e = err(User::Null, &none);
    assert!(e.contains(spark_backend::params::MISSING), "{e}");
    // A quantized K cache.
    let e = err(User::Spec, &|ctx, a| {
        // SAFETY: a fresh tensor of ctx.
        a[1] = unsafe { sys::ggml_new_tensor_3d(ctx.0, sys::GGML_TYPE_Q8_0, 32, 2, 37) };
    });
    assert!(e.contains("k"), "{e}");
    // A mask with too few rows.
    let e = err(User::Spec, &|ctx, a| {
        // SAFETY: a fresh tensor of ctx.
        a[3] = unsafe { sys::ggml_new_tensor_2d(ctx.0, 0, 37, 2) };
    });
    assert!(e.contains("mask"), "{e}");
    // V with another number of positions.
    let e = err(User::Spec, &|ctx, a| {
        // SAFETY: a fresh tensor of ctx.
        a[2] = unsafe { sys::ggml_new_tensor_3d(ctx.0, 1, 8, 2, 36) };
    });
    assert!(e.contains("v "), "{e}");
    // A missing source.
    let e = err(User::Spec, &|_, a| a[0] = std::ptr::null_mut());
    assert!(e.contains("q"), "{e}");
}

#[test]
fn rejects_what_only_the_gpu_cannot_take() {
    // Head dim above the shared-memory rows of the kernels.
    let mut s = Spec::new(1024, 512, 2, 1, 1, 8);
    s.k_keep = 2;
    let e = checked(s, User::Spec, |_, _| {}).unwrap_err().to_string();
    assert!(e.contains("head dim 1024"), "{e}");
    // An f16 K view at an odd byte offset (fine for the CPU, misaligned for the GPU).
    let e = checked(spec(), User::Spec, |ctx, a| {
        let k = a[1];
        // SAFETY: a view of a live tensor of ctx, one byte in; shapes within the storage.
        a[1] = unsafe {
            let store = sys::ggml_new_tensor_1d(ctx.0, 1, 8 * 2 * 40 + 8);
            sys::ggml_view_3d(ctx.0, store, 8, 2, 37, (*k).nb[1], (*k).nb[2], 1)
        };
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("k: address"), "{e}");
}

#[cfg(feature = "cuda")]
#[test]
fn the_launcher_reports_the_ops_line_and_leaves_the_tensors_alone() {
    use spark_backend::cpu_op::fault;
    use spark_backend::registry::LAUNCHERS;
    let launcher = LAUNCHERS
        .iter()
        .find(|l| l.name == "spark_attn")
        .expect("spark_attn is registered in LAUNCHERS");
    assert_eq!(
        launcher.fun as *const (),
        spark_backend::attention::cpu_op::spark_attn as *const ()
    );
    let ctx = Ctx::new(64 << 20);
    let case = Case::build(spec());
    let mut bad = AttnParams {
        layer: 7,
        k: 0,
        ..spec().params()
    };
    let user: *mut c_void = (&mut bad as *mut AttnParams).cast();
    let dst = build_op(&ctx, &case, user, |_| {});
    let n = 8 * 4 * 3;
    // SAFETY: dst holds n f32 values in host memory.
    let host = || unsafe { std::slice::from_raw_parts_mut((*dst).data.cast::<f32>(), n) };
    host().fill(1234.5);
    let before = fault::reports().len();
    // SAFETY: a live custom-op tensor carrying its params (build_op stores them); the launcher
    // validates before any CUDA call, so nothing is enqueued for this bad call. ggml-cuda's
    // userdata is not read.
    let rc = unsafe { (launcher.launch)(dst, 0, std::ptr::null_mut(), std::ptr::null_mut()) };
    assert_ne!(rc, 0);
    let lines = fault::reports();
    assert!(
        lines[before..].contains(
            &"spark-backend: spark_attn: layer 7: invalid parameter: attention k = 0 (must be >= 1); \
              output set to NaN"
                .to_string()
        ),
        "{:?}",
        &lines[before..]
    );
    if spark_backend::cuda::driver::libraries().is_err() {
        assert!(
            host().iter().all(|&x| x == 1234.5),
            "the host dst was written"
        );
    }
    // No parameters in the node: `layer ?`.
    let bare = build_op(&ctx, &case, std::ptr::null_mut(), |_| {});
    let before = fault::reports().len();
    // SAFETY: as above.
    let rc = unsafe { (launcher.launch)(bare, 0, std::ptr::null_mut(), std::ptr::null_mut()) };
    assert_ne!(rc, 0);
    // (the report list is the process's: tests running beside this one add to it too)
    assert!(fault::reports()[before..]
        .iter()
        .any(|l| l.starts_with("spark-backend: spark_attn: layer ?: invalid parameter")));
}

/// attn.cu is in the kernel table, compiles to CUBIN and PTX for sm_75/80/90 with the run-time
/// options, and defines every kernel the plan launches.
#[cfg(feature = "cuda")]
#[test]
fn attn_cu_compiles_for_sm_75_80_90_with_every_planned_kernel() {
    use spark_backend::cuda::driver::{compile, nvrtc_version};
    use spark_backend::cuda::options::Target;
    use spark_backend::registry::KERNEL_SOURCES;
    nvrtc_version().unwrap_or_else(|e| {
        panic!(
            "needs NVRTC ({e}): source target/cuda-tools/env.sh; LD_LIBRARY_PATH=$SPARK_NVRTC_LIB"
        )
    });
    let src = KERNEL_SOURCES
        .iter()
        .find(|s| s.name == "attn.cu")
        .expect("attn.cu in KERNEL_SOURCES");
    for (major, minor) in [(7, 5), (8, 0), (9, 0)] {
        for cubin in [true, false] {
            let t = Target {
                major,
                minor,
                cubin,
            };
            let image = compile(src, t).unwrap_or_else(|e| panic!("attn.cu for {}: {e}", t.arch()));
            assert_eq!(image.cubin, cubin);
            let text = String::from_utf8_lossy(&image.bytes);
            for k in AttnKernel::ALL {
                assert!(
                    text.contains(k.name()),
                    "{}: no kernel {} in the image",
                    t.arch(),
                    k.name()
                );
            }
        }
    }
}
