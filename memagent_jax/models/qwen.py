"""Qwen2 / Qwen2.5 and Qwen3 (dense) in Flax NNX: typed Attention / MLP / DecoderLayer modules,
one model for both architectures (`ModelConfig.model_type`), run three ways.

The parameters, as `split_params` gives them (the one representation the learner, the engine,
checkpoints and export pass around, `Params`):

    {"embed": [V, D],
     "layers": {0: {"attn_norm": [D],
                    "attn": {"q_kernel": [D, Hq, K], "q_bias": [Hq, K],    # biases: Qwen2
                             "k_kernel": [D, Hkv, K], "k_bias": [Hkv, K],
                             "v_kernel": [D, Hkv, K], "v_bias": [Hkv, K],
                             "q_norm": [K], "k_norm": [K],                 # head norms: Qwen3
                             "o_kernel": [Hq, K, D]},
                    "mlp_norm": [D],
                    "mlp": {"gate_kernel": [D, F], "up_kernel": [D, F], "down_kernel": [F, D]}},
                1: ...},
     "final_norm": [D],
     "lm_head": [D, V]}            # untied models only (Qwen2.5-7B, Qwen3-8B and up)

one array per layer and weight, as in HF checkpoints. Every parameter carries its logical axes
(`logical_axes` metadata: "embed", "heads", ...), which `sharding.py` maps onto a mesh.

The model runs them three ways:
- `model(input_ids, attention_mask)`: a whole (left- or right-padded) batch, no cache (training,
  scoring);
- `model.prefill(input_ids, logits_index)`: prompts from position 0, returning every layer's
  keys and values (the engine's prefill);
- `model.decode_step(tokens, positions, cache)`: one token per row against a per-layer KV cache.

The full forward stacks the layers' weights inside the jitted function and runs one
`jax.lax.scan`, so the train step's program is the size of one layer however deep the model;
the stack is one more copy of the weights in the compute dtype per call, small beside the work
of a batch of long rows. Prefill and decode loop over the layers in Python instead, each
layer's matmuls reading its weights where they lie and each layer's cache its own buffer,
updated in place: a scan copies every layer's slice of the stacked weights before its matmuls
read it, which a bandwidth-bound decode step pays in full (docs/architecture.md, "The model").
The price is compile time that grows with depth (benchmarks/compile_time.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from memagent_jax.models.attention import (
    attend,
    attend_cache,
    attend_causal,
    attend_fused,
    segment_starts,
)
from memagent_jax.models.config import ATTENTION_CHOICES, ModelConfig, Remat
from memagent_jax.models.flash_gpu import flash_gpu_causal
from memagent_jax.models.rope import apply_rope, inverse_frequencies
from memagent_jax.models.splash import splash_causal

# The parameters as a nested dict of arrays; see the module docstring.
Params = dict[str, Any]

# attention(q [B, T, Hq, K], k, v [B, T, Hkv, K]) -> (out [B, T, Hq, K], what the layer returns
# beside its output: nothing, the layer's keys and values, or its updated cache).
AttentionFn = Callable[[jnp.ndarray, jnp.ndarray, jnp.ndarray], tuple[jnp.ndarray, object]]

# read_cache(q [B, 1, Hq, K], k_cache [B, Hkv, K, S], v_cache [B, Hkv, S, K], lengths [B]) ->
# [B, 1, Hq, K]: a decode step's attention of each row over its cache's first lengths[b]
# entries (`attend_cache` with a length mask, or `attend_cache_ragged`).
ReadCacheFn = Callable[[jnp.ndarray, jnp.ndarray, jnp.ndarray, jnp.ndarray], jnp.ndarray]

# What the backward keeps of each layer's forward (`remat` of `hidden`/`__call__`; the learner's
# `learner.remat`): "none" everything (no recompute), "matmuls" the outputs of the layer's
# projections (the backward recomputes attention and the elementwise work), "full" only the
# layer's input [B, T, D] (the backward reruns the whole layer: a third more compute).
REMAT_POLICIES = {"none": None,
                  "matmuls": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
                  "full": jax.checkpoint_policies.nothing_saveable}

# jax.nn.dot_product_attention's `implementation` for the fused choices of ATTENTION_CHOICES.
_FUSED: dict[str, Literal["cudnn"] | None] = {"dot_product": None, "cudnn": "cudnn"}


class KVCache(NamedTuple):
    """Keys and values, one head-major buffer per layer: k[i] [B, Hkv, K, S] (keys stored
    transposed), v[i] [B, Hkv, S, K]; entry s holds position s of its row. Both decode products
    then read the cache as a plain [K, S] or [S, K] right operand (see `attend_cache`)."""
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
        """Puts a prefill's keys and values (per layer [R, T, Hkv, K], as `Qwen.prefill`
        returns them) at positions 0..T-1 of rows row..row+R-1 (row may be traced), and zeros
        at every later position of those rows: attention weighs the entries past a row's
        position by 0, and 0 times whatever a previous occupant left there (NaN included) must
        be 0."""
        def put(layer, new, transpose, axis):  # axis: the layer's position axis
            new = new.transpose(transpose).astype(layer.dtype)
            pad = [(0, layer.shape[axis] - new.shape[axis] if a == axis else 0)
                   for a in range(new.ndim)]
            return jax.lax.dynamic_update_slice(layer, jnp.pad(new, pad), (row, 0, 0, 0))
        return KVCache(tuple(put(c, k, (0, 2, 3, 1), 3) for c, k in zip(self.k, keys)),
                       tuple(put(c, v, (0, 2, 1, 3), 2) for c, v in zip(self.v, values)))


class Attention(nnx.Module):
    """Grouped-query self-attention with rotary positions: Qwen2's biases on q, k and v, or
    Qwen3's RMSNorm of each query and key head (one [K] weight each, shared by the heads)
    before the rotation."""

    def __init__(self, config: ModelConfig, dtype, param_dtype, rngs: nnx.Rngs):
        d, hq, hkv, k = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
        self.config, self.dtype = config, dtype
        # Drawn kernel, bias, kernel, bias, ...: the order random_model's seeds always drew
        # them in (the synthetic recipe starts from such weights).
        self.q_kernel = _random(rngs, (d, hq, k), ("embed", "heads", None), param_dtype)
        if config.qkv_bias:
            self.q_bias = _random(rngs, (hq, k), ("heads", None), param_dtype)
        self.k_kernel = _random(rngs, (d, hkv, k), ("embed", "kv_heads", None), param_dtype)
        if config.qkv_bias:
            self.k_bias = _random(rngs, (hkv, k), ("kv_heads", None), param_dtype)
        self.v_kernel = _random(rngs, (d, hkv, k), ("embed", "kv_heads", None), param_dtype)
        if config.qkv_bias:
            self.v_bias = _random(rngs, (hkv, k), ("kv_heads", None), param_dtype)
        if config.qk_norm:
            self.q_norm = _ones((k,), param_dtype)
            self.k_norm = _ones((k,), param_dtype)
        self.o_kernel = _random(rngs, (hq, k, d), ("heads", None, "embed"), param_dtype)

    def __call__(self, h: jnp.ndarray, positions: jnp.ndarray, attention: AttentionFn):
        """h [B, T, D] (normed) at positions [B, T] -> ([B, T, D], the attention's aux)."""
        w = functools.partial(_weight, dtype=self.dtype)
        config = self.config
        inv_freq, factor = _rope_constants(config)
        q = jnp.einsum("btd,dhk->bthk", h, w(self.q_kernel))
        k = jnp.einsum("btd,dhk->bthk", h, w(self.k_kernel))
        v = jnp.einsum("btd,dhk->bthk", h, w(self.v_kernel))
        if config.qkv_bias:
            q, k, v = q + w(self.q_bias), k + w(self.k_bias), v + w(self.v_bias)
        if config.qk_norm:
            q = rms_norm(q, w(self.q_norm), config.rms_norm_eps)
            k = rms_norm(k, w(self.k_norm), config.rms_norm_eps)
        out, aux = attention(apply_rope(q, positions, inv_freq, factor),
                             apply_rope(k, positions, inv_freq, factor), v)
        return jnp.einsum("bthk,hkd->btd", out, w(self.o_kernel)), aux


class MLP(nnx.Module):
    """SwiGLU feed-forward: down(silu(gate(h)) * up(h))."""

    def __init__(self, config: ModelConfig, dtype, param_dtype, rngs: nnx.Rngs):
        d, f = config.hidden_size, config.intermediate_size
        self.dtype = dtype
        self.gate_kernel = _random(rngs, (d, f), ("embed", "mlp"), param_dtype)
        self.up_kernel = _random(rngs, (d, f), ("embed", "mlp"), param_dtype)
        self.down_kernel = _random(rngs, (f, d), ("mlp", "embed"), param_dtype)

    def __call__(self, h: jnp.ndarray) -> jnp.ndarray:
        w = functools.partial(_weight, dtype=self.dtype)
        return (jax.nn.silu(h @ w(self.gate_kernel)) * (h @ w(self.up_kernel))) @ w(
            self.down_kernel)


class DecoderLayer(nnx.Module):
    """Pre-norm residual block: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(self, config: ModelConfig, dtype, param_dtype, rngs: nnx.Rngs):
        self.eps, self.dtype = config.rms_norm_eps, dtype
        self.attn_norm = _ones((config.hidden_size,), param_dtype)
        self.attn = Attention(config, dtype, param_dtype, rngs)
        self.mlp_norm = _ones((config.hidden_size,), param_dtype)
        self.mlp = MLP(config, dtype, param_dtype, rngs)

    def __call__(self, x: jnp.ndarray, positions: jnp.ndarray, attention: AttentionFn):
        """x [B, T, D] at positions [B, T] -> (x [B, T, D], the attention's aux output)."""
        out, aux = self.attn(rms_norm(x, _weight(self.attn_norm, self.dtype), self.eps),
                             positions, attention)
        x = x + out
        return x + self.mlp(rms_norm(x, _weight(self.mlp_norm, self.dtype), self.eps)), aux


class Qwen(nnx.Module):
    """Qwen2 / Qwen3 causal LM (`config.model_type`). `dtype` is the compute dtype,
    `param_dtype` the storage dtype, `attention` one of ATTENTION_CHOICES (for the prefill and
    the unmasked forward: "xla" the blocked causal kernel of attention.py, "dot_product"
    jax.nn.dot_product_attention with the implementation JAX picks, "cudnn" forced cuDNN flash
    attention, GPU and bf16/fp16 only, "splash" TPU's Pallas kernel, splash.py). mesh: the mesh
    the model's arrays are sharded on, which "splash" runs its kernel over (None: one device)."""

    def __init__(self, config: ModelConfig, *, dtype=jnp.float32, param_dtype=jnp.float32,
                 attention: str = "xla", mesh: jax.sharding.Mesh | None = None,
                 rngs: nnx.Rngs):
        if attention not in ATTENTION_CHOICES:
            raise ValueError(f"attention must be one of {list(ATTENTION_CHOICES)}, "
                             f"got {attention!r}")
        self.config = config
        self.dtype = jnp.dtype(dtype)
        self.attention = attention
        self.mesh = mesh
        self.embed = _random(rngs, (config.vocab_size, config.hidden_size), ("vocab", "embed"),
                             param_dtype)
        self.layers = nnx.List([DecoderLayer(config, self.dtype, param_dtype, rngs)
                                for _ in range(config.num_layers)])
        self.final_norm = _ones((config.hidden_size,), param_dtype)
        if not config.tie_word_embeddings:
            self.lm_head = _random(rngs, (config.hidden_size, config.vocab_size),
                                   ("embed", "vocab"), param_dtype)

    def __call__(self, input_ids: jnp.ndarray, attention_mask: jnp.ndarray | None = None, *,
                 segment_ids: jnp.ndarray | None = None, remat: Remat = "none"):
        """input_ids [B, T] int; attention_mask [B, T] (1 = token, 0 = padding, on either side).

        Positions count real tokens only, so a padded row gives the logits the same sequence
        would give unpadded. Without a mask every row runs causally from position 0 with the
        configured attention (right-padded rows may pass None too: padding after a token never
        affects it); its "xla" and "cudnn" kernels never build a [T, T] mask or scores, in the
        gradient either. With a mask, the reference path (`attend`); so too with segment_ids
        [B, T] (packed rows, as `hidden` takes them) instead of a mask. remat: what the
        backward keeps of each layer (`REMAT_POLICIES`: training memory against recompute;
        the values are the same).
        Returns logits [B, T, V] float32 (rows at padding are meaningless).
        """
        t = input_ids.shape[1]
        causal = jnp.tril(jnp.ones((t, t), bool))[None]
        if segment_ids is not None:
            if attention_mask is not None:
                raise ValueError("give an attention_mask or segment_ids, not both")
            positions = segment_positions(segment_ids)
            visible = causal & (segment_ids[:, :, None] == segment_ids[:, None, :])
        elif attention_mask is None:
            return self.logits(self.hidden(input_ids, remat=remat))
        else:
            mask = attention_mask.astype(bool)
            positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
            visible = causal & mask[:, None, :]
        return self.logits(self._scan(input_ids, positions,
                                      lambda q, k, v: attend(q, k, v, visible), remat))

    def hidden(self, input_ids: jnp.ndarray, *, remat: Remat = "none",
               segment_ids: jnp.ndarray | None = None) -> jnp.ndarray:
        """input_ids [B, T] -> the final norm's output [B, T, D]: `__call__` without a mask and
        before the LM head (`logits`), for callers that apply the head a chunk at a time.

        segment_ids [B, T] int: packed rows, each a contiguous run of one id (the padding at
        the end a run of its own): every token attends only to the tokens of its segment, and
        positions restart at 0 at each segment's first token, so each row gets the values it
        would get alone. Under "cudnn" they go to jax's Triton flash kernel (flash_gpu.py),
        as jax.nn's cuDNN path takes none.
        """
        b, t = input_ids.shape
        if segment_ids is None:
            positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        else:
            positions = segment_positions(segment_ids)
        return self._scan(input_ids, positions, self._causal_attention(segment_ids), remat)

    def prefill(self, input_ids: jnp.ndarray, logits_index: jnp.ndarray):
        """Runs prompts from position 0: input_ids [B, T] (right padding is harmless: it comes
        after every real token); logits_index [B]: the position whose logits to return (each
        row's last prompt token), which spares a long prefill the [B, T, V] tensor.
        Returns (logits [B, V] float32, keys, values: per layer [B, T, Hkv, K] in the compute
        dtype)."""
        b, t = input_ids.shape
        positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
        causal = self._causal_attention()

        def attention(q, k, v):
            return causal(q, k, v), (k, v)

        x, kv = self._each_layer(input_ids, positions, [attention] * len(self.layers))
        x = jnp.take_along_axis(x, logits_index[:, None, None], axis=1)
        return self.row_logits(x[:, 0]), tuple(k for k, _ in kv), tuple(v for _, v in kv)

    def decode_step(self, tokens: jnp.ndarray, positions: jnp.ndarray, cache: KVCache,
                    read_cache: ReadCacheFn | None = None):
        """tokens, positions [B] int32: each row's next token and its position. Its key and
        value are written at cache entry `position` (in place when the cache is donated) and it
        attends to the entries up to it, on the XLA path whatever `attention` says: the fused
        kernels take [B, S, Hkv, K] keys, and the head-major cache would be transposed for them
        in every layer of every step. read_cache(q, k_cache, v_cache, lengths): how a layer
        reads its cache (`ReadCacheFn`); None: `attend_cache` over every entry, masked past
        each row's position. Returns (logits [B, V] float32, updated cache)."""
        dtype = self.dtype
        rows = jnp.arange(tokens.shape[0])
        if read_cache is None:
            visible = (jnp.arange(cache.length)[None, :] <= positions[:, None])[:, None, :]

            def read_cache(q, k_cache, v_cache, lengths):
                return attend_cache(q, k_cache, v_cache, visible)

        def cached_attention(k_cache, v_cache) -> AttentionFn:
            def attention(q, k, v):
                # k[:, 0], v[:, 0] [B, Hkv, K] land at position `positions[row]` of each row.
                k_all = k_cache.at[rows, :, :, positions].set(k[:, 0].astype(k_cache.dtype))
                v_all = v_cache.at[rows, :, positions].set(v[:, 0].astype(v_cache.dtype))
                out = read_cache(q, k_all.astype(dtype), v_all.astype(dtype), positions + 1)
                return out, (k_all, v_all)
            return attention

        x, kv = self._each_layer(tokens[:, None], positions[:, None],
                                 [cached_attention(k, v) for k, v in zip(cache.k, cache.v)])
        return self.row_logits(x[:, 0]), KVCache(tuple(k for k, _ in kv), tuple(v for _, v in kv))

    def logits(self, hidden: jnp.ndarray) -> jnp.ndarray:
        """hidden [B, T, D] (after the final norm) -> logits [B, T, V] float32."""
        if self.config.tie_word_embeddings:
            return jnp.einsum("btd,vd->btv", hidden, _weight(self.embed, self.dtype),
                              preferred_element_type=jnp.float32)
        return jnp.einsum("btd,dv->btv", hidden, _weight(self.lm_head, self.dtype),
                          preferred_element_type=jnp.float32)

    def row_logits(self, hidden: jnp.ndarray) -> jnp.ndarray:
        """hidden [B, D] (one position per row, after the final norm) -> logits [B, V] float32."""
        tied = self.config.tie_word_embeddings
        return row_logits(hidden, _weight(self.embed if tied else self.lm_head, self.dtype), tied)

    def _causal_attention(self, segment_ids: jnp.ndarray | None = None
                          ) -> Callable[[jnp.ndarray, jnp.ndarray, jnp.ndarray], jnp.ndarray]:
        """(q [B, T, Hq, K], k, v [B, T, Hkv, K]) -> [B, T, Hq, K], causal from position 0
        (within each segment, given segment_ids [B, T]), by the configured implementation."""
        if self.attention == "xla":
            return functools.partial(attend_causal, segment_ids=segment_ids)
        if self.attention == "splash":
            return functools.partial(splash_causal, mesh=self.mesh, segment_ids=segment_ids)
        if self.attention == "cudnn" and segment_ids is not None:
            # jax.nn's cuDNN path takes no segment ids (attention.py, `attend_fused`).
            return functools.partial(flash_gpu_causal, mesh=self.mesh, segment_ids=segment_ids)
        return lambda q, k, v: attend_fused(q, k, v, _FUSED[self.attention], segment_ids)

    def _embed(self, input_ids: jnp.ndarray) -> jnp.ndarray:
        return jnp.take(self.embed[...], input_ids, axis=0).astype(self.dtype)

    def _final_norm(self, x: jnp.ndarray) -> jnp.ndarray:
        return rms_norm(x, _weight(self.final_norm, self.dtype), self.config.rms_norm_eps)

    def _each_layer(self, input_ids, positions, attentions: list[AttentionFn]):
        """The decoder stack unrolled, layer i attending with attentions[i], then the final
        norm. Returns (hidden [B, T, D], the attentions' aux outputs, one per layer)."""
        x, aux = self._embed(input_ids), []
        for layer, attention in zip(self.layers, attentions):
            x, out = layer(x, positions, attention)
            aux.append(out)
        return self._final_norm(x), aux

    def _scan(self, input_ids, positions, attend_fn, remat: Remat = "none") -> jnp.ndarray:
        """The decoder stack as one scan over the layer weights stacked here (in the compute
        dtype), attending with attend_fn(q, k, v) -> out, then the final norm. Returns hidden
        [B, T, D]."""
        layer_def, _ = nnx.split(self.layers[0])
        stacked = jax.tree.map(lambda *ws: jnp.stack([w.astype(self.dtype) for w in ws]),
                               *[split_params(layer)[1] for layer in self.layers])

        def attention(q, k, v):
            return attend_fn(q, k, v), None

        def layer(x, weights):
            return nnx.merge(layer_def, weights)(x, positions, attention)[0], None

        if remat != "none":
            # prevent_cse=False: the scan already keeps XLA from merging the recomputation
            # into the forward.
            layer = jax.checkpoint(layer, policy=REMAT_POLICIES[remat], prevent_cse=False)
        x, _ = jax.lax.scan(layer, self._embed(input_ids), stacked)
        return self._final_norm(x)


def split_params(module: nnx.Module) -> tuple[nnx.GraphDef, Params]:
    """(the module's structure, its parameters as a nested dict of arrays); `nnx.merge` of the
    two rebuilds the module (inside a jitted function too, from traced arrays)."""
    graphdef, state = nnx.split(module)
    return graphdef, nnx.to_pure_dict(state)


def param_specs(config: ModelConfig) -> Params:
    """Every parameter of the model as (shape, logical axes), in the `Params` tree. Traced for
    one layer (every layer has the same), so an 80-layer model costs no more than a 1-layer."""
    abstract = nnx.eval_shape(lambda: Qwen(config.replace(num_layers=1), rngs=nnx.Rngs(0)))
    specs = nnx.to_pure_dict(jax.tree.map(
        lambda v: (v.get_value().shape, v.get_metadata()["logical_axes"]), nnx.state(abstract),
        is_leaf=lambda x: isinstance(x, nnx.Variable)))
    specs["layers"] = {i: specs["layers"][0] for i in range(config.num_layers)}
    return specs


def row_logits(hidden: jnp.ndarray, head: jnp.ndarray, tied: bool) -> jnp.ndarray:
    """hidden [B, D] -> logits [B, V] float32; head: the embedding [V, D] when tied, else the
    LM head [D, V].

    The tied head is computed as embed @ hidden.T -> [V, B], then the small result transposed:
    XLA:CPU streams the table at its read rate in that form, but not hidden @ embed.T, which
    is what its simplifier makes of the plain product (BENCHMARKS.md, "Kernel choices on
    XLA:CPU"); the barrier keeps it from folding the transpose back into the dot."""
    if not tied:
        return jnp.einsum("bd,dv->bv", hidden, head, preferred_element_type=jnp.float32)
    by_vocab = jnp.einsum("vd,bd->vb", head, hidden, preferred_element_type=jnp.float32)
    return jax.lax.optimization_barrier(by_vocab).T


def rms_norm(x: jnp.ndarray, weight: jnp.ndarray, eps: float) -> jnp.ndarray:
    """RMSNorm over the last axis, normalising in float32 as transformers' Qwen2RMSNorm."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight * normed.astype(x.dtype)


def segment_positions(segment_ids: jnp.ndarray) -> jnp.ndarray:
    """[B, T] -> [B, T] int32: each token's position within its segment (rope restarts at 0)."""
    return jnp.arange(segment_ids.shape[1], dtype=jnp.int32) - segment_starts(segment_ids)


@functools.lru_cache(maxsize=32)
def _rope_constants(config: ModelConfig):
    return inverse_frequencies(config)


def _weight(param: nnx.Param, dtype) -> jnp.ndarray:
    return param[...].astype(dtype)


def _random(rngs: nnx.Rngs, shape: tuple[int, ...], axes: tuple[str | None, ...],
            dtype) -> nnx.Param:
    """A random initial weight, N(0, 0.02), with its logical axes."""
    value = 0.02 * jax.random.normal(rngs.params(), shape, jnp.float32)
    return nnx.Param(value.astype(dtype), logical_axes=axes)


def _ones(shape: tuple[int, ...], dtype) -> nnx.Param:
    """A norm's initial weight (ones); replicated."""
    return nnx.Param(jnp.ones(shape, dtype), logical_axes=(None,) * len(shape))
