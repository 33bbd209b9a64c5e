"""A `Generation` run on the engine worker, answered as OpenAI answers.

`prepare` turns the request's prompts into token ids (chat: through the chat template; on the
`Encoder`'s threads) and checks them: words the tokenizer cannot represent (chat: the local
engine's one check of the prompt the template renders, `conversation.check_readable`, so what
the engine takes is taken; a 400 naming the words and the message or role), ids past the
model's embedding rows, and the engine's length (400 `context_length_exceeded`, as OpenAI
words it).
An `Exchange` submits one job per prompt (its n samples prefilled once) and turns the job
events the engine thread sends into `Update`s, one choice's new text and tokens at a time; it
cancels a prompt's job once every choice of it has met a stop string, and all of its jobs when
the client disconnects or the exchange closes early. `collect` builds the whole response from
them, `stream` the server-sent events of a streamed one. Prompt i of a completions request is
seeded `seed + i`, as line i of `memagent-jax generate --seed` is.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import json
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any, TypeVar

from memagent_jax.engine.sampling import SamplingParams
from memagent_jax.engine.scheduler import Request
from memagent_jax.errors import UserError
from memagent_jax.rollout.conversation import readable_chat_ids
from memagent_jax.rollout.tool_calls import call_template_vars, parse_tool_calls, reads_calls
from memagent_jax.serve.encoding import Encoder
from memagent_jax.serve.protocol import APIError, Generation, bad
from memagent_jax.serve.text import TextStream
from memagent_jax.serve.worker import EngineWorker, Job, Overloaded, ShuttingDown
from memagent_jax.tokenizer import check_representable

T = TypeVar("T")


@dataclasses.dataclass
class Served:
    """What every handler shares. names: the model names requests may give (names[0] is the
    one reported); max_len: the engine's KV length (prompt + reply); tokenizer: decodes
    replies, on the event loop; encoder: tokenizes prompts, on threads of its own."""
    worker: EngineWorker
    tokenizer: Any  # a transformers tokenizer
    names: tuple[str, ...]
    max_len: int
    stop_ids: tuple[int, ...]
    max_top_logprobs: int
    vocab_size: int
    encoder: Encoder
    # Set (on the event loop) once shutdown's deadline has passed: see `end_requests`.
    ended: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    exchanges: set[Exchange] = dataclasses.field(default_factory=set)  # answering now


class Aborted(Exception):
    """The exchange ended early: "disconnected", "shutdown" or "engine error: ..."."""


def end_requests(served: Served) -> None:
    """Shutdown's deadline, on the event loop: every exchange ends at once as "shutdown" (a
    503; the worker aborts their jobs too, and takes no more), without waiting for the engine
    thread's step, and requests not yet submitted end with a 503 (`unless_ended`)."""
    served.ended.set()
    for exchange in list(served.exchanges):
        exchange.abort("shutdown")


