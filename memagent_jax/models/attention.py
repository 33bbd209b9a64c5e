"""Grouped-query attention: the plain XLA reference path, and jax.nn.dot_product_attention.

`attend` takes any boolean mask and materialises the [T, S] scores: the reference, used on CPU
and in tests. `attend_causal` is the causal case from position 0 (a prefill, an unpadded or
right-padded forward) in query and key blocks with a running softmax, as flash attention does:
it never holds more than a block x block score tile per head and skips the blocks above the
diagonal, in its gradient too (flash attention's backward, as a custom VJP), so it is the
long-sequence path for inference and training wherever no fused kernel serves. `attend_cache`
is the decode step's: a few queries over a head-major KV cache (keys stored transposed);
`attend_cache_ragged` is its CPU form for rows of different lengths, which reads each row only
up to its own length.
`attend_fused` runs causal attention from position 0 (a prefill, a training forward) through
jax.nn.dot_product_attention, which on GPU can be cuDNN flash attention (no T x T tensor in
memory). The training forward's paths take segment ids: several rows packed in one sequence,
each attending within itself only.
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
                  block_size: int | None = None,
                  segment_ids: jnp.ndarray | None = None) -> jnp.ndarray:
    """Causal attention where query i sees keys 0..i: q [B, T, Hq, D], k, v [B, T, Hkv, D].
    segment_ids [B, T] int (packed rows, each a contiguous run of one id): query i then sees
    only the keys j <= i of its own segment; None: one segment.

    Query block i runs over key blocks 0..i (the diagonal one masked), keeping the running max,
    normaliser and weighted sum in float32; the blocks above the diagonal are skipped, not
    computed and masked as `attend` would, and with segments so are the key blocks that end
    before the earliest segment start among the block's queries (over the batch). A tile where
    a query sees no key yet contributes nothing (no NaN). Differentiable: the gradient is flash
    attention's backward (`_blocked`), which recomputes each tile's probabilities from the
    saved log-sum-exp, so it too holds only block x block tiles and skips the same tiles.
    block_size None: `default_block`. Returns [B, T, Hq, D].
    """
    b, t, hq, d = q.shape
    hkv = k.shape[2]
    g = hq // hkv
    block = min(block_size or default_block(g), t)
    n = -(-t // block)
    if n * block != t:  # padded keys lie after every real query, so the mask hides them
        pad = ((0, 0), (0, n * block - t), (0, 0), (0, 0))
        q, k, v = jnp.pad(q, pad), jnp.pad(k, pad), jnp.pad(v, pad)
    segments = None
    if segment_ids is not None:
        # The padding positions: a segment of their own (-1), after every real query.
        ids = jnp.pad(segment_ids.astype(jnp.int32), ((0, 0), (0, n * block - t)),
                      constant_values=-1)
        segments = (ids.reshape(b, n, block),) + _block_bounds(ids, block)
    # Head-major tiles, transposed once here rather than inside every tile's product: a query
    # block holds the G query heads of one key-value head as G x block rows (ordered (g, i)),
    # so each tile is one plain [G * block, D] x [D, block] matmul per key-value head.
    q = q.reshape(b, n, block, hkv, g, d).transpose(0, 3, 1, 4, 2, 5)
    q = q.reshape(b, hkv, n, g * block, d) * jnp.asarray(d ** -0.5, q.dtype)
    k = k.reshape(b, n, block, hkv, d).transpose(0, 3, 1, 2, 4)
    v = v.reshape(b, n, block, hkv, d).transpose(0, 3, 1, 2, 4)
    out = _blocked(q, k, v, segments)  # [n, B, Hkv, G * block, D]
    out = out.reshape(n, b, hkv, g, block, d).transpose(1, 0, 4, 2, 3, 5)
    return out.reshape(b, n * block, hq, d)[:, :t]


def segment_starts(segment_ids: jnp.ndarray) -> jnp.ndarray:
    """segment_ids [B, T] (each segment one contiguous run) -> [B, T] int32: the index of the
    first token of each token's segment."""
    index = jnp.arange(segment_ids.shape[1], dtype=jnp.int32)
    return jax.lax.cummax(jnp.where(_segment_begins(segment_ids), index, 0), axis=1)


