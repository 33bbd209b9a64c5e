"""Qwen2.5 in Flax NNX and its Hugging Face / Orbax files."""

from memagent_jax.models.config import ModelConfig
from memagent_jax.models.loading import (build_model, load_model, random_model, read_config,
                                         save_checkpoint, save_hf)
from memagent_jax.models.presets import PRESETS, preset_config
from memagent_jax.models.qwen2 import KVCache, Params, Qwen2, split_params
from memagent_jax.models.sharding import job_mesh, make_mesh, param_shardings

__all__ = [
    "KVCache", "ModelConfig", "PRESETS", "Params", "Qwen2", "build_model", "load_model",
    "job_mesh", "make_mesh", "param_shardings", "preset_config", "random_model", "read_config",
    "save_checkpoint", "save_hf", "split_params",
]
