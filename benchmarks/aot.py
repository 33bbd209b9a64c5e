"""Does a training config fit its chips? Every program of the run, compiled ahead of time for
its real shapes on the config's mesh, with XLA's per-device memory and FLOP counts.

Builds the learner and the decoding engine from shapes only (`Learner.compiled`,
`Engine.compiled`: parameters are ShapeDtypeStructs, nothing is allocated) on the config's
mesh over either a TPU topology's devices (libtpu compiles for chips this machine does not
have: `pip install "jax[tpu]==<jax version>"` in a separate virtualenv) or this machine's
devices (8 simulated CPU devices by default: XLA:CPU's buffer assignment stands in for
XLA:GPU's, with the same algorithm but other fusions). Prints per program the per-device
arguments, outputs and temporaries, their sum against the chip's memory, and the FLOPs.

Programs: the train step (one micro-batch's gradient plus the AdamW update) and the log-prob
pass at the learner's largest micro-batch (`micro_batch_tokens` rows of the longest bucket), the
decode step over `engine.slots`, the prefill of each bucket, and `place`'s program for the
largest weight (the engine's copy is made from the learner's parameters a weight at a time: a
cast and, for fsdp > 1, a gather; beside the copy a chip holds one such program's temporaries). Two
FLOP columns, per chip:
XLA's count, which takes a scanned loop's body once (the learner's programs scan over the
layers and over the LM head's logit chunks, so it undercounts them by about the layer count),
and the model's (benchmarks/flops.py: the whole program's model FLOPs over the chips, as if
split evenly; where XLA's count of an unscanned engine program is higher, the mesh repeats
the work: a prefill of fewer rows than slot groups, or weights the engine splits over tensor
only). Between them the run also holds what the table's rows do not share (the engine's KV
cache and bf16 copy sit beside the learner's state between updates; the config comments count
them).

    python benchmarks/aot.py --config configs/train/qwen2.5-7b_tpu_v5p.yaml --topology v5p:2x4x4
    python benchmarks/aot.py --config configs/train/qwen2.5-7b_gpu8.yaml --hbm-gb 80
    (key=value overrides as `train` takes them; --preset picks the model shape when the
    config's model.path is not on this machine, by default the preset the path names;
    --programs learner|engine compiles half)
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import flops as flop_model  # benchmarks/flops.py, beside this script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--topology", help="a TPU topology, e.g. v5p:2x4x4 (needs libtpu)")
    parser.add_argument("--devices", type=int, default=8, help="simulated CPU devices")
    parser.add_argument("--preset", default=None,
                        help="the model shape, when model.path is not on this machine (default: "
                             "the preset model.path's last component names, else qwen2.5-7b)")
    parser.add_argument("--hbm-gb", type=float, default=None,
                        help="the chip's memory (default: 95 for TPU v5p, else 80)")
    parser.add_argument("--template-tokens", type=int, default=256,
                        help="the templates' tokens, for the cache length (no tokenizer here)")
    parser.add_argument("--programs", choices=("all", "learner", "engine"), default="all")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args()
    if not args.topology:
        os.environ["JAX_PLATFORMS"] = "cpu"
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={args.devices}")

    import jax

    from memagent_jax.engine.engine import Engine
    from memagent_jax.models.loading import abstract_params, build_model
    from memagent_jax.models.qwen import split_params
    from memagent_jax.models.sharding import make_mesh
    from memagent_jax.rl.batching import default_bucket_lengths
    from memagent_jax.rl.config import load_train_config
    from memagent_jax.rl.learner import Learner

    config = load_train_config(args.config, args.overrides)
    if args.topology:
        from jax.experimental import topologies
        devices = topologies.get_topology_desc(platform="tpu",
                                               topology_name=args.topology).devices
    else:
        devices = jax.devices()
    hbm = args.hbm_gb or (95.0 if args.topology and "v5p" in args.topology else 80.0)
    mesh = make_mesh(config.mesh, devices=devices)
    m = config.model
    shape = flop_model.model_shape(m, args.preset)
    shape = shape.replace(dtype=m.param_dtype or "float32")
    compute = m.compute_dtype or "bfloat16"
    model = build_model(shape, abstract_params(shape, mesh), dtype=compute,
                        attention=m.attention)
    # The engine decodes from its own copy in the compute dtype and its own layout
    # (Engine.place); the model here gives it only shapes.
    copy = shape.replace(dtype=compute)
    decoder = build_model(copy, abstract_params(copy, mesh), dtype=compute,
                          attention=m.attention)

    budgets = config.memagent
    tokens = (budgets.chunk_tokens + budgets.max_memory_tokens + budgets.max_problem_tokens
              + budgets.max_final_tokens + args.template_tokens)
    engine = Engine(decoder, config.engine.sized_for(tokens), mesh)
    learner = Learner(model, config.learner, mesh)
    length = max(config.learner.bucket_lengths or default_bucket_lengths(tokens))
    multiple = mesh.shape["data"] * mesh.shape["fsdp"]
    rows = max(multiple, config.learner.micro_batch_tokens // length // multiple * multiple)

    print(f"# {args.config} {' '.join(args.overrides)}")
    print(f"# {platform.machine()}, jax {jax.__version__}; devices: "
          f"{args.topology or f'{len(devices)} simulated CPU'} ({devices[0].device_kind}); "
          f"mesh {dict(mesh.shape)}; "
          f"model {m.path or 'preset ' + m.preset} ({shape.model_type}, {shape.num_layers} "
          f"layers, hidden "
          f"{shape.hidden_size}, {shape.num_heads}/{shape.num_kv_heads} heads of "
          f"{shape.head_dim}{', tied head' if shape.tie_word_embeddings else ''}) "
          f"params {shape.dtype}, compute {compute}, attention {m.attention}; "
          f"micro-batch {rows} x {length}, slots {config.engine.slots}, "
          f"max_len {engine.config.max_len}; chip memory {hbm:g} GB")
    learner_work = flop_model.batch(rows, length, length)
    slots, prefill_rows = config.engine.slots, config.engine.prefill_rows
    model_flops = {  # the whole program's, by the names Learner.compiled and Engine.compiled give
        "train step": flop_model.train(shape, learner_work, config.learner.remat,
                                       config.learner.logit_chunk_tokens is not None,
                                       lora=config.learner.lora),
        "log-probs": flop_model.forward(shape, learner_work),
        # every slot's one token attends the whole max_len cache
        "decode step": flop_model.forward(shape, flop_model.Work(
            slots, slots * engine.config.max_len, slots)),
        # at most the dense read's: a full cache is its worst case
        "decode step, ragged read": flop_model.forward(shape, flop_model.Work(
            slots, slots * engine.config.max_len, slots)),
        **{f"prefill {prefill_rows} x {bucket}": flop_model.forward(
            shape, flop_model.batch(prefill_rows, bucket, 1)) for bucket in engine.buckets}}
    print(f"{'program':24s} {'args GiB':>9s} {'out GiB':>8s} {'temp GiB':>9s} "
          f"{'peak GiB':>9s} {'peak/HBM':>9s} {'XLA TFLOP':>10s} {'model TFLOP':>12s} "
          f"{'compile s':>10s}")
    programs = {"learner": [lambda: learner.compiled(rows, length)],
                "engine": [lambda: engine.compiled(split_params(model)[1])]}
    programs = programs.get(args.programs, programs["learner"] + programs["engine"])
    for build in programs:
        start = time.perf_counter()
        compiled = build()
        seconds = (time.perf_counter() - start) / len(compiled)
        for name, program in compiled.items():
            memory = program.memory_analysis()
            cost = program.cost_analysis()
            cost = cost[0] if isinstance(cost, (list, tuple)) else cost
            args_b, out_b = memory.argument_size_in_bytes, memory.output_size_in_bytes
            temp_b = memory.temp_size_in_bytes
            # Donated arguments (the train step's parameters, optimiser state, gradient sums)
            # share their buffers with the outputs.
            peak = args_b + out_b + temp_b - memory.alias_size_in_bytes
            flops = float(cost.get("flops", float("nan"))) if cost else float("nan")
            print(f"{name:24s} {args_b / 2**30:9.2f} {out_b / 2**30:8.2f} {temp_b / 2**30:9.2f} "
                  f"{peak / 2**30:9.2f} {peak / (hbm * 1e9):9.3f} {flops / 1e12:10.2f} "
                  f"{model_flops.get(name, float('nan')) / len(devices) / 1e12:12.2f} "
                  f"{seconds:10.1f}", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
