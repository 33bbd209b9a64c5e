"""The one table between Hugging Face tensor names and our parameters, used in both directions.

HF stores each layer separately (`model.layers.{i}...`) and linear weights as [out, in]; we stack
layers on a leading axis and keep kernels as [in..., out...] with attention heads split out.
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
    ours: str          # path in our parameter tree, 'layers/...' for stacked ones
    hf: str            # HF tensor name; '{i}' is the layer index
    kind: str          # "linear" | "vector" | "same"
    in_dims: int = 1   # for "linear": how many leading axes of ours are inputs


TABLE = (
    Row("embed", "model.embed_tokens.weight", "same"),
    Row("layers/attn_norm", "model.layers.{i}.input_layernorm.weight", "vector"),
    Row("layers/q_kernel", "model.layers.{i}.self_attn.q_proj.weight", "linear"),
    Row("layers/q_bias", "model.layers.{i}.self_attn.q_proj.bias", "vector"),
    Row("layers/k_kernel", "model.layers.{i}.self_attn.k_proj.weight", "linear"),
    Row("layers/k_bias", "model.layers.{i}.self_attn.k_proj.bias", "vector"),
    Row("layers/v_kernel", "model.layers.{i}.self_attn.v_proj.weight", "linear"),
    Row("layers/v_bias", "model.layers.{i}.self_attn.v_proj.bias", "vector"),
    Row("layers/o_kernel", "model.layers.{i}.self_attn.o_proj.weight", "linear", in_dims=2),
    Row("layers/mlp_norm", "model.layers.{i}.post_attention_layernorm.weight", "vector"),
    Row("layers/gate_kernel", "model.layers.{i}.mlp.gate_proj.weight", "linear"),
    Row("layers/up_kernel", "model.layers.{i}.mlp.up_proj.weight", "linear"),
    Row("layers/down_kernel", "model.layers.{i}.mlp.down_proj.weight", "linear"),
    Row("final_norm", "model.norm.weight", "vector"),
    Row("lm_head", "lm_head.weight", "linear"),
)
# Tensors some HF checkpoints carry that the model recomputes or shares: skipped on load.
IGNORED_HF_SUFFIXES = (".rotary_emb.inv_freq",)


def rows(config: ModelConfig) -> tuple[Row, ...]:
    return tuple(r for r in TABLE if not (r.ours == "lm_head" and config.tie_word_embeddings))


def hf_names(row: Row, config: ModelConfig) -> list[str]:
    """The HF tensor names behind one of our parameters, one per layer for stacked ones."""
    if row.ours.startswith("layers/"):
        return [row.hf.format(i=i) for i in range(config.num_layers)]
    return [row.hf]


def hf_shape(row: Row, our_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The HF tensor shape for one (per-layer, unstacked) slice of our parameter."""
    if row.kind == "linear":
        return (math.prod(our_shape[row.in_dims:]), math.prod(our_shape[:row.in_dims]))
    if row.kind == "vector":
        return (math.prod(our_shape),)
    return tuple(our_shape)


def to_ours(row: Row, tensor: np.ndarray, our_shape: tuple[int, ...]) -> np.ndarray:
    """HF tensor -> our layout (one layer's slice for stacked parameters)."""
    if row.kind == "linear":
        tensor = tensor.T
    return tensor.reshape(our_shape)


def to_hf(row: Row, array: np.ndarray) -> np.ndarray:
    """Our layout (one layer's slice) -> HF tensor, C-contiguous for writing."""
    flat = array.reshape(hf_shape(row, array.shape)[::-1] if row.kind == "linear"
                         else hf_shape(row, array.shape))
    return np.ascontiguousarray(flat.T if row.kind == "linear" else flat)
