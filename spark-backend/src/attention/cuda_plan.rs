//! `spark_attn` on the GPU (feature `cuda` for the launcher; the plan is always built): the
//! CUDA plan of a call (docs/INTERFACES.md; kernels in `attn.cu`, this folder, whose header
//! comment describes the launch sequence, grids and scratch buffers).
//!
//! [`AttnPlan::new`] checks the call from metadata only (the same checks as the CPU op,
//! [`AttnLayout`], plus what the kernels need: aligned addresses, a head dim of at most
//! [`MAX_HEAD_DIM`], 32-bit indices) and fixes the launch sequence ([`AttnPlan::launches`]) over
//! one scratch allocation of [`AttnPlan::scratch_bytes`]. It is a pure function of the tensors'
//! shapes, strides, types and addresses, so the tests run it on host-only tensors; the CPU
//! emulation test (tests/cuda_emu) runs the same launches through g++.
//!
//! With the `cuda` feature, `super::cuda_launch` holds the launcher ggml-cuda calls for a
//! `spark_attn` node, which enqueues this plan.

use super::layout::{AttnCall, AttnLayout, CacheType, ElemType, Strided};
use crate::cuda::CudaSource;
use crate::params::AttnParams;
use crate::KernelError;
use llama_cpp_sys_2 as sys;
use std::ffi::c_void;

/// The CUDA C of the attention kernels, compiled by NVRTC at first use per device.
pub(crate) const KERNELS: CudaSource = CudaSource {
    name: "attn.cu",
    text: include_str!("attn.cu"),
};

/// Largest head dim the kernels hold in shared memory (`SPARK_MAX_HEAD_DIM`).
pub(crate) const MAX_HEAD_DIM: usize = 512;
/// Threads per block of `spark_attn_scores`.
pub(crate) const SCORES_THREADS: u32 = 256;
/// Positions per `spark_attn_scores` block (4 per warp, one pass of its 8 warps): 512 blocks
/// for Gemma-2 2B's one-token decode at depth 4096, twice an H100/H200's 132 SMs and more.
pub(crate) const POS_PER_BLOCK: usize = 32;
/// Most queries one `spark_attn_scores` block holds (`SPARK_QB`).
pub(crate) const QUERIES_PER_BLOCK: usize = 8;
/// Threads per block of `spark_attn_select` (one block per query): the output kernel's, so
/// that `spark_attn_select_output` selects with the same sums in the same order.
pub(crate) const SELECT_THREADS: u32 = OUTPUT_THREADS;
/// Threads per block of `spark_attn_output` and `spark_attn_select_output`.
pub(crate) const OUTPUT_THREADS: u32 = 128;
/// Accumulators per thread of `spark_attn_output` (`SPARK_OUT_ACC`): H <= this * threads.
pub(crate) const OUTPUT_ACC: usize = 8;
const _: () = assert!(MAX_HEAD_DIM <= OUTPUT_ACC * OUTPUT_THREADS as usize);
/// Chunks per query of the output kernel (CH). A constant, so that a query's result does not
/// depend on the batch it comes in; 48 gives a one-token decode of Gemma-2 2B's 8 heads 384
/// blocks (above twice an H100/H200's 132 SMs).
pub const OUTPUT_CHUNKS: usize = 48;
/// Slabs of at most this many queries (N * tokens * streams) select and output in one launch,
/// `spark_attn_select_output`, whose every block selects its query's row itself (CH times the
/// selection's reads, from L2): one-token decode of models with up to 16 heads. Larger slabs
/// select once per query (`spark_attn_select`), then output.
pub const FUSED_MAX_QUERIES: usize = 16;
/// Scratch budget per slab of queries; a call with more queries runs in several slabs.
pub(crate) const SCRATCH_BUDGET: usize = 256 << 20;
/// Largest `gridDim.y` / `gridDim.z`.
const MAX_GRID_YZ: usize = 65_535;
/// Largest value the kernels index with `int`.
const MAX_INT: usize = i32::MAX as usize;

