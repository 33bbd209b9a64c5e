"""Rollout-vs-learner agreement and its optional correction (`learner.rollout_correction`).

The correction is verl's truncated importance sampling (TIS) as it was introduced in
volcengine/verl b8dc5377c (PR #2953) and read at 7f27789961610872c87361c1c7bf2c7f4dd63218 (the
last commit before PR #3694 replaced it): `compute_policy_loss_vanilla` in
verl/trainer/ppo/core_algos.py multiplies each token's dual-clipped PPO loss by
clamp(exp(old_log_prob - rollout_log_probs), max=tis_imp_ratio_cap) before the token-mean;
old_log_prob is computed without gradient (verl/workers/actor/dp_actor.py), so the weight is a
constant of the loss. The end-to-end mismatch numbers in TensorBoard are checked in
tests/rl/test_trainer.py (float32: ~0) and tests/rl/test_precision.py (bf16: non-zero).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memagent_jax.errors import UserError
from memagent_jax.models.loading import random_model
from memagent_jax.rl.config import LearnerConfig
from memagent_jax.rl.dapo import policy_loss, truncated_is_weights
from memagent_jax.rl.learner import Learner
from tests.builders import LEARNER_MODEL, random_rows

pytestmark = pytest.mark.slow  # learner updates compiled


def test_truncated_is_loss_equals_a_hand_computed_one():
    """Two rows of three tokens (eps 0.2 / 0.28, dual clip 3, cap 2): a capped weight
    (exp(log 5) -> 2), a dual-clipped token (A < 0, ratio 4 -> loss 3) whose weight 1.65 must
    multiply the clipped loss (3 x 1.65, not min(4 x 1.65, 3)), a weight below 1, and a masked
    token with a huge weight that must not count. The loss, its gradient with respect to logp,
    and no gradient with respect to the weights."""
    cap = 2.0
    logp = np.log(np.array([[0.5, 0.3, 0.2], [0.4, 0.8, 0.1]]))
    old = logp - np.array([[0.0, 0.1, 0.0], [math.log(4.0), 0.0, 0.0]])   # ratios
    rollout = old - np.array([[math.log(5.0), -1.0, 0.2], [0.5, 0.0, 9.0]])
    advantages = np.array([1.0, -1.0])
    mask = np.array([[1, 1, 1], [1, 1, 0]], np.float32)

    weights = np.minimum(np.exp(old - rollout), cap)
    np.testing.assert_allclose(weights, [[2.0, math.exp(-1), math.exp(0.2)],
                                         [math.exp(0.5), 1.0, 2.0]], rtol=1e-6)
    np.testing.assert_allclose(truncated_is_weights(old, rollout, cap), weights, rtol=1e-6)

    # verl's loss token by token: clip, dual clip, then the weight; token-mean over the mask.
    ratio = np.exp(logp - old)
    a = advantages[:, None]
    pg = np.maximum(-a * ratio, -a * np.clip(ratio, 0.8, 1.28))
    pg = np.where(a < 0, np.minimum(pg, -a * 3.0), pg)
    assert pg[1, 0] == pytest.approx(3.0)          # the dual-clipped token
    expected = float((pg * weights * mask).sum() / mask.sum())
    # d/dlogp of -A ratio is -A ratio where no clip binds; 0 where one does.
    unclipped = (-a * ratio >= -a * np.clip(ratio, 0.8, 1.28)) & ~((a < 0) & (pg >= -a * 3.0))
    expected_grad = np.where(unclipped, -a * ratio, 0.0) * weights * mask / mask.sum()
    assert unclipped[0, 0] and not unclipped[1, 0]

    def loss(logp, token_weights):
        return policy_loss(logp, jnp.asarray(old, jnp.float32), advantages, mask, eps_low=0.2,
                           eps_high=0.28, dual_clip=3.0, kl_coef=0.0,
                           token_weights=token_weights)[0]

    args = (jnp.asarray(logp, jnp.float32), jnp.asarray(truncated_is_weights(old, rollout, cap)))
    value, (grad_logp, grad_weights) = jax.value_and_grad(loss, argnums=(0, 1))(*args)
    assert float(value) == pytest.approx(expected, rel=1e-5)
    np.testing.assert_allclose(np.asarray(grad_logp), expected_grad, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(np.asarray(grad_weights), 0.0)   # a constant of the loss
    # Without weights the loss is the plain one.
    plain = float(loss(args[0], None))
    assert plain == pytest.approx(float((pg * mask).sum() / mask.sum()), rel=1e-5)


# One micro-batch of 32 rows: one shape to compile per learner.
_CONFIG = {"lr": 1e-2, "warmup_steps": 0, "micro_batch_tokens": 1024, "bucket_lengths": (32,),
           "kl_coef": 0.0}


@pytest.fixture(scope="module")
def updates():
    """One training step of two learners on the same model and rows, whose rollout log-probs
    are the learner's own minus a known delta per response token (uniform in [-1.5, 1.5]):
    `recompute` (the default old log-probs) with cap 2, and `rollout` (no recompute, two PPO
    epochs). -> (rows, delta [R, T], response mask [R, T], {name: update's metrics})."""
    learners = {"recompute": Learner(random_model(LEARNER_MODEL, seed=3),
                                     LearnerConfig(rollout_correction=2.0, **_CONFIG)),
                "rollout": Learner(random_model(LEARNER_MODEL, seed=3),
                                   LearnerConfig(old_logprobs="rollout", ppo_epochs=2,
                                                 **_CONFIG))}
    rows = random_rows(seed=4)
    mask = rows.loss_mask > 0
    delta = np.where(mask, np.random.RandomState(4).uniform(-1.5, 1.5, mask.shape), 0.0)
    rows.rollout_logprobs = (learners["recompute"].logprobs(rows) - delta).astype(np.float32)
    return rows, delta, mask, {k: learner.update(rows) for k, learner in learners.items()}


def test_the_learner_weights_each_tokens_loss_and_reports_the_mismatch(updates):
    """Cap 2: before the update the PPO ratio is 1, so pg_loss is the token mean of
    -A x min(exp(delta), 2); the mismatch metrics are mean |delta| and mean(exp(delta) - 1 -
    delta) over the response tokens, and the share of them whose ratio exp(delta) starts
    outside the clip range; the weight metrics their mean and the fraction at the
    cap."""
    rows, delta, mask, out = updates
    out = out["recompute"]
    weights = np.minimum(np.exp(delta), 2.0)
    assert 0 < (weights[mask] == 2.0).mean() < 0.5
    pg = -rows.advantages[:, None] * weights
    assert out["pg_loss"] == pytest.approx(pg[mask].mean(), rel=1e-4)
    assert out["rollout_logprob_abs_diff"] == pytest.approx(np.abs(delta[mask]).mean(), rel=1e-4)
    assert out["rollout_kl_k3"] == pytest.approx((np.expm1(delta) - delta)[mask].mean(),
                                                 rel=1e-4)
    ratio = np.exp(delta[mask])  # the default clip range, [0.8, 1.2]
    assert out["rollout_outside_clip"] == pytest.approx(((ratio < 0.8) | (ratio > 1.2)).mean())
    assert out["rollout_is_weight"] == pytest.approx(weights[mask].mean(), rel=1e-5)
    assert out["rollout_is_capped_fraction"] == pytest.approx((weights[mask] == 2.0).mean())


def test_without_a_recompute_the_mismatch_is_the_first_mini_batchs_forward(updates):
    """old_logprobs: rollout has no recompute: the mismatch comes from the first mini-batch's
    forward, which runs before any update, so with one mini-batch it is the recompute
    learner's whole-batch number, though the second epoch's forward (after an update) sees
    other log-probabilities."""
    *_, out = updates
    assert "rollout_is_weight" not in out["rollout"]
    for name in ("rollout_logprob_abs_diff", "rollout_kl_k3", "rollout_outside_clip"):
        assert out["rollout"][name] == pytest.approx(out["recompute"][name], rel=1e-4)


@pytest.mark.parametrize("overrides", [
    {"rollout_correction": 0.0},
    {"rollout_correction": -2.0},
    {"rollout_correction": 2.0, "old_logprobs": "rollout"},
    {"rollout_correction": 2.0, "loss": "sft"},
])
def test_a_bad_rollout_correction_names_the_key(overrides):
    with pytest.raises(UserError, match="learner.rollout_correction"):
        LearnerConfig(**overrides)
