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
from tests.rl.example_reward import HANG_S


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
    """It sleeps HANG_S (5 s): a timeout not applied shows as its score coming back."""
    rewarder = Rewarder(RewardSection("tests.rl.example_reward:hangs", workers=1,
                                      timeout_s=1.0))
    start = time.monotonic()
    with pytest.raises(UserError, match=r"^reward tests.rl.example_reward.hangs: row 0 \(arith\)"
                                        r": no score within reward.timeout_s = 1 s$"):
        rewarder.score(_examples()[:1], _groups([["a"]]))
    assert time.monotonic() - start < HANG_S and rewarder._pool is None  # its workers ended


def _rows(extra_infos, truths=None):
    """Examples whose extra_info are `extra_infos` (and ground truths `truths`, as stored)."""
    return [example_from_row({"data_source": "arith", "prompt": "1 + 1 ?",
                              "reward_model": {"ground_truth": "2" if truths is None
                                               else truths[i]},
                              "extra_info": extra}, i) for i, extra in enumerate(extra_infos)]


@pytest.fixture(scope="module")
def says_what_the_row_says():
    """A pool running example_reward.row_says: each row's extra_info["score"] is its reward."""
    rewarder = Rewarder(RewardSection("tests.rl.example_reward:row_says", workers=1))
    yield rewarder
    rewarder.close()


@pytest.mark.parametrize("value, shown", [
    (True, "True (bool)"),            # a verifier's `return answer == truth`
    (float("nan"), "nan (float)"),    # a mean over nothing
    (float("-inf"), "-inf (float)"),  # a log-probability of nothing
    ({"score": float("inf")}, "inf (float)"),
])
def test_a_reward_of_a_bool_nan_or_inf_is_one_line_naming_it_and_the_row(
        says_what_the_row_says, value, shown):
    with pytest.raises(UserError) as error:
        says_what_the_row_says.score(_rows([{"score": 0.5}, {"score": value}]),
                                     _groups([["a"], ["b"]]))
    assert str(error.value) == (f"reward tests.rl.example_reward.row_says: row 1 (arith): "
                                f"returned {shown}, not a finite number")


def test_finite_numbers_of_any_kind_are_rewards(says_what_the_row_says):
    rewards, _ = says_what_the_row_says.score(
        _rows([{"score": 1}, {"score": -0.25}, {"score": {"score": 0}}]),
        _groups([["a"], ["b"], ["c"]]))
    assert rewards.tolist() == [[1.0], [-0.25], [0.0]]


def test_the_reward_is_given_the_rows_ground_truth_as_stored_not_as_parsed():
    """A string stays one string (not a list of it), a number a number, a list a list:
    verl's rewards compare `ground_truth` as the dataset wrote it."""
    truths = ["4", 7, ["paris", "Paris"]]
    rewarder = Rewarder(RewardSection("tests.rl.example_reward:truth_as_stored", workers=1))
    try:
        rewards, _ = rewarder.score(_rows([{"stored": t} for t in truths], truths),
                                    _groups([["a"], ["b"], ["c"]]))
    finally:
        rewarder.close()
    assert rewards.tolist() == [[1.0], [1.0], [1.0]]


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
