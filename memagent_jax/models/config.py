"""Model configuration: Qwen2 / Qwen3 hyper-parameters read from (and written back to) HF
config.json.

The two architectures differ in the attention only (`qwen.Attention`): Qwen2 adds biases to the
q/k/v projections; Qwen3 has none and normalises each query and key head (RMSNorm over
head_dim) before the rotary positions. `head_dim` is read as given (Qwen3's is 128 whatever
hidden_size / num_attention_heads is). Qwen3's mixture-of-experts models (Qwen3MoeForCausalLM)
are not supported.

Hugging Face config files carry the rotary settings in one of two forms:
- older: top-level `rope_theta` and `rope_scaling` ({"type"|"rope_type": "yarn", "factor": ...});
- transformers 5: one `rope_parameters` dict holding `rope_theta`, `rope_type` and the scaling keys.
Both are read. `to_hf_dict` writes both as well, so exports load in transformers 4 and 5 alike.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Literal

from memagent_jax.errors import UserError

# model_type -> the architecture name HF writes for it.
ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
SUPPORTED_ROPE_TYPES = ("default", "yarn")
# How the model attends from position 0 (prefill, the training forward): see `qwen.Qwen`.
ATTENTION_CHOICES = ("xla", "dot_product", "cudnn", "splash")
# What the backward keeps of each layer's forward (`qwen.REMAT_POLICIES`; `learner.remat`).
Remat = Literal["none", "matmuls", "full"]
# Keys this class models itself; everything else in a source config.json is carried over verbatim.
_MODELED_KEYS = {
    "architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size",
    "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
    "rope_theta", "rope_scaling", "rope_parameters", "max_position_embeddings",
    "tie_word_embeddings", "hidden_act", "torch_dtype", "dtype", "use_sliding_window",
    "attention_bias",
}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Qwen2 / Qwen3 hyper-parameters. `model_type` is config.json's ("qwen2" or "qwen3").
    `rope_scaling` is None or a dict with `rope_type` "yarn" and the YaRN keys (`factor`,
    `original_max_position_embeddings`, optional `beta_fast`, `beta_slow`,
    `attention_factor`, `mscale`, `mscale_all_dim`, `truncate`)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    dtype: str = "float32"  # the dtype the weights are stored in (HF `torch_dtype`)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # other config.json keys
    model_type: str = "qwen2"

    def __post_init__(self):
        if self.model_type not in ARCHITECTURES:
            raise ValueError(f"model_type must be one of {list(ARCHITECTURES)}, "
                             f"got {self.model_type!r}")

    @property
    def qkv_bias(self) -> bool:
        """Biases on the q, k and v projections (Qwen2)."""
        return self.model_type == "qwen2"

    @property
    def qk_norm(self) -> bool:
        """RMSNorm of every query and key head before the rotary positions (Qwen3)."""
        return self.model_type == "qwen3"

    @property
    def untied(self) -> bool:
        """An LM head of its own (not the embedding table)."""
        return not self.tie_word_embeddings

    @property
    def heads_per_kv_head(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def context_window(self) -> int:
        """Positions the model is made for: max_position_embeddings, or YaRN's extended
        window (original_max_position_embeddings x factor) when its rope scaling is on."""
        scaling = self.rope_scaling or {}
        if scaling.get("rope_type") == "yarn":
            return int(scaling.get("original_max_position_embeddings",
                                   self.max_position_embeddings) * scaling.get("factor", 1.0))
        return self.max_position_embeddings

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], source: str = "config.json") -> ModelConfig:
        """Reads an HF config dict; `source` names the file in error messages."""
        archs = d.get("architectures") or []
        model_type = d.get("model_type")
        if model_type not in ARCHITECTURES or (archs and ARCHITECTURES[model_type] not in archs):
            found = ",".join(archs) or f"model_type={model_type}"
            raise UserError(f"{source}: unsupported architecture '{found}' "
                            f"(supported: {', '.join(ARCHITECTURES.values())})")
        if d.get("hidden_act", "silu") != "silu":
            raise UserError(f"{source}: key 'hidden_act' = {d['hidden_act']!r} is not supported "
                            "(Qwen2 and Qwen3 use 'silu')")
        if d.get("use_sliding_window") or "sliding_attention" in (d.get("layer_types") or ()):
            raise UserError(f"{source}: sliding-window attention ('use_sliding_window' / "
                            "'layer_types') is not supported (Qwen2.5 and Qwen3 checkpoints "
                            "use full attention)")
        if model_type == "qwen3" and d.get("attention_bias"):
            raise UserError(f"{source}: key 'attention_bias' = true is not supported "
                            "(Qwen3 checkpoints have no attention biases)")
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads"):
            if not isinstance(d.get(key), int) or d[key] <= 0:
                raise UserError(f"{source}: key '{key}' must be a positive integer, "
                                f"got {d.get(key)!r}")
        heads = d["num_attention_heads"]
        kv_heads = d.get("num_key_value_heads") or heads
        if heads % kv_heads:
            raise UserError(f"{source}: num_attention_heads={heads} is not a multiple of "
                            f"num_key_value_heads={kv_heads}")
        rope_theta, rope_scaling = _read_rope(d, source)
        return cls(
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=kv_heads,
            # transformers' default where config.json has none: Qwen3Config's 128, Qwen2's
            # hidden / heads.
            head_dim=d.get("head_dim") or (128 if model_type == "qwen3"
                                           else d["hidden_size"] // heads),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(d.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            dtype=str(d.get("torch_dtype") or d.get("dtype") or "float32"),
            extra={k: v for k, v in d.items() if k not in _MODELED_KEYS},
            model_type=model_type,
        )

    @classmethod
    def from_file(cls, path: str) -> ModelConfig:
        if not os.path.isfile(path):
            raise UserError(f"{path}: not found")
        try:
            with open(path) as f:
                d = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"{path}: not valid JSON ({e})") from None
        if not isinstance(d, dict):
            raise UserError(f"{path}: expected a JSON object")
        return cls.from_hf_dict(d, source=path)

    def to_hf_dict(self) -> dict[str, Any]:
        rope = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling:
            rope.update(self.rope_scaling)
        d = dict(self.extra)
        d.update(
            architectures=[ARCHITECTURES[self.model_type]],
            model_type=self.model_type,
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            hidden_act="silu",
            rms_norm_eps=self.rms_norm_eps,
            max_position_embeddings=self.max_position_embeddings,
            tie_word_embeddings=self.tie_word_embeddings,
            use_sliding_window=False,
            rope_parameters=rope,
            # transformers 4.x reads these two; transformers 5 folds them into rope_parameters.
            rope_theta=self.rope_theta,
            rope_scaling=dict(self.rope_scaling, type="yarn") if self.rope_scaling else None,
            torch_dtype=self.dtype,
        )
        if self.model_type == "qwen3":
            d["attention_bias"] = False
        return d

    def replace(self, **changes) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def __hash__(self) -> int:
        # Modules keep their config as static data, which jit caches by hash; dict fields
        # would make the generated dataclass hash fail.
        return hash(json.dumps(dataclasses.asdict(self), sort_keys=True, default=str))


def _read_rope(d: dict[str, Any], source: str) -> tuple[float, dict[str, Any] | None]:
    """Returns (theta, yarn scaling dict or None) from either config form."""
    params = d.get("rope_parameters")
    if params is not None:
        key = "rope_parameters"
        if not isinstance(params, dict):
            raise UserError(f"{source}: key 'rope_parameters' must be an object")
        if "rope_type" not in params and "type" not in params and "full_attention" in params:
            params = params["full_attention"]  # per-layer-type form; one type here
        theta = params.get("rope_theta", d.get("rope_theta", 10000.0))
        scaling = dict(params)
    else:
        key = "rope_scaling"
        theta = d.get("rope_theta", 10000.0)
        scaling = dict(d.get("rope_scaling") or {})
    rope_type = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
    scaling.pop("type", None)
    scaling.pop("rope_theta", None)
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UserError(f"{source}: unsupported rope type '{rope_type}' in key '{key}' "
                        f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})")
    if not isinstance(theta, (int, float)) or theta <= 0:
        raise UserError(f"{source}: key 'rope_theta' must be a positive number, got {theta!r}")
    if rope_type == "default":
        return float(theta), None
    if not isinstance(scaling.get("factor"), (int, float)) or scaling["factor"] < 1:
        raise UserError(f"{source}: yarn rope scaling needs a 'factor' >= 1 in key '{key}'")
    scaling.setdefault("original_max_position_embeddings", d.get("max_position_embeddings", 32768))
    scaling["rope_type"] = "yarn"
    return float(theta), scaling
