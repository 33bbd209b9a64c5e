"""The OpenAI request bodies this server accepts, checked field by field, and its error JSON.

`parse_chat(body)` and `parse_completion(body)` turn a decoded JSON body into a `Generation`
or raise `APIError`, which carries the HTTP status and OpenAI's error object
(`{"error": {"message", "type", "param", "code"}}`, `param` naming the field at fault). Fields
follow OpenAI's API reference; `top_k`, `ignore_eos`, `return_tokens_as_token_ids` and
`chat_template_kwargs` (the chat template's extra variables, e.g. Qwen3's
`{"enable_thinking": false}`) are vLLM's extensions. `tools` (OpenAI's function tools) render
through the chat template and the reply is read for its calls (rollout/tool_calls.py), with
`tool_choice` "auto" or "none"; assistant messages may carry `tool_calls`, and `tool` messages
their `tool_call_id`. A function's `"strict": false` (OpenAI's default, which the Agents SDK
sends for every tool) is dropped before rendering: it asks for nothing.
Sampling features the engine does not have (penalties, logit bias, a forced tool choice, JSON
mode, audio, reasoning effort, echo, best_of) are refused with a 400 rather than silently
ignored; OpenAI's
bookkeeping fields (`user`, `metadata`, `store`, `service_tier`, ...: logging, billing and caching,
never another answer) are taken and ignored. A field this server does not know is a 400 naming
it, with the known field closest to it ("Unrecognized request argument supplied: max_token (did
you mean 'max_tokens'?)"), as OpenAI answers: vLLM ignores one with a warning in its own log,
which the client never reads, so a misspelt `max_token` would silently answer with another
length.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any, Literal

from memagent_jax.rollout.tool_calls import check_tools

MAX_STOP_STRINGS = 16
MAX_N = 128
ROLES = ("system", "developer", "user", "assistant", "tool")
# OpenAI's fields that ask for logging, billing or caching, not for another answer.
_BOOKKEEPING = ("user", "metadata", "store", "service_tier", "safety_identifier",
                "prompt_cache_key", "prediction", "parallel_tool_calls")
_COMMON_FIELDS = ("model", "n", "temperature", "top_p", "top_k", "seed", "stop", "stream",
                  "stream_options", "presence_penalty", "frequency_penalty", "logit_bias",
                  "ignore_eos", "return_tokens_as_token_ids", "max_tokens", "logprobs",
                  *_BOOKKEEPING)
# Chat fields the engine has no use for, and the values that ask for nothing (accepted).
_UNSUPPORTED_CHAT = {"functions": (None, []), "function_call": (None, "none", "auto"),
                     "audio": (None,), "modalities": (None, ["text"]), "reasoning_effort": (None,),
                     "verbosity": (None,), "web_search_options": (None,)}
_CHAT_FIELDS = frozenset((*_COMMON_FIELDS, "messages", "top_logprobs", "max_completion_tokens",
                          "response_format", "chat_template_kwargs", "tools", "tool_choice",
                          *_UNSUPPORTED_CHAT))
_COMPLETION_FIELDS = frozenset((*_COMMON_FIELDS, "prompt", "echo", "suffix", "best_of"))


class APIError(Exception):
    """An error answered as OpenAI does: HTTP `status`, and `body()` the JSON object."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = (status, message, param,
                                                                       code, kind)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param,
                          "code": self.code}}


@dataclasses.dataclass(frozen=True)
class Generation:
    """One checked request. prompts: chat: one list of {"role", "content": str} messages;
    completions: one or more prompts, each a str or a list of token ids (one choice group of n
    per prompt). max_tokens None: whatever the engine's length leaves. seed None: a fresh one.
    top_logprobs: alternatives per token (0: none); logprobs: whether to return them at all.
    ignore_eos: generate max_tokens whatever the model's EOS (benchmarks). template_vars
    (chat): the request's chat_template_kwargs, passed to the chat template; tools (chat):
    OpenAI's function tools (None: none), tool_choice "auto" or "none" (None: auto)."""
    kind: Literal["chat", "completion"]
    model: str
    prompts: tuple
    max_tokens: int | None = None
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    stream: bool = False
    include_usage: bool = False
    tokens_as_ids: bool = False
    ignore_eos: bool = False
    template_vars: dict = dataclasses.field(default_factory=dict)
    tools: list | None = None
    tool_choice: str | None = None


def bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param, code)


