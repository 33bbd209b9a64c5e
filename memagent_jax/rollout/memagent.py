"""The MemAgent workflow: read a document chunk by chunk, rewrite a memory, answer from it.

(docs/algorithm.md section 1.) `memory_turns` is the workflow itself, written once as a
generator: it yields each turn's user message and receives the reply text. Two drivers run it:
- `MemoryAgent`, on the local engine: many samples at once, each a chain of requests on the
  scheduler (turn k's reply builds turn k+1's prompt), so samples with different numbers of
  chunks share the slots without waiting for each other; it records every turn's token ids and
  logprobs (one RL training row per turn);
- `run_on_server` (server.py), one sample against an OpenAI-compatible endpoint.
Both take a `Sample`: the question and its document cut into chunk texts (`read_sample`).

Every turn is an independent conversation (one user message, one reply), not a continuation of
the previous turn's: the memory text is the only thing carried from one turn to the next.
"""

from __future__ import annotations

import dataclasses
import secrets
import zlib
from typing import Callable, ClassVar, Generator

from memagent_jax.errors import UserError
from memagent_jax.rollout.answers import final_answer
from memagent_jax.rollout.sampling import SamplingParams
from memagent_jax.rollout.scheduler import Completion, Request, Scheduler
from memagent_jax.rollout.templates import (INITIAL_MEMORY, chat_prompt_ids, final_prompt,
                                            update_prompt)
from memagent_jax.runconfig import at_least


@dataclasses.dataclass(frozen=True)
class MemAgentConfig:
    """The `memagent` section of the train and eval configs (and `run`'s flags): the token
    budgets of docs/algorithm.md section 1. max_chunks: keep at most this many chunks of a
    document, the first and last halves (training; None: all)."""
    SECTION: ClassVar[str] = "memagent"
    chunk_tokens: int = 5000
    max_memory_tokens: int = 1024
    max_final_tokens: int = 1024
    max_problem_tokens: int = 1024
    max_chunks: int | None = None

    def __post_init__(self):
        at_least(self, 1, "chunk_tokens", "max_memory_tokens", "max_final_tokens",
                 "max_problem_tokens", "max_chunks")


@dataclasses.dataclass(frozen=True)
class Sample:
    """A question and its document as the workflow reads it: chunk texts, and the document's
    length in the policy's tokens (before any max_chunks cut)."""
    problem: str
    chunks: tuple[str, ...]
    document_tokens: int


@dataclasses.dataclass
class Turn:
    """One turn of a trajectory: a conversation of its own, its prompt and its response (kind
    "update" or "final")."""
    kind: str
    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float]
    finish_reason: str
    reply: str  # the response as text: the new memory after an update turn


@dataclasses.dataclass
class Trajectory:
    problem: str
    turns: list[Turn] = dataclasses.field(default_factory=list)
    answer: str | None = None

    @property
    def memories(self) -> list[str]:
        return [t.reply for t in self.turns if t.kind == "update"]

    @property
    def final_reply(self) -> str:
        return self.turns[-1].reply if self.turns else ""


def chunk_ids(ids: list[int], chunk_tokens: int, max_chunks: int | None = None) -> list[list[int]]:
    """chunk i = ids[i*C:(i+1)*C]; beyond max_chunks keep the first and last halves."""
    chunks = [ids[i:i + chunk_tokens] for i in range(0, len(ids), chunk_tokens)]
    if max_chunks and len(chunks) > max_chunks:
        head = (max_chunks + 1) // 2
        chunks = chunks[:head] + chunks[len(chunks) - (max_chunks - head):]
    return chunks


def memory_turns(problem: str, chunk_texts) -> Generator[tuple[str, str], str, None]:
    """Yields (kind, user message) per turn and receives each reply: the workflow."""
    memory = INITIAL_MEMORY
    for chunk in chunk_texts:
        memory = yield "update", update_prompt(problem, memory, chunk)
    yield "final", final_prompt(problem, memory)


def read_sample(tokenizer, problem: str, document: str, config: MemAgentConfig) -> Sample:
    """Checks the question against its budget and cuts the document into chunk texts by the
    policy's tokens. Raises UserError for an empty document or an over-long question."""
    if not document.strip():
        raise UserError("the document is empty")
    problem_tokens = len(tokenizer(problem, add_special_tokens=False)["input_ids"])
    if problem_tokens > config.max_problem_tokens:
        raise UserError(f"the question has {problem_tokens} tokens, over the prompt budget of "
                        f"{config.max_problem_tokens}")
    ids = tokenizer(document, add_special_tokens=False)["input_ids"]
    chunks = chunk_ids(ids, config.chunk_tokens, config.max_chunks)
    return Sample(problem, tuple(tokenizer.decode(c) for c in chunks), len(ids))


