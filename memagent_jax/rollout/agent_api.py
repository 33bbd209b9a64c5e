"""The agent interface: an agent is an async function of a data row and a policy handle that
returns its conversations.

    async def rollout(row, policy) -> Rollout | list[list[dict]]

`await policy.chat(messages, max_tokens=N)` takes OpenAI-style chat messages
(`[{"role": ..., "content": ...}, ...]`) and returns a `Reply`: the reply's text, the token ids
the engine generated, their behaviour log-probabilities and the finish reason. A call whose
prompt leaves no room for a reply within `policy.max_len` raises `PromptTooLong` (the engine's
contract defines it, engine/engine_api.py; it is importable from here) in the agent, which may
end its conversation there. The agent appends `reply.message` to its messages, adds tool
results or user turns, calls again, and returns every conversation it wants trained (one turn;
a multi-turn tool conversation; or several context-independent conversations, as MemAgent's
turns). It writes no batching, padding or tokenization: the rollout runner
(`rollout/runner.py`) runs hundreds of rollouts at once on one event loop, their calls sharing
the engine's slots through the scheduler, and `rollout/client.py` runs the same function
against an OpenAI-compatible server (both behind the rollout contract,
`rollout/rollouts.py`).

A module names an agent in a config's `agent` section (`agent: {module: my_package.my_agent,
...its settings}`, `load_agent`). It defines either `rollout(row, policy)` (an agent without
settings) or `build(settings, config)`, which checks the section's other keys (errors naming
`agent.KEY`, as every config key's) and returns an object with `rollout`, and optionally:
- `setup(tokenizer, stop_ids)`: once, before any rollout (and before `max_len` or
  `engine_need`), with the policy's tokenizer;
- `max_len(tokenizer) -> int`: the most tokens one of its conversations can reach (sizes the
  engine; without it `engine.max_len` must be set), or `engine_need(tokenizer, row=None) ->
  (tokens, the setting that asks for them, how)` where errors should name a setting (with a
  row: that row's conversations', which `run` sizes its engine by);
- `check_row(where, index, row, tokenizer)`: raises UserError naming `where` and `index` for
  a row it cannot run (`eval` checks every row before the model loads);
- `required_fields`: the data-row fields it reads beyond verl's (`data.pipeline`);
- `reply_caps() -> {setting: max_tokens}`: the caps its replies are asked with, by the
  setting that sets each (training checks `overlong.buffer` against the smallest);
- `model_files() -> {file name: JSON-able}`: files a training run writes beside its model.

What is trained (`rl/rows.py`) is what was generated: each conversation becomes a `Turn`, its
tokens the ids the engine produced for every reply (and, between replies, the ids of what the
agent added), never the text re-tokenized. What an agent notes beside its conversations (JSON:
`Conversation.info`, `Rollout.info`) rides along into `run --json`'s record, untrained.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
from collections.abc import Callable
from typing import Any, Protocol

from memagent_jax.engine.engine_api import PromptTooLong as PromptTooLong  # agents catch it
from memagent_jax.errors import ConfigError

SECTION = "agent"
# The agent of a config without an `agent` section: MemAgent, whose budgets are the `memagent`
# section (agents/memagent/).
DEFAULT_MODULE = "memagent_jax.agents.memagent"
# Agent modules by the names they had before they moved, for configs and saved runs that still
# name them (`load_agent` reads an old name as the new one).
MOVED_MODULES = {"memagent_jax.rollout.memagent": DEFAULT_MODULE}


class AssistantMessage(dict):
    """{"role": "assistant", "content": text} (and "tool_calls", OpenAI's, where the reply
    calls tools): a reply as a chat message. `reply` links it to the call that generated it,
    so the runner finds its token ids when the agent sends it back in a later call's messages
    or returns it in a conversation (a plain dict with the same content and calls is matched by
    them instead)."""

    def __init__(self, content: str, reply: Reply | None = None,
                 tool_calls: list[dict] | None = None):
        super().__init__(role="assistant", content=content)
        if tool_calls:
            self["tool_calls"] = tool_calls
        self.reply = reply


@dataclasses.dataclass(eq=False)
class Reply:
    """One chat call's answer. text: the reply, its stop, end-of-text and padding ids removed;
    token_ids: every id generated, the stop token included (None from a server, which
    returns text); logprobs: each id's behaviour log-probability (None likewise);
    finish_reason: "stop" or "length"; prompt_ids: the ids the engine continued (None from a
    server); message: the reply as the next call's messages take it. A call given `tools`
    (`rollout/tool_calls.py`): tool_calls, the calls the reply makes (OpenAI's shape; None:
    none), tool_error, why the calls it wrote do not parse (None: they do, or it wrote none);
    its message's content is then the text outside the calls."""
    text: str
    finish_reason: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    prompt_ids: list[int] | None = None
    completion_tokens: int | None = None  # a server's usage count when it reports one
    tool_calls: list[dict] | None = None
    tool_error: str | None = None
    message: AssistantMessage = dataclasses.field(init=False)

    def __post_init__(self):
        self.message = AssistantMessage(self.text, self)