async def unless_ended(served: Served, awaitable: Awaitable[T]) -> T:
    """awaitable's result, or, once shutdown's deadline has passed (`end_requests`), the 503
    APIError of shutdown, the awaitable cancelled (a prompt being tokenized is finished for
    nobody)."""
    task = asyncio.ensure_future(awaitable)
    ended = asyncio.ensure_future(served.ended.wait())
    try:
        await asyncio.wait((task, ended), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this request's own task is cancelled
        task.cancel()
        raise
    finally:
        ended.cancel()
    if not task.done():
        task.cancel()
        raise abort_error("shutdown")
    return task.result()


@dataclasses.dataclass
class Choice:
    index: int
    text: TextStream
    tokens: list[tuple] = dataclasses.field(default_factory=list)  # (id, logprob, top, offset)
    finish_reason: str | None = None


@dataclasses.dataclass
class Update:
    """What one event changed: `choice` gained `text` and `tokens` (entries as in
    Choice.tokens); `finished` when it has its finish_reason."""
    choice: Choice
    text: str
    tokens: list[tuple]
    finished: bool


@functools.lru_cache(maxsize=8)
def _renderer_arguments(apply_chat_template) -> frozenset[str]:
    """The named parameters of a tokenizer class's `apply_chat_template` (the template itself,
    truncation, return types, ...), which a request's template variables must not override
    (read once per tokenizer class, not per request)."""
    parameters = inspect.signature(apply_chat_template).parameters.values()
    return frozenset(p.name for p in parameters if p.kind not in (
        p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name != "self") | {"chat_template"}


async def prepare(served: Served, gen: Generation) -> list[list[int]]:
    """Each prompt's token ids, every one fitting the engine with the requested max_tokens
    and read by the model as written: text with words the tokenizer has no token for (a
    completion's: read as its unknown token or as ids past its embedding rows, as `generate`
    refuses them; chat: the latter, as the engine refuses them) is a 400 naming them. A
    request of more prompts than the server takes in flight is a 400: it could never be taken
    (more than are free is a 429, when the jobs are submitted)."""
    if len(gen.prompts) > served.worker.max_requests:
        raise bad(f"'prompt' is a list of {len(gen.prompts)} prompts, more than this server "
                  f"takes in flight ({served.worker.max_requests}, its --max-requests): send "
                  "at most that many a request", "prompt")
    if gen.kind == "chat":
        renderer = type(served.tokenizer).apply_chat_template
        clash = sorted(set(gen.template_vars) & _renderer_arguments(renderer))
        if clash:  # vLLM likewise renders them as the template's variables only
            raise bad(f"'chat_template_kwargs' may not set {', '.join(clash)}: the chat "
                      "template renderer's own arguments, not template variables",
                      "chat_template_kwargs")
        messages = list(gen.prompts[0])
        template_vars = call_template_vars(gen.template_vars, gen.tools, None)
        try:
            prompts = [await served.encoder.run(
                lambda tokenizer: readable_chat_ids(tokenizer, messages, template_vars),
                [m["content"] for m in messages], "messages")]
        except APIError:  # the Encoder's length bound
            raise
        except UserError as e:
            raise bad(str(e), "messages") from None
        except Exception as e:  # a template that rejects the conversation (role order, ...)
            if gen.template_vars:  # or the variables
                raise bad(f"the chat template rejected the messages or chat_template_kwargs: "
                          f"{e}", "messages") from None
            raise bad(f"the chat template rejected the messages: {e}", "messages") from None
    else:
        def text_prompt(where: str, text: str, tokenizer) -> list[int]:
            check_representable(tokenizer, text, where)
            return list(tokenizer(text)["input_ids"])

        prompts = []
        for i, p in enumerate(gen.prompts):
            if isinstance(p, list):
                prompts.append(list(p))
                continue
            where = "'prompt'" if len(gen.prompts) == 1 else f"'prompt'[{i}]"
            try:
                prompts.append(await served.encoder.run(
                    functools.partial(text_prompt, where, p), [p], "prompt"))
            except UserError as e:
                raise bad(str(e), "prompt") from None
    where = "messages" if gen.kind == "chat" else "prompt"
    for ids in prompts:
        if not ids:
            raise bad("the prompt is empty once tokenized", where)
        outside = next((t for t in ids if t >= served.vocab_size), None)
        if outside is not None:  # a tokenizer with more tokens than the model has rows
            raise bad(f"the {where} reads as token id {outside}, outside the model's "
                      f"vocabulary of {served.vocab_size} ids", where)
        wanted = len(ids) + (gen.max_tokens or 1)
        if wanted > served.max_len:
            asked = (f"{wanted} tokens ({len(ids)} in the {where}, {gen.max_tokens} in the "
                     "completion)" if gen.max_tokens else f"{len(ids)} tokens in the {where}")
            raise bad(f"This model's maximum context length is {served.max_len} tokens. "
                      f"However, you requested {asked}. Please reduce the length of the "
                      f"{where} or completion.", where, "context_length_exceeded")
    return prompts


class Exchange:
    """The jobs of one request; see the module docstring. receive: the ASGI receive channel,
    watched for the client's disconnect."""

    def __init__(self, served: Served, gen: Generation, prompts: list[list[int]],
                 receive: Callable[[], Awaitable[MutableMapping[str, Any]]]):
        self.served, self.gen, self.prompts = served, gen, prompts
        self.choices = [Choice(i, TextStream(served.tokenizer, gen.stop))
                        for i in range(len(prompts) * gen.n)]
        self._events: asyncio.Queue = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._jobs: list[Job] = []
        self._open: set[int] = set()  # prompts whose job may still send events
        self._watcher: asyncio.Future | None = None
        self.id = f"{'chatcmpl' if gen.kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        for index, ids in enumerate(prompts):
            self._submit(index, ids)
        self._watcher = asyncio.ensure_future(self._watch(receive))
        served.exchanges.add(self)

    def _submit(self, index: int, ids: list[int]) -> None:
        gen = self.gen
        seed = None if gen.seed is None else (gen.seed + index) & 0x7FFFFFFF
        request = Request(tuple(ids), gen.max_tokens or self.served.max_len - len(ids),
                          SamplingParams(gen.temperature, gen.top_p, gen.top_k, seed,
                                         top_logprobs=gen.top_logprobs > 0),
                          () if gen.ignore_eos else self.served.stop_ids, gen.n)
        send = self._send
        job = Job(request, on_token=lambda *token: send(("token", index, *token)),
                  on_done=lambda completions: send(("done", index, completions)),
                  on_abort=lambda reason: send(("abort", reason)))
        try:
            self.served.worker.check(request)
            self.served.worker.submit(job)
        except UserError as e:
            self.close()
            raise bad(str(e)) from None
        except Overloaded:
            self.close()
            raise APIError(429, "The server has as many requests in flight as it takes; retry "
                                "later", code="queue_full", kind="rate_limit_error") from None
        except ShuttingDown:
            self.close()
            raise APIError(503, "The server is shutting down", code="shutting_down",
                           kind="server_error") from None
        self._jobs.append(job)
        self._open.add(index)

    def _send(self, event: tuple) -> None:
        """From the engine thread: hand the event to the event loop."""
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody listens
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)

    async def _watch(self, receive) -> None:
        """Waits for the client to go; the body has been read, so the next ASGI message is
        the disconnect (uvicorn sends it to every receiver once the connection is lost)."""
        try:
            while (await receive())["type"] != "http.disconnect":
                pass
        except Exception:  # a server that refuses a second receiver: no early cancel then
            return
        self.abort("disconnected")

    def abort(self, reason: str) -> None:
        """Ends `updates` with Aborted(reason), on the event loop."""
        self._events.put_nowait(("abort", reason))

    async def updates(self) -> AsyncIterator[Update]:
        """Updates until every choice has finished; raises Aborted if the exchange ends
        first."""
        left, n = len(self.choices), self.gen.n
        while left:
            event = await self._events.get()
            if event[0] == "abort":
                raise Aborted(event[1])
            if event[0] == "token":
                _, index, sample, token, logprob, top = event
                choice = self.choices[index * n + sample]
                if choice.finish_reason:
                    continue  # past a stop string
                offset = choice.text.decoded_length
                text = choice.text.add(token)
                choice.tokens.append((token, logprob, top, offset))
                if choice.text.stopped:
                    choice.finish_reason, left = "stop", left - 1
                    self._cancel_if_stopped(index)
                yield Update(choice, text, [choice.tokens[-1]], bool(choice.finish_reason))
            else:  # done: every sample of the prompt
                _, index, completions = event
                self._open.discard(index)
                for sample, completion in enumerate(completions):
                    choice = self.choices[index * n + sample]
                    if not choice.finish_reason:
                        choice.finish_reason, left = completion.finish_reason, left - 1
                        yield Update(choice, choice.text.finish(), [], True)

    def _cancel_if_stopped(self, index: int) -> None:
        n = self.gen.n
        if index in self._open and all(c.finish_reason
                                       for c in self.choices[index * n:(index + 1) * n]):
            self._open.discard(index)
            self.served.worker.cancel(self._jobs[index])

    def close(self) -> None:
        """Cancels whatever is still running (idempotent)."""
        for index in self._open:
            self.served.worker.cancel(self._jobs[index])
        self._open.clear()
        self.served.exchanges.discard(self)
        if self._watcher is not None:
            self._watcher.cancel()

    def usage(self) -> dict:
        prompt = sum(len(ids) for ids in self.prompts)
        completion = sum(len(c.tokens) for c in self.choices)
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}


