"""Whether an engine fits, checked before it allocates anything: the tokens a slot must hold
against the model's context window, and the parameters, KV cache and sampling arrays against
the devices' memory. `factory.build_engine` runs both for every engine a command builds
(generate, serve, run, demo, trace, eval, train's rollouts), so a size that cannot work is one
line naming the setting that asked for it, never XLA's out-of-memory traceback or a silent
read past the window. `check_fits` is the same memory check for other work (`random-model`'s
weights).
"""

from __future__ import annotations

import jax

from memagent_jax.errors import ConfigError, UserError
from memagent_jax.hostmemory import usable_memory
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
    and its decode step's sampling arrays (`Engine.step_bytes`: they grow with the slots)
    exceed what one of its devices has (`device_memory`); `why` as for `check_window`. XLA's
    other temporaries come on top, so this refuses only what cannot fit."""
    need = engine.device_bytes() + engine.step_bytes()
    have, where = device_memory(engine_devices(engine.mesh))
    if need > have:
        slots, length = engine.config.slots, engine.config.max_len
        raise ConfigError(key, f"{why}: {_size(need)} per device (the KV cache of {slots} "
                               f"slot{'s' * (slots != 1)} x {length} tokens, the decode step's "
                               f"sampling arrays and the weights) is over the {_size(have)} "
                               f"{where}; lower it or the number of slots, or split the weights "
                               "over mesh.tensor (the engine splits them over tensor only)")


def check_fits(need: int, devices: list, what: str) -> None:
    """UserError when `need` bytes exceed what one of `devices` has (`device_memory`): `what`
    is the message up to the figure, the flags at fault and what takes the bytes ("--preset
    X: its weights take")."""
    have, where = device_memory(devices)
    if need > have:
        raise UserError(f"{what} {_size(need)}, over the {_size(have)} {where}")


def engine_devices(mesh: jax.sharding.Mesh | None) -> list:
    """This process's devices an engine on `mesh` uses (None: the first device)."""
    if mesh is None:
        return [jax.devices()[0]]
    return [d for d in mesh.devices.flat if d.process_index == jax.process_index()]


def device_memory(devices: list) -> tuple[int, str]:
    """(bytes, what they are): the smallest `bytes_limit` of the devices' `memory_stats()`
    (GPU, TPU); where a backend reports none (CPU), the host memory this process can use
    (`hostmemory.usable_memory`: what it holds and what is still available, not the memory
    other programs hold) shared among the devices."""
    stats = [d.memory_stats() or {} for d in devices]
    if all("bytes_limit" in s for s in stats):
        return (min(s["bytes_limit"] for s in stats),
                f"a {devices[0].device_kind} device may use")
    share = f", shared by {len(devices)} devices" if len(devices) > 1 else ""
    return usable_memory() // len(devices), f"of host memory this process can use{share}"


def _size(count: int) -> str:
    """1536 -> '1.5 KiB'."""
    units, power = ("B", "KiB", "MiB", "GiB", "TiB", "PiB"), 0
    while count >= 1024 ** (power + 1) and power < len(units) - 1:
        power += 1
    return f"{count / 1024 ** power:.1f} {units[power]}"