/// The kernel argument block, `struct SparkAttnArgs` of attn.cu (same order, C layout),
/// passed by value to every kernel. Addresses are device addresses.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AttnArgs {
    /// q [H, N, T, S] f32.
    pub(crate) q: u64,
    /// K cache view.
    pub(crate) k: u64,
    /// V cache view.
    pub(crate) v: u64,
    /// KQ mask.
    pub(crate) mask: u64,
    /// Output.
    pub(crate) dst: u64,
    /// Scratch: f32 scores [Qs, n_kv].
    pub(crate) scores: u64,
    /// Scratch: i32 kept positions [Qs, n_kv].
    pub(crate) list: u64,
    /// Scratch: i32 |S| `[Qs]`.
    pub(crate) count: u64,
    /// Scratch: f32 (max, 1/z) [Qs, 2].
    pub(crate) norm: u64,
    /// Scratch: f32 chunk partials [Qs, CH, H] (0 when CH == 1).
    pub(crate) partial: u64,
    /// Scratch: u32 chunks finished per query `[Qs]` (0 when CH == 1).
    pub(crate) done: u64,
    /// Byte strides.
    pub(crate) q_nb: [i64; 4],
    /// Byte strides.
    pub(crate) k_nb: [i64; 4],
    /// Byte strides.
    pub(crate) v_nb: [i64; 4],
    /// Byte strides.
    pub(crate) m_nb: [i64; 4],
    /// Byte strides.
    pub(crate) d_nb: [i64; 4],
    /// H.
    pub(crate) head_dim: i32,
    /// N.
    pub(crate) n_head: i32,
    /// KV.
    pub(crate) n_head_kv: i32,
    /// T.
    pub(crate) n_tokens: i32,
    /// n_kv.
    pub(crate) n_kv: i32,
    /// S.
    pub(crate) n_stream: i32,
    /// Mask broadcast extents.
    pub(crate) mask_ne2: i32,
    /// Mask broadcast extents.
    pub(crate) mask_ne3: i32,
    /// 1 when K is f16.
    pub(crate) k_f16: i32,
    /// 1 when V is f16.
    pub(crate) v_f16: i32,
    /// 1 when the mask is f16.
    pub(crate) mask_f16: i32,
    /// half2 fast path for K.
    pub k_vec: i32,
    /// V's fast path: 1 half2 loads, 2 16-byte loads.
    pub v_vec: i32,
    /// k_a.
    pub(crate) keep: i32,
    /// r_a.
    pub(crate) r: i32,
    /// c_attn.
    pub(crate) softcap: f32,
    /// Slab: first stream.
    pub(crate) s0: i32,
    /// Slab: streams.
    pub(crate) ns: i32,
    /// Slab: first token.
    pub(crate) t0: i32,
    /// Slab: tokens.
    pub(crate) nt: i32,
    /// Heads per scores block (GB).
    pub(crate) heads_per_block: i32,
    /// Tokens per scores block (TT).
    pub(crate) tokens_per_block: i32,
    /// Positions per scores block.
    pub(crate) pos_per_block: i32,
    /// Output chunks per query (CH).
    pub chunks: i32,
}

const _: () = assert!(std::mem::size_of::<AttnArgs>() == 11 * 8 + 20 * 8 + 24 * 4);

/// The four kernels of attn.cu.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnKernel {
    /// `spark_attn_scores`.
    Scores,
    /// `spark_attn_select`.
    Select,
    /// `spark_attn_output` (with CH > 1, the last chunk of each query adds the chunks).
    Output,
    /// `spark_attn_select_output`: `Select` and `Output` in one launch (few queries).
    SelectOutput,
}

impl AttnKernel {
    /// Every kernel (the separate path's in launch order, then the fused one).
    pub const ALL: [AttnKernel; 4] = [
        AttnKernel::Scores,
        AttnKernel::Select,
        AttnKernel::Output,
        AttnKernel::SelectOutput,
    ];

    /// The `extern "C"` name in attn.cu.
    pub fn name(self) -> &'static str {
        match self {
            AttnKernel::Scores => "spark_attn_scores",
            AttnKernel::Select => "spark_attn_select",
            AttnKernel::Output => "spark_attn_output",
            AttnKernel::SelectOutput => "spark_attn_select_output",
        }
    }
}

/// One kernel launch: grid, block (x only) and arguments.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Launch {
    /// Which kernel.
    pub kernel: AttnKernel,
    /// Grid dimensions.
    pub grid: (u32, u32, u32),
    /// Threads per block.
    pub block: u32,
    /// Argument block.
    pub args: AttnArgs,
}

/// One slab of queries: streams `s0..s0 + ns`, tokens `t0..t0 + nt` of each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slab {
    /// First stream.
    pub s0: usize,
    /// Streams.
    pub ns: usize,
    /// First token.
    pub t0: usize,
    /// Tokens.
    pub nt: usize,
}

