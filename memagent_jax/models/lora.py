"""Low-rank adapters (LoRA) on the Qwen parameter tree, and PEFT's adapter files.

An adapter of a kernel W (`qwen.Params`; [in..., out...], `mapping.Row.in_dims` input axes)
is a pair A [in..., r], B [r, out...]; the adapted kernel is W + scale A B, scale = alpha / r
(PEFT's, without rsLoRA). The adapters of a model (`Adapters`) mirror the parameter tree:

    {"layers": {0: {"attn": {"q_kernel": {"a": [D, r], "b": [r, Hq, K]}, ...,
                             "o_kernel": {"a": [Hq, K, r], "b": [r, D]}},
                    "mlp": {"gate_kernel": {"a": [D, r], "b": [r, F]}, ...}},
                1: ...}}

A and B carry their kernel's logical axes (A the input axes, B the output axes, the rank
axis replicated), so they shard along their base weight on every mesh (`adapter_shardings`).
The model always runs merged weights (`merge`): the learner merges inside its jitted step (the
gradient reaches A and B through the sum), the engine decodes a merged copy, and loading an
adapter onto a base merges it once. On disk, an adapter is PEFT's: adapter_config.json and
adapter_model.safetensors with tensors `base_model.model.model.layers.N.self_attn.q_proj.
lora_A.weight` [r, in] and `...lora_B.weight` [out, r] (`write_peft`, `read_peft`).
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from memagent_jax.distributed import collectives
from memagent_jax.errors import UserError
from memagent_jax.fileutil import atomic_directory
from memagent_jax.models import mapping, safetensors_io
from memagent_jax.models.config import ModelConfig
from memagent_jax.models.lora_config import (
    ADAPTER_CONFIG,
    PEFT_MODULES,
    LoraConfig,
    is_adapter_dir,
)
from memagent_jax.models.qwen import Params, param_specs
from memagent_jax.models.sharding import partition_spec

Adapters = dict[str, Any]
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PEFT_PREFIX = "base_model.model."
_PEFT_KEY = re.compile(r"base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\."
                       r"(\w+)\.lora_([AB])\.weight")


def target_rows(config: ModelConfig, targets) -> dict[str, mapping.Row]:
    """{short name ("q"): its mapping row} of the projections `targets` names."""
    by_module = {row.hf.split(".")[-2]: row for row in mapping.rows(config)
                 if row.kind == "linear" and "{i}" in row.ours}
    return {t: by_module[PEFT_MODULES[t]] for t in targets}


def _kernel_path(row: mapping.Row) -> tuple[str, str]:
    """("attn", "q_kernel") from "layers/{i}/attn/q_kernel"."""
    block, name = row.ours.split("/")[2:]
    return block, name


def adapter_specs(config: ModelConfig, lora: LoraConfig) -> Adapters:
    """Every adapter matrix as (shape, logical axes), in the `Adapters` tree."""
    specs = param_specs(config)
    layers: dict[int, dict] = {}
    for i in range(config.num_layers):
        layer: dict[str, dict] = {}
        for row in target_rows(config, lora.targets).values():
            block, name = _kernel_path(row)
            shape, axes = specs["layers"][i][block][name]
            n = row.in_dims
            layer.setdefault(block, {})[name] = {
                "a": (tuple(shape[:n]) + (lora.rank,), tuple(axes[:n]) + (None,)),
                "b": ((lora.rank,) + tuple(shape[n:]), (None,) + tuple(axes[n:]))}
        layers[i] = layer
    return {"layers": layers}


def adapter_shardings(config: ModelConfig, lora: LoraConfig,
                      mesh: jax.sharding.Mesh | None) -> Adapters:
    """Each adapter matrix's sharding: its kernel's axes by the learner's rules on `mesh`
    (None: the default device)."""
    def sharding(spec):
        if mesh is None:
            return jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return jax.sharding.NamedSharding(mesh, partition_spec(spec[0], spec[1], mesh))
    return jax.tree.map(sharding, adapter_specs(config, lora), is_leaf=_is_spec)


def abstract_adapters(config: ModelConfig, lora: LoraConfig,
                      mesh: jax.sharding.Mesh | None = None) -> Adapters:
    """The adapters as float32 ShapeDtypeStructs on their shardings (what a restore reads
    onto; an abstract learner's)."""
    return jax.tree.map(lambda spec, sharding: jax.ShapeDtypeStruct(spec[0], jnp.float32,
                                                                    sharding=sharding),
                        adapter_specs(config, lora), adapter_shardings(config, lora, mesh),
                        is_leaf=_is_spec)


def init_adapters(config: ModelConfig, lora: LoraConfig, seed: int,
                  mesh: jax.sharding.Mesh | None = None) -> Adapters:
    """Fresh float32 adapters, placed on `adapter_shardings`: A uniform in +-1/sqrt(fan_in)
    (PEFT's Kaiming-uniform default), B zero, so the adapted model starts as the base."""
    specs = adapter_specs(config, lora)
    leaves, tree = jax.tree.flatten(specs, is_leaf=_is_spec)
    keys = jax.random.split(jax.random.key(seed), len(leaves))

    def draw(key, spec, is_a):
        shape = spec[0]
        if not is_a:
            return jnp.zeros(shape, jnp.float32)
        bound = 1 / math.sqrt(math.prod(shape[:-1]))
        return jax.random.uniform(key, shape, jnp.float32, -bound, bound)

    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(specs, is_leaf=_is_spec)[0]]
    values = [draw(k, s, p[-1].key == "a") for k, s, p in zip(keys, leaves, paths)]
    return jax.device_put(jax.tree.unflatten(tree, values),
                          adapter_shardings(config, lora, mesh))


