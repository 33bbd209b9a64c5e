"""The device mesh's named axes and their sizes over a job's devices (`resolve_axes`).

Standard library only: a config's `mesh` section is checked against a device count without
JAX (`rl.config.check_devices`); `sharding.make_mesh` builds the mesh from the same sizes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from memagent_jax.errors import UserError

MESH_AXES = ("data", "fsdp", "tensor")
DEFAULT_MESH = {"data": 1, "fsdp": -1, "tensor": 1}


def resolve_axes(axes: Mapping[str, int] | None, device_count: int,
                 source: str = "mesh") -> dict[str, int]:
    """Every mesh axis's size on `device_count` devices: one size may be -1 (the devices left
    over); axes not given have size 1; None is DEFAULT_MESH. `source` names the config key in
    errors (UserError)."""
    axes = dict(DEFAULT_MESH if axes is None else axes)
    for name, size in axes.items():
        if name not in MESH_AXES:
            raise UserError(f"{source}: unknown mesh axis '{name}' (known: "
                            f"{', '.join(MESH_AXES)})")
        if not isinstance(size, int) or (size < 1 and size != -1):
            raise UserError(f"{source}.{name}: size must be a positive integer or -1, got {size!r}")
    free = [n for n, s in axes.items() if s == -1]
    if len(free) > 1:
        raise UserError(f"{source}: only one axis may be -1, got {', '.join(free)}")
    fixed = math.prod(s for s in axes.values() if s != -1)
    if free:
        if device_count % fixed:
            raise UserError(f"{source}: {device_count} devices do not divide by {fixed}")
        axes[free[0]] = device_count // fixed
    if math.prod(axes.values()) != device_count:
        raise UserError(f"{source}: axis sizes {axes} need {math.prod(axes.values())} devices, "
                        f"found {device_count}")
    return {name: axes.get(name, 1) for name in MESH_AXES}
