"""OpenAI tool calling in Qwen's format: one parser and one renderer for `policy.chat` (the
engine, a replay, a server) and `serve`.

Tools are OpenAI's `[{"type": "function", "function": {"name", "description",
"parameters"}}]`. `render_input` prepares a chat template's input: a template that takes a
`tools` variable (Qwen2.5's, Qwen3's) gets them there; one that does not (the shipped
word-level models') gets them declared in the system message (`declare_tools`, Qwen2.5's own
words, as the shipped tool agent sends them). Assistant messages carrying
`tool_calls` are rendered by a template that writes them (their `arguments` given as objects,
as vLLM gives them), else as `<tool_call>` text after their content; `role: "tool"` messages
pass as they are.

`parse_tool_calls` reads a reply as vLLM's hermes parser does (`--tool-call-parser hermes`):
every `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` is one call (a last one left
open at the end of the reply counts too), in order, as OpenAI's `tool_calls`
(`{"id", "type": "function", "function": {"name", "arguments": JSON text}}`); `content` is the
text before the first call (None when empty). Where any call does not parse, the reply has no
calls, its content is the whole text, and `error` says why, in words that repeat nothing the
model wrote (a word-level tokenizer reads only its vocabulary; the agent sends it back).
Unlike hermes, strings are stripped of surrounding whitespace (a word-level tokenizer decodes a
space before every word).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
import uuid
from collections.abc import Callable

import jinja2
import jinja2.meta

from memagent_jax.rollout.agent_api import AssistantMessage, Reply

# One call, shortest match first: a reply may hold several (OpenAI's parallel_tool_calls).
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
CALL_START = "<tool_call>"
# Why a reply's calls do not parse (the original's words where it has them).
INVALID_JSON = "invalid json"
NO_NAME = "tool name not found"
NOT_AN_OBJECT = "arguments must be a json object"
TOOL_CHOICES = ("auto", "none")


@dataclasses.dataclass(frozen=True)
class ParsedReply:
    """A reply read for tool calls: content (text outside the calls, None when empty),
    tool_calls (OpenAI's shape; empty: none), error (why its calls do not parse, else None)."""
    content: str | None
    tool_calls: list[dict]
    error: str | None = None


def new_call_id() -> str:
    """A fresh call id, as OpenAI's ("call_" and 24 hex digits)."""
    return "call_" + uuid.uuid4().hex[:24]


def parse_tool_calls(text: str, make_id: Callable[[int], str] | None = None) -> ParsedReply:
    """The reply's calls (module docstring); make_id(k) names call k (default: fresh ids)."""
    if CALL_START not in text:
        return ParsedReply(text or None, [])
    calls = []
    for k, match in enumerate(_CALL.finditer(text)):
        body = match.group(1) if match.group(1) is not None else match.group(2)
        try:
            call = _stripped(json.loads(body.strip()))
        except json.JSONDecodeError:
            return ParsedReply(text, [], INVALID_JSON)
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
            return ParsedReply(text, [], NO_NAME)
        arguments = call.get("arguments", {})
        if not isinstance(arguments, dict):
            return ParsedReply(text, [], NOT_AN_OBJECT)
        calls.append({"id": make_id(k) if make_id else new_call_id(), "type": "function",
                      "function": {"name": call["name"],
                                   "arguments": json.dumps(arguments, ensure_ascii=False)}})
    return ParsedReply(text[:text.index(CALL_START)] or None, calls)


def _stripped(value):
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, dict):
        return {str(k).strip(): _stripped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_stripped(v) for v in value]
    return value


def read_reply(reply: Reply, make_id: Callable[[int], str] | None = None) -> Reply:
    """`reply` with its tool calls read from its text (`Reply.tool_calls`, `Reply.tool_error`)
    and its message OpenAI's: the content outside the calls ("" when none) and `tool_calls`."""
    parsed = parse_tool_calls(reply.text, make_id)
    return with_calls(reply, parsed.content or "", parsed.tool_calls, parsed.error)


def with_calls(reply: Reply, content: str, tool_calls: list[dict], error: str | None) -> Reply:
    """`reply` carrying these calls (a server's, or parsed) and its message with them."""
    reply.tool_calls, reply.tool_error = tool_calls or None, error
    reply.message = AssistantMessage(content, reply, tool_calls or None)
    return reply