def required_length(tokenizer, config: MemAgentConfig) -> int:
    """KV entries a turn can need: the update template around the longest question, a full
    memory and a full chunk, plus the longest reply (64 spare for re-tokenised memory)."""
    overhead = len(chat_prompt_ids(tokenizer, update_prompt("", "", "")))
    reply = max(config.max_memory_tokens, config.max_final_tokens)
    return (overhead + config.max_problem_tokens + config.max_memory_tokens + config.chunk_tokens
            + reply + 64)


class MemoryAgent:
    """Runs the workflow for many samples on a scheduler; see the module docstring. Built by
    `rollout.agent.build_agent`, which sizes the engine for `config`."""

    def __init__(self, scheduler: Scheduler, tokenizer, config: MemAgentConfig,
                 stop_ids: tuple[int, ...]):
        needed = required_length(tokenizer, config)
        if needed > scheduler.engine.config.max_len:
            raise UserError(
                f"chunk size {config.chunk_tokens} + memory cap {config.max_memory_tokens} + "
                f"question budget {config.max_problem_tokens} + template need {needed} tokens "
                f"per turn; the engine holds {scheduler.engine.config.max_len}")
        self.scheduler, self.tokenizer, self.config = scheduler, tokenizer, config
        self.stop_ids = stop_ids

    def with_config(self, config: MemAgentConfig) -> MemoryAgent:
        """The same scheduler and tokenizer with other budgets (e.g. no max_chunks)."""
        return MemoryAgent(self.scheduler, self.tokenizer, config, self.stop_ids)

    def read(self, problem: str, document: str) -> Sample:
        """`read_sample` with this agent's tokenizer and budgets."""
        return read_sample(self.tokenizer, problem, document, self.config)

    def run(self, params, samples: list[Sample], sampling: SamplingParams, n: int = 1,
            on_turn: Callable[[int, Turn], None] | None = None) -> list[list[Trajectory]]:
        """Runs every sample with `params`; returns n trajectories per sample (their identical
        first turn is prefilled once). Each turn is sampled with a seed derived from
        `sampling.seed` (None: a fresh one), the sample, the trajectory and the turn, so the
        result does not depend on how samples share the slots. on_turn(sample index, turn)
        after every turn."""
        base = secrets.randbits(31) if sampling.seed is None else sampling.seed
        results = [[Trajectory(s.problem) for _ in range(n)] for s in samples]
        for i, sample in enumerate(samples):
            runs = [_Run(self, i, j, memory_turns(sample.problem, sample.chunks), results[i][j],
                         base, on_turn) for j in range(n)]
            for run in runs:
                run.advance(None)
            first = runs[0].request(sampling, n)

            def fan_out(completions, runs=runs):
                for run, completion in zip(runs, completions):
                    run.finish_turn(completion, sampling)

            self.scheduler.submit(first, fan_out)
        self.scheduler.run(params)
        return results


class _Run:
    """One trajectory in flight: its workflow generator and the turn it waits on."""

    def __init__(self, agent: MemoryAgent, sample: int, index: int, turns, trajectory, seed,
                 on_turn):
        self.agent, self.sample, self.index, self.turns = agent, sample, index, turns
        self.trajectory, self.seed, self.on_turn = trajectory, seed, on_turn
        self.kind, self.prompt_ids = "", []

    def advance(self, reply: str | None) -> bool:
        """Sends the last reply into the workflow; False when it has no more turns."""
        try:
            self.kind, message = self.turns.send(reply)
        except StopIteration:
            return False
        self.prompt_ids = chat_prompt_ids(self.agent.tokenizer, message)
        return True

    def request(self, sampling: SamplingParams, n: int = 1) -> Request:
        config = self.agent.config
        cap = config.max_memory_tokens if self.kind == "update" else config.max_final_tokens
        turn = len(self.trajectory.turns)
        # Turn 0 of a group is one request of n samples; later turns are per trajectory.
        key = f"{self.seed}/{self.sample}/{self.index if turn else 0}/{turn}"
        seed = zlib.crc32(key.encode()) & 0x7FFFFFFF
        return Request(tuple(self.prompt_ids), cap, dataclasses.replace(sampling, seed=seed),
                       self.agent.stop_ids, n)

    def finish_turn(self, completion: Completion, sampling: SamplingParams) -> None:
        ids = [t for t in completion.token_ids if t not in self.agent.stop_ids]
        reply = self.agent.tokenizer.decode(ids, skip_special_tokens=True)
        turn = Turn(self.kind, self.prompt_ids, completion.token_ids, completion.logprobs,
                    completion.finish_reason, reply)
        self.trajectory.turns.append(turn)
        if self.on_turn is not None:
            self.on_turn(self.sample, turn)
        if self.advance(reply):
            self.agent.scheduler.submit(self.request(sampling),
                                        lambda c: self.finish_turn(c[0], sampling))
        else:
            self.trajectory.answer = final_answer(reply)
