"""Decode step time against max_len at a fixed occupancy: the cache sized to what is filled.

Every slot holds a prompt of `--occupancy` tokens; the script times decode steps
(`Engine.generate`, each waited for; the slots grow by `--steps` x (`--repeats` + 1) tokens)
for each `--max-lens` value, two ways in one run:
- ours: the engine as it runs (`EngineConfig.cache_lengths`: the cache is as long as the
  longest slot needs, in quarter-octave lengths from 1024);
- whole cache: the same engine's step told every slot may reach max_len (`generate`'s
  length), so its cache stays max_len entries long and every step reads it in full: the
  engine before the cache followed the slots;
- the limit: bytes a step must read (every weight once, and each slot's keys and values up to
  the occupancy) / the machine's copy bandwidth (benchmarks/decode.py `DeviceBandwidth`,
  measured right before each row).
Step times are also given as ratios to the first max_len's.

    python benchmarks/decode_length.py [--presets memagent-tiny,qwen2.5-0.5b]
        [--max-lens 1024,8192,32768] [--slots 4] [--occupancy 600] [--steps 16] [--repeats 3]

Weights are random (`random_model` of the preset's, or the shipped model's, config), float32.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform

import jax
import numpy as np
from decode import GB, DeviceBandwidth, best_time
from machine import cpu_model_name  # beside this script

from memagent_jax.engine.engine import Engine
from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.models.loading import load_model, random_model
from memagent_jax.models.presets import preset_config
from memagent_jax.models.qwen import split_params


def model_for(name: str, dtype: str = "float32"):
    config = load_model(name)[1] if name == "memagent-tiny" else preset_config(name, dtype=dtype)
    return random_model(config, dtype=dtype)


def step_time(model, params, config: EngineConfig, occupancy: int, steps: int,
              repeats: int, whole: bool) -> tuple[float, int]:
    """(seconds per decode step with every slot holding `occupancy` tokens, the cache length
    the steps ran on). whole: the engine's step on a max_len cache, kept at max_len (the
    engine before its cache followed the slots)."""
    engine = Engine(model, config)
    params = engine.place(params)
    rng = np.random.default_rng(0)
    greedy = SamplingParams(temperature=0.0, seed=0)
    state = engine.init_decode_state(config.max_len if whole else None)
    step = ((lambda params, state, length: engine.generate(params, state, config.max_len))
            if whole else engine.generate)  # a max_len cache holds max_len: never resized
    for slot in range(config.slots):
        prompt = rng.integers(3, model.config.vocab_size, occupancy).tolist()
        state, _, _ = engine.insert(engine.prefill(params, [prompt])[0], state, slot, greedy)
    fed = 0

    def run():
        nonlocal state, fed
        for _ in range(steps):
            fed += 1
            state, tokens, _ = step(params, state, occupancy + fed)
            jax.block_until_ready(tokens)

    run()  # compiles
    seconds = best_time(run, repeats) / steps
    cache_length = state.cache.length
    del state
    gc.collect()
    return seconds, cache_length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--presets", default="memagent-tiny,qwen2.5-0.5b")
    parser.add_argument("--max-lens", default="1024,8192,32768")
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--occupancy", type=int, default=600)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bandwidth-gb", type=float, default=1.0)
    args = parser.parse_args()
    max_lens = [int(n) for n in args.max_lens.split(",")]
    device = jax.devices()[0]
    print(f"machine: {platform.machine()} {cpu_model_name()}, {os.cpu_count()} cores; jax "
          f"{jax.__version__} on {device.platform} ({device.device_kind}); {args.slots} slots "
          f"of {args.occupancy} tokens, float32, {args.steps} steps x best of {args.repeats}")
    bandwidth = DeviceBandwidth(int(args.bandwidth_gb * GB))
    rows = []
    for name in args.presets.split(","):
        model = model_for(name)
        params = split_params(model)[1]
        c = model.config
        weight_bytes = sum(x.nbytes for x in jax.tree.leaves(params))
        kv_bytes = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 4 * args.slots
        limit_s = (weight_bytes + kv_bytes * (args.occupancy + 1)) / (bandwidth()["copy"] * GB)
        first = None
        for max_len in max_lens:
            config = EngineConfig(slots=args.slots, max_len=max_len)
            ours, length = step_time(model, params, config, args.occupancy, args.steps,
                                     args.repeats, whole=False)
            whole, _ = step_time(model, params, config, args.occupancy, args.steps,
                                 args.repeats, whole=True)
            first = first or (ours, whole)
            rows.append((name, max_len, length, ours, whole, limit_s, first))
            print(f"{name} max_len {max_len}: ours {ours * 1e3:.2f} ms (cache {length}), whole "
                  f"cache {whole * 1e3:.2f} ms, limit {limit_s * 1e3:.2f} ms", flush=True)
        del model, params
        gc.collect()
    print()
    print("| model | max_len | cache read | ours ms/step | vs first max_len | whole cache "
          "ms/step | vs first max_len | ours / whole | limit ms | limit / ours |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, max_len, length, ours, whole, limit_s, first in rows:
        print(f"| {name} | {max_len} | {length} | {ours * 1e3:.2f} | {ours / first[0]:.2f}x | "
              f"{whole * 1e3:.2f} | {whole / first[1]:.2f}x | {ours / whole:.2f} | "
              f"{limit_s * 1e3:.2f} | {limit_s / ours:.0%} |")


if __name__ == "__main__":
    main()
