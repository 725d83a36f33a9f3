//! `spark`: run, evaluate and quantize Spark-Gemma2 (and Gemma-2) GGUF models on the patched
//! llama.cpp, with the Spark kernels registered in-process (default), loaded from a ggml backend
//! library (`--backend-path`), or not at all (`--dense`).

mod bench;
mod error;
mod eval;
mod gguf_info;
mod kernel_source;
mod kld;
mod llama_log;
mod mean_sd;
mod perplexity;
mod quantize;
mod run;
mod session;
mod spark_stats;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Command line of `spark`.
#[derive(Debug, Parser)]
#[command(
    name = "spark",
    version,
    about = "Spark Transformer models on llama.cpp"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate text from a prompt and report prompt and generation speed.
    Run(run::RunArgs),
    /// Write the logits of every position of a token sequence to a .npy file.
    Eval(eval::EvalArgs),
    /// Quantize a GGUF with llama.cpp's quantizer.
    Quantize(quantize::QuantizeArgs),
    /// Perplexity of a text file (llama-perplexity's method: second half of each chunk).
    Perplexity(perplexity::PerplexityArgs),
    /// Prompt and generation speed (llama-bench's pp/tg tests), sparse and dense side by side.
    Bench(bench::BenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Run(a) => run::run(a),
        Command::Eval(a) => eval::run(a),
        Command::Quantize(a) => quantize::run(a),
        Command::Perplexity(a) => perplexity::run(a),
        Command::Bench(a) => bench::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("spark: error: {e}");
            ExitCode::FAILURE
        }
    }
}
