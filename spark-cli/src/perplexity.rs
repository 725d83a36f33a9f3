//! `spark perplexity`: llama-perplexity's method. The whole text is tokenized once (with BOS when
//! the model asks for it); it is cut into chunks of `-c` tokens, each evaluated from position 0
//! with its first token replaced by BOS, and the second half of each chunk is scored: the
//! negative log-likelihood of token j + 1 given the logits at j, for j in [n_ctx/2, n_ctx - 1).

use crate::error::{CliError, Result};
use crate::session::{ModelArgs, Session};
use clap::Args;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;
use std::io::Write;
use std::path::PathBuf;

/// Context size used when `-c` is not given (llama-perplexity's default).
const DEFAULT_CTX: u32 = 512;

/// Arguments of `spark perplexity`.
#[derive(Debug, Clone, Args)]
pub struct PerplexityArgs {
    /// Model and Spark options (`-c` is the chunk length, default 512).
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text file to score.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: PathBuf,
    /// Score at most this many chunks (default: all).
    #[arg(long = "chunks", value_name = "N")]
    pub chunks: Option<usize>,
}

/// Running sums of the scored negative log-likelihoods.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct NllSum {
    /// Sum of -log p over scored tokens.
    pub nll: f64,
    /// Sum of (-log p)^2 (for the error estimate).
    pub nll2: f64,
    /// Scored tokens.
    pub count: u64,
}

impl NllSum {
    /// exp(mean NLL).
    pub fn ppl(&self) -> f64 {
        (self.nll / self.count.max(1) as f64).exp()
    }

    /// llama-perplexity's uncertainty of the PPL estimate: ppl * stderr(mean NLL).
    pub fn ppl_error(&self) -> f64 {
        if self.count < 2 {
            return 0.0;
        }
        let n = self.count as f64;
        let mean = self.nll / n;
        let var = (self.nll2 / n - mean * mean).max(0.0) / (n - 1.0);
        self.ppl() * var.sqrt()
    }
}

/// -log softmax(logits)[target], in f64.
pub fn token_nll(logits: &[f32], target: usize) -> f64 {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let sum: f64 = logits.iter().map(|&v| (v as f64 - max).exp()).sum();
    sum.ln() + max - logits[target] as f64
}

/// Runs `spark perplexity`.
pub fn run(args: &PerplexityArgs) -> Result<()> {
    let text = std::fs::read(&args.file)
        .map_err(|e| CliError::new(format!("cannot read {}: {e}", args.file.display())))?;
    let session = Session::load(&args.model)?;
    let vocab = session.model.vocab();
    let add_bos = vocab.should_add_bos();
    let bos = vocab.bos().0;
    let tokens: Vec<i32> = vocab
        .tokenize(&text, add_bos, false)
        .iter()
        .map(|t| t.0)
        .collect();
    let n_ctx_u32 = if args.model.ctx > 0 {
        args.model.ctx
    } else {
        DEFAULT_CTX
    };
    let n_ctx = n_ctx_u32 as usize;
    if n_ctx < 4 {
        return Err(CliError::new(format!(
            "-c {n_ctx}: the context must hold at least 4 tokens"
        )));
    }
    let available = tokens.len() / n_ctx;
    let n_chunk = args.chunks.map_or(available, |c| c.min(available));
    if n_chunk == 0 {
        return Err(CliError::new(format!(
            "{}: {} tokens is less than one chunk of {n_ctx} (-c)",
            args.file.display(),
            tokens.len()
        )));
    }
    eprintln!(
        "spark: perplexity: {} tokens, {n_chunk} chunks of {n_ctx}, scoring the second half of each",
        tokens.len()
    );
    let mut ctx = session.context(n_ctx_u32)?;
    let n_batch = (ctx.n_batch() as usize).min(n_ctx);
    crate::spark::reset_stats(&session.source);

    let first = n_ctx / 2;
    let mut sum = NllSum::default();
    let mut batch = LlamaBatch::new(n_batch, 1);
    let mut chunk_logits: Vec<f32> = Vec::new();
    let t0 = std::time::Instant::now();
    for chunk in 0..n_chunk {
        let start = chunk * n_ctx;
        let mut input = tokens[start..start + n_ctx].to_vec();
        if add_bos {
            input[0] = bos;
        }
        ctx.clear_kv_cache();
        chunk_logits.clear();
        for (b, part) in input.chunks(n_batch).enumerate() {
            batch.clear();
            for (j, t) in part.iter().enumerate() {
                let pos = b * n_batch + j;
                batch
                    .add(LlamaToken(*t), pos as i32, &[0], pos >= first)
                    .map_err(|e| CliError::new(format!("batch: {e}")))?;
            }
            ctx.decode(&mut batch).map_err(|e| {
                let cause = crate::llama_log::last_error().unwrap_or_else(|| e.to_string());
                CliError::new(format!("decode failed: {cause}"))
            })?;
            for j in 0..part.len() {
                let pos = b * n_batch + j;
                if pos >= first && pos + 1 < n_ctx {
                    let target = tokens[start + pos + 1] as usize;
                    let nll = token_nll(ctx.get_logits_ith(j as i32), target);
                    sum.nll += nll;
                    sum.nll2 += nll * nll;
                    sum.count += 1;
                }
            }
        }
        print!("[{}]{:.4},", chunk + 1, sum.ppl());
        let _ = std::io::stdout().flush();
    }
    println!();
    println!(
        "Final estimate: PPL = {:.4} +/- {:.5}",
        sum.ppl(),
        sum.ppl_error()
    );
    eprintln!(
        "spark: perplexity: {} tokens scored in {:.2} s ({:.2} tokens/s evaluated)",
        sum.count,
        t0.elapsed().as_secs_f64(),
        (n_chunk * n_ctx) as f64 / t0.elapsed().as_secs_f64()
    );
    session.finish();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{token_nll, NllSum};

    #[test]
    fn nll_is_minus_log_softmax() {
        let logits = [1.0f32, 2.0, 3.0];
        let z: f64 = [1.0f64, 2.0, 3.0].iter().map(|v| v.exp()).sum();
        for t in 0..3 {
            let want = -(((t + 1) as f64).exp() / z).ln();
            assert!((token_nll(&logits, t) - want).abs() < 1e-12);
        }
    }

    #[test]
    fn ppl_of_uniform_predictions_is_the_vocabulary_size() {
        let logits = [0.5f32; 10];
        let mut s = NllSum::default();
        for t in 0..10 {
            let nll = token_nll(&logits, t);
            s.nll += nll;
            s.nll2 += nll * nll;
            s.count += 1;
        }
        assert!((s.ppl() - 10.0).abs() < 1e-9);
        assert!(s.ppl_error() < 1e-9);
    }
}
