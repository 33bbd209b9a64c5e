"""`memagent-jax trace --selection`: which facts a memory agent keeps, the asked ones against
the distractors.

The agent reads `num_samples` fresh documents of (task, length, seed) greedily, as `trace`
reads them. The memory its final turn answers from (after the last chunk read) is checked for
every fact of the document (`trace.holds`: the fact's words but its full stop, in a row): the
asked facts (those the answer needs: multikey's asked key's code; twohop's person's city and
that city's code) apart from the distractors (the other facts, of the same forms). The summary:

- the fraction of (document, asked fact) pairs whose memory holds the fact, and of (document,
  distractor) pairs, each with Wilson's 95 % interval (`eval.compare.wilson_interval`; one
  document's distractors are counted as if apart, so their interval is that of a pooled rate);
- whether the asked facts are held more (or less) often than chance: under "an asked fact is
  held as any fact of its document" (the facts exchangeable within each memory), given how
  many facts each memory holds, the asked ones held in a document are hypergeometric and their
  total a sum of them; the count held is set against that, with its exact two-sided p (twice
  the smaller tail, as `eval.compare.sign_test` computes one). A comparison of each asked
  fact against the distractors' share, document by document, is no such test: with each fact
  held at rate q it is even only at q = 1/2;
- what the memories are made of: their sentences of a fact's form ("the code of", "the city
  of"), and how many of those state one of the document's facts as written;
- the update turns' mean reply length in tokens, and the answers right.

A model never shown which facts to keep should hold an asked fact and a distractor alike; the
RL-only ladder's start, whose final turns showed the asked fact (the `format` target), holds
the asked one more often before any RL (docs/synthetic.md). On one-chunk documents the memory
is the one update turn's reply.
"""

from __future__ import annotations

import dataclasses
import math

from memagent_jax.synthetic.trace import holds, read_greedily, write_records

FACT_FORMS = (("the", "code", "of"), ("the", "city", "of"))


@dataclasses.dataclass
class DocumentSelection:
    """One read's memory against its document's facts (in document order)."""
    index: int
    memory: str            # the memory the final turn answered from
    asked: list[bool]      # whether it holds each fact the answer needs
    distractors: list[bool]  # ... each other fact
    sentences: int         # its sentences (the last may be cut)
    fact_form: int         # ... of a fact's form
    facts_stated: int      # ... of them stating one of the document's facts as written
    update_tokens: float   # the update turns' mean reply length (tokens)
    answer: str
    truth: str

    @property
    def correct(self) -> bool:
        return self.answer == self.truth


def document_selection(index: int, document, memory: str, update_tokens: float,
                       answer: str) -> DocumentSelection:
    """The selection of one read: `document` (a tasks.Sample), the `memory` the final turn
    answered from (as decoded), the update turns' mean reply length, the answer (boxed text,
    stripped)."""
    facts = {f.text: f.needed for f in document.facts}
    said = sentences(memory)
    form = [s for s in said if tuple(s[:3]) in FACT_FORMS]
    return DocumentSelection(
        index, memory, [holds(memory, f) for f, needed in facts.items() if needed],
        [holds(memory, f) for f, needed in facts.items() if not needed], len(said), len(form),
        sum(" ".join([*s, "."]) in facts for s in form), update_tokens, answer, document.answer)


def sentences(memory: str) -> list[list[str]]:
    """The memory's sentences as words, full stops left out (a decoder may join one to the
    word before it); the last one even if no full stop ends it."""
    said: list[list[str]] = [[]]
    for word in memory.replace(".", " . ").split():
        if word == ".":
            said.append([])
        else:
            said[-1].append(word)
    return [s for s in said if s]


def summarize(selections: list[DocumentSelection]) -> list[str]:
    """The summary lines (module docstring)."""
    from memagent_jax.eval.compare import wilson_interval

    def rate(flags: list[bool]) -> str:
        k, n = sum(flags), len(flags)
        low, high = wilson_interval(k, n)
        return f"{k} of {n} ({100 * k / n:.1f} %, 95 % {100 * low:.1f}-{100 * high:.1f})"

    asked = [held for s in selections for held in s.asked]
    other = [held for s in selections for held in s.distractors]
    lines = [f"memories holding an asked fact: {rate(asked)}"]
    if other:
        lines.append(f"memories holding a distractor: {rate(other)}, "
                     f"{len(other) // len(selections)} a document")
        expected, p = exchangeable_test(selections)
        lines.append(f"asked facts held: {sum(asked)}, where a memory holding as many facts "
                     f"would hold {expected:.1f} of them by chance; exact p = {p:.2g}")
    said = sum(s.sentences for s in selections)
    form = sum(s.fact_form for s in selections)
    stated = sum(s.facts_stated for s in selections)
    lines.append(f"memory sentences of a fact's form: {form} of {said}"
                 + (f" ({100 * form / said:.1f} %)" if said else "")
                 + f", {stated} of them one of the document's facts as written")
    right = sum(s.correct for s in selections)
    tokens = sum(s.update_tokens for s in selections) / len(selections)
    lines.append(f"update replies {tokens:.1f} tokens on average; answers right {right} of "
                 f"{len(selections)}")
    return lines


def exchangeable_test(selections: list[DocumentSelection]) -> tuple[float, float]:
    """(the asked facts the memories would hold by chance, the exact two-sided p of the count
    they hold) under "each memory holds its document's asked facts as any of its facts"
    (module docstring): given h of a document's k facts held, a of them asked, the asked ones
    held are hypergeometric (k, h, a); the total's distribution is their convolution."""
    total = [1.0]  # P(the documents so far hold j asked facts)
    expected = 0.0
    for s in selections:
        a, k = len(s.asked), len(s.asked) + len(s.distractors)
        h = sum(s.asked) + sum(s.distractors)
        one = [math.comb(h, j) * math.comb(k - h, a - j) / math.comb(k, a)
               for j in range(a + 1)]
        expected += a * h / k
        total = [sum(total[i] * one[j - i] for i in range(len(total)) if 0 <= j - i <= a)
                 for j in range(len(total) + a)]
    held = sum(sum(s.asked) for s in selections)
    low, high = sum(total[:held + 1]), sum(total[held:])
    return expected, min(1.0, 2 * min(low, high))


def run_selection(model: str, task: str, length: int, seed: int, num_samples: int,
                  budgets: dict, slots: int, out: str | None = None
                  ) -> list[DocumentSelection]:
    """Reads the documents greedily, prints the summary (progress on stderr); writes a record a
    document as JSON lines to `out` when given (process 0 of a multi-process job)."""
    from memagent_jax.agents.memagent.agent import memories_of

    _, _, documents, _, trajectories = read_greedily(
        model, task, length, seed, num_samples, budgets, slots, out,
        ", greedy: the memory the answer is read from")
    selections = []
    for index, (trajectory, document) in enumerate(zip(trajectories, documents)):
        updates = [t.generated_tokens for t in trajectory.turns if t.kind == "update"]
        selections.append(document_selection(
            index, document, (memories_of(trajectory) or [""])[-1],
            sum(updates) / max(len(updates), 1), (trajectory.answer or "").strip()))
    for line in summarize(selections):
        print(line)
    write_records(out, [{**dataclasses.asdict(s), "correct": s.correct} for s in selections])
    return selections
