"""Agents' rollouts on the engine: hundreds at once, on one event loop, sharing the slots.

`AgentRunner` is the rollout contract (rollout/rollouts.py) on the engine:
`runner.with_params(params).run(agent, rows, sampling, n)` runs n rollouts of every row, each an
asyncio task of `agent.rollout(row, policy)` with a handle of its own (`EnginePolicy`). A chat
call renders its prompt (`conversation.ChatPrompts`), is queued, and waits. The runner's loop
lets every ready rollout run until it waits on a reply, submits the queued calls to the
scheduler, steps the engine once, and again: the rollouts' calls fill the slots as they come
(continuous batching), and no agent batches, pads or tokenizes anything.

Seeds: call k of rollout j of row i is sampled with the seed
crc32(f"{seed}/{i}/{j if k else 0}/{k}") and, for its first call, sample index j, so a group's
first calls draw as the n samples of one request (and are one request when their prompts agree:
the prompt is prefilled once), and every later call as a request of its own. A rollout's
tokens therefore depend on the seed, its row's place and its own calls, not on the slot or the
step that serves them.

Many processes: every process runs the same rollouts and must make the same engine calls in
the same order. Each submission compares the calls across processes; where they differ (an
agent or tool that reads time, randomness or I/O), the run stops on every process with one line
naming the agent. `policy.once(fn, *args)` computes such a value on process 0 and gives every
process its result.

Limits (`with_limits`, rollout/rollouts.py): a rollout waits for a place among
`max_concurrent` before it starts; one cancelled at its deadline leaves the queue, and its
engine request is cancelled (its slots freed) once no rollout waits on it (a group's first
calls share one).

`build_runner` assembles engine, scheduler and runner for an agent, the engine sized for the
longest conversation the agent says it makes (`engine_need`), or one row's.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import secrets
import threading
import zlib
from collections.abc import Callable
from typing import Any

import jax

from memagent_jax.distributed import collectives, startup
from memagent_jax.engine.engine_api import EngineConfig
from memagent_jax.engine.factory import build_engine
from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.engine.scheduler import Completion, Request, Scheduler
from memagent_jax.errors import ConfigError, UserError
from memagent_jax.models.qwen import Qwen
from memagent_jax.rollout.agent_api import (
    RECORD_KEYS,
    TURN_RECORD_KEYS,
    Reply,
    Rollout,
    Trajectory,
    check_info,
)
from memagent_jax.rollout.answers import final_answer
from memagent_jax.rollout.conversation import (
    Call,
    ChatPrompts,
    check_messages,
    conversation_turns,
)
from memagent_jax.rollout.rollouts import Limits, OnCall, OnDone, within
from memagent_jax.rollout.tool_calls import (
    call_template_vars,
    read_reply,
    reads_calls,
    rollout_call_ids,
)


def call_seed(seed: int, row: int, trajectory: int, call: int) -> tuple[int, int]:
    """(the sampling seed, the sample index) of a rollout's call (module docstring)."""
    key = f"{seed}/{row}/{trajectory if call else 0}/{call}"
    return zlib.crc32(key.encode()) & 0x7FFFFFFF, trajectory if call == 0 else 0


class AgentRunner:
    """Runs agents' rollouts on `scheduler` (module docstring), sampling with `params` (set by
    `with_params`). stop_ids end a reply; they, end-of-text and padding are dropped from its
    text."""
    params: Any = None
    fixed_sampling = False
    limits = Limits()

    def __init__(self, scheduler: Scheduler, tokenizer, stop_ids: tuple[int, ...]):
        self.scheduler, self.tokenizer, self.stop_ids = scheduler, tokenizer, tuple(stop_ids)
        self.not_reply = frozenset(stop_ids) | {
            t for t in (tokenizer.pad_token_id, tokenizer.eos_token_id) if t is not None}
        self.prompts = ChatPrompts(tokenizer, self.stop_ids)

    def with_params(self, params, fixed_sampling: bool = False) -> AgentRunner:
        """This runner (its scheduler and engine) sampling with `params`. fixed_sampling
        (training, whose learner scores tokens under the rollout's distribution): a call may
        not ask for another temperature, top-p or top-k than the run's."""
        runner = copy.copy(self)
        runner.params, runner.fixed_sampling = params, fixed_sampling
        return runner

    def with_limits(self, limits: Limits) -> AgentRunner:
        """This runner (its parameters too) running rollouts under `limits`
        (rollout/rollouts.py); a deadline on many processes is a UserError."""
        if limits.timeout_s is not None and startup.joined():
            raise UserError("rollout.timeout_s: deadlines read each process's clock, so the "
                            "processes of a multi-process run would cancel different "
                            "rollouts; unset it on many processes")
        runner = copy.copy(self)
        runner.limits = limits
        return runner

    def run(self, agent, rows: list, sampling: SamplingParams, n: int = 1,
            on_call: OnCall | None = None, on_done: OnDone | None = None
            ) -> list[list[Trajectory]]:
        """`Rollouts.run` (rollout/rollouts.py): n trajectories of every row, sampled with
        `self.params` and `sampling` (a call may ask for another temperature, top-p or top-k
        unless `fixed_sampling`). A rollout that raises stops the run: its exception, with a
        note naming the agent and the row."""
        run = _Run(self, agent, rows, sampling, n, on_call, on_done)
        try:
            return run_coroutine(run.main)
        except BaseException:
            self.scheduler.clear()
            raise

    def reply(self, call: Call, completion: Completion) -> Reply:
        said = [t for t in completion.token_ids if t not in self.not_reply]
        return Reply(self.tokenizer.decode(said, skip_special_tokens=True),
                     completion.finish_reason, completion.token_ids, completion.logprobs,
                     call.prompt_ids)


