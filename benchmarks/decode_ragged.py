"""Decode step time with one long slot among short ones: each slot read to its own length.

`--slots` slots, two fillings: all short (`--short` tokens each), and one slot of `--long`
tokens beside the short ones (a MemAgent update turn beside final turns). Each filling is
timed on the cache length the engine gives its longest slot (`EngineConfig.cache_lengths`),
two ways in one run:
- ragged: `Qwen.decode_step` reading each slot's cache up to its own length (the platform's
  `RAGGED_READS`: XLA loops on CPU, the Pallas kernels of models/cache_kernels.py on GPU and
  TPU);
- dense: the same step reading every slot's whole cache, masked (`attend_cache`);
- ours: the one of the two the engine takes (ragged where the slots fill under
  `RAGGED_BELOW` of the cache together);
- the limit: bytes a step must read (every weight once, and each slot's keys and values up to
  its length) / the machine's copy bandwidth (benchmarks/decode.py `DeviceBandwidth`,
  measured right before each model's rows).
The mixed filling's time is also given as a ratio to the all-short one's, for each read.

    python benchmarks/decode_ragged.py [--presets qwen2.5-0.5b,memagent-tiny] [--slots 8]
        [--short 512] [--long 7168] [--max-len 8448] [--steps 8] [--repeats 3]
        [--dtype float32]

Weights are random (`random_model` of the preset's, or the shipped model's, config), in --dtype;
the cache holds random keys and values (what they are does not change the time).
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import platform

import jax
import jax.numpy as jnp
import numpy as np
from decode import GB, DeviceBandwidth, best_time
from decode_length import model_for
from flax import nnx
from machine import cpu_model_name  # beside this script

from memagent_jax.engine.engine import RAGGED_BELOW, RAGGED_READS
from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.models.qwen import KVCache, split_params


def step_time(model, params, lengths: list[int], cache_length: int, read_cache, steps: int,
              repeats: int) -> float:
    """Seconds per decode step with slot i holding lengths[i] tokens, on a cache of
    `cache_length` entries, each layer reading it with `read_cache` (None: the dense read)."""
    graphdef = nnx.graphdef(model)

    @functools.partial(jax.jit, donate_argnums=3)  # the cache updated in place, as the engine's
    def step(params, tokens, positions, cache):
        return nnx.merge(graphdef, params).decode_step(tokens, positions, cache, read_cache)

    key = jax.random.key(0)
    cache = jax.tree.map(lambda x: jax.random.normal(key, x.shape, x.dtype),
                         KVCache.zeros(model.config, len(lengths), cache_length))
    tokens = jnp.ones(len(lengths), jnp.int32)
    start = np.asarray(lengths, np.int32)

    def run():
        nonlocal cache
        for k in range(steps):
            logits, cache = step(params, tokens, jnp.asarray(start + k), cache)
        jax.block_until_ready(logits)

    run()  # compiles
    return best_time(run, repeats) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", default="qwen2.5-0.5b,memagent-tiny")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--short", type=int, default=512)
    parser.add_argument("--long", type=int, default=7168)
    parser.add_argument("--max-len", type=int, default=8448,
                        help="the engine's max_len, whose cache lengths the fillings run on")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bandwidth-gb", type=float, default=1.0)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    args = parser.parse_args()
    device = jax.devices()[0]
    ragged_read = RAGGED_READS[device.platform]
    print(f"machine: {platform.machine()} {cpu_model_name()}, {os.cpu_count()} cores; jax "
          f"{jax.__version__} on {device.platform} ({device.device_kind}); {args.slots} slots, "
          f"{args.dtype}, {args.steps} steps x best of {args.repeats}; ragged read "
          f"{ragged_read.__name__}")
    lengths = EngineConfig(max_len=args.max_len).cache_lengths()
    fillings = {"all short": [args.short] * args.slots,
                "one long": [args.long] + [args.short] * (args.slots - 1)}
    bandwidth = DeviceBandwidth(int(args.bandwidth_gb * GB))
    rows = []
    for name in args.presets.split(","):
        model = model_for(name, args.dtype)
        params = split_params(model)[1]
        c = model.config
        weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
        position_bytes = (2 * c.num_layers * c.num_kv_heads * c.head_dim
                          * jnp.dtype(args.dtype).itemsize)
        copy = bandwidth()["copy"] * GB
        first = None
        for filling, filled in fillings.items():
            cache_length = next(n for n in lengths if n >= max(filled) + args.steps)
            ragged, dense = (step_time(model, params, filled, cache_length, read, args.steps,
                                       args.repeats) for read in (ragged_read, None))
            ours = ragged if sum(filled) < RAGGED_BELOW * len(filled) * cache_length else dense
            limit = (weight_bytes + position_bytes * (sum(filled) + len(filled) * args.steps / 2)
                     ) / copy
            first = first or (ours, ragged, dense)
            rows.append((name, filling, cache_length, ours, ragged, dense, limit, first))
            print(f"{name} {filling}: ours {ours * 1e3:.2f} ms, ragged {ragged * 1e3:.2f} ms, "
                  f"dense {dense * 1e3:.2f} ms (cache {cache_length}), limit {limit * 1e3:.2f} "
                  "ms", flush=True)
        del model, params
        gc.collect()
    print()
    print("| model | slots | cache | ours ms/step | vs all short | ragged ms/step | vs all short "
          "| dense ms/step | vs all short | ours / dense | limit ms | limit / ours |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, filling, cache_length, ours, ragged, dense, limit, first in rows:
        print(f"| {name} | {filling} | {cache_length} | {ours * 1e3:.2f} | "
              f"{ours / first[0]:.2f}x | {ragged * 1e3:.2f} | {ragged / first[1]:.2f}x | "
              f"{dense * 1e3:.2f} | {dense / first[2]:.2f}x | {ours / dense:.2f} | "
              f"{limit * 1e3:.2f} | {limit / ours:.0%} |")


if __name__ == "__main__":
    main()
