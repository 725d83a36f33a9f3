//! The Spark ops on many threads: each op called through its C entry point by
//! 16, 32 and 64 threads, all at once or one after another, writes the one-thread output bit
//! for bit and records the same statistics. The shapes are cut every way the work units go at
//! those thread counts (`ffn::tiling::FusedUnits`, `SumUnits`, the attention tiling): a
//! decode step (one token: whole chunks, column halves or quarters), three tokens (one-token
//! groups with column parts), and ubatches of 70 and 64 tokens (token groups of 16 to 35). The
//! partitions themselves (unit counts, coverage, balance at Gemma-2 2B shapes) are tested next
//! to their definitions (`ffn::tiling`, `attention::kernel`).

mod attention_helpers;
mod ffn_helpers;
mod op_helpers;

use attention_helpers::{build_op, Case, Ctx, Spec};
use op_helpers::{ffn_nodes, Node};
use spark_backend::attention::cpu_op::spark_attn;
use spark_backend::params::AttnParams;
use spark_backend::stats::{self, LayerStats};
use std::ffi::c_void;

/// Thread counts a many-core machine runs (16, 32, 64), and one that divides nothing.
const MANY: [i32; 4] = [16, 32, 64, 48];

impl Node {
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

/// `op_helpers::ffn_nodes`: D 1024 (q8_0: 32 blocks of 32, so up to four column parts), r_f 256,
/// F 600 (P = 16 chunks
/// of 37-38 neurons), k_f 60, `n_tokens` tokens; statistics in `layer` (one per test case).
#[test]
fn ffn_ops_on_16_to_64_threads_give_the_one_thread_bits() {
    for (i, n_tokens) in [1usize, 3, 70].into_iter().enumerate() {
        let layer = 200 + i as i32;
        let nodes = ffn_nodes(n_tokens, 26 + i as u64, layer);
        check(
            &format!("spark_ffn_fused T {n_tokens}"),
            &nodes.fused,
            layer,
        );
        // The sum and down read the fused and up outputs of one-thread calls.
        nodes.fused.output(1, false);
        check(&format!("spark_ffn_sum T {n_tokens}"), &nodes.sum, layer);
        check(&format!("spark_ffn_up T {n_tokens}"), &nodes.up, layer);
        nodes.up.output(1, false);
        check(&format!("spark_ffn_down T {n_tokens}"), &nodes.down, layer);
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
            name: "spark_attn",
            layer,
            dst,
            op: spark_attn,
            userdata: ud,
        };
        check(&format!("spark_attn T {n_tokens}"), &node, layer);
    }
}