/// Byte offsets of the scratch buffers inside one allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScratchLayout {
    /// f32 [Qs, n_kv].
    pub(crate) scores: usize,
    /// i32 [Qs, n_kv].
    pub list: usize,
    /// i32 `[Qs]`.
    pub count: usize,
    /// f32 [Qs, 2].
    pub(crate) norm: usize,
    /// f32 [Qs, CH, H] (CH > 1 only; else equal to `total`).
    pub(crate) partial: usize,
    /// u32 `[Qs]`: chunks finished per query (CH > 1 only; else equal to `total`).
    pub(crate) done: usize,
    /// Bytes in all.
    pub total: usize,
}

/// A checked `spark_attn` call and its launch sequence.
#[derive(Debug, Clone)]
pub struct AttnPlan {
    /// The checked arguments (addresses are device addresses).
    pub layout: AttnLayout,
    /// Query slabs, in order; every slab reuses the same scratch.
    pub slabs: Vec<Slab>,
    /// Scratch offsets (sized for the largest slab).
    pub scratch: ScratchLayout,
    /// CH.
    pub(crate) chunks: usize,
    /// Slabs of at most this many queries take `spark_attn_select_output`
    /// ([`FUSED_MAX_QUERIES`]; tests set 0 or `usize::MAX` to run either path).
    pub fused_max_queries: usize,
}

fn shape(msg: String) -> KernelError {
    KernelError::Shape(msg)
}

fn align_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

/// True when `t`'s address and strides are multiples of `align` (every element access of the
/// kernels is then aligned).
fn aligned<T>(t: &Strided<T>, align: usize) -> bool {
    (t.data as usize).is_multiple_of(align) && t.nb.iter().all(|&b| b.is_multiple_of(align))
}

/// True when `t`'s rows (dims 1..4) start at `align`-byte aligned addresses: the half2 (4) and
/// 16-byte loads of the fast paths are then aligned (with an element offset to match).
fn rows_aligned<T>(t: &Strided<T>, align: usize) -> bool {
    (t.data as usize).is_multiple_of(align) && t.nb[1..].iter().all(|&b| b.is_multiple_of(align))
}

/// A K or V cache as the CUDA kernels read it: f16 or f32 in place. Block types (bf16, q8_0,
/// q4_0, ...) are the CPU op's only (the layer's node then runs where ggml's scheduler puts it).
fn read_in_place(c: &Strided<CacheType>, name: &str) -> Result<Strided, KernelError> {
    match c.ty {
        CacheType::Elems(e) => Ok(c.with_ty(e)),
        CacheType::Blocks(t) => Err(KernelError::Shape(format!(
            "{name} cache of type {}: the CUDA kernels read f16 and f32 caches only",
            t.name()
        ))),
    }
}

fn strides<T>(t: &Strided<T>, name: &str) -> Result<[i64; 4], KernelError> {
    let mut out = [0i64; 4];
    for (o, (&b, &n)) in out.iter_mut().zip(t.nb.iter().zip(&t.ne)) {
        // The furthest byte along this dimension must fit the kernels' 64-bit offsets.
        let _ = b
            .checked_mul(n)
            .filter(|&x| x <= i64::MAX as usize)
            .ok_or_else(|| shape(format!("{name}: stride {b} x {n} overflows")))?;
        *o = b as i64;
    }
    Ok(out)
}

impl AttnPlan {
    /// Checks a call from its tensors' metadata and `params` and plans its launches. Errors are
    /// those of the CPU op ([`AttnLayout::new`]) or name what the CUDA kernels cannot take.
    pub fn new(call: &AttnCall, params: &AttnParams) -> Result<Self, KernelError> {
        let layout = AttnLayout::new(call, params)?;
        Self::from_layout(layout)
    }