def parse_chat(body: Any, max_top_logprobs: int) -> Generation:
    """A /v1/chat/completions body -> Generation (APIError 400 on anything malformed)."""
    body = _object(body, _CHAT_FIELDS)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list of messages", "messages")
    checked = tuple(_message(m, f"messages[{i}]") for i, m in enumerate(messages))
    logprobs = _boolean(body, "logprobs")
    top = _integer(body, "top_logprobs", 0, 0, max_top_logprobs)
    if top and not logprobs:
        raise bad("'top_logprobs' requires 'logprobs' to be true", "top_logprobs")
    max_tokens = _integer(body, "max_completion_tokens", None, 1, None)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", None, 1, None)
    for name, nothing in _UNSUPPORTED_CHAT.items():
        if body.get(name) not in nothing:
            raise bad(f"'{name}' is not supported by this server", name)
    response_format = body.get("response_format")
    if response_format not in (None, {"type": "text"}):
        raise bad("only response_format {'type': 'text'} is supported", "response_format")
    template_vars = body.get("chat_template_kwargs")
    if template_vars is None:
        template_vars = {}
    if not isinstance(template_vars, dict):
        raise bad(f"'chat_template_kwargs' must be an object, got {template_vars!r}",
                  "chat_template_kwargs")
    tools, tool_choice = body.get("tools") or None, body.get("tool_choice")
    for name, given in (("tools", (tools or [], None)), ("tool_choice", ([], tool_choice))):
        try:
            check_tools(*given)
        except ValueError as e:
            raise bad(f"'{name}': {e}", name) from None
    if any(t["function"].get("strict") is True for t in tools or []):
        raise bad("'strict' tools need constrained decoding, which this server does not do",
                  "tools")
    if tools:  # `strict: false` is OpenAI's default (the Agents SDK sends it): no words to render
        tools = [{**t, "function": {k: v for k, v in t["function"].items()
                                    if (k, v) != ("strict", False)}} for t in tools]
    common = _common(body)
    if tools and common["stream"]:
        raise bad("'stream' with 'tools' is not supported by this server", "stream")
    return Generation("chat", _model(body), (checked,), max_tokens, logprobs=logprobs,
                      top_logprobs=top, template_vars=template_vars, tools=tools,
                      tool_choice=tool_choice, **common)


def parse_completion(body: Any, max_top_logprobs: int, vocab_size: int) -> Generation:
    """A /v1/completions body -> Generation (APIError 400 on anything malformed). A prompt is
    text, token ids (each below vocab_size), or a list of either (one choice group each)."""
    body = _object(body, _COMPLETION_FIELDS)
    prompts = _prompts(body.get("prompt"), vocab_size)
    top = _integer(body, "logprobs", None, 0, max_top_logprobs)
    if _boolean(body, "echo"):
        raise bad("'echo' is not supported by this server", "echo")
    if body.get("suffix"):
        raise bad("'suffix' is not supported by this server", "suffix")
    common = _common(body)
    best_of = _integer(body, "best_of", None, 1, MAX_N)
    if best_of is not None and best_of != common["n"]:
        raise bad("'best_of' other than n is not supported by this server", "best_of")
    return Generation("completion", _model(body), prompts,
                      _integer(body, "max_tokens", 16, 1, None), logprobs=top is not None,
                      top_logprobs=top or 0, **common)


def _common(body: dict) -> dict:
    """The fields chat and completions share."""
    for name in ("presence_penalty", "frequency_penalty"):
        if _number(body, name, 0.0, -2.0, 2.0) != 0:
            raise bad(f"'{name}' is not supported by this server (only 0)", name)
    if body.get("logit_bias"):
        raise bad("'logit_bias' is not supported by this server", "logit_bias")
    top_k = _integer(body, "top_k", 0, -1, None)
    stream = _boolean(body, "stream")
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or not stream):
        raise bad("'stream_options' must be an object, and only with 'stream': true",
                  "stream_options")
    seed = _integer(body, "seed", None, None, None)
    return dict(n=_integer(body, "n", 1, 1, MAX_N),
                temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
                top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
                top_k=max(top_k, 0),  # vLLM's -1 is off, as our 0
                # The engine seeds a 31-bit key: a seed is used modulo 2^31, as `generate` 's.
                seed=None if seed is None else seed & 0x7FFFFFFF,
                stop=_stop(body.get("stop")), stream=stream,
                include_usage=bool(options and options.get("include_usage")),
                tokens_as_ids=_boolean(body, "return_tokens_as_token_ids"),
                ignore_eos=_boolean(body, "ignore_eos"))


