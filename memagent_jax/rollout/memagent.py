"""The MemAgent workflow: read a document chunk by chunk, rewrite a memory, answer from it.

(docs/algorithm.md section 1.) `memory_turns` is the workflow itself, written once as a
generator: it yields each turn's memory and chunk and receives the new memory. Two drivers run
it, each in its own representation:
- `MemoryAgent`, on the local engine, in token ids as the original's trainer: each prompt is
  the template's ids with the question's, the memory's (the previous reply's ids, end-of-text
  and padding removed; under `thinking: strip` only what follows its last </think>) and the
  chunk's ids spliced in (`templates.TokenPrompts`). It runs many
  samples at once, each a chain of requests on the scheduler (turn k's reply builds turn
  k+1's prompt), so samples with different numbers of chunks share the slots without waiting
  for each other, and records every turn's token ids and logprobs (one RL training row per
  turn);
- `run_on_server` (client.py), one sample against an OpenAI-compatible endpoint, in text.
Both take a `Sample`: the question and its document cut into chunks of token ids
(`read_sample`, centre-truncated first when `max_chunks` is set).

Every turn is an independent conversation (one user message, one reply), not a continuation of
the previous turn's: the memory is the only thing carried from one turn to the next.
"""

from __future__ import annotations

import dataclasses
import secrets
import zlib
from typing import Callable, ClassVar, Generator, Literal

from memagent_jax import model_dir
from memagent_jax.errors import ConfigError, UserError
from memagent_jax.rollout.answers import final_answer
from memagent_jax.rollout.sampling import SamplingParams
from memagent_jax.rollout.scheduler import Completion, Request, Scheduler
from memagent_jax.rollout.templates import TokenPrompts
from memagent_jax.rollout.thinking import THINK_END, THINKING_CHOICES, strip_thinking_ids
from memagent_jax.runconfig import at_least, config_key
from memagent_jax.tokenizer import unknown_id


@dataclasses.dataclass(frozen=True)
class MemAgentConfig:
    """The `memagent` section of the train and eval configs (and `run`'s flags): the token
    budgets of docs/algorithm.md section 1, and what a thinking model's thinking does."""
    SECTION: ClassVar[str] = "memagent"
    chunk_tokens: int = 5000        # document tokens read per turn
    max_memory_tokens: int = 1024   # the longest memory an update turn may write
    max_final_tokens: int = 1024    # the longest final answer
    max_problem_tokens: int = 1024  # the question's tokens kept
    max_chunks: int | None = None   # keep the first and last halves of N chunks (None: all)
    # A thinking model's <think>...</think> (Qwen3; docs/algorithm.md section 7, item 11):
    # keep: the chat template as shipped; a reply's ids (minus stop, EOS, pad) are the next
    #   memory, thinking included (the original's trainer);
    # strip: the template as shipped; the memory is the reply after its last </think>,
    #   stripped of surrounding whitespace (empty if nothing follows it), a reply without one
    #   whole (the original's evaluation);
    # off: the template rendered with enable_thinking=False (an empty think block in every
    #   prompt; `run --url` sends it as chat_template_kwargs); the memory as in keep.
    # The final answer (after the last </think>) and the reward are the same in all three; a
    # model that never writes </think> (Qwen2.5) gets identical prompts and memories.
    thinking: Literal["keep", "strip", "off"] = "keep"

    def __post_init__(self):
        at_least(self, 1, "chunk_tokens", "max_memory_tokens", "max_final_tokens",
                 "max_problem_tokens", "max_chunks")
        if self.thinking not in THINKING_CHOICES:
            raise ConfigError(config_key(self, "thinking"), f"must be one of "
                              f"{', '.join(THINKING_CHOICES)}, got {self.thinking!r}")

    @classmethod
    def from_model(cls, model_path: str | None, **given) -> MemAgentConfig:
        """The budgets a model was trained with (its directory's memagent.json, as `run` and
        `demo` read it; a shipped model's name is taken), with those `given` (None: not given)
        over them, and the defaults above for the rest."""
        return cls(**model_dir.budgets(model_path, **given))


