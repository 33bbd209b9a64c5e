"""A multi-turn tool-calling agent in Qwen's format (`agent: {module:
memagent_jax.agents.tool_calling, tools: [...]}`; the original's
`recurrent/impls/async_tool_gsm8k.py`).

Each call is `policy.chat(messages, tools=...)` (rollout/tool_calls.py): the tools render
through the model's chat template, or, where it takes none, are declared in a system message
as Qwen2.5's template and the original's `toolcall_system_prompt` write it; the reply comes
with its parsed calls. Every call of a reply is run and its result sent back as a `tool`
message with the call's `tool_call_id`, which the chat template renders (Qwen2.5's, the
original's: a user turn of `<tool_response>` blocks); a reply whose calls do not parse gets the
parse error as its tool message (counted: `agent/tool_parse_errors`). The conversation ends at
a reply that calls no tool, after `max_turns` replies that call, or when the next prompt would
not fit `max_length`. The whole conversation is one training row, its tool results carrying no
loss (rollout/conversation.py); the last reply is the answer.

Tools are plain Python functions, named `module:function`, declared with a JSON schema: the
`tool(schema)` decorator's, else the one transformers derives from the signature and docstring
(`get_json_schema`). Arguments the schema does not name come from the row, as verl's tool rows
carry them (`extra_info.tools_kwargs[name].create_kwargs`), unseen by the model, and win over
the model's. A tool's result reaches the model as text (JSON where it returns anything else); an
unknown tool, malformed call, wrong or missing arguments or a tool that raises is told to the
model in the tool message (the original's way), not raised, in words that repeat nothing the
model wrote (a word-level tokenizer reads only its vocabulary). Tools run through
`policy.once`: on many processes, process 0 runs them and shares the results.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Callable
from typing import ClassVar

from memagent_jax.errors import ConfigError
from memagent_jax.rollout.agent_api import PromptTooLong, Rollout
from memagent_jax.rollout.tool_calls import INVALID_JSON, NOT_AN_OBJECT
from memagent_jax.runconfig import at_least, build_section

# What the model is told of a call that runs no tool (the original's words where it has them).
# None repeats what the model wrote: a tool message holds only text the tokenizer reads.
UNKNOWN_TOOL = "unknown tool"


def tool(schema: dict | None = None) -> Callable:
    """Declares a function a tool with its JSON schema ({"name", "description", "parameters"};
    None: derived from its signature and docstring)."""
    def declare(fn: Callable) -> Callable:
        setattr(fn, "tool_schema", schema)  # noqa: B010 - a function attribute mypy cannot type
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

    @property
    def declaration(self) -> dict:
        """The tool as OpenAI's `tools` list holds it."""
        return {"type": "function", "function": self.schema}


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
        except Exception as e:  # transformers raises its own kinds
            raise ConfigError(key, f"{spec}: no JSON schema ({e}); declare one with "
                                   "@tool(schema)") from None
    if not (isinstance(schema, dict) and isinstance(schema.get("name"), str)
            and isinstance(schema.get("parameters", {}).get("properties"), dict)):
        raise ConfigError(key, f"{spec}: a schema needs a name and parameters.properties")
    return Tool(fn, schema)


def _run_tool(fn: Callable, arguments: dict) -> str:
    """fn(**arguments) as the tool message's text; what it raised, as text."""
    try:
        result = fn(**arguments)
    except Exception as e:  # the model is told, as the original tells it
        return f"error: {type(e).__name__}: {e}"
    return result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)


@dataclasses.dataclass(frozen=True)
class ToolCallingSection:
    """The `agent` section's keys besides `module`."""
    SECTION: ClassVar[str] = "agent"
    tools: tuple[str, ...] = ()     # module:function of each tool
    max_turns: int = 4              # replies that call tools, at most
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
        self.declared = [t.declaration for t in self.tools.values()]

    def setup(self, tokenizer, stop_ids: tuple[int, ...]) -> None:
        """The policy's tokenizer and stop ids (a supervised start replays with them)."""
        self.tokenizer, self.stop_ids = tokenizer, tuple(stop_ids)

    def max_len(self, tokenizer) -> int:
        return self.section.max_length

    async def rollout(self, row, policy) -> Rollout:
        s = self.section
        messages = list(row.prompt)
        reply = await policy.chat(messages, max_tokens=s.max_tokens, tools=self.declared)
        messages.append(reply.message)
        turns = calls = errors = parse_errors = 0
        while turns < s.max_turns and (reply.tool_calls or reply.tool_error):
            turns += 1
            if reply.tool_error is not None:
                calls, errors, parse_errors = calls + 1, errors + 1, parse_errors + 1
                messages.append({"role": "tool", "content": f"error: {reply.tool_error}"})
            for call in reply.tool_calls or ():
                calls += 1
                result = await self._call(call["function"], row, policy)
                errors += result.startswith("error")
                messages.append({"role": "tool", "tool_call_id": call["id"],
                                 "content": result})
            try:
                reply = await policy.chat(messages, max_tokens=s.max_tokens,
                                          tools=self.declared)
            except PromptTooLong:
                break
            messages.append(reply.message)
        return Rollout([messages], metrics={"tool_calls": float(calls),
                                            "tool_errors": float(errors),
                                            "tool_parse_errors": float(parse_errors)})

    async def _call(self, function: dict, row, policy) -> str:
        """The tool message's text for a call ({"name", "arguments": JSON text of an object;
        a server's may be neither, which the model is told as a call that does not parse)."""
        name = function.get("name")
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except (json.JSONDecodeError, TypeError):
            return f"error: {INVALID_JSON}"
        if not isinstance(arguments, dict):
            return f"error: {NOT_AN_OBJECT}"
        tool = self.tools.get(name) if isinstance(name, str) else None
        if tool is None:
            return f"error: {UNKNOWN_TOOL}"
        properties = tool.schema["parameters"]["properties"]
        required = tool.schema["parameters"].get("required", [])
        if set(arguments) - set(properties) or set(required) - set(arguments):
            return (f"error: {name} takes {', '.join(properties) or 'no arguments'}"
                    + (f" (required: {', '.join(required)})" if required else ""))
        hidden = (((getattr(row, "extra_info", None) or {}).get("tools_kwargs") or {})
                  .get(name) or {}).get("create_kwargs") or {}
        return await policy.once(_run_tool, tool.fn, {**arguments, **hidden})


def build(settings: dict, config) -> ToolCalling:
    return ToolCalling(build_section(ToolCallingSection, settings, "agent"))