def _object(body: Any, fields: frozenset[str]) -> dict:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    for name in body:
        if name not in fields:
            close = difflib.get_close_matches(name, sorted(fields), n=1, cutoff=0.6)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise bad(f"Unrecognized request argument supplied: {name}{hint}", name)
    return body


def _model(body: dict) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("'model' must name the served model (see /v1/models)", "model")
    return model


def _message(message: Any, where: str) -> dict:
    if not isinstance(message, dict) or message.get("role") not in ROLES:
        raise bad(f"{where} must be an object with a 'role' of {', '.join(ROLES)}", where)
    content = message.get("content")
    if isinstance(content, list):  # content parts: text only
        if not all(isinstance(p, dict) and p.get("type") == "text"
                   and isinstance(p.get("text"), str) for p in content):
            raise bad(f"{where}.content: only text parts are supported", f"{where}.content")
        content = "".join(p["text"] for p in content)
    if content is None and message["role"] == "assistant":
        content = ""
    if not isinstance(content, str):
        raise bad(f"{where}.content must be a string or a list of text parts",
                  f"{where}.content")
    checked = {"role": message["role"], "content": content}
    calls = message.get("tool_calls")
    if message["role"] == "assistant" and calls:
        if not isinstance(calls, list) or not all(
                isinstance(c, dict) and isinstance(c.get("function"), dict)
                and isinstance(c["function"].get("name"), str)
                and isinstance(c["function"].get("arguments"), str) for c in calls):
            raise bad(f"{where}.tool_calls must be a list of {{'id', 'type': 'function', "
                      f"'function': {{'name', 'arguments': JSON text}}}}", f"{where}.tool_calls")
        checked["tool_calls"] = calls
    if message["role"] == "tool":
        for name in ("tool_call_id", "name"):
            if message.get(name) is not None:
                if not isinstance(message[name], str):
                    raise bad(f"{where}.{name} must be a string", f"{where}.{name}")
                checked[name] = message[name]
    return checked


def _prompts(prompt: Any, vocab_size: int) -> tuple:
    def ids(value: list, where: str) -> list[int]:
        if not value:
            raise bad(f"{where} is empty", "prompt")
        if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab_size
                   for t in value):
            raise bad(f"{where}: token ids must be integers in [0, {vocab_size})", "prompt")
        return value

    prompts: tuple[str | list[int], ...]
    if isinstance(prompt, str):
        prompts = (prompt,)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        prompts = (ids(prompt, "'prompt'"),)
    elif isinstance(prompt, list) and prompt:
        items = []
        for i, p in enumerate(prompt):
            if not isinstance(p, (str, list)):
                raise bad(f"'prompt'[{i}] must be text or token ids", "prompt")
            items.append(p if isinstance(p, str) else ids(p, f"'prompt'[{i}]"))
        prompts = tuple(items)
    else:
        raise bad("'prompt' must be text, token ids, or a non-empty list of either", "prompt")
    if any(p == "" for p in prompts):
        raise bad("'prompt' is empty", "prompt")
    return prompts


def _stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if (not isinstance(stops, list) or len(stops) > MAX_STOP_STRINGS
            or not all(isinstance(s, str) and s for s in stops)):
        raise bad(f"'stop' must be a non-empty string or a list of at most "
                  f"{MAX_STOP_STRINGS} of them", "stop")
    return tuple(stops)


def _boolean(body: dict, name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad(f"'{name}' must be true or false, got {value!r}", name)
    return value


def _integer(body: dict, name: str, default, low: int | None, high: int | None):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise bad(f"'{name}' must be an integer, got {value!r}", name)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = (f"at least {low}" if high is None else
                  f"at most {high}" if low is None else f"between {low} and {high}")
        raise bad(f"'{name}' must be {bounds}, got {value}", name)
    return value


def _number(body: dict, name: str, default: float, low: float, high: float,
            low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if (not isinstance(value, (int, float)) or isinstance(value, bool)
            or not math.isfinite(value)):
        raise bad(f"'{name}' must be a number, got {value!r}", name)
    if value > high or value < low or (low_open and value == low):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise bad(f"'{name}' must be in {interval}, got {value}", name)
    return float(value)
