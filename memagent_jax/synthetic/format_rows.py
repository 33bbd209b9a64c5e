"""Format-only trajectories: the memory loop's shape, with no choice of what to keep.

`plugin.target: format` trains a supervised step on these in place of the oracle's
(oracle.py): a start for RL (configs/synthetic/rl_only/) that knows what an update turn and a
final answer look like but was never shown which words a memory keeps.

- Each update reply is a memory of whole sentences drawn at random from the previous memory's
  lines and the chunk's sentences, kept in reading order, one a line, until the next drawn one
  would not fit in max_memory_tokens. A fact is kept exactly as often as a filler sentence.
- The final turn answers from a memory that holds the answer: the last update's memory with the
  facts the answer needs (the oracle's last memory) in place of as many drawn lines as they
  take, at random places; the reply restates those facts and boxes the answer, as the
  oracle's final reply does. Its prompt is therefore not the last update's reply: each turn
  is a row of its own to the learner. This final memory is the oracle's choice of facts: it
  always holds the asked fact and a distractor only as often as it was drawn. The
  `format_all_facts` target (format_all_facts.py) keeps these update turns and builds its
  final turn from memories that hold every fact alike.

The draw is a function of the example's source and row alone (`drawn_memories`).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from memagent_jax.agents.memagent.agent import MemAgent
from memagent_jax.agents.memagent.reading import Sample
from memagent_jax.data.pipeline import Example
from memagent_jax.rollout.agent_api import Trajectory
from memagent_jax.synthetic.oracle import facts_of, loop_trajectory, memory_ids
from memagent_jax.synthetic.tasks import oracle_memories


def format_trajectory(agent: MemAgent, example: Example) -> Trajectory:
    """The format-only trajectory of `example` (module docstring), in `agent`'s tokens, chunks
    and prompts. Raises UserError when the row records no facts."""
    facts = facts_of(example)
    sample, texts, memories, rng, budget, size, _ = drawn_memories(agent, example)
    needed = [f for f in oracle_memories(texts, facts)[-1].splitlines() if f]
    kept = with_facts(memories[-1], needed, budget, size, rng)
    answer = " ".join([*needed, f"\\boxed{{{example.ground_truths[0]}}}"])
    replies = [memory_ids(agent, "\n".join(lines)) for lines in memories]
    replies.append(agent.tokenizer(answer, add_special_tokens=False)["input_ids"])
    return loop_trajectory(agent, example, sample, replies,
                           final_memory=memory_ids(agent, "\n".join(kept)))


class DrawnMemories(NamedTuple):
    """A row's update-turn memories (`drawn_memories`): the sample as the agent reads it, its
    chunks as decoded text, the memory after each chunk (lines), the row's generator as the
    draw left it, the reply budget and line measure the draw used, and the update turns that
    reply `keep` (indexes; their memory is the one before them)."""
    sample: Sample
    texts: list[str]
    memories: list[list[str]]
    rng: np.random.Generator
    budget: int
    size: Callable[[list[str]], int]
    kept: frozenset[int] = frozenset()


def drawn_memories(agent: MemAgent, example: Example, keep_share: float = 0.0
                   ) -> DrawnMemories:
    """The update-turn memories of `example`'s format-only trajectory (module docstring): each
    drawn from the previous one's lines and the chunk's whole sentences by a generator seeded
    by the row's source and index alone. keep_share: the chance that an update turn, whatever
    its chunk holds, keeps the memory as it was instead (drawn by a generator of its own, so
    the other turns' draws are those of keep_share 0)."""
    tokenizer = agent.tokenizer
    source = zlib.crc32(example.data_source.encode())
    rng = np.random.default_rng((source, example.index))
    keeps = np.random.default_rng((source, example.index, 1)) if keep_share else None
    sample = agent.read(example.question, example.context, strict=False)
    texts = [tokenizer.decode(chunk) for chunk in sample.chunks]
    budget = agent.config.max_memory_tokens - 1  # the end token is part of the reply
    size = lambda lines: len(tokenizer("\n".join(lines), add_special_tokens=False)["input_ids"])
    memories: list[list[str]] = []
    lines: list[str] = []
    kept: set[int] = set()
    for i, text in enumerate(texts):
        if keeps is not None and keeps.random() < keep_share:
            kept.add(i)
        else:
            opens = i == 0 or texts[i - 1].rstrip().endswith(".")
            lines = drawn_memory(lines + whole_sentences(text, opens), budget, size, rng)
        memories.append(lines)
    return DrawnMemories(sample, texts, memories, rng, budget, size, frozenset(kept))


def with_facts(lines: list[str], facts: list[str], budget: int,
               size: Callable[[list[str]], int], rng: np.random.Generator) -> list[str]:
    """`lines` less those that state one of `facts` (compared without spaces, as
    `tasks.oracle_memories` compares them: a decoder's "v." is the task's "v .", and no fact
    is shown twice), dropped at random until they and the facts fit `budget` tokens
    (`size(lines)`), then each fact at a random place: a uniformly random order of them all."""
    stated = {unspaced(fact) for fact in facts}
    memory = [line for line in lines if unspaced(line) not in stated]
    while memory and size(memory + facts) > budget:
        memory.pop(int(rng.integers(len(memory))))
    for fact in facts:
        memory.insert(int(rng.integers(len(memory) + 1)), fact)
    return memory


def unspaced(text: str) -> str:
    return "".join(text.split())


def whole_sentences(text: str, opens: bool) -> list[str]:
    """The sentences a chunk's text holds whole, words single-spaced: those ending in a full
    stop, the first only if the chunk `opens` with it (the last piece of a chunk cut
    mid-sentence ends in no full stop). A decoder may join the stop to the word before it."""
    words = text.split()
    ends = [i for i, word in enumerate(words) if word.endswith(".")]
    return [" ".join(words[a + 1:b + 1]) for a, b in zip([-1] + ends, ends) if a >= 0 or opens]


def drawn_memory(candidates: list[str], budget: int, size, rng) -> list[str]:
    """Lines of `candidates` drawn in random order until the next would take the memory past
    `budget` tokens (`size(lines)`), kept in the candidates' order."""
    chosen: list[int] = []
    for i in rng.permutation(len(candidates)):
        if size([candidates[j] for j in sorted(chosen + [int(i)])]) > budget:
            break
        chosen.append(int(i))
    return [candidates[j] for j in sorted(chosen)]

