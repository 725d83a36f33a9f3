//! `spark_attn` as a ggml custom op inside real ggml graphs: llama.cpp-style cache views (a
//! prefix of a larger cache, V transposed through `ggml_permute`), ggml's own worker threads,
//! argument validation (NaN-filled output), statistics through the C wrappers.

mod attention_support;

use attention_support::{Case, MaskKind, Spec, Ty};
use llama_cpp_sys_2 as sys;
use spark_backend::attention::SparseAttention;
use spark_backend::attn_op::spark_attn;
use spark_backend::params::AttnParams;
use spark_backend::stats::LayerStats;
use std::ffi::c_void;

/// A ggml context with its tensors allocated in host memory; freed on drop.
struct Ctx(*mut sys::ggml_context);

impl Ctx {
    fn new(bytes: usize) -> Self {
        let p = sys::ggml_init_params {
            mem_size: bytes,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: false,
        };
        // SAFETY: plain ggml context creation; the result is checked.
        let ctx = unsafe { sys::ggml_init(p) };
        assert!(!ctx.is_null());
        Ctx(ctx)
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: created by ggml_init, freed once.
        unsafe { sys::ggml_free(self.0) };
    }
}

/// Copies `bytes` into a tensor's data.
///
/// # Safety
/// `t` must be an allocated tensor of at least `bytes.len()` bytes.
unsafe fn fill(t: *mut sys::ggml_tensor, bytes: &[u8]) {
    // SAFETY: per the contract.
    unsafe {
        assert!(sys::ggml_nbytes(t) >= bytes.len());
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), (*t).data.cast::<u8>(), bytes.len());
    }
}

fn ty(t: Ty) -> sys::ggml_type {
    t.ggml()
}

/// Builds the llama.cpp-style graph for `case` (K and V views of a larger cache; V either
/// plain or transposed storage permuted to [H, KV, n_kv]) and runs it with `n_threads`.
/// Returns dst's values. `mutate` may alter the arguments before the op is created.
fn run_graph(
    case: &Case,
    params: &mut AttnParams,
    n_threads: i32,
    null_userdata: bool,
    mutate: impl FnOnce(&mut [*mut sys::ggml_tensor; 4]),
) -> Vec<f32> {
    let s = case.spec;
    assert_eq!(s.n_stream, 1);
    let cells = s.n_kv + s.spare_cells;
    let ctx = Ctx::new(64 << 20);
    // SAFETY: every tensor comes from `ctx` (allocated, host memory), data copied to exact sizes.
    unsafe {
        let c = ctx.0;
        let q = sys::ggml_new_tensor_3d(c, 0, s.h as i64, s.n_head as i64, s.n_tokens as i64);
        fill(
            q,
            std::slice::from_raw_parts(case.q.as_ptr().cast::<u8>(), case.q.len() * 4),
        );
        let k_store =
            sys::ggml_new_tensor_3d(c, ty(s.k_ty), s.h as i64, s.n_head_kv as i64, cells as i64);
        fill(k_store, &case.k);
        let k = sys::ggml_view_3d(
            c,
            k_store,
            s.h as i64,
            s.n_head_kv as i64,
            s.n_kv as i64,
            (*k_store).nb[1],
            (*k_store).nb[2],
            0,
        );
        let v = if s.v_transposed {
            // llama.cpp's transposed V: [cells, H, KV] storage, viewed [n_kv, H, KV], then
            // permuted so that dims read [H, KV, n_kv] (nb0 = cells * elem).
            let v_store = sys::ggml_new_tensor_3d(
                c,
                ty(s.v_ty),
                cells as i64,
                s.h as i64,
                s.n_head_kv as i64,
            );
            fill(v_store, &case.v);
            let view = sys::ggml_view_3d(
                c,
                v_store,
                s.n_kv as i64,
                s.h as i64,
                s.n_head_kv as i64,
                (*v_store).nb[1],
                (*v_store).nb[2],
                0,
            );
            sys::ggml_permute(c, view, 2, 0, 1, 3)
        } else {
            let v_store = sys::ggml_new_tensor_3d(
                c,
                ty(s.v_ty),
                s.h as i64,
                s.n_head_kv as i64,
                cells as i64,
            );
            fill(v_store, &case.v);
            sys::ggml_view_3d(
                c,
                v_store,
                s.h as i64,
                s.n_head_kv as i64,
                s.n_kv as i64,
                (*v_store).nb[1],
                (*v_store).nb[2],
                0,
            )
        };
        let mask =
            sys::ggml_new_tensor_3d(c, ty(s.mask_ty), s.n_kv as i64, case.mask_rows as i64, 1);
        fill(mask, &case.mask);
        let mut args = [q, k, v, mask];
        mutate(&mut args);
        let ud: *mut c_void = if null_userdata {
            std::ptr::null_mut()
        } else {
            (params as *mut AttnParams).cast()
        };
        let out = sys::ggml_custom_4d(
            c,
            0,
            s.h as i64,
            s.n_head as i64,
            s.n_tokens as i64,
            1,
            args.as_mut_ptr(),
            4,
            Some(spark_attn),
            -1,
            ud,
        );
        let gf = sys::ggml_new_graph(c);
        sys::ggml_build_forward_expand(gf, out);
        let status = sys::ggml_graph_compute_with_ctx(c, gf, n_threads);
        assert_eq!(status, sys::GGML_STATUS_SUCCESS);
        let n = case.out_len();
        std::slice::from_raw_parts((*out).data.cast::<f32>(), n).to_vec()
    }
}

/// The same case through the Rust API (reference for the op wiring).
fn run_direct(case: &mut Case, params: &AttnParams) -> Vec<f32> {
    let mut out = vec![0f32; case.out_len()];
    let (q, k, v, m) = (
        case.q_view(),
        case.k_view(),
        case.v_view(),
        case.mask_view(),
    );
    let dst = case.dst_view(&mut out);
    let op = SparseAttention::new(&q, &k, &v, &m, &dst, params).unwrap();
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
