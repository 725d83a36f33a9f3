#!/usr/bin/env python3
"""How often each FFN neuron of a trained Spark model fires, and what that means for a model larger
than memory: the share of a step's K2/V row reads that a memory holding part of each layer's rows
would serve (docs/PERF.md, "Models larger than memory").

    .venv/bin/python tools/firing-profile.py [--model models/spark-shakespeare.npz]
        [--text models/heldout.txt] [--tokens 1024] [--ctx 256] [--hold 0.25,0.5,0.75]

It runs the float64 reference (tests/reference/spark_ref.py, docs/SPEC.md section 4) over the
first --tokens tokens of --text (the checkpoint's own SentencePiece tokenizer), in windows of
--ctx tokens as llama-perplexity cuts them, and records each token's active neurons (a_j != 0)
per layer. Per layer it prints:
- how concentrated firing is: the share of all firings that the hottest 10 %, 25 % and 50 % of
  the neurons account for (uniform firing: 10, 25, 50), and how many neurons never fired;
- for each held share h of the rows (--hold): the share of row reads that find their row in
  memory (the hit rate), for three memories of h * F rows each:
  - `lru`: the rows used longest ago leave first, every row read enters (what the kernel's page
    cache approximates; it starts empty);
  - `pinned`: the h * F neurons that fired most in the first half of the tokens stay, nothing
    else does (a calibration pass written into the file would give this); measured on the
    second half, so it is not scored on the tokens that chose it;
  - `uniform`: h, what any memory of h * F rows serves when every neuron fires equally often
    (the synthetic random-weight models of tools/bench-memory.sh).
A hit rate of x at hold h means (1 - x) * k_f row reads per token and layer come from storage.

A second table says how well a layer could request the next layer's rows while it computes (a
model larger than memory waits for them otherwise: they are known only after that layer's own
predictor): for each pair of layers L -> L+1 and each --ahead factor c, layer L's FFN input
through layer L+1's predictor K1 with the statistical top-k threshold of c * k_f instead of k_f
chooses a set of neurons ahead. Per row: the share of layer L+1's active neurons that set holds
(recall), its size per token in units of k_f, and, for an LRU memory of --ahead-hold of the rows
(as above, left as it would be without requests ahead: a first estimate), the share of the
storage reads layer L+1 waits for that the set would have requested ahead (hidden), and the rows
it would read for nothing per token (chosen, not active, not in memory), in units of k_f.
"""

from __future__ import annotations

import argparse
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "reference"))

import spark_checkpoint  # noqa: E402
import spark_ref  # noqa: E402


def tokenize(arrays: dict, text: str) -> tuple[int, list[int]]:
    """(BOS id, the text's ids) by the checkpoint's own tokenizer (its `tokenizer` entry: a
    SentencePiece model)."""
    import sentencepiece

    if "tokenizer" not in arrays:
        raise SystemExit("firing-profile: the checkpoint has no tokenizer entry")
    sp = sentencepiece.SentencePieceProcessor()
    sp.LoadFromSerializedProto(bytes(arrays["tokenizer"]))
    return sp.bos_id(), sp.EncodeAsIds(text)


def record_active_sets(cfg: dict, weights: dict, windows: list[list[int]],
                       inputs: list[list] | None = None,
                       predictors: dict | None = None) -> list[list]:
    """[layer][token] -> sorted active neuron ids over `windows` (each evaluated from position
    0): the reference's spark_ffn_dense, wrapped to keep the neurons it activates (the same
    formula, once more). With `inputs` ([] per layer), each call's FFN input h is appended to
    its layer's list too; with `predictors` ({}), each Spark layer's K1 [r_f, F] is kept under
    its layer number."""
    n_layers = cfg["n_layers"]
    active: list[list] = [[] for _ in range(n_layers)]
    # the reference calls the FFN layer by layer, each layer token by token: call c of a window
    # of T tokens is layer c // T's
    calls = {"n": 0, "tokens": 1}
    original = spark_ref.spark_ffn_dense

    def recording(h, k1, k2, v, ffn_k):
        layer = calls["n"] // calls["tokens"]
        calls["n"] += 1
        s = h[: k1.shape[0]] @ k1
        a = spark_ref.gelu_tanh(spark_ref.soft(s, ffn_k))
        active[layer].append(np.flatnonzero(a))
        if inputs is not None:
            inputs[layer].append(np.array(h, dtype=np.float64))
        if predictors is not None:
            predictors[layer] = k1
        return original(h, k1, k2, v, ffn_k)

    spark_ref.spark_ffn_dense = recording
    try:
        for i, window in enumerate(windows):
            calls.update(n=0, tokens=len(window))
            spark_ref.forward(cfg, weights, window)
            if calls["n"] != n_layers * len(window):
                raise SystemExit(f"firing-profile: the reference ran the FFN {calls['n']} times "
                                 f"for {len(window)} tokens and {n_layers} layers")
            print(f"firing-profile: window {i + 1} / {len(windows)}", file=sys.stderr)
    finally:
        spark_ref.spark_ffn_dense = original
    return active


