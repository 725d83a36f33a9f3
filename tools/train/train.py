"""Train the small Spark-Gemma2 on the Shakespeare corpus and export the SPEC section 5 checkpoint.

Run prepare_data.py first. Then, e.g. on CPU:

    ../train-venv/bin/python tools/train/train.py --threads 2 --steps 1500 --time-limit-min 40

Every --ckpt-every steps (and at the end, or when the time limit is hit) it saves the training
state to <workdir>/state.pt, writes <out>.npz and evaluates the held-out text into <out>.eval.json.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from export import evaluate_for_export, write_checkpoint, write_eval  # noqa: E402
from spark_torch import SparkConfig, SparkModel  # noqa: E402


def load_train_tokens(workdir: Path, sp) -> np.ndarray:
    """Token ids of train.txt (no BOS), cached next to it as train_tokens.npy."""
    cache = workdir / "train_tokens.npy"
    model_bytes = (workdir / "tokenizer.model").read_bytes()
    stamp = workdir / "train_tokens.stamp"
    key = str(hash(model_bytes)) + str((workdir / "train.txt").stat().st_size)
    if cache.exists() and stamp.exists() and stamp.read_text() == key:
        return np.load(cache)
    text = (workdir / "train.txt").read_text(encoding="utf-8")
    ids = np.array(sp.encode(text), dtype=np.int32)
    np.save(cache, ids)
    stamp.write_text(key)
    return ids


def lr_at(step: int, progress: float, peak: float, warmup: int, final_frac: float) -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to final_frac * peak as progress
    (the larger of the step and the wall-time fraction of the budget) goes to 1."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, max(0.0, progress))
    return peak * (final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_batch(tokens: torch.Tensor, batch: int, ctx: int, bos: int, gen: torch.Generator):
    """Random windows: input [BOS, t_s .. t_{s+ctx-2}], target [t_s .. t_{s+ctx-1}] (the
    llama-perplexity chunk layout: position 0 is BOS, position j predicts the next text token)."""
    starts = torch.randint(0, len(tokens) - ctx, (batch,), generator=gen)
    idx = starts[:, None] + torch.arange(ctx)[None, :]
    target = tokens[idx]
    inputs = torch.cat([torch.full((batch, 1), bos, dtype=torch.long), target[:, :-1]], dim=1)
    return inputs, target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("tools/train/work"))
    parser.add_argument("--out", type=Path, default=Path("models/spark-shakespeare.npz"))
    parser.add_argument("--heldout", type=Path, default=Path("models/heldout.txt"))
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--final-lr-frac", type=float, default=0.1)
    parser.add_argument("--weight-decay", type=float, default=0.1)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--time-limit-min", type=float, default=40.0,
                        help="wall-time budget of this invocation; the cosine schedule reaches its "
                             "end at --steps or at this limit, whichever comes first")
    parser.add_argument("--ckpt-every", type=int, default=250)
    parser.add_argument("--ckpt-every-min", type=float, default=0.0,
                        help="also checkpoint when this many minutes passed since the last one")
    parser.add_argument("--init-from", type=Path, default=None,
                        help="start from the weights of a state.pt (fresh optimizer and schedule)")
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--resume", action="store_true", help="continue from <workdir>/state.pt")
    parser.add_argument("--no-export", action="store_true", help="smoke test: skip npz/eval")
    # Model shape (SPEC section 6 names).
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--n-layers", type=int, default=6)
    parser.add_argument("--n-heads", type=int, default=4)
    parser.add_argument("--n-kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--d-ff", type=int, default=1024)
    parser.add_argument("--ffn-k", type=int, default=82)
    parser.add_argument("--ffn-r", type=int, default=128)
    parser.add_argument("--attn-k", type=int, default=32)
    parser.add_argument("--attn-r", type=int, default=32)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--sliding-window", type=int, default=128)
    args = parser.parse_args()

    import sentencepiece as spm

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("train: error: --device cuda but torch.cuda.is_available() is False")
    tok_path = args.workdir / "tokenizer.model"
    if not tok_path.exists():
        sys.exit(f"train: error: {tok_path} missing; run tools/train/prepare_data.py first")
    sp = spm.SentencePieceProcessor(model_file=str(tok_path))
    cfg = SparkConfig(
        vocab_size=sp.get_piece_size(), d_model=args.d_model, n_layers=args.n_layers,
        n_heads=args.n_heads, n_kv_heads=args.n_kv_heads, head_dim=args.head_dim,
        d_ff=args.d_ff, ffn_k=args.ffn_k, ffn_r=args.ffn_r, attn_k=args.attn_k,
        attn_r=args.attn_r, query_pre_attn_scalar=args.head_dim,
        sliding_window=args.sliding_window, max_position_embeddings=args.context,
    )
    model = SparkModel(cfg).to(args.device)
    n_params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    tokens = torch.from_numpy(load_train_tokens(args.workdir, sp).astype(np.int64))
    gen = torch.Generator().manual_seed(args.seed)
    state_path = args.workdir / "state.pt"
    step = 0
    elapsed_before = 0.0
    prior_steps, prior_seconds, prior_tokens = 0, 0.0, 0
    log = []
    if args.resume:
        state = torch.load(state_path, map_location="cpu", weights_only=False)
        if state["config"] != cfg.to_json_dict():
            sys.exit("train: error: --resume with a different model config")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        gen.set_state(state["generator"])
        step = state["step"]
        elapsed_before = state["train_info"]["train_seconds"]
        prior_steps = state["train_info"].get("prior_steps", 0)
        prior_seconds = state["train_info"].get("prior_seconds", 0.0)
        prior_tokens = state["train_info"].get("prior_tokens", 0)
        log = state.get("log", [])
    elif args.init_from is not None:
        state = torch.load(args.init_from, map_location="cpu", weights_only=False)
        if state["config"] != cfg.to_json_dict():
            sys.exit("train: error: --init-from with a different model config")
        model.load_state_dict(state["model"])
        init_info = state["train_info"]
        prior_steps = init_info["train_steps"] + init_info.get("prior_steps", 0)
        prior_seconds = init_info["train_seconds"] + init_info.get("prior_seconds", 0.0)
        prior_tokens = init_info["train_tokens_seen"] + init_info.get("prior_tokens", 0)
        log = state.get("log", [])
    print(json.dumps({"params": n_params, "train_tokens": len(tokens), "config": cfg.to_json_dict()}),
          flush=True)

    heldout_text = args.heldout.read_text(encoding="utf-8")
    tokens_per_step = args.batch * args.context
    started = time.time()

    def train_info() -> dict:
        return {
            "train_steps": step,
            "train_tokens_seen": step * tokens_per_step,
            "train_seconds": round(elapsed_before + time.time() - started, 1),
            "params": n_params,
            "batch": args.batch,
            "peak_lr": args.lr,
            "planned_steps": args.steps,
            "device": args.device,
            "threads": args.threads,
            "seed": args.seed,
            "prior_steps": prior_steps,
            "prior_seconds": prior_seconds,
            "prior_tokens": prior_tokens,
            "total_tokens_seen": prior_tokens + step * tokens_per_step,
            "total_train_seconds": round(prior_seconds + elapsed_before + time.time() - started, 1),
        }

    def checkpoint() -> None:
        info = train_info()
        torch.save({"config": cfg.to_json_dict(), "model": model.state_dict(),
                    "optimizer": opt.state_dict(), "generator": gen.get_state(), "step": step,
                    "train_info": info, "log": log}, state_path)
        if args.no_export:
            return
        write_checkpoint(model, tok_path.read_bytes(), args.out)
        result = evaluate_for_export(model, sp, heldout_text, "tokenizer.model embedded in the "
                                     "checkpoint (SentencePiece BPE, 4096 pieces)",
                                     {**info, "train_loss_last": log[-1]["loss"] if log else None},
                                     device=args.device)
        write_eval(result, args.out.with_suffix(".eval.json"))
        print(json.dumps({"step": step, "heldout_ppl": round(result["full"]["ppl"], 3),
                          "slice_ppl": round(result["slice_first_8_chunks"]["ppl"], 3),
                          "ffn_keep": result["full"]["ffn_keep_rate"],
                          "attn_attended": result["full"]["attn_attended_beyond_k"]}), flush=True)

    model.train()
    window_loss = 0.0
    window_n = 0
    t_window = time.time()
    budget_s = args.time_limit_min * 60
    last_ckpt = time.time()
    while step < args.steps:
        elapsed = time.time() - started
        if elapsed > budget_s:
            print(f"time limit reached at step {step}", flush=True)
            break
        progress = max((step - args.warmup) / max(1, args.steps - args.warmup),
                       (elapsed_before + elapsed) / (elapsed_before + budget_s))
        lr = lr_at(step, progress, args.lr, args.warmup, args.final_lr_frac)
        for group in opt.param_groups:
            group["lr"] = lr
        inputs, target = make_batch(tokens, args.batch, args.context, cfg.bos_id, gen)
        logits = model(inputs.to(args.device))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size),
                                                 target.to(args.device).reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        step += 1
        window_loss += float(loss.detach())
        window_n += 1
        if step % args.log_every == 0:
            dt = time.time() - t_window
            entry = {"step": step, "loss": round(window_loss / window_n, 4), "lr": round(lr, 6),
                     "tok_per_s": round(window_n * tokens_per_step / dt),
                     "elapsed_s": round(elapsed_before + time.time() - started)}
            log.append(entry)
            print(json.dumps(entry), flush=True)
            window_loss, window_n, t_window = 0.0, 0, time.time()
        due_by_time = args.ckpt_every_min > 0 and time.time() - last_ckpt > args.ckpt_every_min * 60
        if (step % args.ckpt_every == 0 or due_by_time) and step < args.steps:
            checkpoint()
            last_ckpt = time.time()
    checkpoint()


if __name__ == "__main__":
    main()
