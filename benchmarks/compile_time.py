"""Compile time of the Qwen2.5 programs versus depth: scanned layers vs unrolled ones.

`memagent_jax.models.qwen` runs the full-sequence forward (the train step's) as one
`jax.lax.scan` over the layers (weights stacked inside the program), so its compiled program is
the size of one layer and compile time should not grow with depth: Qwen2.5-72B (80 layers)
should compile about as fast as Qwen2.5-0.5B (24). The engine's prefill and decode step are
unrolled over the per-layer weights on purpose (a scan copies every layer's weights out of the
stack on every call; see the model's docstring), so their compile time grows with depth: this
script shows by how much.
It lowers and compiles, from shapes only (no weights are allocated, so the 72B shape fits on
any machine), for each preset:
- `forward`: the full-sequence forward `model(input_ids, attention_mask)`;
- `prefill`: `model.prefill(ids [B, T], logits_index)`, the engine's prefill;
- `decode`: one KV-cache decode step `model.decode_step(tokens [B], positions [B], cache)`;
- `unrolled` (the peer for the scanned forward): the forward with the layer scan fully
  unrolled, as a port without the scan compiles it (`unrolled_forward` below).
It prints per program the lowering and compile wall seconds and the compile CPU seconds, each
the best of --repeats rounds (every run a fresh jitted function compiled after
`jax.clear_caches()`, so nothing is reused; rounds go round-robin over the programs, so load
from other processes hits them alike), the line count of the compiled HLO, and the 72B / 0.5B
compile-time ratios. One untimed compile of the `tiny` preset first keeps XLA's one-time
start-up cost out of the first row.

    python benchmarks/compile_time.py [--dtype bfloat16] [--batch 1] [--seq 128]
        [--cache-len 1024] [--repeats 3]
    python benchmarks/compile_time.py --shapes qwen2.5-0.5b qwen2.5-0.5b@80   # depth only
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
from flax import nnx

from memagent_jax.models.presets import preset_config
from memagent_jax.models.qwen import KVCache, Qwen, split_params

PROGRAMS = ("forward", "prefill", "decode", "unrolled")


def unrolled_forward(model: Qwen, input_ids: jnp.ndarray, attention_mask: jnp.ndarray):
    """`Qwen.__call__` traced with its layer scan fully unrolled (`jax.lax.scan(unroll=True)`):
    the peer program, whose HLO holds one copy of the layer per decoder layer, as a port
    without the scan would compile."""
    scan = jax.lax.scan
    jax.lax.scan = functools.partial(scan, unroll=True)
    try:
        return model(input_ids, attention_mask)
    finally:
        jax.lax.scan = scan


def program(kind: str, config, args):
    """(function of (state, *inputs), abstract arguments) for one program of one shape."""
    dtype = jnp.dtype(args.dtype)
    model = nnx.eval_shape(lambda: Qwen(config, dtype=dtype, param_dtype=dtype,
                                         rngs=nnx.Rngs(0)))
    graphdef, state = split_params(model)
    b, t = args.batch, args.seq
    rows = jax.ShapeDtypeStruct((b,), jnp.int32)
    if kind == "decode":
        cache = jax.eval_shape(lambda: KVCache.zeros(config, b, args.cache_len, dtype))
        return (lambda s, ids, pos, c: nnx.merge(graphdef, s).decode_step(ids, pos, c),
                (state, rows, rows, cache))
    tokens = jax.ShapeDtypeStruct((b, t), jnp.int32)
    if kind == "prefill":
        return lambda s, ids, last: nnx.merge(graphdef, s).prefill(ids, last), (state, tokens,
                                                                                rows)
    if kind == "forward":
        return lambda s, ids, m: nnx.merge(graphdef, s)(ids, m), (state, tokens, tokens)
    return (lambda s, ids, m: unrolled_forward(nnx.merge(graphdef, s), ids, m),
            (state, tokens, tokens))


def shape_config(spec: str, dtype: str):
    """'preset' or 'preset@layers' (the preset's widths at another depth) -> ModelConfig."""
    name, _, layers = spec.partition("@")
    config = preset_config(name, dtype)
    return config.replace(num_layers=int(layers)) if layers else config


def measure(kind: str, config, args) -> dict:
    """Lowers and compiles one program afresh: wall seconds of each step, compile CPU seconds
    (all threads; less disturbed than wall time by other processes on a shared machine), and
    the line count of the compiled HLO."""
    jax.clear_caches()
    fn, abstract_args = program(kind, config, args)
    start = time.perf_counter()
    lowered = jax.jit(fn).lower(*abstract_args)
    lowered_at, cpu_start = time.perf_counter(), time.process_time()
    compiled = lowered.compile()
    return {"lower_s": lowered_at - start, "compile_s": time.perf_counter() - lowered_at,
            "compile_cpu_s": time.process_time() - cpu_start,
            "hlo_lines": compiled.as_text().count("\n")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", nargs=2, default=["qwen2.5-0.5b", "qwen2.5-72b"],
                        metavar=("SMALL", "LARGE"), help="two presets, the shallower first; "
                        "'preset@layers' changes a preset's depth only")
    parser.add_argument("--programs", nargs="+", default=list(PROGRAMS), choices=PROGRAMS)
    parser.add_argument("--dtype", default="bfloat16", help="parameter and compute dtype")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128, help="forward / prefill length")
    parser.add_argument("--cache-len", type=int, default=1024, help="KV cache length (decode)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of compilations; the "
                        "fastest per program is reported (timings on shared machines are noisy)")
    args = parser.parse_args()

    print(f"jax {jax.__version__}, {jax.devices()[0].platform}, {platform.machine()}, "
          f"{os.cpu_count()} cores; dtype {args.dtype}, batch {args.batch}, seq {args.seq}, "
          f"cache {args.cache_len}, best of {args.repeats}")
    print(f"{'shape':<17} {'layers':>6} {'program':<9} {'lower s':>8} {'compile s':>10} "
          f"{'cpu s':>8} {'HLO lines':>10}")
    measure("forward", preset_config("tiny", args.dtype), args)  # warm-up, not reported
    configs = {name: shape_config(name, args.dtype) for name in args.shapes}
    runs = [(name, kind) for name in args.shapes for kind in args.programs]
    results = {run: {} for run in runs}
    for _ in range(args.repeats):  # round-robin, so load from other processes hits all alike
        for name, kind in runs:
            for key, value in measure(kind, configs[name], args).items():
                results[name, kind][key] = min(value, results[name, kind].get(key, value))
    for name, kind in runs:
        r = results[name, kind]
        print(f"{name:<17} {configs[name].num_layers:>6} {kind:<9} {r['lower_s']:>8.2f} "
              f"{r['compile_s']:>10.2f} {r['compile_cpu_s']:>8.2f} {r['hlo_lines']:>10}")
    small, large = args.shapes
    print(f"\ncompile-time ratio {large} / {small} (wall, cpu):")
    for kind in args.programs:
        a, b = results[large, kind], results[small, kind]
        print(f"  {kind:<9} {a['compile_s'] / b['compile_s']:5.2f}x "
              f"{a['compile_cpu_s'] / b['compile_cpu_s']:5.2f}x")


if __name__ == "__main__":
    main()
