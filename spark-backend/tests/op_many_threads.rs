//! The Spark ops on many threads (issue 26 item 5): each op called through its C entry point by
//! 16, 32 and 64 threads, all at once or one after another, writes the one-thread output bit
//! for bit and records the same statistics. The shapes are cut every way the work units go at
//! those thread counts (`ffn::tiling::FusedUnits`, `SumUnits`, the attention tiling): a
//! decode step (one token: whole chunks, column halves or quarters), three tokens (one-token
//! groups with column parts), and ubatches of 70 and 64 tokens (token groups of 16 to 35). The
//! partitions themselves (unit counts, coverage, balance at Gemma-2 2B shapes) are tested next
//! to their definitions (`ffn::tiling`, `attention::kernel`).

mod attention_support;
mod ffn_common;

use attention_support::{build_op, Case, Ctx, Spec};
use ffn_common::{op_case, Rng};
use llama_cpp_sys_2 as sys;
use spark_backend::attention::op::spark_attn;
use spark_backend::ffn::op::{spark_ffn_down, spark_ffn_fused, spark_ffn_sum, spark_ffn_up};
use spark_backend::ffn::{self, Batch};
use spark_backend::params::{AttnParams, FfnParams};
use spark_backend::rows::RowType;
use spark_backend::stats::{self, LayerStats};
use std::ffi::c_void;

type OpFn = unsafe extern "C" fn(*mut sys::ggml_tensor, i32, i32, *mut c_void);

/// The thread counts of the issue, and one that divides nothing.
const MANY: [i32; 4] = [16, 32, 64, 48];

/// One custom-op node called by hand.
#[derive(Clone, Copy)]
struct Node {
    dst: *mut sys::ggml_tensor,
    op: OpFn,
    userdata: *mut c_void,
}

// SAFETY: the tensors and params a Node points to outlive every thread the tests start (scoped
// threads), and ggml custom ops are made to be called from several threads at once.
unsafe impl Send for Node {}
// SAFETY: as above; a Node is only read.
unsafe impl Sync for Node {}

impl Node {
    fn call(&self, ith: i32, nth: i32) {
        // SAFETY: dst is a live custom-op tensor of a live context, built with its sources and
        // parameters as the op's contract requires.
        unsafe { (self.op)(self.dst, ith, nth, self.userdata) };
    }

    fn len(&self) -> usize {
        // SAFETY: dst is a live tensor.
        unsafe { sys::ggml_nelements(self.dst) as usize }
    }

    fn read(&self) -> Vec<f32> {
        // SAFETY: dst is a live, contiguous f32 tensor; no op runs meanwhile.
        unsafe { std::slice::from_raw_parts((*self.dst).data.cast::<f32>(), self.len()).to_vec() }
    }

    fn set(&self, v: f32) {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts_mut((*self.dst).data.cast::<f32>(), self.len()) }
            .fill(v);
    }

    /// One call by `nth` threads, all at once (`together`) or one after another, over a
    /// sentinel; returns dst.
    fn output(&self, nth: i32, together: bool) -> Vec<f32> {
        self.set(1234.5);
        if together {
            std::thread::scope(|s| {
                for i in 0..nth {
                    s.spawn(move || self.call(i, nth));
                }
            });
        } else {
            (0..nth).for_each(|i| self.call(i, nth));
        }
        self.read()
    }
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// The statistics `node` records in `layer` over one call by `nth` threads, and its output.
fn run(node: &Node, layer: i32, nth: i32, together: bool) -> (Vec<f32>, LayerStats) {
    let before = stats::snapshot(layer).unwrap();
    let out = node.output(nth, together);
    let after = stats::snapshot(layer).unwrap();
    let diff = LayerStats {
        ffn_kept: after.ffn_kept - before.ffn_kept,
        ffn_tokens: after.ffn_tokens - before.ffn_tokens,
        ffn_width: after.ffn_width,
        attn_kept: after.attn_kept - before.attn_kept,
        attn_queries: after.attn_queries - before.attn_queries,
    };
    (out, diff)
}

