"""Padding in the learner's micro-batches, before and after packing, on MemAgent-shaped rows.

The turns of a rollout batch at the 7B configs' budgets (benchmarks/memagent_rows.py: chunk
5000, memory 1024, 128 prompts x 16 trajectories) go through the learner's planner
(rl/batching.py `plan_sequences`) at configs/train/qwen2.5-7b_gpu8.yaml's micro-batch budget
(33,792 tokens) and data-parallel width (data 2 x fsdp 2), with its bucket lengths and with
the default powers of two (`bucket_lengths: null`), one row per sequence (before) and packed
(after). For the log-prob pass (all rows at once) and the update (the rows split into the
config's 16 mini-batches, each planned on its own, as `Learner.update` does) it prints:
- padded: the share of token slots that hold no row's token (the limit: 0);
- slots / tokens: the forward's work per real token (1 / (1 - padded));
- head / response: the LM head's positions per response token (rl/batching.py
  `response_positions`; 1.0 the limit), so packing does not move that cost;
- micro-batches, and the planner's host time.

    python benchmarks/packing.py [--documents 2048] [--mini-batches 16]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from memagent_rows import describe, turn_lengths  # beside this script

from memagent_jax.rl.batching import (
    default_bucket_lengths,
    padded_fraction,
    plan_sequences,
    response_positions,
)

CONFIG_BUCKETS = (1024, 2048, 4096, 6144, 8448)
MICRO_BATCH_TOKENS = 33792
ROW_MULTIPLE = 4  # mesh data 2 x fsdp 2


def measure(lengths, prompts, groups, buckets, pack):
    """(padded fraction, head positions per response token, micro-batches, seconds) of
    planning each group of row indices."""
    start = time.perf_counter()
    plans = [p for group in groups
             for p in plan_sequences(lengths, group, buckets, pack=pack,
                                     tokens=MICRO_BATCH_TOKENS, row_multiple=ROW_MULTIPLE)]
    seconds = time.perf_counter() - start
    head = sum(response_positions(p, prompts, lengths).size for p in plans)
    return padded_fraction(plans), head / int((lengths - prompts).sum()), len(plans), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=2048,
                        help="trajectories per step (128 prompts x n 16)")
    parser.add_argument("--mini-batches", type=int, default=16)
    args = parser.parse_args()

    turns = turn_lengths(args.documents)
    lengths, prompts = turns.total, turns.prompt
    print(f"rows: {len(lengths)} turns of {args.documents} documents, {int(lengths.sum()):,} "
          f"tokens ({int((lengths - prompts).sum()):,} response); lengths "
          f"{int(lengths.min())}-{int(lengths.max())}, mean {lengths.mean():.0f}")
    print(f"assumptions: {describe()}")
    print(f"micro-batches: {MICRO_BATCH_TOKENS} tokens, sequences in multiples of "
          f"{ROW_MULTIPLE} (configs/train/qwen2.5-7b_gpu8.yaml)\n")
    rng = np.random.default_rng(0)
    passes = {"log-prob pass": [np.arange(len(lengths))],
              "update": np.array_split(rng.permutation(len(lengths)), args.mini_batches)}
    print(f"{'buckets':<40}{'pass':<15}{'layout':<9}{'padded':>8}{'slots/tokens':>14}"
          f"{'head/response':>15}{'micro-batches':>15}{'plan s':>8}")
    for name, buckets in [("config " + str(list(CONFIG_BUCKETS)), CONFIG_BUCKETS),
                          ("powers of two (null)", default_bucket_lengths(int(lengths.max())))]:
        for label, groups in passes.items():
            for pack in (False, True):
                padded, head, count, seconds = measure(lengths, prompts, groups, buckets, pack)
                print(f"{name:<40}{label:<15}{'packed' if pack else 'rows':<9}{padded:8.1%}"
                      f"{1 / (1 - padded):14.3f}{head:15.3f}{count:15d}{seconds:8.2f}")


if __name__ == "__main__":
    main()
