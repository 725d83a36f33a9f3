//! `spark eval`: logits for every position of a token sequence, saved as a `.npy` file.

use crate::error::{CliError, Result};
use crate::session::{decode, finite_logits, ModelArgs, Session};
use clap::Args;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::token::LlamaToken;
use spark_gguf::atomic::{write_atomically, Existing};

use std::path::PathBuf;

/// Arguments of `spark eval`.
#[derive(Debug, Clone, Args)]
pub struct EvalArgs {
    /// Model and Spark options.
    #[command(flatten)]
    pub model: ModelArgs,
    /// Token ids, comma-separated (no BOS is added).
    #[arg(
        long,
        value_name = "IDS",
        conflicts_with = "prompt",
        required_unless_present = "prompt"
    )]
    pub tokens: Option<String>,
    /// Text to tokenize (with BOS when the model asks for it).
    #[arg(short = 'p', long = "prompt", value_name = "TEXT")]
    pub prompt: Option<String>,
    /// Output file: float32 logits of shape [T, vocab].
    #[arg(long = "logits-out", value_name = "FILE.npy")]
    pub logits_out: PathBuf,
    /// Print nothing on success.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

/// Parses "2,17,5" into token ids.
pub fn parse_token_list(text: &str) -> Result<Vec<i32>> {
    let mut out = Vec::new();
    for (i, part) in text.split(',').enumerate() {
        let part = part.trim();
        let id: i32 = part.parse().map_err(|_| {
            CliError::new(format!("--tokens: entry {i} ({part:?}) is not a token id"))
        })?;
        if id < 0 {
            return Err(CliError::new(format!(
                "--tokens: entry {i} ({id}) is negative"
            )));
        }
        out.push(id);
    }
    Ok(out)
}

/// Runs `spark eval`.
pub fn run(args: &EvalArgs) -> Result<()> {
    let session = Session::load(&args.model)?;
    let n_vocab = session.model.n_vocab();
    let tokens: Vec<i32> = match (&args.tokens, &args.prompt) {
        (Some(list), _) => parse_token_list(list)?,
        (None, Some(text)) => {
            let vocab = session.model.vocab();
            let add_bos = vocab.should_add_bos();
            vocab
                .tokenize(text.as_bytes(), add_bos, false)
                .iter()
                .map(|t| t.0)
                .collect()
        }
        (None, None) => return Err(CliError::new("give --tokens or --prompt")),
    };
    if tokens.is_empty() {
        return Err(CliError::new("no tokens to evaluate"));
    }
    if let Some((i, t)) = tokens.iter().enumerate().find(|(_, t)| **t >= n_vocab) {
        return Err(CliError::new(format!(
            "--tokens: entry {i} ({t}) is out of range for a vocabulary of {n_vocab}"
        )));
    }
    let n = u32::try_from(tokens.len()).map_err(|_| CliError::new("too many tokens"))?;
    let mut ctx = session.context(n)?;
    let n_batch = ctx.n_batch() as usize;
    let n_vocab_usize = n_vocab as usize;
    crate::spark_stats::reset_stats(&session.source);

    let mut logits = Vec::with_capacity(tokens.len() * n_vocab_usize);
    let mut batch = LlamaBatch::new(n_batch, 1);
    for (chunk_index, chunk) in tokens.chunks(n_batch).enumerate() {
        batch.clear();
        for (j, t) in chunk.iter().enumerate() {
            let pos = (chunk_index * n_batch + j) as i32;
            batch
                .add(LlamaToken(*t), pos, &[0], true)
                .map_err(|e| CliError::new(format!("batch: {e}")))?;
        }
        decode(&mut ctx, &mut batch)?;
        for j in 0..chunk.len() {
            let position = chunk_index * n_batch + j;
            logits.extend_from_slice(finite_logits(ctx.get_logits_ith(j as i32), position)?);
        }
    }
    write_atomically(&args.logits_out, Existing::Replace, |w| {
        spark_gguf::npy::write_f32_2d(w, tokens.len(), n_vocab_usize, &logits)
    })?;
    if !args.quiet {
        eprintln!(
            "spark: wrote logits [{}, {}] to {}",
            tokens.len(),
            n_vocab,
            args.logits_out.display()
        );
    }
    session.finish();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_token_list;

    #[test]
    fn parses_token_lists() {
        assert_eq!(parse_token_list("2,17, 5").unwrap(), vec![2, 17, 5]);
        assert!(parse_token_list("2,x").unwrap_err().0.contains("entry 1"));
        assert!(parse_token_list("-3").is_err());
        assert!(parse_token_list("").is_err());
    }
}
