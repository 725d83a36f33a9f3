//! `spark_attn` as a ggml custom op inside real ggml graphs: llama.cpp-style cache views (a
//! prefix of a larger cache, V transposed through `ggml_permute`), ggml's own worker threads,
//! argument validation (NaN-filled output), statistics through the C wrappers.

mod attention_helpers;

use attention_helpers::{build_op, Case, Ctx, MaskKind, Spec, Ty};
use llama_cpp_sys_2 as sys;
use spark_backend::params::AttnParams;
use spark_backend::stats::LayerStats;
use std::ffi::c_void;

/// Builds the llama.cpp-style graph for `case` ([`build_op`]) and runs it with `n_threads`.
/// Returns dst's values. `mutate` may alter the arguments before the op is created.
fn run_graph(
    case: &Case,
    params: &mut AttnParams,
    n_threads: i32,
    null_userdata: bool,
    mutate: impl FnOnce(&mut [*mut sys::ggml_tensor; 4]),
) -> Vec<f32> {
    let ctx = Ctx::new(64 << 20);
    let ud: *mut c_void = if null_userdata {
        std::ptr::null_mut()
    } else {
        (params as *mut AttnParams).cast()
    };
    let out = build_op(&ctx, case, ud, mutate);
    // SAFETY: out is a custom-op tensor of ctx whose sources are allocated tensors of ctx;
    // params outlives the computation.
    unsafe {
        let c = ctx.0;
        let gf = sys::ggml_new_graph(c);
        sys::ggml_build_forward_expand(gf, out);
        let status = sys::ggml_graph_compute_with_ctx(c, gf, n_threads);
        assert_eq!(status, sys::GGML_STATUS_SUCCESS);
        std::slice::from_raw_parts((*out).data.cast::<f32>(), case.out_len()).to_vec()
    }
}

/// The same case through the Rust API (reference for the op wiring).
fn run_direct(case: &mut Case, params: &AttnParams) -> Vec<f32> {
    let mut out = vec![0f32; case.out_len()];
    let op = case.sparse_attention(&mut out, params).unwrap();
    // SAFETY: views into live buffers.
    unsafe { op.run_observed(0, 1, &mut |_| {}) };
    out
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn op_matches_the_kernel_for_any_ggml_thread_count() {
    for (i, v_transposed) in [false, true].into_iter().enumerate() {
        let mut spec = Spec::new(64, 32, 8, 4, 5, 200);
        spec.v_transposed = v_transposed;
        spec.mask = if i == 0 {
            MaskKind::Causal
        } else {
            MaskKind::Sliding(64)
        };
        spec.k_keep = 16;
        spec.seed = 40 + i as u64;
        let mut case = Case::build(spec);
        let mut params = spec.params();
        let want = run_direct(&mut case, &params);
        for n_threads in [1, 2, 3, 7] {
            let got = run_graph(&case, &mut params, n_threads, false, |_| {});
            assert_eq!(
                bits(&got),
                bits(&want),
                "v_transposed {v_transposed}, {n_threads} threads"
            );
        }
    }
}

#[test]
fn op_accepts_f32_caches_and_f16_masks() {
    let mut spec = Spec::new(18, 8, 4, 2, 3, 50);
    spec.k_ty = Ty::F32;
    spec.v_ty = Ty::F32;
    spec.mask_ty = Ty::F16;
    spec.mask = MaskKind::Holes(0.6);
    let mut case = Case::build(spec);
    let mut params = spec.params();
    let want = run_direct(&mut case, &params);
    assert_eq!(
        bits(&run_graph(&case, &mut params, 2, false, |_| {})),
        bits(&want)
    );
}

#[test]
fn invalid_arguments_fill_the_output_with_nan() {
    let spec = Spec::new(18, 8, 4, 2, 3, 50);
    let case = Case::build(spec);
    let all_nan = |v: &[f32]| v.iter().all(|x| x.is_nan());
    // Bad parameters: r outside 1..H, k < 1, negative softcap.
    for bad in [
        AttnParams {
            r: 0,
            ..spec.params()
        },
        AttnParams {
            r: 18,
            ..spec.params()
        },
        AttnParams {
            k: 0,
            ..spec.params()
        },
        AttnParams {
            softcap: -1.0,
            ..spec.params()
        },
    ] {
        let mut p = bad;
        assert!(
            all_nan(&run_graph(&case, &mut p, 2, false, |_| {})),
            "{bad:?}"
        );
    }
    // No params at all.
    let mut p = spec.params();
    assert!(all_nan(&run_graph(&case, &mut p, 3, true, |_| {})));
    // A mask that is not [n_kv, >= T]: swap in k as the mask (wrong type for a mask? no: f16 is
    // allowed, but its ne0 is H, not n_kv).
    assert!(all_nan(&run_graph(&case, &mut p, 1, false, |a| a[3] = a[1])));
    // q of the wrong type: pass the f16 K view as q.
    assert!(all_nan(&run_graph(&case, &mut p, 2, false, |a| a[0] = a[1])));
}

#[test]
fn op_records_statistics_readable_through_the_c_wrapper() {
    let mut spec = Spec::new(18, 8, 4, 2, 3, 64);
    spec.k_keep = 5;
    let case = Case::build(spec);
    let mut params = AttnParams {
        layer: 202,
        ..spec.params()
    };
    let get = |layer: i32| {
        let mut s = LayerStats::default();
        // SAFETY: `s` is a valid LayerStats to write.
        let rc = unsafe { spark_backend::registry::spark_stats_get(layer, &mut s) };
        (rc, s)
    };
    let (rc, before) = get(202);
    assert_eq!(rc, 0);
    run_graph(&case, &mut params, 3, false, |_| {});
    let (_, after) = get(202);
    assert_eq!(after.attn_queries - before.attn_queries, 12);
    assert!(after.attn_kept > before.attn_kept);
    assert_eq!(get(-1).0, -1);
    assert_eq!(get(1 << 20).0, -1);
    // SAFETY: null is allowed and reported.
    assert_eq!(
        unsafe { spark_backend::registry::spark_stats_get(0, std::ptr::null_mut()) },
        -1
    );
}
