"""The supervised loss (`learner.loss: sft`): token-level negative log-likelihood of the replies.

A supervised step trains on given trajectories (a plugin's, rl/plugin.py) through the
same rows, micro-batches, mesh, optimiser and checkpoints as a DAPO step.
"""

from __future__ import annotations

import jax.numpy as jnp

from memagent_jax.rl.dapo import per_token


def sft_loss(logp, mask, row_weights, entropy=None):
    """logp, mask [rows, T] (mask 1 on reply tokens), row_weights [rows] or [rows, T] as
    `dapo.policy_loss` takes them -> (the weighted token sum of -logp, metrics with
    policy_loss's names: loss and pg_loss the same negative log-likelihood, the clip and KL
    metrics 0, entropy when given)."""
    weights = jnp.asarray(mask, jnp.float32) * per_token(row_weights)
    nll = -jnp.sum(logp * weights)
    zero = jnp.zeros((), jnp.float32)
    metrics = {"loss": nll, "pg_loss": nll, "clip_fraction": zero, "dual_clip_fraction": zero,
               "approx_kl": zero, "kl": zero,
               "entropy": zero if entropy is None else jnp.sum(entropy * weights)}
    return nll, metrics
