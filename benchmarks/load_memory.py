"""Peak host memory while loading a model: memagent_jax `load_model` versus transformers.

`load_model` builds the model abstractly, then streams each parameter from the memory-mapped
safetensors files straight onto its sharding, so the host should never hold much more than the
model itself: the goal is peak RSS delta <= 1.25 x (model bytes + largest tensor bytes). This
script writes a random-weight HF directory (default: Qwen2.5-0.5B widths, 12 layers, a 32K
vocabulary, untied head, bfloat16: 453 MB) and then, each in a fresh subprocess that has
already imported its libraries and run one tiny op, loads it with
- `memagent_jax.models.loading.load_model(dir, dtype=None)` (stored dtype) onto one CPU device;
- the same onto meshes of simulated CPU devices (the real use: sharded placement), where
  "model MB" counts every device's shard, replicated parameters included;
- the peer, `transformers.AutoModelForCausalLM.from_pretrained(dir, dtype=<stored dtype>)`,
  once as is and once followed by one read of every weight (see `child_transformers`).
The peak is exact whenever loading raised the process's high-water mark (`ru_maxrss`);
otherwise (the import peak was higher) it is the highest RSS a 1 ms sampling thread saw. RSS
counts resident pages of mapped files too, so the RSS left after loading is split into the
process's own (anonymous) memory and file-backed pages, each as a change from the baseline.

    python benchmarks/load_memory.py [--layers 12] [--vocab 32768] [--dtype bfloat16]
        [--mesh fsdp=8 fsdp=4,tensor=2]
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

MB = 1024 ** 2


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory() -> dict[str, int]:
    """Resident bytes of this process: all, anonymous (its own) and file-backed (mapped files,
    libraries included), from /proc/self/status."""
    fields, out = {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file"}, {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in fields:
                out[fields[key]] = int(value.split()[0]) * 1024
    return out


class PeakRss:
    """Peak RSS over a `with` block: ru_maxrss when the block raised it, else 1 ms sampling."""

    def __enter__(self):
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed heap would hide new allocations
        self.baseline, self.max_before = memory(), _max_rss_bytes()
        self.sampled = self.baseline["rss"]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.001):
            self.sampled = max(self.sampled, rss_bytes())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        max_after = _max_rss_bytes()
        self.exact = max_after > self.max_before
        self.peak = max_after if self.exact else max(self.sampled, rss_bytes())

    def report(self) -> dict:
        return {"baseline": self.baseline, "peak": self.peak, "exact": self.exact,
                "end": memory()}


def _max_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def parse_mesh(spec: str) -> dict[str, int]:
    """'fsdp=4,tensor=2' -> {'fsdp': 4, 'tensor': 2}."""
    return {k: int(v) for k, v in (part.split("=") for part in spec.split(","))}


def child_generate(args) -> dict:
    """Writes the random-weight HF directory (in a subprocess, so the parent stays small)."""
    from memagent_jax.models.config import ModelConfig
    from memagent_jax.models.loading import random_model, save_hf
    from memagent_jax.models.presets import preset_hf_dict

    hf = dict(preset_hf_dict(args.widths, args.dtype), num_hidden_layers=args.layers,
              vocab_size=args.vocab, tie_word_embeddings=False, bos_token_id=None,
              eos_token_id=None)
    config = ModelConfig.from_hf_dict(hf, source="benchmark config")
    save_hf(random_model(config), config, args.hf_dir)
    return {}


def child_jax(args) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from memagent_jax.models.loading import load_model
    from memagent_jax.models.sharding import make_mesh

    mesh = make_mesh(parse_mesh(args.mesh[0])) if args.mesh else None
    jnp.ones(4).block_until_ready()
    with PeakRss() as rss:
        start = time.perf_counter()
        model, _ = load_model(args.hf_dir, dtype=None, mesh=mesh)
        params = jax.block_until_ready(jax.tree.leaves(nnx.state(model, nnx.Param)))
        seconds = time.perf_counter() - start
    held = sum(s.data.nbytes for p in params for s in p.addressable_shards)
    return dict(rss.report(), seconds=seconds, model_bytes=held)


def child_transformers(args, read: bool) -> dict:
    """from_pretrained maps the safetensors file and returns tensors that view it, so weights
    reach memory only when first used; with `read`, every weight is read once (as the first
    forward pass would) inside the measured block."""
    import torch
    import transformers

    (torch.ones(4) + 1).sum().item()
    with PeakRss() as rss:
        start = time.perf_counter()
        model = transformers.AutoModelForCausalLM.from_pretrained(
            args.hf_dir, dtype=getattr(torch, args.dtype))
        if read:
            for p in model.state_dict().values():
                p.max().item()
        seconds = time.perf_counter() - start
    held = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    return dict(rss.report(), seconds=seconds, model_bytes=held)


CHILDREN = {"generate": child_generate, "jax": child_jax,
            "transformers": functools.partial(child_transformers, read=False),
            "transformers-read": functools.partial(child_transformers, read=True)}


def run_child(role: str, args, mesh: str = "") -> dict:
    """Runs this script as `--child role` in a fresh interpreter; returns its JSON line."""
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    if mesh:
        devices = math.prod(parse_mesh(mesh).values())
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "")
                            + f" --xla_force_host_platform_device_count={devices}").strip()
    cmd = [sys.executable, __file__, "--child", role, "--hf-dir", args.hf_dir,
           "--widths", args.widths, "--layers", str(args.layers), "--vocab", str(args.vocab),
           "--dtype", args.dtype, "--mesh", *([mesh] if mesh else [])]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def tensor_sizes(hf_dir: str) -> dict:
    """Bytes of the model, and (name, bytes) of its largest tensor (our parameters are the HF
    tensors, reshaped)."""
    from memagent_jax.models.hf_checkpoint import scan_weights

    infos = scan_weights(hf_dir)
    hf = {name: math.prod(i.shape) * i.dtype.itemsize for name, i in infos.items()}
    return {"model": sum(hf.values()), "largest": max(hf.items(), key=lambda kv: kv[1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--widths", default="qwen2.5-0.5b", help="preset giving the widths")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=32768)
    parser.add_argument("--dtype", default="bfloat16", help="stored (and loaded) dtype")
    parser.add_argument("--mesh", nargs="*", default=["fsdp=8", "fsdp=4,tensor=2"],
                        help="meshes for sharded loads (axis=size,...), each on that many "
                        "simulated CPU devices")
    parser.add_argument("--workdir", default=None, help="where the HF directory is written "
                        "(in a temporary directory, deleted at the end)")
    parser.add_argument("--child", choices=CHILDREN, help=argparse.SUPPRESS)
    parser.add_argument("--hf-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(CHILDREN[args.child](args)))
        return

    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        args.hf_dir = os.path.join(tmp, "hf")
        run_child("generate", args)
        sizes = tensor_sizes(args.hf_dir)
        cases = [("memagent_jax load_model, 1 device", "jax", "")]
        cases += [(f"memagent_jax load_model, mesh {mesh}", "jax", mesh) for mesh in args.mesh]
        cases += [("transformers from_pretrained", "transformers", ""),
                  ("transformers from_pretrained + read all", "transformers-read", "")]
        results = [(label, run_child(role, args, mesh)) for label, role, mesh in cases]

    hf_name, hf_bytes = sizes["largest"]
    print(f"model: {args.widths} widths, {args.layers} layers, vocab {args.vocab}, {args.dtype}: "
          f"{sizes['model'] / MB:.1f} MB")
    print(f"largest tensor: {hf_name} {hf_bytes / MB:.1f} MB")
    print(f"{'loader':<45} {'model MB':>8} {'peak dMB':>8} {'anon dMB':>8} {'file dMB':>8} "
          f"{'load s':>6} {'ratio':>6}")
    for label, r in results:
        delta = r["peak"] - r["baseline"]["rss"]
        end = {k: (r["end"][k] - r["baseline"][k]) / MB for k in ("anon", "file")}
        print(f"{label:<45} {r['model_bytes'] / MB:>8.1f} {delta / MB:>8.1f} "
              f"{end['anon']:>8.1f} {end['file']:>8.1f} {r['seconds']:>6.2f} "
              f"{delta / (r['model_bytes'] + hf_bytes):>6.2f}"
              f"{'' if r['exact'] else '  (peak sampled)'}")
    print("peak dMB: peak RSS over the baseline; anon/file dMB: RSS after loading, over the "
          "baseline.\nratio = peak dMB / (model MB + largest tensor), goal <= 1.25.")


if __name__ == "__main__":
    main()