    /// [`new`](Self::new) after the CPU checks.
    pub(crate) fn from_layout(l: AttnLayout) -> Result<Self, KernelError> {
        if l.head_dim > MAX_HEAD_DIM {
            return Err(shape(format!(
                "head dim {} above the CUDA kernels' {MAX_HEAD_DIM}",
                l.head_dim
            )));
        }
        let big = [l.n_head, l.n_tokens, l.n_kv, l.n_stream]
            .iter()
            .any(|&x| x > MAX_INT / 8);
        if big || l.k_keep > MAX_INT {
            return Err(shape(format!(
                "q {:?} / n_kv {} / k {} too large for the CUDA kernels' 32-bit indices",
                l.q.ne, l.n_kv, l.k_keep
            )));
        }
        let (k, v) = (read_in_place(&l.k, "k")?, read_in_place(&l.v, "v")?);
        for (t, name) in [
            (&l.q, "q"),
            (&k, "k"),
            (&v, "v"),
            (&l.mask, "mask"),
            (&l.dst, "dst"),
        ] {
            if !aligned(t, t.ty.size()) {
                return Err(shape(format!(
                    "{name}: address or byte strides {:?} not multiples of its element size {} (the GPU reads aligned elements)",
                    t.nb,
                    t.ty.size()
                )));
            }
        }
        let n = l.n_head;
        let per_query = 8 * l.n_kv
            + 12
            + if OUTPUT_CHUNKS > 1 {
                4 * OUTPUT_CHUNKS * l.head_dim
            } else {
                0
            };
        // Rows (stream, token) per slab, bounded by the budget and by gridDim.z of the scores
        // kernel (tokens_per_block tokens per z index).
        let (gb, tt) = Self::scores_blocking(&l);
        let by_budget = (SCRATCH_BUDGET / (n * per_query).max(1)).max(1);
        let by_grid = MAX_GRID_YZ * tt;
        let rows = by_budget
            .min(by_grid)
            .min(MAX_INT / (n * l.n_kv.max(1)).max(1))
            .max(1);
        let mut slabs = Vec::new();
        if rows >= l.n_tokens {
            let per = (rows / l.n_tokens.max(1))
                .max(1)
                .min(MAX_GRID_YZ / l.n_tokens.div_ceil(tt).max(1))
                .max(1);
            let mut s0 = 0;
            while s0 < l.n_stream {
                let ns = per.min(l.n_stream - s0);
                slabs.push(Slab {
                    s0,
                    ns,
                    t0: 0,
                    nt: l.n_tokens,
                });
                s0 += ns;
            }
        } else {
            for s0 in 0..l.n_stream {
                let mut t0 = 0;
                while t0 < l.n_tokens {
                    let nt = rows.min(l.n_tokens - t0);
                    slabs.push(Slab { s0, ns: 1, t0, nt });
                    t0 += nt;
                }
            }
        }
        // Scratch for the largest slab.
        let qs = slabs.iter().map(|s| s.ns * s.nt * n).max().unwrap_or(0);
        let chunks = OUTPUT_CHUNKS;
        let a = 256;
        let scores = 0;
        let list = align_up(scores + 4 * qs * l.n_kv, a);
        let count = align_up(list + 4 * qs * l.n_kv, a);
        let norm = align_up(count + 4 * qs, a);
        let partial = align_up(norm + 8 * qs, a);
        let (done, total) = if chunks > 1 {
            let done = align_up(partial + 4 * qs * chunks * l.head_dim, a);
            (done, done + 4 * qs)
        } else {
            (partial, partial)
        };
        let _ = gb;
        Ok(Self {
            layout: l,
            slabs,
            scratch: ScratchLayout {
                scores,
                list,
                count,
                norm,
                partial,
                done,
                total: total.max(4),
            },
            chunks,
            fused_max_queries: FUSED_MAX_QUERIES,
        })
    }

    /// (heads per block GB, tokens per block TT) of the scores kernel: every head of a KV group
    /// (up to 8) and enough tokens for about 8 queries per K1 row read.
    pub(crate) fn scores_blocking(l: &AttnLayout) -> (usize, usize) {
        let gb = l.group_size().min(QUERIES_PER_BLOCK);
        (gb, (QUERIES_PER_BLOCK / gb).max(1))
    }

    /// Bytes of scratch memory the launches need.
    pub fn scratch_bytes(&self) -> usize {
        self.scratch.total
    }

    /// Queries in the whole call (N * T * S), for statistics.
    pub fn n_queries(&self) -> usize {
        self.layout.n_head * self.layout.n_tokens * self.layout.n_stream
    }

