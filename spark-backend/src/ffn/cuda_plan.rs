//! The FFN ops on the GPU (feature `cuda` for the launchers; the plans are always built): the
//! CUDA plans and launchers of `spark_ffn_fused`, `spark_ffn_sum`, `spark_ffn_up` and
//! `spark_ffn_down` (kernels in `ffn.cu`, this folder), matching the CPU ops of `super::cpu_op`
//! (docs/INTERFACES.md): same outputs and layouts, exact zeros for dropped neurons, chunk
//! partials summed in increasing neuron order, deterministic.
//!
//! A launcher checks its node from metadata only ([`fused`], [`up`], [`down`], [`sum`]: the
//! shape rules of `super::shapes` that the CPU ops apply, plus the kernels' own limits,
//! `crate::cuda::check`) into a plan; the plan then fixes the launch sequence (kernel, grid,
//! block, arguments in order; [`FusedPlan::launches`] and the like) over one scratch allocation
//! it lays out ([`ScratchLayout`]). Both are pure functions of the tensors' shapes, strides,
//! types and addresses: the tests run them on host-only tensors, and the CPU emulation test
//! (tests/cuda_emu) runs these very launches through g++.
//!
//! Per op, the kernels enqueued on ggml's stream:
//! - `spark_ffn_fused`, T <= [`SPARSE_MAX_TOKENS`] (decode): two kernels. Select-up (32
//!   neurons per block; every block computes its token's threshold itself, then the up dots
//!   of its active neurons: gated values `u` [F, T] in scratch, exact zeros), then gather (per
//!   128 columns, token and chunk: the chunk's nonzero u compacted in shared memory, one
//!   thread per output value over the active V rows).
//! - `spark_ffn_fused`, more tokens: threshold (one block per token) -> up (one warp per
//!   neuron) -> the tiled V accumulation (32 tokens x 64 columns per block; V rows no token of
//!   the tile uses are skipped). Both paths give bit-identical u and accumulate the same
//!   products in the same order.
//! - `spark_ffn_up`: threshold -> up, straight into dst.
//! - `spark_ffn_down`: the tiled V accumulation over all F neurons (one chunk).
//! - `spark_ffn_sum`: one thread per output value, partials added in chunk order.
//!
//! With the `cuda` feature, `super::cuda_launch` holds the launchers ggml-cuda calls, which
//! enqueue these plans.

use super::shapes::{self, StageDims};
use super::tiling;
/// A weight as the kernels read it (type, address, row stride, shape).
pub use crate::cuda::check::GpuWeight;
use crate::cuda::check::{expect_f32_rows, weight};
use crate::cuda::CudaSource;
use crate::tensor::{views, TensorView};
use crate::topk::Cutoff;
use crate::KernelError;
use llama_cpp_sys_2 as sys;
use std::ffi::c_void;

/// The CUDA C of the FFN kernels, compiled by NVRTC at first use per device.
pub(crate) const KERNELS: CudaSource = CudaSource {
    name: "ffn.cu",
    text: include_str!("ffn.cu"),
};

/// The fused path compacts active neurons per token up to this many tokens, and uses the tiled
/// accumulation above (where nearly every V row is active for some token of a tile).
pub const SPARSE_MAX_TOKENS: usize = 8;

/// Threads per block of every FFN kernel but the threshold and the gather.
pub(crate) const THREADS: u32 = 256;

/// Neurons per block of `spark_ffn_select_up` (`SPARK_SELECT_NEURONS` in ffn.cu).
pub const SELECT_NEURONS: usize = 32;

/// Threads per block of `spark_ffn_gather` (`SPARK_GATHER_THREADS`): one output column each.
pub(crate) const GATHER_THREADS: u32 = 128;

/// Threads per block of `spark_ffn_threshold` (`SPARK_THRESHOLD_THREADS` in ffn.cu): one block
/// per token computes the statistics of all F scores, so the block is as wide as CUDA allows.
pub(crate) const THRESHOLD_THREADS: u32 = 1024;

