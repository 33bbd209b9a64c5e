"""Grouped-query attention: the plain XLA reference path, and jax.nn.dot_product_attention.

`attend` takes any boolean mask and materialises the [T, S] scores: the reference, used on CPU
and in tests. `attend_causal` is the causal case from position 0 (a prefill, an unpadded or
right-padded forward) in query and key blocks with a running softmax, as flash attention does:
it never holds more than a block x block score tile per head and skips the blocks above the
diagonal, in its gradient too (flash attention's backward, as a custom VJP), so it is the
long-sequence path for inference and training wherever no fused kernel serves. `attend_cache`
is the decode step's: a few queries over a head-major KV cache (keys stored transposed).
`attend_fused` runs causal attention from position 0 (a prefill, a training forward) through
jax.nn.dot_product_attention, which on GPU can be cuDNN flash attention (no T x T tensor in
memory).
"""

from __future__ import annotations

import functools
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
    return attend_cache(q, k.transpose(0, 2, 3, 1), v.swapaxes(1, 2), mask)


def attend_causal(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray,
                  block_size: int | None = None) -> jnp.ndarray:
    """Causal attention where query i sees keys 0..i: q [B, T, Hq, D], k, v [B, T, Hkv, D].

    Query block i runs over key blocks 0..i (the diagonal one masked), keeping the running max,
    normaliser and weighted sum in float32; the blocks above the diagonal are skipped, not
    computed and masked as `attend` would. Differentiable: the gradient is flash attention's
    backward (`_blocked`), which recomputes each tile's probabilities from the saved
    log-sum-exp, so it too holds only block x block tiles. block_size None: `default_block`.
    Returns [B, T, Hq, D].
    """
    b, t, hq, d = q.shape
    hkv = k.shape[2]
    g = hq // hkv
    block = min(block_size or default_block(g), t)
    n = -(-t // block)
    if n * block != t:  # padded keys lie after every real query, so the mask hides them
        pad = ((0, 0), (0, n * block - t), (0, 0), (0, 0))
        q, k, v = jnp.pad(q, pad), jnp.pad(k, pad), jnp.pad(v, pad)
    # Head-major tiles, transposed once here rather than inside every tile's product: a query
    # block holds the G query heads of one key-value head as G x block rows (ordered (g, i)),
    # so each tile is one plain [G * block, D] x [D, block] matmul per key-value head.
    q = q.reshape(b, n, block, hkv, g, d).transpose(0, 3, 1, 4, 2, 5)
    q = q.reshape(b, hkv, n, g * block, d) * jnp.asarray(d ** -0.5, q.dtype)
    k = k.reshape(b, n, block, hkv, d).transpose(0, 3, 1, 2, 4)
    v = v.reshape(b, n, block, hkv, d).transpose(0, 3, 1, 2, 4)
    out = _blocked(q, k, v)  # [n, B, Hkv, G * block, D]
    out = out.reshape(n, b, hkv, g, block, d).transpose(1, 0, 4, 2, 3, 5)
    return out.reshape(b, n * block, hq, d)[:, :t]


def default_block(group: int) -> int:
    """Rows and keys per tile for `group` query heads per KV head: a tile's product has group x
    block query rows, and below about 512 of them the per-tile overhead of the loop dominates
    (docs/log/benchmarks.md, "Prefill attention block size"). Every Qwen2.5 model has 5 to 8
    query heads per KV head (128-blocks); small test models often 2."""
    return 256 if group <= 4 else 128


# The kernels below take q [B, Hkv, n, M, D] with M = G x block rows (already scaled by
# D^-0.5), k, v [B, Hkv, n, block, D], and give out [n, B, Hkv, M, D] in v.dtype: the layout
# the loop over query blocks stacks, so the forward writes it without a transpose.

@jax.custom_vjp
def _blocked(q, k, v):
    return _blocked_forward(q, k, v)[0]


def _blocked_forward(q, k, v):
    """-> (out [n, B, Hkv, M, D], lse [n, B, Hkv, M] float32: each query row's log-sum-exp of
    scores, which is all the backward needs to rebuild its probabilities)."""
    b, hkv, n, m, d = q.shape
    on_diagonal = _on_diagonal(m, k.shape[3])

    def query_block(i):
        q_i = q[:, :, i]

        def key_block(j, carry):
            running_max, normaliser, acc = carry
            scores = jnp.einsum("bhmd,bhkd->bhmk", q_i, k[:, :, j],
                                preferred_element_type=jnp.float32)
            scores = jnp.where((j < i) | on_diagonal, scores, -jnp.inf)
            new_max = jnp.maximum(running_max, scores.max(axis=-1))
            probs = jnp.exp(scores - new_max[..., None])
            rescale = jnp.exp(running_max - new_max)
            normaliser = normaliser * rescale + probs.sum(axis=-1)
            acc = acc * rescale[..., None] + jnp.einsum(
                "bhmk,bhkd->bhmd", probs.astype(v.dtype), v[:, :, j],
                preferred_element_type=jnp.float32)
            return new_max, normaliser, acc

        shape = (b, hkv, m)
        init = (jnp.full(shape, -jnp.inf, jnp.float32), jnp.zeros(shape, jnp.float32),
                jnp.zeros(shape + (d,), jnp.float32))
        # Key blocks after the diagonal are skipped, not masked: a trip count that depends on
        # i, which is why reverse mode needs the hand-written backward below.
        running_max, normaliser, acc = jax.lax.fori_loop(0, i + 1, key_block, init)
        return (acc / normaliser[..., None]).astype(v.dtype), running_max + jnp.log(normaliser)

    return jax.lax.map(query_block, jnp.arange(n))


def _blocked_fwd(q, k, v):
    out, lse = _blocked_forward(q, k, v)
    return out, (q, k, v, out, lse)


def _blocked_bwd(residuals, d_out):
    """Flash attention's backward (Dao 2023, algorithm 2): for each key block j, the query
    blocks i >= j recompute P = exp(S - lse) tile by tile; dV_j and dK_j accumulate in the
    loop's carry, and dQ_i in a [n, ...] buffer updated in place."""
    q, k, v, out, lse = residuals
    b, hkv, n, m, d = q.shape
    block = k.shape[3]
    on_diagonal = _on_diagonal(m, block)
    # rowsum(dO * O) = rowsum(P * dP): the softmax backward's subtrahend, once per query row.
    delta = jnp.einsum("nbhmd,nbhmd->nbhm", d_out.astype(jnp.float32), out.astype(jnp.float32))
    f32 = functools.partial(jnp.einsum, preferred_element_type=jnp.float32)

    def key_block(dq, j):
        k_j, v_j = k[:, :, j], v[:, :, j]

        def query_block(i, carry):
            dq, dk_j, dv_j = carry
            q_i, do_i = q[:, :, i], d_out[i]
            scores = f32("bhmd,bhkd->bhmk", q_i, k_j)
            scores = jnp.where((j < i) | on_diagonal, scores, -jnp.inf)
            probs = jnp.exp(scores - lse[i][..., None])
            dv_j = dv_j + f32("bhmk,bhmd->bhkd", probs.astype(v.dtype), do_i)
            d_probs = f32("bhmd,bhkd->bhmk", do_i, v_j)
            d_scores = (probs * (d_probs - delta[i][..., None])).astype(q.dtype)
            dq = dq.at[i].add(f32("bhmk,bhkd->bhmd", d_scores, k_j))
            dk_j = dk_j + f32("bhmk,bhmd->bhkd", d_scores, q_i)
            return dq, dk_j, dv_j

        zeros = jnp.zeros((b, hkv, block, d), jnp.float32)
        dq, dk_j, dv_j = jax.lax.fori_loop(j, n, query_block, (dq, zeros, zeros))
        return dq, (dk_j, dv_j)

    dq = jnp.zeros((n, b, hkv, m, d), jnp.float32)
    dq, (dk, dv) = jax.lax.scan(key_block, dq, jnp.arange(n))  # dk, dv [n, B, Hkv, block, D]
    dq = jnp.transpose(dq, (1, 2, 0, 3, 4)).astype(q.dtype)
    dk = jnp.transpose(dk, (1, 2, 0, 3, 4)).astype(k.dtype)
    dv = jnp.transpose(dv, (1, 2, 0, 3, 4)).astype(v.dtype)
    return dq, dk, dv


_blocked.defvjp(_blocked_fwd, _blocked_bwd)


def _on_diagonal(rows: int, block: int) -> jnp.ndarray:
    """[G x block, block] bool: within the diagonal tile, query row r (query r % block of its
    block) may see key k <= r % block."""
    return (jnp.arange(rows) % block)[:, None] >= jnp.arange(block)[None, :]


def attend_cache(q: jnp.ndarray, k_cache: jnp.ndarray, v_cache: jnp.ndarray,
                 visible: jnp.ndarray) -> jnp.ndarray:
    """`attend` over the decode step's KV cache layout: q [B, T, Hq, D]; k_cache
    [B, Hkv, D, S] (keys transposed), v_cache [B, Hkv, S, D]; visible [B, T, S] bool.

    Each (row, KV head) holds its keys as one contiguous [D, S] block and its values as one
    [S, D] block, and its G x T queries form one [G * T, D] block, so both products are plain
    batched matmuls over the cache as it lies, neither with a transposed right operand (which
    XLA:CPU runs with a slower kernel; docs/log/benchmarks.md, "decode attention layout"). Returns
    [B, T, Hq, D]."""
    b, t, hq, d = q.shape
    hkv = k_cache.shape[1]
    g = hq // hkv
    rows = q.reshape(b, t, hkv, g, d).transpose(0, 2, 3, 1, 4).reshape(b, hkv, g * t, d)
    scores = jnp.einsum("bnmd,bnds->bnms", rows, k_cache, preferred_element_type=jnp.float32)
    scores = scores.reshape(b, hkv, g, t, -1)
    scores = jnp.where(visible[:, None, None], scores * (d ** -0.5), jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_cache.dtype).reshape(b, hkv, g * t, -1)
    out = jnp.einsum("bnms,bnsd->bnmd", probs, v_cache)
    return out.reshape(b, hkv, g, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, hq, d)


def attend_fused(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray,
                 implementation: Literal["xla", "cudnn"] | None = None) -> jnp.ndarray:
    """Causal attention from position 0 (a prefill, a training forward and its gradient)
    through jax.nn.dot_product_attention: q [B, T, Hq, D]; k, v [B, T, Hkv, D].
    implementation None lets JAX choose (cuDNN flash attention on a GPU when the shapes allow;
    no T x T tensor in memory)."""
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=implementation)
