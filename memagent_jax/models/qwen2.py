"""Qwen2 / Qwen2.5 decoder in Flax NNX: one array per layer and weight, three ways to run them.

Parameters live as `layers/{i}/q_kernel` etc. (the per-layer layout of HF checkpoints), and the
model runs them three ways:
- `model(input_ids, attention_mask)`: a whole (left- or right-padded) batch, no cache (training,
  scoring);
- `model.prefill(input_ids, logits_index)`: prompts from position 0, returning every layer's
  keys and values (the engine's prefill);
- `model.decode_step(tokens, positions, cache)`: one token per row against a per-layer KV cache.

The full forward stacks the layers' weights inside the jitted function and runs one
`jax.lax.scan`, so the train step's program is the size of one layer however deep the model
(80 layers for Qwen2.5-72B compile as fast as 2); the stack is one more copy of the weights in
the compute dtype per call, small beside the work of a batch of long rows.
Prefill and decode loop over the layers in Python instead, each layer's matmuls reading its
weights where they lie and each layer's cache its own buffer, updated in place. A scan copies
every layer's slice of the stacked weights (dynamic-slice) before its matmuls read it, on
XLA:CPU and XLA:GPU alike: decoding, bound by memory bandwidth, paid about 2.4x the bytes, and
a short prefill of a 0.5B model on a CPU paid 0.45 s of copies (and page faults on the
freshly stacked buffer) per call, 5x its work at 32 tokens (BENCHMARKS.md). The price: their
compile time grows with depth (the decode step once per engine, the prefill once per bucket
used; benchmarks/compile_time.py).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from memagent_jax.models.attention import attend, attend_cache, attend_causal, attend_fused
from memagent_jax.models.config import ModelConfig
from memagent_jax.models.rope import apply_rope, inverse_frequencies


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """shape(config) of one parameter, and a logical axis name (or None) per dimension."""
    shape: Callable[[ModelConfig], tuple[int, ...]]
    axes: tuple[str | None, ...]


# One decoder layer's weights, stored per layer under `layers/{i}/`.
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
    for i in range(config.num_layers):
        specs.update({f"layers/{i}/{name}": spec for name, spec in LAYER_PARAMS.items()})
    specs["final_norm"] = TOP_PARAMS["final_norm"]
    if not config.tie_word_embeddings:
        specs["lm_head"] = TOP_PARAMS["lm_head"]
    return {path: (spec.shape(config), spec.axes) for path, spec in specs.items()}


class KVCache(NamedTuple):
    """Keys and values, one head-major buffer per layer: k[i] [B, Hkv, D, S] (keys stored
    transposed), v[i] [B, Hkv, S, D]; entry s holds position s of its row. Both decode products
    then read the cache as a plain [D, S] or [S, D] right operand (see `attend_cache`)."""
    k: tuple[jnp.ndarray, ...]
    v: tuple[jnp.ndarray, ...]

    @classmethod
    def zeros(cls, config: ModelConfig, batch: int, length: int, dtype=jnp.float32) -> KVCache:
        h, d, layers = config.num_kv_heads, config.head_dim, config.num_layers
        return cls(tuple(jnp.zeros((batch, h, d, length), dtype) for _ in range(layers)),
                   tuple(jnp.zeros((batch, h, length, d), dtype) for _ in range(layers)))

    @property
    def length(self) -> int:
        return self.v[0].shape[2]

    def write_prefix(self, keys, values, row) -> KVCache:
        """Puts a prefill's keys and values (per layer [R, T, Hkv, D], as `Qwen2.prefill`
        returns them) at positions 0..T-1 of rows row..row+R-1 (row may be traced)."""
        def put(layer, new, transpose):
            new = new.transpose(transpose).astype(layer.dtype)
            return jax.lax.dynamic_update_slice(layer, new, (row, 0, 0, 0))
        return KVCache(tuple(put(c, k, (0, 2, 3, 1)) for c, k in zip(self.k, keys)),
                       tuple(put(c, v, (0, 2, 1, 3)) for c, v in zip(self.v, values)))


class DecoderLayer(nnx.Module):
    """One decoder layer's weights (LAYER_PARAMS)."""

    def __init__(self, config: ModelConfig, param_dtype, rngs: nnx.Rngs):
        for name, spec in LAYER_PARAMS.items():
            setattr(self, name, nnx.Param(_init(name, spec.shape(config), param_dtype, rngs)))

    def weights(self, dtype) -> dict[str, jnp.ndarray]:
        return {name: getattr(self, name)[...].astype(dtype) for name in LAYER_PARAMS}


