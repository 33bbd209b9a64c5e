"""Training verifiers: reply text + ground truths -> a scalar reward (docs/algorithm.md 2).

Every verifier takes `(response, ground_truths)`, a list of acceptable answers or one string
(one answer), and returns a float in [0, 1]; an empty list scores 0.

- `strict_reward` (names "strict", "hotpotqa"; the default): the original's HotpotQA training
  reward (original:verl/utils/reward_score/hotpotqa.py), the same score on every reply.
- `lenient_boxed_reward` ("lenient_boxed"): this port's earlier verifier, which also accepts
  `\\fbox{}`, `\\boxed {`, `k = ...` and MATH's other normalisations.
- `exact_match_reward` ("exact_match") and `f1_reward` ("f1"): SQuAD/HotpotQA EM and F1 of the
  boxed answer, extracted as the slime port's evaluation does (docs/algorithm.md 2).

Rewards are looked up by name or by the sample's `data_source` in a registry, so a task with
another verifier registers its own function; unknown sources get the strict one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from memagent_jax.eval import metrics
from memagent_jax.rollout.answers import extract_boxed, extract_boxed_lenient

__all__ = ["strict_reward", "lenient_boxed_reward", "exact_match_reward", "f1_reward",
           "strip_string", "math_strip_string", "reward_function", "register_reward",
           "RewardFn"]

RewardFn = Callable[[str, Sequence[str] | str], float]

# The rewards read only the reply's last 300 characters, as the original's (the evaluation
# reads the whole reply).
ANSWER_WINDOW = 300


def _truths(ground_truths: Sequence[str] | str) -> list[str]:
    # str(): a number in the data is compared as text (the original's .lower() would raise)
    return [ground_truths] if isinstance(ground_truths, str) else [str(t) for t in ground_truths]


def _tail_answer(response: str) -> str | None:
    """The original reward's answer: `extract_boxed` of the lowercased last 300 characters."""
    return extract_boxed(response[-ANSWER_WINDOW:].lower())


def strict_reward(response: str, ground_truths: Sequence[str] | str) -> float:
    """1.0 when the answer in the reply's lowercased last 300 characters (`extract_boxed`)
    equals a lowercased ground truth after `strip_string` on both, else 0.0: the original's
    `compute_score`, where a reply without an answer, or whose box is not `\\boxed{...}`
    (an assertion there), scores 0."""
    answer = _tail_answer(response)
    if answer is None:
        return 0.0
    answer = strip_string(answer)
    return float(any(answer == strip_string(t.lower()) for t in _truths(ground_truths)))


def lenient_boxed_reward(response: str, ground_truths: Sequence[str] | str) -> float:
    """1.0 when `extract_boxed_lenient` of the reply's lowercased last 300 characters equals a
    lowercased ground truth after `math_strip_string` on both (the raw strings are compared
    when that normalisation fails on either), else 0.0. It rewards replies the original scores
    0: `\\fbox{paris}`, `\\boxed {paris}`, `\\boxed{x = paris}`, `\\boxed{0.5}` against 1/2;
    and scores 0 the `\\boxed paris` the original rewards."""
    answer = extract_boxed_lenient(response[-ANSWER_WINDOW:].lower())
    if answer is None:
        return 0.0
    return float(any(_math_equivalent(answer, t.lower()) for t in _truths(ground_truths)))


def exact_match_reward(response: str, ground_truths: Sequence[str] | str) -> float:
    """`eval.metrics.exact_match` of the slime port's answer (`_slime_answer`) against the
    ground truths (the best one counts)."""
    return metrics.exact_match(_slime_answer(response), _truths(ground_truths))


def f1_reward(response: str, ground_truths: Sequence[str] | str) -> float:
    """`eval.metrics.f1` of the slime port's answer (`_slime_answer`) against the ground truths
    (the best one counts); a yes/no/noanswer on either side must match exactly, as the
    original's F1 (the slime port's evaluation F1 has no such rule)."""
    return metrics.f1(_slime_answer(response), _truths(ground_truths))


def _slime_answer(response: str) -> str:
    """The slime port's evaluation answer (agentic/memagent/eval_ruler_hqa.py): the reply is
    stripped of surrounding whitespace before the original reward's extraction; no answer is
    the empty string, which matches only a ground truth that normalises to nothing."""
    return _tail_answer(response.strip()) or ""


