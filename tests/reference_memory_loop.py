"""TEST-ONLY REFERENCE: the memory loop as this port ran it before MemAgent became an agent on
the agent interface (`MemoryAgent.run` at commit a43aa52): each turn a request on the
scheduler, the next turn submitted from the last one's completion callback. MemAgent through
the interface must give these turns byte for byte (tests/rollout/test_agents.py) and take no
more time (benchmarks/agent_overhead.py)."""

from __future__ import annotations

import dataclasses
import zlib

from memagent_jax.agents.memagent.agent import MemAgent, memory_turns
from memagent_jax.agents.memagent.reading import Sample
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.engine.scheduler import Completion, Request, Scheduler
from memagent_jax.rollout.agent_api import Trajectory, Turn
from memagent_jax.rollout.answers import final_answer


def reference_run(agent: MemAgent, scheduler: Scheduler, params, samples: list[Sample],
                  sampling: SamplingParams, n: int = 1) -> list[list[Trajectory]]:
    """n trajectories of every sample, as a43aa52's `MemoryAgent.run` made them."""
    results = [[Trajectory(s.problem) for _ in range(n)] for s in samples]
    for i, sample in enumerate(samples):
        runs = [_Run(agent, scheduler, i, j, sample, results[i][j], sampling.seed)
                for j in range(n)]
        for run in runs:
            run.advance(None)
        first = runs[0].request(sampling, n)

        def fan_out(completions, runs=runs):
            for run, completion in zip(runs, completions):
                run.finish_turn(completion, sampling)

        scheduler.submit(first, fan_out)
    scheduler.run(params)
    return results


class _Run:
    def __init__(self, agent, scheduler, sample_index, index, sample, trajectory, seed):
        self.agent, self.scheduler, self.sample, self.index = agent, scheduler, sample_index, index
        self.problem_ids = sample.problem_ids
        self.turns = memory_turns(sample.chunks, agent.prompts.initial_memory
                                  if sample.initial_memory is None else sample.initial_memory)
        self.trajectory, self.seed = trajectory, seed
        self.kind, self.prompt_ids = "", []

    def advance(self, memory) -> bool:
        try:
            self.kind, memory, chunk = self.turns.send(memory)
        except StopIteration:
            return False
        prompts = self.agent.prompts
        self.prompt_ids = (prompts.update(self.problem_ids, memory, chunk)
                           if self.kind == "update" else prompts.final(self.problem_ids, memory))
        return True

    def request(self, sampling: SamplingParams, n: int = 1) -> Request:
        config = self.agent.config
        cap = config.max_memory_tokens if self.kind == "update" else config.max_final_tokens
        turn = len(self.trajectory.turns)
        key = f"{self.seed}/{self.sample}/{self.index if turn else 0}/{turn}"
        seed = zlib.crc32(key.encode()) & 0x7FFFFFFF
        return Request(tuple(self.prompt_ids), cap, dataclasses.replace(sampling, seed=seed),
                       self.agent.stop_ids, n)

    def finish_turn(self, completion: Completion, sampling: SamplingParams) -> None:
        agent = self.agent
        said = [t for t in completion.token_ids if t not in agent.not_memory]
        reply = agent.tokenizer.decode(said, skip_special_tokens=True)
        memory, text = None, None
        if self.kind == "update":
            memory = agent.memory_ids(said)
            text = reply if memory == said else agent.tokenizer.decode(
                memory, skip_special_tokens=True)
        self.trajectory.turns.append(Turn(self.kind, self.prompt_ids, completion.token_ids,
                                          completion.logprobs, completion.finish_reason, reply,
                                          {"memory": text}))
        if self.advance(memory):
            self.scheduler.submit(self.request(sampling),
                                  lambda c: self.finish_turn(c[0], sampling))
        else:
            self.trajectory.answer = final_answer(reply)
