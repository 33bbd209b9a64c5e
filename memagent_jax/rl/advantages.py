"""Group-relative advantages (GRPO / DAPO, docs/algorithm.md section 3).

Each prompt is sampled n times; a trajectory's advantage is its reward minus the mean reward of
its group (the original does not divide by the group's standard deviation; `normalize_std` does,
with the unbiased estimate, as verl's GRPO). A group of one has no baseline: as in verl its
advantage is its raw reward (mean 0, std 1). A NaN reward (a rollout that passed its deadline:
no reward, nothing trained) takes no part in its group's mean or std and gets advantage 0.
"""

from __future__ import annotations

import numpy as np


def group_advantages(rewards: np.ndarray, normalize_std: bool = False,
                     eps: float = 1e-6) -> np.ndarray:
    """rewards [G, n] (G groups of n trajectories) -> advantages [G, n] float32."""
    rewards = np.asarray(rewards, np.float64)
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be [groups, n], got shape {rewards.shape}")
    n = rewards.shape[1]
    scored = ~np.isnan(rewards)
    if n == 1:
        return np.where(scored, rewards, 0.0).astype(np.float32)
    count = scored.sum(axis=1, keepdims=True)
    values = np.where(scored, rewards, 0.0)
    mean = values.sum(axis=1, keepdims=True) / np.maximum(count, 1)
    advantages = np.where(scored, rewards - mean, 0.0)
    if normalize_std:
        variance = (advantages ** 2).sum(axis=1, keepdims=True) / np.maximum(count - 1, 1)
        advantages = advantages / (np.sqrt(variance) + eps)
    return advantages.astype(np.float32)