    /// The argument block of `slab` with scratch at device address `scratch`.
    pub fn args(&self, slab: &Slab, scratch: u64) -> Result<AttnArgs, KernelError> {
        let l = &self.layout;
        let (gb, tt) = Self::scores_blocking(l);
        let s = &self.scratch;
        let i = |x: usize| x as i32; // every value below was bounded in from_layout
        let (k, v) = (read_in_place(&l.k, "k")?, read_in_place(&l.v, "v")?);
        let k_vec = k.ty == ElemType::F16
            && k.nb[0] == 2
            && rows_aligned(&k, 4)
            && l.r.is_multiple_of(2)
            && l.head_dim.is_multiple_of(2);
        let v_f16_adjacent = v.ty == ElemType::F16 && v.nb[0] == 2;
        let v_vec = if v_f16_adjacent && rows_aligned(&v, 16) && l.head_dim.is_multiple_of(8) {
            2 // 16-byte loads (H / 8 <= OUTPUT_THREADS: H <= MAX_HEAD_DIM)
        } else {
            i32::from(v_f16_adjacent && rows_aligned(&v, 4) && l.head_dim.is_multiple_of(2))
        };
        Ok(AttnArgs {
            q: l.q.data as u64,
            k: k.data as u64,
            v: v.data as u64,
            mask: l.mask.data as u64,
            dst: l.dst.data as u64,
            scores: scratch + s.scores as u64,
            list: scratch + s.list as u64,
            count: scratch + s.count as u64,
            norm: scratch + s.norm as u64,
            partial: if self.chunks > 1 {
                scratch + s.partial as u64
            } else {
                0
            },
            done: if self.chunks > 1 {
                scratch + s.done as u64
            } else {
                0
            },
            q_nb: strides(&l.q, "q")?,
            k_nb: strides(&k, "k")?,
            v_nb: strides(&v, "v")?,
            m_nb: strides(&l.mask, "mask")?,
            d_nb: strides(&l.dst, "dst")?,
            head_dim: i(l.head_dim),
            n_head: i(l.n_head),
            n_head_kv: i(l.n_head_kv),
            n_tokens: i(l.n_tokens),
            n_kv: i(l.n_kv),
            n_stream: i(l.n_stream),
            mask_ne2: i(l.mask.ne[2]),
            mask_ne3: i(l.mask.ne[3]),
            k_f16: i32::from(k.ty == ElemType::F16),
            v_f16: i32::from(v.ty == ElemType::F16),
            mask_f16: i32::from(l.mask.ty == ElemType::F16),
            k_vec: i32::from(k_vec),
            v_vec,
            keep: i(l.k_keep),
            r: i(l.r),
            softcap: l.softcap,
            s0: i(slab.s0),
            ns: i(slab.ns),
            t0: i(slab.t0),
            nt: i(slab.nt),
            heads_per_block: i(gb),
            tokens_per_block: i(tt),
            pos_per_block: i(POS_PER_BLOCK),
            chunks: i(self.chunks),
        })
    }

    /// The launches of `slab` (attn.cu, "Launch sequence").
    pub(crate) fn slab_launches(
        &self,
        slab: &Slab,
        scratch: u64,
    ) -> Result<Vec<Launch>, KernelError> {
        let l = &self.layout;
        let args = self.args(slab, scratch)?;
        let (gb, tt) = Self::scores_blocking(l);
        let u = |x: usize| x as u32;
        let qs = slab.ns * slab.nt * l.n_head;
        let mut out = Vec::with_capacity(3);
        let grid_out = (u(qs), u(self.chunks), 1);
        if qs == 0 {
            return Ok(out);
        }
        if l.n_kv > 0 {
            out.push(Launch {
                kernel: AttnKernel::Scores,
                grid: (
                    u(l.n_kv.div_ceil(POS_PER_BLOCK)),
                    u(l.n_head_kv * l.group_size().div_ceil(gb)),
                    u(slab.ns * slab.nt.div_ceil(tt)),
                ),
                block: SCORES_THREADS,
                args,
            });
        }
        if qs <= self.fused_max_queries {
            out.push(Launch {
                kernel: AttnKernel::SelectOutput,
                grid: grid_out,
                block: OUTPUT_THREADS,
                args,
            });
        } else {
            out.push(Launch {
                kernel: AttnKernel::Select,
                grid: (u(qs), 1, 1),
                block: SELECT_THREADS,
                args,
            });
            out.push(Launch {
                kernel: AttnKernel::Output,
                grid: grid_out,
                block: OUTPUT_THREADS,
                args,
            });
        }
        Ok(out)
    }

    /// Every launch of the call, slab after slab, with scratch at device address `scratch`.
    pub fn launches(&self, scratch: u64) -> Result<Vec<Launch>, KernelError> {
        let mut out = Vec::new();
        for slab in &self.slabs {
            out.extend(self.slab_launches(slab, scratch)?);
        }
        Ok(out)
    }
}