/// The inputs `spark_ffn_up` and `spark_ffn_fused` share, checked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StagePlan {
    /// Layer (statistics, messages).
    pub layer: i32,
    /// How each token's threshold is set (`TopK(k)`: k >= 1, k >= F is dense).
    pub cutoff: Cutoff,
    /// F.
    pub f: usize,
    /// D.
    pub d: usize,
    /// Tokens.
    pub n_tokens: usize,
    /// Scores [F, n_tokens], contiguous f32.
    pub s: u64,
    /// h [D, n_tokens] f32; row t at `h + t * h_stride` bytes.
    pub h: u64,
    /// Bytes between rows of h.
    pub h_stride: u64,
    /// K2: F rows of D - r_f.
    pub k2: GpuWeight,
}

impl StagePlan {
    /// F, D and the tokens, as the shared shape rules name them.
    pub(crate) fn dims(&self) -> StageDims {
        StageDims {
            f: self.f,
            d: self.d,
            n_tokens: self.n_tokens,
        }
    }

    /// r_f = D - (columns of K2), `0 <= r_f < D`.
    pub fn r_f(&self) -> usize {
        self.d - self.k2.cols
    }

    /// True when every neuron is kept, unshifted (`TopK(k)` with k >= F).
    pub fn dense(&self) -> bool {
        self.cutoff.dense(self.f)
    }

    /// The multiplier z of `theta = mean + std * z` the threshold kernel gets from the host
    /// ([`Cutoff::z`]: Q(1 - k/F), or the given std multiplier); 0 when dense (unused).
    pub fn z(&self) -> f64 {
        self.cutoff.z(self.f).unwrap_or(0.0)
    }
}

/// `spark_ffn_fused`, checked: writes partials [D, n_tokens, P] (contiguous) at `out`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FusedPlan {
    /// Scores, h, K2, cutoff.
    pub stage: StagePlan,
    /// V: F rows of D.
    pub v: GpuWeight,
    /// P, the number of chunks.
    pub p: usize,
    /// Device address of dst.
    pub out: u64,
}

/// `spark_ffn_up`, checked: writes u [n_tokens, F] (contiguous, neuron-major) at `out`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UpPlan {
    /// Scores, h, K2, cutoff.
    pub stage: StagePlan,
    /// Device address of dst.
    pub out: u64,
}

/// `spark_ffn_down`, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DownPlan {
    /// u [n_tokens, F], contiguous f32.
    pub u: u64,
    /// V: F rows of D.
    pub v: GpuWeight,
    /// Tokens.
    pub n_tokens: usize,
    /// Device address of dst [D, n_tokens].
    pub out: u64,
    /// Floats between dst rows.
    pub out_row: usize,
}

/// `spark_ffn_sum`, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SumPlan {
    /// Partials [D, n_tokens, P], contiguous f32.
    pub partials: u64,
    /// D.
    pub d: usize,
    /// Tokens.
    pub n_tokens: usize,
    /// P.
    pub p: usize,
    /// Device address of dst [D, n_tokens].
    pub out: u64,
    /// Floats between dst rows.
    pub out_row: usize,
}

fn stage(
    s: &TensorView,
    h: &TensorView,
    k2: &TensorView,
    params: (i32, Cutoff),
) -> Result<StagePlan, KernelError> {
    let (layer, cutoff) = params;
    let StageDims { f, d, n_tokens } = shapes::stage(s, h, k2)?;
    // The kernels' own limits: 32-bit sizes and 4-byte aligned f32 data.
    expect_f32_rows(s, "scores")?;
    expect_f32_rows(h, "h")?;
    let k2w = weight(k2, "ffn_up")?;
    if f == 0 || n_tokens == 0 {
        return Err(KernelError::Shape(format!(
            "F = {f}, n_tokens = {n_tokens}: nothing to compute"
        )));
    }
    Ok(StagePlan {
        layer,
        cutoff,
        f,
        d,
        n_tokens,
        s: s.data as u64,
        h: h.data as u64,
        h_stride: h.nb[1] as u64,
        k2: k2w,
    })
}

