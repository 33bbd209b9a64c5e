"""A model directory on the local decoding engine: the set-up `run`, `generate` and `eval` share."""

from __future__ import annotations

import os
from typing import Callable, NamedTuple

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


def load_engine(model_path: str, *, max_len: int | Callable[[ModelConfig], int], slots: int,
                dtype: str | None = None, attention: str = "xla",
                mesh: jax.sharding.Mesh | None = None,
                prefill_buckets: tuple[int, ...] | None = None,
                prefill_rows: int = 1) -> LocalModel:
    """Loads an HF or checkpoint directory onto an Engine of `slots` slots x `max_len` KV
    entries (or max_len(model config), for callers sized by the model's context length);
    dtype None picks `default_dtype()`; prefill_buckets None: the engine's default buckets
    (given ones get max_len added, so every prompt that fits the cache has a bucket);
    prefill_rows: prompts prefilled per call (EngineConfig)."""
    if not os.path.isdir(model_path):
        raise UserError(f"{model_path}: model directory not found")
    model, config = load_model(model_path, dtype=dtype or default_dtype(), mesh=mesh,
                               attention=attention)
    if callable(max_len):
        max_len = max_len(config)
    if prefill_buckets:
        if max(prefill_buckets) > max_len:
            raise UserError(f"prefill bucket {max(prefill_buckets)} exceeds the KV length "
                            f"{max_len}")
        prefill_buckets = tuple(sorted(set(prefill_buckets) | {max_len}))
    engine = Engine(model, EngineConfig(slots, max_len, prefill_buckets, prefill_rows),
                    mesh=mesh)
    return LocalModel(engine, config, stop_token_ids(model_path, config))