def abort_error(reason: str) -> APIError:
    if reason == "shutdown":
        return APIError(503, "The server is shutting down; the request was not finished",
                        code="shutting_down", kind="server_error")
    return APIError(500, f"The request failed: {reason}", kind="server_error")


async def collect(exchange: Exchange, model: str) -> dict:
    """The whole response object (`chat.completion` or `text_completion`)."""
    try:
        async for _ in exchange.updates():
            pass
    finally:
        exchange.close()
    gen, chat = exchange.gen, exchange.gen.kind == "chat"
    choices = []
    for c in exchange.choices:
        logprobs = _logprobs(exchange, c.tokens) if gen.logprobs else None
        body: dict = ({"message": {"role": "assistant", "content": c.text.text}} if chat
                      else {"text": c.text.text})
        finish_reason = c.finish_reason
        if chat and reads_calls(gen.tools, gen.tool_choice):
            parsed = parse_tool_calls(c.text.text)
            if parsed.tool_calls:  # as vLLM's hermes parser answers; else the text, as it is
                body["message"] = {"role": "assistant", "content": parsed.content,
                                   "tool_calls": parsed.tool_calls}
                finish_reason = "tool_calls"
        choices.append({"index": c.index, **body, "logprobs": logprobs,
                        "finish_reason": finish_reason})
    return {**_head(exchange, model, chunk=False), "choices": choices,
            "usage": exchange.usage()}


