"""LoRA in the engine: decode with a merged copy of the weights, or apply the adapters
unmerged? On this machine's default device, at a preset's shapes (docs/lora.md).

What differs between the two is confined to the adapted projections, so this times those
alone, over every layer, for `--slots` decode rows (one token each):
- `merged`: y = x W for each adapted kernel (the engine's step on weights that already hold
  W + alpha/r AB);
- `unmerged`: y = x W + alpha/r (x A) B, the adapters applied beside the frozen base;
- `merge`: W + alpha/r AB for every adapted kernel, once per training step (what `merged`
  pays before a rollout; models/lora.merge, as the learner's `params` runs it).
It prints each time (best of --repeats), the unmerged step's extra over the merged one, and
the break-even: the decode steps per training step past which merging costs less. A MemAgent
step decodes thousands of tokens per slot per update, so `merged` wins wherever the
break-even is below that; `unmerged` saves the merged copy's memory instead (one more
weight-sized buffer in the compute dtype while the rollouts run).

    python benchmarks/lora_merge.py [--preset small] [--rank 8] [--slots 32] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import platform

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
from decode import best_time  # beside this script

from memagent_jax.models import lora
from memagent_jax.models.loading import random_model
from memagent_jax.models.lora_config import LoraConfig
from memagent_jax.models.presets import preset_config
from memagent_jax.models.qwen import split_params


def _kernels(params, adapters):
    """[(W [in, out], A [in, r], B [r, out])] of every adapted kernel, flattened to 2-D."""
    out = []
    for i, layer in adapters["layers"].items():
        for block, kernels in layer.items():
            for name, ab in kernels.items():
                w = params["layers"][i][block][name]
                n = ab["a"].ndim - 1
                in_size = 1
                for d in w.shape[:n]:
                    in_size *= d
                out.append((w.reshape(in_size, -1), ab["a"].reshape(in_size, -1),
                            ab["b"].reshape(ab["b"].shape[0], -1)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--slots", type=int, default=32)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()

    config = preset_config(args.preset, dtype=args.dtype)
    params = split_params(random_model(config, dtype=args.dtype))[1]
    lora_config = LoraConfig(rank=args.rank, alpha=2.0 * args.rank)
    adapters = jax.tree.map(lambda x: x + 0.01, lora.init_adapters(config, lora_config, 0))
    kernels = _kernels(params, adapters)
    scale = lora_config.scale
    x = {k[0].shape[0]: jax.random.normal(jax.random.key(1), (args.slots, k[0].shape[0]),
                                          jnp.dtype(args.dtype)) for k in kernels}

    @jax.jit
    def merged(ws):
        return sum(jnp.sum(x[w.shape[0]] @ w) for w in ws)

    @jax.jit
    def unmerged(triples):
        return sum(jnp.sum(x[w.shape[0]] @ w + scale * ((x[w.shape[0]] @ a) @ b))
                   for w, a, b in triples)

    merge = jax.jit(lambda p, a: lora.merge(p, a, scale))
    ws = [w for w, _, _ in kernels]
    timings = {}
    for name, fn in (("merged", lambda: merged(ws).block_until_ready()),
                     ("unmerged", lambda: unmerged(kernels).block_until_ready()),
                     ("merge", lambda: jax.block_until_ready(merge(params, adapters)))):
        fn()  # compile
        timings[name] = best_time(fn, args.repeats)
    extra = timings["unmerged"] - timings["merged"]
    print(f"{platform.node()} {jax.devices()[0].platform}: {args.preset} ({config.num_layers} "
          f"layers, {len(kernels)} adapted kernels), rank {args.rank}, {args.slots} slots, "
          f"{args.dtype}")
    for name, seconds in timings.items():
        print(f"  {name:9s} {seconds * 1e3:9.3f} ms")
    print(f"  unmerged extra per decode step {extra * 1e3:.3f} ms; merging pays off past "
          + (f"{timings['merge'] / extra:.0f} decode steps per training step" if extra > 0
             else "no decode step (unmerged was not slower here)"))


if __name__ == "__main__":
    main()
