//! `spark_rope` (src/rope) inside real ggml graphs on ggml's CPU threads: against ggml's own
//! rope (the two `ggml_rope_ext` nodes, the second offset with `ggml_rope_set_offset`, that the
//! graph builds without the op), against a float64 evaluation of SPEC section 4's rotary
//! embedding, the same bits for any thread count, Q as a strided view of a stacked Q/K/V
//! product, and bad arguments (NaN output, one line).

use llama_cpp_sys_2 as sys;
use spark_backend::params::{self, RopeParams};
use spark_backend::rope::cpu_op::spark_rope;
use std::ffi::c_void;

/// A ggml context that frees itself.
struct Ctx(*mut sys::ggml_context);

impl Ctx {
    fn new() -> Self {
        let p = sys::ggml_init_params {
            mem_size: 64 << 20,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: false,
        };
        // SAFETY: plain ggml_init with an owned buffer.
        Ctx(unsafe { sys::ggml_init(p) })
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: the context came from ggml_init and is freed once.
        unsafe { sys::ggml_free(self.0) }
    }
}

/// A deterministic value in [-1, 1).
fn value(i: usize) -> f32 {
    let x = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
    (x as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// One case: heads of `h` values, the first part `r` wide, x a view of rows `stride` floats
/// apart (the stacked Q/K/V product's rows when stride > n_head * h), positions `pos`.
struct Case {
    h: usize,
    n_head: usize,
    stride: usize,
    pos: Vec<i32>,
    params: RopeParams,
}

impl Case {
    fn new(h: usize, r: usize, n_head: usize, stride: usize, pos: Vec<i32>) -> Self {
        Case {
            h,
            n_head,
            stride,
            pos,
            params: RopeParams {
                layer: 3,
                r: r as i32,
                freq_base: 10000.0,
                freq_scale: 1.0,
                scale: 0.0625,
                reserved: 0,
            },
        }
    }

    fn n_tokens(&self) -> usize {
        self.pos.len()
    }

    /// x[t][n][c], as the graph's x view holds it.
    fn x(&self, t: usize, n: usize, c: usize) -> f32 {
        value(t * self.stride + n * self.h + c)
    }

    /// x (a view into a [stride, n_tokens] buffer) and the positions in `ctx`.
    fn inputs(&self, ctx: &Ctx) -> (*mut sys::ggml_tensor, *mut sys::ggml_tensor) {
        let t = self.n_tokens();
        // SAFETY: tensors of a live context with allocated data, filled within their sizes.
        unsafe {
            let buf =
                sys::ggml_new_tensor_2d(ctx.0, sys::GGML_TYPE_F32, self.stride as i64, t as i64);
            let data = (*buf).data.cast::<f32>();
            for i in 0..self.stride * t {
                *data.add(i) = value(i);
            }
            let x = sys::ggml_view_3d(
                ctx.0,
                buf,
                self.h as i64,
                self.n_head as i64,
                t as i64,
                4 * self.h,
                4 * self.stride,
                0,
            );
            let pos = sys::ggml_new_tensor_1d(ctx.0, sys::GGML_TYPE_I32, t as i64);
            for (i, &p) in self.pos.iter().enumerate() {
                *(*pos).data.cast::<i32>().add(i) = p;
            }
            (x, pos)
        }
    }

    /// The op's node over x and pos, with `params` stored (none when null).
    fn op(
        &self,
        ctx: &Ctx,
        x: *mut sys::ggml_tensor,
        pos: *mut sys::ggml_tensor,
        params: Option<RopeParams>,
    ) -> *mut sys::ggml_tensor {
        let mut args = [x, pos];
        // SAFETY: args are live tensors of ctx; the node is stored in ctx.
        unsafe {
            let node = sys::ggml_custom_4d(
                ctx.0,
                sys::GGML_TYPE_F32,
                self.h as i64,
                self.n_head as i64,
                self.n_tokens() as i64,
                1,
                args.as_mut_ptr(),
                2,
                Some(spark_rope),
                -1,
                std::ptr::null_mut::<c_void>(),
            );
            if let Some(p) = params {
                params::store(node, &p.as_block());
            }
            node
        }
    }

    /// ggml's two ropes over x, as the graph builds them without the op.
    fn stock(
        &self,
        ctx: &Ctx,
        x: *mut sys::ggml_tensor,
        pos: *mut sys::ggml_tensor,
    ) -> *mut sys::ggml_tensor {
        let p = &self.params;
        let r = p.r;
        let rope = |y: *mut sys::ggml_tensor, width: i32| {
            // SAFETY: live tensors of ctx; NEOX mode (2) as Gemma's.
            unsafe {
                sys::ggml_rope_ext(
                    ctx.0,
                    y,
                    pos,
                    std::ptr::null_mut(),
                    width,
                    2,
                    0,
                    p.freq_base,
                    p.freq_scale,
                    0.0,
                    p.scale,
                    32.0,
                    1.0,
                )
            }
        };
        let first = rope(x, r);
        // SAFETY: a ROPE node of ctx.
        unsafe { sys::ggml_rope_set_offset(rope(first, self.h as i32 - r), r) }
    }

    /// dst in float64 from SPEC section 4: each part rotated by theta_i = pos * freq_scale *
    /// base^(-2i/w), every channel times scale.
    fn reference(&self) -> Vec<f64> {
        let p = &self.params;
        let (h, r) = (self.h, p.r as usize);
        let mut out = vec![0f64; h * self.n_head * self.n_tokens()];
        for (t, &pos) in self.pos.iter().enumerate() {
            for n in 0..self.n_head {
                let o = &mut out[(t * self.n_head + n) * h..][..h];
                for (off, w) in [(0, r), (r, h - r)] {
                    for i in 0..w / 2 {
                        let theta = f64::from(pos)
                            * f64::from(p.freq_scale)
                            * f64::from(p.freq_base).powf(-2.0 * i as f64 / w as f64);
                        let (x0, x1) = (
                            f64::from(self.x(t, n, off + i)),
                            f64::from(self.x(t, n, off + i + w / 2)),
                        );
                        let s = f64::from(p.scale);
                        o[off + i] = s * (x0 * theta.cos() - x1 * theta.sin());
                        o[off + i + w / 2] = s * (x0 * theta.sin() + x1 * theta.cos());
                    }
                }
            }
        }
        out
    }
}

/// Computes `node` in a graph of `ctx` on `n_threads` and returns its values.
fn compute(ctx: &Ctx, node: *mut sys::ggml_tensor, n_threads: i32) -> Vec<f32> {
    // SAFETY: node is a tensor of ctx whose sources are allocated tensors of ctx.
    unsafe {
        let gf = sys::ggml_new_graph(ctx.0);
        sys::ggml_build_forward_expand(gf, node);
        assert_eq!(
            sys::ggml_graph_compute_with_ctx(ctx.0, gf, n_threads),
            sys::GGML_STATUS_SUCCESS
        );
        let n = sys::ggml_nelements(node) as usize;
        let mut out = vec![0f32; n];
        // the stock chain's output is contiguous as well (a rope allocates its own)
        std::ptr::copy_nonoverlapping((*node).data.cast::<f32>(), out.as_mut_ptr(), n);
        out
    }
}

fn spark(case: &Case, n_threads: i32) -> Vec<f32> {
    let ctx = Ctx::new();
    let (x, pos) = case.inputs(&ctx);
    let node = case.op(&ctx, x, pos, Some(case.params));
    compute(&ctx, node, n_threads)
}

fn stock(case: &Case) -> Vec<f32> {
    let ctx = Ctx::new();
    let (x, pos) = case.inputs(&ctx);
    compute(&ctx, case.stock(&ctx, x, pos), 2)
}

/// The cases: Gemma-2 2B's Q (H 256, r 128, 8 heads of a 4096-wide stacked row), K (4 heads),
/// uneven splits, and positions from 0 to a long context's.
fn cases() -> Vec<Case> {
    let near = vec![0, 1, 2, 7, 31, 64];
    let far = vec![511, 4095, 8191];
    vec![
        Case::new(256, 128, 8, 4096, near.clone()),
        Case::new(256, 128, 4, 4096, far.clone()),
        Case::new(64, 24, 3, 3 * 64, near.clone()),
        Case::new(32, 8, 2, 2 * 32 + 8, near),
        Case::new(48, 40, 2, 96, far),
    ]
}

#[test]
fn matches_ggml_ropes_and_the_float64_rotary_embedding() {
    for case in cases() {
        let got = spark(&case, 2);
        let (ggml, reference) = (stock(&case), case.reference());
        let max_pos = *case.pos.iter().max().unwrap() as f64;
        // f32 theta is pos * theta_scale^i to a few ulps: an angle error of ~max_pos * 2^-22
        // rad, on values of magnitude scale * (|x0| + |x1|) <= 2 * scale
        let tol =
            2.0 * f64::from(case.params.scale) * (4.0 * 2f64.powi(-24) + max_pos * 2f64.powi(-21));
        let worst_ref = got
            .iter()
            .zip(&reference)
            .map(|(&a, &b)| (f64::from(a) - b).abs())
            .fold(0.0, f64::max);
        let worst_ggml = got
            .iter()
            .zip(&ggml)
            .map(|(&a, &b)| f64::from(a - b).abs())
            .fold(0.0, f64::max);
        let (h, r) = (case.h, case.params.r);
        assert!(
            worst_ref <= tol,
            "H {h} r {r}: {worst_ref:.2e} from float64 > {tol:.2e}"
        );
        // ggml's CPU rope iterates theta (theta *= theta_scale), so its angle error grows with
        // i as well: twice the tolerance
        assert!(
            worst_ggml <= 2.0 * tol,
            "H {h} r {r}: {worst_ggml:.2e} from ggml's ropes > {:.2e}",
            2.0 * tol
        );
        println!("H {h} r {r} positions <= {max_pos}: max error {worst_ref:.1e} (float64), {worst_ggml:.1e} (ggml), tolerance {tol:.1e}");
    }
}

#[test]
fn any_thread_count_gives_the_same_bits() {
    for case in cases() {
        let one: Vec<u32> = spark(&case, 1).iter().map(|v| v.to_bits()).collect();
        for n_threads in [2, 3, 7] {
            let many: Vec<u32> = spark(&case, n_threads)
                .iter()
                .map(|v| v.to_bits())
                .collect();
            assert_eq!(one, many, "H {} with {n_threads} threads", case.h);
        }
    }
}

#[test]
fn bad_arguments_give_nan() {
    let base = Case::new(64, 24, 3, 3 * 64, vec![0, 5]);
    let bad = [
        RopeParams {
            r: 23,
            ..base.params
        },
        RopeParams {
            r: 66,
            ..base.params
        },
        RopeParams {
            r: 64,
            ..base.params
        },
        RopeParams {
            r: 0,
            ..base.params
        },
        RopeParams {
            r: -2,
            ..base.params
        },
        RopeParams {
            freq_base: 0.0,
            ..base.params
        },
        RopeParams {
            scale: f32::NAN,
            ..base.params
        },
    ];
    let all_nan = |v: &[f32]| v.iter().all(|x| x.is_nan());
    for p in bad {
        let ctx = Ctx::new();
        let (x, pos) = base.inputs(&ctx);
        let out = compute(&ctx, base.op(&ctx, x, pos, Some(p)), 2);
        assert!(all_nan(&out), "{p:?}");
    }
    // no parameters; positions of the wrong type (x as positions)
    let ctx = Ctx::new();
    let (x, pos) = base.inputs(&ctx);
    assert!(all_nan(&compute(&ctx, base.op(&ctx, x, pos, None), 2)));
    let ctx = Ctx::new();
    let (x, _) = base.inputs(&ctx);
    assert!(all_nan(&compute(
        &ctx,
        base.op(&ctx, x, x, Some(base.params)),
        2
    )));
}