@dataclasses.dataclass(eq=False)
class _Queued:
    """A chat call waiting to be submitted, with its sampling (its own seed)."""
    row: int
    call: Call
    sampling: SamplingParams
    first_index: int
    future: asyncio.Future
    request_id: int = -1  # the scheduler's, once submitted


class EnginePolicy:
    """The policy handle of one rollout on the engine (`agent_api.Policy`)."""
    takes_ids = True

    def __init__(self, run: _Run, row: int, index: int):
        self._run, self.row, self.index = run, row, index
        self.tokenizer = run.runner.tokenizer
        self.calls: dict[Reply, Call] = {}
        self._made: list[Call] = []

    @property
    def max_len(self) -> int:
        """The engine's most tokens a call's prompt and reply may take together."""
        return self._run.runner.scheduler.engine.max_len

    async def chat(self, messages: list[dict] | None = None, *, max_tokens: int,
                   prompt_ids: list[int] | None = None, temperature: float | None = None,
                   top_p: float | None = None, top_k: int | None = None,
                   tools: list[dict] | None = None, tool_choice: str | None = None,
                   **template_vars) -> Reply:
        runner = self._run.runner
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        sampling = self._run.sampling_of(temperature, top_p, top_k)
        template_vars = call_template_vars(template_vars, tools, tool_choice)
        if prompt_ids is None:
            ids, parent = runner.prompts.prompt(messages, template_vars, self._made)
        else:
            ids, parent = list(prompt_ids), None
        seed, first_index = call_seed(self._run.seed, self.row, self.index, len(self._made))
        sampling = dataclasses.replace(sampling, seed=seed)
        runner.scheduler.check(Request(tuple(ids), max_tokens, sampling))
        call = Call(None if messages is None else list(messages), template_vars, ids, max_tokens,
                    parent)
        self._made.append(call)
        future = asyncio.get_running_loop().create_future()
        queued = _Queued(self.row, call, sampling, first_index, future)
        self._run.queue.append(queued)
        self._run.wake.set()
        try:
            completion = await future
        except asyncio.CancelledError:
            self._run.abandon(queued)
            raise
        call.reply = runner.reply(call, completion)
        if reads_calls(tools, tool_choice):
            read_reply(call.reply, rollout_call_ids(len(self._made) - 1))
        self.calls[call.reply] = call
        return call.reply

    async def once(self, fn: Callable, *args) -> Any:
        """fn(*args) computed on process 0 only, its (picklable) result on every process: for
        a tool or value that reads time, randomness or I/O (module docstring)."""
        future = asyncio.get_running_loop().create_future()
        self._run.once.append((functools.partial(fn, *args), future))
        self._run.wake.set()
        return await future


