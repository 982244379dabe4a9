"""Batched decode, engine only: aggregate tokens/s of B sequences decoded together, one token
each per forward pass (what the server's continuous batching runs), next to B = 1.

    python scripts/bench_batch.py MODEL.gguf -t 2 --batches 1,2,4,8,16 --json out.json

Every sequence sits in its own KV-cache slot at its own position (slot s first prefilled
with --context + s random tokens); each measurement decodes --steps tokens from there
(rewriting the same cells each time, so the context stays the same). Batch sizes alternate
within each of --rounds rounds, so machine noise hits them alike; reported are median step
times and tokens/s, and each B's ratio to B = 1 from the same rounds: the ratio of the
medians, and the median of the rounds' own ratios (paired), which the machine's noise moves
less.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from edgeinfer.api import Model


def prefill(model: Model, n_seq: int, n_tokens: int, rng) -> np.ndarray:
    """Slot s gets n_tokens + s random tokens (sequences end at different positions);
    returns each slot's next position."""
    tf = model.transformer
    no_logits = np.zeros((0, model.config.n_vocab), np.float32)
    for slot in range(n_seq):
        n = n_tokens + slot
        ids = rng.integers(0, model.config.n_vocab, n).astype(np.int32)
        pos = np.arange(n, dtype=np.int32)
        tf.forward(ids, pos, np.full(n, slot, np.int32), pos[:0], no_logits)
    return n_tokens + np.arange(n_seq)


def decode_steps(model: Model, n_seq: int, start: np.ndarray, steps: int) -> float:
    """Median seconds per forward of n_seq single tokens, continuing each slot's sequence."""
    tf = model.transformer
    tokens = np.ones(n_seq, np.int32)
    slots = np.arange(n_seq, dtype=np.int32)
    rows = np.arange(n_seq, dtype=np.int32)
    logits = np.zeros((n_seq, model.config.n_vocab), np.float32)
    times = []
    for step in range(steps):
        positions = (start[:n_seq] + step).astype(np.int32)
        t0 = time.perf_counter()
        tf.forward(tokens, positions, slots, rows, logits)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", type=Path)
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--batches", default="1,8", help="batch sizes, e.g. 1,2,4,8,16")
    p.add_argument("--context", type=int, default=128, help="cached tokens per sequence")
    p.add_argument("--steps", type=int, default=16, help="decode steps per measurement")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    n_ctx = args.context + max(batches) + args.steps
    model = Model.load(args.model, n_ctx=n_ctx, threads=args.threads, n_slots=max(batches))
    start = prefill(model, max(batches), args.context, np.random.default_rng(0))
    step_s: dict[int, list[float]] = {b: [] for b in batches}
    for _ in range(args.rounds):
        for b in batches:  # alternate: noise hits every batch size alike
            step_s[b].append(decode_steps(model, b, start, args.steps))
    base = statistics.median(step_s[batches[0]]) if batches[0] == 1 else None
    rows = []
    for b in batches:
        med = statistics.median(step_s[b])
        row = {"batch": b, "step_ms": round(1e3 * med, 2), "tokens_per_s": round(b / med, 1),
               "tokens_per_s_rounds": [round(b / s, 1) for s in step_s[b]]}
        if base is not None:
            # paired: each round's B against its own B = 1, measured a second apart, so a
            # neighbour's burst of memory traffic that slows a whole round cancels out
            paired = [b * s1 / s for s1, s in zip(step_s[1], step_s[b])]
            row["ratio_to_b1"] = round(b / med / (1 / base), 2)
            row["ratio_to_b1_rounds"] = [round(r, 2) for r in paired]
            row["ratio_to_b1_paired"] = round(statistics.median(paired), 2)
        rows.append(row)
        print(f"B={b:3d}  step {row['step_ms']:7.2f} ms  {row['tokens_per_s']:7.1f} tokens/s"
              + (f"  {row['ratio_to_b1']:.2f}x B=1 (paired rounds: median "
                 f"{row['ratio_to_b1_paired']:.2f}x, {min(paired):.2f}-{max(paired):.2f})"
                 if base is not None and b != 1 else ""))
    report = {"model": str(args.model), "threads": args.threads, "context": args.context,
              "steps": args.steps, "rounds": args.rounds, "results": rows}
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
