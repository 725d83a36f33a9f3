//! Spark sparse attention (SPEC.md section 4) on llama.cpp's KV cache.
//!
//! For query token t and head n (KV head g = n / (N / KV)), with C the positions its mask row
//! marks valid (exactly 0):
//!
//! ```text
//! s1_j = capA(q1 . k1_j)                    j in C, over dims 0..r
//! S    = C if |C| <= k, else the statistical top-k (attention form) of s1 over C
//! w_j  = softmax_S(s1)_j * softplus(q2 . k2_j)   dims r..H, j in S only
//! o    = sum_{j in S} w_j v_j
//! ```
//!
//! A query with no valid position gets a zero output row. Scores are f32 (caches are widened
//! from f16 on load), the top-k statistics f64 (`crate::topk`), the softmax max-subtracted with
//! an f64 normaliser, softplus as `max(x, 0) + ln(1 + e^-|x|)`.
//!
//! [`SparseAttention`] validates the tensors of one call and runs any share of it.
//!
//! Everything about it lives in this folder: `layout.rs` reads a call's tensors
//! ([`AttnCall`]) and checks their shapes ([`AttnLayout`], one set of checks for the CPU op and
//! the CUDA launcher); `kernel.rs` the CPU kernel over work units, with its inner loops in
//! `dot.rs` (dot products and value accumulation, scalar and AVX2) and `math.rs` (exp, tanh,
//! softplus); `cpu_op.rs` the ggml custom op `spark_attn` (the C entry point); `cuda_plan.rs` the
//! CUDA plan (checks and launch sequence, a pure function built without CUDA) and `attn.cu` its
//! kernels; `cuda_launch.rs` the launcher ggml-cuda calls (feature `cuda`); `path.rs` whether a
//! ubatch takes the op or the graph's dense attention (`spark_attn_path`, asked by the graph).

pub mod cpu_op;
#[cfg(feature = "cuda")]
pub(crate) mod cuda_launch;
pub mod cuda_plan;
pub(crate) mod dot;
mod kernel;
pub(crate) mod layout;
mod math;
pub mod path;

pub(crate) use kernel::{RowSelection, Tally, Tiling};
pub use layout::AttnCall;
pub(crate) use layout::AttnLayout;

use crate::params::AttnParams;
use crate::KernelError;

/// One validated `spark_attn` call: the tensors and parameters, cut into work units for a
/// thread count, ready to run on any thread share.
#[derive(Debug, Clone, Copy)]
pub struct SparseAttention {
    layout: AttnLayout,
    tiling: Tiling,
}

impl SparseAttention {
    /// Validates the call's tensors (see [`layout`]) and `params`; the work units are those of
    /// a call on one thread until [`with_threads`](Self::with_threads).
    pub fn new(call: &AttnCall, params: &AttnParams) -> Result<Self, KernelError> {
        let layout = AttnLayout::new(call, params)?;
        Ok(Self {
            layout,
            tiling: Tiling::new(&layout, 1),
        })
    }

    /// The same call cut into the work units for `nth` threads ([`Tiling`]; the output is
    /// bit-identical for every tiling).
    pub fn with_threads(self, nth: usize) -> Self {
        Self {
            tiling: Tiling::new(&self.layout, nth),
            ..self
        }
    }

    /// How the call is cut into work units.
    pub fn tiling(&self) -> Tiling {
        self.tiling
    }

    /// Number of independent work units (threads beyond this stay idle).
    pub(crate) fn n_units(&self) -> usize {
        kernel::n_units(&self.layout, self.tiling)
    }

    /// Computes thread `ith`'s share of the output (of `nth` threads; every thread of a call must
    /// run for the whole output to be written) and adds its counts to `crate::stats`.
    ///
    /// # Safety
    /// The tensors' data pointers must be valid for their shapes and strides (dst writable) for
    /// the whole call, and nothing else may access dst while the threads run.
    pub unsafe fn run(&self, ith: usize, nth: usize) -> Tally {
        // SAFETY: forwarded contract.
        let tally = unsafe { kernel::run(&self.layout, self.tiling, ith, nth, None) };
        crate::stats::record_attn(self.layout.layer, tally.kept, tally.queries);
        tally
    }

    /// Computes the output rows of every work unit `units` yields (indices below
    /// [`n_units`](Self::n_units); others are skipped), each as [`run`](Self::run) computes it,
    /// and adds the counts to `crate::stats`. The `spark_attn` op runs this over the units a
    /// thread claims.
    ///
    /// # Safety
    /// As for [`run`](Self::run), and no other thread computes the same units meanwhile.
    pub(crate) unsafe fn run_units(&self, units: &mut dyn Iterator<Item = usize>) -> Tally {
        // SAFETY: forwarded contract.
        let tally = unsafe { kernel::run_units(&self.layout, self.tiling, units, None) };
        crate::stats::record_attn(self.layout.layer, tally.kept, tally.queries);
        tally
    }

    /// Writes `value` into the dst rows of work unit `u` (used to make a failed unit visible).
    ///
    /// # Safety
    /// As for [`run_units`](Self::run_units), for unit `u`.
    pub(crate) unsafe fn fill_unit(&self, u: usize, value: f32) {
        // SAFETY: forwarded contract.
        unsafe { kernel::fill_unit(&self.layout, self.tiling, u, value) }
    }

    /// [`run`](Self::run), reporting every query's kept positions to `observer` (for tests and
    /// diagnostics; does not record statistics).
    ///
    /// # Safety
    /// As for [`run`](Self::run).
    pub unsafe fn run_observed(
        &self,
        ith: usize,
        nth: usize,
        observer: &mut dyn FnMut(&RowSelection),
    ) -> Tally {
        // SAFETY: forwarded contract.
        unsafe { kernel::run(&self.layout, self.tiling, ith, nth, Some(observer)) }
    }
}
