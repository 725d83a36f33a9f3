//! Loading a model and creating a context with the options every inference command shares.

use crate::error::{CliError, Result};
use crate::gguf_info::{self, ModelInfo};
use crate::kernel_source::{self, KernelSource};
use crate::llama_log;
use crate::spark_stats;
use clap::{Args, ValueEnum};
use llama_cpp_2::context::params::{KvCacheType, LlamaContextParams};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::params::kv_overrides::ParamOverrideValue;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use spark_gguf::schema::{arch_key, suffix, SPARK_ARCH};
use std::ffi::CString;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::pin::pin;

/// Options shared by the commands that load one model (`run`, `eval`, `perplexity`).
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// GGUF model file.
    #[arg(short = 'm', long = "model", value_name = "MODEL")]
    pub model: PathBuf,
    /// Context size in tokens (0 = as needed).
    #[arg(short = 'c', long = "ctx-size", value_name = "N", default_value_t = 0)]
    pub ctx: u32,
    /// Threads, batch size and KV cache type.
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    /// Layers to offload to a GPU (when the build has one).
    #[arg(
        short = 'g',
        long = "n-gpu-layers",
        visible_alias = "ngl",
        value_name = "N",
        default_value_t = 0
    )]
    pub n_gpu_layers: u32,
    /// Spark options.
    #[command(flatten)]
    pub spark: SparkArgs,
}

/// How a context runs: threads, batch size, KV cache type (also taken by `spark bench`).
#[derive(Debug, Clone, Args)]
pub struct RuntimeArgs {
    /// Threads (default: all cores).
    #[arg(short = 't', long = "threads", value_name = "N")]
    pub threads: Option<i32>,
    /// Logical batch size for prompt processing.
    #[arg(
        short = 'b',
        long = "batch-size",
        value_name = "N",
        default_value_t = 512
    )]
    pub batch: u32,
    /// KV cache element type.
    #[arg(long = "cache-type", value_enum, default_value_t = CacheType::F16)]
    pub cache_type: CacheType,
}

/// Load-time overrides of the Spark k values (also taken by `spark bench`).
#[derive(Debug, Clone, Args)]
pub struct KOverrides {
    /// Override k_f, the FFN neurons kept per token (spark-gemma2.spark.ffn_k).
    #[arg(long = "spark-ffn-k", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i32::MAX as i64))]
    pub ffn_k: Option<u32>,
    /// Override k_a, the positions kept per query (spark-gemma2.spark.attn_k).
    #[arg(long = "spark-attn-k", value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i32::MAX as i64))]
    pub attn_k: Option<u32>,
}

/// Options that choose and observe the Spark kernels.
#[derive(Debug, Clone, Args)]
pub struct SparkArgs {
    /// Do not register the Spark kernels: run the dense stock-op graph.
    #[arg(long, conflicts_with = "backend_path")]
    pub dense: bool,
    /// k overrides.
    #[command(flatten)]
    pub k: KOverrides,
    /// At exit, print per-layer FFN keep rates and attended positions.
    #[arg(long = "spark-stats")]
    pub stats: bool,
    /// Load the Spark kernels from this ggml backend library (as GGML_BACKEND_PATH does)
    /// instead of registering them in-process.
    #[arg(long = "backend-path", value_name = "PATH")]
    pub backend_path: Option<PathBuf>,
    /// Show llama.cpp's log.
    #[arg(long, short = 'v')]
    pub verbose: bool,
}

impl SparkArgs {
    /// Where the kernels come from.
    pub fn kernel_source(&self) -> KernelSource {
        if self.dense {
            KernelSource::Dense
        } else if let Some(p) = &self.backend_path {
            KernelSource::Plugin(p.clone())
        } else {
            KernelSource::InProcess
        }
    }
}