/// Checks `spark_ffn_fused`'s tensors (docs/INTERFACES.md).
///
/// # Safety
/// As ggml calls a custom op: `dst` null or live with live sources, `userdata` null or a
/// `spark_op_params`.
pub unsafe fn fused(
    dst: *const sys::ggml_tensor,
    params_block: *const c_void,
) -> Result<FusedPlan, KernelError> {
    // SAFETY: forwarded contract.
    let (out, [s, h, k2, v]) = unsafe { views::<4>(dst)? };
    // SAFETY: forwarded contract.
    let params = unsafe { crate::params::read_ffn(params_block)? };
    let stage = stage(&s, &h, &k2, params)?;
    let p = shapes::fused_dst(stage.dims(), &v, &out)?;
    let vw = weight(&v, "ffn_down_t")?;
    expect_f32_rows(&out, "dst")?;
    Ok(FusedPlan {
        stage,
        v: vw,
        p,
        out: out.data as u64,
    })
}

/// Checks `spark_ffn_up`'s tensors.
///
/// # Safety
/// As for [`fused`].
pub unsafe fn up(
    dst: *const sys::ggml_tensor,
    params_block: *const c_void,
) -> Result<UpPlan, KernelError> {
    // SAFETY: forwarded contract.
    let (out, [s, h, k2]) = unsafe { views::<3>(dst)? };
    // SAFETY: forwarded contract.
    let params = unsafe { crate::params::read_ffn(params_block)? };
    let stage = stage(&s, &h, &k2, params)?;
    shapes::up_dst(stage.dims(), &out)?;
    expect_f32_rows(&out, "dst")?;
    Ok(UpPlan {
        stage,
        out: out.data as u64,
    })
}

/// Checks `spark_ffn_down`'s tensors (its parameter block is not read).
///
/// # Safety
/// `dst` null or live with live sources.
pub unsafe fn down(dst: *const sys::ggml_tensor) -> Result<DownPlan, KernelError> {
    // SAFETY: forwarded contract.
    let (out, [u, v]) = unsafe { views::<2>(dst)? };
    let (n_tokens, _, _) = shapes::down(&u, &v, &out)?;
    expect_f32_rows(&u, "u")?;
    let vw = weight(&v, "ffn_down_t")?;
    expect_f32_rows(&out, "dst")?;
    Ok(DownPlan {
        u: u.data as u64,
        v: vw,
        n_tokens,
        out: out.data as u64,
        out_row: out.nb[1] / 4,
    })
}

/// Checks `spark_ffn_sum`'s tensors (its parameter block is not read).
///
/// # Safety
/// `dst` null or live with live sources.
pub unsafe fn sum(dst: *const sys::ggml_tensor) -> Result<SumPlan, KernelError> {
    // SAFETY: forwarded contract.
    let (out, [partials]) = unsafe { views::<1>(dst)? };
    let (d, n_tokens, p) = shapes::sum(&partials, &out)?;
    expect_f32_rows(&partials, "partials")?;
    expect_f32_rows(&out, "dst")?;
    Ok(SumPlan {
        partials: partials.data as u64,
        d,
        n_tokens,
        p,
        out: out.data as u64,
        out_row: out.nb[1] / 4,
    })
}

/// The kernels of `ffn.cu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnKernel {
    /// `spark_ffn_threshold`.
    Threshold,
    /// `spark_ffn_up`.
    Up,
    /// `spark_ffn_select_up`.
    SelectUp,
    /// `spark_ffn_gather`.
    Gather,
    /// `spark_ffn_v_tiled`.
    VTiled,
    /// `spark_ffn_sum`.
    Sum,
}

