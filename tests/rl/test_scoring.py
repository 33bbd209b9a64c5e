"""Reward functions by module path in verl's signature (rl/scoring.py): run in a pool of
processes, given the row's ground truth and extra_info as stored, timed; one that raises, hangs
or returns something other than a number stops the step with one line naming the function and
the row (the trainer side: tests/e2e/test_agent_training.py)."""

import time

import numpy as np
import pytest

from memagent_jax.data.pipeline import example_from_row
from memagent_jax.errors import ConfigError, UserError
from memagent_jax.rl.scoring import Rewarder, RewardSection
from memagent_jax.rollout.agent_api import Trajectory, Turn


def _examples():
    return [example_from_row({"data_source": "arith", "prompt": f"{i} + {i} ?",
                              "reward_model": {"ground_truth": str(2 * i)},
                              "extra_info": {"index": i}}, i) for i in range(3)]


def _groups(replies):
    return [[Trajectory("q", [Turn("final", [1], [2], [0.0], "stop", reply)])
             for reply in group] for group in replies]


@pytest.fixture(scope="module")
def pool():
    """One pool for the tests that leave it running."""
    rewarder = Rewarder(RewardSection("tests.rl.example_reward", workers=2, timeout_s=20))
    yield rewarder
    rewarder.close()


def test_a_module_reward_scores_every_final_reply_in_the_pool(pool):
    rewards, seconds = pool.score(_examples(), _groups([["0", "x"], ["so 2", "3"],
                                                        ["4!", "four"]]))
    np.testing.assert_array_equal(rewards, [[1, 0], [1, 0], [1, 0]])
    assert rewards.dtype == np.float32 and seconds > 0
    assert pool._pool is not None  # the function ran in the pool, not here


def test_verls_dict_form_is_read_for_its_score():
    rewarder = Rewarder(RewardSection("tests.rl.example_reward:as_dict", workers=1))
    try:
        rewards, _ = rewarder.score(_examples()[:1], _groups([["0"]]))
    finally:
        rewarder.close()
    assert rewards.tolist() == [[1.0]]


@pytest.mark.parametrize("function, message", [
    ("raises_on_row_2", "reward tests.rl.example_reward.raises_on_row_2: row 2 (arith): raised "
                        "ZeroDivisionError: division by zero"),
    ("says_yes", "reward tests.rl.example_reward.says_yes: row 0 (arith): returned 'yes' (str), "
                 "not a finite number"),
])
def test_a_reward_that_fails_is_one_line_naming_it_and_the_row(function, message):
    rewarder = Rewarder(RewardSection(f"tests.rl.example_reward:{function}", workers=1))
    try:
        with pytest.raises(UserError) as error:
            rewarder.score(_examples(), _groups([["a"], ["b"], ["c"]]))
    finally:
        rewarder.close()
    assert str(error.value) == message


def test_a_reward_that_hangs_is_stopped_after_its_timeout():
    rewarder = Rewarder(RewardSection("tests.rl.example_reward:hangs", workers=1,
                                      timeout_s=1.0))
    start = time.monotonic()
    with pytest.raises(UserError, match=r"^reward tests.rl.example_reward.hangs: row 0 \(arith\)"
                                        r": no score within reward.timeout_s = 1 s$"):
        rewarder.score(_examples()[:1], _groups([["a"]]))
    assert time.monotonic() - start < 30 and rewarder._pool is None  # its workers ended


@pytest.mark.parametrize("values, key, message", [
    ({"function": "no_such_module"}, "reward.function", "neither a built-in reward"),
    ({"function": "json:nothing"}, "reward.function", "has no function nothing"),
    ({"workers": 0}, "reward.workers", "at least 1"),
    ({"timeout_s": 0}, "reward.timeout_s", "positive number of seconds"),
])
def test_the_reward_section_is_checked_as_it_is_read(values, key, message):
    with pytest.raises(ConfigError) as error:
        RewardSection(**values)
    assert error.value.key == key and message in str(error.value)
