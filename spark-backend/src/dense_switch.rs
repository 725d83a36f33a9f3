//! When a ubatch leaves the Spark kernels for the graph's own dense path (stock ggml ops): per
//! part of a layer ([`Part`]: the FFN, the attention), per device of the layer's weights
//! ([`WeightBackend`]) and per ubatch size. The FFN tiling (`ffn::tiling`) and the attention's
//! answer (`attention::path`) ask [`takes_dense`]; nothing else decides it.
//!
//! - On the CPU (and every backend but CUDA) never: the sparse kernels win at every ubatch size
//!   measured (docs/PERF.md).
//! - On CUDA from [`CUDA_DENSE_FROM_TOKENS`] tokens: a GPU's dense matrix products on tensor
//!   cores beat the sparse kernels' scalar FMA once a ubatch has enough tokens that nearly every
//!   neuron and position is used by one of them.
//! - `SPARK_FFN_DENSE_FROM=<n>` / `SPARK_ATTN_DENSE_FROM=<n>` move the switch for every backend
//!   (ubatches of at least n tokens take the dense path; 0: never), to measure the switch point
//!   on a card (`tools/gpu-check.sh`'s `switch` phase) and to run the dense path's graph on the
//!   CPU in the tests.

use std::ffi::CStr;
use std::sync::OnceLock;

/// Where a layer's weights live, as the graph names it: the ggml backend registry of their
/// device (`ggml_backend_reg_name`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightBackend {
    /// ggml-cuda ("CUDA"), with this plugin's CUDA launchers (feature `cuda`).
    Cuda,
    /// Any other registry (the CPU, an rpc-server, one that does not run the Spark ops), or a
    /// CUDA device when this build has no CUDA launchers.
    Other,
}

impl WeightBackend {
    /// The backend of registry name `name` (`None`: not known).
    pub fn from_registry_name(name: Option<&CStr>) -> Self {
        match name.map(CStr::to_bytes) {
            Some(b"CUDA") if cfg!(feature = "cuda") => WeightBackend::Cuda,
            _ => WeightBackend::Other,
        }
    }
}

/// The part of a Spark layer a switch point belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The FFN (`spark_ffn_tiling` answers `SPARK_FFN_PATH_DENSE`).
    Ffn,
    /// The attention (`spark_attn_path` answers `SPARK_ATTN_PATH_DENSE`).
    Attention,
}

impl Part {
    /// The environment variable that moves this part's switch point.
    pub const fn env_var(self) -> &'static str {
        match self {
            Part::Ffn => "SPARK_FFN_DENSE_FROM",
            Part::Attention => "SPARK_ATTN_DENSE_FROM",
        }
    }
}

/// On CUDA, ubatches of at least this many tokens take the dense path, FFN and attention alike.
///
/// From the one H200 run (2026-11-27, docs/PERF.md), not yet a measured crossover: the sparse
/// FFN above 8 tokens cost ~6.4 us per token and layer (threshold + up + v_tiled at pp512,
/// 3.3 ms per layer) and its attention ~2.2 us (pp512's 33 ms outside the FFN against stock's
/// ~5 ms); the dense FFN costs stock's matrix products at 2/3 of their multiply-adds plus V's
/// copy to stock layout, ~0.1 ms per layer at Gemma-2 2B shapes (~234 MB moved at the card's
/// ~3 TB/s), so it wins from ~26 tokens; the dense attention's ~15 element-wise passes over
/// the scores win earlier. 32 is the first power of two past both; `tools/gpu-check.sh`'s
/// `switch` phase measures the crossover for the next card.
pub const CUDA_DENSE_FROM_TOKENS: usize = 32;

/// The built-in switch point of `part` on `backend`: `Some(n)` when ubatches of at least n
/// tokens take the dense path, `None` when none does.
pub fn built_in(part: Part, backend: WeightBackend) -> Option<usize> {
    let _ = part; // both parts switch at the same size until a card measures each
    match backend {
        WeightBackend::Cuda => Some(CUDA_DENSE_FROM_TOKENS),
        WeightBackend::Other => None,
    }
}

/// What a switch-point variable's value means: `Ok(Some(n))` from n tokens (n >= 1),
/// `Ok(None)` never (`0`), `Err` for anything that is not a token count.
pub fn parse_switch(value: &str) -> Result<Option<usize>, String> {
    match value.trim().parse::<usize>() {
        Ok(0) => Ok(None),
        Ok(n) => Ok(Some(n)),
        Err(_) => Err(format!(
            "{value:?} is not a token count (0: never, n: from n tokens)"
        )),
    }
}

/// The switch point set in the environment for `part`: `None` when the variable is unset or
/// invalid (said once on stderr; the built-in point applies), else what [`parse_switch`] says.
fn from_env(part: Part) -> Option<Option<usize>> {
    static FFN: OnceLock<Option<Option<usize>>> = OnceLock::new();
    static ATTN: OnceLock<Option<Option<usize>>> = OnceLock::new();
    let cell = match part {
        Part::Ffn => &FFN,
        Part::Attention => &ATTN,
    };
    *cell.get_or_init(|| {
        let value = std::env::var(part.env_var()).ok()?;
        match parse_switch(&value) {
            Ok(point) => Some(point),
            Err(why) => {
                crate::log::say!(
                    "spark: {}: {why}; the built-in switch point applies",
                    part.env_var()
                );
                None
            }
        }
    })
}

/// Whether a ubatch of `n_tokens` tokens takes the dense path at switch point `point`
/// (`None`: never).
pub fn takes_dense_at(point: Option<usize>, n_tokens: usize) -> bool {
    point.is_some_and(|from| n_tokens >= from)
}

/// Whether a ubatch of `n_tokens` tokens takes `part`'s dense path on `backend`: the
/// environment's switch point if set, else [`built_in`].
pub fn takes_dense(part: Part, backend: WeightBackend, n_tokens: usize) -> bool {
    let point = from_env(part).unwrap_or_else(|| built_in(part, backend));
    takes_dense_at(point, n_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_cuda_switches_by_default_and_from_32_tokens() {
        for part in [Part::Ffn, Part::Attention] {
            assert_eq!(built_in(part, WeightBackend::Other), None);
            let cuda = built_in(part, WeightBackend::Cuda);
            assert_eq!(cuda, Some(32));
            assert!(!takes_dense_at(cuda, 1));
            assert!(!takes_dense_at(cuda, 31));
            assert!(takes_dense_at(cuda, 32));
            assert!(takes_dense_at(cuda, 4096));
            assert!(!takes_dense_at(None, 4096));
        }
    }

    #[test]
    fn the_variables_parse_counts_and_zero_and_refuse_the_rest() {
        assert_eq!(parse_switch("0"), Ok(None));
        assert_eq!(parse_switch("1"), Ok(Some(1)));
        assert_eq!(parse_switch(" 64 "), Ok(Some(64)));
        for bad in ["", "-1", "1.5", "many", "32k"] {
            let err = parse_switch(bad).unwrap_err();
            assert!(err.contains("not a token count"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn the_registry_name_cuda_is_cuda_only_with_the_launchers() {
        let cuda = WeightBackend::from_registry_name(Some(c"CUDA"));
        let expect = if cfg!(feature = "cuda") {
            WeightBackend::Cuda
        } else {
            WeightBackend::Other
        };
        assert_eq!(cuda, expect);
        for other in [Some(c"CPU"), Some(c"RPC"), Some(c"Vulkan"), None] {
            assert_eq!(
                WeightBackend::from_registry_name(other),
                WeightBackend::Other
            );
        }
    }
}
