"""Decode throughput: our Engine versus `transformers` generate, and versus memory bandwidth.

Single-sequence and small-batch decoding reads every weight once per step, so its ceiling is
the memory bandwidth: steps/s <= bandwidth / parameter bytes. This script measures, in one run:
- the machine's bandwidth: a large array copy (a jitted in-place `a + 1` on JAX's device;
  bytes read + written / time, best of a few) and a read-only `jnp.sum`, measured again just
  before and just after each decode-only run (see `DeviceBandwidth`); the copy is the limit
  (numpy's one-thread host copy and a plain jitted `jnp.copy`, whose fresh output buffer makes
  it page-fault bound on a CPU, are shown once for reference);
- per batch size, greedy decoding of `--new-tokens` tokens after random prompts of
  `--prompt-len` tokens, no EOS stopping, with the SAME random weights in both frameworks:
  * ours end to end: `scheduler.complete(engine, params, requests)` (prefill + insert + steps)
    after `engine.warm_up(params, [prompt_len])`, best of --repeats; the engine prefills the
    whole batch in one call (`prefill_rows` = batch), as transformers does;
  * ours decode only: a loop of `engine.generate(params, state, length)` steps over full slots, each
    step's tokens waited for (`jax.block_until_ready`), as the scheduler does;
  * transformers end to end: `model.generate(ids [B, P], max_new_tokens=N, min_new_tokens=N,
    do_sample=False)` under `torch.inference_mode`, after one untimed warm-up call; its decode
    rate is estimated as B * (N - 1) / (t(N tokens) - t(1 token));
  * achieved weight bytes/s of our decode: parameter bytes (the tied embedding / LM head once)
    x decode steps/s, as a fraction of the measured bandwidth;
  * floor: only the step's weight matmuls over the same per-layer arrays (the same bytes; no
    attention, norms, rope, cache or sampling; see `bench_matmul_floor`);
- the tokens both produced are compared (same weights, both float32 greedy: they should agree
  except where two logits are close to a tie).

    python benchmarks/decode.py [--preset qwen2.5-0.5b] [--dtype float32] [--batch-sizes 1,8,32]
        [--prompt-len 32] [--new-tokens 64] [--max-len 128] [--repeats 2] [--model-dir DIR]

On a GPU (later: `--preset qwen2.5-7b --dtype bfloat16`) JAX uses its default device and torch
runs on cuda; neither is required. Random weights are written to a temporary directory unless
--model-dir names one (written there if it has no config.json yet).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import tempfile
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave GPU memory to torch too

import jax
import jax.numpy as jnp
import numpy as np
from machine import cpu_model_name  # beside this script

GB = 1e9


def cpu_busy() -> tuple[float, float]:
    """(seconds of CPU time the whole machine has been busy, incl. hypervisor steal; seconds of
    CPU time this process has used), for `best_time`'s load check."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
        busy = (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        busy = float("nan")
    own = os.times()
    return busy, own.user + own.system


def best_time(fn, repeats: int, loads: list[float] | None = None, around=None,
              probes: list | None = None) -> float:
    """Fastest of `repeats` runs of fn(), in seconds. If `loads` is given, appends the share of
    the machine's cores that other processes kept busy during that fastest run (this script
    shares its machine: a run that other work slowed down shows a high share). If `around` is
    given, it is called (untimed) before and after every run, and `probes` receives its two
    results for the fastest run."""
    best, best_load, best_probes = float("inf"), float("nan"), None
    cores = os.cpu_count() or 1
    for _ in range(repeats):
        before = around() if around else None
        busy0, own0 = cpu_busy()
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        busy1, own1 = cpu_busy()
        after = around() if around else None
        if elapsed < best:
            best, best_probes = elapsed, (before, after)
            # The counters tick every 10 ms: too coarse for runs shorter than about 0.5 s.
            other = max(0.0, (busy1 - busy0) - (own1 - own0)) / (elapsed * cores)
            best_load = min(other, 1.0) if elapsed >= 0.5 else float("nan")
    if loads is not None:
        loads.append(best_load)
    if probes is not None:
        probes.extend(best_probes)
    return best


# ---- memory bandwidth ---------------------------------------------------------------------

class DeviceBandwidth:
    """GB/s of JAX's default device on a `size_bytes` array, measured whenever called: the
    bandwidth a shared machine gives changes from minute to minute (this 2-core VM's copy rate
    moved between about 55 and 117 GB/s within one run), so each decode timing is compared
    with figures taken right around it.
    - copy: a jitted in-place (donated) `a + 1`, bytes read + written; a non-donated copy writes
      a fresh buffer every call, and first-touching its pages costs more than the copy (shown
      once at the start for reference, never used as the limit). (+ 0 would be folded away.)
    - read: a jitted `jnp.sum`, bytes read."""

    def __init__(self, size_bytes: int):
        self.x = jax.random.uniform(jax.random.PRNGKey(0), (size_bytes // 4,), jnp.float32)
        self._add_one = jax.jit(lambda a: a + jnp.float32(1), donate_argnums=0)
        self._sum = jax.jit(jnp.sum)
        self.x = jax.block_until_ready(self._add_one(self.x))
        jax.block_until_ready(self._sum(self.x))

    def __call__(self, repeats: int = 5) -> dict[str, float]:
        def in_place():
            self.x = jax.block_until_ready(self._add_one(self.x))

        nbytes = self.x.nbytes
        return {"copy": 2 * nbytes / best_time(in_place, repeats) / GB,
                "read": nbytes / best_time(lambda: jax.block_until_ready(self._sum(self.x)),
                                           repeats) / GB}

    def fresh_copy(self, repeats: int = 2) -> float:
        copy = jax.jit(jnp.copy)
        jax.block_until_ready(copy(self.x))
        return 2 * self.x.nbytes / best_time(lambda: jax.block_until_ready(copy(self.x)),
                                             repeats) / GB


def numpy_copy(size_bytes: int, repeats: int) -> float:
    """GB/s of a host copy by numpy (one thread), bytes read + written."""
    src = np.random.default_rng(0).random(size_bytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    rate = 2 * src.nbytes / best_time(lambda: np.copyto(dst, src), repeats) / GB
    src = dst = None  # freed (a `del` would unbind the names the lambda reads)
    gc.collect()
    return rate


# ---- model files --------------------------------------------------------------------------

def ensure_model_dir(path: str | None, preset: str, dtype: str) -> tuple[str, object]:
    from memagent_jax.models.loading import random_model, save_hf
    from memagent_jax.models.presets import preset_config
    if path and os.path.isfile(os.path.join(path, "config.json")):
        return path, None
    tmp = None
    if not path:
        tmp = tempfile.TemporaryDirectory(prefix="decode_bench_")
        path = os.path.join(tmp.name, "model")
    config = preset_config(preset, dtype=dtype)
    start = time.perf_counter()
    model = random_model(config, dtype=dtype)
    save_hf(model, config, path)
    del model
    gc.collect()
    print(f"wrote random {preset} ({dtype}) to {path} in {time.perf_counter() - start:.1f} s")
    return path, tmp


# ---- ours ---------------------------------------------------------------------------------

def bench_ours(model, prompts: np.ndarray, new_tokens: int, max_len: int, repeats: int,
               decode_steps: int, bandwidth: DeviceBandwidth) -> dict:
    """End-to-end and decode-only timings; the bandwidth is probed right before and after each
    decode-only run, and the probes around the fastest one are returned with it."""
    from memagent_jax.engine.engine import Engine
    from memagent_jax.engine.engine_api import EngineConfig
    from memagent_jax.engine.sampling import SamplingParams
    from memagent_jax.engine.scheduler import Request, complete
    from memagent_jax.models.qwen import split_params

    batch, prompt_len = prompts.shape
    engine = Engine(model, EngineConfig(slots=batch, max_len=max_len,
                                        prefill_buckets=(prompt_len,), prefill_rows=batch))
    params = engine.place(split_params(model)[1])
    start = time.perf_counter()
    engine.warm_up(params, [prompt_len])
    warm_up_s = time.perf_counter() - start
    greedy = SamplingParams(temperature=0.0, seed=0)
    requests = [Request(tuple(int(t) for t in row), max_new_tokens=new_tokens, sampling=greedy,
                        stop_ids=()) for row in prompts]
    results, loads = [], []

    def run():
        results.append(complete(engine, params, requests))

    e2e_s = best_time(run, repeats, loads)
    tokens = np.array([r[0].token_ids for r in results[-1]], np.int64)
    assert tokens.shape == (batch, new_tokens), tokens.shape

    # Decode only: every slot busy, then `decode_steps` steps, each waited for (a slot at
    # max_len keeps rewriting its last entry).
    state = engine.init_decode_state()
    for slot, row in enumerate(prompts):
        state, _, _ = engine.insert(engine.prefill(params, [row])[0], state, slot, greedy)
    fed = 0

    def step():
        nonlocal state, fed
        fed += 1
        state, tok, _ = engine.generate(params, state, min(prompt_len + fed, max_len))
        return tok

    for _ in range(2):
        tok = step()
    jax.block_until_ready(tok)

    def steps():
        for _ in range(decode_steps):
            jax.block_until_ready(step())

    probes: list[dict[str, float]] = []
    step_s = best_time(steps, repeats, loads, around=bandwidth, probes=probes) / decode_steps
    state = engine = None  # freed, as above
    gc.collect()
    return {"warm_up_s": warm_up_s, "e2e_s": e2e_s, "step_s": step_s, "tokens": tokens,
            "ours_load": max(loads), "probes": probes}


def bench_matmul_floor(model, batch: int, repeats: int, steps: int) -> float:
    """Seconds per step of a chain of only the decode step's weight matmuls (q, k, v, o, gate,
    up, down per layer, then the LM head; no attention, norms, rope, cache or sampling) over
    the model's own per-layer arrays: what the step would cost if nothing else took time."""
    from memagent_jax.models.qwen import row_logits, split_params

    tied = model.config.tie_word_embeddings
    head = model.embed[...] if tied else model.lm_head[...]
    dtype, d = model.dtype, model.config.hidden_size
    layers = [jax.tree.map(lambda w: w.astype(dtype), params)
              for params in split_params(model)[1]["layers"].values()]

    @jax.jit
    def chain(layers, head, x):
        for layer in layers:
            a, m = layer["attn"], layer["mlp"]
            q = jnp.einsum("bd,dhk->bhk", x, a["q_kernel"])
            kv = (jnp.einsum("bd,dhk->bhk", x, a["k_kernel"]).sum()
                  + jnp.einsum("bd,dhk->bhk", x, a["v_kernel"]).sum())
            x = x + jnp.einsum("bhk,hkd->bd", q, a["o_kernel"]) + 1e-3 * kv
            g = jax.nn.silu(x @ m["gate_kernel"]) * (x @ m["up_kernel"])
            x = x + g @ m["down_kernel"]
        return jnp.argmax(row_logits(x, head.astype(dtype), tied), axis=-1)

    x = jnp.ones((batch, d), dtype)
    jax.block_until_ready(chain(layers, head, x))

    def run():
        for _ in range(steps):
            jax.block_until_ready(chain(layers, head, x))

    return best_time(run, repeats) / steps


# ---- transformers -------------------------------------------------------------------------

def bench_hf(hf_model, prompts: np.ndarray, new_tokens: int, repeats: int, device) -> dict:
    import torch
    ids = torch.as_tensor(prompts, dtype=torch.long, device=device)
    mask = torch.ones_like(ids)

    def gen(n):
        with torch.inference_mode():
            out = hf_model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n,
                                    min_new_tokens=n, do_sample=False, pad_token_id=0)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return out

    gen(2)  # warm-up
    outs, loads = [], []
    e2e_s = best_time(lambda: outs.append(gen(new_tokens)), repeats, loads)
    prefill_s = best_time(lambda: gen(1), repeats, loads)
    tokens = outs[-1][:, prompts.shape[1]:].cpu().numpy()
    assert tokens.shape == (prompts.shape[0], new_tokens), tokens.shape
    return {"e2e_s": e2e_s, "prefill_s": prefill_s, "tokens": tokens, "hf_load": max(loads)}


# ---- main ---------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="qwen2.5-0.5b")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--batch-sizes", default="1,8,32")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--max-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2,
                        help="timed runs per measurement (best kept)")
    parser.add_argument("--large-batch", type=int, default=32,
                        help="batches >= this use --large-repeats (transformers is slow there)")
    parser.add_argument("--large-repeats", type=int, default=1)
    parser.add_argument("--decode-steps", type=int, default=32,
                        help="steps per timed decode-only loop")
    parser.add_argument("--bandwidth-gb", type=float, default=1.0,
                        help="size of the array copied to measure bandwidth")
    parser.add_argument("--model-dir", default=None)
    parser.add_argument("--skip-transformers", action="store_true")
    args = parser.parse_args()
    batches = [int(b) for b in args.batch_sizes.split(",")]
    if args.prompt_len + args.new_tokens > args.max_len:
        parser.error("--prompt-len + --new-tokens must be <= --max-len")

    import flax
    import torch
    import transformers
    from flax import nnx
    cores = os.cpu_count() or 1
    torch.set_num_threads(cores)
    torch_device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    jax_device = jax.devices()[0]
    print(f"machine: {platform.machine()} {cpu_model_name()}, {cores} cores, "
          f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB; "
          f"jax device {jax_device.platform} ({jax_device.device_kind}); torch device "
          f"{torch_device}")
    print(f"jax {jax.__version__}, flax {flax.__version__}, torch {torch.__version__} "
          f"(threads {torch.get_num_threads()}), transformers {transformers.__version__}, "
          f"numpy {np.__version__}")
    print(f"preset {args.preset} {args.dtype}, prompts {args.prompt_len} tokens, "
          f"{args.new_tokens} new tokens, greedy, no EOS; engine max_len {args.max_len}")

    bandwidth = DeviceBandwidth(int(args.bandwidth_gb * GB))
    start_bw = bandwidth()
    print(f"bandwidth at the start: numpy copy (1 thread) "
          f"{numpy_copy(int(args.bandwidth_gb * GB), 5):.1f} GB/s; jax copy (jit a+1, donated) "
          f"{start_bw['copy']:.1f}; jax copy (jnp.copy, fresh out) {bandwidth.fresh_copy():.1f}; "
          f"jax read (jit jnp.sum) {start_bw['read']:.1f} GB/s. Limits per batch: the best jax "
          f"copy and read measured just before and just after its fastest decode-only run.")

    from memagent_jax.models.loading import load_model
    model_dir, tmp = ensure_model_dir(args.model_dir, args.preset, args.dtype)
    model, config = load_model(model_dir, dtype=args.dtype)
    param_bytes = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    print(f"parameters: {param_bytes / GB:.3f} GB read per decode step "
          f"(tied head counted once: {config.tie_word_embeddings})")
    hf_model = None
    if not args.skip_transformers:
        hf_model = transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=getattr(torch, args.dtype)).to(torch_device).eval()
        print(f"transformers attention: {hf_model.config._attn_implementation}")

    rng = np.random.default_rng(0)
    rows = []
    for batch in batches:
        repeats = args.large_repeats if batch >= args.large_batch else args.repeats
        prompts = rng.integers(0, config.vocab_size, (batch, args.prompt_len)).astype(np.int32)
        ours = bench_ours(model, prompts, args.new_tokens, args.max_len, repeats,
                          args.decode_steps, bandwidth)
        floor_s = bench_matmul_floor(model, batch, repeats, max(4, args.decode_steps // 4))
        before, after = ours["probes"]
        row = {"batch": batch, "repeats": repeats, **ours, "floor_s": floor_s,
               "copy_gbs": max(before["copy"], after["copy"]),
               "read_gbs": max(before["read"], after["read"])}
        generated = batch * args.new_tokens
        row["ours_e2e"] = generated / ours["e2e_s"]
        row["ours_decode"] = batch / ours["step_s"]
        row["weight_gbs"] = param_bytes / ours["step_s"] / GB
        row["floor_gbs"] = param_bytes / floor_s / GB
        msg = (f"batch {batch:3d}: ours e2e {ours['e2e_s']:.2f} s = {row['ours_e2e']:.1f} tok/s, "
               f"decode step {ours['step_s'] * 1e3:.1f} ms = {row['ours_decode']:.1f} tok/s "
               f"({row['weight_gbs']:.1f} GB/s of weights); matmuls alone "
               f"{floor_s * 1e3:.1f} ms; warm-up {ours['warm_up_s']:.1f} s; "
               f"other load {ours['ours_load']:.0%}; bandwidth copy / read before "
               f"{before['copy']:.1f} / {before['read']:.1f}, after {after['copy']:.1f} / "
               f"{after['read']:.1f} GB/s")
        if hf_model is not None:
            hf = bench_hf(hf_model, prompts, args.new_tokens, repeats, torch_device)
            row["hf_e2e"] = generated / hf["e2e_s"]
            row["hf_decode"] = batch * (args.new_tokens - 1) / max(hf["e2e_s"] - hf["prefill_s"],
                                                                   1e-9)
            row["hf_prefill_s"] = hf["prefill_s"]
            row["hf_load"] = hf["hf_load"]
            same = ours["tokens"] == hf["tokens"]
            row["match_rows"] = int(same.all(axis=1).sum())
            row["match_first"] = float(np.mean([np.argmin(r) if not r.all() else len(r)
                                                for r in same]))
            msg += (f"\n           transformers e2e {hf['e2e_s']:.2f} s = {row['hf_e2e']:.1f} "
                    f"tok/s (1-token call {hf['prefill_s']:.2f} s, decode ~{row['hf_decode']:.1f}"
                    f" tok/s); identical rows {row['match_rows']}/{batch}, mean agreeing "
                    f"prefix {row['match_first']:.1f} tokens; other load {hf['hf_load']:.0%}")
        print(msg, flush=True)
        rows.append(row)

    print()
    print("| batch | ours e2e tok/s | ours decode tok/s | transformers tok/s (decode) | "
          "ours/transformers e2e (decode) | our weight GB/s | copy limit GB/s | / copy | "
          "read GB/s | / read | matmuls alone: ms (GB/s) | other load ours / transformers |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        hf_cell = (f"{r['hf_e2e']:.1f} ({r['hf_decode']:.1f})" if "hf_e2e" in r else "-")
        ratio = (f"{r['ours_e2e'] / r['hf_e2e']:.2f}x ({r['ours_decode'] / r['hf_decode']:.2f}x)"
                 if "hf_e2e" in r else "-")
        print(f"| {r['batch']} | {r['ours_e2e']:.1f} | {r['ours_decode']:.1f} | {hf_cell} | "
              f"{ratio} | {r['weight_gbs']:.1f} | {r['copy_gbs']:.1f} | "
              f"{r['weight_gbs'] / r['copy_gbs']:.0%} | {r['read_gbs']:.1f} | "
              f"{r['weight_gbs'] / r['read_gbs']:.0%} | {r['floor_s'] * 1e3:.1f} "
              f"({r['floor_gbs']:.1f}) | {r['ours_load']:.0%} / "
              f"{r.get('hf_load', float('nan')):.0%} |")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
