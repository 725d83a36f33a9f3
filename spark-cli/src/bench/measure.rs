//! Measuring one test as llama-bench does: a context of `n_prompt + n_gen + n_depth` tokens, a
//! warm-up (the prompt, or one generated token), then the cache cleared, `n_depth` tokens
//! processed (not timed; the state is kept and restored for the next test at the same depth,
//! as llama-bench does) and the test timed on top. Also the model facts llama-bench reports.

use super::plan::TestSpec;
use super::text::params_text;
use crate::error::{CliError, Result};
use crate::session::{decode, ContextShape, Session};
use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use llama_cpp_2::{LlamaStateSeqFlags, SeqState};
use llama_cpp_sys_2 as sys;
use spark_gguf::keys;
use std::ffi::CStr;
use std::time::Instant;

/// llama-bench's `model_type` without its file-type part: the architecture and the size
/// label (`general.size_label`, else the params column's count without its space, e.g.
/// "spark-gemma2 2.61B").
/// llama-bench calls `llama_model_desc`, which llama-cpp-2 does not expose; this reads the
/// same facts through its public metadata API instead of reaching into `LlamaModel`.
pub fn model_desc(model: &LlamaModel) -> String {
    let arch = model
        .meta_val_str(keys::GENERAL_ARCHITECTURE)
        .unwrap_or_else(|_| "unknown".into());
    let size = model
        .meta_val_str(keys::GENERAL_SIZE_LABEL)
        .unwrap_or_else(|_| params_text(model.n_params()).replace(' ', ""));
    format!("{arch} {size}")
}

/// llama-bench's `backends`: the registered ggml backends other than CPU, or "CPU"; as there,
/// the RPC entry (always registered: the build has ggml's RPC backend) counts only once it has
/// servers (devices).
pub fn backends() -> String {
    let mut names = Vec::new();
    // SAFETY: plain getters of ggml's backend registry; the index is below the count and the
    // name is a static NUL-terminated string owned by the registry entry.
    unsafe {
        for i in 0..sys::ggml_backend_reg_count() {
            let reg = sys::ggml_backend_reg_get(i);
            if reg.is_null() {
                continue;
            }
            let name = sys::ggml_backend_reg_name(reg);
            if name.is_null() {
                continue;
            }
            let name = CStr::from_ptr(name).to_string_lossy().into_owned();
            let unused_rpc = name.starts_with("RPC") && sys::ggml_backend_reg_dev_count(reg) == 0;
            if name != "CPU" && !unused_rpc {
                names.push(name);
            }
        }
    }
    if names.is_empty() {
        "CPU".into()
    } else {
        names.join(",")
    }
}

/// Runs tests on one loaded model, one repetition each.
pub struct Measurer<'a> {
    session: &'a Session,
    warmup: bool,
    /// The sequence state after the last depth fill, restored for the next test at the same
    /// depth instead of processing the depth again (llama-bench's ctx_state).
    depth_state: Option<(u32, SeqState)>,
}

impl<'a> Measurer<'a> {
    /// A measurer for `session` (its `-b`, threads and cache type), with or without warm-ups.
    pub fn new(session: &'a Session, warmup: bool) -> Self {
        Self {
            session,
            warmup,
            depth_state: None,
        }
    }

    /// One repetition of `test`, as llama-bench runs it; returns the timed nanoseconds.
    pub fn run(&mut self, test: TestSpec) -> Result<u64> {
        let session = self.session;
        // llama-bench's context: n_ctx, n_batch, n_ubatch and swa_full = false.
        let mut ctx = session.new_context(ContextShape {
            n_ctx: test.n_ctx(),
            n_batch: session.args.runtime.batch,
            n_ubatch: test.n_ubatch,
            swa_full: Some(false),
        })?;
        let n_batch = ctx.n_batch().max(1) as usize;
        let (d, p, n) = (
            test.n_depth as usize,
            test.n_prompt as usize,
            test.n_gen as usize,
        );
        let tokens = bench_tokens(d + p + n.max(1), session.model.n_vocab());
        let mut batch = LlamaBatch::new(n_batch, 1);

        if self.warmup {
            if p > 0 {
                process_prompt(&mut ctx, &mut batch, &tokens[d..d + p], 0)?;
            }
            if n > 0 {
                generate(&mut ctx, &mut batch, &tokens[d + p..d + p + 1], p)?;
            }
        }

        ctx.clear_kv_cache();
        if d > 0 {
            let restored = match self.depth_state.as_ref() {
                Some((depth, state)) if *depth == test.n_depth => {
                    ctx.state_seq_set(state, 0).is_ok()
                }
                _ => false,
            };
            if !restored {
                ctx.clear_kv_cache();
                process_prompt(&mut ctx, &mut batch, &tokens[..d], 0)?;
                self.depth_state = ctx
                    .state_seq_get(0, LlamaStateSeqFlags::empty())
                    .ok()
                    .map(|s| (test.n_depth, s));
            }
        }

        let t0 = Instant::now();
        if p > 0 {
            process_prompt(&mut ctx, &mut batch, &tokens[d..d + p], d)?;
        }
        if n > 0 {
            generate(&mut ctx, &mut batch, &tokens[d + p..d + p + n], d + p)?;
        }
        Ok(u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }
}

/// llama-bench's test_prompt: `tokens` from position `pos0` in decode calls of at most the
/// context's n_batch tokens (llama.cpp splits each into n_ubatch pieces), logits of the last
/// token of each call.
fn process_prompt(
    ctx: &mut LlamaContext<'_>,
    batch: &mut LlamaBatch,
    tokens: &[i32],
    pos0: usize,
) -> Result<()> {
    let n_batch = ctx.n_batch().max(1) as usize;
    for (b, part) in tokens.chunks(n_batch).enumerate() {
        batch.clear();
        for (j, t) in part.iter().enumerate() {
            let pos = pos0 + b * n_batch + j;
            batch
                .add(LlamaToken(*t), pos as i32, &[0], j + 1 == part.len())
                .map_err(|e| CliError::new(format!("batch: {e}")))?;
        }
        decode(ctx, batch)?;
    }
    ctx.synchronize();
    Ok(())
}

/// llama-bench's test_gen: one token per decode call from position `pos0`.
fn generate(
    ctx: &mut LlamaContext<'_>,
    batch: &mut LlamaBatch,
    tokens: &[i32],
    pos0: usize,
) -> Result<()> {
    for (i, t) in tokens.iter().enumerate() {
        batch.clear();
        batch
            .add(LlamaToken(*t), (pos0 + i) as i32, &[0], true)
            .map_err(|e| CliError::new(format!("batch: {e}")))?;
        decode(ctx, batch)?;
        ctx.synchronize();
    }
    Ok(())
}

/// Deterministic pseudo-random token ids in `[0, n_vocab)` (the content does not matter for
/// speed, only that it is not one repeated token).
fn bench_tokens(n: usize, n_vocab: i32) -> Vec<i32> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 33) % n_vocab.max(1) as u64) as i32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_tokens_stay_in_the_vocabulary_and_vary() {
        let t = bench_tokens(1000, 17);
        assert!(t.iter().all(|&x| (0..17).contains(&x)));
        assert!(t.iter().collect::<std::collections::HashSet<_>>().len() > 10);
    }
}
