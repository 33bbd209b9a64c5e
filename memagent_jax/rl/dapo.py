"""The DAPO policy loss and DAPO's two batch-shaping rules (docs/algorithm.md section 3).

`policy_loss` is verl's PPO loss as MemAgent ran it: per-token importance ratio against the
rollout policy, clipped to [1 - eps_low, 1 + eps_high] ("clip-higher" when eps_high > eps_low),
dual clip for negative advantages, token-mean over every response token of the mini-batch (or
per rank, as verl's data-parallel workers took it: `row_weights`), plus
an optional KL penalty to a frozen reference (verl's `low_var_kl`), an optional entropy bonus,
and optional per-token weights (verl's truncated importance sampling, `truncated_is_weights`).

`rollout_mismatch` measures how far the learner's log-probabilities of the sampled tokens are
from the sampler's (the engine's), the number a bf16 engine makes non-zero.

`overlong_penalty` and `informative_groups` are DAPO's overlong reward shaping and dynamic
sampling filter; they work on host numpy arrays before any row reaches the learner.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# verl clamps log-ratios to +-20 before exponentiating, so one wild token gives a large but
# finite ratio instead of inf (whose gradient would poison the whole update).
_LOG_RATIO_LIMIT = 20.0
_KL_LIMIT = 10.0


def policy_loss(logp, old_logp, advantages, mask, *, eps_low: float, eps_high: float,
                dual_clip: float | None, kl_coef: float, ref_logp=None, entropy=None,
                entropy_coef: float = 0.0, row_weights=None, token_weights=None):
    """The mini-batch loss to minimise, and its metrics.

    logp, old_logp, mask: [rows, T] (log-probabilities of the tokens under the policy being
    trained and under the policy that sampled them; mask 1 on response tokens). advantages:
    [rows], or [rows, T] per token (packed rows: learner.py). ref_logp: [rows, T] under the
    frozen reference, used when kl_coef != 0. entropy:
    [rows, T] the policy's per-token entropy (metric, and a bonus when entropy_coef != 0).
    dual_clip: c > 1, or None for plain PPO clipping.
    row_weights: [rows] (or [rows, T] per token), the weight of each response token of a row;
    default 1 / mask.sum(),
    the token-mean over these rows. A learner that accumulates gradients over micro-batches
    passes 1 / (the mini-batch's token count) for every row, so the micro-batch losses sum to
    the mini-batch token-mean; with `loss_agg: per_rank_token_mean` each row's weight is that of
    its rank's piece (learner.py).
    token_weights: [rows, T], each token's policy-gradient term (after both clips) multiplied
    by it, not differentiated (a constant of the loss): the truncated importance-sampling
    weights of `truncated_is_weights`; None: 1. The KL and entropy terms and the clip metrics
    are not weighted, as in verl.

    Returns (loss [], metrics): pg_loss, clip_fraction (tokens whose ratio the clip bound),
    dual_clip_fraction, approx_kl (to the sampling policy), kl (to the reference, 0 without one),
    entropy (when given). Each metric is a weighted token sum with the same weights.
    """
    mask = jnp.asarray(mask, jnp.float32)
    if row_weights is None:
        row_weights = jnp.full(mask.shape[:1], 1.0 / jnp.maximum(mask.sum(), 1.0))
    weights = mask * per_token(row_weights)

    def token_mean(x):
        return jnp.sum(x * weights)

    advantages = per_token(advantages)
    log_ratio = jnp.clip(logp - old_logp, -_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    ratio = jnp.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    pg = jnp.maximum(unclipped, clipped)
    metrics = {"clip_fraction": token_mean((clipped > unclipped).astype(jnp.float32)),
               "approx_kl": token_mean(-log_ratio)}
    if dual_clip is not None:
        # For A < 0 a huge ratio would give an unbounded loss; cap it at -A * c.
        bound = -advantages * dual_clip
        metrics["dual_clip_fraction"] = token_mean(
            ((pg > bound) & (advantages < 0)).astype(jnp.float32))
        pg = jnp.where(advantages < 0, jnp.minimum(pg, bound), pg)
    else:
        metrics["dual_clip_fraction"] = jnp.zeros((), jnp.float32)
    if token_weights is not None:
        pg = pg * jax.lax.stop_gradient(jnp.asarray(token_weights, jnp.float32))
    pg_loss = token_mean(pg)
    loss = pg_loss
    metrics["pg_loss"] = pg_loss
    if ref_logp is not None and kl_coef != 0.0:
        kl = token_mean(low_var_kl(logp, ref_logp))
        loss = loss + kl_coef * kl
    else:
        kl = jnp.zeros((), jnp.float32)
    metrics["kl"] = kl
    if entropy is not None:
        mean_entropy = token_mean(entropy)
        metrics["entropy"] = mean_entropy
        if entropy_coef != 0.0:
            loss = loss - entropy_coef * mean_entropy
    metrics["loss"] = loss
    return loss, metrics


def per_token(values):
    """[rows] (one value per row) -> [rows, 1], broadcasting over its tokens; [rows, T] as is.
    float32."""
    values = jnp.asarray(values, jnp.float32)
    return values[:, None] if values.ndim == 1 else values


def low_var_kl(logp, ref_logp):
    """verl's low-variance KL estimate (Schulman's k3) per token, clamped to [-10, 10]:
    r - log r - 1 with r = p_ref / p, an unbiased, always non-negative estimate of KL(p||ref)."""
    log_ratio = jnp.clip(ref_logp - logp, -_LOG_RATIO_LIMIT, _LOG_RATIO_LIMIT)
    return jnp.clip(jnp.exp(log_ratio) - log_ratio - 1.0, -_KL_LIMIT, _KL_LIMIT)


def truncated_is_weights(old_logp: np.ndarray, rollout_logp: np.ndarray, cap: float
                         ) -> np.ndarray:
    """verl's truncated importance sampling (TIS) weights, [rows, T] float32 from two [rows, T]
    host arrays: min(exp(old_logp - rollout_logp), cap), the learner's probability of each
    sampled token over the sampler's, truncated at `cap` (> 0). Not log-clamped, as verl's:
    a ratio that overflows is the cap, one that underflows 0."""
    with np.errstate(over="ignore"):
        ratio = np.exp(np.asarray(old_logp, np.float32) - np.asarray(rollout_logp, np.float32))
    return np.minimum(ratio, np.float32(cap))


def rollout_mismatch(logp, rollout_logp, weights, eps_low: float, eps_high: float,
                     xp=jnp) -> dict:
    """How far the learner's log-probabilities of the sampled tokens are from the sampler's.

    logp, rollout_logp: arrays of one shape, e.g. [rows, T]; weights broadcast to it (0 off
    the response tokens; summing to 1 they make a token mean). With r = logp - rollout_logp,
    returns weighted token sums: rollout_logprob_abs_diff = sum(w |r|), rollout_kl_k3 =
    sum(w (exp(r) - 1 - r)), Schulman's k3 estimate of KL(sampler || learner) (the tokens are
    the sampler's draws; each term is >= 0), and rollout_outside_clip = sum(w [exp(r) outside
    [1 - eps_low, 1 + eps_high]]): the tokens whose PPO ratio would start clipped were the
    sampler's log-probabilities the old ones (`old_logprobs: rollout`), the mean hiding them
    when the policy is peaked. Not clamped: a measurement, not a loss. xp: jnp (in a jitted
    function) or np (host arrays, computed in their dtype)."""
    r = logp - rollout_logp
    outside = (r < xp.log1p(-eps_low)) | (r > xp.log1p(eps_high))
    return {"rollout_logprob_abs_diff": xp.sum(xp.abs(r) * weights),
            "rollout_kl_k3": xp.sum((xp.expm1(r) - r) * weights),
            "rollout_outside_clip": xp.sum(xp.where(outside, weights, 0.0))}


def overlong_penalty(response_lengths, max_response_tokens: int, buffer: int,
                     penalty_factor: float = 1.0) -> np.ndarray:
    """DAPO's soft overlong punishment, added to the reward: 0 up to max - buffer tokens, then
    falling linearly to -penalty_factor at the cap (and staying there beyond it).
    response_lengths [N] -> [N] float32."""
    if buffer <= 0 or buffer > max_response_tokens:
        raise ValueError(f"overlong buffer must be in 1..{max_response_tokens}, got {buffer}")
    lengths = np.asarray(response_lengths, np.float64)
    excess = lengths - (max_response_tokens - buffer)
    penalty = -np.clip(excess / buffer, 0.0, 1.0) * penalty_factor
    return penalty.astype(np.float32)


def informative_groups(rewards) -> np.ndarray:
    """DAPO dynamic sampling: rewards [G, n] -> bool [G], True for groups whose rewards are not
    all equal (an all-equal group has zero advantage everywhere and teaches nothing). NaN
    rewards (rollouts past their deadline) are left out of the comparison."""
    rewards = np.asarray(rewards, np.float64)
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be [groups, n], got shape {rewards.shape}")
    with np.errstate(all="ignore"):
        return np.nanmax(rewards, axis=1, initial=-np.inf) > np.nanmin(
            rewards, axis=1, initial=np.inf)