# The attention of rows run from position 0 (the prefill, and the unmasked full forward that
# training runs). "xla": the blocked causal kernel of attention.py; "dot_product":
# jax.nn.dot_product_attention with the implementation JAX picks; "cudnn": forced cuDNN flash
# attention, forward and gradient (GPU, bf16/fp16 only).
ATTENTION_IMPLEMENTATIONS = {"xla": None, "dot_product": None, "cudnn": "cudnn"}

# attention(q [B, T, Hq, D], k, v [B, T, Hkv, D]) -> (out [B, T, Hq, D], what the layer returns
# beside its output: nothing, the layer's keys and values, or its updated cache).
Attention = Callable[[jnp.ndarray, jnp.ndarray, jnp.ndarray], tuple[jnp.ndarray, object]]


class Qwen2(nnx.Module):
    """Qwen2 causal LM. `dtype` is the compute dtype, `param_dtype` the storage dtype,
    `attention` one of ATTENTION_IMPLEMENTATIONS (for the prefill and the unmasked forward)."""

    def __init__(self, config: ModelConfig, *, dtype=jnp.float32, param_dtype=jnp.float32,
                 attention: str = "xla", rngs: nnx.Rngs):
        if attention not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(f"attention must be one of {list(ATTENTION_IMPLEMENTATIONS)}, "
                             f"got {attention!r}")
        self.config = config
        self.dtype = jnp.dtype(dtype)
        self.attention = attention
        self.embed = nnx.Param(_init("embed", TOP_PARAMS["embed"].shape(config), param_dtype,
                                     rngs))
        self.layers = nnx.List([DecoderLayer(config, param_dtype, rngs)
                                for _ in range(config.num_layers)])
        self.final_norm = nnx.Param(_init("final_norm", TOP_PARAMS["final_norm"].shape(config),
                                          param_dtype, rngs))
        if not config.tie_word_embeddings:
            self.lm_head = nnx.Param(_init("lm_head", TOP_PARAMS["lm_head"].shape(config),
                                           param_dtype, rngs))

    def __call__(self, input_ids: jnp.ndarray, attention_mask: jnp.ndarray | None = None, *,
                 remat: bool = False):
        """input_ids [B, T] int; attention_mask [B, T] (1 = token, 0 = padding, on either side).

        Positions count real tokens only, so a padded row gives the logits the same sequence
        would give unpadded. Without a mask every row runs causally from position 0 with the
        configured attention (right-padded rows may pass None too: padding after a token never
        affects it); its "xla" and "cudnn" kernels never build a [T, T] mask or scores, in the
        gradient either. With a mask, the reference path (`attend`). remat: under differentiation,
        keep only each layer's input and recompute the rest of the layer in the backward
        (training memory; the values are the same).
        Returns logits [B, T, V] float32 (rows at padding are meaningless).
        """
        b, t = input_ids.shape
        if attention_mask is None:
            positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
            return self.logits(self._scan(input_ids, positions, self._causal_attention(), remat))
        mask = attention_mask.astype(bool)
        positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
        visible = jnp.tril(jnp.ones((t, t), bool))[None] & mask[:, None, :]
        return self.logits(self._scan(input_ids, positions,
                                      lambda q, k, v: attend(q, k, v, visible), remat))

    def prefill(self, input_ids: jnp.ndarray, logits_index: jnp.ndarray):
        """Runs prompts from position 0: input_ids [B, T] (right padding is harmless: it comes
        after every real token); logits_index [B]: the position whose logits to return (each
        row's last prompt token), which spares a long prefill the [B, T, V] tensor.
        Returns (logits [B, V] float32, keys, values: per layer [B, T, Hkv, D] in the compute
        dtype)."""
        b, t = input_ids.shape
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        causal = self._causal_attention()

        def attention(q, k, v):
            return causal(q, k, v), (k, v)

        x, kv = self._each_layer(input_ids, positions, [attention] * len(self.layers))
        x = jnp.take_along_axis(x, logits_index[:, None, None], axis=1)
        return self.row_logits(x[:, 0]), tuple(k for k, _ in kv), tuple(v for _, v in kv)

    def decode_step(self, tokens: jnp.ndarray, positions: jnp.ndarray, cache: KVCache):
        """tokens, positions [B] int32: each row's next token and its position. Its key and
        value are written at cache entry `position` (in place when the cache is donated) and it
        attends to the entries up to it, on the XLA path whatever `attention` says: the fused
        kernels take [B, S, Hkv, D] keys, and the head-major cache would be transposed for them
        in every layer of every step. Returns (logits [B, V] float32, updated cache)."""
        dtype = self.dtype
        rows = jnp.arange(tokens.shape[0])
        visible = (jnp.arange(cache.length)[None, :] <= positions[:, None])[:, None, :]  # [B, 1, S]

        def cached_attention(k_cache, v_cache) -> Attention:
            def attention(q, k, v):
                # k[:, 0], v[:, 0] [B, Hkv, D] land at position `positions[row]` of each row.
                k_all = k_cache.at[rows, :, :, positions].set(k[:, 0].astype(k_cache.dtype))
                v_all = v_cache.at[rows, :, positions].set(v[:, 0].astype(v_cache.dtype))
                out = attend_cache(q, k_all.astype(dtype), v_all.astype(dtype), visible)
                return out, (k_all, v_all)
            return attention

        x, kv = self._each_layer(tokens[:, None], positions[:, None],
                                 [cached_attention(k, v) for k, v in zip(cache.k, cache.v)])
        return self.row_logits(x[:, 0]), KVCache(tuple(k for k, _ in kv), tuple(v for _, v in kv))

    def logits(self, hidden: jnp.ndarray) -> jnp.ndarray:
        """hidden [B, T, D] (after the final norm) -> logits [B, T, V] float32."""
        if self.config.tie_word_embeddings:
            return jnp.einsum("btd,vd->btv", hidden, self.embed[...].astype(self.dtype),
                              preferred_element_type=jnp.float32)
        return jnp.einsum("btd,dv->btv", hidden, self.lm_head[...].astype(self.dtype),
                          preferred_element_type=jnp.float32)

    def row_logits(self, hidden: jnp.ndarray) -> jnp.ndarray:
        """hidden [B, D] (one position per row, after the final norm) -> logits [B, V] float32."""
        tied = self.config.tie_word_embeddings
        head = self.embed[...] if tied else self.lm_head[...]
        return row_logits(hidden, head.astype(self.dtype), tied)

    def _causal_attention(self) -> Callable[[jnp.ndarray, jnp.ndarray, jnp.ndarray], jnp.ndarray]:
        """(q [B, T, Hq, D], k, v [B, T, Hkv, D]) -> [B, T, Hq, D], causal from position 0, by
        the configured implementation."""
        if self.attention == "xla":
            return attend_causal
        implementation = ATTENTION_IMPLEMENTATIONS[self.attention]
        return lambda q, k, v: attend_fused(q, k, v, implementation)

    def _embed(self, input_ids: jnp.ndarray) -> jnp.ndarray:
        return jnp.take(self.embed[...], input_ids, axis=0).astype(self.dtype)

    def _each_layer(self, input_ids, positions, attentions: list[Attention]):
        """The decoder stack unrolled, layer i attending with attentions[i], then the final
        norm. Returns (hidden [B, T, D], the attentions' aux outputs, one per layer)."""
        x, aux = self._embed(input_ids), []
        for layer, attention in zip(self.layers, attentions):
            x, out = decoder_layer(self.config, layer.weights(self.dtype), x, positions,
                                   attention)
            aux.append(out)
        x = rms_norm(x, self.final_norm[...].astype(self.dtype), self.config.rms_norm_eps)
        return x, aux

    def _scan(self, input_ids, positions, attend_fn, remat: bool = False) -> jnp.ndarray:
        """The decoder stack as one scan over the layer weights stacked here, attending with
        attend_fn(q, k, v) -> out, then the final norm. Returns hidden [B, T, D]."""
        dtype = self.dtype
        stacked = {name: jnp.stack([getattr(layer, name)[...].astype(dtype)
                                    for layer in self.layers]) for name in LAYER_PARAMS}

        def attention(q, k, v):
            return attend_fn(q, k, v), None

        def layer(x, weights):
            return decoder_layer(self.config, weights, x, positions, attention)[0], None

        if remat:
            # Save nothing but the carry (the layer's input [B, T, D]): the backward reruns the
            # layer's forward (up to a third more compute) and the activations held across the
            # stack shrink to one [B, T, D] per layer. Saving the matmul outputs instead
            # (dots_with_no_batch_dims_saveable) would keep the two [B, T, intermediate] MLP
            # projections, most of what there is to save. prevent_cse=False: the scan already
            # keeps XLA from merging the recomputation into the forward.
            layer = jax.checkpoint(layer, policy=jax.checkpoint_policies.nothing_saveable,
                                   prevent_cse=False)
        x, _ = jax.lax.scan(layer, self._embed(input_ids), stacked)
        return rms_norm(x, self.final_norm[...].astype(dtype), self.config.rms_norm_eps)


