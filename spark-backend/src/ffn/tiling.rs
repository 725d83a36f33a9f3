//! How the FFN of one ubatch is cut: which path runs ([`super::fused`] or
//! [`super::two_stage`]) and, on the fused path, into how many neuron chunks P. Decided here
//! and nowhere else: the spark-gemma2 graph asks through the C function [`spark_ffn_tiling`]
//! (a proc of the "Spark" registry entry, docs/INTERFACES.md) and builds its nodes from the
//! answer, so no constant of the kernels is spelled in the patch series.

use std::ffi::c_int;

/// Ubatches of up to this many tokens take the fused path: llama.cpp's default `n_ubatch`, so
/// every decode step and the default prefill ubatch. The fused path is the faster one at every
/// batch size measured (docs/PERF.md); above this its partial outputs (P x D x T floats: 75 MB
/// at Gemma-2 2B shapes and 512 tokens, beside 0.5 GB of logits) would keep growing the compute
/// buffer, and the two-stage path takes over.
pub const FUSED_MAX_TOKENS: usize = 512;

/// The most chunks of the fused path. 16 splits evenly over 1, 2, 4, 8 or 16 threads (a
/// thread's share is then exactly F / nth neurons, so the threads' loads differ only by their
/// chunks' random active counts), and the partials of one token at Gemma-2 2B's D (16 x 9 KB)
/// stay in L2 for the sum.
pub const MAX_CHUNKS: usize = 16;

/// The fused path's chunk count for F = `f` neurons: [`MAX_CHUNKS`], or F when F is smaller.
pub fn default_chunks(f: usize) -> usize {
    f.clamp(1, MAX_CHUNKS)
}

/// The path of a ubatch through the FFN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnPath {
    /// `spark_ffn_fused` into this many partial outputs (1 <= P <= F), then `spark_ffn_sum`.
    Fused {
        /// P, the neuron chunks.
        chunks: usize,
    },
    /// `spark_ffn_up`, then `spark_ffn_down`.
    TwoStage,
}

/// The path of a ubatch of `n_tokens` tokens through an FFN of `f` neurons.
pub fn path(n_tokens: usize, f: usize) -> FfnPath {
    if n_tokens <= FUSED_MAX_TOKENS {
        FfnPath::Fused {
            chunks: default_chunks(f),
        }
    } else {
        FfnPath::TwoStage
    }
}

/// `path` of [`FfnTiling`]: the fused path.
pub const PATH_FUSED: i32 = 1;
/// `path` of [`FfnTiling`]: the two-stage path.
pub const PATH_TWO_STAGE: i32 = 2;

/// The answer of [`spark_ffn_tiling`]: `struct spark_ffn_tiling { int32_t path; int32_t
/// n_chunk; }` of the patch series' `src/models/spark-gemma2-backend.h` (layout pinned by
/// `probe/graph_abi.c`, `tests/registry.rs`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FfnTiling {
    /// [`PATH_FUSED`] or [`PATH_TWO_STAGE`].
    pub path: i32,
    /// P (1 <= P <= F) on the fused path, 1 on the two-stage path.
    pub n_chunk: i32,
}

impl FfnTiling {
    /// The C form of `p`, or `None` when P does not fit an `int32_t`.
    pub fn of(p: FfnPath) -> Option<Self> {
        Some(match p {
            FfnPath::Fused { chunks } => Self {
                path: PATH_FUSED,
                n_chunk: i32::try_from(chunks).ok()?,
            },
            FfnPath::TwoStage => Self {
                path: PATH_TWO_STAGE,
                n_chunk: 1,
            },
        })
    }
}

/// C ABI `int spark_ffn_tiling(int64_t n_tokens, int64_t n_ff, int64_t n_embd,
/// struct spark_ffn_tiling * out)`: the path and chunk count of a ubatch of `n_tokens` tokens
/// through an FFN of `n_ff` neurons and width `n_embd` ([`path`]). Writes `*out` and returns 0;
/// returns -1 and leaves `*out` alone when `out` is null or a size is below 1. The width is
/// part of the question (the fused path's partials are P x D x T floats) though today's answer
/// does not depend on it.
///
/// # Safety
/// `out` must be null or valid for writing one `FfnTiling`.
pub unsafe extern "C" fn spark_ffn_tiling(
    n_tokens: i64,
    n_ff: i64,
    n_embd: i64,
    out: *mut FfnTiling,
) -> c_int {
    crate::ffi::guard("spark_ffn_tiling", -1, || {
        let size = |v: i64| usize::try_from(v).ok().filter(|&v| v >= 1);
        let (Some(t), Some(f), Some(_)) = (size(n_tokens), size(n_ff), size(n_embd)) else {
            return -1;
        };
        if out.is_null() {
            return -1;
        }
        let Some(tiling) = FfnTiling::of(path(t, f)) else {
            return -1;
        };
        // SAFETY: non-null and writable per the contract; unaligned write for safety.
        unsafe { out.write_unaligned(tiling) };
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(n_tokens: i64, n_ff: i64, n_embd: i64) -> Option<FfnTiling> {
        let mut t = FfnTiling {
            path: -7,
            n_chunk: -7,
        };
        // SAFETY: `t` is writable.
        let rc = unsafe { spark_ffn_tiling(n_tokens, n_ff, n_embd, &mut t) };
        match rc {
            0 => Some(t),
            -1 => {
                assert_eq!((t.path, t.n_chunk), (-7, -7), "written on failure");
                None
            }
            rc => panic!("return code {rc}"),
        }
    }

    #[test]
    fn ubatches_up_to_512_tokens_take_the_fused_path_in_16_chunks() {
        let fused16 = Some(FfnTiling {
            path: PATH_FUSED,
            n_chunk: 16,
        });
        assert_eq!(ask(1, 9216, 2304), fused16);
        assert_eq!(ask(64, 9216, 2304), fused16);
        assert_eq!(ask(512, 9216, 2304), fused16);
        let two = Some(FfnTiling {
            path: PATH_TWO_STAGE,
            n_chunk: 1,
        });
        assert_eq!(ask(513, 9216, 2304), two);
        assert_eq!(ask(4096, 9216, 2304), two);
        // fewer neurons than chunks: one chunk per neuron
        assert_eq!(
            ask(3, 5, 16),
            Some(FfnTiling {
                path: PATH_FUSED,
                n_chunk: 5
            })
        );
    }

    #[test]
    fn bad_questions_get_minus_one_and_no_answer() {
        let bad = [
            (0, 9216, 2304),
            (1, 0, 2304),
            (1, 9216, 0),
            (-1, 9216, 2304),
        ];
        for (t, f, d) in bad {
            assert_eq!(ask(t, f, d), None, "{t} {f} {d}");
        }
        // SAFETY: a null `out` is part of the contract.
        assert_eq!(
            unsafe { spark_ffn_tiling(1, 9216, 2304, std::ptr::null_mut()) },
            -1
        );
    }
}
