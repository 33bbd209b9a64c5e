"""The ways an eval answers a question, on the local engine or a server.

- AgentMethod: an agent through the rollout contract (rollout/rollouts.py) on each record as a
  data row (`data.pipeline.example_from_row`), n rollouts each, on the engine or on a server
  (`model.url`): `method: memagent` runs MemAgent (the default agent, its settings the
  `memagent` section), `method: agent` the `agent` section's agent; its final answer is
  scored, its own metrics kept in the record.
- FullContextMethod: the baseline of the paper's table: the whole context in one prompt (the
  original's "boxed" template), centre-truncated to the model window (first half + last half
  of the prompt's tokens, as the original), n samples per question.

Both are used the same way: `check(where, row, record)` on every sample before any device work;
`start()` loads the model (only when something is left to run); `run(set_name, batch, on_done,
on_turn, add_turns)` over a batch of (row, record) pairs calls `on_done(row, answers, info)` as
each question finishes (answers: one `Answer` per sample; info: context_tokens, turns),
`on_turn()` after every model call and `add_turns(k)` as it learns how many calls are coming
(both for the progress bar).
"""

from __future__ import annotations

import dataclasses
import os
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax

from memagent_jax.engine.factory import LoadedModel, build_engine, load_model_section
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.engine.scheduler import Request, complete
from memagent_jax.errors import UserError
from memagent_jax.eval.config import EvalConfig, SamplingSection
from memagent_jax.models.sharding import job_mesh
from memagent_jax.rollout.agent_api import load_agent
from memagent_jax.rollout.answers import final_answer
from memagent_jax.rollout.chat import chat_prompt_ids
from memagent_jax.rollout.rollouts import Rollouts
from memagent_jax.rollout.runner import build_runner

if TYPE_CHECKING:
    from memagent_jax.engine.engine import Engine

# The original's full-context prompt (MemAgent taskutils/memory_eval/utils/boxed.py).
FULL_CONTEXT_TEMPLATE = """Please read the following text and answer the question below.

<text>
$DOC$
</text>

$Q$

Put the answer in \\boxed{}."""


@dataclasses.dataclass
class Answer:
    """One sampled answer: the answer the original's evaluation reads in the reply
    (rollout.answers.final_answer; None without one) and the reply it came from."""
    pred: str | None
    reply: str
    finish_reason: str
    response_tokens: int


OnDone = Callable[[int, list[Answer], dict], None]


def batch_seed(sampling: SamplingSection, set_name: str, batch: list[tuple[int, dict]]) -> int:
    """The seed a batch's rollouts run with, on the engine or a server (their calls' seeds
    derive from it, `rollout.runner.call_seed`): from the set and the batch's first row, so a
    fresh run is reproducible; a resumed run re-runs its unfinished rows in new batches, so
    with new random numbers."""
    return zlib.crc32(f"{sampling.seed}/{set_name}/{batch[0][0]}".encode()) & 0x7FFFFFFF


def _count(tokenizer, texts: list[str]) -> list[int]:
    return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


def _load(config: EvalConfig, tokenizer) -> tuple[LoadedModel, jax.sharding.Mesh | None]:
    """The model section's loaded model, and the config's mesh (None: one device) it is on."""
    mesh = job_mesh(config.mesh, source="mesh")
    return load_model_section(config.model, tokenizer, mesh), mesh