def row_logits(hidden: jnp.ndarray, head: jnp.ndarray, tied: bool) -> jnp.ndarray:
    """hidden [B, D] -> logits [B, V] float32; head: the embedding [V, D] when tied, else the
    LM head [D, V].

    The tied head is computed as embed @ hidden.T -> [V, B], then the small result transposed:
    XLA:CPU streams the table at its read rate in that form, but takes 1.5x as long at 8 rows
    (25 vs 16 ms for Qwen2.5-0.5B) for hidden @ embed.T, which is what its simplifier makes of
    the plain product; the barrier keeps it from folding the transpose back into the dot."""
    if not tied:
        return jnp.einsum("bd,dv->bv", hidden, head, preferred_element_type=jnp.float32)
    by_vocab = jnp.einsum("vd,bd->vb", head, hidden, preferred_element_type=jnp.float32)
    return jax.lax.optimization_barrier(by_vocab).T


def decoder_layer(config: ModelConfig, p: dict[str, jnp.ndarray], x: jnp.ndarray,
                  positions: jnp.ndarray, attention: Attention):
    """One decoder layer: x [B, T, D] at positions [B, T], weights p (LAYER_PARAMS, compute
    dtype). Returns (x [B, T, D], the attention's aux output)."""
    inv_freq, attention_factor = _rope_constants(config)
    h = rms_norm(x, p["attn_norm"], config.rms_norm_eps)
    q = jnp.einsum("btd,dhk->bthk", h, p["q_kernel"]) + p["q_bias"]
    k = jnp.einsum("btd,dhk->bthk", h, p["k_kernel"]) + p["k_bias"]
    v = jnp.einsum("btd,dhk->bthk", h, p["v_kernel"]) + p["v_bias"]
    q = apply_rope(q, positions, inv_freq, attention_factor)
    k = apply_rope(k, positions, inv_freq, attention_factor)
    out, aux = attention(q, k, v)
    x = x + jnp.einsum("bthk,hkd->btd", out, p["o_kernel"])
    h = rms_norm(x, p["mlp_norm"], config.rms_norm_eps)
    gated = jax.nn.silu(h @ p["gate_kernel"]) * (h @ p["up_kernel"])
    return x + gated @ p["down_kernel"], aux


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
