//! `spark-convert`: a Spark (or dense Gemma-2) `.npz` checkpoint, or a synthetic random model,
//! to GGUF.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use spark_convert::chat_template;
use spark_convert::convert::{
    convert, default_manifest_path, ConvertOptions, InputDtype, SparkOverrides,
};
use spark_convert::error::{Error, Result};
use spark_convert::model::OutType;
use spark_convert::synthetic::{generate_with_chat_template, SyntheticOptions};
use spark_gguf::schema::{FfnRowLayout, QkvLayout};

/// Convert a Spark-Gemma2 (or dense Gemma-2) .npz checkpoint to GGUF.
///
/// Usage: spark-convert IN.npz OUT.gguf [options]
///        spark-convert --synthetic PRESET OUT.gguf [--seed N] [options]
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Cli {
    /// IN.npz OUT.gguf (or only OUT.gguf with --synthetic).
    #[arg(value_name = "PATHS", num_args = 1..=2, required = true)]
    paths: Vec<PathBuf>,
    /// Write a random-weight model instead: spark-gemma2-2b, gemma2-2b, spark-gemma2-9b,
    /// gemma2-9b, tiny or tiny-dense.
    #[arg(long, value_name = "PRESET")]
    synthetic: Option<String>,
    /// Seed of the synthetic weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Tensor storage: f32, f16, bf16, q8_0, or auto (the checkpoint's precision; f16 for
    /// --synthetic). Norms and other 1-D tensors are always f32.
    #[arg(long, default_value = "auto")]
    outtype: String,
    /// The checkpoint's float type (float32, float16, bfloat16); needed for bfloat16 arrays
    /// (|V2) when the config has no "dtype".
    #[arg(long, value_name = "DTYPE")]
    input_dtype: Option<String>,
    /// SentencePiece .model file (default: the checkpoint's 'tokenizer' entry).
    #[arg(long, value_name = "FILE")]
    tokenizer: Option<PathBuf>,
    /// Copy the tokenizer.* keys of this GGUF instead.
    #[arg(long, value_name = "MODEL.gguf")]
    vocab_from: Option<PathBuf>,
    /// Write this tokenizer.chat_template: the Jinja text itself, or @FILE to read it from a
    /// UTF-8 file. Wins over the checkpoint's 'chat_template' entry, which wins over a template
    /// copied by --vocab-from. An empty template is an error.
    #[arg(long, value_name = "TEMPLATE")]
    chat_template: Option<String>,
    /// Override k_f (FFN neurons kept per token).
    #[arg(long)]
    ffn_k: Option<u32>,
    /// Override r_f (FFN predictor input dims).
    #[arg(long)]
    ffn_r: Option<u32>,
    /// Override k_a (attention positions kept per query).
    #[arg(long)]
    attn_k: Option<u32>,
    /// Override r_a (attention predictor dims per head).
    #[arg(long)]
    attn_r: Option<u32>,
    /// Write Wq, Wk and Wv of a Spark model as one stacked matrix, blk.N.attn_qkv.weight, instead
    /// of three: one matrix product per layer (four kernels fewer per decode layer on a GPU;
    /// a few percent slower decode on the CPU measured, docs/PERF.md). llama.cpp loads either.
    #[arg(long)]
    stack_qkv: bool,
    /// Write K2 and V of a Spark model as one tensor, blk.N.ffn_k2v.weight, whose row j is
    /// neuron j's K2 row followed by its V row, instead of ffn_up and ffn_down_t: one storage
    /// read per active neuron when rows are read from storage. Stored in the output type when
    /// both parts of a row are whole blocks of it, else as f16 (q8_0 with D - r_f or D not a
    /// multiple of 32). llama.cpp loads either.
    #[arg(long)]
    pair_k2v: bool,
    /// general.name (default: the input file's stem, or the preset).
    #[arg(long)]
    name: Option<String>,
    /// Also write a llama-gguf-hash manifest of the tensor data (per-tensor and whole-file
    /// xxh64, SHA-1 and SHA-256 lines, as `llama-gguf-hash --all` prints them), committed with
    /// the output: to OUT.gguf.manifest, or to FILE with --manifest=FILE. Check a file with
    /// `spark-gguf validate --manifest FILE OUT.gguf`, or `llama-gguf-hash --check FILE
    /// OUT.gguf` run in OUT.gguf's folder (the manifest names it by its file name).
    #[arg(
        long,
        value_name = "FILE",
        num_args = 0..=1,
        require_equals = true
    )]
    manifest: Option<Option<PathBuf>>,
    /// Replace an existing output file (and manifest).
    #[arg(long)]
    force: bool,
    /// No progress bar, notes or summary.
    #[arg(long, short)]
    quiet: bool,
}

/// `--manifest` (without a file: beside the output) as a path.
fn manifest_path(flag: Option<Option<PathBuf>>, output: &Path) -> Option<PathBuf> {
    flag.map(|f| f.unwrap_or_else(|| default_manifest_path(output)))
}

fn run(cli: Cli) -> Result<()> {
    let outtype = OutType::parse(&cli.outtype)?;
    let chat_template = cli
        .chat_template
        .as_deref()
        .map(chat_template::from_arg)
        .transpose()?;
    let qkv = if cli.stack_qkv {
        QkvLayout::Stacked
    } else {
        QkvLayout::Split
    };
    let ffn_rows = if cli.pair_k2v {
        FfnRowLayout::Paired
    } else {
        FfnRowLayout::Separate
    };
    let overrides = SparkOverrides {
        ffn_k: cli.ffn_k,
        ffn_r: cli.ffn_r,
        attn_k: cli.attn_k,
        attn_r: cli.attn_r,
    };
    if let Some(preset) = cli.synthetic {
        let [output] = <[PathBuf; 1]>::try_from(cli.paths)
            .map_err(|_| Error::Usage("with --synthetic give only the output path: spark-convert --synthetic PRESET OUT.gguf".into()))?;
        if cli.tokenizer.is_some() || cli.vocab_from.is_some() || cli.input_dtype.is_some() {
            return Err(Error::Usage(
                "--tokenizer, --vocab-from and --input-dtype do not apply to --synthetic".into(),
            ));
        }
        let manifest = manifest_path(cli.manifest, &output);
        return generate_with_chat_template(
            &SyntheticOptions {
                preset,
                output,
                manifest,
                seed: cli.seed,
                outtype,
                overrides,
                qkv,
                ffn_rows,
                name: cli.name,
                force: cli.force,
                quiet: cli.quiet,
            },
            chat_template.as_deref(),
        );
    }
    let [input, output] = <[PathBuf; 2]>::try_from(cli.paths).map_err(|_| {
        Error::Usage("give the checkpoint and the output: spark-convert IN.npz OUT.gguf".into())
    })?;
    let input_dtype = match cli.input_dtype {
        None => None,
        Some(s) => Some(InputDtype::parse(&s).ok_or_else(|| {
            Error::Usage(format!(
                "--input-dtype must be float32, float16 or bfloat16, not '{s}'"
            ))
        })?),
    };
    convert(&ConvertOptions {
        manifest: manifest_path(cli.manifest, &output),
        input,
        output,
        outtype,
        input_dtype,
        tokenizer: cli.tokenizer,
        vocab_from: cli.vocab_from,
        chat_template,
        overrides,
        qkv,
        ffn_rows,
        name: cli.name,
        force: cli.force,
        quiet: cli.quiet,
    })
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("spark-convert: error: {e}");
            ExitCode::FAILURE
        }
    }
}