/// Every thread count of [`MANY`], both ways, against one thread.
fn check(name: &str, node: &Node, layer: i32) {
    let (want, want_stats) = run(node, layer, 1, false);
    assert!(want.iter().all(|x| x.is_finite() && *x != 1234.5), "{name}");
    for nth in MANY {
        for together in [true, false] {
            let (got, got_stats) = run(node, layer, nth, together);
            assert!(
                same_bits(&got, &want),
                "{name}: {nth} threads differ from one"
            );
            assert_eq!(got_stats, want_stats, "{name}: {nth} threads");
        }
    }
}

/// D 1024 (q8_0: 32 blocks of 32, so up to four column parts), r_f 256, F 600 (P = 16 chunks
/// of 37-38 neurons), k_f 60, `n_tokens` tokens; statistics in `layer` (one per test case).
#[test]
fn ffn_ops_on_16_to_64_threads_give_the_one_thread_bits() {
    let (d, r, f) = (1024, 256, 600);
    for (i, n_tokens) in [1usize, 3, 70].into_iter().enumerate() {
        let layer = 200 + i as i32;
        let mut rng = Rng::new(26 + i as u64);
        let (c, [k1, _, _], h) = op_case(&mut rng, RowType::Q8_0, d, r, f, n_tokens, 60, layer);
        let mut scores = vec![0f32; n_tokens * f];
        let batch = Batch {
            h: &h,
            stride: d,
            width: d,
            n_tokens,
        };
        ffn::predictor_scores(&k1.matrix(), &batch, &mut scores).unwrap();
        let params = &*c.params as *const FfnParams;
        let userdata = params.cast_mut().cast::<c_void>();
        let st = c.ggml.f32_tensor(f, n_tokens, &scores);
        let p = ffn::tiling::default_chunks(f);
        let partials = c.ggml.custom(
            &[d, n_tokens, p],
            &mut [st, c.h, c.k2, c.v],
            spark_ffn_fused,
            params,
        );
        let mut src = [partials];
        let sum = c
            .ggml
            .custom(&[d, n_tokens], &mut src, spark_ffn_sum, params);
        let u = c
            .ggml
            .custom(&[n_tokens, f], &mut [st, c.h, c.k2], spark_ffn_up, params);
        let down = c
            .ggml
            .custom(&[d, n_tokens], &mut [u, c.v], spark_ffn_down, params);
        let node = |dst, op| Node { dst, op, userdata };
        let fused = node(partials, spark_ffn_fused as OpFn);
        check(&format!("spark_ffn_fused T {n_tokens}"), &fused, layer);
        // The sum and down read the fused and up outputs of one-thread calls.
        fused.output(1, false);
        check(
            &format!("spark_ffn_sum T {n_tokens}"),
            &node(sum, spark_ffn_sum),
            layer,
        );
        let up = node(u, spark_ffn_up as OpFn);
        check(&format!("spark_ffn_up T {n_tokens}"), &up, layer);
        up.output(1, false);
        check(
            &format!("spark_ffn_down T {n_tokens}"),
            &node(down, spark_ffn_down),
            layer,
        );
    }
}

/// Gemma-2's head layout (8 query heads on 4 KV heads) at H 64: a decode step (8 head units at
/// most), a decode step of 4 sequences in one stream (blocks of one token on many threads),
/// and a 64-token ubatch (16 blocks of 4 tokens, whole groups or single heads).
#[test]
fn attention_on_16_to_64_threads_gives_the_one_thread_bits() {
    for (i, (n_tokens, n_kv)) in [(1usize, 300usize), (4, 300), (64, 200)]
        .into_iter()
        .enumerate()
    {
        let mut spec = Spec::new(64, 32, 8, 4, n_tokens, n_kv);
        spec.k_keep = 16;
        let case = Case::build(spec);
        let layer = 210 + i as i32;
        let mut params = Box::new(AttnParams {
            layer,
            ..spec.params()
        });
        let ctx = Ctx::new(64 << 20);
        let ud: *mut c_void = (&mut *params as *mut AttnParams).cast();
        let dst = build_op(&ctx, &case, ud, |_| {});
        let node = Node {
            dst,
            op: spark_attn,
            userdata: ud,
        };
        check(&format!("spark_attn T {n_tokens}"), &node, layer);
    }
}