/// KV cache element types (llama.cpp's `-ctk` / `-ctv` set): spark-gemma2's attention reads
/// f32 and f16 in place and the others in whole blocks converted to f32 (patch 0003).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CacheType {
    /// Half precision (llama.cpp's default).
    F16,
    /// Single precision.
    F32,
    /// bfloat16.
    Bf16,
    /// 8-bit blocks of 32 (8.5 bits per value).
    #[value(name = "q8_0")]
    Q8_0,
    /// 4-bit blocks of 32 (4.5 bits per value).
    #[value(name = "q4_0")]
    Q4_0,
    /// 4-bit blocks of 32 with a minimum (5 bits per value).
    #[value(name = "q4_1")]
    Q4_1,
    /// 4-bit non-linear blocks of 32 (4.5 bits per value).
    #[value(name = "iq4_nl")]
    Iq4Nl,
    /// 5-bit blocks of 32 (5.5 bits per value).
    #[value(name = "q5_0")]
    Q5_0,
    /// 5-bit blocks of 32 with a minimum (6 bits per value).
    #[value(name = "q5_1")]
    Q5_1,
}

impl CacheType {
    /// ggml's name of the type, as `--cache-type` and llama-bench's type_k/type_v spell it.
    pub fn name(self) -> &'static str {
        match self {
            CacheType::F16 => "f16",
            CacheType::F32 => "f32",
            CacheType::Bf16 => "bf16",
            CacheType::Q8_0 => "q8_0",
            CacheType::Q4_0 => "q4_0",
            CacheType::Q4_1 => "q4_1",
            CacheType::Iq4Nl => "iq4_nl",
            CacheType::Q5_0 => "q5_0",
            CacheType::Q5_1 => "q5_1",
        }
    }

    /// The type for llama.cpp's context parameters.
    fn kv_type(self) -> KvCacheType {
        match self {
            CacheType::F16 => KvCacheType::F16,
            CacheType::F32 => KvCacheType::F32,
            CacheType::Bf16 => KvCacheType::BF16,
            CacheType::Q8_0 => KvCacheType::Q8_0,
            CacheType::Q4_0 => KvCacheType::Q4_0,
            CacheType::Q4_1 => KvCacheType::Q4_1,
            CacheType::Iq4Nl => KvCacheType::IQ4_NL,
            CacheType::Q5_0 => KvCacheType::Q5_0,
            CacheType::Q5_1 => KvCacheType::Q5_1,
        }
    }
}

/// The thread count in effect: `threads` (`-t`), or all cores.
pub fn thread_count(threads: Option<i32>) -> i32 {
    threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, |n| i32::try_from(n.get()).unwrap_or(1))
    })
}

/// The sizes of a context: llama.cpp's n_ctx, n_batch and n_ubatch, and swa_full when it is
/// not left at llama.cpp's default. Threads and KV cache type come from the session's
/// [`RuntimeArgs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextShape {
    /// Context size in tokens (at least 1).
    pub n_ctx: u32,
    /// Logical batch size: tokens per llama_decode call.
    pub n_batch: u32,
    /// Physical batch size.
    pub n_ubatch: u32,
    /// Whether sliding-window layers keep a full-size KV cache (`None`: llama.cpp's default).
    pub swa_full: Option<bool>,
}

/// A loaded model, its metadata and the kernel source in effect.
pub struct Session {
    /// The llama.cpp backend (must outlive the model).
    pub backend: LlamaBackend,
    /// The model.
    pub model: LlamaModel,
    /// Metadata read before loading.
    pub info: ModelInfo,
    /// Kernel source in effect.
    pub source: KernelSource,
    /// Options used to load.
    pub args: ModelArgs,
}

impl Session {
    /// Checks the file, makes the kernels available, and loads the model with the k overrides.
    pub fn load(args: &ModelArgs) -> Result<Self> {
        llama_log::install(args.spark.verbose);
        let info = gguf_info::read(&args.model)?;
        if !info.is_spark() && (args.spark.k.ffn_k.is_some() || args.spark.k.attn_k.is_some()) {
            return Err(CliError::new(format!(
                "--spark-ffn-k / --spark-attn-k need a {} model, {} is {}",
                SPARK_ARCH,
                args.model.display(),
                info.arch
            )));
        }
        let backend = LlamaBackend::init()
            .map_err(|e| CliError::new(format!("cannot initialise llama.cpp: {e}")))?;
        let source = args.spark.kernel_source();
        kernel_source::activate(&source)?;

        let mut params = pin!(LlamaModelParams::default().with_n_gpu_layers(args.n_gpu_layers));
        for (key, value) in [
            (suffix::SPARK_FFN_K, args.spark.k.ffn_k),
            (suffix::SPARK_ATTN_K, args.spark.k.attn_k),
        ] {
            if let Some(v) = value {
                let key = CString::new(arch_key(SPARK_ARCH, key))
                    .map_err(|_| CliError::new("invalid override key"))?;
                params
                    .as_mut()
                    .append_kv_override(&key, ParamOverrideValue::Int(i64::from(v)));
            }
        }
        llama_log::clear_errors();
        let model = LlamaModel::load_from_file(&backend, &args.model, &params).map_err(|e| {
            let cause = llama_log::last_error().unwrap_or_else(|| e.to_string());
            CliError::new(format!("cannot load {}: {cause}", args.model.display()))
        })?;
        Ok(Self {
            backend,
            model,
            info,
            source,
            args: args.clone(),
        })
    }

