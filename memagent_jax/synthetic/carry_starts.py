"""Carry starts: DAPO rollouts that begin inside a long document, at the carries the policy
finds hardest.

A carry start is a prompt whose rollout begins inside a synthetic document with the facts its
question needs in the memory, and then reads `chunks` chunks: the hardest of chunks x pool
drawn for it, those at which the memory kept unchanged, teacher-forced, has its least likely
token least likely under the current parameters (`rows.weakest_reply_token`). Its reward is
its final answer's, as for any rollout; the rollout samples like the others
(`rl.collect.collect_batch`, through the plugin's `starts`). Where the memory comes from
(`plugin.carry_from`):

- `carry_starts` (`oracle`): the oracle's memory after the document's last chunk, every fact
  the question needs and nothing else; the candidates are filler.
- `policy_carry_starts` (`policy`): the policy's own. The current parameters
  (`StepContext.rollouts`), sampled as the step's rollouts are, read the document up to the chunk
  after which the oracle first holds every needed fact, and the memory they write there is the
  start's, as the policy carries it (the fact copied to the budget, padding, a distractor).
  A start whose memory does not hold every needed fact is dropped: its rollouts could not keep
  what they never had, and with all n rewards 0 dynamic sampling would drop the group after
  paying for it. Twice `count` documents are read at once so that a policy holding its facts
  half the time still fills `count`; where fewer hold, fewer starts come back and the step
  draws rows in their place. Half the candidates are filler, half filler with a distractor of a
  needed fact (`tasks.distractor_text`: its form, another subject and value), so the hardness
  picks between the long document's common carry and its rare hard one.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from memagent_jax.agents.memagent.agent import MemAgent
from memagent_jax.agents.memagent.reading import Sample
from memagent_jax.data.pipeline import Example
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.rl.rows import TrainingRows
from memagent_jax.rollout.agent_api import Trajectory
from memagent_jax.rollout.rollouts import OnCall, Rollouts
from memagent_jax.synthetic.oracle import (
    DocumentState,
    document_state,
    end_token,
    memory_ids,
    update_turn,
)
from memagent_jax.synthetic.rows import weakest_reply_token
from memagent_jax.synthetic.tasks import TASKS, distractor_text, filler_text
from memagent_jax.synthetic.trace import holds

Logprobs = Callable[[TrainingRows], np.ndarray]


def carry_starts(agent: MemAgent, count: int, chunks: int, pool: int, seed: int,
                 logprobs: Logprobs, tasks: tuple[str, ...] = TASKS
                 ) -> tuple[list[Example], list[Sample]]:
    """`count` carry starts from the oracle's memory, drawn by `seed` from documents of `tasks`
    (module docstring): their examples (question, answer, no context; index -1 - i, as they
    come from no data source) and their samples (the question's ids, `chunks` chunks of filler
    in the order drawn, and the oracle's memory as the initial memory). logprobs: rows -> [R, T]
    reply-token log-probabilities (the learner's, under the current parameters)."""
    rng = np.random.default_rng(seed)
    size = agent.config.chunk_tokens
    starts = []
    for index in range(count):
        state = document_state(agent, rng, seed, index, tasks)
        candidates = [filler_text(size, seed, index * chunks * pool + k)
                      for k in range(chunks * pool)]
        starts.append(_start(agent, state, index, memory_ids(agent, state.memories[-1]),
                             candidates, chunks, logprobs))
    return [e for e, _ in starts], [s for _, s in starts]


def policy_carry_starts(agent: MemAgent, count: int, chunks: int, pool: int, seed: int,
                        logprobs: Logprobs, rollouts: Rollouts, sampling: SamplingParams,
                        tasks: tuple[str, ...] = TASKS, on_call: OnCall | None = None
                        ) -> tuple[list[Example], list[Sample]]:
    """At most `count` carry starts from the policy's own memory (module docstring), as
    `carry_starts` returns them, from the first of 2 x `count` documents drawn by `seed` whose
    policy memory holds every needed fact, each with `chunks` chunks of filler or filler with
    a distractor. rollouts: where the agent reads them under the current parameters, one
    trajectory a document (`StepContext.rollouts`, with its on_call); sampling: the reads' (its
    seed set: the same parameters and seed give the same starts)."""
    rng = np.random.default_rng(seed)
    size, decode = agent.config.chunk_tokens, agent.tokenizer.decode
    states = [document_state(agent, rng, seed, index, tasks) for index in range(2 * count)]
    trajectories = [group[0] for group in rollouts.run(
        agent, [_read_to_facts(state) for state in states], sampling, on_call=on_call)]
    starts: list[tuple[Example, Sample]] = []
    for index, (state, trajectory) in enumerate(zip(states, trajectories)):
        needed = state.memories[-1].splitlines()
        memory = memory_after(agent, trajectory)
        if len(starts) == count or not all(holds(decode(memory), f) for f in needed):
            continue
        candidates = [filler_text(size, seed, index * chunks * pool + k) if k % 2 == 0 else
                      distractor_text(size, needed[k // 2 % len(needed)], seed,
                                      index * chunks * pool + k)
                      for k in range(chunks * pool)]
        starts.append(_start(agent, state, index, memory, candidates, chunks, logprobs))
    return [e for e, _ in starts], [s for _, s in starts]


def memory_after(agent: MemAgent, trajectory: Trajectory) -> list[int]:
    """The memory `agent` carries after the last update turn of `trajectory`, in ids: the last
    update reply that is no gate ("keep", "exit": the memory before it goes on), as the agent
    makes a memory of it; the initial memory's where there is none."""
    for turn in reversed([t for t in trajectory.turns if t.kind == "update"]):
        if agent.gate(turn.reply) is None:
            return agent.memory_ids([t for t in turn.response_ids if t not in agent.not_memory])
    return list(agent.prompts.initial_memory)


def _read_to_facts(state: DocumentState) -> Sample:
    """The document's chunks up to the first after which the oracle's memory is its last one
    (every needed fact read; twohop: the other cities' codes dropped)."""
    chunks = state.chunks[:state.memories.index(state.memories[-1]) + 1]
    return Sample(state.question, state.problem, chunks, sum(len(c) for c in chunks))


def _start(agent: MemAgent, state: DocumentState, index: int, memory: list[int],
           candidates: list[str], chunks: int, logprobs: Logprobs) -> tuple[Example, Sample]:
    """The carry start of document `index` from `memory` (ids): the `chunks` of `candidates`
    (texts of chunk_tokens tokens) whose weakest token of the memory kept unchanged,
    teacher-forced, is least likely under `logprobs`, in the order drawn."""
    tokenizer, end = agent.tokenizer, end_token(agent)
    ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in candidates]
    weakest = weakest_reply_token(
        [update_turn(agent, state.question, state.problem, memory, chunk, [*memory, end])
         for chunk in ids], logprobs)
    hardest = sorted(np.argsort(weakest, kind="stable")[:chunks])
    return (Example(-1 - index, f"synthetic_{state.task}", state.question, "", (state.answer,)),
            Sample(state.question, state.problem, tuple(tuple(ids[k]) for k in hardest),
                   chunks * agent.config.chunk_tokens, initial_memory=tuple(memory)))