def _segment_begins(ids: jnp.ndarray) -> jnp.ndarray:
    return jnp.concatenate([jnp.ones_like(ids[:, :1], bool), ids[:, 1:] != ids[:, :-1]], axis=1)


def _block_bounds(ids: jnp.ndarray, block: int) -> tuple[jnp.ndarray, jnp.ndarray]:
    """ids [B, n * block] (contiguous segments) -> (first [n]: the first key block any query of
    query block i can see, last [n]: one past the last query block any key of key block j is
    seen from), over the whole batch."""
    length = ids.shape[1]
    index = jnp.arange(length, dtype=jnp.int32)
    start = segment_starts(ids)
    ends = jnp.concatenate([_segment_begins(ids)[:, 1:], jnp.ones_like(ids[:, :1], bool)],
                           axis=1)
    end = jax.lax.cummin(jnp.where(ends, index + 1, length), axis=1, reverse=True)
    first = start[:, ::block].min(axis=0) // block
    last = (end[:, block - 1::block].max(axis=0) - 1) // block + 1
    return first, last


def default_block(group: int) -> int:
    """Rows and keys per tile for `group` query heads per KV head: a tile's product has group x
    block query rows, and below about 512 of them the per-tile overhead of the loop dominates
    (BENCHMARKS.md, "Kernel choices on XLA:CPU"). Qwen2.5 models have 5 to 8
    query heads per KV head (128-blocks); Qwen3 0.6B-8B 2 to 4 (256), 14B-32B 5 and 8."""
    return 256 if group <= 4 else 128


# The kernels below take q [B, Hkv, n, M, D] with M = G x block rows (already scaled by
# D^-0.5), k, v [B, Hkv, n, block, D], and segments: None, or (ids [B, n, block], first [n],
# last [n]) as attend_causal builds them; they give out [n, B, Hkv, M, D] in v.dtype: the
# layout the loop over query blocks stacks, so the forward writes it without a transpose.

@jax.custom_vjp
def _blocked(q, k, v, segments):
    return _blocked_forward(q, k, v, segments)[0]


def _visible(i, j, on_diagonal, segments, group):
    """[B or 1, 1, M, block] bool: which keys of key block j each query row of query block i
    sees (causal, and within its segment)."""
    causal = ((j < i) | on_diagonal)[None, None]
    if segments is None:
        return causal
    ids = segments[0]
    rows = jnp.tile(ids[:, i], (1, group))  # [B, M]: row r is query r % block of the block
    return causal & (rows[:, None, :, None] == ids[:, j][:, None, None, :])


