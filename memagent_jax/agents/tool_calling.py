"""A multi-turn tool-calling agent in Qwen's format (`agent: {module:
memagent_jax.agents.tool_calling, tools: [...]}`; the original's
`recurrent/impls/async_tool_gsm8k.py`).

The row's prompt gets a system prompt that declares the tools, as Qwen2.5's chat template and the
original's `toolcall_system_prompt` write it (their JSON schemas in `<tools></tools>`). Each
reply's first `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` is run and its result
sent back as a `tool` message, which the chat template renders (Qwen2.5's, the original's: a
user turn of `<tool_response>` blocks); the conversation ends at a reply that calls no tool,
after `max_turns` tool calls, or when the next prompt would not fit `max_length`. The whole
conversation is one training row, its tool results carrying no loss (rollout/conversation.py);
the last reply is the answer.

Tools are plain Python functions, named `module:function`, declared with a JSON schema: the
`tool(schema)` decorator's, else the one transformers derives from the signature and docstring
(`get_json_schema`). Arguments the schema does not name come from the row, as verl's tool rows
carry them (`extra_info.tools_kwargs[name].create_kwargs`), unseen by the model. A tool's
result reaches the model as text; an unknown tool, malformed call, wrong arguments or a tool
that raises is told to the model in the tool message (the original's way), not raised, in
words that repeat nothing the model wrote (a word-level tokenizer reads only its vocabulary). Tools
run through `policy.once`: on many processes, process 0 runs them and shares the results.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
from typing import Any, Callable, ClassVar

from memagent_jax.errors import ConfigError
from memagent_jax.rollout.agent_api import PromptTooLong, Rollout
from memagent_jax.runconfig import at_least, build_section

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
# What the model is told of a call that runs no tool (the original's words where it has them).
# None repeats what the model wrote: a tool message holds only text the tokenizer reads.
INVALID_JSON = "invalid json"
NO_NAME = "tool name not found"
UNKNOWN_TOOL = "unknown tool"
NOT_AN_OBJECT = "arguments must be a json object"


def tool(schema: dict | None = None) -> Callable:
    """Declares a function a tool with its JSON schema ({"name", "description", "parameters"};
    None: derived from its signature and docstring)."""
    def declare(fn: Callable) -> Callable:
        setattr(fn, "tool_schema", schema)  # a function attribute, which mypy cannot type
        return fn
    return declare


@dataclasses.dataclass(frozen=True)
class Tool:
    """A tool: its function and its schema ({"name", "description", "parameters"})."""
    fn: Callable
    schema: dict

    @property
    def name(self) -> str:
        return self.schema["name"]


def load_tool(spec: str, key: str) -> Tool:
    """The tool `module:function` names; ConfigError naming `key`."""
    module_name, _, function = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), function or "", None)
    except ImportError as e:
        raise ConfigError(key, f"cannot import {module_name!r} ({e})") from None
    if not callable(fn):
        raise ConfigError(key, f"{spec!r} names no function (module:function)")
    schema = getattr(fn, "tool_schema", None)
    if schema is None:
        from transformers.utils import get_json_schema
        try:
            schema = get_json_schema(fn)["function"]
        except Exception as e:  # noqa: BLE001 - transformers raises its own kinds
            raise ConfigError(key, f"{spec}: no JSON schema ({e}); declare one with "
                                   "@tool(schema)") from None
    if not (isinstance(schema, dict) and isinstance(schema.get("name"), str)
            and isinstance(schema.get("parameters", {}).get("properties"), dict)):
        raise ConfigError(key, f"{spec}: a schema needs a name and parameters.properties")
    return Tool(fn, schema)


def system_prompt(tools: list[Tool]) -> str:
    """The tools' declaration, as Qwen2.5's chat template (and the original's
    `toolcall_system_prompt`) writes it."""
    declared = "\n".join(json.dumps({"type": "function", "function": t.schema},
                                    ensure_ascii=False) for t in tools)
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


def parse_tool_call(text: str) -> tuple[str, Any] | None:
    """The reply's first tool call: (name, arguments), ("", why) for a malformed one, None
    without one. Strings are stripped of surrounding whitespace (a word-level tokenizer
    decodes a space before every word)."""
    match = _CALL.search(text)
    if match is None:
        return None
    try:
        call = _stripped(json.loads(match.group(1).strip()))
    except json.JSONDecodeError:
        return "", INVALID_JSON
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
        return "", NO_NAME
    return call["name"], call.get("arguments", {})


def _stripped(value):
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, dict):
        return {str(k).strip(): _stripped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_stripped(v) for v in value]
    return value


def _run_tool(fn: Callable, arguments: dict) -> str:
    """fn(**arguments) as the tool message's text; what it raised, as text."""
    try:
        result = fn(**arguments)
    except Exception as e:  # noqa: BLE001 - the model is told, as the original tells it
        return f"error: {type(e).__name__}: {e}"
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)


