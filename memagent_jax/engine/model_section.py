"""The `model` section of the train and eval configs: which weights and which tokenizer.

Read without JAX or the engine (a config is plain data): `engine.factory.load_model_section` loads
what it names.
"""

from __future__ import annotations

import dataclasses
import os
from typing import ClassVar, Literal

from memagent_jax import model_dir
from memagent_jax.errors import ConfigError, UserError
from memagent_jax.models import lora_config as lora
from memagent_jax.models.config import ATTENTION_CHOICES
from memagent_jax.models.presets import preset_config
from memagent_jax.tokenizer import load_tokenizer


@dataclasses.dataclass
class ModelSection:
    """The `model` section of the train and eval configs (`run` and `generate` fill it from
    --model, --tokenizer, --dtype, --attention)."""
    SECTION: ClassVar[str] = "model"
    path: str | None = None       # HF dir, memagent-jax checkpoint, or a shipped model's name
    preset: str | None = None     # random weights of a preset shape instead (needs tokenizer)
    tokenizer: str | None = None  # directory with tokenizer files (None: path)
    # The matmuls', the engine's weights' and KV cache's dtype (None: `factory.default_dtype`,
    # float32 on CPU, bfloat16 on accelerators).
    compute_dtype: Literal["float32", "bfloat16"] | None = None
    # The weights' stored dtype (None: compute_dtype; training: float32 master weights).
    param_dtype: Literal["float32", "bfloat16"] | None = None
    attention: str = "xla"        # prefill and training-forward attention (`qwen.Qwen`)
    init_seed: int = 0            # the preset's random weights
    lora: str | None = None       # a PEFT LoRA adapter directory, merged onto the weights

    def __post_init__(self):
        expand = lambda p: p and model_dir.resolve(os.path.expanduser(p))
        self.path, self.tokenizer = expand(self.path), expand(self.tokenizer)
        self.lora = self.lora and os.path.expanduser(self.lora)
        if (self.path is None) == (self.preset is None):
            raise ConfigError("model", "give exactly one of model.path (weights) and "
                                       "model.preset (random weights)")
        if self.preset is not None and self.tokenizer is None:
            raise ConfigError("model.tokenizer", "a preset model needs a tokenizer directory")
        if self.attention not in ATTENTION_CHOICES:
            raise ConfigError("model.attention", f"must be one of "
                                                 f"{', '.join(ATTENTION_CHOICES)}, got "
                                                 f"{self.attention!r}")

    def load_tokenizer(self, required: bool):
        """The tokenizer of `tokenizer` (default `path`), or None where it has no files (a
        ConfigError if `required`). Checks that the model directory or preset, and the
        adapter, exist; touches no device."""
        if self.path is not None and not os.path.isdir(self.path):
            raise ConfigError("model.path", f"'{self.path}': model directory not found")
        if self.lora is not None and not lora.is_adapter_dir(self.lora):
            raise ConfigError("model.lora", f"'{self.lora}' is not a PEFT adapter directory "
                                            f"(no {lora.ADAPTER_CONFIG})")
        if self.preset is not None:
            try:
                preset_config(self.preset)
            except UserError as e:
                raise ConfigError("model.preset", str(e)) from None
        directory = self.tokenizer or self.path
        assert directory is not None  # a preset has a tokenizer (__post_init__)
        tokenizer = load_tokenizer(directory) if os.path.isdir(directory) else None
        if tokenizer is None and required:
            from memagent_jax.models.loading import is_model_directory  # imports JAX: not at load

            if not self.tokenizer and not is_model_directory(directory):  # say that first
                raise ConfigError("model.path", f"'{self.path}' is not a model directory (no "
                                                "config.json, not a memagent-jax checkpoint)")
            key = "model.tokenizer" if self.tokenizer else "model.path"
            raise ConfigError(key, f"'{directory}' has no tokenizer files (tokenizer.json / "
                                   "tokenizer_config.json)")
        return tokenizer
