"""Qwen2.5 and Qwen3 (dense) shapes (docs/algorithm.md section 6) as HF config dicts, plus
test shapes.

A preset is what the checkpoint's config.json says, so `ModelConfig.from_hf_dict` reads it
like any downloaded model, and `memagent-jax random-model` can write a random-weight stand-in
for benchmarks on machines that cannot download the real weights.
"""

from __future__ import annotations

from memagent_jax.errors import UserError
from memagent_jax.models.config import ARCHITECTURES, ModelConfig

# name: (model_type, hidden, layers, q heads, kv heads, head dim (None: hidden / q heads),
#        intermediate, embedding rows, tied head)
_SHAPES = {
    "qwen2.5-0.5b": ("qwen2", 896, 24, 14, 2, None, 4864, 151936, True),
    "qwen2.5-1.5b": ("qwen2", 1536, 28, 12, 2, None, 8960, 151936, True),
    "qwen2.5-3b": ("qwen2", 2048, 36, 16, 2, None, 11008, 151936, True),
    "qwen2.5-7b": ("qwen2", 3584, 28, 28, 4, None, 18944, 152064, False),
    "qwen2.5-14b": ("qwen2", 5120, 48, 40, 8, None, 13824, 152064, False),
    "qwen2.5-32b": ("qwen2", 5120, 64, 40, 8, None, 27648, 152064, False),
    "qwen2.5-72b": ("qwen2", 8192, 80, 64, 8, None, 29568, 152064, False),
    "qwen3-0.6b": ("qwen3", 1024, 28, 16, 8, 128, 3072, 151936, True),
    "qwen3-1.7b": ("qwen3", 2048, 28, 16, 8, 128, 6144, 151936, True),
    "qwen3-4b": ("qwen3", 2560, 36, 32, 8, 128, 9728, 151936, True),
    "qwen3-8b": ("qwen3", 4096, 36, 32, 8, 128, 12288, 151936, False),
    "qwen3-14b": ("qwen3", 5120, 40, 40, 8, 128, 17408, 151936, False),
    "qwen3-32b": ("qwen3", 5120, 64, 64, 8, 128, 25600, 151936, False),
    # Not a real model: small enough for tests and the README's demo on a laptop CPU.
    "tiny": ("qwen2", 64, 2, 4, 2, None, 128, 512, False),
    # Not a real model: tiny's Qwen3 counterpart (head_dim 32 against hidden / heads = 16).
    "tiny-qwen3": ("qwen3", 64, 2, 4, 2, 32, 128, 512, False),
    # Not a real model: the synthetic tasks' agent (synthetic/tasks.py's ~4K-word vocabulary).
    "small": ("qwen2", 128, 4, 4, 2, None, 384, 4096, True),
}
# Positions a Qwen3 config.json declares (its native window is 32,768; model cards enable YaRN,
# factor 4 over 32,768, for longer inputs).
_MAX_POSITIONS = {"qwen2": 32768, "qwen3": 40960}
PRESETS = tuple(_SHAPES)


def preset_hf_dict(name: str, dtype: str = "bfloat16") -> dict:
    """The config.json of the named preset."""
    if name not in _SHAPES:
        raise UserError(f"unknown preset '{name}' (choose from: {', '.join(PRESETS)})")
    model_type, hidden, layers, heads, kv_heads, head_dim, inter, vocab, tied = _SHAPES[name]
    return {
        "architectures": [ARCHITECTURES[model_type]],
        "model_type": model_type,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim or hidden // heads,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "max_position_embeddings": _MAX_POSITIONS[model_type],
        "tie_word_embeddings": tied,
        "bos_token_id": 151643 if vocab > 151643 else None,
        "eos_token_id": 151645 if vocab > 151645 else None,
        "torch_dtype": dtype,
    }


def preset_config(name: str, dtype: str = "bfloat16") -> ModelConfig:
    return ModelConfig.from_hf_dict(preset_hf_dict(name, dtype), source=f"preset '{name}'")
