"""Training verifiers: reply text + ground truths -> a scalar reward (docs/algorithm.md 2).

The strict verifier is the original's HotpotQA training reward: lowercase the end of the reply,
take the last \\boxed{} (or \\fbox{}) content, normalise it as the MATH dataset's `strip_string`
does, and score 1.0 when it equals one of the lowercased ground truths (normalised the same way).

Rewards are looked up by the sample's `data_source` in a registry, so a task with another
verifier registers its own function; unknown sources get the strict one.

One deliberate change from the original: its `fix_a_slash_b` raised on answers such as
"ac/dc" (`int("ac")`), which made the comparison fall back to the raw, unnormalised strings;
here such an answer is normalised like any other (the slash is kept). Any other failure inside
the normalisation still falls back to comparing the raw strings, as the original's `is_equiv`.
"""

from __future__ import annotations

from typing import Callable

from memagent_jax.rollout.answers import ANSWER_WINDOW, extract_boxed

__all__ = ["extract_boxed", "strict_reward", "strip_string", "reward_function", "register_reward",
           "RewardFn"]

RewardFn = Callable[[str, list[str]], float]


def strict_reward(response: str, ground_truths: list[str] | str) -> float:
    """1.0 when the last \\boxed{} of the reply's last 300 characters equals (after
    normalisation, case-insensitively) one of the ground truths, else 0.0."""
    if isinstance(ground_truths, str):
        ground_truths = [ground_truths]
    answer = extract_boxed(response[-ANSWER_WINDOW:].lower())
    if answer is None:
        return 0.0
    return max((1.0 if _equivalent(answer, str(t).lower()) else 0.0 for t in ground_truths),
               default=0.0)


def _equivalent(answer: str, truth: str) -> bool:
    try:
        return strip_string(answer) == strip_string(truth)
    except (AssertionError, IndexError, ValueError):
        return answer == truth


def strip_string(string: str) -> str:
    """The MATH dataset's answer normalisation (Hendrycks et al.), step for step."""
    string = string.replace("\n", "")
    string = string.replace("\\!", "")
    string = string.replace("\\\\", "\\")
    string = string.replace("tfrac", "frac").replace("dfrac", "frac")
    string = string.replace("\\left", "").replace("\\right", "")
    string = string.replace("^{\\circ}", "").replace("^\\circ", "")
    string = string.replace("\\$", "")
    string = _remove_right_units(string)
    string = string.replace("\\%", "")
    # " 0." and " ." are the same number, so are "{0." and "{."
    string = string.replace(" .", " 0.").replace("{.", "{0.")
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


def _remove_right_units(string: str) -> str:
    # "\text{ " only ever introduces units in MATH; two of them is malformed (raises, as the
    # original's assert, so the caller compares raw strings)
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
    """"3/4" -> \\frac{3}{4} for plain integers; anything else unchanged."""
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


_REGISTRY: dict[str, RewardFn] = {"hotpotqa": strict_reward, "strict": strict_reward}


def register_reward(data_source: str, fn: RewardFn) -> None:
    """Makes `reward_function(data_source)` return fn (replacing any earlier one)."""
    _REGISTRY[data_source] = fn


def reward_function(data_source: str) -> RewardFn:
    """The verifier registered for a data source; the strict one when none is."""
    return _REGISTRY.get(data_source, strict_reward)
