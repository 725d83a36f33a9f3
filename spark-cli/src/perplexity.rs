//! `spark perplexity`: llama-perplexity's method. The whole text is tokenized once (with BOS when
//! the model asks for it); it is cut into chunks of `-c` tokens, each evaluated from position 0
//! with its first token replaced by BOS, and the second half of each chunk is scored: the
//! negative log-likelihood of token j + 1 given the logits at j, for j in [n_ctx/2, n_ctx - 1).
//!
//! `--kl-divergence-base FILE` also saves every scored distribution (of a reference model, e.g.
//! the f32 conversion); `--kl-divergence --kl-divergence-base FILE` then runs another model (a
//! quantization) over the same tokens and reports its KL divergence from the saved one.

use crate::error::{CliError, Result};
use crate::kld::{self, BaseReader, BaseShape, BaseWriter, KldStats};
use crate::session::{decode, finite_logits, ModelArgs, Session};
use clap::Args;
use llama_cpp_2::context::LlamaContext;
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
    /// Text file to score (not needed with --kl-divergence: the base file holds the tokens).
    #[arg(
        short = 'f',
        long = "file",
        value_name = "FILE",
        required_unless_present = "kl_divergence"
    )]
    pub file: Option<PathBuf>,
    /// Score at most this many chunks (default: all).
    #[arg(long = "chunks", value_name = "N")]
    pub chunks: Option<usize>,
    /// File of the reference model's token distributions: written by this run, or read with
    /// --kl-divergence.
    #[arg(long = "kl-divergence-base", value_name = "FILE")]
    pub kl_divergence_base: Option<PathBuf>,
    /// Compare this model with the distributions in --kl-divergence-base.
    #[arg(long = "kl-divergence", requires = "kl_divergence_base")]
    pub kl_divergence: bool,
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

    /// Adds one scored token's negative log-likelihood.
    pub fn add(&mut self, nll: f64) {
        self.nll += nll;
        self.nll2 += nll * nll;
        self.count += 1;
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

/// What happens to each scored position.
trait Scorer {
    /// `logits` predict `target`, the next token.
    fn position(&mut self, logits: &[f32], target: usize) -> Result<()>;
    /// Progress after each chunk (`[1]45.5735,`, as llama-perplexity prints it).
    fn chunk_done(&self, chunk: usize);
}

/// Plain perplexity, optionally saving the distributions for a later KLD run.
struct Perplexity {
    sum: NllSum,
    base_out: Option<BaseWriter>,
    log_probs: Vec<f32>,
}

impl Scorer for Perplexity {
    fn position(&mut self, logits: &[f32], target: usize) -> Result<()> {
        kld::log_softmax(logits, &mut self.log_probs);
        self.sum.add(-f64::from(self.log_probs[target]));
        if let Some(w) = self.base_out.as_mut() {
            w.push(&self.log_probs)?;
        }
        Ok(())
    }

    fn chunk_done(&self, chunk: usize) {
        print!("[{}]{:.4},", chunk + 1, self.sum.ppl());
        let _ = std::io::stdout().flush();
    }
}

/// Perplexity of this model and of the base, and the KL divergence between them.
struct Divergence {
    sum: NllSum,
    base_sum: NllSum,
    stats: KldStats,
    base: BaseReader,
    base_row: Vec<f32>,
    log_probs: Vec<f32>,
}

impl Scorer for Divergence {
    fn position(&mut self, logits: &[f32], target: usize) -> Result<()> {
        kld::log_softmax(logits, &mut self.log_probs);
        self.base.next_row(&mut self.base_row)?;
        self.sum.add(-f64::from(self.log_probs[target]));
        self.base_sum.add(-f64::from(self.base_row[target]));
        self.stats.add(&self.base_row, &self.log_probs);
        Ok(())
    }

    fn chunk_done(&self, chunk: usize) {
        let (kld, _) = self.stats.mean();
        print!("[{}]{:.4}/{kld:.6},", chunk + 1, self.sum.ppl());
        let _ = std::io::stdout().flush();
    }
}

/// Evaluates `n_chunk` chunks of `n_ctx` tokens and hands every scored position to `scorer`.
fn score_chunks(
    ctx: &mut LlamaContext<'_>,
    tokens: &[i32],
    n_ctx: usize,
    n_chunk: usize,
    bos: Option<i32>,
    scorer: &mut dyn Scorer,
) -> Result<()> {
    let n_batch = (ctx.n_batch() as usize).min(n_ctx);
    let first = n_ctx / 2;
    let mut batch = LlamaBatch::new(n_batch, 1);
    for chunk in 0..n_chunk {
        let start = chunk * n_ctx;
        let mut input = tokens[start..start + n_ctx].to_vec();
        if let Some(bos) = bos {
            input[0] = bos;
        }
        ctx.clear_kv_cache();
        for (b, part) in input.chunks(n_batch).enumerate() {
            batch.clear();
            for (j, t) in part.iter().enumerate() {
                let pos = b * n_batch + j;
                batch
                    .add(LlamaToken(*t), pos as i32, &[0], pos >= first)
                    .map_err(|e| CliError::new(format!("batch: {e}")))?;
            }
            decode(ctx, &mut batch)?;
            for j in 0..part.len() {
                let pos = b * n_batch + j;
                if pos >= first && pos + 1 < n_ctx {
                    let target = tokens[start + pos + 1];
                    let logits = finite_logits(ctx.get_logits_ith(j as i32), start + pos)?;
                    let target = usize::try_from(target)
                        .ok()
                        .filter(|&t| t < logits.len())
                        .ok_or_else(|| {
                            CliError::new(format!(
                                "token {target} is outside the model's vocabulary of {}",
                                logits.len()
                            ))
                        })?;
                    scorer.position(logits, target)?;
                }
            }
        }
        scorer.chunk_done(chunk);
    }
    println!();
    Ok(())
}

/// Runs `spark perplexity`.
pub fn run(args: &PerplexityArgs) -> Result<()> {
    let session = Session::load(&args.model)?;
    let vocab = session.model.vocab();
    let add_bos = vocab.should_add_bos();
    let bos = add_bos.then(|| vocab.bos().0);
    let n_vocab = session.model.n_vocab();

    // The tokens (and the chunk length): from the text, or from the base file.
    let mut base_in = None;
    let (tokens, n_ctx) = if args.kl_divergence {
        let path = args.kl_divergence_base.as_ref().expect("clap requires it");
        let mut base = BaseReader::open(path)?;
        if i64::from(base.shape.n_vocab) != i64::from(n_vocab) {
            return Err(CliError::new(format!(
                "{}: vocabulary of {} but the model has {n_vocab}",
                path.display(),
                base.shape.n_vocab
            )));
        }
        let n_ctx = base.shape.n_ctx;
        if args.model.ctx != 0 && args.model.ctx != n_ctx {
            return Err(CliError::new(format!(
                "-c {} differs from the {n_ctx} the base file {} was written with",
                args.model.ctx,
                path.display()
            )));
        }
        let tokens = std::mem::take(&mut base.tokens);
        base_in = Some(base);
        (tokens, n_ctx)
    } else {
        let file = args.file.as_ref().expect("clap requires -f");
        let text = std::fs::read(file)
            .map_err(|e| CliError::new(format!("cannot read {}: {e}", file.display())))?;
        let tokens: Vec<i32> = vocab
            .tokenize(&text, add_bos, false)
            .iter()
            .map(|t| t.0)
            .collect();
        let n_ctx = if args.model.ctx > 0 {
            args.model.ctx
        } else {
            DEFAULT_CTX
        };
        (tokens, n_ctx)
    };
    let n_ctx_u32 = n_ctx;
    let n_ctx = n_ctx as usize;
    if n_ctx < 4 {
        return Err(CliError::new(format!(
            "-c {n_ctx}: the context must hold at least 4 tokens"
        )));
    }
    let available = tokens.len() / n_ctx;
    let n_chunk = args.chunks.map_or(available, |c| c.min(available));
    if n_chunk == 0 {
        let source = args
            .file
            .as_ref()
            .map_or_else(String::new, |f| format!("{}: ", f.display()));
        return Err(CliError::new(format!(
            "{source}{} tokens is less than one chunk of {n_ctx} (-c)",
            tokens.len()
        )));
    }
    eprintln!(
        "spark: perplexity: {} tokens, {n_chunk} chunks of {n_ctx}, scoring the second half of each",
        tokens.len()
    );
    let mut ctx = session.context(n_ctx_u32)?;
    crate::spark_stats::reset_stats(&session.source);
    let t0 = std::time::Instant::now();

    let sum = if let Some(base) = base_in {
        let mut scorer = Divergence {
            sum: NllSum::default(),
            base_sum: NllSum::default(),
            stats: KldStats::default(),
            base,
            base_row: Vec::new(),
            log_probs: Vec::new(),
        };
        score_chunks(&mut ctx, &tokens, n_ctx, n_chunk, bos, &mut scorer)?;
        print_divergence(&scorer);
        scorer.sum
    } else {
        let base_out = match &args.kl_divergence_base {
            Some(path) => {
                let shape = BaseShape {
                    n_ctx: n_ctx_u32,
                    n_vocab: u32::try_from(n_vocab)
                        .map_err(|_| CliError::new(format!("vocabulary size {n_vocab}")))?,
                    n_chunk: n_chunk as u32,
                };
                Some(BaseWriter::create(path, shape, &tokens[..n_chunk * n_ctx])?)
            }
            None => None,
        };
        let mut scorer = Perplexity {
            sum: NllSum::default(),
            base_out,
            log_probs: Vec::new(),
        };
        score_chunks(&mut ctx, &tokens, n_ctx, n_chunk, bos, &mut scorer)?;
        println!(
            "Final estimate: PPL = {:.4} +/- {:.5}",
            scorer.sum.ppl(),
            scorer.sum.ppl_error()
        );
        if let (Some(w), Some(path)) = (scorer.base_out.take(), &args.kl_divergence_base) {
            w.finish()?;
            eprintln!(
                "spark: perplexity: saved the distributions to {}",
                path.display()
            );
        }
        scorer.sum
    };
    eprintln!(
        "spark: perplexity: {} tokens scored in {:.2} s ({:.2} tokens/s evaluated)",
        sum.count,
        t0.elapsed().as_secs_f64(),
        (n_chunk * n_ctx) as f64 / t0.elapsed().as_secs_f64()
    );
    session.finish();
    Ok(())
}

/// llama-perplexity's summary of a `--kl-divergence` run.
fn print_divergence(d: &Divergence) {
    let (kld, kld_err) = d.stats.mean();
    let (same, same_err) = d.stats.same_top1();
    println!("====== Perplexity statistics ======");
    println!(
        "Mean PPL(Q)     : {:10.6} +/- {:.6}",
        d.sum.ppl(),
        d.sum.ppl_error()
    );
    println!(
        "Mean PPL(base)  : {:10.6} +/- {:.6}",
        d.base_sum.ppl(),
        d.base_sum.ppl_error()
    );
    println!("PPL(Q)/PPL(base): {:10.6}", d.sum.ppl() / d.base_sum.ppl());
    println!();
    println!("====== KL divergence statistics ======");
    println!("Positions  : {:10}", d.stats.count());
    println!("Mean    KLD: {kld:10.6} +/- {kld_err:.6}");
    println!("Maximum KLD: {:10.6}", d.stats.quantile(1.0));
    println!("99.0%   KLD: {:10.6}", d.stats.quantile(0.99));
    println!("Median  KLD: {:10.6}", d.stats.quantile(0.5));
    println!("Minimum KLD: {:10.6}", d.stats.quantile(0.0));
    println!();
    println!("====== Token probability statistics ======");
    println!(
        "Same top p: {:6.3} +/- {:.3} %",
        100.0 * same,
        100.0 * same_err
    );
}

#[cfg(test)]
mod tests {
    use super::NllSum;
    use crate::kld::log_softmax;

    #[test]
    fn nll_is_minus_log_softmax() {
        let mut lp = Vec::new();
        log_softmax(&[1.0f32, 2.0, 3.0], &mut lp);
        let z: f64 = [1.0f64, 2.0, 3.0].iter().map(|v| v.exp()).sum();
        for (t, &l) in lp.iter().enumerate() {
            let want = -(((t + 1) as f64).exp() / z).ln();
            assert!((-f64::from(l) - want).abs() < 1e-6);
        }
    }

    #[test]
    fn ppl_of_uniform_predictions_is_the_vocabulary_size() {
        let mut lp = Vec::new();
        log_softmax(&[0.5f32; 10], &mut lp);
        let mut s = NllSum::default();
        for &l in &lp {
            s.add(-f64::from(l));
        }
        assert!((s.ppl() - 10.0).abs() < 1e-6);
        assert!(s.ppl_error() < 1e-6);
    }
}
