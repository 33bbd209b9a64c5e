"""Memory of the learner's token log-probabilities: the whole [rows, T, V] logits against the LM
head applied a chunk of positions at a time (`memagent_jax.rl.logprobs`).

Compiles, from shapes only (nothing is allocated), the gradient of a DAPO-like objective of the
selected-token log-probs and entropies with respect to the final hidden states and the LM head
([D, V] float32, as the master weights), for one micro-batch, whole and with each chunk size,
and prints XLA's buffer assignment (`memory_analysis()`): arguments, outputs and temporaries
per device, the peer (whole logits) and the chip's HBM as ratios. Defaults: one 8192-token row
(MemAgent's longest turns), Qwen2.5-7B's hidden size and vocabulary. XLA:CPU's buffer
assignment stands in for a GPU's or TPU's (same algorithm; fusion choices differ).

    python benchmarks/logit_memory.py [--rows 1] [--tokens 8192] [--hidden 3584]
        [--vocab 152064] [--chunks 2048 1024 512 256] [--hbm-gb 95]
"""

from __future__ import annotations

import argparse
import platform
import time

import jax
import jax.numpy as jnp

from memagent_jax.rl.logprobs import token_logprobs


def objective(chunk):
    def f(hidden, head, tokens, weights):
        logp, entropy = token_logprobs(lambda h: h @ head, hidden, tokens, chunk)
        return jnp.sum(weights * logp) + 0.01 * jnp.sum(weights * entropy)
    return f


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--hidden", type=int, default=3584)
    parser.add_argument("--vocab", type=int, default=152_064)
    parser.add_argument("--chunks", type=int, nargs="+", default=[2048, 1024, 512, 256])
    parser.add_argument("--hbm-gb", type=float, default=95.0,
                        help="the chip's memory (v5p 95, H100 80)")
    args = parser.parse_args()
    b, t, d, v = args.rows, args.tokens, args.hidden, args.vocab
    shapes = (jax.ShapeDtypeStruct((b, t, d), jnp.bfloat16),
              jax.ShapeDtypeStruct((d, v), jnp.float32),
              jax.ShapeDtypeStruct((b, t), jnp.int32), jax.ShapeDtypeStruct((b, t), jnp.float32))
    print(f"# {platform.machine()} {jax.default_backend()}, jax {jax.__version__}; "
          f"rows {b} x {t} tokens, hidden {d}, vocab {v}: float32 logits "
          f"{b * t * v * 4 / 2**30:.2f} GiB; HBM {args.hbm_gb:g} GB")
    print("chunk     temp GiB  args GiB  out GiB  temp/whole  peak/HBM  compile s")
    whole = None
    for chunk in [None, *args.chunks]:
        start = time.perf_counter()
        grad = jax.jit(jax.grad(objective(chunk), argnums=(0, 1)))
        m = grad.lower(*shapes).compile().memory_analysis()
        seconds = time.perf_counter() - start
        temp = m.temp_size_in_bytes
        whole = whole or temp
        peak = temp + m.argument_size_in_bytes + m.output_size_in_bytes
        print(f"{str(chunk or 'whole'):8s} {temp / 2**30:9.2f} "
              f"{m.argument_size_in_bytes / 2**30:9.2f}"
              f" {m.output_size_in_bytes / 2**30:8.2f} {temp / whole:11.3f}"
              f" {peak / (args.hbm_gb * 1e9):9.3f} {seconds:10.1f}")


if __name__ == "__main__":
    main()
