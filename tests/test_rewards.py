"""The strict training verifier (docs/algorithm.md section 2) and the reward registry."""

import pytest

from memagent_jax.rl import rewards
from memagent_jax.rl.rewards import reward_function, strict_reward, strip_string


@pytest.mark.parametrize("response, truths, expected", [
    # exact, and case-insensitive on both sides
    ("The answer is \\boxed{Paris}.", ["paris"], 1.0),
    ("\\boxed{paris}", ["PARIS"], 1.0),
    # spaces and newlines inside the box are dropped by the normalisation
    ("\\boxed{ New  York\nCity }", ["new york city"], 1.0),
    ("\\boxed{Paris}", ["London"], 0.0),
    # the LAST box counts
    ("\\boxed{London} no wait, \\boxed{Paris}", ["paris"], 1.0),
    ("\\boxed{Paris} no wait, \\boxed{London}", ["paris"], 0.0),
    # max over several ground truths; a bare string is one truth
    ("\\boxed{NYC}", ["New York City", "nyc"], 1.0),
    ("\\boxed{NYC}", "nyc", 1.0),
    ("\\boxed{NYC}", [], 0.0),
    # \fbox counts like \boxed
    ("so \\fbox{42}", ["42"], 1.0),
    # nested braces are balanced; tfrac/dfrac -> frac; \frac12 -> \frac{1}{2}; 0.5 and 1/2
    ("\\boxed{\\dfrac{1}{2}}", ["\\frac12"], 1.0),
    ("\\boxed{0.5}", ["1/2"], 1.0),
    ("\\boxed{\\left(3\\right)}", ["(3)"], 1.0),
    ("\\boxed{90^\\circ}", ["90"], 1.0),
    ("\\boxed{50\\%}", ["50"], 1.0),
    ("\\boxed{\\$5}", ["5"], 1.0),
    ("\\boxed{x = 7}", ["7"], 1.0),
    ("\\boxed{\\sqrt2}", ["\\sqrt{2}"], 1.0),
    # no box, an unclosed box: nothing to compare
    ("Paris", ["paris"], 0.0),
    ("\\boxed{Paris", ["paris"], 0.0),
    # a slash between words is normalised like anything else (deliberate: see rewards.py)
    ("\\boxed{AC/DC }", ["ac/dc"], 1.0),
])
def test_strict_reward(response, truths, expected):
    assert strict_reward(response, truths) == expected


def test_only_the_last_300_characters_are_searched():
    boxed = "\\boxed{Paris}"
    assert strict_reward(boxed + " " * (300 - len(boxed)), ["paris"]) == 1.0
    # one more character pushes the box's opening backslash out of the window
    assert strict_reward(boxed + " " * (301 - len(boxed)), ["paris"]) == 0.0
    assert strict_reward("x" * 10_000 + boxed, ["paris"]) == 1.0


def test_normalisation_failure_falls_back_to_raw_comparison():
    # "\text{ " twice is malformed for the MATH normaliser: the raw strings are compared
    with pytest.raises(AssertionError):
        strip_string("1 \\text{ m} \\text{ s}")
    assert strict_reward("\\boxed{1 \\text{ m} \\text{ s}}", ["1 \\text{ m} \\text{ s}"]) == 1.0
    assert strict_reward("\\boxed{1 \\text{ m} \\text{ s}}", ["1"]) == 0.0


def test_registry_defaults_to_strict_and_is_pluggable(monkeypatch):
    assert reward_function("hotpotqa") is strict_reward
    assert reward_function("some_new_source") is strict_reward
    monkeypatch.setattr(rewards, "_REGISTRY", dict(rewards._REGISTRY))

    def contains(response, truths):
        return float(any(t in response for t in truths))

    rewards.register_reward("ruler_niah", contains)
    assert reward_function("ruler_niah")("the key is 1234", ["1234"]) == 1.0
    assert reward_function("hotpotqa") is strict_reward


def test_extract_boxed_is_the_rollout_one():
    from memagent_jax.rollout.answers import extract_boxed
    assert rewards.extract_boxed is extract_boxed