@dataclasses.dataclass(frozen=True)
class Sample:
    """A question and its document as the workflow reads it, in the policy's tokens: the
    question's ids, the chunks' ids, and the document's length (before any max_chunks cut).
    initial_memory: the memory's ids before the first chunk (None: the template's "No
    previous memory"; given: a read that starts inside a document, from the memory held
    there)."""
    problem: str
    problem_ids: tuple[int, ...]
    chunks: tuple[tuple[int, ...], ...]
    document_tokens: int
    initial_memory: tuple[int, ...] | None = None


@dataclasses.dataclass
class Turn:
    """One turn of a trajectory: a conversation of its own, its prompt and its response (kind
    "update" or "final")."""
    kind: str
    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float]
    finish_reason: str
    reply: str  # the whole response as text (stop, EOS and padding ids removed)
    # An update turn's new memory as text: the reply, or under `thinking: strip` what follows
    # its last </think> (None for the final turn).
    memory: str | None = None


@dataclasses.dataclass
class Trajectory:
    problem: str
    turns: list[Turn] = dataclasses.field(default_factory=list)
    answer: str | None = None

    @property
    def memories(self) -> list[str]:
        """The memories as carried from turn to turn (after `thinking: strip`)."""
        return [t.memory for t in self.turns if t.kind == "update"]

    @property
    def final_reply(self) -> str:
        return self.turns[-1].reply if self.turns else ""

    def record(self) -> dict:
        """`run --json`'s record (`run_record`)."""
        return run_record(self.problem, self.answer, [
            {"kind": t.kind, "reply": t.reply, "memory": t.memory,
             "finish_reason": t.finish_reason, "response_tokens": len(t.response_ids)}
            for t in self.turns])


def run_record(problem: str, answer: str | None, turns: list[dict]) -> dict:
    """One read of a document as `run --json` prints it, the same on the local engine and
    against a server (`run_on_server`): turns are {"kind", "reply" (the whole reply), "memory"
    (an update turn's new memory, the reply after `thinking: strip`; None for the final
    turn), "finish_reason", "response_tokens" (None when a server does not report usage)};
    "memories" are the update turns' memories, "final_reply", "finish_reason" and
    "final_tokens" the final turn's."""
    final = turns[-1] if turns else {}
    return {"problem": problem, "answer": answer,
            "memories": [t["memory"] for t in turns if t["kind"] == "update"],
            "final_reply": final.get("reply", ""), "finish_reason": final.get("finish_reason"),
            "final_tokens": final.get("response_tokens"), "turns": turns}


def centre_truncate(ids: list[int], max_tokens: int) -> list[int]:
    """ids, or its first and last max_tokens // 2 when longer than max_tokens (verl's
    `postprocess_data(..., truncation='center')`)."""
    if len(ids) <= max_tokens:
        return ids
    half = max_tokens // 2
    return ids[:half] + ids[len(ids) - half:]


def chunk_ids(ids: list[int], chunk_tokens: int, max_chunks: int | None = None) -> list[list[int]]:
    """chunk i = ids[i*C:(i+1)*C], after centre-truncating ids to max_chunks x C tokens."""
    if max_chunks:
        ids = centre_truncate(ids, max_chunks * chunk_tokens)
    return [ids[i:i + chunk_tokens] for i in range(0, len(ids), chunk_tokens)]


def memory_turns(chunks, memory) -> Generator[tuple, object, None]:
    """The workflow: yields ("update", memory, chunk) for each chunk and receives the new
    memory (the reply), then yields ("final", memory, None). Memories and chunks are whatever
    the driver works in (token ids or text); `memory` is the initial one."""
    for chunk in chunks:
        memory = yield "update", memory, chunk
    yield "final", memory, None


def read_sample(tokenizer, problem: str, document: str, config: MemAgentConfig,
                strict: bool = True) -> Sample:
    """The question and the document in the policy's tokens, the document cut into chunks.
    strict (a user's own question and document): raises UserError for an empty question or
    document, or a question over max_problem_tokens. Not strict (training and validation rows,
    as the original carries on): an empty document has no chunks (the agent answers from the
    initial memory) and an over-long question keeps its first max_problem_tokens tokens (the
    engine holds no more)."""
    if strict and not problem.strip():
        raise UserError("the question is empty")
    if strict and not document.strip():
        raise UserError("the document is empty")
    problem_ids = tokenizer(problem, add_special_tokens=False)["input_ids"]
    if len(problem_ids) > config.max_problem_tokens:
        if strict:
            raise UserError(f"the question has {len(problem_ids)} tokens, over the prompt "
                            f"budget of {config.max_problem_tokens}")
        problem_ids = problem_ids[:config.max_problem_tokens]
    ids = tokenizer(document, add_special_tokens=False)["input_ids"]
    chunks = chunk_ids(ids, config.chunk_tokens, config.max_chunks)
    return Sample(problem, tuple(problem_ids), tuple(tuple(c) for c in chunks), len(ids))


