"""Per-token log-probabilities and entropies of training rows, without the [B, T, V] logits.

At MemAgent's turn lengths (up to ~8K tokens) and Qwen2.5's vocabulary (152,064), float32
logits are 5 GB per row, and their gradient as much again. `token_logprobs` computes them a
slice of positions at a time inside a scan whose body is rematerialised: the forward keeps
only [B, T] results, and the backward recomputes one slice's logits at a time. Each position's
values depend on its own logits only, so slicing changes no value.

Training needs them only where the response lies (a memory turn's prompt holds a chunk of
thousands of tokens, its reply a few hundred at most), so with `positions` the LM head runs on
the given positions of each row only (its response tokens, or those of every row packed in a
sequence), as verl slices the response before its log-softmax; the values there are the same.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp


def token_logprobs(logits_fn: Callable[[jax.Array], jax.Array], hidden: jax.Array,
                   tokens: jax.Array, slice_positions: int | None = None, entropy: bool = True,
                   positions: jax.Array | None = None) -> tuple[jax.Array, jax.Array | None]:
    """hidden [B, T, D] (the model's final-norm output), tokens [B, T];
    logits_fn: hidden [B, C, D] -> logits [B, C, V] (divided by the temperature).
    Returns (logp [B, T]: log p(tokens[:, t] | tokens[:, :t]), 0 at t = 0; entropy [B, T] of
    the distribution token t was drawn from, 0 at t = 0, or None). slice_positions: LM-head
    positions at once (None: all at once, holding [B, T, V]). positions [B, W] int (each >= 1; those
    >= T are padding, dropped): only these positions are computed, the rest are 0. With
    packed rows, position t must not be a row's first token (t - 1 is in another row)."""
    b, t, _ = hidden.shape
    if positions is None:
        logp, ent = _positions(logits_fn, hidden[:, :-1], tokens[:, 1:], slice_positions, entropy)

        def place(x):
            return jnp.pad(x, ((0, 0), (1, 0)))
    else:
        where = positions                                              # [B, W] token positions
        before = jnp.clip(where - 1, 0, t - 1)
        h = jnp.take_along_axis(hidden, before[..., None], axis=1)     # [B, W, D]
        y = jnp.take_along_axis(tokens, jnp.clip(where, 0, t - 1), axis=1)
        logp, ent = _positions(logits_fn, h, y, slice_positions, entropy)
        rows = jnp.broadcast_to(jnp.arange(b)[:, None], where.shape)

        def place(x):  # positions past the row's end are dropped
            return jnp.zeros((b, t), x.dtype).at[rows, where].set(x, mode="drop")
    return place(logp), (None if ent is None else place(ent))


def _positions(logits_fn, h, y, slice_positions, entropy):
    """h [B, N, D], y [B, N] -> (log p(y) [B, N], entropy [B, N] or None), the LM head
    applied slice_positions positions at a time."""
    b, length, d = h.shape
    size = length if slice_positions is None else min(slice_positions, length)
    slices = -(-length // size)
    pad = slices * size - length
    h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
    y = jnp.pad(y, ((0, 0), (0, pad)))
    h = h.reshape(b, slices, size, d).swapaxes(0, 1)    # [slices, B, C, D]
    y = y.reshape(b, slices, size).swapaxes(0, 1)       # [slices, B, C]

    def one_slice(h_c, y_c):
        logits = logits_fn(h_c).astype(jnp.float32)
        lse = jax.nn.logsumexp(logits, axis=-1)
        logp = jnp.take_along_axis(logits, y_c[..., None], axis=-1)[..., 0] - lse
        if not entropy:
            return logp, None
        # log p = logit - lse, so the entropy needs no [B, C, V] log-softmax
        ent = lse - jnp.sum(jax.nn.softmax(logits, axis=-1) * logits, axis=-1)
        return logp, ent

    if slices == 1:
        logp, ent = one_slice(h[0], y[0])
    else:  # rematerialised: the backward recomputes each slice's logits in its turn
        logp, ent = jax.lax.map(lambda xs: jax.checkpoint(one_slice)(*xs), (h, y))
        logp = logp.swapaxes(0, 1).reshape(b, -1)
        ent = None if ent is None else ent.swapaxes(0, 1).reshape(b, -1)
    return logp[:, :length], (None if ent is None else ent[:, :length])
