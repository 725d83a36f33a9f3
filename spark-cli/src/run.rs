//! `spark run`: generate text from a prompt, streaming it, then report speeds like llama-cli.

use crate::error::{CliError, Result};
use crate::session::{decode, finite_logits, ModelArgs, Session};
use clap::Args;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::sampling::LlamaSampler;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

/// Arguments of `spark run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Model and Spark options.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt text.
    #[arg(
        short = 'p',
        long = "prompt",
        value_name = "TEXT",
        conflicts_with = "file"
    )]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Tokens to generate.
    #[arg(
        short = 'n',
        long = "n-predict",
        value_name = "N",
        default_value_t = 64
    )]
    pub n_predict: u32,
    /// Sampling temperature (0 = greedy).
    #[arg(long, value_name = "T", default_value_t = 0.8)]
    pub temp: f32,
    /// Top-k sampling (0 = off).
    #[arg(long = "top-k", value_name = "K", default_value_t = 40)]
    pub top_k: i32,
    /// Top-p (nucleus) sampling (1 = off).
    #[arg(long = "top-p", value_name = "P", default_value_t = 0.95)]
    pub top_p: f32,
    /// Random seed.
    #[arg(long, value_name = "S", default_value_t = 42)]
    pub seed: u32,
    /// Do not echo the prompt or stream the generated text (speeds are still printed).
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

fn sampler(args: &RunArgs) -> LlamaSampler {
    if args.temp <= 0.0 {
        return LlamaSampler::greedy();
    }
    let mut chain = Vec::new();
    if args.top_k > 0 {
        chain.push(LlamaSampler::top_k(args.top_k));
    }
    if args.top_p < 1.0 {
        chain.push(LlamaSampler::top_p(args.top_p, 1));
    }
    chain.push(LlamaSampler::temp(args.temp));
    chain.push(LlamaSampler::dist(args.seed));
    LlamaSampler::chain_simple(chain)
}

/// Runs `spark run`.
pub fn run(args: &RunArgs) -> Result<()> {
    if !(args.top_p > 0.0 && args.top_p <= 1.0) {
        return Err(CliError::new(format!(
            "--top-p must be in (0, 1], got {}",
            args.top_p
        )));
    }
    let prompt = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => std::fs::read_to_string(f)
            .map_err(|e| CliError::new(format!("cannot read prompt file {}: {e}", f.display())))?,
        (None, None) => String::new(),
    };
    let session = Session::load(&args.model)?;
    let vocab = session.model.vocab();
    let mut tokens = vocab.tokenize(prompt.as_bytes(), vocab.should_add_bos(), false);
    if tokens.is_empty() {
        tokens.push(vocab.bos());
    }
    let n_prompt = tokens.len();
    let n_total = u32::try_from(n_prompt)
        .ok()
        .and_then(|n| n.checked_add(args.n_predict))
        .ok_or_else(|| CliError::new("prompt plus --n-predict is too long"))?;
    let mut ctx = session.context(n_total)?;
    let n_batch = ctx.n_batch() as usize;
    let mut sampler = sampler(args);
    crate::spark_stats::reset_stats(&session.source);

    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if !args.quiet {
        let _ = write!(out, "{prompt}");
        let _ = out.flush();
    }

    // prompt
    let t_prompt = Instant::now();
    let mut batch = LlamaBatch::new(n_batch.max(1), 1);
    for (chunk_index, chunk) in tokens.chunks(n_batch).enumerate() {
        batch.clear();
        let last_chunk = (chunk_index + 1) * n_batch >= n_prompt;
        for (j, t) in chunk.iter().enumerate() {
            let pos = (chunk_index * n_batch + j) as i32;
            let want_logits = last_chunk && j + 1 == chunk.len();
            batch
                .add(*t, pos, &[0], want_logits)
                .map_err(|e| CliError::new(format!("batch: {e}")))?;
        }
        decode(&mut ctx, &mut batch)?;
    }
    let prompt_s = t_prompt.elapsed().as_secs_f64();

    // generation
    let t_gen = Instant::now();
    let mut n_generated = 0u32;
    let mut pos = n_prompt as i32;
    let mut last_index = batch.n_tokens() - 1;
    let mut pending = Vec::new();
    while n_generated < args.n_predict {
        finite_logits(ctx.get_logits_ith(last_index), pos as usize - 1)?;
        let token = sampler.sample(&ctx, last_index);
        sampler.accept(token);
        n_generated += 1;
        if vocab.is_eog(token) {
            break;
        }
        if !args.quiet {
            pending.extend_from_slice(&vocab.token_to_piece(token, false, None));
            // print whole UTF-8 sequences only
            let valid = match std::str::from_utf8(&pending) {
                Ok(_) => pending.len(),
                Err(e) => e.valid_up_to(),
            };
            let _ = out.write_all(&pending[..valid]);
            let _ = out.flush();
            pending.drain(..valid);
        }
        if n_generated == args.n_predict {
            break;
        }
        batch.clear();
        batch
            .add(token, pos, &[0], true)
            .map_err(|e| CliError::new(format!("batch: {e}")))?;
        pos += 1;
        decode(&mut ctx, &mut batch)?;
        last_index = 0;
    }
    let gen_s = t_gen.elapsed().as_secs_f64();
    if !args.quiet {
        let _ = out.write_all(&pending);
        let _ = writeln!(out);
    }
    drop(out);

    eprintln!(
        "spark: prompt eval: {n_prompt} tokens in {:.2} s ({:.2} tokens/s)",
        prompt_s,
        n_prompt as f64 / prompt_s.max(1e-9)
    );
    eprintln!(
        "spark: generation: {n_generated} tokens in {:.2} s ({:.2} tokens/s)",
        gen_s,
        f64::from(n_generated) / gen_s.max(1e-9)
    );
    session.finish();
    Ok(())
}
