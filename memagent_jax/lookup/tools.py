"""The lookup task's tool: a key's code in the row's table (task.py), which the model never
sees."""

from __future__ import annotations

from memagent_jax.agents.tool_calling import load_tool, tool


@tool({"name": "lookup", "description": "Look up the code of a key.",
       "parameters": {"type": "object",
                      "properties": {"key": {"type": "string", "description": "the key"}},
                      "required": ["key"]}})
def lookup(key: str, table: list) -> str:
    """table: the row's [key, code] pairs (`extra_info.tools_kwargs.lookup.create_kwargs`)."""
    codes = dict(table)
    # Not found: the key is not repeated (a word the model made up may be none of the
    # tokenizer's).
    return f"the code of {key} is {codes[key]} ." if key in codes else "no such key ."


TOOL = load_tool("memagent_jax.lookup.tools:lookup", "agent.tools")
