"""Device mesh and parameter shardings: the learner's layout and the rollout's.

Parameters name a logical axis per dimension (`logical_axes` in qwen.py); a rules mapping takes
logical axes to mesh axes, as MaxText's logical axis rules do. A dimension that the mesh axis
does not divide (e.g. 4 KV heads over tensor=8) is replicated instead, so every Qwen2.5 and
Qwen3 size loads on every mesh; the cost is memory, never a wrong result.

Two layouts share the one mesh:
- `RULES`, the learner's (and the layout models load in): weights split over fsdp x tensor,
  rows over data x fsdp. A training step's matmuls have thousands of tokens a row to hide
  FSDP's weight gathers behind.
- `ROLLOUT_RULES`, the decode engine's: weights split over tensor only (Megatron's tensor
  parallelism: no matmul contracts over a split dimension, so no step gathers a weight), the
  engine's slots, KV cache and prefill rows over data x fsdp. A decode step computes one token
  a slot: gathering an fsdp-split weight there would move most of the weights over the
  interconnect every step, where reading a replica costs one HBM read. The engine reshards
  the learner's weights into it at each rollout (`engine.engine.Engine.place`).
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from memagent_jax.models.config import ModelConfig
from memagent_jax.models.mesh_axes import MESH_AXES, resolve_axes
from memagent_jax.models.qwen import Params, param_specs

# A logical axis maps to one mesh axis, or to several (split over their product, the longest
# leading run of them whose product divides the dimension).
Rules = Mapping[str, "str | tuple[str, ...] | None"]
RULES: Rules = {
    "vocab": "tensor", "embed": "fsdp", "heads": "tensor", "kv_heads": "tensor", "mlp": "tensor",
}
SLOT_AXES = ("data", "fsdp")  # the mesh axes the engine's slots split over
ROLLOUT_RULES: Rules = {**RULES, "embed": None, "batch": SLOT_AXES}


def make_mesh(axes: Mapping[str, int] | None = None, devices=None, source: str = "mesh") -> Mesh:
    """A mesh over `devices` (default: all) with the named axis sizes (see `resolve_axes`)."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = resolve_axes(axes, len(devices), source)
    return jax.make_mesh(tuple(sizes.values()), MESH_AXES,
                         axis_types=(AxisType.Auto,) * len(MESH_AXES), devices=devices)


def job_mesh(axes: Mapping[str, int] | None, source: str = "mesh") -> Mesh | None:
    """The mesh inference commands run on: `axes` over every device of the job when given;
    else one device for a one-process job, and `mesh_axes.DEFAULT_MESH` over all devices for a
    multi-process one (a model on one host's device would leave the other hosts out)."""
    if axes or jax.process_count() > 1:
        return make_mesh(axes, source=source)
    return None


def partition_spec(shape: tuple[int, ...], logical_axes: tuple[str | None, ...], mesh: Mesh,
                   rules: Rules = RULES) -> PartitionSpec:
    """Maps logical axes to mesh axes, skipping mesh axes of size 1, mesh axes an earlier
    dimension took, and any that does not divide the dim (for several: the longest leading
    run of the rest whose product divides it)."""
    spec, used = [], set()
    for dim, logical in zip(shape, logical_axes):
        wanted = rules.get(logical) if logical else None
        wanted = (wanted,) if isinstance(wanted, str) else wanted or ()
        axes, product = [], 1
        for axis in wanted:
            size = mesh.shape.get(axis, 1)
            if axis in used or size == 1:
                continue
            if dim % (product * size):
                break
            axes.append(axis)
            product *= size
        used.update(axes)
        spec.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    return PartitionSpec(*spec)


def param_shardings(config: ModelConfig, mesh: Mesh | None, rules: Rules = RULES) -> Params:
    """Every parameter's sharding, in the `Params` tree: over `mesh` by `rules`, or (mesh
    None) on the default device."""
    if mesh is None:
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        return jax.tree.map(lambda _: device, param_specs(config), is_leaf=_is_spec)
    return jax.tree.map(lambda spec: NamedSharding(mesh, partition_spec(spec[0], spec[1], mesh,
                                                                        rules)),
                        param_specs(config), is_leaf=_is_spec)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Inputs [B, ...]: the batch split over the data-parallel axes (data and fsdp)."""
    return NamedSharding(mesh, PartitionSpec(("data", "fsdp")))


def _is_spec(x) -> bool:
    """A (shape, logical axes) leaf of `param_specs`."""
    return isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], tuple)
