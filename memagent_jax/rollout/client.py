"""An OpenAI-compatible chat-completions server as a policy handle (`run --url`, `eval` with
`model.url`).

`ServerPolicy` is `agent_api.Policy` against a server: each `chat` call is one HTTP request
(on a thread, so many rollouts' requests are in flight at once), as the original's evaluation
sends its turns to vLLM or a hosted model. A chat API takes text, so its replies have text and
no token ids, and an agent that splices ids (MemAgent) runs in text against it
(`policy.takes_ids` is False). `run_on_server` runs an agent's rollouts with it;
`ServerRollouts` is the rollout contract (rollout/rollouts.py) on it. The URL is
the API base (".../v1", or an Azure deployment URL); the key comes from the environment
(`api_key_from_env`).

A rollout means here what it means on the engine (`rollout/runner.py`): a call whose messages
continue an earlier call's extends that call's conversation (`conversation.continued`), so a
conversation of several calls is one turn whose reply is its last, and the final answer is read
from it; and every call asks for the seed the engine samples it with (`server_seed`), so
greedy rollouts, and sampled ones of one sample a row, are the engine's where the server
samples as ours does.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import secrets
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from memagent_jax.errors import UserError
from memagent_jax.rollout.agent_api import Reply, Trajectory
from memagent_jax.rollout.conversation import Call, continued
from memagent_jax.rollout.rollouts import Limits, OnCall, OnDone, within
from memagent_jax.rollout.runner import call_seed, problem_of, run_coroutine, trajectory_of
from memagent_jax.rollout.tool_calls import (
    call_template_vars,
    read_reply,
    reads_calls,
    with_calls,
)

# Where the client reads its key, first set (non-empty) first: the project's own variable,
# which `serve` reads too, then the original MemAgent quickstart's (and this command's before
# MEMAGENT_API_KEY). Not OPENAI_API_KEY: a key for api.openai.com kept in a shell profile
# would otherwise be sent to whatever --url names, over plain http too; to use it here, say
# so: MEMAGENT_API_KEY=$OPENAI_API_KEY.
API_KEY_VARIABLES = ("MEMAGENT_API_KEY", "API_KEY")


def api_key_from_env() -> str | None:
    """The API key for the server: the first of API_KEY_VARIABLES set; None: no key."""
    return next(filter(None, map(os.environ.get, API_KEY_VARIABLES)), None)


@dataclasses.dataclass(frozen=True)
class Server:
    """Where and how to ask: the API base URL, the served model's name, the key (None: none
    sent), seconds per request, and the sampling every call uses."""
    url: str
    model: str
    api_key: str | None = None
    timeout: float = 300.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0              # 0: not sent (off)


def chat(server: Server, messages: list[dict], *, max_tokens: int, seed: int | None = None,
         template_vars: dict | None = None, tool_choice: str | None = None) -> dict:
    """One chat completion: its first choice ({"message": {"content", "tool_calls"},
    "finish_reason"}), with the response's "usage" when the server reports it. template_vars:
    the chat template's extra variables, sent as "chat_template_kwargs" (vLLM's field; `tools`
    as OpenAI's own top-level field, with tool_choice). Raises OSError/ValueError on
    failure."""
    request = {"model": server.model, "messages": messages, "max_tokens": max_tokens,
               "temperature": server.temperature, "top_p": server.top_p}
    if server.top_k:
        request["top_k"] = server.top_k  # vLLM's, and ours
    if seed is not None:
        request["seed"] = seed
    template_vars = dict(template_vars or {})
    if "tools" in template_vars:
        request["tools"] = template_vars.pop("tools")
    if tool_choice is not None:
        request["tool_choice"] = tool_choice
    if template_vars:
        request["chat_template_kwargs"] = template_vars
    body = json.dumps(request).encode()
    headers = {"Content-Type": "application/json"}
    if server.api_key:
        headers["Authorization"] = f"Bearer {server.api_key}"
        headers["api-key"] = server.api_key  # Azure OpenAI reads this header instead
    call = urllib.request.Request(server.url.rstrip("/") + "/chat/completions", body, headers)
    with urllib.request.urlopen(call, timeout=server.timeout) as response:
        payload = json.loads(response.read())
    return {**payload["choices"][0], "usage": payload.get("usage")}


def server_seed(seed: int, row: int, trajectory: int, call: int) -> int:
    """The seed a server is asked for on call `call` of rollout `trajectory` of row `row` of a
    run seeded `seed`: the engine's (`runner.call_seed`), so the call draws what it draws on
    the engine. Except a row's first calls after its first rollout's, which the engine draws
    as samples 1, 2, ... of one request and a one-sample request cannot ask for: the seed plus
    the sample's index, a draw of their own."""
    value, sample = call_seed(seed, row, trajectory, call)
    return (value + sample) & 0x7FFFFFFF