async def stream(exchange: Exchange, model: str) -> AsyncIterator[str]:
    """Server-sent events: chunks as OpenAI streams them, then `data: [DONE]`; usage on the
    last chunk (or, with include_usage, on a chunk of its own as OpenAI sends it). An exchange
    that ends early ends the stream with an error event instead (never a [DONE])."""
    gen, chat = exchange.gen, exchange.gen.kind == "chat"
    head = _head(exchange, model, chunk=True)
    try:
        if chat:  # OpenAI's first chunk of each choice names the role
            for c in exchange.choices:
                yield _event({**head, "choices": [{"index": c.index, "delta": {
                    "role": "assistant", "content": ""}, "logprobs": None,
                    "finish_reason": None}]})
        async for update in exchange.updates():
            if not (update.text or update.finished or (gen.logprobs and update.tokens)):
                continue
            logprobs = _logprobs(exchange, update.tokens) if gen.logprobs else None
            body = ({"delta": {"content": update.text} if update.text else {}} if chat
                    else {"text": update.text})
            chunk = {**head, "choices": [{
                "index": update.choice.index, **body, "logprobs": logprobs,
                "finish_reason": update.choice.finish_reason if update.finished else None}]}
            if (update.finished and not gen.include_usage
                    and all(c.finish_reason for c in exchange.choices)):
                # Usage in every response: without include_usage's chunk of its own, on the
                # last chunk (OpenAI's chunk objects have the field; clients read or skip it).
                chunk["usage"] = exchange.usage()
            yield _event(chunk)
        if gen.include_usage:
            yield _event({**head, "choices": [], "usage": exchange.usage()})
        yield "data: [DONE]\n\n"
    except Aborted as e:
        if str(e) != "disconnected":  # else nobody is there to read it
            yield _event(abort_error(str(e)).body())
    finally:
        exchange.close()


def _head(exchange: Exchange, model: str, chunk: bool) -> dict:
    chat = exchange.gen.kind == "chat"
    kind = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
    return {"id": exchange.id, "object": kind, "created": exchange.created, "model": model}


def _event(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _logprobs(exchange: Exchange, entries: list[tuple]) -> dict:
    """OpenAI's logprobs object for these token entries: chat's `content` list, or the
    completions API's parallel lists."""
    gen, tokenizer = exchange.gen, exchange.served.tokenizer

    def name(token: int) -> str:
        return f"token_id:{token}" if gen.tokens_as_ids else tokenizer.decode([token])

    def alternatives(top) -> list[tuple[str, float]]:
        if top is None or not gen.top_logprobs:
            return []
        return [(name(t), _finite(v)) for t, v in zip(*top)][:gen.top_logprobs]

    if gen.kind == "chat":
        return {"content": [
            {"token": name(t), "logprob": _finite(lp), "bytes": list(name(t).encode()),
             "top_logprobs": [{"token": s, "logprob": v, "bytes": list(s.encode())}
                              for s, v in alternatives(top)]}
            for t, lp, top, _ in entries]}
    return {"tokens": [name(t) for t, _, _, _ in entries],
            "token_logprobs": [_finite(lp) for _, lp, _, _ in entries],
            "top_logprobs": [dict(alternatives(top)) if gen.top_logprobs else None
                             for _, _, top, _ in entries],
            "text_offset": [offset for _, _, _, offset in entries]}


def _finite(x: float) -> float:
    """JSON has no infinities: a token of probability 0 gets vLLM's stand-in."""
    return x if math.isfinite(x) else -9999.0
