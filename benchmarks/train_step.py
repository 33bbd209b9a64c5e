"""Learner throughput: training tokens/s and model FLOP utilisation of `Learner.update`.

One rollout batch of `--rows` rows (each `--prompt-len` prompt + `--response-len` response
tokens, random ids, random advantages) goes through `Learner.update`: the old log-probs are
recomputed (a forward pass), then one AdamW update accumulates gradients over micro-batches of
`--micro-batch-rows` rows. The script measures, in one run:
- the machine's matmul rate: a jitted [N, N] @ [N, N] in the compute dtype, 2 N^3 FLOPs, best
  of --repeats; the hardware limit the other figures are compared with;
- ours: the whole update (recompute + train step), and the recompute alone, best of --repeats
  after one untimed warm-up update (compilation); tokens/s counts every token the model runs
  (prompt and response, no padding here: rows are exactly one bucket long);
- model FLOPs (PaLM's MFU convention, benchmarks/flops.py): a train step costs
  6 N + 12 L T H D per token, the recompute forward 2 N + 4 L T H D, with N the parameters
  that multiply (the decoder layers' on every token, the LM head's on response tokens only,
  the only ones whose log-probabilities the loss needs; the embedding gather is not a matmul)
  and T the row length (the convention counts the whole T x T attention, though the blocked
  causal path skips most of the upper half; what --remat recomputes is not counted either);
  utilisation = model FLOP/s / measured matmul FLOP/s;
- peer (unless --no-torch): the same update written plainly in PyTorch on `transformers`'
  Qwen2ForCausalLM (Qwen3ForCausalLM for a Qwen3 preset) with the same shapes and random
  weights: a no-grad forward for the old log-probs, then per micro-batch forward + token
  log-probs + PPO-clip loss + backward, one torch.optim.AdamW step; on the GPU when torch
  sees one, float32 parameters (as ours: the learner's master weights) and the forward under
  autocast to --dtype (as ours computes).

    python benchmarks/train_step.py [--preset qwen2.5-0.5b] [--layers N] [--dtype float32]
        [--rows 8] [--prompt-len 192] [--response-len 64] [--micro-batch-rows 4]
        [--repeats 2] [--matmul-size 4096] [--attention xla]
        [--remat none|matmuls|full] [--no-torch] [--full-logits] [--memagent DOCS [--scale 16]]

--memagent DOCS draws the rows instead from the turns of DOCS MemAgent documents at the 7B
configs' budgets (benchmarks/memagent_rows.py), every length divided by --scale, and plans
them as configs/train/qwen2.5-7b_gpu8.yaml does (its bucket lengths and micro-batch tokens,
divided by --scale): our update is timed with one row per sequence (`learner.pack: false`,
before) and packed (after); the peer runs the same micro-batches of rows (longest first,
each cut to its longest row, at the same token budget). tokens/s counts real tokens only.

--full-logits runs the LM head on as many positions as a row has, as the learner did before it
took the response window only (the before/after of that change, one run each).

--layers keeps the preset's widths (and its 152K-row vocabulary) at fewer layers, so a CPU can
run it; the per-token FLOP model accounts for whatever depth is run.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import flops as flop_model  # benchmarks/flops.py, beside this script
import jax
import jax.numpy as jnp
import numpy as np
from memagent_rows import describe, turn_lengths  # beside this script

from memagent_jax.models.loading import random_model
from memagent_jax.models.presets import preset_config
from memagent_jax.rl import batching
from memagent_jax.rl.config import LearnerConfig
from memagent_jax.rl.learner import Learner
from memagent_jax.rl.rows import rows_from_trajectories
from memagent_jax.rollout.agent_api import Trajectory, Turn

# configs/train/qwen2.5-7b_gpu8.yaml's learner plan (--memagent divides it by --scale).
GPU8_BUCKETS = (1024, 2048, 4096, 6144, 8448)
GPU8_MICRO_BATCH_TOKENS = 33792


def best_time(fn, repeats: int) -> float:
    """Fastest wall time of `repeats` calls of fn (which must block until its work is done)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_flops(size: int, dtype: str, repeats: int) -> float:
    """FLOP/s of a jitted square matmul (2 size^3 FLOPs) on JAX's default device."""
    key = jax.random.PRNGKey(0)
    a = jax.random.normal(key, (size, size), jnp.float32).astype(dtype)
    b = jax.random.normal(jax.random.fold_in(key, 1), (size, size), jnp.float32).astype(dtype)
    dot = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
    jax.block_until_ready(dot(a, b))
    return 2 * size ** 3 / best_time(lambda: jax.block_until_ready(dot(a, b)), max(repeats, 3))


def synthetic_rows(config, rows: int, prompt_len: int, response_len: int, seed: int = 0):
    """rows single-turn trajectories with random ids, logprobs and advantages."""
    return random_rows(config, [[(prompt_len, response_len)] for _ in range(rows)], seed)