    /// A context with room for `n_tokens` tokens (or `-c`, when larger), processing prompts in
    /// batches of `-b` tokens (at most the context).
    pub fn context(&self, n_tokens: u32) -> Result<LlamaContext<'_>> {
        let n_ctx = self.args.ctx.max(n_tokens).max(1);
        let n_batch = self.args.runtime.batch.clamp(1, n_ctx);
        self.new_context(ContextShape {
            n_ctx,
            n_batch,
            n_ubatch: n_batch,
            swa_full: None,
        })
    }

    /// A context of the given shape with the session's threads and KV cache type; a failure
    /// carries llama.cpp's own reason when it logged one.
    pub fn new_context(&self, shape: ContextShape) -> Result<LlamaContext<'_>> {
        let threads = thread_count(self.args.runtime.threads);
        if threads < 1 {
            return Err(CliError::new(format!(
                "--threads must be at least 1, got {threads}"
            )));
        }
        let cache = self.args.runtime.cache_type.kv_type();
        let mut params = LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(shape.n_ctx.max(1)))
            .with_n_batch(shape.n_batch)
            .with_n_ubatch(shape.n_ubatch)
            .with_n_threads(threads)
            .with_n_threads_batch(threads)
            .with_type_k(cache)
            .with_type_v(cache);
        if let Some(swa_full) = shape.swa_full {
            params = params.with_swa_full(swa_full);
        }
        llama_log::clear_errors();
        self.model.new_context(&self.backend, params).map_err(|e| {
            let cause = llama_log::last_error().unwrap_or_else(|| e.to_string());
            CliError::new(format!("cannot create a context: {cause}"))
        })
    }

    /// Prints `--spark-stats` when requested.
    pub fn finish(&self) {
        if !self.args.spark.stats {
            return;
        }
        let n_layer = self.info.n_layer().unwrap_or_else(|| self.model.n_layer());
        let targets = spark_stats::Targets {
            n_ff: self.info.n_ff(),
            ffn_k: self.args.spark.k.ffn_k.or(self.info.ffn_k()),
            attn_k: self.args.spark.k.attn_k.or(self.info.attn_k()),
        };
        spark_stats::print_stats(&self.source, n_layer, targets);
    }
}

/// Runs `llama_decode` on `batch`; a failure becomes one line with llama.cpp's own reason
/// (the last error it logged) when there is one.
pub fn decode(
    ctx: &mut LlamaContext<'_>,
    batch: &mut llama_cpp_2::llama_batch::LlamaBatch,
) -> Result<()> {
    ctx.decode(batch).map_err(|e| {
        let cause = llama_log::last_error().unwrap_or_else(|| e.to_string());
        CliError::new(format!("decode failed: {cause}"))
    })
}

/// The logits of `position` (a token position of the input), or an error when any is not
/// finite: a Spark kernel that failed fills its output with NaN (with a `spark-backend: ...`
/// line on stderr), and the NaN reaches every logit downstream; no command goes on to sample,
/// score or write such values as if they were results.
pub fn finite_logits(logits: &[f32], position: usize) -> Result<&[f32]> {
    match logits.iter().position(|x| !x.is_finite()) {
        None => Ok(logits),
        Some(i) => Err(CliError::new(format!(
            "the model produced a non-finite logit ({} for token {i}) at position {position}: a \
             Spark kernel failed (see the spark-backend lines above) or the weights hold NaN/inf",
            logits[i]
        ))),
    }
}
