//! One Spark custom-op node called by hand through its C entry point, as ggml's worker threads
//! call it (`fun(dst, ith, nth, userdata)`): what the op tests share (`op_faults`,
//! `op_schedules`, `op_many_threads`). Each test file adds the ways it calls a node.

#![allow(dead_code)]

use crate::ffn_helpers::{op_case, OpCase, Rng};
use llama_cpp_sys_2 as sys;
use spark_backend::ffn::cpu_ops::{spark_ffn_down, spark_ffn_fused, spark_ffn_sum, spark_ffn_up};
use spark_backend::ffn::{self, Batch};
use spark_backend::params::OpParams;
use spark_backend::rows::RowType;
use std::ffi::c_void;

/// A custom op's C entry point (`ggml_custom_op_t`).
pub type OpFn = unsafe extern "C" fn(*mut sys::ggml_tensor, i32, i32, *mut c_void);

/// One custom-op node: its output tensor (with its sources and parameters in a live ggml
/// context), the op, and the userdata the op is called with.
#[derive(Clone, Copy)]
pub struct Node {
    /// The op's name, as its failure lines give it.
    pub name: &'static str,
    /// The layer its parameters name, as its failure lines give it.
    pub layer: i32,
    pub dst: *mut sys::ggml_tensor,
    pub op: OpFn,
    pub userdata: *mut c_void,
}

// SAFETY: the tensors and params a Node points to outlive every thread the tests start (scoped
// threads), and ggml custom ops are made to be called from several threads at once.
unsafe impl Send for Node {}
// SAFETY: as above; a Node is only read.
unsafe impl Sync for Node {}

impl Node {
    /// Thread `ith` of `nth`'s call.
    pub fn call(&self, ith: i32, nth: i32) {
        self.call_with(ith, nth, self.userdata);
    }

    /// Thread `ith` of `nth`'s call with other userdata (one the op must reject).
    pub fn call_with(&self, ith: i32, nth: i32, userdata: *mut c_void) {
        // SAFETY: dst is a live custom-op tensor of a live context, built with its sources and
        // userdata as the op's contract requires (or with userdata the op rejects).
        unsafe { (self.op)(self.dst, ith, nth, userdata) };
    }

    /// Every thread's call of one evaluation, one after another.
    pub fn run_all(&self, nth: i32) {
        for ith in 0..nth {
            self.call(ith, nth);
        }
    }

    pub fn len(&self) -> usize {
        // SAFETY: dst is a live tensor.
        unsafe { sys::ggml_nelements(self.dst) as usize }
    }

    pub fn read(&self) -> Vec<f32> {
        // SAFETY: dst is a live, contiguous f32 tensor; no op runs meanwhile.
        unsafe { std::slice::from_raw_parts((*self.dst).data.cast::<f32>(), self.len()).to_vec() }
    }

    pub fn set(&self, v: f32) {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts_mut((*self.dst).data.cast::<f32>(), self.len()) }
            .fill(v);
    }
}

/// The FFN case: its four nodes (fused and sum read each other's output; up feeds down). The
/// context and params live in `OpCase`.
pub struct FfnNodes {
    /// The context, tensors and params the nodes point to.
    pub case: OpCase,
    pub up: Node,
    pub down: Node,
    pub fused: Node,
    pub sum: Node,
}

/// The shape of an FFN case: row type, D, r_f, F, tokens, k_f.
#[derive(Clone, Copy, Debug)]
pub struct FfnShape {
    pub ty: RowType,
    pub d: usize,
    pub r: usize,
    pub f: usize,
    pub n: usize,
    pub k: i32,
}

/// D 1024 (q8_0: 32 blocks of 32), r_f 256, F 600 (P = 16 chunks of 37-38 neurons), `n` tokens,
/// k_f 60, statistics in `layer`: several chunks per op (fused 16 x token groups, sum up to 64
/// element blocks, up 5 neuron blocks, down 4 column blocks).
pub fn ffn_nodes(n: usize, seed: u64, layer: i32) -> FfnNodes {
    let shape = FfnShape {
        ty: RowType::Q8_0,
        d: 1024,
        r: 256,
        f: 600,
        n,
        k: 60,
    };
    ffn_nodes_of(shape, seed, layer).0
}

/// The four FFN nodes of a random case of `shape` (weights and inputs from `seed`, statistics in
/// `layer`), and the predictor scores they read.
pub fn ffn_nodes_of(shape: FfnShape, seed: u64, layer: i32) -> (FfnNodes, Vec<f32>) {
    let FfnShape { ty, d, r, f, n, k } = shape;
    let mut rng = Rng::new(seed);
    let (c, [k1, _, _], h) = op_case(&mut rng, ty, d, r, f, n, k, layer);
    let mut scores = vec![0f32; n * f];
    let batch = Batch {
        h: &h,
        stride: d,
        width: d,
        n_tokens: n,
    };
    ffn::predictor_scores(&k1.matrix(), &batch, &mut scores).unwrap();
    let params = &*c.params as *const OpParams;
    let userdata = params.cast_mut().cast::<c_void>();
    let st = c.ggml.f32_tensor(f, n, &scores);
    let p = ffn::tiling::default_chunks(f);
    let u = c
        .ggml
        .custom(&[n, f], &mut [st, c.h, c.k2], spark_ffn_up, params);
    let down = c
        .ggml
        .custom(&[d, n], &mut [u, c.v], spark_ffn_down, params);
    let partials = c.ggml.custom(
        &[d, n, p],
        &mut [st, c.h, c.k2, c.v],
        spark_ffn_fused,
        params,
    );
    let sum = c
        .ggml
        .custom(&[d, n], &mut [partials], spark_ffn_sum, params);
    let node = |name, dst, op| Node {
        name,
        layer,
        dst,
        op,
        userdata,
    };
    let nodes = FfnNodes {
        up: node("spark_ffn_up", u, spark_ffn_up),
        down: node("spark_ffn_down", down, spark_ffn_down),
        fused: node("spark_ffn_fused", partials, spark_ffn_fused),
        sum: node("spark_ffn_sum", sum, spark_ffn_sum),
        case: c,
    };
    (nodes, scores)
}
