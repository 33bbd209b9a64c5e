"""The DAPO loss against a hand-written reference, group advantages on training rows, DAPO
shaping (overlong penalty, dynamic-sampling filter) and the micro-batch planner."""

import math

import jax
import numpy as np
import pytest

from memagent_jax.rl.advantages import group_advantages
from memagent_jax.rl.dapo import informative_groups, overlong_penalty, policy_loss
from memagent_jax.rl.rows import rows_from_trajectories
from memagent_jax.rollout.agent_api import Trajectory, Turn

# DAPO's paper: clip-higher 0.2 / 0.28, dual clip 3, no KL (the shipped configs set their own).
DAPO = {"eps_low": 0.2, "eps_high": 0.28, "dual_clip": 3.0, "kl_coef": 0.0}


def reference_loss(logp, old, adv, mask, eps_low, eps_high, c, ref, kl_coef, ent, ent_coef):
    """Token by token, in plain Python floats: verl's dual-clip PPO loss with low_var_kl."""
    pg_sum = kl_sum = ent_sum = clipped = 0.0
    count = 0.0
    for r in range(logp.shape[0]):
        a = float(adv[r])
        for t in range(logp.shape[1]):
            if not mask[r, t]:
                continue
            count += 1
            ratio = math.exp(min(max(logp[r, t] - old[r, t], -20), 20))
            loss1 = -a * ratio
            loss2 = -a * min(max(ratio, 1 - eps_low), 1 + eps_high)
            if loss2 > loss1:
                clipped += 1
            loss = max(loss1, loss2)
            if a < 0:
                loss = min(loss, -a * c)
            pg_sum += loss
            d = min(max(ref[r, t] - logp[r, t], -20), 20)
            kl_sum += min(max(math.exp(d) - d - 1, -10), 10)
            ent_sum += ent[r, t]
    pg, kl, entropy = pg_sum / count, kl_sum / count, ent_sum / count
    return pg + kl_coef * kl - ent_coef * entropy, pg, kl, entropy, clipped / count


@pytest.fixture
def arrays():
    rng = np.random.RandomState(0)
    rows, t = 6, 9
    old = -rng.uniform(0.1, 3.0, (rows, t))
    # log-ratios spread over [-1, 1] put tokens on every side of the clip bounds (ratios 0.37
    # to 2.7); one huge one exercises the dual clip and the +-20 clamp
    logp = old + rng.uniform(-1.0, 1.0, (rows, t))
    logp[1, 2] = old[1, 2] + 25.0
    ref = old + rng.uniform(-2.0, 2.0, (rows, t))
    ref[2, 3] = logp[2, 3] + 12.0  # k3 estimate far above 10: the clamp bites
    adv = np.array([1.5, -2.0, 0.7, -0.3, 0.0, -1.1])
    mask = (rng.uniform(size=(rows, t)) < 0.7).astype(np.float64)
    mask[1, 2] = mask[2, 3] = 1.0
    mask[4] = 0.0  # a row without response tokens
    entropy = rng.uniform(0.0, 4.0, (rows, t))
    return logp, old, adv, mask, ref, entropy