class ServerPolicy:
    """The handle of rollout `index` of row `row` on a server, in a run seeded `seed` (module
    docstring). The server's context length is its own: a prompt too long for it is its
    HTTP error, not `PromptTooLong` (max_len None)."""
    takes_ids = False
    max_len = None

    def __init__(self, server: Server, tokenizer, seed: int, row: int = 0, index: int = 0,
                 on_call: Callable[[], None] | None = None):
        self.server, self.tokenizer, self.on_call = server, tokenizer, on_call
        self.seed, self.row, self.index = seed, row, index
        self.calls: dict[Reply, Call] = {}
        self._made: list[Call] = []

    async def chat(self, messages: list[dict] | None = None, *, max_tokens: int,
                   prompt_ids: list[int] | None = None, temperature: float | None = None,
                   top_p: float | None = None, top_k: int | None = None,
                   tools: list[dict] | None = None, tool_choice: str | None = None,
                   **template_vars) -> Reply:
        if messages is None:
            raise ValueError("a server takes chat messages, not prompt_ids alone")
        template_vars = call_template_vars(template_vars, tools, tool_choice)
        given: dict[str, Any] = {k: v for k, v in (("temperature", temperature),
                                                   ("top_p", top_p), ("top_k", top_k))
                                 if v is not None}
        server = dataclasses.replace(self.server, **given) if given else self.server
        seed = server_seed(self.seed, self.row, self.index, len(self._made))
        call = Call(list(messages), template_vars, [], max_tokens,
                    continued(messages, template_vars, self._made))
        self._made.append(call)
        number, url = len(self._made), self.server.url
        try:
            choice = await asyncio.to_thread(chat, server, list(messages),
                                             max_tokens=max_tokens, seed=seed,
                                             template_vars=template_vars,
                                             tool_choice=tool_choice)
            text = choice["message"]["content"] or ""
            given_calls = choice["message"].get("tool_calls") or []
        except urllib.error.HTTPError as e:
            raise UserError(f"{url}: call {number}: server answered HTTP {e.code} {e.reason}"
                            f"{_server_message(e)}{_key_hint(e.code, self.server.api_key)}"
                            ) from None
        except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
            raise UserError(f"{url}: call {number}: request failed ({type(e).__name__}: {e})"
                            ) from None
        usage = choice.get("usage") or {}
        call.reply = Reply(text, choice.get("finish_reason") or "",
                           completion_tokens=usage.get("completion_tokens"))
        if given_calls:  # the server's parser read them
            with_calls(call.reply, text, given_calls, None)
        elif reads_calls(tools, tool_choice):  # ours reads what it left as text
            read_reply(call.reply)
        self.calls[call.reply] = call
        if self.on_call is not None:
            self.on_call()
        return call.reply

    async def once(self, fn: Callable, *args):
        return fn(*args)


def run_on_server(server: Server, agent, rows: list, seed: int, n: int = 1,
                  concurrency: int = 32, on_call: Callable[[int], None] | None = None,
                  on_done: Callable[[int, list[Trajectory]], None] | None = None,
                  limits: Limits = Limits()) -> list[list[Trajectory]]:
    """n rollouts of every row on `server`, seeded `seed` as `AgentRunner.run` seeds them
    (`server_seed`), at most `concurrency` of them at once (and `limits`, rollout/rollouts.py);
    the trajectories of every row, in order. on_call(i) after each reply; on_done(i,
    trajectories) once row i's rollouts have all finished. A failed request raises its
    UserError."""
    async def main():
        gate = asyncio.Semaphore(min(concurrency, limits.max_concurrent or concurrency))
        left = [n] * len(rows)
        results: list[list] = [[None] * n for _ in rows]

        async def one(i: int, j: int):
            policy = ServerPolicy(server, None, seed, i, j, on_call and (lambda: on_call(i)))
            result, timed_out = await within(limits, gate,
                                             lambda: agent.rollout(rows[i], policy))
            results[i][j] = (Trajectory(problem_of(rows[i]), timed_out=True) if timed_out
                             else trajectory_of(result, policy.calls, rows[i]))
            left[i] -= 1
            if not left[i] and on_done is not None:
                on_done(i, results[i])

        tasks = [asyncio.ensure_future(one(i, j)) for i in range(len(rows)) for j in range(n)]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
        return results

    return run_coroutine(main)


def _server_message(error: urllib.error.HTTPError) -> str:
    """": " and the server's own explanation of an error response, on one line: OpenAI's
    {"error": {"message": ...}} (ours, vLLM's), or a top-level "message" (older vLLM);
    "" when the body says nothing readable."""
    try:
        body = json.loads(error.read())
    except (OSError, ValueError):
        return ""
    detail = body.get("error", body) if isinstance(body, dict) else None
    message = detail.get("message") if isinstance(detail, dict) else detail
    if not isinstance(message, str) or not message.strip():
        return ""
    return ": " + " ".join(message.split())[:500]


def _key_hint(status: int, api_key: str | None) -> str:
    """For a 401: which variable to set, and where the refused key came from."""
    if status != 401:
        return ""
    if not api_key:  # as chat() sends it
        sent = "no key was sent"
    else:
        sent = next((f"the key sent was {v}'s" for v in API_KEY_VARIABLES
                     if os.environ.get(v) == api_key), "a key was sent")
    return f"; set {API_KEY_VARIABLES[0]} to the server's key ({sent})"


class ServerRollouts:
    """`Rollouts` (rollout/rollouts.py) against `server`: `run_on_server` with the run's
    sampling, at most `concurrency` rollouts at once, each call seeded from `sampling.seed`
    (None: a fresh one) as the engine seeds it (`server_seed`)."""

    limits = Limits()

    def __init__(self, server: Server, concurrency: int = 32):
        self.server, self.concurrency = server, concurrency

    def with_limits(self, limits: Limits) -> ServerRollouts:
        """These rollouts under `limits` (rollout/rollouts.py)."""
        rollouts = ServerRollouts(self.server, self.concurrency)
        rollouts.limits = limits
        return rollouts

    def run(self, agent, rows: list, sampling, n: int = 1, on_call: OnCall | None = None,
            on_done: OnDone | None = None) -> list[list[Trajectory]]:
        server = dataclasses.replace(self.server, temperature=sampling.temperature,
                                     top_p=sampling.top_p, top_k=sampling.top_k)
        seed = secrets.randbits(31) if sampling.seed is None else sampling.seed
        return run_on_server(server, agent, rows, seed, n, self.concurrency, on_call, on_done,
                             self.limits)
