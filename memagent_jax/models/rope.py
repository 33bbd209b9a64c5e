"""Rotary position embeddings, computed as `transformers` does for Qwen (default and YaRN).

The inverse frequencies are a host-side constant of the config; positions are per token, so
left-padded rows, cache prefills at an offset and single decode steps all share one code path.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from memagent_jax.models.config import ModelConfig


def inverse_frequencies(config: ModelConfig) -> tuple[np.ndarray, float]:
    """Returns (inv_freq [head_dim // 2] float32, attention_factor) for the config's rope."""
    dim = config.head_dim
    base = np.float32(config.rope_theta)
    exponents = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
    pos_freqs = base ** exponents
    scaling = config.rope_scaling
    if not scaling:
        return (np.float32(1.0) / pos_freqs).astype(np.float32), 1.0
    return _yarn(scaling, pos_freqs, dim, float(config.rope_theta))


def _yarn(scaling: dict, pos_freqs: np.ndarray, dim: int, base: float) -> tuple[np.ndarray, float]:
    """YaRN: interpolate low frequencies, keep high ones, ramp in between (arXiv 2309.00071)."""
    factor = float(scaling["factor"])
    original_len = scaling["original_max_position_embeddings"]

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        if scaling.get("mscale") and scaling.get("mscale_all_dim"):
            attention_factor = mscale(factor, scaling["mscale"]) / mscale(
                factor, scaling["mscale_all_dim"])
        else:
            attention_factor = mscale(factor)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # the ramp below would divide by zero
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    keep = (1 - ramp).astype(np.float32)  # 1 where the original frequency is kept
    extrapolated = np.float32(1.0) / pos_freqs
    interpolated = np.float32(1.0) / (np.float32(factor) * pos_freqs)
    inv_freq = interpolated * (1 - keep) + extrapolated * keep
    return inv_freq.astype(np.float32), float(attention_factor)


def apply_rope(x: jnp.ndarray, positions: jnp.ndarray, inv_freq: np.ndarray,
               attention_factor: float) -> jnp.ndarray:
    """Rotates x [B, T, H, D] by the angle position * inv_freq (half-rotation layout).

    positions: [B, T] int. The angles are computed in float32 and cast back to x.dtype.
    """
    angles = positions.astype(jnp.float32)[:, :, None] * jnp.asarray(inv_freq)[None, None, :]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [B, T, 1, D]
    cos = (jnp.cos(angles) * attention_factor).astype(x.dtype)
    sin = (jnp.sin(angles) * attention_factor).astype(x.dtype)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin
