"""Held-out perplexity with llama-perplexity's method, plus the model's measured sparsity.

Method (as llama.cpp's `llama-perplexity -c n_ctx`): tokenize the whole text once with BOS
prepended; n_chunk = n_tokens // n_ctx; chunk i is tokens[i*n_ctx : (i+1)*n_ctx] with its first
token replaced by BOS, evaluated fresh at positions 0..n_ctx-1; positions j in [n_ctx/2, n_ctx - 1)
score -log p(tokens[i*n_ctx + j + 1] | logits at j); PPL = exp(mean over all scored positions).

Sparsity, measured over every position of every evaluated chunk:
- ffn_keep_rate[l]: mean over tokens of #{j : a_j != 0} / F;
- attn_attended_beyond_k[l]: mean |S| over (query, head) pairs whose window has |C| > attn_k.
"""

from __future__ import annotations

import math

import numpy as np
import torch


def tokenize_with_bos(sp, text: str, bos_id: int) -> list[int]:
    """SentencePiece ids of the whole text with BOS prepended (llama-perplexity's add_bos)."""
    return [bos_id] + sp.encode(text)


@torch.no_grad()
def llama_perplexity(model, tokens: list[int], n_ctx: int, max_chunks: int | None = None,
                     batch: int = 8, device: str = "cpu") -> dict:
    """Perplexity and sparsity statistics; see the module docstring."""
    cfg = model.cfg
    n_chunk = len(tokens) // n_ctx
    if n_chunk < 1:
        raise ValueError(f"text has {len(tokens)} tokens, fewer than n_ctx = {n_ctx}")
    if max_chunks is not None:
        n_chunk = min(n_chunk, max_chunks)
    first = n_ctx // 2
    was_training = model.training
    model.eval()
    all_tokens = torch.tensor(tokens, dtype=torch.long)
    nll_sum = 0.0
    n_scored = 0
    stats: dict = {}
    for start in range(0, n_chunk, batch):
        rows = range(start, min(start + batch, n_chunk))
        chunk = torch.stack([all_tokens[i * n_ctx:(i + 1) * n_ctx] for i in rows])
        targets = torch.stack([all_tokens[i * n_ctx + first + 1:(i + 1) * n_ctx] for i in rows])
        inputs = chunk.clone()
        inputs[:, 0] = cfg.bos_id
        logits = model(inputs.to(device), stats)
        logp = torch.log_softmax(logits[:, first:n_ctx - 1].to(torch.float64), dim=-1)
        picked = logp.gather(-1, targets.to(device)[..., None])[..., 0]
        nll_sum += float(-picked.sum())
        n_scored += picked.numel()
    model.train(was_training)
    nll = nll_sum / n_scored
    return {
        "ppl": math.exp(nll),
        "mean_nll": nll,
        "n_ctx": n_ctx,
        "n_chunks": n_chunk,
        "n_tokens_total": len(tokens),
        "n_scored": n_scored,
        "ffn_keep_rate": [a / (c * cfg.d_ff) for a, c in
                          zip(stats["ffn_active_sum"], stats["ffn_token_count"])],
        "attn_attended_beyond_k": [s / c if c else float("nan") for s, c in
                                   zip(stats["attn_attended_sum"], stats["attn_attended_count"])],
    }


@torch.no_grad()
def generate(model, sp, prompt: str, n_new: int, temperature: float = 0.0, top_k: int = 0,
             seed: int = 0, device: str = "cpu") -> str:
    """Continue the prompt (BOS prepended); greedy when temperature is 0. The context is the last
    max_position_embeddings tokens, recomputed every step (no KV cache: this is for samples)."""
    cfg = model.cfg
    was_training = model.training
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    ids = [cfg.bos_id] + sp.encode(prompt)
    out: list[int] = []
    for _ in range(n_new):
        window = ids[-cfg.max_position_embeddings:]
        if window[0] != cfg.bos_id:
            window = [cfg.bos_id] + window[1:]
        logits = model(torch.tensor([window], device=device))[0, -1].to("cpu", torch.float64)
        if temperature <= 0:
            nxt = int(torch.argmax(logits))
        else:
            logits = logits / temperature
            if top_k > 0:
                cutoff = torch.topk(logits, top_k).values[-1]
                logits = torch.where(logits < cutoff, torch.full_like(logits, -math.inf), logits)
            nxt = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
        if nxt == cfg.eos_id:
            break
        ids.append(nxt)
        out.append(nxt)
    model.train(was_training)
    return prompt + sp.decode(out)


def summarize(values) -> list[float]:
    """Rounded list for JSON output."""
    return [round(float(v), 6) for v in np.asarray(values, dtype=np.float64)]