def merge(params: Params, adapters: Adapters, scale: float, dtype=None) -> Params:
    """params with every adapted kernel W replaced by W + scale A B (summed in float32, then
    cast to `dtype`, default W's own); the rest of the tree as it is. Traceable."""
    out = dict(params)
    out["layers"] = dict(params["layers"])
    for i, layer_adapters in adapters["layers"].items():
        layer = dict(out["layers"][i])
        for block, kernels in layer_adapters.items():
            layer[block] = dict(layer[block])
            for name, ab in kernels.items():
                w = layer[block][name]
                d = jnp.tensordot(ab["a"], ab["b"], axes=1, precision=jax.lax.Precision.HIGHEST,
                                  preferred_element_type=jnp.float32)
                layer[block][name] = (w.astype(jnp.float32) + scale * d).astype(dtype or w.dtype)
        out["layers"][i] = layer
    return out


def merged(params: Params, adapters: Adapters, scale: float, dtype=None) -> Params:
    """`merge` computed once, on the devices: each weight on its sharding in `params`."""
    shardings = jax.tree.map(lambda x: x.sharding, params)
    return jax.jit(merge, static_argnums=(2, 3), out_shardings=shardings)(
        params, adapters, scale, None if dtype is None else jnp.dtype(dtype))


# ---- PEFT files ---------------------------------------------------------------------------

def write_peft(adapters: Adapters, config: ModelConfig, lora: LoraConfig, out_dir: str,
               base_model: str | None = None) -> None:
    """PEFT's adapter directory (module docstring), loadable by `peft.PeftModel.from_pretrained`
    on the base; all or nothing. base_model: the base's path or hub name, for
    adapter_config.json's base_model_name_or_path. In a multi-process job every process calls
    it (the gathers are collective) and process 0 writes."""
    rows = target_rows(config, lora.targets)
    host = jax.tree.map(collectives.to_host, adapters)
    tensors = []
    for i in range(config.num_layers):
        for row in rows.values():
            block, name = _kernel_path(row)
            a = np.asarray(host["layers"][i][block][name]["a"])
            b = np.asarray(host["layers"][i][block][name]["b"])
            stem = _PEFT_PREFIX + row.hf.format(i=i).removesuffix(".weight")
            a_hf = np.ascontiguousarray(a.reshape(-1, lora.rank).T)
            b_hf = np.ascontiguousarray(b.reshape(lora.rank, -1).T)
            tensors += [(f"{stem}.lora_A.weight", a_hf), (f"{stem}.lora_B.weight", b_hf)]
    adapter_config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.rank,
        "lora_alpha": lora.alpha, "target_modules": sorted(PEFT_MODULES[t] for t in lora.targets),
        "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False, "use_rslora": False,
        "use_dora": False, "inference_mode": True, "init_lora_weights": True,
        "base_model_name_or_path": base_model, "modules_to_save": None}
    with atomic_directory(out_dir) as tmp:
        if not collectives.is_main():
            return
        safetensors_io.write_file(os.path.join(tmp, ADAPTER_WEIGHTS), [
            (key, t.dtype, t.shape, functools.partial(np.asarray, t)) for key, t in tensors])
        with open(os.path.join(tmp, ADAPTER_CONFIG), "w") as f:
            json.dump(adapter_config, f, indent=2, sort_keys=True)


