"""Packed rows' causal attention on GPU: jax's Pallas Triton flash attention
(`jax.experimental.pallas.ops.gpu.attention.mha`, forward and backward kernels), which takes
segment ids where jax.nn's cuDNN path does not. `attention: cudnn` runs it for a training
forward over packed rows (models/qwen.py); everything else stays on cuDNN.

The kernel takes one KV head per query head, so the KV heads are repeated to the query heads
(a [B, T, Hq, D] copy a layer, gone after it; their gradients sum back through the repeat),
and blocks whose sides are powers of two, so T is padded to a multiple of 128 (a power of two
below that) with segment id -1: padding lies after every real query and in a segment of its
own. On a mesh it runs inside `shard_map` as splash does (models/kernel_axes.py). Off GPU it
runs in Pallas's interpret mode: exact, far too slow for real work (the tests use it).
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from memagent_jax.models.kernel_axes import kernel_axes

# Query and key positions a forward program holds (jax's defaults; the backward's are 32).
_BLOCK = 128


def flash_gpu_causal(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, segment_ids: jnp.ndarray,
                     mesh: Mesh | None = None, interpret: bool | None = None) -> jnp.ndarray:
    """Causal attention within each segment: q [B, T, Hq, D]; k, v [B, T, Hkv, D];
    segment_ids [B, T] int (packed rows, each a contiguous run of one id) -> [B, T, Hq, D] in
    q.dtype (softmax in float32 inside the kernel). mesh: the mesh the arguments are sharded
    on (None: one device). interpret: Pallas's interpret mode (None: off GPU)."""
    from jax.experimental.pallas.ops.gpu.attention import BlockSizes, mha

    b, t, hq, d = q.shape
    hkv = k.shape[2]
    padded = -(-t // _BLOCK) * _BLOCK if t > _BLOCK else max(16, 1 << (t - 1).bit_length())
    pad = ((0, 0), (0, padded - t), (0, 0), (0, 0))
    q, k, v = jnp.pad(q, pad), jnp.pad(k, pad), jnp.pad(v, pad)
    ids = jnp.pad(segment_ids.astype(jnp.int32), ((0, 0), (0, padded - t)), constant_values=-1)
    if interpret is None:
        platform = (mesh.devices.flat[0] if mesh is not None else jax.devices()[0]).platform
        interpret = platform != "gpu"
    if interpret:
        warnings.warn("packed rows under attention 'cudnn' off GPU run the Triton kernel in "
                      "Pallas's interpret mode: exact, but for tests only", stacklevel=2)
    kernel = functools.partial(mha, sm_scale=d ** -0.5, causal=True, interpret=interpret,
                               block_sizes=BlockSizes.get_default())

    def run(q, k, v, ids):
        group = q.shape[2] // k.shape[2]
        return kernel(q, jnp.repeat(k, group, axis=2), jnp.repeat(v, group, axis=2),
                      segment_ids=ids)

    if mesh is None:
        out = run(q, k, v, ids)
    else:
        batch_axes, head_axis = kernel_axes(mesh, b, hq, hkv)
        spec = PartitionSpec(batch_axes or None, None, head_axis, None)
        out = jax.shard_map(run, mesh=mesh, in_specs=(spec, spec, spec,
                                                      PartitionSpec(batch_axes or None, None)),
                            out_specs=spec, check_vma=False)(q, k, v, ids)
    return out[:, :t]