impl FfnKernel {
    /// Every kernel.
    pub const ALL: [FfnKernel; 6] = [
        FfnKernel::Threshold,
        FfnKernel::Up,
        FfnKernel::SelectUp,
        FfnKernel::Gather,
        FfnKernel::VTiled,
        FfnKernel::Sum,
    ];

    /// Threads per block the kernel is written for (its `__launch_bounds__`).
    pub fn threads(self) -> u32 {
        match self {
            FfnKernel::Threshold => THRESHOLD_THREADS,
            FfnKernel::Gather => GATHER_THREADS,
            _ => THREADS,
        }
    }

    /// The `extern "C"` name in ffn.cu.
    pub fn name(self) -> &'static str {
        match self {
            FfnKernel::Threshold => "spark_ffn_threshold",
            FfnKernel::Up => "spark_ffn_up",
            FfnKernel::SelectUp => "spark_ffn_select_up",
            FfnKernel::Gather => "spark_ffn_gather",
            FfnKernel::VTiled => "spark_ffn_v_tiled",
            FfnKernel::Sum => "spark_ffn_sum",
        }
    }
}

/// One kernel argument, passed by value (C types `T*`, `int`, `long long`, `double`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg {
    /// A device address.
    Ptr(u64),
    /// `int`.
    I32(i32),
    /// `long long` (`i64` in ffn.cu).
    I64(i64),
    /// `double`.
    F64(f64),
}

/// One kernel launch: grid, block (x only) and the kernel's arguments in order.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// Which kernel.
    pub kernel: FfnKernel,
    /// Grid dimensions.
    pub grid: (u32, u32, u32),
    /// Threads per block.
    pub block: u32,
    /// The arguments, in the kernel's parameter order.
    pub args: Vec<Arg>,
}

fn launch(kernel: FfnKernel, grid: (u32, u32, u32), args: Vec<Arg>) -> Launch {
    Launch {
        kernel,
        grid,
        block: kernel.threads(),
        args,
    }
}

fn int(name: &str, v: usize) -> Result<Arg, String> {
    i32::try_from(v)
        .map(Arg::I32)
        .map_err(|_| format!("{name} = {v} beyond the kernels' 32-bit indices"))
}

fn grid(name: &str, v: usize, max: usize) -> Result<u32, String> {
    if v == 0 || v > max {
        return Err(format!("{name}: {v} blocks outside 1..={max}"));
    }
    Ok(v as u32)
}

/// Largest `gridDim.x` the launches use (the kernels index blocks with `int`).
const MAX_GRID_X: usize = i32::MAX as usize;
/// Largest `gridDim.y` / `gridDim.z`.
const MAX_GRID_YZ: usize = 65_535;

/// Where a launcher's scratch buffers lie in its one allocation: byte offsets, 256-byte aligned
/// (as device allocations are). A buffer an op does not use has no bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScratchLayout {
    /// f32 `[T]`: each token's threshold.
    pub theta: usize,
    /// u32 `[kept_len]`: kept counts whose sum is the op's (copied to the host only for
    /// statistics): one per token, or with select-up one per (token, block).
    pub kept: usize,
    /// How many u32 counts `kept` holds.
    pub kept_len: usize,
    /// f32 [F, T]: the gated values u, neuron-major (`spark_ffn_fused`; `spark_ffn_up` writes
    /// them into dst).
    pub u: usize,
    /// f32 [P', T, D]: chunk partials when `spark_ffn_fused` adds its own chunks (dst of one
    /// chunk, [`FusedPlan::own_chunks`]).
    pub partials: usize,
    /// u32 `[done_len]`: spark_ffn_gather's counters when it adds the chunks (zeroed by
    /// select-up).
    pub done: usize,
    /// How many counters `done` holds.
    pub done_len: usize,
    /// Bytes in all (at least 4).
    pub total: usize,
}