class Conversation(list):
    """A list of chat messages with labels: `kind` (the `Turn.kind` its row gets; default
    "turn", and "final" for a rollout's final conversation) and `info` (`Turn.info`: what the
    agent notes of this conversation, JSON-able; MemAgent: {"memory": the memory the reply
    became})."""

    def __init__(self, messages=(), kind: str | None = None, info: dict | None = None):
        super().__init__(messages)
        self.kind, self.info = kind, dict(info or {})


@dataclasses.dataclass
class Rollout:
    """What an agent returns for one row (a bare list of conversations means
    `Rollout(conversations)`). final: the conversation whose last reply is the answer the
    reward reads; metrics: the agent's own numbers, averaged over trajectories into the step's
    metrics as `agent/NAME`; info: what else the agent notes of the rollout, JSON-able
    (`Trajectory.info`, `run --json`'s record; MemAgent: {"memories": [...]})."""
    conversations: list[list[dict]]
    final: int = -1
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    info: dict = dataclasses.field(default_factory=dict)


class Policy(Protocol):
    """The handle an agent calls. takes_ids: whether `prompt_ids` are honoured and replies carry
    token ids (the engine: True; a server: False); tokenizer: the policy's (None on a server,
    which takes text); max_len: the most tokens a call's prompt and reply take together (a
    prompt that leaves no room raises `PromptTooLong`; None where the handle does not know: a
    server, a replay)."""
    takes_ids: bool
    tokenizer: Any

    @property
    def max_len(self) -> int | None: ...

    async def chat(self, messages: list[dict] | None = None, *, max_tokens: int,
                   prompt_ids: list[int] | None = None, temperature: float | None = None,
                   top_p: float | None = None, top_k: int | None = None,
                   tools: list[dict] | None = None, tool_choice: str | None = None,
                   **template_vars) -> Reply:
        """A reply to `messages` of at most max_tokens tokens, sampled as the run samples
        (temperature, top-p, top-k; a seed per call) unless the call asks otherwise (not in
        training: the learner scores tokens under the rollout's distribution). prompt_ids: the
        prompt as ids instead, for a workflow that splices ids (MemAgent); template_vars: the
        chat template's extra variables (enable_thinking, ...). tools: OpenAI's function tools,
        rendered through the chat template (or declared in the system message where it takes
        none) and the reply read for its calls (`Reply.tool_calls`, `Reply.tool_error`;
        rollout/tool_calls.py); tool_choice "auto" (None) or "none" (not read). Messages may
        hold assistant messages with `tool_calls` and `role: "tool"` messages with
        `tool_call_id`."""

    async def once(self, fn: Callable, *args) -> Any:
        """fn(*args) computed on process 0 only, its (picklable) result on every process: for a
        tool or value that reads time, randomness or I/O (every process runs every rollout
        and must make the same calls)."""