/// Checks a `spark_attn` node from metadata only (shapes, strides, types, data addresses as
/// numbers; the params struct in host memory) and plans it: the CPU op's checks and messages
/// (`super::cpu_op`), then the CUDA kernels' own limits.
///
/// # Safety
/// `dst` is null or a live tensor whose `src[0..4]` are null or live; `params_block` is null or
/// points to a `struct spark_attn_params`.
pub unsafe fn check(
    dst: *const sys::ggml_tensor,
    params_block: *const c_void,
) -> Result<AttnPlan, KernelError> {
    // SAFETY: forwarded contract.
    let (call, params) = unsafe { AttnCall::read(dst, params_block)? };
    AttnPlan::new(&call, &params)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::TensorView;
    use crate::tensor::GGML_TYPE_F32;
    use llama_cpp_sys_2::GGML_TYPE_F16;

    fn view(ty: u32, ne: [usize; 4], addr: usize) -> TensorView {
        let es = if ty == GGML_TYPE_F16 { 2 } else { 4 };
        TensorView {
            ty,
            ne,
            nb: [
                es,
                es * ne[0],
                es * ne[0] * ne[1],
                es * ne[0] * ne[1] * ne[2],
            ],
            data: addr as *mut u8,
        }
    }

    /// Gemma-2 2B attention shapes: T tokens per stream, S streams, n_kv positions.
    fn plan(t: usize, s: usize, n_kv: usize) -> AttnPlan {
        let q = view(GGML_TYPE_F32, [256, 8, t, s], 0x1000_0000);
        let k = view(GGML_TYPE_F16, [256, 4, n_kv, s], 0x2000_0000);
        let m = view(
            GGML_TYPE_F32,
            [n_kv, t.next_multiple_of(64), 1, s],
            0x3000_0000,
        );
        let p = AttnParams {
            layer: 1,
            k: 256,
            r: 128,
            softcap: 50.0,
        };
        plan_of(q, k, m, &p).unwrap()
    }

    /// The plan of a call with K = V = `k` and dst = `q`.
    fn plan_of(
        q: TensorView,
        k: TensorView,
        m: TensorView,
        p: &AttnParams,
    ) -> Result<AttnPlan, KernelError> {
        let call = AttnCall {
            q,
            k,
            v: k,
            mask: m,
            dst: q,
        };
        AttnPlan::new(&call, p)
    }

    #[test]
    fn kernel_limits_hold() {
        assert!(MAX_HEAD_DIM <= OUTPUT_ACC * OUTPUT_THREADS as usize);
        // attn.cu sizes the 16-byte path's group sums for this block size
        let define = format!("#define SPARK_OUT_THREADS {OUTPUT_THREADS}\n");
        assert!(KERNELS.text.contains(&define), "attn.cu: {define}");
        assert_eq!(SCORES_THREADS % 32, 0);
        assert_eq!(SELECT_THREADS % 32, 0);
        assert_eq!(OUTPUT_THREADS % 32, 0);
        assert_eq!(POS_PER_BLOCK % 4, 0);
    }

    #[test]
    fn decode_is_one_slab_of_two_launches() {
        let p = plan(1, 1, 4096);
        assert_eq!(
            p.slabs,
            vec![Slab {
                s0: 0,
                ns: 1,
                t0: 0,
                nt: 1
            }]
        );
        let l = p.launches(0x4000_0000).unwrap();
        let kinds: Vec<_> = l.iter().map(|x| (x.kernel, x.grid)).collect();
        assert_eq!(
            kinds,
            vec![
                (AttnKernel::Scores, (128, 4, 1)),
                (AttnKernel::SelectOutput, (8, OUTPUT_CHUNKS as u32, 1)),
            ]
        );
        let a = l[0].args;
        assert_eq!(
            (a.k_vec, a.v_vec, a.heads_per_block, a.tokens_per_block),
            (1, 2, 2, 4)
        );
        assert_eq!(a.scores, 0x4000_0000);
        assert!(a.list >= a.scores + 4 * 8 * 4096);
    }

    #[test]
    fn slabs_cover_every_query_once_within_the_budget() {
        for (t, s, n_kv) in [
            (512, 1, 4608),
            (4096, 1, 32768),
            (3, 5, 70_000),
            (1, 64, 8192),
        ] {
            let p = plan(t, s, n_kv);
            let mut seen = vec![0u8; t * s];
            for sl in &p.slabs {
                for ss in sl.s0..sl.s0 + sl.ns {
                    for tt in sl.t0..sl.t0 + sl.nt {
                        seen[ss * t + tt] += 1;
                    }
                }
                for l in p.slab_launches(sl, 0).unwrap() {
                    assert!(l.grid.1 as usize <= MAX_GRID_YZ && l.grid.2 as usize <= MAX_GRID_YZ);
                    assert!(l.grid.0 >= 1);
                }
            }
            assert!(
                seen.iter().all(|&c| c == 1),
                "{t} {s} {n_kv}: {:?}",
                p.slabs
            );
            assert!(
                p.scratch_bytes() <= SCRATCH_BUDGET + 4096,
                "{t} {s} {n_kv}: {}",
                p.scratch_bytes()
            );
        }
        assert_eq!(plan(256, 1, 4608).slabs.len(), 1);
    }

    /// A one-token decode step at Gemma-2 2B's shapes (8 heads over 4 KV heads, H 256, r 128,
    /// k 256, f16 caches) and depths 512 to 32768: two kernels, and each that moves more than
    /// 1 MB launches at least twice an H100's / H200's 132 SMs in blocks (the NVIDIA issue's
    /// budget). Bytes from the shapes: the scores kernel reads K1 of every position and writes
    /// the scores; select_output reads each query's scores and mask row and, for its kept
    /// positions, K2 and V.
    #[test]
    fn decode_attention_kernels_that_move_megabytes_fill_twice_the_sms() {
        const SMS: usize = 132;
        let (n, kv, h, r) = (8, 4, 256, 128);
        for n_kv in [512, 4096, 32768] {
            let keep = 256.min(n_kv);
            let p = plan(1, 1, n_kv);
            let launches = p.launches(0).unwrap();
            assert_eq!(launches.len(), 2, "{launches:?}");
            for l in launches {
                let bytes = match l.kernel {
                    AttnKernel::Scores => kv * n_kv * r * 2 + n * n_kv * 4,
                    AttnKernel::SelectOutput => n * n_kv * 8 + n * keep * (h - r + h) * 2,
                    other => panic!("{other:?} at one token"),
                };
                let blocks = (l.grid.0 * l.grid.1 * l.grid.2) as usize;
                assert!(
                    bytes <= 1 << 20 || blocks >= 2 * SMS,
                    "{:?} at depth {n_kv}: {bytes} bytes on {blocks} blocks",
                    l.kernel
                );
            }
        }
    }

    #[test]
    fn few_queries_select_and_output_in_one_launch() {
        let kinds = |p: &AttnPlan| -> Vec<AttnKernel> {
            p.launches(0).unwrap().iter().map(|l| l.kernel).collect()
        };
        // 8 heads x 2 tokens = 16 queries: fused; 3 tokens: separate.
        let fused = vec![AttnKernel::Scores, AttnKernel::SelectOutput];
        let separate = vec![AttnKernel::Scores, AttnKernel::Select, AttnKernel::Output];
        assert_eq!(kinds(&plan(2, 1, 512)), fused);
        assert_eq!(kinds(&plan(3, 1, 512)), separate);
        let mut p = plan(1, 1, 512);
        p.fused_max_queries = 0;
        assert_eq!(kinds(&p), separate);
        // Both paths select with the same block size (the same sums in the same order).
        assert_eq!(SELECT_THREADS, OUTPUT_THREADS);
    }

    #[test]
    fn rejects_what_the_kernels_cannot_take() {
        let q = view(GGML_TYPE_F32, [1024, 2, 1, 1], 0x1000);
        let k = view(GGML_TYPE_F16, [1024, 1, 16, 1], 0x2000);
        let m = view(GGML_TYPE_F32, [16, 1, 1, 1], 0x3000);
        let p = AttnParams {
            layer: 0,
            k: 4,
            r: 2,
            softcap: 0.0,
        };
        let e = plan_of(q, k, m, &p).unwrap_err().to_string();
        assert!(e.contains("head dim 1024"), "{e}");
        let q = view(GGML_TYPE_F32, [8, 2, 1, 1], 0x1000);
        let k = view(GGML_TYPE_F16, [8, 1, 16, 1], 0x2001);
        let e = plan_of(q, k, m, &p).unwrap_err().to_string();
        assert!(e.contains("k: address"), "{e}");
    }
}
