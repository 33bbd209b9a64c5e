"""The MemAgent workflow: read a document chunk by chunk, rewrite a memory, answer from it.

(docs/algorithm.md section 1.) MemAgent is one agent on the agent interface
(rollout/agent_api.py): `MemAgent.rollout(row, policy)` reads its row's document (a `Sample`:
the question and the document cut into chunks of token ids, `read_sample`, centre-truncated
first when `max_chunks` is set) and runs `memory_turns`, the workflow written once as a
generator (it yields each turn's memory and chunk and receives the new memory), in the
policy's representation:
- on the engine (`policy.takes_ids`), in token ids as the original's trainer: each prompt is
  the template's ids with the question's, the memory's (the previous reply's ids, end-of-text
  and padding removed; under `thinking: strip` only what follows its last </think>) and the
  chunk's ids spliced in (`templates.TokenPrompts`), sent as `prompt_ids`;
- against an OpenAI-compatible server (`run --url`, `eval` with `model.url`), in text: each
  chunk as the document's own text (`Sample.chunk_texts`), one user message per turn, the
  memory the reply's text.
Every turn is an independent conversation (one user message, one reply), not a continuation of
the previous turn's: the memory is the only thing carried from one turn to the next, and each
turn is one training row.

It runs as any agent does, through the rollout contract (rollout/rollouts.py): many samples at
once on the engine (`rollout.runner.build_runner` sizes it by `engine_need`), their turns
sharing the slots, or against a server.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from typing import Any, NamedTuple

from memagent_jax import model_dir
from memagent_jax.agents.memagent.config import MemAgentConfig
from memagent_jax.agents.memagent.reading import Sample, check_read, read_sample
from memagent_jax.agents.memagent.templates import (
    GATE_SENTENCES,
    INITIAL_MEMORY,
    TokenPrompts,
    final_prompt,
    update_prompt,
)
from memagent_jax.rollout.agent_api import Conversation, Rollout, Trajectory
from memagent_jax.rollout.thinking import (
    THINK_END,
    strip_thinking_ids,
    strip_thinking_text,
    template_kwargs,
)
from memagent_jax.tokenizer import check_representable, unknown_id


class StopReading(NamedTuple):
    """What an update turn sends `memory_turns` to read no further: the memory kept."""
    memory: object


def memory_turns(chunks, memory) -> Generator[tuple, object, None]:
    """The workflow: yields ("update", memory, chunk) for each chunk and receives the new
    memory (the reply) or a `StopReading`, then yields ("final", memory, None). Memories and
    chunks are whatever the driver works in (token ids or text); `memory` is the initial one."""
    for chunk in chunks:
        memory = yield "update", memory, chunk
        if isinstance(memory, StopReading):
            memory = memory.memory
            break
    yield "final", memory, None


def memories_of(trajectory: Trajectory) -> list[str]:
    """The memory MemAgent carries after each update turn of `trajectory`, as text (its
    `Turn.info["memory"]`): the reply (under `thinking: strip` what follows its last
    </think>), or after a gate's reply ("keep", "exit") the memory before it. A read that
    exits has no update turns for the chunks it left."""
    return [t.info["memory"] for t in trajectory.turns if t.kind == "update"]


class MemAgent:
    """MemAgent as an agent (module docstring): `rollout(row, policy)` for a `Sample` or a
    data row with `question` and `context` (read as training reads them: `read_sample` not
    strict). `setup(tokenizer, stop_ids)` before the first rollout. Its settings are the
    `memagent` section (`build`)."""
    name = "memagent"
    required_fields = ("context",)

    def __init__(self, config: MemAgentConfig, tokenizer=None, stop_ids: tuple[int, ...] = ()):
        self.config = config
        self._read: tuple[object, Sample] | None = None  # `sample`'s last row and its read
        if tokenizer is not None:
            self.setup(tokenizer, stop_ids)

    def setup(self, tokenizer, stop_ids: tuple[int, ...]) -> None:
        self.tokenizer, self.stop_ids = tokenizer, tuple(stop_ids)
        self.prompts = TokenPrompts(tokenizer, self.config.thinking, self.config.gates)
        # What the original strips from a reply before it becomes the next memory (`unpad`
        # with remove_eos): padding and end-of-text, here also every stop id.
        self.not_memory = frozenset(stop_ids) | {
            t for t in (tokenizer.pad_token_id, tokenizer.eos_token_id) if t is not None}
        think_end = tuple(tokenizer.encode(THINK_END, add_special_tokens=False))
        # A tokenizer without the token reads it as its unknown id, which would match any
        # unknown word of a reply: then no reply has thinking to strip.
        self._think_end = () if unknown_id(tokenizer) in think_end else think_end
        self._blank: dict[int, bool] = {}  # id -> decodes to whitespace only
        for gate in self.config.gates:  # a word-level tokenizer may lack their words
            check_representable(tokenizer, GATE_SENTENCES[gate], f"memagent.{gate}_gate")

    def describe(self) -> str:
        """The budgets, as `train` announces them."""
        b = self.config
        return (f"chunks of {b.chunk_tokens} tokens (at most {b.max_chunks or 'all'} a "
                f"document), memory {b.max_memory_tokens}, final answer {b.max_final_tokens}"
                + "".join(f", {g} gate" for g in b.gates))

    def turn_parts(self, sample: Sample | None = None) -> dict[str, int]:
        """The longest turn's tokens by part (after `setup`): the update template's own tokens
        ("template") around the longest "question", "memory" and "chunk", plus the longest
        "reply". (A memory is at most a reply's ids, or the initial memory's; the final prompt
        is the update prompt without its chunk.) With a sample, its question and its longest
        chunk instead of the budgets' (`_turn_budgets`)."""
        budgets = self._turn_budgets(sample)
        return {"template": self.prompts.update_overhead,
                "question": budgets["max_problem_tokens"],
                "memory": max(budgets["max_memory_tokens"], len(self.prompts.initial_memory)),
                "chunk": budgets["chunk_tokens"],
                "reply": max(budgets["max_memory_tokens"], budgets["max_final_tokens"])}

    def _turn_budgets(self, sample: Sample | None = None) -> dict[str, int]:
        """The budgets a turn is sized by, by key: the config's, or with a sample the tokens of
        its question and of its longest chunk in place of max_problem_tokens and chunk_tokens
        (what that sample's turns can reach)."""
        c = self.config
        budgets = {"chunk_tokens": c.chunk_tokens, "max_memory_tokens": c.max_memory_tokens,
                   "max_final_tokens": c.max_final_tokens,
                   "max_problem_tokens": c.max_problem_tokens}
        if sample is not None:
            budgets.update(chunk_tokens=max(map(len, sample.chunks), default=0),
                           max_problem_tokens=len(sample.problem_ids))
        return budgets

    def engine_need(self, tokenizer, row=None) -> tuple[int, str, str]:
        """(KV entries the longest turn needs (`turn_parts`: of any turn the budgets allow, or
        with a row of that row's sample), the largest budget's key, how it makes them):
        `rollout.runner.engine_need`. After `setup`, whose tokenizer this is (the agent
        interface passes it; the prompts built there are the ones sized)."""
        sample = None if row is None else self.sample(row)
        parts, budgets = self.turn_parts(sample), self._turn_budgets(sample)
        budget = max(budgets, key=budgets.__getitem__)
        why = (f"{budgets[budget]} makes turns of up to {sum(parts.values())} "
               "tokens (" + " + ".join(f"{part} {n}" for part, n in parts.items()) + ")")
        return sum(parts.values()), f"memagent.{budget}", why

    def reply_caps(self) -> dict[str, int]:
        """The max_tokens its replies are asked with, by the setting that caps them (the
        agent interface's optional `reply_caps`)."""
        return {"memagent.max_memory_tokens": self.config.max_memory_tokens,
                "memagent.max_final_tokens": self.config.max_final_tokens}

    def model_files(self) -> dict[str, dict]:
        """memagent.json: the budgets and `thinking` setting a model was trained with, which
        `run` and `demo` default to (max_chunks, a training-time cut, left out)."""
        budgets = dataclasses.asdict(self.config)
        budgets.pop("max_chunks")
        for gate in ("keep_gate", "exit_gate"):  # recorded when on: the file is as before
            if not budgets[gate]:
                budgets.pop(gate)
        return {model_dir.BUDGETS_FILE: budgets}

    def memory_ids(self, reply_ids: list[int]) -> list[int]:
        """The next memory from a reply's ids (stop, EOS and padding ids already removed): the
        reply, or under `thinking: strip` `strip_thinking_ids` of it."""
        if self.config.thinking != "strip":
            return list(reply_ids)
        return strip_thinking_ids(reply_ids, self._think_end, self._is_blank)

    def gate(self, reply: str) -> str | None:
        """The gate an update turn's reply names ("keep" or "exit", when on): the reply, after
        `thinking: strip`, is that one word."""
        word = (strip_thinking_text(reply) if self.config.thinking == "strip" else reply).strip()
        return word if word in self.config.gates else None

    def _is_blank(self, token: int) -> bool:
        if token not in self._blank:
            self._blank[token] = not self.tokenizer.decode([token]).strip()
        return self._blank[token]

    def read(self, problem: str, document: str, strict: bool = True) -> Sample:
        """`read_sample` with this agent's tokenizer and budgets."""
        return read_sample(self.tokenizer, problem, document, self.config, strict)

    def sample(self, row) -> Sample:
        """What the rollout reads of `row`: a Sample as it is, a row with question and context
        read as training reads them (`read`, not strict), the last row's read kept (a row's n
        rollouts read it once)."""
        if isinstance(row, Sample):
            return row
        if self._read is None or self._read[0] is not row:
            self._read = row, self.read(row.question, row.context, strict=False)
        return self._read[1]

    def check_row(self, where: str, index: int, row, tokenizer) -> None:
        """What a strict read refuses (`check_read`) in row `index` of `where` (an eval set),
        before any model loads."""
        tokens = len(tokenizer(row.question, add_special_tokens=False)["input_ids"])
        check_read(row.question, row.context, tokens, self.config.max_problem_tokens,
                   f"{where}: row {index}: ")

    async def rollout(self, row, policy) -> Rollout:
        """Every turn of one read of `row` (a Sample, or a row with question and context,
        `sample`). Each conversation's info is {"memory": the memory after it (`memories_of`;
        the final turn's None)}, the rollout's {"memories": every update turn's} (`run
        --json`'s record). With gates on, the rollout's metrics are its chunks read and its
        "keep" and "exit" replies."""
        sample = self.sample(row)
        config, ids = self.config, policy.takes_ids
        chunks: list | tuple  # of token ids, or (a server) of text; likewise each memory
        memory: Any
        if ids:
            chunks, memory = sample.chunks, (self.prompts.initial_memory
                                             if sample.initial_memory is None
                                             else sample.initial_memory)
        else:  # a server takes text: the chunks' text, the memory the reply's text
            chunks = (list(sample.chunk_texts) if sample.chunk_texts is not None
                      else [self.tokenizer.decode(c) for c in sample.chunks])
            memory = (INITIAL_MEMORY if sample.initial_memory is None
                      else self.tokenizer.decode(sample.initial_memory))
        workflow = memory_turns(chunks, memory)
        conversations: list[list[dict]] = []
        memories: list[str | None] = []  # each update turn's, as the record shows them
        new_memory: list[int] | str | StopReading | None = None
        gated = dict.fromkeys(config.gates, 0)
        while True:
            try:
                kind, memory, chunk = workflow.send(new_memory)
            except StopIteration:
                break
            cap = config.max_memory_tokens if kind == "update" else config.max_final_tokens
            if ids:
                prompt = (self.prompts.update(sample.problem_ids, memory, chunk)
                          if kind == "update" else self.prompts.final(sample.problem_ids, memory))
                reply = await policy.chat(prompt_ids=prompt, max_tokens=cap)
                said = [t for t in reply.token_ids if t not in self.not_memory]
                new_memory = self.memory_ids(said) if kind == "update" else None
                text = None if new_memory is None else reply.text if new_memory == said else \
                    self.tokenizer.decode(new_memory, skip_special_tokens=True)
            else:
                message = (update_prompt(sample.problem, memory, chunk, config.gates)
                           if kind == "update"
                           else final_prompt(sample.problem, memory))
                reply = await policy.chat([{"role": "user", "content": message}],
                                          max_tokens=cap, **template_kwargs(config.thinking))
                new_memory = text = None
                if kind == "update":
                    new_memory = text = (strip_thinking_text(reply.text)
                                         if config.thinking == "strip" else reply.text)
            gate = self.gate(reply.text) if kind == "update" else None
            if gate:
                gated[gate] += 1
                text = memory if isinstance(memory, str) else self.tokenizer.decode(
                    memory, skip_special_tokens=True)
                new_memory = memory if gate == "keep" else StopReading(memory)
            conversations.append(Conversation([reply.message], kind, {"memory": text}))
            if kind == "update":
                memories.append(text)
        metrics = {}
        if gated:
            metrics = {"chunks_read": float(len(conversations) - 1),
                       **{f"{gate}s": float(n) for gate, n in gated.items()}}
        return Rollout(conversations, metrics=metrics, info={"memories": memories})