@dataclasses.dataclass
class Turn:
    """One conversation of a trajectory, as it is trained (one row): prompt_ids, the ids before
    its first reply; response_ids, everything after: each reply's generated ids and, between
    replies, the ids of the messages the agent added (tool results, user turns);
    response_logprobs, each generated id's behaviour log-probability (0 elsewhere);
    response_mask, 1 on generated ids (None: all of them, a one-reply conversation); caps, each
    reply's max_tokens; kind, the row's label ("final" for the answer's conversation; MemAgent:
    "update" or "final"); reply, the last reply's text; info, the agent's notes on the
    conversation (`Conversation.info`); messages, the conversation as the agent returned it."""
    kind: str
    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float]
    finish_reason: str
    reply: str
    info: dict = dataclasses.field(default_factory=dict)
    response_mask: list[int] | None = None
    caps: tuple[int, ...] = ()
    messages: list[dict] | None = None
    server_tokens: int | None = None  # a server's turn (no ids): the tokens its usage reported

    @property
    def generated_tokens(self) -> int | None:
        """Tokens generated in this conversation (a server's: its usage count, or None)."""
        if not self.response_ids:
            return self.server_tokens
        return len(self.response_ids) if self.response_mask is None else sum(self.response_mask)

    def replies(self) -> list[tuple[int, int | None]]:
        """(generated tokens, cap) of each reply in order (cap None where not recorded)."""
        if self.response_mask is None:
            lengths = [len(self.response_ids)]
        else:
            lengths, previous = [], 0
            for m in self.response_mask:
                if m and not previous:
                    lengths.append(0)
                if m:
                    lengths[-1] += 1
                previous = m
        caps = list(self.caps) + [None] * (len(lengths) - len(self.caps))
        return list(zip(lengths, caps))


@dataclasses.dataclass
class Trajectory:
    """One rollout of one row: its turns (conversations) in the agent's order, the answer
    (`\\boxed{}` content, or the reply after `rollout.answers.final_answer`) of its final
    turn, and the agent's metrics and notes (`Rollout.metrics`, `Rollout.info`)."""
    problem: str
    turns: list[Turn] = dataclasses.field(default_factory=list)
    answer: str | None = None
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    info: dict = dataclasses.field(default_factory=dict)
    # Cancelled past its deadline (`rollouts.Limits.timeout_s`): no turns, nothing trained.
    timed_out: bool = False

    @property
    def final_turn(self) -> Turn | None:
        """The turn the answer is read from: the last of kind "final" (a final conversation
        of several rows, as a Qwen3 one whose template strips earlier thinking: its last
        reply's), else the last."""
        return next((t for t in reversed(self.turns) if t.kind == "final"),
                    self.turns[-1] if self.turns else None)

    @property
    def final_reply(self) -> str:
        turn = self.final_turn
        return turn.reply if turn is not None else ""

    def record(self) -> dict:
        """`run --json`'s record (`run_record`)."""
        return run_record(self.problem, self.answer, [
            {"kind": t.kind, "reply": t.reply, **t.info,
             "finish_reason": t.finish_reason, "response_tokens": t.generated_tokens,
             **({"messages": [dict(m) for m in t.messages]}
                if t.messages and len(t.messages) > 1 else {})}
            for t in self.turns], self.metrics, self.info)


# `run_record`'s own keys, of the record and of its turns: an agent's info names none of them.
RECORD_KEYS = frozenset({"problem", "answer", "final_reply", "finish_reason", "final_tokens",
                         "turns", "metrics"})
TURN_RECORD_KEYS = frozenset({"kind", "reply", "finish_reason", "response_tokens", "messages"})


def check_info(info, where: str, taken: frozenset[str]) -> None:
    """Raises TypeError unless `info` (an agent's `Rollout.info` or `Conversation.info`, named
    by `where`) is a dict whose keys are strings its record does not already use (`taken`)."""
    if not isinstance(info, dict) or not all(isinstance(k, str) for k in info):
        raise TypeError(f"{where} must be a dict with string keys, got {info!r:.100}")
    clash = sorted(taken & info.keys())
    if clash:
        raise TypeError(f"{where} names {', '.join(map(repr, clash))}, which run --json's "
                        "record uses itself; give it another name")


