"""Qwen2.5 shapes (docs/algorithm.md section 6) as HF config dicts, plus a tiny test shape.

A preset is what a Qwen2.5 checkpoint's config.json says, so `ModelConfig.from_hf_dict` reads it
like any downloaded model, and `memagent-jax random-model` can write a random-weight stand-in
for benchmarks on machines that cannot download the real weights.
"""

from __future__ import annotations

from memagent_jax.errors import UserError
from memagent_jax.models.config import ModelConfig

# name: (hidden, layers, q heads, kv heads, intermediate, embedding rows, tied head)
_SHAPES = {
    "qwen2.5-0.5b": (896, 24, 14, 2, 4864, 151936, True),
    "qwen2.5-1.5b": (1536, 28, 12, 2, 8960, 151936, True),
    "qwen2.5-3b": (2048, 36, 16, 2, 11008, 151936, True),
    "qwen2.5-7b": (3584, 28, 28, 4, 18944, 152064, False),
    "qwen2.5-14b": (5120, 48, 40, 8, 13824, 152064, False),
    "qwen2.5-32b": (5120, 64, 40, 8, 27648, 152064, False),
    "qwen2.5-72b": (8192, 80, 64, 8, 29568, 152064, False),
    # Not a real model: small enough for tests and the README's demo on a laptop CPU.
    "tiny": (64, 2, 4, 2, 128, 512, False),
    # Not a real model: the synthetic tasks' agent (synthetic/tasks.py's ~4K-word vocabulary).
    "small": (128, 4, 4, 2, 384, 4096, True),
}
PRESETS = tuple(_SHAPES)


def preset_hf_dict(name: str, dtype: str = "bfloat16") -> dict:
    """The config.json of the named preset."""
    if name not in _SHAPES:
        raise UserError(f"unknown preset '{name}' (choose from: {', '.join(PRESETS)})")
    hidden, layers, heads, kv_heads, inter, vocab, tied = _SHAPES[name]
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": tied,
        "bos_token_id": 151643 if vocab > 151643 else None,
        "eos_token_id": 151645 if vocab > 151645 else None,
        "torch_dtype": dtype,
    }


def preset_config(name: str, dtype: str = "bfloat16") -> ModelConfig:
    return ModelConfig.from_hf_dict(preset_hf_dict(name, dtype), source=f"preset '{name}'")
