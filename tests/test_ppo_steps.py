"""Several PPO updates in one training step against a hand-written DAPO step: the clipped
token-mean loss, its gradient and optax's AdamW, written out here from the formulas of
docs/algorithm.md section 3. From the second mini-batch on, the parameters have moved away from
those that sampled the rows, so the ratio departs from 1 and clipping acts: what catches a
learner that takes its "old" log-probabilities from the current parameters."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from memagent_jax.models import ModelConfig, random_model, split_params
from memagent_jax.rl.learner import Learner, LearnerConfig
from memagent_jax.rl.rows import rows_from_trajectories
from memagent_jax.rollout.memagent import Trajectory, Turn

CONFIG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=8)
SETTINGS = dict(lr=2e-2, warmup_steps=0, kl_coef=0.0, eps_low=0.2, eps_high=0.28,
                dual_clip=3.0, weight_decay=0.01, max_grad_norm=1.0, micro_batch_rows=8,
                bucket_lengths=(16,), mini_batches=3, seed=7,
                # Not 1e-8: the key bias's gradient is zero up to rounding (a shift of every
                # key), which Adam with a tiny eps would blow up to +-lr either way.
                adam_eps=1e-4)


def _rows():
    rng = np.random.RandomState(3)
    flat = [Trajectory("", [Turn("update", list(rng.randint(3, 64, 6)),
                                 list(rng.randint(3, 64, 2 + t % 4)), [0.0] * (2 + t % 4),
                                 "stop", "")]) for t in range(9)]
    return rows_from_trajectories(flat, rng.randn(9))


def _token_logprobs(graphdef, params, tokens):
    """log p(tokens[:, t] | tokens[:, :t]) [R, T], 0 at t = 0: a plain log-softmax."""
    logits = nnx.merge(graphdef, params)(tokens).astype(jnp.float32)
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
    return jnp.pad(picked, ((0, 0), (1, 0)))


def _dapo_loss(params, graphdef, tokens, mask, advantages, old):
    """verl's PPO loss: clipped ratio, dual clip for A < 0, token-mean over the rows given."""
    ratio = jnp.exp(_token_logprobs(graphdef, params, tokens) - old)
    a = advantages[:, None]
    loss = jnp.maximum(-a * ratio, -a * jnp.clip(ratio, 1 - SETTINGS["eps_low"],
                                                 1 + SETTINGS["eps_high"]))
    loss = jnp.where(a < 0, jnp.minimum(loss, -a * SETTINGS["dual_clip"]), loss)
    return jnp.sum(loss * mask) / jnp.sum(mask)


def test_mini_batch_updates_match_a_hand_written_dapo_step():
    rows = _rows()
    model = random_model(CONFIG, seed=5)
    graphdef, params = split_params(model)
    params = jax.tree.map(jnp.array, params)  # our own copy: the learner donates its arrays

    tokens = jnp.asarray(rows.tokens)
    old = _token_logprobs(graphdef, params, tokens)  # the parameters that "sampled" the rows
    tx = optax.chain(optax.clip_by_global_norm(SETTINGS["max_grad_norm"]),
                     optax.adamw(SETTINGS["lr"], b1=0.9, b2=0.999, eps=SETTINGS["adam_eps"],
                                 weight_decay=SETTINGS["weight_decay"]))
    state = tx.init(params)
    order = np.random.default_rng((SETTINGS["seed"], 0)).permutation(len(rows))
    gradient = jax.jit(jax.grad(lambda p, *batch: _dapo_loss(p, graphdef, *batch)))
    logprobs = jax.jit(lambda p, t: _token_logprobs(graphdef, p, t))
    ratios = []
    for part in np.array_split(order, SETTINGS["mini_batches"]):
        batch = (tokens[part], jnp.asarray(rows.loss_mask[part]),
                 jnp.asarray(rows.advantages[part]), old[part])
        ratios.append(np.exp(np.asarray(logprobs(params, batch[0]) - batch[3]))[
            rows.loss_mask[part] > 0])
        grads = gradient(params, *batch)
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)

    learner = Learner(model, LearnerConfig(**SETTINGS))
    metrics = learner.update(rows)
    assert metrics["updates"] == 3
    np.testing.assert_allclose(ratios[0], 1.0, atol=1e-5)
    assert np.abs(ratios[2] - 1).max() > SETTINGS["eps_high"]  # the last update clips
    assert metrics["clip_fraction"] > 0
    for (path, ours), expected in zip(jax.tree.leaves_with_path(learner.params),
                                      jax.tree.leaves(params)):
        np.testing.assert_allclose(np.asarray(ours), np.asarray(expected), rtol=0,
                                   atol=SETTINGS["lr"] * 1e-3,
                                   err_msg=jax.tree_util.keystr(path))