/// The sizes a [`ScratchLayout`] lays out.
#[derive(Debug, Clone, Copy, Default)]
struct ScratchSizes {
    n_tokens: usize,
    kept_len: usize,
    u_bytes: usize,
    partial_bytes: usize,
    done_len: usize,
}

impl ScratchLayout {
    /// Thresholds of `n_tokens`, `kept_len` kept counts, `u_bytes` bytes of u, `partial_bytes`
    /// of partials and `done_len` counters, in that order.
    fn new(z: ScratchSizes) -> Self {
        let mut end = 0usize;
        let [theta, kept, u, partials, done] = [
            4 * z.n_tokens,
            4 * z.kept_len,
            z.u_bytes,
            z.partial_bytes,
            4 * z.done_len,
        ]
        .map(|b| {
            let at = end.next_multiple_of(256);
            end = at + b;
            at
        });
        Self {
            theta,
            kept,
            kept_len: z.kept_len,
            u,
            partials,
            done,
            done_len: z.done_len,
            total: end.max(4),
        }
    }
}

impl StagePlan {
    /// Threshold, then up: thresholds and kept counts at `theta` and `kept`, u [F, T] at `u`.
    fn launches(&self, theta: u64, kept: u64, u: u64) -> Result<[Launch; 2], String> {
        let (f, t) = (int("F", self.f)?, int("n_tokens", self.n_tokens)?);
        let dense = Arg::I32(i32::from(self.dense()));
        let q = self.z();
        let threshold = launch(
            FfnKernel::Threshold,
            (grid("tokens", self.n_tokens, MAX_GRID_X)?, 1, 1),
            vec![
                Arg::Ptr(self.s),
                f,
                dense,
                Arg::F64(q),
                Arg::Ptr(theta),
                Arg::Ptr(kept),
            ],
        );
        let mut up_args = vec![Arg::Ptr(self.s), f, t, Arg::Ptr(theta), dense];
        up_args.extend(self.up_args()?);
        up_args.push(Arg::Ptr(u));
        let up = launch(
            FfnKernel::Up,
            (grid("neuron groups", self.f.div_ceil(8), MAX_GRID_X)?, 1, 1),
            up_args,
        );
        Ok([threshold, up])
    }

    /// Select-up (T <= [`SPARSE_MAX_TOKENS`]): thresholds computed per block, u [F, T] at `u`;
    /// token thresholds at `theta` and per-(token, block) kept counts at `kept`
    /// ([`Self::select_blocks`] per token); zeroes `done_len` counters at `done`.
    fn select_up_launch(
        &self,
        theta: u64,
        kept: u64,
        u: u64,
        (done, done_len): (u64, usize),
    ) -> Result<Launch, String> {
        let (f, t) = (int("F", self.f)?, int("n_tokens", self.n_tokens)?);
        let mut args = vec![
            Arg::Ptr(self.s),
            f,
            t,
            Arg::I32(i32::from(self.dense())),
            Arg::F64(self.z()),
        ];
        args.extend(self.up_args()?);
        args.extend([
            Arg::Ptr(u),
            Arg::Ptr(theta),
            Arg::Ptr(kept),
            Arg::Ptr(done),
            int("counters", done_len)?,
        ]);
        Ok(launch(
            FfnKernel::SelectUp,
            (
                grid("neuron blocks", self.select_blocks(), MAX_GRID_X)?,
                grid("tokens", self.n_tokens, MAX_GRID_YZ)?,
                1,
            ),
            args,
        ))
    }

    /// The up dots' inputs, as spark_ffn_up and spark_ffn_select_up take them in this order:
    /// h, its row stride, r_f, K2, its row stride and type, K2's columns.
    fn up_args(&self) -> Result<[Arg; 7], String> {
        Ok([
            Arg::Ptr(self.h),
            Arg::I64(self.h_stride as i64),
            int("r_f", self.r_f())?,
            Arg::Ptr(self.k2.ptr),
            Arg::I64(self.k2.row_stride as i64),
            Arg::I32(self.k2.ty as i32),
            int("K2 columns", self.k2.cols)?,
        ])
    }

