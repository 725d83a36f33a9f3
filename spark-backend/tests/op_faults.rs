//! The failure path every Spark op shares (`spark_backend::cpu_op`), driven by the test-only fault
//! switch (`cpu_op::fault`, feature `fault-injection`): when op X panics in thread `ith` of `nth`
//! (nth 1..4, every op), exactly the output share that thread owns is NaN, every element other
//! threads own is bit-identical to a fault-free run (no thread writes another's share), the
//! failure line names the op, layer and thread, and the process goes on. Where the next op of
//! the FFN reads the whole failed output (fused -> sum, up -> down) the whole FFN output is NaN,
//! through ggml's own worker threads. A bad thread index or bad parameters give NaN, not an early
//! return.

mod attention_helpers;
mod ffn_helpers;
mod op_helpers;

use attention_helpers::{build_op, Case, Ctx, Spec};
use ffn_helpers::Runner;
use op_helpers::{ffn_nodes_of, FfnNodes, FfnShape, Node, OpFn};
use spark_backend::attention::cpu_op::spark_attn;
use spark_backend::cpu_op::fault;
use spark_backend::ffn;
use spark_backend::ffn::cpu_ops::{spark_ffn_fused, spark_ffn_up};
use spark_backend::params::OpParams;
use spark_backend::rows::RowType;
use std::ffi::c_void;
use std::sync::Arc;

/// A value no op writes: what is still there after a run was not written.
const SENTINEL: f32 = 1234.5;

impl Node {
    /// Which elements thread `ith` of `nth` writes: run it alone over the sentinel.
    fn owned(&self, ith: i32, nth: i32) -> Vec<bool> {
        self.set(SENTINEL);
        self.call(ith, nth);
        self.read()
            .iter()
            .map(|&x| x.to_bits() != SENTINEL.to_bits())
            .collect()
    }
}