class _Run:
    """One `AgentRunner.run`."""

    def __init__(self, runner: AgentRunner, agent, rows, sampling, n, on_call, on_done):
        self.runner, self.agent, self.rows = runner, agent, rows
        self.seed = secrets.randbits(31) if sampling.seed is None else sampling.seed
        self.sampling, self.n, self.on_call, self.on_done = sampling, n, on_call, on_done
        self.name = getattr(agent, "name", None) or type(agent).__name__
        self.queue: list[_Queued] = []
        self.once: list[tuple[Callable, asyncio.Future]] = []
        self.failures: list[BaseException] = []
        self.left = [n] * len(rows)   # rollouts of each row not finished
        self.finished: list[int] = []  # rows whose rollouts all finished, not reported yet
        # Submitted requests by id, their calls (a group's first calls share one).
        self.submitted: dict[int, list[_Queued]] = {}

    def sampling_of(self, temperature, top_p, top_k) -> SamplingParams:
        """The run's sampling with a call's own values over it (None: the run's)."""
        given = {k: v for k, v in (("temperature", temperature), ("top_p", top_p),
                                   ("top_k", top_k)) if v is not None}
        if not given:
            return self.sampling
        if self.runner.fixed_sampling and any(getattr(self.sampling, k) != v
                                              for k, v in given.items()):
            raise ValueError(f"in training a call samples as rollout.* says (the learner "
                             f"scores its tokens under that distribution), not with {given}")
        if not (given.get("temperature", 0) >= 0 and 0 < given.get("top_p", 1) <= 1
                and given.get("top_k", 0) >= 0):
            raise ValueError(f"sampling out of range: {given}")
        return dataclasses.replace(self.sampling, **given)

    async def main(self) -> list[list[Trajectory]]:
        scheduler = self.runner.scheduler
        placed = scheduler.engine.place(self.runner.params)
        self.wake = asyncio.Event()
        self.gate = self.runner.limits.gate()
        tasks = [[asyncio.ensure_future(self._rollout(i, EnginePolicy(self, i, j)))
                  for j in range(self.n)] for i in range(len(self.rows))]
        flat = [t for group in tasks for t in group]
        for task in flat:
            task.add_done_callback(self._failed)
        try:
            while True:
                await asyncio.sleep(0)  # every ready rollout runs until it waits again
                if self.failures:
                    raise self.failures[0]
                self._report(tasks)
                self._flush()
                if scheduler.step(placed):
                    continue
                pending = [t for t in flat if not t.done()]
                if not pending and not self.queue and not self.once:
                    self._report(tasks)
                    break
                if not self.queue and not self.once:
                    # Rollouts wait on something else than the engine (a tool on a thread).
                    self.wake.clear()
                    waiter = asyncio.ensure_future(self.wake.wait())
                    await asyncio.wait(pending + [waiter],
                                       return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
        finally:
            for task in flat:
                task.cancel()
            await asyncio.gather(*flat, return_exceptions=True)
        return [[t.result() for t in group] for group in tasks]

    def _failed(self, task: asyncio.Task) -> None:
        if not task.cancelled() and (error := task.exception()) is not None:
            self.failures.append(error)

    async def _rollout(self, i: int, policy: EnginePolicy) -> Trajectory:
        row = self.rows[i]
        try:
            result, timed_out = await within(self.runner.limits, self.gate,
                                             lambda: self.agent.rollout(row, policy))
            trajectory = (Trajectory(problem_of(row), timed_out=True) if timed_out
                          else trajectory_of(result, policy.calls, row))
        except Exception as e:
            e.add_note(f"in agent {self.name}, rollout {policy.index} of row {i}")
            raise
        self.left[i] -= 1
        if not self.left[i]:
            self.finished.append(i)
        return trajectory

    def _report(self, tasks) -> None:
        """on_done for the rows whose rollouts have all finished since the last report."""
        finished, self.finished = self.finished, []
        if self.on_done is not None:
            for i in finished:
                self.on_done(i, [t.result() for t in tasks[i]])

    def _flush(self) -> None:
        """Computes the `once` values waiting, then submits the queued calls, a group's
        identical first calls as one request (after checking that every process queued the
        same ones)."""
        if self.once:
            waiting, self.once = self.once, []
            values = collectives.on_main(lambda: [fn() for fn, _ in waiting])
            for (_, future), value in zip(waiting, values):
                if not future.done():  # its rollout was cancelled meanwhile
                    future.set_result(value)
        if not self.queue:
            return
        queued, self.queue = self.queue, []
        self._check_same_calls(queued)
        # A group's identical first calls (one row, seed and prompt; samples j, j+1, ...)
        # are one request, in the order the first of them was queued.
        same: dict[tuple, list[_Queued]] = {}
        for q in queued:
            key = (q.row, q.sampling, q.call.max_tokens, tuple(q.call.prompt_ids))
            same.setdefault(key, []).append(q)
        groups: list[list[_Queued]] = []
        for calls in same.values():
            for q in sorted(calls, key=lambda q: q.first_index):
                last = groups[-1][-1] if groups and groups[-1][0] in calls else None
                if last is not None and q.first_index == last.first_index + 1:
                    groups[-1].append(q)
                else:
                    groups.append([q])
        runner = self.runner
        for group in groups:
            head = group[0]
            request = Request(tuple(head.call.prompt_ids), head.call.max_tokens, head.sampling,
                              runner.stop_ids, len(group), head.first_index)
            request_id = runner.scheduler.submit(request,
                                                 functools.partial(self._answered, group))
            self.submitted[request_id] = group
            for q in group:
                q.request_id = request_id

    def _answered(self, group: list[_Queued], completions: list[Completion]) -> None:
        self.submitted.pop(group[0].request_id, None)
        for q, completion in zip(group, completions):
            if q.future.cancelled():  # its rollout passed its deadline
                continue
            q.future.set_result(completion)
            if self.on_call is not None:
                self.on_call(q.row)

    def abandon(self, queued: _Queued) -> None:
        """A call whose rollout was cancelled (its deadline): dropped from the queue, or its
        request cancelled once no call of it waits (its slots free for the next step)."""
        if queued in self.queue:
            self.queue.remove(queued)
            return
        group = self.submitted.get(queued.request_id)
        if group is not None and all(q.future.cancelled() for q in group):
            del self.submitted[queued.request_id]
            self.runner.scheduler.cancel(queued.request_id)

    def _check_same_calls(self, queued: list[_Queued]) -> None:
        if not startup.joined():
            return
        digest = zlib.crc32(repr([(q.row, q.sampling, q.first_index, q.call.max_tokens,
                                   q.call.prompt_ids) for q in queued]).encode())
        digests = collectives.gather((len(queued), digest))
        if any(d != digests[0] for d in digests):
            raise UserError(f"agent {self.name}: the processes asked the engine for different "
                            f"calls ({digests}, calls and digest per process): an agent or tool "
                            "that reads time, randomness or I/O must compute it once, with "
                            "`await policy.once(fn, *args)`")


def trajectory_of(result, calls: dict[Reply, Call], row) -> Trajectory:
    """A rollout of `row`'s result (a `Rollout` or a bare list of conversations) as its
    Trajectory: each conversation's rows (`conversation_turns`), the final one's labelled
    "final" and its last reply's answer, the agent's metrics and info. Anything else, a
    conversation that is no list of chat messages, or one that holds no reply of this rollout's
    calls (nothing in it is trained), is a UserError saying which (the runner names the agent
    and the row)."""
    rollout = result if isinstance(result, Rollout) else Rollout(result)
    conversations = rollout.conversations
    if not isinstance(conversations, list) or not conversations:
        shown = "None" if result is None else f"a {type(result).__name__} ({result!r:.80})"
        raise UserError(f"the rollout returned {shown}, not its conversations: an agent "
                        "returns a Rollout or a non-empty list of conversations (lists of chat "
                        "messages, its replies among them)")
    if not -len(conversations) <= rollout.final < len(conversations):
        raise UserError(f"Rollout.final {rollout.final} is not a conversation's index (there "
                        f"are {len(conversations)})")
    final = rollout.final % len(conversations)
    check_info(rollout.info, "Rollout.info", RECORD_KEYS)
    turns = []
    for k, conversation in enumerate(conversations):
        check_messages(conversation, f"conversation {k}")
        check_info(getattr(conversation, "info", {}), f"conversation {k}'s info",
                   TURN_RECORD_KEYS)
        rows = conversation_turns(conversation, calls, "final" if k == final else "turn")
        if not rows:
            raise UserError(f"conversation {k} holds no reply of this rollout's chat calls (the "
                            "assistant messages policy.chat returned: reply.message), so "
                            "nothing in it would be trained")
        turns += rows
    trajectory = Trajectory(problem_of(row), turns, metrics=dict(rollout.metrics),
                            info=dict(rollout.info))
    trajectory.answer = final_answer(trajectory.final_reply)
    return trajectory


def problem_of(row) -> str:
    """The question a row asks, for the trajectory's record."""
    for name in ("question", "problem"):
        value = getattr(row, name, None)
        if isinstance(value, str):
            return value
    return ""


def run_coroutine(main: Callable):
    """main() on a new event loop: in this thread, or, where this thread already runs one (a
    notebook), in a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    outcome: dict = {}

    def target():
        try:
            outcome["result"] = asyncio.run(main())
        except BaseException as e:  # raised again on the caller's thread
            outcome["error"] = e

    thread = threading.Thread(target=target, name="rollouts")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def replay(agent, row, answer: Callable[[int, list[dict] | None], list[int]], tokenizer,
           stop_ids: tuple[int, ...]) -> Trajectory:
    """The trajectory `agent` makes of `row` when its call k is answered with the ids
    `answer(k, the call's messages)` (each ending with a stop id) instead of the engine's
    sample: its prompts and continuations exactly as the runner builds them, log-probs 0. What
    a supervised step trains an agent's own conversations on."""
    policy = _ReplayPolicy(answer, tokenizer, stop_ids)
    result = run_coroutine(lambda: agent.rollout(row, policy))
    return trajectory_of(result, policy.calls, row)


class _ReplayPolicy:
    """`replay`'s handle: `EnginePolicy`'s prompts, given replies (no engine: no max_len)."""
    takes_ids = True
    max_len = None

    def __init__(self, answer, tokenizer, stop_ids):
        self.answer, self.tokenizer, self.stop_ids = answer, tokenizer, tuple(stop_ids)
        self.not_reply = frozenset(stop_ids) | {
            t for t in (tokenizer.pad_token_id, tokenizer.eos_token_id) if t is not None}
        self.prompts = ChatPrompts(tokenizer, self.stop_ids)
        self.calls: dict[Reply, Call] = {}
        self._made: list[Call] = []

    async def chat(self, messages=None, *, max_tokens, prompt_ids=None, temperature=None,
                   top_p=None, top_k=None, tools=None, tool_choice=None, **template_vars):
        template_vars = call_template_vars(template_vars, tools, tool_choice)
        if prompt_ids is None:
            ids, parent = self.prompts.prompt(messages, template_vars, self._made)
        else:
            ids, parent = list(prompt_ids), None
        call = Call(None if messages is None else list(messages), template_vars, ids,
                    max_tokens, parent)
        self._made.append(call)
        tokens = list(self.answer(len(self._made) - 1, call.messages))
        said = [t for t in tokens if t not in self.not_reply]
        call.reply = Reply(self.tokenizer.decode(said, skip_special_tokens=True),
                           "stop" if tokens and tokens[-1] in self.stop_ids else "length",
                           tokens, [0.0] * len(tokens), ids)
        if reads_calls(tools, tool_choice):
            read_reply(call.reply, rollout_call_ids(len(self._made) - 1))
        self.calls[call.reply] = call
        return call.reply

    async def once(self, fn: Callable, *args) -> Any:
        return fn(*args)


def build_runner(agent, model: Qwen, tokenizer, engine: EngineConfig,
                 mesh: jax.sharding.Mesh | None, stop_ids: tuple[int, ...],
                 row=None) -> AgentRunner:
    """An AgentRunner for `agent` on its own scheduler and engine, after `agent.setup`; the
    engine sized for the longest conversation the agent makes (`engine_need`), or with `row`
    for that row's alone (`run`: a short document under a large budget needs no larger cache),
    unless `engine.max_len` is set. An `engine.max_len` below what an agent's `engine_need`
    says its conversations take is a ConfigError naming it, before an engine is built (a
    `max_len(tokenizer)` is a bound, which `run --agent ... --max-len` may lower)."""
    if hasattr(agent, "setup"):
        agent.setup(tokenizer, stop_ids)
    tokens, key, why = engine_need(agent, tokenizer, engine, row)
    if engine.max_len is not None and engine.max_len < tokens and hasattr(agent, "engine_need"):
        raise ConfigError("engine.max_len", f"{engine.max_len} is below the agent's longest "
                                            f"turn: {key} {why}")
    decoder = build_engine(model, engine, mesh, tokens, key, why)
    return AgentRunner(Scheduler(decoder), tokenizer, stop_ids)


def engine_need(agent, tokenizer, engine: EngineConfig, row=None) -> tuple[int, str, str]:
    """(KV entries the agent's longest conversation needs, the setting that asks for them, how
    it makes them): the agent's `engine_need(tokenizer)` (with `row`: `engine_need(tokenizer,
    row)`, that row's), else its `max_len(tokenizer)`. An agent that says neither is a
    ConfigError unless `engine.max_len` is set."""
    if hasattr(agent, "engine_need"):
        return agent.engine_need(tokenizer) if row is None else agent.engine_need(tokenizer, row)
    if hasattr(agent, "max_len"):
        tokens = agent.max_len(tokenizer)
        return tokens, "agent", f"{agent.name} makes conversations of up to {tokens} tokens"
    if engine.max_len is None:
        raise ConfigError("engine.max_len", f"must be set: agent {agent.name} does not say "
                                            "how long its conversations get (it defines no "
                                            "max_len(tokenizer))")
    return engine.max_len, "engine.max_len", str(engine.max_len)