def run_record(problem: str, answer: str | None, turns: list[dict],
               metrics: dict | None = None, info: dict | None = None) -> dict:
    """One rollout as `run --json` prints it, the same on the local engine and against a
    server: turns are {"kind", "reply" (the last reply), the agent's notes on the conversation
    (`Turn.info`'s keys; MemAgent: "memory"), "finish_reason", "response_tokens" (generated
    tokens; None when a server does not report usage), and "messages" (the conversation,
    where it holds more than its reply)}; after "problem" and "answer" the agent's notes on
    the rollout (`Rollout.info`'s keys; MemAgent: "memories"); "final_reply",
    "finish_reason" and "final_tokens" the final turn's; "metrics" the agent's own (only when
    it reports any)."""
    final = next((t for t in reversed(turns) if t["kind"] == "final"),
                 turns[-1] if turns else {})
    record = {"problem": problem, "answer": answer, **(info or {}),
              "final_reply": final.get("reply", ""), "finish_reason": final.get("finish_reason"),
              "final_tokens": final.get("response_tokens"), "turns": turns}
    if metrics:
        record["metrics"] = metrics
    return record


def load_agent(section: dict, config) -> Any:
    """The agent a config's `agent` section names (module docstring), built from its other keys
    against `config` (the whole TrainConfig or EvalConfig). A module with `rollout` only takes
    no settings; a module that moved is found by its old name too (`MOVED_MODULES`). Errors
    are ConfigErrors naming `agent.module` or the setting; a section of settings without
    `module` (a misspelled one) is one, not settings for MemAgent."""
    if section and "module" not in section:
        key = next(iter(section))
        raise ConfigError(f"{SECTION}.{key}", "unknown key (did you mean 'agent.module'?)"
                          if difflib.get_close_matches(key, ["module"], cutoff=0.6) else
                          "the section names no module (`module: my_package.my_agent`); "
                          "without one its agent is MemAgent, whose settings are the "
                          "`memagent` section")
    name = section.get("module", DEFAULT_MODULE)
    name = MOVED_MODULES.get(name, name) if isinstance(name, str) else name
    module = section_module(SECTION, name, "rollout(row, policy) or build(settings, config)")
    settings = {k: v for k, v in section.items() if k != "module"}
    if callable(getattr(module, "build", None)):
        agent = module.build(settings, config)
    elif callable(getattr(module, "rollout", None)):
        if settings:
            raise ConfigError(f"{SECTION}.{next(iter(settings))}",
                              f"{name} takes no settings (it defines rollout(row, policy) "
                              "and no build(settings, config))")
        agent = _FunctionAgent(module.rollout)
    else:
        raise ConfigError(f"{SECTION}.module", f"module {name!r} defines neither "
                                               "rollout(row, policy) nor build(settings, config)")
    if not callable(getattr(agent, "rollout", None)):
        raise ConfigError(f"{SECTION}.module", f"{name}.build returned {type(agent).__name__}, "
                                               "which has no rollout(row, policy)")
    if not inspect.iscoroutinefunction(agent.rollout):
        rollout = (f"{name}.rollout" if isinstance(agent, _FunctionAgent) else
                   f"the rollout of {name}.build's {type(agent).__name__}")
        raise ConfigError(f"{SECTION}.module", f"{rollout} is not a coroutine function: the "
                                               "runner awaits it, so it must be `async def "
                                               "rollout(row, policy)`")
    agent.name = getattr(agent, "name", None) or name
    return agent


def section_module(section: str, name, what: str):
    """The module a config section's `module` key names (an agent's, a plugin's); ConfigError
    naming `SECTION.module` unless `name` is a module name that imports (`what`: what such a
    module defines)."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{section}.module", f"must name a module with {what}; got {name!r}")
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ConfigError(f"{section}.module", f"cannot import {name!r} ({e})") from None


class _FunctionAgent:
    """A module's bare `rollout` function as an agent object."""

    def __init__(self, rollout):
        self.rollout = rollout
