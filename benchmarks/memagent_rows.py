"""MemAgent-shaped training rows without a model: the lengths of every turn of a RULER-HQA-like
batch at a train config's budgets, for the packing and step-time benchmarks.

A document of D tokens is read in ceil(D / chunk) chunks (at most `max_chunks`; the original
centre-truncates training documents to 8 chunks), each one memory-update turn, then one
final-answer turn:
- update turn k: prompt = update template + problem + memory_{k-1} (none before the first
  chunk) + chunk k (`chunk` tokens, the last one the rest of the document); response = memory_k;
- final turn: prompt = final template + problem + the last memory; response = the answer.

The distributions are assumptions, stated here and printed by every benchmark that uses them
(`describe`): document lengths uniform in [26K, 32K] tokens (the training set's "~28-32K"
HotpotQA documents, configs/train/qwen2.5-7b_gpu8.yaml); a memory uniform in [128, memory]
tokens; an answer uniform in [16, 256] tokens; the chat-wrapped templates 160 (update) and 120
(final) tokens; a problem 40 tokens.
"""

from __future__ import annotations

import dataclasses

import numpy as np

TEMPLATE_TOKENS = {"update": 160, "final": 120}
PROBLEM_TOKENS = 40
DOCUMENT_TOKENS = (26_000, 32_000)
MEMORY_MIN = 128
ANSWER_TOKENS = (16, 256)


@dataclasses.dataclass(frozen=True)
class TurnLengths:
    """One entry per turn (update turns of every document, then final turns): prompt [N] and
    response [N] token counts, final [N] bool, document [N] the document's index."""
    prompt: np.ndarray
    response: np.ndarray
    final: np.ndarray
    document: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return self.prompt + self.response


def turn_lengths(documents: int, *, chunk: int = 5000, memory: int = 1024,
                 max_chunks: int = 8, seed: int = 0) -> TurnLengths:
    """The turns of `documents` trajectories at these budgets (the 7B configs' by default)."""
    rng = np.random.default_rng(seed)
    prompt, response, final, document = [], [], [], []
    for d in range(documents):
        length = int(rng.integers(DOCUMENT_TOKENS[0], DOCUMENT_TOKENS[1] + 1))
        length = min(length, chunk * max_chunks)
        chunks = [chunk] * (length // chunk) + ([length % chunk] if length % chunk else [])
        previous = 0
        for size in chunks:
            written = int(rng.integers(MEMORY_MIN, memory + 1))
            prompt.append(TEMPLATE_TOKENS["update"] + PROBLEM_TOKENS + previous + size)
            response.append(written)
            final.append(False)
            document.append(d)
            previous = written
        prompt.append(TEMPLATE_TOKENS["final"] + PROBLEM_TOKENS + previous)
        response.append(int(rng.integers(ANSWER_TOKENS[0], ANSWER_TOKENS[1] + 1)))
        final.append(True)
        document.append(d)
    return TurnLengths(np.array(prompt), np.array(response), np.array(final),
                       np.array(document))


def describe() -> str:
    """The assumptions above in one line, for a benchmark's output."""
    return (f"documents U[{DOCUMENT_TOKENS[0]}, {DOCUMENT_TOKENS[1]}] tokens, memory "
            f"U[{MEMORY_MIN}, budget], answer U{list(ANSWER_TOKENS)}, templates "
            f"{TEMPLATE_TOKENS['update']}/{TEMPLATE_TOKENS['final']} + problem "
            f"{PROBLEM_TOKENS} tokens (benchmarks/memagent_rows.py)")
