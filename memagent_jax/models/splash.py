"""Splash attention: TPU's Pallas flash-attention kernel for causal attention from position 0
(a prefill, a training forward and its gradient), as `attention: splash`.

The kernel (`jax.experimental.pallas.ops.tpu.splash_attention`) takes one example's
q [Hq, T, D] and k, v [Hkv, T, D] (grouped query heads in order, Hq a multiple of Hkv) and a
mask it turns into block-sparsity tables at trace time, so the blocks above the diagonal are
neither loaded nor computed, in the forward and in its dq / dkv backward kernels. On a mesh it
runs inside `shard_map`, as MaxText does: rows split over the mesh's `data` and `fsdp` axes and
heads over `tensor` where they divide, the kernel's tables split like the heads
(`manual_sharding_spec`). Off TPU it runs in Pallas's interpret mode: the same kernel code,
exact but far too slow for real work (the parity tests use it).
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from memagent_jax.models.kernel_axes import kernel_axes

# Query and key block sizes tried, largest first: a block must divide the padded length, and
# on TPU be a multiple of 128 (the lane width).
_BLOCKS = (512, 256, 128)


def splash_causal(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, mesh: Mesh | None = None,
                  segment_ids: jnp.ndarray | None = None) -> jnp.ndarray:
    """Causal attention where query i sees keys 0..i: q [B, T, Hq, D], k, v [B, T, Hkv, D]
    -> [B, T, Hq, D] in q.dtype (softmax in float32 inside the kernel). mesh: the mesh the
    arguments are sharded on (None: one device). Rows padded at their end are fine: padding
    comes after every real query. segment_ids [B, T] int (packed rows): query i sees only the
    keys j <= i with its segment id, the kernel's `SegmentIds` (masked inside the causal
    blocks it computes; blocks wholly across segments are computed and masked, not skipped)."""
    b, t, hq, d = q.shape
    hkv = k.shape[2]
    padded = -(-t // _BLOCKS[-1]) * _BLOCKS[-1]
    if padded != t:  # padded keys lie after every real query, so the causal mask hides them
        pad = ((0, 0), (0, padded - t), (0, 0), (0, 0))
        q, k, v = jnp.pad(q, pad), jnp.pad(k, pad), jnp.pad(v, pad)
    ids = None
    if segment_ids is not None:  # the padding: a segment of its own, after every real query
        ids = jnp.pad(segment_ids.astype(jnp.int32), ((0, 0), (0, padded - t)),
                      constant_values=-1)
    # The kernel's layout: heads before positions ([B, H, T, D]); the scale is ours to apply.
    q = (q * jnp.asarray(d ** -0.5, q.dtype)).swapaxes(1, 2)
    k, v = k.swapaxes(1, 2), v.swapaxes(1, 2)
    platform = (mesh.devices.flat[0] if mesh is not None else jax.devices()[0]).platform
    interpret = platform != "tpu"
    if interpret:
        warnings.warn("attention 'splash' off TPU runs Pallas's interpret mode: exact, but "
                      "for tests only (use 'xla' or 'cudnn' here)", stacklevel=2)
    batch_axes, head_axis = kernel_axes(mesh, b, hq, hkv)
    heads = 1 if head_axis is None or mesh is None else mesh.shape[head_axis]
    kernel = _kernel(padded, hq, heads, interpret)
    def run(kernel, q, k, v, ids):
        if ids is None:
            return jax.vmap(kernel)(q, k, v)
        return jax.vmap(lambda q, k, v, ids: kernel(
            q, k, v, segment_ids=_segment_ids_type()(ids, ids)))(q, k, v, ids)

    if mesh is None:
        out = run(kernel, q, k, v, ids)
    else:
        spec = PartitionSpec(batch_axes or None, head_axis, None, None)
        tables = kernel.manual_sharding_spec(NamedSharding(mesh, PartitionSpec(head_axis, None)))
        id_spec = None if ids is None else PartitionSpec(batch_axes or None, None)
        out = jax.shard_map(run, mesh=mesh, in_specs=(tables, spec, spec, spec, id_spec),
                            out_specs=spec, check_vma=False)(kernel, q, k, v, ids)
    return out.swapaxes(1, 2)[:, :t]


def _segment_ids_type():
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel
    return splash_attention_kernel.SegmentIds


@functools.lru_cache(maxsize=32)
def _kernel(length: int, q_heads: int, head_shards: int, interpret: bool):
    """The causal kernel for `length` positions and `q_heads` heads, its tables built for
    `head_shards` shards of the heads (numpy work at trace time, hence cached)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    block = next(b for b in _BLOCKS if length % b == 0)
    mask = masks.MultiHeadMask([masks.CausalMask((length, length))] * q_heads)
    sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                              block_q_dkv=block, block_kv_dkv=block,
                              block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    with jax.ensure_compile_time_eval():  # concrete tables, not the first caller's tracers
        return splash.make_splash_mha(mask, block_sizes=sizes, head_shards=head_shards,
                                      q_seq_shards=1, interpret=interpret)