def _blocked_forward(q, k, v, segments):
    """-> (out [n, B, Hkv, M, D], lse [n, B, Hkv, M] float32: each query row's log-sum-exp of
    scores, which is all the backward needs to rebuild its probabilities)."""
    b, hkv, n, m, d = q.shape
    block = k.shape[3]
    on_diagonal = _on_diagonal(m, block)

    def query_block(i):
        q_i = q[:, :, i]

        def key_block(j, carry):
            running_max, normaliser, acc = carry
            scores = jnp.einsum("bhmd,bhkd->bhmk", q_i, k[:, :, j],
                                preferred_element_type=jnp.float32)
            scores = jnp.where(_visible(i, j, on_diagonal, segments, m // block), scores,
                               -jnp.inf)
            new_max = jnp.maximum(running_max, scores.max(axis=-1))
            # A row that has seen no key yet (its segment starts later) keeps max -inf: shift
            # by 0 instead, so its probabilities and rescale are exp(-inf) = 0, not NaN.
            shift = jnp.where(new_max == -jnp.inf, 0.0, new_max)
            probs = jnp.exp(scores - shift[..., None])
            rescale = jnp.exp(running_max - shift)
            normaliser = normaliser * rescale + probs.sum(axis=-1)
            acc = acc * rescale[..., None] + jnp.einsum(
                "bhmk,bhkd->bhmd", probs.astype(v.dtype), v[:, :, j],
                preferred_element_type=jnp.float32)
            return new_max, normaliser, acc

        shape = (b, hkv, m)
        init = (jnp.full(shape, -jnp.inf, jnp.float32), jnp.zeros(shape, jnp.float32),
                jnp.zeros(shape + (d,), jnp.float32))
        # Key blocks after the diagonal (and before every segment of the block) are skipped,
        # not masked: trip counts that depend on i, which is why reverse mode needs the
        # hand-written backward below.
        first = 0 if segments is None else segments[1][i]
        running_max, normaliser, acc = jax.lax.fori_loop(first, i + 1, key_block, init)
        return (acc / normaliser[..., None]).astype(v.dtype), running_max + jnp.log(normaliser)

    return jax.lax.map(query_block, jnp.arange(n))


def _blocked_fwd(q, k, v, segments):
    out, lse = _blocked_forward(q, k, v, segments)
    return out, (q, k, v, segments, out, lse)


def _blocked_bwd(residuals, d_out):
    """Flash attention's backward (Dao 2023, algorithm 2): for each key block j, the query
    blocks i >= j recompute P = exp(S - lse) tile by tile; dV_j and dK_j accumulate in the
    loop's carry, and dQ_i in a [n, ...] buffer updated in place."""
    q, k, v, segments, out, lse = residuals
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
            scores = jnp.where(_visible(i, j, on_diagonal, segments, m // block), scores,
                               -jnp.inf)
            probs = jnp.exp(scores - lse[i][..., None])
            dv_j = dv_j + f32("bhmk,bhmd->bhkd", probs.astype(v.dtype), do_i)
            d_probs = f32("bhmd,bhkd->bhmk", do_i, v_j)
            d_scores = (probs * (d_probs - delta[i][..., None])).astype(q.dtype)
            dq = dq.at[i].add(f32("bhmk,bhkd->bhmd", d_scores, k_j))
            dk_j = dk_j + f32("bhmk,bhmd->bhkd", d_scores, q_i)
            return dq, dk_j, dv_j

        zeros = jnp.zeros((b, hkv, block, d), jnp.float32)
        last = n if segments is None else segments[2][j]
        dq, dk_j, dv_j = jax.lax.fori_loop(j, last, query_block, (dq, zeros, zeros))
        return dq, (dk_j, dv_j)

    dq = jnp.zeros((n, b, hkv, m, d), jnp.float32)
    dq, (dk, dv) = jax.lax.scan(key_block, dq, jnp.arange(n))  # dk, dv [n, B, Hkv, block, D]
    dq = jnp.transpose(dq, (1, 2, 0, 3, 4)).astype(q.dtype)
    dk = jnp.transpose(dk, (1, 2, 0, 3, 4)).astype(k.dtype)
    dv = jnp.transpose(dv, (1, 2, 0, 3, 4)).astype(v.dtype)
    return dq, dk, dv, None  # the segments are integers: no cotangent


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
    XLA:CPU runs with a slower kernel; BENCHMARKS.md, "Kernel choices on XLA:CPU"). Returns
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


# block 512: fastest on XLA:CPU at decode shapes (fewer loop trips; 1024 reads far past short rows)
def attend_cache_ragged(q: jnp.ndarray, k_cache: jnp.ndarray, v_cache: jnp.ndarray,
                        lengths: jnp.ndarray, block: int = 512) -> jnp.ndarray:
    """`attend_cache` with visible[b, t, s] = s < lengths[b] that reads row b's cache only up
    to its length: q [B, T, Hq, D] (every query of a row sees the same keys); k_cache
    [B, Hkv, D, S], v_cache [B, Hkv, S, D]; lengths [B] int, 1 <= lengths[b] <= S. Returns
    [B, T, Hq, D] in v_cache.dtype. Decode only: a while loop has no reverse-mode gradient.

    The dense path reads all S entries of every row whatever its length, so a batch with one
    long row pays that row's length on each. Here the rows run one after another (lax.map),
    each over ceil(lengths[b] / block) key blocks (a while loop with a per-row trip count)
    with a running max, normaliser and weighted sum in float32, as `_blocked_forward` does:
    a row's cost follows its own length. Each block is a dynamic_slice of the cache as it
    lies, taken from the whole cache by row index (slicing a row out first, as mapping over
    the cache would, copies all S entries of it), so both products stay the plain batched
    matmuls `attend_cache` runs. Only the last block is masked: the blocks before it lie wholly
    below the length, and the last one, whose start is clamped to S - block where S is not a
    multiple of it, masks the entries it shares with the block before and those at or past
    the length, its values included (so NaN or garbage there never reaches the output, where
    the dense path's 0 * NaN would). block: keys per block (min(block, S)).
    """
    b, t, hq, d = q.shape
    hkv, s = k_cache.shape[1], k_cache.shape[3]
    g = hq // hkv
    m = g * t
    block = min(block, s)
    rows = q.reshape(b, t, hkv, g, d).transpose(0, 2, 3, 1, 4).reshape(b, hkv, m, d)
    f32 = functools.partial(jnp.einsum, preferred_element_type=jnp.float32)

    def row(args):
        i, length = args
        q_i = rows[i]

        def take(start):
            k_j = jax.lax.dynamic_slice(k_cache, (i, 0, 0, start), (1, hkv, d, block))[0]
            v_j = jax.lax.dynamic_slice(v_cache, (i, 0, start, 0), (1, hkv, block, d))[0]
            return k_j, v_j, f32("hmd,hdk->hmk", q_i, k_j) * (d ** -0.5)

        def update(carry, scores, v_j):
            running_max, normaliser, acc = carry
            # Every block holds a visible key (the loop stops at the length), so the max is
            # finite from the first block on: no -inf - -inf to guard against.
            new_max = jnp.maximum(running_max, scores.max(axis=-1))
            probs = jnp.exp(scores - new_max[..., None])
            rescale = jnp.exp(running_max - new_max)
            normaliser = normaliser * rescale + probs.sum(axis=-1)
            acc = acc * rescale[..., None] + f32("hmk,hkd->hmd", probs.astype(v_j.dtype), v_j)
            return new_max, normaliser, acc

        def full_block(j, carry):
            k_j, v_j, scores = take(j * block)
            return update(carry, scores, v_j)

        shape = (hkv, m)
        init = (jnp.full(shape, -jnp.inf, jnp.float32), jnp.zeros(shape, jnp.float32),
                jnp.zeros(shape + (d,), jnp.float32))
        last = (length - 1) // block
        carry = jax.lax.fori_loop(0, last, full_block, init)
        begin = last * block
        start = jnp.minimum(begin, s - block)
        k_j, v_j, scores = take(start)
        position = start + jnp.arange(block)
        visible = (position >= begin) & (position < length)
        scores = jnp.where(visible, scores, -jnp.inf)
        v_j = jnp.where(visible[:, None], v_j, jnp.zeros((), v_j.dtype))
        _, normaliser, acc = update(carry, scores, v_j)
        return (acc / normaliser[..., None]).astype(v_cache.dtype)

    out = jax.lax.map(row, (jnp.arange(b), lengths.astype(jnp.int32)))  # [B, Hkv, M, D]
    return out.reshape(b, hkv, g, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, hq, d)


def attend_fused(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray,
                 implementation: Literal["xla", "cudnn"] | None = None,
                 segment_ids: jnp.ndarray | None = None) -> jnp.ndarray:
    """Causal attention from position 0 (a prefill, a training forward and its gradient)
    through jax.nn.dot_product_attention: q [B, T, Hq, D]; k, v [B, T, Hkv, D].
    implementation None lets JAX choose (cuDNN flash attention on a GPU when the shapes allow;
    no T x T tensor in memory).

    segment_ids [B, T] int (packed rows): a [B, 1, T, T] same-segment mask beside the causal
    one, for implementation None / "xla" only (whose scores are [B, H, T, T] anyway).
    jax.nn.dot_product_attention (jax 0.10) has no segment ids or per-segment offsets; its
    cuDNN path would turn the mask into a [B, 1, T, T] bias, the T x T tensor that path exists
    to avoid, so "cudnn" refuses segments (cuDNN's packed layout, q/kv offsets, is reachable
    only through jax._src: docs/architecture.md, "Packed rows")."""
    if segment_ids is None:
        return jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                            implementation=implementation)
    if implementation == "cudnn":
        raise ValueError("attention 'cudnn' cannot take segment ids (packed rows): "
                         "jax.nn.dot_product_attention expresses them only as a T x T bias")
    same = segment_ids[:, None, :, None] == segment_ids[:, None, None, :]
    return jax.nn.dot_product_attention(q, k, v, mask=same, is_causal=True,
                                        implementation=implementation)
