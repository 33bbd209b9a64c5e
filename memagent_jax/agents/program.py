"""Any program as an agent (`agent: {module: memagent_jax.agents.program, command: [python,
my_app.py]}`): an unmodified OpenAI-client program, trained through its base URL.

Each rollout runs `command` once, with
- `OPENAI_BASE_URL` pointing at an OpenAI-compatible endpoint of this rollout's own
  (`http://127.0.0.1:PORT/v1`, loopback only, a free port; `POST /v1/chat/completions`, `GET
  /v1/models`), and `OPENAI_API_KEY` a key made for the rollout (the endpoint refuses others);
- the row as JSON on its standard input (a data row's fields as read: `prompt`,
  `reward_model`, `extra_info`, ...).

Each chat completion it asks for is one `policy.chat` of the rollout: requests are read with
`serve`'s own parser (serve/protocol.py: what `serve` refuses, this endpoint refuses, with the
same 400), sampled on the engine with the run's sampling and a seed per call (a request's
`temperature`, `top_p`, `top_k` are honoured where the run allows: not in training, where a
different value is a 400; its `seed` is not: the call's seed is the run's), and recorded with
the generated ids and their behaviour log-probs. Calls whose messages continue an earlier
call's (its messages, its reply, then more) form one conversation, the others are
conversations of their own (rollout/conversation.py, as for an agent written as a function);
the reward reads the last call's reply. `tools` are `policy.chat`'s (rollout/tool_calls.py):
a reply's calls come back as `tool_calls` with `finish_reason: "tool_calls"`, and `tool`
messages answer them; the calls the replies make (a reply whose calls do not parse one) and
those that do not parse are counted (`agent/tool_calls`, `agent/tool_parse_errors`, as the
shipped tool agent counts them). `max_tokens` (or `max_completion_tokens`) caps a reply,
`agent.max_tokens` where a request gives neither; `n` above 1, `stream`, `stop`, `logprobs`,
`ignore_eos`, `return_tokens_as_token_ids` and `chat_template_kwargs` naming a call's own
argument are 400s (a reply is sampled and recorded as the run samples it, never cut otherwise).
A request that fails on our side is a 500 to the program and stops the run with its error.

A program that exits non-zero, writes a Python traceback on its standard error, or makes no
chat call stops the run with one line naming the command, the row and the end of its standard
error (as a rollout that raises does, and a reward function that fails does: the step is not
applied; the checkpoint before it is where to resume). A program still running at the run's
deadline (`rollout.timeout_s`) is killed and its rollout masked as a timed-out one.

`preload` (a list of modules, e.g. `[openai]`) runs a Python program from a fork server
(agents/fork_server.py) that imported them once: the command must then be `[PYTHON, SCRIPT,
ARGS...]` (or `-m MODULE`, `-c CODE` in SCRIPT's place), and each rollout forks a child that
runs it as that command would, with the same environment, input and error stream, so that a
rollout does not pay the program's imports again (`import openai` is ~1 s of CPU).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import json
import os
import secrets
import shlex
import tempfile
import time
from typing import Any, ClassVar

from memagent_jax.agents.fork_server import ForkServer, kill
from memagent_jax.errors import ConfigError, UserError
from memagent_jax.rollout.agent_api import Policy, PromptTooLong, Reply, Rollout
from memagent_jax.rollout.conversation import is_reply
from memagent_jax.runconfig import at_least, build_section
from memagent_jax.serve.protocol import APIError, bad, parse_chat

_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
            405: "Method Not Allowed", 500: "Internal Server Error"}
# policy.chat's own arguments, which a request's chat_template_kwargs must not name.
_CHAT_ARGUMENTS = frozenset(inspect.signature(Policy.chat).parameters) - {"self", "template_vars"}
# How long a cancelled rollout waits for the fork server to say which child is its own.
_SERVER_ANSWERS_S = 30.0
# What marks a Python program's uncaught exception on its standard error.
_TRACEBACK = "Traceback (most recent call last):"


@dataclasses.dataclass(frozen=True)
class ProgramSection:
    """The `agent` section's keys besides `module`."""
    SECTION: ClassVar[str] = "agent"
    command: tuple[str, ...] = ()   # the program and its arguments (a list), run per rollout
    max_tokens: int = 1024          # a reply's cap where a request gives none
    max_length: int = 4096          # the most tokens a conversation reaches (sizes the engine)
    preload: tuple[str, ...] = ()   # modules a fork server imports once (module docstring)

    def __post_init__(self):
        if not self.command or not all(isinstance(a, str) and a for a in self.command):
            raise ConfigError("agent.command", f"must be the program and its arguments, a "
                                               f"non-empty list of strings, got "
                                               f"{list(self.command)!r}")
        at_least(self, 1, "max_tokens", "max_length")
        if not all(isinstance(m, str) and m.replace(".", "_").isidentifier()
                   for m in self.preload):
            raise ConfigError("agent.preload", f"must be a list of module names, got "
                                               f"{list(self.preload)!r}")
        runs = self.command[1:2]
        if self.preload and (not runs or (runs[0].startswith("-") and (
                runs[0] not in ("-m", "-c") or len(self.command) < 3))):
            raise ConfigError("agent.preload", f"runs agent.command as [PYTHON, SCRIPT, "
                                               f"ARGS...] (or -m MODULE, -c CODE in SCRIPT's "
                                               f"place), got {list(self.command)!r}")