    /// Blocks of select-up per token: [`SELECT_NEURONS`] neurons each.
    pub fn select_blocks(&self) -> usize {
        self.f.div_ceil(SELECT_NEURONS)
    }
}

/// The tiled V accumulation: chunk c of `p` ([c*F/p, (c+1)*F/p)) of u [F, T] at `u` into plane
/// c of `out` (T rows of `out_row` floats per plane, planes `plane` floats apart).
#[allow(clippy::too_many_arguments)]
fn v_tiled(
    u: u64,
    f: usize,
    t: usize,
    p: usize,
    v: &GpuWeight,
    out: u64,
    out_row: usize,
    plane: usize,
) -> Result<Launch, String> {
    let (fi, ti, pi, di) = (
        int("F", f)?,
        int("n_tokens", t)?,
        int("P", p)?,
        int("D", v.cols)?,
    );
    let g = (
        grid("column tiles", v.cols.div_ceil(64), MAX_GRID_X)?,
        grid("token tiles", t.div_ceil(32), MAX_GRID_YZ)?,
        grid("chunks", p, MAX_GRID_YZ)?,
    );
    Ok(launch(
        FfnKernel::VTiled,
        g,
        vec![
            Arg::Ptr(u),
            fi,
            ti,
            pi,
            Arg::Ptr(v.ptr),
            Arg::I64(v.row_stride as i64),
            Arg::I32(v.ty as i32),
            di,
            Arg::Ptr(out),
            Arg::I64(out_row as i64),
            Arg::I64(plane as i64),
        ],
    ))
}

impl FusedPlan {
    /// The chunks the kernels cut F into, and whether the op adds them itself: with a dst of one
    /// chunk (what `spark_ffn_tiling` answers for CUDA, so that no sum node follows) the kernels
    /// still cut F into [`tiling::default_chunks`] (16) chunks for parallelism and add them in
    /// chunk order at the end, as spark_ffn_fused (16 chunks) + spark_ffn_sum would; with P > 1
    /// they write the graph's P partials.
    pub fn own_chunks(&self) -> (usize, bool) {
        if self.p == 1 {
            let c = tiling::default_chunks(self.stage.f);
            (c, c > 1)
        } else {
            (self.p, false)
        }
    }

    /// The scratch of [`launches`](Self::launches): thresholds, kept counts (per token and
    /// select-up block for T <= [`SPARSE_MAX_TOKENS`], else per token), u, and when the op
    /// adds its own chunks their partials and (T <= [`SPARSE_MAX_TOKENS`]) the gather's
    /// counters.
    pub fn scratch(&self) -> ScratchLayout {
        let (f, t, d) = (self.stage.f, self.stage.n_tokens, self.stage.d);
        let sparse = t <= SPARSE_MAX_TOKENS;
        let (chunks, own) = self.own_chunks();
        ScratchLayout::new(ScratchSizes {
            n_tokens: t,
            kept_len: if sparse {
                t * self.stage.select_blocks()
            } else {
                t
            },
            u_bytes: 4 * f * t,
            partial_bytes: if own { 4 * chunks * t * d } else { 0 },
            done_len: if own && sparse {
                t * d.div_ceil(GATHER_THREADS as usize)
            } else {
                0
            },
        })
    }