def random_rows(config, trajectories, seed: int = 0):
    """Trajectories of turns with the given (prompt, response) lengths: random ids, logprobs
    and advantages."""
    rng = np.random.default_rng(seed)
    vocab = config.vocab_size
    flat = [Trajectory("", [Turn(
        "final", rng.integers(0, vocab, p).tolist(), rng.integers(0, vocab, n).tolist(),
        (-rng.uniform(0.1, 5.0, n)).tolist(), "length", "") for p, n in turns])
        for turns in trajectories]
    return rows_from_trajectories(flat, rng.standard_normal(len(flat)))


def memagent_rows(config, documents: int, scale: int):
    """The turns of `documents` MemAgent trajectories at the 7B budgets, lengths / scale."""
    turns = turn_lengths(documents)
    trajectories = [[] for _ in range(documents)]
    for p, n, d in zip(turns.prompt, turns.response, turns.document):
        trajectories[d].append((max(1, int(p) // scale), max(1, int(n) // scale)))
    return random_rows(config, trajectories)


def learner_plan(args) -> dict:
    """The LearnerConfig fields that cut the rows into micro-batches."""
    if args.memagent:
        return {"micro_batch_tokens": GPU8_MICRO_BATCH_TOKENS // args.scale,
                "bucket_lengths": tuple(b // args.scale for b in GPU8_BUCKETS)}
    length = args.prompt_len + args.response_len  # every row exactly one bucket long
    return {"micro_batch_tokens": args.micro_batch_rows * length, "bucket_lengths": (length,)}


def bench_ours(config, args, rows, pack: bool = True) -> dict[str, float]:
    if args.full_logits:
        batching.gather = _whole_row_head(batching.gather)
    model = random_model(config, seed=0, dtype=args.dtype,  # stored as config.dtype
                         attention=args.attention)
    learner = Learner(model, LearnerConfig(
        lr=1e-6, warmup_steps=0, kl_coef=0.0, remat=args.remat, pack=pack,
        **learner_plan(args)))
    start = time.perf_counter()
    learner.update(rows)  # compiles the recompute and the train step
    warm_up = time.perf_counter() - start

    def update():
        metrics = learner.update(rows)  # returns host floats: the update has finished
        assert metrics["skipped_updates"] == 0

    full = best_time(update, args.repeats)
    recompute = best_time(lambda: learner.logprobs(rows), args.repeats)
    return {"warm_up": warm_up, "update": full, "recompute": recompute}


def _whole_row_head(gather):
    """The learner's micro-batch with the LM head on every position from 1 (--full-logits)."""
    def whole(plan, rows, names, arrays):
        batch = gather(plan, rows, names, arrays)
        batch["positions"] = np.broadcast_to(np.arange(1, plan.length + 1, dtype=np.int32),
                                             (plan.sequences, plan.length)).copy()
        return batch
    return whole


def torch_micro_batches(args, rows) -> list[np.ndarray]:
    """The peer's micro-batches of row indices: --micro-batch-rows consecutive rows, or with
    --memagent the rows longest first, as many per micro-batch as the token budget holds at
    the length of its longest."""
    if not args.memagent:
        step = args.micro_batch_rows
        return [np.arange(i, min(i + step, len(rows))) for i in range(0, len(rows), step)]
    budget = learner_plan(args)["micro_batch_tokens"]
    order = np.argsort(-rows.lengths, kind="stable")
    groups, start = [], 0
    while start < len(order):
        count = max(1, budget // int(rows.lengths[order[start]]))
        groups.append(order[start:start + count])
        start += count
    return groups


def bench_torch(config, args, rows) -> float:
    """Seconds per update of the plain PyTorch version (see the module docstring)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    # The preset's own architecture (Qwen2ForCausalLM or Qwen3ForCausalLM), as config.json says.
    hf_config = AutoConfig.for_model(**config.to_hf_dict())
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = AutoModelForCausalLM.from_config(hf_config, attn_implementation="sdpa").to(
        device, torch.float32).train()
    optimiser = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
    groups = []
    for index in torch_micro_batches(args, rows):  # (tokens, loss mask, advantages), cut
        width = int(rows.lengths[index].max())
        groups.append((torch.as_tensor(rows.tokens[index, :width], dtype=torch.long,
                                       device=device),
                       torch.as_tensor(rows.loss_mask[index, 1:width], device=device),
                       torch.as_tensor(rows.advantages[index], device=device)[:, None]))
    total = float(rows.loss_mask.sum())
    autocast = torch.autocast(device.type, dtype=getattr(torch, args.dtype),
                              enabled=args.dtype != "float32")

    def token_logprobs(ids):
        with autocast:
            logits = model(ids).logits[:, :-1].float()
        return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]

    def update():
        with torch.no_grad():
            old = [token_logprobs(tokens) for tokens, _, _ in groups]
        optimiser.zero_grad()
        for (tokens, mask, a), old_logp in zip(groups, old):
            logp = token_logprobs(tokens)
            ratio = torch.exp(logp - old_logp)
            loss = torch.maximum(-a * ratio, -a * ratio.clamp(0.8, 1.28))
            (loss * mask).sum().div(total).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        if device.type == "cuda":
            torch.cuda.synchronize()

    update()  # warm-up (allocations, oneDNN primitive caches)
    seconds = best_time(update, args.repeats)
    model = optimiser = None  # freed (a `del` would unbind the names run() reads)
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen2.5-0.5b")
    parser.add_argument("--layers", type=int, default=None,
                        help="run the preset's widths at this depth")
    parser.add_argument("--dtype", default="float32", help="compute dtype")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=192)
    parser.add_argument("--response-len", type=int, default=64)
    parser.add_argument("--micro-batch-rows", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--matmul-size", type=int, default=4096)
    parser.add_argument("--attention", default="xla", choices=("xla", "dot_product", "cudnn"),
                        help="the forward's attention (cudnn: GPU, bf16 compute)")
    parser.add_argument("--remat", default="none", choices=("none", "matmuls", "full"),
                        help="what ours recomputes in the backward (LearnerConfig.remat)")
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch peer")
    parser.add_argument("--full-logits", action="store_true",
                        help="the LM head on every position (the learner before its response "
                             "window)")
    parser.add_argument("--memagent", type=int, default=None, metavar="DOCS",
                        help="rows: the turns of DOCS MemAgent documents, lengths / --scale; "
                             "times the update unpacked and packed")
    parser.add_argument("--scale", type=int, default=16,
                        help="with --memagent: divides the turn lengths and the 7B plan")
    args = parser.parse_args()

    config = preset_config(args.preset, dtype="float32")
    if args.layers:
        config = config.replace(num_layers=args.layers)
    length = args.prompt_len + args.response_len
    if args.memagent:
        rows = memagent_rows(config, args.memagent, args.scale)
    else:
        rows = synthetic_rows(config, args.rows, args.prompt_len, args.response_len)
    tokens = int(rows.lengths.sum())
    work = sum((flop_model.row(int(n), int(n - p))
                for p, n in zip(rows.prompt_lengths, rows.lengths)), flop_model.Work())
    train_flops, forward_flops = flop_model.train(config, work), flop_model.forward(config, work)

    device = jax.devices()[0]
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, JAX device "
          f"{device.device_kind} ({device.platform}), jax {jax.__version__}")
    if args.memagent:
        plan = learner_plan(args)
        batch = (f"batch: the {len(rows)} turns of {args.memagent} MemAgent documents, lengths "
                 f"/ {args.scale} ({int(rows.lengths.min())}-{int(rows.lengths.max())} tokens, "
                 f"{tokens} in all; {describe()}), micro-batches of "
                 f"{plan['micro_batch_tokens']} tokens, buckets {list(plan['bucket_lengths'])}")
    else:
        batch = (f"batch: {args.rows} rows x {length} tokens ({args.prompt_len} prompt + "
                 f"{args.response_len} response), micro-batches of {args.micro_batch_rows} "
                 "rows")
    print(f"model: {args.preset} widths, {config.num_layers} layers, float32 "
          f"parameters, {args.dtype} compute; {batch}, attention {args.attention}, "
          f"remat {args.remat}")

    peak = matmul_flops(args.matmul_size, args.dtype, args.repeats)
    print(f"matmul {args.matmul_size}^2 {args.dtype}: {peak / 1e9:.1f} GFLOP/s "
          "(the hardware limit below)")

    # The peer runs first and hands its GPU memory back: JAX's allocator keeps what it takes.
    torch_seconds = None if args.no_torch else bench_torch(config, args, rows)
    update_flops = train_flops + forward_flops
    # Rows of exactly one bucket leave nothing to pack: unpacked under cudnn, whose packed
    # rows would take the Triton kernel (models/flash_gpu.py) instead of cuDNN's.
    layouts = ([("rows", False), ("packed", True)] if args.memagent
               else [("", args.attention != "cudnn")])
    for label, pack in layouts:
        ours = bench_ours(config, args, rows, pack)
        step = ours["update"] - ours["recompute"]
        print(f"\nours{' ' + label if label else ''}: first update (compiles) "
              f"{ours['warm_up']:.1f} s")
        print(f"{'':24}{'seconds':>9}{'tokens/s':>11}{'GFLOP/s':>10}{'of matmul':>11}")
        for name, seconds, flops in [("update (recompute+step)", ours["update"], update_flops),
                                     ("  recompute (forward)", ours["recompute"],
                                      forward_flops),
                                     ("  train step", step, train_flops)]:
            print(f"{name:24}{seconds:9.2f}{tokens / seconds:11.1f}"
                  f"{flops / seconds / 1e9:10.1f}{flops / seconds / peak:10.1%}")

    if torch_seconds is not None:
        print(f"\npeer: PyTorch {__import__('torch').__version__} update "
              f"{torch_seconds:.2f} s, {tokens / torch_seconds:.1f} tokens/s, "
              f"{update_flops / torch_seconds / peak:.1%} of matmul")
        print(f"ours{' packed' if args.memagent else ''} / PyTorch tokens/s: "
              f"{torch_seconds / ours['update']:.2f}x")

if __name__ == "__main__":
    main()