fn count_lines(want: &str, since: usize) -> usize {
    fault::reports()[since..]
        .iter()
        .filter(|l| l.as_str() == want)
        .count()
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

/// The checks of the module docs for one node, for nth 1..4 and a fault in each thread.
fn check_fault_path(node: &Node) {
    quiet_injected_panics();
    for nth in 1..=4 {
        node.set(SENTINEL);
        node.run_all(nth);
        let want = node.read();
        assert!(
            want.iter().all(|x| x.is_finite() && *x != SENTINEL),
            "{}: a fault-free run writes every element",
            node.name
        );
        let owned: Vec<Vec<bool>> = (0..nth).map(|i| node.owned(i, nth)).collect();
        for e in 0..node.len() {
            let owners = owned.iter().filter(|o| o[e]).count();
            assert_eq!(owners, 1, "{}: element {e} has {owners} owners", node.name);
        }
        for bad in 0..nth {
            node.set(SENTINEL);
            let since = fault::reports().len();
            fault::arm(node.dst, bad as usize);
            node.run_all(nth);
            fault::disarm(node.dst);
            let got = node.read();
            for (e, (g, w)) in got.iter().zip(&want).enumerate() {
                if owned[bad as usize][e] {
                    assert!(g.is_nan(), "{}: {bad}/{nth} element {e} = {g}", node.name);
                } else {
                    assert_eq!(g.to_bits(), w.to_bits(), "{}: {bad}/{nth} e {e}", node.name);
                }
            }
            let line = format!(
                "spark-backend: {}: layer {}: panic in thread {bad} of {nth}: injected fault; \
                 output set to NaN",
                node.name, node.layer
            );
            assert_eq!(count_lines(&line, since), 1, "{line}");
        }
        // A bad thread index: no share is known, the whole output is NaN and it is said.
        for (ith, n) in [(nth, nth), (-1, nth), (0, 0)] {
            node.set(SENTINEL);
            let since = fault::reports().len();
            node.call(ith, n);
            assert!(node.read().iter().all(|x| x.is_nan()), "{}", node.name);
            let line = format!(
                "spark-backend: {}: layer {}: bad thread index {ith} of {n}; output set to NaN",
                node.name, node.layer
            );
            assert_eq!(count_lines(&line, since), 1, "{line}");
        }
    }
}

/// D 256, r_f 64, F 72, 3 tokens, k_f 10 (every op's share is non-empty for up to 4 threads).
/// One FFN case; `layer` tells its failure lines apart from those of the tests running beside
/// it (the fault reports are one list for the process).
fn ffn_case(ty: RowType, seed: u64, layer: i32) -> (FfnNodes, Vec<f32>) {
    let shape = FfnShape {
        ty,
        d: 256,
        r: 64,
        f: 72,
        n: 3,
        k: 10,
    };
    ffn_nodes_of(shape, seed, layer)
}

#[test]
fn a_failing_ffn_thread_nans_exactly_its_share() {
    for (i, ty) in [RowType::Q8_0, RowType::F16].into_iter().enumerate() {
        let (nodes, _) = ffn_case(ty, 70 + i as u64, 7);
        check_fault_path(&nodes.up);
        nodes.up.run_all(1); // down's input
        check_fault_path(&nodes.down);
        check_fault_path(&nodes.fused);
        nodes.fused.run_all(1); // sum's input
        check_fault_path(&nodes.sum);
    }
}

#[test]
fn a_failing_attention_thread_nans_exactly_its_share() {
    let mut spec = Spec::new(64, 32, 8, 4, 5, 200);
    spec.k_keep = 16;
    let case = Case::build(spec);
    let mut params = spec.params();
    let ctx = Ctx::new(64 << 20);
    let ud: *mut c_void = (&mut params as *mut spark_backend::params::AttnParams).cast();
    let dst = build_op(&ctx, &case, ud, |_| {});
    check_fault_path(&Node {
        name: "spark_attn",
        layer: params.layer,
        dst,
        op: spark_attn,
        userdata: ud,
    });
}

/// Through ggml's own worker threads: a fault in any thread of the first FFN op makes the whole
/// FFN output NaN (every output element reads every partial / every neuron's u). Threads take
/// work chunks from a shared counter, so a thread may find none left; a claim hook makes the
/// other threads wait until the faulty one has claimed, so it owns at least one chunk.
#[test]
fn a_failing_thread_makes_the_whole_ffn_output_nan_in_a_ggml_graph() {
    quiet_injected_panics();
    let (nodes, _) = ffn_case(RowType::Q8_0, 80, 8);
    let c = &nodes.case;
    for fused_path in [true, false] {
        for n_threads in 1..=4 {
            for bad in 0..n_threads {
                let [_, first, out] = if fused_path {
                    let p = ffn::tiling::default_chunks(72);
                    c.ggml.spark_ffn_fused(c.h, c.k1, c.k2, c.v, p, &*c.params)
                } else {
                    c.ggml.spark_ffn(c.h, c.k1, c.k2, c.v, &*c.params)
                };
                let graph = c.ggml.graph(out);
                fault::arm(first, bad as usize);
                fault::set_claim_hook(first, bad_claims_first(bad as usize));
                Runner::new(n_threads).compute(graph);
                fault::clear_claim_hook(first);
                fault::disarm(first);
                let got = c.ggml.read(out);
                assert!(
                    got.iter().all(|x| x.is_nan()),
                    "fused {fused_path}: thread {bad} of {n_threads}"
                );
                // The same graph without the fault is finite again: nothing sticky.
                Runner::new(n_threads).compute(graph);
                assert!(c.ggml.read(out).iter().all(|x| x.is_finite()));
            }
        }
    }
}

/// A claim hook under which thread `bad` makes the first claim of a call: the others wait
/// before claiming until it has (for concurrently running threads only).
fn bad_claims_first(bad: usize) -> fault::ClaimHook {
    use std::sync::atomic::{AtomicBool, Ordering};
    let claimed = Arc::new(AtomicBool::new(false));
    Arc::new(move |event| match event {
        fault::ClaimEvent::Before { ith } if ith != bad => {
            while !claimed.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
        }
        fault::ClaimEvent::After { ith, .. } if ith == bad => {
            claimed.store(true, Ordering::Release)
        }
        _ => {}
    })
}

/// Bad parameters (null userdata, k < 1 with the top-k cutoff, an unknown `ffn_cutoff`, a
/// non-finite std multiplier) fail the checks on every thread: the whole output is NaN for every
/// thread count, with one line naming the op and the field.
#[test]
fn bad_parameters_nan_the_whole_output() {
    let (nodes, scores) = ffn_case(RowType::Q8_0, 90, 9);
    let c = &nodes.case;
    // SAFETY: c.h is a live tensor of c.ggml.
    let (d, n) = unsafe { ((*c.h).ne[0] as usize, (*c.h).ne[1] as usize) };
    let f = scores.len() / n;
    let st = c.ggml.f32_tensor(f, n, &scores);
    use spark_backend::params::FFN_CUTOFF_STD_MUL;
    let bad = [
        (
            OpParams {
                layer: 5,
                k: 0,
                ..Default::default()
            },
            "k = 0 (must be >= 1)",
        ),
        (
            OpParams {
                layer: 6,
                k: 10,
                ffn_cutoff: 2,
                ..Default::default()
            },
            "ffn_cutoff = 2 (must be 0 = SPARK_FFN_CUTOFF_TOP_K or 1 = SPARK_FFN_CUTOFF_STD_MUL)",
        ),
        (
            OpParams {
                layer: 7,
                ffn_cutoff: FFN_CUTOFF_STD_MUL,
                ffn_z: f32::NAN,
                ..Default::default()
            },
            "ffn_z = NaN (must be finite with SPARK_FFN_CUTOFF_STD_MUL)",
        ),
        (
            OpParams {
                layer: 8,
                ffn_cutoff: FFN_CUTOFF_STD_MUL,
                ffn_z: f32::INFINITY,
                ..Default::default()
            },
            "ffn_z = inf (must be finite with SPARK_FFN_CUTOFF_STD_MUL)",
        ),
    ]
    .map(|(p, why)| (Box::new(p), why));
    let mut cases = vec![(
        std::ptr::null_mut(),
        "?".to_string(),
        spark_backend::params::MISSING,
    )];
    for (p, why) in &bad {
        let ud = (&**p as *const OpParams).cast_mut().cast::<c_void>();
        cases.push((ud, p.layer.to_string(), why));
    }
    for (userdata, layer, reason) in cases {
        for (name, op, ne) in [
            ("spark_ffn_up", spark_ffn_up as OpFn, vec![n, f]),
            ("spark_ffn_fused", spark_ffn_fused as OpFn, vec![d, n, 4]),
        ] {
            let mut args = if name == "spark_ffn_up" {
                vec![st, c.h, c.k2]
            } else {
                vec![st, c.h, c.k2, c.v]
            };
            let dst = c.ggml.custom(&ne, &mut args, op, userdata.cast());
            let nd = Node {
                name,
                layer: 0,
                dst,
                op,
                userdata,
            };
            for nth in 1..=4 {
                nd.set(SENTINEL);
                let since = fault::reports().len();
                nd.run_all(nth);
                assert!(nd.read().iter().all(|x| x.is_nan()), "{name} {nth}");
                let line = format!(
                    "spark-backend: {name}: layer {layer}: invalid parameter: {reason}; \
                     output set to NaN"
                );
                assert_eq!(count_lines(&line, since), 1, "{line}");
            }
        }
    }
}
