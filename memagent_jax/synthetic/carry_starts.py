"""Carry starts: DAPO rollouts that begin inside a long document, at the carries the policy
finds hardest.

A carry start is a prompt whose rollout begins with the oracle's memory of a synthetic document
(after its last chunk: every fact the question needs) and then reads `chunks` filler chunks,
the hardest of chunks x pool drawn for it: those at which the memory's least likely token,
teacher-forced, is least likely under the current parameters (`rows.weakest_reply_token`). Its
reward is its final answer's, as for any rollout; the rollout samples like the others
(`rl.collect.collect_batch`, through the plugin's `starts`).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from memagent_jax.data.pipeline import Example
from memagent_jax.rl.rows import TrainingRows
from memagent_jax.rollout.memagent import MemoryAgent, Sample
from memagent_jax.synthetic.oracle import document_state, end_token, memory_ids, update_turn
from memagent_jax.synthetic.rows import weakest_reply_token
from memagent_jax.synthetic.tasks import filler_text


def carry_starts(agent: MemoryAgent, count: int, chunks: int, pool: int, seed: int,
                 logprobs: Callable[[TrainingRows], np.ndarray]
                 ) -> tuple[list[Example], list[Sample]]:
    """`count` carry starts drawn by `seed` (module docstring): their examples (question,
    answer, no context; index -1 - i, as they come from no data source) and their samples
    (the question's ids, `chunks` chunks of filler in the order drawn, and the oracle's
    memory as the initial memory). logprobs: rows -> [R, T] reply-token log-probabilities
    (the learner's, under the current parameters)."""
    rng = np.random.default_rng(seed)
    tokenizer, end, size = agent.tokenizer, end_token(agent), agent.config.chunk_tokens
    examples, samples = [], []
    for index in range(count):
        state = document_state(agent, rng, seed, index)
        memory = memory_ids(agent, state.memories[-1])
        candidates = [tokenizer(filler_text(size, seed, index * chunks * pool + k),
                                add_special_tokens=False)["input_ids"]
                      for k in range(chunks * pool)]
        weakest = weakest_reply_token(
            [update_turn(agent, state.question, state.problem, memory, chunk, [*memory, end])
             for chunk in candidates], logprobs)
        hardest = sorted(np.argsort(weakest, kind="stable")[:chunks])
        examples.append(Example(-1 - index, f"synthetic_{state.task}", state.question, "",
                                (state.answer,)))
        samples.append(Sample(state.question, state.problem,
                              tuple(tuple(candidates[k]) for k in hardest), chunks * size,
                              initial_memory=tuple(memory)))
    return examples, samples
