"""How an attention kernel run per device under `shard_map` splits its arguments over the mesh
(splash.py on TPU, flash_gpu.py on GPU)."""

from __future__ import annotations

import math

from jax.sharding import Mesh


def kernel_axes(mesh: Mesh | None, rows: int, q_heads: int, kv_heads: int
                ) -> tuple[tuple[str, ...], str | None]:
    """(the mesh axes the rows are split over, the axis the heads are split over or None):
    `data` and `fsdp` while their product divides the rows, `tensor` when it divides both
    head counts (each shard then holds whole groups of query heads with their KV head)."""
    if mesh is None:
        return (), None
    batch: tuple[str, ...] = ()
    for axis in ("data", "fsdp"):
        size = mesh.shape[axis]
        if size > 1 and rows % (math.prod(mesh.shape[a] for a in batch) * size) == 0:
            batch += (axis,)
    tensor = mesh.shape["tensor"]
    split_heads = tensor > 1 and q_heads % tensor == 0 and kv_heads % tensor == 0
    return batch, "tensor" if split_heads else None