@pytest.mark.parametrize("eps_low, eps_high, c, kl_coef, ent_coef", [
    (0.2, 0.28, 3.0, 0.0, 0.0),    # DAPO clip-higher, dual clip, no KL
    (0.2, 0.28, 3.0, 0.001, 0.0),  # + the KL loss of docs/algorithm.md section 3
    (0.1, 0.5, 2.0, 0.3, 0.05),    # strongly asymmetric, large KL and entropy terms
    (0.2, 0.2, 3.0, 0.0, 0.0),     # the original scripts' symmetric clip
])
def test_policy_loss_matches_hand_computed_reference(arrays, eps_low, eps_high, c, kl_coef,
                                                     ent_coef):
    logp, old, adv, mask, ref, entropy = arrays
    loss, metrics = policy_loss(
        logp, old, adv, mask, eps_low=eps_low, eps_high=eps_high, dual_clip=c, ref_logp=ref,
        kl_coef=kl_coef, entropy=entropy, entropy_coef=ent_coef)
    want, pg, kl, ent, clip_fraction = reference_loss(logp, old, adv, mask, eps_low, eps_high,
                                                      c, ref, kl_coef, entropy, ent_coef)
    # computed in float32, as the learner runs it
    assert abs(float(loss) - want) <= 1e-6
    assert abs(float(metrics["pg_loss"]) - pg) <= 1e-6
    assert abs(float(metrics["kl"]) - (kl if kl_coef else 0.0)) <= 1e-6
    assert abs(float(metrics["entropy"]) - ent) <= 1e-6
    assert float(metrics["clip_fraction"]) == pytest.approx(clip_fraction, abs=1e-7)


def test_clip_higher_asymmetry_and_dual_clip_on_single_tokens():
    """One token per case, advantages +-1: where each bound applies."""
    def loss(log_ratio, adv, **kw):
        kw = {**DAPO, **kw}
        value, _ = policy_loss(np.array([[log_ratio]]), np.zeros((1, 1)), np.array([adv]),
                               np.ones((1, 1)), **kw)
        return float(value)

    up, down = math.log(1.5), math.log(0.5)
    # A > 0: the ratio is capped at 1 + eps_high (0.28, not 0.2), the lower side unclipped
    assert loss(up, 1.0) == pytest.approx(-1.28, abs=1e-6)
    assert loss(up, 1.0, eps_high=0.2) == pytest.approx(-1.2, abs=1e-6)
    assert loss(down, 1.0) == pytest.approx(-0.5, abs=1e-6)
    # A < 0: floored at 1 - eps_low, unbounded above until the dual clip c = 3
    assert loss(down, -1.0) == pytest.approx(0.8, abs=1e-6)
    assert loss(up, -1.0) == pytest.approx(1.5, abs=1e-6)
    assert loss(math.log(10.0), -1.0) == pytest.approx(3.0, abs=1e-6)
    assert loss(math.log(10.0), -1.0, dual_clip=None) == pytest.approx(10.0, abs=1e-5)


def test_policy_loss_gradient_vanishes_on_clipped_tokens():
    """The clip stops the gradient on the side the advantage pushes to; masked tokens and
    padding never contribute."""
    adv = np.array([1.0, -1.0, 1.0])
    old = np.zeros((3, 2))
    logp = np.array([[math.log(2.0), 0.0], [math.log(0.3), 0.0], [0.1, 0.0]])
    mask = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    grad = jax.grad(lambda lp: policy_loss(lp, old, adv, mask, **DAPO)[0])(logp)
    assert grad[0, 0] == 0.0 and grad[1, 0] == 0.0  # beyond 1.28 with A>0, below 0.8 with A<0
    assert grad[2, 0] == pytest.approx(-math.exp(0.1) / 3, rel=1e-5)  # inside: -A r / tokens
    assert np.all(grad[:, 1] == 0.0)


def test_row_weights_make_micro_batch_losses_sum_to_the_mini_batch_mean(arrays):
    logp, old, adv, mask, ref, _ = arrays
    settings = {**DAPO, "kl_coef": 0.1}
    whole, _ = policy_loss(logp, old, adv, mask, ref_logp=ref, **settings)
    weight = 1.0 / mask.sum()
    parts = [policy_loss(logp[s], old[s], adv[s], mask[s], ref_logp=ref[s], **settings,
                         row_weights=np.full(len(adv[s]), weight))[0]
             for s in (slice(0, 2), slice(2, 6))]
    assert float(sum(parts)) == pytest.approx(float(whole), abs=1e-6)