def read_peft(path: str, config: ModelConfig) -> tuple[LoraConfig, Adapters]:
    """A PEFT LoRA adapter directory for `config`'s model -> (its LoraConfig, its adapters as
    float32 NumPy arrays in our layout). What this model cannot run as PEFT would (DoRA,
    per-module ranks, other module names, shapes of another model) is a UserError naming the
    file and the setting."""
    config_file = os.path.join(path, ADAPTER_CONFIG)
    weights_file = os.path.join(path, ADAPTER_WEIGHTS)
    if not is_adapter_dir(path):
        raise UserError(f"{config_file}: not found (not a PEFT adapter directory)")
    try:
        with open(config_file) as f:
            settings = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{config_file}: unreadable ({e})") from None
    if settings.get("peft_type") != "LORA":
        raise UserError(f"{config_file}: peft_type {settings.get('peft_type')!r} is not LORA")
    for key, fine in (("use_dora", False), ("use_rslora", False), ("bias", "none"),
                      ("fan_in_fan_out", False)):
        if settings.get(key, fine) != fine:
            raise UserError(f"{config_file}: {key} {settings[key]!r} is not supported "
                            f"(only {fine!r})")
    for key in ("rank_pattern", "alpha_pattern", "modules_to_save"):
        if settings.get(key):
            raise UserError(f"{config_file}: {key} is not supported (one rank and alpha for "
                            "every module, no fully trained modules)")
    rank, alpha = settings.get("r"), settings.get("lora_alpha")
    if not isinstance(rank, int) or rank < 1 or not isinstance(alpha, (int, float)):
        raise UserError(f"{config_file}: needs an integer r >= 1 and a number lora_alpha, got "
                        f"r {rank!r}, lora_alpha {alpha!r}")
    infos = safetensors_io.read_header(weights_file)
    short = {module: t for t, module in PEFT_MODULES.items()}
    found: dict[tuple[int, str, str], np.ndarray] = {}
    for key, info in infos.items():
        match = _PEFT_KEY.fullmatch(key)
        if not match or match.group(3) not in short:
            raise UserError(f"{weights_file}: tensor '{key}' is no LoRA matrix of a Qwen "
                            f"projection ({', '.join(PEFT_MODULES.values())})")
        layer = int(match.group(1))
        if layer >= config.num_layers:
            raise UserError(f"{weights_file}: tensor '{key}' names layer {layer}; the base "
                            f"has {config.num_layers}")
        found[(layer, short[match.group(3)], match.group(4))] = info.read()
    if not found:
        raise UserError(f"{weights_file}: holds no LoRA matrix")
    targets = tuple(t for t in PEFT_MODULES if any(k[1] == t for k in found))
    lora = LoraConfig(rank=rank, alpha=float(alpha), targets=targets)
    specs = adapter_specs(config, lora)
    rows = target_rows(config, targets)
    layers: dict[int, dict] = {}
    for i in range(config.num_layers):
        for t, row in rows.items():
            block, name = _kernel_path(row)
            spec = specs["layers"][i][block][name]
            pair = {}
            for side, hf_side in (("a", "A"), ("b", "B")):
                tensor = found.get((i, t, hf_side))
                shape = spec[side][0]
                stem = _PEFT_PREFIX + row.hf.format(i=i).removesuffix(".weight")
                if tensor is None:
                    raise UserError(f"{weights_file}: '{stem}.lora_{hf_side}.weight' is "
                                    "missing (every layer's adapted projections are needed)")
                expected = ((rank, math.prod(shape[:-1])) if side == "a"
                            else (math.prod(shape[1:]), rank))
                if tensor.shape != expected:
                    raise UserError(f"{weights_file}: '{stem}.lora_{hf_side}.weight' has shape "
                                    f"{list(tensor.shape)}, this base needs {list(expected)}")
                pair[side] = np.asarray(tensor, np.float32).T.reshape(shape)
            layers.setdefault(i, {}).setdefault(block, {})[name] = pair
    return lora, {"layers": layers}


def merge_peft(params: Params, config: ModelConfig, path: str) -> Params:
    """params with the PEFT adapter at `path` merged in, each weight in its dtype and on its
    sharding (the adapter placed along it first)."""
    lora, adapters = read_peft(path, config)
    sharding = getattr(params["embed"], "sharding", None)
    mesh = sharding.mesh if isinstance(sharding, jax.sharding.NamedSharding) else None
    mesh = mesh if isinstance(mesh, jax.sharding.Mesh) else None
    adapters = jax.device_put(adapters, adapter_shardings(config, lora, mesh))
    return merged(params, adapters, lora.scale)


def _is_spec(x) -> bool:
    return isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], tuple)
