"""The one table between Hugging Face tensor names and our parameters, used in both directions.

Both sides store each layer separately (HF `model.layers.{i}...`, ours `layers/{i}/...`, the
path of a leaf in the `qwen.Params` tree); HF keeps linear weights as [out, in], we keep kernels
as [in..., out...] with attention heads split out.
Each row says which kind of reshaping links the two layouts:
- "linear": ours [*in, *out] (the first `in_dims` axes are inputs) <-> HF [prod(out), prod(in)];
- "vector": ours [*shape] <-> HF [prod(shape)] (norm weights, biases);
- "same":   identical layouts (the embedding table).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from memagent_jax.models.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Row:
    ours: str          # path in our parameter tree (`flatten`); '{i}' is the layer index
    hf: str            # HF tensor name; '{i}' likewise
    kind: str          # "linear" | "vector" | "same"
    in_dims: int = 1   # for "linear": how many leading axes of ours are inputs
    needs: str = ""    # a ModelConfig flag the tensor exists under ("": always)


TABLE = (
    Row("embed", "model.embed_tokens.weight", "same"),
    Row("layers/{i}/attn_norm", "model.layers.{i}.input_layernorm.weight", "vector"),
    Row("layers/{i}/attn/q_kernel", "model.layers.{i}.self_attn.q_proj.weight", "linear"),
    Row("layers/{i}/attn/q_bias", "model.layers.{i}.self_attn.q_proj.bias", "vector",
        needs="qkv_bias"),
    Row("layers/{i}/attn/k_kernel", "model.layers.{i}.self_attn.k_proj.weight", "linear"),
    Row("layers/{i}/attn/k_bias", "model.layers.{i}.self_attn.k_proj.bias", "vector",
        needs="qkv_bias"),
    Row("layers/{i}/attn/v_kernel", "model.layers.{i}.self_attn.v_proj.weight", "linear"),
    Row("layers/{i}/attn/v_bias", "model.layers.{i}.self_attn.v_proj.bias", "vector",
        needs="qkv_bias"),
    Row("layers/{i}/attn/q_norm", "model.layers.{i}.self_attn.q_norm.weight", "vector",
        needs="qk_norm"),
    Row("layers/{i}/attn/k_norm", "model.layers.{i}.self_attn.k_norm.weight", "vector",
        needs="qk_norm"),
    Row("layers/{i}/attn/o_kernel", "model.layers.{i}.self_attn.o_proj.weight", "linear",
        in_dims=2),
    Row("layers/{i}/mlp_norm", "model.layers.{i}.post_attention_layernorm.weight", "vector"),
    Row("layers/{i}/mlp/gate_kernel", "model.layers.{i}.mlp.gate_proj.weight", "linear"),
    Row("layers/{i}/mlp/up_kernel", "model.layers.{i}.mlp.up_proj.weight", "linear"),
    Row("layers/{i}/mlp/down_kernel", "model.layers.{i}.mlp.down_proj.weight", "linear"),
    Row("final_norm", "model.norm.weight", "vector"),
    Row("lm_head", "lm_head.weight", "linear", needs="untied"),
)
# Tensors some HF checkpoints carry that the model recomputes or shares: skipped on load.
IGNORED_HF_SUFFIXES = (".rotary_emb.inv_freq",)


def rows(config: ModelConfig) -> tuple[Row, ...]:
    """The rows of the tensors `config`'s model has."""
    return tuple(r for r in TABLE if not r.needs or getattr(config, r.needs))


def tensors(config: ModelConfig) -> list[tuple[Row, str, str]]:
    """(row, our path, HF name) of every parameter, in HF order (layer by layer)."""
    layer_rows = [r for r in rows(config) if "{i}" in r.ours]
    out = []
    for row in rows(config):
        if "{i}" not in row.ours:
            out.append((row, row.ours, row.hf))
        elif row is layer_rows[0]:
            out.extend((r, r.ours.format(i=i), r.hf.format(i=i))
                       for i in range(config.num_layers) for r in layer_rows)
    return out


def flatten(params: dict, prefix: str = "") -> dict[str, object]:
    """{'layers': {0: {'attn_norm': x}}} -> {'layers/0/attn_norm': x}."""
    flat = {}
    for key, value in params.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, path + "/"))
        else:
            flat[path] = value
    return flat


def nest(flat: dict[str, object]) -> dict:
    """{'layers/0/attn_norm': x} -> {'layers': {0: {'attn_norm': x}}} (layer indices as ints,
    as in the module's own tree)."""
    tree: dict = {}
    for path, leaf in flat.items():
        *parents, name = [int(p) if p.isdigit() else p for p in path.split("/")]
        node = tree
        for p in parents:
            node = node.setdefault(p, {})
        node[name] = leaf
    return tree


def hf_shape(row: Row, our_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The HF tensor shape of one of our parameters."""
    if row.kind == "linear":
        return (math.prod(our_shape[row.in_dims:]), math.prod(our_shape[:row.in_dims]))
    if row.kind == "vector":
        return (math.prod(our_shape),)
    return tuple(our_shape)


def to_ours(row: Row, tensor: np.ndarray, our_shape: tuple[int, ...]) -> np.ndarray:
    """HF tensor -> our layout."""
    if row.kind == "linear":
        tensor = tensor.T
    return tensor.reshape(our_shape)


def to_hf(row: Row, array: np.ndarray) -> np.ndarray:
    """Our layout -> HF tensor, C-contiguous for writing."""
    flat = array.reshape(hf_shape(row, array.shape)[::-1] if row.kind == "linear"
                         else hf_shape(row, array.shape))
    return np.ascontiguousarray(flat.T if row.kind == "linear" else flat)