def test_group_advantages():
    rewards = np.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]])
    np.testing.assert_array_equal(group_advantages(rewards), [
        [0.5, -0.5, -0.5, 0.5], [0, 0, 0, 0], [-0.25, -0.25, -0.25, 0.75]])
    scaled = group_advantages(rewards, normalize_std=True)
    std = np.std([0, 0, 0, 1.0], ddof=1)
    np.testing.assert_allclose(scaled[2], np.array([-0.25, -0.25, -0.25, 0.75]) / (std + 1e-6),
                               rtol=1e-6)
    np.testing.assert_array_equal(scaled[1], 0.0)  # equal rewards: 0 / eps, not nan
    np.testing.assert_array_equal(group_advantages(np.array([[0.7], [0.0]])),
                                  np.float32([[0.7], [0.0]]))


def _trajectory(turns, seed):
    """A trajectory of `turns` turns with distinct prompt/response lengths."""
    rng = np.random.RandomState(seed)
    steps = []
    for k in range(turns):
        p, n = 3 + rng.randint(5), 1 + rng.randint(6)
        steps.append(Turn("update" if k < turns - 1 else "final", list(rng.randint(3, 100, p)),
                          list(rng.randint(3, 100, n)), list(-rng.uniform(0.1, 2, n)), "stop",
                          ""))
    return Trajectory("q", steps)


def test_rows_carry_each_trajectorys_advantage_on_every_response_token():
    turns = [[1, 4, 2], [3, 1, 4]]  # 2 groups x 3 trajectories, 1 to 4 turns each
    groups = [[_trajectory(k, 10 * g + j) for j, k in enumerate(ts)] for g, ts in
              enumerate(turns)]
    rewards = np.array([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]])
    advantages = group_advantages(rewards)
    np.testing.assert_allclose(advantages, [[2 / 3, -1 / 3, -1 / 3], [1 / 3, 1 / 3, -2 / 3]],
                               rtol=1e-6)
    rows = rows_from_trajectories(groups, advantages)
    assert len(rows) == sum(map(sum, turns)) == 15
    expected_trajectory = [t for t, k in enumerate([1, 4, 2, 3, 1, 4]) for _ in range(k)]
    np.testing.assert_array_equal(rows.trajectory, expected_trajectory)
    flat = [t for g in groups for t in g]
    r = 0
    for t, trajectory in enumerate(flat):
        a = np.float32(advantages.reshape(-1)[t])
        for c in trajectory.turns:
            p, n = len(c.prompt_ids), len(c.response_ids)
            want = np.zeros(rows.tokens.shape[1], np.float32)
            want[p:p + n] = a
            np.testing.assert_array_equal(rows.token_advantages()[r], want)
            np.testing.assert_array_equal(rows.tokens[r, :p + n], c.prompt_ids + c.response_ids)
            np.testing.assert_array_equal(rows.tokens[r, p + n:], 0)
            np.testing.assert_array_equal(rows.rollout_logprobs[r, p:p + n],
                                          np.float32(c.response_logprobs))
            assert rows.rollout_logprobs[r].sum() == pytest.approx(sum(c.response_logprobs))
            assert rows.lengths[r] == p + n and rows.prompt_lengths[r] == p
            r += 1
    # the flat form with flat advantages gives the same rows
    same = rows_from_trajectories(flat, advantages.reshape(-1))
    np.testing.assert_array_equal(same.token_advantages(), rows.token_advantages())


def test_overlong_penalty():
    lengths = [10, 80, 81, 90, 100, 120]
    np.testing.assert_allclose(overlong_penalty(lengths, 100, 20, penalty_factor=0.5),
                               [0, 0, -0.025, -0.25, -0.5, -0.5], rtol=1e-6)
    with pytest.raises(ValueError):
        overlong_penalty(lengths, 100, 0)


def test_informative_groups():
    rewards = np.array([[1, 1, 1], [0, 1, 0], [0, 0, 0], [0.5, 0.5, 0.25]])
    np.testing.assert_array_equal(informative_groups(rewards), [False, True, False, True])