def _strip_markup(string: str) -> str:
    """The first steps common to both normalisations: newlines, `\\!`, doubled backslashes,
    tfrac/dfrac, `\\left`/`\\right`, degree signs and `\\$` go."""
    string = string.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    string = string.replace("tfrac", "frac").replace("dfrac", "frac")
    string = string.replace("\\left", "").replace("\\right", "")
    string = string.replace("^{\\circ}", "").replace("^\\circ", "")
    return string.replace("\\$", "")


def _zero_before_point(string: str) -> str:
    # " 0." and " ." are the same number, so are "{0." and "{."
    return string.replace(" .", " 0.").replace("{.", "{0.")


def strip_string(string: str) -> str:
    """The original HotpotQA reward's normalisation (its short `strip_string`): `_strip_markup`,
    drop `\\%`, write a 0 before a point after a space or `{`, drop all spaces. Never raises."""
    string = _zero_before_point(_strip_markup(string).replace("\\%", ""))
    return string.replace(" ", "")


def math_strip_string(string: str) -> str:
    """The MATH dataset's full answer normalisation (Hendrycks et al.), used by the lenient
    reward: `strip_string`'s steps plus units after `\\text{ `, a leading `.`, a short left-hand
    side before a single `=`, `\\sqrt3`, `\\frac12`, `0.5` and integer `a/b`. Raises on
    malformed input (two `\\text{ `, a trailing `\\sqrt` or `\\frac`); its caller then compares
    the raw strings."""
    string = _remove_right_units(_strip_markup(string))
    string = _zero_before_point(string.replace("\\%", ""))
    if not string:
        return string
    if string[0] == ".":
        string = "0" + string
    # "k = 5" -> "5": a short name on the left of a single "=" is dropped
    parts = string.split("=")
    if len(parts) == 2 and len(parts[0]) <= 2:
        string = parts[1]
    string = _fix_sqrt(string)
    string = string.replace(" ", "")
    string = _fix_fracs(string)
    if string == "0.5":
        string = "\\frac{1}{2}"
    return _fix_a_slash_b(string)


def _math_equivalent(answer: str, truth: str) -> bool:
    try:
        return math_strip_string(answer) == math_strip_string(truth)
    except (AssertionError, IndexError, ValueError):
        return answer == truth


def _remove_right_units(string: str) -> str:
    # "\text{ " only ever introduces units in MATH; two of them is malformed (raises, as
    # MATH's assert, so the caller compares raw strings)
    if "\\text{ " in string:
        parts = string.split("\\text{ ")
        assert len(parts) == 2
        return parts[0]
    return string


def _fix_sqrt(string: str) -> str:
    """\\sqrt3 -> \\sqrt{3}."""
    if "\\sqrt" not in string:
        return string
    parts = string.split("\\sqrt")
    out = parts[0]
    for part in parts[1:]:
        if part[0] != "{":  # IndexError on a trailing "\sqrt": caller falls back
            out += "\\sqrt{" + part[0] + "}" + part[1:]
        else:
            out += "\\sqrt" + part
    return out


def _fix_fracs(string: str) -> str:
    """\\frac12 -> \\frac{1}{2}, \\frac1{72} -> \\frac{1}{72}."""
    parts = string.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        if part[0] == "{":  # IndexError on a trailing "\frac": caller falls back
            out += part
            continue
        if len(part) < 2:
            return string
        a, b, rest = part[0], part[1], part[2:]
        out += "{" + a + "}{" + b + "}" + rest if b != "{" else "{" + a + "}" + b + rest
    return out


def _fix_a_slash_b(string: str) -> str:
    """"3/4" -> \\frac{3}{4} for plain integers; anything else unchanged (MATH's version raised
    on "ac/dc", which made the comparison fall back to the raw strings)."""
    parts = string.split("/")
    if len(parts) != 2:
        return string
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        return string
    if string != f"{a}/{b}":
        return string
    return "\\frac{" + str(a) + "}{" + str(b) + "}"


_REGISTRY: dict[str, RewardFn] = {
    "hotpotqa": strict_reward, "strict": strict_reward, "lenient_boxed": lenient_boxed_reward,
    "exact_match": exact_match_reward, "f1": f1_reward}


def register_reward(name: str, fn: RewardFn) -> None:
    """Makes `reward_function(name)` return fn (replacing any earlier one); name is a data
    source or a reward's name."""
    _REGISTRY[name] = fn


def reward_function(name: str) -> RewardFn:
    """The verifier registered under a data source or reward name; the strict one when none
    is."""
    return _REGISTRY.get(name, strict_reward)