    /// The launch sequence with [`scratch`](Self::scratch) at device address `scratch`: two
    /// kernels for T <= [`SPARSE_MAX_TOKENS`] (select-up, gather), else threshold, up, the
    /// tiled accumulation and, when the op adds its own chunks, the sum kernel.
    pub fn launches(&self, scratch: u64) -> Result<Vec<Launch>, String> {
        let st = &self.stage;
        let (f, t, d) = (st.f, st.n_tokens, st.d);
        let (p, own) = self.own_chunks();
        let sc = self.scratch();
        let at = |off: usize| scratch + off as u64;
        let u = at(sc.u);
        // the chunks' partials: scratch when the op adds them, else dst
        let partials = if own { at(sc.partials) } else { self.out };
        if t > SPARSE_MAX_TOKENS {
            let mut out = Vec::from(st.launches(at(sc.theta), at(sc.kept), u)?);
            out.push(v_tiled(u, f, t, p, &self.v, partials, d, d * t)?);
            if own {
                let sum = SumPlan {
                    partials,
                    d,
                    n_tokens: t,
                    p,
                    out: self.out,
                    out_row: d,
                };
                out.extend(sum.launches()?);
            }
            return Ok(out);
        }
        let (done, done_len) = if own {
            (at(sc.done), sc.done_len)
        } else {
            (0, 0)
        };
        let select = st.select_up_launch(at(sc.theta), at(sc.kept), u, (done, done_len))?;
        let (fi, ti, pi, di) = (
            int("F", f)?,
            int("n_tokens", t)?,
            int("P", p)?,
            int("D", d)?,
        );
        let gather = launch(
            FfnKernel::Gather,
            (
                grid(
                    "column blocks",
                    d.div_ceil(GATHER_THREADS as usize),
                    MAX_GRID_X,
                )?,
                grid("tokens", t, MAX_GRID_YZ)?,
                grid("chunks", p, MAX_GRID_YZ)?,
            ),
            vec![
                Arg::Ptr(u),
                fi,
                ti,
                pi,
                Arg::Ptr(self.v.ptr),
                Arg::I64(self.v.row_stride as i64),
                Arg::I32(self.v.ty as i32),
                di,
                Arg::Ptr(partials),
                Arg::Ptr(if own { self.out } else { 0 }),
                Arg::Ptr(done),
            ],
        );
        Ok(vec![select, gather])
    }
}

impl UpPlan {
    /// The scratch of [`launches`](Self::launches): thresholds and kept counts.
    pub fn scratch(&self) -> ScratchLayout {
        let t = self.stage.n_tokens;
        ScratchLayout::new(ScratchSizes {
            n_tokens: t,
            kept_len: t,
            ..ScratchSizes::default()
        })
    }

    /// The launch sequence with [`scratch`](Self::scratch) at device address `scratch`: u
    /// straight into dst.
    pub fn launches(&self, scratch: u64) -> Result<Vec<Launch>, String> {
        let sc = self.scratch();
        let at = |off: usize| scratch + off as u64;
        Ok(Vec::from(self.stage.launches(
            at(sc.theta),
            at(sc.kept),
            self.out,
        )?))
    }
}

impl DownPlan {
    /// The launch sequence (no scratch): the tiled accumulation over all F neurons as one
    /// chunk.
    pub fn launches(&self) -> Result<Vec<Launch>, String> {
        let l = v_tiled(
            self.u,
            self.v.rows,
            self.n_tokens,
            1,
            &self.v,
            self.out,
            self.out_row,
            0,
        )?;
        Ok(vec![l])
    }
}

impl SumPlan {
    /// The launch sequence (no scratch): one thread per output value.
    pub fn launches(&self) -> Result<Vec<Launch>, String> {
        let (di, ti, pi) = (
            int("D", self.d)?,
            int("n_tokens", self.n_tokens)?,
            int("P", self.p)?,
        );
        let blocks = grid(
            "element blocks",
            (self.d * self.n_tokens).div_ceil(256),
            MAX_GRID_X,
        )?;
        Ok(vec![launch(
            FfnKernel::Sum,
            (blocks, 1, 1),
            vec![
                Arg::Ptr(self.partials),
                di,
                ti,
                pi,
                Arg::Ptr(self.out),
                Arg::I64(self.out_row as i64),
            ],
        )])
    }
}
