"""Answer extraction: the last \\boxed{} / \\fbox{} in the reply's last 300 characters."""

import pytest

from memagent_jax.rollout.answers import extract_boxed


@pytest.mark.parametrize("reply,answer", [
    ("The answer is \\boxed{Paris}.", "Paris"),
    ("\\boxed{first} then \\boxed{second}", "second"),
    ("nested \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}"),
    ("old style \\fbox{42}", "42"),
    ("\\fbox{a} and later \\boxed{b}", "b"),
    ("no box here", None),
    ("cut inside \\boxed{Par", None),
    ("\\boxed{early}" + "x" * 300, None),                  # outside the last 300 characters
    ("x" * 1000 + " \\boxed{late}", "late"),
    ("\\boxed {spaced}", "spaced"),
    ("\\boxedfoo{not a box}", None),
])
def test_extract_boxed(reply, answer):
    assert extract_boxed(reply) == answer
