"""Activation rematerialisation (`model(..., remat=policy)`, `LearnerConfig.remat`, the policies
of models/qwen.py `REMAT_POLICIES`) changes what the backward keeps in memory, not the values:
the model's gradient, a learner update, and the compiled gradient's temporary memory."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memagent_jax.models.loading import random_model
from memagent_jax.rl.config import LearnerConfig
from memagent_jax.rl.learner import Learner
from memagent_jax.rl.logprobs import token_logprobs
from tests.builders import LEARNER_MODEL, random_rows


def _mean_logprob_grad(model, tokens, remat):
    """The jitted gradient of the mean next-token log-prob w.r.t. the model's parameters."""
    graphdef, state = nnx.split(model)

    def mean_logprob(state):
        model = nnx.merge(graphdef, state)
        logp, _ = token_logprobs(model.logits, model.hidden(tokens, remat=remat), tokens,
                                 entropy=False)
        return logp[:, 1:].mean()

    return jax.jit(jax.grad(mean_logprob)), state


@pytest.mark.parametrize("policy", ["matmuls", "full"])
def test_model_gradient_is_the_same_with_remat(policy):
    model = random_model(LEARNER_MODEL, seed=0)
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, 64, (2, 37)))
    plain, state = _mean_logprob_grad(model, tokens, remat="none")
    remat, _ = _mean_logprob_grad(model, tokens, remat=policy)
    for a, b in zip(jax.tree.leaves(remat(state)), jax.tree.leaves(plain(state))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-8)


def test_each_policy_keeps_less_than_the_one_before():
    """Four layers over 512 tokens: without remat the backward keeps every layer's activations
    (the [T, intermediate] MLP activations and the attention's included); saving the matmul
    outputs keeps the projections but not what lies between them; full keeps each layer's
    input only."""
    config = dataclasses.replace(LEARNER_MODEL, hidden_size=64, intermediate_size=256, num_layers=4)
    model = random_model(config, seed=0)
    tokens = jnp.zeros((2, 512), jnp.int32)
    temp = {}
    for remat in ("none", "matmuls", "full"):
        grad, state = _mean_logprob_grad(model, tokens, remat)
        temp[remat] = grad.lower(state).compile().memory_analysis().temp_size_in_bytes
    assert temp["full"] < 0.6 * temp["none"], temp
    assert temp["full"] < 0.9 * temp["matmuls"] and temp["matmuls"] < 0.9 * temp["none"], temp


def test_learner_update_is_the_same_with_remat():
    """Two mini-batches of 8-row micro-batches: same metrics and same new parameters. (The
    learner hands its policy to the model unread: each policy's gradient is the model test's.)"""
    rows = random_rows()
    config = LearnerConfig(lr=1e-3, warmup_steps=0, micro_batch_rows=8, adam_eps=1e-3,
                           bucket_lengths=(32,), mini_batches=2)
    learners = {remat: Learner(random_model(LEARNER_MODEL, seed=1),
                               dataclasses.replace(config, remat=remat))
                for remat in ("none", "full")}
    metrics = {remat: learner.update(rows) for remat, learner in learners.items()}
    params = {remat: jax.tree.leaves(jax.device_get(learner.state()["params"]))
              for remat, learner in learners.items()}
    start = jax.tree.leaves(nnx.to_pure_dict(nnx.state(random_model(LEARNER_MODEL, seed=1))))
    moved = max(float(np.abs(a - np.asarray(b)).max()) for a, b in zip(params["none"], start))
    assert moved > 5e-4  # lr 1e-3: the updates are well above the tolerance
    assert metrics["full"]["updates"] == metrics["none"]["updates"] == 2
    for key in ("loss", "grad_norm", "entropy", "clip_fraction"):
        assert metrics["full"][key] == pytest.approx(metrics["none"][key], rel=1e-5, abs=1e-8)
    for a, b in zip(params["full"], params["none"]):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