class FullContextMethod:
    def __init__(self, config: EvalConfig, tokenizer):
        self.config, self.tokenizer = config, tokenizer
        # A thinking model's switch (memagent.thinking: off renders the one prompt with
        # enable_thinking=False; the answer is read after </think> whatever the setting).
        self.thinking = config.memagent.thinking
        self.overhead = len(chat_prompt_ids(tokenizer, "", self.thinking))  # template, system
        self.max_input: int | None = config.full_context.max_input_tokens
        self.engine: Engine | None = None  # start's
        self.params: Any = None
        self.stop_ids: tuple[int, ...] = ()

    def _budget(self, window: int, what: str) -> int:
        """User-message tokens left in `window` KV entries after the chat template, the reply
        and 64 spare (re-encoding decoded, truncated text may differ by a few tokens)."""
        budget = window - self.overhead - 64 - self.config.full_context.max_new_tokens
        if budget <= 0:
            raise UserError(f"{what} of {window} tokens leaves no room for a prompt of "
                            f"full_context.max_new_tokens = "
                            f"{self.config.full_context.max_new_tokens} new tokens")
        return budget

    def needed_length(self, model_config) -> int:
        """KV entries a prompt and its reply need. Without full_context.max_input_tokens the
        prompt gets the model's context length (YaRN-extended when its config says so)."""
        if self.max_input is None:
            self.max_input = self._budget(model_config.context_window,
                                          "the model's context length")
        return self.max_input + self.overhead + 64 + self.config.full_context.max_new_tokens

    def check(self, where: str, row: int, record: dict) -> None:
        if not record.get("context", "").strip():
            raise UserError(f"{where}: row {row}: the context is empty")

    def start(self) -> None:
        loaded, mesh = _load(self.config, self.tokenizer)
        needed = self.needed_length(loaded.config)
        self.engine = build_engine(loaded.model, self.config.engine, mesh, needed,
                                   "full_context.max_input_tokens",
                                   f"{self.max_input} makes prompts and replies of up to "
                                   f"{needed} tokens")
        self.params, self.stop_ids = loaded.params, loaded.stop_ids
        # engine.max_len, when set, may hold less than the model window
        budget = self._budget(self.engine.max_len, "engine.max_len")
        assert self.max_input is not None  # needed_length's
        self.max_input = min(self.max_input, budget)

    def prompt_ids(self, record: dict) -> tuple[list[int], int]:
        """The chat prompt, its user message centre-truncated to max_input tokens as the
        original does (keep the first and last halves, decode to text); and the context's
        length in tokens. Re-encoding the decoded text can come out longer than the cut (a
        merge at the seam; a word-level tokenizer's "[UNK]"): the cut shrinks until it fits."""
        text = (FULL_CONTEXT_TEMPLATE.replace("$DOC$", record["context"].strip())
                .replace("$Q$", record["input"].strip()))
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert self.max_input is not None, "start (needed_length) sets max_input"
        limit = self.max_input + self.overhead + 64  # what max_len was sized for
        budget = self.max_input
        for _ in range(8):
            cut = text
            if len(ids) > budget:
                half = budget // 2
                cut = self.tokenizer.decode(ids[:half] + ids[len(ids) - half:],
                                            skip_special_tokens=True)
            prompt = chat_prompt_ids(self.tokenizer, cut, self.thinking)
            if len(prompt) <= limit:
                return prompt, len(self.tokenizer(record["context"],
                                                  add_special_tokens=False)["input_ids"])
            budget = min(budget - 1, budget * limit // len(prompt))
            if budget <= 0:
                break
        raise UserError(f"the prompt does not shrink to {limit} tokens by centre truncation")

    def run(self, set_name: str, batch: list[tuple[int, dict]], on_done: OnDone,
            on_turn: Callable[[], None], add_turns: Callable[[int], None]) -> None:
        s, fc = self.config.sampling, self.config.full_context
        add_turns(s.n * len(batch))
        requests, tokens = [], []
        for row, record in batch:
            ids, context_tokens = self.prompt_ids(record)
            seed = zlib.crc32(f"{s.seed}/{set_name}/{row}".encode()) & 0x7FFFFFFF
            requests.append(Request(tuple(ids), fc.max_new_tokens,
                                    SamplingParams(s.temperature, s.top_p, s.top_k, seed),
                                    self.stop_ids, s.n))
            tokens.append(context_tokens)

        def request_done(i: int, completions) -> None:
            answers = []
            for completion in completions:
                on_turn()
                ids = [t for t in completion.token_ids if t not in self.stop_ids]
                reply = self.tokenizer.decode(ids, skip_special_tokens=True)
                answers.append(Answer(final_answer(reply), reply, completion.finish_reason,
                                      len(completion.token_ids)))
            on_done(batch[i][0], answers, {"context_tokens": tokens[i], "turns": 1})

        assert self.engine is not None, "run after start"
        complete(self.engine, self.params, requests, on_done=request_done)



class AgentMethod:
    """`method: memagent` and `method: agent` (module docstring)."""

    def __init__(self, config: EvalConfig, tokenizer):
        self.config, self.tokenizer = config, tokenizer
        self.agent = config.loaded_agent if config.method == "agent" else load_agent({}, config)
        self.rollouts: Rollouts  # start()'s

    def row(self, where: str, row: int, record: dict):
        from memagent_jax.data.pipeline import example_from_row
        return example_from_row(record, row, where)

    def check(self, where: str, row: int, record: dict) -> None:
        example = self.row(where, row, record)
        if hasattr(self.agent, "check_row"):
            self.agent.check_row(where, row, example, self.tokenizer)

    def start(self) -> None:
        model, s = self.config.model, self.config.sampling
        if model.url:  # the server holds the model, asked for model.served_name
            from memagent_jax.rollout.client import Server, ServerRollouts, api_key_from_env

            name = model.served_name or os.path.basename(os.path.normpath(model.path or ""))
            self.server = Server(model.url, name, api_key_from_env(), temperature=s.temperature,
                                 top_p=s.top_p, top_k=s.top_k)
            if hasattr(self.agent, "setup"):
                self.agent.setup(self.tokenizer, ())
            self.rollouts = ServerRollouts(self.server, max(1, self.config.data.batch_size))
            return
        loaded, mesh = _load(self.config, self.tokenizer)
        self.rollouts = build_runner(self.agent, loaded.model, self.tokenizer,
                                     self.config.engine, mesh, loaded.stop_ids
                                     ).with_params(loaded.params)

    def run(self, set_name: str, batch: list[tuple[int, dict]], on_done: OnDone,
            on_turn: Callable[[], None], add_turns: Callable[[int], None]) -> None:
        s = self.config.sampling
        rows = [self.row(set_name, row, record) for row, record in batch]

        def call(_i: int) -> None:
            add_turns(1)
            on_turn()

        def done(i: int, trajectories) -> None:
            answers = [Answer(t.answer, t.final_reply, t.final_turn.finish_reason or "",
                              self._tokens(t.final_turn)) for t in trajectories]
            names = dict.fromkeys(k for t in trajectories for k in t.metrics)
            metrics = {k: sum(t.metrics.get(k, 0.0) for t in trajectories) / len(trajectories)
                       for k in names}
            on_done(batch[i][0], answers, {
                "context_tokens": len(self.tokenizer(rows[i].context, add_special_tokens=False)
                                      ["input_ids"]) if rows[i].context else 0,
                "turns": sum(len(t.turns) for t in trajectories) / len(trajectories),
                **({"agent": metrics} if metrics else {})})

        seed = batch_seed(s, set_name, batch)
        self.rollouts.run(self.agent, rows, SamplingParams(s.temperature, s.top_p, s.top_k, seed),
                          s.n, call, done)

    def _tokens(self, turn) -> int:
        """A final turn's generated tokens; a server's without usage counts: the reply's in
        our tokenizer."""
        if turn.generated_tokens is not None:
            return turn.generated_tokens
        return len(self.tokenizer(turn.reply, add_special_tokens=False)["input_ids"])
