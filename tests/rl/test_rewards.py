"""Training verifiers (docs/algorithm.md section 2) and the reward registry: the strict reward
scores as the original's (quoted in tests/original_hotpotqa_reward.py) on many replies; the
lenient, exact-match and F1 rewards on hand-computed cases."""


import pytest

from memagent_jax.rl import rewards
from memagent_jax.rl.rewards import (
    exact_match_reward,
    f1_reward,
    lenient_boxed_reward,
    math_strip_string,
    reward_function,
    strict_reward,
    strip_string,
)
from memagent_jax.rl.scoring import BUILT_IN, contains_reward, verifier
from tests import original_hotpotqa_reward as original
from tests.builders import random_replies

# (final reply, ground truths); each is scored by ours and by the original's compute_score.
PROBES = [
    ("The answer is \\boxed{Paris}.", ["paris"]),
    ("\\boxed{x = Paris}", ["paris"]),
    ("\\fbox{Paris}", ["paris"]),
    ("\\boxed Paris", ["paris"]),
    ("\\boxed Paris.", ["paris"]),
    ("\\boxed Paris.", ["Paris."]),
    ("\\boxed Paris$ is it", ["paris"]),
    ("\\boxed $Paris$", ["paris"]),
    ("\\boxed  then \\boxed{Paris}", ["paris"]),       # `\boxed ` wins over the later box
    ("\\boxed{1/2}", ["0.5"]),
    ("\\boxed{0.5}", ["1/2"]),
    ("\\boxed {paris}", ["paris"]),
    ("\\boxed{Rome} and \\fbox{Paris}", ["paris"]),
    ("\\boxed{Rome} and \\fbox{Paris}", ["rome"]),
    ("\\boxed{\\text{New {York}}}", ["\\text{new {york}}"]),
    ("\\boxed{\\dfrac{1}{2}}", ["\\frac{1}{2}"]),
    ("\\boxed{\\dfrac{1}{2}}", ["\\frac12"]),
    ("\\boxed{Paris", ["paris"]),
    ("so \\boxed{Paris} or \\boxed{Rome", ["paris"]),
    ("\\boxed{Paris}" + " " * 288, ["paris"]),          # 301 characters: the "\" is cut off
    ("\\boxed{Paris}" + " " * 287, ["paris"]),          # 300 characters
    ("x" * 1000 + "\\boxed{Paris}", ["paris"]),
    ("\\boxed{PARIS}", ["Paris"]),
    ("\\boxed{50\\%}", ["50"]),
    ("\\boxed{50\\%}", ["50\\%"]),
    ("\\boxed{\\$5}", ["5"]),
    ("\\boxed{90^\\circ}", ["90"]),
    ("\\boxed{\\left(3\\right)}", ["(3)"]),
    ("\\boxed{x .5}", ["x 0.5"]),
    ("\\boxed{.5}", ["0.5"]),
    ("\\boxed{ New  York\nCity }", ["new york city"]),
    ("\\boxed{NYC}", ["New York City", "nyc"]),
    ("\\boxed{NYC}", ["London", "Paris"]),
    ("\\boxed{AC/DC}", ["ac/dc"]),
    ("\\boxed{1 \\text{ m} \\text{ s}}", ["1"]),
    ("\\boxed{}", [""]),
    ("\\boxedx{Paris}", ["paris"]),
    ("\\boxed\n{Paris}", ["paris"]),
    ("\\fbox{Paris} and a bare \\boxed", ["paris"]),
    ("Paris", ["paris"]),
    ("", ["paris"]),
]


@pytest.mark.parametrize("response, truths", PROBES)
def test_strict_reward_is_the_originals(response, truths):
    assert strict_reward(response, truths) == original.compute_score(response, truths)


