"""Activation rematerialisation (`model(..., remat=policy)`, `LearnerConfig.remat`, the policies
of models/qwen.py `REMAT_POLICIES`) changes what the backward keeps in memory, not the values:
the model's gradient, a learner update, the residuals kept for the backward and the compiled
gradient's temporary memory."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.ad_checkpoint import print_saved_residuals

from memagent_jax.models.loading import random_model
from memagent_jax.models.qwen import Qwen
from memagent_jax.rl.config import LearnerConfig
from memagent_jax.rl.learner import Learner
from memagent_jax.rl.logprobs import token_logprobs
from tests.builders import LEARNER_MODEL, random_rows

pytestmark = pytest.mark.slow  # gradients compiled under each remat policy


def _mean_logprob(model, tokens, remat):
    """(the mean next-token log-prob as a function of the model's parameters, those)."""
    graphdef, state = nnx.split(model)

    def mean_logprob(state):
        model = nnx.merge(graphdef, state)
        logp, _ = token_logprobs(model.logits, model.hidden(tokens, remat=remat), tokens,
                                 entropy=False)
        return logp[:, 1:].mean()

    return mean_logprob, state


def _mean_logprob_grad(model, tokens, remat):
    """The jitted gradient of the mean next-token log-prob w.r.t. the model's parameters."""
    mean_logprob, state = _mean_logprob(model, tokens, remat)
    return jax.jit(jax.grad(mean_logprob)), state


@pytest.mark.parametrize("policy", ["matmuls", "full"])
def test_model_gradient_is_the_same_with_remat(policy):
    model = random_model(LEARNER_MODEL, seed=0)
    tokens = jnp.asarray(np.random.RandomState(0).randint(0, 64, (2, 37)))
    plain, state = _mean_logprob_grad(model, tokens, remat="none")
    remat, _ = _mean_logprob_grad(model, tokens, remat=policy)
    for a, b in zip(jax.tree.leaves(remat(state)), jax.tree.leaves(plain(state))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-8)


def test_each_policy_keeps_what_it_names_under_fused_attention(capsys):
    """Under attention 'dot_product' (jax.nn.dot_product_attention: the scores are a batched
    product) the backward keeps [T, T] scores without remat; "matmuls" keeps the layer's
    projections (the query's [layers, B, T, heads, head_dim] among them) and recomputes the
    scores (a policy saving every product, batched ones included, would keep them: 82 against
    49 MB of temporaries at 512 tokens); "full" keeps neither. Read from the residuals jax
    lists for the backward, traced only."""
    t = 40  # apart from every other dimension here
    model = random_model(LEARNER_MODEL, seed=0, attention="dot_product")
    tokens = jnp.zeros((2, t), jnp.int32)
    query = (LEARNER_MODEL.num_layers, 2, t, LEARNER_MODEL.num_heads, LEARNER_MODEL.head_dim)
    saved = {}
    for remat in ("none", "matmuls", "full"):
        capsys.readouterr()
        print_saved_residuals(*_mean_logprob(model, tokens, remat))
        saved[remat] = [tuple(int(n) for n in dims.split(",") if n) for dims in
                        re.findall(r"^\w+\[([\d,]*)\]", capsys.readouterr().out, re.MULTILINE)]
    scores = {remat: [s for s in shapes if s.count(t) >= 2] for remat, shapes in saved.items()}
    assert scores["none"] and not scores["matmuls"] and not scores["full"], scores
    assert query in saved["matmuls"] and query not in saved["full"], saved


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


def test_learner_update_is_the_same_with_remat(monkeypatch):
    """Two mini-batches of 8-row micro-batches: same metrics and same new parameters. The
    learner hands its policy to the model for the loss it differentiates: each policy's
    gradient and memory are then the model tests'."""
    rows = random_rows()
    config = LearnerConfig(lr=1e-3, warmup_steps=0, micro_batch_tokens=256, adam_eps=1e-3,
                           bucket_lengths=(32,), mini_batches=2)
    learners = {remat: Learner(random_model(LEARNER_MODEL, seed=1),
                               dataclasses.replace(config, remat=remat))
                for remat in ("none", "full")}
    asked, hidden = [], Qwen.hidden

    def recorded(self, *args, remat="none", **kwargs):
        asked.append(remat)
        return hidden(self, *args, remat=remat, **kwargs)

    monkeypatch.setattr(Qwen, "hidden", recorded)
    metrics = {}
    for remat, learner in learners.items():
        asked.clear()
        metrics[remat] = learner.update(rows)
        assert remat in asked, (remat, asked)  # traced by this learner's update
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
