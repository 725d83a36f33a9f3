//! Work stealing in every Spark op (`spark_backend::cpu_op`): the threads of a call take fixed work
//! chunks from a shared counter, so results must be bit-identical for any thread count and any
//! schedule, and the counter must start fresh for the next call of the same node on every path
//! (success, kernel panic, bad parameters, bad thread index).
//!
//! Schedules are forced through real threads and the test-only claim hook (`cpu_op::fault`): threads
//! called one after another in either order (as ggml's would run if all but one were
//! descheduled), all at once, and one thread stalled while holding a chunk until every other
//! thread has returned. No timing is asserted.

mod attention_helpers;
mod ffn_helpers;
mod op_helpers;

use attention_helpers::{build_op, Case, Ctx, Spec};
use op_helpers::{ffn_nodes, Node};
use spark_backend::attention::cpu_op::spark_attn;
use spark_backend::cpu_op::fault::{self, ClaimEvent};
use spark_backend::params::{self, AttnParams, OpParams};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A value no op writes: what is still there after a run was not written.
const SENTINEL: f32 = 1234.5;
const THREAD_COUNTS: [i32; 4] = [1, 2, 3, 7];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Schedule {
    /// Threads 0, 1, ... one after another: thread 0 takes every chunk.
    InOrder,
    /// Threads nth - 1, ..., 0 one after another.
    Reversed,
    /// All threads at once.
    Together,
    /// Thread 0 claims one chunk and stalls on it until every other thread has returned.
    FirstStalls,
}

const SCHEDULES: [Schedule; 4] = [
    Schedule::InOrder,
    Schedule::Reversed,
    Schedule::Together,
    Schedule::FirstStalls,
];

impl Node {
    /// One call of the node by `nth` threads under `schedule`.
    fn run(&self, nth: i32, schedule: Schedule) {
        match schedule {
            Schedule::InOrder => (0..nth).for_each(|i| self.call(i, nth)),
            Schedule::Reversed => (0..nth).rev().for_each(|i| self.call(i, nth)),
            Schedule::Together => std::thread::scope(|s| {
                for i in 0..nth {
                    s.spawn(move || self.call(i, nth));
                }
            }),
            Schedule::FirstStalls if nth == 1 => self.call(0, 1),
            Schedule::FirstStalls => {
                let holding = Arc::new(AtomicBool::new(false));
                let release = Arc::new(AtomicBool::new(false));
                let (h, r) = (Arc::clone(&holding), Arc::clone(&release));
                let stalled = AtomicBool::new(false);
                fault::set_claim_hook(
                    self.dst,
                    Arc::new(move |event| {
                        if let ClaimEvent::After {
                            ith: 0,
                            chunk: Some(_),
                        } = event
                        {
                            if !stalled.swap(true, Ordering::Relaxed) {
                                h.store(true, Ordering::Release);
                                while !r.load(Ordering::Acquire) {
                                    std::thread::yield_now();
                                }
                            }
                        }
                    }),
                );
                std::thread::scope(|s| {
                    let first = s.spawn(move || self.call(0, nth));
                    while !holding.load(Ordering::Acquire) && !first.is_finished() {
                        std::thread::yield_now();
                    }
                    let others: Vec<_> = (1..nth)
                        .map(|i| s.spawn(move || self.call(i, nth)))
                        .collect();
                    for o in others {
                        o.join().unwrap();
                    }
                    release.store(true, Ordering::Release);
                    first.join().unwrap();
                });
                fault::clear_claim_hook(self.dst);
            }
        }
    }

    /// Runs the node over the sentinel and returns dst.
    fn output(&self, nth: i32, schedule: Schedule) -> Vec<f32> {
        self.set(SENTINEL);
        self.run(nth, schedule);
        self.read()
    }
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Keeps the default panic message (and backtrace) for real panics, not for injected ones.
fn quiet_injected_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.payload().downcast_ref::<&str>() != Some(&"injected fault") {
                default(info);
            }
        }));
    });
}

/// An attention case (context, params, case data) and its node.
struct AttnNode {
    _ctx: Ctx,
    _case: Case,
    _params: Box<AttnParams>,
    node: Node,
}

/// H 64, r 32, 8 query heads on 4 KV heads, `n_tokens` tokens over 200 positions: at 1 token
/// the units are the 4 KV groups on 1-2 threads and the 8 query heads on 3 or more (so the
/// comparison with one thread crosses both tilings), at 20 tokens (4-token block, KV group)
/// pairs (20) for every thread count tested.
fn attn_node(n_tokens: usize) -> AttnNode {
    let mut spec = Spec::new(64, 32, 8, 4, n_tokens, 200);
    spec.k_keep = 16;
    let case = Case::build(spec);
    let mut params = Box::new(spec.params());
    let ctx = Ctx::new(64 << 20);
    let ud: *mut c_void = (&mut *params as *mut AttnParams).cast();
    let dst = build_op(&ctx, &case, ud, |_| {});
    let layer = params.layer;
    AttnNode {
        _ctx: ctx,
        _case: case,
        _params: params,
        node: Node {
            name: "spark_attn",
            layer,
            dst,
            op: spark_attn,
            userdata: ud,
        },
    }
}

/// Every schedule of every thread count gives the one-thread output bit for bit.
fn check_schedules(node: &Node) {
    let want = node.output(1, Schedule::InOrder);
    assert!(
        want.iter().all(|x| x.is_finite() && *x != SENTINEL),
        "{}: one thread writes every element",
        node.name
    );
    for nth in THREAD_COUNTS {
        for schedule in SCHEDULES {
            for _ in 0..if schedule == Schedule::Together { 3 } else { 1 } {
                let got = node.output(nth, schedule);
                assert!(
                    same_bits(&got, &want),
                    "{}: nth {nth} {schedule:?} differs from one thread",
                    node.name
                );
            }
        }
    }
}