def test_random_replies_score_as_the_original(capsys):
    truths = ["paris", "0.5", "1/2", "x", "paris.", "{paris}", "x=paris", ""]
    for k, reply in enumerate(random_replies(3000, seed=1)):
        gold = [truths[k % len(truths)], truths[(k // 3) % len(truths)]]
        assert strict_reward(reply, gold) == original.compute_score(reply, gold), (reply, gold)
    capsys.readouterr()  # the original prints each assertion it catches


@pytest.mark.parametrize("response, truths, expected", [
    ("The answer is \\boxed{Paris}.", ["paris"], 1.0),
    ("\\boxed Paris", ["paris"], 1.0),
    ("\\boxed Paris.", ["paris"], 0.0),                  # the full stop stays in the answer
    ("\\boxed{x = Paris}", ["paris"], 0.0),
    ("\\fbox{Paris}", ["paris"], 0.0),
    ("\\boxed {paris}", ["paris"], 0.0),
    ("\\boxed{Rome} and \\fbox{Paris}", ["rome"], 1.0),
    ("\\boxed{0.5}", ["1/2"], 0.0),
    ("\\boxed{50\\%}", ["50"], 1.0),
    ("\\boxed{NYC}", ["New York City", "nyc"], 1.0),
    ("\\boxed{NYC}", "nyc", 1.0),                        # a bare string is one ground truth
    ("\\boxed{NYC}", [], 0.0),                           # the original raises on no truths
])
def test_strict_reward_by_hand(response, truths, expected):
    assert strict_reward(response, truths) == expected


def test_only_the_last_300_characters_are_searched():
    boxed = "\\boxed{Paris}"
    assert strict_reward(boxed + " " * (300 - len(boxed)), ["paris"]) == 1.0
    # one more character pushes the box's opening backslash out of the window
    assert strict_reward(boxed + " " * (301 - len(boxed)), ["paris"]) == 0.0
    assert strict_reward("x" * 10_000 + boxed, ["paris"]) == 1.0


def test_strip_string_is_the_originals_short_one():
    for s in ["1 \\text{ m} \\text{ s}", "x = 7", "\\sqrt2", "0.5", " .5 {.5", "a\\!b\n\\\\c",
              "\\tfrac{1}{2}", "90^{\\circ}", "\\$5", "50\\%", ""]:
        assert strip_string(s) == original.strip_string(s)


@pytest.mark.parametrize("response, truths, expected", [
    # the port's earlier verifier: \fbox, "\boxed {", the later of \boxed and \fbox, k = ...
    ("The answer is \\boxed{Paris}.", ["paris"], 1.0),
    ("\\boxed{paris}", ["PARIS"], 1.0),
    ("\\boxed{ New  York\nCity }", ["new york city"], 1.0),
    ("\\boxed{Paris}", ["London"], 0.0),
    ("\\boxed{London} no wait, \\boxed{Paris}", ["paris"], 1.0),
    ("\\boxed{NYC}", ["New York City", "nyc"], 1.0),
    ("\\boxed{NYC}", [], 0.0),
    ("so \\fbox{42}", ["42"], 1.0),
    ("\\boxed {paris}", ["paris"], 1.0),
    ("\\boxed{Rome} and \\fbox{Paris}", ["paris"], 1.0),
    ("\\boxed Paris", ["paris"], 0.0),
    ("\\boxed{\\dfrac{1}{2}}", ["\\frac12"], 1.0),
    ("\\boxed{0.5}", ["1/2"], 1.0),
    ("\\boxed{90^\\circ}", ["90"], 1.0),
    ("\\boxed{x = 7}", ["7"], 1.0),
    ("\\boxed{x = Paris}", ["paris"], 1.0),
    ("\\boxed{\\sqrt2}", ["\\sqrt{2}"], 1.0),
    ("\\boxed{Paris", ["paris"], 0.0),
    ("\\boxed{AC/DC }", ["ac/dc"], 1.0),
    ("\\boxed{Paris}" + " " * 288, ["paris"], 0.0),    # outside the last 300 characters
])
def test_lenient_boxed_reward(response, truths, expected):
    assert lenient_boxed_reward(response, truths) == expected


def test_lenient_normalisation_failure_falls_back_to_raw_comparison():
    # "\text{ " twice is malformed for the MATH normaliser: the raw strings are compared
    with pytest.raises(AssertionError):
        math_strip_string("1 \\text{ m} \\text{ s}")
    assert lenient_boxed_reward("\\boxed{1 \\text{ m} \\text{ s}}",
                                ["1 \\text{ m} \\text{ s}"]) == 1.0
    assert lenient_boxed_reward("\\boxed{1 \\text{ m} \\text{ s}}", ["1"]) == 0.0


@pytest.mark.parametrize("response, truths, em, f1", [
    # normalised: case, punctuation and articles go
    ("so \\boxed{The Eiffel Tower.}", ["eiffel tower"], 1.0, 1.0),
    # tokens eiffel tower in paris vs eiffel tower: P 2/4, R 2/2, F1 2/3
    ("\\boxed{Eiffel Tower in Paris}", ["Eiffel Tower"], 0.0, 2 / 3),
    # the best ground truth counts
    ("\\boxed{Eiffel Tower in Paris}", ["London", "Eiffel Tower in Paris"], 1.0, 1.0),
    # yes/no must match exactly for F1 (slime's evaluation F1 would give 1/2 here)
    ("\\boxed{yes it is}", ["yes"], 0.0, 0.0),
    # the original's extraction: `\boxed ` with a space, \fbox scores nothing
    ("\\boxed Paris$", ["paris"], 1.0, 1.0),
    ("\\fbox{Paris}", ["paris"], 0.0, 0.0),
    # trailing whitespace is stripped before the 300-character window (strict: 0)
    ("\\boxed{Paris}" + " " * 400, ["paris"], 1.0, 1.0),
    ("\\boxed{Paris}" + "x" * 300, ["paris"], 0.0, 0.0),
    # no answer is the empty string
    ("no box", ["paris"], 0.0, 0.0),
    ("\\boxed{NYC}", "nyc", 1.0, 1.0),
])
def test_exact_match_and_f1_rewards(response, truths, em, f1):
    assert exact_match_reward(response, truths) == em
    assert f1_reward(response, truths) == pytest.approx(f1)


def test_registry_defaults_to_strict_and_is_pluggable(monkeypatch):
    assert reward_function("hotpotqa") is strict_reward
    assert reward_function("strict") is strict_reward
    assert reward_function("some_new_source") is strict_reward
    assert reward_function("lenient_boxed") is lenient_boxed_reward
    assert reward_function("exact_match") is exact_match_reward
    assert reward_function("f1") is f1_reward
    monkeypatch.setattr(rewards, "_REGISTRY", dict(rewards._REGISTRY))

    def contains(response, truths):
        return float(any(t in response for t in truths))

    rewards.register_reward("ruler_niah", contains)
    assert reward_function("ruler_niah")("the key is 1234", ["1234"]) == 1.0
    assert reward_function("hotpotqa") is strict_reward


def test_every_built_in_reward_name_names_a_verifier():
    assert set(BUILT_IN) == {"by_source", "contains", "strict", "lenient_boxed", "exact_match",
                             "f1"}
    assert verifier("by_source", "hotpotqa") is strict_reward
    assert verifier("contains", "hotpotqa") is contains_reward
    for kind in set(BUILT_IN) - {"by_source", "contains"}:
        assert verifier(kind, "some_source") is reward_function(kind)
    assert verifier("f1", "hotpotqa") is f1_reward
