"""Qwen2.5 and Qwen3 (dense) in Flax NNX and their Hugging Face / Orbax files.

The names below load their module on first use (PEP 562 `__getattr__`): the CLI imports
`models.command` to build its parser, and importing a submodule runs this file first, so it must
not import JAX itself.
"""

import importlib

_MODULE_OF = {
    "ModelConfig": "config",
    "build_model": "loading", "load_model": "loading", "random_model": "loading",
    "read_config": "loading", "save_checkpoint": "loading", "save_hf": "loading",
    "PRESETS": "presets", "preset_config": "presets",
    "KVCache": "qwen", "Params": "qwen", "Qwen": "qwen", "split_params": "qwen",
    "job_mesh": "sharding", "make_mesh": "sharding", "param_shardings": "sharding",
}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
