"""Qwen2 / Qwen2.5 decoder in Flax NNX, with the layers' weights stacked and run by a scan.

Stacking every decoder layer's weights along a leading `layers` axis and running one
`jax.lax.scan` keeps the compiled program the size of one layer, so compile time does not grow
with depth (80 layers for Qwen2.5-72B).

Two entry points share the layer code:
- `model(input_ids, attention_mask)`: a whole (left- or right-padded) batch, no cache;
- `model.forward_cached(input_ids, positions, cache)`: tokens at given positions, whose keys and
  values are written into a KV cache at those positions (prefill: T tokens; decode: T = 1).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from memagent_jax.models.attention import attend, attend_causal, attend_fused
from memagent_jax.models.config import ModelConfig
from memagent_jax.models.rope import apply_rope, inverse_frequencies


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """shape(config) of one parameter, and a logical axis name (or None) per dimension."""
    shape: Callable[[ModelConfig], tuple[int, ...]]
    axes: tuple[str | None, ...]


# One decoder layer; stored stacked as [num_layers, *shape] under `layers/`.
LAYER_PARAMS = {
    "attn_norm": ParamSpec(lambda c: (c.hidden_size,), (None,)),
    "q_kernel": ParamSpec(lambda c: (c.hidden_size, c.num_heads, c.head_dim),
                          ("embed", "heads", None)),
    "q_bias": ParamSpec(lambda c: (c.num_heads, c.head_dim), ("heads", None)),
    "k_kernel": ParamSpec(lambda c: (c.hidden_size, c.num_kv_heads, c.head_dim),
                          ("embed", "kv_heads", None)),
    "k_bias": ParamSpec(lambda c: (c.num_kv_heads, c.head_dim), ("kv_heads", None)),
    "v_kernel": ParamSpec(lambda c: (c.hidden_size, c.num_kv_heads, c.head_dim),
                          ("embed", "kv_heads", None)),
    "v_bias": ParamSpec(lambda c: (c.num_kv_heads, c.head_dim), ("kv_heads", None)),
    "o_kernel": ParamSpec(lambda c: (c.num_heads, c.head_dim, c.hidden_size),
                          ("heads", None, "embed")),
    "mlp_norm": ParamSpec(lambda c: (c.hidden_size,), (None,)),
    "gate_kernel": ParamSpec(lambda c: (c.hidden_size, c.intermediate_size), ("embed", "mlp")),
    "up_kernel": ParamSpec(lambda c: (c.hidden_size, c.intermediate_size), ("embed", "mlp")),
    "down_kernel": ParamSpec(lambda c: (c.intermediate_size, c.hidden_size), ("mlp", "embed")),
}
TOP_PARAMS = {
    "embed": ParamSpec(lambda c: (c.vocab_size, c.hidden_size), ("vocab", "embed")),
    "final_norm": ParamSpec(lambda c: (c.hidden_size,), (None,)),
    "lm_head": ParamSpec(lambda c: (c.hidden_size, c.vocab_size), ("embed", "vocab")),
}


def param_specs(config: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple[str | None, ...]]]:
    """Every parameter of the model: 'path' -> (shape, logical axes), in HF checkpoint order."""
    specs = {"embed": TOP_PARAMS["embed"]}
    specs.update({f"layers/{n}": ParamSpec(s.shape, ("layers",) + s.axes)
                  for n, s in LAYER_PARAMS.items()})
    specs["final_norm"] = TOP_PARAMS["final_norm"]
    if not config.tie_word_embeddings:
        specs["lm_head"] = TOP_PARAMS["lm_head"]
    out = {}
    for path, spec in specs.items():
        shape = spec.shape(config)
        if path.startswith("layers/"):
            shape = (config.num_layers,) + shape
        out[path] = (shape, spec.axes)
    return out


class KVCache(NamedTuple):
    """Keys and values of every layer: k, v [L, B, S, Hkv, D]. Entry s holds position s."""
    k: jnp.ndarray
    v: jnp.ndarray

    @classmethod
    def zeros(cls, config: ModelConfig, batch: int, length: int, dtype=jnp.float32) -> KVCache:
        shape = (config.num_layers, batch, length, config.num_kv_heads, config.head_dim)
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))


class DecoderLayers(nnx.Module):
    """All decoder layers' weights, each stacked to [num_layers, ...]."""

    def __init__(self, config: ModelConfig, param_dtype, rngs: nnx.Rngs):
        for name, (shape, _) in param_specs(config).items():
            if name.startswith("layers/"):
                name = name.removeprefix("layers/")
                setattr(self, name, nnx.Param(_init(name, shape, param_dtype, rngs)))

    def stacked(self) -> dict[str, jnp.ndarray]:
        return {name: getattr(self, name)[...] for name in LAYER_PARAMS}