def lru_states(sets: list, capacity: int):
    """For each token's set in turn: (the rows an LRU memory of `capacity` rows holds before
    that token's reads, as a frozenset, that token's hits)."""
    held: OrderedDict = OrderedDict()
    for s in sets:
        before = frozenset(held)
        hits = 0
        for j in s:
            j = int(j)
            if j in held:
                hits += 1
                held.move_to_end(j)
            else:
                held[j] = None
                if len(held) > capacity:
                    held.popitem(last=False)
        yield before, hits


def lru_hit_rate(sets: list, capacity: int) -> float:
    hits = sum(h for _, h in lru_states(sets, capacity))
    return hits / max(sum(len(s) for s in sets), 1)


def pinned_hit_rate(sets: list, n_ff: int, capacity: int) -> float:
    half = len(sets) // 2
    counts = np.zeros(n_ff, dtype=np.int64)
    for s in sets[:half]:
        counts[s] += 1
    pinned = np.zeros(n_ff, dtype=bool)
    pinned[np.argsort(-counts, kind="stable")[:capacity]] = True
    test = sets[half:]
    reads = sum(len(s) for s in test)
    return sum(int(pinned[s].sum()) for s in test) / max(reads, 1)


def chosen_ahead(inputs: list, k1_next: np.ndarray, want: int) -> list[np.ndarray]:
    """Per token: the neurons of the next layer chosen ahead (a boolean mask over F): its FFN
    input of one layer (`inputs`) through the next layer's predictor `k1_next` [r_f, F] above
    the statistical top-k threshold of `want` neurons (spark_ref.stat_topk_threshold, as the
    FFN's own)."""
    r_f = k1_next.shape[0]
    masks = []
    for h in inputs:
        s = np.asarray(h, dtype=np.float64)[:r_f] @ k1_next
        masks.append(s > spark_ref.stat_topk_threshold(s, want))
    return masks


def ahead_scores(masks: list[np.ndarray], active_next: list, memory: list) -> dict[str, float]:
    """What sets chosen ahead (`masks`) give against the next layer's active neurons
    (`active_next`) and what a memory holds before each token (`memory`: sets of rows):
    recall (the share of all firings chosen ahead), chosen (mean set size), hidden (the share
    of the firings not in memory, the storage reads, that were chosen ahead), wasted (mean
    count of chosen rows neither active nor in memory)."""
    chosen = fired = held = missed = hidden = wasted = 0
    for mask, act, mem in zip(masks, active_next, memory):
        act = np.asarray(act, dtype=np.int64)
        chosen += int(mask.sum())
        fired += len(act)
        held += int(mask[act].sum())
        for j in act:
            if int(j) not in mem:
                missed += 1
                hidden += int(mask[j])
        idle = np.ones(len(mask), dtype=bool)
        idle[act] = False
        wasted += sum(1 for j in np.flatnonzero(mask & idle) if int(j) not in mem)
    n = max(len(masks), 1)
    return {"recall": held / max(fired, 1), "chosen": chosen / n,
            "hidden": hidden / max(missed, 1), "wasted": wasted / n}