class Program:
    """The agent (module docstring)."""

    def __init__(self, section: ProgramSection):
        self.section = section
        self.shown = shlex.join(section.command)
        self.name = f"program `{self.shown}`"
        self._fork_server: ForkServer | None = None

    def max_len(self, tokenizer) -> int:
        return self.section.max_length

    async def rollout(self, row, policy) -> Rollout:
        endpoint = _Endpoint(policy, self.section.max_tokens)
        server = await asyncio.start_server(endpoint.connection, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        env = {**os.environ, "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
               "OPENAI_API_KEY": endpoint.key}
        where = f"agent program `{self.shown}` on row {_row_name(row)}"
        run = self._forked if self.section.preload else self._spawned
        try:
            returncode, error = await run(env, json.dumps(_row_json(row)).encode(), where)
        finally:
            server.close()
            endpoint.close()
        if endpoint.failure is not None:
            raise endpoint.failure
        if returncode or _TRACEBACK in error:
            how = f"exited with status {returncode}" if returncode else "wrote a traceback"
            raise UserError(f"{where}: {how}{_last_line(error)}")
        if not endpoint.calls:
            raise UserError(f"{where}: made no chat completion at {env['OPENAI_BASE_URL']} "
                            "(does it read OPENAI_BASE_URL?)")
        replies = [reply for _, reply in endpoint.calls]
        return Rollout(_conversations(endpoint.calls), metrics={
            "tool_calls": float(sum(len(r.tool_calls or ()) + (r.tool_error is not None)
                                    for r in replies)),
            "tool_parse_errors": float(sum(r.tool_error is not None for r in replies))})

    async def _spawned(self, env: dict, row: bytes, where: str) -> tuple[int, str]:
        """The command's exit status and standard error, run as a process of its own."""
        try:
            process = await asyncio.create_subprocess_exec(
                *self.section.command, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env,
                start_new_session=True)  # its own processes die with it at the deadline
        except OSError as e:
            raise UserError(f"{where}: cannot start it ({e.strerror or e})") from None
        try:
            _, stderr = await process.communicate(row)
        finally:
            if process.returncode is None:  # cancelled (the run's deadline): killed
                kill(process.pid)  # (and so its processes, which hold its stderr open)
                await process.wait()
        return process.returncode or 0, stderr.decode(errors="replace")

    async def _forked(self, env: dict, row: bytes, where: str) -> tuple[int, str]:
        """The same, run as a child of the fork server (started at the first rollout)."""
        if self._fork_server is None:
            command = self.section.command
            path0 = ("" if command[1] == "-c" else os.getcwd() if command[1] == "-m" else
                     os.path.dirname(os.path.realpath(command[1])))
            try:
                self._fork_server = ForkServer(command[0], path0, self.section.preload)
            except OSError as e:
                raise UserError(f"{where}: cannot start its fork server "
                                f"({e.strerror or e})") from None
        server = self._fork_server
        loop = asyncio.get_running_loop()
        started, ended = loop.create_future(), loop.create_future()
        with tempfile.TemporaryDirectory(prefix="memagent-jax-program-") as files:
            stdin, stderr = os.path.join(files, "stdin"), os.path.join(files, "stderr")
            with open(stdin, "wb") as f:
                f.write(row)
            server.start(list(self.section.command[1:]), env, os.getcwd(), stdin, stderr,
                         _settles(loop, started), _settles(loop, ended))
            try:
                status = await asyncio.shield(ended)
            finally:
                if not ended.done():  # cancelled (the run's deadline): killed
                    try:
                        pid = await asyncio.wait_for(asyncio.shield(started), _SERVER_ANSWERS_S)
                    except TimeoutError:  # a server that no longer answers (still importing?)
                        server.stop()
                    else:
                        if pid is not None:
                            kill(pid)
                    await ended
            if status is None:
                raise UserError(f"agent.preload: the fork server of `{self.shown}` "
                                f"{server.error}")
            with open(stderr, "rb") as f:
                return status, f.read().decode(errors="replace")


def _settles(loop: asyncio.AbstractEventLoop, future: asyncio.Future):
    """A callback for another thread that settles `future` on its loop (once; not after the
    loop closed)."""
    def settle(value) -> None:
        def on_loop() -> None:
            if not future.done():
                future.set_result(value)
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
            loop.call_soon_threadsafe(on_loop)
    return settle


class _Endpoint:
    """The rollout's OpenAI-compatible endpoint (module docstring): HTTP/1.1 with keep-alive
    on asyncio streams, each chat completion a `policy.chat`."""

    def __init__(self, policy, max_tokens: int):
        self.policy, self.max_tokens = policy, max_tokens
        self.key = "rollout-" + secrets.token_hex(16)
        self.calls: list[tuple[list[dict], Reply]] = []
        self._writers: set[asyncio.StreamWriter] = set()
        self.failure: Exception | None = None  # the first request that failed on our side

    def close(self) -> None:
        for writer in self._writers:
            writer.close()

    async def connection(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                try:
                    request = await _read_request(reader)
                except ValueError:  # a request line or Content-Length that does not parse
                    await _respond(writer, bad("a malformed HTTP request"))
                    break
                if request is None:
                    break
                method, path, headers, body = request
                try:
                    await _respond(writer, await self._answer(method, path, headers, body))
                except APIError as e:
                    await _respond(writer, e)
                except Exception as e:  # a fault of ours, not the program's: the run stops on it
                    self.failure = self.failure or e
                    await _respond(writer, APIError(500, f"{type(e).__name__}: {e}"))
                if headers.get("connection", "").lower() == "close":
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _answer(self, method: str, path: str, headers: dict, body: bytes) -> dict:
        if headers.get("authorization") != f"Bearer {self.key}":
            raise APIError(401, "Incorrect API key provided: use OPENAI_API_KEY",
                           code="invalid_api_key")
        path = path.split("?")[0].rstrip("/")
        if path == "/v1/models" and method == "GET":
            return {"object": "list", "data": [{"id": "policy", "object": "model",
                                                "owned_by": "memagent-jax"}]}
        if path != "/v1/chat/completions":
            raise APIError(404, f"no route {method} {path} (this endpoint serves "
                                "/v1/chat/completions and /v1/models)")
        if method != "POST":
            raise APIError(405, f"{method} {path}: use POST")
        try:
            raw = json.loads(body)
        except ValueError as e:
            raise bad(f"the request body is not JSON ({e})") from None
        gen = parse_chat(raw, max_top_logprobs=0)
        if gen.n != 1 or gen.stream:
            raise bad("one choice, not streamed: an agent's call is one reply",
                      "n" if gen.n != 1 else "stream")
        asked = [key for key, on in (("stop", gen.stop), ("logprobs", gen.logprobs),
                                     ("ignore_eos", gen.ignore_eos),
                                     ("return_tokens_as_token_ids", gen.tokens_as_ids)) if on]
        if asked:
            raise bad(f"'{asked[0]}' is not taken by a rollout's endpoint: a reply is sampled "
                      "and recorded as the run samples it", asked[0])
        clash = sorted(set(gen.template_vars) & _CHAT_ARGUMENTS)
        if clash:
            raise bad(f"chat_template_kwargs: '{clash[0]}' is one of the call's own arguments",
                      "chat_template_kwargs")
        messages = list(gen.prompts[0])
        sampling = {k: getattr(gen, k) for k in ("temperature", "top_p", "top_k") if k in raw}
        try:
            reply = await self.policy.chat(messages, max_tokens=gen.max_tokens or self.max_tokens,
                                           tools=gen.tools, tool_choice=gen.tool_choice,
                                           **sampling, **gen.template_vars)
        except PromptTooLong as e:
            raise bad(str(e), "messages", "context_length_exceeded") from None
        except (ValueError, UserError) as e:
            raise bad(str(e)) from None
        self.calls.append((messages, reply))
        usage = None
        if reply.token_ids is not None and reply.prompt_ids is not None:
            usage = {"prompt_tokens": len(reply.prompt_ids),
                     "completion_tokens": len(reply.token_ids),
                     "total_tokens": len(reply.prompt_ids) + len(reply.token_ids)}
        return {"id": f"chatcmpl-{secrets.token_hex(12)}", "object": "chat.completion",
                "created": int(time.time()), "model": gen.model,
                "choices": [{"index": 0, **_choice(reply), "logprobs": None}],
                "usage": usage}


async def _respond(writer: asyncio.StreamWriter, answer: dict | APIError) -> None:
    """Writes a JSON response: `answer` with status 200, or the error's status and body."""
    status, payload = ((answer.status, answer.body()) if isinstance(answer, APIError)
                       else (200, answer))
    data = json.dumps(payload, ensure_ascii=False).encode()
    writer.write(f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\nContent-Type: "
                 f"application/json\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    await writer.drain()


def _choice(reply: Reply) -> dict:
    """The reply as a choice's message and finish reason: its calls as `tool_calls`
    (finish_reason "tool_calls", content the text before them or null), as `serve` answers."""
    if reply.tool_calls:
        return {"message": {"role": "assistant", "content": reply.message["content"] or None,
                            "tool_calls": reply.tool_calls}, "finish_reason": "tool_calls"}
    return {"message": {"role": "assistant", "content": reply.text},
            "finish_reason": reply.finish_reason}


async def _read_request(reader: asyncio.StreamReader
                        ) -> tuple[str, str, dict[str, str], bytes] | None:
    """(method, path, headers lower-cased, body) of the next request; None at the end."""
    line = await reader.readline()
    if not line.strip():
        return None
    method, path, _ = line.decode("latin-1").split(" ", 2)
    headers = {}
    while True:
        header = await reader.readline()
        if header in (b"\r\n", b"\n", b""):
            break
        name, _, value = header.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    return method, path, headers, await reader.readexactly(length) if length else b""


def _conversations(calls: list[tuple[list[dict], Reply]]) -> list[list[dict]]:
    """Each call's messages and reply, but for calls a later call continues (their messages
    are in that call's): one conversation per chain, in the order their last calls were made
    (the last call's the final one)."""
    def continued(k: int) -> bool:
        messages, reply = calls[k]
        m = len(messages)
        return any(len(later) > m and later[:m] == messages and is_reply(later[m], reply)
                   for later, _ in calls[k + 1:])

    return [messages + [reply.message] for k, (messages, reply) in enumerate(calls)
            if not continued(k)]


def _row_json(row) -> Any:
    """The row as its program reads it: a data row's fields as read (`Example.fields`), a dict
    as it is."""
    fields = getattr(row, "fields", None)
    if isinstance(fields, dict) and fields:
        return fields
    if isinstance(row, dict):
        return row
    return {k: v for k, v in vars(row).items() if not k.startswith("_")}


def _row_name(row) -> str:
    index = getattr(row, "index", None)
    return str(index) if isinstance(index, int) else repr(row)[:80]


def _last_line(text: str) -> str:
    """": " and the last non-empty line of a program's standard error, or ""."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f": {lines[-1][:300]}" if lines else ""


def build(settings: dict, config) -> Program:
    return Program(build_section(ProgramSection, settings, "agent"))
