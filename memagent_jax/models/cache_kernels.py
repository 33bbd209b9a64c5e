"""Pallas kernels for the decode step's ragged cache read on TPU and GPU: the contract of
`attention.attend_cache_ragged` (each row read only up to its own length), over the cache as
the engine holds it, k_cache [B, Hkv, D, S] (keys transposed) and v_cache [B, Hkv, S, D], so
nothing is copied or re-laid out for them.

Both keep a running max, normaliser and weighted sum in float32 over key blocks (flash
decoding without a split of the keys), one program per (row, KV head), the query heads of a
group and the step's queries (M = Hq / Hkv * T, padded) as the rows of one matmul:

- `attend_cache_ragged_tpu` (Mosaic): grid (B, Hkv, ceil(S / block)); the lengths are
  prefetched scalars, and a block at or past a row's length maps to the row's last needed
  block, so the pipeline fetches nothing new for it and its compute is skipped.
- `attend_cache_ragged_gpu` (Triton): grid (B, Hkv); each program loops over its row's
  ceil(length / block) blocks with masked loads.

Off their platform both run in Pallas's interpret mode (exact, slow: the tests use it).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pl_triton

# Keys a TPU grid step reads: 512 x D=128 in bf16 is 128 KiB of keys and of values, double
# buffered in VMEM; bigger blocks cut per-step overhead, smaller ones read less past a length.
TPU_BLOCK = 512
# Keys a GPU loop trip reads (Triton's tiles hold powers of two).
GPU_BLOCK = 64


def attend_cache_ragged_tpu(q: jnp.ndarray, k_cache: jnp.ndarray, v_cache: jnp.ndarray,
                            lengths: jnp.ndarray, block: int = TPU_BLOCK,
                            interpret: bool = False) -> jnp.ndarray:
    """`attend_cache_ragged` as a Mosaic TPU kernel: q [B, T, Hq, D]; k_cache [B, Hkv, D, S],
    v_cache [B, Hkv, S, D]; lengths [B] int, 1 <= lengths[b] <= S -> [B, T, Hq, D] in
    v_cache.dtype. block: keys a grid step reads (min(block, S); a multiple of 128 on TPU
    unless it is S)."""
    b, t, hq, d = q.shape
    hkv, s = k_cache.shape[1], k_cache.shape[3]
    block = min(block, s)
    rows, m = _query_rows(q, hkv, multiple=16)
    padded = rows.shape[2]

    def last_needed(j, length):  # lax.div: lengths are positive, and `//` lowers a sign op
        return jnp.minimum(j, jax.lax.div(length - 1, block))

    def kernel(lengths_ref, q_ref, k_ref, v_ref, o_ref, max_ref, sum_ref, acc_ref):
        i, j = pl.program_id(0), pl.program_id(2)
        length = lengths_ref[i]

        @pl.when(j == 0)
        def _():
            max_ref[...] = jnp.full(max_ref.shape, -jnp.inf, jnp.float32)
            sum_ref[...] = jnp.zeros(sum_ref.shape, jnp.float32)
            acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

        @pl.when(j * block < length)
        def _():
            scores = jnp.dot(q_ref[0, 0], k_ref[0, 0], preferred_element_type=jnp.float32)
            key = j * block + jax.lax.broadcasted_iota(jnp.int32, scores.shape, 1)
            scores = jnp.where(key < length, scores * (d ** -0.5), -jnp.inf)
            value_key = j * block + jax.lax.broadcasted_iota(jnp.int32, (block, d), 0)
            # Entries past the length (or past S in a last partial block) may hold anything.
            values = jnp.where(value_key < length, v_ref[0, 0], jnp.zeros((), v_ref.dtype))
            running = max_ref[...]
            new_max = jnp.maximum(running, scores.max(axis=-1, keepdims=True))
            probs = jnp.exp(scores - new_max)
            rescale = jnp.exp(running - new_max)
            max_ref[...] = new_max
            sum_ref[...] = sum_ref[...] * rescale + probs.sum(axis=-1, keepdims=True)
            acc_ref[...] = acc_ref[...] * rescale + jnp.dot(
                probs.astype(values.dtype), values, preferred_element_type=jnp.float32)

        @pl.when(j == pl.num_programs(2) - 1)
        def _():
            o_ref[0, 0] = (acc_ref[...] / sum_ref[...]).astype(o_ref.dtype)

    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((b, hkv, padded, d), v_cache.dtype),
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=1,
            grid=(b, hkv, pl.cdiv(s, block)),
            in_specs=[
                pl.BlockSpec((1, 1, padded, d), lambda i, h, j, n: (i, h, 0, 0)),
                pl.BlockSpec((1, 1, d, block),
                             lambda i, h, j, n: (i, h, 0, last_needed(j, n[i]))),
                pl.BlockSpec((1, 1, block, d),
                             lambda i, h, j, n: (i, h, last_needed(j, n[i]), 0)),
            ],
            out_specs=pl.BlockSpec((1, 1, padded, d), lambda i, h, j, n: (i, h, 0, 0)),
            scratch_shapes=[pltpu.VMEM((padded, 1), jnp.float32),
                            pltpu.VMEM((padded, 1), jnp.float32),
                            pltpu.VMEM((padded, d), jnp.float32)]),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret,
    )(lengths.astype(jnp.int32), rows, k_cache, v_cache)
    return _heads_back(out, m, t, hq)


def attend_cache_ragged_gpu(q: jnp.ndarray, k_cache: jnp.ndarray, v_cache: jnp.ndarray,
                            lengths: jnp.ndarray, block: int = GPU_BLOCK,
                            interpret: bool = False) -> jnp.ndarray:
    """`attend_cache_ragged` as a Triton kernel: q [B, T, Hq, D]; k_cache [B, Hkv, D, S],
    v_cache [B, Hkv, S, D]; lengths [B] int, 1 <= lengths[b] <= S -> [B, T, Hq, D] in
    v_cache.dtype. block: keys a loop trip reads (a power of two from 16). Triton's tiles have
    sides that are powers of two from 16: M and D are padded to them (D by masked loads, so
    the cache is not copied)."""
    b, t, hq, d = q.shape
    hkv = k_cache.shape[1]
    rows, m = _query_rows(q, hkv, multiple=16, power_of_two=True)
    padded, dim = rows.shape[2], _power_of_two(d, 16)
    rows = jnp.pad(rows, ((0, 0), (0, 0), (0, 0), (0, dim - d)))

    def kernel(lengths_ref, q_ref, k_ref, v_ref, o_ref):
        i, h = pl.program_id(0), pl.program_id(1)
        length = lengths_ref[i]
        query = q_ref[...]  # [M', D']
        offsets = jnp.arange(block)
        inside = jnp.arange(dim) < d

        def step(j, carry):
            running, total, acc = carry
            visible = j * block + offsets < length  # keeps every load inside: length <= S
            keys = pl_triton.load(k_ref.at[i, h, pl.ds(0, dim), pl.ds(j * block, block)],
                                  mask=inside[:, None] & visible[None, :], other=0.0)
            scores = pl_triton.dot(query, keys).astype(jnp.float32) * (d ** -0.5)
            scores = jnp.where(visible[None, :], scores, -jnp.inf)  # [M', block]
            new_max = jnp.maximum(running, scores.max(axis=-1))
            probs = jnp.exp(scores - new_max[:, None])
            rescale = jnp.exp(running - new_max)
            values = pl_triton.load(v_ref.at[i, h, pl.ds(j * block, block), pl.ds(0, dim)],
                                    mask=visible[:, None] & inside[None, :], other=0.0)
            acc = acc * rescale[:, None] + pl_triton.dot(probs.astype(values.dtype), values)
            return new_max, total * rescale + probs.sum(axis=-1), acc

        init = (jnp.full((padded,), -jnp.inf, jnp.float32), jnp.zeros((padded,), jnp.float32),
                jnp.zeros((padded, dim), jnp.float32))
        _, total, acc = jax.lax.fori_loop(0, pl.cdiv(length, block), step, init)
        o_ref[...] = (acc / total[:, None]).astype(o_ref.dtype)

    out = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((b, hkv, padded, dim), v_cache.dtype),
        grid=(b, hkv),
        in_specs=[
            pl.BlockSpec(memory_space=pl.ANY),  # lengths, the caches: indexed in the kernel
            pl.BlockSpec((None, None, padded, dim), lambda i, h: (i, h, 0, 0)),
            pl.BlockSpec(memory_space=pl.ANY),
            pl.BlockSpec(memory_space=pl.ANY),
        ],
        out_specs=pl.BlockSpec((None, None, padded, dim), lambda i, h: (i, h, 0, 0)),
        compiler_params=pl_triton.CompilerParams(num_warps=4, num_stages=2),
        interpret=interpret,
    )(lengths.astype(jnp.int32), rows, k_cache, v_cache)
    return _heads_back(out[..., :d], m, t, hq)


def _query_rows(q: jnp.ndarray, hkv: int, multiple: int,
                power_of_two: bool = False) -> tuple[jnp.ndarray, int]:
    """q [B, T, Hq, D] as each KV head's rows [B, Hkv, M', D] (a group's query heads, then
    the step's queries), M = Hq / Hkv * T zero-padded to M' (a multiple of `multiple`, or a
    power of two from it); returns (rows, M)."""
    b, t, hq, d = q.shape
    m = hq // hkv * t
    rows = q.reshape(b, t, hkv, hq // hkv, d).transpose(0, 2, 3, 1, 4).reshape(b, hkv, m, d)
    padded = _power_of_two(m, multiple) if power_of_two else -(-m // multiple) * multiple
    return jnp.pad(rows, ((0, 0), (0, 0), (0, padded - m), (0, 0))), m


def _power_of_two(n: int, least: int) -> int:
    """The smallest power of two >= n and >= least."""
    return max(least, 1 << (n - 1).bit_length())


def _heads_back(out: jnp.ndarray, m: int, t: int, hq: int) -> jnp.ndarray:
    """[B, Hkv, M', D] rows back to [B, T, Hq, D] (the padding dropped)."""
    b, hkv, _, d = out.shape
    return (out[:, :, :m].reshape(b, hkv, hq // hkv, t, d).transpose(0, 3, 1, 2, 4)
            .reshape(b, t, hq, d))