def next_layer_table(cfg: dict, predictors: dict, inputs: list, active: list,
                     factors: list[float], hold: float) -> list[str]:
    """The second table's lines (see the module doc); `predictors`: each Spark layer's K1 (a
    pair whose next layer has none, a dense FFN, is left out)."""
    n_ff, k = cfg["d_ff"], cfg["ffn_k"]
    lines = [f"| layer L -> L+1 | ahead | recall | chosen | storage reads hidden "
             f"(hold {100 * hold:.0f} %) | rows read for nothing |",
             "|---|---|---|---|---|---|"]
    for layer in range(cfg["n_layers"] - 1):
        k1_next = predictors.get(layer + 1)
        if k1_next is None:
            continue
        memory = [m for m, _ in lru_states(active[layer + 1], int(round(hold * n_ff)))]
        for c in factors:
            want = min(n_ff - 1, max(1, int(round(c * k))))
            got = ahead_scores(chosen_ahead(inputs[layer], k1_next, want), active[layer + 1],
                               memory)
            lines.append(f"| {layer} -> {layer + 1} | {c:g} k_f | {100 * got['recall']:.0f} % | "
                         f"{got['chosen'] / k:.2f} k_f | {100 * got['hidden']:.0f} % | "
                         f"{got['wasted'] / k:.2f} k_f |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "spark-shakespeare.npz"))
    ap.add_argument("--text", default=str(ROOT / "models" / "heldout.txt"))
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--hold", default="0.25,0.5,0.75")
    ap.add_argument("--ahead", default="1,1.5,2,3",
                    help="thresholds of the next layer's rows chosen ahead, in units of k_f")
    ap.add_argument("--ahead-hold", type=float, default=0.5,
                    help="the share of the rows in memory for the second table's storage reads")
    args = ap.parse_args(argv)
    try:
        holds = [float(h) for h in args.hold.split(",")]
        factors = [float(c) for c in args.ahead.split(",")]
    except ValueError as e:
        ap.error(f"--hold and --ahead take numbers separated by commas ({e})")
    if args.tokens < 2 or args.ctx < 2 or not all(0 < h < 1 for h in holds):
        ap.error("--tokens >= 2, --ctx >= 2, each --hold in (0, 1)")
    if not all(c > 0 for c in factors) or not 0 < args.ahead_hold < 1:
        ap.error("each --ahead more than 0, --ahead-hold in (0, 1)")

    cfg, weights = spark_checkpoint.load_checkpoint(args.model)
    bos, ids = tokenize(weights, Path(args.text).read_text())
    ids = ids[: args.tokens]
    # as llama-perplexity: each window starts with BOS
    windows = [[bos] + ids[i:i + args.ctx - 1] for i in range(0, len(ids), args.ctx - 1)]
    tokens = sum(len(w) for w in windows)
    inputs: list[list] = [[] for _ in range(cfg["n_layers"])]
    predictors: dict = {}
    active = record_active_sets(cfg, weights, windows, inputs, predictors)
    n_ff, k = cfg["d_ff"], cfg["ffn_k"]

    print(f"{Path(args.model).name}: {cfg['n_layers']} layers, F = {n_ff}, k_f = {k} "
          f"({100 * k / n_ff:.1f} %); {tokens} tokens of {Path(args.text).name}, "
          f"windows of {args.ctx}")
    print()
    head = "| layer | active per token | hottest 10 % / 25 % / 50 % fire | never fired |"
    rule = "|---|---|---|---|"
    for h in holds:
        head += f" hold {100 * h:.0f} %: lru / pinned / uniform |"
        rule += "---|"
    print(head)
    print(rule)
    for layer, sets in enumerate(active):
        counts = np.zeros(n_ff, dtype=np.int64)
        for s in sets:
            counts[s] += 1
        ranked = np.sort(counts)[::-1]
        total = max(int(ranked.sum()), 1)
        shares = [100 * ranked[: int(round(f * n_ff))].sum() / total for f in (0.1, 0.25, 0.5)]
        row = (f"| {layer} | {total / len(sets):.1f} | "
               f"{shares[0]:.0f} / {shares[1]:.0f} / {shares[2]:.0f} % | "
               f"{int((counts == 0).sum())} |")
        for h in holds:
            cap = int(round(h * n_ff))
            row += (f" {100 * lru_hit_rate(sets, cap):.0f} / "
                    f"{100 * pinned_hit_rate(sets, n_ff, cap):.0f} / {100 * h:.0f} % |")
        print(row)
    print()
    print("Next layer's rows chosen ahead: layer L's FFN input through layer L+1's K1, "
          "thresholded for c * k_f neurons")
    print()
    for line in next_layer_table(cfg, predictors, inputs, active, factors, args.ahead_hold):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
