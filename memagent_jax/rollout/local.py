"""A model directory on the local decoding engine: the set-up `run`, `generate` and `eval` share."""

from __future__ import annotations

import os
from typing import NamedTuple

import jax

from memagent_jax.errors import UserError
from memagent_jax.models import ModelConfig, load_model
from memagent_jax.rollout.engine import Engine, EngineConfig
from memagent_jax.tokenizer import stop_token_ids


class LocalModel(NamedTuple):
    engine: Engine
    config: ModelConfig
    stop_ids: tuple[int, ...]  # the model's EOS ids (generation_config.json, else config.json)


def default_dtype() -> str:
    """float32 on CPU (XLA:CPU bf16 matmuls measured ~15x slower), bfloat16 on GPU/TPU."""
    return "float32" if jax.default_backend() == "cpu" else "bfloat16"


def load_engine(model_path: str, *, max_len: int, slots: int, dtype: str | None = None,
                attention: str = "xla", mesh: jax.sharding.Mesh | None = None) -> LocalModel:
    """Loads an HF or checkpoint directory onto an Engine of `slots` slots x `max_len` KV
    entries; dtype None picks `default_dtype()`."""
    if not os.path.isdir(model_path):
        raise UserError(f"{model_path}: model directory not found")
    model, config = load_model(model_path, dtype=dtype or default_dtype(), mesh=mesh,
                               attention=attention)
    engine = Engine(model, EngineConfig(slots=slots, max_len=max_len), mesh=mesh)
    return LocalModel(engine, config, stop_token_ids(model_path, config))