def required_length(tokenizer, config: MemAgentConfig) -> int:
    """KV entries a turn can need: the sum of `turn_parts`."""
    return sum(turn_parts(tokenizer, config).values())


def turn_parts(tokenizer, config: MemAgentConfig) -> dict[str, int]:
    """The longest turn's tokens by part: the update template's own tokens ("template")
    around the longest "question", "memory" and "chunk", plus the longest "reply". (A memory
    is at most a reply's ids, or the initial memory's; the final prompt is the update prompt
    without its chunk.)"""
    prompts = TokenPrompts(tokenizer, config.thinking)
    return {"template": prompts.update_overhead, "question": config.max_problem_tokens,
            "memory": max(config.max_memory_tokens, len(prompts.initial_memory)),
            "chunk": config.chunk_tokens,
            "reply": max(config.max_memory_tokens, config.max_final_tokens)}


class MemoryAgent:
    """Runs the workflow for many samples on a scheduler; see the module docstring. Built by
    `rollout.factory.build_agent`, which sizes the engine for `config`."""

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
        self.prompts = TokenPrompts(tokenizer, config.thinking)
        # What the original strips from a reply before it becomes the next memory (`unpad`
        # with remove_eos): padding and end-of-text, here also every stop id.
        self.not_memory = frozenset(stop_ids) | {
            t for t in (tokenizer.pad_token_id, tokenizer.eos_token_id) if t is not None}
        think_end = tuple(tokenizer.encode(THINK_END, add_special_tokens=False))
        # A tokenizer without the token reads it as its unknown id, which would match any
        # unknown word of a reply: then no reply has thinking to strip.
        self._think_end = () if unknown_id(tokenizer) in think_end else think_end
        self._blank: dict[int, bool] = {}  # id -> decodes to whitespace only

    def memory_ids(self, reply_ids: list[int]) -> list[int]:
        """The next memory from a reply's ids (stop, EOS and padding ids already removed): the
        reply, or under `thinking: strip` `strip_thinking_ids` of it."""
        if self.config.thinking != "strip":
            return list(reply_ids)
        return strip_thinking_ids(reply_ids, self._think_end, self._is_blank)

    def _is_blank(self, token: int) -> bool:
        if token not in self._blank:
            self._blank[token] = not self.tokenizer.decode([token]).strip()
        return self._blank[token]

    def read(self, problem: str, document: str, strict: bool = True) -> Sample:
        """`read_sample` with this agent's tokenizer and budgets."""
        return read_sample(self.tokenizer, problem, document, self.config, strict)

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
            runs = [_Run(self, i, j, sample, results[i][j], base, on_turn) for j in range(n)]
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
    """One trajectory in flight: its workflow generator (in token ids) and the turn it waits
    on."""

    def __init__(self, agent: MemoryAgent, sample_index: int, index: int, sample: Sample,
                 trajectory, seed, on_turn):
        self.agent, self.sample, self.index = agent, sample_index, index
        self.problem_ids = sample.problem_ids
        self.turns = memory_turns(sample.chunks, agent.prompts.initial_memory
                                  if sample.initial_memory is None else sample.initial_memory)
        self.trajectory, self.seed, self.on_turn = trajectory, seed, on_turn
        self.kind, self.prompt_ids = "", []

    def advance(self, memory: list[int] | None) -> bool:
        """Sends the last reply's memory ids into the workflow and builds the next prompt;
        False when there are no more turns."""
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
        # Turn 0 of a group is one request of n samples; later turns are per trajectory.
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
        turn = Turn(self.kind, self.prompt_ids, completion.token_ids, completion.logprobs,
                    completion.finish_reason, reply, text)
        self.trajectory.turns.append(turn)
        if self.on_turn is not None:
            self.on_turn(self.sample, turn)
        if self.advance(memory):
            self.agent.scheduler.submit(self.request(sampling),
                                        lambda c: self.finish_turn(c[0], sampling))
        else:
            self.trajectory.answer = final_answer(reply)
