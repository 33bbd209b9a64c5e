"""Grouped-query attention: the plain XLA reference path, and jax.nn.dot_product_attention.

`attend` takes any boolean mask and materialises the [T, S] scores: the reference, used on CPU
and in tests. `attend_fused` goes through jax.nn.dot_product_attention, which on GPU can run
cuDNN flash attention (no T x S tensor in memory); it covers the two shapes a decoding engine
needs: a causal prefill from position 0, and queries over the first kv_lengths cache entries.
"""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp


def attend(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
    """Softmax attention with grouped key/value heads.

    q [B, T, Hq, D]; k, v [B, S, Hkv, D] with Hq a multiple of Hkv; mask [B, T, S] bool (True =
    may attend). Scores and softmax run in float32 (as transformers' eager path). A query row
    with no allowed key (left padding) gets a uniform average instead of NaN.
    Returns [B, T, Hq, D] in q.dtype.
    """
    b, t, hq, d = q.shape
    hkv = k.shape[2]
    q = q.reshape(b, t, hkv, hq // hkv, d)
    scores = jnp.einsum("btngd,bsnd->bngts", q, k, preferred_element_type=jnp.float32)
    scores = scores * (d ** -0.5)
    scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    out = jnp.einsum("bngts,bsnd->btngd", probs, v)
    return out.reshape(b, t, hq, d)


def attend_fused(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, *, causal: bool,
                 kv_lengths: jnp.ndarray,
                 implementation: Literal["xla", "cudnn"] | None = None) -> jnp.ndarray:
    """q [B, T, Hq, D]; k, v [B, S, Hkv, D]; kv_lengths [B]: keys at index >= kv_lengths[b]
    are ignored; causal: query i also ignores keys after i (a prefill with T == S).
    implementation None lets JAX choose (cuDNN on a GPU when the shapes allow)."""
    return jax.nn.dot_product_attention(
        q, k, v, is_causal=causal, key_value_seq_lengths=kv_lengths.astype(jnp.int32),
        implementation=implementation)
