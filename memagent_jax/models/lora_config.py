"""The `learner.lora` section of a train config and what names a PEFT adapter directory: plain
data (no JAX), read with the config."""

from __future__ import annotations

import dataclasses
import os
from typing import ClassVar

from memagent_jax.errors import ConfigError

ADAPTER_CONFIG = "adapter_config.json"  # what makes a directory a PEFT adapter


def is_adapter_dir(path: str) -> bool:
    """Whether `path` is a PEFT adapter directory (it holds ADAPTER_CONFIG)."""
    return os.path.isfile(os.path.join(path, ADAPTER_CONFIG))


# Our short names of the adapted projections, and PEFT's module names for them (Qwen2/Qwen3).
PEFT_MODULES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj",
                "gate": "gate_proj", "up": "up_proj", "down": "down_proj"}


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters on the named projections of every layer: W + (alpha / rank) A B, A
    [in, rank], B [rank, out] (models/lora.py). Default targets: every linear layer of
    attention and MLP (docs/lora.md says why)."""
    SECTION: ClassVar[str] = "learner.lora"
    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = tuple(PEFT_MODULES)

    def __post_init__(self):
        if self.rank < 1:
            raise ConfigError("learner.lora.rank", f"must be >= 1, got {self.rank}")
        if not self.alpha > 0:
            raise ConfigError("learner.lora.alpha", f"must be positive, got {self.alpha}")
        unknown = [t for t in self.targets if t not in PEFT_MODULES]
        if unknown or not self.targets or len(set(self.targets)) != len(self.targets):
            raise ConfigError("learner.lora.targets", f"must be distinct names among "
                                                      f"{', '.join(PEFT_MODULES)}, got "
                                                      f"{list(self.targets)}")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank
