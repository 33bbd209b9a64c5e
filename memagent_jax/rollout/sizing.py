"""Whether an engine fits, checked before it allocates anything: the tokens a slot must hold
against the model's context window, and the parameters and KV cache against the devices'
memory. `factory.build_engine` runs both for every engine a command builds (generate, serve,
run, demo, trace, eval, train's rollouts), so a size that cannot work is one line naming the
setting that asked for it, never XLA's out-of-memory traceback or a silent read past the
window.
"""

from __future__ import annotations

import os

import jax

from memagent_jax.errors import ConfigError
from memagent_jax.models.config import ModelConfig


def check_window(config: ModelConfig, tokens: int, key: str, why: str) -> None:
    """ConfigError(key) when a slot must hold more than the model's context window: `why` is
    the setting's value and how it makes `tokens` (the message's start, after the key). vLLM
    refuses a max_model_len over the model's window the same way."""
    window = config.context_window
    if tokens > window:
        if config.rope_scaling:
            source = "YaRN: original_max_position_embeddings x factor in config.json"
        else:
            source = "config.json max_position_embeddings"
        raise ConfigError(key, f"{why}: over the model's context window of {window} tokens "
                               f"({source})")


def check_memory(engine, key: str, why: str) -> None:
    """ConfigError(key) when `engine`'s parameters and decode state (`Engine.device_bytes`)
    exceed what one of its devices has (`device_memory`); `why` as for `check_window`. XLA's
    temporaries come on top, so this refuses only what cannot fit."""
    need = engine.device_bytes()
    have, where = device_memory(engine_devices(engine.mesh))
    if need > have:
        slots, length = engine.config.slots, engine.config.max_len
        raise ConfigError(key, f"{why}: {_size(need)} per device (the KV cache of {slots} "
                               f"slots x {length} tokens, and the weights) is over the "
                               f"{_size(have)} {where}; lower it or the number of slots, "
                               "or split the weights over mesh.tensor (the engine splits them "
                               "over tensor only)")


def engine_devices(mesh: jax.sharding.Mesh | None) -> list:
    """This process's devices an engine on `mesh` uses (None: the first device)."""
    if mesh is None:
        return [jax.devices()[0]]
    return [d for d in mesh.devices.flat if d.process_index == jax.process_index()]


def device_memory(devices: list) -> tuple[int, str]:
    """(bytes, what they are): the smallest `bytes_limit` of the devices' `memory_stats()`
    (GPU, TPU); where a backend reports none (CPU), the host's physical memory shared among
    the devices."""
    stats = [d.memory_stats() or {} for d in devices]
    if all("bytes_limit" in s for s in stats):
        return (min(s["bytes_limit"] for s in stats),
                f"a {devices[0].device_kind} device may use")
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    share = f" shared by {len(devices)} devices" if len(devices) > 1 else ""
    return host // len(devices), f"of host memory{share}"


def _size(count: int) -> str:
    """1536 -> '1.5 KiB'."""
    units, power = ("B", "KiB", "MiB", "GiB", "TiB", "PiB"), 0
    while count >= 1024 ** (power + 1) and power < len(units) - 1:
        power += 1
    return f"{count / 1024 ** power:.1f} {units[power]}"
