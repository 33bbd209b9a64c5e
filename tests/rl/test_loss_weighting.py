"""How a trajectory's reward reaches its tokens: the loss aggregation across ranks
(`learner.loss_agg`) and the advantage on every trained turn, each pinned against a hand
computation."""

import numpy as np
import pytest

from memagent_jax.models.config import ModelConfig
from memagent_jax.models.loading import random_model
from memagent_jax.rl.config import LearnerConfig
from memagent_jax.rl.learner import Learner
from memagent_jax.rl.rows import rows_from_trajectories
from memagent_jax.rollout.agent_api import Trajectory, Turn

pytestmark = pytest.mark.slow  # learner updates compiled on meshes

CONFIG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=8)


def _trajectory(rng, updates, update_tokens, final_tokens):
    def turn(kind, n):
        return Turn(kind, list(rng.randint(3, 64, 5)), list(rng.randint(3, 64, n)),
                    [-1.0] * n, "stop", "")
    return Trajectory("", [turn("update", update_tokens) for _ in range(updates)]
                      + [turn("final", final_tokens)])


def _batch():
    """4 trajectories of 3, 2, 1 and 2 chunks: long memory updates (9 tokens), short final
    answers (2 tokens), distinct advantages."""
    rng = np.random.RandomState(0)
    flat = [_trajectory(rng, k, 9, 2) for k in (3, 2, 1, 2)]
    return flat, np.array([1.0, -0.5, 2.0, -1.5], np.float32)


def _first_update_pg_loss(rows, **config):
    """pg_loss of one update from the initial parameters: old log-probs are recomputed from
    them, so every ratio is 1 and each token's loss is -A (clipping never acts)."""
    learner = Learner(random_model(CONFIG, seed=0),
                      LearnerConfig(lr=1e-9, warmup_steps=0, micro_batch_tokens=64,
                                    bucket_lengths=(16,), **config))
    return learner.update(rows)["pg_loss"]


def test_global_token_mean_weighs_every_token_the_same():
    flat, advantages = _batch()
    rows = rows_from_trajectories(flat, advantages)
    tokens = rows.loss_mask.sum(axis=1)
    expected = -np.sum(rows.advantages * tokens) / tokens.sum()
    assert _first_update_pg_loss(rows) == pytest.approx(expected, abs=1e-6)


def _verl_order(rows):
    """The original's agent answers once every document is read, so for chunks (3, 2, 1, 2)
    its batch is: update 0 of t0 t1 t2 t3, update 1 of t0 t1 t3, update 2 of t0, the finals of
    t0 t1 t2 t3 (original: recurrent/impls/memory.py, MemoryAgent.action). Row indices."""
    by_position = {(int(t), int(k)): r for r, (t, k) in
                   enumerate(zip(rows.trajectory, rows.turn))}
    return [by_position[p] for p in [(0, 0), (1, 0), (2, 0), (3, 0), (0, 1), (1, 1), (3, 1),
                                     (0, 2), (0, 3), (1, 2), (2, 1), (3, 2)]]


def test_per_rank_token_mean_is_verls_turn_ordered_split():
    """verl gives each of R ranks a contiguous piece of its turn-ordered batch, takes each
    rank's token-mean and averages the ranks: 3 ranks hold rows 0-3, 4-7 and 8-11 of it."""
    flat, advantages = _batch()
    rows = rows_from_trajectories(flat, advantages)
    order = _verl_order(rows)
    tokens = rows.loss_mask.sum(axis=1)
    pieces = [order[:4], order[4:8], order[8:]]
    expected = np.mean([-np.sum(rows.advantages[p] * tokens[p]) / tokens[p].sum()
                        for p in pieces])
    got = _first_update_pg_loss(rows, loss_agg="per_rank_token_mean", loss_agg_ranks=3)
    assert got == pytest.approx(expected, abs=1e-6)
    global_mean = -np.sum(rows.advantages * tokens) / tokens.sum()
    assert abs(expected - global_mean) > 1e-2  # the case tells the two apart


def test_per_rank_mini_batches_take_each_ranks_contiguous_sub_piece():
    """2 ranks x 2 mini-batches: update m holds the m-th half of each rank's piece (rows
    0-5 and 6-11 of the turn-ordered batch), each row weighing 1 / (2 x the tokens of its
    rank's half); the same split every epoch."""
    flat, advantages = _batch()
    rows = rows_from_trajectories(flat, advantages)
    order = _verl_order(rows)
    tokens = rows.loss_mask.sum(axis=1)
    learner = Learner(random_model(CONFIG, seed=0), LearnerConfig(
        loss_agg="per_rank_token_mean", loss_agg_ranks=2, mini_batches=2))
    for epoch in range(2):
        mini_batches = learner.mini_batches_of(rows, np.random.default_rng(epoch))
        assert len(mini_batches) == 2
        for m, (indices, weights) in enumerate(mini_batches):
            halves = [order[3 * m:3 * m + 3], order[6 + 3 * m:9 + 3 * m]]
            assert list(indices) == halves[0] + halves[1]
            for half in halves:
                np.testing.assert_allclose(weights[half], 1 / (2 * tokens[half].sum()))


def test_loss_agg_is_checked():
    with pytest.raises(Exception, match="loss_agg_ranks"):
        LearnerConfig(loss_agg_ranks=0)


def test_every_turn_carries_its_trajectorys_whole_advantage():
    """The original's credit: each memory update and the final answer is a row with the
    trajectory's advantage (1.0: 3 updates + final; -0.5: 2 updates + final)."""
    flat, advantages = _batch()
    rows = rows_from_trajectories(flat[:2], advantages[:2])
    np.testing.assert_allclose(rows.advantages, [1.0] * 4 + [-0.5] * 3, rtol=1e-6)
    kinds = [flat[t].turns[k].kind for t, k in zip(rows.trajectory, rows.turn)]
    assert kinds == ["update"] * 3 + ["final"] + ["update"] * 2 + ["final"]
    for r, (t, k) in enumerate(zip(rows.trajectory, rows.turn)):
        turn = flat[t].turns[k]
        assert list(rows.tokens[r, :rows.lengths[r]]) == turn.prompt_ids + turn.response_ids