@dataclasses.dataclass(frozen=True)
class ToolCallingSection:
    """The `agent` section's keys besides `module`."""
    SECTION: ClassVar[str] = "agent"
    tools: tuple[str, ...] = ()     # module:function of each tool
    max_turns: int = 4              # tool calls in a conversation at most
    max_tokens: int = 256           # each reply's cap
    max_length: int = 4096          # the most tokens a conversation may reach

    def __post_init__(self):
        at_least(self, 1, "max_turns", "max_tokens", "max_length")
        if not self.tools:
            raise ConfigError("agent.tools", "name at least one tool (module:function)")


class ToolCalling:
    """The agent (module docstring)."""
    name = "tool_calling"

    def __init__(self, section: ToolCallingSection):
        self.section = section
        self.tools = {}
        for i, spec in enumerate(section.tools):
            declared = load_tool(spec, f"agent.tools[{i}]")
            self.tools[declared.name] = declared
        self.system_prompt = system_prompt(list(self.tools.values()))

    def setup(self, tokenizer, stop_ids: tuple[int, ...]) -> None:
        """The policy's tokenizer and stop ids (a supervised start replays with them)."""
        self.tokenizer, self.stop_ids = tokenizer, tuple(stop_ids)

    def max_len(self, tokenizer) -> int:
        return self.section.max_length

    async def rollout(self, row, policy) -> Rollout:
        s = self.section
        messages = with_system(list(row.prompt), self.system_prompt)
        reply = await policy.chat(messages, max_tokens=s.max_tokens)
        messages.append(reply.message)
        calls = errors = 0
        while calls < s.max_turns:
            parsed = parse_tool_call(reply.text)
            if parsed is None:
                break
            calls += 1
            result = await self._call(parsed, row, policy)
            errors += result.startswith("error")
            messages.append({"role": "tool", "content": result})
            try:
                reply = await policy.chat(messages, max_tokens=s.max_tokens)
            except PromptTooLong:
                break
            messages.append(reply.message)
        return Rollout([messages], metrics={"tool_calls": float(calls),
                                            "tool_errors": float(errors)})

    async def _call(self, parsed: tuple[str, Any], row, policy) -> str:
        """The tool message's text for a parsed call."""
        name, arguments = parsed
        if not name:
            return f"error: {arguments}"
        tool = self.tools.get(name)
        if tool is None:
            return f"error: {UNKNOWN_TOOL}"
        properties = tool.schema["parameters"]["properties"]
        required = tool.schema["parameters"].get("required", [])
        if not isinstance(arguments, dict):
            return f"error: {NOT_AN_OBJECT}"
        if set(arguments) - set(properties) or set(required) - set(arguments):
            return (f"error: {name} takes {', '.join(properties) or 'no arguments'}"
                    + (f" (required: {', '.join(required)})" if required else ""))
        hidden = (((getattr(row, "extra_info", None) or {}).get("tools_kwargs") or {})
                  .get(name) or {}).get("create_kwargs") or {}
        return await policy.once(_run_tool, tool.fn, {**arguments, **hidden})


def build(settings: dict, config) -> ToolCalling:
    return ToolCalling(build_section(ToolCallingSection, settings, "agent"))
