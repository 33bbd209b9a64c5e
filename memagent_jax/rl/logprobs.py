"""Per-token log-probabilities and entropies of training rows, without the [B, T, V] logits.

At MemAgent's turn lengths (up to ~8K tokens) and Qwen2.5's vocabulary (152,064), float32
logits are 5 GB per row, and their gradient as much again. `token_logprobs` computes them a
chunk of positions at a time inside a scan whose body is rematerialised: the forward keeps
only [B, T] results, and the backward recomputes one chunk's logits at a time. Each position's
values depend on its own logits only, so chunking changes no value.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp


def token_logprobs(logits_fn: Callable[[jax.Array], jax.Array], hidden: jax.Array,
                   tokens: jax.Array, chunk_tokens: int | None = None, entropy: bool = True
                   ) -> tuple[jax.Array, jax.Array | None]:
    """hidden [B, T, D] (the model's final-norm output), tokens [B, T];
    logits_fn: hidden [B, C, D] -> logits [B, C, V] (divided by the temperature).
    Returns (logp [B, T]: log p(tokens[:, t] | tokens[:, :t]), 0 at t = 0; entropy [B, T] of
    the distribution token t was drawn from, 0 at t = 0, or None). chunk_tokens: positions
    per chunk (None: all at once, holding [B, T, V])."""
    b, t, d = hidden.shape
    length = t - 1  # position i predicts token i + 1
    chunk = length if chunk_tokens is None else min(chunk_tokens, length)
    chunks = -(-length // chunk)
    pad = chunks * chunk - length
    h = jnp.pad(hidden[:, :-1], ((0, 0), (0, pad), (0, 0)))
    y = jnp.pad(tokens[:, 1:], ((0, 0), (0, pad)))
    h = h.reshape(b, chunks, chunk, d).swapaxes(0, 1)   # [chunks, B, C, D]
    y = y.reshape(b, chunks, chunk).swapaxes(0, 1)      # [chunks, B, C]

    def one_chunk(h_c, y_c):
        logits = logits_fn(h_c).astype(jnp.float32)
        lse = jax.nn.logsumexp(logits, axis=-1)
        logp = jnp.take_along_axis(logits, y_c[..., None], axis=-1)[..., 0] - lse
        if not entropy:
            return logp, None
        # log p = logit - lse, so the entropy needs no [B, C, V] log-softmax
        ent = lse - jnp.sum(jax.nn.softmax(logits, axis=-1) * logits, axis=-1)
        return logp, ent

    if chunks == 1:
        logp, ent = one_chunk(h[0], y[0])
    else:  # rematerialised: the backward recomputes each chunk's logits in its turn
        logp, ent = jax.lax.map(lambda xs: jax.checkpoint(one_chunk)(*xs), (h, y))
        logp = logp.swapaxes(0, 1).reshape(b, -1)
        ent = None if ent is None else ent.swapaxes(0, 1).reshape(b, -1)

    def finish(x):
        return jnp.pad(x[:, :length], ((0, 0), (1, 0)))

    return finish(logp), (None if ent is None else finish(ent))
