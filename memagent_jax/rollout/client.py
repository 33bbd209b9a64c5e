"""The MemAgent workflow against an OpenAI-compatible chat-completions server (`run --url`).

Same turns as on the local engine (`memory_turns`), one HTTP request per turn, as the original
quickstart does with vLLM or a hosted model. A chat API takes text, so here the workflow runs in
text: each chunk's ids are decoded, the memory is the reply's text (`thinking: strip`: what
follows its last </think>, `strip_thinking_text`), and the server tokenizes each message whole
(`thinking: off`: with "chat_template_kwargs": {"enable_thinking": false}, as vLLM takes it).
The URL is the API base (".../v1", or an Azure deployment URL); the key comes from the
environment (`api_key_from_env`).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Callable

from memagent_jax.errors import UserError
from memagent_jax.rollout.answers import final_answer
from memagent_jax.rollout.memagent import Sample, memory_turns, run_record
from memagent_jax.rollout.templates import INITIAL_MEMORY, final_prompt, update_prompt
from memagent_jax.rollout.thinking import strip_thinking_text, template_kwargs

# Where the client reads its key, first set (non-empty) first: the project's own variable,
# which `serve` reads too, then the original MemAgent quickstart's (and this command's before
# MEMAGENT_API_KEY). Not OPENAI_API_KEY: a key for api.openai.com kept in a shell profile
# would otherwise be sent to whatever --url names, over plain http too; to use it here, say
# so: MEMAGENT_API_KEY=$OPENAI_API_KEY.
API_KEY_VARIABLES = ("MEMAGENT_API_KEY", "API_KEY")


def api_key_from_env() -> str | None:
    """The API key for the server: the first of API_KEY_VARIABLES set; None: no key."""
    return next(filter(None, map(os.environ.get, API_KEY_VARIABLES)), None)


def chat(url: str, model: str, message: str, *, max_tokens: int, temperature: float,
         top_p: float, api_key: str | None, timeout: float, seed: int | None = None,
         template_vars: dict | None = None) -> dict:
    """One chat completion: its first choice ({"message": {"content"}, "finish_reason"}),
    with the response's "usage" when the server reports it. template_vars: the chat
    template's extra variables, sent as "chat_template_kwargs" (vLLM's field). Raises
    OSError/ValueError on failure."""
    request = {"model": model, "messages": [{"role": "user", "content": message}],
               "max_tokens": max_tokens, "temperature": temperature, "top_p": top_p}
    if seed is not None:
        request["seed"] = seed
    if template_vars:
        request["chat_template_kwargs"] = template_vars
    body = json.dumps(request).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
        headers["api-key"] = api_key  # Azure OpenAI reads this header instead
    request = urllib.request.Request(url.rstrip("/") + "/chat/completions", body, headers)
    with urllib.request.urlopen(request, timeout=timeout) as response:
        payload = json.loads(response.read())
    return {**payload["choices"][0], "usage": payload.get("usage")}


def run_on_server(url: str, model: str, sample: Sample, tokenizer, *,
                  max_memory_tokens: int, max_final_tokens: int, temperature: float,
                  top_p: float, api_key: str | None, timeout: float = 300.0,
                  seed: int | None = None, thinking: str = "keep",
                  on_turn: Callable[[int, str, str], None] | None = None) -> dict:
    """Runs every turn; returns `run_record`'s record (the local engine's keys; a turn's
    response_tokens from the server's usage, None without it). tokenizer: the one that cut
    the sample (decodes its chunks). thinking: `MemAgentConfig.thinking`.
    seed: turn k (from 1) asks the server for seed + k (None: no seed). on_turn(turn number,
    kind, reply) after each turn. A failed request raises a UserError naming the turn."""
    turns = memory_turns([tokenizer.decode(c) for c in sample.chunks], INITIAL_MEMORY)
    records, new_memory, reply, number = [], None, None, 0
    while True:
        try:
            kind, memory, chunk = turns.send(new_memory)
        except StopIteration:
            break
        number += 1
        message = (update_prompt(sample.problem, memory, chunk) if kind == "update"
                   else final_prompt(sample.problem, memory))
        cap = max_memory_tokens if kind == "update" else max_final_tokens
        try:
            choice = chat(url, model, message, max_tokens=cap, temperature=temperature,
                          top_p=top_p, api_key=api_key, timeout=timeout,
                          seed=None if seed is None else (seed + number) & 0x7FFFFFFF,
                          template_vars=template_kwargs(thinking))
            reply = choice["message"]["content"] or ""
        except urllib.error.HTTPError as e:
            raise UserError(f"{url}: turn {number} ({kind}): server answered HTTP {e.code} "
                            f"{e.reason}{_server_message(e)}{_key_hint(e.code, api_key)}"
                            ) from None
        except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
            raise UserError(f"{url}: turn {number} ({kind}): request failed "
                            f"({type(e).__name__}: {e})") from None
        new_memory = None
        if kind == "update":
            new_memory = strip_thinking_text(reply) if thinking == "strip" else reply
        if on_turn is not None:
            on_turn(number, kind, reply)
        records.append({"kind": kind, "reply": reply, "memory": new_memory,
                        "finish_reason": choice.get("finish_reason"),
                        "response_tokens": (choice.get("usage") or {}).get("completion_tokens")})
    return run_record(sample.problem, final_answer(reply), records)


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