# "xla": the reference einsum attention; "dot_product": jax.nn.dot_product_attention with the
# implementation JAX picks; "cudnn": forced cuDNN flash attention (GPU, bf16/fp16 only).
ATTENTION_IMPLEMENTATIONS = {"xla": None, "dot_product": None, "cudnn": "cudnn"}


class Qwen2(nnx.Module):
    """Qwen2 causal LM. `dtype` is the compute dtype, `param_dtype` the storage dtype,
    `attention` one of ATTENTION_IMPLEMENTATIONS (the fused ones serve the KV-cache path)."""

    def __init__(self, config: ModelConfig, *, dtype=jnp.float32, param_dtype=jnp.float32,
                 attention: str = "xla", rngs: nnx.Rngs):
        if attention not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(f"attention must be one of {list(ATTENTION_IMPLEMENTATIONS)}, "
                             f"got {attention!r}")
        self.config = config
        self.dtype = jnp.dtype(dtype)
        self.attention = attention
        specs = param_specs(config)
        self.embed = nnx.Param(_init("embed", specs["embed"][0], param_dtype, rngs))
        self.layers = DecoderLayers(config, param_dtype, rngs)
        self.final_norm = nnx.Param(_init("final_norm", specs["final_norm"][0], param_dtype, rngs))
        if not config.tie_word_embeddings:
            self.lm_head = nnx.Param(_init("lm_head", specs["lm_head"][0], param_dtype, rngs))

    def __call__(self, input_ids: jnp.ndarray, attention_mask: jnp.ndarray | None = None, *,
                 remat: bool = False):
        """input_ids [B, T] int; attention_mask [B, T] (1 = token, 0 = padding, on either side).

        Positions count real tokens only, so a padded row gives the logits the same sequence
        would give unpadded. Without a mask every row runs causally from position 0 on the
        blocked attention path (right-padded rows may pass None too: padding after a token never
        affects it). remat: under differentiation, keep only each layer's input and recompute
        the rest of the layer in the backward (training memory; the values are the same).
        Returns logits [B, T, V] float32 (rows at padding are meaningless).
        """
        b, t = input_ids.shape
        if attention_mask is None:
            positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
            hidden, _ = self._layers(input_ids, positions, None, None, remat)
            return self.logits(hidden)
        mask = attention_mask.astype(bool)
        positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
        causal = jnp.tril(jnp.ones((t, t), bool))
        hidden, _ = self._layers(input_ids, positions, causal[None] & mask[:, None, :], None,
                                 remat)
        return self.logits(hidden)

    def forward_cached(self, input_ids: jnp.ndarray, positions: jnp.ndarray, cache: KVCache,
                       logits_index: jnp.ndarray | None = None):
        """Runs input_ids [B, T] at positions [B, T], attending to cache entries <= position.

        Each token's key/value is written at cache index = its position, so a prefill writes
        0..T-1 (padding after the prompt lands beyond it and is overwritten by later decode
        steps before any query can see it) and a decode step writes one entry per row.
        logits_index [B]: return only the logits at that index of each row ([B, V]), which
        spares a long prefill the [B, T, V] tensor.
        Returns (logits [B, T, V] or [B, V] float32, updated cache).
        """
        length = cache.k.shape[2]
        # T == length: the prompt fills the cache from 0, a causal prefill.
        mask = (None if input_ids.shape[1] == length
                else jnp.arange(length)[None, None, :] <= positions[:, :, None])
        hidden, cache = self._layers(input_ids, positions, mask, cache)
        if logits_index is not None:
            hidden = jnp.take_along_axis(hidden, logits_index[:, None, None], axis=1)
            return self.logits(hidden)[:, 0], cache
        return self.logits(hidden), cache

    def logits(self, hidden: jnp.ndarray) -> jnp.ndarray:
        """hidden [B, T, D] (after the final norm) -> logits [B, T, V] float32."""
        if self.config.tie_word_embeddings:
            return jnp.einsum("btd,vd->btv", hidden, self.embed[...].astype(self.dtype),
                              preferred_element_type=jnp.float32)
        return jnp.einsum("btd,dv->btv", hidden, self.lm_head[...].astype(self.dtype),
                          preferred_element_type=jnp.float32)

    def _layers(self, input_ids, positions, mask, cache: KVCache | None, remat: bool = False):
        """The decoder stack: mask [B, T, S] bool, or None for causal attention from position
        0 (T == S), which takes the blocked path and never builds a [T, S] mask or scores.
        remat: checkpoint each scanned layer (see __call__)."""
        config, dtype = self.config, self.dtype
        inv_freq, attention_factor = _rope_constants(config)
        x = jnp.take(self.embed[...], input_ids, axis=0).astype(dtype)
        batch_index = jnp.arange(input_ids.shape[0])[:, None]
        t = input_ids.shape[1]
        # The fused kernels express a prefill from 0 filling the cache, or single-token steps.
        fused = (self.attention != "xla" and cache is not None
                 and t in (1, cache.k.shape[2]))

        def layer(carry, p):
            # The cache rides in the carry and each layer writes its new entries in place: as a
            # scanned input and output it would be copied whole on every call (the stacked
            # output starts as a fresh buffer that the loop fills layer by layer).
            x, i, k_all, v_all = carry
            p = jax.tree.map(lambda a: a.astype(dtype), p)
            h = rms_norm(x, p["attn_norm"], config.rms_norm_eps)
            q = jnp.einsum("btd,dhk->bthk", h, p["q_kernel"]) + p["q_bias"]
            k = jnp.einsum("btd,dhk->bthk", h, p["k_kernel"]) + p["k_bias"]
            v = jnp.einsum("btd,dhk->bthk", h, p["v_kernel"]) + p["v_bias"]
            q = apply_rope(q, positions, inv_freq, attention_factor)
            k = apply_rope(k, positions, inv_freq, attention_factor)
            if k_all is not None:
                k_all = k_all.at[i, batch_index, positions].set(k.astype(k_all.dtype))
                v_all = v_all.at[i, batch_index, positions].set(v.astype(v_all.dtype))
                k = jax.lax.dynamic_index_in_dim(k_all, i, keepdims=False).astype(dtype)
                v = jax.lax.dynamic_index_in_dim(v_all, i, keepdims=False).astype(dtype)
            if fused:
                out = attend_fused(q, k, v, causal=t > 1, kv_lengths=positions[:, -1] + 1,
                                   implementation=ATTENTION_IMPLEMENTATIONS[self.attention])
            elif mask is None:
                out = attend_causal(q, k, v)
            else:
                out = attend(q, k, v, mask)
            x = x + jnp.einsum("bthk,hkd->btd", out, p["o_kernel"])
            h = rms_norm(x, p["mlp_norm"], config.rms_norm_eps)
            gated = jax.nn.silu(h @ p["gate_kernel"]) * (h @ p["up_kernel"])
            x = x + gated @ p["down_kernel"]
            return (x, i + 1, k_all, v_all), None

        if remat:
            # Save nothing but the carry (the layer's input [B, T, D]): the backward reruns the
            # layer's forward (up to a third more compute) and the activations held across the
            # stack shrink to one [B, T, D] per layer. Saving the matmul outputs instead
            # (dots_with_no_batch_dims_saveable) would keep the two [B, T, intermediate] MLP
            # projections, most of what there is to save. prevent_cse=False: the scan already
            # keeps XLA from merging the recomputation into the forward.
            layer = jax.checkpoint(layer, policy=jax.checkpoint_policies.nothing_saveable,
                                   prevent_cse=False)
        kv = (None, None) if cache is None else (cache.k, cache.v)
        (x, _, k_all, v_all), _ = jax.lax.scan(layer, (x, jnp.int32(0)) + kv,
                                               self.layers.stacked())
        x = rms_norm(x, self.final_norm[...].astype(dtype), config.rms_norm_eps)
        return x, (None if cache is None else KVCache(k_all, v_all))


def rms_norm(x: jnp.ndarray, weight: jnp.ndarray, eps: float) -> jnp.ndarray:
    """RMSNorm over the last axis, normalising in float32 as transformers' Qwen2RMSNorm."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight * normed.astype(x.dtype)


@functools.lru_cache(maxsize=32)
def _rope_constants(config: ModelConfig):
    return inverse_frequencies(config)


def _init(name: str, shape: tuple[int, ...], dtype, rngs: nnx.Rngs) -> jnp.ndarray:
    """Random initial weights: norms at 1, everything else N(0, 0.02)."""
    if name.endswith("norm"):
        return jnp.ones(shape, dtype)
    return (0.02 * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
