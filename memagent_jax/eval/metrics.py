"""Test metrics (docs/algorithm.md section 2): lenient SQuAD/HotpotQA answer matching, and
RULER's string_match_all for the synthetic tasks.

Every QA metric takes `(prediction, gold)` and returns a float in [0, 1]; `gold` may be one
answer or a list of acceptable answers (the best match counts, as SQuAD scores several gold
answers). The published RULER-HQA "accuracy" is mean `sub_exact_match` x 100.

A missing prediction (None: no answer in the reply, see rollout.answers.final_answer) scores 0
everywhere, as the original scores samples without an extracted answer.
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Callable, Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
# HotpotQA's F1: a yes/no (or "noanswer") on either side must match exactly, else F1 is 0;
# otherwise "yes" would earn partial credit against "yes, in 1998".
_CLOSED_ANSWERS = ("yes", "no", "noanswer")


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation, drop the articles a/an/the, collapse whitespace (in the
    order of the SQuAD/HotpotQA evaluation scripts)."""
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _best(metric: Callable[[str, str], float], prediction: str | None,
          gold: str | Sequence[str]) -> float:
    if prediction is None:
        return 0.0
    golds = [gold] if isinstance(gold, str) else list(gold)
    return max((metric(prediction, g) for g in golds), default=0.0)


def _exact(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def _sub_exact(prediction: str, gold: str) -> float:
    p, g = normalize_answer(prediction), normalize_answer(gold)
    if not p or not g:
        # Deliberate: the original's `g in p or p in g` counts an answer that normalises to
        # nothing (e.g. "The.") as contained in every gold answer.
        return float(p == g)
    return float(g in p or p in g)


def _f1(prediction: str, gold: str) -> float:
    p, g = normalize_answer(prediction), normalize_answer(gold)
    if (p in _CLOSED_ANSWERS or g in _CLOSED_ANSWERS) and p != g:
        return 0.0
    p_tokens, g_tokens = p.split(), g.split()
    common = sum((collections.Counter(p_tokens) & collections.Counter(g_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(p_tokens), common / len(g_tokens)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str | None, gold: str | Sequence[str]) -> float:
    """1.0 when the normalised prediction equals a normalised gold answer."""
    return _best(_exact, prediction, gold)


def sub_exact_match(prediction: str | None, gold: str | Sequence[str]) -> float:
    """1.0 when a normalised gold answer is contained in the normalised prediction, or the
    prediction in the gold answer (both directions, as the original); an empty normalised
    prediction matches only an empty gold answer."""
    return _best(_sub_exact, prediction, gold)


def f1(prediction: str | None, gold: str | Sequence[str]) -> float:
    """Token-level F1 of the normalised strings; yes/no/noanswer must match exactly."""
    return _best(_f1, prediction, gold)


def string_match_all(prediction: str | None, references: str | Sequence[str]) -> float:
    """RULER's metric: the fraction of reference strings contained in the prediction,
    case-insensitive (no other normalisation)."""
    if prediction is None:
        return 0.0
    refs = [references] if isinstance(references, str) else list(references)
    if not refs:
        return 0.0
    text = prediction.lower()
    return sum(r.lower() in text for r in refs) / len(refs)


def qa_scores(prediction: str | None, gold: str | Sequence[str]) -> dict[str, float]:
    """The three QA metrics of one prediction: {"em", "sub_em", "f1"}."""
    return {"em": exact_match(prediction, gold), "sub_em": sub_exact_match(prediction, gold),
            "f1": f1(prediction, gold)}
