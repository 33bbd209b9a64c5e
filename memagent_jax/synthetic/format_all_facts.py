"""Format-only trajectories with no choice of facts in any row (`plugin.target:
format_all_facts`): a start for RL (configs/synthetic/rl_only_honest/) none of whose targets,
update or final, is built from the oracle's choice of what to keep.

- The update turns are the `format` target's (format_rows.py, `drawn_memories`): memories of
  whole sentences drawn at random, a fact kept exactly as often as a filler sentence.
- The final turn's memory holds every fact of the document, the asked ones and the distractors
  alike (`final_memory`): the last update's memory with its fact lines taken out, the facts
  each at a random place among the drawn lines left, which give way at random until the memory
  fits max_memory_tokens. Its reply restates the facts the answer needs and boxes the answer,
  as the `format` target's does: reading the answer out of the memory by the question's key is
  the final turn's own work.
- All or none: where the facts cannot all be shown (a chunk that states one was not read, cut
  by max_chunks, or together they do not fit the memory), the trajectory has no final turn.
  Showing a random part of them would need a target for the rows whose memory lacks the asked
  fact: without their final turns, those left always hold the asked fact and a distractor only
  sometimes (the `format` target's bias again); with them, a boxed guess teaches making one
  up. Whether a row answers depends on its document's facts alone, never on which is asked.

Two settings make the rebuilt RL-only start (configs/synthetic/rl_only_rebuilt/):
- `plugin.keep_share`: that share of update turns, drawn at random whatever the chunk holds,
  reply the keep gate's single word and the memory goes on unchanged, so the gate is a reply
  the start already gives and RL can choose where;
- `plugin.final_reply: box`: the final reply is the boxed answer alone, restating no fact, so
  no row writes the asked key's fact sentence more than any other; `restate_all`, the
  declared fallback where a bare box is not learned: every fact of the final memory, in its
  order, then the box, so every fact is written alike.

No memory of any row states a fact twice: a drawn line that states one (the decoder's spacing
"v.", the task's "v .") is compared without spaces and gives way. The draw is a function of
the example's source and row alone.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from memagent_jax.agents.memagent.agent import MemAgent
from memagent_jax.agents.memagent.templates import GATE_WORDS
from memagent_jax.data.pipeline import Example
from memagent_jax.rollout.agent_api import Trajectory
from memagent_jax.synthetic.format_rows import drawn_memories, unspaced, with_facts
from memagent_jax.synthetic.oracle import facts_of, loop_trajectory, memory_ids

KEEP = GATE_WORDS[0]  # the keep gate's one-word reply


def format_all_facts_trajectory(agent: MemAgent, example: Example, keep_share: float = 0.0,
                                final_reply: str = "restate") -> Trajectory:
    """The trajectory of `example` (module docstring), in `agent`'s tokens, chunks and prompts:
    one update turn a chunk, then the final turn where the memory can show every fact (else
    none, and `answer` None). keep_share: the chance that an update turn, drawn whatever its
    chunk holds, replies the keep gate's word and carries the memory unchanged
    (`drawn_memories`); final_reply: "restate" (the needed facts, then the boxed answer),
    "box" (the boxed answer alone, no fact restated) or "restate_all" (every fact of the
    memory in its order, asked or not, then the boxed answer). Raises UserError when the row
    records no facts."""
    facts = facts_of(example)
    drawn = drawn_memories(agent, example, keep_share)
    keep = agent.tokenizer(KEEP, add_special_tokens=False)["input_ids"]
    replies = [keep if i in drawn.kept else memory_ids(agent, "\n".join(lines))
               for i, lines in enumerate(drawn.memories)]
    memory = final_memory(drawn.texts, drawn.memories[-1], [f["text"] for f in facts],
                          drawn.budget, drawn.size, drawn.rng)
    if memory is None:
        trajectory = loop_trajectory(agent, example, drawn.sample, replies, kept=drawn.kept)
        trajectory.answer = None
        return trajectory
    texts = [f["text"] for f in facts]
    restated = {"restate": [f["text"] for f in facts if f["needed"]], "box": [],
                "restate_all": [line for line in memory if line in texts]}[final_reply]
    answer = " ".join([*restated, f"\\boxed{{{example.ground_truths[0]}}}"])
    replies.append(agent.tokenizer(answer, add_special_tokens=False)["input_ids"])
    return loop_trajectory(agent, example, drawn.sample, replies,
                           final_memory=memory_ids(agent, "\n".join(memory)), kept=drawn.kept)


def final_memory(texts: list[str], drawn: list[str], facts: list[str], budget: int,
                 size: Callable[[list[str]], int], rng: np.random.Generator
                 ) -> list[str] | None:
    """The final turn's memory, one line each: every one of `facts` (the document's, in the
    task's text) at a random place among the lines of `drawn` (the last update's memory) that
    state none, those dropped at random until the memory fits `budget` tokens (`size(lines)`
    measures them). None when a fact is not stated by `texts` (the chunks read, as decoded;
    compared without spaces, as `tasks.oracle_memories` finds facts) or the facts alone take
    more than `budget`."""
    read = unspaced("".join(texts))
    if any(unspaced(fact) not in read for fact in facts) or size(facts) > budget:
        return None
    return with_facts(drawn, facts, budget, size, rng)
