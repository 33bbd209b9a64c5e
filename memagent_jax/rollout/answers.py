"""The final answer inside a reply: the content of its last \\boxed (docs/algorithm.md 1-2).

`extract_boxed` is the original's extraction (`last_boxed_only_string` + `remove_boxed` of
original:verl/utils/reward_score/hotpotqa.py, the same code as `extract_boxed_answer` of
original:taskutils/memory_eval/utils/__init__.py); the training reward applies it to the
lowercased last 300 characters of a reply (rl/rewards.py), the evaluation to the whole reply
(`final_answer`). `extract_boxed_lenient` is this port's earlier, more forgiving extraction,
kept for the `lenient_boxed` reward only.
"""

from __future__ import annotations

from memagent_jax.rollout.thinking import THINK_END

_BOXED_SPACE = "\\boxed "
_BOXED_BRACE = "\\boxed{"


def _closing_brace(text: str, start: int) -> int | None:
    """Index of the `}` at which the count of `{` minus `}`, scanned from text[start], first
    comes back to zero; None when it never does (the reply was cut inside the box)."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def extract_boxed(text: str) -> str | None:
    """The original's answer of text (case and spaces kept), None when it has none:

    - if text contains `\\boxed ` (with a space) anywhere, everything after the last
      `\\boxed `, up to the first `$` (this wins over any `\\boxed{...}`, even a later one);
    - else from the last `\\boxed` (or, when there is none, the last `\\fbox`) scan to the
      brace that balances the count; the span must read `\\boxed{...}`, and its content is the
      answer. No balance gives None. So does a span that does not start with `\\boxed{`
      (`\\fbox{...}`, `\\boxed\\n{...}`, `\\boxedx{...}`): there the original fails an
      assertion, which its reward scores 0 and its evaluation does not catch.
    """
    at = text.rfind(_BOXED_SPACE)
    if at >= 0:
        return text[at + len(_BOXED_SPACE):].partition("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    end = _closing_brace(text, start)
    if end is None or not text.startswith(_BOXED_BRACE, start):
        return None
    return text[start + len(_BOXED_BRACE):end]


def final_answer(reply: str) -> str | None:
    """The answer the original's evaluation scores for a final reply (`get_pred` in
    original:taskutils/memory_eval/ruler_hqa.py and ruler_general.py, `--api recurrent-boxed`
    or `boxed`): the reply is stripped of surrounding whitespace; when it contains `</think>`,
    the part after the last one (stripped) is searched, or the whole reply if that part is
    empty; the answer is `extract_boxed` of that text, over all of it and with its case."""
    text = reply.strip()
    after_thinking = text.rpartition(THINK_END)[2].strip()
    return extract_boxed(after_thinking or text)


def extract_boxed_lenient(text: str) -> str | None:
    """This port's earlier extraction (the `lenient_boxed` reward): the content of the later
    of the last `\\boxed` and the last `\\fbox` in text, spaces allowed between the keyword
    and its brace, braces balanced; None when there is none or its braces never close.
    `\\boxed paris` (no brace) has no answer here."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    open_at = text.find("{", start)
    if open_at < 0 or text[start:open_at].strip() not in ("\\boxed", "\\fbox"):
        return None
    end = _closing_brace(text, open_at)
    return None if end is None else text[open_at + 1:end]