#[test]
fn ffn_ops_are_bit_identical_for_any_thread_count_and_schedule() {
    for (n, seed) in [(1, 11), (70, 12)] {
        let f = ffn_nodes(n, seed, 9);
        f.fused.run(1, Schedule::InOrder); // sum's input
        f.up.run(1, Schedule::InOrder); // down's input
        for node in [&f.fused, &f.sum, &f.up, &f.down] {
            check_schedules(node);
        }
    }
}

#[test]
fn attention_is_bit_identical_for_any_thread_count_and_schedule() {
    for n_tokens in [1, 20] {
        check_schedules(&attn_node(n_tokens).node);
    }
}

/// After a call with a failing thread (under each schedule), the next call of the same node
/// computes every element again, bit-identical to a clean run: the chunk counter was reset on
/// the failure path too. The faulty thread's chunks are NaN; everything else is untouched.
fn check_reset_after_panic(node: &Node) {
    quiet_injected_panics();
    let want = node.output(1, Schedule::InOrder);
    for nth in [1, 2, 3] {
        for schedule in SCHEDULES {
            for bad in 0..nth {
                node.set(SENTINEL);
                fault::arm(node.dst, bad as usize);
                node.run(nth, schedule);
                fault::disarm(node.dst);
                let got = node.read();
                for (e, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        g.is_nan() || g.to_bits() == w.to_bits(),
                        "{}: nth {nth} {schedule:?} bad {bad}: element {e} = {g}, not NaN or \
                         the clean value",
                        node.name
                    );
                }
                if schedule == Schedule::FirstStalls && bad == 0 {
                    // Thread 0 held a chunk when it failed.
                    assert!(got.iter().any(|x| x.is_nan()), "{}", node.name);
                }
                let again = node.output(nth, schedule);
                assert!(
                    same_bits(&again, &want),
                    "{}: nth {nth} {schedule:?}: the call after a fault in thread {bad} differs",
                    node.name
                );
            }
            // Every thread fails: the chunks left by the first failure are claimed and filled
            // by it, so the whole output is NaN, and the next call is complete again.
            for bad in 0..nth {
                fault::arm(node.dst, bad as usize);
            }
            let got = node.output(nth, schedule);
            fault::disarm(node.dst);
            assert!(
                got.iter().all(|x| x.is_nan()),
                "{}: nth {nth} {schedule:?}: every thread failed",
                node.name
            );
            let again = node.output(nth, schedule);
            assert!(same_bits(&again, &want), "{}: after all failed", node.name);
        }
    }
}

#[test]
fn the_counter_is_reset_after_a_panic() {
    let f = ffn_nodes(3, 21, 9);
    f.fused.run(1, Schedule::InOrder);
    f.up.run(1, Schedule::InOrder);
    for node in [&f.fused, &f.sum, &f.up, &f.down] {
        check_reset_after_panic(node);
    }
    check_reset_after_panic(&attn_node(1).node);
}

/// Bad parameters (every thread fails its checks) and calls with a bad thread index leave no
/// state behind: the next good call is complete.
#[test]
fn the_counter_is_reset_after_bad_parameters_and_bad_thread_indices() {
    let f = ffn_nodes(2, 31, 9);
    let node = f.fused;
    let want = node.output(1, Schedule::InOrder);
    let bad_k = OpParams {
        layer: 9,
        k: 0,
        ..OpParams::default()
    };
    // SAFETY: the node is live and idle; its op_params are plain bytes.
    let good = unsafe { (*node.dst).op_params };
    for nth in THREAD_COUNTS {
        for bad in [None, Some(bad_k)] {
            node.set(SENTINEL);
            // SAFETY: the node is live and no thread computes it between the calls.
            unsafe {
                match bad {
                    None => params::clear(node.dst),
                    Some(p) => params::store(node.dst, &p),
                }
            }
            node.run(nth, Schedule::Together);
            assert!(node.read().iter().all(|x| x.is_nan()));
            // SAFETY: as above.
            unsafe { (*node.dst).op_params = good };
            assert!(same_bits(&node.output(nth, Schedule::Together), &want));
        }
        for (ith, n) in [(nth, nth), (-1, nth), (0, 0), (0, -1)] {
            node.set(SENTINEL);
            node.call(ith, n);
            assert!(node.read().iter().all(|x| x.is_nan()));
            assert!(same_bits(&node.output(nth, Schedule::InOrder), &want));
        }
    }
}

/// Two nodes computed at the same time by their own threads (two graphs, two llama contexts)
/// never share a counter: both outputs are complete and exact.
#[test]
fn concurrent_calls_of_different_nodes_do_not_share_chunks() {
    let a = ffn_nodes(5, 41, 9);
    let b = ffn_nodes(5, 42, 9);
    let (wa, wb) = (
        a.fused.output(1, Schedule::InOrder),
        b.fused.output(1, Schedule::InOrder),
    );
    for nth in [2, 3, 7] {
        for _ in 0..3 {
            a.fused.set(SENTINEL);
            b.fused.set(SENTINEL);
            std::thread::scope(|s| {
                let (na, nb) = (a.fused, b.fused);
                s.spawn(move || na.run(nth, Schedule::Together));
                s.spawn(move || nb.run(nth, Schedule::Together));
            });
            assert!(same_bits(&a.fused.read(), &wa), "nth {nth}: a");
            assert!(same_bits(&b.fused.read(), &wb), "nth {nth}: b");
        }
    }
}
