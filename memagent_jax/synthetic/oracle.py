"""Oracle trajectories: the memory loop on a synthetic document as an ideal reader runs it.

For a training row that records its facts (`memagent-jax data synthetic --layout train`), the
oracle trajectory has the agent's own turns (the same chunks, the same prompts in token ids,
each prompt built from the previous oracle reply as the agent builds it from its own) with the
replies an ideal memory gives: after each chunk, the facts read so far that bear on the question
(`tasks.oracle_memories`; the initial memory's words while there are none), and in the final
turn those facts again and `\\boxed{answer}`; each reply ends with the token that stops the
engine. A supervised step (`learner.loss: sft`) trains on them through the plugin (plugin.py).

`document_state` and `update_turn` build the single update turns the warm-up rows (rows.py)
and carry starts (carry_starts.py) are made of.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from memagent_jax.agents.memagent.agent import MemAgent, memory_turns
from memagent_jax.data.pipeline import Example
from memagent_jax.errors import UserError
from memagent_jax.rollout.agent_api import Trajectory, Turn
from memagent_jax.synthetic.tasks import TASKS, make_sample, oracle_memories


def oracle_trajectory(agent: MemAgent, example: Example) -> Trajectory:
    """The oracle trajectory of `example` (module docstring), in `agent`'s tokens, chunks and
    prompts. Raises UserError when the row records no facts."""
    facts = facts_of(example)
    tokenizer = agent.tokenizer
    sample = agent.read(example.question, example.context, strict=False)
    texts = [tokenizer.decode(chunk) for chunk in sample.chunks]
    facts_read = oracle_memories(texts, facts)
    memories = [memory_ids(agent, m) for m in facts_read]
    # The final reply restates the facts it answers from before the boxed answer: the answer is
    # then a copy of a word a few tokens back, not of one found in the prompt with nothing
    # pointing at it. The verifier reads only the box.
    answer = " ".join([facts_read[-1].replace("\n", " "),
                       f"\\boxed{{{example.ground_truths[0]}}}"]).strip()
    replies = memories + [tokenizer(answer, add_special_tokens=False)["input_ids"]]
    return loop_trajectory(agent, example, sample, replies)


def loop_trajectory(agent: MemAgent, example: Example, sample, replies: list[list[int]],
                    final_memory: list[int] | None = None,
                    kept: frozenset[int] = frozenset()) -> Trajectory:
    """`agent`'s own loop over `sample` with the given replies (ids; one per chunk, then the
    final answer), each ending with `end_token`: each update prompt built from the previous
    reply, the final prompt from `final_memory` (None: the last update's reply). The update
    turns in `kept` reply the keep gate's word: the memory after them is the one before, as
    the agent carries it (`MemAgent.rollout`)."""
    tokenizer, prompts, end = agent.tokenizer, agent.prompts, end_token(agent)
    trajectory = Trajectory(example.question)
    workflow = memory_turns(sample.chunks, prompts.initial_memory)
    memory = None
    for i, reply in enumerate(replies):
        kind, previous, chunk = workflow.send(memory)
        prompt = (prompts.update(sample.problem_ids, previous, chunk) if kind == "update"
                  else prompts.final(sample.problem_ids,
                                     previous if final_memory is None else final_memory))
        text = tokenizer.decode(reply)
        memory = previous if i in kept else reply
        held = tokenizer.decode(memory) if i in kept else text
        trajectory.turns.append(Turn(kind, prompt, [*reply, end], [0.0] * (len(reply) + 1),
                                     "stop", text,
                                     {"memory": held if kind == "update" else None}))
    trajectory.answer = example.ground_truths[0]
    return trajectory


def facts_of(example: Example) -> list[dict]:
    """The facts a training row records (`tasks.train_row`); UserError when it has none."""
    facts = (example.extra_info or {}).get("facts")
    if not facts:
        raise UserError(f"training row {example.index} ({example.data_source}) has no "
                        "extra_info.facts: the synthetic warm-up trains on rows from "
                        "`memagent-jax data synthetic --layout train`")
    return facts


class DocumentState(NamedTuple):
    """A synthetic document as the agent reads it: its task, question and answer, the
    question's ids, its chunks' ids, and the oracle's memory after each chunk (text)."""
    task: str
    question: str
    answer: str
    problem: tuple[int, ...]
    chunks: tuple[tuple[int, ...], ...]
    memories: list[str]


def document_state(agent: MemAgent, rng, seed: int, index: int,
                   tasks: tuple[str, ...] = TASKS) -> DocumentState:
    """Document `index` of a task drawn by `rng` from `tasks` (1,024 tokens: four chunks of
    256; seed -1 - `seed`). The seed is negated so that no data set of a step's seed (1, 2,
    ...), the evaluation's among them, holds these documents."""
    task = tasks[int(rng.integers(len(tasks)))]
    document = make_sample(task, 1024, -1 - seed, index)
    sample = agent.read(document.question, document.context, strict=False)
    memories = oracle_memories([agent.tokenizer.decode(chunk) for chunk in sample.chunks],
                               [dataclasses.asdict(fact) for fact in document.facts])
    return DocumentState(task, document.question, document.answer, sample.problem_ids,
                         sample.chunks, memories)


def first_facts(agent: MemAgent, rng, seed: int):
    """Yields (index, DocumentState, at, fact, before) for documents 0, 1, ... drawn by `rng`
    and `seed` (`document_state`; a caller may draw from `rng` between documents): the chunk
    `at` where the oracle's memory first takes a fact, that fact, and the oracle's memory
    before that chunk (text, "" for the initial one); documents whose first fact is cut by the
    chunk boundary (the chunk alone does not say it) are skipped."""
    index = 0
    while True:
        state = document_state(agent, rng, seed, index)
        before = [""] + state.memories
        at, fact = next((i, f) for i, m in enumerate(state.memories) for f in m.splitlines()
                        if f not in before[i].splitlines())
        if "".join(fact.split()) in "".join(agent.tokenizer.decode(state.chunks[at]).split()):
            yield index, state, at, fact, before[at]
        index += 1


def memory_ids(agent: MemAgent, memory: str) -> list[int]:
    """A memory's ids: its text's, or the initial memory's when it is empty."""
    return (agent.tokenizer(memory, add_special_tokens=False)["input_ids"] if memory
            else list(agent.prompts.initial_memory))


def update_turn(agent: MemAgent, question: str, problem, memory: list[int], chunk,
                reply: list[int]) -> Trajectory:
    """A trajectory of one update turn of `agent`: `reply` to (problem, memory, chunk)."""
    text = agent.tokenizer.decode(reply[:-1])
    return Trajectory(question, [Turn(
        "update", agent.prompts.update(problem, memory, chunk), reply, [0.0] * len(reply),
        "stop", text, {"memory": text})])


def end_token(agent: MemAgent) -> int:
    """The token an oracle reply ends with: end-of-text where it stops the engine."""
    tokenizer = agent.tokenizer
    return (tokenizer.eos_token_id if tokenizer.eos_token_id in agent.stop_ids
            else agent.stop_ids[0])