def check_tools(tools, tool_choice) -> None:
    """ValueError unless `tools` is a list of OpenAI function tools and `tool_choice` one of
    TOOL_CHOICES or None ("required" and named functions need constrained decoding, which the
    engine does not have)."""
    if not isinstance(tools, list) or not all(
            isinstance(t, dict) and t.get("type") == "function"
            and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str) for t in tools):
        raise ValueError(f"tools must be a list of {{'type': 'function', 'function': {{'name', "
                         f"'description', 'parameters'}}}}, got {tools!r:.100}")
    if tool_choice is not None and tool_choice not in TOOL_CHOICES:
        raise ValueError(f"tool_choice {tool_choice!r:.60} is not supported (only "
                         f"{' or '.join(map(repr, TOOL_CHOICES))}: the engine cannot force "
                         "a call)")


def declare_tools(tools: list[dict]) -> str:
    """The tools' declaration in a system message, as Qwen2.5's chat template (and the
    original's `toolcall_system_prompt`) writes it."""
    declared = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
            "You are provided with function signatures within <tools></tools> XML tags:\n"
            f"<tools>\n{declared}\n</tools>\n\nFor each function call, return a json object "
            "with function name and arguments within <tool_call></tool_call> XML tags:\n"
            "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
            "</tool_call>")


def with_system(messages: list[dict], text: str) -> list[dict]:
    """The messages with `text` after the system message's content (a system message of its
    own where there is none), as the original's `merge_system_prompt`."""
    if messages and messages[0].get("role") == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + text},
                *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def render_input(tokenizer, messages: list[dict], template_vars: dict
                 ) -> tuple[list[dict], dict]:
    """(messages, template variables) as the tokenizer's chat template takes them (module
    docstring); unchanged where no message carries tool calls and no tools are given."""
    template = getattr(tokenizer, "chat_template", None) or ""
    tools = template_vars.get("tools")
    if tools is not None and not takes_tools(template):
        template_vars = {k: v for k, v in template_vars.items() if k != "tools"}
        if tools:
            messages = with_system(messages, declare_tools(tools))
    if any(m.get("tool_calls") for m in messages if m.get("role") == "assistant"):
        writes = re.search(r"\btool_calls\b", template) is not None
        messages = [_assistant(m, writes) if m.get("role") == "assistant" else m
                    for m in messages]
    return messages, template_vars


@functools.lru_cache(maxsize=8)
def takes_tools(template: str) -> bool:
    """Whether a chat template reads a `tools` variable (jinja's undeclared variables; the
    `{% generation %}` tags of a training template, which transformers adds, set aside)."""
    source = re.sub(r"{%-?\s*(end)?generation\s*-?%}", "", template)
    try:
        parsed = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(source)
    except jinja2.TemplateSyntaxError:  # transformers will say what is wrong when it renders
        return False
    return "tools" in jinja2.meta.find_undeclared_variables(parsed)


def _assistant(message: dict, template_writes_calls: bool) -> dict:
    """An assistant message for the template: its calls' arguments as objects (a template that
    writes `tool_calls`), or its calls as `<tool_call>` text after its content."""
    calls = message.get("tool_calls") or []
    content = message.get("content") or ""
    if not calls:
        return {**message, "content": content}
    functions = [{"name": c["function"]["name"],
                  "arguments": _arguments(c["function"].get("arguments"))} for c in calls]
    if template_writes_calls:
        return {**message, "content": content, "tool_calls": [
            {**c, "function": f} for c, f in zip(calls, functions)]}
    text = "\n".join(f"<tool_call>\n{json.dumps(f, ensure_ascii=False)}\n</tool_call>"
                     for f in functions)
    return {"role": "assistant", "content": f"{content}\n{text}" if content else text}


def _arguments(arguments):
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments if arguments is not None else {}


def call_template_vars(template_vars: dict, tools: list[dict] | None,
                       tool_choice: str | None) -> dict:
    """A `policy.chat` call's template variables: its own, and `tools` where given (checked,
    `check_tools`; ValueError for tool_choice without tools)."""
    if tools is None:
        if tool_choice is not None:
            raise ValueError(f"tool_choice {tool_choice!r:.60} without tools")
        return template_vars
    check_tools(tools, tool_choice)
    return {**template_vars, "tools": tools}


def reads_calls(tools: list[dict] | None, tool_choice: str | None) -> bool:
    """Whether a call's reply is read for tool calls: tools given, and tool_choice not
    "none"."""
    return bool(tools) and tool_choice != "none"


def rollout_call_ids(number: int) -> Callable[[int], str]:
    """Ids for the calls of a rollout's chat call `number` (its place among the rollout's
    calls): the same on every process and on a replay (the engine's ids, not a server's)."""
    return lambda k: f"call_{number}_{k}"
