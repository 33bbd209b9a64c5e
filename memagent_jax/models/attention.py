"""Grouped-query attention over an explicit boolean mask: the plain XLA reference path."""

from __future__ import annotations

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
